//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds the files
//! of `migrations/` at compile time, and cargo would not otherwise notice a new one.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
