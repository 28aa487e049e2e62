#[test]
fn a_refusal_of_the_moment_is_retried_soon_one_on_its_merits_later() {
    use super::{REFUSED_HOLD, RETRY_HOLD, RETRY_HOLD_MAX, refusal_hold};
    let conflict = "CONFLICT: Operation cannot be fulfilled on works";
    assert_eq!(refusal_hold(conflict, None), RETRY_HOLD);
    assert_eq!(refusal_hold(conflict, Some(RETRY_HOLD)), RETRY_HOLD * 2);
    assert_eq!(refusal_hold(conflict, Some(RETRY_HOLD_MAX)), RETRY_HOLD_MAX);
    assert_eq!(refusal_hold("TOO_MANY_REQUESTS: later", None), RETRY_HOLD);
    assert_eq!(
        refusal_hold("VALIDATION_FAILED: bad status", None),
        REFUSED_HOLD
    );
    // After a long hold, a conflict starts short again.
    assert_eq!(refusal_hold(conflict, Some(REFUSED_HOLD)), RETRY_HOLD);
}

use super::session::{SETTING_UP, hold_while_setting_up};
use super::*;
use crate::backend::{Backend, BackendError, MemberReport, ObjectState, ProxyBody, proxy_error};

/// A member for these tests: objects kept as applied, an outage and a latency to set. (The
/// simulated cluster is the `orrery-sim` crate, which depends on this one; the end-to-end
/// tests run the agent against it.)
#[derive(Debug, Default)]
struct Member {
    objects: parking_lot::Mutex<BTreeMap<String, Value>>,
    faults: parking_lot::Mutex<Faults>,
    changed: Option<tokio::sync::watch::Sender<u64>>,
}

#[derive(Debug, Default, Clone)]
struct Faults {
    outage: bool,
    latency: Duration,
}

impl Member {
    fn new() -> Self {
        Member {
            changed: Some(tokio::sync::watch::channel(0).0),
            ..Member::default()
        }
    }

    fn set_faults(&self, f: Faults) {
        *self.faults.lock() = f;
    }

