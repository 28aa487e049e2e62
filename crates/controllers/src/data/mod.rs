//! The data mover for data sets (the draft's storage-transmission-compute integration): it
//! copies data sets to where the scheduler placed their readers, keeps caches in the regions
//! that read them and refreshes them when the data changes, on links it never books beyond
//! their bandwidth. It reads DataSets, DataTransfers, bindings (who reads what where), the
//! data sets' Works (what members report) and Clusters; asks [`plan::step`] for the next step;
//! and writes DataSet and DataTransfer statuses, new DataTransfers and the data sets' Works.
//! Everything it acts on is stored: a restart carries on where the copies were, and writes
//! only what differs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::binding::BindingSpec;
use orrery_api::cluster::{ClusterSpec, ClusterStatus, TAINT_NOT_READY, TAINT_UNREACHABLE};
use orrery_api::data::{
    DataReader, DataSetSpec, DataSetStatus, DataTransferSpec, DataTransferStatus, Tier,
};
use orrery_api::work::WorkStatus;
use orrery_api::{Object, Quantity, keys};
use orrery_store::stamp::new_object;
use orrery_store::{Preconditions, Store, StoreError};
use serde::Deserialize;
use tokio::sync::watch;

use crate::runtime::Event;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};

pub mod plan;

pub use plan::Settings;

/// Annotation on a data set's Work: the data set it carries (`<namespace>/<name>`).
pub const WORK_ANNOTATION: &str = "multicluster.io/dataset";

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Src {
    DataSet,
    Transfer,
    Binding,
    Work,
    Cluster,
}

type NKey = (String, String);

struct Mover {
    store: Arc<dyn Store>,
    settings: Settings,
    datasets: BTreeMap<NKey, Arc<Object>>,
    transfers: BTreeMap<NKey, Arc<Object>>,
    /// Readers by data set, from each binding that reads one.
    readers: HashMap<NKey, Vec<(NKey, DataReader)>>,
    /// Data set Works, by (cluster namespace, name).
    works: BTreeMap<NKey, Arc<Object>>,
    clusters: BTreeMap<String, plan::Cluster>,
}

/// One key: a round plans every data set and transfer at once. The round writes what it
/// wrote into the mover's view, so the view is behind an async lock (one round at a time).
struct Data(tokio::sync::Mutex<Mover>);

#[async_trait::async_trait]
impl Reconciler for Data {
    type Key = ();
    type Error = String;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<()>) {
        let src = match source.name {
            "datasets" => Src::DataSet,
            "datatransfers" => Src::Transfer,
            "bindings" => Src::Binding,
            "works" => Src::Work,
            _ => Src::Cluster,
        };
        if self.0.get_mut().on_event(src, ev) {
            keys.push(());
        }
    }

    fn all_keys(&self) -> Vec<()> {
        vec![()]
    }

    async fn reconcile(&self, _: &()) -> Result<Action, String> {
        let mut m = self.0.lock().await;
        if m.datasets.is_empty() && m.transfers.is_empty() && m.works.is_empty() {
            return Ok(Action::Done);
        }
        match m.reconcile().await {
            // Finished transfers expire and reads age: looked at again every few seconds.
            0 => Ok(Action::After(Duration::from_secs(5))),
            // Conflicts and the like: the next round reads again and retries.
            n => Err(format!("{n} write(s) of the data mover failed")),
        }
    }
}

/// Runs the data mover until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    settings: Settings,
    metrics: Arc<crate::runtime::metrics::ControllerMetrics>,
    shutdown: watch::Receiver<bool>,
) {
    let m = Mover {
        store: store.clone(),
        settings,
        datasets: BTreeMap::new(),
        transfers: BTreeMap::new(),
        readers: HashMap::new(),
        works: BTreeMap::new(),
        clusters: BTreeMap::new(),
    };
    Controller::new(
        "data",
        store,
        Data(tokio::sync::Mutex::new(m)),
        metrics.of("data"),
    )
    .source(Source::new("datasets", keys::well_known::datasets(None)))
    .source(Source::new(
        "datatransfers",
        keys::well_known::datatransfers(None),
    ))
    .source(Source::new("bindings", keys::well_known::bindings(None)))
    .source(Source::new("works", keys::well_known::works(None)))
    .source(Source::new("clusters", keys::well_known::clusters()))
    // One key for every data set: a failing write holds up the rest no longer than 5 s.
    .backoff(Duration::from_millis(500), Duration::from_secs(5))
    .run(shutdown)
    .await;
}

