//! Bearer secrets: generation, hashing for storage, and constant-time comparison.
//!
//! Registration and lease tokens are stored only as SHA-256 hashes: they are 256-bit random
//! values, so a plain hash is enough and keeps lookups cheap. Admin and forge secrets are
//! compared in constant time.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A fresh random token with a recognisable prefix (`lgr_` registration, `lgl_` lease, …).
pub fn generate_token(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Constant-time equality of a presented secret and the configured one.
pub fn secret_matches(presented: &str, expected: &str) -> bool {
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    bool::from(a.ct_eq(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_prefixed() {
        let a = generate_token("lgl_");
        assert!(a.starts_with("lgl_"));
        assert_ne!(a, generate_token("lgl_"));
        assert_eq!(hash_token(&a).len(), 64);
        assert!(secret_matches(&a, &a.clone()));
        assert!(!secret_matches(&a, "lgl_other"));
    }
}
