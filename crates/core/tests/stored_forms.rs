//! What the Raft log and the snapshots hold, as an earlier version wrote it: every stored form
//! of the lock table's types still loads, to the same values, and is written again byte for
//! byte the same. A change of a field's type (an integer's width, say) that changed the JSON
//! would strand the data directories written before it.
//!
//! The forms below were written by the version whose counts and limits were `usize`, and the
//! last test's by the version whose ids and times were `u64` aliases.

use palisade_core::limits::{LockNameError, OpenKeyError};
use palisade_core::{Access, AcquirePart, Mode, TableImageV1, TableImageV2};
use palisade_core::{
    Command, CoreError, DurationMs, Event, GrantValue, Identity, Input, Limits, LockTable, OpenKey,
    Output, ReleaseCause, Reply, RequestId, SecretDigest, SessionId, TableImage, TimeMs, Token,
    Wait,
};

/// A snapshot: limits of their own; session 1 holds `jobs/a` and session 2 waits for it; session
/// 3 holds `jobs/b` and `jobs/c`, and remembers a refused wait (too many waiters) and a refused
/// acquire (too many locks).
const SNAPSHOT: &str = r#"{"limits":{"lock_name_bytes_max":32,"session_ttl_ms_min":1000,"session_ttl_ms_max":600000,"sessions_max":4,"locks_max":3,"waiters_per_lock_max":1,"lock_delay_ms":500,"token_max":1000},"now_ms":26,"last_token":3,"last_session":3,"sessions":{"1":{"ttl_ms":10000,"expires_at_ms":10026,"open_request_id":null,"held":["jobs/a"],"waiting":[],"recent":[{"request_id":11,"kind":"Acquire","lock":"jobs/a","result":{"Ok":{"Granted":{"lock":"jobs/a","session":1,"token":1}}}}]},"2":{"ttl_ms":10000,"expires_at_ms":10026,"open_request_id":null,"held":[],"waiting":["jobs/a"],"recent":[{"request_id":21,"kind":"Acquire","lock":"jobs/a","result":{"Ok":{"Queued":{"lock":"jobs/a","session":2,"position":0}}}}]},"3":{"ttl_ms":10000,"expires_at_ms":10026,"open_request_id":null,"held":["jobs/b","jobs/c"],"waiting":[],"recent":[{"request_id":31,"kind":"Acquire","lock":"jobs/a","result":{"Err":{"TooManyWaiters":{"lock":"jobs/a","waiters_max":1}}}},{"request_id":32,"kind":"Acquire","lock":"jobs/b","result":{"Ok":{"Granted":{"lock":"jobs/b","session":3,"token":2}}}},{"request_id":33,"kind":"Acquire","lock":"jobs/c","result":{"Ok":{"Granted":{"lock":"jobs/c","session":3,"token":3}}}},{"request_id":34,"kind":"Acquire","lock":"jobs/d","result":{"Err":{"TooManyLocks":{"locks_max":3}}}}]}},"locks":{"jobs/a":{"holder":{"session":1,"token":1,"granted_at_ms":20,"request_id":11},"waiters":[{"session":2,"request_id":21,"deadline_ms":null}],"last_token":1,"available_at_ms":null},"jobs/b":{"holder":{"session":3,"token":2,"granted_at_ms":23,"request_id":32},"waiters":[],"last_token":2,"available_at_ms":null},"jobs/c":{"holder":{"session":3,"token":3,"granted_at_ms":24,"request_id":33},"waiters":[],"last_token":3,"available_at_ms":null}},"open_requests":{},"open_keys":{},"session_deadlines":[[10026,1],[10026,2],[10026,3]],"wait_deadlines":[],"delay_deadlines":[],"forgotten":{},"forgotten_order":{},"last_forgotten":0}"#;

/// A log entry that changes the limits.
const SET_LIMITS_ENTRY: &str = r#"{"now_ms":5,"command":{"SetLimits":{"limits":{"lock_name_bytes_max":32,"session_ttl_ms_min":1000,"session_ttl_ms_max":600000,"sessions_max":4,"locks_max":3,"waiters_per_lock_max":1,"lock_delay_ms":500,"token_max":1000}}}}"#;

fn limits() -> Limits {
    Limits {
        lock_name_bytes_max: 32,
        session_ttl_ms_min: DurationMs::from_millis(1_000),
        session_ttl_ms_max: DurationMs::from_millis(600_000),
        sessions_max: 4,
        locks_max: 3,
        waiters_per_lock_max: 1,
        lock_delay_ms: DurationMs::from_millis(500),
        token_max: Token::new(1_000),
    }
}

