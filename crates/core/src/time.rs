//! Time on the lock table's clock, with its unit in the type: [`TimeMs`] is an instant,
//! [`DurationMs`] a span, both in whole milliseconds.
//!
//! The table reads no clock: every input carries its [`TimeMs`], the leader's monotonic clock
//! mapped onto the table's timeline. Leases, waits and lock-delays are [`DurationMs`], and an
//! instant moves only by adding one ([`TimeMs::saturating_add`]). Both are stored as the bare
//! number of milliseconds (serde `transparent`), as they were when they were plain `u64`s.
//! Outside the replicated state a span is a [`std::time::Duration`]: [`DurationMs`] converts
//! into one without loss, and from one with [`DurationMs::from_duration_floor`].
//!
//! A number of milliseconds where an instant is expected does not compile:
//!
//! ```compile_fail
//! use palisade_core::{Command, Input};
//! let input = Input { now_ms: 1_500, command: Command::Tick };
//! ```
//!
//! nor does a span where an instant is expected, or an instant where a span is:
//!
//! ```compile_fail
//! use palisade_core::{Command, DurationMs, Input};
//! let input = Input { now_ms: DurationMs::from_millis(1_500), command: Command::Tick };
//! ```
//!
//! ```compile_fail
//! use palisade_core::TimeMs;
//! let later = TimeMs::from_millis(1_000).saturating_add(TimeMs::from_millis(500));
//! ```
//!
//! ```
//! use palisade_core::{Command, DurationMs, Input, TimeMs};
//! let now_ms = TimeMs::from_millis(1_000).saturating_add(DurationMs::from_millis(500));
//! let input = Input { now_ms, command: Command::Tick };
//! assert_eq!(input.to_string(), "at 1500 ms: Tick");
//! ```

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// An instant on the table's clock: milliseconds since the clock's origin. Supplied by the
/// caller with each input; never read from a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TimeMs(u64);

/// A span of time in milliseconds, as the replicated state holds leases, waits and
/// lock-delays.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct DurationMs(u64);

impl TimeMs {
    /// The clock's origin, where a new table starts.
    pub const ZERO: TimeMs = TimeMs(0);

    /// The last instant there is, where [`TimeMs::saturating_add`] stops.
    pub const MAX: TimeMs = TimeMs(u64::MAX);

    /// The instant `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> TimeMs {
        TimeMs(ms)
    }

    /// Milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The instant `span` after this one, or the last instant there is.
    pub const fn saturating_add(self, span: DurationMs) -> TimeMs {
        TimeMs(self.0.saturating_add(span.0))
    }

    /// The instant `span` after this one, or `None` past the last instant there is.
    pub const fn checked_add(self, span: DurationMs) -> Option<TimeMs> {
        match self.0.checked_add(span.0) {
            Some(ms) => Some(TimeMs(ms)),
            None => None,
        }
    }

    /// How long after `earlier` this instant is; zero if it is not after it.
    pub const fn saturating_duration_since(self, earlier: TimeMs) -> DurationMs {
        DurationMs(self.0.saturating_sub(earlier.0))
    }
}

impl DurationMs {
    pub const ZERO: DurationMs = DurationMs(0);

    pub const fn from_millis(ms: u64) -> DurationMs {
        DurationMs(ms)
    }

    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `duration` in whole milliseconds, rounded down; `u64::MAX` milliseconds if it is longer.
    pub fn from_duration_floor(duration: Duration) -> DurationMs {
        DurationMs(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl From<DurationMs> for Duration {
    fn from(span: DurationMs) -> Duration {
        Duration::from_millis(span.0)
    }
}

impl fmt::Display for TimeMs {
    /// The bare number of milliseconds, as messages write it (`until 5000 ms`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Display for DurationMs {
    /// The bare number of milliseconds, as messages write it (`ttl 500 ms`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_move_instants_and_instants_give_spans() {
        let start = TimeMs::from_millis(1_000);
        let end = start.saturating_add(DurationMs::from_millis(250));
        assert_eq!(end, TimeMs::from_millis(1_250));
        assert_eq!(
            end.saturating_duration_since(start),
            DurationMs::from_millis(250)
        );
        assert_eq!(start.saturating_duration_since(end), DurationMs::ZERO);
        let last = TimeMs::from_millis(u64::MAX);
        assert_eq!(last.saturating_add(DurationMs::from_millis(1)), last);
        assert_eq!(last.checked_add(DurationMs::from_millis(1)), None);
        assert_eq!(start.checked_add(DurationMs::ZERO), Some(start));
    }

    #[test]
    fn a_duration_converts_to_whole_milliseconds_rounded_down() {
        let span = DurationMs::from_duration_floor(Duration::from_micros(1_999));
        assert_eq!(span, DurationMs::from_millis(1));
        assert_eq!(Duration::from(span), Duration::from_millis(1));
        assert_eq!(
            DurationMs::from_duration_floor(Duration::MAX),
            DurationMs::from_millis(u64::MAX)
        );
    }
}
