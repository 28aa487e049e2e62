//! Locations (the Datum seed): one `Location` (multicluster.io/v1alpha1, cluster-scoped,
//! named by its city code in lower case) per city code that members are labelled with
//! (`topology.datum.net/city-code`): its members, their regions and zones, readiness, summed
//! capacity and highest water level. A view: written only when it differs, and removed when no
//! member is in its city any more.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::location::{self, CITY_LABEL, GROUP, KIND};
use orrery_api::{Object, keys};
use orrery_store::stamp::new_object;
use orrery_store::{Preconditions, Store, StoreError};
use serde_json::json;
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// Rounds are at most this often: heartbeats move water levels all the time.
const SETTLE: Duration = Duration::from_secs(2);

fn key(name: &str) -> String {
    orrery_api::kinds::LOCATION.key("", name)
}

async fn reconcile(
    store: &dyn Store,
    clusters: &BTreeMap<String, Arc<Object>>,
    stored: &Cache,
) -> Result<(), StoreError> {
    let wanted = location::locations(clusters.values().map(|c| c.as_ref()));
    for (name, st) in &wanted {
        let status = serde_json::to_value(st).unwrap_or_default();
        let res = match stored.get("", name) {
            Some(cur)
                if cur.status.as_ref() == Some(&status)
                    && cur.labels().get(CITY_LABEL) == Some(&st.city_code) =>
            {
                continue;
            }
            Some(_) => {
                orrery_store::update_with(store, &key(name), |mut cur| {
                    if cur.status.as_ref() == Some(&status)
                        && cur.labels().get(CITY_LABEL) == Some(&st.city_code)
                    {
                        return Ok(None);
                    }
                    cur.metadata
                        .labels
                        .insert(CITY_LABEL.to_string(), st.city_code.clone());
                    cur.spec = Some(json!({ "cityCode": st.city_code }));
                    cur.status = Some(status.clone());
                    Ok(Some(cur))
                })
                .await
            }
            None => {
                let mut o = new_object(&format!("{GROUP}/v1alpha1"), KIND, None, name);
                o.metadata
                    .labels
                    .insert(CITY_LABEL.to_string(), st.city_code.clone());
                o.spec = Some(json!({ "cityCode": st.city_code }));
                o.status = Some(status.clone());
                store.create(&key(name), o).await
            }
        };
        match res {
            Ok(o) => stored.upsert(o.clone(), o.revision().unwrap_or(0)),
            Err(StoreError::AlreadyExists { .. }) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let gone: BTreeSet<String> = stored
        .list()
        .iter()
        .map(|o| o.name().to_string())
        .filter(|n| !wanted.contains_key(n))
        .collect();
    for name in gone {
        match store.delete(&key(&name), &Preconditions::default()).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Follows a Cluster event into the members kept: those labelled with a city.
fn keep_located(clusters: &mut BTreeMap<String, Arc<Object>>, e: Event) {
    let located = |c: &Object| location::city_of(c.labels()).is_some();
    match e {
        Event::Listed(items) => {
            *clusters = items
                .into_iter()
                .filter(|c| located(c))
                .map(|c| (c.name().to_string(), c))
                .collect();
        }
        Event::Upsert(c) if located(&c) => {
            clusters.insert(c.name().to_string(), c);
        }
        Event::Upsert(c) | Event::Delete(c) => {
            clusters.remove(c.name());
        }
    }
}

/// One key: every Location is decided from every located member at once.
struct Locations {
    store: Arc<dyn Store>,
    /// Only the members in a city are kept: most fleets label none, and a parsed Cluster is
    /// about 25 KB (a quarter of a GiB at 10,000 members, for nothing).
    clusters: BTreeMap<String, Arc<Object>>,
    stored: Arc<Cache>,
}

#[async_trait::async_trait]
impl Reconciler for Locations {
    type Key = ();
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, e: Event, keys: &mut Keys<()>) {
        if source == "clusters" {
            keep_located(&mut self.clusters, e);
        }
        keys.push(());
    }

    fn all_keys(&self) -> Vec<()> {
        vec![()]
    }

    async fn reconcile(&self, _: &()) -> Result<Action, StoreError> {
        reconcile(self.store.as_ref(), &self.clusters, &self.stored).await?;
        Ok(Action::Done)
    }
}

/// Runs the controller until shutdown.
pub async fn run(store: Arc<dyn Store>, metrics: Handle, shutdown: watch::Receiver<bool>) {
    let stored = Arc::new(Cache::new(&[]));
    let r = Locations {
        store: store.clone(),
        clusters: BTreeMap::new(),
        stored: stored.clone(),
    };
    Controller::new("locations", store, r, metrics)
        .source(Source::new("clusters", keys::well_known::clusters()))
        .source(Source::new("locations", orrery_api::kinds::LOCATION.prefix(None)).cached(stored))
        // The first change of a burst sets when the round comes; the rest wait for it.
        .settle(SETTLE)
        .backoff(Duration::from_secs(1), Duration::from_secs(5))
        .run(shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, city: Option<&str>) -> Arc<Object> {
        let mut c = new_object("cluster.karmada.io/v1alpha1", "Cluster", None, name);
        if let Some(city) = city {
            c.metadata
                .labels
                .insert(CITY_LABEL.to_string(), city.to_string());
        }
        Arc::new(c)
    }

    fn names(m: &BTreeMap<String, Arc<Object>>) -> Vec<&str> {
        m.keys().map(String::as_str).collect()
    }

    #[test]
    fn only_members_in_a_city_are_kept() {
        let mut kept = BTreeMap::new();
        keep_located(
            &mut kept,
            Event::Listed(vec![
                cluster("a", Some("AMS")),
                cluster("b", None),
                // Not a name a Location can have: not grouped, so not kept.
                cluster("c", Some("not a code!")),
            ]),
        );
        assert_eq!(names(&kept), ["a"]);
        keep_located(&mut kept, Event::Upsert(cluster("b", Some("FRA"))));
        assert_eq!(names(&kept), ["a", "b"]);
        // A member that loses its city label is dropped, as one deleted is.
        keep_located(&mut kept, Event::Upsert(cluster("a", None)));
        keep_located(&mut kept, Event::Delete(cluster("b", Some("FRA"))));
        assert!(kept.is_empty());
    }
}
