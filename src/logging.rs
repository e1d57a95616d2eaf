//! Logging to stderr, human or JSON, filtered by `RUST_LOG`, which is read strictly.
//!
//! `tracing`'s filter takes any bare word as a target name, so `RUST_LOG=inf` (meant as
//! `info`) parses, and enables only a target called `inf`: every log line goes silent. And a
//! directive that does not parse was dropped for the default without a word. Here both stop
//! the start with what was wrong, before anything else runs, for every command alike.

use crate::config::LogFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{Directive, LevelFilter};

/// The levels a directive may be or give a target.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// The filter of the service's commands when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "info,tower_http=warn,sqlx=warn";

/// Starts logging to stderr, filtered by `RUST_LOG` or else `default_filter`; with
/// `priorities`, each line tagged with its syslog priority when stderr is the journal
/// (`agent::journal`, for the runner's commands).
pub fn init(format: LogFormat, default_filter: &str, priorities: bool) -> Result<(), String> {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let given = std::env::var("RUST_LOG").ok();
    let filter = filter(given.as_deref(), default_filter)?;
    let writer = if priorities {
        BoxMakeWriter::new(crate::agent::journal::Stderr)
    } else {
        BoxMakeWriter::new(std::io::stderr)
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        // Colour only on a terminal: journald and log files would keep the escape codes.
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    Ok(())
}

/// The filter `rust_log` (the value of `RUST_LOG`, if set) says, or `default_filter` when it
/// is unset or empty. Every directive must be a level (`info`) or name one (`sqlx=debug`).
pub fn filter(rust_log: Option<&str>, default_filter: &str) -> Result<EnvFilter, String> {
    let given = rust_log.map(str::trim).filter(|s| !s.is_empty());
    let Some(value) = given else {
        return Ok(EnvFilter::new(default_filter));
    };
    let mut directives = Vec::new();
    for directive in value.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare_word = directive
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ':'));
        if bare_word && directive.parse::<LevelFilter>().is_err() {
            let lower = directive.to_ascii_lowercase();
            let meant = LEVELS
                .iter()
                .find(|l| l.starts_with(&lower) || lower.starts_with(*l))
                .map(|l| format!("did you mean {l}? "))
                .unwrap_or_default();
            return Err(format!(
                "RUST_LOG: `{directive}` is not a level ({}); {meant}a target takes its level \
                 as target=level, e.g. RUST_LOG=info,leasegate=debug",
                LEVELS.join(", ")
            ));
        }
        directive.parse::<Directive>().map_err(|e| {
            format!(
                "RUST_LOG: `{directive}` is not a filter directive ({e}); write a level or \
                 target=level, comma-separated, e.g. RUST_LOG=info,sqlx=debug"
            )
        })?;
        directives.push(directive);
    }
    // The directives again as one filter, without the blanks around commas, which the filter
    // would take as part of a target's name.
    EnvFilter::builder()
        .parse(directives.join(","))
        .map_err(|e| format!("RUST_LOG: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_targets_with_levels_are_taken() {
        for ok in [
            "info",
            "INFO",
            "warn,leasegate=debug",
            "info, sqlx=warn",
            "leasegate::store=trace",
            "leasegate[request]=debug",
            "off",
            "3",
        ] {
            filter(Some(ok), DEFAULT_FILTER).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        assert_eq!(
            filter(Some(""), DEFAULT_FILTER).unwrap().to_string(),
            filter(None, DEFAULT_FILTER).unwrap().to_string()
        );
    }

    #[test]
    fn a_misspelt_level_or_a_bad_directive_is_refused_with_what_to_write() {
        let e = filter(Some("inf"), DEFAULT_FILTER).unwrap_err();
        assert!(e.contains("`inf` is not a level"), "{e}");
        assert!(e.contains("did you mean info?"), "{e}");
        assert!(e.contains("target=level"), "{e}");
        let e = filter(Some("info,leasegate=verbose"), DEFAULT_FILTER).unwrap_err();
        assert!(
            e.contains("`leasegate=verbose` is not a filter directive"),
            "{e}"
        );
    }
}
