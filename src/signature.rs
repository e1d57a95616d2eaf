//! Ed25519 signatures as the gate checks them: one at a time (`Signed::holds`), or many at
//! once (`which_hold`), with one rule for both.
//!
//! The rule is RFC 8032 §5.1.7's, with its cofactored group equation: a signature `(R, S)` of
//! message `M` by key `A` holds when `S` is canonical (below the group order `L`), `R` is the
//! canonical encoding of a point not of small order, `A` is not of small order (a weak key:
//! `KeyPoint::new` refuses it once, when the key is read), and `[8][S]B = [8]R + [8][k]A`
//! with `k = SHA-512(R ‖ A ‖ M)`. It accepts everything `ed25519-dalek`'s `verify_strict`
//! accepts (which checks the same things with the cofactorless equation), and besides only
//! signatures whose `R` carries a small-order component, which nobody but the key's holder
//! can make: no one else's forgery, and an attestation's `jti` is single-use whatever its
//! signature's encoding.
//!
//! Why cofactored: a batch is checked as one random linear combination of its equations, a
//! single multiscalar multiplication that costs about 0.6 of what its signatures cost one
//! by one from eight of them up (docs/BENCHMARKS.md). With the cofactorless equation, whether
//! such a holder-made signature passed would depend on the batch it fell into and on the
//! random coefficients; with the cofactored one on both sides a signature holds alone exactly
//! when it holds in any batch (but with probability 2^-128 over the coefficients), so an
//! answer never depends on load ("Taming the many EdDSAs", Chalkias et al., 2020; Zcash's
//! ZIP 215 settled on the same).

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::{IsIdentity, VartimeMultiscalarMul};
use ed25519_dalek::VerifyingKey;
use rand::Rng;
use sha2::{Digest, Sha512};

/// A runner's key as the checks use it: its encoding (hashed into every `k`) and its point,
/// negated once here rather than in every check. Never a weak key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPoint {
    encoding: [u8; 32],
    negated: EdwardsPoint,
}

impl KeyPoint {
    /// `None` for a weak (small-order) key, for which every signature would be refused.
    pub fn new(key: &VerifyingKey) -> Option<Self> {
        (!key.is_weak()).then(|| KeyPoint {
            encoding: key.to_bytes(),
            negated: -key.to_edwards(),
        })
    }
}

/// A signature read and its hash taken, ready for its equation: the part of a check that is
/// each signature's own, done where the request is handled.
#[derive(Clone, Copy, Debug)]
pub struct Signed {
    r_encoding: [u8; 32],
    s: Scalar,
    k: Scalar,
    negated_key: EdwardsPoint,
}

/// Reads `signature` over `message` for `key`: `None` when it cannot hold whatever the
/// equation says (a non-canonical `S`, or an `R` whose `y` is not canonical).
pub fn read(key: &KeyPoint, message: &[u8], signature: &[u8; 64]) -> Option<Signed> {
    let r_encoding: [u8; 32] = signature[..32].try_into().expect("64 bytes hold 32");
    let s = Option::<Scalar>::from(Scalar::from_canonical_bytes(
        signature[32..].try_into().expect("64 bytes hold 32"),
    ))?;
    if !canonical_y(&r_encoding) {
        return None;
    }
    let k = Scalar::from_hash(
        Sha512::new()
            .chain_update(r_encoding)
            .chain_update(key.encoding)
            .chain_update(message),
    );
    Some(Signed {
        r_encoding,
        s,
        k,
        negated_key: key.negated,
    })
}

/// Whether an encoding's `y` (its low 255 bits) is below `p = 2^255 − 19`: the field element's
/// one encoding. The sign bit is the other half of canonical, and its one non-canonical use
/// (set where `x = 0`) is on the points `y = ±1`, both of small order and refused as such.
fn canonical_y(encoding: &[u8; 32]) -> bool {
    // `y ≥ p` only when bits 5..255 are all ones and the low byte is at least 0xed.
    let high_all_ones = encoding[31] & 0x7f == 0x7f && encoding[1..31].iter().all(|b| *b == 0xff);
    !(high_all_ones && encoding[0] >= 0xed)
}

/// The canonical encodings of the eight points of small order (the identity among them).
fn small_order_encodings() -> &'static [[u8; 32]; 8] {
    static ENCODINGS: std::sync::LazyLock<[[u8; 32]; 8]> = std::sync::LazyLock::new(|| {
        curve25519_dalek::constants::EIGHT_TORSION.map(|point| point.compress().to_bytes())
    });
    &ENCODINGS
}

