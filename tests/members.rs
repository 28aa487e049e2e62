//! Member clusters end to end: real `orrery server` and `orrery agent` processes on loopback,
//! simulated members, the real kubectl.

use crate::common;

use std::time::{Duration, Instant};

use common::{Agent, Server, eventually, http};
use serde_json::{Value, json};

const SIM: &str = "nodes=4,cpu=8,memory=32Gi,load=0.25,start=200ms";

fn sim_agent(s: &Server, name: &str, region: &str, extra: &[&str]) -> Agent {
    let token = s.token(name);
    let mut args = vec![
        "--cluster",
        name,
        "--token",
        &token,
        "--simulate",
        SIM,
        "--region",
        region,
        "--provider",
        "sim",
        "--heartbeat-interval",
        "1s",
        "--report-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    Agent::start(s, name, &args)
}

fn work(name: &str, replicas: u32) -> String {
    format!(
        r#"apiVersion: multicluster.io/v1alpha1
kind: Work
metadata: {{name: {name}}}
spec:
  workload:
    manifests:
    - apiVersion: apps/v1
      kind: Deployment
      metadata: {{name: {name}, namespace: default}}
      spec:
        replicas: {replicas}
        selector: {{matchLabels: {{app: {name}}}}}
        template:
          metadata: {{labels: {{app: {name}}}}}
          spec:
            containers:
            - name: app
              image: nginx:1.27
              resources: {{requests: {{cpu: 500m, memory: 512Mi}}}}
    - apiVersion: v1
      kind: ConfigMap
      metadata: {{name: {name}-config, namespace: default}}
      data: {{mode: fast}}
"#
    )
}

fn ready_replicas(s: &Server, ns: &str, name: &str) -> i64 {
    let v = s.get_json(&["work", name, "-n", ns]);
    v.pointer("/status/manifestStatuses/0/status/readyReplicas")
        .and_then(Value::as_i64)
        .unwrap_or(-1)
}

fn summary(admin: &str, cluster: &str) -> Value {
    let (code, body) = http("GET", admin, &format!("/clusters/{cluster}"), "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn three_agents_in_three_regions_become_ready_at_once() {
    let s = Server::start();
    let regions = [
        ("east", "us-east"),
        ("west", "us-west"),
        ("eu", "eu-central"),
    ];
    let tokens: Vec<String> = regions.iter().map(|(n, _)| s.token(n)).collect();
    let started = Instant::now();
    let _agents: Vec<Agent> = regions
        .iter()
        .zip(&tokens)
        .map(|((n, r), t)| {
            let args = [
                "--cluster",
                n,
                "--token",
                t,
                "--simulate",
                SIM,
                "--region",
                r,
                "--provider",
                "sim",
                "--heartbeat-interval",
                "1s",
            ];
            Agent::start(&s, n, &args)
        })
        .collect();
    eventually(Duration::from_secs(10), "three Ready clusters", || {
        // One kubectl call a poll, so the poll itself adds little to the time measured.
        let ready = s.ok(&[
            "get",
            "clusters",
            "-o",
            "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        ready.split_whitespace().filter(|r| *r == "True").count() == 3
    });
    // From process start (a debug build, with the other end-to-end tests running beside it)
    // to Ready as kubectl reads it; the benchmark measures registration alone (25 ms p99).
    let took = started.elapsed();
    eprintln!("three agents Ready {took:?} after they started");
    assert!(took < Duration::from_secs(2), "Ready after {took:?}");

    let table = s.ok(&["get", "clusters"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "MODE", "READY", "REGION", "WATER-LEVEL", "AGE"]
    );
    for (name, region) in [
        ("east", "us-east"),
        ("west", "us-west"),
        ("eu", "eu-central"),
    ] {
        let row = table.lines().find(|l| l.starts_with(name)).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cols[1..4], ["Pull", "True", region], "{row}");
        let wl: f64 = cols[4]
            .parse()
            .unwrap_or_else(|_| panic!("a water level in {row}"));
        assert!(
            (0.2..0.3).contains(&wl),
            "background load 0.25 gives a level near 0.25: {row}"
        );
    }
    let east = s.get_json(&["cluster", "east"]);
    assert_eq!(
        east["status"]["nodeSummary"],
        json!({"totalNum": 4, "readyNum": 4})
    );
    assert_eq!(
        east["status"]["resourceSummary"]["allocatable"]["cpu"],
        "32"
    );
    assert_eq!(east["status"]["largestNodeFree"]["cpu"], "6");
    assert_eq!(east["status"]["waterLevel"]["cpu"], 0.25);
    assert_eq!(east["status"]["kubernetesVersion"], "v1.32.0+orrery-sim");
    assert_eq!(east["spec"]["region"], "us-east");
    assert!(
        east["status"]["network"]["latencyMs"].is_object() || east["status"]["network"].is_object()
    );
    // Each cluster has its namespace and its inventory entry.
    s.ok(&["get", "namespace", "orrery-cluster-east"]);
    eventually(Duration::from_secs(5), "ClusterProfiles", || {
        s.get_json(&["clusterprofiles", "-n", "orrery-system"])["items"]
            .as_array()
            .map(Vec::len)
            == Some(3)
    });
    let profile = s.get_json(&["clusterprofile", "west", "-n", "orrery-system"]);
    assert_eq!(profile["spec"]["clusterManager"]["name"], "orrery");
    // How a consumer (MultiKueue) reaches the member: the cluster proxy, with the server's CA.
    let access = &profile["status"]["accessProviders"][0];
    assert_eq!(access["name"], "orrery", "{profile:#}");
    assert_eq!(
        access["cluster"]["server"],
        format!(
            "{}/apis/multicluster.io/v1alpha1/clusters/west/proxy",
            s.url
        ),
        "{profile:#}"
    );
    assert!(access["cluster"]["certificate-authority-data"].is_string());
    assert_eq!(
        profile["status"]["credentialProviders"],
        profile["status"]["accessProviders"]
    );
    assert_eq!(
        profile["status"]["version"]["kubernetes"],
        "v1.32.0+orrery-sim"
    );
    let props = profile["status"]["properties"].as_array().unwrap();
    assert!(
        props
            .iter()
            .any(|p| p["name"] == "cluster.clusterset.k8s.io" && p["value"] == "west")
    );
    assert!(
        props
            .iter()
            .any(|p| p["name"] == "region.multicluster.io" && p["value"] == "us-west")
    );
    let conds = profile["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "ControlPlaneHealthy" && c["status"] == "True")
    );
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Joined" && c["status"] == "True")
    );
}

#[test]
fn a_steady_member_renews_its_lease_and_leaves_its_cluster_unwritten() {
    // A grace period of 2 s and beats every second: the cluster stays Ready on renewals
    // alone, with its status written only when it changes.
    let s = Server::start_with(&["--cluster-grace-period", "2s"]);
    let _east = sim_agent(&s, "east", "us-east", &[]);
    eventually(Duration::from_secs(10), "Ready", || {
        s.cluster_condition("east", "Ready") == "True"
    });
    let lease = |s: &Server| s.get_json(&["lease", "east", "-n", "orrery-member-lease"]);
    eventually(Duration::from_secs(10), "the Lease renewed", || {
        s.kubectl(&["get", "lease", "east", "-n", "orrery-member-lease"])
            .status
            .success()
            && !lease(&s)["spec"]["renewTime"].is_null()
    });
    let l = lease(&s);
    assert_eq!(l["spec"]["holderIdentity"], "east", "{l}");
    assert_eq!(
        l["metadata"]["ownerReferences"][0]["kind"], "Cluster",
        "{l}"
    );
    let written =
        |s: &Server| s.get_json(&["cluster", "east"])["status"]["lastHeartbeatTime"].clone();
    let status_before = written(&s);
    // Every beat renews the Lease or writes the status; a status is written only when it
    // says something new (early in a session that may be the round trip to the server, whose
    // lowest recent figure falls as heartbeats come in, and under load moves past tolerance).
    let mut renewals = std::collections::BTreeSet::new();
    let mut statuses = vec![s.get_json(&["cluster", "east"])["status"].clone()];
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        renewals.insert(lease(&s)["spec"]["renewTime"].to_string());
        let c = s.get_json(&["cluster", "east"]);
        assert_eq!(s.cluster_condition("east", "Ready"), "True");
        if c["status"]["lastHeartbeatTime"] != statuses[statuses.len() - 1]["lastHeartbeatTime"] {
            statuses.push(c["status"].clone());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(renewals.len() >= 3, "renewed every beat: {renewals:?}");
    // What a status says besides its time and round trip, and the round trip.
    let said = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("lastHeartbeatTime");
        let rt = v["network"]
            .as_object_mut()
            .and_then(|n| n.remove("serverLatencyMs"))
            .and_then(|l| l.as_f64());
        (v, rt)
    };
    for w in statuses.windows(2) {
        let ((a, ra), (b, rb)) = (said(&w[0]), said(&w[1]));
        let round_trip_moved = match (ra, rb) {
            (Some(x), Some(y)) => (x - y).abs() > 5.0 && x.max(y) > 2.0 * x.min(y),
            (x, y) => x != y,
        };
        assert!(
            a != b || round_trip_moved,
            "a status written again said nothing new:\n{}\n{}",
            w[0],
            w[1]
        );
    }
    // What the agent vouches for: its status as last written.
    let rv = s.get_json(&["cluster", "east"])["metadata"]["resourceVersion"].clone();
    let vouched = lease(&s)["metadata"]["annotations"]["cluster.orrery.io/status-revision"].clone();
    assert!(
        vouched.as_str().unwrap().parse::<i64>().unwrap()
            <= rv.as_str().unwrap().parse::<i64>().unwrap(),
        "{vouched} {rv}"
    );
    // A change in the member is written at the next beat.
    s.stdin(
        &["apply", "-n", "orrery-cluster-east", "-f", "-"],
        &work("web", 2),
    );
    eventually(
        Duration::from_secs(10),
        "the requests in the resource summary",
        || s.get_json(&["cluster", "east"])["status"]["resourceSummary"]["allocated"]["cpu"] == "9",
    );
    assert_ne!(written(&s), status_before);
    // Told Unknown by the server while it still renews (as a new leader might), the agent
    // writes its status again at once rather than renewing over it.
    s.ok(&[
        "patch",
        "cluster",
        "east",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"Unknown","reason":"ClusterStatusUnknown"}]}}"#,
    ]);
    s.ok(&[
        "annotate",
        "lease",
        "east",
        "-n",
        "orrery-member-lease",
        "cluster.orrery.io/status-wanted=now",
    ]);
    eventually(Duration::from_secs(5), "Ready again", || {
        s.cluster_condition("east", "Ready") == "True"
    });
}

