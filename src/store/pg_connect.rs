//! The first connection to PostgreSQL at start, and what its failure says.
//!
//! A pool that cannot connect retries until its acquire timeout and then reports only "pool
//! timed out while waiting for an open connection", which hides whether the server is down,
//! the address is wrong, TLS failed or the password is refused. So the service connects once,
//! alone, before it builds its pool, and a failure names the server and the cause in the
//! server's or the system's own words, with what to check.

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use std::time::Duration;

/// Connects once to the server `options` name, within `timeout`, and closes the connection.
pub async fn first_connection(options: &PgConnectOptions, timeout: Duration) -> anyhow::Result<()> {
    let at = address(options);
    match tokio::time::timeout(timeout, options.connect()).await {
        Ok(Ok(conn)) => {
            conn.close().await.ok();
            Ok(())
        }
        Ok(Err(e)) => Err(anyhow::anyhow!("{}", explain(&e, &at))),
        Err(_) => anyhow::bail!(
            "cannot connect to PostgreSQL at {at}: no answer within {} ms \
             (LEASEGATE_DB_ACQUIRE_TIMEOUT_MS); check DATABASE_URL's host and port, and that \
             nothing between drops the connection",
            timeout.as_millis()
        ),
    }
}

/// The server's `max_connections` and the connections it holds now (every backend a client
/// opened, whatever its database): what room there is for more, for a tool that is about to
/// open many (`leasegate bench`).
pub async fn connection_room(url: &str) -> anyhow::Result<(i64, i64)> {
    let options: PgConnectOptions = url.parse()?;
    let at = address(&options);
    let mut conn = options
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("{}", explain(&e, &at)))?;
    let room = sqlx::query_as(
        "SELECT current_setting('max_connections')::int8, \
         (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
    )
    .fetch_one(&mut conn)
    .await?;
    conn.close().await.ok();
    Ok(room)
}

/// Where the server is, as a person would look for it (never the password).
fn address(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(dir) => format!("the socket in {}", dir.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// A failed first connection as a sentence: the cause, and what to check.
pub fn explain(e: &sqlx::Error, at: &str) -> String {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default().to_string();
            let check = match code.as_str() {
                "28P01" | "28000" => "check the user and password of DATABASE_URL (or PGPASSWORD)",
                "3D000" => "create the database, or correct its name in DATABASE_URL",
                "53300" => "the server has no connection left: raise its max_connections",
                "57P03" => "the server is starting or stopping: try again in a moment",
                _ => "check DATABASE_URL",
            };
            format!(
                "PostgreSQL at {at} refused the connection: {} ({code}); {check}",
                db.message()
            )
        }
        sqlx::Error::Io(io) => format!(
            "cannot connect to PostgreSQL at {at}: {}; check that the server runs and listens \
             there, and DATABASE_URL's host and port",
            io_words(io)
        ),
        sqlx::Error::Tls(tls) => format!(
            "cannot connect to PostgreSQL at {at}: TLS failed: {tls}; check sslmode and \
             sslrootcert in DATABASE_URL"
        ),
        sqlx::Error::Configuration(c) => format!("DATABASE_URL: {c}"),
        other => format!("cannot connect to PostgreSQL at {at}: {other}"),
    }
}

/// An I/O error in plain words: "connection refused" rather than "Connection refused (os
/// error 111)".
fn io_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::ConnectionRefused => "connection refused".into(),
        ErrorKind::TimedOut => "connection timed out".into(),
        ErrorKind::HostUnreachable => "host unreachable".into(),
        ErrorKind::NetworkUnreachable => "network unreachable".into(),
        ErrorKind::ConnectionReset => "connection reset by the server".into(),
        ErrorKind::NotFound => "no such socket".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        _ => {
            let text = e.to_string();
            match text.find(" (os error") {
                Some(i) => text[..i].to_string(),
                None => text,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn io_errors_read_as_words() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            explain(&refused, "127.0.0.1:5999"),
            "cannot connect to PostgreSQL at 127.0.0.1:5999: connection refused; check that \
             the server runs and listens there, and DATABASE_URL's host and port"
        );
        let dns = std::io::Error::other(
            "failed to lookup address information: Name or service \
            not known",
        );
        assert_eq!(
            io_words(&dns),
            "failed to lookup address information: Name or service not known"
        );
    }

    #[test]
    fn the_address_is_the_host_and_port_or_the_socket_never_the_password() {
        let tcp = PgConnectOptions::from_str("postgres://u:secret@db.internal:6543/x").unwrap();
        assert_eq!(address(&tcp), "db.internal:6543");
        let socket =
            PgConnectOptions::from_str("postgres://u@localhost/x?host=/run/postgresql").unwrap();
        assert_eq!(address(&socket), "the socket in /run/postgresql");
    }
}
