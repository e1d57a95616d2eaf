//! Turning what a reference points at into the digests a pool accepts.
//!
//! - An image manifest: its digest, and its config digest (the image ID that `podman image
//!   inspect` reports).
//! - An image index or Docker manifest list: the index digest, and for every platform its
//!   manifest digest and config digest, each platform manifest fetched and checked, so that a
//!   pool mixing architectures is not drifted. Attestation entries (`unknown/unknown`, or
//!   annotated `vnd.docker.reference.type`) are not images and are skipped. The service's
//!   platform (`LEASEGATE_REGISTRY_PLATFORM`, default `linux/amd64`) names which config is
//!   *the* image ID the pool view shows.
//!
//! All or nothing: if any manifest cannot be fetched or read, the resolution fails and the
//! pool keeps its set, rather than accepting a partial set that would refuse some platform.

use super::auth::AuthConfig;
use super::client::{
    DOCKER_LIST, DOCKER_MANIFEST, Fetched, OCI_INDEX, OCI_MANIFEST, RegistryClient, RegistryError,
};
use super::reference::ImageRef;
use crate::domain::digest::ImageDigest;
use crate::domain::image_set::ResolvedImage;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// The most platforms an index may list before it is refused (bounds the requests).
const MAX_PLATFORMS: usize = 64;

/// `os/architecture[/variant]`, e.g. `linux/amd64` or `linux/arm64/v8`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    pub fn parse(s: &str) -> Result<Platform, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, variant] if ok(os) && ok(arch) && ok(variant) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: Some(variant.to_string()),
            }),
            _ => Err(format!(
                "`{s}` is not os/architecture[/variant], e.g. linux/amd64"
            )),
        }
    }

    /// Whether an index entry's platform is this one (a platform without a variant matches
    /// every variant).
    fn matches(&self, p: &PlatformJson) -> bool {
        p.os == self.os
            && p.architecture == self.architecture
            && self
                .variant
                .as_ref()
                .is_none_or(|v| p.variant.as_deref() == Some(v.as_str()))
    }
}

