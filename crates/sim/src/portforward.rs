//! `kubectl port-forward` into a simulated pod, answered as a kubelet answers it: the client
//! opens a pair of SPDY streams per local connection (`streamType` `error` and `data`, one
//! `requestID`, the pod's `port`); the data stream carries the connection's bytes, the error
//! stream a message if the port could not be reached. kubectl 1.31 and newer carry the SPDY
//! connection inside a WebSocket (`SPDY/3.1+portforward.k8s.io`), which is what reaches a
//! simulated member through the cluster proxy.
//!
//! What listens in a simulated pod: each port its containers declare (`containerPort`, TCP).
//! A connection that starts with an HTTP request is answered with one plain-text response
//! naming the pod, its cluster and the port, then closed; anything else is echoed back until
//! the client closes its side. Other ports refuse the connection, as kubelet reports it.

use std::collections::HashMap;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use super::spdy::{Decoder, Encoder, Frame, GOAWAY_PROTOCOL_ERROR, Headers, REFUSED_STREAM};

/// The pod a port-forward reaches.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub pod: String,
    pub cluster: String,
    /// The TCP ports its containers declare.
    pub ports: Vec<u16>,
}

/// The two streams of one forwarded connection, as they arrive.
#[derive(Default)]
struct Pair {
    error: Option<u32>,
    data: Option<(u32, mpsc::Receiver<Vec<u8>>)>,
    port: Option<u16>,
}

/// A data stream's way to its connection's task.
struct Inbound {
    tx: mpsc::Sender<Vec<u8>>,
    /// Its pair is complete and the task reads: the client waits for it (backpressure).
    /// Before that, what arrives is kept up to `STREAM_BUFFER` frames, then the stream reset.
    started: bool,
}

/// Frames of data kept per stream before the pod's side reads them.
const STREAM_BUFFER: usize = 64;
/// Pairs still waiting for their second stream (a client that opens only halves is refused
/// beyond this).
const MAX_WAITING_PAIRS: usize = 256;
/// RST_STREAM's status for a stream whose buffer overflowed.
const FLOW_CONTROL_ERROR: u32 = 7;

/// Serves a port-forward connection until the client closes it.
pub(super) async fn serve<S>(ws: WebSocketStream<S>, target: Target)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = ws.split();
    // One writer: header blocks are one compressed stream, so frames go out in the order made.
    let (out, mut frames) = mpsc::channel::<Frame>(64);
    let writer = tokio::spawn(async move {
        let mut encoder = Encoder::default();
        while let Some(f) = frames.recv().await {
            let bytes = encoder.encode(&f);
            if sink.send(Message::Binary(bytes.into())).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
    let mut decoder = Decoder::default();
    let mut session = Session {
        target,
        out,
        pairs: HashMap::new(),
        inbound: HashMap::new(),
        last_accepted: 0,
    };
    'connection: while let Some(message) = source.next().await {
        match message {
            Ok(Message::Binary(b)) => decoder.push(&b),
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        }
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(pod = %session.target.pod, error = %e, "port-forward: bad SPDY frame");
                    let _ = session
                        .out
                        .send(Frame::GoAway {
                            last: session.last_accepted,
                            status: GOAWAY_PROTOCOL_ERROR,
                        })
                        .await;
                    break 'connection;
                }
            };
            match frame {
                Frame::SynStream { id, fin, headers } => {
                    session.syn_stream(id, fin, headers).await;
                }
                Frame::Data { id, fin, data } => {
                    session.data(id, fin, data).await;
                }
                Frame::RstStream { id, .. } => {
                    session.inbound.remove(&id);
                }
                // The client's pings (odd ids) are answered; this side sends none.
                Frame::Ping(id) if id % 2 == 1 => {
                    let _ = session.out.send(Frame::Ping(id)).await;
                }
                Frame::GoAway { .. } => break 'connection,
                Frame::Ping(_)
                | Frame::SynReply { .. }
                | Frame::Headers { .. }
                | Frame::Ignored(_) => {}
            }
        }
    }
    // The connections' tasks see their input end, close their streams and drop their senders;
    // the writer then ends. (The rest goes last, as it always did.)
    let Session {
        inbound,
        out,
        pairs: _pairs,
        target: _target,
        last_accepted: _,
    } = session;
    drop(inbound);
    drop(out);
    let _ = writer.await;
}

