//! Runners: registration with a single-use token, the runner record and its forge runners,
//! cordon, and what the runner views read (a revocation ends leases: `leases::revoke`).

use super::rows;
use crate::domain::forge::{ForgeBinding, ForgeIdentity, ForgeRunner};
use crate::domain::ids::RunnerId;
use crate::domain::pool_name::PoolName;
use crate::domain::runner::{Runner, RunnerSummary};
use crate::domain::time::Millis;
use crate::store::engine::{Change, Db, Row, Statement, fetch_optional};
use crate::store::{BindError, NewRunner, RegisterError, StoreResult};
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// A runner joined with its newest live lease, for the runner views. A runner may hold several
/// live leases (nothing stops it leasing again), but it is one row here.
const RUNNER_SELECT: &str = "SELECT r.*, l.id AS lease_id, l.job_id AS lease_job_id, \
     l.state AS lease_state, l.expires_at AS lease_expires_at \
     FROM runners r LEFT JOIN leases l ON l.id = (SELECT id FROM leases \
     WHERE runner_id = r.id AND state IN ('leased', 'running') ORDER BY granted_at DESC, id DESC \
     LIMIT 1)";

static BY_ID: LazyLock<String> = LazyLock::new(|| format!("{RUNNER_SELECT} WHERE r.id = $1"));
/// The summaries' selects: all runners or a pool's, with the search's columns or without.
static SUMMARIES: LazyLock<[String; 4]> = LazyLock::new(|| {
    let judging = rows::SUMMARY_COLUMNS;
    let search = format!("{judging}, {}", rows::SEARCH_COLUMNS);
    [
        format!("SELECT {judging} FROM runners"),
        format!("SELECT {search} FROM runners"),
        format!("SELECT {judging} FROM runners WHERE pool = $1"),
        format!("SELECT {search} FROM runners WHERE pool = $1"),
    ]
});

pub async fn get<D: Db>(db: &mut D, id: &RunnerId) -> StoreResult<Option<Runner>> {
    let Some(row) = fetch_optional(db, Statement::new(BY_ID.as_str()).bind(id.as_str())).await?
    else {
        return Ok(None);
    };
    let mut runner = rows::runner(&row)?;
    let bindings = db
        .fetch(
            Statement::new(
                "SELECT * FROM forge_runners WHERE runner_id = $1 ORDER BY kind, identity, system_id",
            )
            .bind(id.as_str()),
        )
        .await?;
    runner.forge_runners = bindings
        .iter()
        .map(rows::forge_binding)
        .collect::<StoreResult<_>>()?;
    Ok(Some(runner))
}

/// Every runner (or a pool's) as judging needs it, with labels and host when `with_search`,
/// by pool and name: one narrow read, without the lease join, the forge runners or the
/// columns only a runner's own view shows.
pub async fn summaries<D: Db>(
    db: &mut D,
    pool: Option<&PoolName>,
    with_search: bool,
) -> StoreResult<Vec<RunnerSummary>> {
    let select = &SUMMARIES[usize::from(with_search) + 2 * usize::from(pool.is_some())];
    let mut st = Statement::new(select.as_str());
    if let Some(p) = pool {
        st = st.bind(p.as_str());
    }
    let found = db.fetch(st).await?;
    let mut summaries: Vec<RunnerSummary> = found
        .iter()
        .map(|row| rows::runner_summary(row, with_search))
        .collect::<StoreResult<_>>()?;
    // Ordered here rather than by the engine, which would sort whole rows (SQLite through a
    // temporary B-tree, copying every record).
    summaries.sort_unstable_by(|a, b| (&a.pool, &a.name).cmp(&(&b.pool, &b.name)));
    Ok(summaries)
}

