//! Copying SQLite's WAL into the database file on a thread of its own, beside the writer.
//!
//! SQLite checkpoints on the committing connection by default: every 1 000 pages of WAL, the
//! commit that crossed the mark also copies the WAL into the file and waits for the disk twice
//! (the WAL, then the file), 2–15 ms here. On the one writer's thread that is a stall of every
//! round queued behind it: at full speed a checkpoint every few hundred milliseconds, the
//! handlers idle while it waits, and a heartbeat's p99 is the checkpoint's `fsync`
//! (`docs/BENCHMARKS.md`, "SQLite's checkpoints beside the writer").
//!
//! So the writer's connection does not checkpoint (its WAL hook, which replaces SQLite's
//! automatic checkpoint, only notes the WAL's size), and after a commit that grew the WAL by
//! another `Cadence::every` pages it cues the checkpointer: a thread with a connection of its
//! own that runs a passive checkpoint, which copies what no reader still needs and waits for
//! nobody while the writer goes on.
//!
//! The WAL starts again from its beginning only when a write begins after everything in it
//! was copied. Under writes that never pause, the checkpointer never quite catches up (the
//! writer commits while it copies), so the WAL would grow for as long as the load lasts;
//! past `Cadence::most` pages the writer copies what is left itself, and the WAL starts
//! again. That stall is rarer than SQLite's (once per `most` pages, not per 1 000), and
//! shorter: the checkpointer has already copied and synced nearly all of it. (The commit that
//! starts the WAL again still syncs its new header, as SQLite always does.) A read that stays
//! open holds the WAL as it does under SQLite's own checkpoints: while it lasts nothing past
//! its snapshot is copied, the WAL grows past the bound, and the writer tries again at each
//! commit.

use rusqlite::Connection;
use rusqlite::hooks::Wal;
use std::cell::Cell;
use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

/// When the WAL is copied, in pages of the WAL.
#[derive(Clone, Copy, Debug)]
pub struct Cadence {
    /// The checkpointer is cued each time the WAL has grown by this much since its last cue
    /// (SQLite's own automatic checkpoint: 1 000 pages, about 4 MB).
    pub every: i32,
    /// Past this, the writer copies the WAL itself, so that it starts again (64 MB).
    pub most: i32,
}

impl Cadence {
    pub const SERVICE: Cadence = Cadence {
        every: 1_000,
        most: 16_000,
    };
}

/// What a commit that left the WAL at some size asks for.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Nothing,
    /// Cue the checkpointer; remember the size it was cued at.
    Cue,
    /// Copy it here, on the writer's thread.
    CopyHere,
}

/// The decision, apart from the threads: the WAL holds `pages` after a commit, and the
/// checkpointer was last cued when it held `cued_at` (a WAL smaller than that has started
/// again since).
fn step(pages: i32, cued_at: i32, cadence: Cadence) -> Step {
    let cued_at = if pages < cued_at { 0 } else { cued_at };
    if pages >= cadence.most {
        Step::CopyHere
    } else if pages - cued_at >= cadence.every {
        Step::Cue
    } else {
        Step::Nothing
    }
}

thread_local! {
    /// The WAL's size after the commit this thread just made, until `committed` takes it: the
    /// hook runs on the committing thread, and nothing of one connection's commit is left for
    /// another's on the same thread (the bench's blocking threads run several), nor for a
    /// transaction that rolled back.
    static WAL_PAGES: Cell<Option<i32>> = const { Cell::new(None) };
}

/// The writer's WAL hook. Setting one turns SQLite's automatic checkpoint off (they share the
/// connection's one hook), which is the point.
fn note_wal_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(Some(pages));
    Ok(())
}

/// The writer's side of the checkpointer: cues it, and copies the WAL itself past the bound.
pub struct Checkpoints {
    cue: mpsc::SyncSender<()>,
    cadence: Cadence,
    /// The WAL's size at the last cue (the writer's thread alone reads and sets it).
    cued_at: AtomicI32,
    counts: Arc<Counts>,
}

/// How many checkpoints copied the whole WAL beside the writer, how many the writer ran
/// itself, and the WAL's size after the last commit (the tests ask).
#[derive(Default, Debug)]
pub struct Counts {
    pub beside: AtomicU64,
    pub on_the_writer: AtomicU64,
    pub wal_pages: AtomicI32,
}

