//! Scenarios for the sequencer format: what the service signs, a resource accepts, and nothing
//! else — no altered, truncated, foreign or out-of-range sequencer gets through.

use palisade_core::limits::{LOCK_NAME_BYTES_MAX, TOKEN_MAX};
use palisade_core::{Access, PERMITS_MAX, SessionId, Token};
use palisade_sequencer::{
    BINDING_BYTES_MAX, KeyIdError, KeySet, ParseError, SEQUENCER_BYTES_LONGEST,
    SEQUENCER_BYTES_LONGEST_ACCESS, SEQUENCER_BYTES_MAX, Sequencer, SequencerError, SignError,
    SigningKey, VerifiedSequencer, display_binding,
};

fn service_key() -> SigningKey {
    SigningKey::from_bytes([7; 32])
}

/// A syntactically valid signature field, for parse-only tests.
fn dummy_signature() -> String {
    "A".repeat(86)
}

#[test]
fn a_signed_sequencer_round_trips_through_text_and_verifies() {
    let key = service_key();
    let sequencer = key
        .sign("jobs/nightly", Token::new(42), SessionId::new(9))
        .unwrap();
    assert!(sequencer.as_str().starts_with("pal2."));
    assert_eq!(sequencer.to_string(), sequencer.as_str());

    let parsed: Sequencer = sequencer.as_str().parse().unwrap();
    assert_eq!(parsed, sequencer);
    let verified = parsed.verify(&key.public_key().into()).unwrap();
    assert_eq!(verified.key_id(), key.key_id());
    assert_eq!(verified.lock(), "jobs/nightly");
    assert_eq!(verified.token(), Token::new(42));
    assert_eq!(verified.session(), SessionId::new(9));
    assert_eq!(verified.as_str(), sequencer.as_str());

    let via_key = key.public_key().verify(sequencer.as_str()).unwrap();
    assert_eq!(via_key, verified);
}

#[test]
fn the_text_has_the_documented_fields() {
    let sequencer = service_key()
        .sign("a.b", Token::new(10), SessionId::new(0))
        .unwrap();
    let fields: Vec<&str> = sequencer.as_str().split('.').collect();
    assert_eq!(fields.len(), 6);
    assert_eq!(fields[0], "pal2");
    // The key id: the first 8 bytes of SHA-256 over the public key (pinned for other languages).
    assert_eq!(fields[1], "fe812c12f3ab4ce6");
    assert_eq!(fields[1], service_key().key_id().to_string());
    assert_eq!(fields[2], "YS5i"); // base64url("a.b")
    assert_eq!(fields[3], "10");
    assert_eq!(fields[4], "0");
    assert_eq!(fields[5].len(), 86);
}

#[test]
fn changing_any_byte_never_yields_an_accepted_sequencer() {
    let key = service_key();
    let trusted = KeySet::from(key.public_key());
    let original = key
        .sign("orders/eu-west", Token::new(123_456), SessionId::new(77))
        .unwrap();
    let text = original.as_str();
    assert!(text.len() > 100, "the test should cover a realistic length");

    let replacements = ['A', 'B', 'z', '0', '1', '9', '.', '-', '_', '~', ' ', '='];
    let mut altered_count = 0;
    for position in 0..text.len() {
        for &replacement in &replacements {
            if text.as_bytes()[position] == replacement as u8 {
                continue;
            }
            let mut altered = text.to_owned().into_bytes();
            altered[position] = replacement as u8;
            let altered = String::from_utf8(altered).unwrap();
            let outcome = VerifiedSequencer::from_str_verified(&altered, &trusted);
            assert!(
                outcome.is_err(),
                "altered byte {position} to {replacement:?} was accepted"
            );
            altered_count += 1;
        }
    }
    assert!(altered_count > text.len() * 10);
}

#[test]
fn every_truncation_is_refused() {
    let key = service_key();
    let trusted = KeySet::from(key.public_key());
    let text = key
        .sign("reports", Token::new(5), SessionId::new(1))
        .unwrap()
        .to_string();
    for length in 0..text.len() {
        let outcome = VerifiedSequencer::from_str_verified(&text[..length], &trusted);
        assert!(
            outcome.is_err(),
            "truncation to {length} bytes was accepted"
        );
    }
}

