//! The attestation's claims and rules 3 and 4 of PROTOCOL.md (shape and time).
//!
//! Rules 1 and 2 (header and signature) need the runner's key and live in `crate::verifier`;
//! rule 5 (replay) and rule 6 (revocation) need shared state and live in the store. What is
//! here is the pure part: given a signature-checked payload, the service's settings and `now`,
//! is this a well-formed, fresh attestation from this runner?

use super::digest::{ImageDigest, NotADigest};
use super::disk::{DiskFigure, MAX_DISKS};
use super::forge::{ForgeRunner, MAX_FORGE_RUNNERS};
use super::ids::RunnerId;
use super::images::{MAX_IMAGES, MAX_LABELS, MAX_REF_BYTES, ReportedEntry};
use super::json_object::{ObjectOnly, parse_object};
use super::text::{PROBE_ERROR_MAX_BYTES, sanitize, without_controls};
use super::time::Millis;
use serde::Deserialize;

/// The service settings that attestations are judged by.
#[derive(Clone, Debug)]
pub struct AttestationRules {
    pub audience: String,
    pub max_age_s: i64,
    pub max_lifetime_s: i64,
    pub clock_skew_s: i64,
}

/// A NumericDate: a JSON number of seconds. A string is a type error, never a date: a claim of
/// the wrong type skipped as if absent is the bug behind `jsonwebtoken`'s CVE-2026-25537.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NumericDate(pub f64);

impl<'de> Deserialize<'de> for NumericDate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if (0.0..1e12).contains(&v) {
            Ok(NumericDate(v))
        } else {
            Err(serde::de::Error::custom(
                "a NumericDate must be a non-negative number of seconds",
            ))
        }
    }
}

impl NumericDate {
    fn millis(self) -> Millis {
        Millis::from_numeric_date(self.0)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct RawProbe {
    ok: bool,
    runtime: String,
    #[serde(default)]
    runtime_version: Option<String>,
    checked_at: NumericDate,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    disk: Option<Vec<ObjectOnly<RawDisk>>>,
}

#[derive(Deserialize)]
struct RawDisk {
    path: String,
    #[serde(default)]
    role: Option<String>,
    free_bytes: u64,
    total_bytes: u64,
    free_inodes: u64,
    total_inodes: u64,
}

#[derive(Deserialize, Default)]
struct RawImage {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    digest: Option<String>,
    #[serde(default, rename = "ref")]
    image_ref: Option<String>,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "ref")]
    image_ref: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    labels: Vec<String>,
    #[serde(default)]
    absent: bool,
}

#[derive(Deserialize)]
struct RawClaims {
    iss: String,
    sub: String,
    aud: Audience,
    iat: NumericDate,
    exp: NumericDate,
    #[serde(default)]
    nbf: Option<NumericDate>,
    jti: String,
    probe: ObjectOnly<RawProbe>,
    #[serde(default)]
    image: Option<ObjectOnly<RawImage>>,
    #[serde(default)]
    images: Option<Vec<ObjectOnly<RawEntry>>>,
    #[serde(default)]
    agent: Option<serde_json::Value>,
    /// The runner's host name (optional; shown on the page).
    #[serde(default)]
    host: Option<String>,
    /// The forge runners on the machine, as the agent read them from their files (optional;
    /// the runner's bindings follow it).
    #[serde(default)]
    forge_runners: Option<Vec<serde_json::Value>>,
}

/// What the runner's container-runtime probe said.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub ok: bool,
    pub runtime: String,
    pub runtime_version: Option<String>,
    pub checked_at: Millis,
    /// The runtime's own words, cleaned (see `domain::text`); present when `ok` is false.
    pub error: Option<String>,
    pub exit_code: Option<i64>,
    /// The filesystems it measured (`probe.disk`), as sent but cleaned; empty when none.
    pub disk: Vec<DiskFigure>,
}

/// The image a runner says it runs, before the digests are checked.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ReportedImage {
    pub id: Option<String>,
    pub digest: Option<String>,
    pub image_ref: Option<String>,
}

