//! Adversarial scenarios for the store's read side (issue #9), written from the documentation
//! alone — `docs/store-http.md`, `crates/cli/README.md`, ARCHITECTURE.md (the store section,
//! invariant 11) and the rustdoc of `Store`, `StoreClient` and the types — before reading the
//! implementation:
//!
//! - fenced reads: a read presenting a sequencer is checked like a write and advances the lock's
//!   accepted token, durably, before the value comes back; a read without one only looks;
//! - claims advance the accepted token and nothing else, and survive a restart (reopen, SIGKILL);
//! - revisions and conditional writes; transactions: compares, then ops, all or nothing, and a
//!   stale sequencer wins over a failing compare;
//! - limits and bad input: a clear error, nothing lost.
//!
//! Two faces here: the library (`Store`) and a real HTTP server on a loopback port. The third,
//! `palisade store …` in-process and as child processes, is in `crates/cli/tests/store_read_side.rs`.

use std::time::{Duration, Instant};

use palisade_store::limits::{
    BATCH_BODY_BYTES_MAX, BATCH_OPS_MAX, COMPARES_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX,
};
use palisade_store::{
    BatchOp, BatchRequest, ClaimAck, Compare, Entry, FenceView, OpKind, Store, StoreClient,
    StoreClientError, StoreError,
};
use palisade_testkit::{ServiceKey, StoreServer, impostor_grant};
use serde_json::{Value, json};

const LOCK: &str = "jobs/nightly";
const OTHER_LOCK: &str = "jobs/hourly";
const SEQUENCER: &str = "Palisade-Sequencer";

// ---------------------------------------------------------------------------------------------
// Library helpers
// ---------------------------------------------------------------------------------------------

fn put_op(key: &str, value: &str) -> BatchOp {
    BatchOp::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

fn get_op(key: &str) -> BatchOp {
    BatchOp::Get { key: key.into() }
}

fn delete_op(key: &str) -> BatchOp {
    BatchOp::Delete { key: key.into() }
}

/// The refusal of a superseded grant of [`LOCK`].
fn stale(presented: u64, accepted: u64, holder_session: u64) -> StoreError {
    StoreError::Stale {
        lock: LOCK.into(),
        presented,
        accepted,
        holder_session: Some(holder_session),
    }
}

/// The refusal of token `token` of [`LOCK`] presented by session `presented` where session
/// `first` presented it first: the lock service issued it twice.
fn reissued(token: u64, first: u64, presented: u64) -> StoreError {
    StoreError::TokenReissued {
        lock: LOCK.into(),
        token,
        first_session: first,
        presented_session: presented,
    }
}

fn fence(store: &Store, lock: &str) -> FenceView {
    store.fence_state(lock).unwrap()
}

fn fence_of(lock: &str, token_max: u64, holder_session: u64) -> FenceView {
    FenceView {
        lock: lock.into(),
        token_max: Some(token_max),
        holder_session: Some(holder_session),
    }
}

/// (value, revision) of `key` as an observer sees it.
fn look(store: &Store, key: &str) -> Option<(String, u64)> {
    store
        .get(key)
        .unwrap()
        .map(|entry| (String::from_utf8(entry.value).unwrap(), entry.revision))
}

fn txn(compare: Vec<Compare>, ops: Vec<BatchOp>) -> BatchRequest {
    BatchRequest { compare, ops }
}

fn revision_is(key: &str, revision: u64) -> Compare {
    Compare::Revision {
        key: key.into(),
        revision,
    }
}

// ---------------------------------------------------------------------------------------------
// Library: fenced reads
// ---------------------------------------------------------------------------------------------

#[test]
fn lib_a_newer_holders_fenced_read_shuts_out_the_older_holder_though_it_wrote_nothing() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    store.put(Some(&old), "counter", b"41", None).unwrap();
    let revision = store.revision().unwrap();

    // The newer holder only reads.
    let entry = store
        .read(Some(&new), "counter")
        .unwrap()
        .expect("counter has a value");
    assert_eq!(
        entry,
        Entry {
            key: "counter".into(),
            value: b"41".to_vec(),
            lock: LOCK.into(),
            token: 5,
            session: 1,
            revision,
        },
        "the entry names the grant that wrote the value, not the reader"
    );
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 2));

    // Every kind of request of the older holder is now refused, on any key of the lock.
    assert_eq!(
        store.put(Some(&old), "counter", b"42", None).unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(
        store
            .put(Some(&old), "counter.log", b"x", None)
            .unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(
        store.delete(Some(&old), "counter", None).unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(
        store
            .batch(Some(&old), &[put_op("counter", "42")], None)
            .unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(
        store
            .txn(Some(&old), &txn(vec![], vec![get_op("counter")]), None)
            .unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(
        store.claim(Some(&old), Some(LOCK)).unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(
        store.read(Some(&old), "counter").unwrap_err(),
        stale(5, 7, 2)
    );

    assert_eq!(look(&store, "counter"), Some(("41".into(), revision)));
    assert_eq!(look(&store, "counter.log"), None);
    assert_eq!(store.revision().unwrap(), revision, "nothing was written");
    // The reader, which wrote nothing, may write.
    store.put(Some(&new), "counter", b"42", None).unwrap();
    assert_eq!(look(&store, "counter").unwrap().0, "42");
}

#[test]
fn lib_a_stale_fenced_read_is_refused_with_the_explanation_of_a_stale_write_and_changes_nothing() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let current = service.grant(LOCK, 9, 4);
    let superseded = service.grant(LOCK, 7, 3);
    store.put(Some(&current), "report", b"nine", None).unwrap();
    let revision = store.revision().unwrap();

    let read = store.read(Some(&superseded), "report").unwrap_err();
    let write = store
        .put(Some(&superseded), "report", b"seven", None)
        .unwrap_err();
    assert_eq!(read, stale(7, 9, 4));
    assert_eq!(read, write);
    assert_eq!(read.to_string(), write.to_string());
    assert!(
        read.to_string().starts_with(
            "token 7 for lock \"jobs/nightly\" is stale; the store has accepted token 9 (presented by session 4)"
        ),
        "{read}"
    );
    assert!(read.is_stale() && read.is_rejection());

    // A key with no value is no way around the fence: stale, not "none".
    assert_eq!(
        store.read(Some(&superseded), "never-written").unwrap_err(),
        stale(7, 9, 4)
    );

    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 9, 4));
    assert_eq!(store.revision().unwrap(), revision);
    assert_eq!(look(&store, "report"), Some(("nine".into(), revision)));
}

#[test]
fn lib_a_fenced_read_of_a_key_with_no_value_answers_none_and_still_advances_the_token() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    store.put(Some(&old), "a", b"1", None).unwrap();
    store.put(Some(&old), "gone", b"x", None).unwrap();
    store.delete(Some(&old), "gone", None).unwrap();

    assert_eq!(store.read(Some(&new), "never-written").unwrap(), None);
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 2));
    assert_eq!(
        store.read(Some(&new), "gone").unwrap(),
        None,
        "a tombstone has no value"
    );
    assert_eq!(
        store.put(Some(&old), "a", b"2", None).unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(look(&store, "a").unwrap().0, "1");
}

#[test]
fn lib_a_fenced_read_binds_no_key_only_the_first_fenced_write_does() {
    // store-http.md: "Each key is bound to the lock of its first fenced write."
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let nightly = service.grant(LOCK, 3, 1);
    let hourly = service.grant(OTHER_LOCK, 4, 2);

    assert_eq!(store.read(Some(&nightly), "fresh").unwrap(), None);
    store
        .put(Some(&hourly), "fresh", b"hourly's", None)
        .expect("a read is not a write: the key is still unbound");
    assert!(matches!(
        store.put(Some(&nightly), "fresh", b"x", None).unwrap_err(),
        StoreError::WrongLock { .. }
    ));
}

