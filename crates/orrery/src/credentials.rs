//! `orrery credentials`: a client-go exec credential plugin (KEP-541) for the access provider
//! Orrery puts in each member's ClusterProfile (KEP-4322's `accessProviders`, named
//! `orrery`).
//!
//! A consumer that reaches clusters through ClusterProfiles (Kueue's MultiKueue, anything
//! built on cluster-inventory-api's `BuildConfigFromCP`) runs it with `provideClusterInfo:
//! true`. It reads the cluster's name from `spec.cluster.config.clusterName` (the profile's
//! `client.authentication.k8s.io/exec` extension, passed verbatim) and answers with a
//! short-lived token of that cluster's proxy identity: a TokenRequest for the ServiceAccount
//! `orrery-cluster-proxy/<cluster>`, which RBAC allows `clusters/proxy` of that cluster and
//! nothing else. The plugin's own credentials (its kubeconfig) need only `create` on
//! `serviceaccounts/token` in `orrery-cluster-proxy`; no kubeconfig is kept per cluster.

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct CredentialsArgs {
    /// The cluster, when the exec info names none (a plugin configured without
    /// `provideClusterInfo`). With both, they must agree.
    #[arg(long)]
    pub cluster: Option<String>,
    /// How long each token is good for (at least 10 minutes, as Kubernetes has it). The
    /// client asks again when it expires.
    #[arg(long, default_value = "10m", value_parser = crate::server::parse_duration)]
    pub expiration: Duration,
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

/// The ExecCredential versions client-go speaks; the answer is in the version asked.
const VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// What the exec info asks: (the ExecCredential version, the cluster).
fn request(exec_info: Option<&str>, flag: Option<&str>) -> anyhow::Result<(String, String)> {
    let info: Value = match exec_info {
        Some(s) if !s.trim().is_empty() => serde_json::from_str(s)
            .context("KUBERNETES_EXEC_INFO is not an ExecCredential (JSON)")?,
        // Run by hand, or by a client of before KEP-541's exec info: v1, the flag's cluster.
        _ => json!({ "apiVersion": VERSIONS[0] }),
    };
    let version = info
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !VERSIONS.contains(&version) {
        bail!("exec info of apiVersion {version:?}: this plugin speaks {VERSIONS:?}");
    }
    let cluster = info.pointer("/spec/cluster");
    let named = cluster
        .and_then(|c| c.pointer("/config/clusterName"))
        .and_then(Value::as_str);
    // The server the client reaches must be that cluster's proxy: a token for one cluster is
    // not handed to a client bound for another.
    let server = cluster
        .and_then(|c| c.get("server"))
        .and_then(Value::as_str);
    let by_server = server.and_then(|s| {
        let (_, rest) = s.split_once("/apis/multicluster.io/v1alpha1/clusters/")?;
        rest.strip_suffix("/proxy")
            .or_else(|| rest.strip_suffix("/proxy/"))
    });
    let name = match (named, flag) {
        (Some(a), Some(b)) if a != b => {
            bail!("the exec info names cluster {a:?} and --cluster {b:?}")
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => bail!(
            "no cluster: the exec info has no spec.cluster.config.clusterName (set provideClusterInfo: true in the provider's execConfig) and no --cluster was given"
        ),
    };
    if let Some(s) = server
        && by_server != Some(name)
    {
        bail!("the client is bound for {s:?}, which is not cluster {name:?}'s proxy");
    }
    if !orrery_api::validation::is_dns1123_subdomain(name).is_empty() {
        bail!("{name:?} is not a cluster name");
    }
    Ok((version.to_string(), name.to_string()))
}

/// The ExecCredential answering `version` with `token`, good until `expires`.
fn answer(version: &str, token: &str, expires: &str) -> Value {
    json!({
        "apiVersion": version,
        "kind": "ExecCredential",
        "status": { "token": token, "expirationTimestamp": expires },
    })
}

pub async fn run(args: CredentialsArgs) -> anyhow::Result<()> {
    let info = std::env::var("KUBERNETES_EXEC_INFO").ok();
    let (version, cluster) = request(info.as_deref(), args.cluster.as_deref())?;
    let seconds = args.expiration.as_secs().max(600);
    let path = args.locate.kubeconfig();
    let client = orrery_client::from_kubeconfig(&path)
        .await
        .with_context(|| format!("reading {}", path.display()))?;
    let uri = format!(
        "/api/v1/namespaces/{}/serviceaccounts/{cluster}/token",
        orrery_api::cluster::PROXY_NAMESPACE
    );
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": { "expirationSeconds": seconds },
    });
    let req = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body)?)?;
    let out: Value = client.request(req).await.with_context(|| {
        format!(
            "a token of cluster {cluster:?}'s proxy identity ({}/{cluster}): the plugin's credentials need create on serviceaccounts/token there",
            orrery_api::cluster::PROXY_NAMESPACE
        )
    })?;
    let token = out
        .pointer("/status/token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .context("the TokenRequest's answer has no token")?;
    let expires = out
        .pointer("/status/expirationTimestamp")
        .and_then(Value::as_str)
        .unwrap_or_default();
    println!("{}", answer(&version, token, expires));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_comes_from_the_exec_info_and_must_match_the_server() {
        let info = |v: &str, server: &str, name: Option<&str>| {
            let mut i = json!({"apiVersion": v, "kind": "ExecCredential",
                "spec": {"interactive": false, "cluster": {"server": server}}});
            if let Some(n) = name {
                i["spec"]["cluster"]["config"] = json!({"clusterName": n});
            }
            i.to_string()
        };
        let proxy =
            |c: &str| format!("https://o:6443/apis/multicluster.io/v1alpha1/clusters/{c}/proxy");
        let v1 = VERSIONS[0];
        let beta = VERSIONS[1];
        assert_eq!(
            request(Some(&info(v1, &proxy("east"), Some("east"))), None).unwrap(),
            (v1.to_string(), "east".to_string())
        );
        // The version asked is the version answered.
        assert_eq!(
            request(Some(&info(beta, &proxy("east"), Some("east"))), None)
                .unwrap()
                .0,
            beta
        );
        // The flag stands in for the extension, and must agree with it.
        assert_eq!(
            request(Some(&info(v1, &proxy("west"), None)), Some("west"))
                .unwrap()
                .1,
            "west"
        );
        let cases = [
            (
                info(v1, &proxy("east"), Some("west")),
                None,
                "not cluster \"west\"'s proxy",
            ),
            (
                info(v1, &proxy("east"), Some("east")),
                Some("west"),
                "--cluster",
            ),
            (info(v1, &proxy("east"), None), None, "provideClusterInfo"),
            (
                info(
                    "client.authentication.k8s.io/v1alpha1",
                    &proxy("e"),
                    Some("e"),
                ),
                None,
                "speaks",
            ),
            (
                info(v1, "https://elsewhere:6443", Some("east")),
                None,
                "not cluster",
            ),
            ("{".to_string(), None, "not an ExecCredential"),
        ];
        for (i, flag, want) in cases {
            let err = request(Some(&i), flag).unwrap_err().to_string();
            assert!(err.contains(want), "{i}: {err}");
        }
        // Run by hand: v1, the flag's cluster.
        assert_eq!(
            request(None, Some("east")).unwrap(),
            (v1.to_string(), "east".to_string())
        );
        assert!(request(None, Some("a/b")).is_err());
    }

    #[test]
    fn the_answer_is_an_exec_credential_of_the_version_asked() {
        let a = answer(VERSIONS[1], "t", "2026-01-01T00:10:00Z");
        assert_eq!(a["apiVersion"], VERSIONS[1]);
        assert_eq!(a["kind"], "ExecCredential");
        assert_eq!(
            a["status"],
            json!({"token": "t", "expirationTimestamp": "2026-01-01T00:10:00Z"})
        );
    }
}
