//! The forge gate judges what a forge would route, and forwards only what it judged: against
//! test forges that route every spelling any forge serves (`common::forges::lenient`), every
//! spelling of a refused runner's fetch is refused and never served, a spelling without one
//! canonical form is 400 `ambiguous_path` and never forwarded, and what is forwarded is the
//! canonical path. A GitLab job request's token is judged wherever GitLab would read it, and a
//! request whose token cannot be read as one is 400 `unreadable_fetch`, even with unbound
//! runners passed. The Job Router's discovery is answered "not available" by the gate itself.
//!
//! Requests go over a raw socket: an HTTP client library would normalize the very spellings
//! under test (dot segments, backslashes) before sending them.

use crate::common;

use common::forges::{
    self, FETCH_TASK, FORGEJO_TOKEN, Gated, JOBS_REQUEST, ROUTER_DISCOVERY, UUID, runner_v1,
};
use common::*;
use leasegate::config::ServeArgs;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GITLAB_TOKEN: &str = "glrt-test-runner-token";

/// The service on `engine` in front of the test forges (`forges::gated`), with `adjust` on top.
async fn gated(engine: Engine, adjust: impl FnOnce(&mut ServeArgs)) -> Option<Gated> {
    forges::gated(engine, GITLAB_TOKEN, 1, adjust).await
}