impl Default for Platform {
    fn default() -> Self {
        Platform {
            os: "linux".into(),
            architecture: "amd64".into(),
            variant: None,
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct ManifestJson {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<DescriptorJson>,
    #[serde(default)]
    manifests: Option<Vec<IndexEntryJson>>,
}

#[derive(Deserialize)]
struct DescriptorJson {
    digest: String,
}

#[derive(Deserialize)]
struct IndexEntryJson {
    digest: String,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    platform: Option<PlatformJson>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Clone, Debug)]
struct PlatformJson {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

/// A manifest read: an image (with its config digest) or an index (with its entries).
enum Parsed {
    Image { config: ImageDigest },
    Index { entries: Vec<IndexEntryJson> },
}

fn bad(what: &str, why: impl fmt::Display) -> RegistryError {
    RegistryError::BadManifest(format!("the manifest of {what} {why}"))
}

fn digest_of(what: &str, field: &str, value: &str) -> Result<ImageDigest, RegistryError> {
    ImageDigest::parse(value).map_err(|_| {
        bad(
            what,
            format_args!("has a {field} that is not a sha256 digest"),
        )
    })
}

fn parse(what: &str, fetched: &Fetched) -> Result<Parsed, RegistryError> {
    let json: ManifestJson = serde_json::from_slice(&fetched.body)
        .map_err(|e| bad(what, format_args!("is not JSON: {e}")))?;
    let media_type = json
        .media_type
        .clone()
        .or_else(|| fetched.media_type.clone())
        .unwrap_or_default();
    let is_index = match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        // OCI allows an absent mediaType; go by the shape then.
        _ if json.manifests.is_some() => true,
        _ if json.config.is_some() => false,
        other => {
            return Err(bad(
                what,
                format_args!(
                    "has the unsupported media type `{other}` (schema 1 manifests are not supported)"
                ),
            ));
        }
    };
    if is_index {
        let entries = json
            .manifests
            .ok_or_else(|| bad(what, "is an index without manifests"))?;
        Ok(Parsed::Index { entries })
    } else {
        let config = json.config.ok_or_else(|| bad(what, "has no config"))?;
        Ok(Parsed::Image {
            config: digest_of(what, "config digest", &config.digest)?,
        })
    }
}

/// Whether an index entry is a runnable image (not a build attestation or signature).
fn is_image(entry: &IndexEntryJson) -> bool {
    let attestation = entry.annotations.contains_key("vnd.docker.reference.type");
    let unknown = entry
        .platform
        .as_ref()
        .is_some_and(|p| p.os == "unknown" || p.architecture == "unknown");
    !attestation && !unknown
}

/// What `image` resolves to now: the manifest (or index) it points at, fetched and checked.
pub async fn resolve(
    client: &RegistryClient,
    image: &ImageRef,
    platform: &Platform,
    auth: &AuthConfig,
) -> Result<ResolvedImage, RegistryError> {
    let reference = image.reference();
    let fetched = client.get_manifest(image, &reference, auth).await?;
    let what = image.to_string();
    let mut accepted = vec![fetched.digest.clone()];
    let image_id = match parse(&what, &fetched)? {
        Parsed::Image { config } => {
            accepted.push(config.clone());
            Some(config)
        }
        Parsed::Index { entries } => {
            let images: Vec<&IndexEntryJson> = entries.iter().filter(|e| is_image(e)).collect();
            if images.is_empty() {
                return Err(bad(&what, "is an index with no image for any platform"));
            }
            if images.len() > MAX_PLATFORMS {
                return Err(bad(
                    &what,
                    format_args!("lists more than {MAX_PLATFORMS} images"),
                ));
            }
            let mut ours = None;
            for entry in images {
                let entry_what =
                    format!("{}/{}@{}", image.registry, image.repository, entry.digest);
                if matches!(entry.media_type.as_deref(), Some(OCI_INDEX | DOCKER_LIST)) {
                    return Err(bad(
                        &entry_what,
                        "is a nested index, which is not supported",
                    ));
                }
                let digest = digest_of(&what, "manifest digest", &entry.digest)?;
                let platform_manifest = client.get_manifest(image, digest.as_str(), auth).await?;
                let Parsed::Image { config } = parse(&entry_what, &platform_manifest)? else {
                    return Err(bad(
                        &entry_what,
                        "is a nested index, which is not supported",
                    ));
                };
                let mine = entry.platform.as_ref().is_some_and(|p| platform.matches(p));
                if mine && ours.is_none() {
                    ours = Some(config.clone());
                }
                accepted.push(digest);
                accepted.push(config);
            }
            ours
        }
    };
    accepted.sort();
    accepted.dedup();
    Ok(ResolvedImage {
        digest: fetched.digest,
        image_id,
        accepted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetched(body: &str, media_type: Option<&str>) -> Fetched {
        Fetched {
            digest: super::super::client::sha256_digest(body.as_bytes()),
            media_type: media_type.map(str::to_string),
            body: body.as_bytes().to_vec(),
        }
    }

    const C: &str = "sha256:0fe3c799a0f15af08aae8de219301ea0d02ec887bd9ff650cda30239a4aa6982";

    #[test]
    fn platforms_parse_and_match() {
        assert_eq!(Platform::parse("linux/amd64").unwrap(), Platform::default());
        let arm = Platform::parse("linux/arm64/v8").unwrap();
        assert_eq!(arm.to_string(), "linux/arm64/v8");
        for bad in ["linux", "linux/", "/amd64", "a/b/c/d", "linux/amd 64"] {
            assert!(Platform::parse(bad).is_err(), "{bad}");
        }
        let entry = |os: &str, arch: &str, variant: Option<&str>| PlatformJson {
            os: os.into(),
            architecture: arch.into(),
            variant: variant.map(str::to_string),
        };
        let arm64 = Platform::parse("linux/arm64").unwrap();
        assert!(arm64.matches(&entry("linux", "arm64", Some("v8"))));
        assert!(arm64.matches(&entry("linux", "arm64", None)));
        assert!(!arm64.matches(&entry("linux", "amd64", None)));
        assert!(arm.matches(&entry("linux", "arm64", Some("v8"))));
        assert!(!arm.matches(&entry("linux", "arm64", None)));
    }

    #[test]
    fn manifests_are_told_apart_by_media_type_or_shape() {
        let image = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"digest":"{C}"}},"layers":[]}}"#
        );
        assert!(
            matches!(parse("x", &fetched(&image, None)).unwrap(), Parsed::Image { config } if config.as_str() == C)
        );
        // No mediaType in the body: the Content-Type, or the shape, decides.
        let bare = format!(r#"{{"schemaVersion":2,"config":{{"digest":"{C}"}}}}"#);
        assert!(matches!(
            parse("x", &fetched(&bare, Some(DOCKER_MANIFEST))).unwrap(),
            Parsed::Image { .. }
        ));
        assert!(matches!(
            parse("x", &fetched(&bare, None)).unwrap(),
            Parsed::Image { .. }
        ));
        let index = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"digest":"{C}","platform":{{"os":"linux","architecture":"amd64"}}}}]}}"#
        );
        assert!(
            matches!(parse("x", &fetched(&index, Some(OCI_INDEX))).unwrap(), Parsed::Index { entries } if entries.len() == 1)
        );
        let schema1 = r#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#;
        let err = parse(
            "x",
            &fetched(
                schema1,
                Some("application/vnd.docker.distribution.manifest.v1+prettyjws"),
            ),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("schema 1"), "{err}");
        let bad_config = r#"{"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"digest":"sha256:abc"}}"#;
        assert!(parse("x", &fetched(bad_config, None)).is_err());
        assert!(parse("x", &fetched("not json", None)).is_err());
    }

    #[test]
    fn attestation_entries_are_not_images() {
        let entry = |platform: &str, annotated: bool| IndexEntryJson {
            digest: C.into(),
            media_type: None,
            platform: Some(PlatformJson {
                os: platform.split('/').next().unwrap().into(),
                architecture: platform.split('/').nth(1).unwrap().into(),
                variant: None,
            }),
            annotations: if annotated {
                [(
                    "vnd.docker.reference.type".to_string(),
                    "attestation-manifest".to_string(),
                )]
                .into_iter()
                .collect()
            } else {
                BTreeMap::new()
            },
        };
        assert!(is_image(&entry("linux/amd64", false)));
        assert!(!is_image(&entry("unknown/unknown", false)));
        assert!(!is_image(&entry("linux/amd64", true)));
    }
}
