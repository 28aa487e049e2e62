//! A thin etcd v3 client over the generated gRPC stubs: the calls the store makes, with etcd's
//! request shapes spelled out once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The store was closed: no call is made.
    #[error("the store is closed")]
    Closed,
}

impl EtcdError {
    /// etcd's "required revision has been compacted".
    pub fn is_compacted(&self) -> bool {
        self.to_string()
            .contains("required revision has been compacted")
    }

    /// The cluster cannot serve the call now: the member has no leader (no quorum), or no
    /// member answered in time. A write that failed so was not acknowledged.
    pub fn is_unavailable(&self) -> bool {
        match self {
            EtcdError::Timeout(_) => true,
            EtcdError::Status(s) => {
                matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                ) || s.message().contains("no leader")
                    || s.message().contains("request timed out")
                    || s.message().contains("leader changed")
            }
            EtcdError::Endpoint { .. } | EtcdError::Closed => false,
        }
    }

    /// etcd refused the request unapplied because it is overloaded ("too many requests":
    /// its apply lags its commits by thousands of entries).
    pub fn is_busy(&self) -> bool {
        matches!(self, EtcdError::Status(s) if s.code() == tonic::Code::ResourceExhausted
            && s.message().contains("too many requests"))
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
    /// How long a read or a write may wait for its answer.
    pub read_timeout: Duration,
    pub write_timeout: Duration,
}

/// One member's clients.
#[derive(Clone, Debug)]
struct Member {
    url: String,
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
}

/// Clients of the KV and Watch services of every member. Calls go to one member; one that
/// cannot be reached, or that has no leader, makes the call go to the next (a write only when
/// it certainly was not carried out: the connection was never made, or the member refused it
/// for want of a leader before anything else).
#[derive(Clone, Debug)]
pub struct Client {
    members: Arc<[Member]>,
    current: Arc<AtomicUsize>,
    read_timeout: Duration,
    write_timeout: Duration,
}

/// A request that a member without a leader refuses at once ("etcdserver: no leader", as
/// clientv3's `WithRequireLeader`), instead of holding it until etcd's own timeout.
fn leader_required<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    req
}

/// The call never reached a member able to serve it: the connection could not be made, or
/// the member has no leader. Another member may be asked, a write included.
fn not_served(s: &tonic::Status) -> bool {
    let m = s.message();
    m.contains("no leader")
        || (s.code() == tonic::Code::Unavailable
            && (m.contains("tcp connect error")
                || m.contains("error trying to connect")
                || m.contains("onnection refused")))
}

/// The member a process asks first, drawn at random: replicas given the same list of
/// members would otherwise all load its first one (clientv3 spreads its calls over the list
/// too), and that member alone served every replica's reads and watches.
fn first_member(n: usize) -> usize {
    use std::hash::BuildHasher;
    let draw = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    (draw % n.max(1) as u64) as usize
}

/// What kind of call: whether a broken call may be asked of another member.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

impl Client {
    /// Builds a channel per member. Connections are made on first use and remade when they
    /// fail, so a member that is down now is used again once it is back.
    pub fn new(endpoints: &[String], c: &Connect) -> Result<Client, EtcdError> {
        let mut members = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let url = if e.contains("://") {
                e.clone()
            } else {
                format!("http://{e}")
            };
            let channel = Endpoint::from_shared(url.clone())
                .map_err(|source| EtcdError::Endpoint {
                    endpoint: e.clone(),
                    source,
                })?
                .connect_timeout(c.connect_timeout)
                // Bounds the wait for a response's headers: a watch, once open, lives on.
                .timeout(c.request_timeout)
                .http2_keep_alive_interval(c.keep_alive.0)
                .keep_alive_timeout(c.keep_alive.1)
                .keep_alive_while_idle(true)
                .connect_lazy();
            members.push(Member {
                url,
                kv: KvClient::new(channel.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
                watch: WatchClient::new(channel).max_decoding_message_size(MAX_MESSAGE),
            });
        }
        if members.is_empty() {
            return Err(EtcdError::Status(tonic::Status::invalid_argument(
                "no etcd endpoint given",
            )));
        }
        let first = first_member(members.len());
        Ok(Client {
            members: members.into(),
            current: Arc::new(AtomicUsize::new(first)),
            read_timeout: c.read_timeout,
            write_timeout: c.write_timeout,
        })
    }