fn cluster_facts(c: &Object) -> plan::Cluster {
    let spec = ClusterSpec::of(c);
    let st = ClusterStatus::of(c);
    plan::Cluster {
        serving: st.ready()
            && !spec
                .taints
                .iter()
                .any(|t| t.key == TAINT_NOT_READY || t.key == TAINT_UNREACHABLE),
        region: spec.region.clone(),
        bandwidth: st
            .network
            .as_ref()
            .and_then(|n| n.bandwidth_bytes_per_second)
            .filter(|b| *b > 0)
            .unwrap_or(orrery_scheduler::moves::DEFAULT_BANDWIDTH),
        cache_bytes: st
            .properties
            .get(orrery_api::data::CACHE_PROPERTY)
            .and_then(|q| q.parse::<Quantity>().ok())
            .map_or(0, |q| i64::try_from(q.value()).unwrap_or(i64::MAX).max(0)),
        tier: c
            .metadata
            .labels
            .get(orrery_api::data::STORAGE_TIER_KEY)
            .and_then(|t| Tier::parse(t))
            .unwrap_or_default(),
        held: st.data_sets.clone(),
        paths: st
            .network
            .as_ref()
            .map(|n| n.path_bandwidth_bytes_per_second.clone())
            .unwrap_or_default(),
    }
}

/// The data sets a binding reads, and the reader it is in each cluster it is placed in.
fn readers_of(b: &Object) -> Vec<(NKey, DataReader)> {
    if b.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let Some(spec) = BindingSpec::of(b) else {
        return Vec::new();
    };
    if spec.data.datasets.is_empty() {
        return Vec::new();
    }
    let workload = format!("{}/{}", spec.resource.kind, spec.resource.name);
    let any_replicas = spec.clusters.iter().any(|c| c.replicas > 0);
    let mut out = Vec::new();
    for c in spec
        .clusters
        .iter()
        .filter(|c| c.replicas > 0 || !any_replicas)
    {
        for d in &spec.data.datasets {
            out.push((
                (b.namespace().to_string(), d.clone()),
                DataReader {
                    workload: workload.clone(),
                    cluster: c.name.clone(),
                },
            ));
        }
    }
    out
}

fn work_status(w: &Object) -> WorkStatus {
    w.status
        .as_ref()
        .and_then(|s| WorkStatus::deserialize(s).ok())
        .unwrap_or_default()
}

fn is_data_work(w: &Object) -> bool {
    w.name().starts_with(plan::WORK_PREFIX) && w.metadata.annotations.contains_key(WORK_ANNOTATION)
}

impl Mover {
    /// Takes in a change; whether it may change what a round does.
    fn on_event(&mut self, src: Src, ev: Event) -> bool {
        fn key(o: &Object) -> NKey {
            (o.namespace().to_string(), o.name().to_string())
        }
        match (src, ev) {
            (Src::DataSet, Event::Listed(items)) => {
                self.datasets = items.into_iter().map(|o| (key(&o), o)).collect();
            }
            (Src::DataSet, Event::Upsert(o)) => {
                newer(&mut self.datasets, key(&o), o);
            }
            (Src::DataSet, Event::Delete(o)) => {
                self.datasets.remove(&key(&o));
            }
            (Src::Transfer, Event::Listed(items)) => {
                self.transfers = items.into_iter().map(|o| (key(&o), o)).collect();
            }
            (Src::Transfer, Event::Upsert(o)) => {
                newer(&mut self.transfers, key(&o), o);
            }
            (Src::Transfer, Event::Delete(o)) => {
                self.transfers.remove(&key(&o));
            }
            (Src::Binding, Event::Listed(items)) => {
                self.readers.clear();
                for b in &items {
                    self.put_readers(b, false);
                }
            }
            (Src::Binding, Event::Upsert(b)) => {
                if !self.put_readers(&b, false) {
                    return false;
                }
            }
            (Src::Binding, Event::Delete(b)) => {
                if !self.put_readers(&b, true) {
                    return false;
                }
            }
            (Src::Work, Event::Listed(items)) => {
                self.works = items
                    .into_iter()
                    .filter(|w| is_data_work(w))
                    .map(|o| (key(&o), o))
                    .collect();
            }
            (Src::Work, Event::Upsert(w)) => {
                if !is_data_work(&w) {
                    return false;
                }
                newer(&mut self.works, key(&w), w);
            }
            (Src::Work, Event::Delete(w)) => {
                if self.works.remove(&key(&w)).is_none() {
                    return false;
                }
            }
            (Src::Cluster, Event::Listed(items)) => {
                self.clusters = items
                    .iter()
                    .map(|c| (c.name().to_string(), cluster_facts(c)))
                    .collect();
            }
            (Src::Cluster, Event::Upsert(c)) => {
                let facts = cluster_facts(&c);
                if self.clusters.get(c.name()) == Some(&facts) {
                    return false;
                }
                self.clusters.insert(c.name().to_string(), facts);
            }
            (Src::Cluster, Event::Delete(c)) => {
                self.clusters.remove(c.name());
            }
        }
        true
    }

