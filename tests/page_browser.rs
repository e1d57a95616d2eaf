//! The health page in a real headless Chromium, driven over WebDriver: log in, find the runner
//! whose probe failed and its message, cordon it in two clicks (button, confirmation), see its
//! status change, and take a screenshot that is not blank.
//!
//! Needs Debian's `chromium` and `chromium-driver`; without them the test says so and skips,
//! unless `LEASEGATE_REQUIRE_CHROMIUM=1` (set by `.ci/run`).

use crate::common;

use common::*;
use fantoccini::{ClientBuilder, Locator};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

fn browser_available() -> bool {
    let present = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if !present {
        assert!(
            std::env::var("LEASEGATE_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "LEASEGATE_REQUIRE_CHROMIUM=1 but {CHROMIUM} or {CHROMEDRIVER} is missing"
        );
        common::skip::skipped(
            "Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
        );
    }
    present
}

async fn start_chromedriver() -> (tokio::process::Child, String) {
    let port = common::free_port();
    let child = tokio::process::Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if reqwest::get(format!("{url}/status"))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return (child, url);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not start");
}

/// Not blank: many colours, and a fair share of pixels that are not the background.
fn assert_not_blank(png_bytes: &[u8]) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let bytes = &buf[..info.buffer_size()];
    let channels = info.color_type.samples();
    let pixels: Vec<&[u8]> = bytes.chunks(channels).collect();
    // A pixel of the page background, below the header bar.
    let background = pixels[info.width as usize * 60 + 5];
    let distinct: std::collections::HashSet<&[u8]> = pixels.iter().copied().collect();
    let differing = pixels.iter().filter(|p| **p != background).count();
    assert!(
        distinct.len() > 20,
        "only {} colours: blank?",
        distinct.len()
    );
    assert!(
        differing * 50 > pixels.len(),
        "almost every pixel is the background"
    );
}

/// A headless Chromium under its own chromedriver, with a throwaway profile.
async fn open_browser() -> (tokio::process::Child, fantoccini::Client, tempfile::TempDir) {
    let (driver, driver_url) = start_chromedriver().await;
    let profile = tempfile::tempdir().unwrap();
    let caps = serde_json::json!({
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", format!("--user-data-dir={}", profile.path().display())]
        }
    });
    let caps = caps.as_object().unwrap().clone();
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let browser = ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver_url)
        .await
        .expect("a browser session");
    (driver, browser, profile)
}

