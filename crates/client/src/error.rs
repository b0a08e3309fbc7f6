//! One error enum per operation, decoded from gRPC statuses.
//!
//! The server sends a refusal as a status code plus, in the status details, the `ErrorDetail`
//! of the [`CoreError`] that explains it (decoded by `palisade_proto::error`, which owns the wire
//! form). [`Failure::from_status`] turns any status (from the server or from the local
//! transport) into one of four situations, which every operation then names in its own enum:
//!
//! - the server **refused** the command, with a [`CoreError`]: nothing changed;
//! - the request was **not applied** and may be retried (`UNAVAILABLE`, or the connection could
//!   not even be made); an `UNAVAILABLE` from a member that is not the leader may name the
//!   leader (`palisade-leader-addr`), which [`Failure::NotLeader`] carries;
//! - the **outcome is unknown** (a timeout, a connection that broke after the request was sent,
//!   `UNKNOWN`): the command may have taken effect (invariant 8: never reported as failed);
//! - anything else the server answered, kept with its code and message.
//!
//! Each operation's error also has a [`class`](AcquireError::class), an [`ErrorClass`] that
//! says how a caller reacts; every mapping here is an exhaustive match (on the client's own
//! enums, or on [`palisade_core::ErrorCategory`] for the lock table's `#[non_exhaustive]`
//! errors), so a new variant does not compile until it is classified.
//!
//! Messages are lowercase, without a trailing period, and say what to do.

use std::error::Error as StdError;
use std::time::Duration;

use palisade_core::error_chain::with_causes;
use palisade_core::{
    CoreError, DurationMs, ErrorCategory, HeldBy, SessionId, Token, holder_clause,
};
use tonic::{Code, Status};

/// How a caller reacts to a failed call, one class per reaction: what the `palisade` binary
/// turns into an exit status.
///
/// Deliberately not `#[non_exhaustive]`: a new class does not compile until every caller that
/// matches on it handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The service refused the request as made (not the holder, no such session, invalid
    /// input): sending it again unchanged fails again.
    Refused,
    /// The lock was not acquired (busy, the wait ended, a limit on waiters or locks); trying
    /// again later may succeed.
    NotAcquired,
    /// Nothing was done: the service cannot be reached or cannot serve now; retry.
    Unavailable,
    /// The request may or may not have taken effect.
    OutcomeUnknown,
    /// The service broke the protocol or failed internally.
    Internal,
    /// The client is configured wrongly (e.g. an invalid endpoint).
    Misconfigured,
}

impl ErrorClass {
    /// The class of a status code the client library does not name otherwise.
    fn of_code(code: Code) -> ErrorClass {
        match code {
            Code::Internal | Code::DataLoss | Code::Unimplemented => ErrorClass::Internal,
            Code::Unavailable | Code::ResourceExhausted => ErrorClass::Unavailable,
            // `Failure::from_status` already reads these as unknown outcomes.
            Code::Unknown | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                ErrorClass::OutcomeUnknown
            }
            Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unauthenticated => ErrorClass::Refused,
        }
    }
}

/// What a failed call means, before it is named for one operation.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The server refused the command and said why; nothing changed.
    Core(CoreError),
    /// `NOT_FOUND` without details: the session does not exist.
    SessionNotFound(String),
    /// `INVALID_ARGUMENT` without details.
    InvalidArgument(String),
    /// The request was not applied; retrying may succeed.
    NotApplied(String),
    /// `UNAVAILABLE` from a member that is not the leader, naming the leader: the request was
    /// not applied, and `leader` (a URL, `http://host:port`) is where to send it instead.
    NotLeader { leader: String, message: String },
    /// The request may or may not have been applied.
    Unknown(String),
    /// Any other status.
    Rejected { code: Code, message: String },
}

impl Failure {
    /// Classifies a status from a call.
    pub(crate) fn from_status(status: &Status) -> Failure {
        if let Some(core) = palisade_proto::error::core_from_status(status) {
            return Failure::Core(core);
        }
        let message = describe_status(status);
        // A status built locally from a transport error carries its source; one that came from
        // the server (in response trailers) does not.
        if status.source().is_some() {
            if chain_has_connect_error(status) {
                return Failure::NotApplied(message);
            }
            return Failure::Unknown(message);
        }
        match status.code() {
            Code::Unavailable => match leader_hint(status) {
                Some(leader) => Failure::NotLeader {
                    message: format!("{message} (the leader is at {leader})"),
                    leader,
                },
                None => Failure::NotApplied(message),
            },
            Code::ResourceExhausted => Failure::NotApplied(message),
            Code::Unknown | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                Failure::Unknown(message)
            }
            Code::NotFound => Failure::SessionNotFound(message),
            Code::InvalidArgument => Failure::InvalidArgument(message),
            code @ (Code::Ok
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Internal
            | Code::DataLoss
            | Code::Unauthenticated) => Failure::Rejected { code, message },
        }
    }

    /// A call that got no answer within `after`.
    pub(crate) fn timed_out(after: Duration) -> Failure {
        Failure::Unknown(format!("no answer within {} ms", after.as_millis()))
    }
}

