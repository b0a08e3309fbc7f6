//! The compact image of a [`LockTable`] that a binary snapshot stores.
//!
//! The image holds only the table's primary data: its counters and limits, each session (in id
//! order), each lock (in name order, with its holder and queue) and the memory of forgotten
//! locks. Every index of the table (which locks a session holds or waits for, the deadlines,
//! open keys and request ids, owners) is rebuilt from it in one pass by
//! [`LockTable::from_image`], which checks each cross-reference as it goes, so a loaded table
//! is as trustworthy as one that passed [`LockTable::validate`].
//!
//! **Positional encodings.** The image is meant for a positional format (the server uses
//! postcard), where a field is known by its place, not its name. So no field of an image type
//! is ever skipped (`skip_serializing_if`) or defaulted, and a changed image is a new format
//! version, never an edited one. The table's own types keep their `skip_serializing_if`
//! attributes for the JSON snapshots of older versions; that is why the image has its own
//! types. Decoding builds each session and lock with a struct literal, so a field added to
//! `Session` or `Lock` fails the build here until the image carries it.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{GroupLink, InvalidTable, Lock, LockTable, Remembered, Session, SharedName, Waiter};
use crate::limits::Limits;
use crate::types::*;
use crate::{Access, Mode};

/// The image of a table as it is decoded: everything owned. Format 3, whose waiters may be parts
/// of multi-locks.
pub type TableImage = Image<Vec<SessionImage<'static>>, Vec<LockImage<'static>>, Vec<Forgotten>>;

/// The image of format 2, with shared holders and semaphores but before multi-locks: it
/// converts into a [`TableImage`] whose every waiter waits alone.
pub type TableImageV2 =
    Image<Vec<SessionImage<'static>>, Vec<LockImageV2<'static>>, Vec<Forgotten>>;

/// The image of format 1, before shared holders and semaphores: what snapshots of earlier
/// versions hold. It converts into a [`TableImage`] whose every grant is exclusive.
pub type TableImageV1 =
    Image<Vec<SessionImage<'static>>, Vec<LockImageV1<'static>>, Vec<Forgotten>>;

/// The image's fields, in their order. `S`, `L` and `F` are sequences: lazily produced from the
/// table when encoding ([`LockTable::image`]), vectors when decoding ([`TableImage`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct Image<S, L, F> {
    limits: Limits,
    now_ms: TimeMs,
    last_token: Token,
    last_session: SessionId,
    last_forgotten: u64,
    sessions: S,
    locks: L,
    forgotten: F,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SessionImage<'a> {
    id: SessionId,
    ttl_ms: DurationMs,
    expires_at_ms: TimeMs,
    open_request_id: Option<RequestId>,
    open_key: Option<Cow<'a, OpenKey>>,
    secret_digest: Option<SecretDigest>,
    owner: Option<Cow<'a, Identity>>,
    recent: Items<'a, Remembered>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct LockImage<'a> {
    name: Cow<'a, str>,
    holder: Option<GrantImage<'a>>,
    sharers: Vec<GrantImage<'a>>,
    permits: Option<u32>,
    waiters: Vec<WaiterImage<'a>>,
    last_token: Token,
    available_at_ms: Option<TimeMs>,
}

#[derive(Debug, Serialize, Deserialize)]
struct GrantImage<'a> {
    session: SessionId,
    token: Token,
    granted_at_ms: TimeMs,
    request_id: RequestId,
    value: Option<Cow<'a, GrantValue>>,
    access: Access,
}

#[derive(Debug, Serialize, Deserialize)]
struct WaiterImage<'a> {
    session: SessionId,
    request_id: RequestId,
    deadline_ms: Option<TimeMs>,
    value: Option<Cow<'a, GrantValue>>,
    mode: Mode,
    /// The next lock of its multi-lock's ring, and whether it is the first part.
    group: Option<(Cow<'a, str>, bool)>,
}

/// A lock of format 2: waiters that wait alone.
#[derive(Debug, Serialize, Deserialize)]
pub struct LockImageV2<'a> {
    name: Cow<'a, str>,
    holder: Option<GrantImage<'a>>,
    sharers: Vec<GrantImage<'a>>,
    permits: Option<u32>,
    waiters: Vec<WaiterImageV2<'a>>,
    last_token: Token,
    available_at_ms: Option<TimeMs>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WaiterImageV2<'a> {
    session: SessionId,
    request_id: RequestId,
    deadline_ms: Option<TimeMs>,
    value: Option<Cow<'a, GrantValue>>,
    mode: Mode,
}

