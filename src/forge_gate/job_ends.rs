//! How a job ended, read from what a forge's runner tells the forge: the reports the gate
//! forwards anyway, read once more for ejection (`domain/ejection.rs`). Pure: bytes in, the
//! job's key and its end out.
//!
//! - GitLab: the job's final `PUT /api/v4/jobs/{id}` (`state` and `failure_reason`); which
//!   runner took job `{id}` is read from the `201` answer to its `jobs/request` (`job_of`).
//! - Forgejo: the final `UpdateTask` (`state.result`, and whether any step has a
//!   `started_at`: forgejo-runner reports the steps of a job that never started cancelled and
//!   without one), in either Connect codec.
//!
//! A report that is not a job's end (`running`, an update without a result) is `None`, and so
//! is one the gate cannot read: the forge judges what it forwards, and a report the gate
//! misreads must never count against a machine. A cancelled job counts neither way.

use crate::domain::ejection::{FailureReason, JobEnd};
use serde_json::Value;

/// The key a job's end is counted under (once, however often it is reported).
pub fn gitlab_key(job_id: i64) -> String {
    format!("gitlab:{job_id}")
}

/// The key of a Forgejo task's end.
pub fn forgejo_key(task_id: i64) -> String {
    format!("forgejo:{task_id}")
}

/// The job id of a GitLab `201` answer to `jobs/request` (`{"id": N, …}`).
pub fn job_of(answer: &[u8]) -> Option<i64> {
    let value: Value = serde_json::from_slice(answer).ok()?;
    value.get("id")?.as_i64().filter(|id| *id > 0)
}

/// The job id in a GitLab job update's canonical path (`/api/v4/jobs/{id}`).
pub fn gitlab_update_job(path: &str) -> Option<i64> {
    let id = path.strip_prefix("/api/v4/jobs/")?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok().filter(|id| *id > 0)
}

/// GitLab's job update body (JSON, as gitlab-runner sends it): the job's end, if it is one.
pub fn gitlab_update(body: &[u8]) -> Option<JobEnd> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let state = value.get("state")?.as_str()?;
    match state {
        "success" => Some(JobEnd::RanToEnd),
        "failed" => {
            let reason = value.get("failure_reason").and_then(Value::as_str);
            Some(match reason {
                Some("runner_system_failure") => {
                    JobEnd::Infrastructure(FailureReason::RunnerSystemFailure)
                }
                Some("image_pull_failure") => {
                    JobEnd::Infrastructure(FailureReason::ImagePullFailure)
                }
                // The job's own failure (`script_failure` and the rest): the machine ran it.
                _ => JobEnd::RanToEnd,
            })
        }
        _ => None,
    }
}

/// Forgejo's `runner.v1` messages, as far as a task's end goes (field numbers as published).
mod forgejo_proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateTaskRequest {
        #[prost(message, optional, tag = "1")]
        pub state: Option<TaskState>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TaskState {
        #[prost(int64, tag = "1")]
        pub id: i64,
        #[prost(int32, tag = "2")]
        pub result: i32,
        #[prost(message, repeated, tag = "5")]
        pub steps: Vec<StepState>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StepState {
        #[prost(int64, tag = "1")]
        pub id: i64,
        #[prost(int32, tag = "2")]
        pub result: i32,
        #[prost(message, optional, tag = "3")]
        pub started_at: Option<Timestamp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Timestamp {
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }
}

/// `runner.v1.Result`.
const RESULT_SUCCESS: i32 = 1;
const RESULT_FAILURE: i32 = 2;

/// A Forgejo task's state, as far as its end goes.
#[derive(Debug, PartialEq, Eq)]
struct TaskEnd {
    id: i64,
    result: i32,
    any_step_started: bool,
}

impl TaskEnd {
    fn end(&self) -> Option<(i64, JobEnd)> {
        if self.id <= 0 {
            return None;
        }
        let end = match self.result {
            RESULT_FAILURE if !self.any_step_started => {
                JobEnd::Infrastructure(FailureReason::NoStepStarted)
            }
            RESULT_SUCCESS | RESULT_FAILURE => JobEnd::RanToEnd,
            _ => return None,
        };
        Some((self.id, end))
    }
}

/// Forgejo's `UpdateTask` request in protobuf: the task's id and its end, if it is one.
pub fn forgejo_update_proto(body: &[u8]) -> Option<(i64, JobEnd)> {
    use prost::Message;
    let request = forgejo_proto::UpdateTaskRequest::decode(body).ok()?;
    let state = request.state?;
    TaskEnd {
        id: state.id,
        result: state.result,
        any_step_started: state.steps.iter().any(|s| s.started_at.is_some()),
    }
    .end()
}

/// Forgejo's `UpdateTask` request in ProtoJSON (`int64` as a string or a number, enums by
/// name or number, field names in either case).
pub fn forgejo_update_json(body: &[u8]) -> Option<(i64, JobEnd)> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let state = value.get("state")?;
    let id = match state.get("id")? {
        Value::String(s) => s.parse().ok()?,
        v => v.as_i64()?,
    };
    let result = match state.get("result") {
        None => 0,
        Some(Value::String(name)) => match name.as_str() {
            "RESULT_SUCCESS" => RESULT_SUCCESS,
            "RESULT_FAILURE" => RESULT_FAILURE,
            _ => 0,
        },
        Some(v) => i32::try_from(v.as_i64()?).ok()?,
    };
    let any_step_started = state
        .get("steps")
        .and_then(Value::as_array)
        .is_some_and(|steps| {
            steps.iter().any(|s| {
                let started = s.get("startedAt").or_else(|| s.get("started_at"));
                started.is_some_and(|v| !v.is_null())
            })
        });
    TaskEnd {
        id,
        result,
        any_step_started,
    }
    .end()
}

#[cfg(test)]
mod tests {
    use super::forgejo_proto::*;
    use super::*;
    use prost::Message;

