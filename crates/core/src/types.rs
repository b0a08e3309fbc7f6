//! The vocabulary of the lock table: commands in, replies, errors and events out.
//!
//! Every type here is plain data with serde, because commands are what the Raft log replicates
//! and the whole table is what a snapshot stores. Applying the same commands to the same state
//! always gives the same replies and events.

use serde::{Deserialize, Serialize};

use crate::limits::{LockNameError, OpenKeyError};

/// A session's id. Assigned by the table from a counter; never reused.
pub type SessionId = u64;
/// A fencing token. Strictly increasing across every grant of a lock; never reused.
pub type Token = u64;
/// A client-chosen id that makes a retried command return its first outcome.
pub type RequestId = u64;
/// Time on the table's clock, in milliseconds. Supplied by the caller; never read from a clock.
pub type TimeMs = u64;

/// A client's random key for opening one session: a retried open with the same key, while the
/// session it opened lives, returns that session instead of opening another.
///
/// Unlike a [`RequestId`], which only has to differ from the other ids of one session, an open
/// key is compared with the keys of every client, so it must be impossible to pick twice by
/// accident and infeasible to guess. The type holds only keys that pass
/// [`crate::limits::validate_open_key`], including those read back from the log or a snapshot.
/// `Debug` shows the length only: while its session lives, the key is what a retry presents.
///
/// Serialised as lowercase hex (a string, so it can key a JSON map in a snapshot).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OpenKey(Vec<u8>);

impl OpenKey {
    /// A key from a client's bytes, refused unless it could be random.
    pub fn new(bytes: &[u8]) -> Result<OpenKey, OpenKeyError> {
        crate::limits::validate_open_key(bytes)?;
        Ok(OpenKey(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl TryFrom<String> for OpenKey {
    type Error = OpenKeyError;

    fn try_from(hex: String) -> Result<OpenKey, OpenKeyError> {
        let digit = |c: u8| (c as char).to_digit(16).filter(|_| !c.is_ascii_uppercase());
        if !hex.len().is_multiple_of(2) {
            return Err(OpenKeyError::NotHex);
        }
        let bytes = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
            .collect::<Option<Vec<u8>>>()
            .ok_or(OpenKeyError::NotHex)?;
        OpenKey::new(&bytes)
    }
}

impl From<OpenKey> for String {
    fn from(key: OpenKey) -> String {
        key.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for OpenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpenKey({} bytes)", self.0.len())
    }
}

/// One command together with the time at which it takes effect.
///
/// The time is the leader's monotonic clock mapped onto the table's timeline; the table never
/// moves its clock backwards (an older `now_ms` is treated as the table's current time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    pub now_ms: TimeMs,
    pub command: Command,
}

impl std::fmt::Display for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {} ms: {:?}", self.now_ms, self.command)
    }
}

/// How long an acquire may wait in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wait {
    /// Grant now or fail with [`CoreError::Busy`].
    Try,
    /// Queue for at most this many milliseconds.
    ForMs(u64),
    /// Queue until granted or the session ends.
    Forever,
}

/// A change to the lock table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Open a session whose lease lasts `ttl_ms` after each keepalive.
    ///
    /// With an `open_key`, an open retried with the same key while the session it opened lives
    /// returns that session (whatever its `ttl_ms`); once that session has ended the key opens a
    /// new one, never the old. Without a key every open opens a new session.
    ///
    /// Serialised under a name of its own, so that a log entry of an older version (which
    /// deduplicated opens by request id across every client) is never read as this command,
    /// and an older version refuses an entry of this one instead of misreading it.
    #[serde(rename = "OpenSessionWithKey")]
    OpenSession {
        open_key: Option<OpenKey>,
        ttl_ms: u64,
    },
    /// The open of versions before open keys, as their log entries spell it: deduplicated by
    /// `request_id` across every client, so two clients sending the same id shared a session.
    ///
    /// Nothing proposes it any more. It exists so that a log written by such a version replays
    /// into exactly the sessions it produced then (same ids, same sharing); the server never
    /// builds it from a request.
    #[serde(rename = "OpenSession")]
    OpenSessionByRequestId { request_id: RequestId, ttl_ms: u64 },
    /// Renew a session's lease for another full TTL.
    KeepAlive { session: SessionId },
    /// End a session: release its locks and withdraw its waits.
    CloseSession { session: SessionId },
    /// Take `lock` for `session`, or queue behind its holder.
    Acquire {
        session: SessionId,
        lock: String,
        request_id: RequestId,
        wait: Wait,
    },
    /// Give up `lock` (or withdraw the session's wait for it).
    Release {
        session: SessionId,
        lock: String,
        request_id: RequestId,
    },
    /// Let time pass: expire leases, end waits past their deadline, end lock-delays.
    Tick,
    /// Replace the limits the table enforces from this point of the log on. Limits decide
    /// outcomes, so they change only through the log: a replay then applies every command
    /// under the limits it was first applied with (invariant 1 depends on it).
    SetLimits { limits: crate::Limits },
    /// A leader took over: every session's lease restarts its full TTL from now (invariant 6:
    /// leases are extended by a change of leader or a restart, never shortened).
    LeaderStart,
}

