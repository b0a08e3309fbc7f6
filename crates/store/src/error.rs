//! The error of every store operation, on both sides of the wire.
//!
//! The server sends it as a JSON body whose `kind` field names the variant and whose `message`
//! field is the `Display` text; [`crate::StoreClient`] parses it back into the same value, so a
//! Rust caller matches on `StoreError::Stale { accepted, .. }` whether it called the store
//! in-process or over HTTP (invariant 9: explainable rejections).

use palisade_core::SessionId;
use palisade_fence::{FenceError, FenceErrorClass};
use serde::{Deserialize, Serialize};

/// Why a store operation did not happen (or, for [`StoreError::OutcomeUnknown`], may not have).
///
/// - rejections ([`StoreError::is_rejection`]): the sequencer was refused (stale, issued twice,
///   of another lock, missing, malformed, forged); retrying the same request with the same
///   sequencer cannot succeed;
/// - invalid input (`TooLarge`, `InvalidKey`, `InvalidRequest`, `RequestIdReused`): fix the request;
/// - a lock at its quota (`QuotaReached`): delete keys under it first, or have the quota raised;
/// - retryable ([`StoreError::is_retryable`]): the store was unreachable or failed; nothing was
///   applied, retry;
/// - [`StoreError::OutcomeUnknown`]: the request was sent but no answer came; retry with the same
///   request id to learn the outcome without applying it twice (invariant 8).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
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
        #[serde(default)]
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
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        expected: String,
        presented: String,
    },
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
    Malformed {
        #[serde(rename = "detail")]
        message: String,
    },
    /// The sequencer's signature does not verify with the store's public key.
    #[error("forged sequencer: {message}")]
    Forged {
        #[serde(rename = "detail")]
        message: String,
    },
    /// An input exceeds one of the limits in [`crate::limits`]; `limit` names it.
    #[error("{what} is too large: {}{limit} is {size_max}", size_text(*size))]
    TooLarge {
        what: String,
        limit: String,
        #[serde(default)]
        size: Option<u64>,
        size_max: u64,
    },
    /// The key is empty or contains a control character.
    #[error("invalid key: {message}")]
    InvalidKey {
        #[serde(rename = "detail")]
        message: String,
    },
    /// The request is not well-formed (bad JSON, a bad request id, an empty batch).
    #[error("invalid request: {message}")]
    InvalidRequest {
        #[serde(rename = "detail")]
        message: String,
    },
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
    /// The stored data violates an invariant: the store is damaged.
    #[error("store data is corrupt: {message}")]
    Corrupt {
        #[serde(rename = "detail")]
        message: String,
    },
    /// The store's storage failed; the write was not applied unless the message says its outcome
    /// is unknown.
    #[error("store storage error: {message}")]
    Storage {
        #[serde(rename = "detail")]
        message: String,
    },
    /// The store could not be reached; nothing was applied.
    #[error("store unavailable: {message}")]
    Unavailable {
        #[serde(rename = "detail")]
        message: String,
    },
    /// The request was sent but no answer arrived: it may or may not have been applied.
    #[error(
        "outcome unknown: {message}; retry with the same request id to learn whether it was applied"
    )]
    OutcomeUnknown {
        #[serde(rename = "detail")]
        message: String,
    },
    /// The server answered with something this client does not understand.
    #[error("unexpected response from the store (HTTP {status}): {message}")]
    UnexpectedResponse {
        status: u16,
        #[serde(rename = "detail")]
        message: String,
    },
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

impl StoreError {
    /// The machine-readable kind, as in the JSON `kind` field.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Stale { .. } => "stale",
            StoreError::TokenReissued { .. } => "token_reissued",
            StoreError::WrongLock { .. } => "wrong_lock",
            StoreError::Unbound { .. } => "unbound",
            StoreError::Missing => "missing",
            StoreError::Malformed { .. } => "malformed",
            StoreError::Forged { .. } => "forged",
            StoreError::TooLarge { .. } => "too_large",
            StoreError::InvalidKey { .. } => "invalid_key",
            StoreError::InvalidRequest { .. } => "invalid_request",
            StoreError::RequestIdReused { .. } => "request_id_reused",
            StoreError::QuotaReached { .. } => "quota_reached",
            StoreError::NotFound { .. } => "not_found",
            StoreError::CompareFailed { .. } => "compare_failed",
            StoreError::NoSuchRoute { .. } => "no_such_route",
            StoreError::MethodNotAllowed { .. } => "method_not_allowed",
            StoreError::MisdirectedRequest { .. } => "misdirected_request",
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::Storage { .. } => "storage",
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::OutcomeUnknown { .. } => "outcome_unknown",
            StoreError::UnexpectedResponse { .. } => "unexpected_response",
        }
    }

    /// The HTTP status the server answers with.
    ///
    /// 400 malformed input, 401 missing sequencer, 403 forged, another lock's sequencer or a key
    /// bound to no lock,
    /// 404 not found, 409 stale or a token issued twice, 412 compare failed, 413 too large, 422 request id reused,
    /// 500 corrupt, 503 storage failure or a full write queue, 504 outcome unknown, 507 a lock's
    /// quota reached.
    pub fn http_status(&self) -> u16 {
        match self {
            StoreError::Malformed { .. }
            | StoreError::InvalidKey { .. }
            | StoreError::InvalidRequest { .. } => 400,
            StoreError::Missing => 401,
            StoreError::Forged { .. }
            | StoreError::WrongLock { .. }
            | StoreError::Unbound { .. } => 403,
            StoreError::NotFound { .. } | StoreError::NoSuchRoute { .. } => 404,
            StoreError::MethodNotAllowed { .. } => 405,
            StoreError::MisdirectedRequest { .. } => 421,
            StoreError::Stale { .. } | StoreError::TokenReissued { .. } => 409,
            StoreError::CompareFailed { .. } => 412,
            StoreError::TooLarge { .. } => 413,
            StoreError::RequestIdReused { .. } => 422,
            StoreError::Corrupt { .. } => 500,
            StoreError::Storage { .. } | StoreError::Unavailable { .. } => 503,
            StoreError::OutcomeUnknown { .. } => 504,
            StoreError::QuotaReached { .. } => 507,
            StoreError::UnexpectedResponse { status, .. } => *status,
        }
    }

    /// A newer grant has written: the presenter was superseded.
    pub fn is_stale(&self) -> bool {
        matches!(self, StoreError::Stale { .. })
    }

    /// The sequencer was refused (stale, issued twice, wrong lock, missing, malformed, forged):
    /// retrying with the same sequencer cannot succeed.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self,
            StoreError::Stale { .. }
                | StoreError::TokenReissued { .. }
                | StoreError::WrongLock { .. }
                | StoreError::Unbound { .. }
                | StoreError::Missing
                | StoreError::Malformed { .. }
                | StoreError::Forged { .. }
        )
    }

    /// Nothing was applied and the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Storage { .. } | StoreError::Unavailable { .. }
        )
    }

    /// The request may or may not have been applied.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, StoreError::OutcomeUnknown { .. })
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

    /// The JSON body the server sends: the variant's fields, `kind`, and `message`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut body = serde_json::to_value(self)
            .unwrap_or_else(|_| serde_json::json!({ "kind": self.kind() }));
        if let serde_json::Value::Object(fields) = &mut body {
            fields.insert("message".into(), self.to_string().into());
        }
        body
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
