//! The `leasegate` binary: parse the command line, start logging, hand over to the library.
#![forbid(unsafe_code)]

use clap::Parser;
use leasegate::config::{Cli, Command, LogFormat};
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version are not errors.
            return if e.use_stderr() {
                ExitCode::from(leasegate::agent::exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let (log_format, default_filter) = match &cli.command {
        Command::Serve(args) | Command::Demo(args) => {
            (args.log_format, leasegate::logging::DEFAULT_FILTER)
        }
        // The service runs in-process: its per-request info lines would be measured too.
        Command::Bench(_) => (LogFormat::Human, "warn"),
        Command::Runner(args) => (args.log_format, leasegate::logging::DEFAULT_FILTER),
    };
    if let Err(e) = leasegate::logging::init(log_format, default_filter) {
        return usage_error(&format!("leasegate: {e}"));
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
            eprintln!("leasegate: {e:#}");
            ExitCode::FAILURE
        }
    }
}
