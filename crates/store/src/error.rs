//! The store's errors, by layer:
//!
//! - [`StoreError`]: what the store refuses, or fails at: what [`crate::Store`] returns
//!   in-process, and what its HTTP server sends;
//! - [`HttpRefusal`]: what the HTTP server refuses before the store sees the request (no such
//!   route, a method the route lacks, a host name the store does not answer to);
//! - [`StoreClientError`]: what a [`crate::StoreClient`] caller meets: a refusal the server sent
//!   (one of the two above, parsed back), or the transport failing (unreachable, no answer, an
//!   answer this client does not understand).
//!
//! All three have a [`StoreErrorClass`], one per way a caller reacts; it is deliberately not
//! `#[non_exhaustive]`, so a caller (the CLI's exit statuses) matches it without a wildcard.
//! None of these types is the HTTP contract: their wire form (`kind`, `message`, the fields,
//! the status) is [`crate::wire`]'s, so renaming a variant or a field here changes nothing a
//! client reads (invariant 9: explainable rejections).

use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, FenceErrorClass};

/// Why a store operation did not happen (or, for [`StoreError::OutcomeUnknown`], may not have).
///
/// [`StoreError::class`] tells how to react:
/// - rejections ([`StoreError::is_rejection`]): the sequencer was refused (stale, issued twice,
///   of another lock, missing, malformed, forged); retrying the same request with the same
///   sequencer cannot succeed;
/// - invalid input (`TooLarge`, `InvalidKey`, `InvalidRequest`, `RequestIdReused`): fix the request;
/// - a lock at its quota (`QuotaReached`): delete keys under it first, or have the quota raised;
/// - retryable ([`StoreError::is_retryable`]: `Storage`, `Unavailable`): nothing was applied,
///   retry;
/// - [`StoreError::OutcomeUnknown`], and only it: the store's commit failed, so the write may or
///   may not be durable; retry with the same request id to learn the outcome without applying it
///   twice (invariant 8). Every other variant means nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A newer grant of the lock has read, claimed or written here: the presenter was superseded.
    #[error(
        "token {presented} for lock {lock:?} is stale; the store has accepted token {accepted}{}: a newer holder has claimed, read or written here; re-acquire the lock and re-read before writing",
        holder_text(*holder_session)
    )]
    Stale {
        lock: String,
        presented: u64,
        accepted: u64,
        /// The session of the grant that set `accepted`.
        holder_session: Option<u64>,
    },
    /// The lock's accepted token was presented again by another session: the lock service
    /// issued that token twice (it was restored from a backup, or lost or rolled back its log).
    /// The store keeps to the session that presented it first.
    #[error(
        "token {token} of lock {lock:?} was first presented to the store by session {first_session}, and session {presented_session} presents it now: the lock service issued this token twice (restored from a backup, or its log was lost or rolled back), so this grant is refused; tell the lock service's operator, then release the lock and acquire it again for a newer token"
    )]
    TokenReissued {
        lock: String,
        token: u64,
        first_session: u64,
        presented_session: u64,
    },
    /// The key is bound to another lock than the sequencer's.
    #[error(
        "{}is protected by lock {expected:?}, but the sequencer is for lock {presented:?}: acquire {expected:?} to write it",
        key_text(key.as_deref())
    )]
    WrongLock {
        key: Option<String>,
        expected: String,
        presented: String,
    },
    /// The sequencer is a shared grant (a reader of a read-write lock's shared phase), and the
    /// request writes: readers may read and claim, only an exclusive grant writes.
    #[error(
        "a reader (shared grant) cannot write: token {token} of lock {lock:?} is a shared grant, so this write is refused; acquire the lock exclusive to write"
    )]
    SharedWrite { lock: String, token: u64 },
    /// The store's bindings give the key to no lock, so no sequencer may write it.
    #[error(
        "key {key:?} is not bound to any lock by the store's bindings: no holder may write it; ask the store's operator to bind its prefix to your lock"
    )]
    Unbound { key: String },
    /// No sequencer was presented for a write.
    #[error(
        "no sequencer presented: writes need the lock holder's sequencer (run under `palisade lock NAME -- …`, pass --sequencer, or send the Palisade-Sequencer header)"
    )]
    Missing,
    /// The text presented is not a sequencer.
    #[error("malformed sequencer: {message}")]
    Malformed { message: String },
    /// The sequencer's signature does not verify with the store's public key.
    #[error("forged sequencer: {message}")]
    Forged { message: String },
    /// An input exceeds one of the limits in [`crate::limits`]; `limit` names it.
    #[error("{what} is too large: {}{limit} is {size_max}", size_text(*size))]
    TooLarge {
        what: String,
        limit: String,
        size: Option<u64>,
        size_max: u64,
    },
    /// The key is empty or contains a control character.
    #[error("invalid key: {message}")]
    InvalidKey { message: String },
    /// The request is not well-formed (bad JSON, a bad request id, an empty batch).
    #[error("invalid request: {message}")]
    InvalidRequest { message: String },
    /// The request id was already used with this sequencer for a different request.
    #[error(
        "request id {request_id:?} was already used with this sequencer for a different request: use a fresh request id for a new request"
    )]
    RequestIdReused { request_id: String },
    /// The write would take the lock's keys past one of the store's per-lock quotas
    /// (`--lock-keys-max`, `--lock-bytes-max`): nothing was applied.
    #[error(
        "lock {lock:?} is at its quota of {quota} in this store: the write would make it {used}, over {quota_max}; nothing was applied. Delete keys under it, or ask the store's operator to raise the quota"
    )]
    QuotaReached {
        lock: String,
        /// `keys` (its live keys) or `bytes` (the names of its keys, deleted ones included, and
        /// the values of its live keys).
        quota: String,
        /// What the lock would hold after the write.
        used: u64,
        quota_max: u64,
    },
    /// The key has no value (never written, or deleted).
    #[error("key {key:?} not found")]
    NotFound { key: String },
    /// A compare of a transaction or a conditional write did not hold: nothing was applied.
    #[error(
        "compare {compare} failed: key {key:?} is {}: nothing was applied; re-read the key and decide again",
        current_text(*revision)
    )]
    CompareFailed {
        /// The index of the first compare that did not hold, in request order.
        compare: u64,
        key: String,
        /// The key's current revision (0: it has no value).
        revision: u64,
    },
    /// The stored data violates an invariant: the store is damaged.
    #[error("store data is corrupt: {message}")]
    Corrupt { message: String },
    /// The store's storage failed before anything was applied; the same request may succeed
    /// when retried. (A failed commit, whose outcome is unknown, is
    /// [`StoreError::OutcomeUnknown`].)
    #[error("store storage error: {message}")]
    Storage { message: String },
    /// The store is too busy to take the request (its write queue is full, too many request
    /// bodies are in memory, the body did not arrive in time): nothing was applied, retry.
    #[error("store unavailable: {message}")]
    Unavailable { message: String },
    /// The store's commit failed, or its writer stopped before answering: the write may or may
    /// not be durable.
    #[error(
        "outcome unknown: {message}; retry with the same request id to learn whether it was applied"
    )]
    OutcomeUnknown { message: String },
}

