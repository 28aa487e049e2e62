//! The responder: one UDP socket and one TCP listener on the same address, answering from the
//! directory the caller publishes (a `watch` channel, so a new directory replaces the old at
//! once and a query never waits for one to be built). Names outside `clusterset.local` are
//! refused: this is an authoritative server for that zone, not a resolver.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record as RR, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;

use crate::directory::{Directory, QType, Record};

/// Seconds answers may be cached: endpoints move, so briefly (as CoreDNS's multicluster
/// plugin does).
pub const TTL: u32 = 5;
/// The schema version's record changes with releases only.
const VERSION_TTL: u32 = 28_800;

fn qtype(t: RecordType) -> QType {
    match t {
        RecordType::A => QType::A,
        RecordType::AAAA => QType::Aaaa,
        RecordType::SRV => QType::Srv,
        RecordType::TXT => QType::Txt,
        RecordType::ANY => QType::Any,
        _ => QType::Other,
    }
}

/// The answer to one request message, encoded; `None` for what deserves no answer (garbage,
/// or a response). `udp` limits the answer to the size the client accepts (truncated answers
/// say so, and the client asks again over TCP).
pub fn answer(request: &[u8], dir: &Directory, udp: bool) -> Option<Vec<u8>> {
    let req = match Message::from_vec(request) {
        Ok(m) => m,
        Err(_) => {
            // A header at least: tell the client its message did not parse.
            if request.len() < 12 {
                return None;
            }
            let id = u16::from_be_bytes([request[0], request[1]]);
            let resp = Message::error_msg(id, OpCode::Query, ResponseCode::FormErr);
            return resp.to_vec().ok();
        }
    };
    if req.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
    resp.metadata = Metadata::response_from_request(&req.metadata);
    resp.metadata.message_type = MessageType::Response;
    if let Some(e) = &req.edns {
        let mut o = Edns::new();
        o.set_max_payload(e.max_payload().max(512));
        resp.set_edns(o);
    }
    if req.metadata.op_code != OpCode::Query || req.queries.len() != 1 {
        resp.metadata.response_code = ResponseCode::NotImp;
        return encode(&resp, udp, &req);
    }
    let q = &req.queries[0];
    resp.add_query(q.clone());
    let name = q.name().to_ascii();
    match dir.lookup(&name, qtype(q.query_type())) {
        None => resp.metadata.response_code = ResponseCode::Refused,
        Some(l) => {
            resp.metadata.authoritative = true;
            if !l.exists {
                resp.metadata.response_code = ResponseCode::NXDomain;
            }
            for r in l.records {
                let (rdata, ttl) = match r {
                    Record::Ip(std::net::IpAddr::V4(ip)) => (RData::A(A(ip)), TTL),
                    Record::Ip(std::net::IpAddr::V6(ip)) => (RData::AAAA(AAAA(ip)), TTL),
                    Record::Srv {
                        priority,
                        weight,
                        port,
                        target,
                    } => {
                        let Ok(target) = Name::from_ascii(format!("{target}.")) else {
                            continue;
                        };
                        (RData::SRV(SRV::new(priority, weight, port, target)), TTL)
                    }
                    Record::Txt(t) => (RData::TXT(TXT::new(vec![t])), VERSION_TTL),
                };
                resp.add_answer(RR::from_rdata(q.name().clone(), ttl, rdata));
            }
        }
    }
    encode(&resp, udp, &req)
}

fn encode(resp: &Message, udp: bool, req: &Message) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(512);
    let mut enc = BinEncoder::new(&mut out);
    if udp {
        enc.set_max_size(req.max_payload().max(512));
    }
    if resp.emit(&mut enc).is_ok() {
        return Some(out);
    }
    if !udp {
        return None;
    }
    // Too large for what the client takes over UDP: the header and the question, truncated,
    // so that it asks again over TCP.
    let mut t = Message::response(resp.metadata.id, resp.metadata.op_code);
    t.metadata = resp.metadata;
    t.metadata.truncation = true;
    for q in &resp.queries {
        t.add_query(q.clone());
    }
    t.to_vec().ok()
}

