//! Scenarios for the fenced store through its Rust API, without HTTP: who may write, what a
//! refusal says, and what survives a restart.

use std::sync::Arc;

use palisade_core::limits::TOKEN_MAX;
use palisade_store::limits::{BATCH_OPS_MAX, KEY_BYTES_MAX, REQUEST_ID_BYTES_MAX, VALUE_BYTES_MAX};
use palisade_store::{BatchOp, OpAck, OpKind, Store, StoreError};
use palisade_testkit::{ServiceKey, impostor_grant};

fn value_of(store: &Store, key: &str) -> Option<(String, u64)> {
    store
        .get(key)
        .unwrap()
        .map(|entry| (String::from_utf8(entry.value).unwrap(), entry.token))
}

fn put(key: &str, value: &str) -> BatchOp {
    BatchOp::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

#[test]
fn a_superseded_holder_is_refused_with_the_presented_and_accepted_tokens() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let paused = service.grant("jobs/nightly", 7, 3);
    let next = service.grant("jobs/nightly", 9, 4);

    // The next holder writes while the first one is paused past its lease.
    store.put(Some(&next), "report", b"by 9", None).unwrap();

    // The paused holder wakes up and tries to write.
    let refusal = store
        .put(Some(&paused), "report", b"by 7", None)
        .unwrap_err();
    assert_eq!(
        refusal,
        StoreError::Stale {
            lock: "jobs/nightly".into(),
            presented: 7,
            accepted: 9,
            holder_session: Some(4),
        }
    );
    assert_eq!(
        refusal.to_string(),
        "token 7 for lock \"jobs/nightly\" is stale; the store has accepted token 9 (presented by session 4): a newer holder has claimed, read or written here; re-acquire the lock and re-read before writing"
    );
    assert_eq!(value_of(&store, "report"), Some(("by 9".into(), 9)));
}

#[test]
fn the_current_holder_writes_many_times_with_the_same_token() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let holder = service.grant("jobs/nightly", 5, 1);

    for round in 0..3 {
        let ack = store
            .put(
                Some(&holder),
                "report",
                format!("draft {round}").as_bytes(),
                None,
            )
            .unwrap();
        assert_eq!(
            (ack.lock.as_str(), ack.token, ack.session),
            ("jobs/nightly", 5, 1)
        );
    }
    assert_eq!(value_of(&store, "report"), Some(("draft 2".into(), 5)));
}

#[test]
fn a_stale_holder_cannot_write_any_key_of_its_lock_not_even_one_the_new_holder_never_touched() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let paused = service.grant("jobs/nightly", 7, 3);
    store
        .put(Some(&paused), "report.partial", b"half", None)
        .unwrap();

    // The next grant writes only "report".
    store
        .put(
            Some(&service.grant("jobs/nightly", 8, 4)),
            "report",
            b"done",
            None,
        )
        .unwrap();

    // The paused holder's write to the key the new holder has not reached is a zombie too.
    let refusal = store
        .put(Some(&paused), "report.partial", b"rest", None)
        .unwrap_err();
    assert!(refusal.is_stale(), "{refusal}");
    let refusal = store
        .put(Some(&paused), "brand-new-key", b"x", None)
        .unwrap_err();
    assert!(refusal.is_stale(), "{refusal}");
    assert_eq!(value_of(&store, "report.partial"), Some(("half".into(), 7)));
    assert_eq!(store.get("brand-new-key").unwrap(), None);
}