#[test]
fn a_stored_snapshot_loads_answers_retries_as_before_and_is_written_the_same() {
    let mut table: LockTable = serde_json::from_str(SNAPSHOT).expect("the snapshot loads");
    table.check_consistency();
    assert_eq!(*table.limits(), limits());
    assert_eq!(serde_json::to_string(&table).unwrap(), SNAPSHOT);

    // The remembered outcomes come back as they were first given.
    let retry = |session, lock: &str, request_id, wait| Input {
        now_ms: TimeMs::from_millis(30),
        command: Command::Acquire {
            session: SessionId::new(session),
            lock: lock.into(),
            request_id: RequestId::new(request_id),
            wait,
            value: None,
            mode: palisade_core::Mode::Exclusive,
        },
    };
    let queued = table.apply(retry(2, "jobs/a", 21, Wait::Forever)).result;
    assert_eq!(
        queued,
        Ok(Reply::Queued {
            lock: "jobs/a".into(),
            session: SessionId::new(2),
            position: 0
        })
    );
    let too_many_waiters = table
        .apply(retry(
            3,
            "jobs/a",
            31,
            Wait::ForMs(DurationMs::from_millis(5_000)),
        ))
        .result;
    assert_eq!(
        too_many_waiters,
        Err(CoreError::TooManyWaiters {
            lock: "jobs/a".into(),
            waiters_max: 1
        })
    );
    let too_many_locks = table.apply(retry(3, "jobs/d", 34, Wait::Try)).result;
    assert_eq!(
        too_many_locks,
        Err(CoreError::TooManyLocks { locks_max: 3 })
    );
    table.check_consistency();
}

#[test]
fn a_stored_log_entry_that_sets_limits_replays_and_is_written_the_same() {
    let entry: Input = serde_json::from_str(SET_LIMITS_ENTRY).expect("the entry loads");
    assert_eq!(
        entry,
        Input {
            now_ms: TimeMs::from_millis(5),
            command: Command::SetLimits { limits: limits() }
        }
    );
    assert_eq!(serde_json::to_string(&entry).unwrap(), SET_LIMITS_ENTRY);
}

/// A floor entry of a version before session floors loads with none and is written the same;
/// one with a session floor round-trips, and raises the session counter.
#[test]
fn a_stored_token_floor_entry_replays_and_is_written_the_same_with_or_without_a_session_floor() {
    let old = r#"{"now_ms":7,"command":{"RaiseTokenFloor":{"floor":1000}}}"#;
    let entry: Input = serde_json::from_str(old).expect("the entry loads");
    assert_eq!(
        entry.command,
        Command::RaiseTokenFloor {
            floor: Token::new(1_000),
            session_floor: None
        }
    );
    assert_eq!(serde_json::to_string(&entry).unwrap(), old);

    let new = r#"{"now_ms":8,"command":{"RaiseTokenFloor":{"floor":1000,"session_floor":77}}}"#;
    let entry: Input = serde_json::from_str(new).expect("the entry loads");
    assert_eq!(serde_json::to_string(&entry).unwrap(), new);
    let mut table = LockTable::new(limits());
    table.apply(entry);
    assert_eq!(table.last_token(), Token::new(1_000));
    assert_eq!(table.last_session(), SessionId::new(77));
}

#[test]
fn stored_replies_and_refusals_with_counts_load_and_are_written_the_same() {
    let replies = [
        (
            r#"{"Ok":{"Queued":{"lock":"jobs/a","session":2,"position":0}}}"#,
            Ok(Reply::Queued {
                lock: "jobs/a".into(),
                session: SessionId::new(2),
                position: 0,
            }),
        ),
        (
            r#"{"Ok":{"LeaderStarted":{"sessions_extended":3}}}"#,
            Ok(Reply::LeaderStarted {
                sessions_extended: 3,
            }),
        ),
        (
            r#"{"Err":{"TooManySessions":{"sessions_max":4}}}"#,
            Err(CoreError::TooManySessions { sessions_max: 4 }),
        ),
        (
            r#"{"Err":{"TooManyWaiters":{"lock":"jobs/a","waiters_max":1}}}"#,
            Err(CoreError::TooManyWaiters {
                lock: "jobs/a".into(),
                waiters_max: 1,
            }),
        ),
        (
            r#"{"Err":{"TooManyLocks":{"locks_max":3}}}"#,
            Err(CoreError::TooManyLocks { locks_max: 3 }),
        ),
        (
            r#"{"Err":{"InvalidLockName":{"TooLong":{"bytes":33,"bytes_max":32}}}}"#,
            Err(CoreError::InvalidLockName(LockNameError::TooLong {
                bytes: 33,
                bytes_max: 32,
            })),
        ),
        (
            r#"{"Err":{"InvalidOpenKey":{"Length":{"bytes":3,"bytes_min":16,"bytes_max":32}}}}"#,
            Err(CoreError::InvalidOpenKey(OpenKeyError::Length {
                bytes: 3,
                bytes_min: 16,
                bytes_max: 32,
            })),
        ),
    ];
    for (stored, expected) in replies {
        let loaded: Result<Reply, CoreError> = serde_json::from_str(stored).expect(stored);
        assert_eq!(loaded, expected, "{stored}");
        assert_eq!(serde_json::to_string(&loaded).unwrap(), stored);
    }
}

