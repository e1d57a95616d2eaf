//! A third-party GitLab runner client, the `gitlab-runner-api` package from PyPI, driven
//! through the forge gate against the test GitLab: `Runner.request_job()` gets `None` for a
//! refused runner (the gate's held 204) and the job for an eligible one (GitLab's 201, relayed).
//! Without Python or the package the test says so and skips; `LEASEGATE_REQUIRE_GITLAB_RUNNER_API=1`
//! (set by `.ci/run`, which installs it) makes that a failure.

use crate::common;

use common::forges;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const TOKEN: &str = "glrt-python-client-token";

/// The client's view, from a short script: `{"verified": true, "job": null | {id, token}}`.
const SCRIPT: &str = r#"
import json, sys
import gitlab_runner_api as g
url, token = sys.argv[1], sys.argv[2]
runner = g.Runner(url, 1, token, {"info": {"name": "gitlab-runner-api", "version": "1.0"}})
job = runner.request_job()
print(json.dumps({"verified": True, "job": None if job is None else {"id": job.id, "token": job.token}}))
"#;

fn client_available() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import gitlab_runner_api"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("LEASEGATE_REQUIRE_GITLAB_RUNNER_API").as_deref() != Ok("1"),
            "LEASEGATE_REQUIRE_GITLAB_RUNNER_API=1 but python3 cannot import gitlab_runner_api"
        );
        common::skip::skipped(
            "gitlab-runner-api not installed (python3 -m pip install gitlab-runner-api)",
        );
    }
    ok
}

async fn request_job_with_the_client(base: &str) -> Value {
    let out = tokio::process::Command::new("python3")
        .args(["-c", SCRIPT, base, TOKEN])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

each_engine!(the_gitlab_runner_api_client_gets_none_when_refused_and_the_job_when_eligible);

async fn the_gitlab_runner_api_client_gets_none_when_refused_and_the_job_when_eligible(
    engine: Engine,
) {
    if !client_available() {
        return;
    }
    let gitlab = forges::gitlab(1).await;
    gitlab.add_runner(TOKEN, TOKEN);
    let base = gitlab.base.clone();
    let Some(app) = spawn_app_on_with(engine, move |a| {
        a.gitlab_upstream = Some(base);
        a.forge_hold_s = 1;
    })
    .await
    else {
        return;
    };
    let gated = &app;
    app.pool("linux", &[IMAGE_A]).await;
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let sha = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(TOKEN.as_bytes()))
    };
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": "gl-01", "public_key": key.public_jwk(),
        "forge_runners": [{"kind": "gitlab", "token_sha256": sha}]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let runner = TestRunner {
        id: r.json::<Value>().await.unwrap()["runner_id"]
            .as_str()
            .unwrap()
            .into(),
        pool: "linux".into(),
        key,
    };
    let id = gitlab.enqueue();

    assert_eq!(
        app.heartbeat(&runner.failing("crun not found"))
            .await
            .status(),
        StatusCode::OK
    );
    let refused = request_job_with_the_client(&gated.base).await;
    assert_eq!(refused, json!({"verified": true, "job": null}));
    assert_eq!(gitlab.queued(), vec![id]);

    assert_eq!(
        app.heartbeat(&runner.healthy()).await.status(),
        StatusCode::OK
    );
    let eligible = request_job_with_the_client(&gated.base).await;
    assert_eq!(eligible["job"]["id"], id);
    assert_eq!(eligible["job"]["token"], format!("job-token-{id}"));
}
