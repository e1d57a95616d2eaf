//! What the service wrote to storage, read from Linux's `/proc/PID/io` (`write_bytes`: the
//! bytes it caused to be sent to the storage layer, counted when pages are dirtied): the
//! in-process service's own, or `--server-pid`'s. SQLite's WAL frames and their checkpoints
//! are counted there; PostgreSQL's writes are its own processes', so nothing is reported for
//! it.
//!
//! A phase's bytes are counted from its start to `SETTLE` after its load ends, with the WAL
//! checkpointed at both ends (`Meter`): what the phase left in the WAL is copied into the
//! database file and counted with it, rather than with whichever phase SQLite's automatic
//! checkpoint next falls in, or with none.

use crate::store::{Bare, DatabaseUrl};
use std::time::Duration;

/// How long after a phase's load its writes are still counted.
pub const SETTLE: Duration = Duration::from_secs(3);

/// How many more times the bench checkpoints a WAL it could not copy whole.
const CHECKPOINT_TRIES: usize = 20;

/// The process's `write_bytes` so far; `None` where `/proc` does not say (not Linux, or
/// another user's process).
pub fn written_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/io"),
        None => "/proc/self/io".into(),
    };
    let io = std::fs::read_to_string(path).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Counts a SQLite service's writes over a phase, checkpoints included.
pub struct Meter {
    /// The service's process: `None` for this one.
    service: Option<u32>,
    /// A connection of the bench's own to the service's file, for the checkpoints.
    file: Option<Bare>,
}

/// Where a phase's count started.
#[derive(Clone, Copy)]
pub struct Mark {
    service: u64,
}

impl Meter {
    /// A meter of `service`'s (`None`: this process's) writes to the SQLite file at `url`.
    pub async fn open(url: &DatabaseUrl, service: Option<u32>) -> anyhow::Result<Meter> {
        Ok(Meter {
            service,
            file: Some(Bare::open(url, 1).await?),
        })
    }

    /// Checkpoints what earlier work left in the WAL, then marks where the count starts.
    pub async fn start(&mut self) -> Option<Mark> {
        self.checkpoint().await;
        Some(Mark {
            service: written_bytes(self.service)?,
        })
    }

    /// The bytes written since `mark`, counted `SETTLE` after the load with the WAL
    /// checkpointed: the service's own, and the checkpoint's when the bench ran it for a
    /// service in another process.
    pub async fn since(&mut self, mark: Mark) -> Option<u64> {
        tokio::time::sleep(SETTLE).await;
        let checkpoint = self.checkpoint().await;
        let service = written_bytes(self.service)?.saturating_sub(mark.service);
        Some(match self.service {
            Some(_) => service + checkpoint,
            // This process ran the checkpoint: already in its own count.
            None => service,
        })
    }

    /// Checkpoints the WAL from the bench's connection; the bytes this process wrote doing it.
    async fn checkpoint(&mut self) -> u64 {
        let Some(mut file) = self.file.take() else {
            return 0;
        };
        let before = written_bytes(None).unwrap_or(0);
        let (file, done) = match tokio::task::spawn_blocking(move || {
            // The service's checkpointer may be copying at the same moment (a passive
            // checkpoint then copies nothing and says it was busy): try again a few times.
            let mut done = file.checkpoint();
            for _ in 0..CHECKPOINT_TRIES {
                if !matches!(done, Ok(false)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
                done = file.checkpoint();
            }
            (file, done)
        })
        .await
        {
            Ok(back) => back,
            Err(e) => {
                tracing::warn!(error = %e, "the bench's checkpoint did not finish");
                return 0;
            }
        };
        match done {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "the WAL was not all checkpointed: a reader or the service's own checkpoint \
                 held it"
            ),
            Err(e) => tracing::warn!(error = %e, "the bench could not checkpoint the WAL"),
        }
        self.file = Some(file);
        written_bytes(None).unwrap_or(0).saturating_sub(before)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_write_count_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(super::written_bytes(None).is_some());
        }
    }
}