impl From<TableImageV2> for TableImage {
    fn from(v2: TableImageV2) -> TableImage {
        let locks = v2.locks.into_iter().map(|l| LockImage {
            name: l.name,
            holder: l.holder,
            sharers: l.sharers,
            permits: l.permits,
            waiters: (l.waiters.into_iter())
                .map(|w| WaiterImage {
                    session: w.session,
                    request_id: w.request_id,
                    deadline_ms: w.deadline_ms,
                    value: w.value,
                    mode: w.mode,
                    group: None,
                })
                .collect(),
            last_token: l.last_token,
            available_at_ms: l.available_at_ms,
        });
        Image {
            limits: v2.limits,
            now_ms: v2.now_ms,
            last_token: v2.last_token,
            last_session: v2.last_session,
            last_forgotten: v2.last_forgotten,
            sessions: v2.sessions,
            locks: locks.collect(),
            forgotten: v2.forgotten,
        }
    }
}

/// A lock of format 1: one exclusive holder, exclusive waiters.
#[derive(Debug, Serialize, Deserialize)]
pub struct LockImageV1<'a> {
    name: Cow<'a, str>,
    holder: Option<GrantImageV1<'a>>,
    waiters: Vec<WaiterImageV1<'a>>,
    last_token: Token,
    available_at_ms: Option<TimeMs>,
}

#[derive(Debug, Serialize, Deserialize)]
struct GrantImageV1<'a> {
    session: SessionId,
    token: Token,
    granted_at_ms: TimeMs,
    request_id: RequestId,
    value: Option<Cow<'a, GrantValue>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WaiterImageV1<'a> {
    session: SessionId,
    request_id: RequestId,
    deadline_ms: Option<TimeMs>,
    value: Option<Cow<'a, GrantValue>>,
}

impl From<TableImageV1> for TableImage {
    fn from(v1: TableImageV1) -> TableImage {
        let grant = |g: GrantImageV1<'static>| GrantImage {
            session: g.session,
            token: g.token,
            granted_at_ms: g.granted_at_ms,
            request_id: g.request_id,
            value: g.value,
            access: Access::Exclusive,
        };
        let locks = v1.locks.into_iter().map(|l| LockImage {
            name: l.name,
            holder: l.holder.map(grant),
            sharers: Vec::new(),
            permits: None,
            waiters: (l.waiters.into_iter())
                .map(|w| WaiterImage {
                    session: w.session,
                    request_id: w.request_id,
                    deadline_ms: w.deadline_ms,
                    value: w.value,
                    mode: Mode::Exclusive,
                    group: None,
                })
                .collect(),
            last_token: l.last_token,
            available_at_ms: l.available_at_ms,
        });
        Image {
            limits: v1.limits,
            now_ms: v1.now_ms,
            last_token: v1.last_token,
            last_session: v1.last_session,
            last_forgotten: v1.last_forgotten,
            sessions: v1.sessions,
            locks: locks.collect(),
            forgotten: v1.forgotten,
        }
    }
}

/// A forgotten lock: when it was forgotten (its place in the order), its name, its last token.
pub type Forgotten = (u64, String, Token);

/// A sequence that is encoded from borrowed items and decoded into owned ones.
#[derive(Debug)]
pub enum Items<'a, T> {
    Borrowed(Vec<&'a T>),
    Owned(Vec<T>),
}

impl<T: Serialize> Serialize for Items<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Items::Borrowed(items) => serializer.collect_seq(items),
            Items::Owned(items) => serializer.collect_seq(items),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Items<'_, T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::deserialize(deserializer).map(Items::Owned)
    }
}

/// A sequence encoded straight from an iterator, so that encoding a table of a million locks
/// builds no second copy of it.
pub struct Lazy<I>(RefCell<Option<I>>);

impl<I> Serialize for Lazy<I>
where
    I: ExactSizeIterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let items = self.0.borrow_mut().take();
        let items = items.ok_or_else(|| serde::ser::Error::custom("an image encodes once"))?;
        serializer.collect_seq(items)
    }
}

fn lazy<I: ExactSizeIterator>(items: I) -> Lazy<I> {
    Lazy(RefCell::new(Some(items)))
}

fn grant_image(grant: &Grant) -> GrantImage<'_> {
    GrantImage {
        session: grant.session,
        token: grant.token,
        granted_at_ms: grant.granted_at_ms,
        request_id: grant.request_id,
        value: grant.value.as_ref().map(Cow::Borrowed),
        access: grant.access,
    }
}

