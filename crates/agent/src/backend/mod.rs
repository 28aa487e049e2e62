//! What an agent applies Works to: a member cluster, a real Kubernetes API ([`kube`]), another
//! Orrery server standing in for one ([`orrery`]), or a simulated cluster (the `orrery-sim`
//! crate, which implements [`Backend`] from outside).

use std::collections::BTreeMap;

use async_trait::async_trait;
use orrery_api::cluster::{
    ApiEnablement, NetworkStatus, NodeSummary, ResourceList, ResourceSummary,
};
use orrery_api::stateful::{Transfer, TransferStatus, VolumeStatus};
use orrery_api::work::{Health, ResourceIdentifier};
use serde_json::Value;

pub mod kube;
pub mod orrery;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The member cannot be reached or does not answer.
    #[error("the member cluster is unavailable: {0}")]
    Unavailable(String),
    /// The member has an object of that name that Orrery does not manage.
    #[error("{0} already exists in the member and is not managed by Orrery")]
    Conflict(String),
    /// The member refused the object.
    #[error("the member refused {what}: {message}")]
    Rejected { what: String, message: String },
}

/// How one applied object is doing in the member.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObjectState {
    pub health: Health,
    /// The object's own status there.
    pub status: Option<Value>,
    /// Its `metadata.generation` there.
    pub generation: Option<i64>,
    pub message: String,
    /// The persistent volumes a workload's pods use.
    pub volumes: Vec<VolumeStatus>,
    /// What a workload's pods use, when the member measures it.
    pub usage: Option<orrery_api::work::WorkloadUsage>,
    /// A Service's endpoints there.
    pub endpoints: Option<orrery_api::services::ServiceEndpoints>,
    /// The restarts of a workload's pods' containers, summed.
    pub restarts: Option<i64>,
}

/// What the member says about itself: health, capacity and what it serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemberReport {
    pub healthy: bool,
    pub message: String,
    pub kubernetes_version: String,
    pub api_enablements: Vec<ApiEnablement>,
    pub node_summary: NodeSummary,
    pub resource_summary: ResourceSummary,
    pub largest_node_free: ResourceList,
    pub network: Option<NetworkStatus>,
    /// KEP-2149 ClusterProperty values (`cluster.clusterset.k8s.io`...).
    pub properties: BTreeMap<String, String>,
    /// The storage classes offered, the default first.
    pub storage_classes: Vec<String>,
    /// The copies of data sets held: claims labelled `orrery.io/dataset`.
    pub data_sets: Vec<orrery_api::data::HeldDataSet>,
    /// The ServiceExports the member made of its own.
    pub service_exports: Vec<orrery_api::services::MemberExport>,
    /// Its nodes (the agent writes them into the member's ClusterMetrics).
    pub nodes: Vec<orrery_api::quota::NodeInfo>,
}

/// Why the agent acts on its member: the Work an operation carries out (`namespace/name`),
/// as the agent saw it then. The simulated member keeps these in its journal; an operation
/// with the same cause as the last one for that Work did not come from a change of the Work.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cause {
    pub work: String,
    pub uid: String,
    pub generation: i64,
    /// The Work's resourceVersion (of its deletion, for objects removed with it).
    pub revision: String,
    /// Why, in a few words (`applied`, `dropped from the Work`, `Work deleted`...).
    pub reason: &'static str,
}

