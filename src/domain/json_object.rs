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
pub fn parse_object<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ParseError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let ObjectOnly(value) = serde_path_to_error::deserialize(&mut de).map_err(|e| ParseError {
        path: e.path().to_string(),
        error: e.into_inner(),
    })?;
    de.end().map_err(|error| ParseError {
        path: ".".into(),
        error,
    })?;
    Ok(value)
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
}
