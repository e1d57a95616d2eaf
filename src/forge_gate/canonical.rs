//! One spelling per path: the form the gate judges a forge's path in, and the only form it
//! forwards.
//!
//! Forges do not route the path they are sent byte for byte. Gitea (~1.20) routes on the
//! percent-decoded path; Forgejo trims repeated and trailing slashes and connect-go decodes the
//! procedure; GitLab's Grape serves `…/jobs/request/`, `…//jobs/request`, `…/jobs/%72equest`
//! and `…/jobs/request.json` alike; a normalizing proxy in front of a forge resolves dot
//! segments too. Comparing the raw path with one string and forwarding every other spelling as
//! it came let a refused runner fetch by spelling the fetch another way. So every path is put
//! in one canonical form before anything looks at it: each segment percent-decoded (and
//! encoded again where a path must be), `.` and `..` resolved, empty segments (repeated and
//! trailing slashes) dropped. The gate judges that form and forwards that form, so the forge
//! routes exactly what the gate judged.
//!
//! A path that has no single canonical form is refused (`Unroutable`) and never forwarded:
//! an encoded `/` (a segment boundary to a forge that decodes first, none to one that does
//! not), a decoded `%` (a second decoding, by a proxy or the forge, would read another path),
//! a control character such as `%00`, a backslash (a `/` to some proxies), a malformed
//! escape, and dot segments that climb out of the prefix the request was routed by (even to
//! come back in).
//!
//! Which canonical paths are the calls the gate answers itself is `is_call`'s to say, loosely
//! on purpose: ASCII case is ignored and, for GitLab, a format suffix (`.json`) on the last
//! segment, so that no forge's leniency there makes a fetch the gate did not recognize.

use percent_encoding::{AsciiSet, CONTROLS, percent_encode};

/// Bytes written percent-encoded in a canonical segment: everything but RFC 3986's `pchar`.
const ENCODED: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Why a path has no single canonical form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unroutable {
    EncodedSlash,
    EncodedPercent,
    Control,
    Backslash,
    BadEscape,
    ClimbsOut,
}

impl Unroutable {
    pub fn detail(self) -> &'static str {
        match self {
            Unroutable::EncodedSlash => {
                "the path holds an encoded `/` (%2F), which forges read as a separator or not"
            }
            Unroutable::EncodedPercent => {
                "the path holds an encoded `%` (%25): decoded once more it is another path"
            }
            Unroutable::Control => "the path holds a control character (such as %00)",
            Unroutable::Backslash => "the path holds a backslash, which some proxies read as `/`",
            Unroutable::BadEscape => "the path holds a `%` that is not followed by two hex digits",
            Unroutable::ClimbsOut => "the path's dot segments climb out of the forge's prefix",
        }
    }
}

/// The canonical form of `path` (as it came on the request line, without the query), which
/// was routed by `prefix` (such as `/api/v4`): it must stay under it.
pub fn canonical(path: &str, prefix: &str) -> Result<String, Unroutable> {
    // Climbing out and back in has one form too, but no runner writes it, and a `..` that
    // leaves the prefix for a moment is what a proxy and a forge are likeliest to read apart.
    let depth = prefix.split('/').filter(|s| !s.is_empty()).count();
    let mut segments: Vec<Vec<u8>> = Vec::new();
    for raw in path.split('/') {
        let segment = decode(raw)?;
        match segment.as_slice() {
            b"" | b"." => {}
            b".." => {
                segments.pop();
                if segments.len() < depth {
                    return Err(Unroutable::ClimbsOut);
                }
            }
            _ => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.extend(percent_encode(segment, ENCODED));
    }
    if out.is_empty() {
        out.push('/');
    }
    let under = out
        .strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    if !under {
        return Err(Unroutable::ClimbsOut);
    }
    Ok(out)
}

/// A segment's bytes, percent-decoded, or why they cannot be.
fn decode(raw: &str) -> Result<Vec<u8>, Unroutable> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(Unroutable::BadEscape)?;
                let hex = std::str::from_utf8(hex).map_err(|_| Unroutable::BadEscape)?;
                let b = u8::from_str_radix(hex, 16).map_err(|_| Unroutable::BadEscape)?;
                i += 3;
                match b {
                    b'/' => return Err(Unroutable::EncodedSlash),
                    b'%' => return Err(Unroutable::EncodedPercent),
                    _ => b,
                }
            }
            b => {
                i += 1;
                b
            }
        };
        if b.is_ascii_control() {
            return Err(Unroutable::Control);
        }
        if b == b'\\' {
            return Err(Unroutable::Backslash);
        }
        out.push(b);
    }
    Ok(out)
}

