//! Operators' named tokens: created, listed, looked up by hash, revoked.

use crate::domain::operator::{Operator, OperatorName, Role};
use crate::domain::time::Millis;
use crate::store::engine::{Db, Row, Statement, fetch_optional};
use crate::store::{OperatorToken, StoreError, StoreResult, TokenError};

fn token(r: &Row) -> StoreResult<OperatorToken> {
    let role = r.text("role")?;
    Ok(OperatorToken {
        operator: Operator {
            name: OperatorName::from_trusted(r.text("name")?),
            role: Role::parse(&role)
                .ok_or_else(|| StoreError::Internal(format!("unknown role {role:?}")))?,
        },
        created_at: Millis(r.int("created_at")?),
        created_by: r.text("created_by")?,
    })
}

/// Inserts the token unless its name is taken.
pub async fn create<D: Db>(
    db: &mut D,
    operator: &Operator,
    token_hash: &str,
    created_by: &str,
    now: Millis,
) -> StoreResult<Result<OperatorToken, TokenError>> {
    let inserted = db
        .execute(
            Statement::new(
                "INSERT INTO operator_tokens (name, role, token_hash, created_at, created_by) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
            )
            .bind(operator.name.as_str())
            .bind(operator.role.as_str())
            .bind(token_hash)
            .bind(now.0)
            .bind(created_by),
        )
        .await?;
    if inserted != 1 {
        db.discard();
        return Ok(Err(TokenError::NameTaken));
    }
    Ok(Ok(OperatorToken {
        operator: operator.clone(),
        created_at: now,
        created_by: created_by.to_string(),
    }))
}

pub async fn list<D: Db>(db: &mut D) -> StoreResult<Vec<OperatorToken>> {
    let rows = db
        .fetch(Statement::new(
            "SELECT name, role, created_at, created_by FROM operator_tokens ORDER BY name",
        ))
        .await?;
    rows.iter().map(token).collect()
}

/// The operator whose token hashes to `token_hash`.
pub async fn by_hash<D: Db>(db: &mut D, token_hash: &str) -> StoreResult<Option<Operator>> {
    let row = fetch_optional(
        db,
        Statement::new(
            "SELECT name, role, created_at, created_by FROM operator_tokens \
             WHERE token_hash = $1",
        )
        .bind(token_hash),
    )
    .await?;
    row.map(|r| token(&r).map(|t| t.operator)).transpose()
}

/// Revokes the token, and ends the page sessions opened with it; whether there was one.
pub async fn delete<D: Db>(db: &mut D, name: &OperatorName) -> StoreResult<bool> {
    let row = fetch_optional(
        db,
        Statement::new("DELETE FROM operator_tokens WHERE name = $1 RETURNING token_hash")
            .bind(name.as_str()),
    )
    .await?;
    let Some(row) = row else {
        return Ok(false);
    };
    db.execute(
        Statement::new("DELETE FROM page_sessions WHERE credential_hash = $1")
            .bind(row.text("token_hash")?),
    )
    .await?;
    Ok(true)
}