/// The image a runner runs, with its digests checked.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RunningImage {
    pub id: Option<ImageDigest>,
    pub digest: Option<ImageDigest>,
    pub image_ref: Option<String>,
}

impl ReportedImage {
    /// The digests as digests: a short id or a tag is a bad request (checked after rule 6).
    pub fn check(self) -> Result<RunningImage, NotADigest> {
        Ok(RunningImage {
            id: self.id.as_deref().map(ImageDigest::parse).transpose()?,
            digest: self.digest.as_deref().map(ImageDigest::parse).transpose()?,
            image_ref: self.image_ref,
        })
    }
}

/// An attestation that passed rules 1–4: well formed, signed by its runner, fresh.
#[derive(Clone, Debug, PartialEq)]
pub struct Attestation {
    pub runner_id: RunnerId,
    pub jti: String,
    pub issued_at: Millis,
    pub expires_at: Millis,
    pub probe: Probe,
    pub image: ReportedImage,
    /// Every image it may run (`images`); empty when it attests one `image`.
    pub images: Vec<ReportedEntry>,
    pub agent: Option<serde_json::Value>,
    /// The forge runners the agent found on the machine, without repeats; `None` when the
    /// attestation says nothing of them (the bindings are left alone).
    pub forge_runners: Option<Vec<ForgeRunner>>,
}

impl Attestation {
    /// Until when this attestation's `jti` must be remembered: rule 4 accepts it until its
    /// `exp` plus the leeway, and no later than `max_age_s` after its `iat`.
    pub fn replay_window_end(&self, rules: &AttestationRules) -> Millis {
        self.expires_at
            .plus_secs(rules.clock_skew_s)
            .min(self.issued_at.plus_secs(rules.max_age_s))
    }
}

/// Why an attestation was rejected by rule 3 or rule 4.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimsError {
    /// Rule 3: a missing or mistyped claim, a mismatched identity or audience, a bad lifetime.
    #[error("{0}")]
    Invalid(String),
    /// Rule 4: expired, not yet valid, or older than the maximum age.
    #[error("{0}")]
    Expired(String),
    /// Rule 4, when the runner's clock explains it: its `iat` or `checked_at` is further from
    /// the server's clock than the leeway allows (ahead), or than the maximum age and the
    /// leeway together (behind). `offset_s` is the runner's time less the server's.
    #[error("{detail}")]
    ClockSkew { offset_s: i64, detail: String },
    /// An identifying claim (`jti`) holds a control character.
    #[error(transparent)]
    BadText(#[from] super::text::BadText),
}

/// A runner's instant `at` (its `iat` or its probe's `checked_at`) past the leeway ahead of
/// `now`.
fn clock_ahead(at: Millis, now: Millis, rules: &AttestationRules) -> ClaimsError {
    let ahead_s = (at.0 - now.0) / 1000;
    ClaimsError::ClockSkew {
        offset_s: ahead_s,
        detail: format!(
            "the runner's clock is {ahead_s} s ahead of the server's (leeway {} s)",
            rules.clock_skew_s
        ),
    }
}

