//! The lock table against a deliberately simple reference model, under random command sequences.
//!
//! [`Model`] is written from the semantics of the lock table (the invariants of ARCHITECTURE.md:
//! 1 monotonic tokens, 6 leases are minimums, 7 FIFO waiters, 8 ownership and retries, 10 bad
//! input), not from its code: plain `Vec`s, linear searches, no deadline indexes, no
//! cross-referenced sets. Every step compares the table's reply and events with the model's and
//! the visible state of every lock and session. Independently of the model, a [`Checker`]
//! watches the observable history for the invariants themselves: tokens strictly increase per
//! lock, waiters are granted in the order they queued, no session is granted after its lease or
//! wait ran out or after it ended, retries do not act twice, lock-delay is honoured after an
//! expiry, leases are never shortened, limits hold. Random snapshot/restore (a round trip of the
//! table through JSON or through its compact postcard image) in the middle of a sequence models
//! a restart. Grants carry values, which
//! only their current holding's session and token may replace.
//!
//! Acquires come in every mode (issue 32): "a" and "b" are read-write locks, "c" and "d/e"
//! mostly semaphores of 3 and of 1, each name sometimes asked as the other kind or another size.
//! The model keeps a lock's holdings in one `Vec` (exclusive, shared or a slot) and grants from
//! the front of the queue while the name admits the front waiter. The checker adds: never more
//! than `N` live permits, one holder per slot, a slot's tokens increase; the readers of a phase
//! share its token, beside no writer; no reader is granted while a writer holds or waits ahead
//! of it (FIFO); a grant's access is what its acquire asked for.
//!
//! `PROPTEST_CASES` overrides the number of sequences (2000 by default).

use std::collections::{BTreeMap, BTreeSet};

use palisade_core::limits::{LockNameError, REQUEST_IDS_PER_SESSION_MAX, TOKEN_MAX, WAIT_MS_MAX};
use palisade_core::{
    Access, AcquirePart, Command, CoreError, DurationMs, Event, GrantValue, GrantedPart, Input,
    Limits, LockTable, MULTI_LOCKS_MAX, Mode, OpenKey, Output, PERMITS_MAX, ReleaseCause, Reply,
    RequestId, SessionId, TableImage, TimeMs, Token, Wait, WaitEndCause,
};
use proptest::prelude::*;

/// `span` after `at`. The model's times stay far from the end of time, so it never saturates.
fn after(at: TimeMs, span: DurationMs) -> TimeMs {
    at.checked_add(span).expect("model times stay small")
}

// ---------------------------------------------------------------------------------------------
// The reference model.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MSession {
    id: SessionId,
    ttl_ms: DurationMs,
    expires_at_ms: TimeMs,
    /// What opened it, if a retry of that open may find it: an open key, or the request id of
    /// an older version's open (deduplicated across every client).
    opened_by: Option<Opener>,
    /// (request id, kind, lock, outcome), oldest first; a multi-lock under its first lock.
    recent: Vec<(RequestId, Kind, String, Result<Reply, CoreError>)>,
}

/// What a remembered request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Acquire,
    Release,
    AcquireAll,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Opener {
    Key(OpenKey),
    RequestId(RequestId),
}

#[derive(Debug, Clone)]
struct MWaiter {
    session: SessionId,
    request_id: RequestId,
    deadline_ms: Option<TimeMs>,
    value: Option<GrantValue>,
    mode: Mode,
    /// Every lock of the multi-lock this waiter is a part of, in the order of its parts.
    group: Option<Vec<String>>,
}

/// One holding of a lock: the exclusive holder, a reader of the shared phase, or a permit.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MHold {
    session: SessionId,
    token: Token,
    access: Access,
    value: Option<GrantValue>,
}

#[derive(Debug, Clone)]
struct MLock {
    name: String,
    /// A semaphore's size; `None` for a lock.
    permits: Option<u32>,
    /// Every holding, in the order granted.
    holds: Vec<MHold>,
    waiters: Vec<MWaiter>,
    available_at_ms: Option<TimeMs>,
    last_token: Token,
}

#[derive(Debug, Clone)]
struct Model {
    limits: Limits,
    now_ms: TimeMs,
    last_token: Token,
    last_session: SessionId,
    sessions: Vec<MSession>,
    locks: Vec<MLock>,
    /// The last token of each lock that was forgotten: a lock created again starts from it (a
    /// multi-lock may create a lock it only waits for, whose status shows that token).
    forgotten: BTreeMap<String, Token>,
}

/// The key a multi-lock is remembered under: its names in order, each ended by a newline.
fn multi_key(names: impl Iterator<Item = String>) -> String {
    names.map(|name| name + "\n").collect()
}

/// A semaphore's size: 1 to `PERMITS_MAX`.
fn permits_in_range(mode: Mode) -> Result<(), CoreError> {
    match mode {
        Mode::Permit(permits) if !(1..=PERMITS_MAX).contains(&permits) => {
            Err(CoreError::PermitsOutOfRange {
                permits,
                permits_max: PERMITS_MAX,
            })
        }
        _ => Ok(()),
    }
}

/// Lock names: 1..=`bytes_max` bytes, no control characters.
fn validate_name(name: &str, bytes_max: usize) -> Result<(), CoreError> {
    if name.is_empty() {
        return Err(CoreError::InvalidLockName(LockNameError::Empty));
    }
    if name.len() > bytes_max {
        return Err(CoreError::InvalidLockName(LockNameError::TooLong {
            bytes: name.len() as u64,
            bytes_max: bytes_max as u64,
        }));
    }
    if name.chars().any(char::is_control) {
        return Err(CoreError::InvalidLockName(LockNameError::ControlCharacter));
    }
    Ok(())
}

impl Model {
    fn new(limits: Limits) -> Self {
        Model {
            limits,
            now_ms: TimeMs::ZERO,
            last_token: Token::ZERO,
            last_session: SessionId::new(0),
            sessions: Vec::new(),
            locks: Vec::new(),
            forgotten: BTreeMap::new(),
        }
    }

    fn session(&self, id: SessionId) -> Option<&MSession> {
        self.sessions.iter().find(|s| s.id == id)
    }

    fn session_mut(&mut self, id: SessionId) -> Option<&mut MSession> {
        self.sessions.iter_mut().find(|s| s.id == id)
    }

    fn lock(&self, name: &str) -> Option<&MLock> {
        self.locks.iter().find(|l| l.name == name)
    }

    fn lock_mut(&mut self, name: &str) -> Option<&mut MLock> {
        self.locks.iter_mut().find(|l| l.name == name)
    }

    /// Names of locks matching `pred`, in name order.
    fn lock_names(&self, pred: impl Fn(&MLock) -> bool) -> Vec<String> {
        let mut names: Vec<String> = self
            .locks
            .iter()
            .filter(|l| pred(l))
            .map(|l| l.name.clone())
            .collect();
        names.sort();
        names
    }