/// What the store's HTTP server refuses before the store sees the request: the client and the
/// server disagree on the API, or the client reached the store by a name it does not answer to.
/// Nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpRefusal {
    /// No such HTTP route.
    #[error("no route for {method} {path}: see docs/store-http.md for the API")]
    NoSuchRoute { method: String, path: String },
    /// The route exists but not with this method.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The request's `Host` is not a name the store answers to (DNS rebinding defence).
    #[error(
        "the store does not answer to the host name {host:?}: it answers to localhost, IP addresses and the names given with --store-host (PALISADE_STORE_HOST); if you reach it by that name on purpose, start palisade store serve with --store-host NAME"
    )]
    MisdirectedRequest { host: String },
}

/// What a caller of [`crate::StoreClient`] meets: the store's refusal, or the transport failing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreClientError {
    /// The store refused the request, or failed at it: the error its server sent. (The CLI also
    /// makes the refusals it can see coming itself, without sending: no sequencer at all.)
    #[error(transparent)]
    Store(StoreError),
    /// The store's HTTP server refused the request before the store saw it.
    #[error(transparent)]
    Http(HttpRefusal),
    /// The request cannot be made as given (a store URL of the wrong scheme, an unreadable
    /// sequencer file): nothing was sent.
    #[error("invalid request: {message}")]
    InvalidRequest { message: String },
    /// The store could not be reached (a refused connection; no answer to a read): nothing was
    /// applied.
    #[error("store unavailable: {message}")]
    Unavailable { message: String },
    /// A write was sent but no answer arrived: it may or may not have been applied.
    #[error(
        "outcome unknown: {message}; retry with the same request id to learn whether it was applied"
    )]
    OutcomeUnknown { message: String },
    /// The server answered with something this client does not understand.
    #[error("unexpected response from the store (HTTP {status}): {message}")]
    UnexpectedResponse { status: u16, message: String },
}

