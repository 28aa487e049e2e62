//! Where a stateful workload goes when it moves (the draft's follow-up scheduling, 5.1):
//! among the clusters that pass its filters and have room for what moves, the one where its
//! data arrives soonest (bytes over the path, the smaller of the two uplinks), close to the
//! workloads it depends on and that depend on it, and least loaded. Every other candidate
//! gets the reason it lost.

use orrery_api::prediction::Ahead;
use orrery_api::stateful::Candidate;

use crate::snapshot::{Fleet, Vector};

/// The uplink assumed of a cluster that does not report one (1 Gbit/s).
pub const DEFAULT_BANDWIDTH: i64 = 125 << 20;

/// Weights of the three ratings.
const TIME: f64 = 3.0;
const LATENCY: f64 = 2.0;
const LEVEL: f64 = 1.0;

/// What moves, and from where.
#[derive(Clone, Debug)]
pub struct MoveRequest<'a> {
    pub source: &'a str,
    pub replicas: i64,
    /// What one replica takes.
    pub demand: Vector,
    /// The data to copy.
    pub bytes: i64,
    /// Clusters of the workloads it depends on and that depend on it.
    pub near: &'a [String],
    /// No candidate may end above this water level.
    pub limit: f64,
    /// How far ahead candidates are judged, and the time now: a cluster with a usable
    /// forecast is judged by the larger of its present level and the forecast, as a
    /// placement is (`Ahead` with a horizon of 0: by the present level).
    pub ahead: Ahead,
    pub now: i64,
    /// Nor may the forecast's mean, over all it reaches, take a candidate above this (the
    /// shed mark): it would be moved off again.
    pub mark: f64,
}

/// The ranking: every cluster looked at, best first, and the estimate for the best.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ranking {
    pub chosen: Option<String>,
    pub candidates: Vec<Candidate>,
    /// Bytes per second of the path to the chosen cluster.
    pub bandwidth: i64,
    pub seconds: f64,
}

/// The path between two clusters: the smaller of their uplinks, or less where either reports
/// the path between them slower.
pub fn path_bandwidth(fleet: &Fleet, a: &str, b: &str) -> i64 {
    match (fleet.get(a), fleet.get(b)) {
        (Some(x), Some(y)) => x.path_bandwidth_to(y, DEFAULT_BANDWIDTH),
        (x, y) => {
            let up = |c: Option<&crate::snapshot::ClusterSnapshot>| {
                c.and_then(|c| c.bandwidth)
                    .filter(|b| *b > 0)
                    .unwrap_or(DEFAULT_BANDWIDTH)
            };
            up(x).min(up(y))
        }
    }
}

