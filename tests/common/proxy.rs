//! A TCP proxy on 127.0.0.1 that a test can cut and restore, to simulate a database outage
//! without stopping the database that other tests share, or silence, to simulate a network
//! that drops packets: the connections made so far stay open and carry nothing. It can also
//! deafen one connection once a given message has gone through it: the server gets the message
//! and answers, the answer never arrives (a connection lost after a commit, before its answer).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
    target: SocketAddr,
    running: Arc<Mutex<Option<CancellationToken>>>,
    /// Cancelled by `silence`: the connections made before then stop forwarding.
    silenced: Arc<std::sync::Mutex<CancellationToken>>,
    deafening: Arc<Deafening>,
    /// Cancelled when the proxy is dropped: every connection through it closes, silent ones
    /// too, so that none outlives its test.
    dropped: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.dropped.cancel();
    }
}

impl Proxy {
    /// Starts forwarding a fresh local port to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            target,
            running: Default::default(),
            silenced: Default::default(),
            deafening: Default::default(),
            dropped: CancellationToken::new(),
        };
        proxy.serve(listener).await;
        proxy
    }

    async fn serve(&self, listener: TcpListener) {
        let stop = self.dropped.child_token();
        *self.running.lock().await = Some(stop.clone());
        let target = self.target;
        let silenced = self.silenced.clone();
        let deafening = self.deafening.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = stop.cancelled() => return,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let stop = stop.clone();
                let silenced = silenced.lock().unwrap().clone();
                let deafening = deafening.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    // As the store's own connections (`tests/pg_sockets.rs` looks at them all).
                    let _ = outbound.set_nodelay(true);
                    tokio::select! {
                        _ = forward(&mut inbound, &mut outbound, &deafening) => {}
                        _ = stop.cancelled() => {}
                        // Both sockets stay open, read by no one, until the proxy stops.
                        _ = silenced.cancelled() => stop.cancelled().await,
                    }
                });
            }
        });
    }

    /// Closes the port and every connection through it.
    pub async fn cut(&self) {
        if let Some(stop) = self.running.lock().await.take() {
            stop.cancel();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    /// Every connection made so far goes silent: open, but nothing more is forwarded either
    /// way and nothing tells either end. Connections made after this forward as usual.
    pub fn silence(&self) {
        let mut silenced = self.silenced.lock().unwrap();
        silenced.cancel();
        *silenced = CancellationToken::new();
    }

    /// The next connection over which a client sends `bytes` (within one read) goes deaf once
    /// they are through: the server gets them, and nothing it sends back on that connection
    /// arrives. Other connections, and those made later, forward as usual.
    pub fn deafen_after(&self, bytes: &[u8]) {
        *self.deafening.armed.lock().unwrap() = Some(bytes.to_vec());
    }

    /// How many connections went deaf (`deafen_after`).
    pub fn deafened(&self) -> usize {
        self.deafening.deafened.load(Ordering::SeqCst)
    }

    /// Listens on the same port again.
    pub async fn restore(&self) {
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        };
        self.serve(listener).await;
    }
}

/// What `Proxy::deafen_after` set, shared by the proxy's connections.
#[derive(Default)]
struct Deafening {
    /// Bytes that, the next time a client sends them, deafen the connection they went over.
    armed: std::sync::Mutex<Option<Vec<u8>>>,
    /// How many connections were deafened.
    deafened: AtomicUsize,
}

/// Both directions of one connection, until both ends have closed theirs; the server's side
/// read and dropped from the moment the client sent the bytes `deafening` holds.
async fn forward(inbound: &mut TcpStream, outbound: &mut TcpStream, deafening: &Deafening) {
    // Borrowed, not owned: a silenced connection's sockets outlive this (`serve`).
    let (mut client_reads, mut client_writes) = inbound.split();
    let (mut server_reads, mut server_writes) = outbound.split();
    let deaf = AtomicBool::new(false);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = client_reads.read(&mut buf).await {
            let sent = &buf[..n];
            {
                let mut armed = deafening.armed.lock().unwrap();
                if armed
                    .as_ref()
                    .is_some_and(|b| sent.windows(b.len()).any(|w| w == b.as_slice()))
                {
                    *armed = None;
                    deaf.store(true, Ordering::SeqCst);
                    deafening.deafened.fetch_add(1, Ordering::SeqCst);
                }
            }
            if server_writes.write_all(sent).await.is_err() {
                break;
            }
        }
        let _ = server_writes.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = server_reads.read(&mut buf).await {
            if !deaf.load(Ordering::SeqCst) && client_writes.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = client_writes.shutdown().await;
    };
    tokio::join!(up, down);
}
