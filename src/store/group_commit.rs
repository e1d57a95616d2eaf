//! Group commit: requests that arrive while a round is being written wait for the next one,
//! which takes all of them at once.
//!
//! Under a light load a round holds one request and costs what a transaction of its own would;
//! under a heavy one, rounds grow and the cost per request falls, since a round's statements and
//! its commit are shared. Each request is answered only after the round that holds it commits.
//! `workers` rounds may be in flight at once: one on SQLite, which has one writer anyway;
//! several on PostgreSQL, where their claims skip each other's locked rows.

use super::round::{RoundItem, RoundOutcome};
use super::{DynStore, StoreError, StoreResult};
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};

/// The most requests one round takes: bounds a round's statements and parameters.
pub const MAX_ROUND: usize = 64;

struct Waiting {
    item: RoundItem,
    reply: oneshot::Sender<StoreResult<RoundOutcome>>,
}

/// The entrance to the rounds; cheap to clone.
#[derive(Clone)]
pub struct GroupCommit {
    queue: mpsc::UnboundedSender<Waiting>,
}

impl GroupCommit {
    /// Starts `workers` round writers on `engine`. They stop when every `GroupCommit` is gone.
    pub fn start(engine: DynStore, workers: usize) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..workers.max(1) {
            tokio::spawn(write_rounds(engine.clone(), rx.clone()));
        }
        GroupCommit { queue }
    }

    /// Waits for the round that takes `item` to commit, and answers its outcome.
    pub async fn submit(&self, item: RoundItem) -> StoreResult<RoundOutcome> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Waiting { item, reply })
            .map_err(|_| StoreError::Unavailable("the store is shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the round writer stopped".into()))?
    }
}

async fn write_rounds(engine: DynStore, rx: Arc<Mutex<mpsc::UnboundedReceiver<Waiting>>>) {
    loop {
        // One worker at a time gathers a round: whatever is waiting, up to MAX_ROUND.
        let round = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut round = vec![first];
            while round.len() < MAX_ROUND {
                match rx.try_recv() {
                    Ok(w) => round.push(w),
                    Err(_) => break,
                }
            }
            round
        };
        let n = round.len();
        let t = std::time::Instant::now();
        write_round(&engine, round).await;
        if std::env::var_os("LG_ROUND_DEBUG").is_some() {
            eprintln!("round {n} {:?}", t.elapsed());
        }
    }
}

async fn write_round(engine: &DynStore, round: Vec<Waiting>) {
    let (items, replies): (Vec<RoundItem>, Vec<_>) =
        round.into_iter().map(|w| (w.item, w.reply)).unzip();
    match engine.write_round(&items).await {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
        }
        // Nothing of a failed round was written. Retried one by one, a failure that belongs
        // to one request (a deadlock, a constraint) stays with it and the others go through.
        Err(e) if items.len() > 1 => {
            tracing::debug!(error = %e, size = items.len(), "a round failed; retrying its requests one by one");
            for (item, reply) in items.into_iter().zip(replies) {
                let result = engine.write_round(std::slice::from_ref(&item)).await;
                let _ = reply.send(result.and_then(|mut o| {
                    o.pop()
                        .ok_or_else(|| StoreError::Internal("a round answered no outcome".into()))
                }));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(clone_error(&e)));
            }
        }
    }
}

fn clone_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Internal(m) => StoreError::Internal(m.clone()),
    }
}