    fn task(result: i32, started: &[bool]) -> Vec<u8> {
        UpdateTaskRequest {
            state: Some(TaskState {
                id: 42,
                result,
                steps: started
                    .iter()
                    .enumerate()
                    .map(|(i, s)| StepState {
                        id: i as i64,
                        result: 3,
                        started_at: s.then_some(Timestamp {
                            seconds: 1_800_000_000,
                            nanos: 0,
                        }),
                    })
                    .collect(),
            }),
        }
        .encode_to_vec()
    }

    #[test]
    fn gitlab_updates_say_whose_fault_a_failure_was() {
        let infra = |r| Some(JobEnd::Infrastructure(r));
        assert_eq!(
            gitlab_update(
                br#"{"token":"t","state":"failed","failure_reason":"runner_system_failure"}"#
            ),
            infra(FailureReason::RunnerSystemFailure)
        );
        assert_eq!(
            gitlab_update(br#"{"state":"failed","failure_reason":"image_pull_failure"}"#),
            infra(FailureReason::ImagePullFailure)
        );
        assert_eq!(
            gitlab_update(br#"{"state":"failed","failure_reason":"script_failure"}"#),
            Some(JobEnd::RanToEnd)
        );
        assert_eq!(
            gitlab_update(br#"{"state":"success"}"#),
            Some(JobEnd::RanToEnd)
        );
        assert_eq!(gitlab_update(br#"{"state":"running"}"#), None);
        assert_eq!(gitlab_update(br#"{"state":"canceled"}"#), None);
        assert_eq!(gitlab_update(b"state=failed"), None);
        assert_eq!(gitlab_update_job("/api/v4/jobs/17"), Some(17));
        assert_eq!(gitlab_update_job("/api/v4/jobs/17/trace"), None);
        assert_eq!(gitlab_update_job("/api/v4/jobs/request"), None);
        assert_eq!(gitlab_update_job("/api/v4/jobs/0"), None);
        assert_eq!(job_of(br#"{"id":17,"token":"x","job_info":{}}"#), Some(17));
        assert_eq!(job_of(b"{}"), None);
    }

    #[test]
    fn a_forgejo_task_that_failed_before_any_step_started_is_the_machine() {
        let none = Some((42, JobEnd::Infrastructure(FailureReason::NoStepStarted)));
        assert_eq!(forgejo_update_proto(&task(2, &[false, false])), none);
        assert_eq!(forgejo_update_proto(&task(2, &[])), none);
        assert_eq!(
            forgejo_update_proto(&task(2, &[true, false])),
            Some((42, JobEnd::RanToEnd))
        );
        assert_eq!(
            forgejo_update_proto(&task(1, &[true])),
            Some((42, JobEnd::RanToEnd))
        );
        // Still running, or cancelled: not an end that counts.
        assert_eq!(forgejo_update_proto(&task(0, &[true])), None);
        assert_eq!(forgejo_update_proto(&task(3, &[false])), None);
        assert_eq!(forgejo_update_proto(b"\xff\xff"), None);
    }

    #[test]
    fn the_json_codec_reads_the_same() {
        assert_eq!(
            forgejo_update_json(
                br#"{"state":{"id":"42","result":"RESULT_FAILURE","steps":[{"id":"0","result":"RESULT_CANCELLED"}]}}"#
            ),
            Some((42, JobEnd::Infrastructure(FailureReason::NoStepStarted)))
        );
        assert_eq!(
            forgejo_update_json(
                br#"{"state":{"id":42,"result":2,"steps":[{"id":0,"startedAt":"2026-12-02T10:00:00Z"}]}}"#
            ),
            Some((42, JobEnd::RanToEnd))
        );
        assert_eq!(forgejo_update_json(br#"{"state":{"id":"42"}}"#), None);
        assert_eq!(forgejo_update_json(b"not json"), None);
    }
}
