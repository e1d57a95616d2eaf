//! Pools' samples for the page's timelines: written a minute at a time, read a window at a
//! time, pruned after a day (`retention`).

use crate::domain::pool_name::PoolName;
use crate::domain::time::Millis;
use crate::domain::timeline::PoolSample;
use crate::store::engine::{Db, Param, Statement};
use crate::store::sql::write_rows;
use crate::store::{StoreError, StoreResult};

pub async fn record<D: Db>(db: &mut D, samples: &[PoolSample]) -> StoreResult<()> {
    let counts: Vec<String> = samples
        .iter()
        .map(|s| serde_json::to_string(&s.counts).expect("counts serialize"))
        .collect();
    let rows: Vec<(&PoolSample, &String)> = samples.iter().zip(&counts).collect();
    let sql = |rows: &str| {
        format!(
            "INSERT INTO pool_samples (pool, at, counts, refusals, live, drifted) \
             {rows} ON CONFLICT (pool, at) DO NOTHING"
        )
    };
    write_rows(db, &rows, 6, sql, |(s, counts)| {
        vec![
            Param::Text(s.pool.as_str()),
            Param::Int(s.at.0),
            Param::Text(counts),
            Param::Int(s.refusals),
            Param::Int(s.live),
            Param::Int(s.drifted),
        ]
    })
    .await
}

/// Every pool's samples since `since`, by pool, oldest first.
pub async fn since<D: Db>(db: &mut D, since: Millis) -> StoreResult<Vec<PoolSample>> {
    let rows = db
        .fetch(
            Statement::new(
                "SELECT pool, at, counts, refusals, live, drifted FROM pool_samples \
                 WHERE at > $1 ORDER BY pool, at",
            )
            .bind(since.0),
        )
        .await?;
    rows.iter()
        .map(|r| {
            let counts = r.text("counts")?;
            Ok(PoolSample {
                pool: PoolName::from_trusted(r.text("pool")?),
                at: Millis(r.int("at")?),
                counts: serde_json::from_str(&counts)
                    .map_err(|_| StoreError::Internal(format!("pool_samples.counts: {counts}")))?,
                refusals: r.int("refusals")?,
                live: r.int("live")?,
                drifted: r.int("drifted")?,
            })
        })
        .collect()
}