/// What a successful command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    SessionOpened {
        session: SessionId,
        ttl_ms: u64,
        expires_at_ms: TimeMs,
    },
    KeptAlive {
        session: SessionId,
        expires_at_ms: TimeMs,
    },
    SessionClosed {
        session: SessionId,
    },
    /// The session holds the lock with this token.
    Granted {
        lock: String,
        session: SessionId,
        token: Token,
    },
    /// The session waits in the lock's queue; `position` 0 is next in line.
    Queued {
        lock: String,
        session: SessionId,
        position: usize,
    },
    /// The session no longer holds the lock (`token`) or no longer waits for it (`token` None).
    Released {
        lock: String,
        session: SessionId,
        token: Option<Token>,
    },
    Ticked,
    LimitsSet,
    LeaderStarted {
        sessions_extended: usize,
    },
}

/// Why a command was refused. Nothing in the table changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CoreError {
    #[error("session {session} does not exist (it expired or was closed); open a new session")]
    SessionNotFound { session: SessionId },
    #[error("ttl {ttl_ms} ms is outside the allowed range {ttl_ms_min}..={ttl_ms_max} ms")]
    TtlOutOfRange {
        ttl_ms: u64,
        ttl_ms_min: u64,
        ttl_ms_max: u64,
    },
    #[error("wait {wait_ms} ms is above the limit of {wait_ms_max} ms")]
    WaitOutOfRange { wait_ms: u64, wait_ms_max: u64 },
    #[error("invalid lock name: {0}")]
    InvalidLockName(LockNameError),
    #[error("invalid open key: {0}")]
    InvalidOpenKey(OpenKeyError),
    #[error("too many sessions: the limit is {sessions_max}; close unused sessions")]
    TooManySessions { sessions_max: usize },
    #[error("too many locks: the limit is {locks_max}")]
    TooManyLocks { locks_max: usize },
    #[error("lock {lock:?} already has {waiters_max} waiters, the limit")]
    TooManyWaiters { lock: String, waiters_max: usize },
    #[error("lock {lock:?} is busy{}", describe_busy(*holder_session, *holder_token, *available_at_ms))]
    Busy {
        lock: String,
        holder_session: Option<SessionId>,
        holder_token: Option<Token>,
        /// Set while the lock sits out its lock-delay after a holder's session expired.
        available_at_ms: Option<TimeMs>,
    },
    #[error("session {session} does not hold lock {lock:?}{}", describe_holder(*holder_session))]
    NotHolder {
        lock: String,
        session: SessionId,
        holder_session: Option<SessionId>,
    },
    #[error("lock {lock:?} cannot be granted: its fencing tokens are exhausted")]
    TokensExhausted { lock: String },
    #[error(
        "the wait for lock {lock:?} ended before it was granted (deadline passed or withdrawn)"
    )]
    WaitEnded { lock: String },
    #[error("invalid limits: {message}")]
    InvalidLimits { message: String },
    #[error("request id {request_id} was already used for a different command in this session")]
    RequestIdConflict { request_id: RequestId },
}

fn describe_busy(
    session: Option<SessionId>,
    token: Option<Token>,
    until: Option<TimeMs>,
) -> String {
    match (session, token, until) {
        (Some(s), Some(t), _) => format!(": held by session {s} with token {t}"),
        (_, _, Some(u)) => format!(": in lock-delay until {u} ms after its holder expired"),
        _ => String::new(),
    }
}

fn describe_holder(session: Option<SessionId>) -> String {
    match session {
        Some(s) => format!("; it is held by session {s}"),
        None => "; it is free".to_string(),
    }
}

impl CoreError {
    /// True when the same command may succeed later without the caller changing anything.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CoreError::Busy { .. }
                | CoreError::TooManySessions { .. }
                | CoreError::TooManyLocks { .. }
                | CoreError::TooManyWaiters { .. }
        )
    }
}

/// Why a holder stopped holding a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseCause {
    Released,
    SessionExpired,
    SessionClosed,
}

/// Why a waiter left a queue without being granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitEndCause {
    TimedOut,
    Withdrawn,
    SessionEnded,
}

/// Something that happened while a command was applied, for watchers and waiting clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    Granted {
        lock: String,
        session: SessionId,
        token: Token,
        request_id: RequestId,
    },
    Released {
        lock: String,
        session: SessionId,
        token: Token,
        cause: ReleaseCause,
    },
    WaitEnded {
        lock: String,
        session: SessionId,
        request_id: RequestId,
        cause: WaitEndCause,
    },
    SessionEnded {
        session: SessionId,
        expired: bool,
    },
}

impl Event {
    /// The lock this event concerns, if any.
    pub fn lock(&self) -> Option<&str> {
        match self {
            Event::Granted { lock, .. }
            | Event::Released { lock, .. }
            | Event::WaitEnded { lock, .. } => Some(lock),
            Event::SessionEnded { .. } => None,
        }
    }
}

/// The result of applying one [`Input`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub result: Result<Reply, CoreError>,
    pub events: Vec<Event>,
}

/// The current holding of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub session: SessionId,
    pub token: Token,
    pub granted_at_ms: TimeMs,
    pub request_id: RequestId,
}

/// A read-only view of one lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockStatus {
    pub lock: String,
    pub holder: Option<Grant>,
    /// The last token granted for this lock since it was last created.
    pub last_token: Token,
    /// Waiting sessions, first in line first.
    pub waiters: Vec<SessionId>,
    /// When the holder's lease ends (the holding session's expiry), if held.
    pub holder_expires_at_ms: Option<TimeMs>,
    /// Set while the lock sits out its lock-delay.
    pub available_at_ms: Option<TimeMs>,
}

/// A read-only view of one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub session: SessionId,
    pub ttl_ms: u64,
    pub expires_at_ms: TimeMs,
    pub held: Vec<String>,
    pub waiting: Vec<String>,
}