/// The leader a member names in an `UNAVAILABLE` answer ([`palisade_proto::LEADER_ADDR_HEADER`],
/// `host:port`), as a URL to connect to: `http://host:port`. `None` when the member names no
/// leader (an election is in progress, or it is shutting down) or names one this client could
/// not connect to (not `host:port`).
pub(crate) fn leader_hint(status: &Status) -> Option<String> {
    let addr = status
        .metadata()
        .get(palisade_proto::LEADER_ADDR_HEADER)?
        .to_str()
        .ok()?
        .trim();
    // `host:port` and nothing else: no scheme, no path, no user.
    if addr.is_empty() || addr.contains(['/', '@', ',']) || addr.chars().any(char::is_whitespace) {
        return None;
    }
    let url = format!("http://{addr}");
    let uri: tonic::transport::Uri = url.parse().ok()?;
    let authority = uri.authority()?;
    if authority.host().is_empty() || authority.port_u16().is_none() {
        return None;
    }
    Some(url)
}

/// The status message with the chain of local causes, e.g. `transport error: connection refused`.
fn describe_status(status: &Status) -> String {
    let message = if status.message().is_empty() {
        format!("{:?}", status.code())
    } else {
        status.message().to_string()
    };
    with_causes(message, status.source())
}

/// True when the status comes from failing to connect, so the request was never sent.
fn chain_has_connect_error(status: &Status) -> bool {
    let mut source: Option<&(dyn StdError + 'static)> = status.source();
    while let Some(cause) = source {
        if cause.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Why [`crate::Client::connect`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    #[error(
        "invalid endpoint {endpoint:?}: {reason}; expected e.g. http://127.0.0.1:7457, or a comma-separated list of up to {} such addresses",
        crate::limits::ENDPOINTS_MAX
    )]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error(
        "cannot connect to the lock service at {endpoint}: {reason}; is `palisade serve` running there? (set --endpoint or PALISADE_ENDPOINT)"
    )]
    Unreachable { endpoint: String, reason: String },
}

impl ConnectError {
    /// True when connecting again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ConnectError::Unreachable { .. })
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            ConnectError::InvalidEndpoint { .. } => ErrorClass::Misconfigured,
            ConnectError::Unreachable { .. } => ErrorClass::Unavailable,
        }
    }
}

/// Why a session could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error(
        "session ttl {ttl_ms} ms is outside the allowed range {ttl_ms_min}..={ttl_ms_max} ms; pick a ttl in that range"
    )]
    TtlOutOfRange {
        ttl_ms: DurationMs,
        ttl_ms_min: DurationMs,
        ttl_ms_max: DurationMs,
    },
    #[error("the lock service has {sessions_max} sessions open, its limit; retry later")]
    TooManySessions { sessions_max: u32 },
    #[error("invalid session request: {0}")]
    InvalidArgument(String),
    #[error("the lock service is unavailable, no session was opened ({0}); retry later")]
    Unavailable(String),
    #[error(
        "opening a session has an unknown outcome ({0}); if a session was opened it expires after its ttl"
    )]
    Unknown(String),
    #[error("the lock service refused to open a session: {0}")]
    Refused(CoreError),
    #[error("the lock service answered with an invalid response: {0}")]
    Protocol(String),
    /// No request was sent: without secure randomness the open key could equal another
    /// client's, and the server would hand this client that client's session.
    #[error(
        "no secure randomness for the session's open key ({reason}); no session was opened, check the OS random source"
    )]
    NoRandomness { reason: String },
    #[error("the lock service refused to open a session ({code:?}): {message}")]
    Rejected { code: Code, message: String },
}

impl SessionError {
    /// True when opening a session again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            SessionError::TooManySessions { .. }
            | SessionError::Unavailable(_)
            | SessionError::Unknown(_) => true,
            SessionError::Refused(core) => core.is_retryable(),
            SessionError::TtlOutOfRange { .. }
            | SessionError::InvalidArgument(_)
            | SessionError::Protocol(_)
            | SessionError::NoRandomness { .. }
            | SessionError::Rejected { .. } => false,
        }
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            SessionError::Unavailable(_) | SessionError::TooManySessions { .. } => {
                ErrorClass::Unavailable
            }
            SessionError::Unknown(_) => ErrorClass::OutcomeUnknown,
            SessionError::Protocol(_) => ErrorClass::Internal,
            SessionError::Rejected { code, .. } => ErrorClass::of_code(*code),
            SessionError::TtlOutOfRange { .. }
            | SessionError::InvalidArgument(_)
            | SessionError::Refused(_)
            | SessionError::NoRandomness { .. } => ErrorClass::Refused,
        }
    }

    pub(crate) fn from_failure(failure: Failure) -> SessionError {
        match failure {
            Failure::Core(CoreError::TtlOutOfRange {
                ttl_ms,
                ttl_ms_min,
                ttl_ms_max,
            }) => SessionError::TtlOutOfRange {
                ttl_ms,
                ttl_ms_min,
                ttl_ms_max,
            },
            Failure::Core(CoreError::TooManySessions { sessions_max }) => {
                SessionError::TooManySessions { sessions_max }
            }
            Failure::Core(CoreError::RequestIdConflict { request_id }) => {
                SessionError::InvalidArgument(format!(
                    "request id {request_id} was already used for a different command"
                ))
            }
            Failure::Core(core) => match unnamed(core) {
                Unnamed::InvalidInput(message) => SessionError::InvalidArgument(message),
                Unnamed::Refused(core) => SessionError::Refused(core),
            },
            Failure::InvalidArgument(message) => SessionError::InvalidArgument(message),
            Failure::NotApplied(message) | Failure::NotLeader { message, .. } => {
                SessionError::Unavailable(message)
            }
            Failure::Unknown(message) => SessionError::Unknown(message),
            Failure::SessionNotFound(message) => SessionError::Rejected {
                code: Code::NotFound,
                message,
            },
            Failure::Rejected { code, message } => SessionError::Rejected { code, message },
        }
    }
}