impl Checkpoints {
    /// Starts the checkpointer's thread with a connection of its own, made by `open`; it
    /// stops when these `Checkpoints` are dropped.
    pub fn start(
        path: PathBuf,
        open: impl Fn() -> rusqlite::Result<Connection> + Send + 'static,
        cadence: Cadence,
    ) -> anyhow::Result<Self> {
        let conn = open()?;
        let (cue, cues) = mpsc::sync_channel::<()>(1);
        let counts = Arc::new(Counts::default());
        let count = counts.clone();
        std::thread::Builder::new()
            .name("sqlite-checkpointer".into())
            .spawn(move || {
                while cues.recv().is_ok() {
                    match checkpoint(&conn) {
                        Ok(true) => {
                            count.beside.fetch_add(1, Ordering::Relaxed);
                        }
                        // A reader still needs part of it: the next cue copies the rest.
                        Ok(false) => tracing::debug!(database = %path.display(),
                            "a checkpoint of the SQLite WAL copied part of it"),
                        // The next cue tries again; a file that cannot be written fails the
                        // writer's commits too, and says so there.
                        Err(e) => tracing::warn!(database = %path.display(), error = %e,
                            "a checkpoint of the SQLite WAL failed"),
                    }
                }
            })?;
        Ok(Checkpoints {
            cue,
            cadence,
            cued_at: AtomicI32::new(0),
            counts,
        })
    }

    /// Makes `conn` (the writer's) note its WAL's size instead of checkpointing.
    pub fn hand_over(conn: &Connection) {
        conn.wal_hook(Some(note_wal_pages));
    }

    #[cfg(test)]
    pub fn counts(&self) -> Arc<Counts> {
        self.counts.clone()
    }

    /// Called on the writer's thread after each transaction of `conn`: nothing to do unless
    /// it committed.
    pub fn committed(&self, conn: &Connection) {
        let Some(pages) = WAL_PAGES.take() else {
            return;
        };
        self.counts.wal_pages.store(pages, Ordering::Relaxed);
        let cued_at = self.cued_at.load(Ordering::Relaxed);
        match step(pages, cued_at, self.cadence) {
            Step::Nothing => {
                if pages < cued_at {
                    self.cued_at.store(0, Ordering::Relaxed);
                }
            }
            Step::Cue => {
                // Full: a cue is waiting already, and that checkpoint will copy this too.
                let _ = self.cue.try_send(());
                self.cued_at.store(pages, Ordering::Relaxed);
            }
            Step::CopyHere => {
                match checkpoint(conn) {
                    Ok(true) => {}
                    // The checkpointer is copying, or a reader needs part of it: tried again
                    // at the next commit.
                    Ok(false) => tracing::debug!(
                        pages,
                        "the writer's checkpoint of a long \
                        SQLite WAL copied part of it"
                    ),
                    Err(e) => tracing::warn!(error = %e, pages, "the writer's checkpoint of a \
                        long SQLite WAL failed"),
                }
                self.counts.on_the_writer.fetch_add(1, Ordering::Relaxed);
                self.cued_at.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// A passive checkpoint: copies every page of the WAL that no reader still needs, waiting for
/// no one. Answers whether it copied the whole WAL.
pub fn checkpoint(conn: &Connection) -> rusqlite::Result<bool> {
    // (busy, frames in the WAL, frames copied)
    let (busy, log, copied): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    Ok(busy == 0 && log == copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Cadence = Cadence {
        every: 10,
        most: 40,
    };

    #[test]
    fn the_checkpointer_is_cued_once_per_cadence_of_growth() {
        assert_eq!(step(3, 0, SMALL), Step::Nothing);
        assert_eq!(step(10, 0, SMALL), Step::Cue);
        assert_eq!(step(15, 10, SMALL), Step::Nothing);
        assert_eq!(step(20, 10, SMALL), Step::Cue);
    }

    #[test]
    fn a_wal_that_started_again_is_counted_from_its_beginning() {
        // Cued at 30, then the WAL started again: 12 pages is 12 of new growth.
        assert_eq!(step(12, 30, SMALL), Step::Cue);
        assert_eq!(step(5, 30, SMALL), Step::Nothing);
    }

    #[test]
    fn past_the_bound_the_writer_copies_it_itself() {
        assert_eq!(step(40, 30, SMALL), Step::CopyHere);
        assert_eq!(step(400, 390, SMALL), Step::CopyHere);
    }
}