#[test]
fn works_run_and_report_and_a_silent_cluster_is_tainted_then_heals() {
    let s = Server::start_with(&[
        "--cluster-grace-period",
        "2s",
        "--cluster-eviction-timeout",
        "2s",
    ]);
    let mut east = sim_agent(&s, "east", "us-east", &[]);
    let _west = sim_agent(&s, "west", "us-west", &[]);
    eventually(Duration::from_secs(10), "Ready", || {
        s.cluster_condition("east", "Ready") == "True"
    });
    s.stdin(
        &["apply", "-n", "orrery-cluster-east", "-f", "-"],
        &work("web", 3),
    );
    eventually(
        Duration::from_secs(10),
        "the Deployment to run in east",
        || ready_replicas(&s, "orrery-cluster-east", "web") == 3,
    );
    let w = s.get_json(&["work", "web", "-n", "orrery-cluster-east"]);
    let conds = w["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Applied" && c["status"] == "True"),
        "{w}"
    );
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Available" && c["status"] == "True"),
        "{w}"
    );
    assert_eq!(
        w["status"]["manifestStatuses"][1]["identifier"]["kind"],
        "ConfigMap"
    );
    // The cluster's requests rose with the replicas.
    eventually(
        Duration::from_secs(5),
        "the requests in the resource summary",
        || {
            let c = s.get_json(&["cluster", "east"]);
            c["status"]["resourceSummary"]["allocated"]["cpu"] == "9500m"
        },
    );

    // Silence: after the grace period, Unknown and tainted; later NoExecute too. The agent is
    // killed just after a heartbeat arrives; that heartbeat came after `quiet_from` (the start
    // of the last read that did not show it), so no Unknown may come before `quiet_from` plus
    // the grace period, however slow the reads are.
    // A heartbeat renews the cluster's Lease, or writes its status when that changed.
    let heard = |s: &Server| {
        (
            s.get_json(&["cluster", "east"])["status"]["lastHeartbeatTime"].clone(),
            s.get_json(&["lease", "east", "-n", "orrery-member-lease"])["spec"]["renewTime"]
                .clone(),
        )
    };
    let before = heard(&s);
    let mut quiet_from = Instant::now();
    let deadline = quiet_from + Duration::from_secs(10);
    loop {
        let read_at = Instant::now();
        if heard(&s) != before {
            break;
        }
        quiet_from = read_at;
        assert!(read_at < deadline, "no heartbeat");
    }
    east.kill9();
    eventually(Duration::from_secs(10), "Ready=Unknown", || {
        s.cluster_condition("east", "Ready") == "Unknown"
    });
    assert!(
        quiet_from.elapsed() >= Duration::from_millis(1950),
        "not before the grace period: Unknown {:?} after the last heartbeat",
        quiet_from.elapsed()
    );
    let taints = |s: &Server| -> Vec<(String, String)> {
        s.get_json(&["cluster", "east"])["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                (
                    t["key"].as_str().unwrap().to_string(),
                    t["effect"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    eventually(
        Duration::from_secs(5),
        "the unreachable NoSchedule taint",
        || {
            taints(&s).contains(&(
                "cluster.multicluster.io/unreachable".into(),
                "NoSchedule".into(),
            ))
        },
    );
    eventually(
        Duration::from_secs(8),
        "the NoExecute taint after the eviction timeout",
        || {
            taints(&s).contains(&(
                "cluster.multicluster.io/unreachable".into(),
                "NoExecute".into(),
            ))
        },
    );
    assert_eq!(
        s.cluster_condition("west", "Ready"),
        "True",
        "the other cluster is unaffected"
    );
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=east",
    ]);
    assert!(events.contains("ClusterUnreachable"), "{events}");

    // The agent comes back with what it stored: no bootstrap token needed, Ready, no taints.
    east.restart();
    eventually(Duration::from_secs(10), "Ready again", || {
        s.cluster_condition("east", "Ready") == "True"
    });
    eventually(Duration::from_secs(5), "the taints to go", || {
        taints(&s).is_empty()
    });
    assert!(s.ok(&["get", "events"]).contains("ClusterReady"));
    assert!(
        !east.log().contains("bootstrap"),
        "the restart used the stored token"
    );
}