#[test]
fn lib_a_read_without_a_sequencer_only_looks() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let holder = service.grant(LOCK, 5, 1);
    store.put(Some(&holder), "a", b"1", None).unwrap();
    let (fence_before, revision) = (fence(&store, LOCK), store.revision().unwrap());

    for _ in 0..3 {
        assert_eq!(store.read(None, "a").unwrap(), store.get("a").unwrap());
        assert_eq!(store.read(None, "absent").unwrap(), None);
        assert_eq!(store.get("absent").unwrap(), None);
    }
    assert_eq!(fence(&store, LOCK), fence_before);
    assert_eq!(store.revision().unwrap(), revision);
    // The holder's token is still exactly the accepted one: claiming it changes nothing.
    assert!(!store.claim(Some(&holder), Some(LOCK)).unwrap().advanced);
}

#[test]
fn lib_a_fenced_read_with_a_foreign_forged_or_malformed_sequencer_is_refused_and_advances_nothing()
{
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let owner = service.grant(LOCK, 3, 1);
    store.put(Some(&owner), "k", b"v", None).unwrap();

    let foreign = service.grant(OTHER_LOCK, 9, 2);
    assert_eq!(
        store.read(Some(&foreign), "k").unwrap_err(),
        StoreError::WrongLock {
            key: Some("k".into()),
            expected: LOCK.into(),
            presented: OTHER_LOCK.into(),
        }
    );
    assert_eq!(
        fence(&store, OTHER_LOCK).token_max,
        None,
        "a refused read advances nothing"
    );

    let forged = impostor_grant(LOCK, 100, 9);
    assert!(matches!(
        store.read(Some(&forged), "k").unwrap_err(),
        StoreError::Forged { .. }
    ));
    assert!(matches!(
        store.read(Some("pal1.garbage"), "k").unwrap_err(),
        StoreError::Malformed { .. }
    ));
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 3, 1));
    // The honest holder is not locked out by any of it.
    store.put(Some(&owner), "k", b"w", None).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lib_the_async_read_and_claim_are_fenced_like_the_blocking_ones() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let newer = service.grant(LOCK, 8, 3);
    store.put(Some(&old), "a", b"1", None).unwrap();

    assert_eq!(
        store
            .read_async(Some(&new), "a")
            .await
            .unwrap()
            .unwrap()
            .value,
        b"1"
    );
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 2));
    assert_eq!(
        store.read_async(Some(&old), "a").await.unwrap_err(),
        stale(5, 7, 2)
    );
    let ack = store.claim_async(Some(&newer), Some(LOCK)).await.unwrap();
    assert_eq!((ack.token, ack.previous_token_max), (8, Some(7)));
    assert_eq!(
        store.claim_async(Some(&new), Some(LOCK)).await.unwrap_err(),
        stale(7, 8, 3)
    );
}

#[test]
fn lib_a_token_issued_twice_is_refused_to_the_second_session_for_every_request_even_after_a_restart()
 {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let first = service.grant(LOCK, 7, 1);
    // What a lock service restored from a backup hands out again: token 7, another session.
    let second = service.grant(LOCK, 7, 2);
    let revision = {
        let store = Store::open(dir.path(), service.key.public_key()).unwrap();
        store.put(Some(&first), "report", b"by 1", None).unwrap();
        let revision = store.revision().unwrap();
        let refusals = [
            store
                .put(Some(&second), "report", b"by 2", Some("r-1"))
                .unwrap_err(),
            store
                .put(Some(&second), "other", b"by 2", None)
                .unwrap_err(),
            store.delete(Some(&second), "report", None).unwrap_err(),
            store
                .txn(
                    Some(&second),
                    &txn(
                        vec![revision_is("report", revision)],
                        vec![get_op("report")],
                    ),
                    None,
                )
                .unwrap_err(),
            store.claim(Some(&second), Some(LOCK)).unwrap_err(),
            store.claim(Some(&second), None).unwrap_err(),
            store.read(Some(&second), "report").unwrap_err(),
            store.read(Some(&second), "never-written").unwrap_err(),
        ];
        for refusal in &refusals {
            assert_eq!(refusal, &reissued(7, 1, 2));
            assert!(refusal.is_rejection() && !refusal.is_stale(), "{refusal}");
            assert_eq!(
                (refusal.kind(), refusal.http_status()),
                ("token_reissued", 409)
            );
        }
        assert!(
            refusals[0].to_string().starts_with(
                "token 7 of lock \"jobs/nightly\" was first presented to the store by session 1, and session 2 presents it now: the lock service issued this token twice"
            ),
            "{}",
            refusals[0]
        );
        assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 1));
        assert_eq!(store.revision().unwrap(), revision, "nothing was written");
        revision
    };

    // Reopened, as after a restart: still session 1's, which reads and writes on with token 7.
    let store = Store::open(dir.path(), service.key.public_key()).unwrap();
    assert_eq!(
        store
            .put(Some(&second), "report", b"by 2", None)
            .unwrap_err(),
        reissued(7, 1, 2)
    );
    assert_eq!(look(&store, "report"), Some(("by 1".into(), revision)));
    assert_eq!(look(&store, "other"), None);
    let claimed = store.claim(Some(&first), Some(LOCK)).unwrap();
    assert!(!claimed.advanced);
    assert_eq!(
        store.read(Some(&first), "report").unwrap().unwrap().value,
        b"by 1"
    );
    store
        .put(Some(&first), "report", b"again by 1", None)
        .unwrap();
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 1));
    // The next grant, of any session, advances as before.
    store
        .put(Some(&service.grant(LOCK, 8, 2)), "report", b"by 8", None)
        .unwrap();
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 8, 2));
}

// ---------------------------------------------------------------------------------------------
// Library: claims, and what survives a restart
// ---------------------------------------------------------------------------------------------

#[test]
fn lib_a_claim_advances_the_accepted_token_and_changes_nothing_else() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    store.put(Some(&old), "a", b"1", None).unwrap();
    store.put(Some(&old), "b", b"2", None).unwrap();
    let before = (store.get("a").unwrap(), store.get("b").unwrap());
    let revision = store.revision().unwrap();

    assert_eq!(
        store.claim(Some(&new), Some(LOCK)).unwrap(),
        ClaimAck {
            lock: LOCK.into(),
            token: 7,
            session: 2,
            previous_token_max: Some(5),
            advanced: true,
        }
    );
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 2));
    assert_eq!((store.get("a").unwrap(), store.get("b").unwrap()), before);
    assert_eq!(store.revision().unwrap(), revision, "a claim writes no key");

    // Again with the same grant (and no lock named): nothing changes.
    assert_eq!(
        store.claim(Some(&new), None).unwrap(),
        ClaimAck {
            lock: LOCK.into(),
            token: 7,
            session: 2,
            previous_token_max: Some(7),
            advanced: false,
        }
    );
    // The older grant is shut out of reads, writes and claims.
    assert_eq!(
        store.put(Some(&old), "a", b"x", None).unwrap_err(),
        stale(5, 7, 2)
    );
    assert_eq!(
        store
            .claim(Some(&service.grant(LOCK, 6, 9)), Some(LOCK))
            .unwrap_err(),
        stale(6, 7, 2)
    );
    assert_eq!(
        store.claim(None, Some(LOCK)).unwrap_err(),
        StoreError::Missing
    );

    // The sequencer must be of the named lock; a mismatch claims nothing.
    let mismatch = store
        .claim(Some(&service.grant(LOCK, 9, 3)), Some(OTHER_LOCK))
        .unwrap_err();
    assert!(
        matches!(
            mismatch,
            StoreError::WrongLock { .. } | StoreError::InvalidRequest { .. }
        ),
        "{mismatch:?}"
    );
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 2));
    assert_eq!(fence(&store, OTHER_LOCK).token_max, None);
    assert_eq!((store.get("a").unwrap(), store.get("b").unwrap()), before);
}