#[test]
fn a_key_bound_to_one_lock_refuses_the_sequencer_of_another_lock() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    store
        .put(
            Some(&service.grant("jobs/nightly", 2, 1)),
            "report",
            b"nightly",
            None,
        )
        .unwrap();

    // Another lock's holder, even with a far larger token, cannot touch the key.
    let other = service.grant("jobs/hourly", 50, 2);
    let refusal = store
        .put(Some(&other), "report", b"hourly", None)
        .unwrap_err();
    assert_eq!(
        refusal,
        StoreError::WrongLock {
            key: Some("report".into()),
            expected: "jobs/nightly".into(),
            presented: "jobs/hourly".into(),
        }
    );
    assert_eq!(refusal.http_status(), 403);
    assert_eq!(
        store
            .delete(Some(&other), "report", None)
            .unwrap_err()
            .kind(),
        "wrong_lock"
    );

    // It writes its own keys, and the tokens of the two locks do not interfere.
    store.put(Some(&other), "hourly", b"ok", None).unwrap();
    store
        .put(
            Some(&service.grant("jobs/nightly", 2, 1)),
            "report",
            b"again",
            None,
        )
        .unwrap();
    assert_eq!(value_of(&store, "report"), Some(("again".into(), 2)));
    assert_eq!(
        store.fence_state("jobs/hourly").unwrap().token_max,
        Some(50)
    );
    assert_eq!(
        store.fence_state("jobs/nightly").unwrap().token_max,
        Some(2)
    );
}

#[test]
fn forged_truncated_and_altered_sequencers_are_refused_and_do_not_lock_out_the_honest_writer() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let honest = service.grant("jobs/nightly", 3, 1);

    // An impostor signs the largest possible token with its own key.
    let forged = impostor_grant("jobs/nightly", TOKEN_MAX.get(), 666);
    let refusal = store
        .put(Some(&forged), "report", b"pwned", None)
        .unwrap_err();
    assert_eq!(refusal.kind(), "forged");
    assert_eq!(refusal.http_status(), 403);

    // A genuine sequencer with its token edited.
    let altered = honest.replacen(".3.", ".9000.", 1);
    assert_ne!(altered, honest);
    assert_eq!(
        store
            .put(Some(&altered), "report", b"x", None)
            .unwrap_err()
            .kind(),
        "forged"
    );

    // Cut short, garbage, blank, absent.
    let truncated = &honest[..honest.len() - 10];
    for (presented, kind) in [
        (Some(truncated), "malformed"),
        (Some("not a sequencer"), "malformed"),
        (Some("   "), "missing"),
        (None, "missing"),
    ] {
        let refusal = store.put(presented, "report", b"x", None).unwrap_err();
        assert_eq!(refusal.kind(), kind, "{presented:?}: {refusal}");
        assert!(refusal.is_rejection());
    }

    // None of that moved the fence: the honest holder writes with its small token.
    assert_eq!(store.fence_state("jobs/nightly").unwrap().token_max, None);
    store.put(Some(&honest), "report", b"honest", None).unwrap();
    assert_eq!(value_of(&store, "report"), Some(("honest".into(), 3)));
}