/// A port-forward connection's state while it reads the client's frames.
struct Session {
    target: Target,
    /// To the one writer.
    out: mpsc::Sender<Frame>,
    /// Stream pairs (error + data) waiting for their other half, by request id.
    pairs: HashMap<String, Pair>,
    /// What the client sends on each data stream, to the connection's task.
    inbound: HashMap<u32, Inbound>,
    /// The last stream accepted (for GOAWAY).
    last_accepted: u32,
}

impl Session {
    /// A new stream: accepted (and its pair's connection started once both halves are in),
    /// or refused.
    async fn syn_stream(&mut self, id: u32, fin: bool, headers: Headers) {
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let kind = header("streamtype").unwrap_or("");
        let port = header("port").and_then(|p| p.parse::<u16>().ok());
        // Clients before requestID paired streams by id: data = error + 2.
        let request = match header("requestid") {
            Some(r) => r.to_string(),
            None if kind == "data" => id.saturating_sub(2).to_string(),
            None => id.to_string(),
        };
        // Nothing is kept of a stream refused.
        let waiting = self.pairs.get(&request);
        let free = match kind {
            "error" => waiting.is_none_or(|p| p.error.is_none()),
            "data" => waiting.is_none_or(|p| p.data.is_none()),
            _ => false,
        };
        let room = waiting.is_some() || self.pairs.len() < MAX_WAITING_PAIRS;
        let Some(port) = port.filter(|_| free && room) else {
            let _ = self
                .out
                .send(Frame::RstStream {
                    id,
                    status: REFUSED_STREAM,
                })
                .await;
            return;
        };
        self.last_accepted = self.last_accepted.max(id);
        let pair = self.pairs.entry(request.clone()).or_default();
        if kind == "error" {
            pair.error = Some(id);
        } else {
            let (tx, rx) = mpsc::channel(STREAM_BUFFER);
            if !fin {
                self.inbound.insert(id, Inbound { tx, started: false });
            }
            pair.data = Some((id, rx));
        }
        pair.port = pair.port.or(Some(port));
        let _ = self
            .out
            .send(Frame::SynReply {
                id,
                fin: false,
                headers: vec![],
            })
            .await;
        let complete = matches!(
            self.pairs.get(&request),
            Some(Pair {
                error: Some(_),
                data: Some(_),
                port: Some(_)
            })
        );
        if complete
            && let Some(Pair {
                error: Some(error),
                data: Some((data, rx)),
                port: Some(port),
            }) = self.pairs.remove(&request)
        {
            if let Some(i) = self.inbound.get_mut(&data) {
                i.started = true;
            }
            tokio::spawn(forward(
                self.target.clone(),
                port,
                error,
                data,
                rx,
                self.out.clone(),
            ));
        }
    }

    /// Data on a stream: to its connection's task; a stream whose pair never completed and
    /// whose buffer overflowed is reset.
    async fn data(&mut self, id: u32, fin: bool, data: Vec<u8>) {
        let delivered = match self.inbound.get(&id) {
            None => false,
            Some(_) if data.is_empty() => true,
            Some(i) if i.started => i.tx.send(data).await.is_ok(),
            Some(i) => match i.tx.try_send(data) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Its pair never completed and it kept sending: reset it, and
                    // forget its half of the pair.
                    self.pairs
                        .retain(|_, p| p.data.as_ref().is_none_or(|(d, _)| *d != id));
                    let _ = self
                        .out
                        .send(Frame::RstStream {
                            id,
                            status: FLOW_CONTROL_ERROR,
                        })
                        .await;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
        };
        if fin || !delivered {
            self.inbound.remove(&id);
        }
    }
}

