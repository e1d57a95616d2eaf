//! Embeds the files of `migrations/sqlite` and `migrations/postgres` in the binary: writes
//! `$OUT_DIR/migrations.rs`, one `(file name, contents)` pair per file in version order, which
//! `store::migrations` turns into sqlx's migrations. A script rather than `sqlx::migrate!`
//! because that macro alone pulled sqlx's compile-time machinery (a second build of its
//! PostgreSQL driver, for the host) onto the critical path of every cold build.
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    // Read when the script runs, not when it was compiled: a target directory copied from
    // another checkout reuses the compiled script, which would embed the other's migrations.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("migrations");
    let mut out = String::new();
    for (engine, constant) in [("sqlite", "SQLITE"), ("postgres", "POSTGRES")] {
        let dir = root.join(engine);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|entry| entry.expect("a migration directory entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
            .collect();
        files.sort();
        writeln!(out, "pub(super) static {constant}: &[(&str, &str)] = &[").unwrap();
        for path in files {
            let name = path
                .file_name()
                .unwrap()
                .to_str()
                .expect("a UTF-8 migration name");
            writeln!(
                out,
                "    ({name:?}, include_str!({:?})),",
                path.display().to_string()
            )
            .unwrap();
        }
        writeln!(out, "];").unwrap();
    }
    let target = Path::new(&std::env::var("OUT_DIR").unwrap()).join("migrations.rs");
    std::fs::write(target, out).expect("writing the embedded migrations");
}