#[test]
fn a_batch_is_applied_whole_or_not_at_all() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    store
        .put(
            Some(&service.grant("other", 1, 9)),
            "owned-by-other",
            b"keep",
            None,
        )
        .unwrap();
    store
        .put(Some(&service.grant("jobs/nightly", 4, 1)), "a", b"a4", None)
        .unwrap();

    // One operation touches a key of another lock: nothing of the batch lands, not even the
    // token advance.
    let grant = service.grant("jobs/nightly", 6, 2);
    let refusal = store
        .batch(
            Some(&grant),
            &[
                put("a", "a6"),
                put("b", "b6"),
                BatchOp::Delete {
                    key: "owned-by-other".into(),
                },
            ],
            None,
        )
        .unwrap_err();
    assert_eq!(refusal.kind(), "wrong_lock");
    assert_eq!(value_of(&store, "a"), Some(("a4".into(), 4)));
    assert_eq!(store.get("b").unwrap(), None);
    assert_eq!(
        store.fence_state("jobs/nightly").unwrap().token_max,
        Some(4)
    );

    // A stale batch writes nothing either.
    let stale = service.grant("jobs/nightly", 3, 7);
    let refusal = store
        .batch(Some(&stale), &[put("c", "c3"), put("a", "a3")], None)
        .unwrap_err();
    assert!(refusal.is_stale());
    assert_eq!(store.get("c").unwrap(), None);

    // A valid batch applies every operation, in order, under one token.
    let ack = store
        .batch(
            Some(&grant),
            &[
                put("a", "a6"),
                put("b", "b6"),
                put("b", "b6 again"),
                BatchOp::Delete { key: "a".into() },
                BatchOp::Delete {
                    key: "never".into(),
                },
            ],
            None,
        )
        .unwrap();
    assert_eq!(ack.token, 6);
    assert_eq!(
        ack.ops,
        vec![
            OpAck {
                op: OpKind::Put,
                key: "a".into(),
                existed: true,
                entry: None,
            },
            OpAck {
                op: OpKind::Put,
                key: "b".into(),
                existed: false,
                entry: None,
            },
            OpAck {
                op: OpKind::Put,
                key: "b".into(),
                existed: true,
                entry: None,
            },
            OpAck {
                op: OpKind::Delete,
                key: "a".into(),
                existed: true,
                entry: None,
            },
            OpAck {
                op: OpKind::Delete,
                key: "never".into(),
                existed: false,
                entry: None,
            },
        ]
    );
    assert_eq!(store.get("a").unwrap(), None);
    assert_eq!(value_of(&store, "b"), Some(("b6 again".into(), 6)));
    assert_eq!(value_of(&store, "owned-by-other"), Some(("keep".into(), 1)));
}

#[test]
fn a_retried_write_is_acknowledged_with_its_original_outcome_and_not_applied_twice() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let holder = service.grant("jobs/nightly", 5, 1);

    let first = store
        .put(Some(&holder), "counter", b"1", Some("req-1"))
        .unwrap();
    assert!(!first.replayed);
    store
        .put(Some(&holder), "counter", b"2", Some("req-2"))
        .unwrap();

    // The answer to req-1 was lost; the client retries it. It must not set "1" again.
    let retry = store
        .put(Some(&holder), "counter", b"1", Some("req-1"))
        .unwrap();
    assert!(retry.replayed);
    assert_eq!(
        (retry.lock.as_str(), retry.token, &retry.ops),
        (first.lock.as_str(), first.token, &first.ops)
    );
    assert_eq!(value_of(&store, "counter"), Some(("2".into(), 5)));

    // Even after a newer holder wrote, the retry learns that its write was applied (rather than
    // being told "stale" for a write that did happen).
    store
        .put(
            Some(&service.grant("jobs/nightly", 6, 2)),
            "counter",
            b"3",
            None,
        )
        .unwrap();
    let late_retry = store
        .put(Some(&holder), "counter", b"1", Some("req-1"))
        .unwrap();
    assert!(late_retry.replayed);
    assert_eq!(value_of(&store, "counter"), Some(("3".into(), 6)));

    // Reusing the request id for a different write is an error, not a silent replay.
    let reuse = store
        .put(Some(&holder), "counter", b"other", Some("req-1"))
        .unwrap_err();
    assert_eq!(
        reuse,
        StoreError::RequestIdReused {
            request_id: "req-1".into()
        }
    );

    // The same request id under another grant is another request.
    let fresh = store
        .put(
            Some(&service.grant("jobs/nightly", 6, 2)),
            "counter",
            b"4",
            Some("req-1"),
        )
        .unwrap();
    assert!(!fresh.replayed);
    assert_eq!(value_of(&store, "counter"), Some(("4".into(), 6)));
}

