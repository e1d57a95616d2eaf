//! Group commit: requests that arrive while a round is being written wait for the next one,
//! which takes all of them at once.
//!
//! Under a light load a round holds one request and costs what a transaction of its own would;
//! under a heavy one, rounds grow and the cost per request falls, since a round's statements and
//! its commit are shared. Each request is answered only after the round that holds it commits.
//! Several lanes may write rounds at once: one on SQLite, which has one writer anyway; two on
//! PostgreSQL, where their claims skip each other's locked jobs and, since each runner keeps to
//! one lane, they never lock the same runner.
//!
//! A failed round wrote nothing; its requests are written again one by one, so that a failure
//! that belongs to one request stays with it and the others go through.

use super::engine::{Engine, work};
use super::held::Held;
use super::known_rows::KnownRows;
use super::retry::retrying;
use super::sql::round::{self, Unlocked};
use super::vocabulary::{Rejection, RoundItem, RoundOutcome};
use super::{StoreError, StoreResult};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// How an engine's rounds are written: how many at once, and how many requests each takes.
#[derive(Clone, Copy, Debug)]
pub struct RoundShape {
    /// Rounds written at once, each from a queue of its own.
    pub lanes: usize,
    /// The most requests one round takes: bounds a round's statements and parameters.
    pub largest: usize,
}

impl RoundShape {
    /// SQLite: one writer, so one lane (a second round could only wait for the first); rounds
    /// of at most 16, which keep the writer and the request handlers working at once. A round
    /// that took everything waiting would, under a load of many clients, hold nearly all of
    /// them (rounds of 29-32 of 32 clients, measured), so the clients moved in one convoy: the
    /// handlers idle while the writer wrote the round, the writer idle while they verified the
    /// next (a fifth of the two cores idle under saturated heartbeats). At 16 the answered part
    /// of the fleet is verified while the rest is written: heartbeats 15.0-16.5k -> 17.4-18.5k
    /// a second at 32 clients, 14.2-15.6k -> 18.4-19.0k at 64; refusals unchanged within the
    /// noise; 0.1-0.2 KB more written per heartbeat (docs/BENCHMARKS.md, "Rounds of at most 16
    /// on SQLite").
    pub const SQLITE: RoundShape = RoundShape {
        lanes: 1,
        largest: 16,
    };

    /// PostgreSQL: `lanes` rounds at once, of up to 64. A round's time there is its round
    /// trips to the server, so a smaller round would cap what a replica far from its database
    /// can write (`lanes x largest` per round's time); measured on one machine, 16 gained
    /// nothing that the noise did not cover.
    pub fn postgres(lanes: usize) -> RoundShape {
        RoundShape { lanes, largest: 64 }
    }
}

/// How many times a round gives the runtime a turn, when nothing more is waiting, before it is
/// written. A round is fast (SQLite: tens of microseconds for one request), so on a busy
/// service it would often hold one request while others are a moment from joining, and each
/// commit writes whole pages: measured, one turn halved the bytes written per heartbeat
/// (4.1 → 2.4 KB) and two more than halved it per refusal (4.0 → 1.4 KB), at no cost to the
/// rate. On an idle service the turns cost microseconds.
const GATHER_YIELDS: usize = 2;

struct Waiting {
    item: RoundItem,
    reply: oneshot::Sender<StoreResult<RoundOutcome>>,
}

/// The entrance to the rounds; cheap to clone.
#[derive(Clone)]
pub struct GroupCommit {
    lanes: Arc<Vec<mpsc::UnboundedSender<Waiting>>>,
}

impl GroupCommit {
    /// Starts `lanes` round writers on `engine`, each with its own queue, on the engine's
    /// rounds' runtime where it has one (PostgreSQL's, `pg_rounds`). A runner's requests
    /// always take the same lane, so rounds written at once never lock the same runner's row
    /// and never wait on each other. The writers stop when every `GroupCommit` is gone.
    /// What a round changed (a quarantine it lifted) is applied to `held` once it commits.
    pub fn start<E: Engine>(engine: Arc<E>, held: Held, shape: RoundShape) -> Self {
        let largest = shape.largest.max(1);
        let runtime = engine
            .rounds_runtime()
            .unwrap_or_else(tokio::runtime::Handle::current);
        let lanes = (0..shape.lanes.max(1))
            .map(|_| {
                let (queue, rx) = mpsc::unbounded_channel();
                runtime.spawn(write_rounds(engine.clone(), held.clone(), rx, largest));
                queue
            })
            .collect();
        GroupCommit {
            lanes: Arc::new(lanes),
        }
    }

