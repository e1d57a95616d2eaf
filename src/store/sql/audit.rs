//! The audit trail: one row per operator's write, recorded in that write's transaction.

use crate::domain::audit::{Action, Entry, Recorded};
use crate::domain::time::Millis;
use crate::store::engine::{Db, Statement};
use crate::store::{AuditFilter, StoreError, StoreResult};

pub async fn record<D: Db>(db: &mut D, e: &Entry) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "INSERT INTO audit (at, actor, action, target, detail, client) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(e.at.0)
        .bind(e.actor.as_str())
        .bind(e.action.as_str())
        .bind(e.target.as_str())
        .bind(e.detail.as_deref())
        .bind(e.client.as_str()),
    )
    .await?;
    Ok(())
}

/// The entries `filter` selects, newest first, at most `filter.limit`.
pub async fn list<D: Db>(db: &mut D, filter: &AuditFilter) -> StoreResult<Vec<Recorded>> {
    let rows = db
        .fetch(
            Statement::new(
                "SELECT seq, at, actor, action, target, detail, client FROM audit \
                 WHERE ($1 IS NULL OR target = $1) AND ($2 IS NULL OR actor = $2) \
                 AND ($3 IS NULL OR at >= $3) AND ($4 IS NULL OR at < $4) \
                 AND ($5 IS NULL OR seq < $5) \
                 ORDER BY seq DESC LIMIT $6",
            )
            .bind(filter.target.as_deref())
            .bind(filter.actor.as_deref())
            .bind(filter.since.map(|m| m.0))
            .bind(filter.until.map(|m| m.0))
            .bind(filter.before)
            .bind(filter.limit),
        )
        .await?;
    rows.iter()
        .map(|r| {
            let action = r.text("action")?;
            Ok(Recorded {
                seq: r.int("seq")?,
                entry: Entry {
                    at: Millis(r.int("at")?),
                    actor: r.text("actor")?,
                    action: Action::parse(&action).ok_or_else(|| {
                        StoreError::Internal(format!("unknown action {action:?}"))
                    })?,
                    target: r.text("target")?,
                    detail: r.opt_text("detail")?,
                    client: r.text("client")?,
                },
            })
        })
        .collect()
}