/// A leasegate runner in pool `linux` bound to both forge runners, attesting `healthy` or a
/// broken runtime.
async fn bound_runner(app: &TestApp, healthy: bool) -> TestRunner {
    use sha2::{Digest, Sha256};
    app.pool("linux", &[IMAGE_A]).await;
    let token = app.registration_token("linux").await;
    let key = leasegate::agent::keys::RunnerKey::generate();
    let r = app
        .post(
            "/api/v1/runners",
            json!({"registration_token": token, "name": "build-01", "public_key": key.public_jwk(),
                   "forge_runners": [{"kind": "forgejo", "uuid": UUID},
                                     {"kind": "gitlab", "token_sha256": hex::encode(Sha256::digest(GITLAB_TOKEN))}]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    let runner = TestRunner {
        id: body["runner_id"].as_str().unwrap().into(),
        pool: "linux".into(),
        key,
    };
    let attestation = if healthy {
        runner.healthy()
    } else {
        runner.failing("default OCI runtime \"crun\" not found: invalid argument")
    };
    assert_eq!(app.heartbeat(&attestation).await.status(), StatusCode::OK);
    runner
}

/// An answer read off a raw socket.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn code(&self) -> Option<String> {
        let v: Value = serde_json::from_str(&self.body).ok()?;
        v["code"].as_str().map(String::from)
    }
}

/// `method target` with `headers` and `body`, sent to the app byte for byte.
async fn raw(
    app: &TestApp,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let addr = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

fn fetch_body() -> Vec<u8> {
    runner_v1::FetchTaskRequest { tasks_version: 0 }.encode_to_vec()
}

async fn fetch_as(app: &TestApp, target: &str) -> Answer {
    raw(
        app,
        "POST",
        target,
        &[
            ("content-type", "application/proto"),
            ("connect-protocol-version", "1"),
            ("x-runner-uuid", UUID),
            ("x-runner-token", FORGEJO_TOKEN),
        ],
        &fetch_body(),
    )
    .await
}

async fn request_job_as(
    app: &TestApp,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    raw(app, "POST", target, headers, body.as_bytes()).await
}

/// A job request: its target, headers and body.
type JobRequest = (String, Vec<(&'static str, &'static str)>, String);

/// What the gate does with a spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Judged as the fetch, and refused.
    Refused,
    /// No single canonical form: 400 `ambiguous_path`.
    Ambiguous,
    /// Not under the forge's routes as it came: leasegate's own 404.
    NotRouted,
}

/// Every spelling of `call`: each character of its tail percent-encoded alone (upper and lower
/// hex), all of it encoded, its case changed, slashes repeated and trailing, dot segments, and
/// GitLab's format suffixes; and the spellings without one canonical form.
fn corpus(call: &str, prefix: &str, gitlab: bool) -> Vec<(String, Expect)> {
    use Expect::*;
    let tail = &call[prefix.len() + 1..];
    let mut out = vec![(call.to_string(), Refused)];
    let encode = |b: u8, lower: bool| {
        if lower {
            format!("%{b:02x}")
        } else {
            format!("%{b:02X}")
        }
    };
    for (i, b) in tail.bytes().enumerate() {
        if b == b'/' {
            out.push((
                format!("{prefix}/{}%2F{}", &tail[..i], &tail[i + 1..]),
                Ambiguous,
            ));
            out.push((
                format!("{prefix}/{}%2f{}", &tail[..i], &tail[i + 1..]),
                Ambiguous,
            ));
            out.push((
                format!("{prefix}/{}//{}", &tail[..i], &tail[i + 1..]),
                Refused,
            ));
            out.push((
                format!("{prefix}/{}/./{}", &tail[..i], &tail[i + 1..]),
                Refused,
            ));
            out.push((
                format!("{prefix}/{}/x/../{}", &tail[..i], &tail[i + 1..]),
                Refused,
            ));
            out.push((
                format!("{prefix}/{}/x/%2e%2E/{}", &tail[..i], &tail[i + 1..]),
                Refused,
            ));
            out.push((
                format!("{prefix}/{}\\{}", &tail[..i], &tail[i + 1..]),
                Ambiguous,
            ));
            continue;
        }
        for lower in [false, true] {
            out.push((
                format!(
                    "{prefix}/{}{}{}",
                    &tail[..i],
                    encode(b, lower),
                    &tail[i + 1..]
                ),
                Refused,
            ));
        }
        // Encoded twice: a forge or proxy that decodes again reads the call.
        out.push((
            format!("{prefix}/{}%25{:02X}{}", &tail[..i], b, &tail[i + 1..]),
            Ambiguous,
        ));
    }
    let all: String = tail
        .bytes()
        .map(|b| {
            if b == b'/' {
                "/".to_string()
            } else {
                encode(b, false)
            }
        })
        .collect();
    out.push((format!("{prefix}/{all}"), Refused));
    for more in [
        format!("{call}/"),
        format!("{call}//"),
        format!("{call}/."),
        format!("{call}/x/.."),
        format!("{prefix}//{tail}"),
        format!("{prefix}/./{tail}"),
        format!("{prefix}/{}", tail.to_ascii_lowercase()),
        format!("{prefix}/{}", tail.to_ascii_uppercase()),
    ] {
        out.push((more, Refused));
    }
    for bad in [
        format!("{call}%00"),
        format!("{call}%0a"),
        format!("{call}%zz"),
        format!("{call}%"),
        format!("{prefix}/x%5C..%5C{tail}"),
        format!("{prefix}/../{}/{tail}", prefix.trim_start_matches('/')),
        format!("{prefix}/%2e%2e/%2e%2e{call}"),
    ] {
        out.push((bad, Ambiguous));
    }
    // A prefix spelled another way is none of the forge's routes here.
    let inner = call[1..].find('/').unwrap() + 1;
    out.push((format!("{}/{}", &call[..inner], &call[inner..]), NotRouted));
    out.push((format!("/%61{}", &call[2..]), NotRouted));
    if gitlab {
        for suffix in [".json", ".JSON", ".txt", ".xml", ".json/"] {
            out.push((format!("{call}{suffix}"), Refused));
        }
        out.push((format!("{call}%2Ejson"), Refused));
    }
    out
}

fn check(answer: &Answer, target: &str, expect: Expect, refused_status: u16) {
    match expect {
        Expect::Refused => {
            assert_eq!(answer.status, refused_status, "{target}: {}", answer.head);
            assert_eq!(
                answer.header("x-leasegate-refusal"),
                Some("probe_failed"),
                "{target}"
            );
        }
        Expect::Ambiguous => {
            assert_eq!(answer.status, 400, "{target}: {}", answer.head);
            assert_eq!(
                answer.header("content-type"),
                Some("application/problem+json"),
                "{target}"
            );
            assert_eq!(
                answer.code().as_deref(),
                Some("ambiguous_path"),
                "{target}: {}",
                answer.body
            );
        }
        Expect::NotRouted => assert_eq!(answer.status, 404, "{target}: {}", answer.head),
    }
}

each_engine!(
    every_spelling_of_a_refused_runners_fetch_is_refused_and_never_served,
    the_forge_is_sent_the_canonical_path,
    a_gitlab_token_is_judged_wherever_gitlab_reads_it,
);

async fn every_spelling_of_a_refused_runners_fetch_is_refused_and_never_served(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    bound_runner(&g.app, false).await;
    let forgejo_job = g.forgejo.enqueue();
    let gitlab_job = g.gitlab.enqueue();
    let forgejo = corpus(FETCH_TASK, "/api/actions", false);
    assert!(forgejo.len() > 100, "{}", forgejo.len());
    for (target, expect) in &forgejo {
        check(&fetch_as(&g.app, target).await, target, *expect, 200);
    }
    // A refused GitLab request is held for the hold (1 s): all at once.
    let gitlab = corpus(JOBS_REQUEST, "/api/v4", true);
    let body = json!({"token": GITLAB_TOKEN, "info": {"name": "gitlab-runner"}}).to_string();
    let answers = futures_util::future::join_all(gitlab.iter().map(|(target, _)| {
        request_job_as(
            &g.app,
            target,
            &[("content-type", "application/json")],
            &body,
        )
    }))
    .await;
    for ((target, expect), answer) in gitlab.iter().zip(&answers) {
        check(answer, target, *expect, 204);
    }
    // The forges route every one of these as the fetch: not one reached them.
    assert_eq!(g.forgejo.calls_to(FETCH_TASK), 0, "{:?}", g.forgejo.calls());
    assert_eq!(g.gitlab.calls_to(JOBS_REQUEST), 0, "{:?}", g.gitlab.calls());
    assert!(g.forgejo.calls().is_empty() && g.gitlab.calls().is_empty());
    assert_eq!(g.forgejo.queued(), vec![forgejo_job]);
    assert_eq!(g.gitlab.queued(), vec![gitlab_job]);
    assert!(g.forgejo.claimed().is_empty() && g.gitlab.claimed().is_empty());
}

async fn the_forge_is_sent_the_canonical_path(engine: Engine) {
    let Some(g) = gated(engine, |_| {}).await else {
        return;
    };
    bound_runner(&g.app, true).await;
    let job = g.forgejo.enqueue();
    let r = fetch_as(&g.app, "/api/actions/%72unner.v1.RunnerService//fetchtask/").await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(r.header("x-leasegate-refusal").is_none());
    assert_eq!(g.forgejo.claimed(), vec![(job, UUID.to_string())]);
    let gl = g.gitlab.enqueue();
    let body = json!({"token": GITLAB_TOKEN}).to_string();
    let r = request_job_as(&g.app, "/api/v4/jobs/./request.json?x=1", &[], &body).await;
    assert_eq!(r.status, 201, "{}", r.head);
    assert_eq!(g.gitlab.claimed(), vec![(gl, GITLAB_TOKEN.to_string())]);
    // Any other path goes as its canonical form, the query as it came.
    let r = raw(
        &g.app,
        "GET",
        "/api/actions_pipeline//_apis/./x%41/y/../%7e?a=%2F",
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.head);
    let r = raw(&g.app, "PUT", "/api/v4/jobs/7/", &[], b"{}").await;
    assert_eq!(r.status, 202, "{}", r.head);
    let sent: Vec<String> = g
        .forgejo
        .calls()
        .iter()
        .chain(g.gitlab.calls().iter())
        .map(|c| c.raw_path.clone())
        .collect();
    assert_eq!(
        sent,
        [
            FETCH_TASK,
            "/api/actions_pipeline/_apis/xA/~",
            JOBS_REQUEST,
            "/api/v4/jobs/7"
        ]
    );
}

async fn a_gitlab_token_is_judged_wherever_gitlab_reads_it(engine: Engine) {
    // With unbound runners passed, a token the gate missed would be forwarded as unbound.
    let Some(g) = gated(engine, |a| {
        a.forge_unbound = leasegate::config::ForgeUnbound::Pass
    })
    .await
    else {
        return;
    };
    bound_runner(&g.app, false).await;
    let job = g.gitlab.enqueue();
    let json_type = ("content-type", "application/json");
    let form_type = ("content-type", "application/x-www-form-urlencoded");
    let refused: Vec<JobRequest> = vec![
        (
            JOBS_REQUEST.into(),
            vec![form_type],
            format!("token={GITLAB_TOKEN}&info[name]=x"),
        ),
        (
            format!("{JOBS_REQUEST}?token={GITLAB_TOKEN}"),
            vec![json_type],
            "{}".into(),
        ),
        (
            format!("{JOBS_REQUEST}?x=1;token={GITLAB_TOKEN}"),
            vec![],
            String::new(),
        ),
        (
            JOBS_REQUEST.into(),
            vec![json_type],
            format!("\u{FEFF}{{\"token\":\"{GITLAB_TOKEN}\"}}"),
        ),
        (
            JOBS_REQUEST.into(),
            vec![("runner-token", GITLAB_TOKEN)],
            String::new(),
        ),
        (
            JOBS_REQUEST.into(),
            vec![],
            format!("{{\"\\u0074oken\":\"{GITLAB_TOKEN}\"}}"),
        ),
        (
            JOBS_REQUEST.into(),
            vec![("content-type", "text/plain")],
            format!("{{\"token\":\"{GITLAB_TOKEN}\"}}"),
        ),
    ];
    let answers = futures_util::future::join_all(
        refused
            .iter()
            .map(|(target, headers, body)| request_job_as(&g.app, target, headers, body)),
    )
    .await;
    for ((target, headers, body), a) in refused.iter().zip(&answers) {
        assert_eq!(
            (a.status, a.header("x-leasegate-refusal")),
            (204, Some("probe_failed")),
            "{target} {headers:?} {body}: {}",
            a.head
        );
    }
    let unreadable: Vec<JobRequest> = vec![
        (
            JOBS_REQUEST.into(),
            vec![json_type],
            format!("{{\"token\":\"glrt-unbound\",\"token\":\"{GITLAB_TOKEN}\"}}"),
        ),
        (
            format!("{JOBS_REQUEST}?token={GITLAB_TOKEN}"),
            vec![json_type],
            "{\"token\":\"glrt-unbound\"}".into(),
        ),
        (
            JOBS_REQUEST.into(),
            vec![("runner-token", GITLAB_TOKEN), json_type],
            "{\"token\":\"glrt-unbound\"}".into(),
        ),
        (
            format!("{JOBS_REQUEST}?token=glrt-unbound&token={GITLAB_TOKEN}"),
            vec![],
            String::new(),
        ),
        (
            format!("{JOBS_REQUEST}?token[]={GITLAB_TOKEN}"),
            vec![],
            String::new(),
        ),
        (
            JOBS_REQUEST.into(),
            vec![json_type],
            format!("{{\"token\":[\"{GITLAB_TOKEN}\"]}}"),
        ),
        (
            JOBS_REQUEST.into(),
            vec![json_type],
            format!("{{\"token\":\"{GITLAB_TOKEN}\""),
        ),
        (
            JOBS_REQUEST.into(),
            vec![("content-type", "multipart/form-data; boundary=b")],
            format!(
                "--b\r\ncontent-disposition: form-data; name=\"token\"\r\n\r\n{GITLAB_TOKEN}\r\n--b--\r\n"
            ),
        ),
    ];
    for (target, headers, body) in &unreadable {
        let a = request_job_as(&g.app, target, headers, body).await;
        assert_eq!(a.status, 400, "{target} {headers:?} {body}: {}", a.head);
        assert_eq!(
            a.code().as_deref(),
            Some("unreadable_fetch"),
            "{target}: {}",
            a.body
        );
    }
    assert_eq!(g.gitlab.calls_to(JOBS_REQUEST), 0, "{:?}", g.gitlab.calls());
    assert_eq!(g.gitlab.queued(), vec![job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_routers_discovery_is_answered_not_available_by_the_gate() {
    let gitlab = forges::gitlab(1).await;
    let base = gitlab.base.clone();
    let app = spawn_app_with(move |a| a.gitlab_upstream = Some(base)).await;
    for target in [
        ROUTER_DISCOVERY,
        "/api/v4/runners/router/discovery.json",
        "/api/v4//runners/router/discovery/",
        "/api/v4/runners/%72outer/discovery",
        "/api/v4/Runners/Router/Discovery",
    ] {
        let a = raw(&app, "GET", target, &[("runner-token", GITLAB_TOKEN)], b"").await;
        // As a GitLab without a router answers: gitlab-runner then asks jobs/request.
        assert_eq!(a.status, 501, "{target}: {}", a.head);
        assert_eq!(a.header("content-type"), Some("application/json"));
        let body: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(
            body,
            json!({"message": "Job Router is not available. Please contact your administrator."})
        );
    }
    assert!(gitlab.calls().is_empty(), "{:?}", gitlab.calls());
}
