//! Who asks in a GitLab job request, read the way GitLab reads it.
//!
//! GitLab's API is Grape on Rack, and its `params` merge the query, a form body
//! (`application/x-www-form-urlencoded`) and a JSON body (`application/json`, or a body with no
//! content type); gitlab-runner also sends its token as the `RUNNER-TOKEN` header. Reading the
//! token from the JSON body alone let a refused runner put it where the gate did not look (a
//! form body, `?token=`, a second `token` key after the first, a body after a BOM) and, with
//! `LEASEGATE_FORGE_UNBOUND=pass`, be forwarded as unbound while GitLab read its token.
//!
//! So every place GitLab (or any Rack of its past: Rack 2 also splits a query at `;` and reads
//! `[token]` as `token`) could read `token`, `system_id` or `last_update` from is read, and
//! they must agree: a field named twice in one place, named differently in two, or given as
//! something other than a string (an array, `token[]=`, a number) makes the request
//! `Unreadable`, and the gate answers it 400 without forwarding it. A body that should be JSON
//! and is not is unreadable too (GitLab answers it 400 as well), and so is a multipart body,
//! which gitlab-runner never sends and the gate does not parse. A UTF-8 BOM before the body is
//! skipped. Reading more places than GitLab does is safe: a token only the gate read is one
//! GitLab did not, and a fetch without one gets no job.

use axum::http::HeaderMap;
use axum::http::header::CONTENT_TYPE;
use serde_json::Value;

/// What the gate reads of a job request; the rest goes to GitLab as it came.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobRequestParams {
    /// The runner's authentication token.
    pub token: Option<String>,
    /// The machine's `system_id` (gitlab-runner's `.runner_system_id`), when it named one.
    pub system_id: Option<String>,
    /// The runner's queue position, echoed in a "no job".
    pub last_update: Option<String>,
}

/// Why a job request's fields cannot be read as one value each.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("`{field}` is named more than once in the {place}")]
    Duplicate {
        field: &'static str,
        place: &'static str,
    },
    #[error("`{0}` is given different values in different places (body, query, header)")]
    Conflicting(&'static str),
    #[error("`{0}` is not a string")]
    NotAString(&'static str),
    #[error("the body is not JSON: {0}")]
    Json(String),
    #[error("the JSON body names `{0}` twice")]
    JsonDuplicate(String),
    #[error("the body is multipart, which a job request is not")]
    Multipart,
}

const FIELDS: [&str; 3] = ["token", "system_id", "last_update"];

/// One field as one place gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Given {
    Str(String),
    Other,
}

/// What one place (the body, the query, the header) gives of each field.
#[derive(Default)]
struct Place {
    fields: [Option<Given>; 3],
}

impl Place {
    fn give(&mut self, name: &str, value: Given, place: &'static str) -> Result<(), Unreadable> {
        let Some(i) = FIELDS.iter().position(|f| *f == name) else {
            return Ok(());
        };
        if self.fields[i].is_some() {
            return Err(Unreadable::Duplicate {
                field: FIELDS[i],
                place,
            });
        }
        self.fields[i] = Some(value);
        Ok(())
    }
}

/// Reads a job request's `headers`, `query` (as it came, undecoded) and `body`.
pub fn read(
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
) -> Result<JobRequestParams, Unreadable> {
    let mut places = Vec::new();
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let media_type = headers
        .get(CONTENT_TYPE)
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|m| !m.is_empty());
    match media_type.as_deref() {
        Some("application/x-www-form-urlencoded") => {
            places.extend(form(body, "form body")?);
        }
        Some(m) if m.starts_with("multipart/") => return Err(Unreadable::Multipart),
        m => {
            let must_be_json = m.is_none_or(|m| m == "application/json" || m.ends_with("+json"));
            if let Some(place) = json(body, must_be_json)? {
                places.push(place);
            }
        }
    }
    if let Some(query) = query {
        places.extend(form(query.as_bytes(), "query")?);
    }
    let mut header = Place::default();
    for value in headers.get_all("runner-token") {
        let given = match value.to_str() {
            Ok(v) => Given::Str(v.to_string()),
            Err(_) => Given::Other,
        };
        header.give("token", given, "RUNNER-TOKEN headers")?;
    }
    places.push(header);
    let mut read = [None, None, None];
    for (i, field) in FIELDS.iter().enumerate() {
        for given in places.iter().filter_map(|p| p.fields[i].as_ref()) {
            let Given::Str(value) = given else {
                return Err(Unreadable::NotAString(field));
            };
            match &read[i] {
                None => read[i] = Some(value.clone()),
                Some(seen) if seen == value => {}
                Some(_) => return Err(Unreadable::Conflicting(field)),
            }
        }
    }
    let [token, system_id, last_update] = read;
    Ok(JobRequestParams {
        token,
        system_id,
        last_update,
    })
}

