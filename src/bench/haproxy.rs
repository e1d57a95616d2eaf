//! A proxy's own best beside the forge gate's transfers: HAProxy in HTTP mode in front of the
//! same stand-in forge, with kernel splicing both ways (`option splice-request`,
//! `option splice-response`: the body moved from one socket to the other through a pipe, never
//! copied into the proxy's memory), the fewest copies a proxy that reads HTTP can make. The
//! forge phase times a body through it beside the same body through the gate and directly, so
//! that what the gate costs is judged against what forwarding itself costs on this machine.
//! Where `haproxy` is not installed the bench says so and goes on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How long HAProxy may take to listen.
const START_PATIENCE: Duration = Duration::from_secs(10);

/// A running HAProxy, stopped (and its configuration and log removed) when dropped.
pub struct Haproxy {
    /// Where it listens: `http://127.0.0.1:PORT`.
    pub base: String,
    child: tokio::process::Child,
    config: PathBuf,
    /// Its stderr: a file, not a pipe nobody reads while it runs, which a chatty HAProxy could
    /// fill and stall on in the middle of a transfer.
    log: PathBuf,
}

impl Haproxy {
    /// Starts HAProxy on a free port of 127.0.0.1, forwarding everything to `upstream` (an
    /// address of 127.0.0.1). `Err` says why there is none.
    pub async fn start(upstream: SocketAddr) -> Result<Haproxy, String> {
        let port = free_port().map_err(|e| format!("no free port for haproxy: {e}"))?;
        let config = std::env::temp_dir().join(format!(
            "leasegate-bench-haproxy-{}.cfg",
            uuid::Uuid::now_v7().simple()
        ));
        let log = config.with_extension("log");
        std::fs::write(&config, config_text(port, upstream))
            .map_err(|e| format!("cannot write haproxy's configuration: {e}"))?;
        let cleanup = || {
            std::fs::remove_file(&config).ok();
            std::fs::remove_file(&log).ok();
        };
        let stderr = match std::fs::File::create(&log) {
            Ok(file) => file,
            Err(e) => {
                cleanup();
                return Err(format!("cannot write haproxy's log: {e}"));
            }
        };
        // `-db`: in the foreground, a child of the bench, killed with it.
        let spawned = tokio::process::Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                cleanup();
                return Err(if e.kind() == std::io::ErrorKind::NotFound {
                    "haproxy is not installed (Debian: haproxy)".into()
                } else {
                    format!("haproxy did not start: {e}")
                });
            }
        };
        let mut proxy = Haproxy {
            base: format!("http://127.0.0.1:{port}"),
            child,
            config,
            log,
        };
        let started = Instant::now();
        let listening = SocketAddr::from(([127, 0, 0, 1], port));
        loop {
            let connect = tokio::net::TcpStream::connect(listening);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(100), connect).await {
                return Ok(proxy);
            }
            if let Ok(Some(status)) = proxy.child.try_wait() {
                let said = std::fs::read_to_string(&proxy.log).unwrap_or_default();
                return Err(format!("haproxy stopped ({status}): {}", said.trim()));
            }
            if started.elapsed() > START_PATIENCE {
                return Err(format!(
                    "haproxy did not listen on {listening} within {START_PATIENCE:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its process id, for its CPU time.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        self.child.start_kill().ok();
        std::fs::remove_file(&self.config).ok();
        std::fs::remove_file(&self.log).ok();
    }
}

/// A port of 127.0.0.1 nothing listens on (the moment it is asked).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `bench/haproxy-splice.cfg` (why each setting, there), with its ports put in; the same file
/// `bench/outside.sh` runs HAProxy with.
fn config_text(port: u16, upstream: SocketAddr) -> String {
    include_str!("../../bench/haproxy-splice.cfg")
        .replace("@PORT@", &port.to_string())
        .replace("@UPSTREAM@", &upstream.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_configuration_listens_on_loopback_and_splices_both_ways() {
        let text = super::config_text(4000, "127.0.0.1:5000".parse().unwrap());
        assert!(text.contains("bind 127.0.0.1:4000\n"));
        assert!(text.contains("server forge 127.0.0.1:5000\n"));
        assert!(text.contains("mode http\n"));
        assert!(
            text.contains("option splice-request\n") && text.contains("option splice-response\n")
        );
        assert!(!text.contains('@'), "every place filled: {text}");
    }
}
