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
//! Three faces: the library (`Store`), a real HTTP server on a loopback port, and
//! `palisade store …` (in-process `execute` as in tests/cli.rs, and real child processes where
//! the environment or a SIGKILL matters: this test executable re-runs itself as the child, see
//! [`child_process_entry`], so no binary of another crate is needed).

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use common::{RunningServer, Service, impostor_grant};
use palisade_sequencer::PublicKey;
use palisade_store::cli::{
    EXIT_COMPARE_FAILED, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_STALE, ServeArgs, StoreCommand, execute,
};
use palisade_store::limits::{
    BATCH_BODY_BYTES_MAX, BATCH_OPS_MAX, COMPARES_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX,
};
use palisade_store::{
    BatchOp, BatchRequest, ClaimAck, Compare, Entry, FenceView, OpKind, Store, StoreClient,
    StoreError,
};
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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

// ---------------------------------------------------------------------------------------------
// Library: claims, and what survives a restart
// ---------------------------------------------------------------------------------------------

#[test]
fn lib_a_claim_advances_the_accepted_token_and_changes_nothing_else() {
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
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
async fn http_a_get_with_the_sequencer_header_is_fenced_and_one_without_only_looks() {
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    assert_eq!(
        response
            .headers()
            .get("www-authenticate")
            .map(|value| value.to_str().unwrap().to_owned()),
        Some("Palisade-Sequencer".to_owned())
    );
    let (status, body) = answer(response).await;
    assert_eq!((status, &body["kind"]), (401, &json!("missing")), "{body}");
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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
        stale(5, 7, 2)
    );
    assert_eq!(client.read("none", Some(&new)).await.unwrap(), None);

    let ack = client.claim(Some(LOCK), Some(&newer)).await.unwrap();
    assert_eq!(
        (ack.token, ack.previous_token_max, ack.advanced),
        (8, Some(7), true)
    );
    assert_eq!(
        client.claim(None, Some(&new)).await.unwrap_err(),
        stale(7, 8, 3)
    );
    assert_eq!(
        client.put("a", b"x", Some(&new), None).await.unwrap_err(),
        stale(7, 8, 3)
    );

    // put_if_revision: 0 means create only.
    let at = client.get("a").await.unwrap().unwrap().revision;
    assert!(matches!(
        client
            .put_if_revision("a", b"2", 0, Some(&newer), None)
            .await
            .unwrap_err(),
        StoreError::CompareFailed { revision, .. } if revision == at
    ));
    assert!(matches!(
        client
            .put_if_revision("a", b"2", at + 1, Some(&newer), None)
            .await
            .unwrap_err(),
        StoreError::CompareFailed { .. }
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
// `palisade store …`, in process (as tests/cli.rs)
// ---------------------------------------------------------------------------------------------

/// The `palisade store` part of the command line, as the `palisade` binary nests it.
#[derive(Debug, Parser)]
#[command(name = "palisade-store")]
struct StoreCli {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Debug)]
struct Outcome {
    status: u8,
    stdout: String,
    stderr: String,
}

/// Runs a client subcommand in this process. Pass `--sequencer` explicitly: the environment is
/// shared by all tests of this process (the child-process tests cover `$PALISADE_SEQUENCER`).
async fn palisade_store(args: &[&str]) -> Outcome {
    let cli =
        StoreCli::try_parse_from(std::iter::once("palisade-store").chain(args.iter().copied()))
            .unwrap_or_else(|error| panic!("{args:?}: {error}"));
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let status = execute(cli.command, &mut stdout, &mut stderr).await;
    Outcome {
        status,
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

#[tokio::test]
async fn cli_get_under_a_lock_is_fenced_and_get_unfenced_only_looks() {
    let service = Service::new();
    let server = RunningServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let newest = service.grant(LOCK, 9, 3);
    let put = palisade_store(&["put", "counter", "41", "--sequencer", &old, "--store", url]).await;
    assert_eq!(put.status, 0, "{}", put.stderr);

    let get = palisade_store(&["get", "counter", "--sequencer", &new, "--store", url]).await;
    assert_eq!(
        (get.status, get.stdout.as_str(), get.stderr.as_str()),
        (0, "41\n", "")
    );
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));

    let refused =
        palisade_store(&["put", "counter", "42", "--sequencer", &old, "--store", url]).await;
    assert_eq!(refused.status, EXIT_STALE, "{}", refused.stderr);
    let stale_get = palisade_store(&["get", "counter", "--sequencer", &old, "--store", url]).await;
    assert_eq!(stale_get.status, EXIT_STALE, "{stale_get:?}");
    assert_eq!(stale_get.stdout, "", "a refused read prints no value");
    assert!(
        stale_get.stderr.starts_with(
            "palisade: refused: token 5 for lock \"jobs/nightly\" is stale; the store has accepted token 7 (presented by session 2)"
        ),
        "{}",
        stale_get.stderr
    );
    assert_eq!(
        stale_get.stderr, refused.stderr,
        "the same explanation as a write"
    );

    // --unfenced only looks, even with a newer sequencer at hand.
    let look = palisade_store(&[
        "get",
        "counter",
        "--unfenced",
        "--sequencer",
        &newest,
        "--store",
        url,
    ])
    .await;
    assert_eq!(
        (look.status, look.stdout.as_str()),
        (0, "41\n"),
        "{}",
        look.stderr
    );
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));
    // And so does a get with no sequencer at all.
    let look = palisade_store(&["get", "counter", "--store", url]).await;
    assert_eq!(look.status, 0);
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));

    // A fenced get of an absent key: 5, and the lock advanced anyway.
    let absent = palisade_store(&["get", "nothing", "--sequencer", &newest, "--store", url]).await;
    assert_eq!(absent.status, EXIT_NOT_FOUND, "{absent:?}");
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 9, 3));

    // --json has the revision.
    let json = palisade_store(&[
        "get",
        "counter",
        "--json",
        "--sequencer",
        &newest,
        "--store",
        url,
    ])
    .await;
    assert_eq!(json.status, 0, "{}", json.stderr);
    let entry: Value = serde_json::from_str(&json.stdout).unwrap();
    let revision = client.get("counter").await.unwrap().unwrap().revision;
    assert_eq!(
        (
            &entry["value"],
            &entry["token"],
            &entry["session"],
            &entry["revision"],
            &entry["lock"]
        ),
        (
            &json!("41"),
            &json!(5),
            &json!(1),
            &json!(revision),
            &json!(LOCK)
        ),
        "{entry}"
    );

    // Another lock's sequencer on a fenced get: refused, 1.
    let foreign = palisade_store(&[
        "get",
        "counter",
        "--sequencer",
        &service.grant(OTHER_LOCK, 50, 4),
        "--store",
        url,
    ])
    .await;
    assert_eq!(foreign.status, EXIT_REFUSED, "{foreign:?}");
}