/// A form-encoded query or body, as Rack reads it: split at `&` (Rack 3), and at `&` and `;`
/// (Rack 2), each a place of its own, so that the two readings must agree.
fn form(bytes: &[u8], place: &'static str) -> Result<[Place; 2], Unreadable> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut ampersand = Place::default();
    for (key, value) in form_urlencoded::parse(bytes) {
        give_form(&mut ampersand, &key, value.into_owned(), place)?;
    }
    let mut semicolon = Place::default();
    for part in bytes.split(|b| *b == b';') {
        for (key, value) in form_urlencoded::parse(part) {
            give_form(&mut semicolon, &key, value.into_owned(), place)?;
        }
    }
    Ok([ampersand, semicolon])
}

/// One form pair, its key read as Rack 2 or 3 may read it: `token`, `[token]` and `token]` are
/// `token`; `token[]` or `token[x]` is `token` given as something other than a string.
fn give_form(
    place: &mut Place,
    key: &str,
    value: String,
    at: &'static str,
) -> Result<(), Unreadable> {
    let key = key.trim_start_matches('\u{FEFF}');
    let key = key.trim_start_matches(['[', ']']);
    let end = key.find(['[', ']']).unwrap_or(key.len());
    let (name, rest) = key.split_at(end);
    let given = if rest.trim_start_matches(']').is_empty() {
        Given::Str(value)
    } else {
        Given::Other
    };
    place.give(name, given, at)
}

/// A JSON body's top-level fields; `None` when the body is empty, or is not JSON and did not
/// have to be, or is JSON but not an object (GitLab reads no fields from either).
fn json(body: &[u8], must_be_json: bool) -> Result<Option<Place>, Unreadable> {
    if body.is_empty() {
        return Ok(None);
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) if must_be_json => return Err(Unreadable::Json(e.to_string())),
        Err(_) => return Ok(None),
    };
    if !value.is_object() {
        return Ok(None);
    }
    let Entries(entries) =
        serde_json::from_slice(body).map_err(|e| Unreadable::Json(e.to_string()))?;
    let mut seen = std::collections::HashSet::new();
    let mut place = Place::default();
    for (key, value) in entries {
        if !seen.insert(key.clone()) {
            return Err(Unreadable::JsonDuplicate(key));
        }
        let given = match value {
            // GitLab's optional fields may be null; a null token is no token to judge.
            Value::Null => continue,
            Value::String(s) => Given::Str(s),
            _ => Given::Other,
        };
        place.give(&key, given, "JSON body")?;
    }
    Ok(Some(place))
}

