//! `duration()` and `timestamp()` as the API server runs them: cel-go parses a duration with Go's
//! `time.ParseDuration` (`1h30m`, `1.5s`, `300µs`, `-1s`; nothing after the last unit) and a
//! timestamp with `time.Parse(time.RFC3339, …)` (`2026-01-02T15:04:05.5Z`, an upper-case `T`
//! and `Z`, seconds below 60), within the years 1 to 9999. The `cel` crate parses both more
//! loosely (chrono's RFC 3339, its own duration grammar), so a call is expanded when written into
//! `@duration(x)` or `@timestamp(x)`, which parse with these grammars; the same functions judge a
//! constant argument when the expression is written, as Kubernetes' literal validators do.
use ::cel::common::ast::{CallExpr, Expr};
use ::cel::common::types::{
    CelDuration, CelInt, CelString, CelTimestamp, DURATION_TYPE, INT_TYPE, STRING_TYPE,
    TIMESTAMP_TYPE,
};
use ::cel::common::value::CowVal;
use ::cel::parser::Macro;
use ::cel::{DeclarationError, Env, ExecutionError};
use chrono::{DateTime, FixedOffset};

use super::lists::take;

/// What `duration(x)` is expanded into; `@` keeps it out of what a Policy can write.
pub const DURATION: &str = "@duration";
/// What `timestamp(x)` is expanded into.
pub const TIMESTAMP: &str = "@timestamp";

/// The function `internal` (one of this module's) was written as.
pub fn written_as(internal: &str) -> Option<&'static str> {
    match internal {
        DURATION => Some("duration"),
        TIMESTAMP => Some("timestamp"),
        _ => None,
    }
}

/// The earliest and latest timestamps CEL has (0001-01-01T00:00:00Z, 9999-12-31T23:59:59Z), in
/// Unix seconds.
const MIN_UNIX_SECONDS: i64 = -62_135_596_800;
const MAX_UNIX_SECONDS: i64 = 253_402_300_799;

/// Registers the expansions and the functions they call.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    for (internal, function) in [(DURATION, "duration"), (TIMESTAMP, "timestamp")] {
        env.add_macro(Macro::global(function, 1, move |helper, _target, args| {
            Ok(Some(helper.next_expr(Expr::Call(CallExpr {
                func_name: internal.to_string(),
                target: None,
                args: std::mem::take(args),
            }))))
        }))?;
    }
    env.add_overload(
        DURATION,
        "@duration_string",
        vec![STRING_TYPE],
        duration_of_string,
    )?;
    env.add_overload(DURATION, "@duration_duration", vec![DURATION_TYPE], itself)?;
    env.add_overload(
        TIMESTAMP,
        "@timestamp_string",
        vec![STRING_TYPE],
        timestamp_of_string,
    )?;
    env.add_overload(
        TIMESTAMP,
        "@timestamp_int",
        vec![INT_TYPE],
        timestamp_of_int,
    )?;
    env.add_overload(
        TIMESTAMP,
        "@timestamp_timestamp",
        vec![TIMESTAMP_TYPE],
        itself,
    )?;
    // cel-go's conversion the crate's `int` lacks: a duration in nanoseconds.
    env.add_overload("int", "int_duration", vec![DURATION_TYPE], int_of_duration)
}

fn int_of_duration<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [duration] = take(args)?;
    let nanos = duration
        .downcast_ref::<CelDuration>()
        .and_then(|d| d.inner().num_nanoseconds())
        .ok_or_else(|| ExecutionError::function_error("int", "not a duration in range"))?;
    Ok(CowVal::owned(CelInt::from(nanos)))
}

fn itself<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [value] = take(args)?;
    Ok(value)
}

fn string_arg<'a>(value: &'a CowVal<'_, '_>, function: &str) -> Result<&'a str, ExecutionError> {
    value
        .downcast_ref::<CelString<'_>>()
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::function_error(function, "not a string"))
}

fn duration_of_string<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [text] = take(args)?;
    let nanos = parse_duration(string_arg(&text, "duration")?)
        .map_err(|e| ExecutionError::function_error("duration", e))?;
    Ok(CowVal::Owned(Box::new(CelDuration::from(
        chrono::Duration::nanoseconds(nanos),
    ))))
}

fn timestamp_of_string<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [text] = take(args)?;
    let at = parse_timestamp(string_arg(&text, "timestamp")?)
        .map_err(|e| ExecutionError::function_error("timestamp", e))?;
    Ok(CowVal::Owned(Box::new(CelTimestamp::from(at))))
}

