//! Strict JSON for requests: the same as `serde_json::Value`, except that an object with the
//! same key twice is an error.
//!
//! serde_json keeps the last of two equal keys, so `{"command":"host.status","command":
//! "session.list"}` would quietly run `session.list`. A request is a person's or a program's
//! intent, and the envelope rule is that a typo is an error, never a guess: every request the
//! host parses (IPC lines, argv, wire JSON) goes through [`parse`]. Agents' own output is not
//! parsed with this: what an agent prints is translated leniently, as the adapters promise.

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parse one JSON value; duplicate object keys anywhere in it are refused.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let Strict(value) = Strict::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A `Value` that refuses duplicate keys while it is built.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_as_serde_json_without_duplicates() {
        for text in [
            r#"{"command":"session.send","params":{"text":"hi","n":[1,-2,3.5,null,true]}}"#,
            "[]",
            "\"x\"",
            "12345678901234567890",
            r#"{"a":{"b":{"c":{}}}}"#,
        ] {
            assert_eq!(
                parse(text).unwrap(),
                serde_json::from_str::<Value>(text).unwrap()
            );
        }
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        for text in [
            r#"{"command":"host.status","command":"session.list"}"#,
            r#"{"command":"session.send","params":{"text":"a","text":"b"}}"#,
            r#"[{"x":1,"x":1}]"#,
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.to_string().contains("duplicate key"), "{text}: {e}");
        }
    }

    #[test]
    fn trailing_garbage_is_refused() {
        assert!(parse(r#"{"command":"host.status"} x"#).is_err());
    }
}