fn waiter_image(waiter: &Waiter) -> WaiterImage<'_> {
    WaiterImage {
        session: waiter.session,
        request_id: waiter.request_id,
        deadline_ms: waiter.deadline_ms,
        value: waiter.value.as_ref().map(Cow::Borrowed),
        mode: waiter.mode,
        group: (waiter.group.as_ref()).map(|link| (Cow::Borrowed(link.next.as_ref()), link.first)),
    }
}

impl LockTable {
    /// The table's image, to encode once with serde (in a positional format: see the module).
    /// Costs nothing until it is encoded, and no copy of the table then.
    pub fn image(&self) -> impl Serialize + '_ {
        let sessions = self.sessions.iter().map(|(&id, s)| SessionImage {
            id,
            ttl_ms: s.ttl_ms,
            expires_at_ms: s.expires_at_ms,
            open_request_id: s.open_request_id,
            open_key: s.open_key.as_ref().map(Cow::Borrowed),
            secret_digest: s.secret_digest,
            owner: s.owner.as_ref().map(Cow::Borrowed),
            recent: Items::Borrowed(s.recent.iter().collect()),
        });
        let locks = self.locks.iter().map(|(name, l)| LockImage {
            name: Cow::Borrowed(name.as_ref()),
            holder: l.holder.as_ref().map(grant_image),
            sharers: l.sharers.values().map(grant_image).collect(),
            permits: l.permits,
            waiters: l.waiters.iter().map(waiter_image).collect(),
            last_token: l.last_token,
            available_at_ms: l.available_at_ms,
        });
        let forgotten = self
            .forgotten_order
            .iter()
            .map(|(&order, name)| (order, name, self.forgotten[name].1));
        Image {
            limits: self.limits,
            now_ms: self.now_ms,
            last_token: self.last_token,
            last_session: self.last_session,
            last_forgotten: self.last_forgotten,
            sessions: lazy(sessions),
            locks: lazy(locks),
            forgotten: lazy(forgotten),
        }
    }

    /// The table an image describes, with every index rebuilt; refused unless the image is of
    /// a valid table (the checks of [`LockTable::validate`], made while rebuilding).
    pub fn from_image(image: TableImage) -> Result<LockTable, InvalidTable> {
        fn inconsistent(what: String) -> InvalidTable {
            InvalidTable::Inconsistent(what)
        }
        image.limits.validate().map_err(InvalidTable::Limits)?;
        let mut table = LockTable::new(image.limits);
        table.now_ms = image.now_ms;
        table.last_token = image.last_token;
        table.last_session = image.last_session;
        table.last_forgotten = image.last_forgotten;

        let mut sessions = OrdMap::new();
        let mut previous = None;
        for s in image.sessions {
            let id = s.id;
            if previous.is_some_and(|p| p >= id) {
                return Err(inconsistent(format!("session {id} is out of order")));
            }
            previous = Some(id);
            if let Some(request_id) = s.open_request_id
                && table.open_requests.insert(request_id, id).is_some()
            {
                return Err(inconsistent(format!("open request id {request_id} reused")));
            }
            let open_key = s.open_key.map(Cow::into_owned);
            if let Some(key) = &open_key
                && table.open_keys.insert(key.clone(), id).is_some()
            {
                return Err(inconsistent(format!("open key of session {id} reused")));
            }
            let owner = s.owner.map(Cow::into_owned);
            if let Some(owner) = &owner {
                table.owners.entry(owner.clone()).or_default().insert(id);
            }
            table.session_deadlines.insert((s.expires_at_ms, id));
            let recent = match s.recent {
                Items::Owned(recent) => recent.into(),
                Items::Borrowed(recent) => recent.into_iter().cloned().collect(),
            };
            sessions.insert(
                id,
                Session {
                    ttl_ms: s.ttl_ms,
                    expires_at_ms: s.expires_at_ms,
                    open_request_id: s.open_request_id,
                    open_key,
                    secret_digest: s.secret_digest,
                    owner,
                    held: OrdSet::new(),
                    waiting: OrdSet::new(),
                    recent,
                },
            );
        }

        let mut locks = OrdMap::new();
        let mut previous: Option<SharedName> = None;
        for l in image.locks {
            let name = SharedName::from(l.name);
            if previous.as_ref().is_some_and(|p| *p >= name) {
                return Err(inconsistent(format!("lock {name:?} is out of order")));
            }
            if l.last_token > table.last_token {
                return Err(inconsistent(format!(
                    "lock {name:?} has token {} above the counter {}",
                    l.last_token, table.last_token
                )));
            }
            let mut hold = |g: GrantImage<'static>| {
                let Some(session) = sessions.get_mut(&g.session) else {
                    return Err(inconsistent(format!("holder of {name:?} is no session")));
                };
                if session.held.insert(name.clone()).is_some() {
                    return Err(inconsistent(format!("a session holds {name:?} twice")));
                }
                Ok(Grant {
                    session: g.session,
                    token: g.token,
                    granted_at_ms: g.granted_at_ms,
                    request_id: g.request_id,
                    value: g.value.map(Cow::into_owned),
                    access: g.access,
                })
            };
            let holder = l.holder.map(&mut hold).transpose()?;
            let mut sharers = OrdMap::new();
            for g in l.sharers {
                let grant = hold(g)?;
                sharers.insert(grant.session, grant);
            }
            let mut waiters = std::collections::VecDeque::with_capacity(l.waiters.len());
            for w in l.waiters {
                let Some(session) = sessions.get_mut(&w.session) else {
                    return Err(inconsistent(format!("waiter of {name:?} is no session")));
                };
                if session.held.contains(&name) {
                    return Err(inconsistent(format!("holder of {name:?} also waits")));
                }
                if session.waiting.insert(name.clone()).is_some() {
                    return Err(inconsistent(format!("a session waits twice for {name:?}")));
                }
                if let Some(deadline) = w.deadline_ms {
                    table
                        .wait_deadlines
                        .insert((deadline, w.session, name.clone()));
                }
                waiters.push_back(Waiter {
                    session: w.session,
                    request_id: w.request_id,
                    deadline_ms: w.deadline_ms,
                    value: w.value.map(Cow::into_owned),
                    mode: w.mode,
                    group: w.group.map(|(next, first)| GroupLink {
                        next: SharedName::from(next),
                        first,
                    }),
                });
            }
            if let Some(at) = l.available_at_ms {
                table.delay_deadlines.insert((at, name.clone()));
            }
            let lock = Lock {
                holder,
                sharers,
                permits: l.permits,
                waiters: waiters.into(),
                last_token: l.last_token,
                available_at_ms: l.available_at_ms,
            };
            lock.check_holders(&name).map_err(inconsistent)?;
            if lock.is_idle() {
                return Err(inconsistent(format!(
                    "idle lock {name:?} was not forgotten"
                )));
            }
            previous = Some(name.clone());
            locks.insert(name, Arc::new(lock));
        }

        for (order, name, token) in image.forgotten {
            let name = SharedName::from(name);
            if locks.contains_key(&name) || token > table.last_token {
                return Err(inconsistent(format!(
                    "forgotten lock {name:?} is live, or remembers a token above the counter"
                )));
            }
            let twice = table
                .forgotten
                .insert(name.clone(), (order, token))
                .is_some();
            if twice || table.forgotten_order.insert(order, name).is_some() {
                return Err(inconsistent("a forgotten lock is remembered twice".into()));
            }
        }
        table.sessions = sessions;
        table.locks = locks;
        table.check_groups().map_err(inconsistent)?;
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;

    fn round_trip(table: &LockTable) -> Result<LockTable, InvalidTable> {
        let bytes = postcard::to_allocvec(&table.image()).expect("an image encodes");
        let image: TableImage = postcard::from_bytes(&bytes).expect("an image decodes");
        LockTable::from_image(image)
    }

    fn apply(table: &mut LockTable, at_ms: u64, command: Command) -> Result<Reply, CoreError> {
        let now_ms = TimeMs::from_millis(at_ms);
        table.apply(Input { now_ms, command }).result
    }

    fn acquire(
        session: u64,
        lock: &str,
        request_id: u64,
        wait: Wait,
        value: Option<&str>,
    ) -> Command {
        Command::Acquire {
            session: SessionId::new(session),
            lock: lock.into(),
            request_id: RequestId::new(request_id),
            wait,
            value: value.map(|v| GrantValue::new(v).unwrap()),
            mode: Mode::Exclusive,
        }
    }

    /// A table where every optional field of every image type is set somewhere, and unset
    /// somewhere else: a field missing from the encoding, or skipped when empty, shifts every
    /// field after it, and the round trip then fails or differs.
    fn table_with_every_field() -> LockTable {
        let limits = Limits {
            lock_delay_ms: DurationMs::from_millis(500),
            ..Limits::default()
        };
        let mut table = LockTable::new(limits);
        let ttl_ms = DurationMs::from_millis(10_000);
        let open = |key: Option<u8>, owner: Option<&str>| Command::OpenSession {
            open_key: key.map(|k| {
                OpenKey::new(&[k, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]).unwrap()
            }),
            ttl_ms,
            secret_digest: key.map(|k| SecretDigest::new([k; SecretDigest::BYTES])),
            owner: owner.map(|o| Identity::new(o).unwrap()),
        };
        // Sessions 1 to 3 open with and without keys, digests and owners; 4 by request id.
        apply(&mut table, 1, open(Some(7), Some("alice"))).unwrap();
        apply(&mut table, 1, open(None, None)).unwrap();
        apply(&mut table, 1, open(Some(9), Some("alice"))).unwrap();
        let by_request_id = Command::OpenSessionByRequestId {
            request_id: RequestId::new(77),
            ttl_ms,
        };
        apply(&mut table, 1, by_request_id).unwrap();
        // Held with and without a value; queues with and without deadlines and values.
        apply(
            &mut table,
            2,
            acquire(1, "a", 1, Wait::Try, Some("10.0.0.1:80")),
        )
        .unwrap();
        apply(&mut table, 2, acquire(2, "b", 1, Wait::Try, None)).unwrap();
        apply(
            &mut table,
            3,
            acquire(
                2,
                "a",
                2,
                Wait::ForMs(DurationMs::from_millis(20_000)),
                Some("v"),
            ),
        )
        .unwrap();
        apply(&mut table, 3, acquire(3, "a", 1, Wait::Forever, None)).unwrap();
        // A forgotten lock, remembered with its last token.
        apply(&mut table, 4, acquire(3, "gone", 2, Wait::Try, None)).unwrap();
        let release = Command::Release {
            session: SessionId::new(3),
            lock: "gone".into(),
            request_id: RequestId::new(3),
        };
        apply(&mut table, 4, release).unwrap();
        // Session 4 holds "d" and lets its lease run out: "d" sits out its lock-delay.
        apply(&mut table, 5, acquire(4, "d", 1, Wait::Try, None)).unwrap();
        for session in 1..=3 {
            let keep_alive = Command::KeepAlive {
                session: SessionId::new(session),
            };
            apply(&mut table, 9_000, keep_alive).unwrap();
        }
        apply(&mut table, 10_002, Command::Tick).unwrap();
        table
    }

    #[test]
    fn a_table_with_every_field_set_and_unset_comes_back_whole_from_its_image() {
        let table = table_with_every_field();
        assert!(
            table.lock_status("d").unwrap().available_at_ms.is_some(),
            "d in lock-delay"
        );
        assert_eq!(table.lock_status("a").unwrap().waiters.len(), 2);
        assert!(table.last_token_of("gone").is_some(), "gone is remembered");
        assert!(
            table
                .session_opened_with(
                    &OpenKey::new(&[9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]).unwrap()
                )
                .is_some()
        );

        let restored = round_trip(&table).expect("the image is of a valid table");
        assert_eq!(restored, table);
        restored.validate().expect("the rebuilt indexes agree");
        // The restored table acts the same: the next grant of "a" goes to the first waiter.
        let (mut before, mut after) = (table, restored);
        let release = || Command::Release {
            session: SessionId::new(1),
            lock: "a".into(),
            request_id: RequestId::new(9),
        };
        assert_eq!(
            apply(&mut before, 10_003, release()),
            apply(&mut after, 10_003, release())
        );
        assert_eq!(before, after);
        assert_eq!(before.holder("a").unwrap().session, SessionId::new(2));

        let empty = LockTable::new(Limits::default());
        assert_eq!(round_trip(&empty).unwrap(), empty);
    }

    #[test]
    fn an_image_of_a_broken_table_is_refused_with_what_is_wrong() {
        let table = table_with_every_field();
        let bytes = postcard::to_allocvec(&table.image()).unwrap();
        let decode = || postcard::from_bytes::<TableImage>(&bytes).unwrap();

        let mut behind = decode();
        behind.last_token = Token::ZERO;
        let mut orphan = decode();
        orphan.sessions.retain(|s| s.id != SessionId::new(1));
        let mut twice = decode();
        let first = twice.locks.remove(0);
        twice.locks.push(first);
        for (image, why) in [
            (behind, "above the counter"),
            (orphan, "holder of \"a\" is no session"),
            (twice, "out of order"),
        ] {
            let refused = LockTable::from_image(image).unwrap_err().to_string();
            assert!(refused.contains(why), "{refused}");
        }
    }
}