    /// Waits for the round that takes `item` to commit, and answers its outcome.
    pub async fn submit(&self, item: RoundItem) -> StoreResult<RoundOutcome> {
        let (reply, answer) = oneshot::channel();
        let lane = &self.lanes[lane_of(&item, self.lanes.len())];
        lane.send(Waiting { item, reply })
            .map_err(|_| StoreError::Unavailable("the store is shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the round writer stopped".into()))?
    }
}

/// The lane of the item's runner.
fn lane_of(item: &RoundItem, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let runner = item.runners().next();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    runner.hash(&mut hasher);
    (hasher.finish() % lanes as u64) as usize
}

/// `items` as one round: first without a transaction where the engine writes rounds so and
/// the round may be (`round::write_unlocked`, from the rows the lane `known` holds when it
/// holds every runner's), else, or when a row changed between its read and its write, in one
/// transaction under its rows' locks (`round::write`); what it changed applied to `held`
/// after, and the attestations it accepted written through to the cache. The lane learns the
/// rows an unlocked round read and wrote, and forgets the others' runners. A locked round
/// written after its unlocked write's answer was lost answers its replays `undecided`.
async fn write<E: Engine>(
    engine: &E,
    held: &Held,
    known: &mut KnownRows,
    items: Arc<Vec<RoundItem>>,
) -> StoreResult<Vec<RoundOutcome>> {
    let written = items.clone();
    let unlocked_items = items.clone();
    let rows = known.of(items.iter().flat_map(RoundItem::runners), Instant::now());
    let unlocked = engine.write_round_unlocked(move || {
        work(move |db| {
            Box::pin(async move { round::write_unlocked(db, &unlocked_items, rows).await })
        })
    });
    // Whether this round's own write was sent and its answer lost with its connection
    // (`undecided`).
    let mut after_lost_write = false;
    let unlocked = match unlocked {
        None => None,
        Some(written) => match written.await {
            Ok(Unlocked::Written {
                outcomes,
                rows,
                changed_behind,
            }) => {
                let now = Instant::now();
                // A runner the round names but did not find (deleted) is known no more.
                known.forget(items.iter().flat_map(RoundItem::runners));
                known.contend(&changed_behind, now);
                known.learn(rows, now);
                Some(outcomes)
            }
            Ok(Unlocked::NeedsLock) => None,
            Ok(Unlocked::ConnectionLost { write_sent }) => {
                known.clear();
                after_lost_write = write_sent;
                None
            }
            Err(e) if e.is_conflict() => {
                tracing::debug!(error = %e, "a round's rows changed between its read and its \
                    write; writing it under their locks");
                None
            }
            Err(e) => {
                known.forget(items.iter().flat_map(RoundItem::runners));
                return Err(e);
            }
        },
    };
    let outcomes = match unlocked {
        Some(outcomes) => outcomes,
        None => {
            // Written under the locks, the rows' versions are the transaction's, not known here.
            known.forget(items.iter().flat_map(RoundItem::runners));
            let (outcomes, changes) = engine
                .write_round(work(move |db| {
                    Box::pin(async move { round::write(db, &items).await })
                }))
                .await
                .map_err(|e| match e {
                    // Not written again one by one: that would find the lost write's own jtis
                    // taken, and answer them replayed (`round::write`). Its runners attest
                    // again.
                    StoreError::Internal(_) | StoreError::Conflict(_) if after_lost_write => {
                        StoreError::Unavailable(format!(
                            "a round whose write's answer was lost failed when written again: \
                             {e}"
                        ))
                    }
                    e => e,
                })?;
            for change in &changes {
                held.apply(change);
            }
            if after_lost_write {
                undecided(outcomes)
            } else {
                outcomes
            }
        }
    };
    for (item, outcome) in written.iter().zip(&outcomes) {
        if let (Some(record), Some(Ok(()))) = (&item.attestation, &outcome.attestation) {
            if outcome.judged_stale {
                // The entry it was judged from missed a change: read again, not renewed.
                held.cache.forget_runner(&record.runner_id);
            } else {
                held.cache
                    .attested(&record.runner_id, record.received_at, &record.state);
            }
        }
    }
    Ok(outcomes)
}

