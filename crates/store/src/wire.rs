//! The HTTP wire form of the store's errors: the JSON body and the status of every kind.
//!
//! **API Boundary:** this module is the only place that knows how a store error is spelled on
//! the wire. The server answers with [`ErrorBody::from`] a [`StoreError`] or an
//! [`HttpRefusal`] and [`WireError::http_status`]; [`crate::StoreClient`] reads the body back
//! with [`client_error`]; `palisade store --json` prints [`ErrorBody::from`] a
//! [`StoreClientError`]. The schema is [`WireError`]: every kind and field is named here, not
//! derived from the Rust errors, so renaming a variant or a field of those changes nothing on
//! the wire. `crates/store/docs/store-http.md` documents it for clients in other languages,
//! and `crates/store/tests/wire_form.rs` pins every kind byte for byte.
//!
//! A body is `{"kind": …, "message": …, <the kind's fields>}`, its keys in sorted order (the
//! order `serde_json::Value` keeps, in which the server always sent them).

use serde::{Deserialize, Serialize};

use crate::error::{HttpRefusal, StoreClientError, StoreError};

/// The JSON body of an error answer: the kind with its fields, and the message a person reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The kind (the `kind` field) and the kind's fields.
    #[serde(flatten)]
    pub error: WireError,
    /// The error's text, for a person; a client rebuilds its own from the fields.
    pub message: String,
}

/// Every kind of store error on the wire, with its typed fields. The names here are the wire
/// names: each kind is spelled out with `rename`, and the field names are the JSON keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum WireError {
    #[serde(rename = "stale")]
    Stale {
        lock: String,
        presented: u64,
        accepted: u64,
        /// `null` when the store does not know the session (always sent).
        #[serde(default)]
        holder_session: Option<u64>,
    },
    #[serde(rename = "token_reissued")]
    TokenReissued {
        lock: String,
        token: u64,
        first_session: u64,
        presented_session: u64,
    },
    #[serde(rename = "wrong_lock")]
    WrongLock {
        /// Left out of a claim's refusal, which concerns no key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        expected: String,
        presented: String,
    },
    #[serde(rename = "shared_write")]
    SharedWrite { lock: String, token: u64 },
    #[serde(rename = "unbound")]
    Unbound { key: String },
    #[serde(rename = "missing")]
    Missing,
    #[serde(rename = "malformed")]
    Malformed { detail: String },
    #[serde(rename = "forged")]
    Forged { detail: String },
    #[serde(rename = "too_large")]
    TooLarge {
        what: String,
        limit: String,
        /// `null` when the size is not known (a body cut off at the limit).
        #[serde(default)]
        size: Option<u64>,
        size_max: u64,
    },
    #[serde(rename = "invalid_key")]
    InvalidKey { detail: String },
    #[serde(rename = "invalid_request")]
    InvalidRequest { detail: String },
    #[serde(rename = "request_id_reused")]
    RequestIdReused { request_id: String },
    #[serde(rename = "quota_reached")]
    QuotaReached {
        lock: String,
        quota: String,
        used: u64,
        quota_max: u64,
    },
    #[serde(rename = "not_found")]
    NotFound { key: String },
    #[serde(rename = "compare_failed")]
    CompareFailed {
        compare: u64,
        key: String,
        revision: u64,
    },
    #[serde(rename = "no_such_route")]
    NoSuchRoute { method: String, path: String },
    #[serde(rename = "method_not_allowed")]
    MethodNotAllowed { method: String, path: String },
    #[serde(rename = "misdirected_request")]
    MisdirectedRequest { host: String },
    #[serde(rename = "corrupt")]
    Corrupt { detail: String },
    #[serde(rename = "storage")]
    Storage { detail: String },
    #[serde(rename = "unavailable")]
    Unavailable { detail: String },
    #[serde(rename = "outcome_unknown")]
    OutcomeUnknown { detail: String },
    /// Never sent by a server: what `palisade store --json` prints for an answer it could not
    /// read.
    #[serde(rename = "unexpected_response")]
    UnexpectedResponse { status: u16, detail: String },
}

