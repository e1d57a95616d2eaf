//! `leasegate serve` refusing to start, as the person setting it up meets it: each mistake
//! stops the real binary with an error that names the setting as it was set (variable or
//! flag), the cause and what to do, and leaves nothing behind (no token, no database).

use crate::common;

use common::binary::*;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// `serve` in a fresh directory with `env`, run to its end.
async fn refused(env: &[(&str, &str)], args: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = serve(dir.path(), free_port());
    cmd.args(args);
    for (name, value) in env {
        cmd.env(name, value);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("a refused start ends")
        .unwrap();
    assert!(!out.status.success(), "{env:?} {args:?} started");
    (out, dir)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_nothing_written(dir: &Path, what: &str) {
    assert_eq!(
        files_in(dir),
        Vec::<String>::new(),
        "{what}: nothing may be written"
    );
}

#[tokio::test]
async fn a_bad_value_is_named_by_the_variable_that_set_it_or_else_by_its_flag() {
    for (name, value, expected) in [
        (
            "LEASEGATE_LISTEN",
            "nowhere",
            "invalid socket address syntax",
        ),
        (
            "LEASEGATE_SQLITE_SYNCHRONOUS",
            "FUL",
            "a similar value exists: 'FULL'",
        ),
        (
            "LEASEGATE_LOG_FORMAT",
            "jsn",
            "[possible values: human, json]",
        ),
        (
            "LEASEGATE_FORGE_UNBOUND",
            "allow",
            "[possible values: refuse, pass]",
        ),
        (
            "LEASEGATE_REGISTRY_RESOLVER",
            "yes",
            "[possible values: true, false]",
        ),
        ("LEASEGATE_MAX_CONNECTIONS", "lots", "invalid digit"),
    ] {
        let (out, dir) = refused(&[(name, value)], &[]).await;
        let stderr = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{name}={value}: {stderr}");
        assert!(
            stderr.contains(&format!("invalid value '{value}' for {name}")),
            "{name}={value}: {stderr}"
        );
        assert!(stderr.contains(expected), "{name}={value}: {stderr}");
        assert!(
            !stderr.contains("for '--"),
            "{name}={value}: no flag was typed: {stderr}"
        );
        assert_nothing_written(dir.path(), name);
    }
    // Typed as a flag, the flag is named, by clap and by the service's own checks alike.
    let (out, _) = refused(&[], &["--listen", "nowhere"]).await;
    assert!(
        stderr(&out).contains("invalid value 'nowhere' for '--listen <LISTEN>'"),
        "{}",
        stderr(&out)
    );
    let (out, dir) = refused(&[], &["--lease-ttl-s", "0"]).await;
    assert!(
        stderr(&out).contains("leasegate: --lease-ttl-s must be positive, got 0"),
        "{}",
        stderr(&out)
    );
    assert_nothing_written(dir.path(), "--lease-ttl-s 0");
    let (out, _) = refused(&[("LEASEGATE_LEASE_TTL_S", "0")], &[]).await;
    assert!(
        stderr(&out).contains("leasegate: LEASEGATE_LEASE_TTL_S must be positive, got 0"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn a_rust_log_that_is_no_filter_stops_every_command_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("runner.key");
    let commands: [&[&str]; 3] = [
        &["serve"],
        &["demo"],
        &["runner", "keygen", "--key", key.to_str().unwrap()],
    ];
    for (value, expected) in [
        ("inf", "RUST_LOG: `inf` is not a level"),
        (
            "info,leasegate=verbose",
            "`leasegate=verbose` is not a filter directive",
        ),
    ] {
        for args in commands {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasegate"));
            clear_settings(&mut cmd);
            let out = cmd
                .args(args)
                .env("RUST_LOG", value)
                .env("LEASEGATE_LISTEN", format!("127.0.0.1:{}", free_port()))
                .current_dir(dir.path())
                .kill_on_drop(true)
                .output()
                .await
                .unwrap();
            let stderr = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(64),
                "{args:?} RUST_LOG={value}: {stderr}"
            );
            assert!(
                stderr.contains(expected),
                "{args:?} RUST_LOG={value}: {stderr}"
            );
            assert_nothing_written(dir.path(), &format!("{args:?}"));
        }
    }
    assert!(stderr(&refused(&[("RUST_LOG", "inf")], &[]).await.0).contains("did you mean info?"));
}

#[tokio::test]
async fn the_database_urls_scheme_is_checked_before_anything_else() {
    // A weak token and a bad setting too: the scheme decides what every other message says.
    let (out, dir) = refused(
        &[
            ("DATABASE_URL", "sqlte://x.db"),
            ("LEASEGATE_ADMIN_TOKEN", "short"),
            ("LEASEGATE_LEASE_TTL_S", "0"),
        ],
        &[],
    )
    .await;
    let stderr = stderr(&out);
    assert!(
        stderr.contains(
            "DATABASE_URL must start with sqlite:// (a file) or postgres:// (a server), not \"sqlte\""
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("PostgreSQL"), "{stderr}");
    assert_nothing_written(dir.path(), "sqlte://");
}

#[tokio::test]
async fn a_sqlite_path_missing_its_third_slash_or_its_directory_is_pointed_out() {
    // The working directory has no `tmp`, but `/tmp` exists: the slash was lost.
    let (out, dir) = refused(&[("DATABASE_URL", "sqlite://tmp/x.db")], &[]).await;
    assert!(
        stderr(&out)
            .contains("did you mean sqlite:///tmp/x.db (three slashes for an absolute path)?"),
        "{}",
        stderr(&out)
    );
    assert_nothing_written(dir.path(), "sqlite://tmp/x.db");

    let (out, dir) = refused(&[("DATABASE_URL", "sqlite://no/such/dir/x.db")], &[]).await;
    assert!(
        stderr(&out).contains("the directory no/such/dir of the SQLite file does not exist"),
        "{}",
        stderr(&out)
    );
    assert_nothing_written(dir.path(), "sqlite://no/such/dir/x.db");
}

/// Makes a file or directory read-only for as long as it lives: `chattr +i` for root (who
/// ignores modes, as the tests here run), a mode without write bits for anyone else.
struct ReadOnly {
    path: PathBuf,
    immutable: bool,
}

impl ReadOnly {
    /// `None`, with the reason printed, when neither works here; a failure instead under
    /// `LEASEGATE_REQUIRE_CHATTR=1` (set by `.ci/run`).
    fn make(path: &Path) -> Option<ReadOnly> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if !root {
            let mode = if path.is_dir() { 0o555 } else { 0o444 };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
            return Some(ReadOnly {
                path: path.into(),
                immutable: false,
            });
        }
        match std::process::Command::new("chattr")
            .arg("+i")
            .arg(path)
            .output()
        {
            Ok(out) if out.status.success() => Some(ReadOnly {
                path: path.into(),
                immutable: true,
            }),
            other => {
                let why = match other {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
                    Err(e) => format!("chattr: {e}"),
                };
                if std::env::var("LEASEGATE_REQUIRE_CHATTR").as_deref() == Ok("1") {
                    panic!("LEASEGATE_REQUIRE_CHATTR=1 but chattr +i failed: {why}");
                }
                eprintln!("skipped: a read-only database needs chattr +i as root ({why})");
                None
            }
        }
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        if self.immutable {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(&self.path)
                .status();
        } else {
            let _ = std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o755));
        }
    }
}

#[tokio::test]
async fn a_read_only_database_or_directory_refuses_to_start_and_says_which_and_what_to_do() {
    // A database file that cannot be written, in a directory that can.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("leasegate.db");
    std::fs::write(&file, b"").unwrap();
    let Some(read_only) = ReadOnly::make(&file) else {
        return;
    };
    let out = serve(dir.path(), free_port()).output().await.unwrap();
    let stderr_file = stderr(&out);
    assert!(!out.status.success(), "{stderr_file}");
    assert!(
        stderr_file.contains(&format!(
            "the SQLite file {} cannot be written",
            file.display()
        )),
        "{stderr_file}"
    );
    assert!(stderr_file.contains("Make it writable"), "{stderr_file}");
    assert_eq!(
        files_in(dir.path()),
        ["leasegate.db"],
        "no token, no lock, no journal"
    );
    drop(read_only);

    // A directory that takes no new file.
    let dir = tempfile::tempdir().unwrap();
    let Some(_read_only) = ReadOnly::make(dir.path()) else {
        return;
    };
    let elsewhere = tempfile::tempdir().unwrap();
    let out = serve(elsewhere.path(), free_port())
        .env(
            "DATABASE_URL",
            format!("sqlite://{}", dir.path().join("leasegate.db").display()),
        )
        .output()
        .await
        .unwrap();
    let stderr_dir = stderr(&out);
    assert!(!out.status.success(), "{stderr_dir}");
    assert!(
        stderr_dir.contains(&format!(
            "the directory {} of the SQLite database cannot be written",
            dir.path().display()
        )),
        "{stderr_dir}"
    );
    assert!(stderr_dir.contains("make it writable"), "{stderr_dir}");
    assert_nothing_written(dir.path(), "read-only directory");
    assert_nothing_written(elsewhere.path(), "the working directory");
}

#[tokio::test]
async fn a_taken_address_stops_the_start_before_anything_is_written() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    for (name, env) in [
        (
            "LEASEGATE_LISTEN",
            vec![("LEASEGATE_LISTEN", addr.to_string())],
        ),
        (
            "LEASEGATE_METRICS_LISTEN",
            vec![("LEASEGATE_METRICS_LISTEN", addr.to_string())],
        ),
    ] {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (out, dir) = refused(&env, &[]).await;
        let stderr = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("leasegate: {name} {addr}: address in use")),
            "{stderr}"
        );
        assert_nothing_written(dir.path(), name);
    }
    let (out, _) = refused(&[], &["--listen", &addr.to_string()]).await;
    assert!(
        stderr(&out).contains(&format!("leasegate: --listen {addr}: address in use")),
        "{}",
        stderr(&out)
    );
}

