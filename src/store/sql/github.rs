//! GitHub registrations: the reservation made before GitHub is asked, the record of what
//! GitHub minted, each step the watcher sees, and the reads of the watcher and of a runner's
//! detail. Never a JIT config: none is ever stored.

use super::rows;
use crate::domain::github::registration::{Registration, State};
use crate::domain::ids::{RegistrationId, RunnerId};
use crate::store::StoreResult;
use crate::store::engine::{Db, Statement, fetch_optional};

/// The states a runner may hold only one of (the partial unique index's).
const OUTSTANDING: &str = "('minting', 'minted', 'online', 'busy')";

/// How many of a runner's registrations its detail shows.
pub const SHOWN_PER_RUNNER: i64 = 20;

/// The runner's registration that has not ended, if any.
async fn outstanding_of<D: Db>(db: &mut D, runner: &RunnerId) -> StoreResult<Option<Registration>> {
    fetch_optional(
        db,
        Statement::built(format!(
            "SELECT * FROM github_registrations WHERE runner_id = $1 AND state IN {OUTSTANDING}"
        ))
        .bind(runner.as_str()),
    )
    .await?
    .map(|r| rows::registration(&r))
    .transpose()
}

/// Reserves `reg` (state `minting`) for its runner, unless the runner holds a registration
/// that has not ended: that one is returned and nothing is written. The unique partial index
/// settles replicas that race: the second insert does nothing and reads the first's row.
pub async fn reserve<D: Db>(db: &mut D, reg: &Registration) -> StoreResult<Option<Registration>> {
    if let Some(existing) = outstanding_of(db, &reg.runner_id).await? {
        return Ok(Some(existing));
    }
    let inserted = db
        .execute(
            Statement::built(format!(
                "INSERT INTO github_registrations (id, runner_id, pool, scope, name, state, \
                 minted_at, expires_at, would_refuse) \
                 VALUES ($1, $2, $3, $4, $5, 'minting', $6, $7, $8) \
                 ON CONFLICT (runner_id) WHERE state IN {OUTSTANDING} DO NOTHING"
            ))
            .bind(reg.id.as_str())
            .bind(reg.runner_id.as_str())
            .bind(reg.pool.as_str())
            .bind(reg.scope.as_str())
            .bind(reg.name.as_str())
            .bind(reg.minted_at.0)
            .bind(reg.expires_at.0)
            .bind(reg.would_refuse.as_deref()),
        )
        .await?;
    if inserted == 1 {
        return Ok(None);
    }
    outstanding_of(db, &reg.runner_id).await
}

/// A reservation GitHub refused: gone, as if it had never been made.
pub async fn release<D: Db>(db: &mut D, id: &RegistrationId) -> StoreResult<()> {
    db.execute(
        Statement::new("DELETE FROM github_registrations WHERE id = $1 AND state = 'minting'")
            .bind(id.as_str()),
    )
    .await?;
    Ok(())
}

/// The reservation's name, before it is asked for again (GitHub had the first one).
pub async fn rename<D: Db>(db: &mut D, id: &RegistrationId, name: &str) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "UPDATE github_registrations SET name = $2 WHERE id = $1 AND state = 'minting'",
        )
        .bind(id.as_str())
        .bind(name),
    )
    .await?;
    Ok(())
}

/// Writes `reg` as it is now over the row that was in `prior`; whether it was (another
/// replica's watcher may have moved it first, and then this write is not made).
pub async fn update<D: Db>(db: &mut D, reg: &Registration, prior: State) -> StoreResult<bool> {
    let n = db
        .execute(
            Statement::new(
                "UPDATE github_registrations SET state = $3, github_runner_id = $4, name = $5, \
                 minted_at = $6, expires_at = $7, online_at = $8, busy_at = $9, seen_at = $10, \
                 ended_at = $11, end_reason = $12, observed_code = $13 \
                 WHERE id = $1 AND state = $2",
            )
            .bind(reg.id.as_str())
            .bind(prior.as_str())
            .bind(reg.state.as_str())
            .bind(reg.github_runner_id)
            .bind(reg.name.as_str())
            .bind(reg.minted_at.0)
            .bind(reg.expires_at.0)
            .bind(reg.online_at.map(|m| m.0))
            .bind(reg.busy_at.map(|m| m.0))
            .bind(reg.seen_at.map(|m| m.0))
            .bind(reg.ended_at.map(|m| m.0))
            .bind(reg.end_reason.as_deref())
            .bind(reg.observed_code.as_deref()),
        )
        .await?;
    Ok(n == 1)
}

/// Every registration that has not ended, by scope: what the watcher looks for in GitHub.
pub async fn outstanding<D: Db>(db: &mut D) -> StoreResult<Vec<Registration>> {
    let found = db
        .fetch(Statement::built(format!(
            "SELECT * FROM github_registrations WHERE state IN {OUTSTANDING} \
             ORDER BY scope, minted_at"
        )))
        .await?;
    found.iter().map(rows::registration).collect()
}

/// A runner's latest registrations, newest first.
pub async fn of_runner<D: Db>(db: &mut D, runner: &RunnerId) -> StoreResult<Vec<Registration>> {
    let found = db
        .fetch(
            Statement::new(
                "SELECT * FROM github_registrations WHERE runner_id = $1 \
                 ORDER BY minted_at DESC LIMIT $2",
            )
            .bind(runner.as_str())
            .bind(SHOWN_PER_RUNNER),
        )
        .await?;
    found.iter().map(rows::registration).collect()
}

/// One retention batch: registrations that ended before the horizon (`$1`), at most `$2`.
pub const PRUNE_SQL: &str = "DELETE FROM github_registrations WHERE id IN (SELECT id FROM \
     github_registrations WHERE ended_at < $1 LIMIT $2)";
