//! A typed client for Orrery's Kubernetes-compatible API, built on the `kube` crate.
//!
//! The member agent, the binary's commands, the benchmarks and the tests talk to the server
//! through this crate (the controllers do not: they work on the store). [`connect`] builds a
//! [`kube::Client`] from a kubeconfig (the one `orrery server` writes works as is) or from a
//! URL, a bearer token and the server's CA; [`api`] gives a typed handle for any of Orrery's
//! own kinds by group, version, kind and plural.

use std::path::Path;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("invalid server URL {0:?}")]
    Url(String),
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    #[error("building the client: {0}")]
    Client(#[from] kube::Error),
}

/// A client from a kubeconfig file (its current context).
pub async fn from_kubeconfig(path: &Path) -> Result<Client, ClientError> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
        path: path.display().to_string(),
        source,
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| ClientError::Kubeconfig {
            path: path.display().to_string(),
            source,
        })?;
    Ok(Client::try_from(config)?)
}

/// Where a Pod finds its ServiceAccount's token, CA and namespace (Kubernetes mounts them
/// there).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The in-cluster configuration, as client-go and kube-rs build it: the API server at
/// `KUBERNETES_SERVICE_HOST`:`KUBERNETES_SERVICE_PORT`, the CA `ca.crt` and the token file
/// `token` of the ServiceAccount directory `dir` (normally [`SERVICE_ACCOUNT_DIR`]). The token
/// is read again as it goes (at least once a minute, kube-rs's token file, as client-go does)
/// so the kubelet's rotation of a projected token is followed without a restart.
pub fn in_cluster(dir: &Path) -> Result<Config, ClientError> {
    let env = |name: &str| {
        std::env::var(name).map_err(|_| ClientError::InCluster(format!("{name} is not set")))
    };
    let host = env("KUBERNETES_SERVICE_HOST")?;
    let port: u16 = env("KUBERNETES_SERVICE_PORT")?
        .parse()
        .map_err(|_| ClientError::InCluster("KUBERNETES_SERVICE_PORT is not a port".into()))?;
    // An IPv6 address is bracketed; 443 is left out, as client-go does.
    let host = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => host,
    };
    let url = if port == 443 {
        format!("https://{host}")
    } else {
        format!("https://{host}:{port}")
    };
    let uri: http::Uri = url.parse().map_err(|_| ClientError::Url(url.clone()))?;
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read_to_string(&path)
            .map_err(|e| ClientError::InCluster(format!("reading {}: {e}", path.display())))
    };
    let certs = pem_certificates(&read("ca.crt")?);
    if certs.is_empty() {
        return Err(ClientError::InCluster(format!(
            "{} holds no certificate",
            dir.join("ca.crt").display()
        )));
    }
    // Read once here so that a missing token is an error now, not at the first request.
    read("token")?;
    let mut config = Config::new(uri);
    config.root_cert = Some(certs);
    config.auth_info.token_file = Some(dir.join("token").display().to_string());
    if let Ok(ns) = read("namespace") {
        config.default_namespace = ns.trim().to_string();
    }
    Ok(config)
}

/// A client from the server's URL, a bearer token, and the PEM of the CA that signed the
/// server's certificate. Goes through the proxy of `HTTPS_PROXY` (minding `NO_PROXY`), as
/// clients built from a kubeconfig do.
pub async fn connect(url: &str, token: &str, ca_pem: &str) -> Result<Client, ClientError> {
    Ok(Client::try_from(
        config_for(url, token, Some(ca_pem)).await?,
    )?)
}

/// The client configuration [`connect`] uses; without a CA, certificates are not verified
/// (only for fetching a CA that is then checked against a pinned hash).
pub async fn config_for(
    url: &str,
    token: &str,
    ca_pem: Option<&str>,
) -> Result<Config, ClientError> {
    use base64::Engine;
    let _: http::Uri = url.parse().map_err(|_| ClientError::Url(url.to_string()))?;
    let mut cluster = serde_json::json!({ "server": url });
    match ca_pem {
        Some(pem) => {
            cluster["certificate-authority-data"] =
                serde_json::json!(base64::engine::general_purpose::STANDARD.encode(pem));
        }
        None => cluster["insecure-skip-tls-verify"] = serde_json::json!(true),
    }
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{ "name": "orrery", "cluster": cluster }],
        "users": [{ "name": "orrery", "user": { "token": token } }],
        "contexts": [{ "name": "orrery", "context": { "cluster": "orrery", "user": "orrery" } }],
        "current-context": "orrery",
    });
    let kubeconfig =
        Kubeconfig::from_yaml(&doc.to_string()).map_err(|source| ClientError::Kubeconfig {
            path: "(generated)".into(),
            source,
        })?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| ClientError::Kubeconfig {
            path: "(generated)".into(),
            source,
        })
}

