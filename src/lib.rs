//! leasegate: the forge-side lease gate for self-hosted CI runners.
//!
//! No fresh signed proof that a runner can run a container, on the image its pool expects, no
//! job. See `docs/ARCHITECTURE.md` for the map; in short:
//!
//! - [`domain`]: pure types and rules (attestation claims, the verdict, the lease state
//!   machine, pools and images). No IO.
//! - [`verifier`]: rules 1–4 on a compact JWS, with `ed25519-dalek`'s strict verification.
//! - [`gate`]: rules 1–14 end to end, recording what the protocol says to record.
//! - [`store`]: the `Store` trait and its engines; the only place SQL lives.
//! - [`http`]: the API and the page: axum routers, one module per party, and the OpenAPI
//!   document.
//! - [`listener`], [`throttle`], [`client`], [`problem`]: what the API and the forge gate
//!   both stand on: serving connections with their limits, throttling credential guessing,
//!   who the client is, and the problem+json error.
//! - [`registry`]: resolving registry pools' image references (OCI distribution API), and
//!   the background resolver.
//! - [`github`]: GitHub Actions under the gate: single-use registrations minted only for
//!   admitted runners, watched and withdrawn.
//! - [`buildkite`]: Buildkite agents under the gate: paused through Buildkite's API while
//!   their runner is refused, resumed when it is admitted.
//! - [`server`], [`sweeper`], [`retention`], [`timeline`]: starting, stopping, housekeeping,
//!   pruning, and sampling pools for the page's timelines.
//! - [`commands`]: each command of the binary run to its end on a runtime of its own.
//! - [`startup`], [`usage`], [`logging`]: what a start checks before it writes anything, and
//!   errors that name a setting as the user set it (variable or flag).
//! - [`agent`]: the runner side: the preflight probe, signed attestations, the client and
//!   the `leasegate runner` commands.
//! - [`jwt`]: the tokens leasegate signs: a runner's attestations (EdDSA), a GitHub App's
//!   token (RS256).
#![forbid(unsafe_code)]

pub mod agent;
pub mod app;
pub mod bench;
pub mod buildkite;
pub mod client;
pub mod commands;
pub mod config;
pub mod demo;
pub mod domain;
pub mod forge_gate;
pub mod gate;
pub mod github;
pub mod http;
pub mod jwt;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod problem;
pub mod registry;
pub mod retention;
pub mod secrets;
pub mod server;
pub mod signature;
pub mod signature_batches;
pub mod startup;
pub mod store;
pub mod sweeper;
pub mod throttle;
pub mod timeline;
pub mod turns;
pub mod usage;
pub mod verifier;
