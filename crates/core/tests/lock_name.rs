//! `LockName` and `Token::checked`: a name is checked once where it comes in, against the ceiling
//! or a table's lower configured limit; its stored form is the bare string a `String` had, and a
//! stored name that fails the checks is an error when read back, never a panic.

use palisade_core::limits::{LOCK_NAME_BYTES_MAX, LockNameError, TOKEN_MAX};
use palisade_core::{LockName, Token};

#[test]
fn a_lock_name_is_stored_exactly_as_the_string_it_replaces() {
    for name in ["jobs/a", "é", &"x".repeat(LOCK_NAME_BYTES_MAX)] {
        let checked = LockName::new(name).unwrap();
        assert_eq!(checked.as_str(), name);
        assert_eq!(checked.to_string(), name);
        let json = serde_json::to_string(&checked).unwrap();
        assert_eq!(json, serde_json::to_string(name).unwrap());
        assert_eq!(serde_json::from_str::<LockName>(&json).unwrap(), checked);
        let bytes = postcard::to_allocvec(&checked).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(name).unwrap());
        assert_eq!(postcard::from_bytes::<LockName>(&bytes).unwrap(), checked);
    }
}

#[test]
fn a_stored_name_that_fails_the_checks_is_refused_when_read_back() {
    let too_long = "x".repeat(LOCK_NAME_BYTES_MAX + 1);
    for (stored, why) in [
        ("", "empty"),
        ("tab\there", "control character"),
        (too_long.as_str(), "257 bytes, the limit is 256"),
    ] {
        let json = serde_json::to_string(stored).unwrap();
        let refused = serde_json::from_str::<LockName>(&json).unwrap_err();
        assert!(refused.to_string().contains(why), "{stored:?}: {refused}");
        let bytes = postcard::to_allocvec(stored).unwrap();
        assert!(
            postcard::from_bytes::<LockName>(&bytes).is_err(),
            "{stored:?}"
        );
    }
}

#[test]
fn a_configured_limit_below_the_ceiling_is_the_limit_a_refusal_names() {
    let between = "x".repeat(20);
    assert!(LockName::new(between.as_str()).is_ok());
    assert_eq!(
        LockName::with_limit(between.as_str(), 16),
        Err(LockNameError::TooLong {
            bytes: 20,
            bytes_max: 16
        })
    );
    // Above both: the configured limit is the one the caller must meet.
    assert_eq!(
        LockName::with_limit("x".repeat(300), 16),
        Err(LockNameError::TooLong {
            bytes: 300,
            bytes_max: 16
        })
    );
    // A limit above the ceiling does not lift it.
    assert_eq!(
        LockName::with_limit("x".repeat(300), 1_000),
        Err(LockNameError::TooLong {
            bytes: 300,
            bytes_max: LOCK_NAME_BYTES_MAX as u64
        })
    );
    assert_eq!(
        LockName::with_limit("a\u{7f}", 16),
        Err(LockNameError::ControlCharacter)
    );
}

#[test]
fn a_checked_token_is_one_a_grant_may_carry() {
    assert_eq!(Token::checked(0), None);
    assert_eq!(Token::checked(1), Some(Token::FIRST));
    assert_eq!(Token::checked(TOKEN_MAX.get()), Some(TOKEN_MAX));
    assert_eq!(Token::checked(TOKEN_MAX.get() + 1), None);
    assert_eq!(Token::checked(u64::MAX), None);
}