/// What kubelet writes on the error stream when nothing listens on the port.
fn refused(t: &Target, port: u16) -> String {
    format!(
        "error forwarding port {port} to pod {}: failed to connect to localhost:{port} inside the pod: connection refused (a simulated pod listens on the ports its containers declare: {})",
        t.pod,
        match t.ports.as_slice() {
            [] => "none".to_string(),
            ports => ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        }
    )
}

const HTTP_METHODS: [&str; 7] = [
    "GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ",
];

/// Whether `head`, the first bytes of a connection, is an HTTP request line: `Some(true)` once
/// it starts with a method and the line has ended (or it is long enough to say), `Some(false)`
/// once it cannot be one, `None` while more bytes could tell.
fn request_line(head: &[u8]) -> Option<bool> {
    let method = HTTP_METHODS.iter().any(|m| head.starts_with(m.as_bytes()));
    if method {
        return (head.contains(&b'\n') || head.len() >= 8192).then_some(true);
    }
    let prefix = HTTP_METHODS.iter().any(|m| m.as_bytes().starts_with(head));
    if prefix { None } else { Some(false) }
}

/// The response to an HTTP request that came through a forwarded port.
fn http_answer(t: &Target, port: u16, request: &[u8]) -> Vec<u8> {
    let line = String::from_utf8_lossy(request);
    let line = line.lines().next().unwrap_or("");
    let mut words = line.split(' ');
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or("/"));
    let body = format!("{} in {}, port {port}: {method} {path}\n", t.pod, t.cluster);
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        r.push_str(&body);
    }
    r.into_bytes()
}

