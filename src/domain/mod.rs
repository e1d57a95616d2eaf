//! The pure core of leasegate: types and rules with no IO.
//!
//! Nothing here imports axum or sqlx. Every decision the service makes about a runner or a job
//! (may this runner lease? what does `complete` do to this job?) is a function of values passed
//! in, including `now`, so that it can be unit- and property-tested without a database.
//!
//! The modules are layered, and every import points down (a module may import its own
//! children; no two siblings import each other):
//!
//! 1. Values with no rules of their own: [`ids`], [`pool_name`], [`time`], [`text`],
//!    [`digest`], [`json_object`], [`disk`], [`status`] (a runner's status, by name),
//!    [`operator`], [`audit`].
//! 2. What each concept owns: [`image_set`] (an expected set and its roll) under [`images`]
//!    (several images per runner); [`forge`] (forge runners and bindings) under
//!    [`attestation`] (what a runner signs); [`ejection`] (failures in a row, and the record
//!    they make), [`job`] and [`lease`] (their states); [`github`] and [`buildkite`] (what
//!    leasegate keeps of each forge's API).
//! 3. The pool, which holds the settings of the concepts below it: [`pool`].
//! 4. The rules that combine them: [`verdict`] (may this runner lease now?) and above it
//!    [`record`] (what an accepted attestation writes: a write round's bookkeeping), then
//!    [`runner`] (its record and its status observed from the verdict), then what reads
//!    runners and their statuses: [`fetch`] (may a forge runner fetch now?),
//!    [`ejection_load`] (a pool's load for an ejection), [`fleet`], [`roll`], [`timeline`], and
//!    [`retention`] (how long history is kept, the timeline's samples among it).
//!
//! A type that a lower module and a higher one both need lives in the lower one (or in a small
//! module of its own, as `pool_name` and `status`); a function that judges across concepts
//! lives above all of them.

pub mod attestation;
pub mod audit;
pub mod buildkite;
pub mod digest;
pub mod disk;
pub mod ejection;
pub mod ejection_load;
pub mod fetch;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod fleet;
pub mod forge;
pub mod github;
pub mod ids;
pub mod image_set;
pub mod images;
pub mod job;
pub mod json_object;
pub mod lease;
pub mod operator;
pub mod pool;
pub mod pool_name;
pub mod record;
pub mod retention;
pub mod roll;
pub mod runner;
pub mod status;
pub mod text;
pub mod time;
pub mod timeline;
pub mod verdict;