/// Serves DNS on `addr` (UDP and TCP; port 0 picks one free for both) until `shutdown`;
/// returns the address bound.
pub async fn serve(
    addr: SocketAddr,
    directory: watch::Receiver<Arc<Directory>>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let (udp, tcp) = bind_both(addr).await?;
    let bound = udp.local_addr()?;
    tracing::info!(%bound, "clusterset DNS serving");
    tokio::spawn(serve_udp(udp, directory.clone(), shutdown.clone()));
    tokio::spawn(serve_tcp(tcp, directory, shutdown));
    Ok(bound)
}

/// Binds UDP and TCP on the same port. For port 0 the port UDP picks may be taken for TCP
/// (an ephemeral port of some TCP connection): then another is tried.
async fn bind_both(addr: SocketAddr) -> std::io::Result<(UdpSocket, TcpListener)> {
    const ATTEMPTS: usize = 64;
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let udp = UdpSocket::bind(addr).await?;
        match TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if addr.port() == 0 && e.kind() == std::io::ErrorKind::AddrInUse => {
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free port for UDP and TCP")))
}

async fn serve_udp(
    socket: UdpSocket,
    directory: watch::Receiver<Arc<Directory>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 4096];
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            got = socket.recv_from(&mut buf) => {
                let Ok((n, peer)) = got else { continue };
                let dir = directory.borrow().clone();
                if let Some(out) = answer(&buf[..n], &dir, true) {
                    // A client gone away is not the server's trouble.
                    let _ = socket.send_to(&out, peer).await;
                }
            }
        }
    }
}

