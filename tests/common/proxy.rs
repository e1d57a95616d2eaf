//! A TCP proxy on 127.0.0.1 that a test can cut and restore, to simulate a database outage
//! without stopping the database that other tests share, or silence, to simulate a network
//! that drops packets: the connections made so far stay open and carry nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
    target: SocketAddr,
    running: Arc<Mutex<Option<CancellationToken>>>,
    /// Cancelled by `silence`: the connections made before then stop forwarding.
    silenced: Arc<std::sync::Mutex<CancellationToken>>,
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
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    // As the store's own connections (`tests/pg_sockets.rs` looks at them all).
                    let _ = outbound.set_nodelay(true);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
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