impl WireError {
    /// The `kind` field.
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::Stale { .. } => "stale",
            WireError::TokenReissued { .. } => "token_reissued",
            WireError::WrongLock { .. } => "wrong_lock",
            WireError::SharedWrite { .. } => "shared_write",
            WireError::Unbound { .. } => "unbound",
            WireError::Missing => "missing",
            WireError::Malformed { .. } => "malformed",
            WireError::Forged { .. } => "forged",
            WireError::TooLarge { .. } => "too_large",
            WireError::InvalidKey { .. } => "invalid_key",
            WireError::InvalidRequest { .. } => "invalid_request",
            WireError::RequestIdReused { .. } => "request_id_reused",
            WireError::QuotaReached { .. } => "quota_reached",
            WireError::NotFound { .. } => "not_found",
            WireError::CompareFailed { .. } => "compare_failed",
            WireError::NoSuchRoute { .. } => "no_such_route",
            WireError::MethodNotAllowed { .. } => "method_not_allowed",
            WireError::MisdirectedRequest { .. } => "misdirected_request",
            WireError::Corrupt { .. } => "corrupt",
            WireError::Storage { .. } => "storage",
            WireError::Unavailable { .. } => "unavailable",
            WireError::OutcomeUnknown { .. } => "outcome_unknown",
            WireError::UnexpectedResponse { .. } => "unexpected_response",
        }
    }

    /// The HTTP status of the kind.
    ///
    /// 400 malformed input, 403 forged, another lock's sequencer or a key bound to no lock, 404
    /// not found or no such route, 405 method not allowed, 409 stale or a token issued twice,
    /// 412 compare failed, 413 too large, 421 misdirected, 422 request id reused, 428 missing
    /// sequencer, 500 corrupt, 503 storage failure or a full write queue, 504 outcome unknown,
    /// 507 a lock's quota reached.
    ///
    /// A missing sequencer is 428 Precondition Required, as the fence's
    /// `FenceError::http_status` says for every resource: the sequencer is a precondition of the
    /// write, like `If-Match`, not a credential. 401 would tell HTTP clients and proxies to fix
    /// their credentials, and is kept for the day the store checks a bearer token.
    pub fn http_status(&self) -> u16 {
        match self {
            WireError::Malformed { .. }
            | WireError::InvalidKey { .. }
            | WireError::InvalidRequest { .. } => 400,
            WireError::Missing => 428,
            WireError::Forged { .. }
            | WireError::WrongLock { .. }
            | WireError::SharedWrite { .. }
            | WireError::Unbound { .. } => 403,
            WireError::NotFound { .. } | WireError::NoSuchRoute { .. } => 404,
            WireError::MethodNotAllowed { .. } => 405,
            WireError::Stale { .. } | WireError::TokenReissued { .. } => 409,
            WireError::CompareFailed { .. } => 412,
            WireError::TooLarge { .. } => 413,
            WireError::MisdirectedRequest { .. } => 421,
            WireError::RequestIdReused { .. } => 422,
            WireError::Corrupt { .. } => 500,
            WireError::Storage { .. } | WireError::Unavailable { .. } => 503,
            WireError::OutcomeUnknown { .. } => 504,
            WireError::QuotaReached { .. } => 507,
            WireError::UnexpectedResponse { status, .. } => *status,
        }
    }

    /// The error a client meets when a server sends this kind with `status`.
    fn into_client_error(self, status: u16) -> StoreClientError {
        let store = StoreClientError::Store;
        let http = StoreClientError::Http;
        match self {
            WireError::Stale {
                lock,
                presented,
                accepted,
                holder_session,
            } => store(StoreError::Stale {
                lock,
                presented,
                accepted,
                holder_session,
            }),
            WireError::TokenReissued {
                lock,
                token,
                first_session,
                presented_session,
            } => store(StoreError::TokenReissued {
                lock,
                token,
                first_session,
                presented_session,
            }),
            WireError::WrongLock {
                key,
                expected,
                presented,
            } => store(StoreError::WrongLock {
                key,
                expected,
                presented,
            }),
            WireError::SharedWrite { lock, token } => {
                store(StoreError::SharedWrite { lock, token })
            }
            WireError::Unbound { key } => store(StoreError::Unbound { key }),
            WireError::Missing => store(StoreError::Missing),
            WireError::Malformed { detail } => store(StoreError::Malformed { message: detail }),
            WireError::Forged { detail } => store(StoreError::Forged { message: detail }),
            WireError::TooLarge {
                what,
                limit,
                size,
                size_max,
            } => store(StoreError::TooLarge {
                what,
                limit,
                size,
                size_max,
            }),
            WireError::InvalidKey { detail } => store(StoreError::InvalidKey { message: detail }),
            WireError::InvalidRequest { detail } => {
                store(StoreError::InvalidRequest { message: detail })
            }
            WireError::RequestIdReused { request_id } => {
                store(StoreError::RequestIdReused { request_id })
            }
            WireError::QuotaReached {
                lock,
                quota,
                used,
                quota_max,
            } => store(StoreError::QuotaReached {
                lock,
                quota,
                used,
                quota_max,
            }),
            WireError::NotFound { key } => store(StoreError::NotFound { key }),
            WireError::CompareFailed {
                compare,
                key,
                revision,
            } => store(StoreError::CompareFailed {
                compare,
                key,
                revision,
            }),
            WireError::NoSuchRoute { method, path } => {
                http(HttpRefusal::NoSuchRoute { method, path })
            }
            WireError::MethodNotAllowed { method, path } => {
                http(HttpRefusal::MethodNotAllowed { method, path })
            }
            WireError::MisdirectedRequest { host } => {
                http(HttpRefusal::MisdirectedRequest { host })
            }
            WireError::Corrupt { detail } => store(StoreError::Corrupt { message: detail }),
            WireError::Storage { detail } => store(StoreError::Storage { message: detail }),
            WireError::Unavailable { detail } => store(StoreError::Unavailable { message: detail }),
            WireError::OutcomeUnknown { detail } => {
                store(StoreError::OutcomeUnknown { message: detail })
            }
            // A server never sends this kind: the answer is not one this client understands.
            WireError::UnexpectedResponse { detail, .. } => StoreClientError::UnexpectedResponse {
                status,
                message: detail,
            },
        }
    }
}

