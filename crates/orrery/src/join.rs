//! `orrery join NAME --kubeconfig PATH`: brings a member whose API the server can reach into
//! the fleet in push mode. The member's kubeconfig is flattened (files it points at are
//! inlined) into a Secret in `orrery-system`, and a Cluster with `syncMode: Push` names it; the
//! server then drives the member itself.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use base64::Engine;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::config::Kubeconfig;
use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct JoinArgs {
    /// The member cluster's name.
    pub name: String,
    /// The member's kubeconfig (its current context, or --context).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    #[arg(long)]
    pub context: Option<String>,
    /// The control plane's admin kubeconfig (default: the data directory's
    /// admin.kubeconfig when --data-dir or ORRERY_DATA_DIR is set, else $KUBECONFIG, else
    /// ./orrery-data/admin.kubeconfig).
    #[arg(long)]
    pub server_kubeconfig: Option<PathBuf>,
    /// The control plane's data directory (`orrery up` or `orrery server`).
    #[arg(long, env = "ORRERY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub facts: crate::agent::ClusterFlags,
}

fn inline(
    base: &Path,
    file: Option<&String>,
    data: Option<&String>,
) -> anyhow::Result<Option<String>> {
    if let Some(d) = data {
        return Ok(Some(d.clone()));
    }
    let Some(f) = file else { return Ok(None) };
    let path = base.join(f);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(
        base64::engine::general_purpose::STANDARD.encode(bytes),
    ))
}

/// A self-contained kubeconfig (JSON, which is YAML) for one context, and its server URL.
pub fn flatten(path: &Path, context: Option<&str>) -> anyhow::Result<(String, String)> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let ctx_name = context
        .map(str::to_string)
        .or(kc.current_context.clone())
        .context("the kubeconfig has no current context; pass --context")?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.clone())
        .with_context(|| format!("no context {ctx_name:?} in the kubeconfig"))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.clone())
        .with_context(|| format!("no cluster {:?} in the kubeconfig", ctx.cluster))?;
    let server = cluster
        .server
        .clone()
        .context("the kubeconfig's cluster has no server")?;
    let mut c = json!({ "server": server });
    if let Some(ca) = inline(
        base,
        cluster.certificate_authority.as_ref(),
        cluster.certificate_authority_data.as_ref(),
    )? {
        c["certificate-authority-data"] = json!(ca);
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        c["insecure-skip-tls-verify"] = json!(true);
    }
    let mut user = json!({});
    if let Some(user_name) = &ctx.user
        && let Some(auth) = kc
            .auth_infos
            .iter()
            .find(|a| &a.name == user_name)
            .and_then(|a| a.auth_info.clone())
    {
        // Serialized, the secrets come out in the clear (kube keeps them wrapped).
        let plain = serde_json::to_value(&auth)?;
        let field = |k: &str| plain.get(k).and_then(Value::as_str).map(str::to_string);
        if let Some(t) = field("token") {
            user["token"] = json!(t);
        } else if let Some(f) = &auth.token_file {
            let t =
                std::fs::read_to_string(base.join(f)).with_context(|| format!("reading {f}"))?;
            user["token"] = json!(t.trim());
        }
        if let Some(cert) = inline(
            base,
            auth.client_certificate.as_ref(),
            auth.client_certificate_data.as_ref(),
        )? {
            user["client-certificate-data"] = json!(cert);
        }
        let key_data = field("client-key-data");
        if let Some(key) = inline(base, auth.client_key.as_ref(), key_data.as_ref())? {
            user["client-key-data"] = json!(key);
        }
        if auth.exec.is_some() || auth.auth_provider.is_some() {
            bail!(
                "the member's kubeconfig authenticates with an exec plugin or auth provider, which the server cannot run; use a token or client certificate"
            );
        }
    }
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{ "name": "member", "cluster": c }],
        "users": [{ "name": "member", "user": user }],
        "contexts": [{ "name": "member", "context": { "cluster": "member", "user": "member" } }],
        "current-context": "member",
    });
    Ok((serde_json::to_string_pretty(&doc)?, server))
}

pub async fn run(args: JoinArgs) -> anyhow::Result<()> {
    let errs = orrery_api::cluster::validate_name(&args.name);
    if let Some(e) = errs.first() {
        bail!("invalid cluster name: {e}");
    }
    let (kubeconfig, server) = flatten(&args.kubeconfig, args.context.as_deref())?;
    let admin = crate::locate::Locate {
        data_dir: args.data_dir.clone(),
        kubeconfig: args.server_kubeconfig.clone(),
    }
    .kubeconfig();
    let client = orrery_client::from_kubeconfig(&admin)
        .await
        .with_context(|| format!("using the admin kubeconfig {}", admin.display()))?;
    let params = PatchParams::apply("orrery-join").force();
    let secret_name = format!("cluster-{}", args.name);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "orrery-system");
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": secret_name, "namespace": "orrery-system",
                      "labels": { "multicluster.io/cluster": args.name } },
        "type": "Opaque",
        "data": { "kubeconfig": base64::engine::general_purpose::STANDARD.encode(&kubeconfig) },
    });
    secrets
        .patch(&secret_name, &params, &Patch::Apply(&secret))
        .await
        .context("storing the member's credentials")?;
    let mut spec = json!({
        "syncMode": "Push",
        "apiEndpoint": server,
        "secretRef": { "namespace": "orrery-system", "name": secret_name },
    });
    let facts = args.facts.info()?;
    if let Value::Object(m) = &mut spec {
        facts.apply_to_spec(m);
    }
    let labels = facts.labels;
    let cluster = json!({
        "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster",
        "metadata": { "name": args.name, "labels": labels },
        "spec": spec,
    });
    let clusters: Api<DynamicObject> =
        orrery_client::api(&client, &orrery_client::kinds::CLUSTER, None);
    clusters
        .patch(&args.name, &params, &Patch::Apply(&cluster))
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => anyhow::anyhow!("the server refused the Cluster: {}", s.message),
            other => anyhow::anyhow!("reaching the server: {other}"),
        })?;
    println!(
        "cluster {} joined in Push mode: the server applies its Works to {server}",
        args.name
    );
    Ok(())
}