#[test]
fn an_agent_rides_out_a_minute_without_the_server() {
    let mut s = Server::start();
    let agent = sim_agent(&s, "edge", "eu-north", &["--admin-listen", "127.0.0.1:0"]);
    let admin = agent.admin();
    eventually(Duration::from_secs(10), "Ready", || {
        s.cluster_condition("edge", "Ready") == "True"
    });
    s.stdin(
        &["apply", "-n", "orrery-cluster-edge", "-f", "-"],
        &work("shop", 3),
    );
    eventually(Duration::from_secs(10), "the workload to run", || {
        ready_replicas(&s, "orrery-cluster-edge", "shop") == 3
    });
    let before = summary(&admin, "edge");
    assert_eq!(before["podsRunning"], 3);
    let reported = s.get_json(&["work", "shop", "-n", "orrery-cluster-edge"]);

    // The server goes away for a minute; the member keeps running what it has.
    assert!(s.terminate());
    let gone = Instant::now();
    while gone.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_secs(5));
        let now = summary(&admin, "edge");
        assert_eq!(
            now["podsRunning"], 3,
            "the workload keeps running without the server"
        );
        assert_eq!(now["podsCreated"], before["podsCreated"]);
    }
    assert!(agent.log().contains("lost the server"), "the agent noticed");
    s.restart();
    eventually(
        Duration::from_secs(45),
        "the agent to reconnect and report",
        || {
            s.cluster_condition("edge", "Ready") == "True"
                && agent.log().matches("connected").count() >= 2
        },
    );
    // Nothing was recreated on return, and nothing reported again: the listing after the
    // reconnect showed the server had the member's status already.
    let after = summary(&admin, "edge");
    assert_eq!(
        after["podsCreated"], before["podsCreated"],
        "no pod was recreated on reconnect"
    );
    std::thread::sleep(Duration::from_secs(1));
    let again = s.get_json(&["work", "shop", "-n", "orrery-cluster-edge"]);
    assert_eq!(
        again["metadata"]["resourceVersion"], reported["metadata"]["resourceVersion"],
        "the Work's status was not written again: {again}"
    );
    // And it converges on changes made after it: one more replica is one more pod.
    s.stdin(
        &["apply", "-n", "orrery-cluster-edge", "-f", "-"],
        &work("shop", 4),
    );
    eventually(Duration::from_secs(10), "the scale-up", || {
        ready_replicas(&s, "orrery-cluster-edge", "shop") == 4
    });
    let scaled = summary(&admin, "edge");
    assert_eq!(
        scaled["podsCreated"].as_u64().unwrap(),
        before["podsCreated"].as_u64().unwrap() + 1
    );
}