    fn apply(&mut self, input: Input) -> Output {
        let mut events = Vec::new();
        self.now_ms = self.now_ms.max(input.now_ms);
        self.pass_time(&mut events);
        let result = match input.command {
            Command::OpenSession {
                open_key, ttl_ms, ..
            } => self.open(open_key.map(Opener::Key), ttl_ms),
            Command::OpenSessionByRequestId { request_id, ttl_ms } => {
                self.open(Some(Opener::RequestId(request_id)), ttl_ms)
            }
            Command::KeepAlive { session } => match self.session(session) {
                None => Err(CoreError::SessionNotFound { session }),
                Some(_) => {
                    let now = self.now_ms;
                    let s = self.session_mut(session).unwrap();
                    s.expires_at_ms = after(now, s.ttl_ms);
                    Ok(Reply::KeptAlive {
                        session,
                        expires_at_ms: s.expires_at_ms,
                    })
                }
            },
            Command::CloseSession { session } => match self.session(session) {
                None => Err(CoreError::SessionNotFound { session }),
                Some(_) => {
                    self.end_session(session, false, &mut events);
                    Ok(Reply::SessionClosed { session })
                }
            },
            Command::Acquire {
                session,
                lock,
                request_id,
                wait,
                value,
                mode,
            } => self.deduplicated(
                session,
                request_id,
                Kind::Acquire,
                lock,
                &mut events,
                |m, l, ev| m.acquire(session, l, request_id, wait, value, mode, ev),
            ),
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
            } => self.deduplicated(
                session,
                request_id,
                Kind::Release,
                lock,
                &mut events,
                |m, l, ev| m.release(session, l, ev),
            ),
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
                (lock, request_id, wait, value, mode),
                &mut events,
            ),
            Command::Tick => Ok(Reply::Ticked),
            Command::SetLimits { limits } => {
                self.limits = limits;
                for name in self.lock_names(|l| !l.waiters.is_empty()) {
                    self.settle(&name, &mut events);
                }
                Ok(Reply::LimitsSet)
            }
            Command::LeaderStart => {
                let now = self.now_ms;
                let mut extended = 0;
                for s in &mut self.sessions {
                    if after(now, s.ttl_ms) > s.expires_at_ms {
                        s.expires_at_ms = after(now, s.ttl_ms);
                        extended += 1;
                    }
                }
                Ok(Reply::LeaderStarted {
                    sessions_extended: extended,
                })
            }
            Command::RaiseTokenFloor {
                floor,
                session_floor,
            } => {
                self.last_token = self.last_token.max(floor.min(self.limits.token_max));
                if let Some(session_floor) = session_floor {
                    self.last_session = self.last_session.max(session_floor);
                }
                Ok(Reply::TokenFloorRaised {
                    last_token: self.last_token,
                })
            }
        };
        Output { result, events }
    }

    /// Expired sessions first (in expiry order), then waits past their deadline, then
    /// lock-delays that ended.
    fn pass_time(&mut self, events: &mut Vec<Event>) {
        let now = self.now_ms;
        while let Some(id) = self
            .sessions
            .iter()
            .filter(|s| s.expires_at_ms <= now)
            .min_by_key(|s| (s.expires_at_ms, s.id))
            .map(|s| s.id)
        {
            self.end_session(id, true, events);
        }
        while let Some((_, session, name)) = self
            .locks
            .iter()
            .flat_map(|l| {
                l.waiters.iter().filter_map(|w| {
                    w.deadline_ms
                        .filter(|d| *d <= now)
                        .map(|d| (d, w.session, l.name.clone()))
                })
            })
            .min()
        {
            self.end_wait_or_group(session, &name, WaitEndCause::TimedOut, events);
        }
        while let Some((_, name)) = self
            .locks
            .iter()
            .filter_map(|l| {
                l.available_at_ms
                    .filter(|a| *a <= now)
                    .map(|a| (a, l.name.clone()))
            })
            .min()
        {
            self.lock_mut(&name).unwrap().available_at_ms = None;
            self.settle(&name, events);
        }
    }

    /// A live session opened by the same key (or older version's request id) is returned as it
    /// is; otherwise, and always without a key, a new session opens.
    fn open(&mut self, opened_by: Option<Opener>, ttl_ms: DurationMs) -> Result<Reply, CoreError> {
        if let Some(s) = self
            .sessions
            .iter()
            .find(|s| opened_by.is_some() && s.opened_by == opened_by)
        {
            return Ok(Reply::SessionOpened {
                session: s.id,
                ttl_ms: s.ttl_ms,
                expires_at_ms: s.expires_at_ms,
            });
        }
        let (ttl_ms_min, ttl_ms_max) = (
            self.limits.session_ttl_ms_min,
            self.limits.session_ttl_ms_max,
        );
        if ttl_ms < ttl_ms_min || ttl_ms > ttl_ms_max {
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
        self.last_session = SessionId::new(self.last_session.get() + 1);
        let session = MSession {
            id: self.last_session,
            ttl_ms,
            expires_at_ms: after(self.now_ms, ttl_ms),
            opened_by,
            recent: Vec::new(),
        };
        let reply = Reply::SessionOpened {
            session: session.id,
            ttl_ms,
            expires_at_ms: session.expires_at_ms,
        };
        self.sessions.push(session);
        Ok(reply)
    }

    /// When a wait ends; refused if it is too long.
    fn deadline_of(&self, wait: Wait) -> Result<Option<TimeMs>, CoreError> {
        match wait {
            Wait::ForMs(ms) if ms > WAIT_MS_MAX => Err(CoreError::WaitOutOfRange {
                wait_ms: ms,
                wait_ms_max: WAIT_MS_MAX,
            }),
            Wait::ForMs(ms) => Ok(Some(after(self.now_ms, ms))),
            _ => Ok(None),
        }
    }

    /// Runs `act` once per request id: a retry returns the remembered outcome.
    fn deduplicated(
        &mut self,
        session: SessionId,
        request_id: RequestId,
        kind: Kind,
        lock: String,
        events: &mut Vec<Event>,
        act: impl FnOnce(&mut Model, &str, &mut Vec<Event>) -> Result<Reply, CoreError>,
    ) -> Result<Reply, CoreError> {
        let Some(s) = self.session(session) else {
            return Err(CoreError::SessionNotFound { session });
        };
        if kind != Kind::AcquireAll {
            validate_name(&lock, self.limits.lock_name_bytes_max as usize)?;
        }
        if let Some((_, was, l, outcome)) = s.recent.iter().find(|r| r.0 == request_id) {
            if *was == kind && *l == lock {
                return outcome.clone();
            }
            return Err(CoreError::RequestIdConflict { request_id });
        }
        let outcome = act(self, &lock, events);
        if let Some(s) = self.session_mut(session) {
            if s.recent.len() == REQUEST_IDS_PER_SESSION_MAX {
                let _evicted = s.recent.remove(0);
            }
            s.recent.push((request_id, kind, lock, outcome.clone()));
        }
        outcome
    }

    /// A release, then (unless it was refused) an acquire, each remembered as its own command
    /// would be; a retry (the acquire's id remembered) answers both without releasing again.
    fn release_then_acquire(
        &mut self,
        session: SessionId,
        (release, release_id): (String, RequestId),
        (lock, request_id, wait, value, mode): (String, RequestId, Wait, Option<GrantValue>, Mode),
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        if release_id == request_id {
            return Err(CoreError::RequestIdConflict { request_id });
        }
        let Some(s) = self.session(session) else {
            return Err(CoreError::SessionNotFound { session });
        };
        let max = self.limits.lock_name_bytes_max as usize;
        validate_name(&release, max)?;
        validate_name(&lock, max)?;
        let find = |id: RequestId| s.recent.iter().find(|r| r.0 == id);
        if let Some((_, kind, l, outcome)) = find(request_id) {
            if *kind != Kind::Acquire || *l != lock {
                return Err(CoreError::RequestIdConflict { request_id });
            }
            let released = match find(release_id) {
                Some((_, Kind::Release, l, Ok(Reply::Released { token, .. }))) if *l == release => {
                    *token
                }
                _ => None,
            };
            return outcome.clone().map(|acquired| Reply::ReleasedThenAcquired {
                released,
                acquired: Box::new(acquired),
            });
        }
        let released = match self.deduplicated(
            session,
            release_id,
            Kind::Release,
            release,
            events,
            |m, l, ev| m.release(session, l, ev),
        )? {
            Reply::Released { token, .. } => token,
            other => panic!("a release answered {other:?}"),
        };
        let acquired = self.deduplicated(
            session,
            request_id,
            Kind::Acquire,
            lock,
            events,
            |m, l, ev| m.acquire(session, l, request_id, wait, value, mode, ev),
        )?;
        Ok(Reply::ReleasedThenAcquired {
            released,
            acquired: Box::new(acquired),
        })
    }

    fn set_value(
        &mut self,
        session: SessionId,
        name: String,
        token: Token,
        value: Option<GrantValue>,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        if self.session(session).is_none() {
            return Err(CoreError::SessionNotFound { session });
        }
        validate_name(&name, self.limits.lock_name_bytes_max as usize)?;
        let holding = self
            .lock(&name)
            .and_then(|l| l.hold_of(session))
            .is_some_and(|h| h.token == token);
        if !holding {
            return Err(CoreError::NotHolder {
                holder_session: self.lock(&name).and_then(MLock::some_holder),
                lock: name,
                session,
            });
        }
        let l = self.lock_mut(&name).unwrap();
        l.holds
            .iter_mut()
            .find(|h| h.session == session)
            .unwrap()
            .value = value.clone();
        events.push(Event::ValueSet {
            lock: name.clone(),
            session,
            token,
            value,
        });
        Ok(Reply::ValueSet {
            lock: name,
            session,
            token,
        })
    }

    #[expect(clippy::too_many_arguments, reason = "the fields of Command::Acquire")]
    fn acquire(
        &mut self,
        session: SessionId,
        name: &str,
        request_id: RequestId,
        wait: Wait,
        value: Option<GrantValue>,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let deadline_ms = self.deadline_of(wait)?;
        permits_in_range(mode)?;
        let Some(l) = self.lock(name) else {
            // A name nobody holds, waits for or delays: free, and of the kind this acquire asks.
            if self.locks.len() >= self.limits.locks_max as usize {
                return Err(CoreError::TooManyLocks {
                    locks_max: self.limits.locks_max,
                });
            }
            if self.last_token >= self.limits.token_max {
                return Err(CoreError::TokensExhausted {
                    lock: name.to_string(),
                });
            }
            self.locks.push(MLock {
                name: name.to_string(),
                permits: mode.permits(),
                holds: Vec::new(),
                waiters: Vec::new(),
                available_at_ms: None,
                last_token: self.forgotten.get(name).copied().unwrap_or(Token::ZERO),
            });
            return Ok(self.grant(name, session, request_id, value, mode, events));
        };
        if l.permits != mode.permits() {
            return Err(CoreError::PermitsMismatch {
                lock: name.to_string(),
                permits: l.permits.unwrap_or(0),
                requested: mode.permits().unwrap_or(0),
            });
        }
        // A session holds or waits at most once; asking again in the same mode answers the
        // grant or the place in line, in the other of shared and exclusive is refused.
        let conflict = |held_shared: bool| {
            Err(CoreError::ModeConflict {
                lock: name.to_string(),
                session,
                held_shared,
            })
        };
        if let Some(h) = l.hold_of(session) {
            let held_shared = h.access == Access::Shared;
            if held_shared != (mode == Mode::Shared) {
                return conflict(held_shared);
            }
            return Ok(Reply::granted(name.to_string(), session, h.token, h.access));
        }
        if let Some(position) = l.waiters.iter().position(|w| w.session == session) {
            let held_shared = l.waiters[position].mode == Mode::Shared;
            if held_shared != (mode == Mode::Shared) {
                return conflict(held_shared);
            }
            return Ok(Reply::Queued {
                lock: name.to_string(),
                session,
                position: position as u32,
            });
        }
        assert!(
            !l.holds.is_empty() || l.available_at_ms.is_some() || !l.waiters.is_empty(),
            "model keeps an idle lock"
        );
        if l.available_at_ms.is_none() && l.waiters.is_empty() && l.admits(mode) {
            if l.draws_token(mode) && self.last_token >= self.limits.token_max {
                return Err(CoreError::TokensExhausted {
                    lock: name.to_string(),
                });
            }
            return Ok(self.grant(name, session, request_id, value, mode, events));
        }
        if wait == Wait::Try || deadline_ms.is_some_and(|d| d <= self.now_ms) {
            let some = l.some_hold();
            return Err(CoreError::Busy {
                lock: name.to_string(),
                holder_session: some.map(|h| h.session),
                holder_token: some.map(|h| h.token),
                available_at_ms: l.available_at_ms,
            });
        }
        if l.waiters.len() >= self.limits.waiters_per_lock_max as usize {
            return Err(CoreError::TooManyWaiters {
                lock: name.to_string(),
                waiters_max: self.limits.waiters_per_lock_max,
            });
        }
        let l = self.lock_mut(name).unwrap();
        l.waiters.push(MWaiter {
            session,
            request_id,
            deadline_ms,
            value,
            mode,
            group: None,
        });
        Ok(Reply::Queued {
            lock: name.to_string(),
            session,
            position: (l.waiters.len() - 1) as u32,
        })
    }

    fn release(
        &mut self,
        session: SessionId,
        name: &str,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let Some(l) = self.lock(name) else {
            return Err(CoreError::NotHolder {
                lock: name.to_string(),
                session,
                holder_session: None,
            });
        };
        if l.hold_of(session).is_some() {
            let token = self.free(name, session, ReleaseCause::Released, events);
            self.settle(name, events);
            return Ok(Reply::Released {
                lock: name.to_string(),
                session,
                token: Some(token),
            });
        }
        if l.waiters.iter().any(|w| w.session == session) {
            self.end_wait_or_group(session, name, WaitEndCause::Withdrawn, events);
            return Ok(Reply::Released {
                lock: name.to_string(),
                session,
                token: None,
            });
        }
        Err(CoreError::NotHolder {
            lock: name.to_string(),
            session,
            holder_session: l.some_holder(),
        })
    }

    fn end_session(&mut self, id: SessionId, expired: bool, events: &mut Vec<Event>) {
        let waiting = self.lock_names(|l| l.waiters.iter().any(|w| w.session == id));
        let held = self.lock_names(|l| l.hold_of(id).is_some());
        for name in &waiting {
            let l = self.lock_mut(name).unwrap();
            let i = l.waiters.iter().position(|w| w.session == id).unwrap();
            let w = l.waiters.remove(i);
            events.push(Event::WaitEnded {
                lock: name.clone(),
                session: id,
                request_id: w.request_id,
                cause: WaitEndCause::SessionEnded,
            });
        }
        let cause = if expired {
            ReleaseCause::SessionExpired
        } else {
            ReleaseCause::SessionClosed
        };
        for name in &held {
            self.free(name, id, cause, events);
        }
        self.sessions.retain(|s| s.id != id);
        events.push(Event::SessionEnded {
            session: id,
            expired,
        });
        for name in waiting.iter().chain(&held) {
            self.settle(name, events);
        }
    }

    /// Ends `session`'s holding of `name`; an expired holding of any kind starts lock-delay.
    fn free(
        &mut self,
        name: &str,
        session: SessionId,
        cause: ReleaseCause,
        events: &mut Vec<Event>,
    ) -> Token {
        let now = self.now_ms;
        let delay = self.limits.lock_delay_ms;
        let l = self.lock_mut(name).unwrap();
        let i = l.holds.iter().position(|h| h.session == session).unwrap();
        let hold = l.holds.remove(i);
        if cause == ReleaseCause::SessionExpired && delay > DurationMs::ZERO {
            l.available_at_ms = Some(after(now, delay));
        }
        events.push(Event::Released {
            lock: name.to_string(),
            session,
            token: hold.token,
            cause,
        });
        hold.token
    }

    fn end_wait(
        &mut self,
        session: SessionId,
        name: &str,
        cause: WaitEndCause,
        events: &mut Vec<Event>,
    ) {
        let l = self.lock_mut(name).unwrap();
        let i = l.waiters.iter().position(|w| w.session == session).unwrap();
        let w = l.waiters.remove(i);
        self.resolve_queued(
            session,
            name,
            Err(CoreError::WaitEnded {
                lock: name.to_string(),
            }),
        );
        events.push(Event::WaitEnded {
            lock: name.to_string(),
            session,
            request_id: w.request_id,
            cause,
        });
    }

    /// Every remembered acquire of `name` that answered "queued" now answers with how the wait
    /// ended, so a retry of any of them sees the outcome rather than a stale "queued".
    fn resolve_queued(
        &mut self,
        session: SessionId,
        name: &str,
        outcome: Result<Reply, CoreError>,
    ) {
        let s = self.session_mut(session).unwrap();
        for r in &mut s.recent {
            if r.1 == Kind::Acquire && r.2 == name && matches!(r.3, Ok(Reply::Queued { .. })) {
                r.3 = outcome.clone();
            }
        }
    }

    /// [`Model::resolve_queued`] for the multi-lock of the names in `key` ([`multi_key`]).
    fn resolve_queued_all(
        &mut self,
        session: SessionId,
        key: &str,
        outcome: Result<Reply, CoreError>,
    ) {
        let s = self.session_mut(session).unwrap();
        for r in &mut s.recent {
            let queued = matches!(r.3, Ok(Reply::QueuedAll { .. }));
            if r.1 == Kind::AcquireAll && r.2 == key && queued {
                r.3 = outcome.clone();
            }
        }
    }

    /// The group `session` waits in for `name`, if it waits there as a part of a multi-lock.
    fn group_of(&self, session: SessionId, name: &str) -> Option<Vec<String>> {
        let l = self.lock(name)?;
        l.waiters
            .iter()
            .find(|w| w.session == session)?
            .group
            .clone()
    }

    /// Ends `session`'s wait for `name`: a single wait alone, a multi-lock's wait in every
    /// queue of its group (each lock settled after, in the order of its parts).
    fn end_wait_or_group(
        &mut self,
        session: SessionId,
        name: &str,
        cause: WaitEndCause,
        events: &mut Vec<Event>,
    ) {
        let Some(group) = self.group_of(session, name) else {
            self.end_wait(session, name, cause, events);
            self.settle(name, events);
            return;
        };
        for lock in &group {
            self.end_wait(session, lock, cause, events);
        }
        let ended = Err(CoreError::WaitEnded {
            lock: group[0].clone(),
        });
        self.resolve_queued_all(session, &multi_key(group.iter().cloned()), ended);
        for lock in &group {
            self.settle(lock, events);
        }
    }

    /// A multi-lock: every part, or none. Checked in order: session, size, names, no name twice,
    /// then a retry (by request id and first lock), then wait, modes, no name the session holds
    /// or waits for, the kind of names in use, the limit on locks.
    fn acquire_all(
        &mut self,
        session: SessionId,
        parts: Vec<AcquirePart>,
        request_id: RequestId,
        wait: Wait,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        if self.session(session).is_none() {
            return Err(CoreError::SessionNotFound { session });
        }
        if parts.is_empty() || parts.len() > MULTI_LOCKS_MAX as usize {
            return Err(CoreError::MultiLockSize {
                locks: parts.len() as u32,
                locks_max: MULTI_LOCKS_MAX,
            });
        }
        for p in &parts {
            validate_name(&p.lock, self.limits.lock_name_bytes_max as usize)?;
        }
        for (i, p) in parts.iter().enumerate() {
            if parts[..i].iter().any(|q| q.lock == p.lock) {
                return Err(CoreError::MultiLockRepeated {
                    lock: p.lock.clone(),
                });
            }
        }
        // Remembered under every name, in order: a retry names the same locks.
        let key = multi_key(parts.iter().map(|p| p.lock.clone()));
        self.deduplicated(
            session,
            request_id,
            Kind::AcquireAll,
            key,
            events,
            |m, _, ev| m.acquire_all_new(session, &parts, request_id, wait, ev),
        )
    }

    fn acquire_all_new(
        &mut self,
        session: SessionId,
        parts: &[AcquirePart],
        request_id: RequestId,
        wait: Wait,
        events: &mut Vec<Event>,
    ) -> Result<Reply, CoreError> {
        let deadline_ms = self.deadline_of(wait)?;
        for p in parts {
            permits_in_range(p.mode)?;
        }
        for p in parts {
            let there = self.lock(&p.lock).is_some_and(|l| {
                l.hold_of(session).is_some() || l.waiters.iter().any(|w| w.session == session)
            });
            if there {
                return Err(CoreError::MultiLockHeld {
                    lock: p.lock.clone(),
                    session,
                });
            }
        }
        for p in parts {
            if let Some(l) = self.lock(&p.lock)
                && l.permits != p.mode.permits()
            {
                return Err(CoreError::PermitsMismatch {
                    lock: p.lock.clone(),
                    permits: l.permits.unwrap_or(0),
                    requested: p.mode.permits().unwrap_or(0),
                });
            }
        }
        let new = parts
            .iter()
            .filter(|p| self.lock(&p.lock).is_none())
            .count();
        if new > 0 && self.locks.len() + new > self.limits.locks_max as usize {
            return Err(CoreError::TooManyLocks {
                locks_max: self.limits.locks_max,
            });
        }
        let free_now = |p: &&AcquirePart| match self.lock(&p.lock) {
            None => true,
            Some(l) => l.available_at_ms.is_none() && l.waiters.is_empty() && l.admits(p.mode),
        };
        let Some(blocked) = parts.iter().find(|p| !free_now(p)) else {
            let mut last = self.last_token;
            for p in parts {
                if self.lock(&p.lock).is_none_or(|l| l.draws_token(p.mode)) {
                    if last >= self.limits.token_max {
                        return Err(CoreError::TokensExhausted {
                            lock: p.lock.clone(),
                        });
                    }
                    last = Token::new(last.get() + 1);
                }
            }
            let mut grants = Vec::new();
            for p in parts {
                self.create_if_absent(&p.lock, p.mode);
                let reply = self.grant(&p.lock, session, request_id, None, p.mode, events);
                let (_, _, token, access) = reply.grant().unwrap();
                grants.push(GrantedPart {
                    lock: p.lock.clone(),
                    token,
                    access,
                });
            }
            return Ok(Reply::GrantedAll { session, grants });
        };
        if wait == Wait::Try || deadline_ms.is_some_and(|d| d <= self.now_ms) {
            let l = self.lock(&blocked.lock).unwrap();
            let some = l.some_hold();
            return Err(CoreError::Busy {
                lock: blocked.lock.clone(),
                holder_session: some.map(|h| h.session),
                holder_token: some.map(|h| h.token),
                available_at_ms: l.available_at_ms,
            });
        }
        let waiters_max = self.limits.waiters_per_lock_max;
        for p in parts {
            if self
                .lock(&p.lock)
                .is_some_and(|l| l.waiters.len() >= waiters_max as usize)
            {
                return Err(CoreError::TooManyWaiters {
                    lock: p.lock.clone(),
                    waiters_max,
                });
            }
        }
        let group: Vec<String> = parts.iter().map(|p| p.lock.clone()).collect();
        for p in parts {
            self.create_if_absent(&p.lock, p.mode);
            self.lock_mut(&p.lock).unwrap().waiters.push(MWaiter {
                session,
                request_id,
                deadline_ms,
                value: None,
                mode: p.mode,
                group: Some(group.clone()),
            });
        }
        Ok(Reply::QueuedAll { session })
    }

    fn create_if_absent(&mut self, name: &str, mode: Mode) {
        if self.lock(name).is_none() {
            self.locks.push(MLock {
                name: name.to_string(),
                permits: mode.permits(),
                holds: Vec::new(),
                waiters: Vec::new(),
                available_at_ms: None,
                last_token: self.forgotten.get(name).copied().unwrap_or(Token::ZERO),
            });
        }
    }

    /// Grants `name`, which admits `mode`, to `session`: a reader joining an open phase takes
    /// the phase's token, everyone else a fresh one (a permit in the lowest free slot).
    fn grant(
        &mut self,
        name: &str,
        session: SessionId,
        request_id: RequestId,
        value: Option<GrantValue>,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> Reply {
        let l = self.lock(name).unwrap();
        let access = match mode {
            Mode::Exclusive => Access::Exclusive,
            Mode::Shared => Access::Shared,
            Mode::Permit(_) => Access::Slot(
                (0..)
                    .find(|k| l.holds.iter().all(|h| h.access != Access::Slot(*k)))
                    .unwrap(),
            ),
        };
        let token = if l.draws_token(mode) {
            assert!(self.last_token < self.limits.token_max);
            self.last_token = Token::new(self.last_token.get() + 1);
            self.last_token
        } else {
            l.holds[0].token
        };
        let l = self.lock_mut(name).unwrap();
        l.holds.push(MHold {
            session,
            token,
            access,
            value: value.clone(),
        });
        l.last_token = l.last_token.max(token);
        events.push(Event::Granted {
            lock: name.to_string(),
            session,
            token,
            request_id,
            value,
            access,
        });
        Reply::granted(name.to_string(), session, token, access)
    }

    /// Grants from the front of the queue while the lock admits the front waiter (whose lease
    /// and wait must still run); a lock with nothing left is forgotten.
    ///
    /// A multi-lock's group at the front is granted whole, once it is first in every one of its
    /// queues and each of its locks admits its part (the counter paying every token); until
    /// then it blocks the queue. Its other locks are settled after this one, in parts order.
    fn settle(&mut self, name: &str, events: &mut Vec<Event>) {
        let mut changed = vec![name.to_string()];
        while !changed.is_empty() {
            let name = changed.remove(0);
            self.settle_one(&name, &mut changed, events);
        }
    }

    fn settle_one(&mut self, name: &str, changed: &mut Vec<String>, events: &mut Vec<Event>) {
        let now = self.now_ms;
        while let Some(l) = self.lock(name)
            && l.available_at_ms.is_none()
            && let Some(w) = l.waiters.first().cloned()
        {
            let lease_running = self.session(w.session).unwrap().expires_at_ms > now;
            let wait_running = w.deadline_ms.is_none_or(|d| d > now);
            if !(lease_running && wait_running) {
                break;
            }
            if let Some(group) = w.group {
                if !self.group_ready(w.session, &group) {
                    break;
                }
                self.grant_group(w.session, &group, events);
                changed.extend(group.into_iter().filter(|l| l != name));
                continue;
            }
            if !l.admits(w.mode)
                || (l.draws_token(w.mode) && self.last_token >= self.limits.token_max)
            {
                break;
            }
            self.lock_mut(name).unwrap().waiters.remove(0);
            let reply = self.grant(name, w.session, w.request_id, w.value, w.mode, events);
            self.resolve_queued(w.session, name, Ok(reply));
        }
        let l = self.lock(name).unwrap();
        if l.holds.is_empty() && l.waiters.is_empty() && l.available_at_ms.is_none() {
            if l.last_token > Token::ZERO {
                self.forgotten.insert(name.to_string(), l.last_token);
            }
            self.locks.retain(|l| l.name != name);
        }
    }

    /// Whether `session`'s group can be granted: first in each queue, each lock out of
    /// lock-delay and admitting its part, and tokens for every part that draws one.
    fn group_ready(&self, session: SessionId, group: &[String]) -> bool {
        let mut draws = 0;
        for name in group {
            let l = self.lock(name).unwrap();
            let Some(w) = l.waiters.first().filter(|w| w.session == session) else {
                return false;
            };
            if l.available_at_ms.is_some() || !l.admits(w.mode) {
                return false;
            }
            draws += u64::from(l.draws_token(w.mode));
        }
        self.last_token.get() + draws <= self.limits.token_max.get()
    }

    /// Grants every part of `session`'s ready group, in the order of its parts.
    fn grant_group(&mut self, session: SessionId, group: &[String], events: &mut Vec<Event>) {
        let mut grants = Vec::new();
        for lock in group {
            let l = self.lock_mut(lock).unwrap();
            let i = l.waiters.iter().position(|x| x.session == session).unwrap();
            let part = l.waiters.remove(i);
            let reply = self.grant(lock, session, part.request_id, None, part.mode, events);
            let (_, _, token, access) = reply.grant().unwrap();
            self.resolve_queued(session, lock, Ok(reply));
            grants.push(GrantedPart {
                lock: lock.clone(),
                token,
                access,
            });
        }
        let granted = Ok(Reply::GrantedAll { session, grants });
        self.resolve_queued_all(session, &multi_key(group.iter().cloned()), granted);
    }
}

impl MLock {
    fn hold_of(&self, session: SessionId) -> Option<&MHold> {
        self.holds.iter().find(|h| h.session == session)
    }

    /// Whether a grant in `mode` fits beside the current holdings: exclusive alone, shared
    /// beside readers only, a permit while fewer than `N` are held.
    fn admits(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.holds.is_empty(),
            Mode::Shared => self.holds.iter().all(|h| h.access == Access::Shared),
            Mode::Permit(n) => self.holds.len() < n as usize,
        }
    }

    /// Whether a grant in `mode` draws a token: all but a reader joining an open phase.
    fn draws_token(&self, mode: Mode) -> bool {
        mode != Mode::Shared || self.holds.is_empty()
    }

    /// The holding a refusal names: the exclusive holder, else the lowest session's.
    fn some_hold(&self) -> Option<&MHold> {
        let exclusive = self.holds.iter().find(|h| h.access == Access::Exclusive);
        exclusive.or_else(|| self.holds.iter().min_by_key(|h| h.session))
    }

    fn some_holder(&self) -> Option<SessionId> {
        self.some_hold().map(|h| h.session)
    }
}

