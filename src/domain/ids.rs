//! Identifier newtypes, so that a runner id can never be passed where a job id is expected.
//!
//! Ids are UUIDv7 strings: opaque to clients (PROTOCOL.md), time-ordered for index locality.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// A fresh, time-ordered id.
            pub fn generate() -> Self {
                Self(uuid::Uuid::now_v7().to_string())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// An id as a client sent it (a path segment, a `kid`): refused when it holds a
            /// control character, which no id has and PostgreSQL cannot look up.
            pub fn parse(field: &'static str, s: &str) -> Result<Self, super::text::BadText> {
                super::text::without_controls(field, s).map(|s| Self(s.to_string()))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

id_type!(
    /// A registered runner; also the `kid`, `iss` and `sub` of its attestations.
    RunnerId
);
id_type!(
    /// A job enqueued by the forge.
    JobId
);
id_type!(
    /// One lease of one job by one runner; every lease-scoped write is fenced by it.
    LeaseId
);
id_type!(
    /// One GitHub registration leasegate minted for a runner (its row; GitHub's own id for the
    /// runner it registered is a number, `github_runner_id`).
    RegistrationId
);