#[test]
fn a_sequencer_from_another_lock_service_is_a_bad_signature() {
    let ours = service_key();
    let theirs = SigningKey::from_bytes([8; 32]);
    let foreign = theirs
        .sign("reports", TOKEN_MAX, SessionId::new(1))
        .unwrap();
    let outcome = foreign.verify(&ours.public_key().into());
    assert_eq!(
        outcome.unwrap_err(),
        SequencerError::UnknownKey {
            key_id: theirs.key_id(),
            trusted: ours.key_id().to_string(),
        }
    );
    assert!(foreign.verify(&theirs.public_key().into()).is_ok());

    // The same grant claiming our key id: the id finds our key, whose check fails.
    let claimed =
        foreign
            .as_str()
            .replacen(&theirs.key_id().to_string(), &ours.key_id().to_string(), 1);
    let outcome = ours.public_key().verify(&claimed);
    assert_eq!(outcome.unwrap_err(), SequencerError::BadSignature);
}

#[test]
fn a_key_set_verifies_each_sequencer_with_the_key_it_names() {
    let old = service_key();
    let new = SigningKey::from_bytes([9; 32]);
    let trusted = KeySet::new([old.public_key(), new.public_key()]).unwrap();
    for key in [&old, &new] {
        let sequencer = key
            .sign("jobs/a", Token::new(5), SessionId::new(1))
            .unwrap();
        let verified = trusted.verify(sequencer.as_str()).unwrap();
        assert_eq!(
            (verified.key_id(), verified.token()),
            (key.key_id(), Token::new(5))
        );
    }
    // Once the old key is dropped from the set, its sequencers no longer verify.
    let rotated = KeySet::from(new.public_key());
    let old_grant = old
        .sign("jobs/a", Token::new(6), SessionId::new(1))
        .unwrap();
    let err = rotated.verify(old_grant.as_str()).unwrap_err();
    assert!(err.is_bad_signature(), "{err}");
    assert!(err.to_string().contains(&old.key_id().to_string()), "{err}");
}

#[test]
fn lock_names_with_slashes_dots_unicode_and_the_maximum_length_work() {
    let key = service_key();
    let longest = "é".repeat(LOCK_NAME_BYTES_MAX / 2);
    assert_eq!(longest.len(), LOCK_NAME_BYTES_MAX);
    for name in [
        "a",
        "jobs/nightly",
        "a.b.c",
        "ロック/日本",
        "with space",
        longest.as_str(),
    ] {
        let sequencer = key.sign(name, TOKEN_MAX, SessionId::new(u64::MAX)).unwrap();
        assert!(sequencer.as_str().len() <= SEQUENCER_BYTES_MAX);
        let verified = key.public_key().verify(sequencer.as_str()).unwrap();
        assert_eq!(verified.lock(), name);
        assert_eq!(verified.token(), TOKEN_MAX);
        assert_eq!(verified.session(), SessionId::new(u64::MAX));
    }
}

#[test]
fn the_longest_sequencer_is_exactly_the_computed_bound() {
    let name = "x".repeat(LOCK_NAME_BYTES_MAX);
    let sequencer = service_key()
        .sign(&name, TOKEN_MAX, SessionId::new(u64::MAX))
        .unwrap();
    assert_eq!(sequencer.as_str().len(), SEQUENCER_BYTES_LONGEST);
}

#[test]
fn signing_refuses_what_the_lock_table_would_refuse() {
    let key = service_key();
    let too_long = "x".repeat(LOCK_NAME_BYTES_MAX + 1);
    assert!(matches!(
        key.sign(&too_long, Token::new(1), SessionId::new(1)),
        Err(SignError::LockName(_))
    ));
    assert!(matches!(
        key.sign("", Token::new(1), SessionId::new(1)),
        Err(SignError::LockName(_))
    ));
    assert!(matches!(
        key.sign("bad\nname", Token::new(1), SessionId::new(1)),
        Err(SignError::LockName(_))
    ));
    assert_eq!(
        key.sign("a", Token::ZERO, SessionId::new(1)).unwrap_err(),
        SignError::TokenZero
    );
    assert_eq!(
        key.sign("a", TOKEN_MAX.next(), SessionId::new(1))
            .unwrap_err(),
        SignError::TokenAboveMax {
            token: TOKEN_MAX.next(),
            token_max: TOKEN_MAX
        }
    );
}

