//! Running a write again when the database aborted it for a conflict with another
//! transaction: PostgreSQL's `deadlock detected` (40P01) and serialization failure (40001).
//!
//! Every job and lease write takes its row locks in one order (runner, job, lease), so two of
//! them should never wait on each other in a cycle; this is what remains if they ever do, and
//! what a transaction under a stricter isolation level would need. The transaction wrote
//! nothing, so running it again is safe; a few tries with a short, jittered pause, then the
//! conflict is the caller's (503 `unavailable`, never 500).

use super::StoreResult;
use rand::Rng;
use std::time::Duration;

/// Tries after the first.
const RETRIES: u32 = 3;

/// Runs `op`, and again (up to `RETRIES` times) while it fails with a conflict.
pub async fn retrying<T, F, Fut>(mut op: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StoreResult<T>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if e.is_conflict() && tries < RETRIES => {
                tries += 1;
                tracing::debug!(error = %e, tries, "a write conflicted with another; trying again");
                let pause_ms = rand::thread_rng().gen_range(5..=20) * u64::from(tries);
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn conflicts_are_tried_again_a_few_times_and_nothing_else_is() {
        let calls = AtomicU32::new(0);
        let r: Result<u32, StoreError> = retrying(|| async {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            if n < 2 {
                Err(StoreError::Conflict("deadlock".into()))
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!(r.unwrap(), 2);

        calls.store(0, Ordering::SeqCst);
        let r: Result<(), StoreError> = retrying(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Conflict("deadlock".into()))
        })
        .await;
        assert!(r.unwrap_err().is_conflict());
        assert_eq!(calls.load(Ordering::SeqCst), 1 + RETRIES);

        calls.store(0, Ordering::SeqCst);
        let r: Result<(), StoreError> = retrying(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Internal("constraint".into()))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