#[test]
fn lib_claims_and_fenced_reads_survive_closing_and_reopening_the_store() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let old = service.grant(LOCK, 5, 1);
    let reader = service.grant(LOCK, 7, 2);
    let claimer = service.grant(OTHER_LOCK, 11, 3);
    {
        let store = Store::open(dir.path(), service.key.public_key()).unwrap();
        store.put(Some(&old), "a", b"1", None).unwrap();
        store.read(Some(&reader), "a").unwrap();
        let ack = store.claim(Some(&claimer), Some(OTHER_LOCK)).unwrap();
        assert_eq!((ack.previous_token_max, ack.advanced), (None, true));
    }
    for round in 0..2 {
        let store = Store::open(dir.path(), service.key.public_key()).unwrap();
        assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 2), "round {round}");
        assert_eq!(fence(&store, OTHER_LOCK), fence_of(OTHER_LOCK, 11, 3));
        assert_eq!(
            store.put(Some(&old), "a", b"x", None).unwrap_err(),
            stale(5, 7, 2)
        );
        let older_claimer = service.grant(OTHER_LOCK, 10, 4);
        let refusal = StoreError::Stale {
            lock: OTHER_LOCK.into(),
            presented: 10,
            accepted: 11,
            holder_session: Some(3),
        };
        assert_eq!(
            store
                .claim(Some(&older_claimer), Some(OTHER_LOCK))
                .unwrap_err(),
            refusal
        );
        assert_eq!(store.read(Some(&older_claimer), "b").unwrap_err(), refusal);
        assert!(!store.claim(Some(&claimer), None).unwrap().advanced);
        assert_eq!(look(&store, "a").unwrap().0, "1");
    }
}

// ---------------------------------------------------------------------------------------------
// Library: revisions, compares, transactions
// ---------------------------------------------------------------------------------------------

#[test]
fn lib_every_write_gives_its_keys_a_new_revision_that_reads_return() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let holder = service.grant(LOCK, 5, 1);
    let newer = service.grant(LOCK, 6, 2);
    assert_eq!(store.revision().unwrap(), 0);

    let first = store.put(Some(&holder), "a", b"1", None).unwrap().revision;
    assert!(first > 0);
    assert_eq!(look(&store, "a"), Some(("1".into(), first)));
    let second = store.put(Some(&holder), "b", b"2", None).unwrap().revision;
    assert!(second > first);
    assert_eq!(
        look(&store, "a").unwrap().1,
        first,
        "b's write leaves a alone"
    );

    // One request, one revision, for every key it wrote.
    let batch = store
        .batch(Some(&holder), &[put_op("a", "10"), put_op("c", "30")], None)
        .unwrap()
        .revision;
    assert!(batch > second);
    assert_eq!(look(&store, "a"), Some(("10".into(), batch)));
    assert_eq!(look(&store, "c"), Some(("30".into(), batch)));
    assert_eq!(store.revision().unwrap(), batch);

    // A fenced read returns the revision too.
    assert_eq!(
        store.read(Some(&holder), "c").unwrap().unwrap().revision,
        batch
    );

    // Reads, claims, refusals and transactions of gets only do not move the revision.
    store.read(Some(&newer), "a").unwrap();
    store.claim(Some(&newer), None).unwrap();
    store.put(Some(&holder), "a", b"stale", None).unwrap_err();
    let gets = store
        .txn(Some(&newer), &txn(vec![], vec![get_op("a")]), None)
        .unwrap();
    assert_eq!(gets.revision, batch);
    assert_eq!(store.revision().unwrap(), batch);

    // A delete is a write: a new revision, and the key is back at revision 0.
    let deleted = store.delete(Some(&newer), "b", None).unwrap().revision;
    assert!(deleted > batch);
    assert_eq!(look(&store, "b"), None);
    store
        .txn(
            Some(&newer),
            &txn(vec![revision_is("b", 0)], vec![put_op("b", "again")]),
            None,
        )
        .expect("a deleted key has revision 0");
}

#[test]
fn lib_a_failed_compare_applies_nothing_not_even_the_token_advance() {
    // Store::txn: "A compare that does not hold is CompareFailed, and nothing — not even the
    // token — changed."
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 9, 2);
    let at = store.put(Some(&old), "a", b"1", None).unwrap().revision;

    let cases: Vec<(Vec<Compare>, u64)> = vec![
        (vec![revision_is("a", at + 1)], 0),
        (vec![revision_is("a", 0)], 0),
        (vec![revision_is("a", at), revision_is("z", at)], 1),
        (
            vec![Compare::Value {
                key: "a".into(),
                value: b"2".to_vec(),
            }],
            0,
        ),
        (
            vec![Compare::Value {
                key: "z".into(),
                value: Vec::new(),
            }],
            0,
        ),
        (
            vec![Compare::Exists {
                key: "a".into(),
                exists: false,
            }],
            0,
        ),
        (
            vec![
                Compare::Exists {
                    key: "z".into(),
                    exists: false,
                },
                Compare::Exists {
                    key: "z".into(),
                    exists: true,
                },
            ],
            1,
        ),
        (vec![revision_is("a", u64::MAX)], 0),
    ];
    for (compare, failing) in cases {
        let request = txn(
            compare.clone(),
            vec![put_op("a", "2"), put_op("z", "new"), delete_op("a")],
        );
        let error = store.txn(Some(&new), &request, None).unwrap_err();
        let failing_key = compare[failing as usize].key().to_owned();
        let current = if failing_key == "a" { at } else { 0 };
        assert_eq!(
            error,
            StoreError::CompareFailed {
                compare: failing,
                key: failing_key,
                revision: current,
            },
            "{compare:?}"
        );
        assert_eq!(look(&store, "a"), Some(("1".into(), at)), "{compare:?}");
        assert_eq!(look(&store, "z"), None, "{compare:?}");
        assert_eq!(
            fence(&store, LOCK),
            fence_of(LOCK, 5, 1),
            "{compare:?}: a failed compare must not advance the token"
        );
        assert_eq!(store.revision().unwrap(), at);
    }
    // So the older holder was never shut out.
    store.put(Some(&old), "a", b"still mine", None).unwrap();
}

#[test]
fn lib_a_transaction_compares_then_applies_puts_deletes_and_gets_in_order() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let holder = service.grant(LOCK, 5, 1);
    let at_a = store.put(Some(&holder), "a", b"1", None).unwrap().revision;
    store.put(Some(&holder), "b", b"x", None).unwrap();

    let request = txn(
        vec![
            revision_is("a", at_a),
            Compare::Value {
                key: "b".into(),
                value: b"x".to_vec(),
            },
            Compare::Exists {
                key: "c".into(),
                exists: false,
            },
            Compare::Exists {
                key: "b".into(),
                exists: true,
            },
        ],
        vec![
            get_op("c"),
            put_op("c", "new"),
            get_op("c"),
            delete_op("b"),
            get_op("b"),
            put_op("a", "2"),
            get_op("a"),
        ],
    );
    let ack = store.txn(Some(&holder), &request, None).unwrap();
    let kinds: Vec<(OpKind, &str, bool)> = ack
        .ops
        .iter()
        .map(|op| (op.op, op.key.as_str(), op.existed))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (OpKind::Get, "c", false),
            (OpKind::Put, "c", false),
            (OpKind::Get, "c", true),
            (OpKind::Delete, "b", true),
            (OpKind::Get, "b", false),
            (OpKind::Put, "a", true),
            (OpKind::Get, "a", true),
        ]
    );
    assert_eq!(ack.ops[0].entry, None);
    let seen_c = ack.ops[2]
        .entry
        .clone()
        .expect("the get sees the put before it");
    assert_eq!(
        (seen_c.value.as_slice(), seen_c.revision, seen_c.token),
        (&b"new"[..], ack.revision, 5)
    );
    assert_eq!(ack.ops[4].entry, None, "the get sees the delete before it");
    assert_eq!(ack.ops[6].entry.as_ref().unwrap().value, b"2");

    assert_eq!(look(&store, "a"), Some(("2".into(), ack.revision)));
    assert_eq!(look(&store, "b"), None);
    assert_eq!(look(&store, "c"), Some(("new".into(), ack.revision)));
}