/// The runners of `ids` that exist, whole, in no particular order: what a view shows of the
/// page of runners it chose from their summaries.
pub async fn by_ids<D: Db>(db: &mut D, ids: &[RunnerId]) -> StoreResult<Vec<Runner>> {
    let mut runners = Vec::with_capacity(ids.len());
    // A bounded number of parameters per statement, whatever the page size.
    for chunk in ids.chunks(BY_IDS_CHUNK) {
        let marks = (1..=chunk.len())
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!("{RUNNER_SELECT} WHERE r.id IN ({marks})");
        let bindings_sql = format!(
            "SELECT * FROM forge_runners WHERE runner_id IN ({marks}) \
             ORDER BY kind, identity, system_id"
        );
        let mut st = Statement::built(sql);
        let mut bst = Statement::built(bindings_sql);
        for id in chunk {
            st = st.bind(id.as_str());
            bst = bst.bind(id.as_str());
        }
        let found = db.fetch(st).await?;
        let mut by_runner = bindings_by_runner(&db.fetch(bst).await?)?;
        for row in &found {
            let mut runner = rows::runner(row)?;
            if let Some(b) = by_runner.remove(runner.id.as_str()) {
                runner.forge_runners = b;
            }
            runners.push(runner);
        }
    }
    Ok(runners)
}

/// Ids per statement of `by_ids`.
const BY_IDS_CHUNK: usize = 200;

fn bindings_by_runner(rows: &[Row]) -> StoreResult<BTreeMap<String, Vec<ForgeBinding>>> {
    let mut by_runner: BTreeMap<String, Vec<ForgeBinding>> = BTreeMap::new();
    for row in rows {
        by_runner
            .entry(row.text("runner_id")?)
            .or_default()
            .push(rows::forge_binding(row)?);
    }
    Ok(by_runner)
}

/// Stores a registration token for `pool`; `false` (nothing stored) when there is no such pool.
pub async fn create_registration_token<D: Db>(
    db: &mut D,
    pool: &PoolName,
    token_hash: &str,
    expires_at: Millis,
    now: Millis,
) -> StoreResult<bool> {
    if !super::pools::held(db, pool.as_str()).await? {
        return Ok(false);
    }
    db.execute(
        Statement::new(
            "INSERT INTO registration_tokens (token_hash, pool, created_at, expires_at) VALUES \
                ($1, $2, $3, $4)",
        )
        .bind(token_hash)
        .bind(pool.as_str())
        .bind(now.0)
        .bind(expires_at.0),
    )
    .await?;
    Ok(true)
}

/// Consumes the token and inserts the runner with its forge runners; on any refusal the
/// transaction is discarded, so the token is not spent.
pub async fn register<D: Db>(
    db: &mut D,
    token_hash: &str,
    runner: &NewRunner,
    now: Millis,
) -> StoreResult<Result<Runner, RegisterError>> {
    // The token's pool is held first, as the pool's delete takes the pool before its tokens:
    // the two meet in the same order, and a token of a pool being deleted is simply gone.
    let unused = fetch_optional(
        db,
        Statement::new(
            "SELECT pool FROM registration_tokens \
             WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2",
        )
        .bind(token_hash)
        .bind(now.0),
    )
    .await?;
    let Some(unused) = unused else {
        return Ok(Err(RegisterError::TokenInvalid));
    };
    let pool = unused.text("pool")?;
    if !super::pools::held(db, &pool).await? {
        return Ok(Err(RegisterError::TokenInvalid));
    }
    // Spent only if still unused: a concurrent registration with the same token may have won.
    let spent = db
        .execute(
            Statement::new(
                "UPDATE registration_tokens SET used_at = $1, used_by = $2 \
                 WHERE token_hash = $3 AND used_at IS NULL AND expires_at > $1",
            )
            .bind(now.0)
            .bind(runner.id.as_str())
            .bind(token_hash),
        )
        .await?;
    if spent != 1 {
        return Ok(Err(RegisterError::TokenInvalid));
    }
    let inserted = db
        .execute(
            Statement::new(
                "INSERT INTO runners (id, name, pool, labels, public_key_x, registered_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (pool, name) WHERE revoked_at IS NULL DO NOTHING",
            )
            .bind(runner.id.as_str())
            .bind(runner.name.as_str())
            .bind(pool.as_str())
            .bind(serde_json::to_string(&runner.labels).expect("labels serialize"))
            .bind(runner.public_key_x.as_str())
            .bind(now.0),
        )
        .await?;
    if inserted != 1 {
        db.discard();
        return Ok(Err(RegisterError::NameTaken));
    }
    if let Some(taken) = bind(db, &runner.id, &runner.forge_runners, now).await? {
        db.discard();
        return Ok(Err(RegisterError::ForgeRunnerTaken(taken)));
    }
    if !runner.forge_runners.is_empty() {
        db.changed(Change::ForgeRunners).await?;
    }
    match get(db, &runner.id).await? {
        Some(stored) => Ok(Ok(stored)),
        None => Err(crate::store::StoreError::Internal(
            "runner vanished after insert".into(),
        )),
    }
}

