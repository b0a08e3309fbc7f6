//! Scenarios for the pure fence decision that every backend runs.

mod common;

use common::{grant, public_keys};
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, FenceState, Intent, LockBinding, verify_presented};
use palisade_sequencer::VerifiedSequencer;

/// The rule for a write: every scenario here is an exclusive grant's, for which a write and a
/// claim are decided alike (`rule_vectors.rs` covers the intents).
fn check(
    accepted: Option<&FenceState>,
    binding: LockBinding<'_>,
    sequencer: &VerifiedSequencer,
) -> Result<FenceState, FenceError> {
    palisade_fence::check(accepted, binding, sequencer, Intent::Write)
}

fn state(lock: &str, token_max: u64, holder_session: u64) -> FenceState {
    FenceState {
        lock: lock.into(),
        token_max: Token::new(token_max),
        holder_session: SessionId::new(holder_session),
    }
}

#[test]
fn the_first_write_binds_the_scope_to_its_lock() {
    let next = check(None, LockBinding::BindOnFirstWrite, &grant("jobs", 5, 1)).unwrap();
    assert_eq!(next, state("jobs", 5, 1));
}

#[test]
fn the_same_grant_writes_many_times_and_newer_grants_advance() {
    let accepted = state("jobs", 5, 1);
    let same = check(
        Some(&accepted),
        LockBinding::BindOnFirstWrite,
        &grant("jobs", 5, 1),
    );
    assert_eq!(same.unwrap(), accepted);
    let newer = check(
        Some(&accepted),
        LockBinding::BindOnFirstWrite,
        &grant("jobs", 9, 2),
    );
    assert_eq!(newer.unwrap(), state("jobs", 9, 2));
}

#[test]
fn a_superseded_holder_is_told_who_superseded_it() {
    let accepted = state("jobs", 9, 2);
    let err = check(
        Some(&accepted),
        LockBinding::BindOnFirstWrite,
        &grant("jobs", 5, 1),
    );
    let err = err.unwrap_err();
    assert_eq!(
        err,
        FenceError::Stale {
            lock: "jobs".into(),
            presented: Token::new(5),
            accepted: Token::new(9),
            holder_session: Some(SessionId::new(2))
        }
    );
    assert!(err.is_stale() && err.is_rejection() && !err.is_retryable());
    let message = err.to_string();
    assert!(
        message.contains("token 5") && message.contains("accepted token 9"),
        "{message}"
    );
    assert!(message.contains("session 2"), "{message}");
}

#[test]
fn the_accepted_token_from_a_second_session_is_refused_as_issued_twice() {
    // Session 1 presented token 5 first; the same lock and token signed for session 2 can only
    // come from a lock service that issued token 5 twice (restored, or its log lost).
    let accepted = check(None, LockBinding::BindOnFirstWrite, &grant("jobs", 5, 1)).unwrap();
    let err = check(
        Some(&accepted),
        LockBinding::BindOnFirstWrite,
        &grant("jobs", 5, 2),
    )
    .unwrap_err();
    assert_eq!(
        err,
        FenceError::TokenReissued {
            lock: "jobs".into(),
            token: Token::new(5),
            first_session: SessionId::new(1),
            presented_session: SessionId::new(2),
        }
    );
    assert!(err.is_token_reissued() && err.is_rejection() && err.is_final());
    assert!(!err.is_stale());
    assert_eq!((err.kind(), err.http_status()), ("token_reissued", 409));
    let message = err.to_string();
    for part in [
        "token 5",
        "\"jobs\"",
        "session 1",
        "session 2",
        "issued this token twice",
    ] {
        assert!(message.contains(part), "{part:?} missing from {message}");
    }
    let json = serde_json::to_value(&err).unwrap();
    assert_eq!(json["kind"], "token_reissued");
    assert_eq!(
        (
            &json["token"],
            &json["first_session"],
            &json["presented_session"]
        ),
        (&5.into(), &1.into(), &2.into())
    );

    // The session that presented it first goes on writing with it, and a newer token from
    // any session advances as before.
    assert_eq!(
        check(
            Some(&accepted),
            LockBinding::BindOnFirstWrite,
            &grant("jobs", 5, 1)
        )
        .unwrap(),
        accepted
    );
    assert_eq!(
        check(
            Some(&accepted),
            LockBinding::BindOnFirstWrite,
            &grant("jobs", 6, 2)
        )
        .unwrap(),
        state("jobs", 6, 2)
    );
    // An older token from the second session is stale, as any older token.
    assert!(
        check(
            Some(&state("jobs", 6, 2)),
            LockBinding::BindOnFirstWrite,
            &grant("jobs", 5, 3)
        )
        .unwrap_err()
        .is_stale()
    );
}

#[test]
fn another_locks_sequencer_is_refused_whatever_its_token() {
    let accepted = state("jobs", 9, 2);
    let err = check(
        Some(&accepted),
        LockBinding::BindOnFirstWrite,
        &grant("other", 1000, 3),
    );
    assert_eq!(
        err.unwrap_err(),
        FenceError::WrongLock {
            expected: "jobs".into(),
            presented: "other".into()
        }
    );
    let err = check(None, LockBinding::Expect("jobs"), &grant("other", 1, 3)).unwrap_err();
    assert!(err.is_wrong_lock());
    assert!(check(None, LockBinding::Expect("jobs"), &grant("jobs", 1, 3)).is_ok());
}

