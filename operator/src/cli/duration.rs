//! Durations on the command line: `90s`, `15m`, `12h`, `30d`, `1y`, or combinations (`1h30m`).
use std::time::Duration;

/// Parses a duration flag; the error says what was wrong, for clap to print.
pub fn parse(input: &str) -> Result<Duration, String> {
    let total = parse_or_zero(input)?;
    if total.is_zero() {
        return Err(format!("duration {input:?} must be positive"));
    }
    Ok(total)
}

/// Like [`parse`], for the flags where zero means "none" (e.g. `--shutdown-delay 0s`).
pub fn parse_or_zero(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty duration; expected e.g. 30s, 15m, 12h, 30d, 1y".into());
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let unit: u64 = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'y' => 365 * 86_400,
            other => {
                return Err(format!(
                    "invalid unit {other:?} in {input:?}; use s, m, h, d or y"
                ));
            }
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("missing number before {ch:?} in {input:?}"))?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration {input:?} is too large"))?;
    }
    if !digits.is_empty() {
        return Err(format!("{input:?} lacks a unit; e.g. {digits}s"));
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::Duration;

    #[test]
    fn zero_is_refused_unless_it_means_none() {
        assert!(parse("0s").unwrap_err().contains("must be positive"));
        assert_eq!(super::parse_or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(super::parse_or_zero("5s"), Ok(Duration::from_secs(5)));
        assert!(super::parse_or_zero("5").is_err());
    }

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse("1y"), Ok(Duration::from_secs(365 * 86_400)));
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("10").unwrap_err().contains("lacks a unit"));
        assert!(parse("5w").unwrap_err().contains("invalid unit"));
        assert!(parse("0s").unwrap_err().contains("positive"));
        assert!(parse("h").unwrap_err().contains("missing number"));
    }
}