#[test]
fn parse_errors_name_the_malformed_part() {
    let sig = dummy_signature();
    let kid = "0123456789abcdef";
    let lock = "YQ"; // "a"
    let cases: Vec<(String, ParseError)> = vec![
        (String::new(), ParseError::Empty),
        (
            "x".repeat(513),
            ParseError::TooLong {
                bytes: 513,
                bytes_max: 512,
            },
        ),
        (
            format!("pal2.{kid}.{lock}.1 .1.{sig}"),
            ParseError::NotPrintableAscii { position: 26 },
        ),
        (
            format!("pal2.{kid}.{lock}.1.{sig}"),
            ParseError::FieldCount { found: 5 },
        ),
        (
            format!("pal2.{kid}.{lock}.1.1.1.{sig}"),
            ParseError::FieldCount { found: 7 },
        ),
        (
            format!("pal1.{kid}.{lock}.1.1.{sig}"),
            ParseError::Version {
                found: "pal1".into(),
            },
        ),
        (
            format!("pal2.0123456789abcde.{lock}.1.1.{sig}"),
            ParseError::KeyId(KeyIdError::Length { found: 15 }),
        ),
        (
            format!("pal2.0123456789ABCDEF.{lock}.1.1.{sig}"),
            ParseError::KeyId(KeyIdError::NotLowercaseHex),
        ),
        (
            format!("pal2.0123456789abcdeg.{lock}.1.1.{sig}"),
            ParseError::KeyId(KeyIdError::NotLowercaseHex),
        ),
        (
            format!("pal2.{kid}.YQ==.1.1.{sig}"),
            ParseError::LockEncoding,
        ),
        (format!("pal2.{kid}.YR.1.1.{sig}"), ParseError::LockEncoding), // non-canonical trailing bits
        (
            format!("pal2.{kid}.a+b.1.1.{sig}"),
            ParseError::LockEncoding,
        ),
        (format!("pal2.{kid}._w.1.1.{sig}"), ParseError::LockNotUtf8),
        (
            format!("pal2.{kid}..1.1.{sig}"),
            ParseError::LockName(lock_name_empty()),
        ),
        (
            format!("pal2.{kid}.{lock}.x.1.{sig}"),
            ParseError::TokenNotANumber,
        ),
        (
            format!("pal2.{kid}.{lock}.-1.1.{sig}"),
            ParseError::TokenNotANumber,
        ),
        (
            format!("pal2.{kid}.{lock}.+1.1.{sig}"),
            ParseError::TokenNotANumber,
        ),
        (
            format!("pal2.{kid}.{lock}..1.{sig}"),
            ParseError::TokenNotANumber,
        ),
        (
            format!("pal2.{kid}.{lock}.01.1.{sig}"),
            ParseError::TokenLeadingZero,
        ),
        (
            format!("pal2.{kid}.{lock}.0.1.{sig}"),
            ParseError::TokenZero,
        ),
        (
            format!("pal2.{kid}.{lock}.{}.1.{sig}", TOKEN_MAX.next()),
            ParseError::TokenAboveMax {
                token_max: TOKEN_MAX,
            },
        ),
        (
            format!("pal2.{kid}.{lock}.{}.1.{sig}", "9".repeat(40)),
            ParseError::TokenAboveMax {
                token_max: TOKEN_MAX,
            },
        ),
        (
            format!("pal2.{kid}.{lock}.1.s.{sig}"),
            ParseError::SessionNotANumber,
        ),
        (
            format!("pal2.{kid}.{lock}.1.007.{sig}"),
            ParseError::SessionLeadingZero,
        ),
        (
            format!("pal2.{kid}.{lock}.1.18446744073709551616.{sig}"),
            ParseError::SessionAboveMax,
        ),
        (
            format!("pal2.{kid}.{lock}.1.1.{}", &sig[..85]),
            ParseError::SignatureEncoding,
        ),
        (
            format!("pal2.{kid}.{lock}.1.1.{sig}AA"),
            ParseError::SignatureLength { bytes: 66 },
        ),
        (
            format!("pal2.{kid}.{lock}.1.1."),
            ParseError::SignatureLength { bytes: 0 },
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            Sequencer::parse(&text).unwrap_err(),
            expected,
            "for {text:?}"
        );
    }
    // A well-formed dummy parses; only verification can refuse it.
    let kid = service_key().key_id();
    let dummy = Sequencer::parse(&format!("pal2.{kid}.{lock}.1.0.{sig}")).unwrap();
    let err = dummy
        .verify(&service_key().public_key().into())
        .unwrap_err();
    assert_eq!(err, SequencerError::BadSignature);
    assert!(err.is_bad_signature() && !err.is_malformed());
}