#[test]
fn lib_a_transaction_is_all_or_nothing_when_a_later_operation_is_refused() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let nightly = service.grant(LOCK, 3, 1);
    let newer_nightly = service.grant(LOCK, 6, 2);
    let hourly = service.grant(OTHER_LOCK, 4, 3);
    store.put(Some(&nightly), "mine", b"1", None).unwrap();
    store.put(Some(&hourly), "theirs", b"keep", None).unwrap();
    let revision = store.revision().unwrap();

    let error = store
        .txn(
            Some(&newer_nightly),
            &txn(
                vec![revision_is("mine", revision - 1)],
                vec![
                    put_op("mine", "2"),
                    put_op("new", "n"),
                    get_op("theirs"),
                    delete_op("theirs"),
                ],
            ),
            None,
        )
        .unwrap_err();
    assert!(matches!(error, StoreError::WrongLock { .. }), "{error:?}");

    let too_big = store
        .txn(
            Some(&newer_nightly),
            &txn(
                vec![],
                vec![
                    put_op("mine", "2"),
                    BatchOp::Put {
                        key: "huge".into(),
                        value: vec![0; VALUE_BYTES_MAX + 1],
                    },
                ],
            ),
            None,
        )
        .unwrap_err();
    assert!(
        matches!(&too_big, StoreError::TooLarge { limit, .. } if limit == "value_bytes_max"),
        "{too_big:?}"
    );

    assert_eq!(look(&store, "mine").unwrap().0, "1");
    assert_eq!(look(&store, "new"), None);
    assert_eq!(look(&store, "huge"), None);
    assert_eq!(look(&store, "theirs").unwrap().0, "keep");
    assert_eq!(store.revision().unwrap(), revision);
    assert_eq!(
        fence(&store, LOCK),
        fence_of(LOCK, 3, 1),
        "a refused transaction does not advance the token"
    );
}

#[test]
fn lib_a_stale_sequencer_is_refused_as_stale_even_when_a_compare_also_fails() {
    // store-http.md: "The sequencer is checked first (a stale one is 409 whatever the compares
    // say)".
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let current = service.grant(LOCK, 9, 4);
    let superseded = service.grant(LOCK, 7, 3);
    let at = store.put(Some(&current), "a", b"1", None).unwrap().revision;

    for compare in [
        revision_is("a", at + 100),
        revision_is("a", at),
        Compare::Exists {
            key: "a".into(),
            exists: false,
        },
        Compare::Value {
            key: "a".into(),
            value: b"nope".to_vec(),
        },
    ] {
        let request = txn(vec![compare.clone()], vec![put_op("a", "7's")]);
        assert_eq!(
            store.txn(Some(&superseded), &request, None).unwrap_err(),
            stale(7, 9, 4),
            "{compare:?}"
        );
    }
    assert_eq!(look(&store, "a"), Some(("1".into(), at)));
}

#[test]
fn lib_a_transaction_of_gets_only_is_a_fenced_read() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let at = store.put(Some(&old), "a", b"1", None).unwrap().revision;

    let ack = store
        .txn(
            Some(&new),
            &txn(vec![revision_is("a", at)], vec![get_op("a"), get_op("b")]),
            None,
        )
        .unwrap();
    assert_eq!(ack.revision, at);
    assert_eq!(ack.ops[0].entry.as_ref().unwrap().value, b"1");
    assert_eq!(ack.ops[1].entry, None);
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 7, 2));
    assert_eq!(
        store.put(Some(&old), "a", b"x", None).unwrap_err(),
        stale(5, 7, 2)
    );
}

#[test]
fn lib_transactions_over_their_limits_are_refused_with_the_limit_named_and_nothing_lost() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let at = store.put(Some(&old), "a", b"1", None).unwrap().revision;

    let too_many_ops: Vec<BatchOp> = (0..=BATCH_OPS_MAX)
        .map(|i| put_op(&format!("k{i}"), "v"))
        .collect();
    let too_many_compares: Vec<Compare> = (0..=COMPARES_MAX)
        .map(|i| Compare::Exists {
            key: format!("k{i}"),
            exists: false,
        })
        .collect();
    let long_key = "k".repeat(KEY_BYTES_MAX + 1);
    let cases: Vec<(&str, BatchRequest, &str)> = vec![
        ("too many ops", txn(vec![], too_many_ops), "batch_ops_max"),
        (
            "too many compares",
            txn(too_many_compares, vec![put_op("a", "2")]),
            "",
        ),
        (
            "long key in a compare",
            txn(vec![revision_is(&long_key, 0)], vec![put_op("a", "2")]),
            "key_bytes_max",
        ),
        (
            "long key in a get",
            txn(vec![], vec![put_op("a", "2"), get_op(&long_key)]),
            "key_bytes_max",
        ),
    ];
    for (what, request, limit_name) in cases {
        let error = store.txn(Some(&new), &request, None).unwrap_err();
        match &error {
            StoreError::TooLarge { limit, .. } if limit_name.is_empty() || limit == limit_name => {}
            other => panic!("{what}: expected too_large {limit_name}, got {other:?}"),
        }
        assert_eq!(look(&store, "a"), Some(("1".into(), at)), "{what}");
        assert_eq!(fence(&store, LOCK), fence_of(LOCK, 5, 1), "{what}");
    }

    // An empty transaction and bad keys are invalid requests, not accidents.
    assert!(matches!(
        store
            .txn(Some(&new), &txn(vec![], vec![]), None)
            .unwrap_err(),
        StoreError::InvalidRequest { .. }
    ));
    for bad_key in ["", "a\nb", "tab\there"] {
        let error = store
            .txn(Some(&new), &txn(vec![], vec![get_op(bad_key)]), None)
            .unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidKey { .. }),
            "{bad_key:?}: {error:?}"
        );
        let error = store.read(Some(&new), bad_key).unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidKey { .. }),
            "{bad_key:?}: {error:?}"
        );
    }
    assert!(matches!(
        store.read(Some(&new), &long_key).unwrap_err(),
        StoreError::TooLarge { .. }
    ));
    assert_eq!(fence(&store, LOCK), fence_of(LOCK, 5, 1));
    assert_eq!(look(&store, "a"), Some(("1".into(), at)));
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// Status and JSON body; panics if the body is not JSON ("Every error is JSON").
async fn answer(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("HTTP {status}: body is not JSON: {body:?}"));
    (status, body)
}

struct Http {
    http: reqwest::Client,
    url: String,
}

impl Http {
    fn new(url: &str) -> Http {
        Http {
            http: reqwest::Client::new(),
            url: url.to_owned(),
        }
    }

    async fn get(&self, path: &str, sequencer: Option<&str>) -> (u16, Value) {
        let mut request = self.http.get(format!("{}{path}", self.url));
        if let Some(sequencer) = sequencer {
            request = request.header(SEQUENCER, sequencer);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn put(
        &self,
        key: &str,
        value: &str,
        sequencer: &str,
        condition: Option<(&str, &str)>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .put(format!("{}/v1/kv/{key}", self.url))
            .header(SEQUENCER, sequencer)
            .body(value.to_owned());
        if let Some((name, value)) = condition {
            request = request.header(name, value);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn delete(
        &self,
        key: &str,
        sequencer: &str,
        condition: Option<(&str, &str)>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .delete(format!("{}/v1/kv/{key}", self.url))
            .header(SEQUENCER, sequencer);
        if let Some((name, value)) = condition {
            request = request.header(name, value);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn post(&self, path: &str, sequencer: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body);
        if let Some(sequencer) = sequencer {
            request = request.header(SEQUENCER, sequencer);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn post_json(&self, path: &str, sequencer: Option<&str>, body: &Value) -> (u16, Value) {
        self.post(path, sequencer, serde_json::to_vec(body).unwrap())
            .await
    }

    async fn fence(&self, lock: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/fence/{lock}"), None).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn value(&self, key: &str) -> Option<(Value, Value)> {
        let (status, body) = self.get(&format!("/v1/kv/{key}"), None).await;
        match status {
            200 => Some((body["value"].clone(), body["revision"].clone())),
            404 => None,
            _ => panic!("GET {key}: {status} {body}"),
        }
    }
}

#[tokio::test]
async fn http_a_token_issued_twice_is_refused_with_409_token_reissued_and_both_sessions() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let first = service.grant(LOCK, 7, 1);
    let second = service.grant(LOCK, 7, 2);
    let (status, ack) = http.put("report", "by 1", &first, None).await;
    assert_eq!(status, 200, "{ack}");

    let expected = json!({"kind": "token_reissued", "lock": LOCK, "token": 7,
                          "first_session": 1, "presented_session": 2});
    let (status, write) = http.put("report", "by 2", &second, None).await;
    let (read_status, read) = http.get("/v1/kv/report", Some(&second)).await;
    let (claim_status, claim) = http
        .post(&format!("/v1/claim/{LOCK}"), Some(&second), Vec::new())
        .await;
    for (status, body) in [
        (status, &write),
        (read_status, &read),
        (claim_status, &claim),
    ] {
        assert_eq!(status, 409, "{body}");
        let mut fields = body.clone();
        let message = fields.as_object_mut().unwrap().remove("message").unwrap();
        assert_eq!(fields, expected);
        assert!(
            message
                .as_str()
                .unwrap()
                .contains("issued this token twice"),
            "{message}"
        );
    }
    // The Rust client parses it back into the same error.
    let client = StoreClient::new(&server.url).unwrap();
    assert_eq!(
        client.read("report", Some(&second)).await.unwrap_err(),
        StoreClientError::Store(reissued(7, 1, 2))
    );
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 7, "holder_session": 1})
    );
    assert_eq!(http.value("report").await.unwrap().0, json!("by 1"));
}

#[tokio::test]
async fn http_a_get_with_the_sequencer_header_is_fenced_and_one_without_only_looks() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let newest = service.grant(LOCK, 9, 3);
    let (status, ack) = http.put("counter", "41", &old, None).await;
    assert_eq!(status, 200, "{ack}");
    let revision = ack["revision"].clone();

    // Without the header: it only looks.
    let (status, looked) = http.get("/v1/kv/counter", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 5, "holder_session": 1})
    );

