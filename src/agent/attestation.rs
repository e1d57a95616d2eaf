//! Turning a probe report into a signed attestation, exactly as PROTOCOL.md's claim table says.
//!
//! Why a fresh one every time: the service accepts each `jti` once and only within
//! `attestation_max_age` of `iat`, so an attestation is signed for one request and thrown away.

use super::keys::RunnerKey;
use super::probe::ProbeReport;
use super::state::RunnerState;
use crate::domain::forge::ForgeRunner;
use serde_json::{Map, Value, json};

/// How long a signed attestation is valid (`exp - iat`). Short, because it is used at once;
/// well under the service's default cap of 300 s.
pub const LIFETIME_S: i64 = 60;

/// The claims for `report`, issued at `now_s` (seconds since the epoch), with the machine's
/// forge runners when read (`forge_runners`; without it the service leaves the bindings alone).
pub fn claims(
    state: &RunnerState,
    report: &ProbeReport,
    forge_runners: Option<&[ForgeRunner]>,
    now_s: i64,
) -> Value {
    let mut probe = Map::new();
    probe.insert("ok".into(), json!(report.ok()));
    probe.insert("runtime".into(), json!(report.runtime));
    if let Some(v) = &report.runtime_version {
        probe.insert("runtime_version".into(), json!(v));
    }
    // Milliseconds matter: the quarantine after an abandon is lifted only by a probe checked
    // *after* it, at sub-second precision.
    probe.insert(
        "checked_at".into(),
        json!(report.checked_at_ms as f64 / 1000.0),
    );
    if !report.disk.is_empty() {
        let disk: Vec<Value> = report
            .disk
            .iter()
            .map(|d| {
                json!({
                    "path": d.path,
                    "role": d.role.as_str(),
                    "free_bytes": d.free_bytes,
                    "total_bytes": d.total_bytes,
                    "free_inodes": d.free_inodes,
                    "total_inodes": d.total_inodes,
                })
            })
            .collect();
        probe.insert("disk".into(), Value::Array(disk));
    }
    if let Err(failure) = &report.outcome {
        probe.insert("error".into(), json!(failure.message));
        if let Some(code) = failure.exit_code {
            probe.insert("exit_code".into(), json!(code));
        }
    }

    // Read once: the same name goes in both places.
    let host = hostname();
    let mut claims = json!({
        "iss": state.runner_id,
        "sub": state.runner_id,
        "aud": state.audience,
        "iat": now_s,
        "exp": now_s + LIFETIME_S,
        "jti": uuid::Uuid::now_v7().to_string(),
        "probe": probe,
        "agent": {
            "name": "leasegate",
            "version": env!("CARGO_PKG_VERSION"),
            "hostname": host,
        },
        "host": host,
    });
    if let Some(image) = &report.image {
        let mut obj = Map::new();
        if let Some(id) = &image.id {
            obj.insert("id".into(), json!(id));
        }
        if let Some(d) = &image.digest {
            obj.insert("digest".into(), json!(d));
        }
        obj.insert("ref".into(), json!(image.reference));
        claims["image"] = Value::Object(obj);
    }
    if let Some(found) = forge_runners {
        claims["forge_runners"] = Value::Array(found.iter().map(ForgeRunner::to_json).collect());
    }
    if !report.images.is_empty() {
        let images: Vec<Value> = report
            .images
            .iter()
            .map(|local| {
                let mut obj = Map::new();
                obj.insert("ref".into(), json!(local.wanted.reference));
                match &local.facts {
                    Some(facts) => {
                        if let Some(id) = &facts.id {
                            obj.insert("id".into(), json!(id));
                        }
                        if let Some(d) = &facts.digest {
                            obj.insert("digest".into(), json!(d));
                        }
                    }
                    None => {
                        obj.insert("absent".into(), json!(true));
                    }
                }
                if !local.wanted.labels.is_empty() {
                    obj.insert("labels".into(), json!(local.wanted.labels));
                }
                Value::Object(obj)
            })
            .collect();
        claims["images"] = Value::Array(images);
    }
    claims
}

/// A signed attestation of `report`, issued now.
pub fn sign(key: &RunnerKey, state: &RunnerState, report: &ProbeReport) -> String {
    sign_claiming(key, state, report, None)
}