impl Signed {
    /// The equation alone. `R' = [S]B − [k]A` is computed; when its encoding is `R`'s, the
    /// equation holds without the cofactor and `R` is a point, canonically encoded, of small
    /// order exactly when it is one of the eight small-order encodings (the common case costs
    /// what `verify` costs: no square root for `R`). Otherwise only an `R` with a small-order
    /// part can hold: `[8](R' − R)` is the identity.
    pub fn holds(&self) -> bool {
        let recomputed =
            EdwardsPoint::vartime_double_scalar_mul_basepoint(&self.k, &self.negated_key, &self.s);
        if recomputed.compress().0 == self.r_encoding {
            return !small_order_encodings().contains(&self.r_encoding);
        }
        self.r()
            .is_some_and(|r| (recomputed - r).mul_by_cofactor().is_identity())
    }

    /// `R` as a point, when it is one and not of small order (a batch needs it as a point).
    fn r(&self) -> Option<EdwardsPoint> {
        CompressedEdwardsY(self.r_encoding)
            .decompress()
            .filter(|r| !r.is_small_order())
    }
}

/// Below this, a batch costs more than its signatures one by one (docs/BENCHMARKS.md).
const SMALLEST_BATCH: usize = 3;

/// What checking a batch found.
#[derive(Debug, PartialEq, Eq)]
pub struct Checked {
    /// Whether each signature holds, in the batch's order.
    pub held: Vec<bool>,
    /// Whether the batch's equation was computed and failed, so that its members were checked
    /// again one by one: the work a bad signature costs the batch it falls into.
    pub batch_failed: bool,
}

/// Which of `batch` hold: all of them at the price of one multiscalar multiplication when they
/// do, and each checked by itself when any does not, so that one bad signature costs its batch
/// about half again, never a wrong answer. One whose `R` is no point, or of small order,
/// fails by itself and does not spoil the others' batch.
pub fn which_hold(batch: &[Signed]) -> Checked {
    if batch.len() < SMALLEST_BATCH {
        return Checked {
            held: batch.iter().map(Signed::holds).collect(),
            batch_failed: false,
        };
    }
    let points: Vec<Option<EdwardsPoint>> = batch.iter().map(Signed::r).collect();
    let members: Vec<(&Signed, EdwardsPoint)> = batch
        .iter()
        .zip(&points)
        .filter_map(|(signed, r)| r.map(|r| (signed, r)))
        .collect();
    if all_hold(&members, &mut rand::thread_rng()) {
        return Checked {
            held: points.iter().map(Option::is_some).collect(),
            batch_failed: false,
        };
    }
    // Whatever the equation says, an `R` with no point fails: only the members are checked
    // again.
    let held = batch
        .iter()
        .zip(&points)
        .map(|(signed, r)| r.is_some() && signed.holds())
        .collect();
    Checked {
        held,
        batch_failed: true,
    }
}

