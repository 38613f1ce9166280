//! Whole numbers in request bodies. JSON has one number type: `122.0` is
//! the integer 122 to JSON Schema (and to JavaScript, which writes it
//! `122`, and Python, which may write `122.0`), so integer fields accept
//! a number with no fractional part, in the field's range, whatever its
//! spelling. A fraction or a value out of range is refused by name.

use serde::{Deserialize, Deserializer, de::Error};

/// The whole number `n` as a `T`, or why not.
fn whole<T: TryFrom<u64>>(n: &serde_json::Number) -> Result<T, String> {
    let v = match n.as_u64() {
        Some(v) => Some(v),
        None => n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64).map(|f| f as u64),
    };
    v.and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| format!("{n} is not a whole number in the range of {}", std::any::type_name::<T>()))
}

/// For `#[serde(deserialize_with = "whole::required")]`.
pub fn required<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    whole(&n).map_err(D::Error::custom)
}

/// For `#[serde(default, deserialize_with = "whole::optional")]`.
pub fn optional<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    match Option::<serde_json::Number>::deserialize(d)? {
        None => Ok(None),
        Some(n) => whole(&n).map(Some).map_err(D::Error::custom),
    }
}

/// For `#[serde(default, deserialize_with = "whole::nullable")]` on an
/// `Option<Option<T>>` of a partial update: absent `None`, `null`
/// `Some(None)`, a number `Some(Some(n))`.
pub fn nullable<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    optional(d).map(Some)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[derive(serde::Deserialize, Debug)]
    struct S {
        #[serde(default, deserialize_with = "super::optional")]
        a: Option<u16>,
        #[serde(deserialize_with = "super::required")]
        b: u64,
    }

    fn parse(s: &str) -> Result<S, String> {
        serde_json::from_str(s).map_err(|e| e.to_string())
    }

    #[test]
    fn integral_numbers_in_any_spelling_are_accepted() {
        let s = parse(r#"{"a": 122.0, "b": 7}"#).unwrap();
        assert_eq!((s.a, s.b), (Some(122), 7));
        let s = parse(r#"{"b": 1e3}"#).unwrap();
        assert_eq!((s.a, s.b), (None, 1000));
        assert_eq!(parse(r#"{"a": null, "b": 0}"#).unwrap().a, None);
    }

    #[test]
    fn fractions_negatives_and_values_out_of_range_are_refused() {
        assert!(parse(r#"{"b": 1.5}"#).unwrap_err().contains("not a whole number"));
        assert!(parse(r#"{"b": -1}"#).unwrap_err().contains("not a whole number"));
        assert!(parse(r#"{"a": 65536, "b": 1}"#).unwrap_err().contains("not a whole number"));
        assert!(parse(r#"{"b": "1"}"#).is_err());
    }
}
