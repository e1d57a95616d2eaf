//! The performance goals the bench's figures are held to, each beside what this run measured:
//! the service's rates as ratios of limits measured in the same run (raw EdDSA verifications,
//! the raw claim, pgbench running the gate's claim), what SQLite writes per request, and what
//! the forge gate adds to a forge's calls. A run measures one engine: the goals of the other
//! engine are not listed, and a goal whose phase did not run is listed as not measured.

use super::Report;
use serde::Serialize;

/// One goal and this run's figure.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// A stable name, for scripts reading `--json`.
    pub name: &'static str,
    /// What is measured, in words.
    pub what: &'static str,
    /// `None`: not measured in this run (its phase did not run, or its limit was not
    /// measured).
    pub measured: Option<f64>,
    /// `x` (a ratio), `KB`, `ms` or `MB`.
    pub unit: &'static str,
    /// `>=`, `<=` or `<`.
    pub bound: &'static str,
    pub goal: f64,
    pub met: Option<bool>,
}

impl Goal {
    fn new(
        name: &'static str,
        what: &'static str,
        measured: Option<f64>,
        unit: &'static str,
        bound: &'static str,
        goal: f64,
    ) -> Goal {
        let met = measured.map(|m| match bound {
            ">=" => m >= goal,
            "<=" => m <= goal,
            _ => m < goal,
        });
        Goal {
            name,
            what,
            measured,
            unit,
            bound,
            goal,
            met,
        }
    }
}

/// `numerator ÷ denominator`, when both were measured.
fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

/// The goals that apply to `r`'s engine, and to every engine.
pub fn of(r: &Report) -> Vec<Goal> {
    let op = |name: &str| r.ops.iter().find(|o| o.op == name);
    let rate = |name: &str| op(name).map(|o| o.per_second);
    let written_kb = |name: &str| {
        op(name)
            .and_then(|o| o.bytes_written_per_op)
            .map(|b| b / 1000.0)
    };
    let verifications = Some(r.limits.verifications_per_second_all_cores);
    let mut goals = Vec::new();
    match r.engine.as_str() {
        "sqlite" => goals.extend([
            Goal::new(
                "sqlite_heartbeats_vs_verifications",
                "SQLite heartbeats / (raw EdDSA verifications x cores)",
                ratio(rate("heartbeats"), verifications),
                "x",
                ">=",
                0.3,
            ),
            Goal::new(
                "sqlite_refusals_vs_verifications",
                "SQLite refusals / (raw EdDSA verifications x cores)",
                ratio(rate("refusals"), verifications),
                "x",
                ">=",
                0.35,
            ),
            Goal::new(
                "sqlite_grants_vs_raw_claims",
                "SQLite grants / raw SQLite claim loop",
                ratio(rate("grants"), r.limits.raw_claims_per_second),
                "x",
                ">=",
                0.5,
            ),
            Goal::new(
                "sqlite_written_per_heartbeat",
                "SQLite bytes written per heartbeat (3 s after, checkpoint included)",
                written_kb("heartbeats"),
                "KB",
                "<=",
                4.0,
            ),
            Goal::new(
                "sqlite_written_per_refusal",
                "SQLite bytes written per refusal (3 s after, checkpoint included)",
                written_kb("refusals"),
                "KB",
                "<=",
                2.0,
            ),
        ]),
        "postgres" => goals.extend([
            Goal::new(
                "postgres_heartbeats_vs_verifications",
                "PostgreSQL heartbeats / (raw EdDSA verifications x cores)",
                ratio(rate("heartbeats"), verifications),
                "x",
                ">=",
                0.2,
            ),
            Goal::new(
                "postgres_refusals_vs_verifications",
                "PostgreSQL refusals / (raw EdDSA verifications x cores)",
                ratio(rate("refusals"), verifications),
                "x",
                ">=",
                0.2,
            ),
            Goal::new(
                "postgres_grants_vs_pgbench",
                "PostgreSQL grants / pgbench running the gate's claim (same clients)",
                ratio(rate("grants"), r.limits.pgbench_claims_per_second),
                "x",
                ">=",
                1.0,
            ),
        ]),
        _ => {}
    }
    let forge = r.forge.as_ref();
    goals.extend([
        Goal::new(
            "forge_refused_vs_readyz",
            "refused forge fetches / /readyz",
            ratio(rate("forge-refused"), rate("readyz")),
            "x",
            ">=",
            0.9,
        ),
        Goal::new(
            "forge_forwarded_p50_added",
            "forwarded fetch p50 added over direct (1 client)",
            forge.map(|f| f.forwarded_p50_added_ms),
            "ms",
            "<=",
            0.2,
        ),
        Goal::new(
            "forge_upload_vs_direct",
            "upload through the forge gate / direct",
            forge.and_then(|f| ratio(Some(f.upload_gate_mb_per_s), Some(f.upload_direct_mb_per_s))),
            "x",
            ">=",
            0.8,
        ),
        Goal::new(
            "forge_download_vs_direct",
            "download through the forge gate / direct",
            forge.and_then(|f| {
                ratio(
                    Some(f.download_gate_mb_per_s),
                    Some(f.download_direct_mb_per_s),
                )
            }),
            "x",
            ">=",
            0.8,
        ),
    ]);
    if let Some(lp) = &r.long_polls {
        // The service's memory with 10,000 waiting, from what each of those measured added.
        let at_10k = match (lp.rss_before_mb, lp.kib_per_waiter) {
            (Some(before), Some(each)) => Some(before + each * 10_000.0 / 1024.0),
            _ => None,
        };
        goals.push(Goal::new(
            "long_polls_10000_memory",
            "service memory with 10,000 waiting long polls (MiB)",
            at_10k,
            "MB",
            "<",
            100.0,
        ));
    }
    goals
}

#[cfg(test)]
mod tests {
    use super::Goal;

    #[test]
    fn a_goal_is_met_on_the_side_its_bound_names() {
        assert_eq!(
            Goal::new("a", "a", Some(0.3), "x", ">=", 0.3).met,
            Some(true)
        );
        assert_eq!(
            Goal::new("a", "a", Some(0.29), "x", ">=", 0.3).met,
            Some(false)
        );
        assert_eq!(
            Goal::new("b", "b", Some(4.0), "KB", "<=", 4.0).met,
            Some(true)
        );
        assert_eq!(
            Goal::new("c", "c", Some(100.0), "MB", "<", 100.0).met,
            Some(false)
        );
        assert_eq!(Goal::new("d", "d", None, "x", ">=", 1.0).met, None);
    }
}
