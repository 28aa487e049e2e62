//! The etcd v3 backend of the Orrery store, for HA and scale-out.
//!
//! Every key lives under an installation prefix (default `/orrery`), so several installations
//! can share one etcd. Revisions are etcd's own; compare-and-swap uses transactions on
//! `mod_revision`; one native watch on the installation prefix feeds the shared
//! [`WatchCache`], so any number of watchers cost one etcd watch.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

mod client;
mod recent;
#[allow(unreachable_pub)]
mod rpc;
mod snapshot;

use client::{Client, Connect, EtcdError, created, delete_op, get_op, modified, put_op, revision};
use orrery_api::Object;
use orrery_store::{
    Change, ChangeKind, Fence, History, Kept, ListOptions, ListResult, Preconditions,
    RawListResult, RawObject, Result, Revision, Store, StoreError, StoredChange, WatchCache,
    WatchCacheConfig, WatchOptions, WatchStream, decode_continue, encode_continue, prefix_end,
    with_resource_version,
};
use rpc::etcdserverpb::{
    RangeRequest, RangeResponse, TxnRequest, TxnResponse, WatchCreateRequest,
    compare::CompareResult, response_op,
};
use rpc::mvccpb::event::EventType;
pub use snapshot::{Snapshot, snapshot};

/// How to reach etcd.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// `http://host:port` URLs of the etcd members.
    pub endpoints: Vec<String>,
    /// The installation's key prefix, without a trailing slash.
    pub prefix: String,
    pub watch: WatchCacheConfig,
    pub connect_timeout: Duration,
    /// The longest any call may take before an answer starts (watches then live on).
    pub request_timeout: Duration,
    /// How long a read waits for etcd's answer; a member without a leader refuses at once
    /// and the read is served by one member, stale.
    pub read_timeout: Duration,
    /// How long a write waits: past it, it fails as unavailable (503 through the API) rather
    /// than hang while etcd has no quorum.
    pub write_timeout: Duration,
}

impl EtcdConfig {
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdConfig {
            endpoints,
            prefix: "/orrery".to_string(),
            watch: WatchCacheConfig::default(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(4),
        }
    }

    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().trim_end_matches('/').to_string();
        self
    }
}

/// The etcd store.
#[derive(Clone, Debug)]
pub struct EtcdStore {
    inner: Arc<Inner>,
    /// Set on a fenced view: every write also compares the leader lease's revision.
    fence: Option<Fence>,
}

