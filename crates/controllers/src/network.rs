//! The latency between every pair of clusters, as each Cluster's status keeps it: what the
//! members measure (`status.network.latencyMs`, from their agents or a simulation's fleet),
//! and for the pairs nobody measures the control plane's estimate
//! (`status.network.estimatedLatencyMs`): the sum of both members' round trips to it
//! (`serverLatencyMs`), an upper bound by the triangle inequality. Pull-mode members behind
//! NAT cannot reach each other to measure; the control plane reaches them all.
//!
//! An estimate is written only when it moves by more than a fifth (round trips jitter), so
//! heartbeats do not each cause a second write.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use orrery_api::cluster::ClusterStatus;
use orrery_api::{Object, keys};
use orrery_store::{Store, StoreError};
use tokio::sync::watch;

use crate::runtime::reflector::{self as informer, Event};

/// What one cluster says of its network.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    pub measured: BTreeMap<String, f64>,
    pub server: Option<f64>,
    pub estimated: BTreeMap<String, f64>,
}

impl Reported {
    pub fn of(c: &Object) -> Reported {
        let st = ClusterStatus::of(c);
        let n = st.network.unwrap_or_default();
        Reported {
            measured: n.latency_ms,
            server: n.server_latency_ms,
            estimated: n.estimated_latency_ms,
        }
    }
}

/// The estimates each cluster should carry, for the pairs neither end measures.
pub fn estimates(all: &BTreeMap<String, Reported>) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (a, ra) in all {
        let row = out.entry(a.clone()).or_default();
        for (b, rb) in all {
            if a == b || ra.measured.contains_key(b) || rb.measured.contains_key(a) {
                continue;
            }
            if let (Some(x), Some(y)) = (ra.server, rb.server) {
                row.insert(b.clone(), ((x + y) * 10.0).round() / 10.0);
            }
        }
    }
    out
}

/// Whether `next` says something `current` does not: another set of peers, or a value that
/// moved by more than a fifth (and 1 ms).
pub fn differs(current: &BTreeMap<String, f64>, next: &BTreeMap<String, f64>) -> bool {
    current.len() != next.len()
        || next.iter().any(|(k, v)| {
            current
                .get(k)
                .is_none_or(|c| (c - v).abs() > (c.abs() * 0.2).max(1.0))
        })
}

async fn write(
    store: &dyn Store,
    name: &str,
    row: &BTreeMap<String, f64>,
) -> Result<(), StoreError> {
    let key = keys::well_known::cluster(name);
    orrery_store::update_with(store, &key, |mut cur| {
        let current = Reported::of(&cur).estimated;
        if !differs(&current, row) {
            return Ok(None);
        }
        let status = cur.status.get_or_insert_with(|| serde_json::json!({}));
        if !status.is_object() {
            *status = serde_json::json!({});
        }
        if !status["network"].is_object() {
            status["network"] = serde_json::json!({});
        }
        if row.is_empty() {
            if let Some(n) = status["network"].as_object_mut() {
                n.remove("estimatedLatencyMs");
            }
        } else {
            status["network"]["estimatedLatencyMs"] = serde_json::json!(row);
        }
        Ok(Some(cur))
    })
    .await
    .map(|_| ())
}

/// Keeps every Cluster's estimates until shutdown.
pub async fn run(store: Arc<dyn Store>, mut shutdown: watch::Receiver<bool>) {
    let mut rx = informer::spawn(
        store.clone(),
        keys::well_known::clusters(),
        shutdown.clone(),
    );
    let mut all: BTreeMap<String, Reported> = BTreeMap::new();
    let mut listed = false;
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => match ev { Some(ev) => ev, None => return },
            _ = shutdown.changed() => return,
        };
        match ev {
            Event::Listed(items) => {
                all = items
                    .iter()
                    .map(|c| (c.name().to_string(), Reported::of(c)))
                    .collect();
                listed = true;
            }
            Event::Upsert(c) => {
                all.insert(c.name().to_string(), Reported::of(&c));
            }
            Event::Delete(c) => {
                all.remove(c.name());
            }
        }
        if !listed {
            continue;
        }
        let want = estimates(&all);
        let mut failed: HashMap<String, StoreError> = HashMap::new();
        for (name, row) in &want {
            let have = all.get(name).map(|r| &r.estimated);
            if have.is_some_and(|h| !differs(h, row)) {
                continue;
            }
            if let Err(e) = write(store.as_ref(), name, row).await
                && !matches!(e, StoreError::NotFound { .. })
            {
                failed.insert(name.clone(), e);
            }
        }
        for (name, e) in failed {
            tracing::debug!(cluster = %name, error = %e, "writing latency estimates failed; tried again on the next change");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(server: Option<f64>, measured: &[(&str, f64)]) -> Reported {
        Reported {
            measured: measured.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            server,
            estimated: BTreeMap::new(),
        }
    }

    #[test]
    fn unmeasured_pairs_get_the_sum_of_both_round_trips() {
        let all: BTreeMap<String, Reported> = [
            ("a".to_string(), r(Some(10.0), &[("b", 3.0)])),
            ("b".to_string(), r(Some(20.0), &[])),
            ("c".to_string(), r(Some(5.25), &[])),
            ("d".to_string(), r(None, &[])),
        ]
        .into();
        let e = estimates(&all);
        // a-b is measured (by a, so b needs none of a either).
        assert!(!e["a"].contains_key("b") && !e["b"].contains_key("a"));
        assert_eq!(e["a"]["c"], 15.3);
        assert_eq!(e["c"]["b"], 25.3);
        // d reports no round trip: nothing to estimate with.
        assert!(e["d"].is_empty() && !e["a"].contains_key("d"));
    }

    #[test]
    fn small_moves_are_not_worth_a_write() {
        let cur: BTreeMap<String, f64> = [("a".to_string(), 10.0)].into();
        assert!(!differs(&cur, &[("a".to_string(), 11.5)].into()));
        assert!(differs(&cur, &[("a".to_string(), 12.5)].into()));
        assert!(differs(&cur, &[("b".to_string(), 10.0)].into()));
        assert!(differs(&cur, &BTreeMap::new()));
        let tiny: BTreeMap<String, f64> = [("a".to_string(), 0.4)].into();
        assert!(
            !differs(&tiny, &[("a".to_string(), 1.2)].into()),
            "within a millisecond"
        );
    }
}
