//! Exit statuses of `palisade`, and which error ends in which.
//!
//! Scripts branch on these, so they are fixed: a new situation gets a new code, an existing
//! code never changes meaning. `palisade lock` passes its command's own status through, so a
//! command that itself exits 75, 76 or 77 is indistinguishable from palisade saying so (as with
//! `timeout(1)` and 124).

use std::fmt;

use palisade_client::{
    AcquireError, CloseError, ConnectError, ErrorClass, QueryError, ReleaseError, RenewError,
    SessionError,
};

/// The service refused the request, or the input is invalid (not the holder, no such session,
/// bad lock name, …).
pub const REFUSED: u8 = 1;
/// The command line is wrong (also clap's usage errors).
pub const USAGE: u8 = 2;
/// The lock service cannot be reached or cannot serve now; nothing was done.
pub const UNAVAILABLE: u8 = 69;
/// Something broke: the service answered nonsense, or palisade itself failed.
pub const INTERNAL: u8 = 70;
/// The lock was not acquired: busy, or not granted within `--wait`.
pub const NOT_ACQUIRED: u8 = 75;
/// `palisade lock`: the lock was lost while the command ran; the command was stopped.
pub const LOCK_LOST: u8 = 76;
/// The outcome is unknown (e.g. the connection broke after the request was sent): the lock
/// may or may not be held or released. Check with `palisade status`.
pub const OUTCOME_UNKNOWN: u8 = 77;
/// `palisade lock`: the command was found but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// `palisade lock`: the command was not found.
pub const COMMAND_NOT_FOUND: u8 = 127;

// `palisade store` shares this scheme; its constants live beside its commands.
const _: () = assert!(palisade_cli::store::EXIT_REFUSED == REFUSED);
const _: () = assert!(palisade_cli::store::EXIT_UNAVAILABLE == UNAVAILABLE);
const _: () = assert!(palisade_cli::store::EXIT_INTERNAL == INTERNAL);
const _: () = assert!(palisade_cli::store::EXIT_OUTCOME_UNKNOWN == OUTCOME_UNKNOWN);
// The store's own codes (3 stale, 5 not found, 8 compare failed) are free here.
const _: () = assert!(palisade_cli::store::EXIT_STALE == 3);
const _: () = assert!(palisade_cli::store::EXIT_NOT_FOUND == 5);
const _: () = assert!(palisade_cli::store::EXIT_COMPARE_FAILED == 8);

/// The exit statuses, as `--help` shows them.
pub const HELP: &str = "\
Exit status:
  0    success (palisade lock: the command's own status is passed through;
       a command killed by signal N gives 128+N)
  1    refused: not the holder, no such session, invalid input
  2    usage error
  3    store: the sequencer is stale (a newer holder read or wrote there)
  5    store get: the key has no value
  8    store: a compare (--if-revision, --create-only, txn --if-…) did not hold
  69   the lock service (or store) is unreachable or unavailable; nothing was done
  70   internal error, or the lock service answered nonsense
  75   the lock was not acquired (busy, or not granted within --wait)
  76   palisade lock: the lock was lost while the command ran; it was stopped
       (SIGTERM, then SIGKILL after --kill-grace)
  77   the outcome is unknown: the lock may or may not be held; check `palisade status`
  126  palisade lock: the command could not be executed
  127  palisade lock: the command was not found";