struct Inner {
    client: Client,
    prefix: String,
    cache: WatchCache,
    compacted: AtomicI64,
    closed: std::sync::atomic::AtomicBool,
    /// Set while etcd has no quorum (reads served stale, writes refused): why.
    degraded: parking_lot::Mutex<Option<String>>,
    /// Whether `degraded` is set: every call looks, few change it.
    is_degraded: std::sync::atomic::AtomicBool,
    /// The highest revision this store's own writes were told of.
    written: AtomicI64,
    /// Objects this store wrote lately, as the feed changed them since.
    recent: recent::Recent,
    feed: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Written to mark a point in the revision stream; never listed or watched.
const FENCE_KEY: &str = "/.orrery-fence";

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Page size when a filtered list must read more than it returns.
const SCAN_PAGE: i64 = 500;
/// Page size for unfiltered lists: a response of 10,000 Clusters (tens of MiB) held a loaded
/// etcd long enough for the connection to be taken for dead.
const DEFAULT_PAGE: i64 = 1_000;

fn backend(e: EtcdError) -> StoreError {
    if matches!(e, EtcdError::Closed) {
        StoreError::Closed
    } else if e.is_unavailable() {
        StoreError::Unavailable(format!("etcd: {e}"))
    } else if e.is_busy() {
        StoreError::Busy(format!("etcd: {e}"))
    } else {
        StoreError::Backend(format!("etcd: {e}"))
    }
}

/// The object a range read of `key` found.
fn first(key: &str, resp: &RangeResponse) -> Result<Object> {
    match resp.kvs.first() {
        Some(kv) => decode(key, kv.mod_revision, &kv.value),
        None => Err(StoreError::NotFound {
            key: key.to_string(),
        }),
    }
}

/// Maps etcd's revision errors to the store's.
fn revision_error(e: EtcdError, requested: Revision, compacted: Revision) -> StoreError {
    if e.is_compacted() {
        StoreError::Expired {
            requested,
            compacted: compacted.max(requested + 1),
        }
    } else if e.is_future() {
        StoreError::FutureRevision {
            requested,
            current: requested - 1,
        }
    } else {
        backend(e)
    }
}

fn decode(key: &str, rev: Revision, value: &[u8]) -> Result<Object> {
    let mut obj: Object = serde_json::from_slice(value).map_err(|e| {
        StoreError::Corrupt(format!(
            "stored object {key} at revision {rev} does not parse: {e}"
        ))
    })?;
    obj.metadata.resource_version = rev.to_string();
    Ok(obj)
}

fn encode(obj: &mut Object) -> Result<Vec<u8>> {
    obj.metadata.resource_version.clear();
    serde_json::to_vec(obj)
        .map_err(|e| StoreError::InvalidArgument(format!("object does not serialize: {e}")))
}

fn stored_uid(value: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(value)
        .ok()?
        .pointer("/metadata/uid")?
        .as_str()
        .map(str::to_string)
}

impl EtcdStore {
    /// Connects, reads the current revision and starts the watch feed.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        let options = Connect {
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            read_timeout: config.read_timeout,
            write_timeout: config.write_timeout,
            // A busy member answers pings late; a connection given up on fails what it carries.
            keep_alive: (Duration::from_secs(10), Duration::from_secs(20)),
        };
        let connecting = |e: &dyn std::fmt::Display| {
            StoreError::Backend(format!(
                "connecting to etcd at {}: {e}",
                config.endpoints.join(",")
            ))
        };
        let client = Client::new(&config.endpoints, &options).map_err(|e| connecting(&e))?;
        let store = EtcdStore {
            fence: None,
            inner: Arc::new(Inner {
                client,
                prefix: config.prefix.trim_end_matches('/').to_string(),
                cache: WatchCache::new(config.watch, 0),
                compacted: AtomicI64::new(0),
                closed: std::sync::atomic::AtomicBool::new(false),
                degraded: parking_lot::Mutex::new(None),
                is_degraded: std::sync::atomic::AtomicBool::new(false),
                written: AtomicI64::new(0),
                recent: recent::Recent::default(),
                feed: parking_lot::Mutex::new(None),
            }),
        };
        let rev = store.current_revision().await.map_err(|e| connecting(&e))?;
        let compacted = store.find_compacted(rev).await?;
        store.inner.compacted.store(compacted, Ordering::Release);
        store.inner.cache.set_compacted(compacted);
        store.inner.cache.reset(rev);
        let feed = tokio::spawn(feed(store.clone(), rev));
        *store.inner.feed.lock() = Some(feed);
        tracing::info!(endpoints = %config.endpoints.join(","), prefix = %store.inner.prefix, revision = rev, "connected to etcd");
        Ok(store)
    }

    /// The revision etcd's history starts at: the oldest revision still readable (etcd keeps
    /// the revision it was compacted to), found by bisection, since etcd reports it only when a
    /// read falls before it. 0 when nothing was ever compacted.
    async fn find_compacted(&self, current: Revision) -> Result<Revision> {
        let key = self.full(FENCE_KEY);
        let readable = |rev: Revision| {
            let key = key.clone();
            async move {
                let req = RangeRequest {
                    key: key.into_bytes(),
                    revision: rev,
                    count_only: true,
                    ..Default::default()
                };
                match self.read(req).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.is_compacted() => Ok(false),
                    Err(e) => Err(backend(e)),
                }
            }
        };
        if current <= 1 || readable(1).await? {
            return Ok(0);
        }
        // Revision `lo` is gone and `hi` (the current one) is readable.
        let (mut lo, mut hi) = (1, current);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if readable(mid).await? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Ok(hi)
    }

    /// One page of matching stored values: (key, revision, stored JSON), the list revision,
    /// and the continue token.
    async fn scan(
        &self,
        prefix: &str,
        opts: &ListOptions,
    ) -> Result<(Vec<(String, Revision, Vec<u8>)>, Revision, Option<String>)> {
        let (start, mut revision) = match &opts.continue_token {
            Some(token) => decode_continue(prefix, token)?,
            None => (prefix.to_string(), opts.revision.unwrap_or(0)),
        };
        let compacted = self.inner.compacted.load(Ordering::Acquire);
        if revision > 0 && revision < compacted {
            return Err(StoreError::Expired {
                requested: revision,
                compacted,
            });
        }
        let end = self.full(&prefix_end(prefix).unwrap_or_else(|| "\u{10FFFF}".to_string()));
        let limit = opts.page_limit();
        let filtered = !(opts.labels.is_everything() && opts.fields.is_everything());
        let page = match limit {
            Some(l) if !filtered => (l as i64 + 1).min(DEFAULT_PAGE),
            Some(_) => SCAN_PAGE,
            None => DEFAULT_PAGE,
        };
        let mut items = Vec::new();
        let mut from = self.full(&start);
        let mut last_key: Option<String> = None;
        let mut more = false;
        'pages: loop {
            let req = RangeRequest {
                key: from.clone().into_bytes(),
                range_end: end.clone().into_bytes(),
                limit: page,
                revision,
                ..Default::default()
            };
            let requested = revision;
            let resp = self
                .read(req)
                .await
                .map_err(|e| revision_error(e, requested, compacted))?;
            if revision == 0 {
                revision = client::revision(resp.header.as_ref());
            }
            let kvs = &resp.kvs;
            for kv in kvs {
                let Some(key) = self.strip(&kv.key) else {
                    continue;
                };
                if limit.is_some_and(|l| items.len() >= l) {
                    more = true;
                    break 'pages;
                }
                // Without selectors nothing needs parsing here.
                if !filtered || opts.matches(&decode(key, kv.mod_revision, &kv.value)?) {
                    items.push((key.to_string(), kv.mod_revision, kv.value.clone()));
                    last_key = Some(key.to_string());
                }
            }
            match kvs.last() {
                Some(kv) if resp.more => {
                    let mut next = kv.key.clone();
                    next.push(0);
                    from = String::from_utf8(next)
                        .map_err(|_| StoreError::Corrupt("non-UTF-8 key in etcd".into()))?;
                }
                _ => break,
            }
        }
        let continue_token = match (more, &last_key) {
            (true, Some(k)) => Some(encode_continue(prefix, k, revision)),
            _ => None,
        };
        Ok((items, revision, continue_token))
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    /// The store key of an etcd key of this installation (`None` for others and the fence).
    fn strip<'a>(&self, full: &'a [u8]) -> Option<&'a str> {
        std::str::from_utf8(full)
            .ok()?
            .strip_prefix(&self.inner.prefix)
            .filter(|k| *k != FENCE_KEY)
    }

    /// Runs a write transaction, on a fenced view with the fence's compare added. A fence that
    /// moved only because its holder renewed the lease is followed; one that another holder or
    /// term took is [`StoreError::Fenced`]. A failed response is the write's own (the fence
    /// held); the fence's read is taken off it.
    async fn fenced_txn(&self, mut txn: TxnRequest) -> Result<TxnResponse> {
        let Some(fence) = &self.fence else {
            return self.write(txn).await;
        };
        let lease = self.full(&fence.key);
        let own = txn.compare.len();
        txn.failure.push(get_op(&lease));
        loop {
            let expected = fence.revision.load(Ordering::Acquire);
            txn.compare.truncate(own);
            txn.compare
                .push(modified(&lease, CompareResult::Equal, expected));
            let mut resp = self.write(txn.clone()).await?;
            if resp.succeeded {
                return Ok(resp);
            }
            let lease_kv = match resp.responses.pop().and_then(|r| r.response) {
                Some(response_op::Response::ResponseRange(r)) => r.kvs.into_iter().next(),
                _ => None,
            };
            let fenced = || StoreError::Fenced {
                key: fence.key.clone(),
                holder: fence.holder.clone(),
            };
            let Some(kv) = lease_kv else {
                return Err(fenced());
            };
            if kv.mod_revision == expected {
                return Ok(resp);
            }
            let holds = decode(&fence.key, kv.mod_revision, &kv.value)
                .map(|o| fence.holds(&o))
                .unwrap_or(false);
            if !holds {
                return Err(fenced());
            }
            fence.revision.fetch_max(kv.mod_revision, Ordering::AcqRel);
        }
    }

    /// A read: linearizable while etcd has a leader; when the member has none (no quorum) or
    /// no member answers in time, served by one member without consensus (possibly stale),
    /// and the store says so ([`Store::degraded`]) until a linearizable call succeeds again.
    async fn read(&self, mut req: RangeRequest) -> std::result::Result<RangeResponse, EtcdError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(EtcdError::Closed);
        }
        let client = &self.inner.client;
        match client.range(req.clone()).await {
            Ok(r) => {
                self.set_degraded(None);
                Ok(r)
            }
            Err(e) if e.is_unavailable() => {
                req.serializable = true;
                let r = client.range(req).await?;
                self.set_degraded(Some(format!(
                    "etcd has no quorum ({e}): reads are served by one member and may be stale; writes fail"
                )));
                Ok(r)
            }
            Err(e) => Err(e),
        }
    }

    /// The connected member's own copy of `key`: a serializable read.
    async fn member_copy(&self, key: &str) -> Result<RangeResponse> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(backend(EtcdError::Closed));
        }
        let req = RangeRequest {
            key: self.full(key).into_bytes(),
            serializable: true,
            ..Default::default()
        };
        self.inner.client.range(req).await.map_err(backend)
    }

    /// The object at `key` as this store keeps it (`recent.rs`), decoded as a read of etcd
    /// would be.
    fn kept(&self, key: &str) -> Option<Result<Arc<Object>>> {
        let (rev, value) = self.inner.recent.get(key)?;
        Some(decode(key, rev, &value).map(Arc::new))
    }

    /// A write transaction; a refused or unanswered one marks the store degraded.
    async fn write(&self, txn: TxnRequest) -> Result<TxnResponse> {
        match self.client()?.txn(txn).await {
            Ok(r) => {
                self.set_degraded(None);
                self.inner
                    .written
                    .fetch_max(revision(r.header.as_ref()), Ordering::AcqRel);
                Ok(r)
            }
            Err(e) => {
                if e.is_unavailable() {
                    self.set_degraded(Some(format!(
                        "etcd has no quorum ({e}): writes fail; reads may be stale"
                    )));
                }
                Err(backend(e))
            }
        }
    }

    fn set_degraded(&self, why: Option<String>) {
        if why.is_none() && !self.inner.is_degraded.load(Ordering::Acquire) {
            return;
        }
        let mut d = self.inner.degraded.lock();
        match (&*d, &why) {
            (None, Some(w)) => tracing::warn!(reason = %w, "the store is degraded"),
            (Some(_), None) => tracing::info!("etcd has quorum again"),
            _ => {}
        }
        self.inner
            .is_degraded
            .store(why.is_some(), Ordering::Release);
        *d = why;
    }

    /// A client handle, or `Closed` once the store has been closed.
    fn client(&self) -> Result<Client> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        Ok(self.inner.client.clone())
    }

    /// Turns one etcd watch event into a store change, parsed (an unreadable one is skipped).
    fn change_of(&self, ev: &rpc::mvccpb::Event) -> Option<Arc<Change>> {
        match self.kept_of(ev)?.change() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "skipping an unreadable watch event");
                None
            }
        }
    }

    /// One etcd watch event as stored, parsed only when it is needed ([`Kept::change`]): the
    /// feed parses every change at once, a history replay as its watcher reaches it.
    fn kept_of(&self, ev: &rpc::mvccpb::Event) -> Option<Kept> {
        let kv = ev.kv.as_ref()?;
        let key = self.strip(&kv.key)?.to_string();
        let revision = kv.mod_revision;
        let (kind, raw, prev_raw) = match (ev.r#type(), &ev.prev_kv) {
            (EventType::Put, prev) => {
                let kind = if kv.version == 1 {
                    ChangeKind::Create
                } else {
                    ChangeKind::Update
                };
                (kind, &kv.value, prev.as_ref().map(|p| p.value.clone()))
            }
            // The object's last state, at the deletion's revision.
            (EventType::Delete, Some(p)) => (ChangeKind::Delete, &p.value, None),
            (EventType::Delete, None) => {
                let mut o = Object::default();
                o.metadata.resource_version = revision.to_string();
                return Some(Kept::Parsed(Arc::new(Change::with_prev(
                    key,
                    revision,
                    ChangeKind::Delete,
                    Arc::new(o),
                    None,
                ))));
            }
        };
        Some(Kept::Stored(Arc::new(StoredChange {
            key,
            revision,
            kind,
            raw: Arc::from(raw.as_slice()),
            prev_raw,
        })))
    }
}

