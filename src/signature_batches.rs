//! The gate's signature checks, gathered into batches (`signature::which_hold`) by the
//! requests themselves.
//!
//! Each attestation's signature is read and hashed where its request is handled
//! (`signature::read`); what is left, its equation, is put among the checks waiting, and the
//! request yields once to the other ready tasks (`yield_now`) before it takes every check
//! still waiting and checks them together, answering each. Its own check may have been taken
//! by another request meanwhile: then it waits for that batch's answer. So a batch holds
//! whatever reached the gate during one pass over the ready tasks: many when the cores are
//! busy (the pass is long, and CPU is what a batch saves), one when they are not (the pass is
//! a look at the sockets, and the check is made at once). Any worker thread may check a
//! batch, so checks never queue behind one task. The equation is the same alone and in a
//! batch, so an answer never depends on the load (`signature`'s header). On PostgreSQL each
//! check is made at once (`SignatureChecks::new` says why).
//!
//! A batch with a bad signature in it fails whole, and each of its members is then checked
//! alone: its sound checks cost a batch and a check each. Someone sending bad signatures for
//! a registered runner's `kid` beside the fleet's requests would make every batch fail, each
//! of their requests costing the gate several checks, and the fleet's checks more than without
//! batches. So after a batch fails, every check is made alone for `ALONE_AFTER_FAILURE`: bad
//! signatures then cost a check each, as they would without batches, and at most one batch a
//! second is spent on them.

use crate::metrics::Metrics;
use crate::signature::{Signed, which_hold};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The most checks in one batch: past a few dozen the multiplication's cost per signature
/// rises again, and a batch's last answer waits for all of it (docs/BENCHMARKS.md).
const LARGEST_BATCH: usize = 32;

/// How long checks are made alone after a batch failed (the module's header says why).
const ALONE_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// The checks waiting for a batch; cheap to clone.
#[derive(Clone)]
pub struct SignatureChecks {
    waiting: Arc<Mutex<Vec<Waiting>>>,
    /// Whether checks wait for a batch at all (`SignatureChecks::new`).
    gather: bool,
    /// Until when (milliseconds since `since`) checks are made alone, after a batch failed.
    alone_until_ms: Arc<AtomicU64>,
    since: Instant,
    alone_for: Duration,
    metrics: Arc<Metrics>,
}

struct Waiting {
    signed: Signed,
    answer: oneshot::Sender<bool>,
}

impl SignatureChecks {
    /// `gather`: checks wait for their batch (the gate on SQLite), or each is made at once
    /// (on PostgreSQL). Measured (docs/BENCHMARKS.md, "Signatures checked in batches, one rule
    /// for both"): on SQLite the cores are what bounds the attestation rates, and batches of
    /// about six raised them a tenth; on PostgreSQL the rounds' wait on the server bounds
    /// them, the batches stayed near four, the service's CPU per heartbeat did not fall, and
    /// the wait for a batch lowered the rates.
    pub fn new(metrics: Arc<Metrics>, gather: bool) -> Self {
        Self::alone_after_failure(metrics, gather, ALONE_AFTER_FAILURE)
    }

    fn alone_after_failure(metrics: Arc<Metrics>, gather: bool, alone_for: Duration) -> Self {
        SignatureChecks {
            waiting: Arc::default(),
            gather,
            alone_until_ms: Arc::default(),
            since: Instant::now(),
            alone_for,
            metrics,
        }
    }

    fn millis(&self) -> u64 {
        self.since.elapsed().as_millis() as u64
    }

    /// Whether `signed` holds, answered by the batch it falls into.
    pub async fn holds(&self, signed: Signed) -> bool {
        if !self.gather || self.millis() < self.alone_until_ms.load(Ordering::Relaxed) {
            self.metrics.signature_batch(1);
            return signed.holds();
        }
        let (answer, mut answered) = oneshot::channel();
        self.lock().push(Waiting { signed, answer });
        tokio::task::yield_now().await;
        loop {
            if let Ok(held) = answered.try_recv() {
                return held;
            }
            let batch = {
                let mut waiting = self.lock();
                let taken = waiting.len().min(LARGEST_BATCH);
                waiting.drain(..taken).collect::<Vec<_>>()
            };
            if batch.is_empty() {
                // Taken by a batch being checked now, on another thread.
                break;
            }
            self.check(batch);
        }
        // A batch is checked without a pause, so its answers come; a panic in one would drop
        // its senders, and the check is then made here.
        answered.await.unwrap_or_else(|_| signed.holds())
    }