/// Why a lock was not acquired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The lock is held by another session (only for [`crate::Wait::Try`], or when the wait had
    /// already run out).
    #[error("lock {lock:?} is busy{}; wait for it or try again later", describe_busy(*holder_session, *holder_token, *in_lock_delay))]
    Busy {
        lock: String,
        holder_session: Option<SessionId>,
        holder_token: Option<Token>,
        /// The lock has no holder but sits out its lock-delay after a holder's session expired.
        in_lock_delay: bool,
    },
    /// The wait ended before the lock was granted (its time ran out, or it was withdrawn).
    #[error("lock {lock:?} was not granted before the wait ended; wait longer or try again later")]
    WaitEnded { lock: String },
    #[error("session {session} does not exist (it expired or was closed); open a new session")]
    SessionNotFound { session: SessionId },
    /// The session was lost while acquiring (see [`crate::SessionLost`]).
    #[error("session {session} was lost while acquiring lock {lock:?}: {reason}")]
    SessionLost {
        lock: String,
        session: SessionId,
        reason: SessionLost,
    },
    #[error("lock {lock:?} already has {waiters_max} waiters, the limit; retry later")]
    TooManyWaiters { lock: String, waiters_max: u32 },
    #[error("the lock service holds {locks_max} locks, its limit; retry later")]
    TooManyLocks { locks_max: u32 },
    #[error("lock {lock:?} cannot be granted any more: its fencing tokens are exhausted")]
    TokensExhausted { lock: String },
    #[error("invalid acquire request: {0}")]
    InvalidArgument(String),
    /// Invariant 8: the acquire may have taken effect. Acquiring the same lock again in the same
    /// session returns that grant if it exists; closing the session ends it.
    #[error(
        "acquiring lock {lock:?} in session {session} has an unknown outcome ({reason}); the lock may be held by this session: acquire again in it, or close it"
    )]
    Unknown {
        lock: String,
        session: SessionId,
        reason: String,
    },
    #[error("the lock service is unavailable, lock not acquired ({0}); retry later")]
    Unavailable(String),
    #[error("the lock service refused the acquire: {0}")]
    Refused(CoreError),
    /// The server broke the protocol; the lock may be held by the session.
    #[error(
        "the lock service answered the acquire with an invalid response ({0}); the lock may be held by this session: close the session"
    )]
    Protocol(String),
    #[error("the lock service refused the acquire ({code:?}): {message}")]
    Rejected { code: Code, message: String },
}

/// A lock-table refusal that an operation has no variant of its own for: invalid input (the
/// caller's to fix, reported as its `InvalidArgument`) or refused as it is. One exhaustive match
/// on the category, so a new category is classified here once for every operation.
enum Unnamed {
    InvalidInput(String),
    Refused(CoreError),
}

fn unnamed(core: CoreError) -> Unnamed {
    match core.category() {
        ErrorCategory::InvalidInput => Unnamed::InvalidInput(core.to_string()),
        ErrorCategory::SessionNotFound
        | ErrorCategory::LimitReached
        | ErrorCategory::Busy
        | ErrorCategory::NotHolder
        | ErrorCategory::WaitEnded
        | ErrorCategory::Exhausted
        | ErrorCategory::Internal
        | ErrorCategory::Unauthenticated
        | ErrorCategory::PermissionDenied => Unnamed::Refused(core),
    }
}

fn describe_busy(session: Option<SessionId>, token: Option<Token>, in_lock_delay: bool) -> String {
    match session {
        Some(session) => format!(": {}", HeldBy { session, token }),
        None if in_lock_delay => ": in lock-delay after its holder's session expired".to_string(),
        None => String::new(),
    }
}

