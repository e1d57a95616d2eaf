//! Strict JSON objects: a derived `Deserialize` struct also accepts a JSON *array* (its fields
//! by position). A JOSE header or a JWT claims set is an object by definition, and a client
//! written with a standard JWT library would reject an array, so neither may we.

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// `T`, read only from a JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        d.deserialize_map(ObjectVisitor(PhantomData))
            .map(ObjectOnly)
    }
}

/// Where in a document parsing failed (`.` for the whole of it), and why.
#[derive(Debug)]
pub struct ParseError {
    pub path: String,
    pub error: serde_json::Error,
}

/// Parses all of `bytes` as `T` read from one JSON object: nothing may follow it.
///
/// Read straight first: tracking the path costs an allocation for every member read, and is
/// needed only to say where a document that fails went wrong, so only such a document is read
/// a second time, with the path tracked (`locate`).
pub fn parse_object<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ParseError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let read = ObjectOnly::<T>::deserialize(&mut de).and_then(|ObjectOnly(value)| {
        de.end()?;
        Ok(value)
    });
    read.map_err(|error| {
        locate::<T>(bytes).unwrap_or(ParseError {
            path: ".".into(),
            error,
        })
    })
}

/// Where reading `bytes` as `T` fails: the path to the value that did, or `.` when what follows
/// the object is the fault.
fn locate<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Option<ParseError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, ObjectOnly<T>>(&mut de) {
        Err(e) => Some(ParseError {
            path: e.path().to_string(),
            error: e.into_inner(),
        }),
        Ok(_) => de.end().err().map(|error| ParseError {
            path: ".".into(),
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Pair {
        a: u8,
        #[allow(dead_code)]
        b: u8,
    }

    #[test]
    fn only_a_whole_object_is_accepted() {
        assert_eq!(parse_object::<Pair>(br#"{"a":1,"b":2}"#).unwrap().a, 1);
        assert!(parse_object::<Pair>(b"[1,2]").is_err());
        assert!(parse_object::<Pair>(br#"{"a":1,"b":2} x"#).is_err());
        assert!(parse_object::<Pair>(br#"{"a":1,"b":2}{"a":1,"b":2}"#).is_err());
        assert!(
            parse_object::<Pair>(br#"{"a":1,"a":1,"b":2}"#).is_err(),
            "duplicate members"
        );
    }

    #[test]
    fn a_failure_says_where() {
        let wrong = parse_object::<Pair>(br#"{"a":1,"b":"two"}"#).unwrap_err();
        assert_eq!(wrong.path, "b");
        let trailing = parse_object::<Pair>(br#"{"a":1,"b":2} x"#).unwrap_err();
        assert_eq!(trailing.path, ".");
        assert!(
            trailing.error.to_string().contains("trailing"),
            "{}",
            trailing.error
        );
    }
}
