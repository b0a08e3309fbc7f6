//! The web UI's timeline: each lock's recent grants, releases and expiries with their tokens,
//! as this node applied them, in memory and bounded.
//!
//! Fed by one task from the state machine's event broadcast (the machinery watches use), so it
//! covers what this node applied since it started, leader or follower. At most
//! [`TIMELINE_EVENTS_PER_LOCK_MAX`] entries per lock, the oldest dropped first, for at most
//! [`TIMELINE_LOCKS_MAX`] locks, the lock whose last entry is oldest forgotten first. Events the
//! task missed (it fell a whole broadcast buffer behind) are counted, not guessed.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use palisade_core::{Event, SessionId, Token};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::limits::{TIMELINE_EVENTS_PER_LOCK_MAX, TIMELINE_LOCKS_MAX};
use crate::node::Node;
use crate::service::{ChangeKind, change_kind};
use crate::ui::AccessJson;

/// What happened to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Granted,
    /// Released by its holder, or its session closed.
    Released,
    /// The holder's session expired.
    Expired,
}

/// One grant, release or expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub kind: EntryKind,
    pub session: SessionId,
    pub token: Token,
    /// When this node applied it, wall-clock milliseconds since 1970 (for people to read; no
    /// lease is measured with it).
    pub at_unix_ms: u64,
    /// How a grant holds the lock (absent from releases and expiries).
    #[serde(flatten)]
    pub access: Option<AccessJson>,
}

impl Entry {
    /// The entry `event` makes, if it is a grant, release or expiry.
    pub fn of(event: &Event, at_unix_ms: u64) -> Option<Entry> {
        let (kind, session, token, _value) = change_kind(event)?;
        let kind = match kind {
            ChangeKind::Granted => EntryKind::Granted,
            ChangeKind::Released => EntryKind::Released,
            ChangeKind::Expired => EntryKind::Expired,
            // A proclaim changes no holder: the lock's row shows the value.
            ChangeKind::Snapshot | ChangeKind::ValueSet => return None,
        };
        let access = match event {
            Event::Granted { access, .. } => Some(AccessJson::from(*access)),
            _ => None,
        };
        Some(Entry {
            kind,
            session,
            token,
            at_unix_ms,
            access,
        })
    }
}

/// The bounded record of every lock's recent entries.
#[derive(Debug, Default)]
pub struct Timeline {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By name, so a listing reads the names under a prefix in order.
    locks: BTreeMap<String, History>,
    /// Each lock's last entry's sequence number, oldest first: who is forgotten next.
    by_activity: BTreeMap<u64, String>,
    next_sequence: u64,
    missed_events: u64,
}

#[derive(Debug)]
struct History {
    last_sequence: u64,
    entries: VecDeque<Entry>,
}

impl Timeline {
    /// Starts recording `node`'s events until it stops.
    pub fn record_from(node: Arc<Node>) -> Arc<Timeline> {
        let timeline = Arc::new(Timeline::default());
        let recording = timeline.clone();
        let mut events = node.subscribe_events();
        tokio::spawn(async move {
            loop {
                let received = tokio::select! {
                    received = events.recv() => received,
                    () = node.stopping() => return,
                };
                match received {
                    Ok(published) => {
                        recording.record(&published.event, unix_ms_now());
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => recording.missed(missed),
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        timeline
    }

    /// Records `event` if it is a grant, release or expiry; returns the lock and its entry.
    pub fn record(&self, event: &Event, at_unix_ms: u64) -> Option<(String, Entry)> {
        let entry = Entry::of(event, at_unix_ms)?;
        let lock = event.lock()?;
        let mut inner = self.lock();
        let sequence = inner.next_sequence;
        inner.next_sequence += 1;
        let previous = match inner.locks.get_mut(lock) {
            Some(history) => {
                let previous = history.last_sequence;
                history.last_sequence = sequence;
                if history.entries.len() == TIMELINE_EVENTS_PER_LOCK_MAX {
                    history.entries.pop_front();
                }
                history.entries.push_back(entry);
                Some(previous)
            }
            None => {
                if inner.locks.len() == TIMELINE_LOCKS_MAX
                    && let Some((_, forgotten)) = inner.by_activity.pop_first()
                {
                    inner.locks.remove(&forgotten);
                }
                inner.locks.insert(
                    lock.to_string(),
                    History {
                        last_sequence: sequence,
                        entries: VecDeque::from([entry]),
                    },
                );
                None
            }
        };
        if let Some(previous) = previous {
            inner.by_activity.remove(&previous);
        }
        inner.by_activity.insert(sequence, lock.to_string());
        debug_assert_eq!(inner.locks.len(), inner.by_activity.len());
        assert!(inner.locks.len() <= TIMELINE_LOCKS_MAX);
        Some((lock.to_string(), entry))
    }

    /// Counts events the recorder missed.
    fn missed(&self, missed: u64) {
        tracing::warn!(
            missed,
            "the web UI's timeline fell behind and missed events"
        );
        self.lock().missed_events += missed;
    }

    /// Events missed since the server started.
    pub fn missed_events(&self) -> u64 {
        self.lock().missed_events
    }

    /// `lock`'s entries, oldest first.
    pub fn entries(&self, lock: &str) -> Vec<Entry> {
        self.lock()
            .locks
            .get(lock)
            .map(|history| history.entries.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Names with entries that start with `prefix`, in order, after `start_after`; at most
    /// `limit`.
    pub fn names(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Vec<String> {
        let start = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.lock()
            .locks
            .range::<str, _>((start, Bound::Unbounded))
            .map(|(name, _)| name)
            .take_while(|name| name.starts_with(prefix))
            .take(limit)
            .cloned()
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Wall-clock milliseconds since 1970 (0 if the clock is before it).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use palisade_core::{ReleaseCause, RequestId};

    use super::*;

    fn granted(lock: &str, token: u64) -> Event {
        Event::Granted {
            lock: lock.into(),
            session: SessionId::new(1),
            token: Token::new(token),
            request_id: RequestId::new(token),
            value: None,
            access: palisade_core::Access::Exclusive,
        }
    }

    #[test]
    fn each_lock_keeps_its_latest_entries_and_the_least_recently_active_lock_goes_first() {
        let timeline = Timeline::default();
        for token in 1..=(TIMELINE_EVENTS_PER_LOCK_MAX as u64 + 5) {
            timeline.record(&granted("busy", token), token);
        }
        let kept = timeline.entries("busy");
        assert_eq!(kept.len(), TIMELINE_EVENTS_PER_LOCK_MAX);
        assert_eq!(kept.first().unwrap().token, Token::new(6));

        // Fill the timeline with other locks: "busy" is touched again midway, so it stays
        // while the locks older than its last entry go.
        for n in 0..TIMELINE_LOCKS_MAX {
            if n == 10 {
                timeline.record(
                    &Event::Released {
                        lock: "busy".into(),
                        session: SessionId::new(1),
                        token: Token::new(21),
                        cause: ReleaseCause::SessionExpired,
                    },
                    0,
                );
            }
            timeline.record(&granted(&format!("other/{n:05}"), 100), 0);
        }
        assert_eq!(
            timeline.names("", None, usize::MAX).len(),
            TIMELINE_LOCKS_MAX
        );
        assert_eq!(
            timeline.entries("busy").last().unwrap().kind,
            EntryKind::Expired
        );
        assert!(timeline.entries("other/00000").is_empty());
        assert_eq!(
            timeline.names("other/", Some("other/01000"), 3),
            ["other/01001", "other/01002", "other/01003"]
        );
    }
}