impl AcquireError {
    /// True when the same acquire may succeed later without the caller changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            AcquireError::Busy { .. }
            | AcquireError::WaitEnded { .. }
            | AcquireError::TooManyWaiters { .. }
            | AcquireError::TooManyLocks { .. }
            | AcquireError::Unknown { .. }
            | AcquireError::Unavailable(_) => true,
            AcquireError::Refused(core) => core.is_retryable(),
            AcquireError::SessionNotFound { .. }
            | AcquireError::SessionLost { .. }
            | AcquireError::TokensExhausted { .. }
            | AcquireError::InvalidArgument(_)
            | AcquireError::Protocol(_)
            | AcquireError::Rejected { .. } => false,
        }
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            AcquireError::Busy { .. }
            | AcquireError::WaitEnded { .. }
            | AcquireError::TooManyWaiters { .. }
            | AcquireError::TooManyLocks { .. } => ErrorClass::NotAcquired,
            AcquireError::Unavailable(_) | AcquireError::SessionLost { .. } => {
                ErrorClass::Unavailable
            }
            AcquireError::Unknown { .. } => ErrorClass::OutcomeUnknown,
            AcquireError::Protocol(_) => ErrorClass::Internal,
            AcquireError::Rejected { code, .. } => ErrorClass::of_code(*code),
            AcquireError::SessionNotFound { .. }
            | AcquireError::TokensExhausted { .. }
            | AcquireError::InvalidArgument(_)
            | AcquireError::Refused(_) => ErrorClass::Refused,
        }
    }

    /// True when the lock may be held by the session despite the error (invariant 8).
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            AcquireError::Unknown { .. } | AcquireError::Protocol(_)
        )
    }

    pub(crate) fn from_failure(failure: Failure, session: SessionId, lock: &str) -> AcquireError {
        match failure {
            Failure::Core(core) => AcquireError::from_core(core),
            Failure::SessionNotFound(_) => AcquireError::SessionNotFound { session },
            Failure::InvalidArgument(message) => AcquireError::InvalidArgument(message),
            Failure::NotApplied(message) | Failure::NotLeader { message, .. } => {
                AcquireError::Unavailable(message)
            }
            Failure::Unknown(reason) => AcquireError::Unknown {
                lock: lock.to_string(),
                session,
                reason,
            },
            Failure::Rejected { code, message } => AcquireError::Rejected { code, message },
        }
    }

    fn from_core(core: CoreError) -> AcquireError {
        match core {
            CoreError::Busy {
                lock,
                holder_session,
                holder_token,
                available_at_ms,
            } => AcquireError::Busy {
                lock,
                holder_session,
                holder_token,
                in_lock_delay: holder_session.is_none() && available_at_ms.is_some(),
            },
            CoreError::WaitEnded { lock } => AcquireError::WaitEnded { lock },
            CoreError::SessionNotFound { session } => AcquireError::SessionNotFound { session },
            CoreError::TooManyWaiters { lock, waiters_max } => {
                AcquireError::TooManyWaiters { lock, waiters_max }
            }
            CoreError::TooManyLocks { locks_max } => AcquireError::TooManyLocks { locks_max },
            CoreError::TokensExhausted { lock } => AcquireError::TokensExhausted { lock },
            // The rest carry nothing an acquire names on its own: classified by category.
            core => match unnamed(core) {
                Unnamed::InvalidInput(message) => AcquireError::InvalidArgument(message),
                Unnamed::Refused(core) => AcquireError::Refused(core),
            },
        }
    }
}

/// Why a lock was not released.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReleaseError {
    /// Invariant 8: only the holding session may release.
    #[error("session {session} does not hold lock {lock:?}{}", describe_holder(*holder_session))]
    NotHolder {
        lock: String,
        session: SessionId,
        holder_session: Option<SessionId>,
    },
    #[error(
        "session {session} does not exist (it expired or was closed), so it holds no lock any more"
    )]
    SessionNotFound { session: SessionId },
    #[error("invalid release request: {0}")]
    InvalidArgument(String),
    #[error(
        "releasing lock {lock:?} has an unknown outcome ({reason}); release again with the same session, or let the session expire"
    )]
    Unknown { lock: String, reason: String },
    #[error("the lock service is unavailable, lock not released ({0}); retry later")]
    Unavailable(String),
    #[error("the lock service refused the release: {0}")]
    Refused(CoreError),
    #[error("the lock service answered the release with an invalid response: {0}")]
    Protocol(String),
    #[error("the lock service refused the release ({code:?}): {message}")]
    Rejected { code: Code, message: String },
}

fn describe_holder(session: Option<SessionId>) -> String {
    holder_clause(session.map(HeldBy::session))
}

