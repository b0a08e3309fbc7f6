//! The lock table: a pure state machine over sessions, locks, FIFO waiters and tokens.
//!
//! [`LockTable::apply`] takes one [`Input`] (a command and the time it takes effect) and returns
//! an [`Output`]. Before the command itself, the table lets time pass: it expires sessions whose
//! lease ended, ends waits past their deadline and ends lock-delays, in a fixed order, so the
//! outcome is a deterministic function of the state and the input. The table reads no clock and
//! does no I/O; the server replicates its inputs through Raft and snapshots it whole with serde.
//!
//! **Copy-on-write.** Every map and set of the table is a persistent one (`imbl`'s `OrdMap` and
//! `OrdSet`, B-trees whose nodes are shared by reference count), so cloning the table is O(1):
//! the server copies it under its lock and encodes the copy on another thread while applying
//! goes on. A change after a clone copies only the nodes on its path (and the one session or
//! lock it changes, with that lock's queue). Their serde forms are those of `BTreeMap` and
//! `BTreeSet`, so a snapshot reads and writes as it did before them.
//!
//! **Memory per lock.** A B-tree leaf holds 16 entries inline, and inserts in name order leave
//! leaves about half full, so an entry costs about twice its size. So the lock map's values are
//! `Arc<Lock>`s (8 bytes, not the 112 a `Lock` was): a leaf copied after a clone copies
//! pointers, and a change copies just the lock it changes ([`lock_mut`], `Arc::make_mut`). A
//! lock's name is one `Arc<str>` ([`SharedName`]), shared by the lock map, its holder's or
//! waiters' sets, the deadlines, the remembered outcomes and the memory of forgotten locks,
//! where each kept a `String` of its own. An empty queue is a null pointer ([`Waiters`]). With
//! serde's `rc` feature an `Arc` is stored as what it points to, so neither the JSON nor the
//! image changed. Measured with a counting allocator, a million locks held by a thousand
//! sessions took 390 bytes of heap per lock (424 of RSS) before, 247 (268) after; held by fifty
//! thousand sessions, whose 16 remembered outcomes each weigh more, 519 (572) before, 353 (385)
//! after.
//!
//! **Tokens** come from one counter shared by all locks. Every grant takes the next value, so a
//! lock's tokens strictly increase however often it is freed, forgotten and created again, and
//! the table needs to remember nothing per lock once a lock is free (invariant 1).

use std::collections::VecDeque;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::canary::{self, Canary};
use crate::limits::{self, Limits};
use crate::types::*;
use crate::{Access, AcquirePart, GrantedPart, Mode};

mod image;

pub use image::{TableImage, TableImageV1, TableImageV2};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    ttl_ms: DurationMs,
    expires_at_ms: TimeMs,
    /// The request id of a [`Command::OpenSessionByRequestId`] that opened it, if one did.
    open_request_id: Option<RequestId>,
    /// The key of the [`Command::OpenSession`] that opened it, if it carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    open_key: Option<OpenKey>,
    /// The digest of the secret whoever opened the session holds; `None` for a session opened
    /// before session secrets (from an older log or snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret_digest: Option<SecretDigest>,
    /// The identity that opened the session, its owner; `None` for an unauthenticated open or
    /// one from before identities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<Identity>,
    held: OrdSet<SharedName>,
    waiting: OrdSet<SharedName>,
    /// Outcomes of recent acquires and releases, oldest first, for retried requests.
    recent: VecDeque<Remembered>,
}

/// What a new session was opened by, so that a retry of the same open finds it.
enum Opener {
    /// An open without a key: nothing can retry it.
    Nobody,
    RequestId(RequestId),
    Key(OpenKey),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Remembered {
    request_id: RequestId,
    kind: RequestKind,
    lock: SharedName,
    result: Result<Reply, CoreError>,
}

/// The acquire half of a [`Command::ReleaseThenAcquire`]: [`Command::Acquire`]'s fields.
struct AcquireArgs {
    lock: String,
    request_id: RequestId,
    wait: Wait,
    value: Option<GrantValue>,
    mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum RequestKind {
    Acquire,
    Release,
    /// A multi-lock ([`Command::AcquireAll`]), remembered under [`multi_lock_key`].
    AcquireAll,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Waiter {
    session: SessionId,
    request_id: RequestId,
    deadline_ms: Option<TimeMs>,
    /// The value the grant will carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<GrantValue>,
    /// How it asks to hold the lock: exclusive, shared, or a permit (of the lock's size).
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    mode: Mode,
    /// The multi-lock this waiter is one part of, if any; `None` for a single acquire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<GroupLink>,
}

/// A waiter's place in a multi-lock ([`Command::AcquireAll`]). A multi-lock that cannot be
/// granted at once waits as one *group*: one waiter in the queue of each of its locks, all with
/// the session's id, the command's request id and deadline, linked into a ring in the order of
/// the command's parts. Any one of them finds the others ([`LockTable::group_of`]), so the whole
/// group is granted, or withdrawn, in one step. A ring costs one name per waiter, where a list of
/// every lock in each waiter would cost the square of the group's size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct GroupLink {
    /// The group's next lock, in the order of the parts; the last part's next is the first's.
    next: SharedName,
    /// Whether this is the first part: the ring is read from it, so that grants and the
    /// remembered outcome list the locks in the order the command named them.
    first: bool,
}

/// A lock's queue, first waiter first. Most locks have no waiter, so an empty queue is a null
/// pointer (8 bytes, where a `VecDeque` is 32), which keeps every [`Lock`] small. Never an empty
/// box, so that equal queues compare equal. Its serde form is the sequence's, as before.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[expect(
    clippy::box_collection,
    reason = "the box is what makes an empty queue one null pointer"
)]
struct Waiters(Option<Box<VecDeque<Waiter>>>);

impl Waiters {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.len())
    }

    fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn iter(&self) -> impl Iterator<Item = &Waiter> {
        self.0.iter().flat_map(|queue| queue.iter())
    }

    fn front(&self) -> Option<&Waiter> {
        self.0.as_ref()?.front()
    }

    /// `session`'s waiter (a session waits at most once per lock).
    fn get(&self, session: SessionId) -> Option<&Waiter> {
        self.iter().find(|w| w.session == session)
    }

    fn push_back(&mut self, waiter: Waiter) {
        self.0.get_or_insert_default().push_back(waiter);
    }

    /// Takes `session`'s waiter out of the queue (a session waits at most once per lock).
    fn remove(&mut self, session: SessionId) -> Option<Waiter> {
        let queue = self.0.as_mut()?;
        let index = queue.iter().position(|w| w.session == session)?;
        let waiter = queue.remove(index);
        if queue.is_empty() {
            self.0 = None;
        }
        waiter
    }
}

impl From<VecDeque<Waiter>> for Waiters {
    fn from(queue: VecDeque<Waiter>) -> Waiters {
        Waiters((!queue.is_empty()).then(|| Box::new(queue)))
    }
}

impl Serialize for Waiters {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Waiters {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Waiters, D::Error> {
        VecDeque::deserialize(deserializer).map(Waiters::from)
    }
}

/// A name in use: a lock (held exclusive by one holder, or shared by the readers of a phase) or
/// a semaphore (`permits` slots, each held exclusive by one holder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lock {
    /// The exclusive holder of a lock; a semaphore has none.
    holder: Option<Grant>,
    /// The readers of a lock's current shared phase (every one with the phase's token), or a
    /// semaphore's permit holders (each with its own slot and token), by session: a session
    /// holds a name at most once. Absent while empty, so a lock of earlier versions is stored
    /// as before.
    #[serde(default, skip_serializing_if = "OrdMap::is_empty")]
    sharers: OrdMap<SessionId, Grant>,
    /// A semaphore's size, fixed from the acquire that created the name until it is forgotten;
    /// `None` for a lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    permits: Option<u32>,
    waiters: Waiters,
    last_token: Token,
    available_at_ms: Option<TimeMs>,
}

impl Lock {
    fn is_idle(&self) -> bool {
        self.holder.is_none()
            && self.sharers.is_empty()
            && self.waiters.is_empty()
            && self.available_at_ms.is_none()
    }

