//! Who gets which session: opens with and without an open key, retries, and a key used again
//! after its session ended; and tables and log entries written before open keys existed.
//!
//! An open key is compared with the keys of every client, so the table must never let two
//! opens that did not come from the same client share a session: a shared session means a
//! shared grant and a shared fencing token, which every resource would accept from both.

use palisade_core::limits::{OPEN_KEY_BYTES_MAX, OPEN_KEY_BYTES_MIN, OpenKeyError};
use palisade_core::{
    Command, CoreError, DurationMs, Input, Limits, LockTable, OpenKey, Output, Reply, RequestId,
    SecretDigest, SessionId, TimeMs, Token, Wait,
};

const TTL_MS: DurationMs = DurationMs::from_millis(10_000);

/// A lock table as a version before open keys left it in its snapshot: session 1 (opened with
/// request id 0) holds `jobs/nightly` with token 1, session 2 (request id 7) waits for it.
const SNAPSHOT_BEFORE_OPEN_KEYS: &str = r#"{"limits":{"lock_name_bytes_max":256,"session_ttl_ms_min":1000,"session_ttl_ms_max":86400000,"sessions_max":50000,"locks_max":1000000,"waiters_per_lock_max":10000,"lock_delay_ms":0,"token_max":9223372036854775807},"now_ms":1300,"last_token":1,"last_session":2,"sessions":{"1":{"ttl_ms":10000,"expires_at_ms":11000,"open_request_id":0,"held":["jobs/nightly"],"waiting":[],"recent":[{"request_id":3,"kind":"Acquire","lock":"jobs/nightly","result":{"Ok":{"Granted":{"lock":"jobs/nightly","session":1,"token":1}}}}]},"2":{"ttl_ms":10000,"expires_at_ms":11100,"open_request_id":7,"held":[],"waiting":["jobs/nightly"],"recent":[{"request_id":4,"kind":"Acquire","lock":"jobs/nightly","result":{"Ok":{"Queued":{"lock":"jobs/nightly","session":2,"position":0}}}}]}},"locks":{"jobs/nightly":{"holder":{"session":1,"token":1,"granted_at_ms":1200,"request_id":3},"waiters":[{"session":2,"request_id":4,"deadline_ms":null}],"last_token":1,"available_at_ms":null}},"open_requests":{"0":1,"7":2},"session_deadlines":[[11000,1],[11100,2]],"wait_deadlines":[],"delay_deadlines":[],"forgotten":{},"forgotten_order":{},"last_forgotten":0}"#;

fn apply(table: &mut LockTable, now_ms: u64, command: Command) -> Output {
    let output = table.apply(Input {
        now_ms: TimeMs::from_millis(now_ms),
        command,
    });
    table.check_consistency();
    output
}

fn open(table: &mut LockTable, now_ms: u64, open_key: Option<OpenKey>) -> SessionId {
    let command = Command::OpenSession {
        open_key,
        ttl_ms: TTL_MS,
        secret_digest: None,
        owner: None,
    };
    match apply(table, now_ms, command).result {
        Ok(Reply::SessionOpened { session, .. }) => session,
        other => panic!("open failed: {other:?}"),
    }
}

fn try_acquire(session: SessionId, request_id: u64) -> Command {
    Command::Acquire {
        session,
        lock: "jobs/nightly".into(),
        request_id: RequestId::new(request_id),
        wait: Wait::Try,
        value: None,
        mode: palisade_core::Mode::Exclusive,
    }
}

fn key(seed: u8) -> OpenKey {
    let bytes: Vec<u8> = (0..16u8)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i))
        .collect();
    OpenKey::new(&bytes).unwrap()
}