/// The outcomes of a round written under its locks after its unlocked write was sent and its
/// answer lost: that write may have committed, so an attestation found replayed may be its
/// own, taken, whose runner a 401 would tell it was replayed; or a genuine replay, which must
/// not be taken. Rows cannot tell the two apart for certain (the write's jti may have left its
/// row for `seen_jtis` at once, or another writer may have written over it since), so such an
/// attestation is answered undecided (`Rejection::Undecided`, 503): neither taken nor called a
/// replay, and its runner attests again with a fresh one.
fn undecided(mut outcomes: Vec<RoundOutcome>) -> Vec<RoundOutcome> {
    for outcome in &mut outcomes {
        if outcome.attestation == Some(Err(Rejection::Replayed)) {
            tracing::info!(
                "an attestation found replayed in a round whose first write's answer was lost \
                 with its connection may be that write's own; answered undecided"
            );
            outcome.attestation = Some(Err(Rejection::Undecided));
        }
    }
    outcomes
}

async fn write_rounds<E: Engine>(
    engine: Arc<E>,
    held: Held,
    mut rx: mpsc::UnboundedReceiver<Waiting>,
    largest: usize,
) {
    let mut known = KnownRows::default();
    // A round is whatever is waiting when the previous one is done (and after a turn or two of
    // the runtime), up to `largest`.
    while let Some(first) = rx.recv().await {
        let mut waiting = vec![first];
        let mut yielded = 0;
        while waiting.len() < largest {
            match rx.try_recv() {
                Ok(w) => waiting.push(w),
                Err(_) if yielded < GATHER_YIELDS => {
                    yielded += 1;
                    tokio::task::yield_now().await;
                }
                Err(_) => break,
            }
        }
        // A request whose client went away while it waited (its handler dropped, and with it
        // the answer's receiver) is not written: a claim would lease a job to nobody, which
        // would sit leased until its lease expired. One that goes while its round is written
        // is written; its lease expires.
        waiting.retain(|w| !w.reply.is_closed());
        if waiting.is_empty() {
            continue;
        }
        let (size, started) = (waiting.len(), std::time::Instant::now());
        let (items, replies): (Vec<RoundItem>, Vec<_>) =
            waiting.into_iter().map(|w| (w.item, w.reply)).unzip();
        // Shared with the round's work, and kept for a retry one by one.
        let items = Arc::new(items);
        let written = write(&*engine, &held, &mut known, items.clone()).await;
        if matches!(written, Err(StoreError::Unavailable(_))) {
            // Whatever server answers next may hand out the versions the lane knows again.
            known.clear();
        }
        match written {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            // Nothing of a failed round was written. Retried one by one, a failure that belongs
            // to one request (a conflict, a constraint) stays with it and the others go through;
            // a conflict is tried again (`retry`). An unavailable database is everyone's
            // failure: retrying each request would only make each wait for its own timeout.
            Err(e @ (StoreError::Internal(_) | StoreError::Conflict(_)))
                if items.len() > 1 || e.is_conflict() =>
            {
                tracing::debug!(error = %e, size, "a round failed; retrying its requests one by \
                    one");
                for (item, reply) in items.iter().zip(replies) {
                    let alone = retrying(|| async {
                        // Read, not known: the failed round forgot its runners.
                        let mut outcomes = write(
                            &*engine,
                            &held,
                            &mut KnownRows::default(),
                            Arc::new(vec![item.clone()]),
                        )
                        .await?;
                        outcomes.pop().ok_or_else(|| {
                            StoreError::Internal("a round answered no outcome".into())
                        })
                    })
                    .await;
                    let _ = reply.send(alone);
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
        tracing::trace!(
            size,
            elapsed_us = started.elapsed().as_micros() as u64,
            "round written"
        );
    }
}
