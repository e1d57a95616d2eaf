//! Text from clients, before it is stored, looked up or shown.
//!
//! Two treatments. What is the runner's report of something else (a probe error is the
//! runtime's own words, escape codes and all) is *cleaned*: newlines and tabs become spaces,
//! other control characters go, and the result is capped on a character boundary. What names
//! or identifies something (ids, `kid`, `jti`, names, labels, keys) is *refused* when it holds
//! a control character: NUL cannot be stored in PostgreSQL's text at all, and the others have
//! no business in a name. Names and labels are also refused with format characters (Unicode
//! category Cf: bidirectional overrides, zero-width joiners and spaces), which make one name
//! look like another on the page.

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

/// A string that names or identifies something held a character it may not.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadText {
    #[error("{0}: control characters (NUL included) are not allowed")]
    Control(&'static str),
    #[error(
        "{0}: invisible format characters (bidirectional controls, zero-width) are not allowed"
    )]
    Format(&'static str),
}

/// `value` unless it holds a control character.
pub fn without_controls<'a>(field: &'static str, value: &'a str) -> Result<&'a str, BadText> {
    if value.chars().any(char::is_control) {
        return Err(BadText::Control(field));
    }
    Ok(value)
}

/// `value` unless it holds a control or a format character: for what people read as a name.
pub fn plain_name<'a>(field: &'static str, value: &'a str) -> Result<&'a str, BadText> {
    use unicode_general_category::{GeneralCategory, get_general_category};
    without_controls(field, value)?;
    if value
        .chars()
        .any(|c| get_general_category(c) == GeneralCategory::Format)
    {
        return Err(BadText::Format(field));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifying_text_with_controls_or_format_characters_is_refused() {
        assert_eq!(
            without_controls("jti", "abc\u{0}"),
            Err(BadText::Control("jti"))
        );
        assert_eq!(
            without_controls("id", "a\u{7f}"),
            Err(BadText::Control("id"))
        );
        assert_eq!(
            without_controls("id", "a\u{85}"),
            Err(BadText::Control("id"))
        );
        assert_eq!(without_controls("id", "runner-é"), Ok("runner-é"));
        // A right-to-left override makes `build-exe.txt` show as `build-txt.exe`.
        assert_eq!(
            plain_name("name", "build-\u{202e}txt.exe"),
            Err(BadText::Format("name"))
        );
        assert_eq!(
            plain_name("name", "a\u{200b}b"),
            Err(BadText::Format("name"))
        );
        assert_eq!(
            plain_name("name", "a\u{2066}b"),
            Err(BadText::Format("name"))
        );
        assert_eq!(plain_name("name", "build-01 (eu)"), Ok("build-01 (eu)"));
    }

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