    // With the header: the same entry comes back, and the lock has moved on.
    let (status, fenced) = http.get("/v1/kv/counter", Some(&new)).await;
    assert_eq!(status, 200, "{fenced}");
    assert_eq!(fenced, looked);
    assert_eq!(
        fenced,
        json!({"key": "counter", "value": "41", "lock": LOCK, "token": 5, "session": 1,
               "revision": revision})
    );
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 7, "holder_session": 2})
    );

    // The old holder's write is refused, and its read is refused with the same explanation.
    let (status, refused_write) = http.put("counter", "42", &old, None).await;
    assert_eq!(status, 409, "{refused_write}");
    assert_eq!(
        (
            &refused_write["kind"],
            &refused_write["lock"],
            &refused_write["presented"],
            &refused_write["accepted"],
            &refused_write["holder_session"],
        ),
        (
            &json!("stale"),
            &json!(LOCK),
            &json!(5),
            &json!(7),
            &json!(2)
        )
    );
    let (status, refused_read) = http.get("/v1/kv/counter", Some(&old)).await;
    assert_eq!(status, 409, "{refused_read}");
    assert_eq!(refused_read, refused_write);
    let (status, refused_raw) = http.get("/v1/kv/counter?format=raw", Some(&old)).await;
    assert_eq!(
        (status, &refused_raw["kind"]),
        (409, &json!("stale")),
        "a raw read with the header is a fenced read too"
    );

    // A fenced read of a key with no value is 404, and still advances the lock.
    let (status, missing) = http.get("/v1/kv/nothing", Some(&newest)).await;
    assert_eq!((status, &missing["kind"]), (404, &json!("not_found")));
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 9, "holder_session": 3})
    );
    let (status, body) = http.put("counter", "42", &new, None).await;
    assert_eq!((status, &body["accepted"]), (409, &json!(9)));

    assert_eq!(
        http.value("counter").await,
        Some((json!("41"), revision)),
        "nothing of the refused writes landed"
    );
}

#[tokio::test]
async fn http_a_fenced_get_with_a_malformed_forged_or_foreign_sequencer_is_refused_and_advances_nothing()
 {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let owner = service.grant(LOCK, 3, 1);
    assert_eq!(http.put("k", "v", &owner, None).await.0, 200);

    let (status, body) = http.get("/v1/kv/k", Some("pal1.garbage")).await;
    assert_eq!(
        (status, &body["kind"]),
        (400, &json!("malformed")),
        "{body}"
    );
    let (status, body) = http
        .get("/v1/kv/k", Some(&impostor_grant(LOCK, 100, 9)))
        .await;
    assert_eq!((status, &body["kind"]), (403, &json!("forged")), "{body}");
    let (status, body) = http
        .get("/v1/kv/k", Some(&service.grant(OTHER_LOCK, 9, 2)))
        .await;
    assert_eq!(
        (
            status,
            &body["kind"],
            &body["key"],
            &body["expected"],
            &body["presented"]
        ),
        (
            403,
            &json!("wrong_lock"),
            &json!("k"),
            &json!(LOCK),
            &json!(OTHER_LOCK)
        ),
        "{body}"
    );

    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 3, "holder_session": 1})
    );
    assert_eq!(
        http.fence(OTHER_LOCK).await,
        json!({"lock": OTHER_LOCK, "token_max": null, "holder_session": null})
    );
    assert_eq!(http.put("k", "w", &owner, None).await.0, 200);
}

#[tokio::test]
async fn http_a_claim_advances_the_accepted_token_and_changes_nothing_else() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let old = service.grant(LOCK, 5, 1);
    assert_eq!(http.put("a", "1", &old, None).await.0, 200);
    let (_, before) = http.get("/v1/kv/a", None).await;

    // The lock name contains '/': raw in the path, as for keys and /v1/fence.
    let (status, ack) = http
        .post(
            "/v1/claim/jobs/nightly",
            Some(&service.grant(LOCK, 7, 2)),
            vec![],
        )
        .await;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(
        (
            &ack["lock"],
            &ack["token"],
            &ack["session"],
            &ack["previous_token_max"],
            &ack["advanced"]
        ),
        (&json!(LOCK), &json!(7), &json!(2), &json!(5), &json!(true)),
        "{ack}"
    );
    assert_eq!(
        http.get("/v1/kv/a", None).await.1,
        before,
        "a claim writes no key"
    );
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 7, "holder_session": 2})
    );

    // Percent-encoded works too; claiming the accepted token again changes nothing.
    let (status, again) = http
        .post(
            "/v1/claim/jobs%2Fnightly",
            Some(&service.grant(LOCK, 7, 2)),
            vec![],
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (&again["previous_token_max"], &again["advanced"]),
        (&json!(7), &json!(false))
    );

    // The older holder is out.
    let (status, body) = http.put("a", "x", &old, None).await;
    assert_eq!((status, &body["accepted"]), (409, &json!(7)), "{body}");

    // A stale claim, a missing sequencer, another lock's sequencer: refused, nothing moves.
    let (status, body) = http
        .post(
            "/v1/claim/jobs/nightly",
            Some(&service.grant(LOCK, 6, 9)),
            vec![],
        )
        .await;
    assert_eq!(
        (status, &body["kind"], &body["presented"], &body["accepted"]),
        (409, &json!("stale"), &json!(6), &json!(7)),
        "{body}"
    );
    let response = http
        .http
        .post(format!("{}/v1/claim/jobs/nightly", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers().get("www-authenticate"), None);
    let (status, body) = answer(response).await;
    assert_eq!((status, &body["kind"]), (428, &json!("missing")), "{body}");
    let (status, body) = http
        .post(
            "/v1/claim/jobs/hourly",
            Some(&service.grant(LOCK, 20, 3)),
            vec![],
        )
        .await;
    assert!(
        (400..500).contains(&status) && body["kind"].is_string(),
        "a claim of another lock than the sequencer's: {status} {body}"
    );
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 7, "holder_session": 2})
    );
    assert_eq!(
        http.fence(OTHER_LOCK).await["token_max"],
        Value::Null,
        "{body}"
    );
    assert_eq!(http.get("/v1/kv/a", None).await.1, before);

    // A claim is a POST.
    let (status, body) = http
        .get("/v1/claim/jobs/nightly", Some(&service.grant(LOCK, 7, 2)))
        .await;
    assert_eq!(
        (status, &body["kind"]),
        (405, &json!("method_not_allowed")),
        "{body}"
    );
}