/// Rules 3 and 4 on a payload whose signature was verified for runner `kid`.
pub fn check_claims(
    payload: &[u8],
    kid: &RunnerId,
    rules: &AttestationRules,
    now: Millis,
) -> Result<Attestation, ClaimsError> {
    let raw: RawClaims = parse_object(payload)
        .map_err(|e| ClaimsError::Invalid(format!("claim `{}`: {}", e.path, e.error)))?;
    let probe = raw.probe.0;
    let invalid = |m: &str| Err(ClaimsError::Invalid(m.to_string()));

    // Rule 3: shape and identity.
    if raw.iss != kid.as_str() || raw.sub != kid.as_str() {
        return invalid("iss and sub must both equal the kid");
    }
    let audience_ok = match &raw.aud {
        Audience::One(a) => *a == rules.audience,
        Audience::Many(list) => list.contains(&rules.audience),
    };
    if !audience_ok {
        return invalid("aud does not name this gatekeeper");
    }
    if !(16..=128).contains(&raw.jti.chars().count()) {
        return invalid("jti must be 16 to 128 characters");
    }
    without_controls("jti", &raw.jti)?;
    let (iat, exp) = (raw.iat.millis(), raw.exp.millis());
    if exp <= iat {
        return invalid("exp must be later than iat");
    }
    if exp.0 - iat.0 > rules.max_lifetime_s * 1000 {
        return Err(ClaimsError::Invalid(format!(
            "exp - iat exceeds the maximum lifetime of {} s",
            rules.max_lifetime_s
        )));
    }
    let leeway_end = now.plus_secs(rules.clock_skew_s);
    let checked_at = probe.checked_at.millis();
    if checked_at > leeway_end {
        return Err(clock_ahead(checked_at, now, rules));
    }
    if probe.runtime.trim().is_empty() {
        return invalid("probe.runtime must name the container runtime");
    }
    if !probe.ok && probe.error.as_deref().is_none_or(|e| e.trim().is_empty()) {
        return invalid("probe.error is required when probe.ok is false");
    }
    let images = checked_entries(raw.images.unwrap_or_default())?;
    if probe.disk.as_ref().is_some_and(|d| d.len() > MAX_DISKS) {
        return Err(ClaimsError::Invalid(format!(
            "probe.disk holds at most {MAX_DISKS} filesystems"
        )));
    }

    // Rule 4: time. A fresh attestation from a runner whose clock is off looks like an old
    // one or one from the future: say which clock is off, and by how much, before "expired".
    if iat > leeway_end {
        return Err(clock_ahead(iat, now, rules));
    }
    if now.0 - iat.0 > (rules.max_age_s + rules.clock_skew_s) * 1000 {
        let behind_s = (now.0 - iat.0) / 1000;
        return Err(ClaimsError::ClockSkew {
            offset_s: -behind_s,
            detail: format!(
                "the attestation was signed {behind_s} s ago by the runner's clock: the \
                 runner's clock is {behind_s} s behind the server's, or the attestation is old \
                 (max age {} s, leeway {} s)",
                rules.max_age_s, rules.clock_skew_s
            ),
        });
    }
    if now > exp.plus_secs(rules.clock_skew_s) {
        return Err(ClaimsError::Expired("the attestation has expired".into()));
    }
    if raw.nbf.is_some_and(|nbf| nbf.millis() > leeway_end) {
        return Err(ClaimsError::Expired(
            "the attestation is not valid yet (nbf)".into(),
        ));
    }
    if now.0 - iat.0 > rules.max_age_s * 1000 {
        return Err(ClaimsError::Expired(format!(
            "the attestation is older than {} s",
            rules.max_age_s
        )));
    }

    let forge_runners = raw.forge_runners.map(|c| forge_runners(&c)).transpose()?;
    let image = raw.image.map(|i| i.0).unwrap_or_default();
    Ok(Attestation {
        runner_id: kid.clone(),
        jti: raw.jti,
        issued_at: iat,
        expires_at: exp,
        probe: Probe {
            ok: probe.ok,
            runtime: sanitize(&probe.runtime, 64),
            runtime_version: probe.runtime_version.map(|v| sanitize(&v, 128)),
            checked_at,
            error: probe.error.map(|e| sanitize(&e, PROBE_ERROR_MAX_BYTES)),
            exit_code: probe.exit_code,
            disk: probe
                .disk
                .unwrap_or_default()
                .into_iter()
                .map(|d| {
                    let d = d.0;
                    DiskFigure {
                        path: sanitize(&d.path, 512),
                        role: d.role.map(|r| sanitize(&r, 32)),
                        free_bytes: d.free_bytes,
                        total_bytes: d.total_bytes,
                        free_inodes: d.free_inodes,
                        total_inodes: d.total_inodes,
                    }
                })
                .collect(),
        },
        image: ReportedImage {
            id: image.id,
            digest: image.digest,
            image_ref: image.image_ref.map(|r| sanitize(&r, 512)),
        },
        images,
        agent: with_host(raw.agent, raw.host.map(|h| sanitize(&h, HOST_MAX_BYTES))),
        forge_runners,
    })
}

