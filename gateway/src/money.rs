//! Money, exactly: the price plan's numbers as decimals, each currency's
//! minor units from ISO 4217, and the one rounding a bill makes.
//!
//! A price written `0.05` is the decimal 0.05, never the nearest binary
//! fraction; an amount is computed from integer usage and decimal prices
//! without loss and rounded once, to the currency's minor unit, half away
//! from zero ([`Currency::to_minor`]).

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::{Decimal, RoundingStrategy};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A non-negative exact decimal of the configuration (a price or an
/// allowance), written as a TOML number (`0.05`) or a decimal string
/// (`"0.05"`). A number is read as the decimal it is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Exact(Decimal);

impl Exact {
    /// `mantissa` × 10^-`scale` (`Exact::new(5, 2)` is 0.05).
    pub fn new(mantissa: u32, scale: u32) -> Exact {
        Exact(Decimal::new(i64::from(mantissa), scale.min(28)))
    }

    /// The decimal.
    pub fn value(self) -> Decimal {
        self.0
    }

    /// Parses a decimal such as `0.05` or `12` (no exponent, not
    /// negative).
    pub fn parse(s: &str) -> Result<Exact, String> {
        let d = Decimal::from_str_exact(s.trim())
            .map_err(|e| format!("'{s}' is not a decimal number such as 0.05 ({e})"))?;
        if d.is_sign_negative() && !d.is_zero() {
            return Err(format!("'{s}' is negative; prices and allowances are 0 or more"));
        }
        Ok(Exact(d.normalize()))
    }

    fn from_f64(x: f64) -> Result<Exact, String> {
        if !x.is_finite() {
            return Err(format!("{x} is not a number"));
        }
        // Rust prints the shortest decimal that reads back as `x`: the
        // number as it was written in the file.
        Exact::parse(&format!("{x}"))
    }
}

impl fmt::Display for Exact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.normalize())
    }
}

impl Serialize for Exact {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Exact {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Exact, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Exact;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative decimal number (0.05 or \"0.05\")")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Exact, E> {
                Exact::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Exact, E> {
                Ok(Exact(Decimal::from(v)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Exact, E> {
                Exact::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Exact, E> {
                Exact::from_f64(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A currency of ISO 4217 that has minor units: its code and how many
/// decimal digits its minor unit is (2 for USD, 0 for JPY, 3 for BHD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Currency {
    code: String,
    exponent: u32,
}

impl Currency {
    /// The currency of an ISO 4217 code (`"USD"`); an error for codes
    /// ISO 4217 does not list and for those without minor units (gold,
    /// funds), which no bill can be written in.
    pub fn from_code(code: &str) -> Result<Currency, String> {
        let c = iso_currency::Currency::from_code(code)
            .ok_or_else(|| format!("currency '{code}' is not an ISO 4217 code (such as USD, EUR or JPY)"))?;
        let exponent = c.exponent().ok_or_else(|| {
            format!("currency '{code}' has no minor unit in ISO 4217 (a metal or fund code): bills need a currency")
        })?;
        Ok(Currency { code: c.code().to_string(), exponent: u32::from(exponent) })
    }

    /// The ISO 4217 code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// Decimal digits of the minor unit.
    pub fn exponent(&self) -> u32 {
        self.exponent
    }

    /// `amount` in minor units, rounded half away from zero to the minor
    /// unit: the one rounding of a bill. Saturates far beyond any bill.
    pub fn to_minor(&self, amount: Decimal) -> i64 {
        let rounded = amount.round_dp_with_strategy(self.exponent, RoundingStrategy::MidpointAwayFromZero);
        let scale = Decimal::from(10i64.pow(self.exponent.min(18)));
        match rounded.checked_mul(scale).and_then(|m| m.to_i64()) {
            Some(m) => m,
            None if amount.is_sign_negative() => i64::MIN,
            None => i64::MAX,
        }
    }

    /// Minor units as a decimal string with the minor unit's digits
    /// (`1234` is `"12.34"` in USD, `"1234"` in JPY, `"1.234"` in BHD).
    pub fn format(&self, minor: i64) -> String {
        Decimal::try_from_i128_with_scale(i128::from(minor), self.exponent)
            .map(|d| d.to_string())
            .unwrap_or_else(|_| minor.to_string())
    }
}

impl Default for Currency {
    fn default() -> Self {
        Currency { code: "USD".into(), exponent: 2 }
    }
}

impl Serialize for Currency {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.code)
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Currency, D::Error> {
        let code = String::deserialize(d)?;
        Currency::from_code(&code).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn numbers_are_the_decimals_they_are_written_as() {
        #[derive(Deserialize)]
        struct P {
            a: Exact,
            b: Exact,
            c: Exact,
        }
        let p: P = toml::from_str("a = 0.1\nb = \"0.10\"\nc = 3").unwrap();
        assert_eq!(p.a.value(), Decimal::new(1, 1));
        assert_eq!(p.b, p.a);
        assert_eq!(p.a.value() * Decimal::from(3), Decimal::new(3, 1));
        assert_eq!(p.c.value(), Decimal::from(3));
        assert_eq!(p.a.to_string(), "0.1");
        for bad in ["a = -0.5\nb = 1\nc = 1", "a = \"1e3\"\nb = 1\nc = 1", "a = nan\nb = 1\nc = 1"] {
            assert!(toml::from_str::<P>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn currencies_round_once_to_their_own_minor_unit() {
        let usd = Currency::from_code("USD").unwrap();
        let jpy = Currency::from_code("JPY").unwrap();
        let bhd = Currency::from_code("BHD").unwrap();
        let x = Decimal::new(12345, 3); // 12.345
        assert_eq!((usd.to_minor(x), usd.format(usd.to_minor(x))), (1235, "12.35".into()));
        assert_eq!((jpy.to_minor(x), jpy.format(jpy.to_minor(x))), (12, "12".into()));
        assert_eq!((bhd.to_minor(x), bhd.format(bhd.to_minor(x))), (12345, "12.345".into()));
        assert_eq!(usd.to_minor(Decimal::new(5, 3)), 1); // 0.005: half away from zero
        assert_eq!(usd.to_minor(Decimal::new(4999, 6)), 0);
        assert_eq!(usd.format(0), "0.00");
        assert_eq!(usd.format(-150), "-1.50");
        assert_eq!(usd.to_minor(Decimal::MAX), i64::MAX);
        assert!(Currency::from_code("XAU").unwrap_err().contains("no minor unit"));
        assert!(Currency::from_code("usd").is_err());
        assert!(Currency::from_code("ABC").unwrap_err().contains("ISO 4217"));
    }
}
