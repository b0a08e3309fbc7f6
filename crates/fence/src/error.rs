//! The one error every fence backend returns, serialisable so an HTTP resource can send it as
//! JSON with a machine-readable `kind` (invariant 9: explainable rejections).

use palisade_core::{SessionId, Token};
use palisade_sequencer::SequencerError;
use serde::{Deserialize, Serialize};

/// Why a fenced write or claim did not happen, or why its outcome is unknown.
///
/// Every variant is exactly one of three outcomes:
///
/// - **did not happen, final** ([`FenceError::is_final`]): retrying the same request cannot
///   succeed. The rejections of the sequencer ([`FenceError::is_rejection`]: stale, wrong lock,
///   reissued, a shared grant's write, missing, malformed, forged) and requests that can never be applied (`InvalidScope`,
///   `InvalidRequest`), and `Corrupt` stored state, which needs an operator;
/// - **did not happen, retryable** ([`FenceError::is_retryable`]): only [`FenceError::Storage`],
///   the backend failed before anything was applied;
/// - **may or may not have happened** ([`FenceError::is_outcome_unknown`]): only
///   [`FenceError::OutcomeUnknown`]. Read the resource (with a claim) before deciding again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FenceError {
    /// A newer grant of the lock has already written here: the presenter was superseded.
    #[error(
        "stale sequencer for lock {lock:?}: token {presented} is older than the accepted token {accepted}{}; a newer holder has claimed, read or written here, so re-acquire the lock and re-read before writing",
        holder_text(*holder_session)
    )]
    Stale {
        lock: String,
        presented: Token,
        accepted: Token,
        /// The session of the grant that set `accepted`, where the resource stores it.
        holder_session: Option<SessionId>,
    },
    /// The accepted token was presented again, by another session. One grant has one session,
    /// so the lock service issued this token to two grants (it was restored from a backup, or
    /// lost or rolled back its log). The resource keeps to the session that presented the token
    /// first, which may go on writing with it, and refuses the other.
    #[error(
        "token {token} of lock {lock:?} was first presented here by {}, and session {presented_session} presents it now: the lock service issued this token twice (restored from a backup, or its log was lost or rolled back), so this grant is refused; tell the lock service's operator, then release the lock and acquire it again for a newer token",
        first_text(*first_session)
    )]
    TokenReissued {
        lock: String,
        token: Token,
        /// The session that presented `token` first, whose writes the resource accepted (0: the
        /// readers of a shared phase).
        first_session: SessionId,
        /// The session presenting the same token now.
        presented_session: SessionId,
    },
    /// The sequencer is a shared grant (a reader of a read-write lock's shared phase), and the
    /// request writes. Readers share their phase's token, so a fence cannot tell one reader's
    /// write from another's: only an exclusive grant (or a semaphore's permit) writes.
    #[error(
        "a reader (shared grant) cannot write: token {token} of lock {lock:?} is a shared grant, so this write is refused; acquire the lock exclusive to write"
    )]
    SharedWrite { lock: String, token: Token },
    /// The sequencer is a grant of a different lock than the one protecting this scope.
    #[error(
        "sequencer is for lock {presented:?}, but this resource is protected by lock {expected:?}: acquire {expected:?} instead"
    )]
    WrongLock { expected: String, presented: String },
    /// No sequencer was presented where one is required.
    #[error("no sequencer presented: fenced writes need the sequencer of the lock holder")]
    Missing,
    /// The text presented is not a sequencer.
    #[error("malformed sequencer: {message}")]
    Malformed { message: String },
    /// The sequencer's signature does not verify with this resource's public key.
    #[error("forged sequencer: {message}")]
    Forged { message: String },
    /// The scope name is empty or too long.
    #[error("invalid fence scope: {message}")]
    InvalidScope { message: String },
    /// The stored fence state violates an invariant (a token out of range, say): someone wrote
    /// to the fence table behind the fence's back, or the store is damaged.
    #[error("fence state of scope {scope:?} is corrupt: {message}")]
    Corrupt { scope: String, message: String },
    /// The request can never be applied as sent (too many operations, an operation the data
    /// does not allow, a key reserved for the fence): nothing was written; change the request.
    #[error("invalid fenced request: {message}")]
    InvalidRequest { message: String },
    /// The backend failed before anything was applied: nothing was written, and the same request
    /// may succeed when retried.
    #[error("fence storage error: {message}")]
    Storage { message: String },
    /// The request was sent, but the backend failed before confirming it (a dropped connection
    /// after a script was sent, a failed commit): it may or may not have been applied. Read the
    /// resource under a claim before deciding what to do.
    #[error(
        "outcome unknown: {message}; the write may or may not have been applied, read it back under a claim before retrying"
    )]
    OutcomeUnknown { message: String },
}

