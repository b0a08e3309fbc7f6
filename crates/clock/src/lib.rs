//! The clock seam: every piece of Palisade that measures time (the leader's clock, the lease
//! driver, the client's lease accounting) reads it through [`Clock`], never from
//! `std::time::Instant` directly.
//!
//! - [`TokioClock`] is the production clock: tokio's monotonic time. Under a paused tokio
//!   runtime or a simulator that drives tokio's time, it follows the simulated time.
//! - [`ManualClock`] stands still until the test moves it with [`ManualClock::advance`], so a
//!   test decides exactly when a lease ends or a deadline passes, without sleeping.
//!
//! Times are [`Duration`]s since the clock's origin (its creation). They only ever grow: a
//! wall-clock jump moves none of them.

pub mod entropy;
pub mod wall;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A future returned by [`Clock::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A monotonic clock.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time elapsed since this clock's origin. Never decreases.
    fn now(&self) -> Duration;

    /// Resolves once [`Clock::now`] has reached `deadline` (at once if it has already).
    fn sleep_until(&self, deadline: Duration) -> Sleep;

    /// Resolves once `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> Sleep {
        self.sleep_until(self.now().saturating_add(duration))
    }
}

/// A shared clock, as the server and the client hold it.
pub type SharedClock = Arc<dyn Clock>;

/// The production clock: tokio's monotonic time since the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> TokioClock {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }

    /// A [`TokioClock`] ready to share.
    pub fn shared() -> SharedClock {
        Arc::new(TokioClock::new())
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep_until(&self, deadline: Duration) -> Sleep {
        let at = self
            .origin
            .checked_add(deadline)
            // Beyond what the platform's instants can hold: in effect never.
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400 * 365));
        Box::pin(tokio::time::sleep_until(at))
    }
}

/// A clock that moves only when told to. Clones share one time.
#[derive(Clone)]
pub struct ManualClock {
    now: Arc<tokio::sync::watch::Sender<Duration>>,
}

impl ManualClock {
    /// A clock standing at its origin.
    pub fn new() -> ManualClock {
        ManualClock {
            now: Arc::new(tokio::sync::watch::channel(Duration::ZERO).0),
        }
    }

    /// Moves the clock forward by `by` and wakes every sleeper whose deadline has come.
    pub fn advance(&self, by: Duration) {
        self.now.send_modify(|now| *now = now.saturating_add(by));
    }

    /// This clock, ready to share (the returned handle and `self` move together).
    pub fn shared(&self) -> SharedClock {
        Arc::new(self.clone())
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &*self.now.borrow())
            .finish()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.now.borrow()
    }

    fn sleep_until(&self, deadline: Duration) -> Sleep {
        let mut now = self.now.subscribe();
        Box::pin(async move {
            // The sender lives as long as any clone of the clock; if every clone is gone, time
            // can no longer move and the sleep never ends.
            if now.wait_for(|now| *now >= deadline).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_a_sleeper_only_when_advanced_past_its_deadline() {
        let clock = ManualClock::new();
        let shared = clock.shared();
        let mut sleep = tokio::spawn(shared.sleep(Duration::from_millis(100)));
        clock.advance(Duration::from_millis(99));
        tokio::task::yield_now().await;
        assert!(
            futures_poll_once(&mut sleep).await.is_none(),
            "woke before its deadline"
        );
        clock.advance(Duration::from_millis(1));
        sleep.await.unwrap();
        assert_eq!(shared.now(), Duration::from_millis(100));
        // A deadline already passed resolves at once.
        shared.sleep_until(Duration::from_millis(50)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_follows_paused_time() {
        let clock = TokioClock::new();
        let before = clock.now();
        clock.sleep(Duration::from_secs(3_600)).await;
        assert!(clock.now() - before >= Duration::from_secs(3_600));
    }

    /// `Some` if the task has finished, without waiting for it.
    async fn futures_poll_once(
        task: &mut tokio::task::JoinHandle<()>,
    ) -> Option<Result<(), tokio::task::JoinError>> {
        tokio::time::timeout(Duration::from_millis(20), task)
            .await
            .ok()
    }
}