    async fn gate(&self) -> Result<(), BackendError> {
        let f = self.faults.lock().clone();
        tokio::time::sleep(f.latency).await;
        if f.outage {
            return Err(BackendError::Unavailable("a test outage".into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Backend for Member {
    async fn apply(&self, m: &Value, _overwrite: bool, _: &Cause) -> Result<(), BackendError> {
        self.gate().await?;
        let id = ResourceIdentifier::of(0, m).ok_or_else(|| BackendError::Rejected {
            what: "a manifest".into(),
            message: "it has no apiVersion, kind or name".into(),
        })?;
        self.objects.lock().insert(id.describe(), m.clone());
        Ok(())
    }

    async fn observed(&self, id: &ResourceIdentifier) -> Result<Option<Value>, BackendError> {
        self.gate().await?;
        Ok(self.objects.lock().get(&id.describe()).cloned())
    }

    async fn delete(&self, id: &ResourceIdentifier, _: &Cause) -> Result<(), BackendError> {
        self.gate().await?;
        self.objects.lock().remove(&id.describe());
        Ok(())
    }

    async fn state(&self, id: &ResourceIdentifier) -> Result<Option<ObjectState>, BackendError> {
        self.gate().await?;
        Ok(self
            .objects
            .lock()
            .contains_key(&id.describe())
            .then(ObjectState::default))
    }

    async fn report(&self) -> Result<MemberReport, BackendError> {
        self.gate().await?;
        Ok(MemberReport {
            healthy: true,
            ..MemberReport::default()
        })
    }

    async fn proxy(&self, _: http::Request<bytes::Bytes>) -> http::Response<ProxyBody> {
        proxy_error(http::StatusCode::NOT_FOUND, "no API here")
    }

    async fn proxy_upgrade(
        &self,
        _: http::request::Parts,
        _: hyper::upgrade::OnUpgrade,
    ) -> http::Response<ProxyBody> {
        proxy_error(http::StatusCode::NOT_FOUND, "no API here")
    }

    fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        match &self.changed {
            Some(tx) => tx.subscribe(),
            None => tokio::sync::watch::channel(0).1,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_fleet_member_gives_its_place_back_when_set_up_or_after_a_while() {
    let limit = Arc::new(tokio::sync::Semaphore::new(1));
    // Given back as soon as the session is set up.
    let done = hold_while_setting_up(limit.clone().acquire_owned().await.unwrap());
    tokio::task::yield_now().await;
    assert!(
        limit.clone().try_acquire_owned().is_err(),
        "held while setting up"
    );
    drop(done);
    let again = tokio::time::timeout(Duration::from_millis(1), limit.clone().acquire_owned());
    let permit = again.await.expect("given back once set up").unwrap();
    // A session that never gets set up (a server that never answers) holds it no longer
    // than SETTING_UP.
    let _stuck = hold_while_setting_up(permit);
    tokio::time::sleep(SETTING_UP - Duration::from_secs(1)).await;
    assert!(limit.clone().try_acquire_owned().is_err());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        limit.try_acquire_owned().is_ok(),
        "given back after SETTING_UP"
    );
}

#[test]
fn values_compare_equal_but_for_the_skipped_pointers() {
    let skip = ["/t", "/n/lat", "/u/nvidia.com~1gpu", "/a/1"];
    let base = json!({
        "t": 1, "n": {"lat": 1.0, "region": "r1"},
        "u": {"cpu": "1", "nvidia.com/gpu": "2"}, "a": [1, 2, 3],
    });
    let with = |at: &str, v: Option<Value>| {
        let mut x = base.clone();
        let (parent, key) = at.rsplit_once('/').unwrap();
        let key = key.replace("~1", "/");
        let target = x.pointer_mut(parent).unwrap();
        match (target, v) {
            (Value::Array(a), Some(v)) => a[key.parse::<usize>().unwrap()] = v,
            (Value::Object(m), Some(v)) => {
                m.insert(key, v);
            }
            (Value::Object(m), None) => {
                m.remove(&key);
            }
            _ => unreachable!(),
        }
        x
    };
    let cases = [
        ("itself", base.clone(), true),
        ("a skipped member changed", with("/t", Some(json!(2))), true),
        ("a skipped member gone", with("/t", None), true),
        (
            "a nested skipped member changed",
            with("/n/lat", Some(json!(9))),
            true,
        ),
        (
            "a skipped member whose key has a slash",
            with("/u/nvidia.com~1gpu", Some(json!("7"))),
            true,
        ),
        (
            "a skipped array element",
            with("/a/1", Some(json!(5))),
            true,
        ),
        ("its sibling", with("/n/region", Some(json!("r2"))), false),
        ("a sibling gone", with("/n/region", None), false),
        ("a member added", with("/n/zone", Some(json!("z"))), false),
        (
            "a key like the skipped one",
            with("/u/nvidia.com", Some(json!("2"))),
            false,
        ),
        ("another array element", with("/a/0", Some(json!(5))), false),
        (
            "a member not skipped",
            with("/u/cpu", Some(json!("2"))),
            false,
        ),
    ];
    for (what, other, same) in cases {
        let mut at = String::new();
        assert_eq!(equal_except(&base, &other, &mut at, &skip), same, "{what}");
        assert_eq!(
            equal_except(&other, &base, &mut at, &skip),
            same,
            "{what}, reversed"
        );
        assert!(at.is_empty(), "{what}: the pointer is given back as it was");
    }
}

#[test]
fn a_status_is_written_again_only_when_it_says_something_new() {
    let status = |usage_cpu: &str, allocated_cpu: &str, ready: &str, latency: f64, at: &str| {
        json!({
            "conditions": [{"type": "Ready", "status": ready}],
            "lastHeartbeatTime": at,
            "network": {"serverLatencyMs": latency, "region": "r1"},
            "resourceSummary": {
                "allocatable": {"cpu": "100", "memory": "64Gi"},
                "allocated": {"cpu": allocated_cpu},
                "usage": {"cpu": usage_cpu, "memory": "10Gi"},
            },
        })
    };
    let written = status("30", "20", "True", 1.5, "2026-01-01T00:00:00Z");
    let cases = [
        (
            "the time and latency of the beat",
            status("30", "20", "True", 2.4, "2026-01-01T00:00:10Z"),
            true,
        ),
        (
            "a round trip much longer",
            status("30", "20", "True", 9.0, "x"),
            false,
        ),
        (
            "usage drifting under a percent of allocatable",
            status("30900m", "20", "True", 1.5, "x"),
            true,
        ),
        (
            "usage drifting by more",
            status("31100m", "20", "True", 1.5, "x"),
            false,
        ),
        (
            "usage falling by more",
            status("28", "20", "True", 1.5, "x"),
            false,
        ),
        (
            "one more replica's requests",
            status("30", "20100m", "True", 1.5, "x"),
            false,
        ),
        ("readiness", status("30", "20", "False", 1.5, "x"), false),
    ];
    for (what, now, same) in cases {
        assert_eq!(same_status(&written, &now), same, "{what}");
    }
    // The first round trip measured is news.
    let mut unmeasured = written.clone();
    unmeasured["network"]
        .as_object_mut()
        .unwrap()
        .remove("serverLatencyMs");
    assert!(!same_status(&unmeasured, &written));
    assert!(same_latency(Some(40.0), Some(79.0)));
    assert!(!same_latency(Some(40.0), Some(81.0)));
    assert!(same_latency(Some(0.2), Some(5.1)));
    assert!(!same_latency(Some(0.2), Some(5.3)));
    // Traffic is measured against the uplink's bandwidth.
    let traffic = |egress: f64| {
        let mut v = written.clone();
        v["network"]["bandwidthBytesPerSecond"] = json!(1000);
        v["network"]["egressBytesPerSecond"] = json!(egress);
        v
    };
    assert!(same_status(&traffic(500.0), &traffic(509.5)));
    assert!(!same_status(&traffic(500.0), &traffic(511.0)));
    assert!(!same_status(&written, &traffic(500.0)), "traffic begins");
    // A resource with nothing to measure drift against is compared exactly.
    let mut odd = written.clone();
    odd["resourceSummary"]["usage"]["gpu"] = json!("1");
    let mut odd2 = odd.clone();
    odd2["resourceSummary"]["usage"]["gpu"] = json!("2");
    assert!(same_status(&odd, &odd.clone()));
    assert!(!same_status(&odd, &odd2));
    assert!(!same_status(&written, &odd));
}

/// The status a beat wants: a member read says which lists it emptied (`null`, removed by the
/// patch); a member that could not be read says nothing of its figures, so they stay.
#[test]
fn a_status_removes_emptied_lists_and_keeps_an_unread_members_figures() {
    let t = MicroTime::now().time();
    let read = Ok(MemberReport {
        healthy: true,
        ..Default::default()
    });
    let s = cluster_status(&read, &mut Vec::new(), t, false, None, "h");
    for k in ["storageClasses", "dataSets", "serviceExports", "network"] {
        assert!(s.get(k).is_some_and(Value::is_null), "{k}: {s}");
    }
    assert!(s["resourceSummary"].is_object());
    let unread = Err(BackendError::Unavailable("gone".into()));
    let s = cluster_status(&unread, &mut Vec::new(), t, false, None, "h");
    let mut keys: Vec<&String> = s.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["caBundleHash", "conditions", "lastHeartbeatTime"]);
    assert_eq!(s["conditions"][0]["reason"], "MemberUnreachable");
}

/// RFC 7386 applied, as the server applies a heartbeat's patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A heartbeat sends what differs from the server's status, the conditions and the time
/// always, removes what the member no longer reports and leaves the server's fields alone;
/// applied to what the server has, it makes the agent's fields what the member says.
#[test]
fn a_heartbeat_patches_the_status_with_what_changed() {
    let want = |cpu: &str| {
        json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "lastHeartbeatTime": "2026-01-01T00:00:10Z",
            "kubernetesVersion": "v1.31.0",
            "apiEnablements": [{"groupVersion": "v1", "resources": [{"name": "pods"}]}],
            "resourceSummary": {
                "allocatable": {"cpu": "100", "memory": "64Gi"},
                "usage": {"cpu": cpu, "memory": "10Gi"},
            },
            "network": {"serverLatencyMs": 1.5},
            "largestNodeFree": null,
            "storageClasses": null,
            "dataSets": null,
            "serviceExports": null,
        })
    };
    // What the server has: the last beat's fields, the server's own, one the member stopped
    // reporting, and one inside a field that went.
    let mut has = want("30");
    // A stored status holds no nulls: a merge patch's null removes.
    has.as_object_mut().unwrap().retain(|_, v| !v.is_null());
    has["lastHeartbeatTime"] = json!("2026-01-01T00:00:00Z");
    has["waterLevel"] = json!({"cpu": 0.3});
    has["forecast"] = json!({"peak": 0.4});
    has["dataSets"] = json!([{"claim": "corpus"}]);
    has["resourceSummary"]["usage"]["nvidia.com/gpu"] = json!("1");
    let now = want("31");
    let patch = status_patch(Some(&has), &now);
    assert_eq!(
        patch,
        json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "lastHeartbeatTime": "2026-01-01T00:00:10Z",
            "resourceSummary": {"usage": {"cpu": "31", "nvidia.com/gpu": null}},
            "dataSets": null,
        }),
        "only what changed, and what went"
    );
    let mut applied = has.clone();
    merge_patch(&mut applied, &patch);
    let mut expected = now.clone();
    expected
        .as_object_mut()
        .unwrap()
        .retain(|_, v| !v.is_null());
    expected["waterLevel"] = has["waterLevel"].clone();
    expected["forecast"] = has["forecast"].clone();
    assert_eq!(applied, expected);
    // Nothing to compare with (a session's first beat, or a minute since the last whole
    // one): the whole status, the lists the member emptied removed.
    let whole = status_patch(None, &now);
    assert_eq!(whole, now);
    for k in [
        "apiEnablements",
        "kubernetesVersion",
        "network",
        "conditions",
    ] {
        assert_eq!(whole[k], now[k], "{k}");
    }
    for k in [
        "dataSets",
        "storageClasses",
        "serviceExports",
        "largestNodeFree",
    ] {
        assert!(whole.get(k).is_some_and(Value::is_null), "{k} removed");
    }
    assert!(whole.get("waterLevel").is_none() && whole.get("forecast").is_none());
    let mut applied = has.clone();
    merge_patch(&mut applied, &whole);
    assert_eq!(
        applied["resourceSummary"]["usage"]["nvidia.com/gpu"],
        json!("1"),
        "a whole status as a merge patch leaves nested fields; the next diff removes them"
    );
    let mut again = applied.clone();
    merge_patch(&mut again, &status_patch(Some(&applied), &now));
    assert_eq!(again, expected);
    // An array (the API list) is sent whole when it changed; the same answer twice is one
    // beat's time and conditions.
    let mut more = now.clone();
    more["apiEnablements"][0]["resources"] = json!([{"name": "pods"}, {"name": "services"}]);
    let p = status_patch(Some(&expected), &more);
    assert_eq!(p["apiEnablements"], more["apiEnablements"]);
    let p = status_patch(Some(&expected), &now);
    let keys: Vec<&String> = p.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["conditions", "lastHeartbeatTime"]);
    // A member that could not be read reports its conditions only: its last figures stay
    // (they are shown greyed, and the scheduler keeps its limits), nothing is removed.
    let dark = json!({
        "conditions": [{"type": "Ready", "status": "False", "reason": "MemberUnreachable"}],
        "lastHeartbeatTime": "2026-01-01T00:00:20Z",
    });
    let p = status_patch(Some(&expected), &dark);
    assert_eq!(p, dark);
    let mut applied = expected.clone();
    merge_patch(&mut applied, &p);
    for k in [
        "resourceSummary",
        "apiEnablements",
        "kubernetesVersion",
        "waterLevel",
    ] {
        assert_eq!(applied[k], expected[k], "{k} kept");
    }
}

