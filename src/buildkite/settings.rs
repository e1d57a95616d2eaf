//! The Buildkite settings (`LEASEGATE_BUILDKITE_*`), read and checked at start: the REST API's
//! address, the organization, the API token (scope `write_agents`) and how long each pause
//! lasts before Buildkite lifts it by itself.
//!
//! Neither the token nor the organization given: the feature is off. One without the other,
//! both a token and a token file, an organization that is not a slug, or a pause outside
//! Buildkite's 1 to 10,080 minutes is refused at start, with the setting named.

use crate::config::ServeArgs;
use crate::github::settings::Secret;
use anyhow::{anyhow, bail, ensure};
use std::path::PathBuf;

/// Buildkite's own bounds on a pause's `timeout_in_minutes`.
pub const PAUSE_MINUTES_MAX: u32 = 10_080;

/// Everything the Buildkite side runs with.
#[derive(Clone, Debug)]
pub struct BuildkiteSettings {
    /// `https://api.buildkite.com`; no trailing slash.
    pub api_url: String,
    /// The organization's slug, as in `/v2/organizations/{org}/agents`.
    pub org: String,
    /// An API access token with the `write_agents` scope.
    pub token: Secret,
    /// Each pause's `timeout_in_minutes`.
    pub pause_minutes: u32,
}

/// The token, from its value or its file; both given is refused.
fn read_token(value: &Option<String>, file: &Option<PathBuf>) -> anyhow::Result<Option<Secret>> {
    let value = value.as_ref().map(|v| v.trim()).filter(|v| !v.is_empty());
    match (value, file) {
        (Some(_), Some(_)) => bail!(
            "LEASEGATE_BUILDKITE_TOKEN and LEASEGATE_BUILDKITE_TOKEN_FILE are both set: unset one"
        ),
        (Some(v), None) => Ok(Some(Secret::new(v))),
        (None, Some(path)) => {
            let name = "LEASEGATE_BUILDKITE_TOKEN_FILE";
            let token = std::fs::read_to_string(path)
                .map_err(|e| anyhow!("{name} {}: cannot read it: {e}", path.display()))?;
            let token = token.trim();
            ensure!(!token.is_empty(), "{name} {} is empty", path.display());
            Ok(Some(Secret::new(token)))
        }
        (None, None) => Ok(None),
    }
}

/// An organization's slug: what Buildkite puts in its URLs (lowercase letters, digits, `-`).
fn org_slug(given: &str) -> anyhow::Result<String> {
    let org = given.trim();
    let ok = (1..=100).contains(&org.len())
        && org
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ensure!(
        ok,
        "LEASEGATE_BUILDKITE_ORG: `{given}` is not an organization's slug (as in \
         https://buildkite.com/ORG: lowercase letters, digits and `-`)"
    );
    Ok(org.to_string())
}

impl ServeArgs {
    /// The Buildkite settings; `None` when neither the token nor the organization is given
    /// (the feature is off). Names the setting at fault.
    pub fn buildkite_settings(&self) -> anyhow::Result<Option<BuildkiteSettings>> {
        let token = read_token(&self.buildkite_token, &self.buildkite_token_file)?;
        let org = self
            .buildkite_org
            .as_deref()
            .map(str::trim)
            .filter(|o| !o.is_empty());
        let (token, org) = match (token, org) {
            (None, None) => return Ok(None),
            (Some(_), None) => bail!(
                "LEASEGATE_BUILDKITE_ORG not set: the Buildkite token needs the organization \
                 whose agents it pauses"
            ),
            (None, Some(_)) => bail!(
                "LEASEGATE_BUILDKITE_TOKEN (or LEASEGATE_BUILDKITE_TOKEN_FILE) not set: pausing \
                 the organization's agents needs an API token with the write_agents scope"
            ),
            (Some(t), Some(o)) => (t, org_slug(o)?),
        };
        ensure!(
            (1..=PAUSE_MINUTES_MAX).contains(&self.buildkite_pause_minutes),
            "LEASEGATE_BUILDKITE_PAUSE_MINUTES must be from 1 to {PAUSE_MINUTES_MAX} (Buildkite's \
             bounds on a pause's timeout), got {}",
            self.buildkite_pause_minutes
        );
        Ok(Some(BuildkiteSettings {
            api_url: crate::github::settings::api_url(
                "LEASEGATE_BUILDKITE_API_URL",
                &self.buildkite_api_url,
            )?,
            org,
            token,
            pause_minutes: self.buildkite_pause_minutes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn organizations_are_slugs() {
        assert_eq!(org_slug(" acme-inc ").unwrap(), "acme-inc");
        for bad in ["Acme", "acme/inc", "acme?x", &"a".repeat(101)] {
            let e = org_slug(bad).unwrap_err().to_string();
            assert!(e.starts_with("LEASEGATE_BUILDKITE_ORG: "), "{bad}: {e}");
        }
    }

    #[test]
    fn a_token_is_given_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "bkua_x\n").unwrap();
        assert_eq!(
            read_token(&None, &Some(file.clone())).unwrap(),
            Some(Secret::new("bkua_x"))
        );
        assert!(
            read_token(&Some("bkua_y".into()), &Some(file.clone()))
                .unwrap_err()
                .to_string()
                .contains("both set")
        );
        std::fs::write(&file, " \n").unwrap();
        assert!(read_token(&None, &Some(file)).is_err());
        assert_eq!(read_token(&Some(String::new()), &None).unwrap(), None);
    }
}