fn first_text(first_session: SessionId) -> String {
    if first_session.get() == 0 {
        "the readers of a shared phase".into()
    } else {
        format!("session {first_session}")
    }
}

fn holder_text(holder_session: Option<SessionId>) -> String {
    match holder_session {
        Some(session) if session.get() == 0 => " (set by a shared phase's readers)".into(),
        Some(session) => format!(" (set by session {session})"),
        None => String::new(),
    }
}

/// The classes of [`FenceError`], one per way a caller reacts.
///
/// Deliberately not `#[non_exhaustive]`: other crates match on it without a wildcard, so a new
/// class does not compile until each of them handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceErrorClass {
    /// The sequencer was refused (`is_rejection`): nothing was applied, and retrying with it
    /// cannot succeed.
    Rejected,
    /// The request itself is invalid: nothing was applied; fix it.
    Invalid,
    /// The stored fence state is damaged: nothing was applied; an operator must look.
    Corrupt,
    /// Nothing was applied; the same request may succeed later (`is_retryable`).
    Retryable,
    /// The request may or may not have been applied (`is_outcome_unknown`).
    OutcomeUnknown,
}

impl FenceError {
    /// The machine-readable kind, as in the JSON `kind` field.
    pub fn kind(&self) -> &'static str {
        match self {
            FenceError::Stale { .. } => "stale",
            FenceError::TokenReissued { .. } => "token_reissued",
            FenceError::SharedWrite { .. } => "shared_write",
            FenceError::WrongLock { .. } => "wrong_lock",
            FenceError::Missing => "missing",
            FenceError::Malformed { .. } => "malformed",
            FenceError::Forged { .. } => "forged",
            FenceError::InvalidScope { .. } => "invalid_scope",
            FenceError::Corrupt { .. } => "corrupt",
            FenceError::InvalidRequest { .. } => "invalid_request",
            FenceError::Storage { .. } => "storage",
            FenceError::OutcomeUnknown { .. } => "outcome_unknown",
        }
    }

    /// How a caller reacts. A crate that maps fence errors onto its own (the store) falls back
    /// on this for variants it does not name, so a new variant is classified here, once.
    pub fn class(&self) -> FenceErrorClass {
        match self {
            FenceError::Stale { .. }
            | FenceError::TokenReissued { .. }
            | FenceError::SharedWrite { .. }
            | FenceError::WrongLock { .. }
            | FenceError::Missing
            | FenceError::Malformed { .. }
            | FenceError::Forged { .. } => FenceErrorClass::Rejected,
            FenceError::InvalidScope { .. } | FenceError::InvalidRequest { .. } => {
                FenceErrorClass::Invalid
            }
            FenceError::Corrupt { .. } => FenceErrorClass::Corrupt,
            FenceError::Storage { .. } => FenceErrorClass::Retryable,
            FenceError::OutcomeUnknown { .. } => FenceErrorClass::OutcomeUnknown,
        }
    }

    /// Another session presented this token first: the lock service issued it twice.
    pub fn is_token_reissued(&self) -> bool {
        matches!(self, FenceError::TokenReissued { .. })
    }

    /// A newer grant has written: the presenter was superseded.
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceError::Stale { .. })
    }

    /// A shared grant tried to write.
    pub fn is_shared_write(&self) -> bool {
        matches!(self, FenceError::SharedWrite { .. })
    }

    /// The sequencer is for another lock.
    pub fn is_wrong_lock(&self) -> bool {
        matches!(self, FenceError::WrongLock { .. })
    }

    /// The sequencer was refused (stale, reissued, a shared grant's write, wrong lock, missing,
    /// malformed, forged):
    /// retrying with the same sequencer cannot succeed.
    pub fn is_rejection(&self) -> bool {
        // Every variant is listed, so a new one does not compile until it is classified.
        match self {
            FenceError::Stale { .. }
            | FenceError::TokenReissued { .. }
            | FenceError::SharedWrite { .. }
            | FenceError::WrongLock { .. }
            | FenceError::Missing
            | FenceError::Malformed { .. }
            | FenceError::Forged { .. } => true,
            FenceError::InvalidScope { .. }
            | FenceError::Corrupt { .. }
            | FenceError::InvalidRequest { .. }
            | FenceError::Storage { .. }
            | FenceError::OutcomeUnknown { .. } => false,
        }
    }

    /// Nothing was applied and the same request may succeed when retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            FenceError::Storage { .. } => true,
            FenceError::Stale { .. }
            | FenceError::TokenReissued { .. }
            | FenceError::SharedWrite { .. }
            | FenceError::WrongLock { .. }
            | FenceError::Missing
            | FenceError::Malformed { .. }
            | FenceError::Forged { .. }
            | FenceError::InvalidScope { .. }
            | FenceError::Corrupt { .. }
            | FenceError::InvalidRequest { .. }
            | FenceError::OutcomeUnknown { .. } => false,
        }
    }

    /// The request may or may not have been applied.
    pub fn is_outcome_unknown(&self) -> bool {
        match self {
            FenceError::OutcomeUnknown { .. } => true,
            FenceError::Stale { .. }
            | FenceError::TokenReissued { .. }
            | FenceError::SharedWrite { .. }
            | FenceError::WrongLock { .. }
            | FenceError::Missing
            | FenceError::Malformed { .. }
            | FenceError::Forged { .. }
            | FenceError::InvalidScope { .. }
            | FenceError::Corrupt { .. }
            | FenceError::InvalidRequest { .. }
            | FenceError::Storage { .. } => false,
        }
    }

    /// Nothing was applied and retrying the same request cannot succeed: every variant that is
    /// neither retryable nor of unknown outcome.
    pub fn is_final(&self) -> bool {
        !self.is_retryable() && !self.is_outcome_unknown()
    }

    /// A suggested HTTP status: 400 malformed or invalid request, 403 forged or foreign or a
    /// shared grant's write (the grant is genuine but does not permit writing, whatever the
    /// resource's state: no retry with it can succeed), 409 stale or reissued token, 428 missing sequencer, 500 corrupt state, 503 storage failure (retry),
    /// 504 outcome unknown.
    pub fn http_status(&self) -> u16 {
        match self {
            FenceError::Malformed { .. }
            | FenceError::InvalidScope { .. }
            | FenceError::InvalidRequest { .. } => 400,
            FenceError::Forged { .. }
            | FenceError::WrongLock { .. }
            | FenceError::SharedWrite { .. } => 403,
            FenceError::Stale { .. } | FenceError::TokenReissued { .. } => 409,
            FenceError::Missing => 428,
            FenceError::Corrupt { .. } => 500,
            FenceError::Storage { .. } => 503,
            FenceError::OutcomeUnknown { .. } => 504,
        }
    }

    pub(crate) fn storage(error: impl std::fmt::Display) -> FenceError {
        FenceError::Storage {
            message: error.to_string(),
        }
    }

    pub(crate) fn invalid_request(message: impl Into<String>) -> FenceError {
        FenceError::InvalidRequest {
            message: message.into(),
        }
    }
}

impl From<SequencerError> for FenceError {
    fn from(error: SequencerError) -> FenceError {
        // The message is the detail only; the variant's Display adds what kind of failure it is.
        match &error {
            SequencerError::Malformed(parse) => FenceError::Malformed {
                message: parse.to_string(),
            },
            SequencerError::BadSignature | SequencerError::UnknownKey { .. } => {
                FenceError::Forged {
                    message: error.to_string(),
                }
            }
        }
    }
}
