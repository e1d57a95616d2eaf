//! Buildkite: the bound agent names the watcher follows, the pauses leasegate made (kept from
//! the pause until it ended, so that every replica and a restart know which pauses are
//! leasegate's to resume), and the watcher's notes on each agent name.

use crate::domain::buildkite::{AgentWatch, Pause, PauseEnd};
use crate::domain::ids::RunnerId;
use crate::domain::time::Millis;
use crate::store::StoreResult;
use crate::store::engine::{Db, Row, Statement};
use crate::store::sql::rows::corrupt;

/// How many of a runner's pauses its detail shows.
pub const SHOWN_PER_RUNNER: i64 = 20;

/// What the watcher reads at each look.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildkiteState {
    /// Every bound Buildkite agent name and its runner.
    pub bindings: Vec<(String, RunnerId)>,
    /// leasegate's pauses that have not ended (some may have lapsed by now).
    pub pauses: Vec<Pause>,
    pub watches: Vec<AgentWatch>,
}

fn opt_millis(row: &Row, column: &str) -> StoreResult<Option<Millis>> {
    Ok(row.opt_int(column)?.map(Millis))
}

fn pause(row: &Row) -> StoreResult<Pause> {
    let end = match row.opt_text("end_reason")? {
        Some(s) => Some(PauseEnd::parse(&s).ok_or_else(|| corrupt("pause end", &s))?),
        None => None,
    };
    Ok(Pause {
        agent_id: row.text("agent_id")?,
        agent_name: row.text("agent_name")?,
        runner_id: RunnerId(row.text("runner_id")?),
        code: row.text("code")?,
        note: row.text("note")?,
        paused_at: Millis(row.int("paused_at")?),
        until: Millis(row.int("until_at")?),
        ended_at: opt_millis(row, "ended_at")?,
        end,
    })
}

fn watch(row: &Row) -> StoreResult<AgentWatch> {
    Ok(AgentWatch {
        agent_name: row.text("agent_name")?,
        runner_id: RunnerId(row.text("runner_id")?),
        checked_at: opt_millis(row, "checked_at")?,
        observed_code: row.opt_text("observed_code")?,
        left_alone: row.opt_text("left_alone")?,
        failures: row.int("failures")?,
        error: row.opt_text("error")?,
        error_at: opt_millis(row, "error_at")?,
        next_try_at: opt_millis(row, "next_try_at")?,
    })
}

/// The bindings, the pauses that have not ended and the notes, in one read.
pub async fn state<D: Db>(db: &mut D) -> StoreResult<BuildkiteState> {
    let bindings = db
        .fetch(Statement::new(
            "SELECT identity, runner_id FROM forge_runners WHERE kind = 'buildkite' \
             ORDER BY identity",
        ))
        .await?
        .iter()
        .map(|r| Ok((r.text("identity")?, RunnerId(r.text("runner_id")?))))
        .collect::<StoreResult<_>>()?;
    let pauses = db
        .fetch(Statement::new(
            "SELECT * FROM buildkite_pauses WHERE ended_at IS NULL ORDER BY agent_name, paused_at",
        ))
        .await?
        .iter()
        .map(pause)
        .collect::<StoreResult<_>>()?;
    let watches = db
        .fetch(Statement::new(
            "SELECT * FROM buildkite_agents ORDER BY agent_name",
        ))
        .await?
        .iter()
        .map(watch)
        .collect::<StoreResult<_>>()?;
    Ok(BuildkiteState {
        bindings,
        pauses,
        watches,
    })
}

/// A pause made, or how it ended.
pub async fn record_pause<D: Db>(db: &mut D, p: &Pause) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "INSERT INTO buildkite_pauses (agent_id, paused_at, agent_name, runner_id, code, \
             note, until_at, ended_at, end_reason) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (agent_id, paused_at) DO UPDATE SET ended_at = excluded.ended_at, \
             end_reason = excluded.end_reason",
        )
        .bind(p.agent_id.as_str())
        .bind(p.paused_at.0)
        .bind(p.agent_name.as_str())
        .bind(p.runner_id.as_str())
        .bind(p.code.as_str())
        .bind(p.note.as_str())
        .bind(p.until.0)
        .bind(p.ended_at.map(|m| m.0))
        .bind(p.end.map(|e| e.as_str())),
    )
    .await?;
    Ok(())
}

/// The watcher's notes on an agent name, as they are now.
pub async fn record_watch<D: Db>(db: &mut D, w: &AgentWatch) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "INSERT INTO buildkite_agents (agent_name, runner_id, checked_at, observed_code, \
             left_alone, failures, error, error_at, next_try_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (agent_name) DO UPDATE SET runner_id = excluded.runner_id, \
             checked_at = excluded.checked_at, observed_code = excluded.observed_code, \
             left_alone = excluded.left_alone, failures = excluded.failures, \
             error = excluded.error, error_at = excluded.error_at, \
             next_try_at = excluded.next_try_at",
        )
        .bind(w.agent_name.as_str())
        .bind(w.runner_id.as_str())
        .bind(w.checked_at.map(|m| m.0))
        .bind(w.observed_code.as_deref())
        .bind(w.left_alone.as_deref())
        .bind(w.failures)
        .bind(w.error.as_deref())
        .bind(w.error_at.map(|m| m.0))
        .bind(w.next_try_at.map(|m| m.0)),
    )
    .await?;
    Ok(())
}

/// The notes on an agent name no longer bound, with no pause of leasegate's left on it.
pub async fn forget_watch<D: Db>(db: &mut D, agent_name: &str) -> StoreResult<()> {
    db.execute(
        Statement::new("DELETE FROM buildkite_agents WHERE agent_name = $1").bind(agent_name),
    )
    .await?;
    Ok(())
}

/// A runner's latest pauses, newest first, and the notes on its agent names.
pub async fn of_runner<D: Db>(
    db: &mut D,
    runner: &RunnerId,
) -> StoreResult<(Vec<Pause>, Vec<AgentWatch>)> {
    let pauses = db
        .fetch(
            Statement::new(
                "SELECT * FROM buildkite_pauses WHERE runner_id = $1 \
                 ORDER BY paused_at DESC LIMIT $2",
            )
            .bind(runner.as_str())
            .bind(SHOWN_PER_RUNNER),
        )
        .await?
        .iter()
        .map(pause)
        .collect::<StoreResult<_>>()?;
    let watches = db
        .fetch(
            Statement::new(
                "SELECT * FROM buildkite_agents WHERE runner_id = $1 ORDER BY agent_name",
            )
            .bind(runner.as_str()),
        )
        .await?
        .iter()
        .map(watch)
        .collect::<StoreResult<_>>()?;
    Ok((pauses, watches))
}

/// One retention batch: pauses that ended before the horizon (`$1`), at most `$2`.
pub const PRUNE_SQL: &str = "DELETE FROM buildkite_pauses WHERE (agent_id, paused_at) IN \
     (SELECT agent_id, paused_at FROM buildkite_pauses WHERE ended_at < $1 LIMIT $2)";