/// Follows the installation prefix and publishes every change to the cache. A broken stream
/// is resumed from the last revision seen; if that revision is gone, the cache is reset and its
/// watchers expire (they re-list).
async fn feed(store: EtcdStore, mut last: Revision) {
    let prefix = format!("{}/", store.inner.prefix);
    let mut backoff = Duration::from_millis(100);
    loop {
        let create = WatchCreateRequest {
            key: prefix.clone().into_bytes(),
            range_end: prefix_end_bytes(&prefix),
            start_revision: last + 1,
            prev_kv: true,
            progress_notify: true,
            ..Default::default()
        };
        let mut stream = match store.inner.client.watch(create).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "etcd watch failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    backoff = Duration::from_millis(100);
                    if resp.canceled {
                        if resp.compact_revision > 0 {
                            let now = store
                                .current_revision()
                                .await
                                .unwrap_or(resp.compact_revision);
                            tracing::warn!(
                                last,
                                compacted = resp.compact_revision,
                                "etcd history lost; watchers must re-list"
                            );
                            store.inner.cache.reset(now);
                            store.inner.recent.clear(now);
                            last = now;
                        }
                        break;
                    }
                    for ev in &resp.events {
                        if let Some(change) = store.change_of(ev) {
                            last = change.revision;
                            let value = ev.kv.as_ref().map(|kv| kv.value.as_slice());
                            let gone = change.kind == ChangeKind::Delete;
                            store
                                .inner
                                .recent
                                .changed(&change.key, last, value.filter(|_| !gone));
                            store.inner.cache.publish(change);
                        } else if let Some(kv) = &ev.kv {
                            last = kv.mod_revision;
                            if let Some(key) = store.strip(&kv.key) {
                                store.inner.recent.changed(key, last, None);
                            }
                            store.inner.cache.advance(last);
                        }
                    }
                    if resp.events.is_empty()
                        && let Some(h) = &resp.header
                        && !resp.created
                    {
                        // A progress notification: nothing of ours changed up to here.
                        store.inner.cache.advance(h.revision);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "etcd watch stream broke; resuming");
                    // The member may have lost its leader: resume on another.
                    store.inner.client.next_member();
                    break;
                }
            }
        }
        tokio::time::sleep(backoff).await;
    }
}