#[test]
fn two_opens_without_a_key_get_two_sessions_and_only_one_of_them_holds_the_lock() {
    let mut table = LockTable::new(Limits::default());

    // Two clients that know nothing of open keys each open a session.
    let first = open(&mut table, 0, None);
    let second = open(&mut table, 0, None);
    assert_ne!(first, second);
    assert_eq!(table.session_count(), 2);

    // Both try the same lock with the same request id: one holds it, the other is told who.
    let granted = apply(&mut table, 1, try_acquire(first, 0)).result;
    let Ok(Reply::Granted { token, .. }) = granted else {
        panic!("first acquire: {granted:?}")
    };
    let refused = apply(&mut table, 1, try_acquire(second, 0)).result;
    assert_eq!(
        refused,
        Err(CoreError::Busy {
            lock: "jobs/nightly".into(),
            holder_session: Some(first),
            holder_token: Some(token),
            available_at_ms: None,
        })
    );
}

#[test]
fn an_open_retried_with_the_same_key_returns_the_same_session_unchanged() {
    let mut table = LockTable::new(Limits::default());
    let opened = apply(
        &mut table,
        0,
        Command::OpenSession {
            open_key: Some(key(1)),
            ttl_ms: TTL_MS,
            secret_digest: None,
            owner: None,
        },
    );

    // The reply was lost; the client retries later, even with another TTL by mistake.
    let retried = apply(
        &mut table,
        500,
        Command::OpenSession {
            open_key: Some(key(1)),
            ttl_ms: DurationMs::from_millis(2 * TTL_MS.as_millis()),
            secret_digest: None,
            owner: None,
        },
    );
    assert_eq!(
        retried.result, opened.result,
        "a retry must not open or change"
    );
    assert_eq!(table.session_count(), 1);

    // Another client's key, and a keyless open, get sessions of their own.
    let other = open(&mut table, 600, Some(key(2)));
    let keyless = open(&mut table, 600, None);
    assert_eq!(table.session_count(), 3);
    let first = SessionId::new(1);
    assert!(other != keyless && other != first && keyless != first);
}

#[test]
fn a_key_whose_session_was_closed_or_expired_opens_a_new_session_not_the_old_one() {
    let mut table = LockTable::new(Limits::default());

    // Phase 1: opened by key K, holding a lock, then closed.
    let closed = open(&mut table, 0, Some(key(1)));
    assert!(apply(&mut table, 1, try_acquire(closed, 1)).result.is_ok());
    apply(&mut table, 2, Command::CloseSession { session: closed })
        .result
        .unwrap();

    // Phase 2: K again (a late retry) opens a fresh session: new id, holding nothing. The
    // closed session stays ended and its lock stays free for anyone.
    let reopened = open(&mut table, 3, Some(key(1)));
    assert_ne!(reopened, closed);
    assert_eq!(
        table.session_status(reopened).unwrap().held,
        Vec::<String>::new()
    );
    assert_eq!(
        apply(&mut table, 4, Command::KeepAlive { session: closed }).result,
        Err(CoreError::SessionNotFound { session: closed })
    );
    assert_eq!(table.lock_status("jobs/nightly"), None);

    // Phase 3: the same after an expiry instead of a close.
    let expiring = open(&mut table, 5, Some(key(2)));
    let later = 5 + TTL_MS.as_millis() + 1;
    let renewed = open(&mut table, later, Some(key(2)));
    assert_ne!(renewed, expiring);
    assert!(table.session_status(expiring).is_none());
    assert_eq!(
        table.session_status(renewed).unwrap().expires_at_ms,
        TimeMs::from_millis(later).saturating_add(TTL_MS)
    );
}