#[test]
fn keys_values_batches_and_request_ids_over_their_limits_are_refused_with_the_limit_named() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let holder = service.grant("jobs/nightly", 1, 1);

    // At the limits: accepted.
    let longest_key = "k".repeat(KEY_BYTES_MAX);
    let largest_value = vec![7u8; VALUE_BYTES_MAX];
    store
        .put(Some(&holder), &longest_key, &largest_value, None)
        .unwrap();
    assert_eq!(
        store.get(&longest_key).unwrap().unwrap().value,
        largest_value
    );

    // One past: refused, naming the limit.
    let too_long_key = "k".repeat(KEY_BYTES_MAX + 1);
    match store
        .put(Some(&holder), &too_long_key, b"x", None)
        .unwrap_err()
    {
        StoreError::TooLarge {
            limit,
            size,
            size_max,
            ..
        } => {
            assert_eq!(limit, "key_bytes_max");
            assert_eq!(
                (size, size_max),
                (Some(KEY_BYTES_MAX as u64 + 1), KEY_BYTES_MAX as u64)
            );
        }
        other => panic!("expected too_large, got {other:?}"),
    }
    let refusal = store
        .put(Some(&holder), "big", &vec![0u8; VALUE_BYTES_MAX + 1], None)
        .unwrap_err();
    assert_eq!(refusal.http_status(), 413);
    assert!(
        refusal.to_string().contains("value_bytes_max is 1048576"),
        "{refusal}"
    );

    let many: Vec<BatchOp> = (0..=BATCH_OPS_MAX)
        .map(|i| put(&format!("k{i}"), "v"))
        .collect();
    match store.batch(Some(&holder), &many, None).unwrap_err() {
        StoreError::TooLarge { limit, .. } => assert_eq!(limit, "batch_ops_max"),
        other => panic!("expected too_large, got {other:?}"),
    }
    store
        .batch(Some(&holder), &many[..BATCH_OPS_MAX], None)
        .unwrap();
    assert_eq!(
        store.batch(Some(&holder), &[], None).unwrap_err().kind(),
        "invalid_request"
    );

    // Bad keys and request ids.
    assert_eq!(
        store.put(Some(&holder), "", b"x", None).unwrap_err().kind(),
        "invalid_key"
    );
    assert_eq!(
        store
            .put(Some(&holder), "line\nbreak", b"x", None)
            .unwrap_err()
            .kind(),
        "invalid_key"
    );
    let long_id = "r".repeat(REQUEST_ID_BYTES_MAX + 1);
    assert_eq!(
        store
            .put(Some(&holder), "k", b"x", Some(&long_id))
            .unwrap_err()
            .kind(),
        "too_large"
    );
    assert_eq!(
        store
            .put(Some(&holder), "k", b"x", Some("has space"))
            .unwrap_err()
            .kind(),
        "invalid_request"
    );
}

#[test]
fn after_a_restart_the_accepted_token_is_kept_and_replaying_an_old_token_is_refused() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let old = service.grant("jobs/nightly", 4, 1);
    {
        let store = Store::open(dir.path(), service.key.public_key()).unwrap();
        store.put(Some(&old), "report", b"by 4", None).unwrap();
        store
            .put(
                Some(&service.grant("jobs/nightly", 8, 2)),
                "report",
                b"by 8",
                Some("r8"),
            )
            .unwrap();
    }

    // Restart the resource, then replay the superseded holder's write.
    let store = Store::open(dir.path(), service.key.public_key()).unwrap();
    let refusal = store
        .put(Some(&old), "report", b"replayed", None)
        .unwrap_err();
    assert_eq!(
        refusal,
        StoreError::Stale {
            lock: "jobs/nightly".into(),
            presented: 4,
            accepted: 8,
            holder_session: Some(2),
        }
    );
    assert_eq!(value_of(&store, "report"), Some(("by 8".into(), 8)));
    // The request-id record survived too.
    let retry = store
        .put(
            Some(&service.grant("jobs/nightly", 8, 2)),
            "report",
            b"by 8",
            Some("r8"),
        )
        .unwrap();
    assert!(retry.replayed);
}

