//! Per-lock quotas (`--lock-keys-max`, `--lock-bytes-max`): a lock's keys cannot grow past
//! them, a write that does not grow them always passes, the count survives a restart, and
//! concurrent writers of one lock cannot pass a quota together.

use std::sync::Arc;

use palisade_store::{BatchOp, LockQuota, Store, StoreError, StoreOptions};
use palisade_testkit::ServiceKey;

const LOCK: &str = "jobs/nightly";
const OTHER_LOCK: &str = "jobs/hourly";

fn open(service: &ServiceKey, dir: &std::path::Path, quota: LockQuota) -> Store {
    Store::open_with(
        dir,
        service.key.public_key(),
        StoreOptions {
            bindings: None,
            quota,
        },
    )
    .expect("store opens")
}

fn quota_reached(quota: &str, used: u64, quota_max: u64) -> StoreError {
    StoreError::QuotaReached {
        lock: LOCK.into(),
        quota: quota.into(),
        used,
        quota_max,
    }
}

#[test]
fn a_lock_cannot_hold_more_live_keys_than_its_quota_but_may_overwrite_and_delete() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let quota = LockQuota {
        keys_max: Some(2),
        bytes_max: None,
    };
    let store = open(&service, dir.path(), quota);
    let holder = service.grant(LOCK, 1, 1);
    store.put(Some(&holder), "a", b"1", None).unwrap();
    store.put(Some(&holder), "b", b"2", None).unwrap();

    let refused = store.put(Some(&holder), "c", b"3", None).unwrap_err();
    assert_eq!(refused, quota_reached("keys", 3, 2));
    assert_eq!(refused.http_status(), 507);
    assert!(
        refused.to_string().contains("nothing was applied"),
        "{refused}"
    );
    assert_eq!(
        store.get("c").unwrap(),
        None,
        "a refused write wrote nothing"
    );

    // Writes that do not add a key pass at the quota: an overwrite, a batch that deletes one
    // key and adds another.
    store.put(Some(&holder), "a", b"10", None).unwrap();
    store
        .batch(
            Some(&holder),
            &[
                BatchOp::Delete { key: "b".into() },
                BatchOp::Put {
                    key: "c".into(),
                    value: b"3".to_vec(),
                },
            ],
            None,
        )
        .unwrap();
    assert_eq!(store.get("c").unwrap().unwrap().value, b"3");
    // A batch that adds two keys in one go is refused whole.
    store.delete(Some(&holder), "c", None).unwrap();
    let refused = store
        .batch(
            Some(&holder),
            &[
                BatchOp::Put {
                    key: "d".into(),
                    value: b"4".to_vec(),
                },
                BatchOp::Put {
                    key: "e".into(),
                    value: b"5".to_vec(),
                },
            ],
            None,
        )
        .unwrap_err();
    assert_eq!(refused, quota_reached("keys", 3, 2));
    assert_eq!(store.get("d").unwrap(), None);

    // Another lock has a quota of its own.
    let other = service.grant(OTHER_LOCK, 1, 2);
    store.put(Some(&other), "x", b"1", None).unwrap();
    store.put(Some(&other), "y", b"1", None).unwrap();

    // Counted again from the database after a restart.
    drop(store);
    let store = open(&service, dir.path(), quota);
    store.put(Some(&holder), "f", b"6", None).unwrap();
    assert_eq!(
        store.put(Some(&holder), "g", b"7", None).unwrap_err(),
        quota_reached("keys", 3, 2)
    );
    store.delete(Some(&holder), "a", None).unwrap();
    store.put(Some(&holder), "g", b"7", None).unwrap();
}

#[test]
fn a_locks_bytes_count_its_key_names_deleted_ones_included_and_its_live_values() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let quota = LockQuota {
        keys_max: None,
        bytes_max: Some(20),
    };
    let store = open(&service, dir.path(), quota);
    let holder = service.grant(LOCK, 1, 1);
    // "a" + 10 bytes: 11.
    store.put(Some(&holder), "a", &[b'x'; 10], None).unwrap();
    assert_eq!(
        store
            .put(Some(&holder), "b", &[b'x'; 10], None)
            .unwrap_err(),
        quota_reached("bytes", 22, 20)
    );
    // A shorter value frees bytes; a longer one takes them, up to the quota.
    store.put(Some(&holder), "a", &[b'x'; 2], None).unwrap();
    store.put(Some(&holder), "b", &[b'x'; 10], None).unwrap();
    assert_eq!(
        store.put(Some(&holder), "a", &[b'x'; 9], None).unwrap_err(),
        quota_reached("bytes", 21, 20)
    );
    // A delete frees the value but not the name, which its tombstone keeps.
    store.delete(Some(&holder), "b", None).unwrap();
    store.put(Some(&holder), "a", &[b'x'; 17], None).unwrap();
    assert_eq!(
        store.put(Some(&holder), "cc", &[], None).unwrap_err(),
        quota_reached("bytes", 21, 20)
    );

    drop(store);
    let store = open(&service, dir.path(), quota);
    assert_eq!(
        store
            .put(Some(&holder), "a", &[b'x'; 19], None)
            .unwrap_err(),
        quota_reached("bytes", 21, 20)
    );
}

#[test]
fn concurrent_writers_of_one_lock_cannot_pass_its_quota_together() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let quota = LockQuota {
        keys_max: Some(5),
        bytes_max: None,
    };
    let store = Arc::new(open(&service, dir.path(), quota));
    let holder = service.grant(LOCK, 1, 1);
    let writers: Vec<_> = (0..16)
        .map(|i| {
            let store = store.clone();
            let holder = holder.clone();
            std::thread::spawn(move || store.put(Some(&holder), &format!("k{i}"), b"v", None))
        })
        .collect();
    let outcomes: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let written = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(written, 5, "{outcomes:?}");
    for outcome in outcomes {
        if let Err(error) = outcome {
            assert!(
                matches!(error, StoreError::QuotaReached { ref quota, .. } if quota == "keys"),
                "{error}"
            );
        }
    }
    let live = (0..16)
        .filter(|i| store.get(&format!("k{i}")).unwrap().is_some())
        .count();
    assert_eq!(live, 5);
}

#[test]
fn a_quota_lowered_below_what_a_lock_holds_lets_it_shrink_but_not_grow() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let store = open(&service, dir.path(), LockQuota::default());
    let holder = service.grant(LOCK, 1, 1);
    for key in ["a", "b", "c"] {
        store.put(Some(&holder), key, b"1", None).unwrap();
    }
    drop(store);
    let quota = LockQuota {
        keys_max: Some(1),
        bytes_max: None,
    };
    let store = open(&service, dir.path(), quota);
    assert_eq!(
        store.put(Some(&holder), "d", b"1", None).unwrap_err(),
        quota_reached("keys", 4, 1)
    );
    store.put(Some(&holder), "a", b"2", None).unwrap();
    store.delete(Some(&holder), "b", None).unwrap();
    assert_eq!(
        store.put(Some(&holder), "b", b"1", None).unwrap_err(),
        quota_reached("keys", 3, 1)
    );
}
