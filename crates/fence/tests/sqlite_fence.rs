//! Scenarios for the SQLite fence with real database files.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{assert_nondecreasing, forged_text, grant, public_keys, reissued, shuffled};
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, LockBinding, sqlite, verify_presented};
use rusqlite::Connection;

const SCOPE: &str = "reports";

/// A connection to an existing database, as each racing writer opens its own.
fn connect(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn
}

/// Opens (creating if needed) the database with the fence and the user's tables.
fn open(path: &Path) -> Connection {
    let conn = connect(path);
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    sqlite::ensure_schema(&conn).unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS applied (id INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER);
         CREATE TABLE IF NOT EXISTS value (k TEXT PRIMARY KEY, token INTEGER);",
    )
    .unwrap();
    conn
}

fn fenced_write(
    conn: &mut Connection,
    lock: &str,
    token: u64,
    session: u64,
) -> Result<(), FenceError> {
    let txn = sqlite::begin(conn)?;
    sqlite::claim(&txn, SCOPE, &grant(lock, token, session))?;
    txn.execute("INSERT INTO applied (token) VALUES (?1)", [token as i64])
        .unwrap();
    txn.execute(
        "INSERT OR REPLACE INTO value (k, token) VALUES ('v', ?1)",
        [token as i64],
    )
    .unwrap();
    txn.commit().unwrap();
    Ok(())
}

fn value(conn: &Connection) -> Option<i64> {
    conn.query_row("SELECT token FROM value WHERE k = 'v'", [], |row| {
        row.get(0)
    })
    .ok()
}

#[test]
fn after_reopening_the_file_a_replayed_old_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fenced.sqlite");
    {
        let mut conn = open(&path);
        fenced_write(&mut conn, "report", 2, 1).unwrap();
        fenced_write(&mut conn, "report", 5, 2).unwrap();
    }

    let mut conn = open(&path);
    let err = fenced_write(&mut conn, "report", 2, 1).unwrap_err();
    assert_eq!(
        err,
        FenceError::Stale {
            lock: "report".into(),
            presented: Token::new(2),
            accepted: Token::new(5),
            holder_session: Some(SessionId::new(2))
        }
    );
    assert_eq!(value(&conn), Some(5));
    fenced_write(&mut conn, "report", 5, 2).unwrap();
}

#[test]
fn a_token_issued_twice_is_refused_from_the_second_session_and_the_first_writes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fenced.sqlite");
    let mut conn = open(&path);
    // Sessions above i64::MAX are stored bit for bit as negative integers: compare them too.
    let (first, second) = (u64::MAX - 1, 7);
    fenced_write(&mut conn, "report", 5, first).unwrap();
    let before = sqlite::fence_state(&conn, SCOPE).unwrap();

    // A lock service restored from a backup grants token 5 again, to another session.
    for presented in [second, u64::MAX] {
        let err = fenced_write(&mut conn, "report", 5, presented).unwrap_err();
        assert_eq!(err, reissued("report", 5, first, presented));
    }
    drop(conn);
    let mut conn = open(&path);
    assert_eq!(sqlite::fence_state(&conn, SCOPE).unwrap(), before);
    let applied: i64 = conn
        .query_row("SELECT count(*) FROM applied", [], |row| row.get(0))
        .unwrap();
    assert_eq!(applied, 1, "nothing of the second session was written");

    // The first session writes on with token 5; a newer token advances as before.
    fenced_write(&mut conn, "report", 5, first).unwrap();
    assert_eq!(sqlite::fence_state(&conn, SCOPE).unwrap(), before);
    fenced_write(&mut conn, "report", 6, second).unwrap();
}

#[test]
fn a_rolled_back_transaction_takes_the_token_advance_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open(&dir.path().join("fenced.sqlite"));
    fenced_write(&mut conn, "report", 2, 1).unwrap();

    let txn = sqlite::begin(&mut conn).unwrap();
    sqlite::claim(&txn, SCOPE, &grant("report", 40, 2)).unwrap();
    drop(txn);

    assert_eq!(
        sqlite::fence_state(&conn, SCOPE)
            .unwrap()
            .unwrap()
            .token_max,
        Token::new(2)
    );
    fenced_write(&mut conn, "report", 3, 3).unwrap();
}

#[test]
fn foreign_locks_and_forgeries_are_refused_and_honest_writers_continue() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open(&dir.path().join("fenced.sqlite"));
    fenced_write(&mut conn, "report", 5, 1).unwrap();

    let err = fenced_write(&mut conn, "other", 1000, 9).unwrap_err();
    assert_eq!(
        err,
        FenceError::WrongLock {
            expected: "report".into(),
            presented: "other".into()
        }
    );
    let forged = verify_presented(Some(&forged_text("report", 1 << 62)), &public_keys());
    assert_eq!(forged.unwrap_err().kind(), "forged");
    let txn = sqlite::begin(&mut conn).unwrap();
    let err = sqlite::claim_expecting(&txn, "fresh", &grant("x", 1, 1), LockBinding::Expect("y"))
        .unwrap_err();
    assert!(err.is_wrong_lock());
    drop(txn);

    fenced_write(&mut conn, "report", 6, 2).unwrap();
    assert_eq!(value(&conn), Some(6));
}

