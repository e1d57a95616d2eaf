//! Logging for `leasegate runner …`: tracing on stderr, and under systemd each line tagged
//! with its syslog priority, so that `journalctl -p warning` shows the agent's warnings.
//!
//! Why: journald files every line a service writes to stderr at the unit's `SyslogLevel=`
//! (info by default), whatever the text says. A line that starts with `<4>` is filed at
//! priority 4 (warning) instead, the prefix removed (`SyslogLevelPrefix=`, on by default). The
//! prefix is written only when stderr is the journal's stream, which systemd says in
//! `JOURNAL_STREAM` (`<device>:<inode>` of that stream): on a terminal, in a pipe or in a test,
//! the output is exactly what it was.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// The syslog priorities the agent writes at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    Err = 3,
    Warning = 4,
    Info = 6,
    Debug = 7,
}

impl Priority {
    pub fn of(level: &Level) -> Priority {
        match *level {
            Level::ERROR => Priority::Err,
            Level::WARN => Priority::Warning,
            Level::INFO => Priority::Info,
            _ => Priority::Debug,
        }
    }

    /// `<N>`, the prefix journald reads.
    pub fn prefix(self) -> String {
        format!("<{}>", self as u8)
    }
}

/// Writes one line to stderr at `priority`: for the lines a command prints itself rather than
/// logs (a failed probe's summary), which systemd must file at the right priority too.
pub fn eprint_line(priority: Priority, line: &str) {
    let mut err = std::io::stderr().lock();
    let prefix = if stderr_is_journal() {
        priority.prefix()
    } else {
        String::new()
    };
    let _ = writeln!(err, "{prefix}{line}");
}

/// Is stderr the stream systemd connected to the journal? Decided once per process.
pub fn stderr_is_journal() -> bool {
    static IS: OnceLock<bool> = OnceLock::new();
    *IS.get_or_init(|| {
        let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
            return false;
        };
        let stat = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map(std::fs::File::from)
            .and_then(|f| f.metadata());
        stat.is_ok_and(|m| names_stream(&stream, m.dev(), m.ino()))
    })
}

/// `JOURNAL_STREAM`'s `<device>:<inode>` names the file with this device and inode. The
/// variable is inherited by children whose stderr is elsewhere, hence the comparison.
pub fn names_stream(journal_stream: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.trim().split_once(':') else {
        return false;
    };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

/// stderr, each event's line prefixed with its priority when stderr is the journal.
/// stderr as `tracing` writes to it for the runner's commands (`logging::init`): each line
/// prefixed with its priority when stderr is the journal.
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { prefix: None }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line {
        Line {
            prefix: stderr_is_journal().then(|| Priority::of(meta.level()).prefix()),
        }
    }
}

/// One event's output. The formatter writes an event in a single `write_all`, so the prefix
/// goes before the first write only.
/// One log line on its way to stderr, given its priority prefix when it is written.
pub struct Line {
    prefix: Option<String>,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        if let Some(prefix) = self.prefix.take() {
            err.write_all(prefix.as_bytes())?;
        }
        err.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(Priority::of(&Level::ERROR).prefix(), "<3>");
        assert_eq!(Priority::of(&Level::WARN).prefix(), "<4>");
        assert_eq!(Priority::of(&Level::INFO).prefix(), "<6>");
        assert_eq!(Priority::of(&Level::DEBUG).prefix(), "<7>");
    }

    #[test]
    fn journal_stream_must_name_this_very_file() {
        let f = tempfile::tempfile().unwrap();
        let m = f.metadata().unwrap();
        let here = format!("{}:{}", m.dev(), m.ino());
        assert!(names_stream(&here, m.dev(), m.ino()));
        assert!(!names_stream(&here, m.dev(), m.ino() + 1));
        assert!(!names_stream("", m.dev(), m.ino()));
        assert!(!names_stream("garbage", m.dev(), m.ino()));
    }
}
