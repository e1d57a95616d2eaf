//! Rule 5 at the edge of a jti's window, through the store of each engine. A jti is kept
//! `FORGET_AFTER` beyond its window, in its runner's row and once it spilled (past the
//! sweeper's purge), so that a replica whose clock is behind another's still finds it; and a
//! round planned after an attestation's window ended refuses it as expired, whatever was
//! forgotten by then. Each case was seen to fail with the jti forgotten at its window's end.

use crate::common;
use common::records::healthy as attestation;
use common::*;
use leasegate::domain::ids::RunnerId;
use leasegate::domain::record::{IN_ROW, Rejection};
use leasegate::domain::time::Millis;
use leasegate::store::{AttestationRecord, DynStore, RoundItem};

each_engine!(
    a_jti_in_the_row_outlives_its_window_for_a_replica_whose_clock_is_behind,
    a_spilled_jti_outlives_the_sweep_after_its_window_and_a_late_round_refuses_it,
);

/// What the round made of `record`.
async fn recorded(store: &DynStore, record: AttestationRecord) -> Result<(), Rejection> {
    store
        .submit(RoundItem {
            attestation: Some(record),
            claim: None,
        })
        .await
        .expect("the round is written")
        .attestation
        .expect("an attestation's outcome")
}

async fn one_runner(app: &TestApp) -> RunnerId {
    app.pool("linux", &[IMAGE_A]).await;
    RunnerId(app.register("linux", "r0").await.id)
}

async fn a_jti_in_the_row_outlives_its_window_for_a_replica_whose_clock_is_behind(engine: Engine) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let store = app.state.store().clone();
    let runner = one_runner(&app).await;
    let now = Millis::now();
    // J, signed nearly a minute ago: its window ends in a second.
    let j = attestation(
        &runner,
        "jti-J-0123456789",
        Millis(now.0 - 59_000),
        now.plus_secs(1),
    );
    assert_eq!(recorded(&store, j.clone()).await, Ok(()));
    // Another of the runner's attestations, stamped by a replica whose clock is two seconds
    // ahead: past J's window by that clock.
    let ahead = Millis(now.0 + 2_000);
    let other = attestation(&runner, "jti-X-0123456789", ahead, ahead.plus_secs(60));
    assert_eq!(recorded(&store, other).await, Ok(()));
    // J replayed to a replica whose clock is right, where J's window is still open.
    let mut replay = j;
    replay.received_at = Millis(now.0 - 58_000);
    assert_eq!(recorded(&store, replay).await, Err(Rejection::Replayed));
}

async fn a_spilled_jti_outlives_the_sweep_after_its_window_and_a_late_round_refuses_it(
    engine: Engine,
) {
    let Some(app) = common::spawn_app_on_with(engine, |_| {}).await else {
        return;
    };
    let store = app.state.store().clone();
    let runner = one_runner(&app).await;
    let now = Millis::now();
    // J's window ends in 1.5 s, every other one's in a minute: J is the first to spill out of
    // the row once it holds more than it keeps.
    let j_ends = Millis(now.0 + 1_500);
    let j = attestation(&runner, "jti-J-0123456789", Millis(now.0 - 58_500), j_ends);
    assert_eq!(recorded(&store, j.clone()).await, Ok(()));
    for i in 0..=IN_ROW {
        let other = attestation(
            &runner,
            &format!("jti-{i:02}-0123456789"),
            now,
            now.plus_secs(60),
        );
        assert_eq!(recorded(&store, other).await, Ok(()));
    }
    // A sweep by a replica whose clock reads a second past J's window.
    store
        .sweep(Millis(j_ends.0 + 1_000))
        .await
        .expect("the sweep");
    let mut replay = j.clone();
    replay.received_at = Millis(now.0 - 1_000);
    assert_eq!(recorded(&store, replay).await, Err(Rejection::Replayed));

    // Once J's window has ended by this clock, J is refused as expired, not judged.
    while Millis::now() <= j_ends {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(recorded(&store, j).await, Err(Rejection::Expired));
}