/// Log entries, outputs and replies that name sessions, tokens, request ids, instants and
/// spans, as the version whose `SessionId`, `Token`, `RequestId` and `TimeMs` were `u64` aliases
/// wrote them: each newtype is still its bare number.
#[test]
fn ids_and_times_are_stored_as_the_bare_numbers_they_were() {
    let (session, token, request_id) = (SessionId::new(3), Token::new(4), RequestId::new(31));
    let at = |ms| TimeMs::from_millis(ms);
    let entries = [
        (
            r#"{"now_ms":30,"command":{"Acquire":{"session":3,"lock":"jobs/a","request_id":31,"wait":{"ForMs":5000}}}}"#,
            Input {
                now_ms: at(30),
                command: Command::Acquire {
                    session,
                    lock: "jobs/a".into(),
                    request_id,
                    wait: Wait::ForMs(DurationMs::from_millis(5_000)),
                    value: None,
                    mode: palisade_core::Mode::Exclusive,
                },
            },
        ),
        (
            r#"{"now_ms":30,"command":{"Acquire":{"session":3,"lock":"jobs/a","request_id":33,"wait":"Forever","value":"10.0.0.1:7000"}}}"#,
            Input {
                now_ms: at(30),
                command: Command::Acquire {
                    session,
                    lock: "jobs/a".into(),
                    request_id: RequestId::new(33),
                    wait: Wait::Forever,
                    value: Some(GrantValue::new("10.0.0.1:7000").unwrap()),
                    mode: palisade_core::Mode::Exclusive,
                },
            },
        ),
        (
            r#"{"now_ms":30,"command":{"SetValue":{"session":3,"lock":"jobs/a","token":4,"value":null}}}"#,
            Input {
                now_ms: at(30),
                command: Command::SetValue {
                    session,
                    lock: "jobs/a".into(),
                    token,
                    value: None,
                },
            },
        ),
        (
            r#"{"now_ms":31,"command":{"Release":{"session":3,"lock":"jobs/a","request_id":32}}}"#,
            Input {
                now_ms: at(31),
                command: Command::Release {
                    session,
                    lock: "jobs/a".into(),
                    request_id: RequestId::new(32),
                },
            },
        ),
        (
            r#"{"now_ms":32,"command":{"OpenSessionWithKey":{"open_key":null,"ttl_ms":10000}}}"#,
            Input {
                now_ms: at(32),
                command: Command::OpenSession {
                    open_key: None,
                    ttl_ms: DurationMs::from_millis(10_000),
                    secret_digest: None,
                    owner: None,
                },
            },
        ),
        (
            r#"{"now_ms":33,"command":{"KeepAlive":{"session":3}}}"#,
            Input {
                now_ms: at(33),
                command: Command::KeepAlive { session },
            },
        ),
    ];
    for (stored, expected) in entries {
        let loaded: Input = serde_json::from_str(stored).expect(stored);
        assert_eq!(loaded, expected, "{stored}");
        assert_eq!(serde_json::to_string(&loaded).unwrap(), stored);
    }

    let output = r#"{"result":{"Err":{"Busy":{"lock":"jobs/a","holder_session":1,"holder_token":1,"available_at_ms":10526}}},"events":[{"Granted":{"lock":"jobs/a","session":2,"token":4,"request_id":21}},{"Released":{"lock":"jobs/b","session":3,"token":2,"cause":"SessionExpired"}}]}"#;
    let expected = Output {
        result: Err(CoreError::Busy {
            lock: "jobs/a".into(),
            holder_session: Some(SessionId::new(1)),
            holder_token: Some(Token::new(1)),
            available_at_ms: Some(at(10_526)),
        }),
        events: vec![
            Event::Granted {
                lock: "jobs/a".into(),
                session: SessionId::new(2),
                token,
                request_id: RequestId::new(21),
                value: None,
                access: palisade_core::Access::Exclusive,
            },
            Event::Released {
                lock: "jobs/b".into(),
                session,
                token: Token::new(2),
                cause: ReleaseCause::SessionExpired,
            },
        ],
    };
    let loaded: Output = serde_json::from_str(output).unwrap();
    assert_eq!(loaded, expected);
    assert_eq!(serde_json::to_string(&loaded).unwrap(), output);

    let replies = [
        (
            r#"{"Err":{"TtlOutOfRange":{"ttl_ms":10,"ttl_ms_min":1000,"ttl_ms_max":600000}}}"#,
            Err(CoreError::TtlOutOfRange {
                ttl_ms: DurationMs::from_millis(10),
                ttl_ms_min: DurationMs::from_millis(1_000),
                ttl_ms_max: DurationMs::from_millis(600_000),
            }),
        ),
        (
            r#"{"Err":{"WaitOutOfRange":{"wait_ms":99000000,"wait_ms_max":86400000}}}"#,
            Err(CoreError::WaitOutOfRange {
                wait_ms: DurationMs::from_millis(99_000_000),
                wait_ms_max: DurationMs::from_millis(86_400_000),
            }),
        ),
        (
            r#"{"Ok":{"SessionOpened":{"session":4,"ttl_ms":10000,"expires_at_ms":10032}}}"#,
            Ok(Reply::SessionOpened {
                session: SessionId::new(4),
                ttl_ms: DurationMs::from_millis(10_000),
                expires_at_ms: at(10_032),
            }),
        ),
    ];
    for (stored, expected) in replies {
        let loaded: Result<Reply, CoreError> = serde_json::from_str(stored).expect(stored);
        assert_eq!(loaded, expected, "{stored}");
        assert_eq!(serde_json::to_string(&loaded).unwrap(), stored);
    }
}

