//! `orrery status`: the fleet in the terminal. Clusters with their readiness and water levels
//! as bars, the fleet's level, and the workloads with where they run.

use anyhow::Context;
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub locate: crate::locate::Locate,
    /// Width of the water level bars.
    #[arg(long, default_value_t = 12)]
    pub bar: usize,
}

/// What marks a level past capacity.
const OVER: &str = "!";

/// `████░░░░ 0.42` (the level is clamped to the bar; the figure is exact; past 1 it is
/// marked `!`).
pub fn bar(level: f64, width: usize) -> String {
    let filled = ((level.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!(
        "{}{} {:.2}{}",
        "█".repeat(filled),
        "░".repeat(width - filled),
        level,
        // Overcommitted (usage past capacity): flagged, and explained under the table.
        if level > 1.0 { OVER } else { "" }
    )
}

fn get(v: &Value, path: &[&str]) -> Value {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.clone()
}

async fn list(client: &kube::Client, path: &str) -> anyhow::Result<Vec<Value>> {
    let req = http::Request::get(path).body(Vec::new())?;
    let text = client.request_text(req).await.map_err(|e| match e {
        kube::Error::Api(s) => anyhow::anyhow!("the server refused: {}", s.message),
        other => anyhow::anyhow!("reaching the server: {other}"),
    })?;
    let v: Value = serde_json::from_str(&text)?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// The workload kinds a newcomer expects to run somewhere, `(group/version, plural)`.
const WORKLOADS: &[(&str, &str, &str)] = &[
    ("apps/v1", "deployments", "Deployment"),
    ("apps/v1", "statefulsets", "StatefulSet"),
    ("apps/v1", "daemonsets", "DaemonSet"),
    ("batch/v1", "jobs", "Job"),
    ("batch/v1", "cronjobs", "CronJob"),
];

/// Workloads no placement policy selects: they have no binding, and run nowhere. Orrery's
/// own namespaces are left out.
pub fn unselected(workloads: &[Value], bindings: &[Value]) -> Vec<Value> {
    let bound: std::collections::HashSet<(String, String)> = bindings
        .iter()
        .map(|b| {
            let r = &b["spec"]["resource"];
            (
                r["namespace"].as_str().unwrap_or("").to_string(),
                format!(
                    "{}/{}",
                    r["kind"].as_str().unwrap_or(""),
                    r["name"].as_str().unwrap_or("")
                ),
            )
        })
        .collect();
    workloads
        .iter()
        .filter(|w| {
            let ns = w["metadata"]["namespace"].as_str().unwrap_or("");
            let id = format!(
                "{}/{}",
                w["kind"].as_str().unwrap_or(""),
                w["metadata"]["name"].as_str().unwrap_or("")
            );
            !ns.starts_with("orrery-")
                && !ns.starts_with("kube-")
                && !bound.contains(&(ns.to_string(), id))
        })
        .cloned()
        .collect()
}

/// Renders the fleet from the Cluster and ResourceBinding lists, and the workloads no policy
/// selects.
pub fn render(
    clusters: &[Value],
    bindings: &[Value],
    unselected: &[Value],
    width: usize,
) -> String {
    let mut out = String::new();
    render_clusters(&mut out, clusters, width);
    out.push_str(&format!(
        "\nWORKLOADS ({})\n",
        bindings.len() + unselected.len()
    ));
    if bindings.is_empty() && unselected.is_empty() {
        out.push_str("  none yet: kubectl apply -f examples/web.yaml\n");
        return out;
    }
    let mut rows: Vec<[String; 5]> = bindings.iter().map(binding_row).collect();
    rows.extend(unselected.iter().map(unselected_row));
    push_table(&mut out, &rows);
    if !unselected.is_empty() {
        out.push_str(
            "NoPlacementPolicy: no placement policy selects it, so it runs in no cluster \
             (docs/policies.md: a ResourcePlacementPolicy or PropagationPolicy)\n",
        );
    }
    out
}

/// The clusters' section: each one's readiness and water levels as bars, and the fleet's
/// mean over the ready ones.
fn render_clusters(out: &mut String, clusters: &[Value], width: usize) {
    let ready = |c: &Value| {
        c["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|x| x["type"] == "Ready"))
            .and_then(|x| x["status"].as_str())
            .unwrap_or("Unknown")
            .to_string()
    };
    let n_ready = clusters.iter().filter(|c| ready(c) == "True").count();
    out.push_str(&format!(
        "CLUSTERS ({} registered, {} ready)\n",
        clusters.len(),
        n_ready
    ));
    let name_w = clusters
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(4)
        .max(4);
    let region_w = clusters
        .iter()
        .filter_map(|c| c["spec"]["region"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(6)
        .max(6);
    let col = width + 6;
    out.push_str(&format!(
        "{:name_w$}  {:region_w$}  {:7}  {:col$}  {:col$}  {:col$}\n",
        "NAME", "REGION", "READY", "CPU", "MEMORY", "OVERALL"
    ));
    let (mut sum, mut n) = (0.0, 0);
    let mut over = false;
    for c in clusters {
        let wl = get(c, &["status", "waterLevel"]);
        let level = |d: &str| wl[d].as_f64();
        over |= ["cpu", "memory", "overall"]
            .iter()
            .any(|d| level(d).is_some_and(|l| l > 1.0));
        let cell = |x: Option<f64>| x.map(|v| bar(v, width)).unwrap_or_else(|| "-".into());
        if ready(c) == "True"
            && let Some(o) = level("overall")
        {
            sum += o;
            n += 1;
        }
        out.push_str(&format!(
            "{:name_w$}  {:region_w$}  {:7}  {:col$}  {:col$}  {:col$}\n",
            c["metadata"]["name"].as_str().unwrap_or(""),
            c["spec"]["region"].as_str().unwrap_or("-"),
            ready(c),
            cell(level("cpu")),
            cell(level("memory")),
            cell(level("overall")),
        ));
    }
    if over {
        out.push_str(&format!(
            "{OVER} over 100%: the cluster's usage is past its allocatable capacity (overcommitted)\n"
        ));
    }
    if n > 0 {
        out.push_str(&format!(
            "fleet (mean of the ready clusters): {}\n",
            bar(sum / n as f64, width)
        ));
    }
}

/// A ResourceBinding's row: the workload, its kind, replicas, where it is placed and its state.
fn binding_row(b: &Value) -> [String; 5] {
    let r = &b["spec"]["resource"];
    let ns = r["namespace"].as_str().unwrap_or("");
    let name = r["name"].as_str().unwrap_or("");
    let placed: Vec<String> = b["spec"]["clusters"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    format!(
                        "{}({})",
                        c["name"].as_str().unwrap_or(""),
                        c["replicas"].as_i64().unwrap_or(0)
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let cond = |t: &str| {
        b["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|x| x["type"] == t))
            .map(|x| {
                (
                    x["status"].as_str().unwrap_or("") == "True",
                    x["reason"].as_str().unwrap_or("").to_string(),
                )
            })
    };
    // A Job has an end: Completed once every cluster's copy completed, Failed if one
    // failed.
    let has = |a: &Value, t: &str| {
        a["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
    };
    let copies = b["status"]["aggregatedStatus"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let is_job = r["kind"] == "Job";
    let job_failed = is_job && copies.iter().any(|a| has(a, "Failed"));
    let job_done = is_job && !copies.is_empty() && copies.iter().all(|a| has(a, "Complete"));
    let state = match (cond("Scheduled"), cond("FullyApplied")) {
        (Some((false, reason)), _) => reason,
        _ if job_failed => "Failed".into(),
        _ if job_done => "Completed".into(),
        (_, Some((true, _))) => "Running".into(),
        (Some((true, _)), _) => "Applying".into(),
        _ => "Pending".into(),
    };
    [
        if ns.is_empty() {
            name.to_string()
        } else {
            format!("{ns}/{name}")
        },
        r["kind"].as_str().unwrap_or("").to_string(),
        b["spec"]["replicas"]
            .as_i64()
            .map(|x| x.to_string())
            .unwrap_or_else(|| "-".into()),
        if placed.is_empty() {
            "-".into()
        } else {
            placed.join(" ")
        },
        state,
    ]
}

/// The row of a workload no policy selects.
fn unselected_row(w: &Value) -> [String; 5] {
    [
        format!(
            "{}/{}",
            w["metadata"]["namespace"].as_str().unwrap_or(""),
            w["metadata"]["name"].as_str().unwrap_or("")
        ),
        w["kind"].as_str().unwrap_or("").to_string(),
        w["spec"]["replicas"]
            .as_i64()
            .map(|x| x.to_string())
            .unwrap_or_else(|| "-".into()),
        "-".into(),
        "NoPlacementPolicy".into(),
    ]
}

/// The workloads' table: a header and the rows, each column as wide as its widest cell.
fn push_table(out: &mut String, rows: &[[String; 5]]) {
    let header = ["NAME", "KIND", "REPLICAS", "PLACEMENT", "STATUS"];
    let widths: Vec<usize> = (0..5)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 5]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == 4 {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:w$}  ", w = widths[i]));
            }
        }
        l.trim_end().to_string() + "\n"
    };
    out.push_str(&line(header));
    for r in rows {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4]]));
    }
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let path = args.locate.kubeconfig();
    let client = orrery_client::from_kubeconfig(&path)
        .await
        .with_context(|| format!("using the admin kubeconfig {}", path.display()))?;
    let clusters = list(&client, "/apis/multicluster.io/v1alpha1/clusters").await?;
    let bindings = list(&client, "/apis/multicluster.io/v1alpha1/resourcebindings").await?;
    let mut workloads = Vec::new();
    for (gv, plural, kind) in WORKLOADS {
        // List items need not carry their kind.
        workloads.extend(
            list(&client, &format!("/apis/{gv}/{plural}"))
                .await?
                .into_iter()
                .map(|mut w| {
                    w["kind"] = Value::from(*kind);
                    w
                }),
        );
    }
    let unselected = unselected(&workloads, &bindings);
    print!(
        "{}",
        render(&clusters, &bindings, &unselected, args.bar.clamp(4, 60))
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bars_and_tables() {
        assert_eq!(bar(0.5, 4), "██░░ 0.50");
        assert_eq!(bar(1.3, 4), "████ 1.30!");
        assert_eq!(bar(-0.1, 4), "░░░░ -0.10");
        let clusters = vec![json!({
            "metadata": {"name": "east"}, "spec": {"region": "us-east-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "waterLevel": {"cpu": 0.25, "memory": 0.5, "overall": 0.5}}
        })];
        let bindings = vec![json!({
            "spec": {"resource": {"kind": "Deployment", "namespace": "default", "name": "web"},
                "replicas": 4, "clusters": [{"name": "east", "replicas": 4}]},
            "status": {"conditions": [{"type": "Scheduled", "status": "True", "reason": "Success"},
                {"type": "FullyApplied", "status": "True"}]}
        })];
        let out = render(&clusters, &bindings, &[], 4);
        assert!(out.contains("CLUSTERS (1 registered, 1 ready)"), "{out}");
        assert!(out.contains("east  us-east-1  True"), "{out}");
        assert!(out.contains("█░░░ 0.25"), "{out}");
        assert!(
            out.contains("default/web  Deployment  4         east(4)    Running"),
            "{out}"
        );
        assert!(render(&clusters, &[], &[], 4).contains("none yet"));
    }

    #[test]
    fn jobs_end_and_unselected_workloads_show() {
        let job = |conds: Vec<Value>| {
            json!({
                "spec": {"resource": {"kind": "Job", "namespace": "ml", "name": "train"},
                    "replicas": 1, "clusters": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}]},
                "status": {"conditions": [{"type": "Scheduled", "status": "True"}, {"type": "FullyApplied", "status": "True"}],
                    "aggregatedStatus": conds.into_iter().map(|c| json!({"status": {"conditions": c}})).collect::<Vec<_>>()}
            })
        };
        let complete = json!([{"type": "Complete", "status": "True"}]);
        let state = |b: Value| {
            let out = render(&[], &[b], &[], 4);
            out.lines()
                .find(|l| l.starts_with("ml/train"))
                .unwrap_or_default()
                .split_whitespace()
                .last()
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(
            state(job(vec![complete.clone(), complete.clone()])),
            "Completed"
        );
        assert_eq!(
            state(job(vec![complete.clone(), json!([])])),
            "Running",
            "one still runs"
        );
        assert_eq!(
            state(job(vec![
                complete,
                json!([{"type": "Failed", "status": "True"}])
            ])),
            "Failed"
        );
        let loner = json!({"kind": "Deployment", "metadata": {"namespace": "default", "name": "loner"}, "spec": {"replicas": 2}});
        let system =
            json!({"kind": "Deployment", "metadata": {"namespace": "orrery-system", "name": "x"}});
        let placed =
            json!({"kind": "Deployment", "metadata": {"namespace": "default", "name": "web"}});
        let web = json!({"spec": {"resource": {"kind": "Deployment", "namespace": "default", "name": "web"}}});
        let left = unselected(&[loner, system, placed], std::slice::from_ref(&web));
        assert_eq!(left.len(), 1);
        let out = render(&[], &[web], &left, 4);
        assert!(
            out.lines()
                .any(|l| l.starts_with("default/loner") && l.ends_with("NoPlacementPolicy")),
            "{out}"
        );
        assert!(out.contains("WORKLOADS (2)"), "{out}");
    }
}