#[test]
fn open_keys_that_cannot_be_random_are_refused() {
    let too_short = vec![7u8; OPEN_KEY_BYTES_MIN - 1];
    let too_long: Vec<u8> = (0..=OPEN_KEY_BYTES_MAX as u8).collect();
    let length = |bytes: usize| OpenKeyError::Length {
        bytes: bytes as u64,
        bytes_min: OPEN_KEY_BYTES_MIN as u64,
        bytes_max: OPEN_KEY_BYTES_MAX as u64,
    };
    assert_eq!(OpenKey::new(&[]), Err(length(0)));
    assert_eq!(OpenKey::new(&too_short), Err(length(too_short.len())));
    assert_eq!(OpenKey::new(&too_long), Err(length(too_long.len())));
    assert_eq!(OpenKey::new(&[0; 16]), Err(OpenKeyError::NotRandom));
    assert_eq!(OpenKey::new(&[0xFF; 32]), Err(OpenKeyError::NotRandom));
    let shortest: Vec<u8> = (1..=OPEN_KEY_BYTES_MIN as u8).collect();
    let longest: Vec<u8> = (1..=OPEN_KEY_BYTES_MAX as u8).collect();
    assert_eq!(OpenKey::new(&shortest).unwrap().as_bytes(), &shortest[..]);
    assert_eq!(OpenKey::new(&longest).unwrap().as_bytes(), &longest[..]);

    // A key read back from a log entry is checked the same way.
    let entry =
        |hex: &str| format!(r#"{{"OpenSessionWithKey":{{"open_key":"{hex}","ttl_ms":1000}}}}"#);
    let logged = Command::OpenSession {
        open_key: Some(OpenKey::new(&shortest).unwrap()),
        ttl_ms: DurationMs::from_millis(1000),
        secret_digest: None,
        owner: None,
    };
    let hex = "0102030405060708090a0b0c0d0e0f10";
    assert_eq!(serde_json::to_string(&logged).unwrap(), entry(hex));
    assert_eq!(
        serde_json::from_str::<Command>(&entry(hex)).unwrap(),
        logged
    );
    for refused in [
        "00000000000000000000000000000000",
        "0102",
        "0102030405060708090A0B0C0D0E0F10",
        "0g",
    ] {
        assert!(
            serde_json::from_str::<Command>(&entry(refused)).is_err(),
            "{refused}"
        );
    }

    // The message says what to send instead.
    let message = OpenKey::new(&too_short).unwrap_err().to_string();
    assert!(
        message.contains("16..=32") && message.contains("send none"),
        "{message}"
    );
    assert!(
        !format!("{:?}", key(1)).contains('['),
        "Debug shows the key's bytes"
    );
}

#[test]
fn a_snapshot_written_before_open_keys_loads_with_its_sessions_and_grant() {
    let mut table: LockTable =
        serde_json::from_str(SNAPSHOT_BEFORE_OPEN_KEYS).expect("an older snapshot loads");
    table.check_consistency();
    let status = table.lock_status("jobs/nightly").unwrap();
    assert_eq!(
        status.holder.map(|g| (g.session, g.token)),
        Some((SessionId::new(1), Token::new(1)))
    );
    assert_eq!(status.waiters, vec![SessionId::new(2)]);

    // New opens, with and without a key, take new ids and never one of the old sessions.
    let keyless = open(&mut table, 1_400, None);
    let keyed = open(&mut table, 1_400, Some(key(1)));
    assert_eq!((keyless, keyed), (SessionId::new(3), SessionId::new(4)));
    let refused = apply(&mut table, 1_500, try_acquire(keyless, 9)).result;
    assert!(
        matches!(refused, Err(CoreError::Busy { .. })),
        "{refused:?}"
    );

    // A snapshot of the upgraded table round-trips.
    let json = serde_json::to_string(&table).unwrap();
    assert_eq!(serde_json::from_str::<LockTable>(&json).unwrap(), table);
}

#[test]
fn a_log_entry_written_before_open_keys_replays_as_it_was_first_applied() {
    let mut table: LockTable = serde_json::from_str(SNAPSHOT_BEFORE_OPEN_KEYS).unwrap();

    // An older version logged opens like this; request id 0 is session 1's.
    let logged = r#"{"OpenSession":{"request_id":0,"ttl_ms":10000}}"#;
    let command: Command = serde_json::from_str(logged).unwrap();
    assert_eq!(
        command,
        Command::OpenSessionByRequestId {
            request_id: RequestId::new(0),
            ttl_ms: DurationMs::from_millis(10_000)
        }
    );
    assert_eq!(serde_json::to_string(&command).unwrap(), logged);

    // Replayed, it gives what it gave then: session 1, so later entries of that log that name
    // session ids still name the sessions they named when first applied.
    let replayed = apply(&mut table, 1_400, command).result;
    assert_eq!(
        replayed,
        Ok(Reply::SessionOpened {
            session: SessionId::new(1),
            ttl_ms: DurationMs::from_millis(10_000),
            expires_at_ms: TimeMs::from_millis(11_000)
        })
    );
    assert_eq!(table.session_count(), 2);

    // The open of this version is spelled differently, so no version mistakes one for the other.
    let current = Command::OpenSession {
        open_key: None,
        ttl_ms: DurationMs::from_millis(10_000),
        secret_digest: None,
        owner: None,
    };
    let json = serde_json::to_string(&current).unwrap();
    assert!(json.starts_with(r#"{"OpenSessionWithKey":"#), "{json}");
    assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), current);
}

/// The digest of the opener's secret is kept with the session, through a snapshot, and a
/// retried open leaves it as it was; entries and snapshots from before secrets load with none
/// (their sessions are acted for by id alone, which the server decides, not the table).
#[test]
fn a_session_keeps_the_digest_it_was_opened_with_and_older_forms_load_without_one() {
    let digest = |byte: u8| SecretDigest::new([byte; SecretDigest::BYTES]);
    let mut table = LockTable::new(Limits::default());
    let open_with = |table: &mut LockTable, key: Option<OpenKey>, byte: u8| {
        let command = Command::OpenSession {
            open_key: key,
            ttl_ms: TTL_MS,
            secret_digest: Some(digest(byte)),
            owner: None,
        };
        match apply(table, 1_000, command).result {
            Ok(Reply::SessionOpened { session, .. }) => session,
            other => panic!("open failed: {other:?}"),
        }
    };

    // Phase 1: each open keeps its own digest; a retry with the same key finds the session
    // with the first digest, whatever digest the retry carried.
    let keyless = open_with(&mut table, None, 1);
    let keyed = open_with(&mut table, Some(key(9)), 2);
    assert_eq!(open_with(&mut table, Some(key(9)), 3), keyed);
    assert_eq!(table.session_secret_digest(keyless), Some(Some(digest(1))));
    assert_eq!(table.session_secret_digest(keyed), Some(Some(digest(2))));
    assert_eq!(table.session_secret_digest(SessionId::new(99)), None);

    // Phase 2: a snapshot keeps them, as 64 hex digits.
    let json = serde_json::to_string(&table).unwrap();
    assert!(json.contains(&"02".repeat(SecretDigest::BYTES)), "{json}");
    let restored: LockTable = serde_json::from_str(&json).unwrap();
    restored.validate().unwrap();
    assert_eq!(restored, table);

    // Phase 3: an entry written before secrets opens a session without a digest, and so does
    // a snapshot written before them.
    let mut table = LockTable::new(Limits::default());
    let old_entry: Command =
        serde_json::from_str(r#"{"OpenSessionWithKey":{"open_key":null,"ttl_ms":1000}}"#).unwrap();
    let Ok(Reply::SessionOpened { session, .. }) = apply(&mut table, 0, old_entry).result else {
        panic!("an entry of before secrets does not open");
    };
    assert_eq!(table.session_secret_digest(session), Some(None));
    let old: LockTable = serde_json::from_str(SNAPSHOT_BEFORE_OPEN_KEYS).unwrap();
    assert_eq!(old.session_secret_digest(SessionId::new(1)), Some(None));
    assert!(serde_json::from_str::<SecretDigest>(r#""0102""#).is_err());
}

fn open_owned(table: &mut LockTable, now_ms: u64, key: Option<OpenKey>, owner: &str) -> SessionId {
    let command = Command::OpenSession {
        open_key: key,
        ttl_ms: TTL_MS,
        secret_digest: None,
        owner: Some(palisade_core::Identity::new(owner).unwrap()),
    };
    match apply(table, now_ms, command).result {
        Ok(Reply::SessionOpened { session, .. }) => session,
        other => panic!("open failed: {other:?}"),
    }
}

#[test]
fn a_session_keeps_its_owner_and_each_owner_counts_only_its_own_sessions_locks_and_waits() {
    use palisade_core::{Identity, Usage};
    let (alice, bob) = (
        Identity::new("alice").unwrap(),
        Identity::new("bob").unwrap(),
    );
    let mut table = LockTable::new(Limits::default());
    let a1 = open_owned(&mut table, 0, Some(key(1)), "alice");
    let a2 = open_owned(&mut table, 0, None, "alice");
    let b1 = open_owned(&mut table, 0, None, "bob");
    let anonymous = open(&mut table, 0, None);
    assert_eq!(table.session_owner(a1), Some(Some(&alice)));
    assert_eq!(table.session_owner(anonymous), Some(None));
    assert_eq!(table.session_owner(SessionId::new(99)), None);

    // A retried open returns the session with its first owner, whoever retries.
    assert_eq!(open_owned(&mut table, 1, Some(key(1)), "bob"), a1);
    assert_eq!(table.session_owner(a1), Some(Some(&alice)));
    assert_eq!(table.session_opened_with(&key(1)), Some(a1));

    apply(&mut table, 2, try_acquire(a1, 1)).result.unwrap();
    let queued = apply(
        &mut table,
        3,
        Command::Acquire {
            session: b1,
            lock: "jobs/nightly".into(),
            request_id: RequestId::new(2),
            wait: Wait::Forever,
            value: None,
            mode: palisade_core::Mode::Exclusive,
        },
    );
    assert!(matches!(queued.result, Ok(Reply::Queued { .. })));
    assert!(table.session_holds_or_waits(a1, "jobs/nightly"));
    assert!(table.session_holds_or_waits(b1, "jobs/nightly"));
    assert!(!table.session_holds_or_waits(a2, "jobs/nightly"));
    assert_eq!(
        table.usage_of(&alice),
        Usage {
            sessions: 2,
            held: 1,
            waiting: 0
        }
    );
    assert_eq!(
        table.usage_of(&bob),
        Usage {
            sessions: 1,
            held: 0,
            waiting: 1
        }
    );

    // The index survives a snapshot, and forgets a session that ends: closed or expired.
    let stored = serde_json::to_string(&table).unwrap();
    let mut restored: LockTable = serde_json::from_str(&stored).unwrap();
    restored.validate().unwrap();
    assert_eq!(restored.usage_of(&alice), table.usage_of(&alice));
    apply(&mut restored, 4, Command::CloseSession { session: a1 })
        .result
        .unwrap();
    assert_eq!(restored.usage_of(&alice).sessions, 1);
    apply(&mut restored, 4 + TTL_MS.as_millis() + 1, Command::Tick);
    assert_eq!(restored.usage_of(&alice), Usage::default());
    assert_eq!(restored.usage_of(&bob), Usage::default());
    assert!(!serde_json::to_string(&restored).unwrap().contains("owners"));
}

#[test]
fn an_open_entry_without_an_owner_is_stored_as_before_and_one_with_an_owner_names_it() {
    let before = Command::OpenSession {
        open_key: None,
        ttl_ms: TTL_MS,
        secret_digest: None,
        owner: None,
    };
    assert_eq!(
        serde_json::to_string(&before).unwrap(),
        r#"{"OpenSessionWithKey":{"open_key":null,"ttl_ms":10000}}"#
    );
    let owned = Command::OpenSession {
        open_key: None,
        ttl_ms: TTL_MS,
        secret_digest: None,
        owner: Some(palisade_core::Identity::new("alice").unwrap()),
    };
    let text = serde_json::to_string(&owned).unwrap();
    assert_eq!(
        text,
        r#"{"OpenSessionWithKey":{"open_key":null,"ttl_ms":10000,"owner":"alice"}}"#
    );
    assert!(serde_json::from_str::<Command>(&text.replace("alice", "al ice")).is_err());
}
