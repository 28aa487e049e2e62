//! A fleet-wide outage under the eviction rate: `dark` of the fleet's clusters stop answering
//! at once; the server taints them `NoExecute` no faster than `--eviction-rate` (a token
//! bucket of `--eviction-burst`), and the replicas they held move to the live clusters. Each
//! workload has a disruption budget: the moves Orrery makes never take a ready replica down on
//! the live clusters (a dark cluster's replicas are not ready to keep), so the count there
//! only grows, back to the whole.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::api::ServerProcess;
use crate::propagation::{deployment, fleet_on, post};
use crate::stateful::get;
use crate::stats::{emit, progress, round};

pub struct Args {
    pub clusters: usize,
    pub dark: usize,
    pub workloads: usize,
    /// Clusters' worth of evictions a minute, and the burst.
    pub rate: f64,
    pub burst: u32,
    pub server_bin: Option<std::path::PathBuf>,
    pub dir: Option<std::path::PathBuf>,
}

/// When each cluster got its `NoExecute` taint (whole seconds), of those that have one.
fn noexecute_times(clusters: &Value) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for c in clusters["items"].as_array().into_iter().flatten() {
        let at = c["spec"]["taints"].as_array().and_then(|ts| {
            ts.iter().find_map(|t| {
                (t["effect"] == "NoExecute")
                    .then(|| t["timeAdded"].as_str()?.parse::<orrery_api::Time>().ok())
                    .flatten()
            })
        });
        if let (Some(name), Some(at)) = (c["metadata"]["name"].as_str(), at) {
            out.insert(name.to_string(), at.unix_seconds());
        }
    }
    out
}