// ---------------------------------------------------------------------------------------------
// The invariant checker: judges the observable history only.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Checker {
    /// Highest token ever granted per lock.
    token_max_of: BTreeMap<String, Token>,
    /// Every grant ever made: (session, lock, token).
    grants: BTreeSet<(SessionId, String, Token)>,
    /// Sessions in the order they queued, per lock, as replies and events told us.
    queues: BTreeMap<String, Vec<SessionId>>,
    ended: BTreeSet<SessionId>,
    /// Each live session's lease end, as of the end of the previous step.
    expiry: BTreeMap<SessionId, TimeMs>,
    /// A lock whose holder expired may not be granted before this time.
    delay_until: BTreeMap<String, TimeMs>,
    /// Every session ever opened by [`Command::OpenSession`], with the key that opened it.
    opened_with: BTreeMap<SessionId, Option<OpenKey>>,
    /// The live holdings of each lock, as grant and release events told us.
    holds: BTreeMap<String, Vec<(SessionId, Token, Access)>>,
    /// The mode each session asked for a lock it holds or waits for.
    requested: BTreeMap<(SessionId, String), Mode>,
    /// Every grant ever made, with its access.
    granted_as: BTreeSet<(String, SessionId, Token, Access)>,
    /// The last token granted in each slot of a semaphore.
    slot_token: BTreeMap<(String, u32), Token>,
    /// The multi-locks that wait: each session's group of locks, in the order of its parts,
    /// and whether it queued in the step being checked (whose earlier events are not its).
    groups: Vec<(SessionId, Vec<String>, bool)>,
}

