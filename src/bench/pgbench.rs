//! PostgreSQL's own tool beside the bench: `pgbench` runs the gate's claim
//! (`bench/pgbench/claim.sql`, built into the binary) on the service's database, in a pool of
//! its own, with as many clients and for as long as the bench's phases, its statements
//! prepared (`-M prepared`). PostgreSQL grants are judged against it: the database running the
//! same claim with nothing of leasegate in between. Where `pgbench` is not installed the bench
//! says so and goes on.

use std::time::Duration;

/// The claim, claim and refill, as pgbench runs it.
const CLAIM: &str = include_str!("../../bench/pgbench/claim.sql");

/// What became of the run.
pub enum Outcome {
    /// Transactions (claims) per second, as pgbench reports them without connection time.
    Ran(f64),
    /// Why there is no figure: pgbench is not installed, or it failed.
    NotRun(String),
}

/// Runs pgbench against `url` for `duration`, with `clients` clients claiming from `pool` for
/// `runner` (both exist, and the pool has its queue).
pub async fn claim(
    url: &str,
    pool: &str,
    runner: &str,
    clients: usize,
    duration: Duration,
) -> Outcome {
    let script = std::env::temp_dir().join(format!(
        "leasegate-pgbench-{}.sql",
        uuid::Uuid::now_v7().simple()
    ));
    if let Err(e) = std::fs::write(&script, CLAIM) {
        return Outcome::NotRun(format!("cannot write pgbench's script: {e}"));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let clients = clients.max(1);
    let output = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared"])
        .args(["-c", &clients.to_string()])
        .args(["-j", &clients.min(cores).to_string()])
        .args(["-T", &duration.as_secs().max(1).to_string()])
        .args([
            "-D",
            &format!("pool={pool}"),
            "-D",
            &format!("runner={runner}"),
        ])
        .arg("-f")
        .arg(&script)
        .arg(url)
        .kill_on_drop(true)
        .output()
        .await;
    std::fs::remove_file(&script).ok();
    match output {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Outcome::NotRun("pgbench is not installed (Debian: postgresql-client)".into())
        }
        Err(e) => Outcome::NotRun(format!("pgbench did not start: {e}")),
        Ok(out) if !out.status.success() => Outcome::NotRun(format!(
            "pgbench failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(out) => match tps(&String::from_utf8_lossy(&out.stdout)) {
            Some(tps) => Outcome::Ran(tps),
            None => Outcome::NotRun("pgbench printed no `tps = …` line".into()),
        },
    }
}

/// The `tps = N (without initial connection time)` of pgbench's report.
fn tps(report: &str) -> Option<f64> {
    report
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rate_is_read_from_the_report() {
        let report = "number of failed transactions: 0 (0.000%)\nlatency average = 3.003 ms\n\
                      initial connection time = 50.632 ms\n\
                      tps = 2663.594405 (without initial connection time)\n";
        assert_eq!(super::tps(report), Some(2663.594405));
        assert_eq!(super::tps("pgbench: error: connection failed"), None);
    }

    #[test]
    fn the_script_takes_its_pool_and_runner_as_variables() {
        assert!(super::CLAIM.contains(":pool") && super::CLAIM.contains(":runner"));
        assert!(super::CLAIM.contains("FOR UPDATE SKIP LOCKED"));
    }
}
