//! Cleaning text that runners send before it is stored and shown.
//!
//! A probe error is the runtime's own words and operators must see them as written, but a
//! runner could send anything: newlines and tabs become spaces, other control characters go,
//! and the result is capped at a byte length cut on a character boundary.

/// The cap on a stored probe error, in bytes (PROTOCOL.md).
pub const PROBE_ERROR_MAX_BYTES: usize = 2048;

/// Newlines and tabs to spaces, other control characters removed, at most `max_bytes` bytes.
pub fn sanitize(input: &str, max_bytes: usize) -> String {
    let mut out = String::with_capacity(input.len().min(max_bytes));
    for c in input.chars() {
        let c = match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_control() => continue,
            c => c,
        };
        if out.len() + c.len_utf8() > max_bytes {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_whitespace_to_spaces_and_drops_controls() {
        assert_eq!(sanitize("a\nb\tc\u{7}d\u{1b}[31m", 100), "a b cd[31m");
    }

    #[test]
    fn cuts_on_a_character_boundary() {
        let s = "é".repeat(10); // 2 bytes each
        assert_eq!(sanitize(&s, 5), "éé");
        assert_eq!(
            sanitize(&"x".repeat(5000), PROBE_ERROR_MAX_BYTES).len(),
            2048
        );
    }
}