/// A table with an entry in every map and set of the table: held locks with and without values,
/// queues with and without deadlines and values, a lock in its lock-delay, a forgotten lock, and
/// sessions opened with and without keys, digests and owners.
fn table_with_every_kind_of_entry() -> LockTable {
    let limits = Limits {
        lock_delay_ms: DurationMs::from_millis(500),
        ..Limits::default()
    };
    let mut table = LockTable::new(limits);
    let ttl_ms = DurationMs::from_millis(10_000);
    let mut apply = |at_ms, command| {
        let now_ms = TimeMs::from_millis(at_ms);
        table.apply(Input { now_ms, command }).result.unwrap();
    };
    let open = |key: Option<u8>, owner: Option<&str>| Command::OpenSession {
        open_key: key.map(|k| {
            OpenKey::new(&[k, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]).unwrap()
        }),
        ttl_ms,
        secret_digest: key.map(|k| SecretDigest::new([k; SecretDigest::BYTES])),
        owner: owner.map(|o| Identity::new(o).unwrap()),
    };
    let acquire = |session, lock: &str, request_id, wait, value: Option<&str>| Command::Acquire {
        session: SessionId::new(session),
        lock: lock.into(),
        request_id: RequestId::new(request_id),
        wait,
        value: value.map(|v| GrantValue::new(v).unwrap()),
        mode: palisade_core::Mode::Exclusive,
    };
    apply(1, open(Some(7), Some("alice")));
    apply(1, open(None, None));
    apply(1, open(Some(9), None));
    apply(1, open(None, None));
    apply(2, acquire(1, "jobs/a", 1, Wait::Try, Some("10.0.0.1:80")));
    apply(2, acquire(2, "jobs/b", 1, Wait::Try, None));
    let for_20_s = Wait::ForMs(DurationMs::from_millis(20_000));
    apply(3, acquire(2, "jobs/a", 2, for_20_s, Some("v")));
    apply(3, acquire(3, "jobs/a", 1, Wait::Forever, None));
    apply(4, acquire(3, "jobs/gone", 2, Wait::Try, None));
    let release = Command::Release {
        session: SessionId::new(3),
        lock: "jobs/gone".into(),
        request_id: RequestId::new(3),
    };
    apply(4, release);
    // Session 4 holds "jobs/d" and lets its lease run out: "jobs/d" sits out its lock-delay.
    apply(5, acquire(4, "jobs/d", 1, Wait::Try, None));
    for session in 1..=3 {
        let session = SessionId::new(session);
        apply(9_000, Command::KeepAlive { session });
    }
    apply(10_002, Command::Tick);
    table
}