#[test]
fn non_ascii_text_is_refused_at_its_first_bad_byte() {
    let text = format!("pal2.0123456789abcdef.YQ.1.1.{}é", dummy_signature());
    assert_eq!(
        Sequencer::parse(&text).unwrap_err(),
        ParseError::NotPrintableAscii { position: 29 + 86 }
    );
    let trusted = service_key().public_key().into();
    let err = VerifiedSequencer::from_str_verified(&text, &trusted).unwrap_err();
    assert!(err.is_malformed());
}

#[test]
fn error_messages_are_lowercase_and_without_trailing_period() {
    let messages = [
        ParseError::FieldCount { found: 3 }.to_string(),
        SequencerError::BadSignature.to_string(),
        SequencerError::UnknownKey {
            key_id: service_key().key_id(),
            trusted: String::new(),
        }
        .to_string(),
        SignError::TokenZero.to_string(),
        SequencerError::from(ParseError::TokenZero).to_string(),
    ];
    for message in messages {
        assert!(message.chars().next().unwrap().is_lowercase(), "{message}");
        assert!(!message.ends_with('.'), "{message}");
    }
}

#[test]
fn a_signing_key_does_not_print_its_secret() {
    let key = service_key();
    let debug = format!("{key:?}");
    assert!(debug.contains(&key.public_key().to_string()));
    let secret_hex: String = key.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert!(!debug.contains(&secret_hex));
    assert!(!debug.contains("7, 7, 7"));
}

#[test]
fn generated_keys_differ_and_restore_from_bytes() {
    let first = SigningKey::generate();
    let second = SigningKey::generate();
    assert_ne!(first.public_key(), second.public_key());
    let restored = SigningKey::from_bytes(first.to_bytes());
    assert_eq!(restored.public_key(), first.public_key());
    let sequencer = first.sign("a", Token::new(1), SessionId::new(1)).unwrap();
    assert!(restored.public_key().verify(sequencer.as_str()).is_ok());
}

fn lock_name_empty() -> palisade_core::limits::LockNameError {
    palisade_core::LockName::new("").unwrap_err()
}

#[test]
fn shared_grants_and_permits_are_pal3_and_read_back_their_access_and_binding() {
    let key = service_key();
    let trusted: KeySet = key.public_key().into();
    let cases = [
        (Access::Exclusive, "pal2.", "jobs"),
        (Access::Shared, "pal3.", "jobs"),
        (Access::Slot(0), "pal3.", "jobs\u{1f}0"),
        (Access::Slot(PERMITS_MAX - 1), "pal3.", "jobs\u{1f}4095"),
    ];
    for (access, prefix, binding) in cases {
        let sequencer = key
            .sign_access("jobs", access, Token::new(42), SessionId::new(9))
            .unwrap();
        assert!(sequencer.as_str().starts_with(prefix), "{sequencer}");
        let verified = trusted.verify(sequencer.as_str()).unwrap();
        assert_eq!(verified.access(), access);
        assert_eq!(verified.binding(), binding);
        assert_eq!(
            (verified.lock(), verified.token(), verified.session()),
            ("jobs", Token::new(42), SessionId::new(9))
        );
    }
    // `sign` is the exclusive grant, byte for byte.
    assert_eq!(
        key.sign("jobs", Token::new(42), SessionId::new(9)).unwrap(),
        key.sign_access("jobs", Access::Exclusive, Token::new(42), SessionId::new(9))
            .unwrap()
    );
    let fields: Vec<String> = key
        .sign_access("a.b", Access::Slot(17), Token::new(10), SessionId::new(3))
        .unwrap()
        .as_str()
        .split('.')
        .map(str::to_owned)
        .collect();
    assert_eq!(
        fields[..6],
        ["pal3", "fe812c12f3ab4ce6", "YS5i", "p17", "10", "3"]
    );
    assert_eq!(display_binding("jobs\u{1f}2"), "jobs (slot 2)");
    assert_eq!(display_binding("jobs"), "jobs");
}

