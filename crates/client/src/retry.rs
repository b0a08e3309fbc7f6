//! Request ids, open keys, retry pacing and the retry loop.
//!
//! A command that changes state carries a random request id chosen once; every retry of it
//! sends the same id, so the server returns the first outcome instead of acting twice
//! (invariant 8). Opening a session does the same with an open key, which unlike a request id
//! is compared with every client's keys. Retries are bounded by time, not only by count, so a
//! server restart of a few seconds is ridden out while a dead server is reported promptly.
//!
//! [`retry_until_known`] is the one loop that retries a request and reports an outcome that an
//! earlier attempt left unknown as unknown, never as failed: the lock client's calls and the
//! `palisade store` commands both run it, each with its own pacing and error type.
//!
//! What the lock client retries: a failure that says the request was not applied (a member that
//! is not the leader, `UNAVAILABLE`, a failed connection) goes again at once after a leader hint
//! (at most `RETRIES_AT_ONCE_MAX` times in a row, so members pointing at each other fall back to
//! pauses), else after a pause of 50 ms doubling up to 1 s, all within
//! `ClientOptions::retry_budget`. An attempt whose outcome is unknown is retried, at the next
//! endpoint, only as the same request (one request id, or one open key), which the replicated
//! state machine deduplicates whichever member leads; renewals, closes and reads are idempotent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use palisade_core::limits::OPEN_KEY_BYTES_MIN;
use palisade_core::{OpenKey, RequestId};
use tokio::time::Instant;

use crate::error::Failure;

/// First pause between attempts.
pub(crate) const BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Most attempts in a row made at once, without a pause, because the failure before each named
/// where to go instead (a leader hint). Members with stale views can point at each other; after
/// this many the next attempt waits its pause like any other, within the same budget.
pub(crate) const RETRIES_AT_ONCE_MAX: u32 = 3;

/// A fresh random request id, for an acquire, a release, or a write to the fenced store.
///
/// The lock service compares such an id only with the last few ids of the same session
/// (`REQUEST_IDS_PER_SESSION_MAX`), and a session's commands come from the process that opened
/// it; the store compares it only with the ids presented with the same sequencer. So if the OS
/// has no randomness to give, a mix of the clock, a counter and the process id is enough: the
/// counter keeps this process's ids apart, the process id those of the holder's other processes,
/// and no other client's ids are ever compared with them. That
/// reasoning holds only for ids scoped to one session; anything compared across clients, like
/// the key of an open, must come from the open key's generator (`open_key`), which has no
/// fallback.
pub fn request_id() -> RequestId {
    RequestId::new(match palisade_clock::entropy::u64() {
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
    })
}

/// A fresh open key for one session open, from the OS's secure random source.
///
/// The server hands the session this key opened to whoever presents the key while the session
/// lives, and compares it with the keys of every client. A key from a clock or a counter could
/// equal another client's, so without OS randomness this fails instead of falling back.
pub(crate) fn open_key() -> Result<OpenKey, String> {
    let mut bytes = [0u8; OPEN_KEY_BYTES_MIN];
    palisade_clock::entropy::fill(&mut bytes).map_err(|e| e.to_string())?;
    OpenKey::new(&bytes).map_err(|e| format!("the OS random source gave {e}"))
}

/// Exponential backoff with jitter, bounded by a total time budget.
///
/// It also allows up to [`RETRIES_AT_ONCE_MAX`] attempts in a row without a pause
/// ([`Backoff::at_once`]), for failures that say where to go instead.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    give_up_at: Instant,
    at_once_left: u32,
}

impl Backoff {
    pub(crate) fn new(budget: Duration) -> Backoff {
        Backoff {
            next: BACKOFF_INITIAL,
            give_up_at: Instant::now() + budget,
            at_once_left: RETRIES_AT_ONCE_MAX,
        }
    }

    /// True if the next attempt may be made at once (counted), false once
    /// [`RETRIES_AT_ONCE_MAX`] were made in a row since the last pause, or the budget is spent.
    pub(crate) fn at_once(&mut self) -> bool {
        if self.at_once_left == 0 || Instant::now() >= self.give_up_at {
            return false;
        }
        self.at_once_left -= 1;
        true
    }

    /// The pause before the next attempt, or `None` when the budget is spent.
    pub(crate) fn next_delay(&mut self) -> Option<Duration> {
        let now = Instant::now();
        if now >= self.give_up_at {
            return None;
        }
        let delay = jitter(self.next).min(self.give_up_at - now);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        self.at_once_left = RETRIES_AT_ONCE_MAX;
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

/// What a failed attempt says about the request it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptFailure {
    /// Retrying the same request cannot change the answer: stop.
    Final,
    /// The request was not applied; another attempt may succeed.
    NotApplied,
    /// The request may or may not have been applied; another attempt, with the same request
    /// id, finds out without applying it twice.
    OutcomeUnknown,
}

/// How one kind of request is retried: how its errors are read, and how long to pause between
/// attempts.
pub trait RetryPolicy<E> {
    /// What `error`, the failure of one attempt, says about the request.
    fn classify(&self, error: &E) -> AttemptFailure;

