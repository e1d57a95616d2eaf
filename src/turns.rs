//! Background work done by one replica at a time, in turns: every tick, the replica that
//! claims the task in the store (`Store::claim_task`) takes a look. The GitHub and Buildkite
//! watchers run on it; the claim is the store's, so any number of replicas may run the loop.

use crate::domain::time::Millis;
use crate::store::{DynStore, StoreResult};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How a task's turn is held.
#[derive(Clone, Copy, Debug)]
pub struct Turn {
    /// The task's name in the store.
    pub task: &'static str,
    /// Who takes the turns, for the log (`the GitHub watcher`).
    pub who: &'static str,
    pub tick: Duration,
    /// How long a claim holds (a replica that dies mid-look is taken over after it).
    pub hold: Duration,
    /// Let the claim go after each look (any replica may take the next one), or keep it
    /// until it lapses (held a little under one tick, the same replica takes the next).
    pub release: bool,
}

/// Runs `look` at every tick this replica holds `turn`'s task in `store`, until `shutdown`.
pub async fn every_turn<F, Look>(
    store: &DynStore,
    shutdown: &CancellationToken,
    turn: Turn,
    mut look: Look,
) where
    Look: FnMut(Millis) -> F,
    F: Future<Output = StoreResult<()>> + Send,
{
    let mut tick = tokio::time::interval(turn.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let now = Millis::now();
        let until = Millis(now.0 + turn.hold.as_millis() as i64);
        match store.claim_task(turn.task, now, until).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "{} cannot claim its turn", turn.who);
                continue;
            }
        }
        if let Err(e) = look(now).await {
            tracing::warn!(error = %e, "{}'s look failed; trying next turn", turn.who);
        }
        if turn.release
            && let Err(e) = store.release_task(turn.task, until, Millis::now()).await
        {
            tracing::warn!(error = %e, "{} cannot let its turn go", turn.who);
        }
    }
}
