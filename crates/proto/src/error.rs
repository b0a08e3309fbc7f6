//! The wire form of the lock table's errors: [`CoreError`] to a gRPC status carrying an
//! [`ErrorDetail`], and back.
//!
//! **API Boundary:** this module is the only place that knows how a refusal is spelled on the
//! wire. The server sends with [`status_from_core`], the Rust client reads with
//! [`core_from_status`]; neither touches the details bytes. The schema is `ErrorDetail` in
//! `palisade.proto`, documented there for clients in other languages, so renaming a field of
//! [`CoreError`] changes nothing on the wire.
//!
//! The details bytes follow the gRPC convention (what `grpc-status-details-bin` holds): a
//! `google.rpc.Status` whose `details` hold one `google.protobuf.Any` wrapping the
//! `ErrorDetail`. Those two standard messages are declared here by hand, with their field
//! numbers, rather than compiled from Google's `.proto` files, to keep the build to one file.

use palisade_core::limits::{GrantValueError, LockNameError, OpenKeyError};
use palisade_core::{
    CoreError, CredentialError, DurationMs, ErrorCategory, Quota, RequestId, Right, SessionId,
    TimeMs, Token,
};
use prost::Message;
use tonic::{Code, Status};

use crate::v1::ErrorDetail;

/// The `type_url` of the `Any` that wraps an [`ErrorDetail`].
pub const ERROR_DETAIL_TYPE_URL: &str = "type.googleapis.com/palisade.v1.ErrorDetail";

/// `google.rpc.Status`, as defined in `google/rpc/status.proto`.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`, as defined in `google/protobuf/any.proto`.
#[derive(Clone, PartialEq, Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// The status code of each category. Part of the contract: `palisade.proto` lists it.
pub fn grpc_code(category: ErrorCategory) -> Code {
    match category {
        ErrorCategory::SessionNotFound => Code::NotFound,
        ErrorCategory::InvalidInput => Code::InvalidArgument,
        ErrorCategory::LimitReached => Code::ResourceExhausted,
        ErrorCategory::Busy => Code::FailedPrecondition,
        ErrorCategory::NotHolder => Code::PermissionDenied,
        ErrorCategory::WaitEnded => Code::DeadlineExceeded,
        ErrorCategory::Exhausted => Code::OutOfRange,
        ErrorCategory::Internal => Code::Internal,
        ErrorCategory::Unauthenticated => Code::Unauthenticated,
        ErrorCategory::PermissionDenied => Code::PermissionDenied,
    }
}

/// The status that tells a client the lock table refused a command: the category's code, the
/// error's message, and its [`ErrorDetail`] in the details.
pub fn status_from_core(error: &CoreError) -> Status {
    let code = grpc_code(error.category());
    let message = error.to_string();
    let detail = detail_from_core(error);
    let details = RpcStatus {
        code: code as i32,
        message: message.clone(),
        details: vec![Any {
            type_url: ERROR_DETAIL_TYPE_URL.to_string(),
            value: detail.encode_to_vec(),
        }],
    };
    Status::with_details(code, message, details.encode_to_vec().into())
}

/// The lock table's error a status carries, if it carries one this crate can read: an
/// [`ErrorDetail`] of a known kind, or the JSON that servers sent before it. `None` for any
/// other status, which the caller classifies by its code.
pub fn core_from_status(status: &Status) -> Option<CoreError> {
    let bytes = status.details();
    if bytes.is_empty() {
        return None;
    }
    if let Ok(rpc) = RpcStatus::decode(bytes)
        && let Some(any) = rpc
            .details
            .iter()
            .find(|any| any.type_url == ERROR_DETAIL_TYPE_URL)
    {
        let detail = ErrorDetail::decode(any.value.as_slice()).ok()?;
        return core_from_detail(&detail).ok();
    }
    // Compatibility: servers before `ErrorDetail` sent the serde JSON of `CoreError`.
    serde_json::from_slice::<CoreError>(bytes).ok()
}

