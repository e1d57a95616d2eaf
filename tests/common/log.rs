//! A test's own log: what the code it runs logs on the test's thread, captured as text.
//!
//! `tracing` remembers, for each place that logs, whether any subscriber wants its events, and
//! decides it where the place is first reached. While a test's subscriber is the process's only
//! one, that decision asks the subscriber of the thread that got there first: another test's
//! worker thread has none, so the place was remembered as unheard, and a test capturing its log
//! missed the line for good (`forge_gate_blame` missed "cannot reach the forge" whenever
//! `forge_gate`'s dead forge ran first). A global subscriber that wants nothing, installed once,
//! makes every decision ask all the live subscribers, so a capture hears what its thread logs
//! whichever test ran first.

use std::io::Write;
use std::sync::{Arc, Mutex, Once};
use tracing::subscriber::DefaultGuard;

/// The log lines written on the capturing thread while its guard lives.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures this thread's log (INFO and above, without colours) until the guard is dropped:
    /// on a current-thread runtime, the service's, its clients' and the test's own.
    pub fn start() -> (Self, DefaultGuard) {
        static GLOBAL: Once = Once::new();
        GLOBAL.call_once(|| {
            // Fails only if something else set one first, which serves as well.
            let _ =
                tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::new());
        });
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (log, tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