fn cause() -> Cause {
    Cause {
        work: "orrery-cluster-m1/default.web-deployment".into(),
        uid: "u1".into(),
        generation: 1,
        revision: "7".into(),
        reason: "Work deleted",
    }
}

/// A server that takes the connection and never answers does not hold the heartbeats:
/// each beat is given up at its limit; the first is skipped, the second in a row ends
/// the session (the next tries another replica, on new connections).
#[tokio::test(start_paused = true)]
async fn heartbeats_that_get_no_answer_end_the_session_in_time() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            open.push(c);
        }
    });
    let sim = Arc::new(Member::new());
    let mut cfg = AgentConfig::new(&url, "m1");
    cfg.heartbeat_interval = Duration::from_millis(100);
    let inner = Inner::new(cfg, sim, AgentState::default());
    let client = orrery_client::connect(&url, "t", "").await.unwrap();
    let t = Transport::new(client, "m1");
    let started = tokio::time::Instant::now();
    let end = heartbeat_loop(&inner, &t, Vec::new(), Beats::default()).await;
    assert!(
        matches!(&end, End::Transient(why) if why.contains("two heartbeats in a row")),
        "{end:?}"
    );
    // Two beats of 10 s each, and the pauses before them.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(20) && took < Duration::from_secs(21),
        "{took:?}"
    );
    held.abort();
}

