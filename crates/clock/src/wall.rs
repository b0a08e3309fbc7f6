//! The wall-clock seam: where the server reads the time of day (milliseconds since 1970), which
//! places the counters' recovery floors (`palisade_core::limits::recovery_floors`) and stamps
//! the counters' mark and backups. The system clock, unless a deterministic simulation has
//! replaced it on the current thread, so that a run with a restore or a cut of the log replays
//! exactly. Nothing in production calls [`simulate_thread`].

use std::cell::Cell;

thread_local! {
    static SIMULATED: Cell<Option<fn() -> u64>> = const { Cell::new(None) };
}

/// From now on, [`unix_ms`] on this thread reads `now` (`None` goes back to the system clock).
/// For deterministic simulations only.
pub fn simulate_thread(now: Option<fn() -> u64>) {
    SIMULATED.with(|simulated| simulated.set(now));
}

/// Milliseconds since 1970 (0 before 1970, `u64::MAX` past what 64 bits hold).
pub fn unix_ms() -> u64 {
    if let Some(now) = SIMULATED.with(Cell::get) {
        return now();
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_thread_reads_its_clock_and_goes_back_to_the_systems() {
        fn fixed() -> u64 {
            42
        }
        let system = unix_ms();
        assert!(system > 1_600_000_000_000, "{system}");
        simulate_thread(Some(fixed));
        assert_eq!(unix_ms(), 42);
        simulate_thread(None);
        assert!(unix_ms() >= system);
    }
}