    /// Pauses before the next attempt; false, at once, when no attempt is left.
    fn pause(&mut self) -> impl Future<Output = bool> + Send;

    /// True when the next attempt is made at once, without [`RetryPolicy::pause`]: `error`, a
    /// failure that applied nothing ([`AttemptFailure::NotApplied`]), says where the request
    /// should go instead, and the next attempt goes there (the lock client's leader hint). The
    /// policy bounds how many such attempts come in a row. By default, never.
    fn retry_at_once(&mut self, error: &E) -> bool {
        let _ = error;
        false
    }

    /// The error to report when `last`, a failure that applied nothing, ends the retries after
    /// `earlier`, an attempt whose outcome is unknown: that attempt may have been applied, so
    /// the request's outcome is unknown too.
    fn unknown_after(&self, earlier: E, last: E) -> E;
}

/// Runs `attempt` until it succeeds, fails for good, or `policy` allows no further attempt.
///
/// Every attempt must be safe to repeat (one request id throughout, or an operation that is
/// idempotent by nature). If the last failure only says "not applied this time" but an earlier
/// attempt's outcome was unknown, the error reported is an unknown outcome
/// ([`RetryPolicy::unknown_after`]): that earlier attempt may have been applied.
pub async fn retry_until_known<T, E, F, Fut>(
    policy: &mut impl RetryPolicy<E>,
    mut attempt: F,
) -> Result<T, E>
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut earlier_unknown: Option<E> = None;
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let failure = policy.classify(&error);
        if failure == AttemptFailure::NotApplied && policy.retry_at_once(&error) {
            tracing::debug!(?error, "retrying at once");
            continue;
        }
        if failure != AttemptFailure::Final && policy.pause().await {
            tracing::debug!(?error, "retrying");
            if failure == AttemptFailure::OutcomeUnknown {
                earlier_unknown = Some(error);
            }
            continue;
        }
        return Err(match (failure, earlier_unknown) {
            (AttemptFailure::NotApplied, Some(earlier)) => policy.unknown_after(earlier, error),
            (_, _) => error,
        });
    }
}

/// The lock client's calls: retried within a time budget ([`Backoff`]), at once after a member
/// named the leader (the client has switched to it, `client::Endpoints`), and an unknown
/// outcome followed by a refusal to apply is unknown, with both reasons.
impl RetryPolicy<Failure> for Backoff {
    fn classify(&self, failure: &Failure) -> AttemptFailure {
        match failure {
            Failure::NotApplied(_) | Failure::NotLeader { .. } => AttemptFailure::NotApplied,
            Failure::Unknown(_) => AttemptFailure::OutcomeUnknown,
            Failure::Core(_)
            | Failure::SessionNotFound(_)
            | Failure::InvalidArgument(_)
            | Failure::Rejected { .. } => AttemptFailure::Final,
        }
    }

    async fn pause(&mut self) -> bool {
        self.wait().await
    }

    fn retry_at_once(&mut self, failure: &Failure) -> bool {
        matches!(failure, Failure::NotLeader { .. }) && self.at_once()
    }

    fn unknown_after(&self, earlier: Failure, last: Failure) -> Failure {
        match (earlier, last) {
            (
                Failure::Unknown(reason),
                Failure::NotApplied(last) | Failure::NotLeader { message: last, .. },
            ) => Failure::Unknown(format!("{reason}; then {last}")),
            (_, last) => last,
        }
    }
}

