//! The runner-health page's sessions.

use crate::domain::time::Millis;
use crate::store::engine::{Db, Statement, fetch_optional};
use crate::store::{PageSession, StoreResult};

pub async fn create<D: Db>(db: &mut D, s: &PageSession) -> StoreResult<()> {
    db.execute(
        Statement::new(
            "INSERT INTO page_sessions (token_hash, actor, credential_hash, created_at, \
                expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(s.token_hash.as_str())
        .bind(s.actor.as_str())
        .bind(s.credential_hash.as_str())
        .bind(s.created_at.0)
        .bind(s.expires_at.0),
    )
    .await?;
    Ok(())
}

pub async fn get<D: Db>(
    db: &mut D,
    token_hash: &str,
    now: Millis,
) -> StoreResult<Option<PageSession>> {
    let row = fetch_optional(
        db,
        Statement::new("SELECT * FROM page_sessions WHERE token_hash = $1 AND expires_at > $2")
            .bind(token_hash)
            .bind(now.0),
    )
    .await?;
    row.map(|r| {
        Ok(PageSession {
            token_hash: r.text("token_hash")?,
            actor: r.text("actor")?,
            credential_hash: r.text("credential_hash")?,
            created_at: Millis(r.int("created_at")?),
            expires_at: Millis(r.int("expires_at")?),
        })
    })
    .transpose()
}

/// Ends the session; whether there was one.
pub async fn end<D: Db>(db: &mut D, token_hash: &str) -> StoreResult<bool> {
    let n = db
        .execute(Statement::new("DELETE FROM page_sessions WHERE token_hash = $1").bind(token_hash))
        .await?;
    Ok(n > 0)
}

/// Forgets expired sessions.
pub async fn purge<D: Db>(db: &mut D, now: Millis) -> StoreResult<()> {
    db.execute(Statement::new("DELETE FROM page_sessions WHERE expires_at <= $1").bind(now.0))
        .await?;
    Ok(())
}
