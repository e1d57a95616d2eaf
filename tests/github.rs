//! GitHub Actions under the gate (issue: the just-in-time runner config is the lease), against
//! a test double of GitHub's REST API that holds every request to GitHub's published
//! description (`tests/common/github.rs`, `tests/github_rest.json`), on both engines:
//!
//! - a refused runner's request makes no call to GitHub; an admitted runner's mints once,
//!   with its pool's group, labels and work folder, under `<runner>-<8 hex>`;
//! - a GitHub App's installation token is fetched once and reused, and fetched again after a
//!   401; a token credential is used as it is;
//! - one registration at a time; an unused one is withdrawn after the TTL, an online idle one
//!   as soon as its runner's probe fails, a busy one never, a foreign runner never;
//! - a pool that observes mints and records; GitHub's 403, 429, 5xx, 404, 409 give the
//!   answers PROTOCOL.md gives;
//! - every step is in the runner's detail, the audit trail, the page and the metrics.

use crate::common;

use common::github::{Auth, Failure, FakeGithub, app_keys};
use common::*;
use leasegate::domain::time::Millis;
use leasegate::github::watcher::{WatchReport, watch_once};
use reqwest::StatusCode;
use serde_json::{Value, json};

const APP_ID: u64 = 4242;
const INSTALLATION_ID: u64 = 77;
const LABELS: [&str; 3] = ["linux", "x64", "leasegate"];

fn app_auth() -> Auth {
    Auth::App {
        app_id: APP_ID,
        installation_id: INSTALLATION_ID,
    }
}

/// The service, with GitHub's double and a credential for it (a GitHub App, or a token).
struct Setup {
    app: TestApp,
    github: FakeGithub,
    _keys: tempfile::TempDir,
}

async fn setup(engine: Engine, auth: Auth) -> Option<Setup> {
    setup_with(engine, auth, |_| {}).await
}

async fn setup_with(
    engine: Engine,
    auth: Auth,
    adjust: impl FnOnce(&mut leasegate::config::ServeArgs) + Send + 'static,
) -> Option<Setup> {
    let github = FakeGithub::start(auth.clone()).await;
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("app.pem");
    std::fs::write(&key_file, &app_keys().private_pem).unwrap();
    // The tests look when they choose (`Setup::look`, at the time they choose): the service's
    // own watcher never takes a turn, as a replica that holds it keeps every other one, so
    // that no look of its own lands between a test's step and its assertion. The turn is held
    // before the watcher first runs (a watcher starts with a look, and one already under way
    // when the turn was taken from it could land anywhere in a busy test): the service starts
    // without GitHub, the turn is held in its database, and it starts again with GitHub.
    let app = spawn_app_on_with(engine, |_| {}).await?;
    let forever = Millis(i64::MAX / 2);
    assert!(
        app.state
            .store()
            .claim_task("github", forever, forever)
            .await
            .unwrap(),
        "the watcher's turn is held"
    );
    let url = github.url.clone();
    let app = app
        .restart_with(move |args| {
            args.github_api_url = url;
            match auth {
                Auth::App {
                    app_id,
                    installation_id,
                } => {
                    args.github_app_id = Some(app_id);
                    args.github_installation_id = Some(installation_id);
                    args.github_app_key_file = Some(key_file);
                }
                Auth::Token(token) => args.github_token = Some(token),
            }
            args.github_poll_s = 10;
            args.github_unused_ttl_s = 300;
            adjust(args);
        })
        .await;
    Some(Setup {
        app,
        github,
        _keys: keys,
    })
}

impl Setup {
    /// A pool on `IMAGE_A` whose runners register in `orgs/acme`, in `gate_mode`.
    async fn pool(&self, name: &str, gate_mode: &str) -> Value {
        let r = self
            .app
            .admin_put(
                &format!("/api/v1/admin/pools/{name}"),
                json!({
                    "expected_image_ids": [IMAGE_A],
                    "gate_mode": gate_mode,
                    "github": {"scope": "orgs/acme", "runner_group_id": 3, "labels": LABELS, "work_folder": "jobs"},
                }),
            )
            .await;
        assert!(r.status().is_success(), "pool {name}: {}", r.status());
        r.json().await.unwrap()
    }

    async fn ask(&self, attestation: &str) -> reqwest::Response {
        self.app
            .post(
                "/api/v1/github/runners",
                json!({"attestation": attestation}),
            )
            .await
    }

