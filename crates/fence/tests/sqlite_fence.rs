//! The SQLite fence with real database files: the conformance suite, and a claim expecting one
//! lock.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::grant;
use palisade_fence::testing::{self, Data, FenceHarness, Unsupported};
use palisade_fence::{FenceError, FenceState, LockBinding, sqlite};
use palisade_sequencer::VerifiedSequencer;
use rusqlite::{Connection, Transaction};

const SCOPE: &str = "reports";

/// A connection to an existing database, as each racing writer opens its own.
fn connect(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn
}

/// One database file, and a connection to it.
struct Sqlite {
    dir: Arc<tempfile::TempDir>,
    conn: Mutex<Connection>,
}

impl Sqlite {
    fn path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("fenced.sqlite")
    }

    /// A new database file with the fence's table and the user's.
    async fn fresh() -> Sqlite {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let conn = connect(&Self::path(&dir));
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        sqlite::ensure_schema(&conn).unwrap();
        conn.execute_batch(
            "CREATE TABLE applied (id INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL);
             CREATE TABLE value (k TEXT PRIMARY KEY, n INTEGER NOT NULL);
             INSERT INTO value VALUES ('v', 0);",
        )
        .unwrap();
        Sqlite {
            dir,
            conn: Mutex::new(conn),
        }
    }

    /// Begins, claims, and writes `change` of the stored value in the transaction it returns.
    fn write_in<'c>(
        conn: &'c mut Connection,
        sequencer: &VerifiedSequencer,
        change: impl FnOnce(i64) -> i64,
    ) -> Result<(i64, Transaction<'c>), FenceError> {
        let txn = sqlite::begin(conn)?;
        sqlite::claim(&txn, SCOPE, sequencer)?;
        let seen: i64 = txn
            .query_row("SELECT n FROM value WHERE k = 'v'", [], |row| row.get(0))
            .unwrap();
        let value = change(seen);
        txn.execute("UPDATE value SET n = ?1 WHERE k = 'v'", [value])
            .unwrap();
        let token = sequencer.token().get() as i64;
        txn.execute("INSERT INTO applied (token) VALUES (?1)", [token])
            .unwrap();
        Ok((value, txn))
    }
}

impl FenceHarness for Sqlite {
    async fn connect_another(&self) -> Self {
        Sqlite {
            dir: Arc::clone(&self.dir),
            conn: Mutex::new(connect(&Self::path(&self.dir))),
        }
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        let mut conn = self.conn.lock().unwrap();
        let txn = sqlite::begin(&mut conn)?;
        sqlite::claim_read(&txn, SCOPE, sequencer)?;
        txn.commit().unwrap();
        Ok(())
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        let mut conn = self.conn.lock().unwrap();
        let (_, txn) = Self::write_in(&mut conn, sequencer, |_| value)?;
        txn.commit().unwrap();
        Ok(())
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        let mut conn = self.conn.lock().unwrap();
        let (value, txn) = Self::write_in(&mut conn, sequencer, |seen| seen + 1)?;
        txn.commit().unwrap();
        Ok(value)
    }

    async fn write_and_roll_back(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        let mut conn = self.conn.lock().unwrap();
        Ok(Self::write_in(&mut conn, sequencer, |_| value).map(|(_, txn)| txn.rollback().unwrap()))
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        self.conn = Mutex::new(connect(&Self::path(&self.dir)));
        Ok(())
    }

    async fn read(&self) -> Data {
        let conn = self.conn.lock().unwrap();
        let value = conn
            .query_row("SELECT n FROM value WHERE k = 'v'", [], |row| row.get(0))
            .unwrap();
        let mut statement = conn
            .prepare("SELECT token FROM applied ORDER BY id")
            .unwrap();
        let log = statement
            .query_map([], |row| row.get::<_, i64>(0))
            .unwrap()
            .map(|token| token.unwrap() as u64)
            .collect();
        Data { value, log }
    }

    async fn state(&self) -> Option<FenceState> {
        sqlite::fence_state(&self.conn.lock().unwrap(), SCOPE).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_fence_conformance_suite() {
    testing::run_all(Sqlite::fresh).await;
}

#[tokio::test]
async fn a_claim_expecting_one_lock_refuses_others_in_a_fresh_scope() {
    let fence = Sqlite::fresh().await;
    let mut conn = fence.conn.lock().unwrap();
    let txn = sqlite::begin(&mut conn).unwrap();
    let expecting = LockBinding::Expect("jobs");
    let refused = sqlite::claim_expecting(&txn, "fresh", &grant("x", 1, 1), expecting);
    assert!(refused.unwrap_err().is_wrong_lock());
    assert_eq!(sqlite::fence_state(&txn, "fresh").unwrap(), None);
}
