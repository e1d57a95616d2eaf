//! Which leasegate runner judges a forge runner's fetch, beyond one identity per machine: a
//! GitLab token shared by a fleet is told apart by each machine's `system_id`; a Forgejo
//! binding holding the runner's token's SHA-256 answers only fetches presenting that token
//! (anyone else naming the uuid is forwarded untouched and learns nothing); and the bindings
//! follow what the runner's agent claims in its attestations (`forge_runners`), one owner per
//! forge runner, audited.

use crate::common;

use common::forges::{self, FETCH_TASK, FORGEJO_TOKEN, Gated, JOBS_REQUEST, UUID, runner_v1};
use common::*;
use leasegate::config::ServeArgs;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};

const FLEET_TOKEN: &str = "glrt-fleet-token";
const MACHINE_A: &str = "s_0123456789ab";
const MACHINE_B: &str = "s_ba9876543210";

/// The service on `engine` in front of the test forges (`forges::gated`), with `adjust` on top.
async fn gated(engine: Engine, adjust: impl FnOnce(&mut ServeArgs)) -> Option<Gated> {
    let g = forges::gated(engine, FLEET_TOKEN, 1, adjust).await?;
    g.app.pool("linux", &[IMAGE_A]).await;
    Some(g)
}

fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// A runner of pool `linux` named `name`, registered with `forge_runners`.
async fn runner_with(app: &TestApp, name: &str, forge_runners: Value) -> TestRunner {
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": name, "public_key": key.public_jwk(),
                   "forge_runners": forge_runners}),
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "{}",
        r.text().await.unwrap()
    );
    let body: Value = r.json().await.unwrap();
    TestRunner {
        id: body["runner_id"].as_str().unwrap().into(),
        pool: "linux".into(),
        key,
    }
}

fn machine(system_id: &str) -> Value {
    json!({"kind": "gitlab", "token_sha256": sha256_hex(FLEET_TOKEN), "system_id": system_id})
}

async fn beat(app: &TestApp, attestation: &str) {
    let r = app.heartbeat(attestation).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
}