#[tokio::test]
async fn http_if_match_and_if_none_match_write_only_when_the_condition_holds() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 9, 2);
    let (_, ack) = http.put("a", "1", &old, None).await;
    let at = ack["revision"].as_u64().unwrap();

    // The ETag of a raw read is the revision of the JSON read.
    let raw = http
        .http
        .get(format!("{}/v1/kv/a?format=raw", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.headers()["etag"], format!("\"{at}\"").as_str());
    assert_eq!(raw.headers()["palisade-revision"], at.to_string().as_str());

    // A condition that does not hold: 412, nothing applied — not even the token advance.
    let wrong = format!("\"{}\"", at + 1);
    for (name, value) in [
        ("If-Match", wrong.as_str()),
        ("If-Match", "\"0\""),
        ("If-None-Match", "*"),
    ] {
        let (status, body) = http.put("a", "2", &new, Some((name, value))).await;
        assert_eq!(
            (
                status,
                &body["kind"],
                &body["compare"],
                &body["key"],
                &body["revision"]
            ),
            (
                412,
                &json!("compare_failed"),
                &json!(0),
                &json!("a"),
                &json!(at)
            ),
            "{name}: {value}: {body}"
        );
        let (status, body) = http.delete("a", &new, Some((name, value))).await;
        assert_eq!(
            (status, &body["kind"]),
            (412, &json!("compare_failed")),
            "{body}"
        );
    }
    assert_eq!(http.value("a").await, Some((json!("1"), json!(at))));
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 5, "holder_session": 1}),
        "a failed condition applies nothing, the token advance included"
    );

    // Conditions that hold.
    let (status, body) = http
        .put("a", "2", &old, Some(("If-Match", &format!("\"{at}\""))))
        .await;
    assert_eq!(status, 200, "{body}");
    let at2 = body["revision"].as_u64().unwrap();
    assert!(at2 > at);
    let (status, body) = http
        .put("b", "new", &old, Some(("If-None-Match", "*")))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http
        .put("c", "new", &old, Some(("If-Match", "\"0\"")))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http
        .put("b", "again", &old, Some(("If-None-Match", "*")))
        .await;
    assert_eq!((status, &body["kind"]), (412, &json!("compare_failed")));
    assert_eq!(http.value("b").await.unwrap().0, json!("new"));

    // A delete at the right revision.
    let (status, body) = http
        .delete("a", &old, Some(("If-Match", &format!("\"{at2}\""))))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(http.value("a").await, None);
    // Now absent: create-only works again.
    let (status, body) = http.put("a", "3", &old, Some(("If-None-Match", "*"))).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn http_bad_if_match_headers_are_a_clear_400_and_nothing_is_applied() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let holder = service.grant(LOCK, 5, 1);
    let newer = service.grant(LOCK, 6, 2);
    let (_, ack) = http.put("a", "1", &holder, None).await;
    let at = ack["revision"].clone();

    for bad in [
        "\"-1\"",
        "\"abc\"",
        "\"18446744073709551616\"",
        "\"99999999999999999999999999\"",
        "\"\"",
        "\"1\", \"2\"",
        // If-Match compares strongly (RFC 9110 §13.1.1): a weak tag never matches.
        "W/\"1\"",
    ] {
        let (status, body) = http.put("a", "2", &newer, Some(("If-Match", bad))).await;
        assert_eq!(status, 400, "If-Match: {bad}: {body}");
        assert!(
            body["message"].is_string() && body["kind"].is_string(),
            "{body}"
        );
    }
    assert_eq!(http.value("a").await, Some((json!("1"), at)));
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 5, "holder_session": 1})
    );
}

#[tokio::test]
async fn http_a_transaction_compares_then_applies_all_or_nothing_and_a_stale_sequencer_wins() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 9, 2);
    let (_, ack) = http.put("counter", "7", &old, None).await;
    let at = ack["revision"].as_u64().unwrap();

    // Compare on revision, value and existence; put, delete and get, in order.
    let request = json!({
        "compare": [{"key": "counter", "revision": at},
                    {"key": "counter", "value": "7"},
                    {"key": "other", "exists": false}],
        "ops": [{"op": "put", "key": "counter", "value": "8"},
                {"op": "get", "key": "counter"},
                {"op": "put", "key": "other", "value_base64": "AAE="},
                {"op": "delete", "key": "other"},
                {"op": "get", "key": "other"}]
    });
    let (status, body) = http.post_json("/v1/txn", Some(&old), &request).await;
    assert_eq!(status, 200, "{body}");
    let ops = body["ops"].as_array().unwrap();
    assert_eq!(ops.len(), 5, "{body}");
    assert_eq!(ops[1]["entry"]["value"], json!("8"), "{body}");
    assert!(ops[4].get("entry").is_none_or(Value::is_null), "{body}");
    let at2 = body["revision"].as_u64().unwrap();
    assert_eq!(http.value("counter").await, Some((json!("8"), json!(at2))));

    // The same request again: the revision compare no longer holds; 412 and nothing applied.
    let (status, body) = http.post_json("/v1/txn", Some(&new), &request).await;
    assert_eq!(
        (
            status,
            &body["kind"],
            &body["compare"],
            &body["key"],
            &body["revision"]
        ),
        (
            412,
            &json!("compare_failed"),
            &json!(0),
            &json!("counter"),
            &json!(at2)
        ),
        "{body}"
    );
    assert_eq!(http.value("counter").await, Some((json!("8"), json!(at2))));
    assert_eq!(
        http.fence(LOCK).await["token_max"],
        json!(5),
        "a failed compare does not advance the token"
    );

    // /v1/batch is the same thing, read-set included.
    let (status, body) = http
        .post_json(
            "/v1/batch",
            Some(&new),
            &json!({"compare": [{"key": "counter", "value": "7"}],
                    "ops": [{"op": "put", "key": "counter", "value": "100"}]}),
        )
        .await;
    assert_eq!(
        (status, &body["kind"]),
        (412, &json!("compare_failed")),
        "{body}"
    );
    let (status, body) = http
        .post_json(
            "/v1/batch",
            Some(&new),
            &json!({"compare": [{"key": "counter", "value": "8"}],
                    "ops": [{"op": "put", "key": "counter", "value": "9"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Now 9 has written; 5 is stale, and stale wins whatever the compares say.
    for compare in [
        json!([{"key": "counter", "revision": 1_000_000}]),
        json!([{"key": "counter", "value": "9"}]),
        json!([]),
    ] {
        let (status, body) = http
            .post_json(
                "/v1/txn",
                Some(&old),
                &json!({"compare": compare, "ops": [{"op": "put", "key": "counter", "value": "0"}]}),
            )
            .await;
        assert_eq!(
            (status, &body["kind"], &body["presented"], &body["accepted"]),
            (409, &json!("stale"), &json!(5), &json!(9)),
            "{compare}: {body}"
        );
    }
    assert_eq!(http.value("counter").await.unwrap().0, json!("9"));
}

#[tokio::test]
async fn http_bad_transactions_get_a_clear_error_and_nothing_is_lost() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 9, 2);
    let (_, ack) = http.put("a", "1", &old, None).await;
    let at = ack["revision"].clone();
    let ops = json!([{"op": "put", "key": "a", "value": "2"}]);

    let invalid: Vec<(&str, Vec<u8>)> = vec![
        ("not JSON", b"{\"ops\": [".to_vec()),
        ("not an object", b"[1, 2]".to_vec()),
        ("empty body", Vec::new()),
        (
            "unknown compare kind",
            serde_json::to_vec(&json!({"compare": [{"key": "a", "lease": 3}], "ops": ops}))
                .unwrap(),
        ),
        (
            "compare of no kind",
            serde_json::to_vec(&json!({"compare": [{"key": "a"}], "ops": ops})).unwrap(),
        ),
        (
            "compare of two kinds",
            serde_json::to_vec(
                &json!({"compare": [{"key": "a", "revision": 1, "exists": true}], "ops": ops}),
            )
            .unwrap(),
        ),
        (
            "negative revision",
            serde_json::to_vec(&json!({"compare": [{"key": "a", "revision": -1}], "ops": ops}))
                .unwrap(),
        ),
        (
            "revision beyond u64",
            format!(
                r#"{{"compare": [{{"key": "a", "revision": 18446744073709551616}}], "ops": {ops}}}"#
            )
            .into_bytes(),
        ),
        (
            "fractional revision",
            format!(r#"{{"compare": [{{"key": "a", "revision": 1.5}}], "ops": {ops}}}"#)
                .into_bytes(),
        ),
        (
            "revision as a string",
            serde_json::to_vec(&json!({"compare": [{"key": "a", "revision": "1"}], "ops": ops}))
                .unwrap(),
        ),
        (
            "exists not a bool",
            serde_json::to_vec(&json!({"compare": [{"key": "a", "exists": 1}], "ops": ops}))
                .unwrap(),
        ),
        (
            "unknown op",
            serde_json::to_vec(&json!({"ops": [{"op": "increment", "key": "a"}]})).unwrap(),
        ),
        (
            "get with a value",
            serde_json::to_vec(&json!({"ops": [{"op": "get", "key": "a", "value": "x"}]})).unwrap(),
        ),
        (
            "put without a value",
            serde_json::to_vec(&json!({"ops": [{"op": "put", "key": "a"}]})).unwrap(),
        ),
        (
            "bad base64",
            serde_json::to_vec(&json!({"ops": [{"op": "put", "key": "a", "value_base64": "!!"}]}))
                .unwrap(),
        ),
        (
            "unknown top-level field",
            serde_json::to_vec(&json!({"ops": ops, "read_set": ["a"]})).unwrap(),
        ),
        ("no ops", serde_json::to_vec(&json!({"ops": []})).unwrap()),
    ];
    for (what, body) in invalid {
        for path in ["/v1/txn", "/v1/batch"] {
            let (status, answer) = http.post(path, Some(&new), body.clone()).await;
            assert_eq!(
                (status, &answer["kind"]),
                (400, &json!("invalid_request")),
                "{path}: {what}: {answer}"
            );
            assert!(answer["message"].is_string(), "{answer}");
        }
    }

    // A compare of a bad key.
    let (status, body) = http
        .post_json(
            "/v1/txn",
            Some(&new),
            &json!({"compare": [{"key": "", "exists": true}], "ops": ops}),
        )
        .await;
    assert_eq!(
        (status, &body["kind"]),
        (400, &json!("invalid_key")),
        "{body}"
    );
    let (status, body) = http
        .post_json(
            "/v1/txn",
            Some(&new),
            &json!({"compare": [{"key": "k".repeat(KEY_BYTES_MAX + 1), "exists": true}], "ops": ops}),
        )
        .await;
    assert_eq!(
        (status, &body["kind"], &body["limit"]),
        (413, &json!("too_large"), &json!("key_bytes_max")),
        "{body}"
    );

    // Limits: ops, compares, body size.
    let many_ops: Vec<Value> = (0..=BATCH_OPS_MAX)
        .map(|i| json!({"op": "get", "key": format!("k{i}")}))
        .collect();
    let (status, body) = http
        .post_json("/v1/txn", Some(&new), &json!({"ops": many_ops}))
        .await;
    assert_eq!(
        (status, &body["kind"], &body["limit"]),
        (413, &json!("too_large"), &json!("batch_ops_max")),
        "{body}"
    );
    let many_compares: Vec<Value> = (0..=COMPARES_MAX)
        .map(|i| json!({"key": format!("k{i}"), "exists": false}))
        .collect();
    let (status, body) = http
        .post_json(
            "/v1/txn",
            Some(&new),
            &json!({"compare": many_compares, "ops": ops}),
        )
        .await;
    assert_eq!(
        (status, &body["kind"]),
        (413, &json!("too_large")),
        "{body}"
    );
    assert!(
        body["limit"].is_string() && body["size_max"].is_u64(),
        "{body}"
    );
    let huge =
        json!({"ops": [{"op": "put", "key": "a", "value": "x".repeat(BATCH_BODY_BYTES_MAX)}]});
    let (status, body) = http.post_json("/v1/txn", Some(&new), &huge).await;
    assert_eq!(
        (status, &body["kind"], &body["limit"]),
        (413, &json!("too_large"), &json!("batch_body_bytes_max")),
        "{body}"
    );

    // A revision compare that is valid JSON but can never hold.
    let (status, body) = http
        .post_json(
            "/v1/txn",
            Some(&new),
            &json!({"compare": [{"key": "a", "revision": u64::MAX}], "ops": ops}),
        )
        .await;
    assert_eq!(
        (status, &body["kind"]),
        (412, &json!("compare_failed")),
        "{body}"
    );

    // Nothing lost, nothing advanced.
    assert_eq!(http.value("a").await, Some((json!("1"), at)));
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 5, "holder_session": 1})
    );
    // And the server still serves.
    assert_eq!(http.get("/healthz", None).await.0, 200);
}