#[test]
fn errors_serialise_with_a_machine_readable_kind() {
    let err = FenceError::Stale {
        lock: "jobs".into(),
        presented: Token::new(5),
        accepted: Token::new(9),
        holder_session: Some(SessionId::new(2)),
    };
    let json: serde_json::Value = serde_json::to_value(&err).unwrap();
    assert_eq!(json["kind"], "stale");
    assert_eq!(json["presented"], 5);
    assert_eq!(json["accepted"], 9);
    assert_eq!(json["holder_session"], 2);
    assert_eq!(err.kind(), "stale");
    assert_eq!(serde_json::from_value::<FenceError>(json).unwrap(), err);
    assert_eq!(
        serde_json::to_value(FenceError::Missing).unwrap()["kind"],
        "missing"
    );
}

#[test]
fn the_state_serialises_its_token_and_session_as_bare_numbers() {
    let stored = r#"{"lock":"jobs","token_max":9,"holder_session":7}"#;
    assert_eq!(serde_json::to_string(&state("jobs", 9, 7)).unwrap(), stored);
    assert_eq!(
        serde_json::from_str::<FenceState>(stored).unwrap(),
        state("jobs", 9, 7)
    );
}

#[test]
fn presented_text_maps_to_missing_malformed_or_forged() {
    let key = public_keys();
    assert_eq!(
        verify_presented(None, &key).unwrap_err(),
        FenceError::Missing
    );
    assert_eq!(
        verify_presented(Some("  "), &key).unwrap_err(),
        FenceError::Missing
    );
    let malformed = verify_presented(Some("pal1.garbage"), &key).unwrap_err();
    assert_eq!(malformed.kind(), "malformed");
    assert_eq!(malformed.http_status(), 400);
    let forged = verify_presented(Some(&common::forged_text("jobs", 1 << 62)), &key).unwrap_err();
    assert_eq!(forged.kind(), "forged");
    assert_eq!(forged.http_status(), 403);
    let other_service = palisade_sequencer::SigningKey::from_bytes([14; 32]);
    let foreign = other_service
        .sign("jobs", Token::new(1 << 62), SessionId::new(1))
        .unwrap();
    let untrusted = verify_presented(Some(foreign.as_str()), &key).unwrap_err();
    assert_eq!(untrusted.kind(), "forged");
    assert!(
        untrusted
            .to_string()
            .contains(&other_service.key_id().to_string()),
        "the refusal names the untrusted key: {untrusted}"
    );
    let honest = grant("jobs", 3, 1);
    assert_eq!(
        verify_presented(Some(honest.as_str()), &key).unwrap(),
        honest
    );
}

#[test]
fn every_error_is_exactly_one_of_final_retryable_or_outcome_unknown() {
    let all = [
        FenceError::Stale {
            lock: "jobs".into(),
            presented: Token::new(5),
            accepted: Token::new(9),
            holder_session: None,
        },
        FenceError::WrongLock {
            expected: "jobs".into(),
            presented: "other".into(),
        },
        FenceError::Missing,
        FenceError::Malformed {
            message: "m".into(),
        },
        FenceError::Forged {
            message: "f".into(),
        },
        FenceError::InvalidScope {
            message: "s".into(),
        },
        FenceError::Corrupt {
            scope: "s".into(),
            message: "c".into(),
        },
        FenceError::InvalidRequest {
            message: "too many ops".into(),
        },
        FenceError::Storage {
            message: "connection refused".into(),
        },
        FenceError::OutcomeUnknown {
            message: "connection dropped after the script was sent".into(),
        },
        FenceError::TokenReissued {
            lock: "jobs".into(),
            token: Token::new(9),
            first_session: SessionId::new(2),
            presented_session: SessionId::new(3),
        },
    ];
    let mut kinds = std::collections::BTreeSet::new();
    for err in &all {
        let classes = [err.is_final(), err.is_retryable(), err.is_outcome_unknown()];
        assert_eq!(
            classes.iter().filter(|class| **class).count(),
            1,
            "{err:?} is {classes:?}"
        );
        assert!(!err.is_rejection() || err.is_final(), "{err:?}");
        // The class agrees with the predicates.
        let class = err.class();
        assert_eq!(
            class == palisade_fence::FenceErrorClass::Rejected,
            err.is_rejection(),
            "{err:?}"
        );
        assert_eq!(
            class == palisade_fence::FenceErrorClass::Retryable,
            err.is_retryable(),
            "{err:?}"
        );
        assert_eq!(
            class == palisade_fence::FenceErrorClass::OutcomeUnknown,
            err.is_outcome_unknown(),
            "{err:?}"
        );
        // The JSON kind round-trips and is unique per variant.
        let json = serde_json::to_value(err).unwrap();
        assert_eq!(json["kind"], err.kind());
        assert_eq!(&serde_json::from_value::<FenceError>(json).unwrap(), err);
        assert!(kinds.insert(err.kind()), "kind {} used twice", err.kind());
    }

    let invalid = &all[7];
    assert_eq!(
        (invalid.kind(), invalid.http_status(), invalid.is_final()),
        ("invalid_request", 400, true)
    );
    let storage = &all[8];
    assert_eq!(
        (
            storage.kind(),
            storage.http_status(),
            storage.is_retryable()
        ),
        ("storage", 503, true)
    );
    let unknown = &all[9];
    assert_eq!(
        (unknown.kind(), unknown.http_status()),
        ("outcome_unknown", 504)
    );
    assert!(!unknown.is_retryable() && !unknown.is_final());
    assert!(
        unknown
            .to_string()
            .contains("may or may not have been applied"),
        "{unknown}"
    );
}