fn timestamp_of_int<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [seconds] = take(args)?;
    let seconds = seconds
        .downcast_ref::<CelInt>()
        .map(|i| *i.inner())
        .ok_or_else(|| ExecutionError::function_error("timestamp", "not an int"))?;
    let at = timestamp_of_seconds(seconds)
        .map_err(|e| ExecutionError::function_error("timestamp", e))?;
    Ok(CowVal::Owned(Box::new(CelTimestamp::from(at))))
}

/// `seconds` since the Unix epoch, within CEL's years.
pub fn timestamp_of_seconds(seconds: i64) -> Result<DateTime<FixedOffset>, String> {
    if !(MIN_UNIX_SECONDS..=MAX_UNIX_SECONDS).contains(&seconds) {
        return Err(format!("timestamp {seconds} is out of range"));
    }
    DateTime::from_timestamp(seconds, 0)
        .map(|at| at.fixed_offset())
        .ok_or_else(|| format!("timestamp {seconds} is out of range"))
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` with the units `ns`, `us`
/// (`µs`, `μs`), `ms`, `s`, `m`, `h`, or `0`; in nanoseconds, at most 2^63 - 1.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    let mut reading = DurationText { text, rest };
    if rest.is_empty() {
        return Err(reading.invalid());
    }
    let mut total: u64 = 0;
    while !reading.rest.is_empty() {
        let term = reading.term()?;
        total = total
            .checked_add(term)
            .filter(|t| *t <= DURATION_LIMIT)
            .ok_or_else(|| reading.overflow())?;
    }
    if negative {
        // 2^63 nanoseconds negated is i64::MIN.
        return Ok(0i64.wrapping_sub_unsigned(total));
    }
    i64::try_from(total).map_err(|_| reading.overflow())
}

/// The largest magnitude of a duration, in nanoseconds: 2^63, which only a negative one reaches.
const DURATION_LIMIT: u64 = 1 << 63;

/// A duration being parsed: all its `text`, and the `rest` not read yet.
struct DurationText<'a> {
    text: &'a str,
    rest: &'a str,
}

/// The number before a unit: its whole part and its fraction, `fraction / scale`.
struct Number {
    whole: u64,
    whole_digits: usize,
    fraction: u64,
    scale: f64,
    fraction_digits: usize,
}

impl DurationText<'_> {
    fn invalid(&self) -> String {
        format!("invalid duration {:?}", self.text)
    }

    fn overflow(&self) -> String {
        format!("invalid duration {:?}: out of range", self.text)
    }

    /// The next number and its unit, in nanoseconds.
    fn term(&mut self) -> Result<u64, String> {
        if !self
            .rest
            .starts_with(|c: char| c == '.' || c.is_ascii_digit())
        {
            return Err(self.invalid());
        }
        let number = self.number()?;
        if number.whole_digits == 0 && number.fraction_digits == 0 {
            return Err(self.invalid());
        }
        let unit = self.unit()?;
        if number.whole > DURATION_LIMIT / unit {
            return Err(self.overflow());
        }
        let mut value = number.whole * unit;
        if number.fraction > 0 {
            // As Go: the fraction's share of the unit, in floating point, truncated.
            value += (number.fraction as f64 * (unit as f64 / number.scale)) as u64;
            if value > DURATION_LIMIT {
                return Err(self.overflow());
            }
        }
        Ok(value)
    }

    /// The digits, with an optional fraction after `.`, that start the rest.
    fn number(&mut self) -> Result<Number, String> {
        let whole_digits = self.rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut number = Number {
            whole: 0,
            whole_digits,
            fraction: 0,
            scale: 1.0,
            fraction_digits: 0,
        };
        for digit in self.rest[..whole_digits].bytes() {
            number.whole = number
                .whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(u64::from(digit - b'0')))
                .filter(|w| *w <= DURATION_LIMIT)
                .ok_or_else(|| self.overflow())?;
        }
        self.rest = &self.rest[whole_digits..];
        if let Some(after_point) = self.rest.strip_prefix('.') {
            number.fraction_digits = after_point.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflowed = false;
            for digit in after_point[..number.fraction_digits].bytes() {
                // Digits past what a u64 holds are dropped, as Go does.
                if overflowed || number.fraction > (DURATION_LIMIT - 1) / 10 {
                    overflowed = true;
                    continue;
                }
                number.fraction = number.fraction * 10 + u64::from(digit - b'0');
                number.scale *= 10.0;
            }
            self.rest = &after_point[number.fraction_digits..];
        }
        Ok(number)
    }

    /// The unit that starts the rest, in nanoseconds.
    fn unit(&mut self) -> Result<u64, String> {
        let unit_len = self
            .rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(self.rest.len());
        let text = self.text;
        let unit: u64 = match &self.rest[..unit_len] {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("invalid duration {text:?}: missing unit")),
            other => return Err(format!("invalid duration {text:?}: unknown unit {other:?}")),
        };
        self.rest = &self.rest[unit_len..];
        Ok(unit)
    }
}

/// Go's `time.Parse(time.RFC3339, …)`, within CEL's years: `YYYY-MM-DDTHH:MM:SS`, an optional
/// fraction of a second after `.` or `,`, then `Z` or `±HH:MM`.
pub fn parse_timestamp(text: &str) -> Result<DateTime<FixedOffset>, String> {
    let invalid = || format!("invalid timestamp {text:?}: not RFC 3339");
    let bytes = text.as_bytes();
    let digits = |from: usize, to: usize| {
        bytes
            .get(from..to)
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
    };
    let shaped = digits(0, 4)
        && bytes.get(4) == Some(&b'-')
        && digits(5, 7)
        && bytes.get(7) == Some(&b'-')
        && digits(8, 10)
        && bytes.get(10) == Some(&b'T')
        && digits(11, 13)
        && bytes.get(13) == Some(&b':')
        && digits(14, 16)
        && bytes.get(16) == Some(&b':')
        && digits(17, 19);
    if !shaped {
        return Err(invalid());
    }
    // Go refuses a leap second; chrono would take it.
    if &text[17..19] >= "60" {
        return Err(format!("invalid timestamp {text:?}: second out of range"));
    }
    let mut rest = &text[19..];
    let mut normalized = text[..19].to_string();
    if let Some(after) = rest.strip_prefix(['.', ',']) {
        let fraction = after.bytes().take_while(u8::is_ascii_digit).count();
        if fraction > 0 {
            normalized.push('.');
            normalized.push_str(&after[..fraction]);
            rest = &after[fraction..];
        }
    }
    let zone = rest.as_bytes();
    let zone_ok = rest == "Z"
        || (zone.len() == 6
            && (zone[0] == b'+' || zone[0] == b'-')
            && zone[1..3].iter().all(u8::is_ascii_digit)
            && zone[3] == b':'
            && zone[4..6].iter().all(u8::is_ascii_digit)
            && &rest[1..3] < "24"
            && &rest[4..6] < "60");
    if !zone_ok {
        return Err(invalid());
    }
    normalized.push_str(rest);
    let at = DateTime::parse_from_rfc3339(&normalized)
        .map_err(|e| format!("invalid timestamp {text:?}: {e}"))?;
    let seconds = at.timestamp();
    if !(MIN_UNIX_SECONDS..=MAX_UNIX_SECONDS).contains(&seconds) {
        return Err(format!("invalid timestamp {text:?}: out of range"));
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_follow_go() {
        let second = 1_000_000_000;
        for (text, nanos) in [
            ("0", 0),
            ("+0", 0),
            ("1s", second),
            ("-1.5h", -5_400 * second),
            ("1h30m", 5_400 * second),
            (".5s", second / 2),
            ("1.s", second),
            ("300ms", 300_000_000),
            ("1µs", 1_000),
            ("1μs", 1_000),
            ("1us", 1_000),
            ("2562047h47m16.854775807s", i64::MAX),
            ("-2562047h47m16.854775808s", i64::MIN),
        ] {
            assert_eq!(parse_duration(text), Ok(nanos), "{text}");
        }
        for text in [
            "",
            "-",
            "1",
            "s",
            ".s",
            "1x",
            "1s junk",
            "1s ",
            " 1s",
            "1e3s",
            "2562047h47m16.854775808s",
            "9999999999999999999h",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?} parsed");
        }
    }

    #[test]
    fn timestamps_follow_go_rfc3339() {
        for text in [
            "2023-01-01T00:00:00Z",
            "2023-01-01T00:00:00.123456789Z",
            "2023-01-01T00:00:00,5Z",
            "2023-01-01T00:00:00+01:30",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ] {
            assert!(parse_timestamp(text).is_ok(), "{text} refused");
        }
        for text in [
            "2023-01-01t00:00:00Z",
            "2023-01-01T00:00:00z",
            "2023-01-01 00:00:00Z",
            "2023-01-01T00:00:00",
            "2023-01-01T00:00:60Z",
            "2023-02-30T00:00:00Z",
            "2023-01-01T24:00:00Z",
            "2023-01-01T00:00:00UTC",
            "2023-01-01T00:00:00.Z",
            "2023-01-01T00:00:00+24:00",
            "10000-01-01T00:00:00Z",
            "0000-12-31T00:00:00Z",
            "not a time",
        ] {
            assert!(parse_timestamp(text).is_err(), "{text:?} parsed");
        }
        assert!(timestamp_of_seconds(MAX_UNIX_SECONDS).is_ok());
        assert!(timestamp_of_seconds(MAX_UNIX_SECONDS + 1).is_err());
        assert!(timestamp_of_seconds(MIN_UNIX_SECONDS - 1).is_err());
    }
}
