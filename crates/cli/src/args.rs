//! Parsers for the values of command-line flags: durations and waits.

use std::time::Duration;

use palisade_client::Wait;

/// Parses `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    palisade_core::duration::parse_duration(text)
}

/// Parses a wait: a duration (`0` for "do not wait") or `forever`.
pub fn parse_wait(text: &str) -> Result<Wait, String> {
    match text.trim() {
        "forever" | "inf" | "infinite" => Ok(Wait::Forever),
        other => {
            let wait = parse_duration(other)?;
            Ok(if wait.is_zero() {
                Wait::Try
            } else {
                Wait::For(wait)
            })
        }
    }
}

/// Checks a grant's value (`--value`) as the service will: 1 to 1024 bytes, no control
/// characters.
pub fn parse_value(text: &str) -> Result<String, String> {
    palisade_core::GrantValue::new(text)
        .map(String::from)
        .map_err(|e| e.to_string())
}

/// A wait as a user wrote it, for messages: `forever`, `0s`, `1.5s`.
pub fn describe_wait(wait: Wait) -> String {
    match wait {
        Wait::Try => "0s".to_string(),
        Wait::For(d) => crate::output::human_duration(d),
        Wait::Forever => "forever".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_usual_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn a_wait_of_zero_is_a_try_and_forever_is_a_word() {
        assert_eq!(parse_wait("0"), Ok(Wait::Try));
        assert_eq!(parse_wait("0s"), Ok(Wait::Try));
        assert_eq!(parse_wait("1s"), Ok(Wait::For(Duration::from_secs(1))));
        assert_eq!(parse_wait("forever"), Ok(Wait::Forever));
        assert!(parse_wait("never").is_err());
    }
}