async fn serve_tcp(
    listener: TcpListener,
    directory: watch::Receiver<Arc<Directory>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            got = listener.accept() => {
                let Ok((mut conn, _)) = got else { continue };
                let directory = directory.clone();
                let mut shutdown = shutdown.clone();
                tokio::spawn(async move {
                    // Messages are length-prefixed; a connection may carry several. An idle
                    // one is closed after 10 s.
                    loop {
                        let mut len = [0u8; 2];
                        let read = tokio::select! {
                            _ = shutdown.changed() => return,
                            r = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read_exact(&mut len)) => r,
                        };
                        if !matches!(read, Ok(Ok(_))) {
                            return;
                        }
                        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if conn.read_exact(&mut msg).await.is_err() {
                            return;
                        }
                        let dir = directory.borrow().clone();
                        let Some(out) = answer(&msg, &dir, false) else { return };
                        let Ok(n) = u16::try_from(out.len()) else { return };
                        if conn.write_all(&n.to_be_bytes()).await.is_err()
                            || conn.write_all(&out).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use serde_json::json;

    #[tokio::test]
    async fn port_zero_binds_udp_and_tcp_on_one_port_and_a_taken_port_is_an_error() {
        for _ in 0..20 {
            let (udp, tcp) = bind_both("127.0.0.1:0".parse().unwrap()).await.unwrap();
            assert_eq!(udp.local_addr().unwrap(), tcp.local_addr().unwrap());
        }
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = bind_both(taken.local_addr().unwrap()).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    }

    fn directory() -> Directory {
        Directory::build(
            &[json!({
                "metadata": {"namespace": "shop", "name": "web"},
                "spec": {"type": "ClusterSetIP", "ips": ["10.254.0.7"], "ports": [{"name": "http", "protocol": "TCP", "port": 80}]},
            })],
            &[],
        )
    }

    fn ask(name: &str, t: RecordType, dir: &Directory) -> Message {
        let mut m = Message::query();
        m.metadata.id = 7;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        Message::from_vec(&answer(&m.to_vec().unwrap(), dir, true).unwrap()).unwrap()
    }

    #[test]
    fn answers_carry_the_records_and_the_codes() {
        let d = directory();
        let r = ask("web.shop.svc.clusterset.local.", RecordType::A, &d);
        assert_eq!(r.metadata.id, 7);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative);
        assert_eq!(r.answers.len(), 1);
        assert_eq!(
            r.answers[0].data,
            RData::A(A("10.254.0.7".parse().unwrap()))
        );
        assert_eq!(r.answers[0].ttl, TTL);
        let r = ask(
            "_http._tcp.web.shop.svc.clusterset.local.",
            RecordType::SRV,
            &d,
        );
        assert!(matches!(&r.answers[0].data, RData::SRV(s) if s.port == 80));
        let r = ask("nope.shop.svc.clusterset.local.", RecordType::A, &d);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        let r = ask("example.com.", RecordType::A, &d);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        // Garbage with a header gets FORMERR; less than a header, nothing.
        let mut junk = vec![0u8, 9, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        junk.extend_from_slice(&[0xff; 5]);
        let r = Message::from_vec(&answer(&junk, &d, true).unwrap()).unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(r.metadata.id, 9);
        assert!(answer(&[1, 2, 3], &d, true).is_none());
    }

    #[test]
    fn an_answer_too_large_for_udp_is_truncated_and_whole_over_tcp() {
        let eps: Vec<serde_json::Value> = (0..200)
            .map(|i| json!({"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)], "conditions": {"ready": true}}))
            .collect();
        let d = Directory::build(
            &[json!({"metadata": {"namespace": "shop", "name": "db"},
                     "spec": {"type": "Headless", "ports": [{"name": "pg", "protocol": "TCP", "port": 5432}]}})],
            &[json!({"metadata": {"namespace": "shop", "name": "db-a",
                                  "labels": {"multicluster.kubernetes.io/service-name": "db",
                                             "multicluster.kubernetes.io/source-cluster": "a"}},
                     "addressType": "IPv4", "endpoints": eps, "ports": []})],
        );
        let mut m = Message::query();
        m.metadata.id = 3;
        m.add_query(Query::query(
            Name::from_ascii("db.shop.svc.clusterset.local.").unwrap(),
            RecordType::A,
        ));
        let q = m.to_vec().unwrap();
        let udp = answer(&q, &d, true).unwrap();
        assert!(udp.len() <= 512, "{}", udp.len());
        let r = Message::from_vec(&udp).unwrap();
        assert!(r.metadata.truncation, "truncated over UDP");
        assert_eq!(r.metadata.id, 3);
        let tcp = Message::from_vec(&answer(&q, &d, false).unwrap()).unwrap();
        assert!(!tcp.metadata.truncation);
        assert_eq!(tcp.answers.len(), 200);
    }

    #[tokio::test]
    async fn serves_over_udp_and_tcp() {
        let (_tx, rx) = watch::channel(Arc::new(directory()));
        let (_stop, shutdown) = watch::channel(false);
        let addr = serve("127.0.0.1:0".parse().unwrap(), rx, shutdown)
            .await
            .unwrap();
        let mut m = Message::query();
        m.metadata.id = 11;
        m.add_query(Query::query(
            Name::from_ascii("web.shop.svc.clusterset.local.").unwrap(),
            RecordType::A,
        ));
        let q = m.to_vec().unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.send_to(&q, addr).await.unwrap();
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).await.unwrap();
        assert_eq!(Message::from_vec(&buf[..n]).unwrap().answers.len(), 1);
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            conn.write_all(&(q.len() as u16).to_be_bytes())
                .await
                .unwrap();
            conn.write_all(&q).await.unwrap();
            let mut len = [0u8; 2];
            conn.read_exact(&mut len).await.unwrap();
            let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
            conn.read_exact(&mut msg).await.unwrap();
            assert_eq!(Message::from_vec(&msg).unwrap().metadata.id, 11);
        }
    }
}