#[test]
fn deleting_a_key_keeps_its_lock_and_token_so_neither_an_old_token_nor_another_lock_gets_back_in() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    store
        .put(
            Some(&service.grant("jobs/nightly", 4, 1)),
            "report",
            b"by 4",
            None,
        )
        .unwrap();
    let ack = store
        .delete(Some(&service.grant("jobs/nightly", 5, 2)), "report", None)
        .unwrap();
    assert!(ack.ops[0].existed);
    assert_eq!(store.get("report").unwrap(), None);

    let old = store
        .put(
            Some(&service.grant("jobs/nightly", 4, 1)),
            "report",
            b"zombie",
            None,
        )
        .unwrap_err();
    assert!(old.is_stale(), "{old}");
    let foreign = store
        .put(
            Some(&service.grant("jobs/other", 100, 3)),
            "report",
            b"foreign",
            None,
        )
        .unwrap_err();
    assert_eq!(foreign.kind(), "wrong_lock");

    // The current holder may re-create it.
    store
        .put(
            Some(&service.grant("jobs/nightly", 5, 2)),
            "report",
            b"again",
            None,
        )
        .unwrap();
    assert_eq!(value_of(&store, "report"), Some(("again".into(), 5)));
    // Deleting twice is fine, and says there was nothing the second time.
    let holder = service.grant("jobs/nightly", 5, 2);
    store.delete(Some(&holder), "report", None).unwrap();
    assert!(!store.delete(Some(&holder), "report", None).unwrap().ops[0].existed);
}

#[test]
fn racing_holders_leave_the_newest_grants_value_and_no_older_write_lands_after_a_newer_one() {
    use std::sync::atomic::{AtomicU64, Ordering};

    let service = Arc::new(ServiceKey::new());
    let (store, _dir) = service.store();
    let store = Arc::new(store);
    let clock = Arc::new(AtomicU64::new(0));

    // Sixteen grants race. For any two acknowledged writes where one finished before the other
    // started, the later one has the larger (or equal) token.
    let threads: Vec<_> = (1..=16u64)
        .map(|token| {
            let (service, store, clock) = (service.clone(), store.clone(), clock.clone());
            std::thread::spawn(move || {
                let grant = service.grant("race", token, token);
                let started = clock.fetch_add(1, Ordering::SeqCst);
                let result = store.put(Some(&grant), "winner", token.to_string().as_bytes(), None);
                let finished = clock.fetch_add(1, Ordering::SeqCst);
                match result {
                    Ok(ack) => Some((started, finished, ack.token)),
                    Err(error) => {
                        assert!(error.is_stale(), "{error}");
                        None
                    }
                }
            })
        })
        .collect();
    let acknowledged: Vec<_> = threads
        .into_iter()
        .filter_map(|thread| thread.join().unwrap())
        .collect();
    for earlier in &acknowledged {
        for later in &acknowledged {
            if earlier.1 < later.0 {
                assert!(earlier.2 <= later.2, "{earlier:?} then {later:?}");
            }
        }
    }
    assert!(acknowledged.iter().any(|write| write.2 == 16));
    assert_eq!(value_of(&store, "winner"), Some(("16".into(), 16)));
}

#[test]
fn a_second_store_cannot_open_the_same_data_directory() {
    let service = ServiceKey::new();
    let (store, dir) = service.store();
    let second = Store::open(dir.path(), service.key.public_key()).unwrap_err();
    assert_eq!(second.kind(), "storage", "{second}");
    drop(store);
    Store::open(dir.path(), service.key.public_key()).unwrap();
}

/// Needs the `bench` feature, which the crate's own dev-dependency on itself turns on.
#[test]
fn the_benchmark_only_unfenced_write_is_never_visible_to_reads() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    store.put_unfenced("report", b"unfenced").unwrap();
    assert_eq!(store.get("report").unwrap(), None);
    store
        .put(
            Some(&service.grant("jobs/nightly", 1, 1)),
            "report",
            b"fenced",
            None,
        )
        .unwrap();
    assert_eq!(value_of(&store, "report"), Some(("fenced".into(), 1)));
}

