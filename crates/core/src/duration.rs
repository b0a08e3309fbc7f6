//! Durations as people write them (`500ms`, `10s`, `2m`, `1h`), for every binary and flag that
//! takes one: the lock table counts time in whole milliseconds, so text becomes a [`Duration`]
//! of whole milliseconds here.
//!
//! Pure string parsing; it lives here rather than in a binary because the lock service's
//! flags, the `palisade` command and the benchmarks all accept the same forms.

use std::time::Duration;

/// Parses `1500ms`, `10s`, `2m`, `1h` or a bare number of seconds into a whole number of
/// milliseconds.
///
/// Fractions are accepted (`1.5s` is 1500 ms) and rounded to the nearest millisecond; negative,
/// non-finite and absurdly large durations are refused with a message naming the input.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 10s, 2m"))?;
    let scale = match unit {
        "ms" => 1.0,
        "" | "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => {
            return Err(format!(
                "invalid duration unit {unit:?} in {text:?}: use ms, s, m or h"
            ));
        }
    };
    let ms = number * scale;
    if !ms.is_finite() || ms < 0.0 || ms > u64::MAX as f64 / 2.0 {
        return Err(format!("duration {text:?} is out of range"));
    }
    Ok(Duration::from_millis(ms.round() as u64))
}

#[cfg(test)]
mod tests {
    /// The duration `text` stands for, in milliseconds.
    fn parse_duration_ms(text: &str) -> Result<u64, String> {
        let duration = super::parse_duration(text)?;
        assert_eq!(
            duration.subsec_nanos() % 1_000_000,
            0,
            "not whole milliseconds"
        );
        Ok(u64::try_from(duration.as_millis()).unwrap())
    }

    #[test]
    fn each_unit_scales_to_milliseconds() {
        assert_eq!(parse_duration_ms("1500ms"), Ok(1_500));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
    }

    #[test]
    fn a_bare_number_is_seconds_and_fractions_round_to_the_millisecond() {
        assert_eq!(parse_duration_ms("3"), Ok(3_000));
        assert_eq!(parse_duration_ms("0"), Ok(0));
        assert_eq!(parse_duration_ms(" 1.5s "), Ok(1_500));
        assert_eq!(parse_duration_ms("0.0004s"), Ok(0));
    }

    #[test]
    fn words_unknown_units_negatives_and_overflow_are_refused() {
        assert!(parse_duration_ms("ten").is_err());
        assert!(parse_duration_ms("").is_err());
        assert!(parse_duration_ms("5 weeks").is_err());
        assert!(parse_duration_ms("5d").is_err());
        assert!(parse_duration_ms("-1s").is_err());
        assert!(parse_duration_ms("99999999999999999999h").is_err());
        assert!(
            parse_duration_ms("5d")
                .unwrap_err()
                .contains("use ms, s, m or h")
        );
    }
}