/// The classes of the store's errors, one per way a caller reacts.
///
/// Deliberately not `#[non_exhaustive]`: other crates match on it without a wildcard (the CLI's
/// exit statuses), so a new class does not compile until each of them handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorClass {
    /// The sequencer is stale: a newer grant of its lock has claimed, read or written here.
    /// Nothing was applied; re-acquire the lock and re-read.
    Stale,
    /// The sequencer was refused otherwise (issued twice, of another lock, missing, malformed,
    /// forged, or the key is bound to no lock): nothing was applied, and retrying with it cannot
    /// succeed.
    Rejected,
    /// The request is invalid (too large, a bad key, a reused request id, an unknown route):
    /// nothing was applied; fix it.
    Invalid,
    /// The write would take its lock past the store's quota: nothing was applied.
    QuotaReached,
    /// The key has no value.
    NotFound,
    /// A compare did not hold: nothing was applied; re-read and decide again.
    CompareFailed,
    /// Nothing was applied; the same request may succeed later.
    Retryable,
    /// The request may or may not have been applied: retry with the same request id to learn.
    OutcomeUnknown,
    /// The store's data is corrupt, or it answered something this client does not understand.
    Internal,
}

fn holder_text(holder_session: Option<u64>) -> String {
    match holder_session {
        Some(session) => format!(" (presented by session {session})"),
        None => String::new(),
    }
}

fn current_text(revision: u64) -> String {
    match revision {
        0 => "absent".to_owned(),
        revision => format!("at revision {revision}"),
    }
}

fn key_text(key: Option<&str>) -> String {
    match key {
        Some(key) => format!("key {key:?} "),
        None => "this resource ".to_owned(),
    }
}

fn size_text(size: Option<u64>) -> String {
    match size {
        Some(size) => format!("{size}, but "),
        None => String::new(),
    }
}

impl StoreErrorClass {
    /// The sequencer was refused: retrying with the same sequencer cannot succeed.
    pub fn is_rejection(self) -> bool {
        match self {
            StoreErrorClass::Stale | StoreErrorClass::Rejected => true,
            StoreErrorClass::Invalid
            | StoreErrorClass::QuotaReached
            | StoreErrorClass::NotFound
            | StoreErrorClass::CompareFailed
            | StoreErrorClass::Retryable
            | StoreErrorClass::OutcomeUnknown
            | StoreErrorClass::Internal => false,
        }
    }
}

