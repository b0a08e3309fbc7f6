//! The MySQL/MariaDB fence against a real server (`PALISADE_TEST_MYSQL`, e.g.
//! `mysql://root@127.0.0.1:3306/test`): the conformance suite, scopes compared byte for byte, a
//! first claim rolled back, a claim expecting one lock, and the order of claim and read inside
//! one REPEATABLE READ transaction.

mod common;

use std::time::{Duration, Instant};

use common::{grant, unique};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Transaction, TxOpts};
use palisade_fence::testing::{self, Data, FenceHarness, Unsupported};
use palisade_fence::{FenceError, FenceState, LockBinding, mysql};
use palisade_sequencer::VerifiedSequencer;
use tokio::sync::Mutex;

fn database_url() -> Option<String> {
    common::server("PALISADE_TEST_MYSQL", "the MySQL fence tests")
}

async fn connect(url: &str) -> Conn {
    let mut conn = Conn::from_url(url).await.unwrap();
    mysql::ensure_schema(&mut conn).await.unwrap();
    conn
}

/// The user's tables for one test: every applied write logged in commit order, and a value
/// that starts at `start`.
async fn create_user_tables(conn: &mut Conn, table: &str, start: i64) {
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
    conn.exec_drop(
        format!("INSERT INTO {table}_value VALUES ('c', ?)"),
        (start,),
    )
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

/// One scope and its tables, through one connection.
struct Mysql {
    url: String,
    table: String,
    scope: String,
    conn: Mutex<Conn>,
}

impl Mysql {
    async fn fresh(url: String) -> Mysql {
        let mut conn = connect(&url).await;
        let (table, scope) = (unique("pal_conf"), unique("scope"));
        create_user_tables(&mut conn, &table, 0).await;
        Mysql {
            url,
            table,
            scope,
            conn: Mutex::new(conn),
        }
    }

    /// Claims, and writes `change` of the stored value and the log, in `txn`.
    async fn write_in(
        &self,
        txn: &mut Transaction<'_>,
        sequencer: &VerifiedSequencer,
        change: impl FnOnce(i64) -> i64,
    ) -> Result<i64, FenceError> {
        mysql::claim(txn, &self.scope, sequencer).await?;
        let table = &self.table;
        let value = change(read_value(txn, table).await);
        let sql = format!("UPDATE {table}_value SET n = ? WHERE k = 'c'");
        txn.exec_drop(sql, (value,)).await.unwrap();
        let sql = format!("INSERT INTO {table}_log (token) VALUES (?)");
        txn.exec_drop(sql, (sequencer.token().get(),))
            .await
            .unwrap();
        Ok(value)
    }

    /// Runs `write_in` in a transaction of its own, committed if it is accepted.
    async fn commit_write(
        &self,
        sequencer: &VerifiedSequencer,
        change: impl FnOnce(i64) -> i64,
    ) -> Result<i64, FenceError> {
        let mut conn = self.conn.lock().await;
        let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
        match self.write_in(&mut txn, sequencer, change).await {
            Ok(value) => mysql::commit(txn).await.map(|()| value),
            Err(refused) => {
                txn.rollback().await.unwrap();
                Err(refused)
            }
        }
    }
}

impl FenceHarness for Mysql {
    async fn connect_another(&self) -> Self {
        Mysql {
            url: self.url.clone(),
            table: self.table.clone(),
            scope: self.scope.clone(),
            conn: Mutex::new(connect(&self.url).await),
        }
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        let mut conn = self.conn.lock().await;
        let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
        match mysql::claim_read(&mut txn, &self.scope, sequencer).await {
            Ok(()) => mysql::commit(txn).await,
            Err(refused) => {
                txn.rollback().await.unwrap();
                Err(refused)
            }
        }
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        self.commit_write(sequencer, |_| value).await.map(drop)
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        self.commit_write(sequencer, |seen| seen + 1).await
    }

    async fn write_and_roll_back(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        let mut conn = self.conn.lock().await;
        let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
        let claimed = self
            .write_in(&mut txn, sequencer, |_| value)
            .await
            .map(drop);
        txn.rollback().await.unwrap();
        Ok(claimed)
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        let old = std::mem::replace(&mut self.conn, Mutex::new(connect(&self.url).await));
        old.into_inner().disconnect().await.unwrap();
        Ok(())
    }

    async fn read(&self) -> Data {
        let mut conn = self.conn.lock().await;
        let value = read_value(&mut *conn, &self.table).await;
        let sql = format!("SELECT token FROM {}_log ORDER BY id", self.table);
        let log: Vec<u64> = conn.query(sql).await.unwrap();
        Data { value, log }
    }

    async fn state(&self) -> Option<FenceState> {
        let mut conn = self.conn.lock().await;
        mysql::fence_state(&mut *conn, &self.scope).await.unwrap()
    }

    async fn clean_up(self) {
        let mut conn = self.conn.into_inner();
        drop_user_tables(&mut conn, &self.table, &self.scope).await;
        conn.disconnect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_passes_the_fence_conformance_suite() {
    let Some(url) = database_url() else { return };
    testing::run_all(|| Mysql::fresh(url.clone())).await;
}

#[tokio::test]
async fn scopes_compare_byte_for_byte_and_a_rolled_back_first_claim_leaves_no_row() {
    let Some(url) = database_url() else { return };
    let mut conn = connect(&url).await;
    let scope = unique("scope");
    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    mysql::claim(&mut txn, &scope, &grant("report", 5, 1))
        .await
        .unwrap();
    // A case or trailing-space variant is another scope, which another lock may claim.
    for variant in [scope.to_uppercase(), format!("{scope} ")] {
        mysql::claim(&mut txn, &variant, &grant("other", 1, 9))
            .await
            .unwrap();
    }
    txn.rollback().await.unwrap();
    for rolled_back in [scope.to_uppercase(), format!("{scope} "), scope] {
        assert_eq!(
            mysql::fence_state(&mut conn, &rolled_back).await.unwrap(),
            None
        );
    }

    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    let (fresh, holder) = (unique("fresh"), grant("x", 1, 1));
    let refused = mysql::claim_expecting(&mut txn, &fresh, &holder, LockBinding::Expect("jobs"));
    assert!(refused.await.unwrap_err().is_wrong_lock());
    txn.rollback().await.unwrap();
    conn.disconnect().await.unwrap();
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
    create_user_tables(&mut conn, &table, 5).await;
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
