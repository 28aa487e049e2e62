//! A network partition on loopback: a TCP proxy between a client and a server that can cut
//! the link (bytes stop flowing both ways, connections hang as behind a dead route) and heal
//! it (the connections of the cut are closed, as a long partition's time out; new ones flow).
//! It needs no privileges and no address but 127.0.0.1.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub struct Partition {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped when the link heals: connections from before are closed.
    era: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Partition {
    /// A proxy on a free loopback port to `upstream`.
    pub fn to(upstream: SocketAddr) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let p = Partition {
            addr,
            cut: Arc::new(AtomicBool::new(false)),
            era: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (cut, era, stop) = (p.cut.clone(), p.era.clone(), p.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let born = era.load(Ordering::Acquire);
                        let Ok(server) = TcpStream::connect(upstream) else {
                            continue;
                        };
                        for (from, to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            let (cut, era, stop) = (cut.clone(), era.clone(), stop.clone());
                            std::thread::spawn(move || pump(from, to, born, &cut, &era, &stop));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        p
    }

    /// The proxy's URL for an HTTPS server.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Cuts the link: nothing more passes either way.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
    }

    /// Heals it: connections of before are closed, new ones pass.
    pub fn heal(&self) {
        self.era.fetch_add(1, Ordering::AcqRel);
        self.cut.store(false, Ordering::Release);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.era.fetch_add(1, Ordering::AcqRel);
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    born: u64,
    cut: &AtomicBool,
    era: &AtomicU64,
    stop: &AtomicBool,
) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if era.load(Ordering::Acquire) != born || stop.load(Ordering::Acquire) {
            break;
        }
        if cut.load(Ordering::Acquire) {
            // Nothing is read: what was sent waits in the socket, as on a dead route.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