/// Waits (up to 10 s) until the browser shows a page whose query holds `needle`, and that
/// page has loaded; a form's submit and a link's click may return before either.
async fn wait_for_query(browser: &fantoccini::Client, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let url = browser.current_url().await.unwrap();
        let loaded = browser
            .execute("return document.readyState === 'complete';", vec![])
            .await
            .ok()
            == Some(serde_json::Value::Bool(true));
        if loaded && let Some(query) = url.query().filter(|query| query.contains(needle)) {
            return query.to_string();
        }
        assert!(Instant::now() < deadline, "{url} never had {needle}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_the_broken_runner_and_cordons_it() {
    if !browser_available() {
        return;
    }
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let broken = app.register("linux", "broken-runner").await;
    let healthy = app.register("linux", "healthy-runner").await;
    app.heartbeat(&broken.failing("default OCI runtime \"crun\" not found: invalid argument"))
        .await;
    app.heartbeat(&healthy.healthy()).await;

    let (_driver, browser, _profile) = open_browser().await;

    browser.goto(&app.url("/admin")).await.unwrap();
    assert!(
        browser
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/admin/login"),
        "not sent to login"
    );
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(ADMIN)
        .await
        .unwrap();
    browser
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("table.runners"))
        .await
        .unwrap();

    let row_css = format!("tr[data-runner='{}']", broken.id);
    let row = browser.find(Locator::Css(&row_css)).await.unwrap();
    assert_eq!(
        row.attr("data-status").await.unwrap().as_deref(),
        Some("probe_failed")
    );
    let text = row.text().await.unwrap();
    assert!(
        text.contains("cannot run a container with podman: default OCI runtime \"crun\" not found: invalid argument"),
        "{text}"
    );
    // What needs attention comes first.
    let first = browser
        .find(Locator::Css("table.runners tbody tr"))
        .await
        .unwrap();
    assert_eq!(
        first.attr("data-runner").await.unwrap().as_deref(),
        Some(broken.id.as_str())
    );

    // Two clicks: the button, then the confirmation.
    row.find(Locator::Css("button.action"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.accept_alert().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(row) = browser.find(Locator::Css(&row_css)).await
            && row.attr("data-status").await.ok().flatten().as_deref() == Some("cordoned")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the status did not change to cordoned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.runner(&broken.id).await["status"], "cordoned");
    // The runtime's words stay in view after the cordon.
    let text = browser
        .find(Locator::Css(&row_css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("default OCI runtime \"crun\" not found"),
        "{text}"
    );

    let shot = browser.screenshot().await.unwrap();
    assert_not_blank(&shot);
    std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).ok();
    std::fs::write(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("health-page.png"),
        &shot,
    )
    .unwrap();
    browser.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_collapses_the_healthy_filters_pages_and_draws_its_pools() {
    if !browser_available() {
        return;
    }
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    app.pool("macos", &[IMAGE_B]).await;
    for i in 0..3 {
        let r = app.register("linux", &format!("ok-{i}")).await;
        app.heartbeat(&r.attest(serde_json::json!({"host": format!("host-{i}.ci")})))
            .await;
    }
    for i in 0..3 {
        let r = app.register("macos", &format!("mac-{i}")).await;
        app.heartbeat(&r.failing("no podman machine")).await;
    }
    app.enqueue("macos").await;
    let now = leasegate::domain::time::Millis::now();
    leasegate::timeline::take_samples(&app.state, now)
        .await
        .unwrap();

    let (_driver, browser, _profile) = open_browser().await;
    browser
        .goto(&app.url(&format!("/admin/login?token={ADMIN}")))
        .await
        .unwrap();
    let text = |css: &'static str| {
        let browser = browser.clone();
        async move {
            browser
                .find(Locator::Css(css))
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    // The banner, the timelines, the healthy ones as a count.
    assert!(
        text("#pool-macos .banner")
            .await
            .contains("no runner of this pool may take one")
    );
    assert_eq!(
        browser
            .find_all(Locator::Css("svg.timeline"))
            .await
            .unwrap()
            .len(),
        4
    );
    assert!(text(".healthy-count").await.contains("3 healthy runners"));
    assert_eq!(
        browser
            .find_all(Locator::Css("tr.runner"))
            .await
            .unwrap()
            .len(),
        3
    );
    // The filter form: the healthy ones, then a search over hosts; kept in the URL.
    let form = browser.form(Locator::Css("form.filters")).await.unwrap();
    form.set_by_name("status", "healthy").await.unwrap();
    form.set_by_name("q", "host-1").await.unwrap();
    form.submit().await.unwrap();
    // A submit starts the navigation and does not wait for it: wait for the new page.
    let query = wait_for_query(&browser, "q=host-1").await;
    assert_eq!(query, "pool=&status=healthy&q=host-1");
    let rows = browser.find_all(Locator::Css("tr.runner")).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].text().await.unwrap().contains("host-1.ci"));
    // Paging: one a page, the next page's link.
    browser
        .goto(&app.url("/admin?pool=macos&limit=1"))
        .await
        .unwrap();
    browser
        .find(Locator::Css("a[rel=next]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for_query(&browser, "cursor=1").await;
    assert_eq!(
        browser
            .find_all(Locator::Css("tr.runner"))
            .await
            .unwrap()
            .len(),
        1
    );
    browser.close().await.unwrap();
}

#[tokio::test]
async fn the_refresh_replaces_only_the_rows_that_changed() {
    if !browser_available() {
        return;
    }
    let app = spawn_app().await;
    app.pool("linux", &[IMAGE_A]).await;
    let mut runners = Vec::new();
    for name in ["a", "b", "c"] {
        let r = app.register("linux", name).await;
        app.heartbeat(&r.failing("crun not found")).await;
        runners.push(r);
    }
    let (_driver, browser, _profile) = open_browser().await;
    browser
        .goto(&app.url(&format!("/admin/login?token={ADMIN}")))
        .await
        .unwrap();
    // Marks on the document and on every row: a reload or a replaced row loses its mark.
    browser
        .execute(
            "window.sameDocument = true; \
             document.querySelectorAll('tr.runner').forEach(el => { el.marked = true; });",
            vec![],
        )
        .await
        .unwrap();
    app.heartbeat(&runners[1].failing("disk full under /var/lib/containers"))
        .await;
    let state = "return [window.sameDocument === true, \
        [...document.querySelectorAll('tr.runner')].map(el => \
          [el.querySelector('a').textContent, el.marked === true, el.textContent.includes('disk full')])];";
    let deadline = Instant::now() + Duration::from_secs(20);
    let seen = loop {
        let seen = browser.execute(state, vec![]).await.unwrap();
        let b_updated = seen[1]
            .as_array()
            .unwrap()
            .iter()
            .any(|row| row[0] == "b" && row[2] == true);
        if b_updated || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        seen,
        serde_json::json!([
            true,
            [["a", true, false], ["b", false, true], ["c", true, false]]
        ]),
        "the changed row is replaced in place, the others are the same elements"
    );
    browser.close().await.unwrap();
}
