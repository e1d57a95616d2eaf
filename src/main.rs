//! The `leasegate` binary: parse the command line, start logging, hand over to the library.
#![forbid(unsafe_code)]

use clap::Parser;
use leasegate::config::{Cli, Command, LogFormat};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

// The system allocator under `--features system-allocator`, so that heap profilers which
// intercept malloc (heaptrack, valgrind's massif) see every allocation.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing(format: LogFormat) {
    init_tracing_with(format, "info,tower_http=warn,sqlx=warn");
}

/// Logging to stderr, filtered by `RUST_LOG` or else `default_filter`.
fn init_tracing_with(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version are not errors. Usage errors exit 64 (EX_USAGE) rather than
            // clap's 2, which `leasegate runner lease` uses for "no job".
            return if e.use_stderr() {
                std::process::ExitCode::from(leasegate::agent::exit::USAGE)
            } else {
                std::process::ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Serve(args) => {
            init_tracing(args.log_format);
            leasegate::server::serve(args).await
        }
        Command::Demo(args) => {
            init_tracing(args.log_format);
            leasegate::demo::run(args).await
        }
        Command::Bench(args) => {
            // The service runs in-process: its per-request info lines would be measured too.
            init_tracing_with(LogFormat::Human, "warn");
            leasegate::bench::run(args).await.map(|_| ())
        }
        Command::Runner(args) => {
            // The agent's logging tags each line with its priority for journald.
            leasegate::agent::journal::init_tracing(args.log_format);
            return leasegate::agent::commands::run(args).await.into();
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasegate: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