/// A member whose Works do not change sends no status; a change is sent once.
#[test]
fn a_quiet_member_reports_only_changes() {
    let s = Server::start();
    let agent = sim_agent(&s, "calm", "eu-west", &["--admin-listen", "127.0.0.1:0"]);
    let admin = agent.admin();
    eventually(Duration::from_secs(10), "Ready", || {
        s.cluster_condition("calm", "Ready") == "True"
    });
    s.stdin(
        &["apply", "-n", "orrery-cluster-calm", "-f", "-"],
        &work("steady", 2),
    );
    eventually(Duration::from_secs(10), "the workload to run", || {
        ready_replicas(&s, "orrery-cluster-calm", "steady") == 2
    });
    let items = |reset: bool| -> u64 {
        let (code, body) = http(
            "GET",
            &admin,
            if reset { "/stats?reset=true" } else { "/stats" },
            "",
        );
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["statusItems"]
            .as_u64()
            .unwrap()
    };
    assert!(items(true) >= 1, "the status went out at least once");
    let rv =
        s.get_json(&["work", "steady", "-n", "orrery-cluster-calm"])["metadata"]["resourceVersion"]
            .clone();
    // Ten report intervals with nothing new.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(items(false), 0, "a quiet member sends no status");
    assert_eq!(
        s.get_json(&["work", "steady", "-n", "orrery-cluster-calm"])["metadata"]["resourceVersion"],
        rv
    );
    // A change (one more replica, starting after 200 ms) goes out.
    s.stdin(
        &["apply", "-n", "orrery-cluster-calm", "-f", "-"],
        &work("steady", 3),
    );
    eventually(Duration::from_secs(10), "the scale-up reported", || {
        ready_replicas(&s, "orrery-cluster-calm", "steady") == 3
    });
    assert!(items(false) >= 1);
}

