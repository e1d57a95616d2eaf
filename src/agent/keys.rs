//! A runner's Ed25519 key: generation, its public JWK, and signing attestations with it.
//!
//! The private key never leaves the runner; the service only ever sees the JWK's `x`.

use crate::verifier::ATTESTATION_TYP;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::{EncodePrivateKey, spki::der::pem::LineEnding};

/// A runner's key pair.
pub struct RunnerKey {
    signing: SigningKey,
}

impl RunnerKey {
    pub fn generate() -> Self {
        Self::from_signing_key(SigningKey::generate(&mut rand::rngs::OsRng))
    }

    pub fn from_signing_key(signing: SigningKey) -> Self {
        RunnerKey { signing }
    }

    /// The key as a PKCS#8 PEM document, for the runner's key file.
    pub fn to_pkcs8_pem(&self) -> String {
        self.signing
            .to_pkcs8_pem(LineEnding::LF)
            .expect("an Ed25519 key always encodes as PKCS#8")
            .to_string()
    }

    pub fn from_pkcs8_pem(pem: &str) -> Result<Self, String> {
        use ed25519_dalek::pkcs8::DecodePrivateKey;
        SigningKey::from_pkcs8_pem(pem)
            .map(Self::from_signing_key)
            .map_err(|e| format!("not an Ed25519 PKCS#8 private key: {e}"))
    }

    /// `x` of the public JWK: base64url of the 32 public key bytes.
    pub fn public_x(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.signing.verifying_key().as_bytes())
    }

    /// The public key as a JWK (`kty` OKP, `crv` Ed25519), as registration expects it.
    pub fn public_jwk(&self) -> serde_json::Value {
        serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": self.public_x()})
    }

    /// Signs `claims` as an attestation of runner `kid`.
    pub fn sign_attestation(&self, kid: &str, claims: &serde_json::Value) -> String {
        crate::jwt::eddsa(&self.signing, ATTESTATION_TYP, kid, claims)
    }
}