    /// Runs `call` on the current member, and on the next ones while it is not served (reads
    /// also when the connection broke), each member once, all within `limit`.
    async fn call<T, F, Fut>(&self, kind: Kind, limit: Duration, call: F) -> Result<T, EtcdError>
    where
        F: Fn(Member) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let n = self.members.len();
        let attempts = async {
            let mut last = None;
            for _ in 0..n {
                let i = self.current.load(Ordering::Acquire) % n;
                let member = self.members[i].clone();
                match call(member).await {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s) => {
                        // A read may be asked again anywhere: it changes nothing.
                        // (A loaded member may also cut its answer short: hyper's "error
                        // reading a body from connection", seen listing 10,000 Clusters.)
                        let elsewhere = not_served(&s)
                            || (kind == Kind::Read
                                && (s.code() == tonic::Code::Unavailable
                                    || s.message().contains("transport error")
                                    || s.message().contains("error reading a body")));
                        if !elsewhere {
                            return Err(EtcdError::Status(s));
                        }
                        tracing::debug!(member = %self.members[i].url, error = %s.message(), "etcd member did not serve; trying the next");
                        // Another caller may have moved on already.
                        let _ = self.current.compare_exchange(
                            i,
                            (i + 1) % n,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                        last = Some(s);
                    }
                }
            }
            Err(EtcdError::Status(last.unwrap_or_else(|| {
                tonic::Status::unavailable("no etcd member answered")
            })))
        };
        match tokio::time::timeout(limit, attempts).await {
            Ok(r) => r,
            Err(_) => Err(EtcdError::Timeout(limit)),
        }
    }

    /// Moves later calls to the next member (a watch on this one broke).
    pub fn next_member(&self) {
        let n = self.members.len();
        let i = self.current.load(Ordering::Acquire);
        let _ = self
            .current
            .compare_exchange(i, (i + 1) % n, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Reads `key` (or `[key, range_end)` when `range_end` is not empty); a serializable
    /// read (`req.serializable`) is answered by one member without consensus, leader or not.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.call(Kind::Read, self.read_timeout, |m| {
            let req = req.clone();
            async move {
                let call = if req.serializable {
                    tonic::Request::new(req)
                } else {
                    leader_required(req)
                };
                m.kv.clone().range(call).await
            }
        })
        .await
    }

    pub async fn put(&self, key: String, value: Vec<u8>) -> Result<PutResponse, EtcdError> {
        let req = PutRequest {
            key: key.into_bytes(),
            value,
            ..Default::default()
        };
        self.call(Kind::Write, self.write_timeout, |m| {
            let req = req.clone();
            async move { m.kv.clone().put(leader_required(req)).await }
        })
        .await
    }

    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.call(Kind::Write, self.write_timeout, |m| {
            let req = req.clone();
            async move { m.kv.clone().txn(leader_required(req)).await }
        })
        .await
    }

    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let req = CompactionRequest {
            revision,
            physical: false,
        };
        self.call(Kind::Write, self.write_timeout, |m| async move {
            m.kv.clone().compact(leader_required(req)).await
        })
        .await?;
        Ok(())
    }

    /// Opens a watch. The stream stays open while the returned [`Watch`] is held. A member
    /// that loses its leader ends the watch, so that it is made again on a member that has
    /// one (a member cut off from the others would otherwise stay silent).
    pub async fn watch(&self, create: WatchCreateRequest) -> Result<Watch, EtcdError> {
        let (requests, stream) = self
            .call(Kind::Read, self.read_timeout, |m| {
                let create = create.clone();
                async move {
                    let (tx, rx) = mpsc::channel(1);
                    let first = WatchRequest {
                        request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
                    };
                    // The channel has room for the one request: this cannot fail while `rx`
                    // is alive.
                    let _ = tx.try_send(first);
                    let resp = m
                        .watch
                        .clone()
                        .watch(leader_required(
                            tokio_stream::wrappers::ReceiverStream::new(rx),
                        ))
                        .await?;
                    Ok(tonic::Response::new((tx, resp.into_inner())))
                }
            })
            .await?;
        Ok(Watch {
            _requests: requests,
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
