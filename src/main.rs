//! The `leasegate` binary: parse the command line, start logging, hand over to the library.
#![forbid(unsafe_code)]

use clap::{CommandFactory, FromArgMatches};
use leasegate::config::{Cli, Command, LogFormat};
use leasegate::usage::Spelling;
use std::ffi::OsString;
use std::process::ExitCode;

// The system allocator under `--features system-allocator`, so that heap profilers which
// intercept malloc (heaptrack, valgrind's massif) see every allocation.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

#[tokio::main]
async fn main() -> ExitCode {
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
    let result = match cli.command {
        Command::Serve(args) => leasegate::server::serve(args).await,
        Command::Demo(args) => leasegate::demo::run(args).await,
        Command::Bench(args) => leasegate::bench::run(args).await.map(|_| ()),
        Command::Runner(args) => return leasegate::agent::commands::run(args).await.into(),
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
