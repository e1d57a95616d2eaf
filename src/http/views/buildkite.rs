//! Buildkite pauses and notes on an agent, as a runner's history shows them.

use serde::Serialize;
use utoipa::ToSchema;

/// A pause leasegate made on one of the runner's Buildkite agents.
#[derive(Serialize, ToSchema)]
pub struct BuildkitePauseRecord {
    /// Buildkite's id of the agent.
    pub agent_id: String,
    pub agent_name: String,
    /// The refusal it was made for, and the note it carried (`leasegate: CODE: DETAIL`).
    pub code: String,
    pub note: String,
    pub paused_at: String,
    /// When Buildkite lifts it by itself unless leasegate resumes the agent first.
    pub until: String,
    #[schema(required = true)]
    pub ended_at: Option<String>,
    /// `resumed` (by leasegate), `lapsed` (its timeout passed), `undone` (found no longer
    /// paused), `replaced` (found paused by somebody else since) or `gone` (no longer
    /// connected); null while it holds.
    #[schema(required = true)]
    pub end: Option<String>,
}

/// What leasegate notes of one of the runner's Buildkite agent names.
#[derive(Serialize, ToSchema)]
pub struct BuildkiteAgentRecord {
    pub agent_name: String,
    /// The last time its agents were listed while the runner was refused.
    #[schema(required = true)]
    pub checked_at: Option<String>,
    /// In an observing pool: the refusal it would be paused for.
    #[schema(required = true)]
    pub would_pause: Option<String>,
    /// An agent of this name paused by somebody else, left alone.
    #[schema(required = true)]
    pub left_alone: Option<String>,
    /// Failed calls in a row (a pause or resume that failed), the last one's error and when,
    /// and when it is tried again; 0 and nulls when the last call went through.
    pub failures: i64,
    #[schema(required = true)]
    pub error: Option<String>,
    #[schema(required = true)]
    pub error_at: Option<String>,
    #[schema(required = true)]
    pub retry_at: Option<String>,
}

pub fn buildkite_pause(p: &crate::domain::buildkite::Pause) -> BuildkitePauseRecord {
    BuildkitePauseRecord {
        agent_id: p.agent_id.clone(),
        agent_name: p.agent_name.clone(),
        code: p.code.clone(),
        note: p.note.clone(),
        paused_at: p.paused_at.rfc3339(),
        until: p.until.rfc3339(),
        ended_at: p.ended_at.map(|m| m.rfc3339()),
        end: p.end.map(|e| e.as_str().to_string()),
    }
}

pub fn buildkite_agent(w: &crate::domain::buildkite::AgentWatch) -> BuildkiteAgentRecord {
    BuildkiteAgentRecord {
        agent_name: w.agent_name.clone(),
        checked_at: w.checked_at.map(|m| m.rfc3339()),
        would_pause: w.observed_code.clone(),
        left_alone: w.left_alone.clone(),
        failures: w.failures,
        error: w.error.clone(),
        error_at: w.error_at.map(|m| m.rfc3339()),
        retry_at: w.next_try_at.map(|m| m.rfc3339()),
    }
}