#[tokio::test]
async fn cli_claim_announces_the_grant_and_a_stale_or_missing_claim_is_refused() {
    let service = Service::new();
    let server = RunningServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    assert_eq!(
        palisade_store(&["put", "a", "1", "--sequencer", &old, "--store", url])
            .await
            .status,
        0
    );
    let before = client.get("a").await.unwrap();
    let revision_before = before.as_ref().unwrap().revision;

    let claim = palisade_store(&["claim", LOCK, "--sequencer", &new, "--store", url]).await;
    assert_eq!(claim.status, 0, "{claim:?}");
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));
    assert_eq!(client.get("a").await.unwrap(), before);

    let json =
        palisade_store(&["claim", LOCK, "--json", "--sequencer", &new, "--store", url]).await;
    assert_eq!(json.status, 0, "{json:?}");
    let ack: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        (&ack["advanced"], &ack["previous_token_max"]),
        (&json!(false), &json!(7))
    );

    let stale_claim = palisade_store(&["claim", LOCK, "--sequencer", &old, "--store", url]).await;
    assert_eq!(stale_claim.status, EXIT_STALE, "{stale_claim:?}");
    assert!(
        stale_claim.stderr.starts_with("palisade: refused: token 5"),
        "{}",
        stale_claim.stderr
    );
    let missing = palisade_store(&["claim", LOCK, "--store", url]).await;
    assert_eq!(missing.status, EXIT_REFUSED, "{missing:?}");
    let foreign = palisade_store(&[
        "claim",
        OTHER_LOCK,
        "--sequencer",
        &service.grant(LOCK, 20, 3),
        "--store",
        url,
    ])
    .await;
    assert_eq!(
        foreign.status, EXIT_REFUSED,
        "a claim of another lock than the sequencer's: {foreign:?}"
    );

    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));
    assert_eq!(client.fence(OTHER_LOCK).await.unwrap().token_max, None);
    let put = palisade_store(&["put", "a", "x", "--sequencer", &old, "--store", url]).await;
    assert_eq!(put.status, EXIT_STALE);
    assert_eq!(
        client.get("a").await.unwrap().unwrap().revision,
        revision_before
    );
}