/// The wire form of an error.
pub fn detail_from_core(error: &CoreError) -> ErrorDetail {
    let mut detail = ErrorDetail {
        kind: error.code().to_string(),
        category: error.category().name().to_string(),
        ..ErrorDetail::default()
    };
    // Each arm sets exactly the fields `palisade.proto` lists for its kind.
    match error {
        CoreError::SessionNotFound { session } => detail.session = session.get(),
        CoreError::TtlOutOfRange {
            ttl_ms,
            ttl_ms_min,
            ttl_ms_max,
        } => {
            detail.ttl_ms = ttl_ms.as_millis();
            detail.ttl_ms_min = ttl_ms_min.as_millis();
            detail.ttl_ms_max = ttl_ms_max.as_millis();
        }
        CoreError::WaitOutOfRange {
            wait_ms,
            wait_ms_max,
        } => {
            detail.wait_ms = wait_ms.as_millis();
            detail.wait_ms_max = wait_ms_max.as_millis();
        }
        CoreError::InvalidLockName(reason) => {
            detail.reason = reason.code().to_string();
            match reason {
                LockNameError::TooLong { bytes, bytes_max } => {
                    detail.bytes = *bytes;
                    detail.bytes_max = *bytes_max;
                }
                LockNameError::Empty | LockNameError::ControlCharacter => {}
                // `LockNameError` is `#[non_exhaustive]`; its `code()` above is exhaustive, so
                // a new reason is still named on the wire, only without fields until added here.
                _ => {}
            }
        }
        CoreError::InvalidOpenKey(reason) => {
            detail.reason = reason.code().to_string();
            match reason {
                OpenKeyError::Length {
                    bytes,
                    bytes_min,
                    bytes_max,
                } => {
                    detail.bytes = *bytes;
                    detail.bytes_min = *bytes_min;
                    detail.bytes_max = *bytes_max;
                }
                OpenKeyError::NotRandom | OpenKeyError::NotHex => {}
                // As for lock names: the reason is named by `code()`, its fields added here.
                _ => {}
            }
        }
        CoreError::InvalidValue(reason) => {
            detail.reason = reason.code().to_string();
            match reason {
                GrantValueError::TooLong { bytes, bytes_max } => {
                    detail.bytes = *bytes;
                    detail.bytes_max = *bytes_max;
                }
                GrantValueError::Empty | GrantValueError::ControlCharacter => {}
                // As for lock names: the reason is named by `code()`, its fields added here.
                _ => {}
            }
        }
        CoreError::TooManySessions { sessions_max } => {
            detail.sessions_max = u64::from(*sessions_max)
        }
        CoreError::TooManyLocks { locks_max } => detail.locks_max = u64::from(*locks_max),
        CoreError::TooManyWaiters { lock, waiters_max } => {
            detail.lock = lock.clone();
            detail.waiters_max = u64::from(*waiters_max);
        }
        CoreError::Busy {
            lock,
            holder_session,
            holder_token,
            available_at_ms,
        } => {
            detail.lock = lock.clone();
            detail.holder_session = holder_session.map(SessionId::get);
            detail.holder_token = holder_token.map(Token::get);
            detail.available_at_ms = available_at_ms.map(TimeMs::as_millis);
        }
        CoreError::NotHolder {
            lock,
            session,
            holder_session,
        } => {
            detail.lock = lock.clone();
            detail.session = session.get();
            detail.holder_session = holder_session.map(SessionId::get);
        }
        CoreError::TokensExhausted { lock } | CoreError::WaitEnded { lock } => {
            detail.lock = lock.clone();
        }
        CoreError::InvalidLimits { message } => detail.limits_problem = message.clone(),
        CoreError::RequestIdConflict { request_id } => detail.request_id = request_id.get(),
        CoreError::SessionSecretMissing { session }
        | CoreError::SessionSecretWrong { session }
        | CoreError::SessionNotOwned { session } => detail.session = session.get(),
        CoreError::Unauthenticated { reason } => detail.reason = reason.code().to_string(),
        CoreError::PermissionDenied {
            identity,
            right,
            scope,
        } => {
            detail.identity = identity.clone();
            detail.right = right.name().to_string();
            detail.scope = scope.clone();
        }
        CoreError::QuotaReached {
            identity,
            quota,
            quota_max,
        } => {
            detail.identity = identity.clone();
            detail.quota = quota.name().to_string();
            detail.quota_max = u64::from(*quota_max);
        }
        CoreError::PermitsOutOfRange {
            permits,
            permits_max,
        } => {
            detail.permits = *permits;
            detail.permits_max = *permits_max;
        }
        CoreError::PermitsMismatch {
            lock,
            permits,
            requested,
        } => {
            detail.lock = lock.clone();
            detail.permits = *permits;
            detail.requested_permits = *requested;
        }
        CoreError::ModeConflict {
            lock,
            session,
            held_shared,
        } => {
            detail.lock = lock.clone();
            detail.session = session.get();
            detail.held_shared = *held_shared;
        }
        CoreError::MultiLockSize { locks, locks_max } => {
            detail.locks = *locks;
            detail.locks_max = u64::from(*locks_max);
        }
        CoreError::MultiLockRepeated { lock } => detail.lock = lock.clone(),
        CoreError::MultiLockHeld { lock, session } => {
            detail.lock = lock.clone();
            detail.session = session.get();
        }
        // `CoreError` is `#[non_exhaustive]`. A new variant is still sent with its `kind` and
        // `category` (both exhaustive in core) and its status code; the round-trip test over
        // `CoreError::examples()` fails until its fields are added here and to the schema.
        _ => {}
    }
    detail
}