#[test]
fn agent_restarted_without_the_server_keeps_running_its_works() {
    let mut s = Server::start();
    let mut agent = sim_agent(&s, "ship", "at-sea", &["--admin-listen", "127.0.0.1:0"]);
    eventually(Duration::from_secs(10), "Ready", || {
        s.cluster_condition("ship", "Ready") == "True"
    });
    s.stdin(
        &["apply", "-n", "orrery-cluster-ship", "-f", "-"],
        &work("radar", 2),
    );
    eventually(Duration::from_secs(10), "the workload", || {
        ready_replicas(&s, "orrery-cluster-ship", "radar") == 2
    });
    s.kill9();
    // A restart of the member's agent (its simulated cluster starts empty) while the server
    // is away: the state file brings the workload back.
    agent.kill9();
    agent.restart();
    let admin = agent.admin();
    eventually(
        Duration::from_secs(10),
        "the stored Work to run again",
        || summary(&admin, "ship")["podsRunning"] == 2,
    );
    s.restart();
    eventually(Duration::from_secs(45), "reconnected", || {
        agent.log().contains("connected")
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tokens_stay_in_their_lane() {
    let s = Server::start();
    let _a = sim_agent(&s, "alpha", "r1", &[]);
    let _b = sim_agent(&s, "beta", "r2", &[]);
    eventually(Duration::from_secs(10), "both Ready", || {
        s.cluster_condition("alpha", "Ready") == "True"
            && s.cluster_condition("beta", "Ready") == "True"
    });
    s.stdin(
        &["apply", "-n", "orrery-cluster-beta", "-f", "-"],
        &work("secret-plans", 1),
    );
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(s.dir.join("agents/alpha/state/state.json")).unwrap(),
    )
    .unwrap();
    let alpha_token = state["token"].as_str().unwrap().to_string();
    let ca = std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    let alpha = orrery_client::connect(&s.url, &alpha_token, &ca)
        .await
        .unwrap();
    let code = |r: Result<String, kube::Error>| match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    };
    let req = |method: &str, path: &str, ct: &str, body: Value| {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", ct)
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap()
    };
    let get = |path: &str| req("GET", path, "application/json", Value::Null);
    // Its own Works: yes. Another cluster's: no.
    assert_eq!(
        code(
            alpha
                .request_text(get(
                    "/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-alpha/works"
                ))
                .await
        ),
        200
    );
    assert_eq!(
        code(
            alpha
                .request_text(get(
                    "/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-beta/works"
                ))
                .await
        ),
        403
    );
    assert_eq!(code(alpha.request_text(get("/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-beta/works/secret-plans")).await), 403);
    assert_eq!(
        code(
            alpha
                .request_text(get("/apis/multicluster.io/v1alpha1/works"))
                .await
        ),
        403
    );
    assert_eq!(
        code(
            alpha
                .request_text(get("/api/v1/namespaces/default/secrets"))
                .await
        ),
        403
    );
    // Another cluster's status: no, by either path.
    let status_patch = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Hijacked"}]}});
    assert_eq!(
        code(
            alpha
                .request_text(req(
                    "PATCH",
                    "/apis/multicluster.io/v1alpha1/clusters/beta/status",
                    "application/merge-patch+json",
                    status_patch.clone()
                ))
                .await
        ),
        403
    );
    let batch = |items: Value| {
        req(
            "POST",
            "/api/v1/sync/batch",
            "application/json",
            json!({ "items": items }),
        )
    };
    let r = alpha
        .request_text(batch(json!([{"kind": "Work", "namespace": "orrery-cluster-beta", "name": "secret-plans", "status": {}}])))
        .await;
    match r {
        Err(kube::Error::Api(st)) => {
            assert_eq!(st.code, 403);
            assert!(
                st.message.contains("FORBIDDEN"),
                "the DRO-DS error body: {}",
                st.message
            );
        }
        other => panic!("expected 403, got {other:?}"),
    }
    // Nor a heartbeat for a cluster that does not exist.
    assert_eq!(
        code(
            alpha
                .request_text(req(
                    "PATCH",
                    "/apis/multicluster.io/v1alpha1/clusters/ghost/status",
                    "application/merge-patch+json",
                    status_patch.clone()
                ))
                .await
        ),
        403
    );
    let admin = s.client().await;
    assert_eq!(
        code(
            admin
                .request_text(req(
                    "PATCH",
                    "/apis/multicluster.io/v1alpha1/clusters/ghost/status",
                    "application/merge-patch+json",
                    status_patch
                ))
                .await
        ),
        404
    );
    // Its own heartbeat Lease: renewed, yes (the agent renews it every beat). Another
    // cluster's: no. A Lease of its choosing: no (the server makes them).
    eventually(Duration::from_secs(20), "alpha's Lease made", || {
        s.kubectl(&["get", "lease", "alpha", "-n", "orrery-member-lease"])
            .status
            .success()
    });
    let renew = json!({"spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}});
    let lease_patch = |name: &str| {
        req(
            "PATCH",
            &format!("/apis/coordination.k8s.io/v1/namespaces/orrery-member-lease/leases/{name}"),
            "application/merge-patch+json",
            renew.clone(),
        )
    };
    assert_eq!(code(alpha.request_text(lease_patch("alpha")).await), 200);
    assert_eq!(code(alpha.request_text(lease_patch("beta")).await), 403);
    assert_eq!(
        code(
            alpha
                .request_text(req(
                    "POST",
                    "/apis/coordination.k8s.io/v1/namespaces/orrery-member-lease/leases",
                    "application/json",
                    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": "alpha2"}, "spec": {}})
                ))
                .await
        ),
        403
    );
    assert_eq!(
        code(
            alpha
                .request_text(req(
                    "PATCH",
                    "/apis/coordination.k8s.io/v1/namespaces/orrery-system/leases/alpha",
                    "application/merge-patch+json",
                    renew.clone()
                ))
                .await
        ),
        403
    );
    // A malformed report is refused and corrupts nothing.
    let before = s.get_json(&["cluster", "alpha"])["status"]["resourceSummary"].clone();
    let bad = json!({"status": {"resourceSummary": {"allocatable": {"cpu": "a lot"}}}});
    assert_eq!(
        code(
            alpha
                .request_text(req(
                    "PATCH",
                    "/apis/multicluster.io/v1alpha1/clusters/alpha/status",
                    "application/merge-patch+json",
                    bad
                ))
                .await
        ),
        422
    );
    let r = alpha
        .request_text(batch(json!([{"kind": "Cluster", "name": "alpha", "status": {"nodeSummary": {"totalNum": -1}}}])))
        .await
        .unwrap();
    let r: Value = serde_json::from_str(&r).unwrap();
    assert_eq!(r["failed"], 1);
    assert_eq!(r["results"][0]["code"], "VALIDATION_FAILED");
    assert_eq!(
        s.get_json(&["cluster", "alpha"])["status"]["resourceSummary"],
        before
    );
    // 1,001 items: refused whole, the valid first one included.
    let valid = json!({"kind": "Cluster", "name": "alpha", "status": {"nodeSummary": {"totalNum": 77, "readyNum": 77}}});
    let mut many = vec![valid.clone()];
    many.extend((1..1001).map(|i| json!({"kind": "Work", "namespace": "orrery-cluster-alpha", "name": format!("w{i}"), "status": {}})));
    match alpha.request_text(batch(json!(many))).await {
        Err(kube::Error::Api(st)) => assert_eq!(
            (st.code, st.message.contains("BATCH_TOO_LARGE")),
            (413, true)
        ),
        other => panic!("expected 413, got {other:?}"),
    }
    let total =
        |s: &Server| s.get_json(&["cluster", "alpha"])["status"]["nodeSummary"]["totalNum"].clone();
    assert_ne!(total(&s), 77, "nothing of a refused batch is applied");
    // The same item alone is applied (alpha's agent may report its own figures over it
    // at any moment after, so the answer is what is checked).
    let r: Value =
        serde_json::from_str(&alpha.request_text(batch(json!([valid]))).await.unwrap()).unwrap();
    assert_eq!(
        (&r["applied"], &r["results"][0]["code"]),
        (&json!(1), &json!("OK")),
        "{r}"
    );
    // A bootstrap token for alpha registers alpha only, and reads nothing.
    let boot = s.token("alpha");
    let (_, cred) = orrery_api::token::parse(&boot);
    let boot_client = orrery_client::connect(&s.url, cred, &ca).await.unwrap();
    assert_eq!(
        code(
            boot_client
                .request_text(req(
                    "POST",
                    "/agent/v1/register",
                    "application/json",
                    json!({"cluster": "beta"})
                ))
                .await
        ),
        403
    );
    assert_eq!(
        code(
            boot_client
                .request_text(get(
                    "/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-alpha/works"
                ))
                .await
        ),
        403
    );
    // No token at all: 401, in each API's own error shape.
    let anon = orrery_client::connect(&s.url, "nobody.nothing", &ca)
        .await
        .unwrap();
    assert_eq!(
        code(
            anon.request_text(get("/apis/multicluster.io/v1alpha1/clusters"))
                .await
        ),
        401
    );
}

#[test]
fn a_token_from_elsewhere_or_a_forged_ca_is_refused() {
    let s = Server::start();
    let other = Server::start();
    // A token of another installation: the CA hash does not match this server's CA.
    let foreign = other.token("east");
    let mut a = Agent::start(
        &s,
        "east",
        &["--cluster", "east", "--token", &foreign, "--simulate", SIM],
    );
    let status = a.wait_exit(Duration::from_secs(20));
    assert!(!status.success());
    assert!(
        a.log().contains("does not match the token's CA hash"),
        "{}",
        a.log()
    );
    // A token without a CA hash needs --ca-file.
    let token = s.token("east");
    let (_, bare) = orrery_api::token::parse(&token);
    let mut b = Agent::start(
        &s,
        "east-bare",
        &["--cluster", "east", "--token", bare, "--simulate", SIM],
    );
    assert!(!b.wait_exit(Duration::from_secs(20)).success());
    assert!(b.log().contains("--ca-file"), "{}", b.log());
    let ca = s.dir.join("tls/ca.crt").display().to_string();
    let _c = Agent::start(
        &s,
        "east-ca",
        &[
            "--cluster",
            "east",
            "--token",
            bare,
            "--ca-file",
            &ca,
            "--simulate",
            SIM,
            "--heartbeat-interval",
            "1s",
        ],
    );
    eventually(Duration::from_secs(10), "Ready with --ca-file", || {
        s.cluster_condition("east", "Ready") == "True"
    });
}

/// A server and one Ready simulated member `name` running a one-replica Work.
fn member_running_a_work(name: &str) -> (Server, Agent) {
    let s = Server::start();
    let agent = sim_agent(&s, name, "r", &[]);
    eventually(Duration::from_secs(10), "Ready", || {
        s.cluster_condition(name, "Ready") == "True"
    });
    let ns = format!("orrery-cluster-{name}");
    s.stdin(&["apply", "-n", &ns, "-f", "-"], &work("app", 1));
    eventually(Duration::from_secs(10), "running", || {
        ready_replicas(&s, &ns, "app") == 1
    });
    (s, agent)
}

#[test]
fn unregistering_a_cluster_removes_its_works_and_stops_its_agent() {
    let (s, mut agent) = member_running_a_work("gone");
    s.ok(&["delete", "cluster", "gone"]);
    assert!(s.fails(&["get", "cluster", "gone"]).contains("NotFound"));
    assert!(
        s.fails(&["get", "namespace", "orrery-cluster-gone"])
            .contains("NotFound")
    );
    stops_as_unregistered(&mut agent);
    eventually(Duration::from_secs(5), "its ClusterProfile to go", || {
        !s.kubectl(&["get", "clusterprofile", "gone", "-n", "orrery-system"])
            .status
            .success()
    });
}

/// The agent sleeps through the whole unregistration (the Cluster and its tokens are gone when it
/// wakes): its revoked token must still tell it that the cluster was unregistered, so it stops
/// cleanly instead of failing to register again with a bootstrap token that was revoked too.
#[test]
fn an_agent_that_slept_through_its_unregistration_still_stops_cleanly() {
    let (s, mut agent) = member_running_a_work("napper");
    agent.signal("STOP");
    s.ok(&["delete", "cluster", "napper"]);
    assert!(s.fails(&["get", "cluster", "napper"]).contains("NotFound"));
    agent.signal("CONT");
    stops_as_unregistered(&mut agent);
}

/// The agent exits cleanly, saying its cluster was unregistered, and forgets its state.
fn stops_as_unregistered(agent: &mut Agent) {
    let status = agent.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{}", agent.log());
    assert!(
        agent
            .output()
            .iter()
            .any(|l| l.contains("was unregistered")),
        "{}",
        agent.log()
    );
    assert!(
        !agent.dir.join("state/state.json").exists(),
        "the agent forgot its state"
    );
}

#[test]
fn a_simulated_fleet_with_faults() {
    let s = Server::start_with(&["--cluster-grace-period", "3s"]);
    let token = s.token("fleet-*");
    let fleet = common::write(
        &s.dir,
        "fleet.yaml",
        r#"
clusters:
  - name: fleet-{i}
    count: 5
    regions: [us-east, eu-west]
    provider: sim
    labels: {tier: edge}
    simulate: nodes=3,cpu=4,memory=16Gi,load=0.1,start=100ms
"#,
    );
    let agent = Agent::start(
        &s,
        "fleet",
        &[
            "--simulate-fleet",
            &fleet.display().to_string(),
            "--token",
            &token,
            "--heartbeat-interval",
            "1s",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let admin = agent.admin();
    eventually(Duration::from_secs(15), "five Ready clusters", || {
        (0..5).all(|i| s.cluster_condition(&format!("fleet-{i}"), "Ready") == "True")
    });
    assert_eq!(
        s.get_json(&["cluster", "fleet-1"])["spec"]["region"],
        "eu-west"
    );
    assert_eq!(
        s.get_json(&["cluster", "fleet-1"])["metadata"]["labels"]["tier"],
        "edge"
    );
    // The pattern token covers fleet-* only.
    let (code, _) = http("GET", &admin, "/clusters", "");
    assert_eq!(code, 200);
    // An outage of the member's API: NotReady, tainted not-ready.
    let (code, body) = http(
        "PUT",
        &admin,
        "/clusters/fleet-2/faults",
        r#"{"outage": true}"#,
    );
    assert_eq!(code, 200, "{body}");
    eventually(Duration::from_secs(10), "fleet-2 not ready", || {
        s.cluster_condition("fleet-2", "Ready") == "False"
    });
    let c = s.get_json(&["cluster", "fleet-2"]);
    let cond = c["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(cond["reason"], "MemberUnreachable");
    eventually(Duration::from_secs(5), "the not-ready taint", || {
        s.get_json(&["cluster", "fleet-2"])["spec"]["taints"]
            .to_string()
            .contains("cluster.multicluster.io/not-ready")
    });
    // Lost nodes show in the node summary; clearing the faults heals.
    http(
        "PUT",
        &admin,
        "/clusters/fleet-3/faults",
        r#"{"lostNodes": 2}"#,
    );
    eventually(Duration::from_secs(10), "fleet-3 down to one node", || {
        s.get_json(&["cluster", "fleet-3"])["status"]["nodeSummary"]["readyNum"] == 1
    });
    http("DELETE", &admin, "/clusters/fleet-2/faults", "");
    eventually(Duration::from_secs(10), "fleet-2 ready", || {
        s.cluster_condition("fleet-2", "Ready") == "True"
    });
    // Raising the load raises the water level.
    http("PUT", &admin, "/clusters/fleet-4/load", r#"{"load": 0.8}"#);
    eventually(Duration::from_secs(10), "fleet-4's water level", || {
        s.get_json(&["cluster", "fleet-4"])["status"]["waterLevel"]["overall"]
            .as_f64()
            .unwrap_or(0.0)
            >= 0.8
    });
    let (code, _) = http("PUT", &admin, "/clusters/fleet-4/load", r#"{"load": 3}"#);
    assert_eq!(code, 400);
    let (code, _) = http("PUT", &admin, "/clusters/nope/faults", "{}");
    assert_eq!(code, 404);
    let failures = s.ok(&["get", "events", "-A"]);
    assert!(failures.contains("ClusterNotReady"), "{failures}");
}

/// A tiny HTTP CONNECT proxy on loopback that counts the tunnels it opened.
fn connect_proxy() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(client) = stream else { continue };
            let c = c.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(client.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                }
                let Ok(upstream) = std::net::TcpStream::connect(&target) else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let mut client_w = client.try_clone().unwrap();
                client_w
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .unwrap();
                let mut up_r = upstream.try_clone().unwrap();
                let mut up_w = upstream;
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut up_r, &mut client_w);
                });
                let _ = std::io::copy(&mut reader, &mut up_w);
            });
        }
    });
    (format!("http://{addr}"), count)
}

