//! Request ids, open keys and retry pacing.
//!
//! A command that changes state carries a random request id chosen once; every retry of it
//! sends the same id, so the server returns the first outcome instead of acting twice
//! (invariant 8). Opening a session does the same with an open key, which unlike a request id
//! is compared with every client's keys. Retries are bounded by time, not only by count, so a
//! server restart of a few seconds is ridden out while a dead server is reported promptly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use palisade_core::OpenKey;
use palisade_core::limits::OPEN_KEY_BYTES_MIN;
use tokio::time::Instant;

/// First pause between attempts.
pub(crate) const BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A fresh random request id, for an acquire, a release, or a write to the fenced store.
///
/// The lock service compares such an id only with the last few ids of the same session
/// (`REQUEST_IDS_PER_SESSION_MAX`), and a session's commands come from the process that opened
/// it; the store compares it only with the ids presented with the same sequencer. So if the OS
/// has no randomness to give, a mix of the clock, a counter and the process id is enough: the
/// counter keeps this process's ids apart, the process id those of the holder's other processes,
/// and no other client's ids are ever compared with them. That
/// reasoning holds only for ids scoped to one session; anything compared across clients, like
/// the key of an open, must come from [`open_key`], which has no fallback.
pub fn request_id() -> u64 {
    match getrandom::u64() {
        Ok(id) => id,
        Err(error) => {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            tracing::warn!(%error, "no OS randomness for a request id; using the clock");
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let count = COUNTER.fetch_add(1, Ordering::Relaxed);
            nanos ^ count.rotate_left(48) ^ u64::from(std::process::id()).rotate_left(32)
        }
    }
}

/// A fresh open key for one session open, from the OS's secure random source.
///
/// The server hands the session this key opened to whoever presents the key while the session
/// lives, and compares it with the keys of every client. A key from a clock or a counter could
/// equal another client's, so without OS randomness this fails instead of falling back.
pub(crate) fn open_key() -> Result<OpenKey, String> {
    let mut bytes = [0u8; OPEN_KEY_BYTES_MIN];
    getrandom::fill(&mut bytes).map_err(|e| e.to_string())?;
    OpenKey::new(&bytes).map_err(|e| format!("the OS random source gave {e}"))
}

/// Exponential backoff with jitter, bounded by a total time budget.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    give_up_at: Instant,
}

impl Backoff {
    pub(crate) fn new(budget: Duration) -> Backoff {
        Backoff {
            next: BACKOFF_INITIAL,
            give_up_at: Instant::now() + budget,
        }
    }

    /// Starts over after a success.
    pub(crate) fn reset(&mut self, budget: Duration) {
        *self = Backoff::new(budget);
    }

    /// The pause before the next attempt, or `None` when the budget is spent.
    pub(crate) fn next_delay(&mut self) -> Option<Duration> {
        let now = Instant::now();
        if now >= self.give_up_at {
            return None;
        }
        let delay = jitter(self.next).min(self.give_up_at - now);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        Some(delay)
    }

    /// Sleeps before the next attempt; false when the budget is spent.
    pub(crate) async fn wait(&mut self) -> bool {
        match self.next_delay() {
            Some(delay) => {
                tokio::time::sleep(delay).await;
                true
            }
            None => false,
        }
    }
}

/// Between half and all of `delay`, so clients that failed together do not retry together.
fn jitter(delay: Duration) -> Duration {
    let random = getrandom::u32().unwrap_or(u32::MAX / 2);
    let fraction = 0.5 + f64::from(random) / f64::from(u32::MAX) / 2.0;
    delay.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_differ() {
        let ids: std::collections::HashSet<u64> = (0..64).map(|_| request_id()).collect();
        assert_eq!(ids.len(), 64);
    }

    #[test]
    fn open_keys_are_random_and_the_server_would_accept_them() {
        let keys: std::collections::HashSet<Vec<u8>> = (0..64)
            .map(|_| open_key().unwrap().as_bytes().to_vec())
            .collect();
        assert_eq!(keys.len(), 64);
        assert!(keys.iter().all(|k| k.len() == OPEN_KEY_BYTES_MIN));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_to_its_cap_and_stops_at_its_budget() {
        let started = Instant::now();
        let mut backoff = Backoff::new(Duration::from_secs(3));
        let mut delays = Vec::new();
        while let Some(delay) = backoff.next_delay() {
            assert!(delay <= BACKOFF_MAX);
            delays.push(delay);
            tokio::time::sleep(delay).await;
        }
        assert!(delays.len() >= 4, "{delays:?}");
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_secs(3) && elapsed <= Duration::from_millis(3_050),
            "{elapsed:?}"
        );
    }
}