/// [`table_with_every_kind_of_entry`] as JSON, written by the version whose lock names were
/// `String`s everywhere (before the table shared one allocation per name).
const SNAPSHOT_WITH_EVERY_KIND_OF_ENTRY: &str = r#"{"limits":{"lock_name_bytes_max":256,"session_ttl_ms_min":1000,"session_ttl_ms_max":86400000,"sessions_max":50000,"locks_max":1000000,"waiters_per_lock_max":10000,"lock_delay_ms":500,"token_max":9223372036854775807},"now_ms":10002,"last_token":4,"last_session":4,"sessions":{"1":{"ttl_ms":10000,"expires_at_ms":19000,"open_request_id":null,"open_key":"070102030405060708090a0b0c0d0e0f","secret_digest":"0707070707070707070707070707070707070707070707070707070707070707","owner":"alice","held":["jobs/a"],"waiting":[],"recent":[{"request_id":1,"kind":"Acquire","lock":"jobs/a","result":{"Ok":{"Granted":{"lock":"jobs/a","session":1,"token":1}}}}]},"2":{"ttl_ms":10000,"expires_at_ms":19000,"open_request_id":null,"held":["jobs/b"],"waiting":["jobs/a"],"recent":[{"request_id":1,"kind":"Acquire","lock":"jobs/b","result":{"Ok":{"Granted":{"lock":"jobs/b","session":2,"token":2}}}},{"request_id":2,"kind":"Acquire","lock":"jobs/a","result":{"Ok":{"Queued":{"lock":"jobs/a","session":2,"position":0}}}}]},"3":{"ttl_ms":10000,"expires_at_ms":19000,"open_request_id":null,"open_key":"090102030405060708090a0b0c0d0e0f","secret_digest":"0909090909090909090909090909090909090909090909090909090909090909","held":[],"waiting":["jobs/a"],"recent":[{"request_id":1,"kind":"Acquire","lock":"jobs/a","result":{"Ok":{"Queued":{"lock":"jobs/a","session":3,"position":1}}}},{"request_id":2,"kind":"Acquire","lock":"jobs/gone","result":{"Ok":{"Granted":{"lock":"jobs/gone","session":3,"token":3}}}},{"request_id":3,"kind":"Release","lock":"jobs/gone","result":{"Ok":{"Released":{"lock":"jobs/gone","session":3,"token":3}}}}]}},"locks":{"jobs/a":{"holder":{"session":1,"token":1,"granted_at_ms":2,"request_id":1,"value":"10.0.0.1:80"},"waiters":[{"session":2,"request_id":2,"deadline_ms":20003,"value":"v"},{"session":3,"request_id":1,"deadline_ms":null}],"last_token":1,"available_at_ms":null},"jobs/b":{"holder":{"session":2,"token":2,"granted_at_ms":2,"request_id":1},"waiters":[],"last_token":2,"available_at_ms":null},"jobs/d":{"holder":null,"waiters":[],"last_token":4,"available_at_ms":10502}},"open_requests":{},"open_keys":{"070102030405060708090a0b0c0d0e0f":1,"090102030405060708090a0b0c0d0e0f":3},"session_deadlines":[[19000,1],[19000,2],[19000,3]],"wait_deadlines":[[20003,2,"jobs/a"]],"delay_deadlines":[[10502,"jobs/d"]],"forgotten":{"jobs/gone":[1,3]},"forgotten_order":{"1":"jobs/gone"},"last_forgotten":1,"owners":{"alice":[1]}}"#;

