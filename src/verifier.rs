//! Rules 1–4 of PROTOCOL.md: is this compact JWS a well-formed, fresh attestation signed by
//! the runner it names?
//!
//! The header is checked by hand before any key is touched (`alg` exactly `EdDSA`, `typ`
//! exactly `leasegate-attestation+jwt`, a `kid`, and no `crit` or `b64`: RFC 7515 §4.1.11
//! says to reject critical extensions one does not understand, and this service understands
//! none), so that no header can choose the algorithm, the key or the payload's encoding. The
//! signature is checked over the exact bytes received by `crate::signature`'s rule (RFC 8032's
//! cofactored equation; on SQLite the gate checks it in a batch of whatever arrives with it,
//! `crate::signature_batches`): it refuses a small-order (weak) key, a small-order `R` and a
//! non-canonical `S` as `ed25519-dalek`'s `verify_strict` does, where the plain Ed25519 check
//! (what JWT libraries call) lets a forged signature pass for a weak key.
//! The claims are then parsed strictly by `domain::attestation`. Not a JWT library's `decode`
//! with its validation: its defaults are not the protocol's (its own leeway, no `aud`, `iss` or
//! `sub` checked, no `jti` kept), and here every claim rule is `domain`'s, unit-tested there.
//! An unknown `kid` and a bad signature answer with the same detail, so runner ids cannot be
//! probed.
//!
//! The runner's key arrives decoded (`RunnerKey`): decompressing its point costs a good part
//! of a verification, so it is done once, when the runner's record enters the gate's cache,
//! and each attestation is checked straight with the decompressed point.

use crate::domain::attestation::{Attestation, AttestationRules, ClaimsError, check_claims};
use crate::domain::ids::RunnerId;
use crate::domain::json_object::parse_object;
use crate::domain::time::Millis;
use crate::signature::{KeyPoint, Signed};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::VerifyingKey;

/// The only `typ` an attestation may carry.
pub const ATTESTATION_TYP: &str = "leasegate-attestation+jwt";

/// The one answer for every failure of rules 1–2, so that runner ids cannot be probed.
pub const INVALID_SIGNATURE_DETAIL: &str =
    "the attestation is not a valid EdDSA JWS from a registered runner";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// Rules 1–2, before the runner's key has vouched for anything: 401
    /// `attestation_invalid`.
    #[error("{0}")]
    Invalid(String),
    /// Rules 3–4 on an attestation the runner's key signed: what the runner itself sent is
    /// wrong (a claim, its age, its clock), which the gate notes on the runner.
    #[error(transparent)]
    Claims(ClaimsError),
    /// A `kid` or a claim that holds a control character: 400, before it is looked up.
    #[error(transparent)]
    BadText(#[from] crate::domain::text::BadText),
}

impl From<ClaimsError> for VerifyError {
    fn from(e: ClaimsError) -> Self {
        VerifyError::Claims(e)
    }
}

fn invalid() -> VerifyError {
    VerifyError::Invalid(INVALID_SIGNATURE_DETAIL.into())
}

#[derive(serde::Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    typ: Option<String>,
    #[serde(default)]
    kid: Option<String>,
    /// Present at all: refused (no extension is understood here).
    #[serde(default)]
    crit: Option<serde_json::Value>,
    /// RFC 7797's unencoded payload, which would change what is signed: refused.
    #[serde(default)]
    b64: Option<serde_json::Value>,
}

/// A compact JWS split into its parts, header checked (rule 1 but for the runner lookup).
pub struct Unverified<'a> {
    pub kid: RunnerId,
    signing_input: &'a str,
    payload_b64: &'a str,
    signature_b64: &'a str,
}

/// Rule 1, the part that needs no key: shape, `alg`, `typ`, `kid`.
pub fn read_header(token: &str) -> Result<Unverified<'_>, VerifyError> {
    let mut parts = token.split('.');
    let (Some(header_b64), Some(payload_b64), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(VerifyError::Invalid(
            "the attestation is not a compact JWS".into(),
        ));
    };
    let header_json = URL_SAFE_NO_PAD
        .decode(header_b64)
        .map_err(|_| VerifyError::Invalid("the JWS header is not base64url".into()))?;
    let header: RawHeader = parse_object(&header_json)
        .map_err(|_| VerifyError::Invalid("the JWS header is not a JSON object with alg".into()))?;
    if header.alg != "EdDSA" {
        return Err(VerifyError::Invalid(format!(
            "alg must be EdDSA, not {:?}",
            header.alg
        )));
    }
    if header.typ.as_deref() != Some(ATTESTATION_TYP) {
        return Err(VerifyError::Invalid(format!(
            "typ must be {ATTESTATION_TYP}"
        )));
    }
    if header.crit.is_some() || header.b64.is_some() {
        return Err(VerifyError::Invalid(
            "the JWS header declares an extension (crit, b64), and none is understood here".into(),
        ));
    }
    let kid = header
        .kid
        .filter(|k| !k.is_empty() && k.len() <= 128)
        .ok_or_else(invalid)?;
    Ok(Unverified {
        kid: RunnerId::parse("kid", &kid)?,
        signing_input: &token[..header_b64.len() + 1 + payload_b64.len()],
        payload_b64,
        signature_b64,
    })
}

/// A registered key (`x` of its Ed25519 JWK), decoded: `None` when it is not a point.
pub fn runner_key(public_key_x: &str) -> Option<VerifyingKey> {
    let bytes: [u8; 32] = URL_SAFE_NO_PAD.decode(public_key_x).ok()?.try_into().ok()?;
    VerifyingKey::from_bytes(&bytes).ok()
}