impl From<&StoreError> for WireError {
    fn from(error: &StoreError) -> WireError {
        let detail = |message: &String| message.clone();
        match error {
            StoreError::Stale {
                lock,
                presented,
                accepted,
                holder_session,
            } => WireError::Stale {
                lock: lock.clone(),
                presented: *presented,
                accepted: *accepted,
                holder_session: *holder_session,
            },
            StoreError::TokenReissued {
                lock,
                token,
                first_session,
                presented_session,
            } => WireError::TokenReissued {
                lock: lock.clone(),
                token: *token,
                first_session: *first_session,
                presented_session: *presented_session,
            },
            StoreError::WrongLock {
                key,
                expected,
                presented,
            } => WireError::WrongLock {
                key: key.clone(),
                expected: expected.clone(),
                presented: presented.clone(),
            },
            StoreError::SharedWrite { lock, token } => WireError::SharedWrite {
                lock: lock.clone(),
                token: *token,
            },
            StoreError::Unbound { key } => WireError::Unbound { key: key.clone() },
            StoreError::Missing => WireError::Missing,
            StoreError::Malformed { message } => WireError::Malformed {
                detail: detail(message),
            },
            StoreError::Forged { message } => WireError::Forged {
                detail: detail(message),
            },
            StoreError::TooLarge {
                what,
                limit,
                size,
                size_max,
            } => WireError::TooLarge {
                what: what.clone(),
                limit: limit.clone(),
                size: *size,
                size_max: *size_max,
            },
            StoreError::InvalidKey { message } => WireError::InvalidKey {
                detail: detail(message),
            },
            StoreError::InvalidRequest { message } => WireError::InvalidRequest {
                detail: detail(message),
            },
            StoreError::RequestIdReused { request_id } => WireError::RequestIdReused {
                request_id: request_id.clone(),
            },
            StoreError::QuotaReached {
                lock,
                quota,
                used,
                quota_max,
            } => WireError::QuotaReached {
                lock: lock.clone(),
                quota: quota.clone(),
                used: *used,
                quota_max: *quota_max,
            },
            StoreError::NotFound { key } => WireError::NotFound { key: key.clone() },
            StoreError::CompareFailed {
                compare,
                key,
                revision,
            } => WireError::CompareFailed {
                compare: *compare,
                key: key.clone(),
                revision: *revision,
            },
            StoreError::Corrupt { message } => WireError::Corrupt {
                detail: detail(message),
            },
            StoreError::Storage { message } => WireError::Storage {
                detail: detail(message),
            },
            StoreError::Unavailable { message } => WireError::Unavailable {
                detail: detail(message),
            },
            StoreError::OutcomeUnknown { message } => WireError::OutcomeUnknown {
                detail: detail(message),
            },
        }
    }
}

