//! What the cluster proxy (`proxy`) serves from: the tunnels agents opened to this replica,
//! by cluster, and how this replica reaches the others. State only, held by `App`; what is
//! done with it (and needs `App`) is in `proxy`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;

/// An HTTP/2 connection requests are sent on (an agent's tunnel, or one to another replica).
pub(crate) type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;
pub(crate) type H2 = Sender;

/// The tunnels open to this server, by cluster.
#[derive(Debug, Default)]
pub struct Tunnels {
    pub(crate) open: parking_lot::Mutex<HashMap<String, (u64, Sender)>>,
    pub(crate) next: AtomicU64,
    /// How this replica forwards to the one holding a tunnel.
    pub(crate) peers: Peers,
}

/// How a replica reaches the others: its TLS client configuration (made when first needed,
/// renewed at half the certificate's life or when the CA changes) and an HTTP/2 connection
/// per replica for plain requests (an upgrade gets an HTTP/1.1 connection of its own).
#[derive(Debug, Default)]
pub struct Peers {
    pub(crate) tls: parking_lot::Mutex<Option<(Instant, u64, Arc<rustls::ClientConfig>)>>,
    pub(crate) h2: parking_lot::Mutex<HashMap<String, H2>>,
}