/// Whether a grant's access is what its acquire asked for: a permit of a semaphore of `N` in a
/// slot below `N`.
fn access_fits(access: Access, mode: Mode) -> bool {
    match (access, mode) {
        (Access::Exclusive, Mode::Exclusive) | (Access::Shared, Mode::Shared) => true,
        (Access::Slot(k), Mode::Permit(n)) => k < n,
        _ => false,
    }
}

impl Checker {
    /// Every waiting multi-lock is all or none: it waits in all of its queues, or it was granted
    /// all of its locks in this one step, or it left all of its queues. No deadlock: a group
    /// first in every one of its queues, whose locks all admit it, is not left waiting.
    fn check_groups(&mut self, table: &LockTable, output: &Output) {
        let limits = *table.limits();
        let mut waiting = Vec::new();
        for (session, group, fresh) in std::mem::take(&mut self.groups) {
            let told = |l: &String, granted: bool| {
                (output.events.iter()).any(|e| match e {
                    Event::Granted {
                        lock, session: s, ..
                    } => granted && lock == l && *s == session,
                    Event::WaitEnded {
                        lock, session: s, ..
                    } => !granted && lock == l && *s == session,
                    _ => false,
                })
            };
            // Its wait ended in every queue in this step, or it was granted every lock, or
            // neither and it still waits in every queue. (A grant after the end of the wait in
            // the same step is a new acquire's; so is a wait after it.)
            let ended = group.iter().filter(|l| !fresh && told(l, false)).count();
            let got = group.iter().filter(|l| !fresh && told(l, true)).count();
            if ended == group.len() {
                continue;
            }
            assert!(
                ended == 0 && (got == 0 || got == group.len()),
                "multi-lock granted in part: {got} of {group:?} to session {session}, \
                 {ended} waits ended"
            );
            if got == group.len() {
                continue;
            }
            let queued = |l: &String| self.queues.get(l).is_some_and(|q| q.contains(&session));
            let in_queues = group.iter().filter(|l| queued(l)).count();
            assert_eq!(
                in_queues,
                group.len(),
                "a multi-lock of session {session} waits in part: {group:?}"
            );
            waiting.push((session, group, false));
        }
        for (session, group, _) in &waiting {
            let mut ready = true;
            let mut draws = 0;
            for l in group {
                let status = table.lock_status(l).expect("a waited-for lock");
                let mode = self.requested[&(*session, l.clone())];
                let admits = match mode {
                    Mode::Exclusive => status.holder.is_none() && status.sharers.is_empty(),
                    Mode::Shared => status.holder.is_none(),
                    Mode::Permit(n) => status.sharers.len() < n as usize,
                };
                ready &= status.waiters.first() == Some(session)
                    && status.available_at_ms.is_none()
                    && admits;
                draws += u64::from(mode != Mode::Shared || status.sharers.is_empty());
            }
            let paid = table.last_token().get() + draws <= limits.token_max.get();
            assert!(
                !(ready && paid),
                "a multi-lock of session {session} could be granted but waits: {group:?}"
            );
        }
        self.groups = waiting;
    }

