//! `orrery rollout`: a workload's progressive rollout (docs/rollouts.md) seen and steered from
//! the terminal. Every command acts on the objects `kubectl` sees too: the binding's
//! `status.rollout` and annotations, its ControllerRevisions, RolloutApprovals.

use anyhow::{Context, bail};
use serde_json::{Value, json};

use orrery_api::rollout as ro;

#[derive(Debug, clap::Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub command: RolloutCommand,
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Where the rollout stands: phase, stages, and each cluster's revision and gate.
    Status(Target),
    /// Update no further cluster (those updating go on).
    Pause(Target),
    /// Go on after a pause; a halted rollout goes on with its failures forgiven; a rolled
    /// back or aborted one starts again.
    Resume(Target),
    /// Restore the stable revision everywhere.
    Abort(Target),
    /// Let a stage that waits for approval start.
    Approve {
        #[command(flatten)]
        target: Target,
        /// The stage.
        #[arg(long)]
        stage: String,
    },
    /// The template's revisions.
    History(Target),
    /// Put an earlier revision's template back (the previous one unless --to-revision):
    /// a change like any other, rolled out stage by stage.
    Undo {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        to_revision: Option<i64>,
    },
}

/// The workload: `KIND/NAME` (`deployment/web`) or its ResourceBinding's name.
#[derive(Debug, clap::Args)]
pub struct Target {
    pub name: String,
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
}

impl Target {
    /// The binding's name.
    fn binding(&self) -> String {
        match self.name.split_once('/') {
            Some((kind, name)) => orrery_api::binding::name_for(&kind_of(kind), name),
            None => self.name.clone(),
        }
    }
}

/// `deployment`, `deploy`, `Deployment` → `Deployment` (the built-in workload kinds).
fn kind_of(k: &str) -> String {
    match k.to_ascii_lowercase().as_str() {
        "deployment" | "deployments" | "deploy" => "Deployment".into(),
        "statefulset" | "statefulsets" | "sts" => "StatefulSet".into(),
        "daemonset" | "daemonsets" | "ds" => "DaemonSet".into(),
        "job" | "jobs" => "Job".into(),
        "cronjob" | "cronjobs" | "cj" => "CronJob".into(),
        other => {
            let mut c = other.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect())
                .unwrap_or_default()
        }
    }
}

const GROUP: &str = "/apis/multicluster.io/v1alpha1";

async fn request(client: &kube::Client, req: http::Request<Vec<u8>>) -> anyhow::Result<Value> {
    let text = client.request_text(req).await.map_err(|e| match e {
        kube::Error::Api(s) => anyhow::anyhow!("the server refused: {}", s.message),
        other => anyhow::anyhow!("reaching the server: {other}"),
    })?;
    Ok(serde_json::from_str(&text)?)
}

async fn get(client: &kube::Client, path: &str) -> anyhow::Result<Value> {
    request(client, http::Request::get(path).body(Vec::new())?).await
}

fn binding_path(t: &Target) -> String {
    format!(
        "{GROUP}/namespaces/{}/resourcebindings/{}",
        t.namespace,
        t.binding()
    )
}

async fn annotate(
    client: &kube::Client,
    t: &Target,
    key: &str,
    value: Option<&str>,
) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    let req = http::Request::patch(binding_path(t))
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(&patch)?)?;
    request(client, req).await.map(|_| ())
}

/// A new value for the resume and abort annotations (each new value is one request).
fn stamp() -> String {
    orrery_api::Time::now().to_string()
}

pub async fn run(args: RolloutArgs) -> anyhow::Result<()> {
    let path = args.locate.kubeconfig();
    let client = orrery_client::from_kubeconfig(&path)
        .await
        .with_context(|| format!("using the admin kubeconfig {}", path.display()))?;
    let c = &client;
    match args.command {
        RolloutCommand::Status(t) => {
            let b = get(c, &binding_path(&t)).await?;
            print!("{}", render_status(&b));
        }
        RolloutCommand::Pause(t) => {
            annotate(c, &t, ro::PAUSED_ANNOTATION, Some("true")).await?;
            println!("{} paused", t.binding());
        }
        RolloutCommand::Resume(t) => {
            annotate(c, &t, ro::PAUSED_ANNOTATION, None).await?;
            annotate(c, &t, ro::RESUME_ANNOTATION, Some(&stamp())).await?;
            println!("{} resumed", t.binding());
        }
        RolloutCommand::Abort(t) => {
            annotate(c, &t, ro::ABORT_ANNOTATION, Some(&stamp())).await?;
            println!("{} aborted: the stable revision is restored", t.binding());
        }
        RolloutCommand::Approve { target, stage } => {
            let b = get(c, &binding_path(&target)).await?;
            let revision = b["status"]["rollout"]["revision"]
                .as_i64()
                .context("the binding has no rollout under way")?;
            let name = format!("{}-r{revision}-{stage}", target.binding());
            let obj = json!({
                "apiVersion": "multicluster.io/v1alpha1", "kind": "RolloutApproval",
                "metadata": {"name": name, "namespace": target.namespace},
                "spec": {"binding": target.binding(), "revision": revision, "stage": stage},
            });
            let req = http::Request::post(format!(
                "{GROUP}/namespaces/{}/rolloutapprovals",
                target.namespace
            ))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&obj)?)?;
            request(c, req).await?;
            println!("rolloutapproval/{name} created: stage {stage} of revision {revision}");
        }
        RolloutCommand::History(t) => {
            let revs = revisions(c, &t).await?;
            let b = get(c, &binding_path(&t)).await?;
            print!("{}", render_history(&revs, &b["status"]["rollout"]));
        }
        RolloutCommand::Undo {
            target,
            to_revision,
        } => undo(c, &target, to_revision).await?,
    }
    Ok(())
}