/// A runner's registered key, decoded and its point decompressed once (`runner_key`). A key
/// that is not a point, or is weak, is kept as such: every signature is refused for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerKey(Option<KeyPoint>);

impl RunnerKey {
    pub fn parse(public_key_x: &str) -> Self {
        RunnerKey(runner_key(public_key_x).as_ref().and_then(KeyPoint::new))
    }
}

/// Rule 2's reading: `signature_b64` over `signing_input` for `key`, ready for its equation
/// (`crate::signature`); `None` when it cannot hold whatever the equation says.
fn read_signature(key: &RunnerKey, signing_input: &[u8], signature_b64: &str) -> Option<Signed> {
    let key = key.0.as_ref()?;
    let bytes = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .ok()
        .and_then(|b| <[u8; 64]>::try_from(b).ok())?;
    crate::signature::read(key, signing_input, &bytes)
}

impl Unverified<'_> {
    /// Rule 2's first half: the signature read for the key registered for `kid`, ready for
    /// its equation (which the gate checks in whatever batch it falls into:
    /// `crate::signature_batches`).
    pub fn signature(&self, key: &RunnerKey) -> Result<Signed, VerifyError> {
        read_signature(key, self.signing_input.as_bytes(), self.signature_b64).ok_or_else(invalid)
    }

    /// Rules 3–4, once the signature held.
    pub fn claims(
        &self,
        rules: &AttestationRules,
        now: Millis,
    ) -> Result<Attestation, VerifyError> {
        let payload = URL_SAFE_NO_PAD
            .decode(self.payload_b64)
            .map_err(|_| VerifyError::Invalid("the JWS payload is not base64url".into()))?;
        Ok(check_claims(&payload, &self.kid, rules, now)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};

    /// Rule 2 for one signature, as the gate checks it (alone or in a batch: the same rule).
    fn signature_valid(key: &VerifyingKey, signing_input: &[u8], signature_b64: &str) -> bool {
        read_signature(&RunnerKey(KeyPoint::new(key)), signing_input, signature_b64)
            .is_some_and(|signed| signed.holds())
    }

    const IDENTITY: [u8; 32] = {
        let mut b = [0u8; 32];
        b[0] = 1;
        b
    };

    #[test]
    fn a_forged_signature_never_passes_for_a_weak_key() {
        // Under the plain Ed25519 check the identity key accepts R = identity, S = 0 for any
        // message: the forgery an older registration could have let in.
        let key = VerifyingKey::from_bytes(&IDENTITY).unwrap();
        let mut forged = [0u8; 64];
        forged[..32].copy_from_slice(&IDENTITY);
        assert!(key.verify(b"msg", &Signature::from_bytes(&forged)).is_ok());
        assert!(!signature_valid(
            &key,
            b"msg",
            &URL_SAFE_NO_PAD.encode(forged)
        ));
    }

    /// A signature with `R` = the identity that the plain check accepts for a sound key:
    /// `S = k·a`, so `S·B − k·A` is the identity. Only a key's holder can make one (it needs
    /// the secret scalar), but strict verification refuses it, and so must the gate.
    fn identity_r_signature(seed: [u8; 32], message: &[u8]) -> (VerifyingKey, [u8; 64]) {
        use curve25519_dalek::scalar::{Scalar, clamp_integer};
        use sha2::{Digest, Sha512};
        let key = SigningKey::from_bytes(&seed).verifying_key();
        let expanded = Sha512::digest(seed);
        let a = Scalar::from_bytes_mod_order(clamp_integer(expanded[..32].try_into().unwrap()));
        let k = Scalar::from_bytes_mod_order_wide(
            &Sha512::new()
                .chain_update(IDENTITY)
                .chain_update(key.as_bytes())
                .chain_update(message)
                .finalize()
                .into(),
        );
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&IDENTITY);
        signature[32..].copy_from_slice((k * a).as_bytes());
        (key, signature)
    }

    #[test]
    fn a_small_order_r_is_refused_where_the_plain_check_accepts_it() {
        let (key, signature) = identity_r_signature([9u8; 32], b"msg");
        let signature_obj = Signature::from_bytes(&signature);
        assert!(key.verify(b"msg", &signature_obj).is_ok());
        assert!(key.verify_strict(b"msg", &signature_obj).is_err());
        assert!(!signature_valid(
            &key,
            b"msg",
            &URL_SAFE_NO_PAD.encode(signature)
        ));
    }

    #[test]
    fn a_non_canonical_s_is_refused_and_the_canonical_one_accepted() {
        let signing = SigningKey::from_bytes(&[7u8; 32]);
        let key = signing.verifying_key();
        let sig = signing.sign(b"msg").to_bytes();
        assert!(signature_valid(&key, b"msg", &URL_SAFE_NO_PAD.encode(sig)));
        // S + L: the same scalar, another encoding (the malleable form).
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut malleated = sig;
        let mut carry = 0u16;
        for i in 0..32 {
            let sum = u16::from(sig[32 + i]) + u16::from(L[i]) + carry;
            malleated[32 + i] = sum as u8;
            carry = sum >> 8;
        }
        assert_eq!(carry, 0);
        assert!(!signature_valid(
            &key,
            b"msg",
            &URL_SAFE_NO_PAD.encode(malleated)
        ));
        assert!(!signature_valid(
            &key,
            b"other",
            &URL_SAFE_NO_PAD.encode(sig)
        ));
    }
}
