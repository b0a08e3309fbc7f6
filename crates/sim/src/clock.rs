//! Simulated clocks through the [`Clock`] seam: each node and client reads a monotonic clock
//! that runs a little fast or slow against simulated time (drift), reads its own value at the
//! start (offset: a machine's monotonic clock counts from its boot), keeps running across a
//! restart of the process, and may jump forward.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_clock::{Clock, SharedClock, Sleep};

/// A clock whose time is its offset, plus `rate` × the simulated time, plus every jump.
#[derive(Debug, Clone)]
pub struct DriftingClock(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    offset: Duration,
    /// Parts per million faster (positive) or slower (negative) than simulated time.
    drift_ppm: i64,
    jumped: Mutex<Duration>,
}

impl DriftingClock {
    pub fn new(offset: Duration, drift_ppm: i64) -> DriftingClock {
        DriftingClock(Arc::new(Inner {
            offset,
            drift_ppm,
            jumped: Mutex::new(Duration::ZERO),
        }))
    }

    pub fn shared(&self) -> SharedClock {
        Arc::new(self.clone())
    }

    /// Moves the clock forward by `by` at once.
    pub fn jump(&self, by: Duration) {
        *self.0.jumped.lock().expect("clock lock") += by;
    }

    fn rate(&self) -> f64 {
        1.0 + self.0.drift_ppm as f64 / 1e6
    }
}

impl Clock for DriftingClock {
    fn now(&self) -> Duration {
        self.0.offset
            + crate::now().mul_f64(self.rate())
            + *self.0.jumped.lock().expect("clock lock")
    }

    fn sleep_until(&self, deadline: Duration) -> Sleep {
        let clock = self.clone();
        Box::pin(async move {
            loop {
                let now = clock.now();
                if now >= deadline {
                    return;
                }
                let wait = (deadline - now).div_f64(clock.rate());
                tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
            }
        })
    }
}

impl DriftingClock {
    /// How much simulated time passes while this clock moves by `span`.
    pub fn to_simulated(&self, span: Duration) -> Duration {
        span.div_f64(self.rate())
    }
}