/// A JSON object's members in order, duplicates kept (`serde_json::Value` keeps the last).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn json_request(body: &str) -> Result<JobRequestParams, Unreadable> {
        read(
            &headers(&[("content-type", "application/json")]),
            None,
            body.as_bytes(),
        )
    }

    fn token(r: Result<JobRequestParams, Unreadable>) -> Option<String> {
        r.unwrap().token
    }

    #[test]
    fn gitlab_runners_request_is_read_whole() {
        let r = read(
            &headers(&[
                ("content-type", "application/json"),
                ("runner-token", "glrt-a"),
            ]),
            None,
            br#"{"token":"glrt-a","system_id":"s_0123456789ab","last_update":"17","info":{"name":"gitlab-runner"}}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            JobRequestParams {
                token: Some("glrt-a".into()),
                system_id: Some("s_0123456789ab".into()),
                last_update: Some("17".into()),
            }
        );
    }

    #[test]
    fn the_token_is_found_wherever_grape_would_find_it() {
        let form = headers(&[("content-type", "application/x-www-form-urlencoded")]);
        assert_eq!(
            token(read(&form, None, b"token=glrt-f&x=1")),
            Some("glrt-f".into())
        );
        assert_eq!(
            token(read(&form, None, b"tok%65n=glrt-f")),
            Some("glrt-f".into())
        );
        assert_eq!(
            token(read(&form, None, b"[token]=glrt-f")),
            Some("glrt-f".into())
        );
        assert_eq!(
            token(read(&HeaderMap::new(), Some("token=glrt-q"), b"")),
            Some("glrt-q".into())
        );
        assert_eq!(
            token(read(&HeaderMap::new(), Some("x=1;token=glrt-q"), b"")),
            Some("glrt-q".into())
        );
        // No content type: the body is JSON to Grape.
        assert_eq!(
            token(read(&HeaderMap::new(), None, br#"{"token":"glrt-j"}"#)),
            Some("glrt-j".into())
        );
        // After a BOM.
        assert_eq!(
            token(json_request("\u{FEFF}{\"token\":\"glrt-b\"}")),
            Some("glrt-b".into())
        );
        assert_eq!(
            token(read(&form, None, "\u{FEFF}token=glrt-b".as_bytes())),
            Some("glrt-b".into())
        );
        // A JSON body under another content type is read too.
        let text = headers(&[("content-type", "text/plain")]);
        assert_eq!(
            token(read(&text, None, br#"{"token":"glrt-t"}"#)),
            Some("glrt-t".into())
        );
        assert_eq!(token(read(&text, None, b"not json")), None);
        // The header alone.
        assert_eq!(
            token(read(&headers(&[("runner-token", "glrt-h")]), None, b"")),
            Some("glrt-h".into())
        );
        // An escaped key is the same key.
        assert_eq!(
            token(json_request(r#"{"\u0074oken":"glrt-u"}"#)),
            Some("glrt-u".into())
        );
        // A null is no value.
        assert_eq!(token(json_request(r#"{"token":null}"#)), None);
        assert_eq!(token(json_request("[1]")), None);
    }

    #[test]
    fn one_field_with_two_values_is_unreadable() {
        assert_eq!(
            json_request(r#"{"token":"a","token":"b"}"#),
            Err(Unreadable::JsonDuplicate("token".into()))
        );
        assert_eq!(
            json_request(r#"{"info":{},"info":{},"token":"a"}"#),
            Err(Unreadable::JsonDuplicate("info".into()))
        );
        assert!(matches!(
            read(&HeaderMap::new(), Some("token=a&token=b"), b""),
            Err(Unreadable::Duplicate { field: "token", .. })
        ));
        assert!(matches!(
            read(&HeaderMap::new(), Some("token=a&[token]=a"), b""),
            Err(Unreadable::Duplicate { field: "token", .. })
        ));
        assert_eq!(
            read(&HeaderMap::new(), Some("token=a"), br#"{"token":"b"}"#),
            Err(Unreadable::Conflicting("token"))
        );
        assert_eq!(
            read(
                &headers(&[("runner-token", "a")]),
                None,
                br#"{"token":"b"}"#
            ),
            Err(Unreadable::Conflicting("token"))
        );
        // Rack 2 reads `a`, Rack 3 `a;b`.
        assert_eq!(
            read(&HeaderMap::new(), Some("token=a;b"), b""),
            Err(Unreadable::Conflicting("token"))
        );
        assert_eq!(
            read(
                &HeaderMap::new(),
                Some("system_id=s_1"),
                br#"{"system_id":"s_2"}"#
            ),
            Err(Unreadable::Conflicting("system_id"))
        );
        // The same value in two places is one value.
        assert_eq!(
            token(read(
                &headers(&[("runner-token", "a")]),
                Some("token=a"),
                br#"{"token":"a"}"#
            )),
            Some("a".into())
        );
    }

    #[test]
    fn what_is_not_one_string_is_unreadable() {
        assert_eq!(
            json_request(r#"{"token":["a"]}"#),
            Err(Unreadable::NotAString("token"))
        );
        assert_eq!(
            json_request(r#"{"token":7}"#),
            Err(Unreadable::NotAString("token"))
        );
        assert_eq!(
            read(&HeaderMap::new(), Some("token[]=a"), b""),
            Err(Unreadable::NotAString("token"))
        );
        assert_eq!(
            read(&HeaderMap::new(), Some("token[x]=a"), b""),
            Err(Unreadable::NotAString("token"))
        );
        assert!(matches!(
            json_request(r#"{"token":"a""#),
            Err(Unreadable::Json(_))
        ));
        assert!(matches!(
            read(&HeaderMap::new(), None, b"token=a"),
            Err(Unreadable::Json(_))
        ));
        assert_eq!(
            read(
                &headers(&[("content-type", "multipart/form-data; boundary=x")]),
                None,
                b"--x"
            ),
            Err(Unreadable::Multipart)
        );
    }
}