/// The permission bits of `path`.
#[cfg(unix)]
fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[cfg(unix)]
#[test]
fn the_data_directory_and_the_database_are_owner_only_new_or_found_open() {
    use std::os::unix::fs::PermissionsExt as _;
    let service = ServiceKey::new();
    let parent = tempfile::tempdir().unwrap();

    // A new directory, whatever the umask (the tests' is usually 022).
    let fresh = parent.path().join("fresh");
    drop(Store::open(&fresh, service.key.public_key()).unwrap());
    assert_eq!(mode_of(&fresh), 0o700);
    assert_eq!(mode_of(&fresh.join("store.redb")), 0o600);

    // A store an earlier version left readable by everyone is narrowed when it opens, and its
    // data is still there.
    let found = parent.path().join("found");
    {
        let store = Store::open(&found, service.key.public_key()).unwrap();
        store
            .put(Some(&service.grant("jobs/nightly", 1, 1)), "k", b"v", None)
            .unwrap();
    }
    std::fs::set_permissions(&found, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        found.join("store.redb"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let store = Store::open(&found, service.key.public_key()).unwrap();
    assert_eq!(mode_of(&found), 0o700);
    assert_eq!(mode_of(&found.join("store.redb")), 0o600);
    assert_eq!(value_of(&store, "k"), Some(("v".into(), 1)));
}

/// The request-id tables, as the store names them, to look inside and to make an older store's.
const REQUESTS: redb::TableDefinition<&str, (u64, u64, &[u8])> =
    redb::TableDefinition::new("palisade_store_requests");
const REQUEST_ORDER: redb::TableDefinition<u64, &str> =
    redb::TableDefinition::new("palisade_store_request_order");

/// The keys of the request-id table and of its order table.
fn request_keys(path: &std::path::Path) -> (Vec<String>, Vec<String>) {
    use redb::{ReadableDatabase as _, ReadableTable as _};
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let requests = txn.open_table(REQUESTS).unwrap();
    let order = txn.open_table(REQUEST_ORDER).unwrap();
    (
        requests
            .iter()
            .unwrap()
            .map(|row| row.unwrap().0.value().to_owned())
            .collect(),
        order
            .iter()
            .unwrap()
            .map(|row| row.unwrap().1.value().to_owned())
            .collect(),
    )
}

#[test]
fn the_database_keeps_no_sequencer_only_a_hash_of_it_beside_each_request_id() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let holder = service.grant("jobs/nightly", 5, 1);
    {
        let store = Store::open(dir.path(), service.key.public_key()).unwrap();
        store
            .put(Some(&holder), "counter", b"1", Some("req-1"))
            .unwrap();
    }
    // A sequencer lets whoever reads it write as the holder until the next grant: the file
    // must not hold one. Its signature is the part no one else can make.
    let path = dir.path().join("store.redb");
    let signature = holder.rsplit('.').next().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        !bytes
            .windows(signature.len())
            .any(|window| window == signature.as_bytes()),
        "store.redb holds the holder's sequencer"
    );
    let (requests, order) = request_keys(&path);
    assert_eq!(requests.len(), 1);
    assert_eq!(order, requests);
    assert!(
        requests[0].starts_with("sha256:") && requests[0].ends_with(" req-1"),
        "{requests:?}"
    );

    // The retry after a restart is still recognised by its sequencer and request id.
    let store = Store::open(dir.path(), service.key.public_key()).unwrap();
    let retry = store
        .put(Some(&holder), "counter", b"1", Some("req-1"))
        .unwrap();
    assert!(retry.replayed);
    // The same request id under another grant is another request.
    let other = service.grant("jobs/nightly", 6, 2);
    assert!(
        !store
            .put(Some(&other), "counter", b"2", Some("req-1"))
            .unwrap()
            .replayed
    );
}

