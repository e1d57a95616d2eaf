//! The runtime's own words: the one line of a failed runtime command's stderr that says why,
//! without the framing around it.
//!
//! podman frames its messages two ways. Its final error is `Error: <message>`; but messages it
//! logs through logrus (most of rootless podman's set-up: the runtime directory, the pause
//! process, user namespaces) come as `time="…" level=error msg="<Go-quoted message>"` when
//! stderr is not a terminal, and sometimes such a line is the last one. An operator reading
//! the runner page needs the message, not the frame or its escapes, so both are taken off
//! here. Lines logged below `error` (podman's many warnings) are only used when nothing else
//! was printed: they usually come before the real error, but not always.

/// The line of `stderr` that says why the command failed, unframed, or `None` when it printed
/// nothing. The last non-empty line wins, except that a logrus line below `error` level gives
/// way to any other line before it.
pub fn last_error_line(stderr: &str) -> Option<String> {
    let mut weak = None;
    for line in stderr.lines().rev().map(str::trim) {
        if line.is_empty() {
            continue;
        }
        let (message, strong) = match LogrusLine::parse(line) {
            Some(frame) => (frame.message(), frame.is_error()),
            None => (strip_error_prefix(line), true),
        };
        if message.is_empty() {
            continue;
        }
        if strong {
            return Some(message);
        }
        weak.get_or_insert(message);
    }
    weak
}