impl ReleaseError {
    /// True when the same release may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ReleaseError::Unknown { .. } | ReleaseError::Unavailable(_)
        )
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            ReleaseError::Unavailable(_) => ErrorClass::Unavailable,
            ReleaseError::Unknown { .. } => ErrorClass::OutcomeUnknown,
            ReleaseError::Protocol(_) => ErrorClass::Internal,
            ReleaseError::Rejected { code, .. } => ErrorClass::of_code(*code),
            ReleaseError::NotHolder { .. }
            | ReleaseError::SessionNotFound { .. }
            | ReleaseError::InvalidArgument(_)
            | ReleaseError::Refused(_) => ErrorClass::Refused,
        }
    }

    pub(crate) fn from_failure(failure: Failure, session: SessionId, lock: &str) -> ReleaseError {
        match failure {
            Failure::Core(CoreError::NotHolder {
                lock,
                session,
                holder_session,
            }) => ReleaseError::NotHolder {
                lock,
                session,
                holder_session,
            },
            Failure::Core(CoreError::SessionNotFound { session }) => {
                ReleaseError::SessionNotFound { session }
            }
            Failure::Core(core) => match unnamed(core) {
                Unnamed::InvalidInput(message) => ReleaseError::InvalidArgument(message),
                Unnamed::Refused(core) => ReleaseError::Refused(core),
            },
            Failure::SessionNotFound(_) => ReleaseError::SessionNotFound { session },
            Failure::InvalidArgument(message) => ReleaseError::InvalidArgument(message),
            Failure::NotApplied(message) | Failure::NotLeader { message, .. } => {
                ReleaseError::Unavailable(message)
            }
            Failure::Unknown(reason) => ReleaseError::Unknown {
                lock: lock.to_string(),
                reason,
            },
            Failure::Rejected { code, message } => ReleaseError::Rejected { code, message },
        }
    }
}

/// Why a grant's value was not replaced ([`crate::Client::proclaim`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProclaimError {
    /// The grant named is not the lock's holding any more (or never was this session's): a
    /// leader that lost its leadership cannot proclaim.
    #[error(
        "session {session} does not hold lock {lock:?} with the grant it named{}",
        describe_holder(*holder_session)
    )]
    NotHolder {
        lock: String,
        session: SessionId,
        holder_session: Option<SessionId>,
    },
    #[error(
        "session {session} does not exist (it expired or was closed), so it holds no lock any more"
    )]
    SessionNotFound { session: SessionId },
    #[error("invalid proclaim request: {0}")]
    InvalidArgument(String),
    #[error(
        "proclaiming a value for lock {lock:?} has an unknown outcome ({reason}); proclaim again (it is harmless) or read the lock"
    )]
    Unknown { lock: String, reason: String },
    #[error("the lock service is unavailable, value not set ({0}); retry later")]
    Unavailable(String),
    #[error("the lock service refused the proclaim: {0}")]
    Refused(CoreError),
    #[error("the lock service answered the proclaim with an invalid response: {0}")]
    Protocol(String),
    #[error("the lock service refused the proclaim ({code:?}): {message}")]
    Rejected { code: Code, message: String },
}

impl ProclaimError {
    /// True when the same proclaim may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProclaimError::Unknown { .. } | ProclaimError::Unavailable(_)
        )
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            ProclaimError::Unavailable(_) => ErrorClass::Unavailable,
            ProclaimError::Unknown { .. } => ErrorClass::OutcomeUnknown,
            ProclaimError::Protocol(_) => ErrorClass::Internal,
            ProclaimError::Rejected { code, .. } => ErrorClass::of_code(*code),
            ProclaimError::NotHolder { .. }
            | ProclaimError::SessionNotFound { .. }
            | ProclaimError::InvalidArgument(_)
            | ProclaimError::Refused(_) => ErrorClass::Refused,
        }
    }

    pub(crate) fn from_failure(failure: Failure, session: SessionId, lock: &str) -> ProclaimError {
        // The release's mapping names the same refusals; only the type differs.
        match ReleaseError::from_failure(failure, session, lock) {
            ReleaseError::NotHolder {
                lock,
                session,
                holder_session,
            } => ProclaimError::NotHolder {
                lock,
                session,
                holder_session,
            },
            ReleaseError::SessionNotFound { session } => ProclaimError::SessionNotFound { session },
            ReleaseError::InvalidArgument(message) => ProclaimError::InvalidArgument(message),
            ReleaseError::Unknown { lock, reason } => ProclaimError::Unknown { lock, reason },
            ReleaseError::Unavailable(message) => ProclaimError::Unavailable(message),
            ReleaseError::Refused(core) => ProclaimError::Refused(core),
            ReleaseError::Rejected { code, message } => ProclaimError::Rejected { code, message },
            ReleaseError::Protocol(message) => ProclaimError::Protocol(message),
        }
    }
}

/// Why a session's lease was not renewed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RenewError {
    #[error(
        "session {session} does not exist (it expired or was closed); every lock it held is lost"
    )]
    SessionNotFound { session: SessionId },
    #[error(
        "renewing session {session} has an unknown outcome ({reason}); renew again before its lease runs out"
    )]
    Unknown { session: SessionId, reason: String },
    #[error("the lock service is unavailable, lease not renewed ({0}); retry soon")]
    Unavailable(String),
    #[error("invalid renew request: {0}")]
    InvalidArgument(String),
    #[error("the lock service refused the renewal: {0}")]
    Refused(CoreError),
    #[error("the lock service answered the renewal with an invalid response: {0}")]
    Protocol(String),
    #[error("the lock service refused the renewal ({code:?}): {message}")]
    Rejected { code: Code, message: String },
}