/// The `forge_runners` claim: the binding objects the API takes, at most
/// `MAX_FORGE_RUNNERS`, an identity named twice counting once (the first).
fn forge_runners(claim: &[serde_json::Value]) -> Result<Vec<ForgeRunner>, ClaimsError> {
    if claim.len() > MAX_FORGE_RUNNERS {
        return Err(ClaimsError::Invalid(format!(
            "claim `forge_runners`: at most {MAX_FORGE_RUNNERS}"
        )));
    }
    let mut out: Vec<ForgeRunner> = Vec::with_capacity(claim.len());
    for (i, v) in claim.iter().enumerate() {
        let r = ForgeRunner::from_json(v)
            .map_err(|e| ClaimsError::Invalid(format!("claim `forge_runners[{i}]`: {e}")))?;
        if !out.iter().any(|o| o.identity == r.identity) {
            out.push(r);
        }
    }
    Ok(out)
}

/// Rule 3 for `images`: at most 32, each with a ref (no control characters: it is what the
/// pool's entry is found by) and an `id` unless it is `absent`, at most 32 labels each.
fn checked_entries(raw: Vec<ObjectOnly<RawEntry>>) -> Result<Vec<ReportedEntry>, ClaimsError> {
    if raw.len() > MAX_IMAGES {
        return Err(ClaimsError::Invalid(format!(
            "images holds at most {MAX_IMAGES} entries"
        )));
    }
    raw.into_iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e.0;
            let invalid = |m: String| Err(ClaimsError::Invalid(format!("images[{i}]: {m}")));
            if e.image_ref.trim().is_empty() || e.image_ref.len() > MAX_REF_BYTES {
                return invalid(format!("ref must be 1 to {MAX_REF_BYTES} bytes"));
            }
            without_controls("images[].ref", &e.image_ref)?;
            match (&e.id, e.absent) {
                (None, false) => return invalid("id is required unless absent is true".into()),
                (Some(_), true) => return invalid("an absent image has no id".into()),
                _ => {}
            }
            if e.labels.len() > MAX_LABELS {
                return invalid(format!("at most {MAX_LABELS} labels"));
            }
            Ok(ReportedEntry {
                image_ref: e.image_ref,
                id: e.id,
                digest: e.digest,
                labels: e.labels.iter().map(|l| sanitize(l, 128)).collect(),
                absent: e.absent,
            })
        })
        .collect()
}

/// The longest host name kept (a DNS name's limit).
pub const HOST_MAX_BYTES: usize = 253;