/// [`table_with_every_kind_of_entry`]'s image in postcard, as hex, written by the same version:
/// image format 1, from before shared holders and semaphores.
const IMAGE_WITH_EVERY_KIND_OF_ENTRY: &str = "8002e80780b89929d08603c0843d904ef403ffffffffffffffff7f924e0404010301904eb8940100012030373031303230333034303530363037303830393061306230633064306530660140303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730370105616c696365010100066a6f62732f610003066a6f62732f61010102904eb8940100000000020100066a6f62732f620003066a6f62732f6202020200066a6f62732f610004066a6f62732f61020003904eb89401000120303930313032303330343035303630373038303930613062306330643065306601403039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303900030100066a6f62732f610004066a6f62732f6103010200096a6f62732f676f6e650003096a6f62732f676f6e6503030301096a6f62732f676f6e650005096a6f62732f676f6e6503010303066a6f62732f610101010201010b31302e302e302e313a383002020201a39c01010176030100000100066a6f62732f62010202020100000200066a6f62732f640000040186520101096a6f62732f676f6e6503";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// [`table_with_every_kind_of_entry`] and a read-write lock and a semaphore, each with holders
/// and a waiter: "jobs/r" read by sessions 1 and 2 (one phase, one token) with session 3
/// waiting to write, "jobs/s" a semaphore of 2 whose slots sessions 1 and 2 hold, session 3
/// waiting for a permit.
fn table_with_shared_holders_and_permits() -> LockTable {
    let mut table = table_with_every_kind_of_entry();
    let mut apply = |command| {
        let now_ms = TimeMs::from_millis(10_003);
        table.apply(Input { now_ms, command }).result.unwrap();
    };
    let acquire = |session, lock: &str, request_id, mode| Command::Acquire {
        session: SessionId::new(session),
        lock: lock.into(),
        request_id: RequestId::new(request_id),
        wait: Wait::Forever,
        value: None,
        mode,
    };
    apply(acquire(1, "jobs/r", 11, Mode::Shared));
    apply(acquire(2, "jobs/r", 11, Mode::Shared));
    apply(acquire(3, "jobs/r", 11, Mode::Exclusive));
    apply(acquire(1, "jobs/s", 12, Mode::Permit(2)));
    apply(acquire(2, "jobs/s", 12, Mode::Permit(2)));
    apply(acquire(3, "jobs/s", 12, Mode::Permit(2)));
    table
}

/// [`table_with_shared_holders_and_permits`]'s image in postcard (format 2), as hex, written
/// by the version that added them.
const IMAGE_WITH_SHARED_HOLDERS_AND_PERMITS: &str = "8002e80780b89929d08603c0843d904ef403ffffffffffffffff7f934e0704010301904eb8940100012030373031303230333034303530363037303830393061306230633064306530660140303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730370105616c696365030100066a6f62732f610003066a6f62732f6101010b00066a6f62732f72000b066a6f62732f720105010c00066a6f62732f73000b066a6f62732f730106020002904eb8940100000000040100066a6f62732f620003066a6f62732f6202020200066a6f62732f610004066a6f62732f6102000b00066a6f62732f72000b066a6f62732f720205010c00066a6f62732f73000b066a6f62732f730207020103904eb89401000120303930313032303330343035303630373038303930613062306330643065306601403039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303900050100066a6f62732f610004066a6f62732f6103010200096a6f62732f676f6e650003096a6f62732f676f6e6503030301096a6f62732f676f6e650005096a6f62732f676f6e650301030b00066a6f62732f720004066a6f62732f7203000c00066a6f62732f730004066a6f62732f73030005066a6f62732f610101010201010b31302e302e302e313a383000000002020201a39c010101760003010000000100066a6f62732f62010202020100000000000200066a6f62732f640000000004018652066a6f62732f7200020105934e0b00010205934e0b00010001030b0000000500066a6f62732f7300020106934e0c0002000207934e0c000201010201030c0000020207000101096a6f62732f676f6e6503";

#[test]
fn an_image_of_format_2_with_shared_holders_and_permits_loads() {
    let table = table_with_shared_holders_and_permits();
    let bytes = unhex(IMAGE_WITH_SHARED_HOLDERS_AND_PERMITS);
    let image: TableImageV2 = postcard::from_bytes(&bytes).expect("the format-2 image decodes");
    let restored = LockTable::from_image(image.into()).expect("the image is of a valid table");
    assert_eq!(restored, table);
    let json: LockTable = serde_json::from_str(&serde_json::to_string(&table).unwrap()).unwrap();
    assert_eq!(json, table);
    // The restored copy acts the same: the readers leave, the writer is granted, and a freed
    // slot goes to the waiting permit.
    let release = |session, lock: &str, request_id| Input {
        now_ms: TimeMs::from_millis(10_004),
        command: Command::Release {
            session: SessionId::new(session),
            lock: lock.into(),
            request_id: RequestId::new(request_id),
        },
    };
    let mut copies = [table.clone(), restored];
    for copy in &mut copies {
        for (session, lock, request_id) in [(1, "jobs/r", 21), (2, "jobs/r", 21), (1, "jobs/s", 22)]
        {
            copy.apply(release(session, lock, request_id))
                .result
                .unwrap();
        }
        assert_eq!(copy.holder("jobs/r").unwrap().session, SessionId::new(3));
        let permits = copy.lock_status("jobs/s").unwrap().sharers;
        let held: Vec<_> = permits
            .iter()
            .map(|g| (g.session.get(), g.access))
            .collect();
        assert_eq!(held, [(2, Access::Slot(1)), (3, Access::Slot(0))]);
    }
    assert_eq!(copies[0], copies[1]);
}