/// The binding's ControllerRevisions, oldest first.
async fn revisions(c: &kube::Client, t: &Target) -> anyhow::Result<Vec<Value>> {
    let list = get(
        c,
        &format!(
            "/apis/apps/v1/namespaces/{}/controllerrevisions?labelSelector={}%3D{}",
            t.namespace,
            ro::BINDING_LABEL,
            t.binding()
        ),
    )
    .await?;
    let mut v = list["items"].as_array().cloned().unwrap_or_default();
    v.sort_by_key(|r| r["revision"].as_i64().unwrap_or(0));
    Ok(v)
}

/// Writes an earlier revision's spec back into the template (its replicas kept).
async fn undo(c: &kube::Client, t: &Target, to: Option<i64>) -> anyhow::Result<()> {
    let b = get(c, &binding_path(t)).await?;
    let revs = revisions(c, t).await?;
    let current = b["status"]["rollout"]["revision"].as_i64().unwrap_or(0);
    let want = match to {
        Some(n) => n,
        None => revs
            .iter()
            .filter_map(|r| r["revision"].as_i64())
            .filter(|n| *n < current)
            .max()
            .context("no earlier revision to go back to")?,
    };
    let Some(rev) = revs.iter().find(|r| r["revision"].as_i64() == Some(want)) else {
        bail!("no revision {want} (see `orrery rollout history`)");
    };
    let r = &b["spec"]["resource"];
    let (api_version, kind, name) = (
        r["apiVersion"].as_str().unwrap_or(""),
        r["kind"].as_str().unwrap_or(""),
        r["name"].as_str().unwrap_or(""),
    );
    let base = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    let plural = format!("{}s", kind.to_ascii_lowercase());
    let path = format!("{base}/namespaces/{}/{plural}/{name}", t.namespace);
    let mut spec = rev["data"]["spec"].clone();
    let now = get(c, &path).await?;
    if let (Some(s), Some(n)) = (spec.as_object_mut(), now["spec"].get("replicas")) {
        s.insert("replicas".into(), n.clone());
    }
    // The whole spec replaced (a merge patch would keep fields the old one lacked).
    let patch = json!([{"op": "replace", "path": "/spec", "value": spec}]);
    let req = http::Request::patch(&path)
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&patch)?)?;
    request(c, req).await?;
    println!("{kind}/{name}: revision {want}'s template put back; it rolls out as a new revision");
    Ok(())
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// The rollout as a few lines and a table of clusters.
pub fn render_status(b: &Value) -> String {
    let r = &b["status"]["rollout"];
    if r.is_null() {
        return format!(
            "{}: no rollout (its placement has no rollout strategy)\n",
            s(&b["metadata"]["name"])
        );
    }
    let mut out = format!(
        "{}: revision {} (stable {}): {}",
        s(&b["metadata"]["name"]),
        r["revision"],
        r["stable"],
        s(&r["phase"])
    );
    if !s(&r["stage"]).is_empty() {
        out.push_str(&format!(", stage {}", s(&r["stage"])));
    }
    out.push('\n');
    if !s(&r["message"]).is_empty() {
        out.push_str(&format!("  {}\n", s(&r["message"])));
    }
    for st in r["stages"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  stage {:<12} {:<20} {} clusters\n",
            s(&st["name"]),
            s(&st["state"]),
            st["clusters"]
        ));
    }
    out.push_str(&format!(
        "{:<20} {:<12} {:>8}  {:<10} {}\n",
        "CLUSTER", "STAGE", "REVISION", "STATE", "WHY"
    ));
    for c in r["clusters"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<20} {:<12} {:>8}  {:<10} {}\n",
            s(&c["name"]),
            s(&c["stage"]),
            c["revision"],
            s(&c["state"]),
            s(&c["message"])
        ));
    }
    out
}

/// The revisions, marking the one rolling out and the stable one.
pub fn render_history(revs: &[Value], rollout: &Value) -> String {
    let mut out = format!("{:>8}  {:<28} {}\n", "REVISION", "CREATED", "");
    for r in revs {
        let n = r["revision"].as_i64().unwrap_or(0);
        let mut marks = Vec::new();
        if rollout["revision"].as_i64() == Some(n) {
            marks.push("rolling out");
        }
        if rollout["stable"].as_i64() == Some(n) {
            marks.push("stable");
        }
        out.push_str(&format!(
            "{:>8}  {:<28} {}\n",
            n,
            s(&r["metadata"]["creationTimestamp"]),
            marks.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_tables() {
        let t = Target {
            name: "deploy/web".into(),
            namespace: "default".into(),
        };
        assert_eq!(t.binding(), "web-deployment");
        let b = json!({"metadata": {"name": "web-deployment"}, "status": {"rollout": {
            "revision": 3, "stable": 2, "phase": "Halted", "stage": "canary",
            "message": "halted in stage canary: 1 failed",
            "stages": [{"name": "canary", "state": "Halted", "clusters": 1}],
            "clusters": [{"name": "m1", "stage": "canary", "revision": 3, "state": "Failed", "message": "not healthy"}]
        }}});
        let out = render_status(&b);
        assert!(
            out.starts_with("web-deployment: revision 3 (stable 2): Halted, stage canary"),
            "{out}"
        );
        assert!(
            out.contains("m1") && out.contains("Failed") && out.contains("not healthy"),
            "{out}"
        );
        let h = render_history(
            &[json!({"revision": 2}), json!({"revision": 3})],
            &b["status"]["rollout"],
        );
        assert!(
            h.contains("2  ") && h.contains("stable") && h.contains("rolling out"),
            "{h}"
        );
        assert!(render_status(&json!({"metadata": {"name": "x"}})).contains("no rollout"));
    }
}
