//! The pure core of leasegate: types and rules with no IO.
//!
//! Nothing here imports axum or sqlx. Every decision the service makes about a runner or a job
//! (may this runner lease? what does `complete` do to this job?) is a function of values passed
//! in, including `now`, so that it can be unit- and property-tested without a database.

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
pub mod retention;
pub mod roll;
pub mod runner;
pub mod status;
pub mod text;
pub mod time;
pub mod timeline;
pub mod verdict;
