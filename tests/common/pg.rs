//! PostgreSQL for tests: one fresh database per test, dropped afterwards.
//!
//! The server's address comes from `LEASEGATE_TEST_DATABASE_URL`. Without it the PostgreSQL
//! cases are skipped with a printed reason, unless `LEASEGATE_REQUIRE_POSTGRES=1` (set by
//! `.ci/run`), in which case a missing or unreachable database fails them.

use sqlx::Connection;

pub const URL_VAR: &str = "LEASEGATE_TEST_DATABASE_URL";
pub const REQUIRE_VAR: &str = "LEASEGATE_REQUIRE_POSTGRES";

pub fn required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1")
}

/// The server URL, or `None` (with the reason printed) when PostgreSQL tests should skip.
pub fn server_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if required() => panic!("{REQUIRE_VAR}=1 but {URL_VAR} is not set"),
        _ => {
            super::skip::skipped(format!(
                "PostgreSQL case (set {URL_VAR}=postgres://… to run it)"
            ));
            None
        }
    }
}

/// `url` with its database name replaced by `name`.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

pub struct TestDatabase {
    pub url: String,
    server: String,
    name: String,
}

impl TestDatabase {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn create() -> Option<TestDatabase> {
        let server = server_url()?;
        let name = format!("lg_test_{}", uuid::Uuid::now_v7().simple());
        let mut conn = match sqlx::PgConnection::connect(&server).await {
            Ok(c) => c,
            Err(e) if required() => panic!("cannot reach PostgreSQL at {URL_VAR}: {e}"),
            Err(e) => {
                super::skip::skipped(format!("PostgreSQL case ({URL_VAR} unreachable: {e})"));
                return None;
            }
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create a test database");
        conn.close().await.ok();
        Some(TestDatabase {
            url: with_database(&server, &name),
            server,
            name,
        })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        run_on_server(
            &self.server,
            vec![format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            )],
        );
    }
}

/// Runs `statements` on `server`, each whatever became of the one before, from a drop: inside
/// a test's runtime, so on a runtime of its own.
fn run_on_server(server: &str, statements: Vec<String>) {
    let server = server.to_string();
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            if let Ok(mut conn) = sqlx::PgConnection::connect(&server).await {
                for sql in statements {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await;
                }
            }
        })
    });
    let _ = done.join();
}

/// A test's database and the role that owns it, both dropped with this (before the
/// `TestDatabase`, whose own drop then finds nothing): a role is the server's, not the
/// database's, and outlives it unless dropped.
pub struct DroppedWithRole {
    pub server: String,
    pub database: String,
    pub role: String,
}

impl Drop for DroppedWithRole {
    fn drop(&mut self) {
        run_on_server(
            &self.server,
            vec![
                format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.database),
                format!("DROP ROLE IF EXISTS \"{}\"", self.role),
            ],
        );
    }
}

/// A fresh database reached through a proxy that the test can cut or silence: the database
/// (dropped with it), the proxy, and the URL through it. `None` when PostgreSQL cases skip.
pub async fn behind_proxy() -> Option<(TestDatabase, super::proxy::Proxy, String)> {
    let server = server_url()?;
    let db = TestDatabase::create().await?;
    let target = socket_addr(&server);
    let proxy = super::proxy::Proxy::start(target).await;
    let url = with_database(
        &server.replace(&target.to_string(), &proxy.addr.to_string()),
        db.name(),
    );
    Some((db, proxy, url))
}

/// The address of the server `url` names (PostgreSQL's port when it names none).
fn socket_addr(url: &str) -> std::net::SocketAddr {
    let rest = url.split_once("://").unwrap().1;
    let host_port = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host_port = host_port.split(['/', '?']).next().unwrap();
    let with_port = if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    use std::net::ToSocketAddrs;
    with_port.to_socket_addrs().unwrap().next().unwrap()
}
