//! Rules 1–4 of PROTOCOL.md: is this compact JWS a well-formed, fresh attestation signed by
//! the runner it names?
//!
//! The header is checked by hand before any key is touched (`alg` exactly `EdDSA`, `typ`
//! exactly `leasegate-attestation+jwt`, a `kid`), so that no header can choose the algorithm
//! or the key. The signature is checked with `jsonwebtoken`'s EdDSA verifier over the exact
//! bytes received; the claims are then parsed strictly by `domain::attestation`.

use crate::domain::attestation::{Attestation, AttestationRules, ClaimsError, check_claims};
use crate::domain::ids::RunnerId;
use crate::domain::json_object::parse_object;
use crate::domain::time::Millis;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey};

/// The only `typ` an attestation may carry.
pub const ATTESTATION_TYP: &str = "leasegate-attestation+jwt";

/// The one answer for every failure of rules 1–2, so that runner ids cannot be probed.
pub const INVALID_SIGNATURE_DETAIL: &str =
    "the attestation is not a valid EdDSA JWS from a registered runner";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// Rules 1–3: 401 `attestation_invalid`.
    #[error("{0}")]
    Invalid(String),
    /// Rule 4: 401 `attestation_expired`.
    #[error("{0}")]
    Expired(String),
    /// A `kid` or a claim that holds a control character: 400, before it is looked up.
    #[error(transparent)]
    BadText(#[from] crate::domain::text::BadText),
}

impl From<ClaimsError> for VerifyError {
    fn from(e: ClaimsError) -> Self {
        match e {
            ClaimsError::Invalid(m) => VerifyError::Invalid(m),
            ClaimsError::Expired(m) => VerifyError::Expired(m),
            ClaimsError::BadText(t) => VerifyError::BadText(t),
        }
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

impl Unverified<'_> {
    /// Rules 2–4 with the key registered for `kid` (`x` of its Ed25519 JWK).
    pub fn verify(
        &self,
        public_key_x: &str,
        rules: &AttestationRules,
        now: Millis,
    ) -> Result<Attestation, VerifyError> {
        let key = DecodingKey::from_ed_components(public_key_x).map_err(|_| invalid())?;
        if key.as_bytes().len() != 32 {
            return Err(invalid());
        }
        let ok = jsonwebtoken::crypto::verify(
            self.signature_b64,
            self.signing_input.as_bytes(),
            &key,
            Algorithm::EdDSA,
        )
        .map_err(|_| invalid())?;
        if !ok {
            return Err(invalid());
        }
        let payload = URL_SAFE_NO_PAD
            .decode(self.payload_b64)
            .map_err(|_| VerifyError::Invalid("the JWS payload is not base64url".into()))?;
        Ok(check_claims(&payload, &self.kid, rules, now)?)
    }
}