/// One forwarded connection: the simulated pod's side of it.
async fn forward(
    target: Target,
    port: u16,
    error: u32,
    data: u32,
    mut input: mpsc::Receiver<Vec<u8>>,
    out: mpsc::Sender<Frame>,
) {
    let close = |id| Frame::Data {
        id,
        fin: true,
        data: vec![],
    };
    if !target.ports.contains(&port) {
        let _ = out
            .send(Frame::Data {
                id: error,
                fin: true,
                data: refused(&target, port).into_bytes(),
            })
            .await;
        let _ = out.send(close(data)).await;
        return;
    }
    // The first bytes are held while they may be an HTTP request line: a client may write it
    // in pieces (`GET `, the path, the rest), each its own frame.
    let mut head: Option<Vec<u8>> = Some(Vec::new());
    loop {
        let Some(mut chunk) = input.recv().await else {
            // The input ended: what was held is answered or echoed.
            if let Some(h) = head.take().filter(|h| !h.is_empty()) {
                let data_out = if request_line(&h) == Some(false) {
                    h
                } else {
                    http_answer(&target, port, &h)
                };
                let _ = out
                    .send(Frame::Data {
                        id: data,
                        fin: false,
                        data: data_out,
                    })
                    .await;
            }
            break;
        };
        if let Some(h) = head.as_mut() {
            h.extend_from_slice(&chunk);
            match request_line(h) {
                // Not (or no longer possibly) HTTP: echoed from here on.
                Some(false) => chunk = head.take().unwrap_or_default(),
                Some(true) => {
                    let _ = out
                        .send(Frame::Data {
                            id: data,
                            fin: false,
                            data: http_answer(&target, port, h),
                        })
                        .await;
                    break;
                }
                None => continue,
            }
        }
        if out
            .send(Frame::Data {
                id: data,
                fin: false,
                data: chunk,
            })
            .await
            .is_err()
        {
            return;
        }
    }
    let _ = out.send(close(data)).await;
    let _ = out.send(close(error)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            pod: "web-0".into(),
            cluster: "a".into(),
            ports: vec![80, 8080],
        }
    }

    #[test]
    fn a_request_line_is_told_only_once_it_can_be() {
        for (head, want) in [
            (&b"GE"[..], None),
            (b"GET ", None),
            (b"GET /a", None),
            (b"GET /a HTTP/1.1\r\n", Some(true)),
            (b"hello", Some(false)),
            (b"G\x00", Some(false)),
            (b"", None),
        ] {
            assert_eq!(
                request_line(head),
                want,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn http_requests_get_one_answer_naming_the_pod() {
        let r = String::from_utf8(http_answer(
            &target(),
            80,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        ))
        .unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        let body = "web-0 in a, port 80: GET /healthz\n";
        assert!(
            r.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{r}"
        );
        assert!(r.ends_with(&format!("\r\n\r\n{body}")), "{r}");
        let head =
            String::from_utf8(http_answer(&target(), 80, b"HEAD / HTTP/1.1\r\n\r\n")).unwrap();
        assert!(head.ends_with("\r\n\r\n"), "{head}");
    }

    #[test]
    fn a_port_not_declared_is_refused_naming_those_that_are() {
        let m = refused(&target(), 81);
        assert!(
            m.contains("localhost:81") && m.contains("connection refused"),
            "{m}"
        );
        assert!(m.ends_with("declare: 80, 8080)"), "{m}");
    }

    /// Runs `serve` over an in-memory WebSocket and plays kubectl's side.
    async fn client() -> (
        WebSocketStream<tokio::io::DuplexStream>,
        tokio::task::JoinHandle<()>,
    ) {
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move {
            let ws = WebSocketStream::from_raw_socket(a, Role::Server, None).await;
            serve(ws, target()).await;
        });
        (
            WebSocketStream::from_raw_socket(b, Role::Client, None).await,
            server,
        )
    }

    async fn send(ws: &mut WebSocketStream<tokio::io::DuplexStream>, e: &mut Encoder, f: Frame) {
        ws.send(Message::Binary(e.encode(&f).into())).await.unwrap();
    }

    async fn recv(ws: &mut WebSocketStream<tokio::io::DuplexStream>, d: &mut Decoder) -> Frame {
        loop {
            if let Some(f) = d.next_frame().unwrap() {
                return f;
            }
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => d.push(&b),
                other => panic!("{other:?}"),
            }
        }
    }

    fn syn(id: u32, kind: &str, port: &str, request: &str) -> Frame {
        Frame::SynStream {
            id,
            fin: false,
            headers: vec![
                ("streamtype".into(), kind.into()),
                ("port".into(), port.into()),
                ("requestid".into(), request.into()),
            ],
        }
    }

    #[tokio::test]
    async fn a_request_line_written_in_pieces_gets_one_answer() {
        let (mut ws, _server) = client().await;
        let (mut e, mut d) = (Encoder::default(), Decoder::default());
        send(&mut ws, &mut e, syn(1, "error", "8080", "0")).await;
        send(&mut ws, &mut e, syn(3, "data", "8080", "0")).await;
        for id in [1, 3] {
            assert!(
                matches!(recv(&mut ws, &mut d).await, Frame::SynReply { id: i, .. } if i == id)
            );
        }
        for piece in [
            &b"GE"[..],
            b"T ",
            b"/split",
            b" HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let data = piece.to_vec();
            send(
                &mut ws,
                &mut e,
                Frame::Data {
                    id: 3,
                    fin: false,
                    data,
                },
            )
            .await;
        }
        match recv(&mut ws, &mut d).await {
            Frame::Data { id: 3, data, .. } => {
                let answer = String::from_utf8(data).unwrap();
                assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
                assert!(answer.ends_with("port 8080: GET /split\n"), "{answer}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_pair_of_streams_echoes_and_closes_as_kubelet_does() {
        let (mut ws, server) = client().await;
        let (mut e, mut d) = (Encoder::default(), Decoder::default());
        send(&mut ws, &mut e, syn(1, "error", "8080", "0")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::SynReply {
                id: 1,
                fin: false,
                headers: vec![]
            }
        );
        send(
            &mut ws,
            &mut e,
            Frame::Data {
                id: 1,
                fin: true,
                data: vec![],
            },
        )
        .await;
        send(&mut ws, &mut e, syn(3, "data", "8080", "0")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::SynReply {
                id: 3,
                fin: false,
                headers: vec![]
            }
        );
        send(&mut ws, &mut e, Frame::Ping(1)).await;
        assert_eq!(recv(&mut ws, &mut d).await, Frame::Ping(1));
        send(
            &mut ws,
            &mut e,
            Frame::Data {
                id: 3,
                fin: false,
                data: b"hello".to_vec(),
            },
        )
        .await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::Data {
                id: 3,
                fin: false,
                data: b"hello".to_vec()
            }
        );
        // The client closes its side: the pod closes the data stream, then the error stream
        // with nothing on it (no error).
        send(
            &mut ws,
            &mut e,
            Frame::Data {
                id: 3,
                fin: true,
                data: vec![],
            },
        )
        .await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::Data {
                id: 3,
                fin: true,
                data: vec![]
            }
        );
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::Data {
                id: 1,
                fin: true,
                data: vec![]
            }
        );

        // A second connection to a port nobody listens on: the message on its error stream.
        send(&mut ws, &mut e, syn(5, "error", "81", "1")).await;
        send(&mut ws, &mut e, syn(7, "data", "81", "1")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::SynReply {
                id: 5,
                fin: false,
                headers: vec![]
            }
        );
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::SynReply {
                id: 7,
                fin: false,
                headers: vec![]
            }
        );
        match recv(&mut ws, &mut d).await {
            Frame::Data {
                id: 5,
                fin: true,
                data,
            } => {
                assert!(String::from_utf8_lossy(&data).contains("connection refused"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::Data {
                id: 7,
                fin: true,
                data: vec![]
            }
        );

        // A stream of a type nobody knows is refused; a second error stream for one request too.
        send(&mut ws, &mut e, syn(9, "resize", "80", "2")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::RstStream {
                id: 9,
                status: REFUSED_STREAM
            }
        );
        send(&mut ws, &mut e, syn(11, "error", "80", "3")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::SynReply {
                id: 11,
                fin: false,
                headers: vec![]
            }
        );
        send(&mut ws, &mut e, syn(13, "error", "80", "3")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::RstStream {
                id: 13,
                status: REFUSED_STREAM
            }
        );

        // A stream refused keeps nothing: the same request's error stream, with a port, is
        // taken after one without.
        send(
            &mut ws,
            &mut e,
            Frame::SynStream {
                id: 15,
                fin: false,
                headers: vec![
                    ("streamtype".into(), "error".into()),
                    ("requestid".into(), "4".into()),
                ],
            },
        )
        .await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::RstStream {
                id: 15,
                status: REFUSED_STREAM
            }
        );
        send(&mut ws, &mut e, syn(17, "error", "80", "4")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::SynReply {
                id: 17,
                fin: false,
                headers: vec![]
            }
        );
        // A data stream whose pair never completes is reset once its buffer is full.
        send(&mut ws, &mut e, syn(19, "data", "80", "5")).await;
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::SynReply {
                id: 19,
                fin: false,
                headers: vec![]
            }
        );
        for _ in 0..=STREAM_BUFFER {
            send(
                &mut ws,
                &mut e,
                Frame::Data {
                    id: 19,
                    fin: false,
                    data: b"x".to_vec(),
                },
            )
            .await;
        }
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::RstStream {
                id: 19,
                status: FLOW_CONTROL_ERROR
            }
        );

        // Bytes that are not SPDY end the connection with a GOAWAY naming the last stream taken.
        ws.send(Message::Binary(
            b"\x80\x02\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01"
                .to_vec()
                .into(),
        ))
        .await
        .unwrap();
        assert_eq!(
            recv(&mut ws, &mut d).await,
            Frame::GoAway {
                last: 19,
                status: GOAWAY_PROTOCOL_ERROR
            }
        );
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }
}
