//! `DUR` values on the command line: a whole number with a unit (`250ms`,
//! `2s`, `5m`, `1h`). No unit, an unknown unit, a fraction or an overflow is an
//! error, so a typo can never silently become a different duration.

use std::num::ParseIntError;
use std::time::Duration;

/// Why a `DUR` was refused. Each message quotes what was typed and says
/// what a duration looks like, without the flag name (the caller adds it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// No digits first (empty, a bare unit, a sign).
    #[error(
        "`{0}` is not a duration: expected a whole number with a unit, like 250ms, 2s, 5m or 1h"
    )]
    NoNumber(String),
    /// The digits do not fit a `u64`.
    #[error("`{input}`: the number is too large")]
    BadNumber {
        input: String,
        #[source]
        source: ParseIntError,
    },
    /// A number alone: which unit was meant is a guess we do not make.
    #[error("`{input}` has no unit: write {n}ms, {n}s, {n}m or {n}h")]
    NoUnit { input: String, n: u64 },
    /// Not one of `ms`, `s`, `m`, `h` (a fraction lands here too: `.5s`).
    #[error("`{input}` has an unknown unit `{unit}`: use ms, s, m or h")]
    UnknownUnit { input: String, unit: String },
    /// The number fits, but not once in milliseconds.
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// Parses a `DUR`.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(DurationError::NoNumber(s.to_string()));
    }
    let n: u64 = num.parse().map_err(|source| DurationError::BadNumber {
        input: s.to_string(),
        source,
    })?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => {
            return Err(DurationError::NoUnit {
                input: s.to_string(),
                n,
            });
        }
        other => {
            return Err(DurationError::UnknownUnit {
                input: s.to_string(),
                unit: other.to_string(),
            });
        }
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .ok_or_else(|| DurationError::TooLarge(s.to_string()))?;
    Ok(Duration::from_millis(ms))
}

/// Formats a duration for humans: `1.5s`, `250ms`, `2m30s`.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        let tenths = (ms % 1_000) / 100;
        if tenths == 0 {
            format!("{}s", ms / 1_000)
        } else {
            format!("{}.{}s", ms / 1_000, tenths)
        }
    } else if ms < 3_600_000 {
        let (m, s) = (ms / 60_000, (ms % 60_000) / 1_000);
        if s == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{s}s")
        }
    } else {
        let (h, m) = (ms / 3_600_000, (ms % 3_600_000) / 60_000);
        if m == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{m}m")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse("0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn refuses_bad_input() {
        assert!(matches!(
            parse("10"),
            Err(DurationError::NoUnit { n: 10, .. })
        ));
        assert!(matches!(
            parse("1.5s"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(parse("s"), Err(DurationError::NoNumber(_))));
        assert!(matches!(parse(""), Err(DurationError::NoNumber(_))));
        assert!(matches!(parse("-1s"), Err(DurationError::NoNumber(_))));
        assert!(matches!(
            parse("99999999999999999999s"),
            Err(DurationError::BadNumber { .. })
        ));
        assert!(matches!(
            parse("18446744073709551615h"),
            Err(DurationError::TooLarge(_))
        ));
    }

    #[test]
    fn messages_quote_the_input_and_say_what_fits() {
        let msg = |s: &str| parse(s).unwrap_err().to_string();
        assert_eq!(msg("10"), "`10` has no unit: write 10ms, 10s, 10m or 10h");
        assert_eq!(
            msg(" 10d "),
            "`10d` has an unknown unit `d`: use ms, s, m or h"
        );
        assert_eq!(
            msg("s"),
            "`s` is not a duration: expected a whole number with a unit, like 250ms, 2s, 5m or 1h"
        );
        assert_eq!(
            msg("99999999999999999999s"),
            "`99999999999999999999s`: the number is too large"
        );
        assert_eq!(
            msg("18446744073709551615h"),
            "`18446744073709551615h` is too large"
        );
        let e = parse("99999999999999999999s").unwrap_err();
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn formats() {
        assert_eq!(format(Duration::from_millis(250)), "250ms");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_secs(150)), "2m30s");
        assert_eq!(format(Duration::from_secs(7200)), "2h");
    }
}