    fn observe(&mut self, table: &LockTable, command: &Command, output: &Output) {
        let limits = *table.limits();
        let now = table.now_ms();
        // The mode of each lock this acquire asks for, for a grant it gets at once.
        let asked: Vec<(SessionId, String, Mode)> = match command {
            Command::Acquire {
                session,
                lock,
                mode,
                ..
            }
            | Command::ReleaseThenAcquire {
                session,
                lock,
                mode,
                ..
            } => vec![(*session, lock.clone(), *mode)],
            Command::AcquireAll { session, parts, .. } => (parts.iter())
                .map(|p| (*session, p.lock.clone(), p.mode))
                .collect(),
            _ => Vec::new(),
        };
        for event in &output.events {
            match event {
                Event::Granted {
                    lock,
                    session,
                    token,
                    access,
                    ..
                } => {
                    assert!(!self.ended.contains(session), "grant to ended session");
                    assert!(*token <= limits.token_max, "token past the limit");
                    let key = (*session, lock.clone());
                    let mode = match self.requested.get(&key) {
                        Some(mode) => *mode,
                        None => {
                            let (_, _, mode) = (asked.iter())
                                .find(|(s, l, _)| (s, l) == (session, lock))
                                .expect("a grant nobody asked for");
                            self.requested.insert(key.clone(), *mode);
                            *mode
                        }
                    };
                    let holds = self.holds.entry(lock.clone()).or_default();
                    assert!(
                        holds.iter().all(|h| h.0 != *session),
                        "{lock:?} granted twice to session {session}"
                    );
                    for h in holds.iter() {
                        let theirs = self.requested[&(h.0, lock.clone())];
                        assert_eq!(
                            theirs.permits(),
                            mode.permits(),
                            "{lock:?} held as {theirs:?} and granted as {mode:?}"
                        );
                    }
                    let joins_phase = *access == Access::Shared && !holds.is_empty();
                    match *access {
                        Access::Exclusive => assert!(
                            holds.is_empty(),
                            "{lock:?} granted exclusive beside {holds:?}"
                        ),
                        Access::Shared => {
                            for h in holds.iter() {
                                assert_eq!(
                                    h.2,
                                    Access::Shared,
                                    "reader of {lock:?} granted while a writer holds"
                                );
                                assert_eq!(
                                    h.1, *token,
                                    "readers of one phase of {lock:?} with different tokens"
                                );
                            }
                        }
                        Access::Slot(k) => {
                            let n = mode.permits().expect("a permit");
                            assert!(
                                holds.len() < n as usize,
                                "permit of {lock:?} granted beside {} of {n} live holders",
                                holds.len()
                            );
                            assert!(
                                holds.iter().all(|h| h.2 != *access),
                                "slot {k} of {lock:?} granted while held"
                            );
                            let slot = (lock.clone(), k);
                            if let Some(&last) = self.slot_token.get(&slot) {
                                assert!(*token > last, "token of slot {k} of {lock:?} fell");
                            }
                            self.slot_token.insert(slot, *token);
                        }
                    }
                    assert!(
                        access_fits(*access, mode),
                        "grant of {lock:?} as {access} to an acquire of {mode:?}"
                    );
                    holds.push((*session, *token, *access));
                    self.granted_as
                        .insert((lock.clone(), *session, *token, *access));
                    if let Some(&max) = self.token_max_of.get(lock)
                        && !joins_phase
                    {
                        assert!(*token > max, "token {token} of {lock:?} not above {max}");
                    }
                    let expiry = self.expiry[session];
                    assert!(
                        expiry > now,
                        "grant at {now} to a lease that ended at {expiry}"
                    );
                    if let Some(&until) = self.delay_until.get(lock) {
                        assert!(now >= until, "grant of {lock:?} at {now} in lock-delay");
                    }
                    let queue = self.queues.entry(lock.clone()).or_default();
                    if let Some(&first) = queue.first() {
                        assert_eq!(first, *session, "grant out of FIFO order");
                        queue.remove(0);
                    }
                    assert!(!queue.contains(session));
                    self.token_max_of.insert(lock.clone(), *token);
                    self.grants.insert((*session, lock.clone(), *token));
                }
                Event::Released {
                    lock,
                    session,
                    token,
                    cause,
                } => {
                    assert!(self.grants.contains(&(*session, lock.clone(), *token)));
                    let holds = self.holds.entry(lock.clone()).or_default();
                    let i = holds.iter().position(|h| (h.0, h.1) == (*session, *token));
                    holds.remove(i.expect("release of a grant that does not hold"));
                    self.requested.remove(&(*session, lock.clone()));
                    if *cause == ReleaseCause::SessionExpired {
                        let until = after(self.expiry[session], limits.lock_delay_ms);
                        self.delay_until.insert(lock.clone(), until);
                    }
                }
                Event::ValueSet {
                    lock,
                    session,
                    token,
                    ..
                } => {
                    let status = table.lock_status(lock).expect("a held lock");
                    let holding = status
                        .holder
                        .iter()
                        .chain(&status.sharers)
                        .any(|g| (g.session, g.token) == (*session, *token));
                    assert!(
                        holding,
                        "the value of {lock:?} set by a grant that is not a holding"
                    );
                }
                Event::WaitEnded { lock, session, .. } => {
                    let queue = self.queues.entry(lock.clone()).or_default();
                    let i = queue.iter().position(|s| s == session);
                    queue.remove(i.expect("wait ended for a session that was not queued"));
                    self.requested.remove(&(*session, lock.clone()));
                }
                Event::SessionEnded { session, expired } => {
                    assert!(
                        self.queues.values().all(|q| !q.contains(session)),
                        "session ended while still queued"
                    );
                    if *expired {
                        assert!(self.expiry[session] <= now, "session expired early");
                    }
                    assert!(self.ended.insert(*session), "session ended twice");
                }
            }
        }
        // A release-then-acquire is judged by its acquire's reply; its release's effects are
        // in the events, as a release's are.
        let result = match &output.result {
            Ok(Reply::ReleasedThenAcquired { acquired, .. }) => Ok(&**acquired),
            result => result.as_ref(),
        };
        if let Some((lock, session, token, access)) = result.ok().and_then(Reply::grant) {
            assert!(!self.ended.contains(&session));
            assert!(
                self.grants.contains(&(session, lock.to_string(), token)),
                "reply names a grant that never happened"
            );
            // A retry answers a remembered grant, which may have ended since.
            assert!(
                self.granted_as
                    .contains(&(lock.to_string(), session, token, access)),
                "reply names {access} of {lock:?}, not the access granted"
            );
        }
        match result {
            Ok(Reply::Queued {
                lock,
                session,
                position,
            }) => {
                let queue = self.queues.entry(lock.clone()).or_default();
                if !queue.contains(session) {
                    queue.push(*session);
                    assert_eq!(*position as usize, queue.len() - 1);
                    let (s, l, mode) = asked.first().cloned().expect("queued by an acquire");
                    assert_eq!((s, &l), (*session, lock));
                    self.requested.insert((s, l), mode);
                }
            }
            Ok(Reply::QueuedAll { session }) => {
                let group: Vec<String> = asked.iter().map(|(_, l, _)| l.clone()).collect();
                if !(self.groups.iter()).any(|g| (&g.0, &g.1) == (session, &group)) {
                    for (s, l, mode) in &asked {
                        assert_eq!(s, session, "queued for another session");
                        let queue = self.queues.entry(l.clone()).or_default();
                        assert!(!queue.contains(session), "{l:?} queued twice");
                        queue.push(*session);
                        self.requested.insert((*s, l.clone()), *mode);
                    }
                    self.groups.push((*session, group, true));
                }
            }
            Ok(Reply::GrantedAll { session, grants }) => {
                let named: Vec<&String> = asked.iter().map(|(_, l, _)| l).collect();
                let got: Vec<&String> = grants.iter().map(|g| &g.lock).collect();
                assert_eq!(got, named, "multi-lock granted in part");
                for g in grants {
                    assert!(
                        (self.granted_as).contains(&(g.lock.clone(), *session, g.token, g.access)),
                        "reply names a grant of {:?} that never happened",
                        g.lock
                    );
                }
            }
            Ok(Reply::SessionOpened {
                session,
                expires_at_ms,
                ..
            }) => {
                assert!(!self.ended.contains(session));
                self.expiry.entry(*session).or_insert(*expires_at_ms);
                // An open without a key never returns an existing session; one with a key
                // returns only the live session that same key opened.
                if let Command::OpenSession { open_key, .. } = command {
                    match self.opened_with.get(session) {
                        None => {
                            self.opened_with.insert(*session, open_key.clone());
                        }
                        Some(first) => assert!(
                            open_key.is_some() && first == open_key,
                            "open with key {open_key:?} returned session {session}, opened by {first:?}"
                        ),
                    }
                }
            }
            Err(CoreError::TokensExhausted { .. }) => {
                // A multi-lock needs a token for each of its parts (a reader joining a phase
                // aside): it is refused while fewer are left.
                let left = limits.token_max.get() - table.last_token().get();
                assert!(
                    (left as usize) < asked.len().max(1),
                    "tokens exhausted with {left} left for {} locks",
                    asked.len()
                );
            }
            _ => {}
        }

        self.check_groups(table, output);

        // The table's own cross-references, and the limits.
        table.check_consistency();
        assert!(table.session_count() <= limits.sessions_max as usize);
        assert!(table.lock_count() <= limits.locks_max as usize);
        assert!(table.last_token() <= limits.token_max);
        for status in table.locks("", None, usize::MAX) {
            assert!(status.waiters.len() <= limits.waiters_per_lock_max as usize);
            // FIFO: the table's queue is exactly the order in which sessions were told "queued".
            let queue = self.queues.get(&status.lock).cloned().unwrap_or_default();
            assert_eq!(status.waiters, queue, "queue of {:?}", status.lock);
            if let Some(g) = &status.holder {
                assert_eq!(self.token_max_of[&status.lock], g.token);
            }
            if let Some(n) = status.permits {
                assert!(
                    status.sharers.len() <= n as usize,
                    "{status:?} over its size"
                );
            } else {
                for g in &status.sharers {
                    assert_eq!(self.token_max_of[&status.lock], g.token, "{status:?}");
                }
            }
            // What the events told equals what the table shows.
            let mut shown: Vec<(SessionId, Token, Access)> = status
                .holder
                .iter()
                .chain(&status.sharers)
                .map(|g| (g.session, g.token, g.access))
                .collect();
            let mut told = self.holds.get(&status.lock).cloned().unwrap_or_default();
            shown.sort();
            told.sort();
            assert_eq!(shown, told, "holdings of {:?}", status.lock);
        }
        for (lock, queue) in &self.queues {
            if !queue.is_empty() {
                assert!(
                    table.lock_status(lock).is_some(),
                    "waiters of a forgotten lock"
                );
            }
        }

        // Leases: never shortened; a leader start renews each to a full TTL from now.
        let ids: Vec<SessionId> = self.expiry.keys().copied().collect();
        for id in ids {
            match table.session_status(id) {
                Some(s) => {
                    assert!(
                        s.expires_at_ms > now,
                        "a live session's lease already ended"
                    );
                    assert!(s.expires_at_ms >= self.expiry[&id], "lease shortened");
                    if *command == Command::LeaderStart {
                        assert!(s.expires_at_ms >= after(now, s.ttl_ms));
                    }
                    self.expiry.insert(id, s.expires_at_ms);
                }
                None => {
                    assert!(self.ended.contains(&id), "session vanished without ending");
                    self.expiry.remove(&id);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random command sequences.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum ReqId {
    /// A request id never used before.
    Fresh,
    /// The n-th most recent request id the session used (a retry, or a conflicting reuse).
    Reuse(usize),
}

#[derive(Debug, Clone, Copy)]
enum KeyChoice {
    /// An open without a key.
    None,
    /// A key never used before.
    Fresh,
    /// The n-th most recent key used (a retry, or a key whose session may have ended).
    Reuse(usize),
}

#[derive(Debug, Clone)]
enum Op {
    Open {
        key: KeyChoice,
        ttl: u8,
    },
    /// An open as an older version logged it, deduplicated by request id across every client.
    OpenByRequestId {
        request_id: ReqId,
        ttl: u8,
    },
    KeepAlive {
        session: usize,
    },
    Close {
        session: usize,
    },
    Acquire {
        session: usize,
        lock: u8,
        request_id: ReqId,
        wait: Wait,
        value: u8,
        /// The mode, as [`mode_of`] reads it for the lock.
        mode: u8,
    },
    /// Replace a grant's value, naming the n-th most recent grant seen (its session, lock and
    /// token), mostly one that still holds.
    SetValue {
        grant: usize,
        value: u8,
    },
    Release {
        session: usize,
        lock: u8,
        request_id: ReqId,
    },
    /// A multi-lock of the first `count` of `locks`, each in the mode [`mode_of`] reads from
    /// `modes`.
    AcquireAll {
        session: usize,
        locks: [u8; 4],
        count: usize,
        modes: [u8; 4],
        request_id: ReqId,
        wait: Wait,
    },
    /// A release, then an acquire, in one command (often of the same lock: a handoff to
    /// itself).
    ReleaseThenAcquire {
        session: usize,
        release: u8,
        release_request_id: ReqId,
        /// `None`: the released lock again.
        lock: Option<u8>,
        request_id: ReqId,
        wait: Wait,
        value: u8,
        mode: u8,
    },
    /// Repeat an earlier acquire, multi-lock, release, or release-then-acquire exactly.
    Retry {
        back: usize,
    },
    Tick,
    LeaderStart,
    /// Raise the token counter to at least `floor`, and the session counter to at least
    /// `session_floor` if given.
    RaiseTokenFloor {
        floor: u64,
        session_floor: Option<u64>,
    },
    /// Snapshot the table and restore it from the snapshot (a restart).
    Restart,
}

#[derive(Debug, Clone)]
struct Step {
    advance_ms: u64,
    /// Present an input whose time is behind the table's clock.
    behind_ms: Option<u64>,
    op: Op,
}

fn req_id() -> impl Strategy<Value = ReqId> {
    prop_oneof![3 => Just(ReqId::Fresh), 1 => (0usize..4).prop_map(ReqId::Reuse)]
}

fn key_choice() -> impl Strategy<Value = KeyChoice> {
    prop_oneof![
        2 => Just(KeyChoice::None),
        2 => Just(KeyChoice::Fresh),
        1 => (0usize..4).prop_map(KeyChoice::Reuse),
    ]
}

fn wait() -> impl Strategy<Value = Wait> {
    prop_oneof![
        2 => Just(Wait::Try),
        3 => (0u64..1_500).prop_map(|ms| Wait::ForMs(DurationMs::from_millis(ms))),
        1 => Just(Wait::ForMs(DurationMs::from_millis(WAIT_MS_MAX.as_millis() + 1))),
        3 => Just(Wait::Forever),
    ]
}

fn lock() -> impl Strategy<Value = u8> {
    prop_oneof![20 => 0u8..4, 1 => 4u8..7]
}

/// The locks of a multi-lock: 2 to 4 of the names in any order; now and then a name twice, an
/// invalid name, or none at all.
fn multi_lock() -> impl Strategy<Value = ([u8; 4], usize)> {
    let names = prop::sample::subsequence(vec![0u8, 1, 2, 3], 2..=4).prop_shuffle();
    (names, 0u8..12).prop_map(|(mut locks, twist)| {
        let n = locks.len();
        match twist {
            0 if n < 4 => locks.push(locks[0]),
            0 => locks[3] = locks[0],
            1 => locks[n - 1] = 5,
            2 => locks.clear(),
            _ => {}
        }
        let mut fixed = [0; 4];
        fixed[..locks.len()].copy_from_slice(&locks);
        (fixed, locks.len())
    })
}

fn op() -> impl Strategy<Value = Op> {
    let session = 0usize..10;
    prop_oneof![
        4 => (key_choice(), 0u8..10).prop_map(|(key, ttl)| Op::Open { key, ttl }),
        1 => (req_id(), 0u8..10)
            .prop_map(|(request_id, ttl)| Op::OpenByRequestId { request_id, ttl }),
        6 => session.clone().prop_map(|session| Op::KeepAlive { session }),
        1 => session.clone().prop_map(|session| Op::Close { session }),
        12 => (session.clone(), lock(), req_id(), wait(), 0u8..4, 0u8..20).prop_map(
            |(session, lock, request_id, wait, value, mode)| Op::Acquire {
                session,
                lock,
                request_id,
                wait,
                value,
                mode,
            }
        ),
        6 => (session.clone(), multi_lock(), prop::array::uniform4(0u8..20), req_id(), wait())
            .prop_map(|(session, (locks, count), modes, request_id, wait)| Op::AcquireAll {
                session,
                locks,
                count,
                modes,
                request_id,
                wait,
            }),
        4 => (
            session.clone(),
            lock(),
            req_id(),
            proptest::option::of(lock()),
            req_id(),
            wait(),
            0u8..4,
            0u8..20
        )
            .prop_map(
                |(session, release, release_request_id, lock, request_id, wait, value, mode)| {
                    Op::ReleaseThenAcquire {
                        session,
                        release,
                        release_request_id,
                        lock,
                        request_id,
                        wait,
                        value,
                        mode,
                    }
                }
            ),
        2 => (0usize..4, 0u8..4).prop_map(|(grant, value)| Op::SetValue { grant, value }),
        5 => (session, lock(), req_id()).prop_map(|(session, lock, request_id)| Op::Release {
            session,
            lock,
            request_id
        }),
        2 => (0usize..6).prop_map(|back| Op::Retry { back }),
        2 => Just(Op::Tick),
        1 => Just(Op::LeaderStart),
        1 => (0u64..40, proptest::option::of(0u64..20))
            .prop_map(|(floor, session_floor)| Op::RaiseTokenFloor { floor, session_floor }),
        1 => Just(Op::Restart),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let advance = prop_oneof![
        12 => Just(0u64),
        12 => 1u64..40,
        4 => 40u64..300,
        1 => 300u64..1_200,
        1 => 1_200u64..4_000,
    ];
    let behind = prop_oneof![9 => Just(None), 1 => (1u64..2_000).prop_map(Some)];
    (advance, behind, op()).prop_map(|(advance_ms, behind_ms, op)| Step {
        advance_ms,
        behind_ms,
        op,
    })
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    small: bool,
    few_tokens: bool,
    lock_delay: bool,
}

fn limits_of(setup: Setup) -> Limits {
    let mut limits = Limits {
        session_ttl_ms_min: DurationMs::from_millis(1_000),
        lock_delay_ms: DurationMs::from_millis(if setup.lock_delay { 500 } else { 0 }),
        token_max: if setup.few_tokens {
            Token::new(8)
        } else {
            TOKEN_MAX
        },
        ..Limits::default()
    };
    if setup.small {
        limits.sessions_max = 4;
        limits.waiters_per_lock_max = 3;
        limits.locks_max = 3;
        limits.lock_name_bytes_max = 8;
        limits.session_ttl_ms_max = DurationMs::from_millis(3_000);
    }
    limits
}

/// Turns a generated op into a command, resolving session and request-id choices against what
/// happened so far.
#[derive(Debug, Default)]
struct Driver {
    sessions: Vec<SessionId>,
    /// Sessions that are open, as the model knows.
    live: Vec<SessionId>,
    open_request_ids: Vec<RequestId>,
    open_keys: Vec<OpenKey>,
    next_open_key: u64,
    request_ids_of: BTreeMap<SessionId, Vec<RequestId>>,
    sent: Vec<Command>,
    next_request_id: u64,
    /// Every grant seen: (session, lock, token), oldest first.
    grants: Vec<(SessionId, String, Token)>,
}

/// An acquire's mode, by lock: "a" and "b" are read-write locks (writers and readers mixed, now
/// and then a permit, a mismatch), "c" a semaphore of 3 (sometimes asked as one of 2, or as a
/// lock), "d/e" mostly a semaphore of 1 but sometimes of 3 or a lock (each fits while the name
/// is idle), and a size out of range now and then.
fn mode_of(lock: u8, choice: u8) -> Mode {
    match (lock, choice) {
        (0 | 1 | 4.., 0..=8) => Mode::Exclusive,
        (0 | 1 | 4.., 9..=17) => Mode::Shared,
        (0 | 1 | 4.., 18) => Mode::Permit(2),
        (2, 0..=15) => Mode::Permit(3),
        (2, 16) => Mode::Permit(2),
        (2, 17) => Mode::Exclusive,
        (2, 18) => Mode::Shared,
        (3, 0..=12) => Mode::Permit(1),
        (3, 13..=15) => Mode::Permit(3),
        (3, 16) => Mode::Exclusive,
        (3, 17 | 18) => Mode::Shared,
        _ if lock.is_multiple_of(2) => Mode::Permit(0),
        _ => Mode::Permit(PERMITS_MAX + 1),
    }
}

/// A value choice: none, two short ones, or the longest allowed.
fn value_of(choice: u8) -> Option<GrantValue> {
    let value = match choice {
        0 => return None,
        1 => "10.0.0.1:7000".to_string(),
        2 => "{\"role\": \"primary\"}".to_string(),
        _ => "v".repeat(palisade_core::limits::GRANT_VALUE_BYTES_MAX),
    };
    Some(GrantValue::new(value).expect("a valid value"))
}

impl Driver {
    /// Mostly one of the live sessions; sometimes one that ended, or one that never existed.
    fn session(&self, choice: usize) -> SessionId {
        match choice {
            0..8 if !self.live.is_empty() => self.live[choice % self.live.len()],
            8 if !self.sessions.is_empty() => {
                self.sessions[self.sessions.len() - 1 - choice % self.sessions.len().min(6)]
            }
            _ => SessionId::new(1_000_000),
        }
    }

    fn request_id(&mut self, used: &[RequestId], choice: ReqId) -> RequestId {
        match choice {
            ReqId::Reuse(n) if !used.is_empty() => used[used.len() - 1 - n % used.len()],
            _ => {
                self.next_request_id += 1;
                RequestId::new(self.next_request_id)
            }
        }
    }

    fn open_key(&mut self, choice: KeyChoice) -> Option<OpenKey> {
        match choice {
            KeyChoice::None => None,
            KeyChoice::Reuse(n) if !self.open_keys.is_empty() => {
                Some(self.open_keys[self.open_keys.len() - 1 - n % self.open_keys.len()].clone())
            }
            _ => {
                self.next_open_key += 1;
                let mut bytes = [0xA5; 16];
                bytes[..8].copy_from_slice(&self.next_open_key.to_be_bytes());
                let key = OpenKey::new(&bytes).expect("a valid open key");
                self.open_keys.push(key.clone());
                Some(key)
            }
        }
    }

    fn session_request_id(&mut self, session: SessionId, choice: ReqId) -> RequestId {
        let used = self
            .request_ids_of
            .get(&session)
            .cloned()
            .unwrap_or_default();
        let id = self.request_id(&used, choice);
        self.request_ids_of.entry(session).or_default().push(id);
        id
    }

    fn command(&mut self, op: &Op, limits: &Limits) -> Option<Command> {
        let lock_name = |i: u8| match i {
            0 => "a".to_string(),
            1 => "b".to_string(),
            2 => "c".to_string(),
            3 => "d/e".to_string(),
            4 => String::new(),
            5 => "x".repeat(limits.lock_name_bytes_max as usize + 1),
            _ => "bell\u{7}".to_string(),
        };
        let ttl_ms = |ttl: u8| {
            DurationMs::from_millis(match ttl {
                0 => limits.session_ttl_ms_min.as_millis() - 1,
                1 => limits.session_ttl_ms_min.as_millis(),
                2..=4 => 1_500,
                5..=7 => 2_500,
                8 => limits.session_ttl_ms_max.as_millis(),
                _ => limits.session_ttl_ms_max.as_millis() + 1,
            })
        };
        let command = match *op {
            Op::Open { key, ttl } => Command::OpenSession {
                open_key: self.open_key(key),
                ttl_ms: ttl_ms(ttl),
                secret_digest: None,
                owner: None,
            },
            Op::OpenByRequestId { request_id, ttl } => {
                let used = self.open_request_ids.clone();
                let request_id = self.request_id(&used, request_id);
                self.open_request_ids.push(request_id);
                Command::OpenSessionByRequestId {
                    request_id,
                    ttl_ms: ttl_ms(ttl),
                }
            }
            Op::KeepAlive { session } => Command::KeepAlive {
                session: self.session(session),
            },
            Op::Close { session } => Command::CloseSession {
                session: self.session(session),
            },
            Op::Acquire {
                session,
                lock,
                request_id,
                wait,
                value,
                mode,
            } => {
                let session = self.session(session);
                Command::Acquire {
                    session,
                    lock: lock_name(lock),
                    request_id: self.session_request_id(session, request_id),
                    wait,
                    value: value_of(value),
                    mode: mode_of(lock, mode),
                }
            }
            Op::SetValue { grant, value } => {
                let (session, lock, token) = match self.grants.len() {
                    0 => (self.session(0), lock_name(0), Token::new(1)),
                    n => self.grants[n - 1 - grant % n].clone(),
                };
                Command::SetValue {
                    session,
                    lock,
                    token,
                    value: value_of(value),
                }
            }
            Op::Release {
                session,
                lock,
                request_id,
            } => {
                let session = self.session(session);
                Command::Release {
                    session,
                    lock: lock_name(lock),
                    request_id: self.session_request_id(session, request_id),
                }
            }
            Op::AcquireAll {
                session,
                locks,
                count,
                modes,
                request_id,
                wait,
            } => {
                let session = self.session(session);
                let parts = (locks.iter().zip(modes).take(count))
                    .map(|(&lock, mode)| AcquirePart {
                        lock: lock_name(lock),
                        mode: mode_of(lock, mode),
                    })
                    .collect();
                Command::AcquireAll {
                    session,
                    parts,
                    request_id: self.session_request_id(session, request_id),
                    wait,
                }
            }
            Op::ReleaseThenAcquire {
                session,
                release,
                release_request_id,
                lock,
                request_id,
                wait,
                value,
                mode,
            } => {
                let session = self.session(session);
                let lock = lock.unwrap_or(release);
                Command::ReleaseThenAcquire {
                    session,
                    release: lock_name(release),
                    release_request_id: self.session_request_id(session, release_request_id),
                    lock: lock_name(lock),
                    request_id: self.session_request_id(session, request_id),
                    wait,
                    value: value_of(value),
                    mode: mode_of(lock, mode),
                }
            }
            Op::Retry { back } => {
                if self.sent.is_empty() {
                    return None;
                }
                return Some(self.sent[self.sent.len() - 1 - back % self.sent.len()].clone());
            }
            Op::Tick => Command::Tick,
            Op::LeaderStart => Command::LeaderStart,
            Op::RaiseTokenFloor {
                floor,
                session_floor,
            } => Command::RaiseTokenFloor {
                floor: Token::new(floor),
                session_floor: session_floor.map(SessionId::new),
            },
            Op::Restart => return None,
        };
        if matches!(
            command,
            Command::Acquire { .. }
                | Command::AcquireAll { .. }
                | Command::Release { .. }
                | Command::ReleaseThenAcquire { .. }
        ) {
            self.sent.push(command.clone());
        }
        Some(command)
    }

    fn learn(&mut self, output: &Output) {
        for event in &output.events {
            if let Event::Granted {
                lock,
                session,
                token,
                ..
            } = event
            {
                self.grants.push((*session, lock.clone(), *token));
            }
        }
        if let Ok(Reply::SessionOpened { session, .. }) = output.result
            && !self.sessions.contains(&session)
        {
            self.sessions.push(session);
        }
    }
}

/// Compares everything a client can see of the table with the model.
fn compare_state(table: &LockTable, model: &Model) {
    assert_eq!(table.now_ms(), model.now_ms);
    assert_eq!(table.last_token(), model.last_token);
    assert_eq!(table.session_count(), model.sessions.len());
    assert_eq!(table.lock_count(), model.locks.len());
    for l in &model.locks {
        let status = table.lock_status(&l.name).expect("lock the model has");
        let hold = |g: &palisade_core::Grant| MHold {
            session: g.session,
            token: g.token,
            access: g.access,
            value: g.value.clone(),
        };
        let exclusive = l.holds.iter().find(|h| h.access == Access::Exclusive);
        assert_eq!(status.holder.as_ref().map(hold).as_ref(), exclusive);
        let mut sharers: Vec<MHold> = l
            .holds
            .iter()
            .filter(|h| h.access != Access::Exclusive)
            .cloned()
            .collect();
        sharers.sort_by_key(|h| h.session);
        let table_sharers: Vec<MHold> = status.sharers.iter().map(hold).collect();
        assert_eq!(table_sharers, sharers, "sharers of {:?}", l.name);
        assert_eq!(status.permits, l.permits);
        let waiters: Vec<SessionId> = l.waiters.iter().map(|w| w.session).collect();
        assert_eq!(status.waiters, waiters);
        assert_eq!(status.available_at_ms, l.available_at_ms);
        assert_eq!(status.last_token, l.last_token);
    }
    for s in &model.sessions {
        let status = table.session_status(s.id).expect("session the model has");
        assert_eq!(status.expires_at_ms, s.expires_at_ms);
        assert_eq!(status.ttl_ms, s.ttl_ms);
    }
}

fn run(setup: Setup, steps: &[Step]) {
    run_judged(setup, steps, true);
}

/// Runs `steps` against the table, the checker judging each step and, if `by_model`, the model
/// too (the model still runs without it, to choose live sessions as it would).
fn run_judged(setup: Setup, steps: &[Step], by_model: bool) {
    let limits = limits_of(setup);
    let mut table = LockTable::new(limits);
    let mut model = Model::new(limits);
    let mut checker = Checker::default();
    let mut driver = Driver::default();
    let mut now: u64 = 0;
    let mut restarts = 0_u32;
    for step in steps {
        now += step.advance_ms;
        if let Op::Restart = step.op {
            // Restarts alternate between the JSON snapshot of older versions and the compact
            // image of the binary snapshot (positional: a field left out would shift the rest).
            restarts += 1;
            let restored = if restarts % 2 == 1 {
                let json = serde_json::to_string(&table).expect("table serialises");
                serde_json::from_str(&json).expect("table deserialises")
            } else {
                let bytes = postcard::to_allocvec(&table.image()).expect("image encodes");
                let image: TableImage = postcard::from_bytes(&bytes).expect("image decodes");
                LockTable::from_image(image).expect("the image is of a valid table")
            };
            assert_eq!(restored, table, "snapshot round trip changed the table");
            table = restored;
            continue;
        }
        let Some(command) = driver.command(&step.op, &limits) else {
            continue;
        };
        let now_ms = TimeMs::from_millis(step.behind_ms.map_or(now, |b| now.saturating_sub(b)));
        let input = Input {
            now_ms,
            command: command.clone(),
        };
        let output = table.apply(input.clone());
        let expected = model.apply(input);
        if by_model {
            assert_eq!(
                output, expected,
                "table and model disagree on {command:?} at {now_ms}"
            );
        }
        checker.observe(&table, &command, &output);
        if by_model {
            compare_state(&table, &model);
        }
        driver.learn(&output);
        driver.live = model.sessions.iter().map(|s| s.id).collect();
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn table_matches_the_model_and_keeps_its_invariants(
        small in any::<bool>(),
        few_tokens in any::<bool>(),
        lock_delay in any::<bool>(),
        steps in prop::collection::vec(step(), 1..160),
    ) {
        run(Setup { small, few_tokens, lock_delay }, &steps);
    }
}

/// Each canary of the table's modes is caught within a budget of generated sequences (a fixed
/// seed, so the test is deterministic), by the checker alone and by the model.
#[cfg(feature = "canary")]
#[test]
fn the_checker_and_the_model_catch_each_canary_of_the_modes() {
    use palisade_core::canary::{self, Canary};
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

    /// How many sequences each canary may take to be caught.
    const BUDGET: usize = 2_000;
    let sequences = (
        any::<(bool, bool, bool)>(),
        prop::collection::vec(step(), 1..160),
    );
    for canary_on in Canary::MODES {
        for by_model in [false, true] {
            let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
            let mut runner = TestRunner::new_with_rng(ProptestConfig::default(), rng);
            let caught = (0..BUDGET).find_map(|i| {
                let ((small, few_tokens, lock_delay), steps) = sequences
                    .new_tree(&mut runner)
                    .expect("a sequence")
                    .current();
                let setup = Setup {
                    small,
                    few_tokens,
                    lock_delay,
                };
                canary::set(Some(canary_on));
                let outcome =
                    std::panic::catch_unwind(|| run_judged(setup, &steps, by_model)).err();
                canary::set(None);
                outcome.map(|panic| (i, panic))
            });
            let Some((i, panic)) = caught else {
                panic!(
                    "canary {} not caught in {BUDGET} sequences (by model: {by_model})",
                    canary_on.name()
                );
            };
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!(
                "canary {} caught at sequence {i} (by model: {by_model}): {message}",
                canary_on.name()
            );
            if !by_model {
                // The checker's own verdict, not the table's consistency check.
                let checker_said = [
                    "live holders",
                    "to an acquire of",
                    "grant out of FIFO order",
                    "multi-lock granted in part",
                ];
                assert!(
                    checker_said.iter().any(|m| message.contains(m)),
                    "canary {} caught by something else: {message}",
                    canary_on.name()
                );
            }
        }
    }
}