/// A Work the member could not take because it did not answer says so
/// (`MemberUnavailable`), not that it was refused (`AppliedFailed`): a move must not take
/// an outage at its target for a refusal.
#[tokio::test]
async fn an_apply_failed_for_an_outage_is_not_a_refusal() {
    let sim = Arc::new(Member::new());
    let inner = Inner::new(
        AgentConfig::new("https://127.0.0.1:1", "m1"),
        sim.clone(),
        AgentState::default(),
    );
    let work = |name: &str| {
        Object::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
            "metadata": {"name": name, "namespace": "orrery-cluster-m1", "uid": name, "generation": 1},
            "spec": {"workload": {"manifests": [
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": name, "namespace": "default"}, "data": {"v": "1"}}]}}
        }))
        .expect("a Work")
    };
    let reason = |st: &WorkStatus| {
        orrery_api::conditions::find(&st.conditions, work::CONDITION_APPLIED)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    // Applied, then the member stops answering: its status cannot be read.
    inner.apply_work(&work("before")).await;
    let ids = |n: &str| identifiers(&inner.lock_state().works[n].manifests);
    let st = inner
        .work_status("before", 1, ids("before"), Time::now())
        .await;
    assert_eq!(
        reason(&st),
        Some(("True".into(), "AppliedSuccessful".into()))
    );
    sim.set_faults(Faults {
        outage: true,
        ..Faults::default()
    });
    let st = inner
        .work_status("before", 1, ids("before"), Time::now())
        .await;
    assert_eq!(
        reason(&st),
        Some(("False".into(), work::REASON_MEMBER_UNAVAILABLE.into()))
    );
    // Applied while it does not answer.
    inner.apply_work(&work("away")).await;
    let st = inner.work_status("away", 1, ids("away"), Time::now()).await;
    assert_eq!(
        reason(&st),
        Some(("False".into(), work::REASON_MEMBER_UNAVAILABLE.into()))
    );
    // A refusal is still a refusal.
    sim.set_faults(Faults::default());
    let mut refused = work("refused");
    // A manifest without a kind is refused.
    refused.spec.as_mut().expect("a spec")["workload"]["manifests"][0]
        .as_object_mut()
        .expect("a manifest")
        .remove("kind");
    inner.apply_work(&refused).await;
    let st = inner
        .work_status("refused", 1, ids("refused"), Time::now())
        .await;
    assert_eq!(reason(&st), Some(("False".into(), "AppliedFailed".into())));
}

/// A Work's Retain script runs on updates of what the member has, with the member's object:
/// what the script keeps is applied, Orrery's label and annotation stay whatever it returns,
/// and a failing script applies the manifest as it is and says so in `Retained`.
#[tokio::test]
async fn a_retain_script_runs_on_the_members_object() {
    let sim = Arc::new(Member::new());
    let inner = Inner::new(
        AgentConfig::new("https://127.0.0.1:1", "m1"),
        sim.clone(),
        AgentState::default(),
    );
    let work = |generation: i64, v: &str, script: &str| {
        Object::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
            "metadata": {"name": "w", "namespace": "orrery-cluster-m1", "uid": "w", "generation": generation},
            "spec": {
                "workload": {"manifests": [
                    {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "c", "namespace": "default"}, "data": {"v": v}}]},
                "retention": [{"apiVersion": "v1", "kind": "ConfigMap",
                               "customization": "keep", "luaScript": script}],
            }
        }))
        .expect("a Work")
    };
    let keep = "function Retain(d, o)\n  d.data.kept = o.data.kept\n  d.metadata.labels = nil\n  return d\nend";
    let member = || sim.objects.lock()["ConfigMap v1 default/c"].clone();
    let retained = |st: &WorkStatus| {
        orrery_api::conditions::find(&st.conditions, work::CONDITION_RETAINED)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let status = || async {
        let ids = identifiers(&inner.lock_state().works["w"].manifests);
        inner.work_status("w", 1, ids, Time::now()).await
    };
    // Created: nothing observed, nothing retained.
    inner.apply_work(&work(1, "1", keep)).await;
    assert_eq!(member()["data"], json!({"v": "1"}));
    // Someone in the member adds a key; the next version keeps it, and stays Orrery's.
    sim.objects
        .lock()
        .get_mut("ConfigMap v1 default/c")
        .unwrap()["data"]["kept"] = json!("yes");
    inner.apply_work(&work(2, "2", keep)).await;
    let m = member();
    assert_eq!(m["data"], json!({"v": "2", "kept": "yes"}));
    assert_eq!(
        m["metadata"]["labels"][work::MANAGED_LABEL],
        work::MANAGED_VALUE
    );
    assert_eq!(
        m["metadata"]["annotations"][work::WORK_ANNOTATION],
        "orrery-cluster-m1/w"
    );
    assert_eq!(retained(&status().await), None);
    // A failing script: applied as it is, and told.
    inner
        .apply_work(&work(
            3,
            "3",
            "function Retain(d, o) error('not today') end",
        ))
        .await;
    assert_eq!(member()["data"], json!({"v": "3"}));
    let (st, reason, message) = retained(&status().await).expect("Retained");
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("False", work::REASON_INTERPRET_FAILED)
    );
    assert!(
        message.starts_with("Retain of ResourceInterpreterCustomization keep failed:")
            && message.contains("not today"),
        "{message}"
    );
    // Mended: the condition goes.
    inner.apply_work(&work(4, "4", keep)).await;
    assert_eq!(retained(&status().await), None);
}