impl StoreError {
    /// How a caller reacts.
    pub fn class(&self) -> StoreErrorClass {
        match self {
            StoreError::Stale { .. } => StoreErrorClass::Stale,
            StoreError::TokenReissued { .. }
            | StoreError::WrongLock { .. }
            | StoreError::SharedWrite { .. }
            | StoreError::Unbound { .. }
            | StoreError::Missing
            | StoreError::Malformed { .. }
            | StoreError::Forged { .. } => StoreErrorClass::Rejected,
            StoreError::TooLarge { .. }
            | StoreError::InvalidKey { .. }
            | StoreError::InvalidRequest { .. }
            | StoreError::RequestIdReused { .. } => StoreErrorClass::Invalid,
            StoreError::QuotaReached { .. } => StoreErrorClass::QuotaReached,
            StoreError::NotFound { .. } => StoreErrorClass::NotFound,
            StoreError::CompareFailed { .. } => StoreErrorClass::CompareFailed,
            StoreError::Storage { .. } | StoreError::Unavailable { .. } => {
                StoreErrorClass::Retryable
            }
            StoreError::OutcomeUnknown { .. } => StoreErrorClass::OutcomeUnknown,
            StoreError::Corrupt { .. } => StoreErrorClass::Internal,
        }
    }

    pub(crate) fn too_large(
        what: &str,
        limit: &str,
        size: Option<usize>,
        size_max: usize,
    ) -> StoreError {
        StoreError::TooLarge {
            what: what.to_owned(),
            limit: limit.to_owned(),
            size: size.map(|size| size as u64),
            size_max: size_max as u64,
        }
    }

    pub(crate) fn storage(error: impl std::fmt::Display) -> StoreError {
        StoreError::Storage {
            message: error.to_string(),
        }
    }
}

impl HttpRefusal {
    /// How a caller reacts: fix the request (or the URL, or the store's `--store-host`).
    pub fn class(&self) -> StoreErrorClass {
        match self {
            HttpRefusal::NoSuchRoute { .. }
            | HttpRefusal::MethodNotAllowed { .. }
            | HttpRefusal::MisdirectedRequest { .. } => StoreErrorClass::Invalid,
        }
    }
}

impl StoreClientError {
    /// How a caller reacts.
    pub fn class(&self) -> StoreErrorClass {
        match self {
            StoreClientError::Store(error) => error.class(),
            StoreClientError::Http(refusal) => refusal.class(),
            StoreClientError::InvalidRequest { .. } => StoreErrorClass::Invalid,
            StoreClientError::Unavailable { .. } => StoreErrorClass::Retryable,
            StoreClientError::OutcomeUnknown { .. } => StoreErrorClass::OutcomeUnknown,
            StoreClientError::UnexpectedResponse { .. } => StoreErrorClass::Internal,
        }
    }
}

/// The queries every layer answers alike from its [`StoreErrorClass`]. (Those of its wire form,
/// `kind`, `http_status` and `to_json`, are [`crate::wire`]'s.)
macro_rules! class_queries {
    ($($error:ty),*) => {$(
        impl $error {
            /// A newer grant has written: the presenter was superseded.
            pub fn is_stale(&self) -> bool {
                self.class() == StoreErrorClass::Stale
            }

            /// The sequencer was refused (stale, issued twice, wrong lock, missing, malformed,
            /// forged): retrying with the same sequencer cannot succeed.
            pub fn is_rejection(&self) -> bool {
                self.class().is_rejection()
            }

            /// Nothing was applied and the same request may succeed later.
            pub fn is_retryable(&self) -> bool {
                self.class() == StoreErrorClass::Retryable
            }

            /// The request may or may not have been applied.
            pub fn is_outcome_unknown(&self) -> bool {
                self.class() == StoreErrorClass::OutcomeUnknown
            }
        }
    )*};
}

class_queries!(StoreError, HttpRefusal, StoreClientError);

impl From<StoreError> for StoreClientError {
    fn from(error: StoreError) -> StoreClientError {
        StoreClientError::Store(error)
    }
}

