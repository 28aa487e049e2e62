//! `--kubeconfig-secret`: the admin kubeconfig exported as a Secret of the cluster the server
//! runs in (as Karmada's `karmada-kubeconfig` and vcluster's `vc-<name>` are), so that
//! whoever may read that Secret reaches the control plane without a shell in its Pod. Written
//! at start and again whenever the CA bundle changes (a rotation's steps).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Secret;

/// The key of the kubeconfig in the Secret's data.
pub const KEY: &str = "kubeconfig";

/// Where the kubeconfig goes.
pub struct Target {
    api: kube::Api<Secret>,
    namespace: String,
    name: String,
    server_url: String,
}

impl Target {
    /// `NAMESPACE/NAME` in the cluster of the in-cluster configuration under `sa_dir`; an
    /// error now, with what is missing, when there is none.
    pub fn new(spec: &str, sa_dir: &Path, server_url: String) -> anyhow::Result<Target> {
        let (namespace, name) = spec
            .split_once('/')
            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
            .with_context(|| format!("--kubeconfig-secret {spec}: give NAMESPACE/NAME"))?;
        let config = orrery_client::in_cluster(sa_dir).with_context(|| {
            "--kubeconfig-secret writes to the cluster the server runs in, through its in-cluster configuration"
        })?;
        let client = kube::Client::try_from(config).context("the in-cluster client")?;
        Ok(Target {
            api: kube::Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            server_url,
        })
    }

    async fn write(&self, bundle: &str, token: &str) -> Result<(), kube::Error> {
        use base64::Engine;
        let kubeconfig =
            orrery_apiserver::pki::kubeconfig(&self.server_url, bundle, "admin", token);
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": self.name, "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "orrery"}},
            "type": "Opaque",
            "data": {KEY: base64::engine::general_purpose::STANDARD.encode(kubeconfig)},
        });
        let params = kube::api::PatchParams::apply("orrery-server").force();
        self.api
            .patch(&self.name, &params, &kube::api::Patch::Apply(&secret))
            .await
            .map(|_| ())
    }
}

/// Writes the kubeconfig now and whenever the CA bundle changes, until `shutdown`; a write
/// that fails is tried again (5 s, doubling to a minute), with a warning.
pub async fn keep_exported(
    target: Target,
    authority: Arc<orrery_apiserver::ca::Authority>,
    token: String,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut changes = authority.subscribe();
    let mut written: Option<String> = None;
    let mut retry = Duration::from_secs(5);
    loop {
        let bundle = authority.current().bundle.clone();
        if written.as_deref() != Some(&bundle) {
            match target.write(&bundle, &token).await {
                Ok(()) => {
                    tracing::info!(secret = %format!("{}/{}", target.namespace, target.name), server = %target.server_url, "exported the admin kubeconfig");
                    written = Some(bundle);
                    retry = Duration::from_secs(5);
                }
                Err(e) => {
                    tracing::warn!(secret = %format!("{}/{}", target.namespace, target.name), error = %e, retry_in = ?retry, "exporting the admin kubeconfig failed");
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = shutdown.changed() => return,
                    }
                    retry = (retry * 2).min(Duration::from_secs(60));
                    continue;
                }
            }
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}