#[test]
fn request_ids_an_older_store_kept_under_the_whole_sequencer_are_rehashed_and_still_replay() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let holder = service.grant("jobs/nightly", 5, 1);
    {
        let store = Store::open(dir.path(), service.key.public_key()).unwrap();
        store
            .put(Some(&holder), "counter", b"1", Some("req-1"))
            .unwrap();
        store
            .put(Some(&holder), "counter", b"2", Some("req-2"))
            .unwrap();
    }
    // Turn the file into what an older store wrote: each request keyed "<sequencer> <id>".
    {
        use redb::ReadableTable as _;
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut order = txn.open_table(REQUEST_ORDER).unwrap();
            let mut requests = txn.open_table(REQUESTS).unwrap();
            let rows: Vec<(u64, String)> = order
                .iter()
                .unwrap()
                .map(|row| {
                    let (serial, key) = row.unwrap();
                    (serial.value(), key.value().to_owned())
                })
                .collect();
            for (serial, key) in rows {
                let request_id = key.split_once(' ').unwrap().1.to_owned();
                let legacy = format!("{holder} {request_id}");
                let row = requests.remove(key.as_str()).unwrap().unwrap();
                let (row_serial, fingerprint, ack) = row.value();
                let ack = ack.to_vec();
                drop(row);
                requests
                    .insert(legacy.as_str(), (row_serial, fingerprint, ack.as_slice()))
                    .unwrap();
                order.insert(serial, legacy.as_str()).unwrap();
            }
        }
        txn.commit().unwrap();
    }
    assert!(
        request_keys(&path)
            .0
            .iter()
            .all(|key| key.starts_with("pal"))
    );

    let store = Store::open(dir.path(), service.key.public_key()).unwrap();
    // Both retries are answered with their first outcome, not applied again.
    for (request_id, value) in [("req-1", b"1"), ("req-2", b"2")] {
        let retry = store
            .put(Some(&holder), "counter", value, Some(request_id))
            .unwrap();
        assert!(retry.replayed, "{request_id}");
    }
    assert_eq!(value_of(&store, "counter"), Some(("2".into(), 5)));
    // The fingerprint came along: another request under a kept id is still refused.
    assert_eq!(
        store
            .put(Some(&holder), "counter", b"other", Some("req-1"))
            .unwrap_err()
            .kind(),
        "request_id_reused"
    );
    drop(store);
    let (requests, order) = request_keys(&path);
    assert_eq!(requests.len(), 2);
    assert!(
        requests.iter().all(|key| key.starts_with("sha256:")) && order.len() == 2,
        "{requests:?} {order:?}"
    );
    assert!(order.iter().all(|key| requests.contains(key)));
}

#[test]
fn the_store_counts_what_its_fence_accepted_and_refused_per_lock_with_both_tokens() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let paused = service.grant("jobs/nightly", 7, 3);
        let next = service.grant("jobs/nightly", 9, 4);
        store.put(Some(&paused), "report", b"by 7", None).unwrap();
        store.claim(Some(&next), None).unwrap();
        store.read(Some(&next), "report").unwrap();
        store
            .put(Some(&paused), "report", b"late", None)
            .unwrap_err();
        store.put(None, "report", b"anonymous", None).unwrap_err();
        // Not a fence decision: an invalid key is counted nowhere.
        store.put(Some(&next), "", b"x", None).unwrap_err();
    });
    let jobs = store.fence_stats().get("jobs/nightly").unwrap();
    assert_eq!((jobs.accepted, jobs.refused), (3, 1));
    let stale = jobs.last_refusal.unwrap();
    assert_eq!(
        stale.to_string(),
        "stale sequencer for lock \"jobs/nightly\": token 7 is older than the accepted token 9 (set by session 4); a newer holder has claimed, read or written here, so re-acquire the lock and re-read before writing"
    );
    let unverified = store.fence_stats().get(palisade_fence::UNVERIFIED).unwrap();
    assert_eq!((unverified.accepted, unverified.refused), (0, 1));
    let text = metrics.render();
    for line in [
        "palisade_store_fence_accepted_total{lock=\"jobs/nightly\"} 3",
        "palisade_store_fence_refused_total{lock=\"jobs/nightly\",kind=\"stale\"} 1",
        "palisade_store_fence_refused_total{lock=\"(unverified)\",kind=\"missing\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
}