/// gitlab-runner's `jobs/request` from the machine `system_id`.
async fn request_job(app: &TestApp, system_id: Option<&str>) -> reqwest::Response {
    let mut body = json!({"token": FLEET_TOKEN, "info": {"name": "gitlab-runner"}});
    if let Some(s) = system_id {
        body["system_id"] = json!(s);
    }
    app.client
        .post(app.url(JOBS_REQUEST))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn fetch_task(app: &TestApp, token: &str) -> reqwest::Response {
    app.client
        .post(app.url(FETCH_TASK))
        .header("connect-protocol-version", "1")
        .header("content-type", "application/proto")
        .header("x-runner-uuid", UUID)
        .header("x-runner-token", token)
        .body(runner_v1::FetchTaskRequest { tasks_version: 0 }.encode_to_vec())
        .send()
        .await
        .unwrap()
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

each_engine!(
    two_machines_on_one_gitlab_token_are_judged_each_by_its_own_runner,
    a_bound_token_from_an_unknown_machine_is_unknown_or_passed,
    a_fetch_without_the_runners_token_is_forwarded_untouched,
    bindings_follow_the_claim_of_each_attestation,
);

async fn two_machines_on_one_gitlab_token_are_judged_each_by_its_own_runner(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let app = &g.app;
    let healthy = runner_with(app, "build-a", json!([machine(MACHINE_A)])).await;
    let broken = runner_with(app, "build-b", json!([machine(MACHINE_B)])).await;
    beat(app, &healthy.healthy()).await;
    beat(app, &broken.failing("crun not found")).await;
    let id = g.gitlab.enqueue();
    // The broken machine asks first: no work for it, and the job stays queued.
    let r = request_job(app, Some(MACHINE_B)).await;
    assert_eq!(
        (r.status(), header(&r, "x-leasegate-refusal")),
        (StatusCode::NO_CONTENT, Some("probe_failed"))
    );
    assert_eq!(g.gitlab.queued(), vec![id]);
    // The healthy one gets it.
    let r = request_job(app, Some(MACHINE_A)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let job: Value = r.json().await.unwrap();
    assert_eq!(job["id"], id);
    // Each fetch is noted on its own machine's binding, the refusal on its own runner.
    let a = app.runner(&healthy.id).await;
    let b = app.runner(&broken.id).await;
    assert_eq!(a["forge_runners"][0]["system_id"], MACHINE_A);
    assert!(a["forge_runners"][0]["last_fetch_at"].is_string());
    assert!(b["forge_runners"][0]["last_fetch_at"].is_string());
    assert_eq!(a["refusals"].as_array().unwrap().len(), 0);
    assert_eq!(b["refusals"][0]["code"], "probe_failed");
}

async fn a_bound_token_from_an_unknown_machine_is_unknown_or_passed(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let app = &g.app;
    let healthy = runner_with(app, "build-a", json!([machine(MACHINE_A)])).await;
    beat(app, &healthy.healthy()).await;
    g.gitlab.enqueue();
    for unknown in [Some("s_cccccccccccc"), None] {
        let r = request_job(app, unknown).await;
        assert_eq!(
            (r.status(), header(&r, "x-leasegate-refusal")),
            (StatusCode::NO_CONTENT, Some("unknown_runner")),
            "{unknown:?}"
        );
    }
    assert_eq!(g.gitlab.calls_to(JOBS_REQUEST), 0);
    // A binding of the token alone judges every machine no system_id binding names.
    let any = runner_with(
        app,
        "build-any",
        json!([{"kind": "gitlab", "token_sha256": sha256_hex(FLEET_TOKEN)}]),
    )
    .await;
    beat(app, &any.failing("crun not found")).await;
    let r = request_job(app, Some("s_cccccccccccc")).await;
    assert_eq!(header(&r, "x-leasegate-refusal"), Some("probe_failed"));
    // ... but not the machine that has its own.
    let r = request_job(app, Some(MACHINE_A)).await;
    assert_eq!(r.status(), StatusCode::CREATED);

    let Some(pass) = gated(engine, |a| {
        a.forge_unbound = leasegate::config::ForgeUnbound::Pass
    })
    .await
    else {
        return;
    };
    let healthy = runner_with(&pass.app, "build-a", json!([machine(MACHINE_B)])).await;
    beat(&pass.app, &healthy.failing("crun not found")).await;
    let id = pass.gitlab.enqueue();
    let r = request_job(&pass.app, Some("s_cccccccccccc")).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(r.headers().get("x-leasegate-refusal").is_none());
    assert_eq!(r.json::<Value>().await.unwrap()["id"], id);
}

async fn a_fetch_without_the_runners_token_is_forwarded_untouched(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let app = &g.app;
    let runner = runner_with(
        app,
        "build-01",
        json!([{"kind": "forgejo", "uuid": UUID, "token_sha256": sha256_hex(FORGEJO_TOKEN)}]),
    )
    .await;
    beat(app, &runner.failing("crun not found")).await;
    g.forgejo.enqueue();
    for mode in ["enforce", "observe"] {
        app.admin_put(
            "/api/v1/admin/pools/linux",
            json!({"expected_image_ids": [IMAGE_A], "gate_mode": mode}),
        )
        .await;
        // Someone who knows the uuid but not the token: the forge's own answer, nothing else.
        let r = fetch_task(app, "a-guess").await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{mode}");
        for h in ["x-leasegate-refusal", "x-leasegate-would-refuse"] {
            assert!(r.headers().get(h).is_none(), "{mode}: {h}");
        }
        let view = app.runner(&runner.id).await;
        assert!(
            view["forge_runners"][0]["last_fetch_at"].is_null(),
            "{mode}"
        );
        assert_eq!(view["refusals"].as_array().unwrap().len(), 0, "{mode}");
    }
    assert_eq!(g.forgejo.calls_to(FETCH_TASK), 2);
    // The runner itself, with its token, is judged.
    app.admin_put(
        "/api/v1/admin/pools/linux",
        json!({"expected_image_ids": [IMAGE_A], "gate_mode": "enforce"}),
    )
    .await;
    let r = fetch_task(app, FORGEJO_TOKEN).await;
    assert_eq!(header(&r, "x-leasegate-refusal"), Some("probe_failed"));
    assert_eq!(g.forgejo.calls_to(FETCH_TASK), 2);
    let view = app.runner(&runner.id).await;
    assert!(view["forge_runners"][0]["last_fetch_at"].is_string());
    assert_eq!(
        view["forge_runners"][0]["token_sha256"],
        sha256_hex(FORGEJO_TOKEN)
    );
    assert_eq!(view["refusals"][0]["code"], "probe_failed");
}

async fn bindings_follow_the_claim_of_each_attestation(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    let app = &g.app;
    let first = runner_with(app, "build-01", json!([])).await;
    let forgejo =
        json!({"kind": "forgejo", "uuid": UUID, "token_sha256": sha256_hex(FORGEJO_TOKEN)});
    // The claim binds what the agent found.
    beat(
        app,
        &first.attest(json!({"forge_runners": [forgejo, machine(MACHINE_A)]})),
    )
    .await;
    let view = app.runner(&first.id).await;
    let bound = view["forge_runners"].as_array().unwrap();
    assert_eq!(bound.len(), 2, "{view}");
    assert_eq!(view["forge_runners_taken"], json!([]));
    let audit = &view["audit"][0];
    assert_eq!(
        (audit["action"].as_str(), audit["actor"].as_str()),
        (Some("runner_forge_runners"), Some("leasegate"))
    );
    let audited = view["audit"].as_array().unwrap().len();
    // The same claim again changes nothing and audits nothing.
    beat(
        app,
        &first.attest(json!({"forge_runners": [machine(MACHINE_A), forgejo]})),
    )
    .await;
    let view = app.runner(&first.id).await;
    assert_eq!(view["audit"].as_array().unwrap().len(), audited);
    // An attestation without the claim leaves the bindings alone.
    beat(app, &first.healthy()).await;
    assert_eq!(
        app.runner(&first.id).await["forge_runners"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A renewed token: the old one is unbound and the new one gated from the next fetch.
    let renewed = json!({"kind": "gitlab", "token_sha256": sha256_hex("glrt-renewed"), "system_id": MACHINE_A});
    beat(
        app,
        &first.attest(json!({"forge_runners": [forgejo, renewed]})),
    )
    .await;
    let view = app.runner(&first.id).await;
    let keys: Vec<&str> = view["forge_runners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["token_sha256"].as_str().unwrap())
        .collect();
    assert!(
        keys.contains(&sha256_hex("glrt-renewed").as_str()),
        "{view}"
    );
    assert!(!keys.contains(&sha256_hex(FLEET_TOKEN).as_str()), "{view}");
    g.gitlab.add_runner("glrt-renewed", "glrt-renewed");
    beat(app, &first.attest(json!({"probe": {"ok": false, "error": "crun not found"}, "forge_runners": [forgejo, renewed]}))).await;
    let r = app
        .client
        .post(app.url(JOBS_REQUEST))
        .json(&json!({"token": "glrt-renewed", "system_id": MACHINE_A}))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "x-leasegate-refusal"), Some("probe_failed"));

    // Another runner claiming the uuid does not take it: it is shown as taken on that runner.
    let second = runner_with(app, "build-02", json!([])).await;
    beat(
        app,
        &second.attest(json!({"forge_runners": [forgejo, machine(MACHINE_B)]})),
    )
    .await;
    let view = app.runner(&second.id).await;
    assert_eq!(view["forge_runners"].as_array().unwrap().len(), 1, "{view}");
    assert_eq!(view["forge_runners"][0]["system_id"], MACHINE_B);
    assert_eq!(view["forge_runners_taken"][0]["uuid"], UUID);
    assert_eq!(
        app.runner(&first.id).await["forge_runners"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Once the first lets it go (its machine no longer has it), the second binds it.
    beat(app, &first.attest(json!({"forge_runners": [renewed]}))).await;
    beat(
        app,
        &second.attest(json!({"forge_runners": [forgejo, machine(MACHINE_B)]})),
    )
    .await;
    let view = app.runner(&second.id).await;
    assert_eq!(view["forge_runners"].as_array().unwrap().len(), 2, "{view}");
    assert_eq!(view["forge_runners_taken"], json!([]));
    // A claim that is not well formed is refused as the attestation's other claims would be.
    let r = app
        .heartbeat(
            &second.attest(json!({"forge_runners": [{"kind": "gitlab", "token": "glrt-raw"}]})),
        )
        .await;
    expect_problem(
        r,
        "a raw token",
        StatusCode::UNAUTHORIZED,
        "attestation_invalid",
    )
    .await;
    assert_eq!(
        app.runner(&second.id).await["forge_runners"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}
