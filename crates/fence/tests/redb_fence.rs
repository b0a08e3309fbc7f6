//! Scenarios for the redb fence: the accepted token commits with the data, survives a restart,
//! and racing writers are applied in token order.

mod common;

use std::sync::Arc;

use common::{assert_nondecreasing, forged_text, grant, public_keys, reissued, shuffled};
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, RedbFence, verify_presented};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

const DATA: TableDefinition<&str, u64> = TableDefinition::new("data");
const LOG: TableDefinition<u64, u64> = TableDefinition::new("applied_tokens");

fn write_value(fence: &RedbFence, token: u64, session: u64) -> Result<(), FenceError> {
    let fenced = fence.begin(&grant("report", token, session), "reports")?;
    {
        let mut data = fenced.txn().open_table(DATA).unwrap();
        data.insert("value", token).unwrap();
        let mut log = fenced.txn().open_table(LOG).unwrap();
        let next = log.len().unwrap();
        log.insert(next, token).unwrap();
    }
    fenced.commit()
}

fn read_value(fence: &RedbFence) -> Option<u64> {
    let txn = fence.database().begin_read().unwrap();
    let table = txn.open_table(DATA).ok()?;
    table.get("value").unwrap().map(|value| value.value())
}

#[test]
fn the_accepted_token_survives_a_restart_and_an_old_token_is_refused_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fenced.redb");
    {
        let fence = RedbFence::open(&path).unwrap();
        write_value(&fence, 4, 1).unwrap();
        write_value(&fence, 7, 2).unwrap();
    }

    // Restart: reopen the file and replay the superseded holder's write.
    let fence = RedbFence::open(&path).unwrap();
    let state = fence.fence_state("reports").unwrap().unwrap();
    assert_eq!(
        (state.lock.as_str(), state.token_max, state.holder_session),
        ("report", Token::new(7), SessionId::new(2))
    );
    let err = write_value(&fence, 4, 1).unwrap_err();
    assert_eq!(
        err,
        FenceError::Stale {
            lock: "report".into(),
            presented: Token::new(4),
            accepted: Token::new(7),
            holder_session: Some(SessionId::new(2))
        }
    );
    assert_eq!(read_value(&fence), Some(7));
    write_value(&fence, 7, 2).unwrap();
}

#[test]
fn a_token_issued_twice_is_refused_from_the_second_session_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fenced.redb");
    {
        let fence = RedbFence::open(&path).unwrap();
        write_value(&fence, 9, 1).unwrap();
        // A lock service restored from a backup grants token 9 again, to session 2.
        assert_eq!(
            write_value(&fence, 9, 2).unwrap_err(),
            reissued("report", 9, 1, 2)
        );
    }
    let fence = RedbFence::open(&path).unwrap();
    let state = fence.fence_state("reports").unwrap().unwrap();
    assert_eq!(
        (state.token_max, state.holder_session),
        (Token::new(9), SessionId::new(1))
    );
    assert_eq!(
        write_value(&fence, 9, 2).unwrap_err(),
        reissued("report", 9, 1, 2)
    );
    let applied = {
        let txn = fence.database().begin_read().unwrap();
        txn.open_table(LOG).unwrap().len().unwrap()
    };
    assert_eq!(applied, 1, "nothing of session 2 was written");
    // Session 1 writes on with token 9.
    write_value(&fence, 9, 1).unwrap();
    assert_eq!(
        fence
            .fence_state("reports")
            .unwrap()
            .unwrap()
            .holder_session,
        SessionId::new(1)
    );
}

#[test]
fn an_aborted_transaction_does_not_advance_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let fence = RedbFence::open(dir.path().join("fenced.redb")).unwrap();
    write_value(&fence, 3, 1).unwrap();

    let fenced = fence.begin(&grant("report", 9, 2), "reports").unwrap();
    fenced
        .txn()
        .open_table(DATA)
        .unwrap()
        .insert("value", 9)
        .unwrap();
    assert_eq!(fenced.previous().unwrap().token_max, Token::new(3));
    drop(fenced); // the caller gave up: the write and the advance both vanish

    assert_eq!(
        fence.fence_state("reports").unwrap().unwrap().token_max,
        Token::new(3)
    );
    assert_eq!(read_value(&fence), Some(3));
    write_value(&fence, 4, 3).unwrap();
}

#[test]
fn scopes_are_bound_to_one_lock_and_forgeries_never_reach_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let fence = RedbFence::open(dir.path().join("fenced.redb")).unwrap();
    write_value(&fence, 5, 1).unwrap();

    let err = fence
        .begin(&grant("other-lock", 1000, 9), "reports")
        .unwrap_err();
    assert_eq!(
        err,
        FenceError::WrongLock {
            expected: "report".into(),
            presented: "other-lock".into()
        }
    );
    let forged = verify_presented(Some(&forged_text("report", 1 << 62)), &public_keys());
    assert_eq!(forged.unwrap_err().kind(), "forged");

    // Honest writers are not locked out.
    write_value(&fence, 6, 2).unwrap();
    assert_eq!(
        fence.fence_state("reports").unwrap().unwrap().token_max,
        Token::new(6)
    );

    // A fence expecting one lock refuses others even in a fresh scope.
    let strict = RedbFence::open(dir.path().join("strict.redb"))
        .unwrap()
        .expecting_lock("x");
    assert!(
        strict
            .begin(&grant("report", 1, 1), "fresh")
            .unwrap_err()
            .is_wrong_lock()
    );
    assert!(fence.begin(&grant("report", 6, 2), "").unwrap_err().kind() == "invalid_scope");
}

#[test]
fn racing_writers_commit_in_token_order_and_the_highest_token_wins() {
    const WRITERS: usize = 4;
    const TOKENS: u64 = 120;
    let dir = tempfile::tempdir().unwrap();
    let fence = Arc::new(RedbFence::open(dir.path().join("race.redb")).unwrap());
    let tokens = shuffled((1..=TOKENS).collect(), 7);

    let handles: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let fence = Arc::clone(&fence);
            let mine: Vec<u64> = tokens
                .iter()
                .copied()
                .skip(writer)
                .step_by(WRITERS)
                .collect();
            std::thread::spawn(move || {
                for token in mine {
                    match write_value(&fence, token, writer as u64) {
                        Ok(()) => {}
                        Err(FenceError::Stale {
                            presented,
                            accepted,
                            ..
                        }) => {
                            assert!(presented == Token::new(token) && accepted > Token::new(token));
                        }
                        Err(other) => panic!("unexpected error {other}"),
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }

    let txn = fence.database().begin_read().unwrap();
    let log = txn.open_table(LOG).unwrap();
    let applied: Vec<u64> = log
        .iter()
        .unwrap()
        .map(|entry| entry.unwrap().1.value())
        .collect();
    assert_nondecreasing(&applied);
    assert_eq!(applied.last(), Some(&TOKENS));
    assert_eq!(read_value(&fence), Some(TOKENS));
}