#[tokio::test]
async fn cli_conditional_writes_and_transactions_exit_8_when_a_compare_fails_and_3_when_stale() {
    let service = Service::new();
    let server = RunningServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 9, 2);
    assert_eq!(
        palisade_store(&["put", "counter", "7", "--sequencer", &old, "--store", url])
            .await
            .status,
        0
    );
    let at = client.get("counter").await.unwrap().unwrap().revision;
    let wrong = (at + 1).to_string();
    let right = at.to_string();

    let failed: Vec<Vec<&str>> = vec![
        vec!["put", "counter", "8", "--if-revision", &wrong],
        vec!["put", "counter", "8", "--if-revision", "0"],
        vec!["put", "counter", "8", "--create-only"],
        vec!["delete", "counter", "--if-revision", &wrong],
        vec!["txn", "--if-absent", "counter", "put", "counter", "8"],
        vec!["txn", "--if-exists", "other", "put", "counter", "8"],
        vec!["txn", "--if-value", "counter=6", "put", "counter", "8"],
    ];
    let revision_compare = format!("counter={wrong}");
    let mut failed = failed;
    failed.push(vec![
        "txn",
        "--if-revision",
        &revision_compare,
        "put",
        "counter",
        "8",
        "put",
        "other",
        "o",
    ]);
    for args in &failed {
        let mut full = args.clone();
        full.splice(1..1, ["--sequencer", &new, "--store", url]);
        let outcome = palisade_store(&full).await;
        assert_eq!(outcome.status, EXIT_COMPARE_FAILED, "{args:?}: {outcome:?}");
        assert!(
            outcome.stderr.starts_with("palisade: "),
            "{args:?}: {outcome:?}"
        );
        assert_eq!(outcome.stdout, "", "{args:?}");
    }
    assert_eq!(client.get("counter").await.unwrap().unwrap().value, b"7");
    assert_eq!(client.get("other").await.unwrap(), None);
    assert_eq!(
        client.fence(LOCK).await.unwrap(),
        fence_of(LOCK, 5, 1),
        "failed compares advance nothing"
    );

    // The stale holder: 3, whatever the compare says.
    for args in [
        vec![
            "txn",
            "--if-revision",
            &revision_compare,
            "put",
            "counter",
            "0",
        ],
        vec!["put", "counter", "0", "--create-only"],
    ] {
        // First let 9 write, once, so that 5 is stale.
        if client.fence(LOCK).await.unwrap().token_max == Some(5) {
            let put = palisade_store(&[
                "txn",
                "--sequencer",
                &new,
                "--store",
                url,
                "--if-revision",
                &format!("counter={right}"),
                "put",
                "counter",
                "8",
                "get",
                "counter",
            ])
            .await;
            assert_eq!(put.status, 0, "{put:?}");
        }
        let mut full = args.clone();
        full.splice(1..1, ["--sequencer", &old, "--store", url]);
        let outcome = palisade_store(&full).await;
        assert_eq!(outcome.status, EXIT_STALE, "{args:?}: {outcome:?}");
    }
    assert_eq!(client.get("counter").await.unwrap().unwrap().value, b"8");

    // Compares that hold.
    let at = client.get("counter").await.unwrap().unwrap().revision;
    let ok = palisade_store(&[
        "txn",
        "--sequencer",
        &new,
        "--store",
        url,
        "--if-value",
        "counter=8",
        "--if-absent",
        "other",
        "--if-exists",
        "counter",
        "--if-revision",
        &format!("counter={at}"),
        "put",
        "counter",
        "9",
        "delete",
        "other",
        "get",
        "counter",
    ])
    .await;
    assert_eq!(ok.status, 0, "{ok:?}");
    assert_eq!(client.get("counter").await.unwrap().unwrap().value, b"9");
    let at = client.get("counter").await.unwrap().unwrap().revision;
    let put = palisade_store(&[
        "put",
        "counter",
        "10",
        "--if-revision",
        &at.to_string(),
        "--sequencer",
        &new,
        "--store",
        url,
    ])
    .await;
    assert_eq!(put.status, 0, "{put:?}");
    let create = palisade_store(&[
        "put",
        "fresh",
        "f",
        "--create-only",
        "--sequencer",
        &new,
        "--store",
        url,
    ])
    .await;
    assert_eq!(create.status, 0, "{create:?}");
}