/// A leading `Error: ` (podman) or `ERROR: ` removed: the sentence around the message already
/// says it is an error.
fn strip_error_prefix(line: &str) -> String {
    ["Error:", "ERROR:"]
        .iter()
        .filter_map(|p| line.strip_prefix(p))
        .find(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
        .unwrap_or(line)
        .trim()
        .to_string()
}

/// One line of logrus's text format: `key=value` pairs, each value bare or Go-quoted, with
/// at least `level` and `msg`.
#[derive(Debug, PartialEq, Eq)]
struct LogrusLine {
    level: String,
    msg: String,
    /// logrus's `WithError` field, which podman uses for the cause of the message.
    error: Option<String>,
}

impl LogrusLine {
    fn parse(line: &str) -> Option<LogrusLine> {
        let mut fields = Vec::new();
        let mut rest = line.trim_start();
        while !rest.is_empty() {
            let eq = rest.find('=')?;
            let key = &rest[..eq];
            if key.is_empty() || key.contains([' ', '"']) {
                return None;
            }
            let (value, after) = match rest[eq + 1..].strip_prefix('"') {
                Some(quoted) => go_unquote(quoted)?,
                None => {
                    let bare = &rest[eq + 1..];
                    let end = bare.find(' ').unwrap_or(bare.len());
                    (bare[..end].to_string(), &bare[end..])
                }
            };
            fields.push((key, value));
            rest = after.trim_start();
        }
        // logrus writes `time` first (unless timestamps are off, then `level`): requiring it
        // keeps an ordinary sentence with an `=` in it from being read as a frame.
        if !matches!(fields.first(), Some((k, _)) if *k == "time" || *k == "level") {
            return None;
        }
        let take = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        };
        Some(LogrusLine {
            level: take("level")?,
            msg: take("msg")?,
            error: take("error").or_else(|| take("err")),
        })
    }

    fn is_error(&self) -> bool {
        matches!(self.level.as_str(), "error" | "fatal" | "panic")
    }

    /// The message on one line: Go's quoting can carry newlines (a sub-command's output), and
    /// the probe's report is one line.
    fn message(&self) -> String {
        let mut text = self.msg.clone();
        if let Some(e) = self.error.as_deref().filter(|e| !e.trim().is_empty()) {
            text.push_str(": ");
            text.push_str(e);
        }
        text.split(['\n', '\r'])
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Reads a Go double-quoted string (`strconv.Quote`'s output) from just after its opening
/// quote: the unescaped text and what follows the closing quote, or `None` when it is not
/// closed or has an escape Go would not write.
fn go_unquote(s: &str) -> Option<(String, &str)> {
    let mut out: Vec<u8> = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    let hex = |digits: &[u8]| -> Option<u32> {
        u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // `\x` and octal escapes are bytes: invalid UTF-8 among them is shown, not lost.
                return Some((String::from_utf8_lossy(&out).into_owned(), &s[i + 1..]));
            }
            b'\\' => {
                let esc = *bytes.get(i + 1)?;
                i += 2;
                let simple = match esc {
                    b'a' => Some(0x07),
                    b'b' => Some(0x08),
                    b'f' => Some(0x0c),
                    b'n' => Some(b'\n'),
                    b'r' => Some(b'\r'),
                    b't' => Some(b'\t'),
                    b'v' => Some(0x0b),
                    b'\\' | b'"' | b'\'' => Some(esc),
                    _ => None,
                };
                if let Some(b) = simple {
                    out.push(b);
                    continue;
                }
                match esc {
                    b'x' => {
                        out.push(hex(bytes.get(i..i + 2)?)? as u8);
                        i += 2;
                    }
                    b'u' | b'U' => {
                        let n = if esc == b'u' { 4 } else { 8 };
                        let c = char::from_u32(hex(bytes.get(i..i + n)?)?)?;
                        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                        i += n;
                    }
                    b'0'..=b'7' => {
                        let digits = std::str::from_utf8(bytes.get(i - 1..i + 2)?).ok()?;
                        out.push(u8::from_str_radix(digits, 8).ok()?);
                        i += 2;
                    }
                    _ => return None,
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as rootless podman 4 writes them when stderr is not a terminal (the first is what
    // `XDG_RUNTIME_DIR=/run podman info` prints as an unprivileged user, exit status 1).
    const XDG: &str = r#"time="2026-12-01T13:44:45Z" level=error msg="XDG_RUNTIME_DIR directory \"/run\" is not owned by the current user""#;
    const PAUSE: &str = r#"time="2025-03-04T08:12:40Z" level=error msg="invalid internal status, try resetting the pause process with \"podman system migrate\": could not find any running process: no such process""#;
    const NEWUIDMAP: &str = r#"time="2025-03-04T08:12:40Z" level=error msg="running `/usr/bin/newuidmap 4242 0 1001 1 1 100000 65536`: newuidmap: write to uid_map failed: Operation not permitted\n""#;
    const CGROUP_WARN: &str = r#"time="2025-03-04T08:12:40Z" level=warning msg="The cgroupv2 manager is set to systemd but there is no systemd user session available""#;

    #[test]
    fn a_logrus_error_line_gives_its_message_unescaped() {
        assert_eq!(
            last_error_line(&format!("{XDG}\n")).as_deref(),
            Some(r#"XDG_RUNTIME_DIR directory "/run" is not owned by the current user"#)
        );
        assert_eq!(
            last_error_line(&format!("{CGROUP_WARN}\n{PAUSE}\n")).as_deref(),
            Some(
                r#"invalid internal status, try resetting the pause process with "podman system migrate": could not find any running process: no such process"#
            )
        );
        assert_eq!(
            last_error_line(NEWUIDMAP).as_deref(),
            Some(
                "running `/usr/bin/newuidmap 4242 0 1001 1 1 100000 65536`: newuidmap: write to uid_map failed: Operation not permitted"
            ),
            "the quoted trailing newline is not part of the message"
        );
    }

    #[test]
    fn podmans_final_error_wins_over_the_logrus_lines_before_it() {
        let stderr = format!(
            "{CGROUP_WARN}\n{NEWUIDMAP}\nError: cannot set up namespace using \"/usr/bin/newuidmap\": exit status 1\n"
        );
        assert_eq!(
            last_error_line(&stderr).as_deref(),
            Some(r#"cannot set up namespace using "/usr/bin/newuidmap": exit status 1"#)
        );
    }

    #[test]
    fn warnings_after_the_error_give_way_and_are_used_when_alone() {
        let stderr = format!("{PAUSE}\n{CGROUP_WARN}\n");
        assert!(
            last_error_line(&stderr)
                .unwrap()
                .starts_with("invalid internal status")
        );
        assert_eq!(
            last_error_line(CGROUP_WARN).as_deref(),
            Some(
                "The cgroupv2 manager is set to systemd but there is no systemd user session available"
            )
        );
    }

    #[test]
    fn logrus_fields_bare_values_and_the_error_field() {
        let line = r#"time="2025-03-04T08:12:40Z" level=fatal msg="cannot re-exec process" error="exit status 1""#;
        assert_eq!(
            last_error_line(line).as_deref(),
            Some("cannot re-exec process: exit status 1")
        );
        assert_eq!(
            last_error_line("level=error msg=oops").as_deref(),
            Some("oops")
        );
    }

    #[test]
    fn go_escapes_are_undone() {
        let (s, rest) = go_unquote(r#"tab\there \u00e9\xc3\xa9 \101 \\ \" end" tail"#).unwrap();
        assert_eq!(s, "tab\there éé A \\ \" end");
        assert_eq!(rest, " tail");
        assert_eq!(go_unquote("no closing quote"), None);
        assert_eq!(go_unquote(r#"bad \q escape""#), None);
    }

    #[test]
    fn ordinary_lines_are_not_frames() {
        for line in [
            "Error: default OCI runtime \"crun\" not found: invalid argument",
            "crun: setrlimit RLIMIT_NOFILE=1024: Operation not permitted",
            "msg=\"x\" level=error",
            "time=\"unterminated level=error msg=x",
        ] {
            assert_eq!(LogrusLine::parse(line), None, "{line}");
        }
    }

    #[test]
    fn the_last_line_without_podmans_prefix_is_the_message() {
        let stderr = "time=\"…\" level=warning msg=\"RunRoot is pointing to a path\"\n\
                      Error: default OCI runtime \"crun\" not found: invalid argument\n\n";
        assert_eq!(
            last_error_line(stderr).as_deref(),
            Some("default OCI runtime \"crun\" not found: invalid argument")
        );
        assert_eq!(
            last_error_line("Cannot connect to the Docker daemon. Is it running?\n").as_deref(),
            Some("Cannot connect to the Docker daemon. Is it running?")
        );
        assert_eq!(last_error_line("\n  \n"), None);
        assert_eq!(last_error_line("Error: "), None);
        assert_eq!(last_error_line("Errors: 3").as_deref(), Some("Errors: 3"));
    }
}