#[test]
fn agents_reach_the_server_through_an_https_proxy() {
    let s = Server::start();
    let (proxy, tunnels) = connect_proxy();
    let token = s.token("behind-nat");
    let _a = Agent::start_env(
        &s,
        "behind-nat",
        &[
            "--cluster",
            "behind-nat",
            "--token",
            &token,
            "--simulate",
            SIM,
            "--heartbeat-interval",
            "1s",
        ],
        &[("HTTPS_PROXY", &proxy), ("NO_PROXY", "")],
    );
    eventually(Duration::from_secs(15), "Ready through the proxy", || {
        s.cluster_condition("behind-nat", "Ready") == "True"
    });
    assert!(
        tunnels.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the agent's connections went through the proxy"
    );
}

#[test]
fn orrery_up_starts_a_fleet_and_resumes() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let run = || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args(["up", "--clusters", "3", "--data-dir"])
            .arg(dir.path())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut out = Vec::new();
        for l in lines.by_ref() {
            let l = l.unwrap();
            let done = l.starts_with("Ctrl-C stops everything");
            out.push(l);
            if done {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        (child, out)
    };
    let (mut child, out) = run();
    let text = out.join("\n");
    assert!(
        text.contains("orrery is up: a control plane and 3 simulated clusters"),
        "{text}"
    );
    let kubeconfig = dir.path().canonicalize().unwrap().join("admin.kubeconfig");
    assert!(
        text.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{text}"
    );
    let kubectl = |args: &[&str]| {
        let o = std::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let table = kubectl(&["get", "clusters"]);
    for name in ["aws-us-east", "gcp-europe", "azure-asia"] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name) && l.contains("True")),
            "{table}"
        );
    }
    // A workload in one member, seen through the cluster proxy.
    let apply = std::process::Command::new("kubectl")
        .args(["apply", "-f", "-"])
        .env("KUBECONFIG", &kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        apply
            .stdin
            .as_ref()
            .unwrap()
            .write_all(
                common::divided_deployment(
                    "kept",
                    2,
                    "{cpu: 100m, memory: 64Mi}",
                    "    clusterAffinity: {clusterNames: [aws-us-east]}",
                )
                .as_bytes(),
            )
            .unwrap();
    }
    assert!(apply.wait_with_output().unwrap().status.success());
    let member = dir.path().join("aws-us-east.kubeconfig");
    common::cluster_kubeconfig(&kubeconfig, "aws-us-east", &member);
    let cache = tempfile::tempdir().unwrap();
    let in_member = |args: &[&str]| -> serde_json::Value {
        let o = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&member)
            .args(args)
            .args(["-o", "json"])
            .env("HOME", cache.path())
            .env("KUBECACHEDIR", cache.path())
            .output()
            .unwrap();
        serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
    };
    let identities = |pods: &serde_json::Value| -> Vec<String> {
        let mut v: Vec<String> = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kept-"))
            })
            .map(|p| {
                format!(
                    "{} {} {} {} {}",
                    p["metadata"]["name"],
                    p["metadata"]["uid"],
                    p["metadata"]["creationTimestamp"],
                    p["spec"]["nodeName"],
                    p["status"]["containerStatuses"][0]["restartCount"]
                )
            })
            .collect();
        v.sort();
        v
    };
    common::eventually(Duration::from_secs(60), "kept's pods running", || {
        identities(&in_member(&["get", "pods", "-n", "default"])).len() == 2
    });
    let pods_before = identities(&in_member(&["get", "pods", "-n", "default"]));
    let deploy_before = in_member(&["get", "deployment", "kept", "-n", "default"]);
    std::thread::sleep(Duration::from_secs(2));
    // Ctrl-C stops everything cleanly; a second run resumes the same fleet.
    common::signal(child.id(), "INT");
    assert!(child.wait().unwrap().success());
    let (mut again, out) = run();
    assert!(out.join("\n").contains("3 simulated clusters"));
    assert_eq!(
        kubectl(&["get", "clusters", "-o", "name"]).lines().count(),
        3,
        "the same three, not new ones"
    );
    // The member kept its workload as it was: the same pods (names, uids, creation times,
    // nodes, restarts) and the same Deployment (uid, creation time), as a real cluster would.
    common::eventually(Duration::from_secs(30), "the member answers again", || {
        identities(&in_member(&["get", "pods", "-n", "default"])).len() == 2
    });
    assert_eq!(
        identities(&in_member(&["get", "pods", "-n", "default"])),
        pods_before
    );
    let deploy_after = in_member(&["get", "deployment", "kept", "-n", "default"]);
    for f in ["uid", "creationTimestamp"] {
        assert_eq!(
            deploy_after["metadata"][f], deploy_before["metadata"][f],
            "{f}"
        );
    }
    common::signal(again.id(), "INT");
    assert!(again.wait().unwrap().success());
}
