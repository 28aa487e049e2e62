use super::*;

fn t(name: &str, replicas: i64) -> TargetCluster {
    TargetCluster {
        name: name.into(),
        replicas,
    }
}

#[test]
fn a_queued_trigger_does_not_swallow_a_fresh_decision() {
    use Trigger::*;
    assert_eq!(ClustersChanged.merged(Recovered), Recovered);
    assert_eq!(Retry.merged(Requested), Requested);
    assert_eq!(Requested.merged(Recovered), Requested);
    assert_eq!(Recovered.merged(ClustersChanged), Recovered);
    assert_eq!(Binding.merged(Shed), Binding);
}

#[test]
fn a_placement_message_counts_replicas_only_for_kinds_that_have_them() {
    assert_eq!(
        placed_message(&[t("a", 3), t("b", 0)]),
        "placed on a(3), b(0)"
    );
    assert_eq!(
        placed_message(&[t("onprem-gpu", 0)]),
        "placed on onprem-gpu"
    );
    assert_eq!(placed_message(&[]), "placed on no cluster");
}

/// A store in which another writer (the detector, say) changes a binding just before the
/// scheduler's first write of it, which then fails as a conflict.
#[derive(Debug)]
struct Racing {
    inner: Arc<dyn Store>,
    raced: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Store for Racing {
    async fn get(&self, key: &str) -> orrery_store::Result<Object> {
        self.inner.get(key).await
    }
    async fn list(
        &self,
        prefix: &str,
        opts: &orrery_store::ListOptions,
    ) -> orrery_store::Result<orrery_store::ListResult> {
        self.inner.list(prefix, opts).await
    }
    async fn create(&self, key: &str, obj: Object) -> orrery_store::Result<Arc<Object>> {
        self.inner.create(key, obj).await
    }
    async fn update(
        &self,
        key: &str,
        obj: Object,
        expected: Option<orrery_store::Revision>,
    ) -> orrery_store::Result<Arc<Object>> {
        if key.contains("resourcebindings")
            && !self.raced.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let mut other = self.inner.get(key).await?;
            other.metadata.generation = Some(2);
            if let Some(r) = other.spec.as_mut().and_then(|s| s.get_mut("resource")) {
                r["resourceVersion"] = "2".into();
            }
            self.inner.update(key, other, None).await?;
        }
        self.inner.update(key, obj, expected).await
    }
    async fn delete(
        &self,
        key: &str,
        p: &orrery_store::Preconditions,
    ) -> orrery_store::Result<Arc<Object>> {
        self.inner.delete(key, p).await
    }
    async fn watch(
        &self,
        prefix: &str,
        from: orrery_store::Revision,
        opts: orrery_store::WatchOptions,
    ) -> orrery_store::Result<orrery_store::WatchStream> {
        self.inner.watch(prefix, from, opts).await
    }
    async fn current_revision(&self) -> orrery_store::Result<orrery_store::Revision> {
        self.inner.current_revision().await
    }
    async fn compact(&self, r: orrery_store::Revision) -> orrery_store::Result<()> {
        self.inner.compact(r).await
    }
    async fn compacted_revision(&self) -> orrery_store::Result<orrery_store::Revision> {
        self.inner.compacted_revision().await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

/// A decision whose write loses a race gives back the room it assumed: the next decision
/// places as much as the first would have (it once found the cluster full of replicas
/// that were never written, and placed none), and the history tells only of the decision
/// that was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_that_lost_its_write_holds_no_room() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> =
        Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
    let store: Arc<dyn Store> = Arc::new(Racing {
        inner: sqlite.clone(),
        raced: false.into(),
    });
    let mut c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name("a");
    c.metadata.generation = Some(1);
    c.spec = Some(serde_json::json!({"region": "r"}));
    let now = Time::now().to_string();
    let figures = serde_json::json!({"cpu": "10", "memory": "64Gi", "pods": "1000"});
    let none = serde_json::json!({"cpu": "0", "memory": "0", "pods": "0"});
    c.status = Some(serde_json::json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "Test",
            "lastTransitionTime": now}],
        "resourceSummary": {"allocatable": figures, "allocated": none, "usage": none},
        "lastHeartbeatTime": now,
    }));
    sqlite
        .create(&keys::well_known::cluster("a"), c)
        .await
        .unwrap();
    let bkey = keys::well_known::binding("default", "web-deployment");
    let mut b = Object::new(binding::API_VERSION, binding::KIND).with_name("web-deployment");
    b.metadata.namespace = "default".into();
    b.metadata.uid = "b-uid".into();
    b.metadata.generation = Some(1);
    // 200 replicas of 100m; half of the cluster's 10 cores hold 50.
    b.spec = Some(serde_json::json!({
        "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default",
            "name": "web", "uid": "t-uid", "resourceVersion": "1"},
        "replicas": 200,
        "replicaRequirements": {"resourceRequest": {"cpu": "100m"}},
        "placement": {"waterLevelLimit": 0.5,
            "replicaScheduling": {"replicaSchedulingType": "Divided"}},
        "policy": {"apiVersion": "multicluster.io/v1alpha1",
            "kind": "ResourcePlacementPolicy", "namespace": "default", "name": "p"},
    }));
    sqlite.create(&bkey, b).await.unwrap();

    let (stop, stopped) = watch::channel(false);
    let ctl = tokio::spawn(run(store.clone(), Settings::default(), stopped));
    let start = Instant::now();
    let placed = loop {
        let b = sqlite.get(&bkey).await.unwrap();
        let st = BindingStatus::of(&b);
        if st.scheduler_observed_generation == Some(2) {
            break BindingSpec::of(&b).unwrap().clusters;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no decision: {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        placed,
        vec![t("a", 50)],
        "the room the lost write assumed is free"
    );
    // The history is written after the binding: give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records = sqlite
        .list(history::PREFIX, &Default::default())
        .await
        .unwrap();
    let entries: Vec<ScheduleEntry> = records
        .items
        .iter()
        .flat_map(|r| history::record_entries(r.spec.as_ref().unwrap()).unwrap())
        .collect();
    assert_eq!(entries.len(), 1, "one decision written: {entries:?}");
    assert_eq!(entries[0].clusters, vec![t("a", 50)]);
    let _ = stop.send(true);
    let _ = ctl.await;
    sqlite.close().await;
}

/// Preemption takes the lowest priorities first, passes over a workload its disruption
/// budget protects and one that did not say it is preemptible, and takes no more than the
/// shortfall needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_takes_the_lowest_preemptible_priorities_within_their_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
    let mut c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name("a");
    c.metadata.generation = Some(1);
    c.spec = Some(serde_json::json!({"region": "r"}));
    let now = Time::now().to_string();
    // 10 cores, 10 requested by the four workloads below: full.
    c.status = Some(serde_json::json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "Test",
            "lastTransitionTime": now}],
        "resourceSummary": {
            "allocatable": {"cpu": "10", "memory": "64Gi", "pods": "1000"},
            "allocated": {"cpu": "10", "memory": "0", "pods": "10"},
            "usage": {"cpu": "10", "memory": "0", "pods": "10"}},
        "lastHeartbeatTime": now,
    }));
    store
        .create(&keys::well_known::cluster("a"), c)
        .await
        .unwrap();
    let put = |name: &str, replicas: i64, placed: Option<i64>, extra: serde_json::Value| {
        let mut b = Object::new(binding::API_VERSION, binding::KIND)
            .with_name(format!("{name}-deployment"));
        b.metadata.namespace = "default".into();
        b.metadata.uid = format!("{name}-uid");
        b.metadata.generation = Some(1);
        let mut spec = serde_json::json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default",
                "name": name, "uid": format!("{name}-t"), "resourceVersion": "1"},
            "replicas": replicas,
            "replicaRequirements": {"resourceRequest": {"cpu": "1"}},
            "placement": {"waterLevelLimit": 1.0,
                "replicaScheduling": {"replicaSchedulingType": "Divided"}},
            "policy": {"apiVersion": "multicluster.io/v1alpha1",
                "kind": "ResourcePlacementPolicy", "namespace": "default", "name": name},
        });
        if let Some(n) = placed {
            spec["clusters"] = serde_json::json!([{"name": "a", "replicas": n}]);
            b.status = Some(serde_json::json!({"schedulerObservedGeneration": 1}));
        }
        for (k, v) in extra.as_object().unwrap() {
            if k == "placement" {
                for (pk, pv) in v.as_object().unwrap() {
                    spec["placement"][pk] = pv.clone();
                }
            } else {
                spec[k] = v.clone();
            }
        }
        b.spec = Some(spec);
        (
            keys::well_known::binding("default", &format!("{name}-deployment")),
            b,
        )
    };
    let bindings = [
        // Protected by its budget: it may lose none of its 4.
        put(
            "guarded",
            4,
            Some(4),
            serde_json::json!({"schedulePriority": {"priority": 1},
            "placement": {"preemptible": true, "disruptionBudget": {"minAvailable": 4}}}),
        ),
        put(
            "lowest",
            2,
            Some(2),
            serde_json::json!({"schedulePriority": {"priority": 2},
            "placement": {"preemptible": true}}),
        ),
        put(
            "middle",
            2,
            Some(2),
            serde_json::json!({"schedulePriority": {"priority": 5},
            "placement": {"preemptible": true}}),
        ),
        // The lowest of all, but it never said it may be preempted.
        put("unwilling", 2, Some(2), serde_json::json!({})),
        // Needs 3 cores: lowest (2) and middle (2) free 4.
        put(
            "urgent",
            3,
            None,
            serde_json::json!({"schedulePriority": {"priority": 100,
            "preemptionPolicy": "PreemptLowerPriority"}}),
        ),
    ];
    for (k, b) in bindings {
        store.create(&k, b).await.unwrap();
    }
    let (stop, stopped) = watch::channel(false);
    let ctl = tokio::spawn(run(store.clone(), Settings::default(), stopped));
    let placed = |name: &str| {
        let store = store.clone();
        let k = keys::well_known::binding("default", &format!("{name}-deployment"));
        async move {
            let b = store.get(&k).await.unwrap();
            BindingSpec::of(&b).unwrap().clusters
        }
    };
    let start = Instant::now();
    while !(placed("lowest").await.is_empty() && placed("middle").await.is_empty()) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "lowest and middle not preempted: {:?} {:?} {:?}",
            placed("lowest").await,
            placed("middle").await,
            store
                .get(&keys::well_known::binding("default", "urgent-deployment"))
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(placed("guarded").await, vec![t("a", 4)]);
    assert_eq!(placed("unwilling").await, vec![t("a", 2)]);
    // Each victim keeps its old copy while it waits (make-before-break).
    let lowest = store
        .get(&keys::well_known::binding("default", "lowest-deployment"))
        .await
        .unwrap();
    let evictions = BindingSpec::of(&lowest).unwrap().evictions;
    assert!(
        evictions.iter().any(|e| e.cluster == "a"
            && e.reason.ends_with("(Preempted)")
            && e.keep_until.is_some()),
        "{evictions:?}"
    );
    let _ = stop.send(true);
    let _ = ctl.await;
    store.close().await;
}
