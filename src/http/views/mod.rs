//! The JSON shapes of PROTOCOL.md, built from domain values. One function per shape, so that
//! a runner or a job looks the same in every response that carries it. Each shape is a struct
//! deriving `Serialize` and `ToSchema`: the answer a handler sends and its schema in the
//! OpenAPI document are one definition. Optional fields are sent as `null`, never left out
//! (`#[schema(required = true)]`), except a forge runner's key of the other kind.
//!
//! One file per resource; every shape is named from here (`views::PoolView`), so a handler
//! need not know which file holds it. Nothing here imports a handler: the handlers, the
//! document and the page read these, never the other way.

mod agent;
mod buildkite;
mod drift;
mod ejection;
mod forge_runners;
mod github;
mod jobs;
mod leases;
mod operators;
mod pools;
mod runner_history;
mod runners;

pub use agent::*;
pub use buildkite::*;
pub use drift::*;
pub use ejection::*;
pub use forge_runners::*;
pub use github::*;
pub use jobs::*;
pub use leases::*;
pub use operators::*;
pub use pools::*;
pub use runner_history::*;
pub use runners::*;
