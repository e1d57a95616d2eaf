//! A PostgreSQL server of a test's own (`initdb` into a temporary directory, its own port on
//! 127.0.0.1), for what a test may not do to the shared one: stop it, or bring it back from an
//! earlier copy of its files, as a failover to a standby that had not received the last
//! transactions does.
//!
//! Found where Debian installs PostgreSQL (`/usr/lib/postgresql/*/bin`) or on PATH; without
//! it the case skips with a printed reason, unless `LEASEGATE_REQUIRE_POSTGRES=1`. As root
//! (PostgreSQL refuses to run as root) the server runs as the `postgres` user.

use std::path::PathBuf;
use std::process::Command;

pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
}

impl Cluster {
    /// A new server, started; `None` when PostgreSQL's programs are not installed here.
    pub fn start() -> Option<Cluster> {
        let Some(bin) = programs() else {
            assert!(
                !super::pg::required(),
                "{}=1 but PostgreSQL's initdb is not installed",
                super::pg::REQUIRE_VAR
            );
            super::skip::skipped("a private PostgreSQL server: initdb is not installed here");
            return None;
        };
        let as_postgres = run_output(Command::new("id").arg("-u")).trim() == "0";
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = Cluster {
            bin,
            dir,
            port,
            as_postgres,
        };
        let data = cluster.data();
        run(cluster
            .program("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data));
        cluster.pg_ctl_start();
        Some(cluster)
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server cleanly, copies its files aside, and starts it again: what
    /// `fail_over` brings back.
    pub fn copy_aside(&self) {
        self.pg_ctl_stop("fast");
        let snapshot = self.dir.path().join("snapshot");
        run(self
            .as_owner("cp")
            .arg("-a")
            .arg(self.data())
            .arg(&snapshot));
        self.pg_ctl_start();
    }

    /// Ends the server at once and starts one on the same port from the files `copy_aside`
    /// kept: every transaction since is lost, and the new server hands out their ids again,
    /// as a standby promoted after a failover does.
    pub fn fail_over(&self) {
        self.pg_ctl_stop("immediate");
        let data = self.data();
        std::fs::remove_dir_all(&data).unwrap();
        run(self
            .as_owner("cp")
            .arg("-a")
            .arg(self.dir.path().join("snapshot"))
            .arg(&data));
        self.pg_ctl_start();
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn pg_ctl_start(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=off \
             -c max_connections=40",
            self.port
        );
        run(self
            .program("pg_ctl")
            .args(["-w", "-t", "30", "-o", &options, "-l"])
            .arg(self.dir.path().join("log"))
            .arg("-D")
            .arg(self.data())
            .arg("start"));
    }

    fn pg_ctl_stop(&self, mode: &str) {
        run(self
            .program("pg_ctl")
            .args(["-w", "-m", mode, "-D"])
            .arg(self.data())
            .arg("stop"));
    }

    fn program(&self, name: &str) -> Command {
        self.as_owner(self.bin.join(name))
    }

    /// `program`, run as the server's files' owner.
    fn as_owner(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .program("pg_ctl")
            .args(["-w", "-m", "immediate", "-D"])
            .arg(self.data())
            .arg("stop")
            .output();
    }
}

/// The directory of PostgreSQL's server programs.
fn programs() -> Option<PathBuf> {
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    debian.sort();
    debian.pop().or_else(|| {
        let paths = std::env::var_os("PATH")?;
        std::env::split_paths(&paths).find(|dir| dir.join("initdb").is_file())
    })
}

fn run(cmd: &mut Command) {
    run_output(cmd);
}

fn run_output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