#[test]
fn a_stored_snapshot_and_image_with_every_kind_of_entry_load_and_are_written_the_same() {
    let table = table_with_every_kind_of_entry();

    let loaded: LockTable =
        serde_json::from_str(SNAPSHOT_WITH_EVERY_KIND_OF_ENTRY).expect("the snapshot loads");
    loaded.validate().expect("the snapshot is of a valid table");
    assert_eq!(loaded, table);
    assert_eq!(
        serde_json::to_string(&table).unwrap(),
        SNAPSHOT_WITH_EVERY_KIND_OF_ENTRY
    );

    let v1 = unhex(IMAGE_WITH_EVERY_KIND_OF_ENTRY);
    let image: TableImageV1 = postcard::from_bytes(&v1).expect("the format-1 image decodes");
    let restored = LockTable::from_image(image.into()).expect("the image is of a valid table");
    assert_eq!(restored, table);
    let bytes = postcard::to_allocvec(&table.image()).expect("an image encodes");
    let image: TableImage = postcard::from_bytes(&bytes).expect("the image decodes");
    assert_eq!(LockTable::from_image(image).unwrap(), table);

    // Each copy acts the same: the release of "jobs/a" grants it to its first waiter.
    let release = || Input {
        now_ms: TimeMs::from_millis(10_003),
        command: Command::Release {
            session: SessionId::new(1),
            lock: "jobs/a".into(),
            request_id: RequestId::new(9),
        },
    };
    let expected = table.clone().apply(release());
    for mut copy in [loaded, restored] {
        assert_eq!(copy.apply(release()), expected);
        assert_eq!(copy.holder("jobs/a").unwrap().session, SessionId::new(2));
    }
}

/// The server encodes a snapshot from a clone of the table while applying goes on: whatever the
/// table applies after the clone (grants, a changed value, a withdrawn wait, expiries, forgotten
/// locks) leaves the clone as it was, so the snapshot is of one instant.
#[test]
fn a_clone_is_unchanged_by_what_the_table_applies_after_it() {
    let mut table = table_with_every_kind_of_entry();
    let clone = table.clone();
    let mut apply = |at_ms, command| {
        let now_ms = TimeMs::from_millis(at_ms);
        table.apply(Input { now_ms, command }).result.unwrap();
    };
    let release = |session, request_id| Command::Release {
        session: SessionId::new(session),
        lock: "jobs/a".into(),
        request_id: RequestId::new(request_id),
    };
    apply(10_003, release(3, 9));
    apply(10_003, release(1, 9));
    let value = Some(GrantValue::new("changed").unwrap());
    let set_value = Command::SetValue {
        session: SessionId::new(2),
        lock: "jobs/a".into(),
        token: Token::new(5),
        value,
    };
    apply(10_004, set_value);
    let session = SessionId::new(2);
    apply(10_005, Command::KeepAlive { session });
    // Every session expires, and every lock sits out its lock-delay and is forgotten.
    apply(40_000, Command::Tick);
    apply(41_000, Command::Tick);
    assert_eq!((table.session_count(), table.lock_count()), (0, 0));

    assert_eq!(
        serde_json::to_string(&clone).unwrap(),
        SNAPSHOT_WITH_EVERY_KIND_OF_ENTRY
    );
    clone.validate().expect("the clone is still a valid table");
}

