//! What `serve` checks and takes before it writes anything, in the order a person setting it
//! up meets them: the database URL's scheme, every setting, the place of a SQLite file, and
//! the addresses to listen on. Only then are tokens generated and the database created.
//!
//! A start that fails here leaves no file behind, and its error names the setting at fault
//! (by its variable; `usage::Spelling` renames it to the flag when a flag set it) and what to
//! do about it. A setting that is wrong in itself (the URL's scheme, `validate`) is a
//! `UsageError`: exit status 64, as for a value that does not parse.

use crate::config::ServeArgs;
use crate::store::DatabaseUrl;
use crate::usage::UsageError;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// Every check that needs nothing written: the URL's scheme first, since what the other
/// messages say depends on the engine it names.
pub fn check(args: &ServeArgs) -> anyhow::Result<DatabaseUrl> {
    let url = DatabaseUrl::parse(&args.database_url).map_err(|e| UsageError(e.into()))?;
    args.validate().map_err(UsageError)?;
    if let DatabaseUrl::Sqlite(path) = &url {
        crate::store::location::check(path)?;
    }
    Ok(url)
}

/// The service's listeners, bound before anything is written.
pub struct Listeners {
    pub api: TcpListener,
    /// `/metrics` on an address of its own (`LEASEGATE_METRICS_LISTEN`).
    pub metrics: Option<TcpListener>,
    /// Woodpecker's agents (`LEASEGATE_WOODPECKER_LISTEN`).
    pub woodpecker: Option<TcpListener>,
}

/// Binds `LEASEGATE_LISTEN` and, if set, `LEASEGATE_METRICS_LISTEN` and
/// `LEASEGATE_WOODPECKER_LISTEN`.
pub async fn bind(args: &ServeArgs) -> anyhow::Result<Listeners> {
    let api = listen("LEASEGATE_LISTEN", args.listen).await?;
    let metrics = match args.metrics_listen {
        Some(addr) => Some(listen("LEASEGATE_METRICS_LISTEN", addr).await?),
        None => None,
    };
    let woodpecker = match args.woodpecker_listen {
        Some(addr) => Some(listen("LEASEGATE_WOODPECKER_LISTEN", addr).await?),
        None => None,
    };
    Ok(Listeners {
        api,
        metrics,
        woodpecker,
    })
}

/// How many connections the kernel completes and queues before the service accepts them.
///
/// `TcpListener::bind` asks for 128, as the standard library does. A fleet's runners reconnect
/// together (after a restart, a network blip, the end of a long poll), and a burst of a few
/// thousand connects past a queue of 128 has its SYNs dropped and retried a second later, and
/// again. Linux caps the value at `net.core.somaxconn` (4096 by default since 5.4).
const BACKLOG: u32 = 4096;

/// Binds `addr`, the value of the setting `name`; a failure names both and the cause.
pub async fn listen(name: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    bind_with_backlog(addr).map_err(|e| {
        use std::io::ErrorKind;
        let why = match e.kind() {
            ErrorKind::AddrInUse => format!(
                "address in use; another process listens there (`ss -ltnp 'sport = :{}'` names \
                 it): stop it, or set {name} to another address",
                addr.port()
            ),
            ErrorKind::AddrNotAvailable => {
                "address not available: no interface of this machine has it".to_string()
            }
            ErrorKind::PermissionDenied => {
                "permission denied: a port below 1024 needs CAP_NET_BIND_SERVICE".to_string()
            }
            _ => e.to_string(),
        };
        anyhow::anyhow!("{name} {addr}: {why}")
    })
}

/// What `TcpListener::bind` does (`SO_REUSEADDR`, bind, listen), with `BACKLOG`.
fn bind_with_backlog(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_address_is_named_with_its_setting() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = listen("LEASEGATE_LISTEN", addr)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("LEASEGATE_LISTEN {addr}: address in use;")),
            "{e}"
        );
    }

    /// The queue a listener was given, as `ss` shows it (Send-Q of a listening socket).
    fn backlog_of(port: u16) -> Option<u32> {
        let out = std::process::Command::new("ss")
            .args(["-ltnH", &format!("sport = :{port}")])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        text.split_whitespace().nth(2)?.parse().ok()
    }

    #[tokio::test]
    async fn the_listener_queues_a_burst_of_connects() {
        let listener = listen("LEASEGATE_LISTEN", "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let Some(backlog) = backlog_of(port) else {
            eprintln!("skipped: ss (iproute2) is not installed");
            return;
        };
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .map_or(BACKLOG, |s| s.trim().parse().unwrap_or(BACKLOG));
        assert_eq!(backlog, BACKLOG.min(somaxconn));
        assert!(backlog > 128 || somaxconn <= 128, "{backlog}");
    }
}