/// `Σ zᵢ([8]([Sᵢ]B − [kᵢ]Aᵢ − Rᵢ))` is the identity for random 128-bit `zᵢ`, which, when any
/// one equation fails, happens with probability 2^-128: the coefficients are drawn after the
/// signatures are fixed and are never seen by whoever made them.
fn all_hold(batch: &[(&Signed, EdwardsPoint)], rng: &mut impl Rng) -> bool {
    let z: Vec<Scalar> = batch
        .iter()
        .map(|_| Scalar::from(rng.r#gen::<u128>()))
        .collect();
    let b = batch
        .iter()
        .zip(&z)
        .map(|((signed, _), z)| z * signed.s)
        .sum::<Scalar>();
    let scalars = std::iter::once(b)
        .chain(z.iter().map(|z| -z))
        .chain(batch.iter().zip(&z).map(|((signed, _), z)| z * signed.k));
    let points = std::iter::once(ED25519_BASEPOINT_POINT)
        .chain(batch.iter().map(|(_, r)| *r))
        .chain(batch.iter().map(|(signed, _)| signed.negated_key));
    EdwardsPoint::vartime_multiscalar_mul(scalars, points)
        .mul_by_cofactor()
        .is_identity()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Signer, SigningKey};

    const P: [u8; 32] = {
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        p
    };

    #[test]
    fn an_encoding_is_canonical_exactly_when_its_y_is_below_p() {
        let mut below = P;
        below[0] = 0xec;
        assert!(canonical_y(&below));
        for low in 0xed..=0xff {
            let mut at_or_above = P;
            at_or_above[0] = low;
            assert!(!canonical_y(&at_or_above), "{low:#x}");
            // The sign bit is not part of y.
            at_or_above[31] |= 0x80;
            assert!(!canonical_y(&at_or_above));
        }
        let mut lower_high = P;
        lower_high[30] = 0xfe;
        assert!(canonical_y(&lower_high));
        assert!(canonical_y(&[0; 32]));
    }

    proptest::proptest! {
        /// On every 32 bytes that are a point, canonical means what dalek's round trip says.
        #[test]
        fn canonical_y_agrees_with_the_round_trip(
            bytes in proptest::array::uniform32(proptest::prelude::any::<u8>()),
            near_p in 0u8..=0xff,
        ) {
            let mut close = P;
            close[0] = near_p;
            for encoding in [bytes, close] {
                if let Some(point) = CompressedEdwardsY(encoding).decompress()
                    && !point.is_small_order()
                {
                    proptest::prop_assert_eq!(
                        canonical_y(&encoding),
                        point.compress().to_bytes() == encoding
                    );
                }
            }
        }
    }

    fn signed(seed: u8, message: &[u8]) -> (KeyPoint, [u8; 64]) {
        let signing = SigningKey::from_bytes(&[seed; 32]);
        let key = KeyPoint::new(&signing.verifying_key()).unwrap();
        (key, signing.sign(message).to_bytes())
    }

    fn check(key: &KeyPoint, message: &[u8], signature: &[u8; 64]) -> bool {
        read(key, message, signature).is_some_and(|s| s.holds())
    }

    #[test]
    fn a_weak_key_has_no_point_to_check_with() {
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(KeyPoint::new(&VerifyingKey::from_bytes(&identity).unwrap()).is_none());
    }

    #[test]
    fn a_batch_with_one_bad_signature_finds_exactly_that_one() {
        let messages: Vec<Vec<u8>> = (0..9u8).map(|i| vec![i; 40]).collect();
        let mut batch: Vec<Signed> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let (key, signature) = signed(i as u8 + 1, m);
                read(&key, m, &signature).unwrap()
            })
            .collect();
        assert_eq!(
            which_hold(&batch),
            Checked {
                held: vec![true; 9],
                batch_failed: false
            }
        );
        // Signature 4 over message 5: a sound signature, of another message.
        let (key, signature) = signed(5, &messages[4]);
        batch[4] = read(&key, &messages[5], &signature).unwrap();
        let checked = which_hold(&batch);
        assert!(checked.batch_failed);
        let held = checked.held;
        assert_eq!(held.iter().filter(|h| !**h).count(), 1);
        assert!(!held[4]);
    }

    #[test]
    fn a_signature_whose_r_is_no_point_or_of_small_order_fails_alone_in_its_batch() {
        let sound: Vec<(KeyPoint, [u8; 64])> = (1..=4u8).map(|i| signed(i, b"msg")).collect();
        let mut small_r = sound[1].1;
        small_r[..32].copy_from_slice(small_order_encodings()[3].as_slice());
        // y = 1 with the sign bit set: x = 0 read with a sign, the identity once decompressed.
        let mut signed_identity = sound[2].1;
        signed_identity[..32].copy_from_slice(&[0; 32]);
        signed_identity[0] = 1;
        signed_identity[31] = 0x80;
        // y = 2 is on no point of the curve.
        let mut no_point = sound[3].1;
        no_point[..32].copy_from_slice(&[0; 32]);
        no_point[0] = 2;
        assert!(
            CompressedEdwardsY(no_point[..32].try_into().unwrap())
                .decompress()
                .is_none()
        );
        let batch: Vec<Signed> = [
            (&sound[0].0, sound[0].1),
            (&sound[1].0, small_r),
            (&sound[2].0, signed_identity),
            (&sound[3].0, no_point),
            (&sound[1].0, sound[1].1),
            (&sound[2].0, sound[2].1),
        ]
        .iter()
        .map(|(key, signature)| read(key, b"msg", signature).unwrap())
        .collect();
        // No batch failed: the members' equation held.
        assert_eq!(
            which_hold(&batch),
            Checked {
                held: vec![true, false, false, false, true, true],
                batch_failed: false
            }
        );
        assert_eq!(
            batch.iter().map(Signed::holds).collect::<Vec<_>>(),
            [true, false, false, false, true, true]
        );
        // With a member that fails too, the batch fails and is checked again: the same answers.
        let (key, other) = signed(9, b"other");
        let mut failing = batch.clone();
        failing.push(read(&key, b"msg", &other).unwrap());
        assert_eq!(
            which_hold(&failing),
            Checked {
                held: vec![true, false, false, false, true, true, false],
                batch_failed: true
            }
        );
    }

    /// A signature whose `R` carries a small-order component `T`: `S = r + k·a` for
    /// `R = [r]B + T`, which only the key's holder can make. The cofactored equation holds;
    /// `verify_strict`'s cofactorless one does not (`[S]B − [k]A = R − T`).
    fn holder_made_mixed_r(
        seed: [u8; 32],
        message: &[u8],
        torsion: usize,
    ) -> (VerifyingKey, [u8; 64]) {
        use curve25519_dalek::constants::{ED25519_BASEPOINT_TABLE, EIGHT_TORSION};
        use curve25519_dalek::scalar::clamp_integer;
        let signing = SigningKey::from_bytes(&seed);
        let key = signing.verifying_key();
        let expanded = Sha512::digest(seed);
        let a = Scalar::from_bytes_mod_order(clamp_integer(expanded[..32].try_into().unwrap()));
        let nonce = Scalar::from_bytes_mod_order_wide(&Sha512::digest(message).into());
        let r = (ED25519_BASEPOINT_TABLE * &nonce + EIGHT_TORSION[torsion]).compress();
        let k = Scalar::from_hash(
            Sha512::new()
                .chain_update(r.as_bytes())
                .chain_update(key.as_bytes())
                .chain_update(message),
        );
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(r.as_bytes());
        signature[32..].copy_from_slice((nonce + k * a).as_bytes());
        (key, signature)
    }

    proptest::proptest! {
        /// Alone and in a batch of sound signatures, the check agrees with `verify_strict` on
        /// sound signatures, on every byte of them changed, on an `R` swapped for a point of
        /// small order; it accepts a holder-made `R` with a small-order part, which
        /// `verify_strict` refuses, and refuses it once any other byte changes.
        #[test]
        fn the_rule_is_verify_strict_but_for_holder_made_small_order_parts(
            seed in proptest::array::uniform32(proptest::prelude::any::<u8>()),
            message in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            position in 0usize..64,
            xor in 1u8..=255,
            torsion in 1usize..8,
        ) {
            let signing = SigningKey::from_bytes(&seed);
            let verifying = signing.verifying_key();
            let key = KeyPoint::new(&verifying).unwrap();
            let sound = signing.sign(&message).to_bytes();
            let mut changed = sound;
            changed[position] ^= xor;
            let mut small_r = sound;
            small_r[..32].copy_from_slice(
                curve25519_dalek::constants::EIGHT_TORSION[torsion].compress().as_bytes(),
            );
            let (_, mixed) = holder_made_mixed_r(seed, &message, torsion);
            let mut mixed_changed = mixed;
            mixed_changed[position] ^= xor;
            let others: Vec<Signed> = (0..4u8)
                .map(|i| {
                    let (k, s) = signed(i.wrapping_add(seed[0]), b"another");
                    read(&k, b"another", &s).unwrap()
                })
                .collect();
            for (signature, expected) in [
                (sound, Some(true)),
                (changed, None),
                (small_r, Some(false)),
                (mixed, Some(true)),
                (mixed_changed, Some(false)),
            ] {
                let strict = verifying
                    .verify_strict(&message, &Signature::from_bytes(&signature))
                    .is_ok();
                let alone = check(&key, &message, &signature);
                proptest::prop_assert_eq!(alone, expected.unwrap_or(strict));
                if signature != mixed {
                    proptest::prop_assert_eq!(alone, strict);
                }
                if let Some(read) = read(&key, &message, &signature) {
                    let mut batch = others.clone();
                    batch.insert(2, read);
                    let held = which_hold(&batch).held;
                    proptest::prop_assert_eq!(held[2], alone);
                    proptest::prop_assert!(held.iter().enumerate().all(|(i, h)| i == 2 || *h));
                } else {
                    proptest::prop_assert!(!alone);
                }
            }
            let mixed = Signature::from_bytes(&mixed);
            proptest::prop_assert!(verifying.verify_strict(&message, &mixed).is_err());
        }
    }
}