/// A binding's `system_id` column: `''` for none (a Forgejo runner, or a GitLab token alone).
fn system_id_of(identity: &ForgeIdentity) -> &str {
    identity.system_id.as_deref().unwrap_or("")
}

/// Binds `wanted` to `runner` unless another runner holds it (then `false`, nothing changed),
/// bringing the token's SHA-256 of a binding it already holds up to date.
async fn bind_one<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    wanted: &ForgeRunner,
    now: Millis,
) -> StoreResult<bool> {
    let identity = &wanted.identity;
    db.execute(
        Statement::new(
            "INSERT INTO forge_runners (kind, identity, system_id, token_sha256, runner_id, \
                bound_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (kind, identity, system_id) DO NOTHING",
        )
        .bind(identity.kind.as_str())
        .bind(identity.key.as_str())
        .bind(system_id_of(identity))
        .bind(wanted.token_sha256.as_deref())
        .bind(runner.as_str())
        .bind(now.0),
    )
    .await?;
    let Some(held) = fetch_optional(
        db,
        Statement::new(
            "SELECT runner_id, token_sha256 FROM forge_runners \
             WHERE kind = $1 AND identity = $2 AND system_id = $3",
        )
        .bind(identity.kind.as_str())
        .bind(identity.key.as_str())
        .bind(system_id_of(identity)),
    )
    .await?
    else {
        return Ok(false);
    };
    if held.text("runner_id")? != runner.as_str() {
        return Ok(false);
    }
    if held.opt_text("token_sha256")? != wanted.token_sha256 {
        db.execute(
            Statement::new(
                "UPDATE forge_runners SET token_sha256 = $4 \
                 WHERE kind = $1 AND identity = $2 AND system_id = $3",
            )
            .bind(identity.kind.as_str())
            .bind(identity.key.as_str())
            .bind(system_id_of(identity))
            .bind(wanted.token_sha256.as_deref()),
        )
        .await?;
    }
    Ok(true)
}

/// Binds `wanted` to `runner`, keeping those it already has; the first one bound to another
/// runner, if any.
async fn bind<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    wanted: &[ForgeRunner],
    now: Millis,
) -> StoreResult<Option<ForgeIdentity>> {
    for w in wanted {
        if !bind_one(db, runner, w, now).await? {
            return Ok(Some(w.identity.clone()));
        }
    }
    Ok(None)
}

/// Unbinds what `current` holds and `wanted` does not name.
async fn unbind_others<D: Db>(
    db: &mut D,
    current: &Runner,
    wanted: &[ForgeRunner],
) -> StoreResult<bool> {
    let mut any = false;
    for kept in &current.forge_runners {
        if !wanted.iter().any(|w| w.identity == kept.identity) {
            db.execute(
                Statement::new(
                    "DELETE FROM forge_runners WHERE kind = $1 AND identity = $2 AND \
                        system_id = $3",
                )
                .bind(kept.identity.kind.as_str())
                .bind(kept.identity.key.as_str())
                .bind(system_id_of(&kept.identity)),
            )
            .await?;
            any = true;
        }
    }
    Ok(any)
}

/// Replaces the forge runners of `runner` (keeping when each was last seen); all or nothing.
pub async fn set_forge_runners<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    wanted: &[ForgeRunner],
    now: Millis,
) -> StoreResult<Result<Option<Runner>, BindError>> {
    let Some(current) = get(db, runner).await? else {
        return Ok(Ok(None));
    };
    if current.is_revoked() {
        return Ok(Err(BindError::Revoked));
    }
    unbind_others(db, &current, wanted).await?;
    if let Some(taken) = bind(db, runner, wanted, now).await? {
        db.discard();
        return Ok(Err(BindError::Taken(taken)));
    }
    db.changed(Change::Runner(runner.clone())).await?;
    db.changed(Change::ForgeRunners).await?;
    Ok(Ok(get(db, runner).await?))
}

