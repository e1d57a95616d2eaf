//! The gate judges attestations from its cache of each runner's cordon, quarantine and
//! ejection; a round checks those facts against the row it reads, so that an entry which
//! missed a change (a notification lost, a change made behind the service's back) is not
//! renewed by the rounds it was wrong for, but forgotten: the runner's next attestation is
//! judged by the database, not after the cache's `MAX_AGE`.

use crate::common;
use common::*;
use leasegate::domain::ids::RunnerId;
use reqwest::StatusCode;

each_engine!(a_cache_entry_that_missed_a_cordon_is_forgotten_by_the_next_round);

async fn a_cache_entry_that_missed_a_cordon_is_forgotten_by_the_next_round(engine: Engine) {
    let Some(app) = spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let runner = app.one_healthy_runner().await;
    let id = RunnerId(runner.id.clone());
    let cordoned_in_cache = || async {
        let held = app.state.store().gate_runner(&id).await.unwrap().unwrap();
        held.record.gate.cordoned
    };
    assert!(!cordoned_in_cache().await, "held, not cordoned");

    app.behind_the_service("UPDATE runners SET cordoned = 1 WHERE id = $1", &runner.id)
        .await;
    // Judged by the cache, which missed the cordon; its round reads the row, which holds it.
    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    assert!(
        cordoned_in_cache().await,
        "the entry was forgotten by the round, and read again"
    );
    assert_eq!(
        code_of(app.lease(&runner.healthy()).await, StatusCode::CONFLICT).await,
        "runner_cordoned"
    );
}
