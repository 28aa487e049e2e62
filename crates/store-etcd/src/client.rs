//! A thin etcd v3 client over the generated gRPC stubs: the calls the store makes, with etcd's
//! request shapes spelled out once.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use crate::rpc::etcdserverpb::{
    CompactionRequest, Compare, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp,
    TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest, WatchResponse, compare,
    kv_client::KvClient, request_op, watch_client::WatchClient, watch_request,
};

/// A list page of 10,000 objects of a few KiB each is tens of MiB; etcd itself sends any size.
const MAX_MESSAGE: usize = 512 * 1024 * 1024;

/// How an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("invalid endpoint {endpoint}: {source}")]
    Endpoint {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("{}", .0.message())]
    Status(#[from] tonic::Status),
}

impl EtcdError {
    /// etcd's "required revision has been compacted".
    pub fn is_compacted(&self) -> bool {
        self.to_string()
            .contains("required revision has been compacted")
    }

    /// etcd's "required revision is a future revision".
    pub fn is_future(&self) -> bool {
        self.to_string()
            .contains("required revision is a future revision")
    }
}

/// Connection settings.
#[derive(Clone, Debug)]
pub struct Connect {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// HTTP/2 keep-alive ping interval and the time to wait for its answer.
    pub keep_alive: (Duration, Duration),
}

/// Clients of the KV and Watch services over one channel balanced across the endpoints.
#[derive(Clone, Debug)]
pub struct Client {
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
}

impl Client {
    /// Builds the channel. Connections are made on first use and remade when they fail, so an
    /// endpoint that is down now is used once it is back.
    pub fn new(endpoints: &[String], c: &Connect) -> Result<Client, EtcdError> {
        let mut list = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let url = if e.contains("://") {
                e.clone()
            } else {
                format!("http://{e}")
            };
            let endpoint = Endpoint::from_shared(url)
                .map_err(|source| EtcdError::Endpoint {
                    endpoint: e.clone(),
                    source,
                })?
                .connect_timeout(c.connect_timeout)
                // Bounds the wait for a response's headers: a watch, once open, lives on.
                .timeout(c.request_timeout)
                .http2_keep_alive_interval(c.keep_alive.0)
                .keep_alive_timeout(c.keep_alive.1)
                .keep_alive_while_idle(true);
            list.push(endpoint);
        }
        let channel = Channel::balance_list(list.into_iter());
        let kv = KvClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let watch = WatchClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        Ok(Client { kv, watch })
    }

    /// Reads `key` (or `[key, range_end)` when `range_end` is not empty).
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse, EtcdError> {
        Ok(self.kv.clone().range(req).await?.into_inner())
    }

    pub async fn put(&self, key: String, value: Vec<u8>) -> Result<PutResponse, EtcdError> {
        let req = PutRequest {
            key: key.into_bytes(),
            value,
            ..Default::default()
        };
        Ok(self.kv.clone().put(req).await?.into_inner())
    }

    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, EtcdError> {
        Ok(self.kv.clone().txn(req).await?.into_inner())
    }

    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let req = CompactionRequest {
            revision,
            physical: false,
        };
        self.kv.clone().compact(req).await?;
        Ok(())
    }

    /// Opens a watch. The stream stays open while the returned [`Watch`] is held.
    pub async fn watch(&self, create: WatchCreateRequest) -> Result<Watch, EtcdError> {
        let (tx, rx) = mpsc::channel(1);
        let first = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        };
        // The channel has room for the one request: this cannot fail while `rx` is alive.
        let _ = tx.try_send(first);
        let stream = self
            .watch
            .clone()
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Watch {
            _requests: tx,
            stream,
        })
    }
}

/// An open watch stream.
#[derive(Debug)]
pub struct Watch {
    /// Closing the request side would end the watch.
    _requests: mpsc::Sender<WatchRequest>,
    stream: tonic::Streaming<WatchResponse>,
}

impl Watch {
    /// The next response; `None` when etcd ended the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, EtcdError> {
        Ok(self.stream.message().await?)
    }
}

/// The revision a response was served at.
pub fn revision(header: Option<&crate::rpc::etcdserverpb::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

/// `key`'s create revision compared with `value`.
pub fn created(key: &str, result: compare::CompareResult, value: i64) -> Compare {
    Compare {
        result: result as i32,
        target: compare::CompareTarget::Create as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(compare::TargetUnion::CreateRevision(value)),
    }
}

/// `key`'s last modification revision compared with `value`.
pub fn modified(key: &str, result: compare::CompareResult, value: i64) -> Compare {
    Compare {
        result: result as i32,
        target: compare::CompareTarget::Mod as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(compare::TargetUnion::ModRevision(value)),
    }
}

pub fn put_op(key: &str, value: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            ..Default::default()
        })),
    }
}

pub fn get_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

pub fn delete_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            crate::rpc::etcdserverpb::DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                prev_kv: true,
                ..Default::default()
            },
        )),
    }
}
