//! Scenarios for the MySQL/MariaDB fence against a real server (`PALISADE_TEST_MYSQL`, e.g.
//! `mysql://root@127.0.0.1:3306/test`).

mod common;

use std::time::{Duration, Instant};

use common::{assert_nondecreasing, forged_text, grant, public_keys, reissued, shuffled, unique};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, LockBinding, mysql, verify_presented};
use palisade_sequencer::VerifiedSequencer;

fn database_url() -> Option<String> {
    let url = std::env::var("PALISADE_TEST_MYSQL")
        .ok()
        .filter(|url| !url.is_empty());
    if url.is_none() {
        common::skip("SKIP: PALISADE_TEST_MYSQL not set; MySQL fence tests did not run");
    }
    url
}

async fn connect(url: &str) -> Conn {
    let mut conn = Conn::from_url(url).await.unwrap();
    mysql::ensure_schema(&mut conn).await.unwrap();
    conn
}

/// The user's tables for one test: every applied write logged in commit order, plus a value
/// and a counter that starts at 5.
async fn create_user_tables(conn: &mut Conn, table: &str) {
    conn.query_drop(format!(
        "CREATE TABLE {table}_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL)
            ENGINE = InnoDB"
    ))
    .await
    .unwrap();
    conn.query_drop(format!(
        "CREATE TABLE {table}_value (k VARCHAR(16) PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB"
    ))
    .await
    .unwrap();
    conn.query_drop(format!("INSERT INTO {table}_value VALUES ('c', 5)"))
        .await
        .unwrap();
}

async fn drop_user_tables(conn: &mut Conn, table: &str, scope: &str) {
    conn.query_drop(format!("DROP TABLE {table}_log, {table}_value"))
        .await
        .unwrap();
    conn.exec_drop("DELETE FROM palisade_fence WHERE scope = ?", (scope,))
        .await
        .unwrap();
}

async fn read_value(conn: &mut impl Queryable, table: &str) -> i64 {
    conn.query_first(format!("SELECT n FROM {table}_value WHERE k = 'c'"))
        .await
        .unwrap()
        .unwrap()
}

/// One fenced write: claim, then write the value and log the token, in one transaction.
async fn fenced_write(
    conn: &mut Conn,
    table: &str,
    scope: &str,
    holder: &VerifiedSequencer,
) -> Result<(), FenceError> {
    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    mysql::claim(&mut txn, scope, holder).await?;
    let token = holder.token().get() as i64;
    txn.exec_drop(
        format!("INSERT INTO {table}_log (token) VALUES (?)"),
        (token,),
    )
    .await
    .unwrap();
    txn.exec_drop(
        format!("UPDATE {table}_value SET n = ? WHERE k = 'c'"),
        (token,),
    )
    .await
    .unwrap();
    mysql::commit(txn).await
}

#[tokio::test]
async fn a_superseded_token_is_refused_and_still_refused_after_reconnecting() {
    let Some(url) = database_url() else { return };
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_stale"), unique("scope"));
    create_user_tables(&mut conn, &table).await;

    fenced_write(&mut conn, &table, &scope, &grant("report", 3, 1))
        .await
        .unwrap();
    fenced_write(&mut conn, &table, &scope, &grant("report", 8, 2))
        .await
        .unwrap();
    let err = fenced_write(&mut conn, &table, &scope, &grant("report", 3, 1))
        .await
        .unwrap_err();
    let expected = FenceError::Stale {
        lock: "report".into(),
        presented: Token::new(3),
        accepted: Token::new(8),
        holder_session: Some(SessionId::new(2)),
    };
    assert_eq!(err, expected);
    conn.disconnect().await.unwrap();

    // A new connection, as after a restart of the resource process or of the server's client.
    let mut conn = connect(&url).await;
    let err = fenced_write(&mut conn, &table, &scope, &grant("report", 3, 1))
        .await
        .unwrap_err();
    assert_eq!(err, expected);
    assert_eq!(read_value(&mut conn, &table).await, 8);
    let state = mysql::fence_state(&mut conn, &scope)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (state.lock.as_str(), state.token_max, state.holder_session),
        ("report", Token::new(8), SessionId::new(2))
    );
    fenced_write(&mut conn, &table, &scope, &grant("report", 8, 2))
        .await
        .unwrap();
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
}