const TOKENS: [(&str, &str); 2] = [
    (
        "LEASEGATE_ADMIN_TOKEN",
        "startup-admin-token-0123456789abcdef",
    ),
    (
        "LEASEGATE_FORGE_TOKEN",
        "startup-forge-token-0123456789abcdef",
    ),
];

#[tokio::test]
async fn an_unreachable_postgres_is_named_with_its_cause_at_once() {
    let port = free_port();
    let url = format!("postgres://leasegate@127.0.0.1:{port}/leasegate");
    let started = Instant::now();
    let (out, dir) = refused(&[TOKENS[0], TOKENS[1], ("DATABASE_URL", &url)], &[]).await;
    let stderr = stderr(&out);
    assert!(
        stderr.contains(&format!(
            "cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("pool timed out"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "refused at once, not after the pool's timeout: {:?}",
        started.elapsed()
    );
    assert_nothing_written(dir.path(), "unreachable PostgreSQL");
}

#[tokio::test]
async fn a_database_postgres_does_not_have_is_named_in_the_servers_words() {
    let Some(server) = common::pg::server_url() else {
        return;
    };
    let url = common::pg::with_database(&server, "lg_no_such_database");
    let (out, _) = refused(&[TOKENS[0], TOKENS[1], ("DATABASE_URL", &url)], &[]).await;
    let stderr = stderr(&out);
    assert!(
        stderr.contains(
            "refused the connection: database \"lg_no_such_database\" does not exist (3D000)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("correct its name in DATABASE_URL"),
        "{stderr}"
    );
}

#[tokio::test]
async fn postgres_with_sslmode_require_is_reached_over_tls() {
    use sqlx::Connection;
    let Some(db) = common::pg::TestDatabase::create().await else {
        return;
    };
    let mut conn = sqlx::PgConnection::connect(&common::pg::server_url().unwrap())
        .await
        .unwrap();
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    if ssl != "on" {
        eprintln!("skipped: the PostgreSQL server has ssl off");
        return;
    }
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}sslmode=require", db.url);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve(dir.path(), port)
        .envs(TOKENS)
        .env("DATABASE_URL", &url)
        .spawn()
        .unwrap();
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    let sessions: Vec<(bool, Option<String>)> = sqlx::query_as(
        "SELECT s.ssl, s.version FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.datname = $1 AND a.application_name LIKE 'leasegate%'",
    )
    .bind(db.name())
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(!sessions.is_empty(), "the service's connections are seen");
    assert!(
        sessions
            .iter()
            .all(|(ssl, version)| *ssl && version.is_some()),
        "every connection is over TLS: {sessions:?}"
    );
    assert!(sigterm(&mut child).await.success());
}

#[tokio::test]
async fn a_misspelt_variable_is_refused_and_any_other_stray_one_is_warned_of() {
    // A slip of a setting's name would leave the setting at its default without a word.
    let (out, dir) = refused(&[("LEASEGATE_CLOCK_SKW_S", "120")], &[]).await;
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{said}");
    assert!(
        said.contains(
            "LEASEGATE_CLOCK_SKW_S is set, but there is no such setting: did you mean \
             LEASEGATE_CLOCK_SKEW_S?"
        ),
        "{said}"
    );
    assert_nothing_written(dir.path(), "LEASEGATE_CLOCK_SKW_S");

    // A name near no setting may be another tool's: the service starts and says so once.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve(dir.path(), port)
        .env("LEASEGATE_DASHBOARD_THEME", "dark")
        .spawn()
        .unwrap();
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    assert!(sigterm(&mut child).await.success());
    let mut log = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut log)
        .await
        .unwrap();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("no setting of leasegate"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("LEASEGATE_DASHBOARD_THEME"), "{log}");
}

#[tokio::test]
async fn a_github_credential_that_is_not_whole_stops_the_start_with_status_64() {
    let keys = tempfile::tempdir().unwrap();
    let ed25519 = keys.path().join("ed25519.pem");
    std::fs::write(
        &ed25519,
        leasegate::agent::keys::RunnerKey::generate().to_pkcs8_pem(),
    )
    .unwrap();
    let (ed25519, missing) = (
        ed25519.to_str().unwrap().to_string(),
        keys.path().join("none.pem").to_str().unwrap().to_string(),
    );
    let app = |key: &str| {
        vec![
            ("LEASEGATE_GITHUB_APP_ID", "123".to_string()),
            ("LEASEGATE_GITHUB_APP_KEY_FILE", key.to_string()),
            ("LEASEGATE_GITHUB_INSTALLATION_ID", "456".to_string()),
        ]
    };
    let token = |extra: &[(&'static str, &str)]| {
        let mut env = vec![("LEASEGATE_GITHUB_TOKEN", "github_pat_x".to_string())];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        env
    };
    let cases: Vec<(Vec<(&str, String)>, String)> = vec![
        (
            app(&missing),
            format!("LEASEGATE_GITHUB_APP_KEY_FILE {missing}: cannot read it"),
        ),
        (
            app(&ed25519),
            format!("LEASEGATE_GITHUB_APP_KEY_FILE {ed25519}: not an RSA private key"),
        ),
        (
            vec![("LEASEGATE_GITHUB_APP_ID", "123".into())],
            "LEASEGATE_GITHUB_APP_KEY_FILE and LEASEGATE_GITHUB_INSTALLATION_ID not set".into(),
        ),
        (
            [app(&ed25519), token(&[])].concat(),
            "are both set: leasegate holds one GitHub credential".into(),
        ),
        (
            token(&[("LEASEGATE_GITHUB_API_URL", "http://github.example")]),
            "LEASEGATE_GITHUB_API_URL: `http://github.example` must be an https:// URL".into(),
        ),
        (
            token(&[("LEASEGATE_GITHUB_POLL_S", "0")]),
            "LEASEGATE_GITHUB_POLL_S must be positive".into(),
        ),
    ];
    for (env, expected) in cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (out, dir) = refused(&env, &[]).await;
        let stderr = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{env:?}: {stderr}");
        assert!(stderr.contains(&expected), "{env:?}: {stderr}");
        assert!(
            !stderr.contains("github_pat_x"),
            "the token is never shown: {stderr}"
        );
        assert_nothing_written(dir.path(), &expected);
    }
    // Typed as a flag, the flag is named.
    let (out, _) = refused(&[], &["--github-app-id", "1"]).await;
    assert_eq!(out.status.code(), Some(64));
    assert!(
        stderr(&out).contains("a GitHub App needs --github-app-id, LEASEGATE_GITHUB_APP_KEY_FILE"),
        "{}",
        stderr(&out)
    );
}
