//! Image references: `host[:port]/path/name[:tag|@digest]`, as container tools read them.
//!
//! The first path component is a registry host when it contains a `.` or a `:`, is
//! `localhost`, or is a bracketed IPv6 address; otherwise the reference is on Docker Hub
//! (`docker.io`), where a single-component name is an official image under `library/`. With
//! neither tag nor digest the tag is `latest`; with both, the digest decides (as pulls do).

use crate::domain::digest::ImageDigest;
use std::fmt;

/// Docker Hub as references name it.
pub const DOCKER_HUB: &str = "docker.io";
/// Docker Hub's registry API host.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A parsed, normalized image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// `host[:port]`, `docker.io` for Docker Hub.
    pub registry: String,
    /// The repository path on that registry, e.g. `ci/runner` or `library/alpine`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<ImageDigest>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{reference}` is not a valid image reference: {why}")]
pub struct BadReference {
    pub reference: String,
    pub why: &'static str,
}

/// `[a-z0-9]+` joined by `.`, `_`, `__` or runs of `-`.
fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|x| x.is_ascii_alphanumeric() || matches!(x, b'_' | b'.' | b'-'))
}

/// A host name or IPv4 address with an optional port, or `[ipv6]` with an optional port.
fn valid_host(h: &str) -> bool {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        if inside.is_empty() || !inside.bytes().all(|x| x.is_ascii_hexdigit() || x == b':') {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("x", Some(port)),
                None => return false,
            },
        }
    } else {
        match h.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    let host_ok = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|x| x.is_ascii_alphanumeric() || x == b'-')
        });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|x| x.is_ascii_digit()));
    host_ok && port_ok
}

impl ImageRef {
    pub fn parse(reference: &str) -> Result<ImageRef, BadReference> {
        let bad = |why| BadReference {
            reference: reference.to_string(),
            why,
        };
        if reference.is_empty() || reference.len() > 512 {
            return Err(bad("empty or longer than 512 characters"));
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, d)) => (
                rest,
                Some(ImageDigest::parse(d).map_err(|_| bad("the digest is not sha256:<64 hex>"))?),
            ),
            None => (reference, None),
        };
        // A tag is after the last `:` of the last path component (a port is before a `/`).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_string()),
            ),
            None => (rest, None),
        };
        if let Some(t) = &tag
            && !valid_tag(t)
        {
            return Err(bad("the tag is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"));
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') =>
            {
                if !valid_host(first) {
                    return Err(bad("the registry host is not host[:port]"));
                }
                (first.to_string(), path.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_string(),
            _ => registry,
        };
        if path.is_empty() || !path.split('/').all(valid_path_component) {
            return Err(bad(
                "a repository path component is not lowercase [a-z0-9] joined by . _ __ or -",
            ));
        }
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path
        };
        if registry.len() + 1 + repository.len() > 255 {
            return Err(bad("the name is longer than 255 characters"));
        }
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What to ask the registry for: the digest when there is one, else the tag (`latest`).
    pub fn reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        }
    }

    /// The tag a push must name to move this reference; `None` for a digest reference,
    /// which never moves.
    pub fn moving_tag(&self) -> Option<&str> {
        match (&self.digest, &self.tag) {
            (Some(_), _) => None,
            (None, Some(t)) => Some(t),
            (None, None) => Some("latest"),
        }
    }

    /// The host (and port) the registry API is reached at.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(r: &str) -> (String, String, Option<String>, Option<String>) {
        let p = ImageRef::parse(r).unwrap_or_else(|e| panic!("{e}"));
        (
            p.registry,
            p.repository,
            p.tag,
            p.digest.map(|d| d.to_string()),
        )
    }

    fn s(x: &str) -> String {
        x.to_string()
    }

    const D: &str = "sha256:0fe3c799a0f15af08aae8de219301ea0d02ec887bd9ff650cda30239a4aa6982";

    #[test]
    fn registry_hosts_are_recognised() {
        assert_eq!(
            parts("registry.example.com/ci/runner:stable"),
            (
                s("registry.example.com"),
                s("ci/runner"),
                Some(s("stable")),
                None
            )
        );
        assert_eq!(
            parts("127.0.0.1:5000/ci/runner:stable"),
            (s("127.0.0.1:5000"), s("ci/runner"), Some(s("stable")), None)
        );
        assert_eq!(
            parts("localhost/runner"),
            (s("localhost"), s("runner"), None, None)
        );
        assert_eq!(
            parts("localhost:5000/a/b/c:v1.2-rc_3"),
            (s("localhost:5000"), s("a/b/c"), Some(s("v1.2-rc_3")), None)
        );
        assert_eq!(
            parts("[::1]:5000/ci/runner"),
            (s("[::1]:5000"), s("ci/runner"), None, None)
        );
        assert_eq!(
            parts(&format!("quay.io/podman/stable@{D}")),
            (s("quay.io"), s("podman/stable"), None, Some(s(D)))
        );
    }

    #[test]
    fn without_a_host_the_reference_is_on_docker_hub() {
        assert_eq!(
            parts("alpine"),
            (s("docker.io"), s("library/alpine"), None, None)
        );
        assert_eq!(
            parts("alpine:3.20"),
            (s("docker.io"), s("library/alpine"), Some(s("3.20")), None)
        );
        assert_eq!(
            parts("ci/runner:stable"),
            (s("docker.io"), s("ci/runner"), Some(s("stable")), None)
        );
        assert_eq!(
            parts("docker.io/alpine"),
            (s("docker.io"), s("library/alpine"), None, None)
        );
        assert_eq!(
            parts("index.docker.io/library/alpine:edge"),
            (s("docker.io"), s("library/alpine"), Some(s("edge")), None)
        );
        let hub = ImageRef::parse("alpine").unwrap();
        assert_eq!(hub.api_host(), "registry-1.docker.io");
        assert_eq!(hub.reference(), "latest");
        assert_eq!(hub.moving_tag(), Some("latest"));
        assert_eq!(hub.to_string(), "docker.io/library/alpine");
        let local = ImageRef::parse("127.0.0.1:5000/ci/runner:stable").unwrap();
        assert_eq!(local.api_host(), "127.0.0.1:5000");
        assert_eq!(local.to_string(), "127.0.0.1:5000/ci/runner:stable");
    }

    #[test]
    fn a_digest_decides_over_a_tag() {
        let r = ImageRef::parse(&format!("registry.example.com:443/ci/runner:stable@{D}")).unwrap();
        assert_eq!(r.tag.as_deref(), Some("stable"));
        assert_eq!(r.reference(), D);
        assert_eq!(r.moving_tag(), None);
        assert_eq!(r.registry, "registry.example.com:443");
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in [
            "",
            "CI/runner",
            "ci/Runner",
            "ci//runner",
            "ci/runner:",
            "ci/runner:-bad",
            "ci/runner:a b",
            "ci/runner@sha256:abc",
            "ci/runner@md5:0123",
            "/runner",
            "runner/",
            "registry.example.com/",
            "registry.example.com:port/ci/runner",
            "registry..example.com/ci/runner",
            "ci/-runner",
            "ci/runner-",
            "ci/run___ner",
            "ci/run.-ner",
            &format!("ci/{}", "a".repeat(260)),
            &format!("ci/runner:{}", "t".repeat(129)),
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["ci/run__ner", "ci/run---ner", "ci/run.ner", "ci/run_ner"] {
            assert!(ImageRef::parse(good).is_ok(), "{good:?} refused");
        }
    }
}
