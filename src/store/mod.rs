//! Persistence: the service's `Store`, its one implementation, and the two engines under it.
//!
//! This is the only place SQL lives and the only place that knows which engine is in use.
//! Handlers hold an `Arc<dyn Store>` (`service.rs`): the service's API, nothing of how it is
//! written, in the words of `vocabulary.rs`. Under it, `gated::GatedStore` is group commit and
//! the gate's cache over an `engine::Engine`; every statement is a function of `sql/`, once,
//! over the engine interface; `sqlite.rs` and `postgres.rs` are that interface over each
//! engine, and `open.rs` picks one. Every rule that decides what a write should be comes from
//! `domain`; the store only loads, fences and writes, each call in one transaction.
//! `docs/ARCHITECTURE.md` draws the map.

pub mod engine;
mod gated;
mod group_commit;
mod held;
pub mod known_rows;
pub mod location;
pub mod migrations;
mod open;
mod pg_connect;
mod pg_rounds;
pub mod postgres;
pub mod retry;
mod service;
pub mod signal;
pub mod spills;
pub mod sql;
pub mod sqlite;
mod sqlite_checkpoints;
pub mod verdict_cache;
mod vocabulary;

pub use crate::domain::lease::Lease;
pub use open::{Bare, DatabaseUrl, DatabaseUrlError, open};
pub use pg_connect::connection_room;
pub use service::{DynStore, Store};
pub use signal::JobSignal;
pub use sql::buildkite::BuildkiteState;
pub use sql::queue::CLAIM_BATCH_SQL;
pub use sql::runners::Followed;
pub use verdict_cache::GateRunner;
pub use vocabulary::*;
