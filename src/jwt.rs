//! Signing JWTs, the two kinds leasegate writes: a runner's attestations (EdDSA over Ed25519,
//! `agent::keys`) and a GitHub App's token (RS256, `github`). A token is the JWS compact
//! serialization (RFC 7515, §7.1): base64url of the header's JSON, of the claims' JSON, and of
//! the signature over the first two, joined by dots; the signatures are `ed25519-dalek`'s and
//! `rsa`'s. Reading tokens is `verifier`'s and `domain::attestation`'s.
//!
//! Why not `jsonwebtoken`: its crypto is a process-wide provider, and its one backend without
//! C (`rust_crypto`) brings every family it knows, two elliptic curves and their crates among
//! them, which nothing here signs with and a cold release build paid for (docs/BENCHMARKS.md,
//! "Build time"). A provider of our own would be process-wide too, and would take the place of
//! the backend the tests decode with. So the tests check every token this module writes with
//! `jsonwebtoken`'s own decoder and backend, an implementation independent of this one.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rsa::signature::{RandomizedSigner, SignatureEncoding, Signer};
use serde::Serialize;

/// An RS256 signing key: RSASSA-PKCS1-v1_5 with SHA-256.
pub type Rs256Key = rsa::pkcs1v15::SigningKey<sha2::Sha256>;

/// The JOSE header of the tokens written here: the algorithm, the type and the key's id.
#[derive(Serialize)]
struct Header<'a> {
    alg: &'static str,
    typ: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    kid: Option<&'a str>,
}

/// An EdDSA token of type `typ` for key `kid`.
pub fn eddsa<T: Serialize>(
    key: &ed25519_dalek::SigningKey,
    typ: &str,
    kid: &str,
    claims: &T,
) -> String {
    let input = signing_input(
        &Header {
            alg: "EdDSA",
            typ,
            kid: Some(kid),
        },
        claims,
    );
    let signature = key.sign(input.as_bytes()).to_bytes();
    joined(input, &signature)
}

/// An RS256 token of type `JWT`, without a key id (GitHub's App tokens).
pub fn rs256<T: Serialize>(key: &Rs256Key, claims: &T) -> Result<String, rsa::signature::Error> {
    let input = signing_input(
        &Header {
            alg: "RS256",
            typ: "JWT",
            kid: None,
        },
        claims,
    );
    // The signature is deterministic; the random source only blinds the private-key operation
    // against timing.
    let signature = key.try_sign_with_rng(&mut rand::thread_rng(), input.as_bytes())?;
    Ok(joined(input, &signature.to_vec()))
}

fn signing_input<T: Serialize>(header: &Header, claims: &T) -> String {
    // Both serialize infallibly: string fields, and claims built here as structs or JSON values.
    let header = serde_json::to_vec(header).expect("a header serializes");
    let claims = serde_json::to_vec(claims).expect("claims serialize");
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    )
}

fn joined(mut input: String, signature: &[u8]) -> String {
    input.push('.');
    URL_SAFE_NO_PAD.encode_string(signature, &mut input);
    input
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
    use rsa::pkcs1::EncodeRsaPublicKey;
    use serde_json::{Value, json};

    /// What `jsonwebtoken` reads back, its signature checked with `key`.
    fn read(token: &str, algorithm: Algorithm, key: &DecodingKey) -> (jsonwebtoken::Header, Value) {
        let mut validation = Validation::new(algorithm);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        let data = decode::<Value>(token, key, &validation).expect("jsonwebtoken accepts it");
        (data.header, data.claims)
    }

    #[test]
    fn an_eddsa_token_is_what_jsonwebtoken_verifies() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let claims = json!({"iss": "r1", "sub": "r1", "probe": {"ok": true}});
        let token = eddsa(&key, "lease-attestation+jwt", "r1", &claims);
        let decoding = DecodingKey::from_ed_der(key.verifying_key().as_bytes());
        let (header, read_claims) = read(&token, Algorithm::EdDSA, &decoding);
        assert_eq!(header.alg, Algorithm::EdDSA);
        assert_eq!(header.typ.as_deref(), Some("lease-attestation+jwt"));
        assert_eq!(header.kid.as_deref(), Some("r1"));
        assert_eq!(read_claims, claims);

        let other = ed25519_dalek::SigningKey::from_bytes(&[8; 32]).verifying_key();
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.required_spec_claims.clear();
        let wrong = DecodingKey::from_ed_der(other.as_bytes());
        assert!(decode::<Value>(&token, &wrong, &validation).is_err());
    }

    #[test]
    fn an_rs256_token_is_what_jsonwebtoken_verifies() {
        let private = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).unwrap();
        let public = private.to_public_key().to_pkcs1_der().unwrap();
        let claims = json!({"iat": 1, "exp": 600, "iss": "42"});
        let token = rs256(&Rs256Key::new(private), &claims).unwrap();
        let (header, read_claims) = read(
            &token,
            Algorithm::RS256,
            &DecodingKey::from_rsa_der(public.as_bytes()),
        );
        assert_eq!(header.alg, Algorithm::RS256);
        assert_eq!(header.typ.as_deref(), Some("JWT"));
        assert_eq!(header.kid, None);
        assert_eq!(read_claims, claims);
    }

    #[test]
    fn the_header_names_only_the_algorithm_the_type_and_the_key() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let token = eddsa(&key, "t", "k", &json!({}));
        let header = decode_header(&token).unwrap();
        let raw: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(token.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(raw, json!({"alg": "EdDSA", "typ": "t", "kid": "k"}));
        assert_eq!(header.kid.as_deref(), Some("k"));
    }
}
