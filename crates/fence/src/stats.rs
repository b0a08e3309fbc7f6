//! What a fence accepted and refused, counted per lock, for the application (or its metrics) to
//! read: a resource that refuses writes silently looks, to its operator, like one that lost them.
//!
//! Every adapter and the HTTP middleware count the same way: [`FenceStats::record`] after each
//! fenced request, with the lock of the sequencer presented (known once it verified) and the
//! outcome. Only rejections ([`FenceError::is_rejection`]) count as refused; a storage failure or
//! an unknown outcome is neither accepted nor refused. The last refusal of each lock is kept
//! whole, so the presented and the accepted token of a [`FenceError::Stale`] can be read back.
//!
//! Bounded: at most [`FENCE_STATS_LOCKS_MAX`] locks are counted by name; requests of any further
//! lock are counted together under [`OTHER_LOCKS`], and refusals without a verified lock
//! (missing, malformed, forged) under [`UNVERIFIED`].
//!
//! ```
//! use palisade_fence::{FenceError, FenceStats};
//! # use palisade_core::{SessionId, Token};
//! let stats = FenceStats::new();
//! stats.record::<()>(Some("jobs"), &Ok(()));
//! let stale = FenceError::Stale {
//!     lock: "jobs".into(),
//!     presented: Token::new(4),
//!     accepted: Token::new(5),
//!     holder_session: Some(SessionId::new(1)),
//! };
//! stats.record::<()>(Some("jobs"), &Err(stale.clone()));
//! let jobs = stats.get("jobs").unwrap();
//! assert_eq!((jobs.accepted, jobs.refused), (1, 1));
//! assert_eq!(jobs.last_refusal, Some(stale));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use crate::FenceError;

/// How many locks a [`FenceStats`] counts by name.
pub const FENCE_STATS_LOCKS_MAX: usize = 1024;

/// The name under which the locks beyond [`FENCE_STATS_LOCKS_MAX`] are counted together. Not a
/// valid lock name (lock names have no spaces or parentheses), so it never collides with one.
pub const OTHER_LOCKS: &str = "(other locks)";

/// The name under which refusals of sequencers that did not verify (missing, malformed, forged)
/// are counted: such a request names no lock anyone could trust.
pub const UNVERIFIED: &str = "(unverified)";

/// The counts of one lock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Requests the fence accepted.
    pub accepted: u64,
    /// Requests the fence refused (stale, reissued, wrong lock, a reader's write, missing,
    /// malformed, forged).
    pub refused: u64,
    /// The last refusal, with its presented and accepted token.
    pub last_refusal: Option<FenceError>,
}

/// Accepted and refused requests per lock, bounded; shared by reference (`Arc<FenceStats>`).
#[derive(Debug, Default)]
pub struct FenceStats {
    locks: Mutex<HashMap<String, LockStats>>,
}

impl FenceStats {
    pub fn new() -> FenceStats {
        FenceStats::default()
    }

    /// Counts one fenced request: `lock` is the lock of the sequencer presented (`None` when
    /// none verified). `Ok` counts as accepted, a rejection as refused; other errors (storage,
    /// outcome unknown) are not counted. Returns the name it was counted under: `lock` itself,
    /// [`OTHER_LOCKS`] or [`UNVERIFIED`] (a bounded label for metrics), or `None` when not
    /// counted.
    pub fn record<'a, T>(
        &self,
        lock: Option<&'a str>,
        outcome: &Result<T, FenceError>,
    ) -> Option<&'a str> {
        match outcome {
            Ok(_) => Some(self.count(lock, |counts| {
                counts.accepted = counts.accepted.saturating_add(1);
            })),
            Err(refusal) if refusal.is_rejection() => Some(self.count(lock, |counts| {
                counts.refused = counts.refused.saturating_add(1);
                counts.last_refusal = Some(refusal.clone());
            })),
            Err(_) => None,
        }
    }

    /// The counts of `lock` (or of [`OTHER_LOCKS`], [`UNVERIFIED`]), if any request was counted.
    pub fn get(&self, lock: &str) -> Option<LockStats> {
        self.locks().get(lock).cloned()
    }

    /// Every counted lock's counts, by name.
    pub fn snapshot(&self) -> BTreeMap<String, LockStats> {
        self.locks()
            .iter()
            .map(|(lock, counts)| (lock.clone(), counts.clone()))
            .collect()
    }

    /// Applies `change` to the counts of `lock`, or of its bucket; returns the name counted.
    fn count<'a>(&self, lock: Option<&'a str>, change: impl FnOnce(&mut LockStats)) -> &'a str {
        let mut locks = self.locks();
        let name = match lock {
            None => UNVERIFIED,
            Some(lock) if locks.contains_key(lock) => lock,
            Some(lock) if named(&locks) < FENCE_STATS_LOCKS_MAX => lock,
            Some(_) => OTHER_LOCKS,
        };
        change(locks.entry(name.to_owned()).or_default());
        name
    }

    fn locks(&self) -> MutexGuard<'_, HashMap<String, LockStats>> {
        // Counters only: a panic elsewhere cannot leave them inconsistent.
        self.locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How many locks are counted by name (the buckets are not).
fn named(locks: &HashMap<String, LockStats>) -> usize {
    locks.len()
        - usize::from(locks.contains_key(OTHER_LOCKS))
        - usize::from(locks.contains_key(UNVERIFIED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_beyond_the_limit_are_counted_together_and_unverified_apart() {
        let stats = FenceStats::new();
        for index in 0..FENCE_STATS_LOCKS_MAX {
            let lock = format!("lock-{index}");
            assert_eq!(
                stats.record::<()>(Some(&lock), &Ok(())),
                Some(lock.as_str())
            );
        }
        assert_eq!(
            stats.record::<()>(None, &Err(FenceError::Missing)),
            Some(UNVERIFIED)
        );
        assert_eq!(stats.record::<()>(Some("late"), &Ok(())), Some(OTHER_LOCKS));
        assert_eq!(stats.record::<()>(Some("lock-3"), &Ok(())), Some("lock-3"));
        let storage = FenceError::Storage {
            message: "disk".into(),
        };
        assert_eq!(stats.record::<()>(Some("lock-3"), &Err(storage)), None);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.len(), FENCE_STATS_LOCKS_MAX + 2);
        assert_eq!(snapshot["lock-3"].accepted, 2);
        assert_eq!(snapshot[OTHER_LOCKS].accepted, 1);
        assert_eq!(snapshot[UNVERIFIED].refused, 1);
        assert_eq!(snapshot[UNVERIFIED].last_refusal, Some(FenceError::Missing));
    }
}