#[test]
fn a_signature_never_verifies_under_the_other_format_or_another_access() {
    let key = service_key();
    let trusted: KeySet = key.public_key().into();
    let shared = key
        .sign_access("jobs", Access::Shared, Token::new(42), SessionId::new(9))
        .unwrap();
    let signature = shared.as_str().rsplit('.').next().unwrap();
    let kid = key.key_id();
    for forged in [
        // The same grant as exclusive, with the shared grant's signature.
        format!("pal2.{kid}.am9icw.42.9.{signature}"),
        format!("pal3.{kid}.am9icw.p0.42.9.{signature}"),
    ] {
        assert_eq!(
            trusted.verify(&forged).unwrap_err(),
            SequencerError::BadSignature,
            "{forged}"
        );
    }
    let exclusive = key.sign("jobs", Token::new(42), SessionId::new(9)).unwrap();
    let signature = exclusive.as_str().rsplit('.').next().unwrap();
    let as_shared = format!("pal3.{kid}.am9icw.s.42.9.{signature}");
    assert_eq!(
        trusted.verify(&as_shared).unwrap_err(),
        SequencerError::BadSignature
    );
}

#[test]
fn pal3_parse_errors_name_the_malformed_part() {
    let sig = dummy_signature();
    let kid = "0123456789abcdef";
    let cases: Vec<(String, ParseError)> = vec![
        // pal3 has 7 fields, pal2 6: each with the other's count is refused.
        (
            format!("pal3.{kid}.YQ.1.1.{sig}"),
            ParseError::FieldCount { found: 6 },
        ),
        (
            format!("pal2.{kid}.YQ.s.1.1.{sig}"),
            ParseError::FieldCount { found: 7 },
        ),
        (
            format!("pal3.{kid}.YQ.s.1.1.1.{sig}"),
            ParseError::FieldCount { found: 8 },
        ),
        (
            format!("pal4.{kid}.YQ.s.1.1.{sig}"),
            ParseError::Version {
                found: "pal4".into(),
            },
        ),
        (
            format!("PAL3.{kid}.YQ.s.1.1.{sig}"),
            ParseError::Version {
                found: "PAL3".into(),
            },
        ),
        // No pal3 form for exclusive, no uppercase, nothing but s and p<k>.
        (
            format!("pal3.{kid}.YQ.e.1.1.{sig}"),
            ParseError::Access { found: "e".into() },
        ),
        (
            format!("pal3.{kid}.YQ.x.1.1.{sig}"),
            ParseError::Access { found: "x".into() },
        ),
        (
            format!("pal3.{kid}.YQ.S.1.1.{sig}"),
            ParseError::Access { found: "S".into() },
        ),
        (
            format!("pal3.{kid}.YQ.P1.1.1.{sig}"),
            ParseError::Access { found: "P1".into() },
        ),
        (
            format!("pal3.{kid}.YQ.ss.1.1.{sig}"),
            ParseError::Access { found: "ss".into() },
        ),
        (
            format!("pal3.{kid}.YQ..1.1.{sig}"),
            ParseError::Access {
                found: String::new(),
            },
        ),
        (
            format!("pal3.{kid}.YQ.p.1.1.{sig}"),
            ParseError::SlotNotANumber,
        ),
        (
            format!("pal3.{kid}.YQ.p-1.1.1.{sig}"),
            ParseError::SlotNotANumber,
        ),
        (
            format!("pal3.{kid}.YQ.p+1.1.1.{sig}"),
            ParseError::SlotNotANumber,
        ),
        (
            format!("pal3.{kid}.YQ.px.1.1.{sig}"),
            ParseError::SlotNotANumber,
        ),
        (
            format!("pal3.{kid}.YQ.p01.1.1.{sig}"),
            ParseError::SlotLeadingZero,
        ),
        (
            format!("pal3.{kid}.YQ.p00.1.1.{sig}"),
            ParseError::SlotLeadingZero,
        ),
        (
            format!("pal3.{kid}.YQ.p4096.1.1.{sig}"),
            ParseError::SlotAboveMax { slot_max: 4095 },
        ),
        (
            format!("pal3.{kid}.YQ.p{}.1.1.{sig}", "9".repeat(30)),
            ParseError::SlotAboveMax { slot_max: 4095 },
        ),
        // The service never issues session 0; a fence reads a stored holder 0 as a shared phase.
        (
            format!("pal3.{kid}.YQ.s.1.0.{sig}"),
            ParseError::SessionZero,
        ),
        (
            format!("pal3.{kid}.YQ.p3.1.0.{sig}"),
            ParseError::SessionZero,
        ),
        // The fields shared with pal2 keep their checks, in their order.
        (format!("pal3.{kid}.YQ.s.0.1.{sig}"), ParseError::TokenZero),
        (
            format!("pal3.{kid}.YQ.s.1.01.{sig}"),
            ParseError::SessionLeadingZero,
        ),
        (
            format!("pal3.{kid}.YQ=.s.1.1.{sig}"),
            ParseError::LockEncoding,
        ),
        (
            format!("pal3.{kid}.YQ.s.1.1.{}", &sig[..85]),
            ParseError::SignatureEncoding,
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            Sequencer::parse(&text).unwrap_err(),
            expected,
            "for {text:?}"
        );
    }
    for (access, text) in [
        (Access::Shared, "s"),
        (Access::Slot(0), "p0"),
        (Access::Slot(4095), "p4095"),
    ] {
        let parsed = Sequencer::parse(&format!("pal3.{kid}.YQ.{text}.1.1.{sig}")).unwrap();
        assert_eq!(parsed.access(), access);
    }
    // Exclusive pal2 keeps accepting session 0, as before.
    assert_eq!(
        Sequencer::parse(&format!("pal2.{kid}.YQ.1.0.{sig}"))
            .unwrap()
            .access(),
        Access::Exclusive
    );
}

