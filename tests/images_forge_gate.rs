//! The forge gate and several images: a Forgejo runner whose one image of several drifted
//! asks for a task and gets none, refused `image_drift` naming the image's ref and label, and
//! the forge never hears of the fetch; back on its pool's images, its next fetch goes through.
//! A refusal for those images is confirmed against the database first: another replica's cache
//! may hold an older attestation's (a change of only them is not announced).

use crate::common;

use common::forges::{self, FETCH_TASK, FORGEJO_TOKEN, UUID, runner_v1};
use common::*;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};

const IMAGE_C: &str = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
const IMAGE_E: &str = "sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

each_engine!(
    a_forgejo_runner_off_one_of_its_images_gets_no_task_naming_it,
    a_refusal_for_images_the_cache_holds_is_confirmed_against_the_database,
);

/// What the runner attests: node on `node`, the others on their pool's images.
fn running(node: &str) -> Value {
    json!({"images": [
        {"ref": "node:20-bookworm", "id": node, "labels": ["ubuntu-latest", "ubuntu-24.04"]},
        {"ref": "ghcr.io/catthehacker/ubuntu:act-22.04", "id": IMAGE_B, "labels": ["ubuntu-22.04"]},
        {"ref": "postgres:16", "id": IMAGE_C},
    ]})
}

/// A Forgejo runner's `FetchTask`, in protobuf as forgejo-runner sends it; the answer's
/// refusal header, and whether it holds a task.
async fn fetch_task(app: &TestApp) -> (Option<String>, bool) {
    let r = app
        .client
        .post(app.url(FETCH_TASK))
        .header("connect-protocol-version", "1")
        .header("x-runner-uuid", UUID)
        .header("x-runner-token", FORGEJO_TOKEN)
        .header("content-type", "application/proto")
        .body(runner_v1::FetchTaskRequest { tasks_version: 0 }.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let refusal = r
        .headers()
        .get("x-leasegate-refusal")
        .map(|v| v.to_str().unwrap().to_string());
    let body = r.bytes().await.unwrap();
    let answer = runner_v1::FetchTaskResponse::decode(body.as_ref()).unwrap();
    (refusal, answer.task.is_some())
}

/// The gated forge, its pool of three images, and a runner bound to the Forgejo runner.
async fn three_images(engine: Engine) -> Option<(forges::Gated, TestRunner)> {
    let g = forges::gated(engine, "glrt-unused", 1, |_| {}).await?;
    let r = g
        .app
        .admin_put(
            "/api/v1/admin/pools/docker",
            json!({"images": [
                {"ref": "node:20-bookworm", "expected_image_ids": [IMAGE_A]},
                {"ref": "ghcr.io/catthehacker/ubuntu:act-22.04", "expected_image_ids": [IMAGE_B]},
                {"ref": "postgres:16", "expected_image_ids": [IMAGE_C]},
            ]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let token = g.app.registration_token("docker").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let r = g
        .app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": "docker-01", "public_key": key.public_jwk(),
                   "forge_runners": [{"kind": "forgejo", "uuid": UUID}]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    let runner = TestRunner {
        id: body["runner_id"].as_str().unwrap().into(),
        pool: "docker".into(),
        key,
    };
    Some((g, runner))
}

async fn a_forgejo_runner_off_one_of_its_images_gets_no_task_naming_it(engine: Engine) {
    let Some((g, runner)) = three_images(engine).await else {
        return;
    };

    // node:20-bookworm drifted; its two other images are current.
    let hb: Value = g
        .app
        .heartbeat(&runner.attest(running(IMAGE_E)))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hb["code"], "image_drift", "{hb}");
    g.forgejo.enqueue();
    let (refusal, task) = fetch_task(&g.app).await;
    assert_eq!((refusal.as_deref(), task), (Some("image_drift"), false));
    assert_eq!(
        g.forgejo.calls_to(FETCH_TASK),
        0,
        "the forge saw a refused fetch"
    );
    let view = g.app.runner(&runner.id).await;
    let refused = &view["refusals"][0];
    assert_eq!(refused["code"], "image_drift", "{view}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(detail.contains("forgejo fetch"), "{detail}");
    assert!(
        detail.contains(&format!(
            "image node:20-bookworm (labels ubuntu-latest, ubuntu-24.04) runs {IMAGE_E} but its pool expects {IMAGE_A}"
        )),
        "{detail}"
    );

    // Back on its pool's images: the fetch goes through to the forge, which hands the task.
    g.app.heartbeat(&runner.attest(running(IMAGE_A))).await;
    let (refusal, task) = fetch_task(&g.app).await;
    assert_eq!((refusal, task), (None, true));
    assert_eq!(g.forgejo.calls_to(FETCH_TASK), 1);
}

/// A round announces a runner's change to other replicas when its status or its running
/// image changed, not when only the other images it claims did: another replica's cache may
/// hold the images of an older attestation. A fetch refused for its images is confirmed
/// against the database before it is refused, as a refusal for age is. Here the runner's
/// images are put back on its pool's behind the service (as another replica's unannounced
/// write), and its next fetch goes through.
async fn a_refusal_for_images_the_cache_holds_is_confirmed_against_the_database(engine: Engine) {
    let Some((g, runner)) = three_images(engine).await else {
        return;
    };
    g.app.heartbeat(&runner.attest(running(IMAGE_A))).await;
    let images_on_its_pools = {
        let view = g.app.runner(&runner.id).await;
        assert_eq!(view["status"], "healthy", "{view}");
        match g.app.engine {
            Engine::Sqlite => {
                let path = g.app.database_url.trim_start_matches("sqlite://");
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.query_row(
                    "SELECT images FROM runners WHERE id = ?1",
                    [&runner.id],
                    |r| r.get::<_, String>(0),
                )
                .unwrap()
            }
            Engine::Postgres => {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&g.app.database_url)
                    .await
                    .unwrap();
                sqlx::query_scalar("SELECT images FROM runners WHERE id = $1")
                    .bind(&runner.id)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap()
            }
        }
    };
    g.app.heartbeat(&runner.attest(running(IMAGE_E))).await;
    // The refused fetch leaves the drifted images in the cache.
    g.forgejo.enqueue();
    let (refusal, _) = fetch_task(&g.app).await;
    assert_eq!(refusal.as_deref(), Some("image_drift"));

    let sql = format!(
        "UPDATE runners SET images = '{}' WHERE id = $1",
        images_on_its_pools.replace('\'', "''")
    );
    g.app.behind_the_service(&sql, &runner.id).await;
    let (refusal, task) = fetch_task(&g.app).await;
    assert_eq!(
        (refusal, task),
        (None, true),
        "judged by the images the database holds"
    );
}