impl RenewError {
    /// True when renewing again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RenewError::Unknown { .. } | RenewError::Unavailable(_)
        )
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            RenewError::Unavailable(_) => ErrorClass::Unavailable,
            RenewError::Unknown { .. } => ErrorClass::OutcomeUnknown,
            RenewError::Protocol(_) => ErrorClass::Internal,
            RenewError::Rejected { code, .. } => ErrorClass::of_code(*code),
            RenewError::SessionNotFound { .. }
            | RenewError::InvalidArgument(_)
            | RenewError::Refused(_) => ErrorClass::Refused,
        }
    }

    pub(crate) fn from_failure(failure: Failure, session: SessionId) -> RenewError {
        match failure {
            Failure::Core(CoreError::SessionNotFound { .. }) | Failure::SessionNotFound(_) => {
                RenewError::SessionNotFound { session }
            }
            Failure::Core(core) => match unnamed(core) {
                Unnamed::InvalidInput(message) => RenewError::InvalidArgument(message),
                Unnamed::Refused(core) => RenewError::Refused(core),
            },
            Failure::InvalidArgument(message) => RenewError::InvalidArgument(message),
            Failure::NotApplied(message) | Failure::NotLeader { message, .. } => {
                RenewError::Unavailable(message)
            }
            Failure::Unknown(reason) => RenewError::Unknown { session, reason },
            Failure::Rejected { code, message } => RenewError::Rejected { code, message },
        }
    }
}

/// Why a session was not closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseError {
    /// The session had already ended: every lock it held was released when it did.
    #[error("session {session} does not exist (it had already expired or been closed)")]
    SessionNotFound { session: SessionId },
    #[error(
        "closing session {session} has an unknown outcome ({reason}); it expires after its ttl if it is still open"
    )]
    Unknown { session: SessionId, reason: String },
    #[error("the lock service is unavailable, session not closed ({0}); it expires after its ttl")]
    Unavailable(String),
    #[error("the lock service refused to close the session: {0}")]
    Refused(CoreError),
    #[error("the lock service answered the close with an invalid response: {0}")]
    Protocol(String),
    #[error("the lock service refused to close the session ({code:?}): {message}")]
    Rejected { code: Code, message: String },
}

impl CloseError {
    /// True when closing again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CloseError::Unknown { .. } | CloseError::Unavailable(_)
        )
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            CloseError::Unavailable(_) => ErrorClass::Unavailable,
            CloseError::Unknown { .. } => ErrorClass::OutcomeUnknown,
            CloseError::Protocol(_) => ErrorClass::Internal,
            CloseError::Rejected { code, .. } => ErrorClass::of_code(*code),
            CloseError::SessionNotFound { .. } | CloseError::Refused(_) => ErrorClass::Refused,
        }
    }

    pub(crate) fn from_failure(failure: Failure, session: SessionId) -> CloseError {
        match failure {
            Failure::Core(CoreError::SessionNotFound { .. }) | Failure::SessionNotFound(_) => {
                CloseError::SessionNotFound { session }
            }
            Failure::Core(core) => CloseError::Refused(core),
            Failure::InvalidArgument(message) => CloseError::Rejected {
                code: Code::InvalidArgument,
                message,
            },
            Failure::NotApplied(message) | Failure::NotLeader { message, .. } => {
                CloseError::Unavailable(message)
            }
            Failure::Unknown(reason) => CloseError::Unknown { session, reason },
            Failure::Rejected { code, message } => CloseError::Rejected { code, message },
        }
    }
}

/// Why a read (`status`, `list_locks`, `watch`, `public_key`) failed.
///
/// Reads change nothing, so they share one enum: their outcome is never unknown, and every
/// failure means the same thing for each of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    #[error("the lock service is unavailable ({0}); retry later")]
    Unavailable(String),
    #[error("the lock service refused the request: {0}")]
    Refused(CoreError),
    #[error("the lock service answered with an invalid response: {0}")]
    Protocol(String),
    #[error("the lock service refused the request ({code:?}): {message}")]
    Rejected { code: Code, message: String },
}

impl QueryError {
    /// True when the same read may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, QueryError::Unavailable(_))
    }

    /// How a caller reacts.
    pub fn class(&self) -> ErrorClass {
        match self {
            QueryError::Unavailable(_) => ErrorClass::Unavailable,
            QueryError::Protocol(_) => ErrorClass::Internal,
            QueryError::Rejected { code, .. } => ErrorClass::of_code(*code),
            QueryError::InvalidArgument(_) | QueryError::Refused(_) => ErrorClass::Refused,
        }
    }

    pub(crate) fn from_failure(failure: Failure) -> QueryError {
        match failure {
            Failure::Core(core) => match unnamed(core) {
                Unnamed::InvalidInput(message) => QueryError::InvalidArgument(message),
                Unnamed::Refused(core) => QueryError::Refused(core),
            },
            Failure::InvalidArgument(message) => QueryError::InvalidArgument(message),
            Failure::NotApplied(message)
            | Failure::NotLeader { message, .. }
            | Failure::Unknown(message) => QueryError::Unavailable(message),
            Failure::SessionNotFound(message) => QueryError::Rejected {
                code: Code::NotFound,
                message,
            },
            Failure::Rejected { code, message } => QueryError::Rejected { code, message },
        }
    }
}

