//! Attestation records as a round takes them, for cases that drive the store directly (with
//! stamps and windows of their choosing) rather than through the listener.

use leasegate::domain::attestation::{Probe, RunningImage};
use leasegate::domain::ids::RunnerId;
use leasegate::domain::status::RunnerStatus;
use leasegate::domain::time::Millis;
use leasegate::domain::verdict::AttestedState;
use leasegate::store::AttestationRecord;

/// A healthy attestation of `runner` with `jti`, stamped `received_at` by the replica that
/// admitted it, remembered for replay until `replay_until`.
pub fn healthy(
    runner: &RunnerId,
    jti: &str,
    received_at: Millis,
    replay_until: Millis,
) -> AttestationRecord {
    AttestationRecord {
        runner_id: runner.clone(),
        jti: jti.into(),
        replay_until,
        received_at,
        state: AttestedState {
            probe: Probe {
                ok: true,
                runtime: "podman".into(),
                runtime_version: Some("5.4.2".into()),
                checked_at: received_at,
                error: None,
                exit_code: None,
                disk: Vec::new(),
            },
            image: RunningImage::default(),
            images: Vec::new(),
        },
        agent: None,
        status: RunnerStatus::Healthy,
        refusal: None,
        judged_gate: Default::default(),
    }
}