/// Ranks the clusters `feasible` (fleet indexes that passed the filters); `turned_away` are
/// the others with the filter's reason, listed after them.
pub fn rank(
    fleet: &Fleet,
    feasible: &[usize],
    turned_away: &[(usize, String)],
    req: &MoveRequest<'_>,
) -> Ranking {
    struct Rated {
        i: usize,
        seconds: f64,
        bandwidth: i64,
        latency: Option<f64>,
        level: f64,
        fits: bool,
    }
    let clusters = fleet.clusters();
    let facts = fleet.facts();
    let mut rated: Vec<Rated> = Vec::new();
    let mut out: Vec<Candidate> = Vec::new();
    for &i in feasible {
        let c = &clusters[i];
        if c.name == req.source {
            continue;
        }
        let bandwidth = path_bandwidth(fleet, req.source, &c.name);
        let seconds = req.bytes.max(0) as f64 / bandwidth as f64;
        let latency = mean_latency(fleet, i, req.near);
        let f = &facts[i];
        // The level after what moves arrives, over the dimensions one replica needs.
        let mut level: f64 = f.level();
        let mut fits = true;
        if f.known() {
            level = 0.0;
            let (rise, reach) = f.rises(req.now, &req.ahead).unwrap_or(([0.0; 5], [0.0; 5]));
            for d in 0..5 {
                if f.allocatable[d] <= 0.0 {
                    continue;
                }
                let moved = f.taken(d) + req.replicas as f64 * req.demand[d];
                let after = (moved + rise[d]) / f.allocatable[d];
                if req.demand[d] > 0.0 {
                    fits &= after <= req.limit + 1e-9
                        && (moved + reach[d]) / f.allocatable[d] <= req.mark + 1e-9;
                }
                level = level.max(after);
            }
        }
        rated.push(Rated {
            i,
            seconds,
            bandwidth,
            latency,
            level,
            fits,
        });
    }
    let fitting: Vec<&Rated> = rated.iter().filter(|r| r.fits).collect();
    let min_secs = fitting.iter().map(|r| r.seconds).fold(f64::MAX, f64::min);
    let (min_lat, max_lat) = fitting
        .iter()
        .filter_map(|r| r.latency)
        .fold((f64::MAX, 0.0f64), |(lo, hi), l| (lo.min(l), hi.max(l)));
    let score = |r: &Rated| -> f64 {
        let t = if r.seconds <= 0.0 || min_secs <= 0.0 {
            100.0
        } else {
            100.0 * min_secs / r.seconds
        };
        let l = match r.latency {
            Some(l) if max_lat > min_lat => 100.0 * (1.0 - (l - min_lat) / (max_lat - min_lat)),
            Some(_) => 100.0,
            None => 50.0,
        };
        let w = 100.0 * (1.0 - r.level).clamp(0.0, 1.0);
        (TIME * t + LATENCY * l + LEVEL * w) / (TIME + LATENCY + LEVEL)
    };
    let mut scored: Vec<(f64, &Rated)> = fitting.iter().map(|r| (score(r), *r)).collect();
    // Best first; ties by name (the fleet's order), so the same input gives the same answer.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.i.cmp(&b.1.i)));
    let best = scored.first().map(|(_, r)| *r);
    let round = |x: f64, places: i32| {
        let p = 10f64.powi(places);
        (x * p).round() / p
    };
    for (s, r) in &scored {
        let reason = match best {
            Some(b) if b.i != r.i => {
                why_lost(r.seconds, b.seconds, r.latency, b.latency, r.level, b.level)
            }
            _ => String::new(),
        };
        out.push(Candidate {
            cluster: clusters[r.i].name.clone(),
            estimated_seconds: Some(round(r.seconds, 1)),
            latency_ms: r.latency.map(|l| round(l, 1)),
            water_level: Some(round(r.level, 3)),
            score: Some(round(*s, 1)),
            reason,
        });
    }
    for r in rated.iter().filter(|r| !r.fits) {
        out.push(Candidate {
            cluster: clusters[r.i].name.clone(),
            estimated_seconds: Some(round(r.seconds, 1)),
            latency_ms: r.latency.map(|l| round(l, 1)),
            water_level: Some(round(r.level, 3)),
            score: None,
            reason: format!(
                "no room for {} replica(s) under the water level limit {} (it would reach {:.2})",
                req.replicas, req.limit, r.level
            ),
        });
    }
    for (i, why) in turned_away {
        if clusters[*i].name == req.source {
            continue;
        }
        out.push(Candidate {
            cluster: clusters[*i].name.clone(),
            reason: why.clone(),
            ..Default::default()
        });
    }
    Ranking {
        chosen: best.map(|b| clusters[b.i].name.clone()),
        candidates: out,
        bandwidth: best.map_or(0, |b| b.bandwidth),
        seconds: best.map_or(0.0, |b| round(b.seconds, 1)),
    }
}

/// The one thing that cost a candidate the most against the winner.
fn why_lost(
    secs: f64,
    best_secs: f64,
    lat: Option<f64>,
    best_lat: Option<f64>,
    level: f64,
    best_level: f64,
) -> String {
    let time_loss = if secs > 0.0 {
        TIME * (1.0 - best_secs / secs)
    } else {
        0.0
    };
    let lat_loss = match (lat, best_lat) {
        (Some(l), Some(b)) if l > b => LATENCY * ((l - b) / l.max(1.0)).min(1.0),
        _ => 0.0,
    };
    let level_loss = LEVEL * (level - best_level).max(0.0);
    if time_loss >= lat_loss && time_loss >= level_loss && time_loss > 0.0 {
        format!("copying its data takes {secs:.1}s here against {best_secs:.1}s")
    } else if lat_loss >= level_loss && lat_loss > 0.0 {
        format!(
            "farther from the workloads it depends on: {:.1} ms against {:.1} ms",
            lat.unwrap_or(0.0),
            best_lat.unwrap_or(0.0)
        )
    } else {
        format!("fuller: water level {level:.2} against {best_level:.2}")
    }
}

