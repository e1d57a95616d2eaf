//! The binary's commands, each run to its end on a Tokio runtime built here. The binary
//! (`main.rs`) parses the command line and calls one of these plain functions: were it to
//! await the service's futures itself, a release build would compile every one of them (their
//! state machines and drop glue) a second time in the binary's crate, about a third of a cold
//! release build.
use crate::agent::cli::RunnerArgs;
use crate::agent::exit::Exit;
use crate::bench::BenchArgs;
use crate::config::ServeArgs;

/// `leasegate serve`.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    runtime()?.block_on(crate::server::serve(args))
}

/// `leasegate demo`.
pub fn demo(args: ServeArgs) -> anyhow::Result<()> {
    runtime()?.block_on(crate::demo::run(args))
}

/// `leasegate bench`.
pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    runtime()?.block_on(crate::bench::run(args)).map(|_| ())
}

/// `leasegate runner …`.
pub fn runner(args: RunnerArgs) -> Exit {
    match runtime() {
        Ok(runtime) => runtime.block_on(crate::agent::commands::run(args)),
        // Threads or an epoll instance refused: the command could not do its job.
        Err(e) => {
            eprintln!("leasegate: {e:#}");
            Exit::Error
        }
    }
}

/// The runtime `#[tokio::main]` would build: every worker thread, timers and I/O.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
