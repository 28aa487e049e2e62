//! The agent's side of the wire. Every connection is opened by the agent (inward, through
//! `HTTPS_PROXY` when it is set); the server never needs a route to the member.

use futures_util::{Stream, StreamExt};
use kube::Resource;
use kube::api::{
    Api, DynamicObject, GetParams, ListParams, Patch, PatchParams, PostParams, WatchParams,
};
use kube::core::{Request, WatchEvent};
use orrery_api::Object;
use orrery_client::{Kind, kinds};

/// The protocol the tunnel upgrades to (the server's `proxy::TUNNEL_PROTOCOL`).
pub const TUNNEL_PROTOCOL: &str = "orrery-tunnel";
use serde_json::{Value, json};

/// What went wrong talking to the server.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The server refused our credentials (401).
    #[error("the server refused the agent's token: {0}")]
    Unauthorized(String),
    /// Authenticated, but not allowed (403).
    #[error("the server forbade it: {0}")]
    Forbidden(String),
    /// Our Cluster is gone (404 on it).
    #[error("the cluster is not registered: {0}")]
    NotRegistered(String),
    /// The watch fell too far behind (410): list again.
    #[error("the watch expired: {0}")]
    Expired(String),
    /// A conditional write met a newer version (409).
    #[error("the object changed meanwhile: {0}")]
    Conflict(String),
    /// The request was refused for another reason (4xx).
    #[error("the server refused the request ({code}): {message}")]
    Refused { code: u16, message: String },
    /// Network trouble or a server error: retry later.
    #[error("the server is unreachable: {0}")]
    Unreachable(String),
    /// The server is serving all it takes at once (429): come back shortly.
    #[error("the server is busy: {0}")]
    Busy(String),
    #[error("the server sent something unexpected: {0}")]
    Protocol(String),
}

impl From<kube::Error> for TransportError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => match s.code {
                401 => TransportError::Unauthorized(s.message),
                403 => TransportError::Forbidden(s.message),
                404 => TransportError::NotRegistered(s.message),
                409 => TransportError::Conflict(s.message),
                410 => TransportError::Expired(s.message),
                429 => TransportError::Busy(s.message),
                c if (400..500).contains(&c) => TransportError::Refused {
                    code: c,
                    message: s.message,
                },
                _ => TransportError::Unreachable(s.message),
            },
            other => TransportError::Unreachable(other.to_string()),
        }
    }
}

impl TransportError {
    /// Whether trying again later may help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            TransportError::Unreachable(_) | TransportError::Expired(_) | TransportError::Busy(_)
        )
    }
}

fn to_object(d: DynamicObject) -> Result<Object, TransportError> {
    let v = serde_json::to_value(d).map_err(|e| TransportError::Protocol(e.to_string()))?;
    Object::from_value(v).map_err(|e| TransportError::Protocol(e.to_string()))
}

/// One change to the Works of the agent's cluster.
#[derive(Debug)]
pub enum WorkEvent {
    Applied(Object),
    Deleted(Object),
    /// Progress marker: the watch has seen everything up to this resourceVersion.
    Bookmark(String),
}

/// A connection to the server as one cluster's agent.
#[derive(Clone)]
pub struct Transport {
    client: kube::Client,
    cluster: String,
    namespace: String,
    /// Requests for the objects a heartbeat reads and writes; their answers are decoded
    /// straight into [`Object`]s (see [`Transport::object`]).
    clusters: Request,
    leases: Request,
    metrics: Request,
}

