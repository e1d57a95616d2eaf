//! PostgreSQL's write rounds: `round_writer`'s steps through sqlx, in one transaction.

use super::StoreResult;
use super::round::{RoundItem, RoundResult, RunnerRow};
use super::round_sql::{Param, Statement};
use super::round_writer::{RoundDb, write_round};
use super::rows::{Decoders, get};
use crate::domain::ids::RunnerId;
use crate::domain::job::Job;
use crate::domain::time::Millis;
use sqlx::postgres::PgArguments;

/// Writes `items` in `tx` and commits.
pub(super) async fn run(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    items: &[RoundItem],
) -> RoundResult {
    let mut db = PgRound(tx);
    let outcomes = write_round(&mut db, items).await?;
    db.0.commit().await?;
    Ok(outcomes)
}

/// A round's transaction on PostgreSQL.
struct PgRound(sqlx::Transaction<'static, sqlx::Postgres>);

/// A statement as a sqlx query, its parameters bound in order.
pub(super) fn query(st: Statement<'_>) -> sqlx::query::Query<'_, sqlx::Postgres, PgArguments> {
    let mut q = sqlx::query(sqlx::AssertSqlSafe(st.sql));
    for p in st.params {
        q = match p {
            Param::Text(s) => q.bind(s),
            Param::Int(i) => q.bind(i),
            Param::OptText(s) => q.bind(s),
            Param::OptInt(i) => q.bind(i),
        };
    }
    q
}

impl RoundDb for PgRound {
    const ROW_LOCK: &'static str = " FOR UPDATE";
    const CLAIM_LOCK: &'static str = " FOR UPDATE SKIP LOCKED";
    // `RETURNING *` of an `UPDATE … FROM` would return the joined columns too.
    const RETURNING_JOBS: &'static str = "RETURNING jobs.*";

    async fn execute(&mut self, st: Statement<'_>) -> StoreResult<()> {
        query(st).execute(&mut *self.0).await?;
        Ok(())
    }

    async fn exists(&mut self, st: Statement<'_>) -> StoreResult<bool> {
        Ok(query(st).fetch_optional(&mut *self.0).await?.is_some())
    }

    async fn runner_rows(&mut self, st: Statement<'_>) -> StoreResult<Vec<(RunnerId, RunnerRow)>> {
        let rows = query(st).fetch_all(&mut *self.0).await?;
        rows.iter()
            .map(|r| {
                Ok((
                    RunnerId(get(r, "id")?),
                    RunnerRow {
                        attestation_seq: get(r, "attestation_seq")?,
                        refusal_seq: get(r, "refusal_seq")?,
                        last_status: get(r, "last_status")?,
                        quarantined_at: get::<_, Option<i64>>(r, "quarantined_at")?.map(Millis),
                        revoked: get::<_, Option<i64>>(r, "revoked_at")?.is_some(),
                        cordoned: get::<_, i64>(r, "cordoned")? != 0,
                    },
                ))
            })
            .collect()
    }

    async fn inserted_jtis(&mut self, st: Statement<'_>) -> StoreResult<Vec<(String, String)>> {
        let rows = query(st).fetch_all(&mut *self.0).await?;
        rows.iter()
            .map(|r| Ok((get(r, "runner_id")?, get(r, "jti")?)))
            .collect()
    }

    async fn seqs(&mut self, st: Statement<'_>) -> StoreResult<Vec<i64>> {
        let rows = query(st).fetch_all(&mut *self.0).await?;
        rows.iter().map(|r| get(r, "seq")).collect()
    }

    async fn jobs(&mut self, st: Statement<'_>) -> StoreResult<Vec<Job>> {
        let rows = query(st).fetch_all(&mut *self.0).await?;
        rows.iter().map(|r| r.job()).collect()
    }
}