/// Ready replicas of a binding on the clusters in `live`, as the members report them.
fn ready_on(b: &Value, live: &BTreeSet<String>) -> i64 {
    b["status"]["aggregatedStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["clusterName"].as_str().is_some_and(|c| live.contains(c)))
        .map(|i| i["status"]["readyReplicas"].as_i64().unwrap_or(0))
        .sum()
}

/// Evictions beyond what a bucket of `burst` filling at `rate` a minute allows: for every
/// span of the sorted whole-second times, the evictions in it against the burst and the
/// span's refill (a second more, for the rounding). Counts the evictions that end a span over.
fn beyond_rate(times: &[i64], rate: f64, burst: u32) -> usize {
    (0..times.len())
        .filter(|&j| {
            (0..=j).any(|i| {
                let count = (j - i + 1) as f64;
                let allowed = f64::from(burst) + (times[j] - times[i] + 1) as f64 * rate / 60.0;
                count > allowed - 1e-9
            })
        })
        .count()
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let n = args.clusters;
    anyhow::ensure!(args.dark < n, "--dark must leave some clusters live");
    let rate = args.rate.to_string();
    let burst = args.burst.to_string();
    let server = ServerProcess::start_with(
        &args.server_bin,
        &args.dir,
        &[
            // Heartbeats come every 5 s here: a grace of three of them.
            "--cluster-grace-period",
            "15s",
            "--cluster-eviction-timeout",
            "2s",
            "--eviction-rate",
            &rate,
            "--eviction-burst",
            &burst,
        ],
    )?;
    progress(format!("outage: starting {n} simulated clusters"));
    let (admin, agent) = fleet_on(&server, &args.server_bin, n, "200ms").await?;
    let all: Vec<String> = (0..n).map(|i| format!("m-{i}")).collect();
    let replicas = n;
    let budget = json!({"maxUnavailable": "10%"});
    let floor = replicas - replicas.div_ceil(10);
    for w in 0..args.workloads {
        let name = format!("w-{w}");
        post(
            &admin,
            "/apis/apps/v1/namespaces/default/deployments",
            &deployment(&name, replicas as i64),
        )
        .await?;
        post(&admin, "/apis/policy.karmada.io/v1alpha1/namespaces/default/propagationpolicies", &json!({
            "apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name}],
                "placement": {"clusterAffinity": {"clusterNames": all},
                    "replicaScheduling": {"replicaSchedulingType": "Divided"},
                    "disruptionBudget": budget}}})).await?;
    }
    let bindings = "/apis/multicluster.io/v1alpha1/namespaces/default/resourcebindings";
    let everyone: BTreeSet<String> = all.iter().cloned().collect();
    let t0 = Instant::now();
    loop {
        let bs = get(&admin, bindings).await?;
        let ready: Vec<i64> = bs["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| ready_on(b, &everyone))
            .collect();
        if ready.len() == args.workloads && ready.iter().all(|r| *r == replicas as i64) {
            break;
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(180),
            "workloads not all ready: {ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    progress(format!(
        "outage: {} workloads of {replicas} ready; {} clusters go dark",
        args.workloads, args.dark
    ));
    let dark: Vec<String> = all[..args.dark].to_vec();
    let live: BTreeSet<String> = all[args.dark..].iter().cloned().collect();
    let dark_at = orrery_api::Time::now().unix_seconds();
    for c in &dark {
        crate::members::admin_send(
            "PUT",
            &agent.admin,
            &format!("/clusters/{c}/faults"),
            &json!({"outage": true}),
        )?;
    }
    let t_dark = Instant::now();
    // Per workload: ready on the live clusters when the outage began, the least since, and
    // when it was back at its budget's floor and at the whole.
    let mut at_start: BTreeMap<String, i64> = BTreeMap::new();
    let mut least: BTreeMap<String, i64> = BTreeMap::new();
    let mut at_floor: BTreeMap<String, f64> = BTreeMap::new();
    let mut whole: BTreeMap<String, f64> = BTreeMap::new();
    let mut evicted = BTreeMap::new();
    while whole.len() < args.workloads || evicted.len() < args.dark {
        anyhow::ensure!(
            t_dark.elapsed() < Duration::from_secs(600),
            "not done: {} of {} dark clusters evicted, {} of {} workloads whole",
            evicted.len(),
            args.dark,
            whole.len(),
            args.workloads
        );
        let clusters = get(&admin, "/apis/multicluster.io/v1alpha1/clusters").await?;
        evicted = noexecute_times(&clusters);
        evicted.retain(|c, _| dark.contains(c));
        let bs = get(&admin, bindings).await?;
        for b in bs["items"].as_array().into_iter().flatten() {
            let name = b["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let r = ready_on(b, &live);
            at_start.entry(name.clone()).or_insert(r);
            let l = least.entry(name.clone()).or_insert(r);
            *l = (*l).min(r);
            let s = t_dark.elapsed().as_secs_f64();
            if r >= floor as i64 {
                at_floor.entry(name.clone()).or_insert(s);
            }
            if r >= replicas as i64 {
                whole.entry(name).or_insert(s);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut times: Vec<i64> = evicted.values().copied().collect();
    times.sort();
    let over = beyond_rate(&times, args.rate, args.burst);
    let span = match (times.first(), times.last()) {
        (Some(a), Some(b)) => (b - a) as f64,
        _ => 0.0,
    };
    // The set pace for the evictions after the burst, and what it was.
    let after_burst = args.dark.saturating_sub(args.burst as usize) as f64;
    let taken_down: Vec<&String> = least
        .iter()
        .filter(|(w, l)| **l < at_start[*w])
        .map(|(w, _)| w)
        .collect();
    let median = |m: &BTreeMap<String, f64>| {
        let mut v: Vec<f64> = m.values().copied().collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    emit(json!({
        "scenario": "outage-eviction",
        "clusters": n,
        "dark": args.dark,
        "workloads": args.workloads,
        "replicas": replicas,
        "eviction_rate_per_min": args.rate,
        "eviction_burst": args.burst,
        "evicted": evicted.len(),
        "first_eviction_after_outage_s": times.first().map(|t| t - dark_at),
        "eviction_span_s": span,
        "set_span_floor_s": round(after_burst.max(0.0) / args.rate * 60.0 - 1.0, 1),
        "evictions_beyond_rate": over,
        "budget_floor": floor,
        "live_ready_at_outage_min": at_start.values().min(),
        "workloads_with_live_ready_taken_down": taken_down.len(),
        "back_at_floor_s_median": round(median(&at_floor), 1),
        "whole_again_s_median": round(median(&whole), 1),
        "whole_again_s_max": round(whole.values().copied().fold(0.0, f64::max), 1),
        "measures": "dark clusters' NoExecute taint times (whole seconds) against a token bucket of the set rate and burst; ready replicas on the live clusters per workload (binding aggregatedStatus), sampled every 0.5 s",
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evictions_are_judged_against_the_bucket() {
        // A burst of 2, then one a second (60 a minute): within.
        assert_eq!(beyond_rate(&[0, 0, 1, 2, 3], 60.0, 2), 0);
        // Three in the same second with a burst of 2: one too many.
        assert_eq!(beyond_rate(&[0, 0, 0], 60.0, 2), 1);
        // 6 a minute: one every 10 s; 5 s apart is too soon (after the burst of 1).
        assert_eq!(beyond_rate(&[0, 10, 15], 6.0, 1), 1);
        assert_eq!(beyond_rate(&[0, 10, 20], 6.0, 1), 0);
    }
}