#[tokio::test]
async fn a_token_issued_twice_is_refused_from_the_second_session_and_the_first_writes_on() {
    let Some(url) = database_url() else { return };
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_reissue"), unique("scope"));
    create_user_tables(&mut conn, &table).await;
    let (first, second) = (u64::MAX - 1, 7);

    fenced_write(&mut conn, &table, &scope, &grant("report", 5, first))
        .await
        .unwrap();
    let before = mysql::fence_state(&mut conn, &scope).await.unwrap();
    // A lock service restored from a backup grants token 5 again, to another session.
    for presented in [second, u64::MAX] {
        let err = fenced_write(&mut conn, &table, &scope, &grant("report", 5, presented))
            .await
            .unwrap_err();
        assert_eq!(err, reissued("report", 5, first, presented));
    }
    assert_eq!(mysql::fence_state(&mut conn, &scope).await.unwrap(), before);
    let logged: i64 = conn
        .query_first(format!("SELECT count(*) FROM {table}_log"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(logged, 1, "nothing of the second session was written");

    // The first session writes on with token 5; a newer token advances as before.
    fenced_write(&mut conn, &table, &scope, &grant("report", 5, first))
        .await
        .unwrap();
    assert_eq!(mysql::fence_state(&mut conn, &scope).await.unwrap(), before);
    fenced_write(&mut conn, &table, &scope, &grant("report", 6, second))
        .await
        .unwrap();
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
}

#[tokio::test]
async fn a_rolled_back_transaction_takes_the_token_advance_with_it() {
    let Some(url) = database_url() else { return };
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_rollback"), unique("scope"));
    create_user_tables(&mut conn, &table).await;
    fenced_write(&mut conn, &table, &scope, &grant("report", 2, 1))
        .await
        .unwrap();

    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    mysql::claim(&mut txn, &scope, &grant("report", 50, 2))
        .await
        .unwrap();
    txn.rollback().await.unwrap();

    let state = mysql::fence_state(&mut conn, &scope)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.token_max, Token::new(2));
    fenced_write(&mut conn, &table, &scope, &grant("report", 3, 3))
        .await
        .unwrap();

    // A first claim of a new scope, rolled back, leaves no row behind.
    let fresh = unique("fresh");
    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    mysql::claim(&mut txn, &fresh, &grant("report", 9, 2))
        .await
        .unwrap();
    txn.rollback().await.unwrap();
    assert_eq!(mysql::fence_state(&mut conn, &fresh).await.unwrap(), None);
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
}

#[tokio::test]
async fn foreign_locks_and_forgeries_are_refused_and_honest_writers_continue() {
    let Some(url) = database_url() else { return };
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_foreign"), unique("scope"));
    create_user_tables(&mut conn, &table).await;
    fenced_write(&mut conn, &table, &scope, &grant("report", 5, 1))
        .await
        .unwrap();

    let err = fenced_write(&mut conn, &table, &scope, &grant("other", 1000, 9))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FenceError::WrongLock {
            expected: "report".into(),
            presented: "other".into()
        }
    );
    // Scopes are compared byte for byte: a case or trailing-space variant is another scope.
    for variant in [scope.to_uppercase(), format!("{scope} ")] {
        let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
        mysql::claim(&mut txn, &variant, &grant("other", 1, 9))
            .await
            .unwrap();
        txn.rollback().await.unwrap();
    }
    let forged = verify_presented(Some(&forged_text("report", 1 << 62)), &public_keys());
    assert_eq!(forged.unwrap_err().kind(), "forged");

    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    let err = mysql::claim_expecting(
        &mut txn,
        &unique("fresh"),
        &grant("x", 1, 1),
        LockBinding::Expect("jobs"),
    )
    .await
    .unwrap_err();
    assert!(err.is_wrong_lock());
    txn.rollback().await.unwrap();

    fenced_write(&mut conn, &table, &scope, &grant("report", 6, 2))
        .await
        .unwrap();
    assert_eq!(read_value(&mut conn, &table).await, 6);
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_commit_in_token_order_and_the_highest_token_wins() {
    const WRITERS: usize = 6;
    const TOKENS: u64 = 150;
    let Some(url) = database_url() else { return };
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_race"), unique("scope"));
    create_user_tables(&mut conn, &table).await;
    let tokens = shuffled((1..=TOKENS).collect(), 99);

    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let mine: Vec<u64> = tokens
            .iter()
            .copied()
            .skip(writer)
            .step_by(WRITERS)
            .collect();
        let (url, table, scope) = (url.clone(), table.clone(), scope.clone());
        tasks.push(tokio::spawn(async move {
            // Each writer has its own connection; they all start on a scope that does not
            // exist yet, so the first claims race to create its row.
            let mut conn = connect(&url).await;
            for token in mine {
                let holder = grant("race", token, writer as u64);
                match fenced_write(&mut conn, &table, &scope, &holder).await {
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
            conn.disconnect().await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let applied: Vec<i64> = conn
        .query(format!("SELECT token FROM {table}_log ORDER BY id"))
        .await
        .unwrap();
    let applied: Vec<u64> = applied.into_iter().map(|token| token as u64).collect();
    assert_nondecreasing(&applied);
    assert_eq!(applied.last(), Some(&TOKENS));
    assert_eq!(read_value(&mut conn, &table).await, TOKENS as i64);
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
}

/// Reads the counter in a transaction of its own, claiming first when `claim` is set.
async fn read_step(
    conn: &mut Conn,
    table: &str,
    scope: &str,
    holder: &VerifiedSequencer,
    claim: bool,
) -> i64 {
    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    if claim {
        mysql::claim(&mut txn, scope, holder).await.unwrap();
    }
    let seen = read_value(&mut txn, table).await;
    mysql::commit(txn).await.unwrap();
    seen
}

/// Writes `value` to the counter under a claim, in a transaction of its own.
async fn write_step(
    conn: &mut Conn,
    table: &str,
    scope: &str,
    holder: &VerifiedSequencer,
    value: i64,
) -> Result<(), FenceError> {
    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    mysql::claim(&mut txn, scope, holder).await?;
    txn.exec_drop(
        format!("UPDATE {table}_value SET n = ? WHERE k = 'c'"),
        (value,),
    )
    .await
    .unwrap();
    mysql::commit(txn).await
}

/// Holder A (token 10) reads the counter, B (token 11) reads it, A writes back its increment,
/// B writes back its own, each step its own transaction. Returns the counter at the end and
/// what A's write came to.
async fn two_increments(claim_reads: bool) -> Option<(i64, Result<(), FenceError>)> {
    let url = database_url()?;
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_incr"), unique("scope"));
    create_user_tables(&mut conn, &table).await;
    let (a, b) = (grant("counter", 10, 1), grant("counter", 11, 2));

    let seen_by_a = read_step(&mut conn, &table, &scope, &a, claim_reads).await;
    // A pauses past its lease here; B is granted the lock.
    let seen_by_b = read_step(&mut conn, &table, &scope, &b, claim_reads).await;
    let written_by_a = write_step(&mut conn, &table, &scope, &a, seen_by_a + 1).await;
    write_step(&mut conn, &table, &scope, &b, seen_by_b + 1)
        .await
        .unwrap();

    let value = read_value(&mut conn, &table).await;
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
    Some((value, written_by_a))
}

#[tokio::test]
async fn a_claim_before_reading_refuses_the_superseded_holders_write_back() {
    let Some((value, written_by_a)) = two_increments(true).await else {
        return;
    };
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

#[tokio::test]
async fn reads_without_a_claim_let_a_superseded_holder_lose_an_update() {
    // Why claims come before reads: the same two holders, claiming only to write.
    let Some((value, written_by_a)) = two_increments(false).await else {
        return;
    };
    assert!(written_by_a.is_ok(), "no newer grant had claimed yet");
    assert_eq!(value, 6, "two increments of 5, and one was lost");
}

/// Waits until the server connection `id` is waiting for a row lock (bounded: 10 s).
async fn wait_until_blocked(observer: &mut Conn, id: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: Option<u64> = observer
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX
                 WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'",
                (id,),
            )
            .await
            .unwrap();
        if waiting == Some(1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connection {id} never blocked on the fence row"
        );
        // InnoDB refreshes INNODB_TRX only when it was last read over 100 ms ago: faster
        // polling would keep reading the first answer.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// In one REPEATABLE READ transaction each: A (token 10) claims and reads; B (token 11) starts
/// while A is still open, reading and claiming in the order `b_claims_first` says; A writes its
/// increment and commits while B waits for the fence row; B writes its own. Returns the counter.
async fn overlapping_increments(b_claims_first: bool) -> Option<i64> {
    let url = database_url()?;
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_overlap"), unique("scope"));
    create_user_tables(&mut conn, &table).await;
    let mut conn_a = connect(&url).await;
    let mut txn_a = conn_a.start_transaction(TxOpts::default()).await.unwrap();
    mysql::claim(&mut txn_a, &scope, &grant("counter", 10, 1))
        .await
        .unwrap();
    let seen_by_a = read_value(&mut txn_a, &table).await;

    let mut conn_b = connect(&url).await;
    let id_b = conn_b.id();
    let b = tokio::spawn({
        let (table, scope) = (table.clone(), scope.clone());
        async move {
            let holder = grant("counter", 11, 2);
            let mut txn = conn_b.start_transaction(TxOpts::default()).await.unwrap();
            let seen = if b_claims_first {
                mysql::claim(&mut txn, &scope, &holder).await.unwrap();
                read_value(&mut txn, &table).await
            } else {
                let seen = read_value(&mut txn, &table).await;
                mysql::claim(&mut txn, &scope, &holder).await.unwrap();
                // Even after the claim, a plain read returns the snapshot of the first read.
                assert_eq!(read_value(&mut txn, &table).await, seen);
                seen
            };
            txn.exec_drop(
                format!("UPDATE {table}_value SET n = ? WHERE k = 'c'"),
                (seen + 1,),
            )
            .await
            .unwrap();
            mysql::commit(txn).await.unwrap();
            conn_b.disconnect().await.unwrap();
        }
    });
    wait_until_blocked(&mut conn, id_b).await;

    txn_a
        .exec_drop(
            format!("UPDATE {table}_value SET n = ? WHERE k = 'c'"),
            (seen_by_a + 1,),
        )
        .await
        .unwrap();
    mysql::commit(txn_a).await.unwrap();
    conn_a.disconnect().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("B finishes once A committed")
        .unwrap();

    let value = read_value(&mut conn, &table).await;
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
    Some(value)
}

#[tokio::test]
async fn a_claim_first_in_the_transaction_waits_for_the_older_holders_commit_and_reads_it() {
    let Some(value) = overlapping_increments(true).await else {
        return;
    };
    assert_eq!(value, 7, "both increments survive");
}

#[tokio::test]
async fn a_read_before_the_claim_fixes_an_old_snapshot_and_loses_an_update() {
    // Why the claim is the transaction's first statement: B's first read fixed its snapshot
    // before A committed, and every plain read of B's transaction returns that snapshot.
    let Some(value) = overlapping_increments(false).await else {
        return;
    };
    assert_eq!(value, 6, "two increments of 5, and one was lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claimers_read_modify_write_and_lose_no_increment() {
    const CLAIMERS: usize = 5;
    const TOKENS: u64 = 100;
    let Some(url) = database_url() else { return };
    let mut conn = connect(&url).await;
    let (table, scope) = (unique("pal_claimers"), unique("scope"));
    create_user_tables(&mut conn, &table).await;
    let tokens = shuffled((1..=TOKENS).collect(), 7);

    let mut tasks = Vec::new();
    for claimer in 0..CLAIMERS {
        let mine: Vec<u64> = tokens
            .iter()
            .copied()
            .skip(claimer)
            .step_by(CLAIMERS)
            .collect();
        let (url, table, scope) = (url.clone(), table.clone(), scope.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = connect(&url).await;
            let mut committed = 0u64;
            for token in mine {
                let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
                match mysql::claim(&mut txn, &scope, &grant("c", token, claimer as u64)).await {
                    Ok(()) => {}
                    Err(FenceError::Stale { accepted, .. }) => {
                        assert!(accepted > Token::new(token));
                        txn.rollback().await.unwrap();
                        continue;
                    }
                    Err(other) => panic!("unexpected error {other}"),
                }
                let seen = read_value(&mut txn, &table).await;
                txn.exec_drop(
                    format!("UPDATE {table}_value SET n = ? WHERE k = 'c'"),
                    (seen + 1,),
                )
                .await
                .unwrap();
                txn.exec_drop(
                    format!("INSERT INTO {table}_log (token) VALUES (?)"),
                    (token,),
                )
                .await
                .unwrap();
                mysql::commit(txn).await.unwrap();
                committed += 1;
            }
            conn.disconnect().await.unwrap();
            committed
        }));
    }
    let mut committed = 0;
    for task in tasks {
        committed += task.await.unwrap();
    }

    assert_eq!(
        read_value(&mut conn, &table).await,
        5 + committed as i64,
        "every committed increment counted"
    );
    let applied: Vec<u64> = conn
        .query(format!("SELECT token FROM {table}_log ORDER BY id"))
        .await
        .unwrap();
    assert_eq!(applied.len() as u64, committed);
    assert_nondecreasing(&applied);
    assert_eq!(applied.last(), Some(&TOKENS));
    drop_user_tables(&mut conn, &table, &scope).await;
    conn.disconnect().await.unwrap();
}