#[async_trait::async_trait]
impl History for EtcdStore {
    /// Replays history with a temporary watch over the whole installation prefix. To know when
    /// everything up to `until` has arrived, it writes a fence key and reads until the fence's
    /// own event: events arrive in revision order, so all earlier ones came before it.
    async fn changes(&self, prefix: &str, after: Revision, until: Revision) -> Result<Vec<Kept>> {
        let mut out = Vec::new();
        if until <= after {
            return Ok(out);
        }
        let watched = format!("{}/", self.inner.prefix);
        let create = WatchCreateRequest {
            range_end: prefix_end_bytes(&watched),
            key: watched.into_bytes(),
            start_revision: after + 1,
            prev_kv: true,
            ..Default::default()
        };
        let mut stream = self.client()?.watch(create).await.map_err(backend)?;
        let fence = match self
            .client()?
            .put(self.full(FENCE_KEY), Vec::new())
            .await
            .map_err(backend)?
            .header
        {
            Some(h) => h.revision,
            None => Revision::MAX,
        };
        let collect = async {
            while let Some(resp) = stream.message().await.map_err(backend)? {
                if resp.canceled {
                    let compacted = resp.compact_revision;
                    return Err(if compacted > 0 {
                        StoreError::Expired {
                            requested: after,
                            compacted,
                        }
                    } else {
                        StoreError::Backend(format!(
                            "etcd cancelled a history watch: {}",
                            resp.cancel_reason
                        ))
                    });
                }
                for ev in &resp.events {
                    let Some(kv) = &ev.kv else { continue };
                    if kv.mod_revision >= fence {
                        return Ok(());
                    }
                    if kv.mod_revision > until
                        || !self.strip(&kv.key).is_some_and(|k| k.starts_with(prefix))
                    {
                        continue;
                    }
                    if let Some(kept) = self.kept_of(ev) {
                        out.push(kept);
                    }
                }
            }
            Err(StoreError::Backend(
                "etcd: history watch ended early".into(),
            ))
        };
        tokio::time::timeout(Duration::from_secs(30), collect)
            .await
            .map_err(|_| StoreError::Backend("etcd: timed out replaying history".into()))??;
        Ok(out)
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Object> {
        let req = RangeRequest {
            key: self.full(key).into_bytes(),
            ..Default::default()
        };
        let resp = self.read(req).await.map_err(backend)?;
        first(key, &resp)
    }

    /// The object as this store last wrote it (and its feed changed it since), when it keeps
    /// it (`recent.rs`); else the connected member's own copy: a serializable read, without
    /// the round of consensus a linearizable one waits for (etcd confirms the leader and waits
    /// for its apply). A member behind what this store knows to be committed (its own writes,
    /// its watch) is read again linearizably: under load a lagging copy of a busy key would
    /// cost a failed write (a round of consensus too) before the read that a linearizable one
    /// gives at once.
    async fn get_recent(&self, key: &str) -> Result<Arc<Object>> {
        if let Some(kept) = self.kept(key) {
            return kept;
        }
        let resp = self.member_copy(key).await?;
        let known = self
            .inner
            .written
            .load(Ordering::Acquire)
            .max(self.inner.cache.revision());
        if revision(resp.header.as_ref()) < known {
            return self.get(key).await.map(Arc::new);
        }
        first(key, &resp).map(Arc::new)
    }

    async fn get_copy(&self, key: &str) -> Result<Arc<Object>> {
        if let Some(kept) = self.kept(key) {
            return kept;
        }
        let resp = self.member_copy(key).await?;
        first(key, &resp).map(Arc::new)
    }

    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult> {
        let (rows, revision, continue_token) = self.scan(prefix, opts).await?;
        let items = rows
            .iter()
            .map(|(k, rev, v)| decode(k, *rev, v))
            .collect::<Result<_>>()?;
        Ok(ListResult {
            items,
            revision,
            continue_token,
        })
    }

    async fn list_raw(&self, prefix: &str, opts: &ListOptions) -> Result<RawListResult> {
        let (rows, revision, continue_token) = self.scan(prefix, opts).await?;
        let items = rows
            .into_iter()
            .map(|(_, rev, v)| RawObject {
                revision: rev,
                json: with_resource_version(&v, rev),
            })
            .collect();
        Ok(RawListResult {
            items,
            revision,
            continue_token,
        })
    }

    async fn create(&self, key: &str, mut obj: Object) -> Result<Arc<Object>> {
        let value = encode(&mut obj)?;
        let kept = Arc::<[u8]>::from(value.as_slice());
        let _writing = self.inner.recent.writing(key);
        let full = self.full(key);
        let resp = self
            .fenced_txn(TxnRequest {
                compare: vec![created(&full, CompareResult::Equal, 0)],
                success: vec![put_op(&full, value)],
                failure: Vec::new(),
            })
            .await?;
        if !resp.succeeded {
            return Err(StoreError::AlreadyExists {
                key: key.to_string(),
            });
        }
        let rev = revision(resp.header.as_ref());
        self.inner.recent.wrote(key, rev, kept);
        obj.metadata.resource_version = rev.to_string();
        Ok(Arc::new(obj))
    }

    async fn update(
        &self,
        key: &str,
        mut obj: Object,
        expected: Option<Revision>,
    ) -> Result<Arc<Object>> {
        let value = encode(&mut obj)?;
        let kept = Arc::<[u8]>::from(value.as_slice());
        let _writing = self.inner.recent.writing(key);
        let full = self.full(key);
        // The key must exist in both cases: etcd compares a missing key's mod_revision as 0,
        // so an update expecting revision 0 would otherwise create the object.
        let mut when = vec![created(&full, CompareResult::Greater, 0)];
        if let Some(rev) = expected {
            when.push(modified(&full, CompareResult::Equal, rev));
        }
        let txn = TxnRequest {
            compare: when,
            success: vec![put_op(&full, value)],
            failure: vec![get_op(&full)],
        };
        let resp = self.fenced_txn(txn).await?;
        if !resp.succeeded {
            let current = resp.responses.iter().find_map(|r| match &r.response {
                Some(response_op::Response::ResponseRange(g)) => {
                    g.kvs.first().map(|kv| kv.mod_revision)
                }
                _ => None,
            });
            return Err(match current {
                None => StoreError::NotFound {
                    key: key.to_string(),
                },
                Some(current) => StoreError::Conflict {
                    key: key.to_string(),
                    expected: expected.unwrap_or(0),
                    current,
                },
            });
        }
        let rev = revision(resp.header.as_ref());
        self.inner.recent.wrote(key, rev, kept);
        obj.metadata.resource_version = rev.to_string();
        Ok(Arc::new(obj))
    }

    async fn delete(&self, key: &str, pre: &Preconditions) -> Result<Arc<Object>> {
        let full = self.full(key);
        loop {
            let req = RangeRequest {
                key: full.clone().into_bytes(),
                ..Default::default()
            };
            let resp = self.read(req).await.map_err(backend)?;
            let Some(kv) = resp.kvs.first() else {
                return Err(StoreError::NotFound {
                    key: key.to_string(),
                });
            };
            let current = kv.mod_revision;
            if let Some(expected) = pre.revision
                && expected != current
            {
                return Err(StoreError::Conflict {
                    key: key.to_string(),
                    expected,
                    current,
                });
            }
            if let Some(uid) = &pre.uid {
                let stored = stored_uid(&kv.value);
                if stored.as_deref() != Some(uid.as_str()) {
                    return Err(StoreError::PreconditionFailed {
                        key: key.to_string(),
                        message: format!(
                            "UID in precondition: {uid}, UID in object meta: {}",
                            stored.unwrap_or_default()
                        ),
                    });
                }
            }
            let txn = TxnRequest {
                compare: vec![modified(&full, CompareResult::Equal, current)],
                success: vec![delete_op(&full)],
                failure: Vec::new(),
            };
            let resp = self.fenced_txn(txn).await?;
            if !resp.succeeded {
                // Changed between our read and the delete: check the preconditions again.
                continue;
            }
            let rev = revision(resp.header.as_ref());
            let prev = resp.responses.into_iter().find_map(|r| match r.response {
                Some(response_op::Response::ResponseDeleteRange(d)) => {
                    d.prev_kvs.into_iter().next().map(|kv| kv.value)
                }
                _ => None,
            });
            self.inner.recent.forget(key);
            let value = prev.unwrap_or_else(|| kv.value.clone());
            return Ok(Arc::new(decode(key, rev, &value)?));
        }
    }

    async fn watch(&self, prefix: &str, from: Revision, opts: WatchOptions) -> Result<WatchStream> {
        self.inner.cache.watch(prefix, from, opts, self).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        let req = RangeRequest {
            key: format!("{}/", self.inner.prefix).into_bytes(),
            count_only: true,
            ..Default::default()
        };
        let resp = self.read(req).await.map_err(backend)?;
        resp.header
            .map(|h| h.revision)
            .ok_or_else(|| StoreError::Backend("etcd: response without a header".into()))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let current = self.current_revision().await?;
        if revision > current {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current,
            });
        }
        if revision <= self.inner.compacted.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.client()?.compact(revision).await {
            Ok(()) => {}
            // Another installation sharing this etcd compacted further already.
            Err(e) if e.is_compacted() => {}
            Err(e) => return Err(backend(e)),
        }
        self.inner.compacted.fetch_max(revision, Ordering::AcqRel);
        self.inner.cache.set_compacted(revision);
        Ok(())
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.inner.compacted.load(Ordering::Acquire))
    }

    fn watch_stats(&self) -> Option<orrery_store::WatchStats> {
        Some(self.inner.cache.stats())
    }

    fn degraded(&self) -> Option<String> {
        if !self.inner.is_degraded.load(Ordering::Acquire) {
            return None;
        }
        self.inner.degraded.lock().clone()
    }

    fn fenced(&self, fence: Fence) -> Option<Arc<dyn Store>> {
        Some(Arc::new(EtcdStore {
            inner: self.inner.clone(),
            fence: Some(fence),
        }))
    }

    async fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        if let Some(feed) = self.inner.feed.lock().take() {
            feed.abort();
        }
        self.inner.cache.close();
    }
}

/// The end of the key range that holds every key starting with `prefix` (etcd's `\0`, the end
/// of the keyspace, when there is none).
fn prefix_end_bytes(prefix: &str) -> Vec<u8> {
    prefix_end(prefix).map_or(vec![0], String::into_bytes)
}