/// Between half and all of `delay`, so clients that failed together do not retry together.
fn jitter(delay: Duration) -> Duration {
    let random = palisade_clock::entropy::u64().map_or(u32::MAX / 2, |r| r as u32);
    let fraction = 0.5 + f64::from(random) / f64::from(u32::MAX) / 2.0;
    delay.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_differ() {
        let ids: std::collections::HashSet<RequestId> = (0..64).map(|_| request_id()).collect();
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

    /// A policy of `attempts_max` attempts with no pause, over the lock client's failures.
    struct Attempts {
        attempts_left: u32,
    }

    impl RetryPolicy<Failure> for Attempts {
        fn classify(&self, failure: &Failure) -> AttemptFailure {
            Backoff::new(Duration::ZERO).classify(failure)
        }

        async fn pause(&mut self) -> bool {
            let more = self.attempts_left > 1;
            self.attempts_left = self.attempts_left.saturating_sub(1);
            more
        }

        fn unknown_after(&self, earlier: Failure, last: Failure) -> Failure {
            Backoff::new(Duration::ZERO).unknown_after(earlier, last)
        }
    }

    /// Runs `outcomes` in turn as the attempts of one request, at most `attempts_max` of them.
    async fn run(
        attempts_max: u32,
        outcomes: Vec<Result<u32, Failure>>,
    ) -> (Result<u32, Failure>, usize) {
        let mut outcomes = outcomes.into_iter();
        let mut made = 0;
        let mut policy = Attempts {
            attempts_left: attempts_max,
        };
        let result = retry_until_known(&mut policy, || {
            made += 1;
            let outcome = outcomes.next().expect("an outcome for every attempt");
            async move { outcome }
        })
        .await;
        (result, made)
    }

    #[tokio::test]
    async fn an_unknown_outcome_then_a_refusal_to_apply_is_reported_unknown() {
        let unknown = || Failure::Unknown("no answer within 10 ms".into());
        let not_applied = || Failure::NotApplied("connection refused".into());

        let (result, made) = run(2, vec![Err(unknown()), Err(not_applied())]).await;
        assert_eq!(made, 2);
        assert!(
            matches!(&result, Err(Failure::Unknown(reason)) if reason == "no answer within 10 ms; then connection refused"),
            "{result:?}"
        );

        // Without an unknown outcome before it, not applied stays not applied.
        let (result, _) = run(2, vec![Err(not_applied()), Err(not_applied())]).await;
        assert!(matches!(result, Err(Failure::NotApplied(_))), "{result:?}");

        // A refusal is final at once, whatever came before it.
        let refused = Failure::InvalidArgument("bad lock name".into());
        let (result, made) = run(5, vec![Err(unknown()), Err(refused), Ok(1)]).await;
        assert_eq!(made, 2);
        assert!(
            matches!(result, Err(Failure::InvalidArgument(_))),
            "{result:?}"
        );

        // A success after failures is a success.
        let (result, made) = run(5, vec![Err(unknown()), Err(not_applied()), Ok(7)]).await;
        assert_eq!((result.ok(), made), (Some(7), 3));
    }

    /// Runs `outcomes` in turn under the lock client's own policy; returns the result, the
    /// attempts made and the (paused-clock) time spent pausing.
    async fn run_with_backoff(
        budget: Duration,
        outcomes: Vec<Result<u32, Failure>>,
    ) -> (Result<u32, Failure>, usize, Duration) {
        let started = Instant::now();
        let mut outcomes = outcomes.into_iter();
        let mut made = 0;
        let mut policy = Backoff::new(budget);
        let result = retry_until_known(&mut policy, || {
            made += 1;
            let outcome = outcomes
                .next()
                .unwrap_or(Err(Failure::NotApplied("down".into())));
            async move { outcome }
        })
        .await;
        (result, made, started.elapsed())
    }

    fn not_leader() -> Failure {
        Failure::NotLeader {
            leader: "http://10.0.0.2:7457".into(),
            message: "not the leader (the leader is at http://10.0.0.2:7457)".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_hint_is_followed_at_once_a_few_times_in_a_row() {
        let budget = Duration::from_secs(10);
        // Hints are followed without a pause...
        let outcomes = vec![Err(not_leader()), Err(not_leader()), Ok(1)];
        let (result, made, paused) = run_with_backoff(budget, outcomes).await;
        assert_eq!((result.ok(), made, paused), (Some(1), 3, Duration::ZERO));

        // ...at most RETRIES_AT_ONCE_MAX in a row: members pointing at each other get a pause.
        let mut outcomes: Vec<_> = (0..=RETRIES_AT_ONCE_MAX)
            .map(|_| Err(not_leader()))
            .collect();
        outcomes.push(Ok(2));
        let (result, made, paused) = run_with_backoff(budget, outcomes).await;
        assert_eq!(result.ok(), Some(2));
        assert_eq!(made, RETRIES_AT_ONCE_MAX as usize + 2);
        assert!(paused > Duration::ZERO, "{paused:?}");

        // A plain "not applied" (no leader named) always pauses.
        let outcomes = vec![Err(Failure::NotApplied("election".into())), Ok(3)];
        let (result, _, paused) = run_with_backoff(budget, outcomes).await;
        assert_eq!(result.ok(), Some(3));
        assert!(paused > Duration::ZERO, "{paused:?}");

        // Hints never outlast the budget: a cluster that only redirects ends the retries.
        let (result, made, paused) = run_with_backoff(
            Duration::from_secs(2),
            (0..10_000).map(|_| Err(not_leader())).collect(),
        )
        .await;
        assert!(
            matches!(result, Err(Failure::NotLeader { .. })),
            "{result:?}"
        );
        assert!(made < 200, "{made}");
        assert!(paused <= Duration::from_millis(2_050), "{paused:?}");

        // An unknown outcome, then redirects until the budget ends: still unknown.
        let mut outcomes = vec![Err(Failure::Unknown("connection reset".into()))];
        outcomes.extend((0..10_000).map(|_| Err(not_leader())));
        let (result, _, _) = run_with_backoff(Duration::from_secs(2), outcomes).await;
        assert!(
            matches!(&result, Err(Failure::Unknown(reason)) if reason.starts_with("connection reset; then not the leader")),
            "{result:?}"
        );
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
