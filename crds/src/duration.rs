//! Durations as Istio's networking API writes them: `5s`, `1.5s`, `250ms`, `1m30s`, `2h`.
//!
//! Istio's manifests use Go duration strings (a sequence of decimal numbers with a unit: `h`,
//! `m`, `s`, `ms`, `us`/`µs`, `ns`); protobuf's canonical JSON form (`1.500s`) is one of them.
//! The CRD schema carries the same pattern, so the API server refuses a malformed duration
//! before any meshplane code sees it.

use std::fmt;
use std::time::Duration as StdDuration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The pattern the CRD schema enforces (a superset check; [`parse`] is exact).
pub const PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(h|m|s|ms|us|µs|ns))+$";

/// Why a duration string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {value:?}: {reason} (write e.g. \"5s\", \"1.5s\", \"250ms\" or \"1m30s\")"
)]
pub struct DurationError {
    pub value: String,
    pub reason: &'static str,
}

/// Parses a Go-style duration string.
pub fn parse(value: &str) -> Result<StdDuration, DurationError> {
    let err = |reason| DurationError {
        value: value.to_string(),
        reason,
    };
    if value.is_empty() {
        return Err(err("empty"));
    }
    let mut rest = value;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("a number needs a unit"))?;
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let scale: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" => 1_000,
            "ns" => 1,
            _ => return Err(err("unknown unit (use h, m, s, ms, us or ns)")),
        };
        let (whole, frac) = match number.split_once('.') {
            Some((w, f)) if !w.is_empty() && !f.is_empty() && !f.contains('.') => (w, f),
            Some(_) => return Err(err("malformed decimal number")),
            None => (number, ""),
        };
        let whole: u128 = whole.parse().map_err(|_| err("number too large"))?;
        let mut nanos = whole
            .checked_mul(scale)
            .ok_or_else(|| err("duration too large"))?;
        // Fractions beyond nanosecond precision are dropped.
        let mut unit_fraction = scale;
        for d in frac.bytes() {
            unit_fraction /= 10;
            if unit_fraction == 0 {
                break;
            }
            nanos += u128::from(d - b'0') * unit_fraction;
        }
        total_nanos = total_nanos
            .checked_add(nanos)
            .ok_or_else(|| err("duration too large"))?;
        rest = next;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| err("duration too large"))?;
    // Below 1e9 by construction.
    let sub = (total_nanos % 1_000_000_000) as u32;
    Ok(StdDuration::new(secs, sub))
}

/// A duration field of the networking API. Keeps the text the user wrote (so objects
/// round-trip unchanged) and the parsed value.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Duration {
    text: String,
    value: StdDuration,
}

impl Duration {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        Ok(Self {
            text: text.to_string(),
            value: parse(text)?,
        })
    }

    /// A duration from a value (written in milliseconds or seconds).
    pub fn from_std(value: StdDuration) -> Self {
        let text = if value.subsec_nanos() == 0 {
            format!("{}s", value.as_secs())
        } else if value.subsec_nanos().is_multiple_of(1_000_000) {
            format!("{}ms", value.as_millis())
        } else {
            format!("{}ns", value.as_nanos())
        };
        Self { text, value }
    }

    /// The parsed value.
    pub fn get(&self) -> StdDuration {
        self.value
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl Default for Duration {
    fn default() -> Self {
        Self::from_std(StdDuration::ZERO)
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Duration::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_and_protobuf_forms() {
        let ms = StdDuration::from_millis;
        assert_eq!(parse("5s"), Ok(ms(5000)));
        assert_eq!(parse("1.5s"), Ok(ms(1500)));
        assert_eq!(parse("1.500s"), Ok(ms(1500)));
        assert_eq!(parse("250ms"), Ok(ms(250)));
        assert_eq!(parse("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse("10us"), Ok(StdDuration::from_micros(10)));
        assert_eq!(parse("0s"), Ok(StdDuration::ZERO));
    }

    #[test]
    fn refuses_malformed_durations_with_a_reason() {
        for bad in ["", "5", "s", "5x", "1..5s", ".5s", "5s3", "-1s", "1.s"] {
            let e = parse(bad).expect_err(bad);
            assert!(e.to_string().contains("invalid duration"), "{bad}: {e}");
        }
        let e = serde_json::from_str::<Duration>("\"10 seconds\"").expect_err("bad");
        assert!(e.to_string().contains("\"10 seconds\""), "{e}");
    }

    #[test]
    fn round_trips_the_text() {
        let d: Duration = serde_json::from_str("\"1m30s\"").expect("valid");
        assert_eq!(d.get(), StdDuration::from_secs(90));
        assert_eq!(serde_json::to_string(&d).expect("serializes"), "\"1m30s\"");
        assert_eq!(
            Duration::from_std(StdDuration::from_millis(1500)).as_str(),
            "1500ms"
        );
    }

    #[test]
    fn the_schema_pattern_agrees_with_the_parser_on_common_forms() {
        let re = regex::Regex::new(PATTERN).expect("pattern compiles");
        for good in ["5s", "1.5s", "250ms", "1m30s", "2h", "10us", "3µs"] {
            assert!(re.is_match(good) && parse(good).is_ok(), "{good}");
        }
        for bad in ["5", "5x", "-1s", "1.5", "s"] {
            assert!(!re.is_match(bad) && parse(bad).is_err(), "{bad}");
        }
    }
}