/// Why a session ended while its holder still used it. Every lock it held is gone (or must be
/// assumed gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionLost {
    /// The server no longer knows the session: it expired or was closed elsewhere.
    #[error("the lock service no longer knows the session (it expired or was closed)")]
    NotFound,
    /// No renewal was acknowledged within the lease, so the server may have expired it.
    #[error(
        "no keepalive was acknowledged within the session's ttl, so its lease may have run out"
    )]
    LeaseUnproven,
    /// The session was closed by this process.
    #[error("the session was closed")]
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status the server sends for `core`; `code` is checked against the wire's choice.
    fn status_with_core(code: Code, core: &CoreError) -> Status {
        let status = palisade_proto::error::status_from_core(core);
        assert_eq!(status.code(), code, "{core:?}");
        status
    }

    #[test]
    fn busy_details_name_the_holder_and_its_token() {
        let core = CoreError::Busy {
            lock: "jobs/nightly".into(),
            holder_session: Some(SessionId::new(7)),
            holder_token: Some(Token::new(42)),
            available_at_ms: None,
        };
        let status = status_with_core(Code::FailedPrecondition, &core);
        let error = AcquireError::from_failure(
            Failure::from_status(&status),
            SessionId::new(3),
            "jobs/nightly",
        );
        assert_eq!(
            error,
            AcquireError::Busy {
                lock: "jobs/nightly".into(),
                holder_session: Some(SessionId::new(7)),
                holder_token: Some(Token::new(42)),
                in_lock_delay: false,
            }
        );
        assert!(error.is_retryable());
        assert_eq!(
            error.to_string(),
            "lock \"jobs/nightly\" is busy: held by session 7 with token 42; wait for it or try again later"
        );
    }

    #[test]
    fn not_holder_details_become_a_release_error_naming_the_holder() {
        let core = CoreError::NotHolder {
            lock: "a".into(),
            session: SessionId::new(3),
            holder_session: Some(SessionId::new(9)),
        };
        let status = status_with_core(Code::PermissionDenied, &core);
        let error =
            ReleaseError::from_failure(Failure::from_status(&status), SessionId::new(3), "a");
        assert_eq!(
            error,
            ReleaseError::NotHolder {
                lock: "a".into(),
                session: SessionId::new(3),
                holder_session: Some(SessionId::new(9))
            }
        );
        assert!(!error.is_retryable());
        assert!(error.to_string().contains("held by session 9"));
    }

    #[test]
    fn a_timeout_is_an_unknown_outcome_never_a_failure() {
        let error = AcquireError::from_failure(
            Failure::timed_out(Duration::from_secs(2)),
            SessionId::new(5),
            "a",
        );
        assert!(
            matches!(error, AcquireError::Unknown { session, .. } if session == SessionId::new(5))
        );
        assert!(error.outcome_unknown());
        assert!(error.is_retryable());
    }

    /// An `UNAVAILABLE` status as a member that is not the leader sends it.
    fn not_leader(addr: Option<&str>) -> Status {
        let mut status = Status::unavailable("this member is not the leader");
        if let Some(addr) = addr {
            status
                .metadata_mut()
                .insert(palisade_proto::LEADER_ID_HEADER, "2".parse().unwrap());
            status
                .metadata_mut()
                .insert(palisade_proto::LEADER_ADDR_HEADER, addr.parse().unwrap());
        }
        status
    }

    #[test]
    fn unavailable_naming_the_leader_carries_its_address() {
        let failure = Failure::from_status(&not_leader(Some("10.0.0.2:7457")));
        assert!(
            matches!(&failure, Failure::NotLeader { leader, message }
                if leader == "http://10.0.0.2:7457" && message.contains("10.0.0.2:7457")),
            "{failure:?}"
        );
        let failure = Failure::from_status(&not_leader(Some("locks-2.internal:7457")));
        assert!(
            matches!(&failure, Failure::NotLeader { leader, .. } if leader == "http://locks-2.internal:7457"),
            "{failure:?}"
        );
        let failure = Failure::from_status(&not_leader(Some("[::1]:7457")));
        assert!(
            matches!(&failure, Failure::NotLeader { leader, .. } if leader == "http://[::1]:7457"),
            "{failure:?}"
        );
        // Reported as unavailable: nothing was done.
        let error = AcquireError::from_failure(failure, SessionId::new(1), "a");
        assert!(matches!(error, AcquireError::Unavailable(_)), "{error:?}");
        assert_eq!(error.class(), ErrorClass::Unavailable);
    }

    #[test]
    fn unavailable_without_a_usable_leader_is_only_not_applied() {
        // An election in progress: no leader named.
        let failure = Failure::from_status(&not_leader(None));
        assert!(matches!(failure, Failure::NotApplied(_)), "{failure:?}");
        // Addresses this client could not connect to are ignored, not followed.
        for bad in [
            "",
            "10.0.0.2",
            "http://10.0.0.2:7457",
            "10.0.0.2:7457/x",
            "a:1,b:2",
            "user@10.0.0.2:7457",
            "10.0.0.2:port",
        ] {
            let failure = Failure::from_status(&not_leader(Some(bad)));
            assert!(
                matches!(failure, Failure::NotApplied(_)),
                "{bad:?}: {failure:?}"
            );
        }
        // Only UNAVAILABLE is a redirect: other codes keep their meaning.
        let mut status = Status::failed_precondition("no");
        status.metadata_mut().insert(
            palisade_proto::LEADER_ADDR_HEADER,
            "10.0.0.2:7457".parse().unwrap(),
        );
        assert!(matches!(
            Failure::from_status(&status),
            Failure::Rejected { .. }
        ));
    }

    #[test]
    fn server_statuses_without_details_are_classified_by_code() {
        let unavailable = Failure::from_status(&Status::unavailable("not leader"));
        assert!(matches!(unavailable, Failure::NotApplied(_)));
        let unknown = Failure::from_status(&Status::unknown("timed out"));
        assert!(matches!(unknown, Failure::Unknown(_)));
        let not_found = Failure::from_status(&Status::not_found("no session"));
        assert!(matches!(
            RenewError::from_failure(not_found, SessionId::new(4)),
            RenewError::SessionNotFound { session } if session == SessionId::new(4)
        ));
        let internal = Failure::from_status(&Status::internal("bug"));
        assert!(matches!(
            QueryError::from_failure(internal),
            QueryError::Rejected {
                code: Code::Internal,
                ..
            }
        ));
    }

    #[test]
    fn every_refusal_of_the_lock_table_reaches_each_operation_as_a_class() {
        for core in CoreError::examples() {
            let status = palisade_proto::error::status_from_core(&core);
            let failure = || Failure::from_status(&status);
            assert!(
                matches!(failure(), Failure::Core(ref c) if *c == core),
                "{core:?}"
            );
            let acquire = AcquireError::from_failure(failure(), SessionId::new(1), "a");
            let expected = match core.category() {
                // A quota is the caller's own to free: refused, like a request to fix.
                ErrorCategory::Busy | ErrorCategory::LimitReached | ErrorCategory::WaitEnded
                    if !matches!(
                        core,
                        CoreError::TooManySessions { .. } | CoreError::QuotaReached { .. }
                    ) =>
                {
                    ErrorClass::NotAcquired
                }
                _ => ErrorClass::Refused,
            };
            assert_eq!(acquire.class(), expected, "{core:?} -> {acquire:?}");
            let session = SessionError::from_failure(failure()).class();
            if matches!(core, CoreError::TooManySessions { .. }) {
                assert_eq!(session, ErrorClass::Unavailable);
            } else {
                assert_eq!(session, ErrorClass::Refused, "{core:?}");
            }
            for class in [
                ReleaseError::from_failure(failure(), SessionId::new(1), "a").class(),
                RenewError::from_failure(failure(), SessionId::new(1)).class(),
                CloseError::from_failure(failure(), SessionId::new(1)).class(),
                QueryError::from_failure(failure()).class(),
            ] {
                assert_eq!(class, ErrorClass::Refused, "{core:?}");
            }
        }
    }

    #[test]
    fn details_that_are_not_a_core_error_fall_back_to_the_code() {
        let status = Status::with_details(
            Code::FailedPrecondition,
            "busy",
            b"\x08\x01not json".to_vec().into(),
        );
        assert!(matches!(
            Failure::from_status(&status),
            Failure::Rejected {
                code: Code::FailedPrecondition,
                ..
            }
        ));
    }

    #[test]
    fn wait_ended_and_session_not_found_map_to_their_acquire_variants() {
        let status = status_with_core(
            Code::DeadlineExceeded,
            &CoreError::WaitEnded { lock: "a".into() },
        );
        let error =
            AcquireError::from_failure(Failure::from_status(&status), SessionId::new(1), "a");
        assert_eq!(error, AcquireError::WaitEnded { lock: "a".into() });
        let status = status_with_core(
            Code::NotFound,
            &CoreError::SessionNotFound {
                session: SessionId::new(1),
            },
        );
        let error =
            AcquireError::from_failure(Failure::from_status(&status), SessionId::new(1), "a");
        assert_eq!(
            error,
            AcquireError::SessionNotFound {
                session: SessionId::new(1)
            }
        );
        assert!(!error.is_retryable());
    }

    #[test]
    fn a_lock_in_lock_delay_is_busy_without_a_holder() {
        let core = CoreError::Busy {
            lock: "a".into(),
            holder_session: None,
            holder_token: None,
            available_at_ms: Some(palisade_core::TimeMs::from_millis(5_000)),
        };
        let error = AcquireError::from_core(core);
        assert!(matches!(
            error,
            AcquireError::Busy {
                in_lock_delay: true,
                ..
            }
        ));
        assert!(error.to_string().contains("lock-delay"));
    }
}