/// A signed attestation of `report` claiming `forge_runners`, issued now.
pub fn sign_claiming(
    key: &RunnerKey,
    state: &RunnerState,
    report: &ProbeReport,
    forge_runners: Option<&[ForgeRunner]>,
) -> String {
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    key.sign_attestation(
        &state.runner_id,
        &claims(state, report, forge_runners, now_s),
    )
}

/// The machine's host name, for operators telling runners apart; empty when unknown.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::disk::{DiskFigures, Role};
    use crate::agent::probe::{Depth, ImageFacts, ProbeFailure};

    fn state() -> RunnerState {
        RunnerState {
            runner_id: "0190-runner".into(),
            name: "build-01".into(),
            pool: "linux".into(),
            server: "http://x".into(),
            audience: "gate".into(),
            heartbeat_interval_s: 15,
            attestation_max_age_s: 60,
            probe_max_age_s: 300,
            registered_at: None,
        }
    }

    #[test]
    fn a_failed_probe_carries_the_runtimes_words_and_exit_code() {
        let report = ProbeReport {
            runtime: "podman".into(),
            runtime_version: None,
            checked_at_ms: 1_700_000_000_123,
            outcome: Err(ProbeFailure {
                message: "default OCI runtime \"crun\" not found: invalid argument".into(),
                exit_code: Some(125),
            }),
            image: None,
            depth: Depth::Info,
            disk: Vec::new(),
            images: Vec::new(),
        };
        let c = claims(&state(), &report, None, 1_700_000_001);
        assert_eq!(c["iss"], "0190-runner");
        assert_eq!(c["sub"], "0190-runner");
        assert_eq!(c["aud"], "gate");
        assert_eq!(c["exp"], 1_700_000_061);
        assert_eq!(c["probe"]["ok"], false);
        assert_eq!(c["probe"]["exit_code"], 125);
        assert_eq!(c["probe"]["checked_at"], 1_700_000_000.123);
        assert!(c.get("image").is_none());
        assert!(c["jti"].as_str().unwrap().len() >= 16);
    }

    #[test]
    fn a_passing_probe_reports_the_image() {
        let id = format!("sha256:{}", "a".repeat(64));
        let report = ProbeReport {
            runtime: "podman".into(),
            runtime_version: Some("4.3.1".into()),
            checked_at_ms: 1_700_000_000_000,
            outcome: Ok(()),
            image: Some(ImageFacts {
                reference: "ci/runner:1".into(),
                id: Some(id.clone()),
                digest: None,
            }),
            depth: Depth::Info,
            disk: Vec::new(),
            images: Vec::new(),
        };
        let c = claims(&state(), &report, None, 1_700_000_000);
        assert_eq!(c["probe"]["ok"], true);
        assert!(c["probe"].get("error").is_none());
        assert_eq!(c["image"], json!({"id": id, "ref": "ci/runner:1"}));
        assert!(c["probe"].get("disk").is_none());
        let mut measured = report.clone();
        measured.disk = vec![DiskFigures {
            path: "/var/lib/containers/storage".into(),
            role: Role::Storage,
            free_bytes: 7 << 30,
            total_bytes: 100 << 30,
            free_inodes: 900,
            total_inodes: 1000,
        }];
        assert_eq!(
            claims(&state(), &measured, None, 1_700_000_000)["probe"]["disk"],
            json!([{"path": "/var/lib/containers/storage", "role": "storage",
                    "free_bytes": 7u64 << 30, "total_bytes": 100u64 << 30,
                    "free_inodes": 900, "total_inodes": 1000}])
        );
        assert_ne!(
            claims(&state(), &report, None, 1)["jti"],
            claims(&state(), &report, None, 1)["jti"]
        );
        assert!(c.get("forge_runners").is_none());
        let found = [ForgeRunner::of(
            crate::domain::forge::ForgeIdentity::gitlab_token("glrt-x")
                .on_machine(Some("s_0123456789ab".into())),
        )];
        let c = claims(&state(), &report, Some(&found), 1);
        assert_eq!(c["forge_runners"][0]["system_id"], "s_0123456789ab");
        assert_eq!(c["forge_runners"][0]["kind"], "gitlab");
    }
}