#[tokio::test]
async fn http_oversized_keys_and_values_on_the_read_side_are_413_naming_the_limit() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let holder = service.grant(LOCK, 5, 1);
    let newer = service.grant(LOCK, 6, 2);
    assert_eq!(http.put("a", "1", &holder, None).await.0, 200);
    let long_key = "k".repeat(KEY_BYTES_MAX + 1);

    for sequencer in [None, Some(newer.as_str())] {
        let (status, body) = http.get(&format!("/v1/kv/{long_key}"), sequencer).await;
        assert_eq!(
            (status, &body["kind"], &body["limit"]),
            (413, &json!("too_large"), &json!("key_bytes_max")),
            "{sequencer:?}: {body}"
        );
        let (status, body) = http.get("/v1/kv/a%01b", sequencer).await;
        assert_eq!(
            (status, &body["kind"]),
            (400, &json!("invalid_key")),
            "{body}"
        );
    }
    let (status, body) = http
        .put(
            "a",
            &"x".repeat(VALUE_BYTES_MAX + 1),
            &newer,
            Some(("If-None-Match", "*")),
        )
        .await;
    assert_eq!(
        (status, &body["kind"], &body["limit"]),
        (413, &json!("too_large"), &json!("value_bytes_max")),
        "{body}"
    );
    assert_eq!(
        http.fence(LOCK).await,
        json!({"lock": LOCK, "token_max": 5, "holder_session": 1})
    );
    assert_eq!(http.value("a").await.unwrap().0, json!("1"));
}

#[tokio::test]
async fn client_read_and_claim_are_fenced_and_get_only_looks() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let client = StoreClient::new(&server.url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let newer = service.grant(LOCK, 8, 3);
    client.put("a", b"1", Some(&old), None).await.unwrap();

    assert_eq!(client.get("a").await.unwrap().unwrap().value, b"1");
    assert_eq!(client.read("a", None).await.unwrap().unwrap().value, b"1");
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 5, 1));

    let entry = client.read("a", Some(&new)).await.unwrap().unwrap();
    assert_eq!((entry.value.as_slice(), entry.token), (&b"1"[..], 5));
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));
    assert_eq!(
        client.read("a", Some(&old)).await.unwrap_err(),
        StoreClientError::Store(stale(5, 7, 2))
    );
    assert_eq!(client.read("none", Some(&new)).await.unwrap(), None);

    let ack = client.claim(Some(LOCK), Some(&newer)).await.unwrap();
    assert_eq!(
        (ack.token, ack.previous_token_max, ack.advanced),
        (8, Some(7), true)
    );
    assert_eq!(
        client.claim(None, Some(&new)).await.unwrap_err(),
        StoreClientError::Store(stale(7, 8, 3))
    );
    assert_eq!(
        client.put("a", b"x", Some(&new), None).await.unwrap_err(),
        StoreClientError::Store(stale(7, 8, 3))
    );

    // put_if_revision: 0 means create only.
    let at = client.get("a").await.unwrap().unwrap().revision;
    assert!(matches!(
        client
            .put_if_revision("a", b"2", 0, Some(&newer), None)
            .await
            .unwrap_err(),
        StoreClientError::Store(StoreError::CompareFailed { revision, .. }) if revision == at
    ));
    assert!(matches!(
        client
            .put_if_revision("a", b"2", at + 1, Some(&newer), None)
            .await
            .unwrap_err(),
        StoreClientError::Store(StoreError::CompareFailed { .. })
    ));
    client
        .put_if_revision("a", b"2", at, Some(&newer), None)
        .await
        .unwrap();
    client
        .put_if_revision("fresh", b"f", 0, Some(&newer), None)
        .await
        .unwrap();
    assert_eq!(client.get("a").await.unwrap().unwrap().value, b"2");
}

