//! The watchers of single locks, by lock name. The apply path hands each event of a lock to that
//! lock's watchers only, so the cost of an applied entry grows with the watchers of the locks it
//! changes, not with every watch open on the node (ten thousand watchers of other locks used to
//! wake ten thousand tasks per event).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::limits::WATCH_BUFFER_EVENTS;
use palisade_core::Event;

/// Every open subscription, by the lock it watches.
#[derive(Debug, Default)]
pub struct LockWatchers {
    by_lock: Mutex<HashMap<String, Vec<Watcher>>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct Watcher {
    id: u64,
    events: mpsc::Sender<Arc<Published>>,
    /// Set when the watcher's buffer was full: it is cut off, and learns how many it missed.
    missed: Arc<AtomicU64>,
}

impl LockWatchers {
    /// The events of `lock` from now on.
    pub fn subscribe(self: &Arc<Self>, lock: &str) -> LockSubscription {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Bounded, and allocated as it fills: an idle watcher costs a few hundred bytes.
        let (tx, rx) = mpsc::channel(WATCH_BUFFER_EVENTS);
        let missed = Arc::new(AtomicU64::new(0));
        self.lock_map()
            .entry(lock.to_string())
            .or_default()
            .push(Watcher {
                id,
                events: tx,
                missed: missed.clone(),
            });
        LockSubscription {
            watchers: self.clone(),
            lock: lock.to_string(),
            id,
            events: rx,
            missed,
        }
    }

    /// Hands `published` to the watchers of its lock. Never waits: a watcher whose buffer is
    /// full is cut off (it learns so from [`LockSubscription::recv`]) rather than slowing the
    /// apply path.
    pub fn publish(&self, published: Published) {
        let published = Arc::new(published);
        let Some(lock) = published.event.lock() else {
            return;
        };
        let mut by_lock = self.lock_map();
        let Some(watchers) = by_lock.get_mut(lock) else {
            return;
        };
        watchers.retain(|watcher| match watcher.events.try_send(published.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                watcher.missed.store(1, Ordering::Relaxed);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        if watchers.is_empty() {
            by_lock.remove(lock);
        }
    }

    /// How many subscriptions are open.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock_map().values().map(Vec::len).sum()
    }

    /// Whether no subscription is open.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.lock_map().is_empty()
    }

    fn lock_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Watcher>>> {
        // A panic while holding the map leaves it consistent: every change is one call.
        self.by_lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One watcher's events; it leaves the registry when dropped.
#[derive(Debug)]
pub struct LockSubscription {
    watchers: Arc<LockWatchers>,
    lock: String,
    id: u64,
    events: mpsc::Receiver<Arc<Published>>,
    missed: Arc<AtomicU64>,
}

/// The watcher fell too far behind and was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged {
    /// Events it did not receive (at least this many).
    pub missed: u64,
}

impl LockSubscription {
    /// The next event of the lock, in apply order.
    pub async fn recv(&mut self) -> Result<Arc<Published>, Lagged> {
        match self.events.recv().await {
            Some(published) => Ok(published),
            None => Err(Lagged {
                missed: self.missed.load(Ordering::Relaxed).max(1),
            }),
        }
    }
}

impl Drop for LockSubscription {
    fn drop(&mut self) {
        let mut by_lock = self.watchers.lock_map();
        if let Some(watchers) = by_lock.get_mut(&self.lock) {
            watchers.retain(|watcher| watcher.id != self.id);
            if watchers.is_empty() {
                by_lock.remove(&self.lock);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use palisade_core::{Event, ReleaseCause, SessionId, Token};

    use super::*;

    fn released(lock: &str, token: u64) -> Published {
        Published {
            event: Event::Released {
                lock: lock.to_string(),
                session: SessionId::new(1),
                token: Token::new(token),
                cause: ReleaseCause::Released,
            },
            waiters: 0,
        }
    }

    #[tokio::test]
    async fn a_watcher_hears_its_own_lock_only_and_in_order() {
        let watchers = Arc::new(LockWatchers::default());
        let mut a = watchers.subscribe("a");
        watchers.publish(released("b", 1));
        watchers.publish(released("a", 2));
        watchers.publish(released("b", 3));
        watchers.publish(released("a", 4));
        assert_eq!(*a.recv().await.unwrap(), released("a", 2));
        assert_eq!(*a.recv().await.unwrap(), released("a", 4));
        // Nothing of lock b was queued for it.
        assert!(a.events.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_dropped_watcher_leaves_the_registry() {
        let watchers = Arc::new(LockWatchers::default());
        let a = watchers.subscribe("a");
        let a2 = watchers.subscribe("a");
        let b = watchers.subscribe("b");
        assert_eq!(watchers.len(), 3);
        drop(a);
        assert_eq!(watchers.len(), 2);
        drop(a2);
        drop(b);
        assert!(watchers.is_empty());
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_is_cut_off_after_what_it_was_sent() {
        let watchers = Arc::new(LockWatchers::default());
        let mut slow = watchers.subscribe("a");
        for token in 1..=(WATCH_BUFFER_EVENTS as u64 + 5) {
            watchers.publish(released("a", token));
        }
        // It left the registry at the first event it had no room for...
        assert!(watchers.is_empty());
        // ...and still gets, in order, everything it was sent before the cut.
        for token in 1..=WATCH_BUFFER_EVENTS as u64 {
            assert_eq!(*slow.recv().await.unwrap(), released("a", token));
        }
        assert_eq!(slow.recv().await.unwrap_err(), Lagged { missed: 1 });
    }
}

/// An applied event as watchers receive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub event: Event,
    /// How many sessions wait for the event's lock once the entry that made the event was
    /// applied (0 for an event of no lock). Carried here so that a watcher's work per event does
    /// not grow with the queue, and never takes the lock the apply path holds.
    pub waiters: u64,
}