/// An error that ends the process with a chosen status.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl Exit {
    pub fn new(code: u8, message: impl Into<String>) -> Exit {
        Exit {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// The exit status for an error that ends a command.
///
/// Each error type of the client library classifies itself (`class()`, an exhaustive match in
/// that crate); this only finds the type and maps the class, so a new variant or class cannot
/// end in a status nobody chose.
pub fn code_for(error: &anyhow::Error) -> u8 {
    if let Some(exit) = error.downcast_ref::<Exit>() {
        return exit.code;
    }
    let class = if let Some(e) = error.downcast_ref::<ConnectError>() {
        e.class()
    } else if let Some(e) = error.downcast_ref::<SessionError>() {
        e.class()
    } else if let Some(e) = error.downcast_ref::<AcquireError>() {
        e.class()
    } else if let Some(e) = error.downcast_ref::<ReleaseError>() {
        e.class()
    } else if let Some(e) = error.downcast_ref::<RenewError>() {
        e.class()
    } else if let Some(e) = error.downcast_ref::<CloseError>() {
        e.class()
    } else if let Some(e) = error.downcast_ref::<QueryError>() {
        e.class()
    } else {
        // Not an error of the lock service: the command failed on its own input (a file, an
        // argument clap could not check).
        return REFUSED;
    };
    code_for_class(class)
}

/// The exit status of each class of client error.
fn code_for_class(class: ErrorClass) -> u8 {
    match class {
        ErrorClass::Refused => REFUSED,
        ErrorClass::NotAcquired => NOT_ACQUIRED,
        ErrorClass::Unavailable => UNAVAILABLE,
        ErrorClass::OutcomeUnknown => OUTCOME_UNKNOWN,
        ErrorClass::Internal => INTERNAL,
        ErrorClass::Misconfigured => USAGE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_client::{SessionId, Token};

    fn code(error: impl std::error::Error + Send + Sync + 'static) -> u8 {
        code_for(&anyhow::Error::new(error))
    }

    #[test]
    fn a_busy_lock_or_an_ended_wait_is_not_acquired() {
        let busy = AcquireError::Busy {
            lock: "a".into(),
            holder_session: Some(SessionId::new(1)),
            holder_token: Some(Token::new(2)),
            in_lock_delay: false,
        };
        assert_eq!(code(busy), NOT_ACQUIRED);
        assert_eq!(
            code(AcquireError::WaitEnded { lock: "a".into() }),
            NOT_ACQUIRED
        );
    }

    #[test]
    fn an_unknown_outcome_is_never_reported_as_a_plain_failure() {
        let unknown = AcquireError::Unknown {
            lock: "a".into(),
            session: SessionId::new(1),
            reason: "timeout".into(),
        };
        assert_eq!(code(unknown), OUTCOME_UNKNOWN);
        let unknown = ReleaseError::Unknown {
            lock: "a".into(),
            reason: "timeout".into(),
        };
        assert_eq!(code(unknown), OUTCOME_UNKNOWN);
        assert_eq!(
            code(SessionError::Unknown("timeout".into())),
            OUTCOME_UNKNOWN
        );
    }

    #[test]
    fn a_wrong_holder_is_refused_and_an_unreachable_service_is_unavailable() {
        let not_holder = ReleaseError::NotHolder {
            lock: "a".into(),
            session: SessionId::new(1),
            holder_session: Some(SessionId::new(2)),
        };
        assert_eq!(code(not_holder), REFUSED);
        let unreachable = ConnectError::Unreachable {
            endpoint: "http://127.0.0.1:1".into(),
            reason: "connection refused".into(),
        };
        assert_eq!(code(unreachable), UNAVAILABLE);
        assert_eq!(code(QueryError::Unavailable("down".into())), UNAVAILABLE);
        assert_eq!(code(QueryError::Protocol("nonsense".into())), INTERNAL);
    }

    #[test]
    fn statuses_the_client_does_not_name_keep_their_exit_codes() {
        use tonic::Code;
        let rejected = |code| QueryError::Rejected {
            code,
            message: "x".into(),
        };
        assert_eq!(code(rejected(Code::Internal)), INTERNAL);
        assert_eq!(code(rejected(Code::DataLoss)), INTERNAL);
        assert_eq!(code(rejected(Code::Unimplemented)), INTERNAL);
        assert_eq!(code(rejected(Code::Unavailable)), UNAVAILABLE);
        assert_eq!(code(rejected(Code::ResourceExhausted)), UNAVAILABLE);
        assert_eq!(code(rejected(Code::PermissionDenied)), REFUSED);
        assert_eq!(code(rejected(Code::FailedPrecondition)), REFUSED);
        assert_eq!(
            code(ConnectError::InvalidEndpoint {
                endpoint: "x".into(),
                reason: "y".into()
            }),
            USAGE
        );
        assert_eq!(
            code(SessionError::TooManySessions { sessions_max: 1 }),
            UNAVAILABLE
        );
        assert_eq!(
            code(AcquireError::TokensExhausted { lock: "a".into() }),
            REFUSED
        );
        assert_eq!(
            code(AcquireError::TooManyLocks { locks_max: 1 }),
            NOT_ACQUIRED
        );
    }

    #[test]
    fn an_explicit_exit_keeps_its_code_through_context() {
        let error = anyhow::Error::new(Exit::new(LOCK_LOST, "lost")).context("while running");
        assert_eq!(code_for(&error), LOCK_LOST);
    }

    #[test]
    fn the_codes_are_distinct() {
        let mut codes = vec![
            REFUSED,
            USAGE,
            UNAVAILABLE,
            INTERNAL,
            NOT_ACQUIRED,
            LOCK_LOST,
            OUTCOME_UNKNOWN,
            CANNOT_EXECUTE,
            COMMAND_NOT_FOUND,
        ];
        let count = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), count);
        for code in codes {
            assert!(
                HELP.contains(&format!("  {code} ")),
                "{code} is not in the help"
            );
        }
    }
}