    /// Takes a binding's readers in (or out); whether anything changed.
    fn put_readers(&mut self, b: &Object, gone: bool) -> bool {
        let bk = (b.namespace().to_string(), b.name().to_string());
        let now = if gone { Vec::new() } else { readers_of(b) };
        let had: Vec<(NKey, DataReader)> = self
            .readers
            .iter()
            .flat_map(|(set, rs)| {
                rs.iter()
                    .filter(|(k, _)| *k == bk)
                    .map(|(_, r)| (set.clone(), r.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        if had == now {
            return false;
        }
        for rs in self.readers.values_mut() {
            rs.retain(|(k, _)| *k != bk);
        }
        self.readers.retain(|_, rs| !rs.is_empty());
        for (set, r) in now {
            self.readers.entry(set).or_default().push((bk.clone(), r));
        }
        true
    }

    /// One step of the plan, written; returns how many writes failed.
    async fn reconcile(&mut self) -> usize {
        let now = orrery_api::Time::now();
        let sets = self.plan_sets();
        let transfers = self.plan_transfers();
        let out = plan::step(&plan::Input {
            now,
            settings: &self.settings,
            clusters: &self.clusters,
            sets: &sets,
            transfers: &transfers,
        });
        let mut failed = 0;
        // What this round wrote goes into the caches at once (the watch brings it later), so
        // the next round does not conflict with its own writes.
        let mut wrote_transfers = Vec::new();
        let mut wrote_sets = Vec::new();
        let (sets_failed, held) = self
            .write_set_statuses(&out.statuses, &mut wrote_sets)
            .await;
        failed += sets_failed;
        failed += self
            .write_transfer_statuses(&out.transfer_statuses, &held, &mut wrote_transfers)
            .await;
        failed += self.delete_transfers(&out.delete).await;
        let (works_failed, wrote_works) = self.write_works(&out.works, &held).await;
        failed += works_failed;
        failed += self
            .create_transfers(&out.create, &held, &mut wrote_transfers)
            .await;
        for (k, o) in wrote_transfers {
            newer(&mut self.transfers, k, o);
        }
        for (k, o) in wrote_sets {
            newer(&mut self.datasets, k, o);
        }
        for (k, o) in wrote_works {
            match o {
                Some(o) => newer(&mut self.works, k, o),
                None => {
                    self.works.remove(&k);
                }
            }
        }
        failed
    }

    /// The plan's view of each data set that parses: its spec and status, what each
    /// cluster's Work of it reports, and its readers.
    fn plan_sets(&self) -> Vec<plan::Set> {
        let mut sets = Vec::new();
        for ((ns, name), o) in &self.datasets {
            let Ok(spec) = DataSetSpec::parse(o.spec.as_ref()) else {
                continue;
            };
            let wname = plan::work_name(ns, name);
            let mut seen = BTreeMap::new();
            for cluster in self.clusters.keys() {
                let wns = orrery_api::cluster::namespace_of(cluster);
                let Some(w) = self.works.get(&(wns, wname.clone())) else {
                    continue;
                };
                let st = work_status(w);
                seen.insert(
                    cluster.clone(),
                    plan::Seen {
                        volume: st
                            .manifest_statuses
                            .iter()
                            .find(|m| m.identifier.kind == "PersistentVolumeClaim")
                            .and_then(|m| m.volumes.first().cloned()),
                        transfers: st.transfers,
                    },
                );
            }
            sets.push(plan::Set {
                namespace: ns.clone(),
                name: name.clone(),
                spec,
                status: DataSetStatus::of(o),
                seen,
                readers: self
                    .readers
                    .get(&(ns.clone(), name.clone()))
                    .into_iter()
                    .flatten()
                    .map(|(_, r)| r.clone())
                    .collect(),
            });
        }
        sets
    }

    /// The plan's view of each DataTransfer whose spec parses.
    fn plan_transfers(&self) -> Vec<plan::Xfer> {
        self.transfers
            .iter()
            .filter_map(|((ns, name), o)| {
                Some(plan::Xfer {
                    namespace: ns.clone(),
                    name: name.clone(),
                    spec: DataTransferSpec::parse(o.spec.as_ref()).ok()?,
                    status: DataTransferStatus::of(o),
                    created: o.metadata.creation_timestamp,
                })
            })
            .collect()
    }

    /// Writes the data sets' statuses that changed; returns how many writes failed, and
    /// the data sets held (their status not written).
    ///
    /// The data sets' statuses go first: they hold each copy's round. A data set whose status
    /// was not written has nothing else of this round written either (its transfers, Works
    /// and new transfers wait for the next round), so what is stored never runs ahead of
    /// it; the plan also takes a copy's round from its transfer when the status lags.
    async fn write_set_statuses(
        &self,
        statuses: &BTreeMap<NKey, DataSetStatus>,
        wrote_sets: &mut Vec<(NKey, Arc<Object>)>,
    ) -> (usize, std::collections::BTreeSet<NKey>) {
        let mut failed = 0;
        let mut held: std::collections::BTreeSet<NKey> = Default::default();
        for (k, st) in statuses {
            if let Some(o) = self.datasets.get(k)
                && DataSetStatus::of(o) != *st
            {
                let r = self
                    .write_status(&keys::well_known::dataset(&k.0, &k.1), o, st)
                    .await
                    .map(|o| wrote_sets.push((k.clone(), o)));
                if note("data set status", r) > 0 {
                    failed += 1;
                    held.insert(k.clone());
                }
            }
        }
        (failed, held)
    }

    /// Writes the transfers' statuses that changed, but for held data sets'; returns how
    /// many writes failed.
    async fn write_transfer_statuses(
        &self,
        statuses: &BTreeMap<NKey, DataTransferStatus>,
        held: &std::collections::BTreeSet<NKey>,
        wrote_transfers: &mut Vec<(NKey, Arc<Object>)>,
    ) -> usize {
        let mut failed = 0;
        let set_of = |k: &NKey| -> NKey {
            let set = self
                .transfers
                .get(k)
                .and_then(|o| {
                    o.spec
                        .as_ref()?
                        .get("dataSet")?
                        .as_str()
                        .map(str::to_string)
                })
                .unwrap_or_default();
            (k.0.clone(), set)
        };
        for (k, st) in statuses {
            if held.contains(&set_of(k)) {
                continue;
            }
            if let Some(o) = self.transfers.get(k)
                && DataTransferStatus::of(o) != *st
            {
                let r = self
                    .write_status(&keys::well_known::datatransfer(&k.0, &k.1), o, st)
                    .await
                    .map(|o| wrote_transfers.push((k.clone(), o)));
                failed += note("transfer status", r);
            }
        }
        failed
    }

    /// Deletes the transfers finished long enough ago (and forgets those gone); returns
    /// how many deletions failed.
    async fn delete_transfers(&mut self, delete: &[NKey]) -> usize {
        let mut failed = 0;
        for k in delete {
            let r = self
                .store
                .delete(
                    &keys::well_known::datatransfer(&k.0, &k.1),
                    &Preconditions::default(),
                )
                .await
                .map(|_| ());
            if ignore_not_found(r.clone()).is_ok() {
                self.transfers.remove(k);
            }
            failed += note("transfer delete", ignore_not_found(r));
        }
        failed
    }

    /// Makes the planned transfers, but for held data sets'; returns how many creations
    /// failed.
    async fn create_transfers(
        &self,
        create: &[(NKey, DataTransferSpec)],
        held: &std::collections::BTreeSet<NKey>,
        wrote_transfers: &mut Vec<(NKey, Arc<Object>)>,
    ) -> usize {
        let mut failed = 0;
        for ((ns, name), spec) in create {
            if held.contains(&(ns.clone(), spec.data_set.clone())) {
                continue;
            }
            let mut o = new_object(
                &format!("{}/v1alpha1", "multicluster.io"),
                orrery_api::data::DATATRANSFER_KIND,
                Some(ns),
                name,
            );
            o.spec = serde_json::to_value(spec).ok();
            o.status = serde_json::to_value(DataTransferStatus::default()).ok();
            tracing::info!(namespace = %ns, transfer = %name, dataset = %spec.data_set, destination = %spec.destination, reason = %spec.reason, "a data set copy is planned");
            let r = match self
                .store
                .create(&keys::well_known::datatransfer(ns, name), o)
                .await
            {
                Ok(o) => {
                    wrote_transfers.push(((ns.clone(), name.clone()), o));
                    Ok(())
                }
                Err(StoreError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(e),
            };
            failed += note("transfer create", r);
        }
        failed
    }

    async fn write_status<T: serde::Serialize>(
        &self,
        key: &str,
        o: &Object,
        status: &T,
    ) -> Result<Arc<Object>, StoreError> {
        let mut next = o.clone();
        next.status = serde_json::to_value(status).ok();
        self.store.update(key, next, o.revision()).await
    }

    /// Makes the data set Works what the plan wants: new ones created, changed ones
    /// updated, the others deleted.
    /// Returns how many writes failed, and what was written (`None`: deleted).
    async fn write_works(
        &self,
        want: &BTreeMap<plan::WorkKey, orrery_api::work::WorkSpec>,
        held: &std::collections::BTreeSet<NKey>,
    ) -> (usize, Vec<(NKey, Option<Arc<Object>>)>) {
        // The Works of data sets whose status was not written stay as they are.
        let held_names: std::collections::BTreeSet<String> = held
            .iter()
            .map(|(ns, set)| plan::work_name(ns, set))
            .collect();
        let mut failed = 0;
        let mut wrote = Vec::new();
        let mut wanted_keys = std::collections::BTreeSet::new();
        for ((cluster, ns, set), spec) in want {
            let wns = orrery_api::cluster::namespace_of(cluster);
            let wname = plan::work_name(ns, set);
            wanted_keys.insert((wns.clone(), wname.clone()));
            if held_names.contains(&wname) {
                continue;
            }
            let Ok(value) = serde_json::to_value(spec) else {
                continue;
            };
            let key = keys::well_known::work(&wns, &wname);
            let wk = (wns.clone(), wname.clone());
            let r = match self.works.get(&wk) {
                Some(w) if w.spec.as_ref() == Some(&value) => Ok(()),
                Some(w) => {
                    let mut next = (**w).clone();
                    next.spec = Some(value);
                    next.metadata.generation = Some(w.metadata.generation.unwrap_or(1) + 1);
                    self.store
                        .update(&key, next, w.revision())
                        .await
                        .map(|o| wrote.push((wk.clone(), Some(o))))
                }
                None => {
                    let mut w = new_object("multicluster.io/v1alpha1", "Work", Some(&wns), &wname);
                    w.metadata
                        .annotations
                        .insert(WORK_ANNOTATION.into(), format!("{ns}/{set}"));
                    w.spec = Some(value);
                    match self.store.create(&key, w).await {
                        Ok(o) => {
                            wrote.push((wk.clone(), Some(o)));
                            Ok(())
                        }
                        Err(StoreError::AlreadyExists { .. }) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            };
            if let Err(e) = r {
                failed += 1;
                tracing::debug!(work = %wname, cluster = %cluster, error = %e, "writing a data set Work failed; it is tried again");
            }
        }
        for (k, w) in &self.works {
            if wanted_keys.contains(k) || held_names.contains(&k.1) {
                continue;
            }
            // Decided from a synced cache; the delete is conditional on the uid seen, so a
            // Work made anew meanwhile stays.
            let r = self
                .store
                .delete(
                    &keys::well_known::work(&k.0, &k.1),
                    &Preconditions {
                        uid: Some(w.metadata.uid.clone()),
                        revision: None,
                    },
                )
                .await
                .map(|_| ());
            if let Err(e) = ignore_not_found(r) {
                failed += 1;
                tracing::debug!(work = %k.1, error = %e, "deleting a data set Work failed; it is tried again");
            } else {
                tracing::info!(work = %k.1, namespace = %k.0, "a data set copy is removed");
                wrote.push((k.clone(), None));
            }
        }
        (failed, wrote)
    }
}

/// 1 for a failed write (logged), 0 for one that went through.
fn note(what: &str, r: Result<(), StoreError>) -> usize {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::debug!(what, error = %e, "a data mover write failed; it is tried again");
            1
        }
    }
}

/// Puts what was written into a cache, unless the cache already holds a newer version (the
/// watch may have been faster).
fn newer(cache: &mut BTreeMap<NKey, Arc<Object>>, k: NKey, o: Arc<Object>) {
    if cache
        .get(&k)
        .is_none_or(|cur| cur.revision() <= o.revision())
    {
        cache.insert(k, o);
    }
}

fn ignore_not_found(r: Result<(), StoreError>) -> Result<(), StoreError> {
    match r {
        Err(StoreError::NotFound { .. }) => Ok(()),
        r => r,
    }
}
