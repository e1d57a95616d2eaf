//! The schema's migrations, one tree per engine (`migrations/sqlite`, `migrations/postgres`),
//! embedded at build time by `build.rs` and named as sqlx names them: a file
//! `<version>_<description>.sql`, its checksum the SHA-384 of its text. PostgreSQL runs them
//! with sqlx's migrator (under its advisory lock); SQLite applies the same list itself
//! (`store::sqlite`), recording them in the same `_sqlx_migrations` table, so a database
//! migrated by an earlier build that used `sqlx::migrate!` sees the same versions and checksums.
use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

/// SQLite's migrations, in version order.
pub fn sqlite() -> Migrator {
    migrator(embedded::SQLITE)
}

/// PostgreSQL's migrations, in version order.
pub fn postgres() -> Migrator {
    migrator(embedded::POSTGRES)
}

fn migrator(files: &'static [(&'static str, &'static str)]) -> Migrator {
    Migrator::with_migrations(
        files
            .iter()
            .map(|&(name, sql)| migration(name, sql))
            .collect(),
    )
}

/// One file as sqlx's own resolver reads it: the version before the first `_`, the rest of
/// the name without `.sql` and with spaces for underscores as its description.
fn migration(name: &str, sql: &'static str) -> Migration {
    let (version, rest) = name
        .split_once('_')
        .unwrap_or_else(|| panic!("migration {name} is not named <version>_<description>.sql"));
    let version = version
        .parse()
        .unwrap_or_else(|_| panic!("migration {name} does not start with a number"));
    let kind = MigrationType::from_filename(rest);
    let description = rest.trim_end_matches(kind.suffix()).replace('_', " ");
    Migration::new(
        version,
        description.into(),
        kind,
        sql.into_sql_str(),
        sql.starts_with("-- no-transaction"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_trees_are_embedded_in_version_order_with_sqlx_names() {
        for migrator in [sqlite(), postgres()] {
            let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
            assert!(!versions.is_empty());
            assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
            let first = migrator.iter().next().unwrap();
            assert_eq!(first.description, "init");
            assert_eq!(first.checksum.len(), 48, "SHA-384, as sqlx computes it");
        }
    }

    /// Read from `_sqlx_migrations` of a database that a build using `sqlx::migrate!` created:
    /// a database migrated before must still find every applied migration unchanged.
    #[test]
    fn names_and_checksums_are_those_sqlx_migrate_recorded() {
        let migrator = sqlite();
        let mut applied = migrator.iter();
        let init = applied.next().unwrap();
        assert_eq!(init.version, 20261130000001);
        assert_eq!(
            hex::encode_upper(init.checksum.as_ref()),
            "DE2AE2BFB20F6D886F2003A500C3E306193D7C6C31FA87E4686C26DD60EE9350\
             FB5E2F596D1F4868431E3F95E14CB88F"
        );
        let second = applied.next().unwrap();
        assert_eq!(second.description, "registry resolution");
        assert_eq!(
            hex::encode_upper(second.checksum.as_ref()),
            "F1E9A7887420759A6FC1E73D020AD1BD3EC6835D4CCB8CE8637F5BC5AFD975BD\
             8D3FD11C4098AB79315E29501ADD5D2E"
        );
    }
}