    /// Asks for `runner`'s registration with a healthy attestation, asserting it is minted.
    async fn minted(&self, runner: &TestRunner) -> Value {
        let r = self.ask(&runner.healthy()).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        r.json().await.unwrap()
    }

    /// One look of the watcher at `now`.
    async fn look(&self, now: Millis) -> WatchReport {
        let github = self.app.state.github().unwrap().clone();
        watch_once(&self.app.state.github_context(), &github, now)
            .await
            .unwrap()
    }

    async fn registrations(&self, runner: &TestRunner) -> Vec<Value> {
        self.app.runner(&runner.id).await["github_registrations"]
            .as_array()
            .unwrap()
            .clone()
    }

    async fn audit_actions(&self, runner: &TestRunner) -> Vec<String> {
        let r = self
            .app
            .admin_get(&format!("/api/v1/admin/audit?target={}", runner.id))
            .await;
        let body: Value = r.json().await.unwrap();
        let mut actions: Vec<String> = body["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].as_str().unwrap().to_string())
            .filter(|a| a.starts_with("github_"))
            .collect();
        actions.reverse();
        actions
    }

    async fn metric(&self, outcome: &str, code: &str) -> u64 {
        let text = self.app.metrics_text().await;
        let series = format!(
            "leasegate_github_registrations_total{{outcome=\"{outcome}\",code=\"{code}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

async fn a_refused_runner_makes_no_call_to_github_and_an_admitted_one_mints_once(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let runner = s.app.register("gh", "build-01").await;

    let refused = s
        .ask(&runner.failing("default OCI runtime \"crun\" not found: invalid argument"))
        .await;
    assert_eq!(refused.headers()["retry-after"], "15");
    let body = expect_problem(
        refused,
        "probe failed",
        StatusCode::CONFLICT,
        "probe_failed",
    )
    .await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("crun\" not found"),
        "{body}"
    );
    let drifted = s
        .ask(&runner.attest(json!({"image": {"id": IMAGE_B}})))
        .await;
    expect_problem(drifted, "drift", StatusCode::CONFLICT, "image_drift").await;
    assert!(
        s.github.calls().is_empty(),
        "a refusal calls GitHub: {:?}",
        s.github.calls()
    );
    // Refused as a lease would be, and recorded as a lease's refusal is.
    let detail = s.app.runner(&runner.id).await;
    assert_eq!(detail["refusals"][0]["code"], "image_drift", "{detail}");
    assert_eq!(s.metric("refused", "probe_failed").await, 1);

    let minted = s.minted(&runner).await;
    let name = minted["name"].as_str().unwrap();
    assert!(
        name.starts_with("build-01-") && name.len() == "build-01-".len() + 8,
        "{name}"
    );
    assert!(
        name["build-01-".len()..]
            .chars()
            .all(|c| c.is_ascii_hexdigit()),
        "{name}"
    );
    let id = minted["github_runner_id"].as_i64().unwrap();
    assert_eq!(
        minted["encoded_jit_config"],
        common::github::jit_config_for(id, name),
        "the JIT config is GitHub's, passed on"
    );
    let expires = Millis::parse_rfc3339(minted["expires_at"].as_str().unwrap()).unwrap();
    assert!(
        (Millis::now().plus_secs(300).0 - expires.0).abs() < 5_000,
        "{minted}"
    );

    let generated = s.github.calls_to("generate-jitconfig");
    assert_eq!(generated.len(), 1);
    assert_eq!(
        generated[0].path,
        "/orgs/acme/actions/runners/generate-jitconfig"
    );
    assert_eq!(
        generated[0].body,
        json!({"name": name, "runner_group_id": 3, "labels": LABELS, "work_folder": "jobs"})
    );
    let at_github = s.github.runner(id).unwrap();
    assert_eq!((at_github.online, at_github.busy), (false, false));

    // Recorded (never the JIT config), audited, counted.
    let regs = s.registrations(&runner).await;
    assert_eq!(regs.len(), 1);
    assert_eq!(regs[0]["state"], "minted");
    assert_eq!(regs[0]["github_runner_id"], id);
    assert_eq!(regs[0]["scope"], "orgs/acme");
    let stored = serde_json::to_string(&s.app.runner(&runner.id).await).unwrap();
    assert!(!stored.contains(minted["encoded_jit_config"].as_str().unwrap()));
    assert_eq!(s.audit_actions(&runner).await, ["github_runner_minted"]);
    assert_eq!(s.metric("minted", "none").await, 1);
    s.github.assert_clean();
}

async fn one_registration_at_a_time_and_the_apps_token_is_fetched_once(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let a = s.app.register("gh", "a").await;
    let b = s.app.register("gh", "b").await;
    let first = s.minted(&a).await;
    s.minted(&b).await;

    let again = s.ask(&a.healthy()).await;
    assert_eq!(again.headers()["retry-after"], "10", "the poll interval");
    let body = expect_problem(
        again,
        "outstanding",
        StatusCode::CONFLICT,
        "github_runner_outstanding",
    )
    .await;
    assert_eq!(
        body["github_runner_id"], first["github_runner_id"],
        "{body}"
    );
    assert_eq!(s.github.calls_to("generate-jitconfig").len(), 2);

    s.look(Millis::now()).await;
    assert_eq!(
        s.github.tokens_issued(),
        1,
        "one installation token for every call"
    );
    for call in s.github.calls() {
        let auth = call.headers["authorization"].to_str().unwrap();
        let expected = if call.op == "access_tokens" {
            "Bearer ey"
        } else {
            "Bearer ghs_test1_"
        };
        assert!(auth.starts_with(expected), "{} {auth}", call.op);
        assert_eq!(
            call.headers["user-agent"].to_str().unwrap(),
            concat!("leasegate/", env!("CARGO_PKG_VERSION"))
        );
    }

    // GitHub revokes it: a 401, a new token, the call made again, once.
    s.github.revoke_tokens();
    let c = s.app.register("gh", "c").await;
    s.minted(&c).await;
    assert_eq!(s.github.tokens_issued(), 2);
    // A token near its end is renewed before it is used.
    s.github.set_token_lifetime(120);
    let d = s.app.register("gh", "d").await;
    s.github.revoke_tokens();
    s.minted(&d).await;
    let issued = s.github.tokens_issued();
    s.look(Millis::now()).await;
    assert_eq!(
        s.github.tokens_issued(),
        issued + 1,
        "a token with 2 min left is renewed"
    );
    s.github.assert_clean();
}

async fn a_token_credential_is_used_as_it_is(engine: Engine) {
    let Some(s) = setup(engine, Auth::Token("github_pat_0123456789".into())).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let runner = s.app.register("gh", "tok").await;
    s.minted(&runner).await;
    s.look(Millis::now()).await;
    assert!(s.github.calls_to("access_tokens").is_empty());
    for call in s.github.calls() {
        assert_eq!(
            call.headers["authorization"],
            "Bearer github_pat_0123456789"
        );
    }
    s.github.assert_clean();
}

async fn a_registration_goes_online_busy_done_and_an_unused_one_is_withdrawn_after_the_ttl(
    engine: Engine,
) {
    // The looks below are minutes ahead: the runners' attestations must stay fresh that long.
    let Some(s) = setup_with(engine, app_auth(), |a| {
        a.attestation_max_age_s = 900;
        a.probe_max_age_s = 900;
    })
    .await
    else {
        return;
    };
    s.pool("gh", "enforce").await;
    let worker = s.app.register("gh", "worker").await;
    let idle = s.app.register("gh", "idle").await;
    let id = s.minted(&worker).await["github_runner_id"]
        .as_i64()
        .unwrap();
    let unused = s.minted(&idle).await["github_runner_id"].as_i64().unwrap();
    // Someone else's runner in the same organization: never leasegate's to touch.
    let foreign = s.github.add_foreign_runner("orgs/acme", "theirs", false);
    s.github.set_page_size(1);

    s.github.set_runner(id, true, false);
    s.look(Millis::now()).await;
    assert_eq!(s.registrations(&worker).await[0]["state"], "online");
    assert_eq!(
        s.github.calls_to("list").len(),
        3,
        "one list call (of 3 pages) per scope per look"
    );
    assert_eq!(
        s.github.calls_to("list")[0].query.as_deref(),
        Some("per_page=100")
    );
    s.github.set_runner(id, true, true);
    s.look(Millis::now()).await;
    s.github.remove_runner(id);
    s.look(Millis::now()).await;
    let reg = &s.registrations(&worker).await[0];
    assert_eq!(
        (&reg["state"], &reg["end_reason"]),
        (&json!("done"), &json!("done")),
        "{reg}"
    );
    for step in ["online_at", "busy_at", "ended_at"] {
        assert!(reg[step].is_string(), "{step}: {reg}");
    }
    assert_eq!(
        s.audit_actions(&worker).await,
        [
            "github_runner_minted",
            "github_runner_online",
            "github_runner_busy",
            "github_runner_done"
        ]
    );

    // The unused one: kept until its TTL, then withdrawn.
    s.look(Millis::now().plus_secs(299)).await;
    assert!(s.github.runner(unused).is_some());
    assert!(s.github.calls_to("delete").is_empty());
    let report = s.look(Millis::now().plus_secs(301)).await;
    assert_eq!(report.withdrawn, 1, "{report:?}");
    assert!(s.github.runner(unused).is_none(), "deleted in GitHub");
    let deletes = s.github.calls_to("delete");
    assert_eq!(deletes.len(), 1);
    assert_eq!(
        deletes[0].path,
        format!("/orgs/acme/actions/runners/{unused}")
    );
    let reg = &s.registrations(&idle).await[0];
    assert_eq!(
        (&reg["state"], &reg["end_reason"]),
        (&json!("deleted"), &json!("unused"))
    );
    assert!(
        s.github.runner(foreign).is_some(),
        "a runner leasegate did not mint is left alone"
    );
    assert_eq!(s.metric("deleted", "unused").await, 1);
    assert_eq!(s.metric("done", "done").await, 1);
    // Asked again once the first is done: a new registration.
    let second = s.minted(&worker).await;
    assert_ne!(second["github_runner_id"], id);
    s.github.assert_clean();
}

async fn an_idle_registration_is_withdrawn_when_its_runner_breaks_but_a_busy_one_is_not(
    engine: Engine,
) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let breaks = s.app.register("gh", "breaks").await;
    let working = s.app.register("gh", "working").await;
    let idle_id = s.minted(&breaks).await["github_runner_id"]
        .as_i64()
        .unwrap();
    let busy_id = s.minted(&working).await["github_runner_id"]
        .as_i64()
        .unwrap();
    s.github.set_runner(idle_id, true, false);
    s.github.set_runner(busy_id, true, true);
    s.look(Millis::now()).await;

    // Both machines' runtimes break while their GitHub runners wait or work.
    for runner in [&breaks, &working] {
        let r = s
            .app
            .heartbeat(&runner.failing("crun: cannot allocate memory"))
            .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let report = s.look(Millis::now()).await;
    assert_eq!(
        report.withdrawn, 1,
        "at the first look after the failed probe: {report:?}"
    );
    assert!(
        s.github.runner(idle_id).is_none(),
        "the idle one is withdrawn"
    );
    assert!(
        s.github.runner(busy_id).is_some(),
        "the busy one is never deleted"
    );
    let reg = &s.registrations(&breaks).await[0];
    assert_eq!(
        (&reg["state"], &reg["end_reason"]),
        (&json!("deleted"), &json!("probe_failed")),
        "{reg}"
    );
    assert_eq!(s.registrations(&working).await[0]["state"], "busy");
    let deletes = s.github.calls_to("delete");
    assert_eq!(
        deletes.len(),
        1,
        "no delete is tried on a busy registration"
    );
    let audit = s
        .app
        .admin_get(&format!("/api/v1/admin/audit?target={}", breaks.id))
        .await
        .json::<Value>()
        .await
        .unwrap();
    let withdrawn = &audit["entries"][0];
    assert_eq!(withdrawn["action"], "github_runner_deleted");
    assert_eq!(withdrawn["actor"], "leasegate");
    assert!(
        withdrawn["detail"]
            .as_str()
            .unwrap()
            .contains("cannot allocate memory"),
        "{withdrawn}"
    );
    assert_eq!(s.metric("deleted", "probe_failed").await, 1);

    // A registration that takes its job as it is withdrawn (GitHub's 422) is kept.
    let late = s.app.register("gh", "late").await;
    let late_id = s.minted(&late).await["github_runner_id"].as_i64().unwrap();
    s.github.set_runner(late_id, true, false);
    s.look(Millis::now()).await;
    s.app.heartbeat(&late.failing("crun gone")).await;
    s.github.fail_next(
        "delete",
        Failure::status(422, "Bad request - Runner is still running a job"),
    );
    s.look(Millis::now()).await;
    assert!(s.github.runner(late_id).is_some());
    assert_ne!(s.registrations(&late).await[0]["state"], "deleted");
    assert_eq!(s.metric("kept", "busy").await, 1);
    s.github.assert_clean();
}

async fn a_stale_runner_loses_its_idle_registration(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let runner = s.app.register("gh", "silent").await;
    let id = s.minted(&runner).await["github_runner_id"]
        .as_i64()
        .unwrap();
    s.github.set_runner(id, true, false);
    s.look(Millis::now()).await;
    assert!(s.github.runner(id).is_some(), "fresh: kept");
    // No attestation for over a minute: its agent stopped.
    s.look(Millis::now().plus_secs(61)).await;
    assert!(s.github.runner(id).is_none());
    assert_eq!(
        s.registrations(&runner).await[0]["end_reason"],
        "attestation_expired"
    );
}

async fn a_pool_that_observes_mints_for_refused_runners_and_records_it(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("watching", "observe").await;
    let runner = s.app.register("watching", "flaky").await;
    let r = s.ask(&runner.failing("crun not found")).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["x-leasegate-would-refuse"], "probe_failed");
    let id = r.json::<Value>().await.unwrap()["github_runner_id"]
        .as_i64()
        .unwrap();
    let detail = s.app.runner(&runner.id).await;
    assert_eq!(
        detail["refusals"][0]["code"], "probe_failed",
        "recorded: {detail}"
    );
    assert_eq!(
        detail["github_registrations"][0]["would_refuse"],
        "probe_failed"
    );
    assert_eq!(s.metric("observed", "probe_failed").await, 1);
    // Its idle registration is kept too, and what would have withdrawn it is noted once.
    s.github.set_runner(id, true, false);
    s.look(Millis::now()).await;
    s.look(Millis::now()).await;
    assert!(s.github.runner(id).is_some());
    assert!(s.github.calls_to("delete").is_empty());
    assert_eq!(s.metric("would_delete", "probe_failed").await, 1);
    s.github.assert_clean();
}

async fn githubs_refusals_and_outages_are_answered_and_nothing_is_recorded(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let runner = s.app.register("gh", "unlucky").await;
    let now_s = Millis::now().0 / 1000;
    let cases = [
        (
            Failure::status(403, "Resource not accessible by integration"),
            StatusCode::BAD_GATEWAY,
            "github_refused",
            None,
        ),
        (
            Failure::status(403, "API rate limit exceeded")
                .header("x-ratelimit-remaining", 0)
                .header("x-ratelimit-reset", now_s + 120),
            StatusCode::SERVICE_UNAVAILABLE,
            "github_unavailable",
            Some(120),
        ),
        (
            Failure::status(403, "You have exceeded a secondary rate limit")
                .header("retry-after", 37),
            StatusCode::SERVICE_UNAVAILABLE,
            "github_unavailable",
            Some(37),
        ),
        (
            Failure::status(429, "Too many requests"),
            StatusCode::SERVICE_UNAVAILABLE,
            "github_unavailable",
            Some(60),
        ),
        (
            Failure::status(502, "Server Error"),
            StatusCode::SERVICE_UNAVAILABLE,
            "github_unavailable",
            Some(30),
        ),
        (
            Failure::status(404, "Not Found"),
            StatusCode::BAD_GATEWAY,
            "github_refused",
            None,
        ),
        (
            Failure::status(422, "Validation Failed"),
            StatusCode::BAD_GATEWAY,
            "github_refused",
            None,
        ),
    ];
    for (failure, status, code, retry) in cases {
        let case = format!("{} {}", failure.status, failure.message);
        s.github.fail_next("generate-jitconfig", failure);
        let r = s.ask(&runner.healthy()).await;
        let retry_after = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse::<i64>().unwrap());
        let body = expect_problem(r, &case, status, code).await;
        let detail = body["detail"].as_str().unwrap();
        match retry {
            Some(secs) => assert!(
                retry_after.is_some_and(|r| (r - secs).abs() <= 2),
                "{case}: {retry_after:?}"
            ),
            None => {
                assert!(
                    detail.contains("Self-hosted runners: write"),
                    "{case}: {detail}"
                );
                assert!(
                    detail.contains(&case[4..]),
                    "GitHub's message: {case}: {detail}"
                );
            }
        }
        assert!(
            s.registrations(&runner).await.is_empty(),
            "{case}: nothing recorded as minted"
        );
    }
    assert_eq!(s.metric("failed", "github_refused").await, 3);
    assert_eq!(s.metric("failed", "github_unavailable").await, 4);
    // A name GitHub already has: asked once more under another.
    s.github
        .fail_next("generate-jitconfig", Failure::status(409, "Already exists"));
    let minted = s.minted(&runner).await;
    let tries = s.github.calls_to("generate-jitconfig");
    let (a, b) = (&tries[tries.len() - 2], &tries[tries.len() - 1]);
    assert_ne!(a.body["name"], b.body["name"]);
    assert_eq!(b.body["name"], minted["name"]);
    s.github.assert_clean();
}

async fn an_unreachable_github_is_503_and_nothing_is_recorded(engine: Engine) {
    let (_held, refusing) = refusing_address();
    let Some(app) = spawn_app_on_with(engine, move |a| {
        a.github_api_url = format!("http://{refusing}");
        a.github_token = Some("github_pat_unused".into());
    })
    .await
    else {
        return;
    };
    let r = app
        .admin_put(
            "/api/v1/admin/pools/gh",
            json!({"expected_image_ids": [IMAGE_A], "github": {"scope": "orgs/acme", "labels": ["x"]}}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let runner = app.register("gh", "alone").await;
    let r = app
        .post(
            "/api/v1/github/runners",
            json!({"attestation": runner.healthy()}),
        )
        .await;
    assert_eq!(r.headers()["retry-after"], "30");
    let body = expect_problem(
        r,
        "unreachable",
        StatusCode::SERVICE_UNAVAILABLE,
        "github_unavailable",
    )
    .await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("cannot reach GitHub"),
        "{body}"
    );
    assert_eq!(
        app.runner(&runner.id).await["github_registrations"],
        json!([])
    );
}

/// GitHub takes longer to mint than the watcher's window for a reservation, and the watcher,
/// not finding the runner in GitHub's list, settles the reservation meanwhile. The runner
/// GitHub then makes is withdrawn and the request answered 503, rather than a registration
/// handed out that nothing records (nothing would withdraw it, and its machine could mint
/// another at once).
async fn a_mint_that_outlasts_its_reservation_is_withdrawn_not_handed_out(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let runner = s.app.register("gh", "build-01").await;
    let hold = s.github.hold_next("generate-jitconfig");
    let asking = {
        let (app, attestation) = (s.app.client.clone(), runner.healthy());
        let url = s.app.url("/api/v1/github/runners");
        tokio::spawn(async move {
            app.post(url)
                .json(&json!({"attestation": attestation}))
                .send()
                .await
                .unwrap()
        })
    };
    hold.arrived.notified().await;
    let window = leasegate::domain::github::registration::MINTING_WINDOW_S;
    s.look(Millis::now().plus_secs(window + 1)).await;
    assert_eq!(
        s.registrations(&runner).await,
        Vec::<Value>::new(),
        "settled"
    );

    hold.release.notify_one();
    let r = asking.await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(s.github.runners().is_empty(), "withdrawn from GitHub");
    assert_eq!(s.github.calls_to("delete").len(), 1);
    assert_eq!(s.registrations(&runner).await, Vec::<Value>::new());
    s.github.assert_clean();
}

async fn the_pools_github_object_is_checked_shown_and_required(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    let view = s.pool("gh", "enforce").await;
    assert_eq!(
        view["github"],
        json!({"scope": "orgs/acme", "runner_group_id": 3, "labels": LABELS, "work_folder": "jobs"})
    );
    let put = |github: Value| {
        s.app.admin_put(
            "/api/v1/admin/pools/bad",
            json!({"expected_image_ids": [IMAGE_A], "github": github}),
        )
    };
    for (github, names) in [
        (json!({"scope": "acme", "labels": ["x"]}), "github.scope"),
        (json!({"scope": "orgs/acme", "labels": []}), "github.labels"),
        (
            json!({"scope": "orgs/acme", "labels": ["a,b"]}),
            "github.labels[0]",
        ),
        (
            json!({"scope": "orgs/acme", "labels": ["x"], "runner_group_id": 0}),
            "github.runner_group_id",
        ),
        (
            json!({"scope": "orgs/acme", "labels": ["x"], "work_folder": "../up"}),
            "github.work_folder",
        ),
        (
            json!({"scope": "orgs/acme", "labels": ["x"], "runners_group_id": 2}),
            "runners_group_id",
        ),
    ] {
        let body = expect_problem(
            put(github.clone()).await,
            &github.to_string(),
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
        assert!(
            body["detail"].as_str().unwrap().contains(names),
            "{github}: {body}"
        );
    }
    // Defaults: group 1, `_work`.
    let r = s
        .app
        .admin_put("/api/v1/admin/pools/repo", json!({"expected_image_ids": [IMAGE_A], "github": {"scope": "repos/acme/.github", "labels": ["x"]}}))
        .await;
    let view: Value = r.json().await.unwrap();
    assert_eq!(view["github"]["runner_group_id"], 1);
    assert_eq!(view["github"]["work_folder"], "_work");

    // A PATCH that does not name it keeps it; one that names it null removes it.
    let patch = |body: Value| {
        s.app
            .client
            .patch(s.app.url("/api/v1/admin/pools/repo"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
    };
    let kept: Value = patch(json!({"gate_mode": "observe"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(kept["github"], view["github"], "{kept}");
    // A patch of the object merges into it (RFC 7396), as the documented patch schema says:
    // `{}` changes nothing, a label list alone keeps the scope.
    let same: Value = patch(json!({"github": {}}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(same["github"], view["github"], "{same}");
    let relabelled: Value = patch(json!({"github": {"labels": ["y"]}}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(relabelled["github"]["scope"], "repos/acme/.github");
    assert_eq!(relabelled["github"]["labels"], json!(["y"]));
    let removed: Value = patch(json!({"github": null}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(removed["github"], Value::Null, "{removed}");
    // Onto none, a partial object is a partial PUT body: refused, nothing changed.
    let r = patch(json!({"github": {"labels": ["y"]}})).await.unwrap();
    let body = expect_problem(
        r,
        "partial github onto none",
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("scope"), "{body}");

    // A pool without one: refused before GitHub is asked.
    s.app.pool("plain", &[IMAGE_A]).await;
    let runner = s.app.register("plain", "nowhere").await;
    let r = s.ask(&runner.healthy()).await;
    let body = expect_problem(
        r,
        "no github object",
        StatusCode::CONFLICT,
        "pool_not_github",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("plain"), "{body}");
    assert!(s.github.calls().is_empty());
}

async fn without_a_credential_the_route_answers_404(engine: Engine) {
    let Some(app) = spawn_app_on(engine).await else {
        return;
    };
    assert!(app.state.github().is_none());
    let r = app
        .post("/api/v1/github/runners", json!({"attestation": "x.y.z"}))
        .await;
    let body = expect_problem(r, "off", StatusCode::NOT_FOUND, "not_found").await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("LEASEGATE_GITHUB_APP_ID"),
        "{body}"
    );
}

async fn the_runners_page_shows_each_step(engine: Engine) {
    let Some(s) = setup(engine, app_auth()).await else {
        return;
    };
    s.pool("gh", "enforce").await;
    let runner = s.app.register("gh", "paged").await;
    let id = s.minted(&runner).await["github_runner_id"]
        .as_i64()
        .unwrap();
    s.github.set_runner(id, true, false);
    s.look(Millis::now()).await;
    s.app.heartbeat(&runner.failing("crun not found")).await;
    s.look(Millis::now()).await;
    let html = s
        .app
        .client
        .get(s.app.url(&format!("/admin/runners/{}", runner.id)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("GitHub registrations"), "{html}");
    assert!(html.contains(&format!("<code>{id}</code>")), "{html}");
    assert!(
        html.contains("withdrawn: runner refused (probe_failed)"),
        "{html}"
    );
    assert!(html.contains("github_runner_deleted"), "{html}");
}

each_engine!(
    a_refused_runner_makes_no_call_to_github_and_an_admitted_one_mints_once,
    one_registration_at_a_time_and_the_apps_token_is_fetched_once,
    a_token_credential_is_used_as_it_is,
    a_registration_goes_online_busy_done_and_an_unused_one_is_withdrawn_after_the_ttl,
    an_idle_registration_is_withdrawn_when_its_runner_breaks_but_a_busy_one_is_not,
    a_stale_runner_loses_its_idle_registration,
    a_pool_that_observes_mints_for_refused_runners_and_records_it,
    githubs_refusals_and_outages_are_answered_and_nothing_is_recorded,
    an_unreachable_github_is_503_and_nothing_is_recorded,
    a_mint_that_outlasts_its_reservation_is_withdrawn_not_handed_out,
    the_pools_github_object_is_checked_shown_and_required,
    without_a_credential_the_route_answers_404,
    the_runners_page_shows_each_step,
);