/// The mean latency from cluster `i` to `near` (`None` when nobody reports one).
pub fn mean_latency(fleet: &Fleet, i: usize, near: &[String]) -> Option<f64> {
    let clusters = fleet.clusters();
    let c = &clusters[i];
    let ls: Vec<f64> = near
        .iter()
        .filter_map(|n| fleet.position(n))
        .filter_map(|j| c.latency_to(&clusters[j]))
        .collect();
    (!ls.is_empty()).then(|| ls.iter().sum::<f64>() / ls.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::ClusterSnapshot;
    use orrery_api::{Format, Quantity};

    fn c(name: &str, bw_mib: i64, cores: i64, used: i64) -> ClusterSnapshot {
        let mut c = ClusterSnapshot {
            name: name.into(),
            ready: true,
            bandwidth: (bw_mib > 0).then_some(bw_mib << 20),
            ..Default::default()
        };
        c.allocatable
            .insert("cpu".into(), Quantity::from_int(cores, Format::DecimalSI));
        c.allocated
            .insert("cpu".into(), Quantity::from_int(used, Format::DecimalSI));
        c
    }

    fn req<'a>(near: &'a [String]) -> MoveRequest<'a> {
        MoveRequest {
            source: "src",
            replicas: 2,
            demand: [1.0, 0.0, 0.0, 1.0, 0.0],
            bytes: 10 << 30,
            near,
            limit: 0.8,
            ahead: Ahead {
                horizon_seconds: 0,
                ..Ahead::default()
            },
            now: 0,
            mark: 0.95,
        }
    }

    #[test]
    fn the_faster_path_wins_and_each_loser_says_why() {
        // src has 125 MiB/s; slow has 25, fast 1000 (the path is src's 125), full has no room.
        let fleet = Fleet::new(vec![
            c("src", 125, 10, 2),
            c("slow", 25, 10, 0),
            c("fast", 1000, 10, 3),
            c("full", 1000, 10, 7),
        ]);
        let all: Vec<usize> = (0..4).collect();
        let r = rank(&fleet, &all, &[], &req(&[]));
        assert_eq!(r.chosen.as_deref(), Some("fast"));
        assert_eq!(r.bandwidth, 125 << 20, "the smaller uplink");
        assert_eq!(r.seconds, 81.9);
        let by: std::collections::BTreeMap<&str, &Candidate> = r
            .candidates
            .iter()
            .map(|c| (c.cluster.as_str(), c))
            .collect();
        assert!(by["fast"].reason.is_empty());
        assert_eq!(by["slow"].estimated_seconds, Some(409.6));
        assert!(
            by["slow"]
                .reason
                .starts_with("copying its data takes 409.6s here against 81.9s"),
            "{}",
            by["slow"].reason
        );
        assert!(
            by["full"].reason.starts_with("no room for 2 replica(s)"),
            "{}",
            by["full"].reason
        );
        assert!(!by.contains_key("src"), "the source is no candidate");
        assert_eq!(r.candidates[0].cluster, "fast", "best first");
    }

    #[test]
    fn latency_to_dependencies_and_load_break_ties_of_equal_paths() {
        let mut a = c("a", 125, 10, 0);
        let mut b = c("b", 125, 10, 0);
        a.latency_ms.insert("app".into(), 80.0);
        b.latency_ms.insert("app".into(), 5.0);
        let fleet = Fleet::new(vec![c("src", 125, 10, 0), a, b, c("app", 125, 10, 0)]);
        let near = vec!["app".to_string()];
        let at = |n: &str| fleet.position(n).unwrap();
        let feasible = vec![at("a"), at("b"), at("src")];
        let turned = vec![(
            at("app"),
            "not among the policy's targetClusters".to_string(),
        )];
        let r = rank(&fleet, &feasible, &turned, &req(&near));
        assert_eq!(r.chosen.as_deref(), Some("b"));
        let a = r.candidates.iter().find(|c| c.cluster == "a").unwrap();
        assert_eq!(
            a.reason,
            "farther from the workloads it depends on: 80.0 ms against 5.0 ms"
        );
        let app = r.candidates.iter().find(|c| c.cluster == "app").unwrap();
        assert_eq!(app.reason, "not among the policy's targetClusters");
        // Without dependencies, the emptier one.
        let fleet = Fleet::new(vec![
            c("src", 125, 10, 0),
            c("a", 125, 10, 4),
            c("b", 125, 10, 1),
        ]);
        let r = rank(&fleet, &[0, 1, 2], &[], &req(&[]));
        assert_eq!(r.chosen.as_deref(), Some("b"));
        assert!(
            r.candidates[1]
                .reason
                .starts_with("fuller: water level 0.60 against 0.30"),
            "{:?}",
            r.candidates
        );
        // Nothing fits: no choice.
        let fleet = Fleet::new(vec![c("src", 125, 10, 0), c("a", 125, 10, 9)]);
        assert_eq!(rank(&fleet, &[0, 1], &[], &req(&[])).chosen, None);
    }
}