impl From<&HttpRefusal> for WireError {
    fn from(refusal: &HttpRefusal) -> WireError {
        match refusal {
            HttpRefusal::NoSuchRoute { method, path } => WireError::NoSuchRoute {
                method: method.clone(),
                path: path.clone(),
            },
            HttpRefusal::MethodNotAllowed { method, path } => WireError::MethodNotAllowed {
                method: method.clone(),
                path: path.clone(),
            },
            HttpRefusal::MisdirectedRequest { host } => {
                WireError::MisdirectedRequest { host: host.clone() }
            }
        }
    }
}

impl From<&StoreClientError> for WireError {
    fn from(error: &StoreClientError) -> WireError {
        match error {
            StoreClientError::Store(error) => WireError::from(error),
            StoreClientError::Http(refusal) => WireError::from(refusal),
            StoreClientError::InvalidRequest { message } => WireError::InvalidRequest {
                detail: message.clone(),
            },
            StoreClientError::Unavailable { message } => WireError::Unavailable {
                detail: message.clone(),
            },
            StoreClientError::OutcomeUnknown { message } => WireError::OutcomeUnknown {
                detail: message.clone(),
            },
            StoreClientError::UnexpectedResponse { status, message } => {
                WireError::UnexpectedResponse {
                    status: *status,
                    detail: message.clone(),
                }
            }
        }
    }
}

impl ErrorBody {
    /// The body as a JSON value (its keys sorted, as every body was sent).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(
            |_| serde_json::json!({ "kind": self.error.kind(), "message": self.message }),
        )
    }
}

impl<E> From<&E> for ErrorBody
where
    E: std::fmt::Display,
    for<'a> &'a E: Into<WireError>,
{
    fn from(error: &E) -> ErrorBody {
        ErrorBody {
            error: error.into(),
            message: error.to_string(),
        }
    }
}

/// What every layer of error answers from its wire form.
macro_rules! wire_queries {
    ($($error:ty),*) => {$(
        impl $error {
            /// The machine-readable kind, as in the JSON `kind` field ([`crate::wire`]).
            pub fn kind(&self) -> &'static str {
                WireError::from(self).kind()
            }

            /// The HTTP status of the kind ([`crate::wire`] has the table): the one the server
            /// answers with, or, for a failure on the client's side, the one a server gives the
            /// same kind (503 unreachable, 504 no answer, 400 invalid).
            pub fn http_status(&self) -> u16 {
                WireError::from(self).http_status()
            }

            /// The JSON body (`kind`, `message`, the kind's fields), as the server sends it and
            /// `palisade store --json` prints it.
            pub fn to_json(&self) -> serde_json::Value {
                ErrorBody::from(self).to_json()
            }
        }
    )*};
}

wire_queries!(StoreError, HttpRefusal, StoreClientError);

/// Characters of an unreadable answer kept in the error.
const UNREADABLE_BODY_CHARS_MAX: usize = 200;

/// The error a client meets when the server answers `status` with `body`: the refusal it
/// sent, or, for a body that is not an [`ErrorBody`], [`StoreClientError::UnexpectedResponse`].
pub fn client_error(status: u16, body: &[u8]) -> StoreClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(body) => body.error.into_client_error(status),
        Err(_) => StoreClientError::UnexpectedResponse {
            status,
            message: String::from_utf8_lossy(body)
                .chars()
                .take(UNREADABLE_BODY_CHARS_MAX)
                .collect(),
        },
    }
}
