//! `leasegate bench --server … --emit-requests DIR`: the phases' requests written to files
//! instead of sent, for a load generator in another process (`bench/outside.sh` drives them
//! with wrk), so that the in-process figures can be checked from outside.
//!
//! The runners are registered and the attestations signed here, by the same code as the
//! phases' own (`Fleet::presigned`, `forge::bound_runner`), before any clock starts. Per
//! request kind, `DIR/NAME.head` holds the request line (`METHOD PATH`) and then its header
//! lines, `\n`-separated; beside it, either `NAME.bodies`, one body a line, each to be sent
//! once (an attestation's `jti` is accepted once, and only for a minute after it was signed),
//! or `NAME.body`, one body for every request (a forge fetch carries no nonce).
//!
//! Kinds: `grants`, `heartbeats` and `refusals` as their phases send them (as many bodies as
//! the phase would sign ahead: `--rate`, or 50 000 a second, for `--duration-s`, at most
//! 20 s); for the phase `forge`, Forgejo's `FetchTask` from a forge runner bound to a runner
//! whose probe failed (`forge-refused`, which the gate answers without asking the forge) and
//! from one bound to a runner that attested healthy (`forge-forwarded`, which the gate hands
//! on to the forge while that attestation is fresh: a minute).

use super::fleet::Fleet;
use super::forge;
use super::load::Drive;
use std::fmt::Write as _;
use std::path::Path;

/// Writes the requests of `phases` into `dir`; answers what it wrote, one line per kind.
pub async fn write(
    fleet: &Fleet,
    client: &reqwest::Client,
    admin: &str,
    phases: &[String],
    drive: Drive,
    dir: &Path,
) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for phase in phases.iter().filter(|p| !p.is_empty()) {
        if phase == "forge" {
            for (name, healthy) in [("forge-refused", false), ("forge-forwarded", true)] {
                let runner = forge::bound_runner(fleet, client, admin, name, healthy).await?;
                let headers: Vec<&str> = runner.headers.lines().collect();
                head(dir, name, "POST", forge::FETCH_TASK, &headers)?;
                std::fs::write(dir.join(format!("{name}.body")), forge::FETCH_BODY)?;
                written.push(format!("{name}: one fetch, sent as often as wanted"));
            }
            continue;
        }
        let (path, bodies) = fleet.presigned(phase, drive).await.ok_or_else(|| {
            anyhow::anyhow!(
                "--emit-requests writes grants, heartbeats, refusals and forge, not {phase:?}"
            )
        })?;
        head(
            dir,
            phase,
            "POST",
            path,
            &["content-type: application/json"],
        )?;
        let mut text = String::with_capacity(bodies.iter().map(|b| b.len() + 1).sum());
        for body in &bodies {
            // A body spans one line: compact JSON has no raw newline.
            debug_assert!(!body.contains('\n'));
            writeln!(text, "{body}")?;
        }
        std::fs::write(dir.join(format!("{phase}.bodies")), text)?;
        written.push(format!("{phase}: {} bodies, each once", bodies.len()));
    }
    Ok(written)
}

/// `DIR/NAME.head`: the request line, then the header lines.
fn head(dir: &Path, name: &str, method: &str, path: &str, headers: &[&str]) -> anyhow::Result<()> {
    let mut text = format!("{method} {path}\n");
    for h in headers {
        writeln!(text, "{h}")?;
    }
    std::fs::write(dir.join(format!("{name}.head")), text)?;
    Ok(())
}
