//! Values the domain's tests build again and again: an image id from one repeated hex digit,
//! and a runner's latest attestation at an instant. Compiled for tests only.

use super::attestation::{Probe, RunningImage};
use super::digest::ImageDigest;
use super::runner::LatestAttestation;
use super::time::Millis;
use super::verdict::AttestedState;

/// The image id `sha256:` and 64 times `c`.
pub fn digest(c: char) -> ImageDigest {
    ImageDigest::parse(&format!("sha256:{}", c.to_string().repeat(64))).unwrap()
}

/// An attestation received and probed at `at`: podman, passing or failing ("crun not found"),
/// running the image `digest(image)` or reporting none.
pub fn attested(at: Millis, probe_ok: bool, image: Option<char>) -> LatestAttestation {
    LatestAttestation {
        received_at: at,
        state: AttestedState {
            probe: Probe {
                ok: probe_ok,
                runtime: "podman".into(),
                runtime_version: None,
                checked_at: at,
                error: (!probe_ok).then(|| "crun not found".into()),
                exit_code: None,
                disk: Vec::new(),
            },
            image: RunningImage {
                id: image.map(digest),
                digest: None,
                image_ref: None,
            },
            images: Vec::new(),
        },
    }
}