// ---------------------------------------------------------------------------------------------
// Harder edges: races with the group commit, revision reuse, request ids, odd transactions
// ---------------------------------------------------------------------------------------------

/// Rounds of the race below; each is bounded in writes too.
const RACE_ROUNDS: u64 = 20;
const RACE_WRITERS: u64 = 6;
const RACE_WRITES_PER_WRITER_MAX: u64 = 200;

#[test]
fn lib_no_write_of_the_older_grant_lands_after_a_newer_grants_fenced_read_returns() {
    // Invariant 11: once the newer holder's read has returned, nothing of an older grant lands.
    // The newer holder never writes, so the value it read must be the final value.
    let service = std::sync::Arc::new(ServiceKey::new());
    let (store, _dir) = service.store();
    let store = std::sync::Arc::new(store);
    for round in 0..RACE_ROUNDS {
        let lock = format!("race/{round}");
        let key = format!("counter/{round}");
        let old = service.grant(&lock, 10, 1);
        let new = service.grant(&lock, 20, 2);
        store.put(Some(&old), &key, b"start", None).unwrap();
        let landed = std::sync::atomic::AtomicU64::new(0);
        let seen = std::thread::scope(|scope| {
            for writer in 0..RACE_WRITERS {
                let (store, old, key, landed) = (&store, &old, &key, &landed);
                scope.spawn(move || {
                    for i in 0..RACE_WRITES_PER_WRITER_MAX {
                        let value = format!("w{writer}.{i}");
                        match store.put(Some(old), key, value.as_bytes(), None) {
                            Ok(_) => {
                                landed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Err(StoreError::Stale { .. }) => return,
                            Err(other) => panic!("unexpected refusal: {other:?}"),
                        }
                    }
                });
            }
            // Let some writes land first (bounded), then read under the newer grant, by a
            // fenced read in even rounds and a transaction's get in odd ones.
            let deadline = Instant::now() + Duration::from_secs(30);
            while landed.load(std::sync::atomic::Ordering::Relaxed) < 3 && Instant::now() < deadline
            {
                std::thread::yield_now();
            }
            if round % 2 == 0 {
                store.read(Some(&new), &key).unwrap().unwrap().value
            } else {
                let ack = store
                    .txn(Some(&new), &txn(vec![], vec![get_op(&key)]), None)
                    .unwrap();
                ack.ops[0].entry.clone().unwrap().value
            }
        });
        let last = store.get(&key).unwrap().unwrap().value;
        assert_eq!(
            String::from_utf8_lossy(&last),
            String::from_utf8_lossy(&seen),
            "round {round}: an older grant's write landed after the newer grant's read returned"
        );
    }
}

#[test]
fn lib_revisions_are_never_reused_across_deletes_and_restarts_so_if_match_cannot_be_fooled() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let holder = service.grant(LOCK, 5, 1);
    let (first, after_delete) = {
        let store = Store::open(dir.path(), service.key.public_key()).unwrap();
        let first = store.put(Some(&holder), "a", b"1", None).unwrap().revision;
        store.delete(Some(&holder), "a", None).unwrap();
        let again = store.put(Some(&holder), "a", b"1", None).unwrap().revision;
        assert_ne!(
            again, first,
            "delete and re-create gives a new revision (ABA)"
        );
        store
            .txn(
                Some(&holder),
                &txn(vec![revision_is("a", first)], vec![put_op("a", "2")]),
                None,
            )
            .unwrap_err();
        (first, store.revision().unwrap())
    };
    let store = Store::open(dir.path(), service.key.public_key()).unwrap();
    assert_eq!(
        store.revision().unwrap(),
        after_delete,
        "the revision survives a reopen"
    );
    let next = store.put(Some(&holder), "b", b"x", None).unwrap().revision;
    assert!(
        next > after_delete && next > first,
        "{next} after {after_delete}"
    );
}

#[test]
fn lib_a_transactions_get_of_another_locks_key_is_refused_like_a_fenced_read() {
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let nightly = service.grant(LOCK, 3, 1);
    let hourly = service.grant(OTHER_LOCK, 4, 2);
    store.put(Some(&hourly), "theirs", b"keep", None).unwrap();

    let read = store.read(Some(&nightly), "theirs").unwrap_err();
    assert!(matches!(read, StoreError::WrongLock { .. }), "{read:?}");
    let in_txn = store
        .txn(Some(&nightly), &txn(vec![], vec![get_op("theirs")]), None)
        .unwrap_err();
    assert_eq!(
        in_txn, read,
        "a get in a transaction is fenced like a fenced read"
    );

    // A tombstone keeps the binding: a fenced read of a deleted key of another lock is refused.
    store.put(Some(&hourly), "gone", b"x", None).unwrap();
    store.delete(Some(&hourly), "gone", None).unwrap();
    let error = store.read(Some(&nightly), "gone").unwrap_err();
    assert!(matches!(error, StoreError::WrongLock { .. }), "{error:?}");
    assert_eq!(fence(&store, LOCK).token_max, None);
}

#[test]
fn lib_a_request_id_replays_only_the_same_transaction_not_one_with_other_compares() {
    // store-http.md: a retry with the same sequencer and request id returns the original answer;
    // 422 request_id_reused if the id "was used with this sequencer for a different write".
    let service = ServiceKey::new();
    let (store, _dir) = service.store();
    let holder = service.grant(LOCK, 5, 1);
    let at = store.put(Some(&holder), "a", b"1", None).unwrap().revision;

    let first = txn(vec![revision_is("a", at)], vec![put_op("a", "2")]);
    let ack = store.txn(Some(&holder), &first, Some("rid-1")).unwrap();
    assert!(!ack.replayed);
    let retry = store.txn(Some(&holder), &first, Some("rid-1")).unwrap();
    assert!(retry.replayed);
    assert_eq!(retry.revision, ack.revision);

    // Same ops, another condition: a different request, not a replay of the first.
    let other = txn(vec![revision_is("a", at + 1000)], vec![put_op("a", "2")]);
    let error = store.txn(Some(&holder), &other, Some("rid-1")).unwrap_err();
    assert_eq!(
        error,
        StoreError::RequestIdReused {
            request_id: "rid-1".into()
        }
    );

    // A request refused by its compare is not remembered: the same id can be used once it holds.
    let now = store.get("a").unwrap().unwrap().revision;
    let guarded = txn(vec![revision_is("a", now + 1)], vec![put_op("a", "3")]);
    assert!(matches!(
        store
            .txn(Some(&holder), &guarded, Some("rid-2"))
            .unwrap_err(),
        StoreError::CompareFailed { .. }
    ));
    let fixed = txn(vec![revision_is("a", now)], vec![put_op("a", "3")]);
    let ack = store.txn(Some(&holder), &fixed, Some("rid-2")).unwrap();
    assert!(!ack.replayed);
    assert_eq!(look(&store, "a").unwrap().0, "3");
}

#[tokio::test]
async fn http_an_accepted_transaction_of_compares_only_is_fenced_like_any_other() {
    // The doc does not say whether a transaction with compares and no operations is allowed
    // ("empty batch" is invalid). If it is accepted, WriteAck says the token it was accepted with
    // is "now at most the lock's accepted maximum": the token advanced.
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = Http::new(&server.url);
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 9, 2);
    let (_, ack) = http.put("a", "1", &old, None).await;
    let at = ack["revision"].clone();

    let (status, body) = http
        .post_json(
            "/v1/txn",
            Some(&new),
            &json!({"compare": [{"key": "a", "revision": at}], "ops": []}),
        )
        .await;
    match status {
        400 => assert_eq!(body["kind"], json!("invalid_request"), "{body}"),
        200 => {
            assert_eq!(body["token"], json!(9), "{body}");
            assert_eq!(
                http.fence(LOCK).await["token_max"],
                json!(9),
                "accepted under token 9, yet the lock's accepted maximum did not reach 9"
            );
            let (status, refused) = http.put("a", "x", &old, None).await;
            assert_eq!(status, 409, "{refused}");
        }
        _ => panic!("{status} {body}"),
    }
    assert_eq!(http.value("a").await, Some((json!("1"), at)));
}
