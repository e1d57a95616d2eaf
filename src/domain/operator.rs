//! Operators: the people and programs that hold an admin-API token, and what each role may do.
//!
//! Three roles, each allowing what the one below it does and more: a `viewer` reads the admin
//! API and the page; an `operator` also changes runners, pools, registration tokens and
//! resolutions; an `admin` also manages the operators' tokens. The configured admin token
//! acts as an admin named `bootstrap`, so that a fresh service can be entered at all.

use serde::Serialize;
use std::fmt;

/// What an operator may do, in increasing power.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// Whether this role may do what `needed` may.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name the configured admin token acts under.
pub const BOOTSTRAP: &str = "bootstrap";

/// An operator's name: 1–63 characters of `a-z 0-9 - _ . @`, starting with a letter or digit
/// (a person's login or a program's name; shown in the audit trail and on the page).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct OperatorName(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "`{0}` is not a valid operator name (1-63 characters of a-z 0-9 - _ . @, starting with a \
     letter or digit)"
)]
pub struct BadOperatorName(pub String);

impl OperatorName {
    pub fn parse(s: &str) -> Result<Self, BadOperatorName> {
        let first_ok = s
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let all_ok = s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.' | b'@')
        });
        if first_ok && all_ok && s.len() <= 63 {
            Ok(OperatorName(s.to_string()))
        } else {
            Err(BadOperatorName(s.chars().take(80).collect()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// For values read back from the store, which only ever holds parsed names.
    pub fn from_trusted(s: String) -> Self {
        OperatorName(s)
    }
}

impl fmt::Display for OperatorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who is asking: a name and what it may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operator {
    pub name: OperatorName,
    pub role: Role,
}

impl Operator {
    /// The configured admin token's operator.
    pub fn bootstrap() -> Self {
        Operator {
            name: OperatorName(BOOTSTRAP.to_string()),
            role: Role::Admin,
        }
    }

    pub fn may(&self, needed: Role) -> bool {
        self.role.allows(needed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_allows_what_the_ones_below_it_do() {
        assert!(Role::Admin.allows(Role::Operator) && Role::Admin.allows(Role::Viewer));
        assert!(Role::Operator.allows(Role::Viewer) && !Role::Operator.allows(Role::Admin));
        assert!(!Role::Viewer.allows(Role::Operator) && Role::Viewer.allows(Role::Viewer));
        for role in [Role::Viewer, Role::Operator, Role::Admin] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
        assert!(Operator::bootstrap().may(Role::Admin));
    }

    #[test]
    fn operator_names_are_plain() {
        assert!(OperatorName::parse("alice@ops").is_ok());
        assert!(OperatorName::parse("ci-dashboard.1").is_ok());
        for bad in ["", "Alice", "-x", "a b", "a\u{202e}b", &"a".repeat(64)] {
            assert!(OperatorName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