/// The `agent` object as recorded: what the runner sent, with its `host` claim beside its own
/// fields, so that the runner's record keeps one object of what it says it is.
fn with_host(agent: Option<serde_json::Value>, host: Option<String>) -> Option<serde_json::Value> {
    let Some(host) = host else { return agent };
    let mut object = match agent {
        Some(serde_json::Value::Object(o)) => o,
        _ => serde_json::Map::new(),
    };
    object.insert("host".into(), serde_json::Value::String(host));
    Some(serde_json::Value::Object(object))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW_S: i64 = 1_800_000_000;

    fn rules() -> AttestationRules {
        AttestationRules {
            audience: "leasegate".into(),
            max_age_s: 60,
            max_lifetime_s: 300,
            clock_skew_s: 30,
        }
    }

    fn claims() -> serde_json::Value {
        json!({
            "iss": "r1", "sub": "r1", "aud": "leasegate",
            "iat": NOW_S, "exp": NOW_S + 120, "jti": "0123456789abcdef",
            "probe": {"ok": true, "runtime": "podman", "checked_at": NOW_S - 5},
            "image": {"id": format!("sha256:{}", "a".repeat(64))}
        })
    }

    fn check(v: serde_json::Value) -> Result<Attestation, ClaimsError> {
        let now = Millis::from_secs(NOW_S);
        check_claims(
            &serde_json::to_vec(&v).unwrap(),
            &RunnerId("r1".into()),
            &rules(),
            now,
        )
    }

    fn with(path: &[&str], value: serde_json::Value) -> serde_json::Value {
        let mut c = claims();
        let mut slot = &mut c;
        for p in &path[..path.len() - 1] {
            slot = slot.get_mut(*p).unwrap();
        }
        let last = path[path.len() - 1];
        if value.is_null() {
            slot.as_object_mut().unwrap().remove(last);
        } else {
            slot[last] = value;
        }
        c
    }

    fn is_invalid(r: Result<Attestation, ClaimsError>) -> bool {
        matches!(r, Err(ClaimsError::Invalid(_)))
    }

    fn skew(r: Result<Attestation, ClaimsError>) -> Option<i64> {
        match r {
            Err(ClaimsError::ClockSkew { offset_s, .. }) => Some(offset_s),
            _ => None,
        }
    }

    fn is_expired(r: Result<Attestation, ClaimsError>) -> bool {
        matches!(r, Err(ClaimsError::Expired(_)))
    }

    #[test]
    fn a_good_attestation_passes() {
        let a = check(claims()).unwrap();
        assert_eq!(a.jti, "0123456789abcdef");
        assert!(a.probe.ok);
        assert_eq!(a.probe.checked_at, Millis::from_secs(NOW_S - 5));
    }

    #[test]
    fn the_forge_runners_claim_is_read_when_present_and_checked() {
        assert_eq!(check(claims()).unwrap().forge_runners, None);
        let sha = "b".repeat(64);
        let uuid = "0b9a7e3c-55a1-4d4a-9c9d-1e2f3a4b5c6d";
        let one = json!({"kind": "gitlab", "token_sha256": sha, "system_id": "s_0123456789ab"});
        let a = check(with(
            &["forge_runners"],
            json!([one, one, {"kind": "forgejo", "uuid": uuid, "token_sha256": sha}]),
        ))
        .unwrap();
        let found = a.forge_runners.unwrap();
        assert_eq!(found.len(), 2, "a repeat counts once");
        assert_eq!(
            found[0].identity.system_id.as_deref(),
            Some("s_0123456789ab")
        );
        assert_eq!(found[1].token_sha256.as_deref(), Some(sha.as_str()));
        // An empty claim is a claim: the machine has no forge runner.
        assert_eq!(
            check(with(&["forge_runners"], json!([])))
                .unwrap()
                .forge_runners,
            Some(vec![])
        );
        for bad in [
            json!({"kind": "forgejo"}),
            json!([{"kind": "gitlab", "token": "glrt-raw"}]),
            json!([{"kind": "gitlab", "token_sha256": sha, "system_id": ""}]),
            json!(vec![one.clone(); 65]),
        ] {
            assert!(is_invalid(check(with(&["forge_runners"], bad))));
        }
    }

    #[test]
    fn a_jti_is_remembered_while_rule_4_could_accept_its_attestation() {
        // exp + leeway is 150 s away, but 60 s after iat it is too old anyway.
        let a = check(claims()).unwrap();
        assert_eq!(a.replay_window_end(&rules()), Millis::from_secs(NOW_S + 60));
        // A short lifetime: exp + leeway comes first.
        let a = check(with(&["exp"], json!(NOW_S + 10))).unwrap();
        assert_eq!(a.replay_window_end(&rules()), Millis::from_secs(NOW_S + 40));
        for (age_s, ok) in [(60, true), (61, false)] {
            let later = check_claims(
                &serde_json::to_vec(&claims()).unwrap(),
                &RunnerId("r1".into()),
                &rules(),
                Millis::from_secs(NOW_S + age_s),
            );
            assert_eq!(later.is_ok(), ok, "{age_s} s after iat");
        }
    }

    #[test]
    fn audience_may_be_an_array_containing_ours() {
        assert!(check(with(&["aud"], json!(["other", "leasegate"]))).is_ok());
        assert!(is_invalid(check(with(&["aud"], json!(["other"])))));
        assert!(is_invalid(check(with(&["aud"], json!("other")))));
    }

    #[test]
    fn missing_or_mistyped_claims_are_invalid() {
        for claim in ["iss", "sub", "aud", "iat", "exp", "jti", "probe"] {
            assert!(
                is_invalid(check(with(&[claim], json!(null)))),
                "missing {claim}"
            );
        }
        assert!(is_invalid(check(with(
            &["exp"],
            json!((NOW_S + 60).to_string())
        ))));
        assert!(is_invalid(check(with(&["iat"], json!("now")))));
        assert!(is_invalid(check(with(&["nbf"], json!("0")))));
        assert!(is_invalid(check(with(&["probe", "ok"], json!("true")))));
        assert!(is_invalid(check(with(
            &["probe", "checked_at"],
            json!(null)
        ))));
    }

    #[test]
    fn identity_must_be_the_kid() {
        assert!(is_invalid(check(with(&["sub"], json!("r2")))));
        assert!(is_invalid(check(with(&["iss"], json!("r2")))));
    }

    #[test]
    fn jti_length_is_bounded() {
        assert!(is_invalid(check(with(&["jti"], json!("short")))));
        assert!(is_invalid(check(with(&["jti"], json!("x".repeat(129))))));
        assert!(check(with(&["jti"], json!("x".repeat(128)))).is_ok());
    }

    #[test]
    fn lifetime_is_capped() {
        assert!(is_invalid(check(with(&["exp"], json!(NOW_S + 301)))));
        assert!(is_invalid(check(with(&["exp"], json!(NOW_S)))));
        assert!(check(with(&["exp"], json!(NOW_S + 300))).is_ok());
    }

    #[test]
    fn a_probe_from_the_future_says_the_clock_is_ahead() {
        assert_eq!(
            skew(check(with(&["probe", "checked_at"], json!(NOW_S + 612)))),
            Some(612)
        );
        assert!(check(with(&["probe", "checked_at"], json!(NOW_S + 29))).is_ok());
    }

    #[test]
    fn a_clock_far_off_is_named_with_its_offset() {
        // Ten minutes fast: iat, exp and checked_at all ahead.
        let mut c = with(&["iat"], json!(NOW_S + 600));
        c["exp"] = json!(NOW_S + 660);
        c["probe"]["checked_at"] = json!(NOW_S + 599);
        let e = check(c).unwrap_err();
        assert!(e.to_string().contains("599 s ahead"), "{e}");
        // Ten minutes slow: signed "600 s ago", expired long since.
        let mut c = with(&["iat"], json!(NOW_S - 600));
        c["exp"] = json!(NOW_S - 540);
        c["probe"]["checked_at"] = json!(NOW_S - 601);
        let r = check(c);
        let e = r.as_ref().unwrap_err().to_string();
        assert!(e.contains("600 s behind"), "{e}");
        assert_eq!(skew(r), Some(-600));
    }

    #[test]
    fn failed_probe_needs_its_error() {
        assert!(is_invalid(check(with(&["probe", "ok"], json!(false)))));
        let mut c = with(&["probe", "ok"], json!(false));
        c["probe"]["error"] = json!("default OCI runtime \"crun\" not found:\ninvalid argument");
        let a = check(c).unwrap();
        assert_eq!(
            a.probe.error.as_deref(),
            Some("default OCI runtime \"crun\" not found: invalid argument")
        );
    }

    #[test]
    fn time_rules_answer_expired() {
        // iat 90 s ago, exp 10 s ago but inside the 30 s leeway: too old (max age 60).
        let mut c = with(&["iat"], json!(NOW_S - 90));
        c["exp"] = json!(NOW_S - 10);
        assert!(is_expired(check(c)));
        // exp passed beyond the leeway.
        let mut c = with(&["iat"], json!(NOW_S - 50));
        c["exp"] = json!(NOW_S - 31);
        assert!(is_expired(check(c)));
        // iat in the future beyond the leeway: the clock is ahead.
        let mut c = with(&["iat"], json!(NOW_S + 31));
        c["exp"] = json!(NOW_S + 100);
        assert_eq!(skew(check(c)), Some(31));
        // nbf in the future beyond the leeway.
        assert!(is_expired(check(with(&["nbf"], json!(NOW_S + 31)))));
        assert!(check(with(&["nbf"], json!(NOW_S + 29))).is_ok());
    }

    #[test]
    fn disk_figures_are_numbers_and_few() {
        let one = json!({"path": "/var/lib/containers\u{7}", "role": "storage",
                         "free_bytes": 3_330_000_000u64, "total_bytes": 100u64 << 30,
                         "free_inodes": 9, "total_inodes": 10});
        let a = check(with(&["probe", "disk"], json!([one.clone()]))).unwrap();
        assert_eq!(
            a.probe.disk,
            vec![DiskFigure {
                path: "/var/lib/containers".into(),
                role: Some("storage".into()),
                free_bytes: 3_330_000_000,
                total_bytes: 100 << 30,
                free_inodes: 9,
                total_inodes: 10,
            }]
        );
        assert!(check(claims()).unwrap().probe.disk.is_empty());
        let mut as_text = one.clone();
        as_text["free_bytes"] = json!("3 GiB");
        assert!(is_invalid(check(with(
            &["probe", "disk"],
            json!([as_text])
        ))));
        let mut negative = one.clone();
        negative["free_inodes"] = json!(-1);
        assert!(is_invalid(check(with(
            &["probe", "disk"],
            json!([negative])
        ))));
        assert!(is_invalid(check(with(&["probe", "disk"], json!([1])))));
        assert!(is_invalid(check(with(
            &["probe", "disk"],
            json!(one.clone())
        ))));
        let nine = vec![one; MAX_DISKS + 1];
        assert!(is_invalid(check(with(&["probe", "disk"], json!(nine)))));
    }

    #[test]
    fn several_images_each_have_a_ref_and_an_id_unless_absent() {
        let id = format!("sha256:{}", "b".repeat(64));
        let a = check(with(
            &["images"],
            json!([{"ref": "node:20", "id": id, "labels": ["ubuntu-latest", "ubuntu-24.04"]},
                   {"ref": "postgres:16", "absent": true}]),
        ))
        .unwrap();
        assert_eq!(a.images.len(), 2);
        assert_eq!(a.images[0].labels, ["ubuntu-latest", "ubuntu-24.04"]);
        assert!(a.images[1].absent && a.images[1].id.is_none());
        assert!(check(claims()).unwrap().images.is_empty());
        for bad in [
            json!([{"ref": "node:20"}]),
            json!([{"ref": "", "id": id}]),
            json!([{"ref": "node:20\n", "id": id}]),
            json!([{"ref": "node:20", "id": id, "absent": true}]),
            json!([{"id": id}]),
            json!({"ref": "node:20", "id": id}),
            json!(vec![json!({"ref": "x", "id": id}); MAX_IMAGES + 1]),
            json!([{"ref": "x", "id": id, "labels": vec!["l"; MAX_LABELS + 1]}]),
        ] {
            assert!(
                matches!(
                    check(with(&["images"], bad.clone())),
                    Err(ClaimsError::Invalid(_) | ClaimsError::BadText(_))
                ),
                "{bad}"
            );
        }
        // Digests are checked after rule 6, as `image`'s are.
        let a = check(with(&["images"], json!([{"ref": "x", "id": "abc"}]))).unwrap();
        assert!(a.images[0].clone().check().is_err());
    }

    #[test]
    fn digests_are_checked_separately() {
        let a = check(with(&["image", "id"], json!("abc123"))).unwrap();
        assert!(a.image.check().is_err());
    }
}