/// Requests for `kind`'s objects (in `namespace`, when it is namespaced).
fn requests(kind: &Kind, namespace: Option<&str>) -> Request {
    let namespace = namespace.filter(|_| kind.namespaced);
    Request::new(DynamicObject::url_path(&kind.api_resource(), namespace))
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl Transport {
    /// A new cluster token for this agent's cluster (the current one keeps working until it
    /// expires).
    pub async fn renew(&self) -> Result<Renewed, TransportError> {
        let req = http::Request::post("/agent/v1/renew")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(b"{}".to_vec())
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        let text = self.client.request_text(req).await?;
        serde_json::from_str(&text).map_err(|e| TransportError::Protocol(e.to_string()))
    }

    /// The CA bundle the server hands out now, read over this verified connection (so it
    /// is the server's, whatever it holds: during a CA rotation, the old CA and the new).
    pub async fn ca_bundle(&self) -> Result<String, TransportError> {
        let req = http::Request::get("/cacerts")
            .body(Vec::new())
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        Ok(self.client.request_text(req).await?)
    }

    pub fn new(client: kube::Client, cluster: &str) -> Self {
        Transport {
            client,
            cluster: cluster.to_string(),
            namespace: orrery_api::cluster::namespace_of(cluster),
            clusters: requests(&kinds::CLUSTER, None),
            leases: requests(&kinds::LEASE, Some(orrery_api::cluster::LEASE_NAMESPACE)),
            metrics: requests(&kinds::CLUSTER_METRICS, None),
        }
    }

    /// Sends `req` and decodes its answer once, into an [`Object`]: a typed `Api` would
    /// decode a `DynamicObject` and convert it again, which for every heartbeat (whose answer
    /// is the whole Cluster) was a tenth of a simulated fleet's CPU.
    async fn object(
        &self,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
        verb: &'static str,
    ) -> Result<Object, TransportError> {
        let mut req = req.map_err(|e| TransportError::Protocol(e.to_string()))?;
        req.extensions_mut().insert(verb);
        Ok(self.client.request::<Object>(req).await?)
    }

    fn works(&self) -> Api<DynamicObject> {
        orrery_client::api(&self.client, &kinds::WORK, Some(&self.namespace))
    }

    /// Every Work of the cluster, and the resourceVersion to watch from.
    pub async fn list_works(&self) -> Result<(Vec<Object>, String), TransportError> {
        let list = self.works().list(&ListParams::default()).await?;
        let rv = list.metadata.resource_version.unwrap_or_default();
        let items = list
            .items
            .into_iter()
            .map(to_object)
            .collect::<Result<_, _>>()?;
        Ok((items, rv))
    }

    /// Changes to the Works after `rv`, until the server ends the watch.
    pub async fn watch_works(
        &self,
        rv: &str,
    ) -> Result<impl Stream<Item = Result<WorkEvent, TransportError>> + use<>, TransportError> {
        let params = WatchParams::default().timeout(290);
        let stream = self.works().watch(&params, rv).await?;
        Ok(stream.map(|ev| match ev {
            Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                to_object(o).map(WorkEvent::Applied)
            }
            Ok(WatchEvent::Deleted(o)) => to_object(o).map(WorkEvent::Deleted),
            Ok(WatchEvent::Bookmark(b)) => Ok(WorkEvent::Bookmark(b.metadata.resource_version)),
            Ok(WatchEvent::Error(e)) if e.code == 410 => Err(TransportError::Expired(e.message)),
            Ok(WatchEvent::Error(e)) => Err(TransportError::Unreachable(e.message)),
            Err(e) => Err(TransportError::from(e)),
        }))
    }

    /// Writes the cluster's status (`status`, a merge patch of the status subresource's
    /// `status`) and returns the Cluster as stored.
    pub async fn heartbeat(&self, status: Value) -> Result<Object, TransportError> {
        let patch = json!({ "status": status });
        let req = self.clusters.patch_subresource(
            "status",
            &self.cluster,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        );
        self.object(req, "patch_status").await
    }

    /// The cluster's Cluster object.
    pub async fn get_cluster(&self) -> Result<Object, TransportError> {
        let req = self.clusters.get(&self.cluster, &GetParams::default());
        self.object(req, "get").await
    }

    /// The cluster's heartbeat Lease (`NotRegistered` when the server has made none).
    pub async fn get_lease(&self) -> Result<Object, TransportError> {
        let req = self.leases.get(&self.cluster, &GetParams::default());
        self.object(req, "get").await
    }

    /// Replaces the Lease with `lease`, conditional on its resourceVersion; returns it as
    /// stored. `Conflict` when it changed since it was read.
    pub async fn renew_lease(&self, lease: &Object) -> Result<Object, TransportError> {
        let body =
            serde_json::to_vec(lease).map_err(|e| TransportError::Protocol(e.to_string()))?;
        let req = self
            .leases
            .replace(&self.cluster, &PostParams::default(), body);
        self.object(req, "replace").await
    }

    /// Opens the cluster proxy's tunnel: the connection, upgraded, on which the server sends
    /// the requests for the member's API.
    pub async fn open_tunnel(&self) -> Result<hyper::upgrade::Upgraded, TransportError> {
        let req = http::Request::post(format!(
            "/apis/multicluster.io/v1alpha1/clusters/{}/tunnel",
            self.cluster
        ))
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, TUNNEL_PROTOCOL)
        .body(kube::client::Body::empty())
        .map_err(|e| TransportError::Protocol(e.to_string()))?;
        let res = self.client.send(req).await?;
        if res.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            return Err(match res.status().as_u16() {
                404 => TransportError::NotRegistered("the server has no cluster proxy".into()),
                code => TransportError::Refused {
                    code,
                    message: format!("the tunnel was refused ({code})"),
                },
            });
        }
        hyper::upgrade::on(res)
            .await
            .map_err(|e| TransportError::Unreachable(e.to_string()))
    }

    /// Writes the member's nodes into its ClusterMetrics (a merge patch of the status
    /// subresource of the object the server made for it).
    pub async fn write_metrics(&self, status: Value) -> Result<(), TransportError> {
        let mut req = self
            .metrics
            .patch_subresource(
                "status",
                &self.cluster,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        req.extensions_mut().insert("patch_status");
        // The answer (every node again) is not needed: only whether it was taken.
        self.client.request_text(req).await?;
        Ok(())
    }

    /// Sends up to 1,000 status items in one request (`POST /api/v1/sync/batch`); returns,
    /// per item in the order sent, `None` when the server took it or why it refused it.
    pub async fn report(&self, items: Vec<Value>) -> Result<Vec<Option<String>>, TransportError> {
        let sent = items.len();
        let body = serde_json::to_vec(&json!({ "items": items }))
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        let req = http::Request::post("/api/v1/sync/batch")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        let text = self.client.request_text(req).await?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| TransportError::Protocol(e.to_string()))?;
        // Results come in the items' order (an item whose handler failed has no name).
        let results = v.get("results").and_then(Value::as_array);
        Ok((0..sent)
            .map(|i| match results.and_then(|r| r.get(i)) {
                Some(r) if r["code"] == "OK" => None,
                Some(r) => Some(format!(
                    "{}: {}",
                    r["code"].as_str().unwrap_or("?"),
                    r["message"].as_str().unwrap_or_default()
                )),
                None => Some("the server gave no result for it".into()),
            })
            .collect())
    }
}

/// What the server answers a registration with.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Registration {
    pub token: String,
    pub uid: String,
    pub namespace: String,
    /// When the token expires; none: it does not.
    #[serde(default)]
    pub expires: Option<orrery_api::Time>,
}

/// What the server answers a token's renewal with.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Renewed {
    pub token: String,
    #[serde(default)]
    pub expires: Option<orrery_api::Time>,
}

/// Registers a cluster with a bootstrap (or cluster) token.
pub async fn register(
    client: &kube::Client,
    request: &orrery_api::cluster::Registration,
) -> Result<Registration, TransportError> {
    let body = serde_json::to_vec(request).map_err(|e| TransportError::Protocol(e.to_string()))?;
    let req = http::Request::post("/agent/v1/register")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|e| TransportError::Protocol(e.to_string()))?;
    let text = client.request_text(req).await.map_err(|e| match e {
        // A 404 here is about the endpoint, not a missing cluster.
        kube::Error::Api(s) if s.code == 404 => TransportError::Refused {
            code: 404,
            message: s.message,
        },
        other => other.into(),
    })?;
    serde_json::from_str(&text).map_err(|e| TransportError::Protocol(e.to_string()))
}