    fn check(&self, batch: Vec<Waiting>) {
        let signed: Vec<Signed> = batch.iter().map(|w| w.signed).collect();
        self.metrics.signature_batch(signed.len());
        let checked = which_hold(&signed);
        if checked.batch_failed {
            let until = self.millis() + self.alone_for.as_millis() as u64;
            self.alone_until_ms.fetch_max(until, Ordering::Relaxed);
        }
        for (waiting, held) in batch.into_iter().zip(checked.held) {
            // Its request may be gone (the client left): nobody to answer.
            let _ = waiting.answer.send(held);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        // A panic while the lock was held left a plain list of checks behind: still sound.
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::{KeyPoint, read};
    use ed25519_dalek::{Signer, SigningKey};

    /// A sound signature of `i`'s message, or, with `bad`, a sound signature of another
    /// message (the key one of 50).
    fn signed(i: u32, bad: bool) -> Signed {
        let signing = SigningKey::from_bytes(&[(i % 50) as u8 + 1; 32]);
        let key = KeyPoint::new(&signing.verifying_key()).unwrap();
        let message = i.to_le_bytes();
        let signature = signing.sign(&message).to_bytes();
        let checked = if bad { (i + 1).to_le_bytes() } else { message };
        read(&key, &checked, &signature).unwrap()
    }

    /// `count` checks at once from as many tasks, every `bad_every`th bad (0: none), each
    /// answered with its own answer; and how many batches they made.
    async fn check_at_once(checks: &SignatureChecks, count: u32, bad_every: u32) -> u64 {
        let batches = checks.metrics.signature_batches.get();
        let is_bad = move |i: u32| bad_every != 0 && i % bad_every == 3;
        let tasks: Vec<_> = (0..count)
            .map(|i| {
                let checks = checks.clone();
                tokio::spawn(async move { (i, checks.holds(signed(i, is_bad(i))).await) })
            })
            .collect();
        for task in tasks {
            let (i, held) = task.await.unwrap();
            assert_eq!(held, !is_bad(i), "check {i}");
        }
        assert!(checks.lock().is_empty());
        checks.metrics.signature_batches.get() - batches
    }

    /// Many checks at once from many tasks on two threads: every one answered, each with its
    /// own answer, whatever batch it fell into; and batches of more than one were made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_checks_each_get_their_own_answer() {
        let metrics = Arc::new(Metrics::default());
        let checks = SignatureChecks::new(metrics.clone(), true);
        let batches = check_at_once(&checks, 400, 0).await;
        assert_eq!(metrics.signatures_checked.get(), 400);
        assert!(batches < 400, "{batches} batches for 400 checks");
        // Every seventh bad: still each its own answer.
        check_at_once(&checks, 400, 7).await;
        assert_eq!(metrics.signatures_checked.get(), 800);
    }

    /// Checks `signed` as one batch, as a request would, and answers each one's answer.
    fn check_as_one_batch(checks: &SignatureChecks, signed: &[Signed]) -> Vec<bool> {
        let (batch, answered): (Vec<_>, Vec<_>) = signed
            .iter()
            .map(|s| {
                let (answer, answered) = oneshot::channel();
                (Waiting { signed: *s, answer }, answered)
            })
            .unzip();
        checks.check(batch);
        answered
            .into_iter()
            .map(|mut a| a.try_recv().unwrap())
            .collect()
    }

    /// After a batch fails, checks are made alone while the pause lasts (bad signatures then
    /// cost a check each, not a batch's), and in batches again after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_failed_batch_checks_are_made_alone_for_a_while() {
        let failing: Vec<_> = (0..4).map(|i| signed(i, i == 3)).collect();

        // A pause longer than the test: every check after the failure is made alone.
        let metrics = Arc::new(Metrics::default());
        let hour = Duration::from_secs(3600);
        let checks = SignatureChecks::alone_after_failure(metrics.clone(), true, hour);
        assert_eq!(
            check_as_one_batch(&checks, &failing),
            [true, true, true, false]
        );
        let batches = check_at_once(&checks, 200, 0).await;
        assert_eq!(batches, 200, "each check alone");

        // A short pause: once it is over, batches again.
        let short = Duration::from_millis(100);
        let checks = SignatureChecks::alone_after_failure(metrics.clone(), true, short);
        check_as_one_batch(&checks, &failing);
        tokio::time::sleep(short * 2).await;
        let batches = check_at_once(&checks, 400, 0).await;
        assert!(batches < 400, "{batches} batches for 400 checks");

        // A failed check alone, or in a pair (checked one by one: no batch failed), does not
        // stop the batches.
        assert!(!checks.holds(signed(9, true)).await);
        assert_eq!(
            check_as_one_batch(&checks, &[signed(10, false), signed(11, true)]),
            [true, false]
        );
        let batches = check_at_once(&checks, 400, 0).await;
        assert!(batches < 400, "{batches} batches for 400 checks");
    }
}