/// Rebinds `runner` to exactly the forge runners its agent `claimed` (what it found in the
/// forge runners' files), binding each one no other runner holds and noting on the runner
/// those another holds; `None` for an unknown or revoked runner (nothing written). Whether
/// anything changed is in the answer, for the audit.
pub async fn follow_forge_runners<D: Db>(
    db: &mut D,
    runner: &RunnerId,
    claimed: &[ForgeRunner],
    now: Millis,
) -> StoreResult<Option<Followed>> {
    let Some(current) = get(db, runner).await? else {
        return Ok(None);
    };
    if current.is_revoked() {
        return Ok(None);
    }
    let before: Vec<ForgeRunner> = current.forge_runners.iter().map(|b| b.runner()).collect();
    unbind_others(db, &current, claimed).await?;
    let mut taken = Vec::new();
    for c in claimed {
        if !bind_one(db, runner, c, now).await? {
            taken.push(c.clone());
        }
    }
    let after = get(db, runner)
        .await?
        .map(|r| r.forge_runners)
        .unwrap_or_default();
    let after: Vec<ForgeRunner> = after.iter().map(|b| b.runner()).collect();
    let changed = before != after || taken != current.forge_runners_taken;
    if taken != current.forge_runners_taken {
        db.execute(
            Statement::new("UPDATE runners SET forge_runners_taken = $2 WHERE id = $1")
                .bind(runner.as_str())
                .bind(rows::forge_runners_taken_text(&taken).as_deref()),
        )
        .await?;
    }
    if changed {
        db.changed(Change::Runner(runner.clone())).await?;
        db.changed(Change::ForgeRunners).await?;
    }
    Ok(Some(Followed {
        changed,
        bound: after,
        taken,
    }))
}

/// What following a claim did.
#[derive(Clone, Debug, Default)]
pub struct Followed {
    /// Whether a binding or the taken list changed.
    pub changed: bool,
    /// The runner's forge runners now.
    pub bound: Vec<ForgeRunner>,
    /// The claimed forge runners another runner holds.
    pub taken: Vec<ForgeRunner>,
}

/// The binding that judges a fetch from `identity`, and its runner: the one naming the
/// fetch's `system_id`, else the token's (or uuid's) binding by itself.
pub async fn forge_runner<D: Db>(
    db: &mut D,
    identity: &ForgeIdentity,
) -> StoreResult<Option<(RunnerId, ForgeBinding)>> {
    // '' (the binding by key alone) sorts before any system_id.
    let row = fetch_optional(
        db,
        Statement::new(
            "SELECT * FROM forge_runners WHERE kind = $1 AND identity = $2 \
             AND system_id IN ($3, '') ORDER BY system_id DESC LIMIT 1",
        )
        .bind(identity.kind.as_str())
        .bind(identity.key.as_str())
        .bind(system_id_of(identity)),
    )
    .await?;
    row.map(|r| Ok((RunnerId(r.text("runner_id")?), rows::forge_binding(&r)?)))
        .transpose()
}

/// Notes that the binding `identity` names (exactly: as `forge_runner` answered it) saw a
/// fetch at `now`.
pub async fn note_forge_fetch<D: Db>(
    db: &mut D,
    identity: &ForgeIdentity,
    now: Millis,
) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "UPDATE forge_runners SET last_fetch_at = $4 \
             WHERE kind = $1 AND identity = $2 AND system_id = $3",
        )
        .bind(identity.kind.as_str())
        .bind(identity.key.as_str())
        .bind(system_id_of(identity))
        .bind(now.0),
    )
    .await?;
    Ok(())
}

pub async fn set_cordoned<D: Db>(
    db: &mut D,
    id: &RunnerId,
    cordoned: bool,
) -> StoreResult<Option<Runner>> {
    db.execute(
        Statement::new("UPDATE runners SET cordoned = $1 WHERE id = $2")
            .bind(i64::from(cordoned))
            .bind(id.as_str()),
    )
    .await?;
    db.changed(Change::Runner(id.clone())).await?;
    get(db, id).await
}

/// Notes the runner's last attestation refused under rules 3–4, with why.
pub async fn note_rejection<D: Db>(
    db: &mut D,
    id: &RunnerId,
    code: &str,
    detail: &str,
    now: Millis,
) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "UPDATE runners SET rejected_at = $2, rejected_code = $3, rejected_detail = $4 \
             WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(now.0)
        .bind(code)
        .bind(detail),
    )
    .await?;
    Ok(())
}
