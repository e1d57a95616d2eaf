//! The `leasegate` binary: parse the command line, start logging, hand over to the library.
#![forbid(unsafe_code)]

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use leasegate::config::{LogFormat, ServeArgs};
use leasegate::usage::Spelling;
use std::ffi::OsString;
use std::process::ExitCode;

// The system allocator under `--features system-allocator`, so that heap profilers which
// intercept malloc (heaptrack, valgrind's massif) see every allocation.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The command line: one command per thing the binary is. Here, and not in the library, so
/// that the service's settings (`config`), the agent's (`agent::cli`) and the bench's know
/// nothing of each other.
#[derive(Parser, Debug)]
#[command(
    name = "leasegate",
    version,
    about = "The forge-side lease gate for self-hosted CI runners"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the service.
    Serve(ServeArgs),
    /// Run the service on a temporary database with simulated runners and a trickle of jobs.
    Demo(ServeArgs),
    /// The runner agent: key, registration, preflight probe, heartbeats and lease calls.
    Runner(leasegate::agent::cli::RunnerArgs),
    /// Measure the service against the engine's own limits (see docs/BENCHMARKS.md).
    Bench(leasegate::bench::BenchArgs),
}

/// Usage errors exit 64 (`EX_USAGE`) rather than clap's 2, which `leasegate runner lease`
/// uses for "no job".
fn usage_error(message: &str) -> ExitCode {
    eprintln!("{message}");
    ExitCode::from(leasegate::agent::exit::USAGE)
}

/// A clap error: help and version are not errors; a bad value from the environment is named
/// by its variable.
fn clap_error(cmd: &clap::Command, e: clap::Error, args: &[OsString]) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    match leasegate::usage::env_error(cmd, &e, args) {
        Some(message) => usage_error(message.trim_end()),
        None => {
            let _ = e.print();
            ExitCode::from(leasegate::agent::exit::USAGE)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cmd = Cli::command();
    let matches = match cmd.clone().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => return clap_error(&cmd, e, &args),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return clap_error(&cmd, e, &args),
    };
    let spelling = Spelling::of(&cmd, &matches);
    // A misspelt setting is refused (it would silently keep its default); any other
    // `LEASEGATE_*` name is likely someone else's variable, and only warned of once logging is up.
    let unknown = leasegate::usage::unknown_variables(
        &cmd,
        std::env::vars_os().map(|(name, _)| name.to_string_lossy().into_owned()),
    );
    if let Some((name, meant)) = unknown
        .iter()
        .find_map(|u| Some((&u.name, u.meant.as_ref()?)))
    {
        return usage_error(&format!(
            "leasegate: {name} is set, but there is no such setting: did you mean {meant}? \
             (nothing was started)"
        ));
    }
    let (log_format, default_filter, priorities) = match &cli.command {
        Command::Serve(args) | Command::Demo(args) => {
            (args.log_format, leasegate::logging::DEFAULT_FILTER, false)
        }
        // The service runs in-process: its per-request info lines would be measured too.
        Command::Bench(_) => (LogFormat::Human, "warn", false),
        // The agent's lines carry their priority for journald (`agent::journal`).
        Command::Runner(args) => (args.log_format, leasegate::logging::DEFAULT_FILTER, true),
    };
    if let Err(e) = leasegate::logging::init(log_format, default_filter, priorities) {
        return usage_error(&format!("leasegate: {e}"));
    }
    for variable in &unknown {
        tracing::warn!(
            variable = %variable.name,
            "set in the environment, but no setting of leasegate: ignored"
        );
    }
    // Each command runs on a runtime the library builds (`commands`), so that this crate
    // compiles none of the service's futures again.
    let result = match cli.command {
        Command::Serve(args) => leasegate::commands::serve(args),
        Command::Demo(args) => leasegate::commands::demo(args),
        Command::Bench(args) => leasegate::commands::bench(args),
        Command::Runner(args) => return leasegate::commands::runner(args).into(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasegate: {}", spelling.apply(&format!("{e:#}")));
            if leasegate::usage::UsageError::is(&e) {
                ExitCode::from(leasegate::agent::exit::USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
/// The usage helpers over the real command line.
mod tests {
    use super::Cli;
    use clap::CommandFactory;
    use leasegate::usage::{Spelling, UnknownVariable, env_error, unknown_variables};
    use std::ffi::OsString;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_variable_that_is_no_setting_is_found_with_the_setting_it_slips_from() {
        let cmd = Cli::command();
        let names = [
            "PATH",
            "LEASEGATE_LISTEN",
            "LEASEGATE_CLOCK_SKW_S",
            "LEASEGATE_RUNNER_KEY",
            "LEASEGATE_TEST_DATABASE_URL",
            "LEASEGATE_REQUIRE_POSTGRES",
            "LEASEGATE_PUBLISH",
            "LEASEGATE_COLOUR",
            "LEASEGATE_ADMIN_TOKEN_FIL",
            "LEASEGATE_DATABASE_URL",
        ]
        .map(String::from);
        assert_eq!(
            unknown_variables(&cmd, names),
            vec![
                UnknownVariable {
                    name: "LEASEGATE_CLOCK_SKW_S".into(),
                    meant: Some("LEASEGATE_CLOCK_SKEW_S".into()),
                },
                UnknownVariable {
                    name: "LEASEGATE_COLOUR".into(),
                    meant: None,
                },
                UnknownVariable {
                    name: "LEASEGATE_ADMIN_TOKEN_FIL".into(),
                    meant: Some("LEASEGATE_ADMIN_TOKEN_FILE".into()),
                },
                UnknownVariable {
                    name: "LEASEGATE_DATABASE_URL".into(),
                    meant: Some("DATABASE_URL".into()),
                },
            ]
        );
    }

    #[test]
    fn a_bad_value_from_the_environment_is_named_by_its_variable() {
        let cmd = Cli::command();
        let args = os(&["leasegate", "serve", "--listen", "nowhere"]);
        let typed = cmd.clone().try_get_matches_from(&args).unwrap_err();
        assert!(typed.to_string().contains("'--listen <LISTEN>'"), "{typed}");
        assert_eq!(env_error(&cmd, &typed, &args), None, "typed: clap's words");
        // As if from the environment: the same error, with no flag on the command line.
        let args = os(&["leasegate", "serve"]);
        let reworded = env_error(&cmd, &typed, &args).unwrap();
        assert!(
            reworded.contains("invalid value 'nowhere' for LEASEGATE_LISTEN:"),
            "{reworded}"
        );
    }

    #[test]
    fn the_services_messages_name_the_flags_that_were_typed() {
        let cmd = Cli::command();
        let args = os(&[
            "leasegate",
            "serve",
            "--lease-ttl-s",
            "0",
            "--admin-token-file=x",
        ]);
        let matches = cmd.clone().try_get_matches_from(&args).unwrap();
        let spelling = Spelling::of(&cmd, &matches);
        assert_eq!(
            spelling.apply("LEASEGATE_LEASE_TTL_S must be positive, got 0"),
            "--lease-ttl-s must be positive, got 0"
        );
        assert_eq!(
            spelling.apply("set LEASEGATE_ADMIN_TOKEN or LEASEGATE_ADMIN_TOKEN_FILE"),
            "set LEASEGATE_ADMIN_TOKEN or --admin-token-file"
        );
        assert_eq!(
            spelling.apply("LEASEGATE_LISTEN 127.0.0.1:8080: address in use"),
            "LEASEGATE_LISTEN 127.0.0.1:8080: address in use",
            "not typed: the variable"
        );
    }
}