/// The server's CA bundle from `/cacerts`, fetched without verification; callers must check
/// it against a hash they trust before using it.
pub async fn fetch_ca_unverified(url: &str) -> Result<String, ClientError> {
    let mut config = config_for(url, "", None).await?;
    // Nothing is verified, so no trust store is needed: without roots of its own, kube
    // loads the system's (every file under /etc/ssl/certs, parsed on each call), which cost a
    // simulated fleet's registration a seventh of its CPU.
    config.root_cert = Some(Vec::new());
    let client = Client::try_from(config)?;
    let req = http::Request::get("/cacerts")
        .body(Vec::new())
        .map_err(|e| ClientError::Url(e.to_string()))?;
    Ok(client.request_text(req).await?)
}

/// The DER certificates in a PEM bundle.
pub fn pem_certificates(pem: &str) -> Vec<Vec<u8>> {
    use base64::Engine;
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .filter_map(|block| block.split("-----END CERTIFICATE-----").next())
        .filter_map(|body| {
            let compact: String = body.chars().filter(|c| !c.is_whitespace()).collect();
            base64::engine::general_purpose::STANDARD
                .decode(compact)
                .ok()
        })
        .collect()
}

/// How to address one of Orrery's kinds.
#[derive(Clone, Debug)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

/// The kinds the agent and the commands address: Orrery's own, from their descriptors (where
/// each is served is said once, in `orrery_api::kinds`), and Kubernetes' Lease.
pub mod kinds {
    use super::Kind;
    use orrery_api::kinds as own;

    pub const CLUSTER: Kind = Kind::of(&own::CLUSTER);
    pub const CLUSTER_METRICS: Kind = Kind::of(&own::CLUSTER_METRICS);
    pub const WORK: Kind = Kind::of(&own::WORK);
    pub const RESOURCE_BINDING: Kind = Kind::of(&own::RESOURCE_BINDING);
    pub const RESOURCE_PLACEMENT_POLICY: Kind = Kind::of(&own::RESOURCE_PLACEMENT_POLICY);
    /// Kubernetes' Lease (a member's heartbeat, leader election).
    pub const LEASE: Kind = Kind {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        namespaced: true,
    };
}

impl Kind {
    /// Where one of Orrery's kinds is served.
    pub const fn of(d: &orrery_api::kinds::Descriptor) -> Kind {
        Kind {
            group: d.group,
            version: d.version,
            kind: d.kind,
            plural: d.plural,
            namespaced: d.namespaced,
        }
    }

    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.to_string(),
            version: self.version.to_string(),
            api_version: format!("{}/{}", self.group, self.version),
            kind: self.kind.to_string(),
            plural: self.plural.to_string(),
        }
    }
}

/// A handle on one kind: all namespaces (or cluster-scoped) when `namespace` is `None`.
pub fn api(client: &Client, kind: &Kind, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = kind.api_resource();
    match (kind.namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    }
}

/// Calls `f` on every object of `api`, read in pages of 500 as kubectl reads: a fleet of
/// thousands is never held whole, here or in the server.
pub async fn for_each(
    api: &Api<DynamicObject>,
    mut f: impl FnMut(&DynamicObject),
) -> Result<(), ClientError> {
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        page.items.iter().for_each(&mut f);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// How many Clusters are Ready now.
pub async fn ready_clusters(client: &Client) -> Result<usize, ClientError> {
    let mut ready = 0;
    for_each(&api(client, &kinds::CLUSTER, None), |o| {
        let is_ready = o
            .data
            .pointer("/status/conditions")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        ready += usize::from(is_ready);
    })
    .await?;
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_pem_bodies() {
        let pem = "-----BEGIN CERTIFICATE-----\naGVs\nbG8=\n-----END CERTIFICATE-----\n";
        assert_eq!(pem_certificates(pem), vec![b"hello".to_vec()]);
        assert!(pem_certificates("no certificates here").is_empty());
    }
}