#[test]
fn racing_connections_commit_in_token_order_and_the_highest_token_wins() {
    const WRITERS: usize = 4;
    const TOKENS: u64 = 120;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.sqlite");
    drop(open(&path));
    let tokens = shuffled((1..=TOKENS).collect(), 3);

    let handles: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let path = path.clone();
            let mine: Vec<u64> = tokens
                .iter()
                .copied()
                .skip(writer)
                .step_by(WRITERS)
                .collect();
            std::thread::spawn(move || {
                let mut conn = connect(&path);
                for token in mine {
                    match fenced_write(&mut conn, "race", token, writer as u64) {
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

    let conn = open(&path);
    let mut statement = conn
        .prepare("SELECT token FROM applied ORDER BY id")
        .unwrap();
    let applied: Vec<u64> = statement
        .query_map([], |row| row.get::<_, i64>(0))
        .unwrap()
        .map(|token| token.unwrap() as u64)
        .collect();
    assert_nondecreasing(&applied);
    assert_eq!(applied.last(), Some(&TOKENS));
    assert_eq!(value(&conn), Some(TOKENS as i64));
}

fn read_counter(conn: &Connection) -> i64 {
    conn.query_row("SELECT n FROM counter WHERE k = 'c'", [], |row| row.get(0))
        .unwrap()
}

fn open_with_counter(path: &Path) -> Connection {
    let conn = open(path);
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS counter (k TEXT PRIMARY KEY, n INTEGER NOT NULL);
         INSERT OR IGNORE INTO counter VALUES ('c', 5);",
    )
    .unwrap();
    conn
}

/// Holder A (token 10) reads the counter, B (token 11) reads it, A writes back its increment,
/// B writes back its own, each step its own transaction. Returns the counter at the end and
/// what A's write came to.
fn two_increments(claim_reads: bool) -> (i64, Result<(), FenceError>) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open_with_counter(&dir.path().join("counter.sqlite"));
    let (a, b) = (grant("counter", 10, 1), grant("counter", 11, 2));
    let mut read_step = |holder| {
        let txn = sqlite::begin(&mut conn).unwrap();
        if claim_reads {
            sqlite::claim(&txn, SCOPE, holder).unwrap();
        }
        let seen = read_counter(&txn);
        txn.commit().unwrap();
        seen
    };
    let seen_by_a = read_step(&a);
    // A pauses past its lease here; B is granted the lock.
    let seen_by_b = read_step(&b);
    let mut write_step = |holder, value: i64| -> Result<(), FenceError> {
        let txn = sqlite::begin(&mut conn).unwrap();
        sqlite::claim(&txn, SCOPE, holder)?;
        txn.execute("UPDATE counter SET n = ?1 WHERE k = 'c'", [value])
            .unwrap();
        txn.commit().unwrap();
        Ok(())
    };
    let written_by_a = write_step(&a, seen_by_a + 1);
    write_step(&b, seen_by_b + 1).unwrap();
    (read_counter(&conn), written_by_a)
}

#[test]
fn a_claim_before_reading_refuses_the_superseded_holders_write_back() {
    let (value, written_by_a) = two_increments(true);
    assert_eq!(
        written_by_a.unwrap_err(),
        FenceError::Stale {
            lock: "counter".into(),
            presented: Token::new(10),
            accepted: Token::new(11),
            holder_session: Some(SessionId::new(2))
        },
        "B claimed before reading, so A's write back is refused"
    );
    assert_eq!(value, 6, "only B's increment, made from what B read");
}

#[test]
fn reads_without_a_claim_let_a_superseded_holder_lose_an_update() {
    // Why claims come before reads: the same two holders, claiming only to write.
    let (value, written_by_a) = two_increments(false);
    assert!(written_by_a.is_ok(), "no newer grant had claimed yet");
    assert_eq!(value, 6, "two increments of 5, and one was lost");
}

#[test]
fn racing_claimers_read_modify_write_and_lose_no_increment() {
    const CLAIMERS: usize = 4;
    const TOKENS: u64 = 80;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claimers.sqlite");
    drop(open_with_counter(&path));
    let tokens = shuffled((1..=TOKENS).collect(), 5);

    let handles: Vec<_> = (0..CLAIMERS)
        .map(|claimer| {
            let path = path.clone();
            let mine: Vec<u64> = tokens
                .iter()
                .copied()
                .skip(claimer)
                .step_by(CLAIMERS)
                .collect();
            std::thread::spawn(move || {
                let mut conn = connect(&path);
                let mut committed = 0i64;
                for token in mine {
                    let txn = sqlite::begin(&mut conn).unwrap();
                    match sqlite::claim(&txn, SCOPE, &grant("c", token, claimer as u64)) {
                        Ok(()) => {}
                        Err(FenceError::Stale { accepted, .. }) => {
                            assert!(accepted > Token::new(token));
                            continue;
                        }
                        Err(other) => panic!("unexpected error {other}"),
                    }
                    let seen = read_counter(&txn);
                    txn.execute("UPDATE counter SET n = ?1 WHERE k = 'c'", [seen + 1])
                        .unwrap();
                    txn.execute("INSERT INTO applied (token) VALUES (?1)", [token as i64])
                        .unwrap();
                    txn.commit().unwrap();
                    committed += 1;
                }
                committed
            })
        })
        .collect();
    let committed: i64 = handles.into_iter().map(|h| h.join().unwrap()).sum();

    let conn = open(&path);
    assert_eq!(
        read_counter(&conn),
        5 + committed,
        "every increment counted"
    );
    let mut statement = conn
        .prepare("SELECT token FROM applied ORDER BY id")
        .unwrap();
    let applied: Vec<u64> = statement
        .query_map([], |row| row.get::<_, i64>(0))
        .unwrap()
        .map(|token| token.unwrap() as u64)
        .collect();
    assert_eq!(applied.len() as i64, committed);
    assert_nondecreasing(&applied);
    assert_eq!(applied.last(), Some(&TOKENS));
}
