//! `orrery kubeconfig --cluster NAME`: a kubeconfig for a member cluster's API through the
//! cluster proxy, made from the control plane's kubeconfig (same credentials: the proxy
//! authorizes them on `clusters/proxy`, and the member sees the agent's).

use std::path::PathBuf;

use anyhow::{Context, bail};
use kube::config::Kubeconfig;

#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// The member cluster.
    #[arg(long)]
    pub cluster: String,
    /// Where to write it (default: standard output).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

/// The proxy's path for a cluster on the control plane's server.
pub fn proxy_path(cluster: &str) -> String {
    format!("/apis/multicluster.io/v1alpha1/clusters/{cluster}/proxy")
}

/// `k` reduced to its current context, pointed at cluster `cluster`'s API through the proxy.
pub fn through_proxy(mut k: Kubeconfig, cluster: &str) -> anyhow::Result<Kubeconfig> {
    if !orrery_api::validation::is_dns1123_subdomain(cluster).is_empty() {
        bail!("{cluster:?} is not a cluster name");
    }
    let context = k
        .current_context
        .clone()
        .or_else(|| k.contexts.first().map(|c| c.name.clone()))
        .context("the kubeconfig has no context")?;
    let mut ctx = k
        .contexts
        .into_iter()
        .find(|c| c.name == context)
        .with_context(|| format!("the kubeconfig has no context {context:?}"))?;
    let inner = ctx
        .context
        .as_mut()
        .with_context(|| format!("context {context:?} is empty"))?;
    let mut named = k
        .clusters
        .into_iter()
        .find(|c| c.name == inner.cluster)
        .with_context(|| format!("the kubeconfig has no cluster {:?}", inner.cluster))?;
    let server = named
        .cluster
        .as_mut()
        .and_then(|c| c.server.as_mut())
        .context("the kubeconfig's cluster names no server")?;
    *server = format!("{}{}", server.trim_end_matches('/'), proxy_path(cluster));
    let name = format!("orrery-{cluster}");
    named.name = name.clone();
    inner.cluster = name.clone();
    ctx.name = name.clone();
    let user = inner.user.clone();
    k.auth_infos.retain(|a| Some(&a.name) == user.as_ref());
    k.clusters = vec![named];
    k.contexts = vec![ctx];
    k.current_context = Some(name);
    Ok(k)
}

pub fn run(args: KubeconfigArgs) -> anyhow::Result<()> {
    let path = args.locate.kubeconfig();
    let k = Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
    let out = through_proxy(k, &args.cluster)?;
    // JSON is YAML, and kubectl reads either.
    let text = serde_json::to_string_pretty(&out)?;
    match args.output {
        Some(p) => {
            orrery_apiserver::pki::write_kubeconfig(&p, &text)
                .with_context(|| format!("writing {}", p.display()))?;
            eprintln!(
                "wrote {} for cluster {}'s API through the cluster proxy",
                p.display(),
                args.cluster
            );
        }
        None => println!("{text}"),
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_through_the_proxy_keeps_the_current_context_only() {
        let k: Kubeconfig = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "orrery",
            "clusters": [
                {"name": "orrery", "cluster": {"server": "https://127.0.0.1:6443/", "certificate-authority-data": "Q0E="}},
                {"name": "other", "cluster": {"server": "https://elsewhere"}},
            ],
            "contexts": [
                {"name": "orrery", "context": {"cluster": "orrery", "user": "admin"}},
                {"name": "x", "context": {"cluster": "other", "user": "someone"}},
            ],
            "users": [{"name": "admin", "user": {"token": "t"}}, {"name": "someone", "user": {"token": "u"}}],
        }))
        .unwrap();
        let p = through_proxy(k.clone(), "east-1").unwrap();
        assert_eq!(p.current_context.as_deref(), Some("orrery-east-1"));
        assert_eq!(p.clusters.len(), 1);
        let c = p.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(
            c.server.as_deref(),
            Some("https://127.0.0.1:6443/apis/multicluster.io/v1alpha1/clusters/east-1/proxy")
        );
        assert_eq!(c.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(p.auth_infos.len(), 1);
        assert_eq!(p.auth_infos[0].name, "admin");
        assert!(through_proxy(k.clone(), "a/../b").is_err());
        let mut none = k;
        none.contexts.clear();
        none.current_context = None;
        assert!(through_proxy(none, "a").is_err());
    }
}