/// A member cluster, as the agent drives it. Objects passed to [`Backend::apply`] already
/// carry Orrery's managed-by label and Work annotation.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Creates or updates one object. With `overwrite` false, an existing object that Orrery
    /// does not manage is left alone ([`BackendError::Conflict`]).
    async fn apply(
        &self,
        manifest: &Value,
        overwrite: bool,
        cause: &Cause,
    ) -> Result<(), BackendError>;

    /// The object as the member has it (spec, status and all), for a Retain script to read;
    /// `None` when it has none.
    async fn observed(&self, id: &ResourceIdentifier) -> Result<Option<Value>, BackendError>;

    /// Deletes one object Orrery applied (absent objects are fine).
    async fn delete(&self, id: &ResourceIdentifier, cause: &Cause) -> Result<(), BackendError>;

    /// The state of an applied object; `None` if the member does not have it.
    async fn state(&self, id: &ResourceIdentifier) -> Result<Option<ObjectState>, BackendError>;

    /// A number that stays the same for as long as [`Backend::state`] would answer the same
    /// for `id`, so the agent reads and reports only what changed (a member with thousands
    /// of objects, reported several times a second). `None`: the backend cannot tell now;
    /// the agent asks `state` every time.
    fn state_stamp(&self, _id: &ResourceIdentifier) -> Option<u64> {
        None
    }

    /// The member's health, capacity and inventory.
    async fn report(&self) -> Result<MemberReport, BackendError>;

    /// Takes part in the volume transfers a Work asks for (`work` is its name), replacing
    /// what it asked before; an empty list ends its transfers. A backend that cannot move
    /// volume data refuses any.
    async fn set_transfers(&self, _work: &str, transfers: &[Transfer]) -> Result<(), BackendError> {
        if transfers.is_empty() {
            return Ok(());
        }
        Err(BackendError::Rejected {
            what: "volume transfers".into(),
            message: "this member's backend cannot move volume data".into(),
        })
    }

    /// Where the transfers a Work asked for stand, in its order.
    async fn transfer_statuses(&self, _work: &str, _transfers: &[Transfer]) -> Vec<TransferStatus> {
        Vec::new()
    }

    /// Like [`Backend::state_stamp`], for every transfer's status at once.
    fn transfer_stamp(&self) -> Option<u64> {
        Some(0)
    }

    /// Moves when a transfer reaches a milestone the control plane waits for (a snapshot
    /// taken, a copy in, a fence confirmed): the agent reports it without waiting for its
    /// next report slot, since a migration's downtime is made of such waits.
    fn milestone(&self) -> u64 {
        0
    }

    /// Writes the status of one of the member's own ServiceExports (the conditions the
    /// control plane decided). A member without the MCS API has none to write.
    async fn set_export_status(
        &self,
        _namespace: &str,
        _name: &str,
        _status: &Value,
    ) -> Result<(), BackendError> {
        Ok(())
    }

    /// Answers a request for the member's API that came through the cluster proxy (the
    /// tunnel the agent keeps open to the server). The request's path is the member API's.
    async fn proxy(&self, req: http::Request<bytes::Bytes>) -> http::Response<ProxyBody>;

    /// Answers a WebSocket upgrade that came through the cluster proxy (exec, attach,
    /// port-forward): `200` and the subprotocol chosen, then the stream `upgrade` brings is
    /// the WebSocket's (client frames masked, as RFC 6455 has them). `req` is the request's
    /// head, its path the member API's.
    async fn proxy_upgrade(
        &self,
        req: http::request::Parts,
        upgrade: hyper::upgrade::OnUpgrade,
    ) -> http::Response<ProxyBody>;

    /// Changes when object states may have changed, so the agent re-reads and reports them.
    fn changed(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// The body of an answer through the cluster proxy: it may stream (a followed log).
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, std::io::Error>;

/// A whole answer through the cluster proxy.
pub fn proxy_answer(
    status: http::StatusCode,
    content_type: &str,
    body: impl Into<bytes::Bytes>,
) -> http::Response<ProxyBody> {
    use http_body_util::BodyExt;
    let mut r = http::Response::new(
        http_body_util::Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

/// An error through the cluster proxy, as a Kubernetes Status.
pub fn proxy_error(status: http::StatusCode, message: &str) -> http::Response<ProxyBody> {
    let reason = match status.as_u16() {
        404 => "NotFound",
        400 => "BadRequest",
        405 => "MethodNotAllowed",
        502 => "BadGateway",
        _ => "ServiceUnavailable",
    };
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": status.as_u16(),
    });
    proxy_answer(status, "application/json", body.to_string())
}