/// Why an [`ErrorDetail`] could not be read as a [`CoreError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DetailError {
    /// A kind this version does not know (a newer server): classify by the status code.
    #[error("unknown error kind {kind:?}")]
    UnknownKind { kind: String },
    #[error("unknown reason {reason:?} for error kind {kind:?}")]
    UnknownReason { kind: String, reason: String },
    #[error("field {field} of error kind {kind:?} is out of range")]
    OutOfRange { kind: String, field: &'static str },
}

/// Reads the wire form of an error back.
pub fn core_from_detail(detail: &ErrorDetail) -> Result<CoreError, DetailError> {
    let narrow = |value: u64, field: &'static str| {
        u32::try_from(value).map_err(|_| DetailError::OutOfRange {
            kind: detail.kind.clone(),
            field,
        })
    };
    let unknown_reason = || DetailError::UnknownReason {
        kind: detail.kind.clone(),
        reason: detail.reason.clone(),
    };
    let lock = || detail.lock.clone();
    let error = match detail.kind.as_str() {
        "session_not_found" => CoreError::SessionNotFound {
            session: SessionId::new(detail.session),
        },
        "ttl_out_of_range" => CoreError::TtlOutOfRange {
            ttl_ms: DurationMs::from_millis(detail.ttl_ms),
            ttl_ms_min: DurationMs::from_millis(detail.ttl_ms_min),
            ttl_ms_max: DurationMs::from_millis(detail.ttl_ms_max),
        },
        "wait_out_of_range" => CoreError::WaitOutOfRange {
            wait_ms: DurationMs::from_millis(detail.wait_ms),
            wait_ms_max: DurationMs::from_millis(detail.wait_ms_max),
        },
        "invalid_lock_name" => CoreError::InvalidLockName(match detail.reason.as_str() {
            "empty" => LockNameError::Empty,
            "too_long" => LockNameError::TooLong {
                bytes: detail.bytes,
                bytes_max: detail.bytes_max,
            },
            "control_character" => LockNameError::ControlCharacter,
            _ => return Err(unknown_reason()),
        }),
        "invalid_open_key" => CoreError::InvalidOpenKey(match detail.reason.as_str() {
            "length" => OpenKeyError::Length {
                bytes: detail.bytes,
                bytes_min: detail.bytes_min,
                bytes_max: detail.bytes_max,
            },
            "not_random" => OpenKeyError::NotRandom,
            "not_hex" => OpenKeyError::NotHex,
            _ => return Err(unknown_reason()),
        }),
        "invalid_value" => CoreError::InvalidValue(match detail.reason.as_str() {
            "empty" => GrantValueError::Empty,
            "too_long" => GrantValueError::TooLong {
                bytes: detail.bytes,
                bytes_max: detail.bytes_max,
            },
            "control_character" => GrantValueError::ControlCharacter,
            _ => return Err(unknown_reason()),
        }),
        "too_many_sessions" => CoreError::TooManySessions {
            sessions_max: narrow(detail.sessions_max, "sessions_max")?,
        },
        "too_many_locks" => CoreError::TooManyLocks {
            locks_max: narrow(detail.locks_max, "locks_max")?,
        },
        "too_many_waiters" => CoreError::TooManyWaiters {
            lock: lock(),
            waiters_max: narrow(detail.waiters_max, "waiters_max")?,
        },
        "busy" => CoreError::Busy {
            lock: lock(),
            holder_session: detail.holder_session.map(SessionId::new),
            holder_token: detail.holder_token.map(Token::new),
            available_at_ms: detail.available_at_ms.map(TimeMs::from_millis),
        },
        "not_holder" => CoreError::NotHolder {
            lock: lock(),
            session: SessionId::new(detail.session),
            holder_session: detail.holder_session.map(SessionId::new),
        },
        "tokens_exhausted" => CoreError::TokensExhausted { lock: lock() },
        "wait_ended" => CoreError::WaitEnded { lock: lock() },
        "invalid_limits" => CoreError::InvalidLimits {
            message: detail.limits_problem.clone(),
        },
        "request_id_conflict" => CoreError::RequestIdConflict {
            request_id: RequestId::new(detail.request_id),
        },
        "session_secret_missing" => CoreError::SessionSecretMissing {
            session: SessionId::new(detail.session),
        },
        "session_secret_wrong" => CoreError::SessionSecretWrong {
            session: SessionId::new(detail.session),
        },
        "unauthenticated" => CoreError::Unauthenticated {
            reason: match detail.reason.as_str() {
                "credential_missing" => CredentialError::Missing,
                "credential_malformed" => CredentialError::Malformed,
                "credential_unknown" => CredentialError::Unknown,
                "credential_certificate_name" => CredentialError::CertificateName,
                "credential_conflict" => CredentialError::Conflict,
                "admin_token_needed" => CredentialError::AdminTokenNeeded,
                _ => return Err(unknown_reason()),
            },
        },
        "permission_denied" => CoreError::PermissionDenied {
            identity: detail.identity.clone(),
            right: Right::from_name(&detail.right).ok_or_else(|| DetailError::OutOfRange {
                kind: detail.kind.clone(),
                field: "right",
            })?,
            scope: detail.scope.clone(),
        },
        "session_not_owned" => CoreError::SessionNotOwned {
            session: SessionId::new(detail.session),
        },
        "quota_reached" => CoreError::QuotaReached {
            identity: detail.identity.clone(),
            quota: Quota::from_name(&detail.quota).ok_or_else(|| DetailError::OutOfRange {
                kind: detail.kind.clone(),
                field: "quota",
            })?,
            quota_max: narrow(detail.quota_max, "quota_max")?,
        },
        "permits_out_of_range" => CoreError::PermitsOutOfRange {
            permits: detail.permits,
            permits_max: detail.permits_max,
        },
        "permits_mismatch" => CoreError::PermitsMismatch {
            lock: detail.lock.clone(),
            permits: detail.permits,
            requested: detail.requested_permits,
        },
        "mode_conflict" => CoreError::ModeConflict {
            lock: detail.lock.clone(),
            session: SessionId::new(detail.session),
            held_shared: detail.held_shared,
        },
        "multi_lock_size" => CoreError::MultiLockSize {
            locks: detail.locks,
            locks_max: narrow(detail.locks_max, "locks_max")?,
        },
        "multi_lock_repeated" => CoreError::MultiLockRepeated { lock: lock() },
        "multi_lock_held" => CoreError::MultiLockHeld {
            lock: lock(),
            session: SessionId::new(detail.session),
        },
        // Strings, not an enum: a kind from a newer server is data, not a bug.
        _ => {
            return Err(DetailError::UnknownKind {
                kind: detail.kind.clone(),
            });
        }
    };
    Ok(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_error_survives_the_wire() {
        for error in CoreError::examples() {
            let status = status_from_core(&error);
            assert_eq!(status.code(), grpc_code(error.category()), "{error:?}");
            assert_eq!(status.message(), error.to_string());
            assert_eq!(core_from_status(&status), Some(error.clone()));

            let detail = detail_from_core(&error);
            assert_eq!(detail.kind, error.code());
            assert_eq!(detail.category, error.category().name());
            assert_eq!(core_from_detail(&detail), Ok(error));
        }
    }

    #[test]
    fn the_details_are_a_google_rpc_status_wrapping_one_error_detail() {
        let busy = CoreError::Busy {
            lock: "jobs/nightly".into(),
            holder_session: Some(SessionId::new(3)),
            holder_token: Some(Token::new(42)),
            available_at_ms: None,
        };
        let status = status_from_core(&busy);
        let rpc = RpcStatus::decode(status.details()).unwrap();
        assert_eq!(rpc.code, Code::FailedPrecondition as i32);
        assert_eq!(rpc.message, status.message());
        assert_eq!(rpc.details.len(), 1);
        assert_eq!(rpc.details[0].type_url, ERROR_DETAIL_TYPE_URL);
        let detail = ErrorDetail::decode(rpc.details[0].value.as_slice()).unwrap();
        assert_eq!(
            detail,
            ErrorDetail {
                kind: "busy".into(),
                category: "busy".into(),
                lock: "jobs/nightly".into(),
                holder_session: Some(3),
                holder_token: Some(42),
                ..ErrorDetail::default()
            }
        );
    }

    #[test]
    fn the_codes_match_the_table_in_the_proto_file() {
        let expected = [
            ("session_not_found", Code::NotFound),
            ("ttl_out_of_range", Code::InvalidArgument),
            ("wait_out_of_range", Code::InvalidArgument),
            ("invalid_lock_name", Code::InvalidArgument),
            ("invalid_open_key", Code::InvalidArgument),
            ("invalid_value", Code::InvalidArgument),
            ("request_id_conflict", Code::InvalidArgument),
            ("too_many_sessions", Code::ResourceExhausted),
            ("too_many_locks", Code::ResourceExhausted),
            ("too_many_waiters", Code::ResourceExhausted),
            ("busy", Code::FailedPrecondition),
            ("not_holder", Code::PermissionDenied),
            ("wait_ended", Code::DeadlineExceeded),
            ("tokens_exhausted", Code::OutOfRange),
            ("invalid_limits", Code::Internal),
            ("session_secret_missing", Code::Unauthenticated),
            ("session_secret_wrong", Code::Unauthenticated),
            ("unauthenticated", Code::Unauthenticated),
            ("permission_denied", Code::PermissionDenied),
            ("session_not_owned", Code::PermissionDenied),
            ("quota_reached", Code::ResourceExhausted),
            ("permits_out_of_range", Code::InvalidArgument),
            ("permits_mismatch", Code::InvalidArgument),
            ("mode_conflict", Code::InvalidArgument),
            ("multi_lock_size", Code::InvalidArgument),
            ("multi_lock_repeated", Code::InvalidArgument),
            ("multi_lock_held", Code::InvalidArgument),
        ];
        let proto = include_str!("../proto/palisade.proto");
        for error in CoreError::examples() {
            let (kind, code) = expected
                .iter()
                .find(|(kind, _)| *kind == error.code())
                .unwrap_or_else(|| panic!("{} is not in this test's table", error.code()));
            assert_eq!(status_from_core(&error).code(), *code, "{kind}");
            assert!(
                proto.contains(&format!("//   {kind} ")),
                "{kind} is not documented in palisade.proto"
            );
        }
    }

    #[test]
    fn a_kind_from_a_newer_server_is_left_to_the_status_code() {
        let detail = ErrorDetail {
            kind: "lock_frozen".into(),
            lock: "a".into(),
            ..ErrorDetail::default()
        };
        let details = RpcStatus {
            code: Code::FailedPrecondition as i32,
            message: "frozen".into(),
            details: vec![Any {
                type_url: ERROR_DETAIL_TYPE_URL.into(),
                value: detail.encode_to_vec(),
            }],
        };
        let status = Status::with_details(
            Code::FailedPrecondition,
            "frozen",
            details.encode_to_vec().into(),
        );
        assert_eq!(core_from_status(&status), None);
        assert_eq!(
            core_from_detail(&detail),
            Err(DetailError::UnknownKind {
                kind: "lock_frozen".into()
            })
        );
    }

    #[test]
    fn the_json_of_servers_before_error_detail_is_still_read() {
        let busy = CoreError::Busy {
            lock: "a".into(),
            holder_session: Some(SessionId::new(1)),
            holder_token: Some(Token::new(2)),
            available_at_ms: None,
        };
        let status = Status::with_details(
            Code::FailedPrecondition,
            busy.to_string(),
            serde_json::to_vec(&busy).unwrap().into(),
        );
        assert_eq!(core_from_status(&status), Some(busy));
        let garbage =
            Status::with_details(Code::Internal, "x", b"\x08\x01not json".to_vec().into());
        assert_eq!(core_from_status(&garbage), None);
    }
}
