//! Image digests: `sha256:` followed by 64 lowercase hex characters, nothing else.
//!
//! Short image ids and tags are rejected at the edge (400 `bad_request`), so that comparing a
//! runner's image with its pool's expected set is a plain string comparison.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ImageDigest(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "`{0}` is not a full image digest (expected sha256: followed by 64 lowercase hex characters)"
)]
pub struct NotADigest(pub String);

impl ImageDigest {
    pub fn parse(s: &str) -> Result<Self, NotADigest> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| NotADigest(s.to_string()))?;
        let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if valid {
            Ok(ImageDigest(s.to_string()))
        } else {
            Err(NotADigest(s.to_string()))
        }
    }

    /// An image id as an operator may paste it: a full digest, or the bare 64 hex characters
    /// podman's `{{.Id}}` prints (the agent sends the same form with its prefix).
    pub fn parse_image_id(s: &str) -> Result<Self, NotADigest> {
        let bare = s.len() == 64 && !s.contains(':');
        if bare {
            ImageDigest::parse(&format!("sha256:{s}")).map_err(|_| NotADigest(s.to_string()))
        } else {
            ImageDigest::parse(s)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex characters, as container runtimes print image ids.
    pub fn short(&self) -> &str {
        &self.0[7..19]
    }
}

impl TryFrom<String> for ImageDigest {
    type Error = NotADigest;
    fn try_from(s: String) -> Result<Self, NotADigest> {
        ImageDigest::parse(&s)
    }
}

impl From<ImageDigest> for String {
    fn from(d: ImageDigest) -> String {
        d.0
    }
}

impl fmt::Display for ImageDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_id_may_be_podmans_bare_hex() {
        let hex = "b".repeat(64);
        let full = ImageDigest::parse_image_id(&hex).unwrap();
        assert_eq!(full.as_str(), format!("sha256:{hex}"));
        assert_eq!(ImageDigest::parse_image_id(full.as_str()), Ok(full));
        assert!(ImageDigest::parse_image_id(&"B".repeat(64)).is_err());
        assert!(ImageDigest::parse_image_id("abc123").is_err());
        assert!(
            ImageDigest::parse(&hex).is_err(),
            "a digest itself keeps its prefix"
        );
    }

    #[test]
    fn accepts_only_full_lowercase_sha256() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert!(ImageDigest::parse(&good).is_ok());
        assert_eq!(ImageDigest::parse(&good).unwrap().short(), "aaaaaaaaaaaa");
        for bad in [
            "sha256:abc".to_string(),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha512:{}", "a".repeat(64)),
            "a".repeat(64),
            "ci/runner:stable".to_string(),
            format!("sha256:{}", "g".repeat(64)),
            format!("sha256:{}", "a".repeat(65)),
        ] {
            assert!(ImageDigest::parse(&bad).is_err(), "{bad} accepted");
        }
    }
}