#[tokio::test]
async fn cli_bad_transactions_are_refused_and_apply_nothing() {
    let service = Service::new();
    let server = RunningServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let holder = service.grant(LOCK, 5, 1);
    let newer = service.grant(LOCK, 6, 2);
    assert_eq!(
        palisade_store(&["put", "a", "1", "--sequencer", &holder, "--store", url])
            .await
            .status,
        0
    );
    let long_key = "k".repeat(KEY_BYTES_MAX + 1);
    let bad: Vec<Vec<&str>> = vec![
        vec!["txn", "put", "a", "2", "increment", "a"],
        vec!["txn", "put", "a"],
        vec!["txn", "put", "a", "2", "get"],
        vec!["txn"],
        vec!["txn", "--if-revision", "a=-1", "put", "a", "2"],
        vec![
            "txn",
            "--if-revision",
            "a=99999999999999999999999",
            "put",
            "a",
            "2",
        ],
        vec!["txn", "--if-revision", "a", "put", "a", "2"],
        vec!["txn", "put", "a", "2", "get", &long_key],
    ];
    for args in &bad {
        let mut full = args.clone();
        full.splice(1..1, ["--sequencer", &newer, "--store", url]);
        let Ok(cli) =
            StoreCli::try_parse_from(std::iter::once("palisade-store").chain(full.iter().copied()))
        else {
            continue; // refused by the command line parser: exit 2, nothing sent
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let status = execute(cli.command, &mut stdout, &mut stderr).await;
        let stderr = String::from_utf8(stderr).unwrap();
        assert!(
            status == EXIT_REFUSED || status == 2,
            "{args:?}: exit {status}: {stderr}"
        );
        assert!(stderr.starts_with("palisade: "), "{args:?}: {stderr}");
    }
    assert_eq!(client.get("a").await.unwrap().unwrap().value, b"1");
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 5, 1));
}

// ---------------------------------------------------------------------------------------------
// Real processes: `$PALISADE_SEQUENCER`, and `palisade store serve` killed with SIGKILL
// ---------------------------------------------------------------------------------------------

const CHILD_ROLE_ENV: &str = "PALISADE_READ_SIDE_TEST_CHILD";
const CHILD_ARGS_ENV: &str = "PALISADE_READ_SIDE_TEST_ARGS";
const CHILD_DIR_ENV: &str = "PALISADE_READ_SIDE_TEST_DATA_DIR";
const CHILD_KEY_ENV: &str = "PALISADE_READ_SIDE_TEST_PUBLIC_KEY";
const OUTCOME_PREFIX: &str = "palisade-read-side-outcome ";
const LISTENING_PREFIX: &str = "palisade store: listening on ";
/// No child may take longer than this (a bound, not a timing assertion).
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// The entry point of the child processes: this test executable, run again with
/// `child_process_entry --exact --ignored`, is `palisade store serve` or one client command.
#[test]
#[ignore = "entry point of the child processes the other tests start; does nothing alone"]
fn child_process_entry() {
    match std::env::var(CHILD_ROLE_ENV).as_deref() {
        Ok("serve") => run_serve_child(),
        Ok("cli") => run_cli_child(),
        _ => {}
    }
}