impl From<HttpRefusal> for StoreClientError {
    fn from(refusal: HttpRefusal) -> StoreClientError {
        StoreClientError::Http(refusal)
    }
}
impl StoreError {
    /// This error as the fence's refusal, if it is one (stale, token reissued, wrong lock,
    /// missing, malformed, forged): what [`crate::Store::fence_stats`] counts and keeps.
    pub fn fence_refusal(&self) -> Option<FenceError> {
        Some(match self.clone() {
            StoreError::Stale {
                lock,
                presented,
                accepted,
                holder_session,
            } => FenceError::Stale {
                lock,
                presented: Token::new(presented),
                accepted: Token::new(accepted),
                holder_session: holder_session.map(SessionId::new),
            },
            StoreError::TokenReissued {
                lock,
                token,
                first_session,
                presented_session,
            } => FenceError::TokenReissued {
                lock,
                token: Token::new(token),
                first_session: SessionId::new(first_session),
                presented_session: SessionId::new(presented_session),
            },
            StoreError::WrongLock {
                expected,
                presented,
                ..
            } => FenceError::WrongLock {
                expected,
                presented,
            },
            StoreError::SharedWrite { lock, token } => FenceError::SharedWrite {
                lock,
                token: Token::new(token),
            },
            StoreError::Missing => FenceError::Missing,
            StoreError::Malformed { message } => FenceError::Malformed { message },
            StoreError::Forged { message } => FenceError::Forged { message },
            _ => return None,
        })
    }
}

impl From<FenceError> for StoreError {
    fn from(error: FenceError) -> StoreError {
        match error {
            FenceError::Stale {
                lock,
                presented,
                accepted,
                holder_session,
            } => StoreError::Stale {
                lock,
                presented: presented.get(),
                accepted: accepted.get(),
                holder_session: holder_session.map(SessionId::get),
            },
            FenceError::TokenReissued {
                lock,
                token,
                first_session,
                presented_session,
            } => StoreError::TokenReissued {
                lock,
                token: token.get(),
                first_session: first_session.get(),
                presented_session: presented_session.get(),
            },
            FenceError::WrongLock {
                expected,
                presented,
            } => StoreError::WrongLock {
                key: None,
                expected,
                presented,
            },
            FenceError::SharedWrite { lock, token } => StoreError::SharedWrite {
                lock,
                token: token.get(),
            },
            FenceError::Missing => StoreError::Missing,
            FenceError::Malformed { message } => StoreError::Malformed { message },
            FenceError::Forged { message } => StoreError::Forged { message },
            FenceError::InvalidScope { message } => StoreError::InvalidRequest { message },
            FenceError::Corrupt { scope, message } => StoreError::Corrupt {
                message: format!("fence state of lock {scope:?}: {message}"),
            },
            FenceError::InvalidRequest { message } => StoreError::InvalidRequest { message },
            FenceError::Storage { message } => StoreError::Storage { message },
            FenceError::OutcomeUnknown { message } => StoreError::OutcomeUnknown { message },
            // `FenceError` is `#[non_exhaustive]`: a variant added later is mapped by the class
            // the fence gives it (an exhaustive match there) until the store names it.
            other => {
                let message = other.to_string();
                match other.class() {
                    FenceErrorClass::Rejected | FenceErrorClass::Invalid => {
                        StoreError::InvalidRequest { message }
                    }
                    FenceErrorClass::Corrupt => StoreError::Corrupt { message },
                    FenceErrorClass::Retryable => StoreError::Storage { message },
                    FenceErrorClass::OutcomeUnknown => StoreError::OutcomeUnknown { message },
                }
            }
        }
    }
}

macro_rules! storage_from {
    ($($error:ty),* $(,)?) => {
        $(impl From<$error> for StoreError {
            fn from(error: $error) -> StoreError {
                StoreError::storage(error)
            }
        })*
    };
}

storage_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError,
);
