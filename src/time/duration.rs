//! `DUR` values on the command line: a whole number with a unit (`250ms`,
//! `2s`, `5m`, `1h`). No unit, an unknown unit, a fraction or an overflow is an
//! error, so a typo can never silently become a different duration.

use std::time::Duration;

/// Parses a `DUR`. The error says what is wrong, without the flag name (the
/// caller adds it).
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "`{s}` is not a duration: expected a whole number with a unit, like 250ms, 2s, 5m or 1h"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: the number is too large"))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => {
            return Err(format!(
                "`{s}` has no unit: write {n}ms, {n}s, {n}m or {n}h"
            ));
        }
        other => {
            return Err(format!(
                "`{s}` has an unknown unit `{other}`: use ms, s, m or h"
            ));
        }
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .ok_or_else(|| format!("`{s}` is too large"))?;
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
        assert!(parse("10").unwrap_err().contains("no unit"));
        assert!(parse("10d").unwrap_err().contains("unknown unit `d`"));
        assert!(parse("1.5s").unwrap_err().contains("unknown unit"));
        assert!(parse("s").is_err());
        assert!(parse("").is_err());
        assert!(parse("-1s").is_err());
        assert!(parse("99999999999999999999s").is_err());
        assert!(parse("18446744073709551615h").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format(Duration::from_millis(250)), "250ms");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_secs(150)), "2m30s");
        assert_eq!(format(Duration::from_secs(7200)), "2h");
    }
}