/// [`table_with_shared_holders_and_permits`] and two multi-locks: session 1 waits for
/// "jobs/m1" (exclusive, held by session 2) and "jobs/m2" (shared, free) as one group with a
/// deadline; session 2 holds "jobs/m3" and "jobs/m4", granted together.
fn table_with_multi_locks() -> LockTable {
    let mut table = table_with_shared_holders_and_permits();
    let mut apply = |command| {
        let now_ms = TimeMs::from_millis(10_004);
        table.apply(Input { now_ms, command }).result.unwrap()
    };
    let part = |lock: &str, mode| AcquirePart {
        lock: lock.into(),
        mode,
    };
    let acquire_all = |session, parts, request_id, wait| Command::AcquireAll {
        session: SessionId::new(session),
        parts,
        request_id: RequestId::new(request_id),
        wait,
    };
    let both = vec![
        part("jobs/m3", Mode::Exclusive),
        part("jobs/m4", Mode::Permit(2)),
    ];
    apply(acquire_all(2, both, 31, Wait::Try));
    apply(Command::Acquire {
        session: SessionId::new(2),
        lock: "jobs/m1".into(),
        request_id: RequestId::new(32),
        wait: Wait::Try,
        value: None,
        mode: Mode::Exclusive,
    });
    let group = vec![
        part("jobs/m1", Mode::Exclusive),
        part("jobs/m2", Mode::Shared),
    ];
    let for_20_s = Wait::ForMs(DurationMs::from_millis(20_000));
    let queued = apply(acquire_all(1, group, 33, for_20_s));
    assert!(matches!(queued, Reply::QueuedAll { .. }));
    table
}

/// [`table_with_multi_locks`]'s image in postcard (format 3), as hex, written by the version
/// that added multi-locks.
const IMAGE_WITH_MULTI_LOCKS: &str = "8002e80780b89929d08603c0843d904ef403ffffffffffffffff7f944e0a04010301904eb8940100012030373031303230333034303530363037303830393061306230633064306530660140303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730373037303730370105616c696365040100066a6f62732f610003066a6f62732f6101010b00066a6f62732f72000b066a6f62732f720105010c00066a6f62732f73000b066a6f62732f73010602002102106a6f62732f6d310a6a6f62732f6d320a000d0102904eb8940100000000060100066a6f62732f620003066a6f62732f6202020200066a6f62732f610004066a6f62732f6102000b00066a6f62732f72000b066a6f62732f720205010c00066a6f62732f73000b066a6f62732f73020702011f02106a6f62732f6d330a6a6f62732f6d340a000c0202076a6f62732f6d330800076a6f62732f6d340902002000076a6f62732f6d310003076a6f62732f6d31020a03904eb89401000120303930313032303330343035303630373038303930613062306330643065306601403039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303930393039303900050100066a6f62732f610004066a6f62732f6103010200096a6f62732f676f6e650003096a6f62732f676f6e6503030301096a6f62732f676f6e650005096a6f62732f676f6e650301030b00066a6f62732f720004066a6f62732f7203000c00066a6f62732f730004066a6f62732f73030009066a6f62732f610101010201010b31302e302e302e313a383000000002020201a39c0101017600000301000000000100066a6f62732f62010202020100000000000200066a6f62732f640000000004018652076a6f62732f6d3101020a944e200000000001012101b4ea01000001076a6f62732f6d32010a00076a6f62732f6d3200000001012101b4ea01000101076a6f62732f6d31000000076a6f62732f6d33010208944e1f00000000000800076a6f62732f6d3400010209944e1f0002000102000900066a6f62732f7200020105934e0b00010205934e0b00010001030b000000000500066a6f62732f7300020106934e0c0002000207934e0c000201010201030c000002020007000101096a6f62732f676f6e6503";

#[test]
fn an_image_of_format_3_with_a_waiting_multi_lock_loads_and_is_written_the_same() {
    let table = table_with_multi_locks();
    let bytes = postcard::to_allocvec(&table.image()).expect("an image encodes");
    assert_eq!(hex(&bytes), IMAGE_WITH_MULTI_LOCKS);
    let image: TableImage = postcard::from_bytes(&bytes).expect("the image decodes");
    let restored = LockTable::from_image(image).expect("the image is of a valid table");
    assert_eq!(restored, table);
    let json: LockTable = serde_json::from_str(&serde_json::to_string(&table).unwrap()).unwrap();
    assert_eq!(json, table);
    json.validate().expect("the JSON is of a valid table");
    // The restored copy acts the same: when session 2 releases "jobs/m1", session 1 gets both
    // of its locks in one step, and a retry of its multi-lock answers both grants.
    let mut copies = [table.clone(), restored];
    for copy in &mut copies {
        let release = Command::Release {
            session: SessionId::new(2),
            lock: "jobs/m1".into(),
            request_id: RequestId::new(34),
        };
        let now_ms = TimeMs::from_millis(10_005);
        copy.apply(Input {
            now_ms,
            command: release,
        })
        .result
        .unwrap();
        assert_eq!(copy.holder("jobs/m1").unwrap().session, SessionId::new(1));
        let reader = copy.lock_status("jobs/m2").unwrap().sharers;
        assert_eq!(reader[0].session, SessionId::new(1));
    }
    assert_eq!(copies[0], copies[1]);
}