#[test]
fn sign_access_refuses_what_pal3_cannot_carry() {
    let key = service_key();
    assert_eq!(
        key.sign_access(
            "a",
            Access::Slot(PERMITS_MAX),
            Token::new(1),
            SessionId::new(1)
        )
        .unwrap_err(),
        SignError::SlotAboveMax {
            slot: PERMITS_MAX,
            slot_max: PERMITS_MAX - 1
        }
    );
    for access in [Access::Shared, Access::Slot(0)] {
        assert_eq!(
            key.sign_access("a", access, Token::new(1), SessionId::new(0))
                .unwrap_err(),
            SignError::SessionZero
        );
        assert_eq!(
            key.sign_access("a", access, Token::ZERO, SessionId::new(1))
                .unwrap_err(),
            SignError::TokenZero
        );
        assert!(matches!(
            key.sign_access("", access, Token::new(1), SessionId::new(1)),
            Err(SignError::LockName(_))
        ));
    }
}

#[test]
fn the_longest_pal3_sequencer_is_exactly_the_computed_bound() {
    let name = "x".repeat(LOCK_NAME_BYTES_MAX);
    let sequencer = service_key()
        .sign_access(
            &name,
            Access::Slot(PERMITS_MAX - 1),
            TOKEN_MAX,
            SessionId::new(u64::MAX),
        )
        .unwrap();
    assert_eq!(sequencer.as_str().len(), SEQUENCER_BYTES_LONGEST_ACCESS);
    assert_eq!(sequencer.binding().len(), BINDING_BYTES_MAX);
}
