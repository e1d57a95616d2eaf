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
}

/// Binds `LEASEGATE_LISTEN` and, if set, `LEASEGATE_METRICS_LISTEN`.
pub async fn bind(args: &ServeArgs) -> anyhow::Result<Listeners> {
    let api = listen("LEASEGATE_LISTEN", args.listen).await?;
    let metrics = match args.metrics_listen {
        Some(addr) => Some(listen("LEASEGATE_METRICS_LISTEN", addr).await?),
        None => None,
    };
    Ok(Listeners { api, metrics })
}

/// Binds `addr`, the value of the setting `name`; a failure names both and the cause.
pub async fn listen(name: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
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
}