/// A retried deletion cut short (the session ends while the member answers slowly, and
/// the future is dropped) stays owed, and is carried out by the next retry.
#[tokio::test]
async fn a_retried_delete_cut_short_stays_owed() {
    let sim = Arc::new(Member::new());
    let m = stamped(
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "web", "namespace": "default"}, "data": {"v": "1"}}),
        "orrery-cluster-m1/default.web-deployment",
    );
    let id = ResourceIdentifier::of(0, &m).expect("a manifest with a kind and a name");
    sim.apply(&m, false, &cause()).await.expect("applied");
    let mut state = AgentState::default();
    let owed = owe_dropped(&mut state, std::slice::from_ref(&m), &[], &cause());
    assert_eq!(owed.len(), 1);
    let inner = Inner::new(
        AgentConfig::new("https://127.0.0.1:1", "m1"),
        sim.clone(),
        state,
    );
    sim.set_faults(Faults {
        latency: Duration::from_millis(500),
        ..Faults::default()
    });
    let cut = tokio::time::timeout(Duration::from_millis(50), inner.retry_deletes()).await;
    assert!(cut.is_err(), "the slow member outlasts the session");
    assert_eq!(inner.lock_state().pending_deletes.len(), 1, "still owed");
    assert!(matches!(sim.state(&id).await, Ok(Some(_))));
    sim.set_faults(Faults::default());
    inner.retry_deletes().await;
    assert!(inner.lock_state().pending_deletes.is_empty());
    assert!(matches!(sim.state(&id).await, Ok(None)), "deleted");
}