/// Whether the canonical path `path` is the call `call` (a canonical path too), as a forge
/// lenient about ASCII case (and, with `format_suffix`, about a `.json`-like suffix on the last
/// segment, as Grape is) would route it.
pub fn is_call(path: &str, call: &str, format_suffix: bool) -> bool {
    if path.eq_ignore_ascii_case(call) {
        return true;
    }
    if !format_suffix {
        return false;
    }
    let (dir, last) = path.rsplit_once('/').unwrap_or(("", path));
    let Some((stem, _format)) = last.split_once('.') else {
        return false;
    };
    let (call_dir, call_last) = call.rsplit_once('/').unwrap_or(("", call));
    dir.eq_ignore_ascii_case(call_dir) && stem.eq_ignore_ascii_case(call_last)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FETCH: &str = "/api/actions/runner.v1.RunnerService/FetchTask";
    const REQUEST: &str = "/api/v4/jobs/request";

    fn forgejo(path: &str) -> Result<String, Unroutable> {
        canonical(path, "/api/actions")
    }

    #[test]
    fn every_spelling_of_the_fetch_has_the_fetch_as_its_form() {
        for spelling in [
            FETCH,
            "/api/actions/runner.v1.RunnerService/Fetch%54ask",
            "/api/actions/%72unner.v1.RunnerService/FetchTask",
            "/api/actions/runner.v1.RunnerService/FetchTask/",
            "/api/actions//runner.v1.RunnerService/FetchTask",
            "/api/actions/runner.v1.RunnerService//FetchTask//",
            "/api/actions/./runner.v1.RunnerService/FetchTask",
            "/api/actions/x/../runner.v1.RunnerService/FetchTask",
            "/api/actions/x/%2e%2E/runner.v1.RunnerService/FetchTask",
            "/api/actions/runner.v1.RunnerService/%46%65%74%63%68%54%61%73%6b",
            "/api/actions/runner.v1.RunnerService/FetchTask/.",
            "/api/actions/runner.v1.RunnerService/FetchTask/x/..",
        ] {
            assert_eq!(forgejo(spelling).as_deref(), Ok(FETCH), "{spelling}");
        }
    }

    #[test]
    fn a_path_without_one_form_is_unroutable() {
        for (path, why) in [
            (
                "/api/actions/runner.v1.RunnerService%2FFetchTask",
                Unroutable::EncodedSlash,
            ),
            (
                "/api/actions/runner.v1.RunnerService%2fFetchTask",
                Unroutable::EncodedSlash,
            ),
            (
                "/api/actions/runner.v1.RunnerService/Fetch%2554ask",
                Unroutable::EncodedPercent,
            ),
            ("/api/actions/FetchTask%00", Unroutable::Control),
            ("/api/actions/FetchTask%0a", Unroutable::Control),
            ("/api/actions/x%5C..%5CFetchTask", Unroutable::Backslash),
            ("/api/actions/x\\FetchTask", Unroutable::Backslash),
            ("/api/actions/Fetch%zzTask", Unroutable::BadEscape),
            ("/api/actions/FetchTask%4", Unroutable::BadEscape),
            ("/api/actions/FetchTask%", Unroutable::BadEscape),
            ("/api/actions/../v4/jobs/request", Unroutable::ClimbsOut),
            ("/api/actions/%2e%2e/%2e%2e/x", Unroutable::ClimbsOut),
            ("/api/actions/../../../../etc", Unroutable::ClimbsOut),
            ("/api/actions/..", Unroutable::ClimbsOut),
            ("/api/actions/../actions/FetchTask", Unroutable::ClimbsOut),
        ] {
            assert_eq!(forgejo(path), Err(why), "{path}");
        }
    }

    #[test]
    fn what_needs_encoding_stays_encoded_and_nothing_else() {
        assert_eq!(
            canonical("/api/v4/jobs/7/artifacts/a%20b%3Fc%23d%C3%A9", "/api/v4").as_deref(),
            Ok("/api/v4/jobs/7/artifacts/a%20b%3Fc%23d%C3%A9")
        );
        assert_eq!(
            canonical("/api/v4/jobs/7/trace", "/api/v4").as_deref(),
            Ok("/api/v4/jobs/7/trace")
        );
        // Letters, digits and the path's sub-delimiters are written plainly.
        assert_eq!(
            canonical("/twirp/%41%3a%40%2B%3D%2C%7E", "/twirp").as_deref(),
            Ok("/twirp/A:@+=,~")
        );
        // A raw non-ASCII byte is written encoded.
        assert_eq!(
            canonical("/twirp/é", "/twirp").as_deref(),
            Ok("/twirp/%C3%A9")
        );
        // Decoding twice gives the same form: it is one form.
        for path in ["/api/v4/a%20b", "/api/v4/x%C3%A9/./y", "/api/v4//z/"] {
            let once = canonical(path, "/api/v4").unwrap();
            assert_eq!(canonical(&once, "/api/v4").unwrap(), once);
        }
    }

    #[test]
    fn the_prefix_is_whole_segments() {
        assert_eq!(
            canonical(
                "/api/actions_pipeline/../actions/x",
                "/api/actions_pipeline"
            ),
            Err(Unroutable::ClimbsOut)
        );
        assert_eq!(
            canonical("/api/v4/", "/api/v4").as_deref(),
            Ok("/api/v4"),
            "the prefix alone is under itself"
        );
        assert_eq!(
            canonical("/api/v4/../v44/x", "/api/v4"),
            Err(Unroutable::ClimbsOut)
        );
    }

    #[test]
    fn calls_are_recognized_whatever_the_case_and_grapes_format_suffix() {
        assert!(is_call(REQUEST, REQUEST, true));
        assert!(is_call("/api/v4/jobs/REQUEST", REQUEST, true));
        assert!(is_call("/api/v4/jobs/request.json", REQUEST, true));
        assert!(is_call("/api/v4/jobs/request.txt", REQUEST, true));
        assert!(is_call("/api/v4/Jobs/Request.JSON", REQUEST, true));
        assert!(!is_call("/api/v4/jobs/request.json", REQUEST, false));
        assert!(!is_call("/api/v4/jobs/requests", REQUEST, true));
        assert!(!is_call("/api/v4/jobs/7", REQUEST, true));
        assert!(!is_call("/api/v4/jobsx/request.json", REQUEST, true));
        assert!(is_call(
            "/api/actions/RUNNER.V1.RUNNERSERVICE/FETCHTASK",
            FETCH,
            false
        ));
        // A dot inside the call's own last segment is part of it, not a suffix.
        assert!(!is_call(
            "/api/actions/runner.v1.RunnerService",
            "/api/actions/runner",
            false
        ));
    }
}