    /// Whether an acquire in `mode` could be granted beside the current holders (lock-delay and
    /// the queue aside): exclusive on a lock nobody holds, shared while no writer holds it, a
    /// permit while a slot is free.
    fn admits(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.holder.is_none() && self.sharers.is_empty(),
            Mode::Shared => self.holder.is_none(),
            Mode::Permit(_) => {
                let held = self.sharers.len() as u64;
                let permits = u64::from(self.permits.unwrap_or(0));
                held < permits
                    || (held == permits && canary::active(Canary::SemaphoreAdmitsWhenFull))
            }
        }
    }

    /// Whether a grant in `mode` draws a token from the counter: every grant but a reader's
    /// joining the open phase, which takes the phase's token.
    fn draws_token(&self, mode: Mode) -> bool {
        mode != Mode::Shared || self.sharers.is_empty()
    }

    /// The grant of session `id`, exclusive or not.
    fn grant_of(&self, id: SessionId) -> Option<&Grant> {
        self.holder
            .as_ref()
            .filter(|g| g.session == id)
            .or_else(|| self.sharers.get(&id))
    }

    /// A holder to name in a refusal: the exclusive one, else the first sharer.
    fn some_holder(&self) -> Option<&Grant> {
        self.holder
            .as_ref()
            .or_else(|| self.sharers.values().next())
    }

    /// Checks how the lock is held, against its kind: a lock has an exclusive holder or a shared
    /// phase (every reader with the lock's last token), never both; a semaphore has only
    /// permits, at most one per slot below its size; every waiter asks for what the kind takes.
    fn check_holders(&self, name: &str) -> Result<(), String> {
        let fail = |what: &str| Err(format!("{what} in {name:?}"));
        let waiters_fit = self
            .waiters
            .iter()
            .all(|w| w.mode.permits() == self.permits);
        if !waiters_fit {
            return fail("a waiter asks for another kind than the lock's");
        }
        for (id, g) in &self.sharers {
            if g.session != *id {
                return fail("a sharer is filed under another session");
            }
        }
        match self.permits {
            None => {
                if let Some(g) = &self.holder {
                    if g.access != Access::Exclusive || g.token != self.last_token {
                        return fail("the holder is not exclusive with the lock's last token");
                    }
                    if !self.sharers.is_empty() {
                        return fail("an exclusive holder beside shared holders");
                    }
                }
                let phase = |g: &Grant| g.access == Access::Shared && g.token == self.last_token;
                if !self.sharers.values().all(phase) {
                    return fail("a shared holder outside the current phase");
                }
            }
            Some(permits) => {
                if !(1..=crate::PERMITS_MAX).contains(&permits) || self.holder.is_some() {
                    return fail("a semaphore of a size out of range, or with an exclusive holder");
                }
                let mut slots = std::collections::BTreeSet::new();
                for g in self.sharers.values() {
                    let fits = g.access.slot().is_some_and(|slot| slot < permits);
                    if !fits || !slots.insert(g.access) || g.token > self.last_token {
                        return fail(
                            "a permit outside the slots, twice in a slot, or above the last token",
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The lowest slot no permit holds.
    fn free_slot(&self) -> u32 {
        let used: std::collections::BTreeSet<u32> = self
            .sharers
            .values()
            .filter_map(|g| g.access.slot())
            .collect();
        (0..)
            .find(|slot| !used.contains(slot))
            .expect("a free slot exists")
    }
}

/// A lock's name, as the table keeps it: one allocation per lock, shared by the lock map, its
/// holder's and waiters' sets, the deadlines, the remembered outcomes that name it and the
/// memory of forgotten locks. Serialised as the string it is.
type SharedName = Arc<str>;

/// The lock `name` of `locks`, to change: copied first if a clone of the table still shares it.
fn lock_mut<'a>(locks: &'a mut OrdMap<SharedName, Arc<Lock>>, name: &str) -> Option<&'a mut Lock> {
    locks.get_mut(name).map(Arc::make_mut)
}

/// The whole lock table. Serialise it to snapshot; deserialise it to restore. Clone it in O(1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    limits: Limits,
    now_ms: TimeMs,
    /// The last token granted to any lock. Only ever grows.
    last_token: Token,
    /// The last session id assigned. Only ever grows.
    last_session: SessionId,
    sessions: OrdMap<SessionId, Session>,
    locks: OrdMap<SharedName, Arc<Lock>>,
    /// Request ids of live sessions opened by [`Command::OpenSessionByRequestId`] (logs of older
    /// versions), so that their replay deduplicates exactly as it did when first applied.
    open_requests: OrdMap<RequestId, SessionId>,
    /// Open keys of live sessions, so a retried open returns the same session. Forgotten when
    /// the session ends: the key then opens a new session.
    #[serde(default)]
    open_keys: OrdMap<OpenKey, SessionId>,
    /// Deadlines, ordered: session expiries, waiter deadlines and lock-delay ends.
    session_deadlines: OrdSet<(TimeMs, SessionId)>,
    wait_deadlines: OrdSet<(TimeMs, SessionId, SharedName)>,
    delay_deadlines: OrdSet<(TimeMs, SharedName)>,
    /// The last tokens of recently forgotten locks, for status reads only: safety never depends
    /// on them (the shared counter does that). Bounded by `FORGOTTEN_LOCKS_REMEMBERED_MAX`,
    /// oldest forgotten first out.
    #[serde(default)]
    forgotten: OrdMap<SharedName, (u64, Token)>,
    #[serde(default)]
    forgotten_order: OrdMap<u64, SharedName>,
    #[serde(default)]
    last_forgotten: u64,
    /// The live sessions of each owner, so that an identity's use of its quotas is counted
    /// from its own sessions ([`LockTable::usage_of`]) without a walk over every session.
    /// Absent while empty, so a table without owners is stored as before.
    #[serde(default, skip_serializing_if = "OrdMap::is_empty")]
    owners: OrdMap<Identity, OrdSet<SessionId>>,
}

/// How much of the table's capacity one identity's sessions take ([`LockTable::usage_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Its live sessions.
    pub sessions: usize,
    /// Locks its sessions hold.
    pub held: usize,
    /// Locks its sessions wait for.
    pub waiting: usize,
}

impl Default for LockTable {
    fn default() -> Self {
        LockTable::new(Limits::default())
    }
}

impl LockTable {
    /// An empty table enforcing `limits`.
    ///
    /// # Panics
    /// If `limits` exceed the ceilings of [`crate::limits`]: that is a programming error.
    pub fn new(limits: Limits) -> Self {
        if let Err(message) = limits.validate() {
            panic!("invalid lock table limits: {message}");
        }
        LockTable {
            limits,
            now_ms: TimeMs::ZERO,
            last_token: Token::ZERO,
            last_session: SessionId::new(0),
            sessions: OrdMap::new(),
            locks: OrdMap::new(),
            open_requests: OrdMap::new(),
            open_keys: OrdMap::new(),
            session_deadlines: OrdSet::new(),
            wait_deadlines: OrdSet::new(),
            delay_deadlines: OrdSet::new(),
            forgotten: OrdMap::new(),
            forgotten_order: OrdMap::new(),
            last_forgotten: 0,
            owners: OrdMap::new(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The table's clock: the latest time of any input applied.
    pub fn now_ms(&self) -> TimeMs {
        self.now_ms
    }

    /// The last token granted to any lock.
    pub fn last_token(&self) -> Token {
        self.last_token
    }

    /// The last session id assigned.
    pub fn last_session(&self) -> SessionId {
        self.last_session
    }

    /// The table a cluster restored from a backup of this one starts with: the same limits and
    /// time, no session, holder or waiter (every lock is free; clients open new sessions), the
    /// token counter raised to `token_floor` and the session counter to `session_floor` if
    /// they are below. With the floors of [`crate::limits::recovery_floors`], no grant of the
    /// restored cluster reuses a token or a session id that any earlier incarnation issued
    /// after the backup was taken.
    pub fn restored(&self, token_floor: Token, session_floor: SessionId) -> LockTable {
        let mut table = LockTable::new(self.limits);
        table.now_ms = self.now_ms;
        table.last_session = self
            .last_session
            .max(session_floor.min(crate::limits::SESSION_ID_MAX));
        table.last_token = self.last_token.max(token_floor.min(self.limits.token_max));
        table
    }

    /// What the sessions `owner` opened take now: sessions, locks held and locks waited for.
    /// Costs a look at each of its sessions, no walk over the table.
    pub fn usage_of(&self, owner: &Identity) -> Usage {
        let mut usage = Usage::default();
        for id in self.owners.get(owner).into_iter().flatten() {
            let session = &self.sessions[id];
            usage.sessions += 1;
            usage.held += session.held.len();
            usage.waiting += session.waiting.len();
        }
        usage
    }

    /// True when session `id` holds `lock` or waits for it: an acquire of it by that session is
    /// a retry or a repeat, which takes nothing more.
    pub fn session_holds_or_waits(&self, id: SessionId, lock: &str) -> bool {
        self.sessions
            .get(&id)
            .is_some_and(|s| s.held.contains(lock) || s.waiting.contains(lock))
    }

    /// The live session an open with `key` opened, if any: a retried open returns it.
    pub fn session_opened_with(&self, key: &OpenKey) -> Option<SessionId> {
        self.open_keys.get(key).copied()
    }

    /// The identity that opened session `id`: `None` if there is no such session, `Some(None)`
    /// for a session opened without an identity (acted for with its secret alone).
    pub fn session_owner(&self, id: SessionId) -> Option<Option<&Identity>> {
        self.sessions.get(&id).map(|s| s.owner.as_ref())
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// The earliest time at which a [`Command::Tick`] would change something, if any.
    pub fn next_deadline_ms(&self) -> Option<TimeMs> {
        [
            self.session_deadlines.get_min().map(|d| d.0),
            self.wait_deadlines.get_min().map(|d| d.0),
            self.delay_deadlines.get_min().map(|d| d.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Applies one input. The only way the table changes.
    pub fn apply(&mut self, input: Input) -> Output {
        let mut events = Vec::new();
        self.now_ms = self.now_ms.max(input.now_ms);
        self.pass_time(&mut events);
        let result = match input.command {
            Command::OpenSession {
                open_key,
                ttl_ms,
                secret_digest,
                owner,
            } => match open_key {
                Some(key) => self.open_session_with_key(key, ttl_ms, secret_digest, owner),
                None => self.open_session(Opener::Nobody, ttl_ms, secret_digest, owner),
            },
            Command::OpenSessionByRequestId { request_id, ttl_ms } => {
                match self.open_requests.get(&request_id) {
                    Some(&id) => Ok(self.opened(id)),
                    None => self.open_session(Opener::RequestId(request_id), ttl_ms, None, None),
                }
            }
            Command::KeepAlive { session } => self.keep_alive(session),
            Command::CloseSession { session } => self.close_session(session, &mut events),
            Command::Acquire {
                session,
                lock,
                request_id,
                wait,
                value,
                mode,
            } => self.acquire(session, lock, request_id, wait, value, mode, &mut events),
            Command::AcquireAll {
                session,
                parts,
                request_id,
                wait,
            } => self.acquire_all(session, parts, request_id, wait, &mut events),
            Command::SetValue {
                session,
                lock,
                token,
                value,
            } => self.set_value(session, lock, token, value, &mut events),
            Command::Release {
                session,
                lock,
                request_id,
            } => self.release(session, lock, request_id, &mut events),
            Command::ReleaseThenAcquire {
                session,
                release,
                release_request_id,
                lock,
                request_id,
                wait,
                value,
                mode,
            } => self.release_then_acquire(
                session,
                (release, release_request_id),
                AcquireArgs {
                    lock,
                    request_id,
                    wait,
                    value,
                    mode,
                },
                &mut events,
            ),
            Command::Tick => Ok(Reply::Ticked),
            Command::SetLimits { limits } => match limits.validate() {
                Ok(()) => {
                    self.limits = limits;
                    // A raised token limit pays for waiters that waited for tokens alone.
                    let waited: Vec<SharedName> = (self.locks.iter())
                        .filter(|(_, l)| !l.waiters.is_empty())
                        .map(|(name, _)| Arc::clone(name))
                        .collect();
                    for lock in &waited {
                        self.settle(lock, &mut events);
                    }
                    Ok(Reply::LimitsSet)
                }
                Err(message) => Err(CoreError::InvalidLimits { message }),
            },
            Command::LeaderStart => Ok(self.leader_start()),
            Command::RaiseTokenFloor {
                floor,
                session_floor,
            } => {
                self.last_token = self.last_token.max(floor.min(self.limits.token_max));
                if let Some(session_floor) = session_floor {
                    self.last_session = self
                        .last_session
                        .max(session_floor.min(crate::limits::SESSION_ID_MAX));
                }
                Ok(Reply::TokenFloorRaised {
                    last_token: self.last_token,
                })
            }
        };
        // A canary of the modes breaks what this checks; it is left to the checkers outside the
        // table (the reference model's) to catch, as they must in a release build.
        #[cfg(debug_assertions)]
        if !Canary::MODES.into_iter().any(canary::active) {
            self.check_consistency();
        }
        Output { result, events }
    }

    // ----- time -----

    fn pass_time(&mut self, events: &mut Vec<Event>) {
        let now = self.now_ms;
        while let Some(&(at, session)) = self.session_deadlines.get_min() {
            if at > now {
                break;
            }
            self.end_session(session, true, events);
        }
        while let Some((at, session, lock)) = self.wait_deadlines.get_min().cloned() {
            if at > now {
                break;
            }
            match self.group_of(session, &lock) {
                Some(group) => self.withdraw_group(session, &group, WaitEndCause::TimedOut, events),
                None => {
                    self.remove_waiter(session, &lock, WaitEndCause::TimedOut, events);
                    self.settle(&lock, events);
                }
            }
        }
        while let Some((at, lock)) = self.delay_deadlines.get_min().cloned() {
            if at > now {
                break;
            }
            self.delay_deadlines.remove(&(at, lock.clone()));
            if let Some(l) = lock_mut(&mut self.locks, &lock) {
                l.available_at_ms = None;
            }
            self.settle(&lock, events);
        }
    }

    fn leader_start(&mut self) -> Reply {
        let now = self.now_ms;
        let mut extended = 0;
        let ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for id in ids {
            let session = self.sessions.get_mut(&id).expect("a listed session exists");
            let renewed = now.saturating_add(session.ttl_ms);
            if renewed > session.expires_at_ms {
                self.session_deadlines.remove(&(session.expires_at_ms, id));
                session.expires_at_ms = renewed;
                self.session_deadlines.insert((renewed, id));
                extended += 1;
            }
        }
        Reply::LeaderStarted {
            sessions_extended: extended,
        }
    }

    // ----- sessions -----

    /// A retry finds the session the key opened, with the digest it was opened with: the
    /// retry's own digest is ignored (the server derives a keyed open's secret from its key, so
    /// the two are the same).
    fn open_session_with_key(
        &mut self,
        key: OpenKey,
        ttl_ms: DurationMs,
        secret_digest: Option<SecretDigest>,
        owner: Option<Identity>,
    ) -> Result<Reply, CoreError> {
        match self.open_keys.get(&key) {
            Some(&id) => Ok(self.opened(id)),
            None => self.open_session(Opener::Key(key), ttl_ms, secret_digest, owner),
        }
    }

    /// The reply to a retried open: the live session it opened first, unchanged.
    fn opened(&self, id: SessionId) -> Reply {
        let s = &self.sessions[&id];
        Reply::SessionOpened {
            session: id,
            ttl_ms: s.ttl_ms,
            expires_at_ms: s.expires_at_ms,
        }
    }

    /// Opens a new session; the caller has checked that `opener` is not a retry.
    fn open_session(
        &mut self,
        opener: Opener,
        ttl_ms: DurationMs,
        secret_digest: Option<SecretDigest>,
        owner: Option<Identity>,
    ) -> Result<Reply, CoreError> {
        let (ttl_ms_min, ttl_ms_max) = (
            self.limits.session_ttl_ms_min,
            self.limits.session_ttl_ms_max,
        );
        if !(ttl_ms_min..=ttl_ms_max).contains(&ttl_ms) {
            return Err(CoreError::TtlOutOfRange {
                ttl_ms,
                ttl_ms_min,
                ttl_ms_max,
            });
        }
        if self.sessions.len() >= self.limits.sessions_max as usize {
            return Err(CoreError::TooManySessions {
                sessions_max: self.limits.sessions_max,
            });
        }
        self.last_session = self.last_session.next();
        let id = self.last_session;
        let expires_at_ms = self.now_ms.saturating_add(ttl_ms);
        let (open_request_id, open_key) = match opener {
            Opener::Nobody => (None, None),
            Opener::RequestId(request_id) => {
                let earlier = self.open_requests.insert(request_id, id);
                assert!(
                    earlier.is_none(),
                    "open request id of a live session reused"
                );
                (Some(request_id), None)
            }
            Opener::Key(key) => {
                let earlier = self.open_keys.insert(key.clone(), id);
                assert!(earlier.is_none(), "open key of a live session reused");
                (None, Some(key))
            }
        };
        self.sessions.insert(
            id,
            Session {
                ttl_ms,
                expires_at_ms,
                open_request_id,
                open_key,
                secret_digest,
                owner: owner.clone(),
                held: OrdSet::new(),
                waiting: OrdSet::new(),
                recent: VecDeque::new(),
            },
        );
        self.session_deadlines.insert((expires_at_ms, id));
        if let Some(owner) = owner {
            self.owners.entry(owner).or_default().insert(id);
        }
        Ok(Reply::SessionOpened {
            session: id,
            ttl_ms,
            expires_at_ms,
        })
    }

    fn keep_alive(&mut self, id: SessionId) -> Result<Reply, CoreError> {
        let session = self
            .sessions
            .get_mut(&id)
            .ok_or(CoreError::SessionNotFound { session: id })?;
        let renewed = self.now_ms.saturating_add(session.ttl_ms);
        // A lease only ever grows: `now` never moves backwards, so neither does the expiry.
        assert!(
            renewed >= session.expires_at_ms,
            "keepalive would shorten a lease"
        );
        self.session_deadlines.remove(&(session.expires_at_ms, id));
        session.expires_at_ms = renewed;
        self.session_deadlines.insert((renewed, id));
        Ok(Reply::KeptAlive {
            session: id,
            expires_at_ms: renewed,
        })
    }

    fn close_session(
        &mut self,
        id: SessionId,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        if !self.sessions.contains_key(&id) {
            return Err(CoreError::SessionNotFound { session: id });
        }
        self.end_session(id, false, events);
        Ok(Reply::SessionClosed { session: id })
    }

    /// Ends a session: its waits are withdrawn first (so none of them can be granted by the
    /// releases that follow — invariant 7), then its locks are released.
    fn end_session(&mut self, id: SessionId, expired: bool, events: &mut Vec<Event>) {
        let Some(session) = self.sessions.remove(&id) else {
            return;
        };
        self.session_deadlines.remove(&(session.expires_at_ms, id));
        if let Some(request_id) = session.open_request_id {
            self.open_requests.remove(&request_id);
        }
        if let Some(key) = &session.open_key {
            self.open_keys.remove(key);
        }
        if let Some(owner) = &session.owner
            && let Some(owned) = self.owners.get_mut(owner)
        {
            owned.remove(&id);
            if owned.is_empty() {
                self.owners.remove(owner);
            }
        }
        for lock in &session.waiting {
            let l = lock_mut(&mut self.locks, lock).expect("a waited-for lock exists");
            let waiter = l.waiters.remove(id).expect("waiter is queued");
            if let Some(deadline) = waiter.deadline_ms {
                self.wait_deadlines.remove(&(deadline, id, lock.clone()));
            }
            events.push(Event::WaitEnded {
                lock: lock.to_string(),
                session: id,
                request_id: waiter.request_id,
                cause: WaitEndCause::SessionEnded,
            });
        }
        let cause = if expired {
            ReleaseCause::SessionExpired
        } else {
            ReleaseCause::SessionClosed
        };
        for lock in &session.held {
            self.free(lock, id, cause, events);
        }
        events.push(Event::SessionEnded {
            session: id,
            expired,
        });
        for lock in session.waiting.iter().chain(&session.held) {
            self.settle(lock, events);
        }
    }

    // ----- locks -----

    #[expect(clippy::too_many_arguments, reason = "the fields of Command::Acquire")]
    fn acquire(
        &mut self,
        id: SessionId,
        lock: String,
        request_id: RequestId,
        wait: Wait,
        value: Option<GrantValue>,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let session = self
            .sessions
            .get(&id)
            .ok_or(CoreError::SessionNotFound { session: id })?;
        // Checked before anything is remembered: an invalid name costs no dedup slot.
        let lock = self.checked_name(lock)?;
        if let Some(earlier) = remembered(session, request_id, RequestKind::Acquire, &lock)? {
            return earlier;
        }
        let lock = self.shared_name(lock);
        let result = self.acquire_new(id, &lock, request_id, wait, value, mode, events);
        self.remember(id, request_id, RequestKind::Acquire, lock, &result);
        result
    }

    #[expect(clippy::too_many_arguments, reason = "the fields of Command::Acquire")]
    fn acquire_new(
        &mut self,
        id: SessionId,
        lock: &SharedName,
        request_id: RequestId,
        wait: Wait,
        value: Option<GrantValue>,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let deadline_ms = self.wait_deadline(wait)?;
        permits_in_range(mode)?;
        self.ensure_lock(lock, mode)?;
        let l = &self.locks[lock];
        if let Some(reply) = already_there(l, id, lock, mode) {
            return reply;
        }
        let line_is_free = l.waiters.is_empty()
            || (mode == Mode::Shared
                && !l.sharers.is_empty()
                && canary::active(Canary::ReaderJoinsPastWaitingWriter));
        let free = l.available_at_ms.is_none() && line_is_free && l.admits(mode);
        if free {
            return self.grant_free(lock, id, request_id, value, mode, events);
        }
        let busy = busy(l, lock);
        if wait == Wait::Try || deadline_ms.is_some_and(|d| d <= self.now_ms) {
            return Err(busy);
        }
        self.enqueue(id, lock, request_id, deadline_ms, value, mode)
    }

    /// A multi-lock ([`Command::AcquireAll`]): every part granted now, in this one step, or the
    /// session queued for all of them at once as one group, or refused with nothing changed.
    ///
    /// Checked in this order: the session; the number of parts (so the work below is bounded);
    /// each name, as a single acquire checks it; no name twice. Those cost no remembered slot, as
    /// an invalid name of a single acquire does not. Then a retry (the same request id and
    /// names, in order: [`multi_lock_key`]) answers the remembered outcome, and a request id
    /// used for another command is a conflict. Then the wait, each part's mode, no lock the
    /// session already holds or waits for (a multi-lock never extends a hold or a wait), the
    /// kind of every name in use, and the limit on locks for the new names.
    fn acquire_all(
        &mut self,
        id: SessionId,
        parts: Vec<AcquirePart>,
        request_id: RequestId,
        wait: Wait,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let session = self
            .sessions
            .get(&id)
            .ok_or(CoreError::SessionNotFound { session: id })?;
        let locks_max = crate::MULTI_LOCKS_MAX;
        if parts.is_empty() || parts.len() > locks_max as usize {
            return Err(CoreError::MultiLockSize {
                locks: u32::try_from(parts.len()).unwrap_or(u32::MAX),
                locks_max,
            });
        }
        let mut named = Vec::with_capacity(parts.len());
        for part in parts {
            named.push((self.checked_name(part.lock)?, part.mode));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some((lock, _)) = named.iter().find(|(lock, _)| !seen.insert(lock.as_str())) {
            return Err(CoreError::MultiLockRepeated { lock: lock.clone() });
        }
        let key = multi_lock_key(named.iter().map(|(lock, _)| lock.as_str()));
        if let Some(earlier) = remembered(session, request_id, RequestKind::AcquireAll, &key)? {
            return earlier;
        }
        let parts: Vec<(SharedName, Mode)> = (named.into_iter())
            .map(|(lock, mode)| (self.shared_name(lock), mode))
            .collect();
        let result = self.acquire_all_new(id, &parts, request_id, wait, events);
        self.remember(id, request_id, RequestKind::AcquireAll, key.into(), &result);
        result
    }

    /// A multi-lock that is not a retry (see [`Self::acquire_all`]). It is granted now only if
    /// every part could be granted alone now (its lock admits it, is out of lock-delay and has
    /// nobody queued ahead: strict FIFO) and the counter can pay every token it draws.
    fn acquire_all_new(
        &mut self,
        id: SessionId,
        parts: &[(SharedName, Mode)],
        request_id: RequestId,
        wait: Wait,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let deadline_ms = self.wait_deadline(wait)?;
        for (_, mode) in parts {
            permits_in_range(*mode)?;
        }
        let session = &self.sessions[&id];
        let taken =
            |lock: &SharedName| session.held.contains(lock) || session.waiting.contains(lock);
        if let Some((lock, _)) = parts.iter().find(|(lock, _)| taken(lock)) {
            return Err(CoreError::MultiLockHeld {
                lock: lock.to_string(),
                session: id,
            });
        }
        let mut new_locks = 0;
        for (lock, mode) in parts {
            match self.locks.get(lock) {
                Some(l) if l.permits != mode.permits() => {
                    return Err(CoreError::PermitsMismatch {
                        lock: lock.to_string(),
                        permits: l.permits.unwrap_or(0),
                        requested: mode.permits().unwrap_or(0),
                    });
                }
                Some(_) => {}
                None => new_locks += 1,
            }
        }
        if new_locks > 0 && self.locks.len() + new_locks > self.limits.locks_max as usize {
            return Err(CoreError::TooManyLocks {
                locks_max: self.limits.locks_max,
            });
        }
        let blocked = |(lock, mode): &&(SharedName, Mode)| !self.grantable_now(lock, *mode);
        let Some((blocked, _)) = parts.iter().find(blocked) else {
            // Every part can be granted: each draws its token as a single grant would.
            let mut tokens_left = self.tokens_left();
            for (lock, mode) in parts {
                let draws = self.locks.get(lock).is_none_or(|l| l.draws_token(*mode));
                if draws && tokens_left == 0 {
                    return Err(CoreError::TokensExhausted {
                        lock: lock.to_string(),
                    });
                }
                tokens_left -= u64::from(draws);
            }
            let mut grants = Vec::with_capacity(parts.len());
            for (lock, mode) in parts {
                self.ensure_lock(lock, *mode).expect("checked above");
                let (token, access) = self.grant(lock, id, request_id, None, *mode, events);
                grants.push(GrantedPart {
                    lock: lock.to_string(),
                    token,
                    access,
                });
            }
            return Ok(Reply::GrantedAll {
                session: id,
                grants,
            });
        };
        let (first, mode) = &parts[0];
        if canary::active(Canary::MultiLockPartialGrant)
            && self.grantable_now(first, *mode)
            && self.tokens_left() > 0
        {
            self.ensure_lock(first, *mode).expect("checked above");
            let (token, access) = self.grant(first, id, request_id, None, *mode, events);
            let lock = first.to_string();
            let grants = vec![GrantedPart {
                lock,
                token,
                access,
            }];
            return Ok(Reply::GrantedAll {
                session: id,
                grants,
            });
        }
        if wait == Wait::Try || deadline_ms.is_some_and(|d| d <= self.now_ms) {
            return Err(busy(&self.locks[blocked], blocked));
        }
        let waiters_max = self.limits.waiters_per_lock_max;
        let full = |(lock, _): &&(SharedName, Mode)| {
            (self.locks.get(lock)).is_some_and(|l| l.waiters.len() >= waiters_max as usize)
        };
        if let Some((lock, _)) = parts.iter().find(full) {
            return Err(CoreError::TooManyWaiters {
                lock: lock.to_string(),
                waiters_max,
            });
        }
        // One waiter in every queue, in this one step: queue order across locks follows the
        // log's order, so the earliest group is first in each queue it waits in, and no cycle
        // of groups waiting for each other can form.
        for (i, (lock, mode)) in parts.iter().enumerate() {
            self.ensure_lock(lock, *mode).expect("checked above");
            let next = Arc::clone(&parts[(i + 1) % parts.len()].0);
            let waiter = Waiter {
                session: id,
                request_id,
                deadline_ms,
                value: None,
                mode: *mode,
                group: Some(GroupLink {
                    next,
                    first: i == 0,
                }),
            };
            lock_mut(&mut self.locks, lock)
                .expect("the lock exists")
                .waiters
                .push_back(waiter);
            if let Some(deadline) = deadline_ms {
                self.wait_deadlines.insert((deadline, id, Arc::clone(lock)));
            }
            let session = self.sessions.get_mut(&id).expect("session checked above");
            session.waiting.insert(Arc::clone(lock));
        }
        Ok(Reply::QueuedAll { session: id })
    }

    /// Whether an acquire of `lock` in `mode` would be granted now, tokens aside: the name is
    /// free, or out of lock-delay with nobody queued and admitting `mode`.
    fn grantable_now(&self, lock: &str, mode: Mode) -> bool {
        self.locks
            .get(lock)
            .is_none_or(|l| l.available_at_ms.is_none() && l.waiters.is_empty() && l.admits(mode))
    }

    /// How many tokens the counter can still give.
    fn tokens_left(&self) -> u64 {
        (self.limits.token_max.get()).saturating_sub(self.last_token.get())
    }

    /// The locks of the group in which session `id` waits for `lock`, first part first; `None`
    /// if it waits there alone (or not at all).
    fn group_of(&self, id: SessionId, lock: &str) -> Option<Vec<SharedName>> {
        match self.group_ring(id, lock) {
            Ok(group) => group,
            Err(broken) => panic!("{broken}"),
        }
    }

    /// [`Self::group_of`], or what is wrong with the ring: a part missing from its queue, or
    /// waiting with another request id or deadline, or a ring that does not close, or that has
    /// not exactly one first part.
    fn group_ring(&self, id: SessionId, lock: &str) -> Result<Option<Vec<SharedName>>, String> {
        let waiter_in = |lock: &str| {
            let (name, l) = self.locks.get_key_value(lock)?;
            Some((Arc::clone(name), l.waiters.get(id)?))
        };
        let Some((name, start)) = waiter_in(lock) else {
            return Ok(None);
        };
        let Some(link) = &start.group else {
            return Ok(None);
        };
        let broken = |what: &str| Err(format!("session {id}'s group waiting for {lock:?} {what}"));
        let mut ring = vec![name];
        let mut first = link.first.then_some(0);
        let mut next = Arc::clone(&link.next);
        while *next != *lock {
            let Some((name, w)) = waiter_in(&next) else {
                return broken(&format!("is missing from the queue of {next:?}"));
            };
            let Some(link) = &w.group else {
                return broken(&format!("waits for {next:?} alone"));
            };
            if (w.request_id, w.deadline_ms) != (start.request_id, start.deadline_ms) {
                return broken("has parts of other requests");
            }
            if ring.len() >= crate::MULTI_LOCKS_MAX as usize || ring.contains(&name) {
                return broken("does not close its ring");
            }
            if link.first {
                if first.is_some() {
                    return broken("has two first parts");
                }
                first = Some(ring.len());
            }
            ring.push(name);
            next = Arc::clone(&link.next);
        }
        let Some(first) = first else {
            return broken("has no first part");
        };
        ring.rotate_left(first);
        Ok(Some(ring))
    }

    /// Whether session `id`'s group (its locks, first part first) can be granted now: first in
    /// every queue, every lock out of lock-delay and admitting its part, and the counter able to
    /// pay every token the group draws.
    fn group_ready(&self, id: SessionId, group: &[SharedName]) -> bool {
        let mut draws = 0;
        for lock in group {
            let l = &self.locks[lock];
            let Some(front) = l.waiters.front().filter(|w| w.session == id) else {
                return false;
            };
            if l.available_at_ms.is_some() || !l.admits(front.mode) {
                return false;
            }
            draws += u64::from(l.draws_token(front.mode));
        }
        draws <= self.tokens_left()
    }

    /// Grants every part of session `id`'s ready group (first part first), in this one step.
    fn grant_group(&mut self, id: SessionId, group: &[SharedName], events: &mut Vec<Event>) {
        let mut grants = Vec::with_capacity(group.len());
        for lock in group {
            let l = lock_mut(&mut self.locks, lock).expect("a group's lock exists");
            let waiter = l.waiters.remove(id).expect("the group waits here");
            if let Some(deadline) = waiter.deadline_ms {
                self.wait_deadlines
                    .remove(&(deadline, id, Arc::clone(lock)));
            }
            let (token, access) =
                self.grant(lock, id, waiter.request_id, None, waiter.mode, events);
            let granted = Ok(Reply::granted(lock.to_string(), id, token, access));
            let session = self.sessions.get_mut(&id).expect("waiter session exists");
            update_remembered(session, RequestKind::Acquire, lock, &granted);
            grants.push(GrantedPart {
                lock: lock.to_string(),
                token,
                access,
            });
        }
        let granted = Ok(Reply::GrantedAll {
            session: id,
            grants,
        });
        let session = self.sessions.get_mut(&id).expect("waiter session exists");
        let key = multi_lock_key(group.iter().map(AsRef::as_ref));
        update_remembered(session, RequestKind::AcquireAll, &key, &granted);
    }

    /// Takes session `id`'s group (its locks, first part first) out of every queue, and settles
    /// each of its locks.
    fn withdraw_group(
        &mut self,
        id: SessionId,
        group: &[SharedName],
        cause: WaitEndCause,
        events: &mut Vec<Event>,
    ) {
        for lock in group {
            self.remove_waiter(id, lock, cause, events);
        }
        let ended = Err(CoreError::WaitEnded {
            lock: group[0].to_string(),
        });
        let session = self.sessions.get_mut(&id).expect("waiting session exists");
        let key = multi_lock_key(group.iter().map(AsRef::as_ref));
        update_remembered(session, RequestKind::AcquireAll, &key, &ended);
        for lock in group {
            self.settle(lock, events);
        }
    }

    fn wait_deadline(&self, wait: Wait) -> Result<Option<TimeMs>, CoreError> {
        match wait {
            Wait::ForMs(ms) if ms > limits::WAIT_MS_MAX => Err(CoreError::WaitOutOfRange {
                wait_ms: ms,
                wait_ms_max: limits::WAIT_MS_MAX,
            }),
            Wait::ForMs(ms) => Ok(Some(self.now_ms.saturating_add(ms))),
            Wait::Try | Wait::Forever => Ok(None),
        }
    }

    /// `lock` from a command, refused unless it is a lock name within this table's configured
    /// limit. Commands carry a plain string: a log may hold a name an older version refused
    /// here, and replaying it must refuse it again, not fail to read the entry.
    fn checked_name(&self, lock: String) -> Result<String, CoreError> {
        LockName::with_limit(lock, self.limits.lock_name_bytes_max)
            .map(LockName::into_string)
            .map_err(CoreError::InvalidLockName)
    }

    /// The name `lock` as the table keeps it: the live lock's own, so that whatever else names
    /// the lock shares its one allocation, or a new one for a lock the table does not know.
    fn shared_name(&self, lock: String) -> SharedName {
        match self.locks.get_key_value(lock.as_str()) {
            Some((name, _)) => Arc::clone(name),
            None => lock.into(),
        }
    }

    /// Makes sure `lock` exists as the kind `mode` asks for, creating it (with the last token it
    /// had before it was forgotten, if it is still remembered) within the limit on locks. A name
    /// in use as a semaphore takes only permits of its size; a name in use as a lock, none.
    fn ensure_lock(&mut self, lock: &SharedName, mode: Mode) -> Result<(), CoreError> {
        if let Some(l) = self.locks.get(lock) {
            if l.permits != mode.permits() {
                return Err(CoreError::PermitsMismatch {
                    lock: lock.to_string(),
                    permits: l.permits.unwrap_or(0),
                    requested: mode.permits().unwrap_or(0),
                });
            }
            return Ok(());
        }
        if self.locks.len() >= self.limits.locks_max as usize {
            return Err(CoreError::TooManyLocks {
                locks_max: self.limits.locks_max,
            });
        }
        let remembered = self.unforget(lock);
        self.locks.insert(
            Arc::clone(lock),
            Arc::new(Lock {
                holder: None,
                sharers: OrdMap::new(),
                permits: mode.permits(),
                waiters: Waiters::default(),
                last_token: remembered.unwrap_or(Token::ZERO),
                available_at_ms: None,
            }),
        );
        Ok(())
    }

    /// Grants a lock that admits `mode` now, unless it needs a token and they are used up.
    fn grant_free(
        &mut self,
        lock: &SharedName,
        id: SessionId,
        request_id: RequestId,
        value: Option<GrantValue>,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        if self.locks[lock].draws_token(mode) && self.last_token >= self.limits.token_max {
            self.forget_if_idle(lock);
            return Err(CoreError::TokensExhausted {
                lock: lock.to_string(),
            });
        }
        let (token, access) = self.grant(lock, id, request_id, value, mode, events);
        Ok(Reply::granted(lock.to_string(), id, token, access))
    }

    /// Queues `id` behind the lock's holder, within the limit on waiters.
    fn enqueue(
        &mut self,
        id: SessionId,
        lock: &SharedName,
        request_id: RequestId,
        deadline_ms: Option<TimeMs>,
        value: Option<GrantValue>,
        mode: Mode,
    ) -> Result<Reply, CoreError> {
        let waiters_max = self.limits.waiters_per_lock_max;
        let l = lock_mut(&mut self.locks, lock).expect("the lock exists");
        if l.waiters.len() >= waiters_max as usize {
            return Err(CoreError::TooManyWaiters {
                lock: lock.to_string(),
                waiters_max,
            });
        }
        l.waiters.push_back(Waiter {
            session: id,
            request_id,
            deadline_ms,
            value,
            mode,
            group: None,
        });
        let position = queue_position(l.waiters.len() - 1);
        if let Some(deadline) = deadline_ms {
            self.wait_deadlines.insert((deadline, id, Arc::clone(lock)));
        }
        let session = self.sessions.get_mut(&id).expect("session checked above");
        session.waiting.insert(Arc::clone(lock));
        Ok(Reply::Queued {
            lock: lock.to_string(),
            session: id,
            position,
        })
    }

    fn release(
        &mut self,
        id: SessionId,
        lock: String,
        request_id: RequestId,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let session = self
            .sessions
            .get(&id)
            .ok_or(CoreError::SessionNotFound { session: id })?;
        let lock = self.checked_name(lock)?;
        if let Some(earlier) = remembered(session, request_id, RequestKind::Release, &lock)? {
            return earlier;
        }
        let lock = self.shared_name(lock);
        let result = if session.held.contains(&lock) {
            let token = self.free(&lock, id, ReleaseCause::Released, events);
            self.settle(&lock, events);
            Ok(Reply::Released {
                lock: lock.to_string(),
                session: id,
                token: Some(token),
            })
        } else if session.waiting.contains(&lock) {
            // A wait for one lock of a multi-lock withdraws the whole group: a group waits for
            // all of its locks or none.
            match self.group_of(id, &lock) {
                Some(group) => self.withdraw_group(id, &group, WaitEndCause::Withdrawn, events),
                None => {
                    self.remove_waiter(id, &lock, WaitEndCause::Withdrawn, events);
                    self.settle(&lock, events);
                }
            }
            Ok(Reply::Released {
                lock: lock.to_string(),
                session: id,
                token: None,
            })
        } else {
            let holder_session = self
                .locks
                .get(&lock)
                .and_then(|l| l.some_holder())
                .map(|g| g.session);
            Err(CoreError::NotHolder {
                lock: lock.to_string(),
                session: id,
                holder_session,
            })
        };
        self.remember(id, request_id, RequestKind::Release, lock, &result);
        result
    }

    /// A [`Command::ReleaseThenAcquire`]: `release` (its name and request id) as
    /// [`Command::Release`], then, unless that was refused, `acquire` as [`Command::Acquire`].
    fn release_then_acquire(
        &mut self,
        id: SessionId,
        (release, release_request_id): (String, RequestId),
        acquire: AcquireArgs,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        if release_request_id == acquire.request_id {
            return Err(CoreError::RequestIdConflict {
                request_id: acquire.request_id,
            });
        }
        let session = self
            .sessions
            .get(&id)
            .ok_or(CoreError::SessionNotFound { session: id })?;
        let release = self.checked_name(release)?;
        let lock = self.checked_name(acquire.lock)?;
        // A retry: the acquire answered already, so the release did too. Releasing again
        // would give up the very grant the first attempt took (a handoff to the same lock).
        if let Some(earlier) = remembered(session, acquire.request_id, RequestKind::Acquire, &lock)?
        {
            let released =
                match remembered(session, release_request_id, RequestKind::Release, &release) {
                    Ok(Some(Ok(Reply::Released { token, .. }))) => token,
                    _ => None,
                };
            return earlier.map(|acquired| Reply::ReleasedThenAcquired {
                released,
                acquired: Box::new(acquired),
            });
        }
        let released = match self.release(id, release, release_request_id, events)? {
            Reply::Released { token, .. } => token,
            other => unreachable!("a release answered {other:?}"),
        };
        let acquired = self.acquire(
            id,
            lock,
            acquire.request_id,
            acquire.wait,
            acquire.value,
            acquire.mode,
            events,
        )?;
        Ok(Reply::ReleasedThenAcquired {
            released,
            acquired: Box::new(acquired),
        })
    }

    /// Replaces the value of `id`'s grant `token` of `lock`, if that is the lock's holding.
    fn set_value(
        &mut self,
        id: SessionId,
        lock: String,
        token: Token,
        value: Option<GrantValue>,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        if !self.sessions.contains_key(&id) {
            return Err(CoreError::SessionNotFound { session: id });
        }
        let lock = self.checked_name(lock)?;
        let Some(l) = lock_mut(&mut self.locks, &lock) else {
            return Err(CoreError::NotHolder {
                holder_session: None,
                lock,
                session: id,
            });
        };
        let holding = l.grant_of(id).is_some_and(|g| g.token == token);
        if !holding {
            return Err(CoreError::NotHolder {
                holder_session: l.some_holder().map(|g| g.session),
                lock,
                session: id,
            });
        }
        let grant = match l.holder.as_mut().filter(|g| g.session == id) {
            Some(grant) => grant,
            None => l.sharers.get_mut(&id).expect("the session's grant"),
        };
        grant.value = value.clone();
        events.push(Event::ValueSet {
            lock: lock.clone(),
            session: id,
            token,
            value,
        });
        Ok(Reply::ValueSet {
            lock,
            session: id,
            token,
        })
    }

    /// Grants `lock` to `id` in `mode`, which the lock admits: exclusive and a permit with the
    /// next token (a permit in the lowest free slot), shared with the current phase's token, or
    /// the next token if it opens a phase.
    fn grant(
        &mut self,
        lock: &SharedName,
        id: SessionId,
        request_id: RequestId,
        value: Option<GrantValue>,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> (Token, Access) {
        let l = lock_mut(&mut self.locks, lock).expect("granted lock exists");
        assert!(
            l.admits(mode) && l.available_at_ms.is_none(),
            "grant of a lock that does not admit it"
        );
        let phase = match mode {
            Mode::Shared => l.sharers.values().next().map(|g| g.token),
            _ => None,
        };
        let token = match phase {
            Some(token) => token,
            None => {
                assert!(
                    self.last_token < self.limits.token_max,
                    "grant past the token limit"
                );
                let token = self.last_token.next();
                // Invariant 1, where the token is produced: above every token this lock ever had.
                assert!(
                    token > l.last_token && token > self.last_token,
                    "token did not increase"
                );
                self.last_token = token;
                l.last_token = token;
                token
            }
        };
        let access = match mode {
            Mode::Exclusive => Access::Exclusive,
            Mode::Shared => Access::Shared,
            Mode::Permit(_) => Access::Slot(l.free_slot()),
        };
        let grant = Grant {
            session: id,
            token,
            granted_at_ms: self.now_ms,
            request_id,
            value: value.clone(),
            access,
        };
        if access.is_exclusive() {
            l.holder = Some(grant);
        } else {
            l.sharers.insert(id, grant);
        }
        let session = self.sessions.get_mut(&id).expect("grantee session exists");
        session.waiting.remove(lock);
        session.held.insert(Arc::clone(lock));
        events.push(Event::Granted {
            lock: lock.to_string(),
            session: id,
            token,
            request_id,
            value,
            access,
        });
        (token, access)
    }

    /// Takes `lock` away from its holder `id`; lock-delay starts if the session expired.
    fn free(
        &mut self,
        lock: &SharedName,
        id: SessionId,
        cause: ReleaseCause,
        events: &mut Vec<Event>,
    ) -> Token {
        let l = lock_mut(&mut self.locks, lock).expect("held lock exists");
        let grant = match l.holder.take_if(|g| g.session == id) {
            Some(grant) => grant,
            None => l
                .sharers
                .remove(&id)
                .expect("lock freed by a session that does not hold it"),
        };
        if cause == ReleaseCause::SessionExpired && !self.limits.lock_delay_ms.is_zero() {
            let until = self.now_ms.saturating_add(self.limits.lock_delay_ms);
            // A name of several holders (readers, permits) may already sit out the delay of an
            // earlier expiry: the later one replaces it, or that deadline would end it early.
            if let Some(earlier) = l.available_at_ms.replace(until) {
                self.delay_deadlines.remove(&(earlier, Arc::clone(lock)));
            }
            self.delay_deadlines.insert((until, Arc::clone(lock)));
        }
        if let Some(session) = self.sessions.get_mut(&id) {
            session.held.remove(lock);
        }
        events.push(Event::Released {
            lock: lock.to_string(),
            session: id,
            token: grant.token,
            cause,
        });
        grant.token
    }

    fn remove_waiter(
        &mut self,
        id: SessionId,
        lock: &SharedName,
        cause: WaitEndCause,
        events: &mut Vec<Event>,
    ) {
        let l = lock_mut(&mut self.locks, lock).expect("waited-for lock exists");
        let waiter = l.waiters.remove(id).expect("waiter is queued");
        if let Some(deadline) = waiter.deadline_ms {
            self.wait_deadlines
                .remove(&(deadline, id, Arc::clone(lock)));
        }
        let session = self.sessions.get_mut(&id).expect("waiting session exists");
        session.waiting.remove(lock);
        let ended = Err(CoreError::WaitEnded {
            lock: lock.to_string(),
        });
        update_remembered(session, RequestKind::Acquire, lock, &ended);
        events.push(Event::WaitEnded {
            lock: lock.to_string(),
            session: id,
            request_id: waiter.request_id,
            cause,
        });
    }

    /// After a lock changed: grant it to the first waiter if it is free, or forget it if idle.
    ///
    /// The first waiter is granted only while its session's lease and its wait are still running
    /// at `now`. When time jumps past several deadlines in one input, [`Self::pass_time`] ends
    /// them one at a time; a waiter whose own lease or deadline has also passed is about to be
    /// removed by a later step of that same pass (which settles the lock again), and must not be
    /// granted in between (invariant 7; etcd#11456).
    ///
    /// A multi-lock's group at the front is granted only when it is first in every one of its
    /// queues and each of its locks admits its part; until then it blocks the queue it heads
    /// (strict FIFO: nobody overtakes it, so it cannot starve). Granting it changes its other
    /// locks, which are settled in turn (in the order of its parts, after this one), and so on:
    /// a work list, not recursion, however long the chain of groups.
    fn settle(&mut self, lock: &SharedName, events: &mut Vec<Event>) {
        let mut changed = VecDeque::from([Arc::clone(lock)]);
        while let Some(lock) = changed.pop_front() {
            self.settle_one(&lock, &mut changed, events);
        }
    }

    /// [`Self::settle`] for one lock: adds the other locks of each group it grants to `changed`.
    fn settle_one(
        &mut self,
        lock: &SharedName,
        changed: &mut VecDeque<SharedName>,
        events: &mut Vec<Event>,
    ) {
        let now = self.now_ms;
        // Waiters are granted first in line first while the lock admits them: one writer, the
        // readers up to the next writer (who stops readers joining behind it), or permits while
        // slots are free.
        while let Some(l) = self.locks.get(lock)
            && l.available_at_ms.is_none()
        {
            let live = |w: &&Waiter| {
                self.sessions[&w.session].expires_at_ms > now
                    && w.deadline_ms.is_none_or(|d| d > now)
            };
            if let Some(front) = l.waiters.front().filter(live)
                && front.group.is_some()
            {
                let id = front.session;
                let group = self.group_of(id, lock).expect("a group waits here");
                if !self.group_ready(id, &group) {
                    break;
                }
                self.grant_group(id, &group, events);
                changed.extend(group.into_iter().filter(|other| *other != *lock));
                continue;
            }
            let Some(next) = l
                .waiters
                .front()
                .filter(live)
                .filter(|w| l.admits(w.mode))
                .filter(|w| !l.draws_token(w.mode) || self.last_token < self.limits.token_max)
                .cloned()
            else {
                break;
            };
            if let Some(deadline) = next.deadline_ms {
                self.wait_deadlines
                    .remove(&(deadline, next.session, Arc::clone(lock)));
            }
            lock_mut(&mut self.locks, lock)
                .expect("lock exists")
                .waiters
                .remove(next.session);
            let (token, access) = self.grant(
                lock,
                next.session,
                next.request_id,
                next.value,
                next.mode,
                events,
            );
            let granted = Ok(Reply::granted(
                lock.to_string(),
                next.session,
                token,
                access,
            ));
            let session = self
                .sessions
                .get_mut(&next.session)
                .expect("waiter session exists");
            update_remembered(session, RequestKind::Acquire, lock, &granted);
        }
        self.forget_if_idle(lock);
    }

    /// A free lock with no waiters is forgotten; the shared token counter keeps its tokens safe.
    fn forget_if_idle(&mut self, lock: &str) {
        if !self.locks.get(lock).is_some_and(|l| l.is_idle()) {
            return;
        }
        let (name, forgotten) = self.locks.remove_with_key(lock).expect("checked above");
        if forgotten.last_token == Token::ZERO {
            return;
        }
        self.unforget(lock);
        self.last_forgotten += 1;
        self.forgotten.insert(
            Arc::clone(&name),
            (self.last_forgotten, forgotten.last_token),
        );
        self.forgotten_order.insert(self.last_forgotten, name);
        if self.forgotten.len() > limits::FORGOTTEN_LOCKS_REMEMBERED_MAX {
            let (order, _) = self.forgotten_order.get_min().cloned().expect("not empty");
            let oldest = self
                .forgotten_order
                .remove(&order)
                .expect("the oldest is there");
            self.forgotten.remove(&oldest);
        }
    }

    /// Drops `lock` from the memory of forgotten locks, returning its last token.
    fn unforget(&mut self, lock: &str) -> Option<Token> {
        let (order, token) = self.forgotten.remove(lock)?;
        self.forgotten_order.remove(&order);
        Some(token)
    }

    /// The last token granted for `lock`: from the lock if it exists, else from the memory of
    /// recently forgotten locks; `None` if neither knows (never granted, or forgotten long ago).
    pub fn last_token_of(&self, lock: &str) -> Option<Token> {
        match self.locks.get(lock) {
            Some(l) => Some(l.last_token).filter(|t| *t > Token::ZERO),
            None => self.forgotten.get(lock).map(|(_, token)| *token),
        }
    }

    fn remember(
        &mut self,
        id: SessionId,
        request_id: RequestId,
        kind: RequestKind,
        lock: SharedName,
        result: &Result<Reply, CoreError>,
    ) {
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        if session.recent.len() >= limits::REQUEST_IDS_PER_SESSION_MAX {
            session.recent.pop_front();
        }
        session.recent.push_back(Remembered {
            request_id,
            kind,
            lock,
            result: result.clone(),
        });
    }

    // ----- reads -----

    /// The state of one lock, or `None` if it is free and nobody waits for it.
    pub fn lock_status(&self, lock: &str) -> Option<LockStatus> {
        self.locks.get(lock).map(|l| self.status_of(lock, l))
    }

    /// The current holding of `lock`, if any, without copying its queue.
    pub fn holder(&self, lock: &str) -> Option<Grant> {
        self.locks.get(lock).and_then(|l| l.holder.clone())
    }

    /// The first reader or permit holder of `lock` (in session order), without copying the rest.
    pub fn first_sharer(&self, lock: &str) -> Option<Grant> {
        self.locks
            .get(lock)
            .and_then(|l| l.sharers.values().next().cloned())
    }

    /// How many sessions wait for `lock` (0 if the table does not know it). Costs the same
    /// however long the queue is: a watcher's count must not copy a queue of up to
    /// `waiters_per_lock_max` sessions.
    pub fn waiter_count(&self, lock: &str) -> usize {
        self.locks.get(lock).map_or(0, |l| l.waiters.len())
    }

    /// Locks whose names start with `prefix`, in name order, after `start_after`, at most `limit`.
    pub fn locks(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Vec<LockStatus> {
        use std::ops::Bound;
        let start = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.locks
            .range::<_, str>((start, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .take(limit)
            .map(|(name, l)| self.status_of(name, l))
            .collect()
    }

    fn status_of(&self, name: &str, l: &Lock) -> LockStatus {
        LockStatus {
            lock: name.to_string(),
            holder: l.holder.clone(),
            sharers: l.sharers.values().cloned().collect(),
            permits: l.permits,
            sharers_expire_at_ms: (l.sharers.keys())
                .map(|id| self.sessions[id].expires_at_ms)
                .collect(),
            last_token: l.last_token,
            waiters: l.waiters.iter().map(|w| w.session).collect(),
            waiter_modes: l.waiters.iter().map(|w| w.mode).collect(),
            holder_expires_at_ms: l
                .holder
                .as_ref()
                .map(|g| self.sessions[&g.session].expires_at_ms),
            available_at_ms: l.available_at_ms,
        }
    }

    /// What the session `id` was opened with to prove its owner: `None` if there is no such
    /// session, `Some(None)` for a session opened before session secrets (acted for by its id
    /// alone, as then, until it ends), else the digest of its secret.
    pub fn session_secret_digest(&self, id: SessionId) -> Option<Option<SecretDigest>> {
        self.sessions.get(&id).map(|s| s.secret_digest)
    }

    pub fn session_status(&self, id: SessionId) -> Option<SessionStatus> {
        self.sessions.get(&id).map(|s| SessionStatus {
            session: id,
            ttl_ms: s.ttl_ms,
            expires_at_ms: s.expires_at_ms,
            held: s.held.iter().map(|name| name.to_string()).collect(),
            waiting: s.waiting.iter().map(|name| name.to_string()).collect(),
        })
    }

    /// Checks the groups of multi-locks: every group waiter is in one whole ring (see
    /// [`Self::group_ring`]) whose parts carry no value, and no group that could be granted
    /// (first in all its queues, every lock admitting it) is left waiting.
    fn check_groups(&self) -> Result<(), String> {
        let (mut members, mut in_rings) = (0, 0);
        for (name, l) in &self.locks {
            for w in l.waiters.iter().filter(|w| w.group.is_some()) {
                members += 1;
                if w.value.is_some() {
                    return Err(format!(
                        "a part of a multi-lock carries a value in {name:?}"
                    ));
                }
                if w.group.as_ref().is_some_and(|link| link.first) {
                    let group = self.group_ring(w.session, name)?.expect("a group waiter");
                    in_rings += group.len();
                    if self.group_ready(w.session, &group) {
                        return Err(format!(
                            "session {}'s multi-lock of {name:?} could be granted but waits",
                            w.session
                        ));
                    }
                }
            }
        }
        if members != in_rings {
            return Err("a part of a multi-lock is in no group with a first part".into());
        }
        Ok(())
    }

    /// Checks every cross-reference of the table. Called after each input in debug builds and
    /// by the property tests; panics on the first inconsistency.
    pub fn check_consistency(&self) {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
    }

    /// Checks a table that came from outside this process (a snapshot file, a snapshot sent by
    /// a leader): its limits are within their ceilings and every cross-reference holds.
    /// Deserialising bypasses [`LockTable::new`], so a loaded table is trusted only after this.
    pub fn validate(&self) -> Result<(), InvalidTable> {
        self.limits.validate().map_err(InvalidTable::Limits)?;
        let inconsistent = |what: &str| Err(InvalidTable::Inconsistent(what.to_owned()));
        macro_rules! ensure {
            ($condition:expr, $($what:tt)+) => {
                if !$condition {
                    return inconsistent(&format!($($what)+));
                }
            };
        }
        self.check_groups().map_err(InvalidTable::Inconsistent)?;
        for (name, l) in &self.locks {
            ensure!(!l.is_idle(), "idle lock {name:?} was not forgotten");
            if let Err(what) = l.check_holders(name) {
                return Err(InvalidTable::Inconsistent(what));
            }
            ensure!(
                l.last_token <= self.last_token,
                "lock {name:?} has token {} above the counter {}",
                l.last_token,
                self.last_token
            );
            for g in l.holder.iter().chain(l.sharers.values()) {
                ensure!(
                    self.sessions
                        .get(&g.session)
                        .is_some_and(|s| s.held.contains(name)),
                    "holder of {name:?} does not know it holds"
                );
            }
            for w in l.waiters.iter() {
                ensure!(
                    self.sessions
                        .get(&w.session)
                        .is_some_and(|s| s.waiting.contains(name)),
                    "waiter of {name:?} does not know it waits"
                );
                ensure!(
                    l.grant_of(w.session).is_none(),
                    "holder of {name:?} also waits"
                );
            }
        }
        for (id, s) in &self.sessions {
            ensure!(
                self.session_deadlines.contains(&(s.expires_at_ms, *id)),
                "session {id} has no deadline"
            );
            for name in &s.held {
                ensure!(
                    self.locks
                        .get(name)
                        .is_some_and(|l| l.grant_of(*id).is_some()),
                    "session {id} believes it holds {name:?}"
                );
            }
            for name in &s.waiting {
                ensure!(
                    self.locks
                        .get(name)
                        .is_some_and(|l| l.waiters.iter().any(|w| w.session == *id)),
                    "session {id} believes it waits for {name:?}"
                );
            }
        }
        ensure!(
            self.forgotten.len() == self.forgotten_order.len(),
            "forgotten index out of step"
        );
        ensure!(
            self.forgotten
                .iter()
                .all(|(name, (_, token))| !self.locks.contains_key(name)
                    && *token <= self.last_token),
            "a forgotten lock is live, or remembers a token above the counter"
        );
        ensure!(
            self.session_deadlines.len() == self.sessions.len(),
            "stale session deadlines"
        );
        for (request_id, id) in &self.open_requests {
            ensure!(
                self.sessions.get(id).and_then(|s| s.open_request_id) == Some(*request_id),
                "stale open request id {request_id}"
            );
        }
        for (key, id) in &self.open_keys {
            ensure!(
                self.sessions.get(id).and_then(|s| s.open_key.as_ref()) == Some(key),
                "stale open key of session {id}"
            );
        }
        let opened_by_request_id = self
            .sessions
            .values()
            .filter(|s| s.open_request_id.is_some());
        let opened_by_key = self.sessions.values().filter(|s| s.open_key.is_some());
        ensure!(
            (opened_by_request_id.count(), opened_by_key.count())
                == (self.open_requests.len(), self.open_keys.len()),
            "a session's open request id or key is not indexed"
        );
        for (owner, owned) in &self.owners {
            ensure!(
                !owned.is_empty(),
                "owner {owner} is indexed without sessions"
            );
            for id in owned {
                ensure!(
                    self.sessions
                        .get(id)
                        .is_some_and(|s| s.owner.as_ref() == Some(owner)),
                    "session {id} is indexed under owner {owner} but not owned by it"
                );
            }
        }
        let owned = self.sessions.values().filter(|s| s.owner.is_some()).count();
        ensure!(
            owned == self.owners.values().map(OrdSet::len).sum::<usize>(),
            "an owned session is not indexed under its owner"
        );
        Ok(())
    }
}

/// Why a table from a snapshot was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidTable {
    #[error("its limits are invalid: {0}")]
    Limits(String),
    #[error("it is inconsistent: {0}")]
    Inconsistent(String),
}

/// Refused unless a permit's semaphore size is in range.
fn permits_in_range(mode: Mode) -> Result<(), CoreError> {
    match mode {
        Mode::Permit(permits) if !(1..=crate::PERMITS_MAX).contains(&permits) => {
            Err(CoreError::PermitsOutOfRange {
                permits,
                permits_max: crate::PERMITS_MAX,
            })
        }
        _ => Ok(()),
    }
}

/// The refusal of an acquire of `lock` that cannot be granted now and may not wait.
fn busy(l: &Lock, lock: &str) -> CoreError {
    let holder = l.some_holder();
    CoreError::Busy {
        lock: lock.to_string(),
        holder_session: holder.map(|g| g.session),
        holder_token: holder.map(|g| g.token),
        available_at_ms: l.available_at_ms,
    }
}

/// A place in a lock's queue, as a reply carries it.
fn queue_position(index: usize) -> u32 {
    u32::try_from(index).expect("a queue is never longer than waiters_per_lock_max, a u32")
}

/// The reply to an acquire by a session that already holds `lock` or waits for it: the same
/// grant, or its place in line; refused if it holds or waits in the other mode (the lock's
/// kind, and so a permit's size, was checked before).
fn already_there(
    l: &Lock,
    id: SessionId,
    lock: &str,
    mode: Mode,
) -> Option<Result<Reply, CoreError>> {
    let conflict = |held_shared: bool| CoreError::ModeConflict {
        lock: lock.to_string(),
        session: id,
        held_shared,
    };
    if let Some(grant) = l.grant_of(id) {
        let held_shared = grant.access == Access::Shared;
        if held_shared != (mode == Mode::Shared) {
            return Some(Err(conflict(held_shared)));
        }
        return Some(Ok(Reply::granted(
            lock.to_string(),
            id,
            grant.token,
            grant.access,
        )));
    }
    let index = l.waiters.iter().position(|w| w.session == id)?;
    let waiter = l.waiters.iter().nth(index).expect("found above");
    let held_shared = waiter.mode == Mode::Shared;
    if held_shared != (mode == Mode::Shared) {
        return Some(Err(conflict(held_shared)));
    }
    Some(Ok(Reply::Queued {
        lock: lock.to_string(),
        session: id,
        position: queue_position(index),
    }))
}

/// What a multi-lock's outcome is remembered under: its names in order, each ended by a
/// newline, which no lock name contains. So a request id reused for a multi-lock of other
/// names, or of the same names in another order, is a conflict, not a retry; modes and the
/// wait are not compared, as a single acquire's are not.
fn multi_lock_key<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.flat_map(|name| [name, "\n"]).collect()
}

/// The remembered outcome of `request_id`, or an error if the id was used for something else.
fn remembered(
    session: &Session,
    request_id: RequestId,
    kind: RequestKind,
    lock: &str,
) -> Result<Option<Result<Reply, CoreError>>, CoreError> {
    if canary::active(Canary::DropRequestDedup) {
        return Ok(None);
    }
    match session.recent.iter().find(|r| r.request_id == request_id) {
        None => Ok(None),
        Some(r) if r.kind == kind && *r.lock == *lock => Ok(Some(r.result.clone())),
        Some(_) => Err(CoreError::RequestIdConflict { request_id }),
    }
}

/// A queued wait for `lock` ended (granted, timed out or withdrawn): a retry must now see that.
///
/// Every remembered acquire of `lock` that answered "queued" belongs to this wait — the one that
/// queued and any repeated acquire while it waited (a new request id answers the current place
/// in line) — because an earlier wait of the same session was resolved the same way when it
/// ended. Updating only the request id that queued would leave a retry of a repeated acquire
/// answering "queued" for a lock the session already holds, or no longer waits for (invariant 8).
///
/// A multi-lock's wait (`kind` [`RequestKind::AcquireAll`], `lock` its [`multi_lock_key`]) is
/// answered "queued" once: a repeat while it waits is refused (the session waits for its
/// locks already), so the one remembered "queued" is the group's own.
fn update_remembered(
    session: &mut Session,
    kind: RequestKind,
    lock: &str,
    result: &Result<Reply, CoreError>,
) {
    for r in session.recent.iter_mut().filter(|r| {
        r.kind == kind
            && *r.lock == *lock
            && matches!(r.result, Ok(Reply::Queued { .. } | Reply::QueuedAll { .. }))
    }) {
        r.result = result.clone();
    }
}
