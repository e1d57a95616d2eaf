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

use crate::metrics::Metrics;
use crate::signature::{Signed, which_hold};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The most checks in one batch: past a few dozen the multiplication's cost per signature
/// rises again, and a batch's last answer waits for all of it (docs/BENCHMARKS.md).
const LARGEST_BATCH: usize = 32;

/// The checks waiting for a batch; cheap to clone.
#[derive(Clone)]
pub struct SignatureChecks {
    waiting: Arc<Mutex<Vec<Waiting>>>,
    /// Whether checks wait for a batch at all (`SignatureChecks::new`).
    gather: bool,
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
        SignatureChecks {
            waiting: Arc::default(),
            gather,
            metrics,
        }
    }

    /// Whether `signed` holds, answered by the batch it falls into.
    pub async fn holds(&self, signed: Signed) -> bool {
        if !self.gather {
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
        for (waiting, held) in batch.into_iter().zip(which_hold(&signed)) {
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

    /// Many checks at once from many tasks on two threads: every one answered, each with its
    /// own answer, whatever batch it fell into; and batches of more than one were made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_checks_each_get_their_own_answer() {
        let metrics = Arc::new(Metrics::default());
        let checks = SignatureChecks::new(metrics.clone(), true);
        let tasks: Vec<_> = (0..400u32)
            .map(|i| {
                let checks = checks.clone();
                tokio::spawn(async move {
                    let signing = SigningKey::from_bytes(&[(i % 50) as u8 + 1; 32]);
                    let key = KeyPoint::new(&signing.verifying_key()).unwrap();
                    let message = i.to_le_bytes();
                    let signature = signing.sign(&message).to_bytes();
                    // Every seventh is a sound signature of another message.
                    let checked = if i % 7 == 3 {
                        (i + 1).to_le_bytes()
                    } else {
                        message
                    };
                    let signed = read(&key, &checked, &signature).unwrap();
                    (i, checks.holds(signed).await)
                })
            })
            .collect();
        for task in tasks {
            let (i, held) = task.await.unwrap();
            assert_eq!(held, i % 7 != 3, "check {i}");
        }
        let checked = metrics.signatures_checked.get();
        let batches = metrics.signature_batches.get();
        assert_eq!(checked, 400);
        assert!(batches < checked, "{batches} batches for {checked} checks");
        assert!(checks.lock().is_empty());
    }
}