fn run_serve_child() {
    let data_dir = PathBuf::from(std::env::var(CHILD_DIR_ENV).unwrap());
    let public_key = PublicKey::parse(&std::env::var(CHILD_KEY_ENV).unwrap()).unwrap();
    let command = StoreCommand::Serve(ServeArgs {
        data_dir,
        listen: "127.0.0.1:0".parse().unwrap(),
        public_key,
    });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(palisade_store::cli::run(command))
        .unwrap();
}

fn run_cli_child() -> ! {
    let args: Vec<String> = serde_json::from_str(&std::env::var(CHILD_ARGS_ENV).unwrap()).unwrap();
    let parsed = StoreCli::try_parse_from(
        std::iter::once("palisade-store").chain(args.iter().map(String::as_str)),
    );
    let (status, stdout, stderr) = match parsed {
        Err(error) => (2, Vec::new(), error.to_string().into_bytes()),
        Ok(cli) => {
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            let status = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(execute(cli.command, &mut stdout, &mut stderr));
            (status, stdout, stderr)
        }
    };
    let line = json!({
        "status": status,
        "stdout": String::from_utf8_lossy(&stdout),
        "stderr": String::from_utf8_lossy(&stderr),
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{OUTCOME_PREFIX}{line}").unwrap();
    out.flush().unwrap();
    std::process::exit(i32::from(status));
}

/// This executable as a child, with none of the user's palisade variables.
fn child_command(role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "child_process_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE_ENV, role)
        .env_remove("PALISADE_SEQUENCER")
        .env_remove("PALISADE_STORE")
        .env_remove("PALISADE_PUBLIC_KEY")
        .env_remove("PALISADE_STORE_DATA_DIR")
        .env_remove("PALISADE_STORE_LISTEN");
    command
}

/// `palisade store ARGS…` as a process, with `$PALISADE_SEQUENCER` set if given.
fn store_process(args: &[&str], sequencer_env: Option<&str>) -> (Outcome, ExitStatus) {
    let mut command = child_command("cli");
    command
        .env(CHILD_ARGS_ENV, serde_json::to_string(args).unwrap())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(sequencer) = sequencer_env {
        command.env("PALISADE_SEQUENCER", sequencer);
    }
    let mut child = command.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + CHILD_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("palisade store {args:?} did not finish within {CHILD_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let line = out
        .lines()
        .find_map(|line| line.split_once(OUTCOME_PREFIX).map(|(_, outcome)| outcome))
        .unwrap_or_else(|| panic!("{args:?}: no outcome from the child ({status}): {out}\n{err}"));
    let outcome: Value = serde_json::from_str(line).unwrap();
    let outcome = Outcome {
        status: u8::try_from(outcome["status"].as_u64().unwrap()).unwrap(),
        stdout: outcome["stdout"].as_str().unwrap().to_owned(),
        stderr: outcome["stderr"].as_str().unwrap().to_owned(),
    };
    (outcome, status)
}

/// `palisade store serve` as a process on a data directory of the caller's.
struct ServerProcess {
    child: Child,
    url: String,
}

impl ServerProcess {
    fn start(data_dir: &Path, service: &Service) -> ServerProcess {
        let mut child = child_command("serve")
            .env(CHILD_DIR_ENV, data_dir)
            .env(CHILD_KEY_ENV, service.key.public_key().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (lines, received) = mpsc::channel();
        // Reads (and drains) the child's stdout until it ends.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = lines.send(line);
            }
        });
        let deadline = Instant::now() + CHILD_DEADLINE;
        let mut seen = Vec::new();
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match received.recv_timeout(left) {
                Ok(line) => {
                    // libtest may print "test child_process_entry ... " before it.
                    if let Some((_, url)) = line.split_once(LISTENING_PREFIX) {
                        break url.trim().to_owned();
                    }
                    seen.push(line);
                }
                Err(error) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the store did not say where it listens ({error}): {seen:?}");
                }
            }
        };
        ServerProcess { child, url }
    }

    fn kill_9(mut self) {
        self.child.kill().unwrap(); // SIGKILL on Unix
        self.child.wait().unwrap();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn process_palisade_store_get_presents_palisade_sequencer_from_the_environment() {
    let service = Service::new();
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &service);
    let url = server.url.clone();
    let rt = runtime();
    let client = StoreClient::new(&url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let newest = service.grant(LOCK, 9, 3);

    // put reads $PALISADE_SEQUENCER.
    let (put, status) = store_process(&["put", "counter", "41", "--store", &url], Some(&old));
    assert_eq!(put.status, 0, "{put:?}");
    assert_eq!(status.code(), Some(0));

    // get under a lock (the variable set) is fenced.
    let (get, _) = store_process(&["get", "counter", "--store", &url], Some(&new));
    assert_eq!((get.status, get.stdout.as_str()), (0, "41\n"), "{get:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 7, 2)
    );

    // So the older holder is out, for reads too.
    let (stale_put, status) = store_process(&["put", "counter", "42", "--store", &url], Some(&old));
    assert_eq!(stale_put.status, EXIT_STALE, "{stale_put:?}");
    assert_eq!(status.code(), Some(i32::from(EXIT_STALE)));
    let (stale_get, _) = store_process(&["get", "counter", "--store", &url], Some(&old));
    assert_eq!(stale_get.status, EXIT_STALE, "{stale_get:?}");
    assert_eq!(stale_get.stdout, "");

    // --unfenced, and no variable at all, only look.
    let (look, _) = store_process(
        &["get", "counter", "--unfenced", "--store", &url],
        Some(&newest),
    );
    assert_eq!((look.status, look.stdout.as_str()), (0, "41\n"), "{look:?}");
    let (look, _) = store_process(&["get", "counter", "--store", &url], None);
    assert_eq!((look.status, look.stdout.as_str()), (0, "41\n"), "{look:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 7, 2)
    );

    // claim reads the variable too.
    let (claim, _) = store_process(&["claim", LOCK, "--store", &url], Some(&newest));
    assert_eq!(claim.status, 0, "{claim:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 9, 3)
    );
    let (stale_claim, _) = store_process(&["claim", LOCK, "--store", &url], Some(&new));
    assert_eq!(stale_claim.status, EXIT_STALE, "{stale_claim:?}");

    // Read-modify-write as one step: txn takes the sequencer from the environment too.
    let (txn, _) = store_process(
        &[
            "txn",
            "--store",
            &url,
            "--if-value",
            "counter=41",
            "put",
            "counter",
            "42",
        ],
        Some(&newest),
    );
    assert_eq!(txn.status, 0, "{txn:?}");
    assert_eq!(
        rt.block_on(client.get("counter")).unwrap().unwrap().value,
        b"42"
    );
    drop(server);
}

#[test]
fn process_claims_and_fenced_reads_survive_a_sigkill_of_the_store_server() {
    let service = Service::new();
    let dir = tempfile::tempdir().unwrap();
    let old = service.grant(LOCK, 5, 1);
    let reader = service.grant(LOCK, 7, 2);
    let claimer = service.grant(OTHER_LOCK, 11, 3);
    let rt = runtime();

    let server = ServerProcess::start(dir.path(), &service);
    rt.block_on(async {
        let http = Http::new(&server.url);
        assert_eq!(http.put("a", "1", &old, None).await.0, 200);
        let (status, body) = http.get("/v1/kv/a", Some(&reader)).await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = http
            .post("/v1/claim/jobs/hourly", Some(&claimer), vec![])
            .await;
        assert_eq!(status, 200, "{body}");
    });
    server.kill_9();

    for round in 0..2 {
        let server = ServerProcess::start(dir.path(), &service);
        rt.block_on(async {
            let http = Http::new(&server.url);
            assert_eq!(
                http.fence(LOCK).await,
                json!({"lock": LOCK, "token_max": 7, "holder_session": 2}),
                "round {round}"
            );
            assert_eq!(
                http.fence(OTHER_LOCK).await,
                json!({"lock": OTHER_LOCK, "token_max": 11, "holder_session": 3})
            );
            let (status, body) = http.put("a", "x", &old, None).await;
            assert_eq!((status, &body["accepted"]), (409, &json!(7)), "{body}");
            let (status, body) = http.get("/v1/kv/a", Some(&old)).await;
            assert_eq!((status, &body["kind"]), (409, &json!("stale")), "{body}");
            let (status, body) = http
                .post(
                    "/v1/claim/jobs/hourly",
                    Some(&service.grant(OTHER_LOCK, 10, 4)),
                    vec![],
                )
                .await;
            assert_eq!((status, &body["accepted"]), (409, &json!(11)), "{body}");
            assert_eq!(http.value("a").await.unwrap().0, json!("1"));
        });
        server.kill_9();
    }

    // The CLI against a restarted process: a claim there, then SIGKILL, then still refused.
    let server = ServerProcess::start(dir.path(), &service);
    let newer = service.grant(LOCK, 12, 5);
    let (claim, _) = store_process(&["claim", LOCK, "--store", &server.url], Some(&newer));
    assert_eq!(claim.status, 0, "{claim:?}");
    server.kill_9();
    let server = ServerProcess::start(dir.path(), &service);
    let (stale_get, _) = store_process(&["get", "a", "--store", &server.url], Some(&reader));
    assert_eq!(stale_get.status, EXIT_STALE, "{stale_get:?}");
    assert!(
        stale_get.stderr.contains("accepted token 12"),
        "{}",
        stale_get.stderr
    );
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
    let service = std::sync::Arc::new(Service::new());
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
    let service = Service::new();
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
fn process_revisions_keep_growing_after_a_sigkill() {
    let service = Service::new();
    let dir = tempfile::tempdir().unwrap();
    let holder = service.grant(LOCK, 5, 1);
    let rt = runtime();
    let mut last = 0;
    for round in 0..3 {
        let server = ServerProcess::start(dir.path(), &service);
        let client = StoreClient::new(&server.url).unwrap();
        let revision = rt
            .block_on(client.put("a", format!("{round}").as_bytes(), Some(&holder), None))
            .unwrap()
            .revision;
        assert!(
            revision > last,
            "round {round}: revision {revision} after {last}"
        );
        // An If-Match of the revision before the kill must not match a later write.
        if last > 0 {
            let error = rt
                .block_on(client.put_if_revision("a", b"x", last, Some(&holder), None))
                .unwrap_err();
            assert!(
                matches!(error, StoreError::CompareFailed { .. }),
                "{error:?}"
            );
        }
        last = revision;
        server.kill_9();
    }
}

#[test]
fn lib_a_transactions_get_of_another_locks_key_is_refused_like_a_fenced_read() {
    let service = Service::new();
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
    let service = Service::new();
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
    let service = Service::new();
    let server = RunningServer::start(&service).await;
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

#[test]
fn process_get_unfenced_with_a_stale_palisade_sequencer_still_reads() {
    let service = Service::new();
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &service);
    let rt = runtime();
    let client = StoreClient::new(&server.url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    rt.block_on(client.put("a", b"1", Some(&new), None))
        .unwrap();

    let (look, _) = store_process(
        &["get", "a", "--unfenced", "--store", &server.url],
        Some(&old),
    );
    assert_eq!((look.status, look.stdout.as_str()), (0, "1\n"), "{look:?}");
    let (fenced, _) = store_process(&["get", "a", "--store", &server.url], Some(&old));
    assert_eq!(fenced.status, EXIT_STALE, "{fenced:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 7, 2)
    );
}
