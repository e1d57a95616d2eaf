//! Opening the store: what `DATABASE_URL` names, and the `Store` (or bare engine) over it.
//!
//! The one place that picks an engine; everything after it holds a `DynStore`.

use super::group_commit::RoundShape;
use super::held::Held;
use super::service::DynStore;
use super::signal::JobSignal;
use super::{gated, postgres, sqlite};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `DATABASE_URL` names: the one place its scheme is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// `sqlite://PATH` or `sqlite:PATH`: the file (created if missing).
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`, as given.
    Postgres(String),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DatabaseUrlError {
    #[error("DATABASE_URL must start with sqlite:// (a file) or postgres:// (a server), not {0:?}")]
    Scheme(String),
    #[error("DATABASE_URL names no SQLite file: write sqlite://PATH, as sqlite://leasegate.db")]
    NoPath,
    #[error(
        "DATABASE_URL: an in-memory SQLite database would be lost at every restart and is not \
         shared between connections; name a file"
    )]
    InMemory,
    #[error("DATABASE_URL: a SQLite URL takes no options (found ?{0}); name the file only")]
    SqliteOptions(String),
}

impl DatabaseUrl {
    pub fn parse(url: &str) -> Result<Self, DatabaseUrlError> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseUrl::Postgres(url.to_string()));
        }
        let Some(rest) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        else {
            // Only the scheme is shown: the rest may hold a password.
            let scheme = url.split_once(':').map_or(url, |(s, _)| s);
            return Err(DatabaseUrlError::Scheme(scheme.chars().take(32).collect()));
        };
        let (path, options) = rest.split_once('?').unwrap_or((rest, ""));
        if path.contains(":memory:") || options.contains("mode=memory") {
            return Err(DatabaseUrlError::InMemory);
        }
        if !options.is_empty() {
            return Err(DatabaseUrlError::SqliteOptions(options.to_string()));
        }
        if path.is_empty() {
            return Err(DatabaseUrlError::NoPath);
        }
        Ok(DatabaseUrl::Sqlite(PathBuf::from(path)))
    }

    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        match self {
            DatabaseUrl::Sqlite(_) => "sqlite",
            DatabaseUrl::Postgres(_) => "postgres",
        }
    }

    /// Whether replicas may share the database (and so must share their secrets).
    pub fn is_shared(&self) -> bool {
        matches!(self, DatabaseUrl::Postgres(_))
    }

    /// The SQLite file's directory (`.` for a bare file name); `None` for PostgreSQL.
    pub fn sqlite_dir(&self) -> Option<&Path> {
        match self {
            DatabaseUrl::Sqlite(path) => Some(match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            }),
            DatabaseUrl::Postgres(_) => None,
        }
    }
}

/// Opens the store that `url` names, migrated, behind group commit and the gate's cache.
pub async fn open(
    url: &DatabaseUrl,
    pg: &postgres::PgSettings,
    sync: sqlite::Synchronous,
) -> anyhow::Result<DynStore> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => {
            // Wake-ups are not lost in one process, but one may be swallowed by a waiter that
            // was cordoned while it waited: re-check now and then all the same.
            let held = Held::new(JobSignal::with_recheck(sqlite::RECHECK_INTERVAL));
            let engine = sqlite::SqliteEngine::open(path, sync)?;
            Arc::new(gated::GatedStore::new(
                Arc::new(engine),
                held,
                RoundShape::SQLITE,
            ))
        }
        DatabaseUrl::Postgres(url) => {
            let held = Held::new(JobSignal::with_recheck(postgres::RECHECK_INTERVAL));
            let listener = held.clone();
            let announced = Arc::new(move |a: postgres::Announced| match a {
                postgres::Announced::Change(change) => listener.apply(&change),
                postgres::Announced::Lost => listener.lost(),
            });
            let engine = postgres::PgEngine::open(url, pg, announced).await?;
            let shape = RoundShape::postgres(engine.round_lanes());
            Arc::new(gated::GatedStore::new(Arc::new(engine), held, shape))
        }
    })
}

/// An engine opened bare, without group commit, caches or wake-ups: the bench's baseline
/// (`bench/baseline.rs`) runs the store's own statements (`sql::queue`) on it.
pub enum Bare {
    Sqlite(sqlite::Direct),
    Postgres(postgres::PgEngine),
}

impl Bare {
    pub async fn open(url: &DatabaseUrl, connections: u32) -> anyhow::Result<Bare> {
        Ok(match url {
            DatabaseUrl::Sqlite(path) => Bare::Sqlite(sqlite::Direct::open(path)?),
            DatabaseUrl::Postgres(url) => {
                let settings = postgres::PgSettings {
                    max_connections: connections.max(1),
                    ..Default::default()
                };
                Bare::Postgres(postgres::PgEngine::connect(url, &settings).await?)
            }
        })
    }

    /// Checkpoints SQLite's WAL into the file (`sqlite::Direct::checkpoint`): whether it was
    /// all copied. PostgreSQL's checkpoints are the server's own: nothing to do.
    pub fn checkpoint(&mut self) -> anyhow::Result<bool> {
        match self {
            Bare::Sqlite(direct) => Ok(direct.checkpoint()?),
            Bare::Postgres(_) => Ok(true),
        }
    }

    /// Closes the engine's connections, waiting until they are.
    pub async fn close(self) {
        if let Bare::Postgres(engine) = self {
            engine.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_name_their_engine_or_say_what_is_wrong() {
        assert_eq!(
            DatabaseUrl::parse("sqlite:///var/lib/leasegate/leasegate.db"),
            Ok(DatabaseUrl::Sqlite(
                "/var/lib/leasegate/leasegate.db".into()
            ))
        );
        let relative = DatabaseUrl::parse("sqlite:leasegate.db").unwrap();
        assert_eq!(relative.sqlite_dir(), Some(Path::new(".")));
        assert_eq!(
            DatabaseUrl::parse("sqlite:///var/lib/x.db")
                .unwrap()
                .sqlite_dir(),
            Some(Path::new("/var/lib"))
        );
        let pg = DatabaseUrl::parse("postgresql://u:secret@db/leasegate").unwrap();
        assert!(pg.is_shared() && pg.engine() == "postgres" && pg.sqlite_dir().is_none());
        let wrong = DatabaseUrl::parse("mysql://u:secret@db/x").unwrap_err();
        assert_eq!(wrong, DatabaseUrlError::Scheme("mysql".into()));
        assert!(!wrong.to_string().contains("secret"));
        assert_eq!(
            DatabaseUrl::parse("sqlite://"),
            Err(DatabaseUrlError::NoPath)
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite::memory:"),
            Err(DatabaseUrlError::InMemory)
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite://x.db?mode=ro"),
            Err(DatabaseUrlError::SqliteOptions("mode=ro".into()))
        );
    }
}
