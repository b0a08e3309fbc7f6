//! The one error every fence backend returns, serialisable so an HTTP resource can send it as
//! JSON with a machine-readable `kind` (invariant 9: explainable rejections).

use palisade_sequencer::SequencerError;
use serde::{Deserialize, Serialize};

/// Why a fenced write did not happen.
///
/// The rejections ([`FenceError::is_rejection`]) are final for the sequencer presented: retrying
/// the same write with it cannot succeed. [`FenceError::Storage`] is about the backend, not the
/// sequencer, and may be retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FenceError {
    /// A newer grant of the lock has already written here: the presenter was superseded.
    #[error(
        "stale sequencer for lock {lock:?}: token {presented} is older than the accepted token {accepted}{}; a newer holder has written, so re-acquire the lock and re-read before writing",
        holder_text(*holder_session)
    )]
    Stale {
        lock: String,
        presented: u64,
        accepted: u64,
        /// The session of the grant that set `accepted`, where the resource stores it.
        holder_session: Option<u64>,
    },
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
    /// The backend failed; the write did not happen unless the message says its outcome is
    /// unknown (a failed commit).
    #[error("fence storage error: {message}")]
    Storage { message: String },
}

fn holder_text(holder_session: Option<u64>) -> String {
    match holder_session {
        Some(session) => format!(" (set by session {session})"),
        None => String::new(),
    }
}

impl FenceError {
    /// The machine-readable kind, as in the JSON `kind` field.
    pub fn kind(&self) -> &'static str {
        match self {
            FenceError::Stale { .. } => "stale",
            FenceError::WrongLock { .. } => "wrong_lock",
            FenceError::Missing => "missing",
            FenceError::Malformed { .. } => "malformed",
            FenceError::Forged { .. } => "forged",
            FenceError::InvalidScope { .. } => "invalid_scope",
            FenceError::Corrupt { .. } => "corrupt",
            FenceError::Storage { .. } => "storage",
        }
    }

    /// A newer grant has written: the presenter was superseded.
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceError::Stale { .. })
    }

    /// The sequencer is for another lock.
    pub fn is_wrong_lock(&self) -> bool {
        matches!(self, FenceError::WrongLock { .. })
    }

    /// The sequencer was refused (stale, wrong lock, missing, malformed, forged): retrying with
    /// the same sequencer cannot succeed.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self,
            FenceError::Stale { .. }
                | FenceError::WrongLock { .. }
                | FenceError::Missing
                | FenceError::Malformed { .. }
                | FenceError::Forged { .. }
        )
    }

    /// A backend failure that may succeed when retried.
    pub fn is_retryable(&self) -> bool {
        matches!(self, FenceError::Storage { .. })
    }

    /// A suggested HTTP status: 400 malformed input, 403 forged or foreign, 409 stale,
    /// 428 missing sequencer, 500 corrupt state, 503 storage failure.
    pub fn http_status(&self) -> u16 {
        match self {
            FenceError::Malformed { .. } | FenceError::InvalidScope { .. } => 400,
            FenceError::Forged { .. } | FenceError::WrongLock { .. } => 403,
            FenceError::Stale { .. } => 409,
            FenceError::Missing => 428,
            FenceError::Corrupt { .. } => 500,
            FenceError::Storage { .. } => 503,
        }
    }

    pub(crate) fn storage(error: impl std::fmt::Display) -> FenceError {
        FenceError::Storage {
            message: error.to_string(),
        }
    }
}

impl From<SequencerError> for FenceError {
    fn from(error: SequencerError) -> FenceError {
        // The message is the detail only; the variant's Display adds what kind of failure it is.
        match error {
            SequencerError::Malformed(parse) => FenceError::Malformed {
                message: parse.to_string(),
            },
            other => FenceError::Forged {
                message: other.to_string(),
            },
        }
    }
}
