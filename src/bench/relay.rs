//! The floor of any proxy beside the forge gate's transfers: a TCP relay that copies each byte
//! from one socket to the other through a buffer of its own, with nothing else to do (no HTTP,
//! no parsing, no runtime: two blocking threads per connection, 1 MiB read and written whole).
//! A forwarded byte is copied out of one loopback socket and into another; this is that work
//! and no more, so a body through it costs what forwarding costs on this machine, and the gate
//! divided by it is what the gate adds. Kernel splicing (HAProxy's, `haproxy.rs`) would save
//! the two copies, but reads slower here than copying.
//!
//! The relay listens on 127.0.0.1 only and stops when dropped: it accepts no more, and shuts
//! down the connections it holds, which ends their threads.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What each direction of a connection reads and writes at once: as large as the gate's
/// largest read of a body (`listener::MAX_READ_BYTES`, 256 KiB) and more, so that the floor is not held back
/// by its buffer.
const PIECE: usize = 1 << 20;

/// A running relay to one upstream.
pub struct Relay {
    /// Where it listens: `http://127.0.0.1:PORT`.
    pub base: String,
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    /// Both sockets of every connection it relayed, to shut down when it stops.
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// Starts relaying every connection to 127.0.0.1's free port it picks to `upstream`.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (stop, held) = (stopping.clone(), open.clone());
        std::thread::Builder::new()
            .name("bench-relay".into())
            .spawn(move || accept(listener, upstream, &stop, &held))?;
        Ok(Relay {
            base: format!("http://{addr}"),
            addr,
            stopping,
            open,
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees it is to stop.
        let _ = TcpStream::connect(self.addr);
        for socket in self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    stopping: &AtomicBool,
    open: &Mutex<Vec<TcpStream>>,
) {
    for client in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(forge) = TcpStream::connect(upstream) else {
            continue;
        };
        let _ = (client.set_nodelay(true), forge.set_nodelay(true));
        let (Ok(client_out), Ok(forge_out)) = (client.try_clone(), forge.try_clone()) else {
            continue;
        };
        if let (Ok(a), Ok(b)) = (client.try_clone(), forge.try_clone()) {
            open.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend([a, b]);
        }
        std::thread::spawn(move || copy(client, forge_out));
        std::thread::spawn(move || copy(forge, client_out));
    }
}

/// Copies `from` into `to` until `from` ends, then ends `to`'s sending side (an HTTP/1.1
/// connection's other direction may still be in use).
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut piece = vec![0u8; PIECE];
    loop {
        match from.read(&mut piece) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&piece[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes go both ways unchanged, and a dropped relay lets go of its connections.
    #[test]
    fn relays_both_ways_and_stops() {
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        let up_addr = upstream.local_addr().unwrap();
        let forge = std::thread::spawn(move || {
            // The first connection: what it is sent, reversed.
            let (mut conn, _) = upstream.accept().unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            got.reverse();
            conn.write_all(&got).unwrap();
            drop(conn);
            // The second: held open until the relay lets go of it.
            let (mut conn, _) = upstream.accept().unwrap();
            let mut rest = Vec::new();
            let _ = conn.read_to_end(&mut rest);
        });
        let relay = Relay::start(up_addr).unwrap();
        let mut conn = TcpStream::connect(relay.addr).unwrap();
        let sent: Vec<u8> = (0..3 * PIECE + 17).map(|i| (i % 251) as u8).collect();
        conn.write_all(&sent).unwrap();
        conn.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        conn.read_to_end(&mut back).unwrap();
        let mut expected = sent;
        expected.reverse();
        assert_eq!(back, expected);

        let mut kept = TcpStream::connect(relay.addr).unwrap();
        kept.write_all(b"x").unwrap();
        kept.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        let mut one = [0u8; 1];
        // Both ends open: nothing comes, and the read waits.
        assert!(kept.read(&mut one).is_err());
        drop(relay);
        kept.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        // Shut down by the relay: the read ends at once.
        assert_eq!(kept.read(&mut one).unwrap(), 0);
        forge.join().unwrap();
    }
}
