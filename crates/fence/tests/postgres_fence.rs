//! The PostgreSQL fence against a real server (`PALISADE_TEST_POSTGRES`): the conformance
//! suite, a claim expecting one lock, a database that changes the advanced token, and the order
//! of claim and read inside one READ COMMITTED transaction.

mod common;

use common::{grant, unique};
use palisade_fence::testing::{self, Data, FenceHarness, Unsupported};
use palisade_fence::{FenceError, FenceState, LockBinding, postgres};
use palisade_sequencer::VerifiedSequencer;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls, Transaction};

fn database_url() -> Option<String> {
    common::server("PALISADE_TEST_POSTGRES", "the PostgreSQL fence tests")
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("postgresql connection ended: {error}");
        }
    });
    postgres::ensure_schema(&client).await.unwrap();
    client
}

/// One scope and its tables (`<table>_value`, `<table>_log`), through one connection.
struct Postgres {
    url: String,
    table: String,
    scope: String,
    client: Mutex<Client>,
}

impl Postgres {
    async fn fresh(url: String) -> Postgres {
        let client = connect(&url).await;
        let (table, scope) = (unique("pal_conf"), unique("scope"));
        client
            .batch_execute(&format!(
                "CREATE TABLE {table}_log (id bigserial PRIMARY KEY, token bigint NOT NULL);
                 CREATE TABLE {table}_value (k text PRIMARY KEY, n bigint NOT NULL);
                 INSERT INTO {table}_value VALUES ('v', 0);"
            ))
            .await
            .unwrap();
        Postgres {
            url,
            table,
            scope,
            client: Mutex::new(client),
        }
    }

    /// Claims, and writes `change` of the stored value and the log, in `txn`.
    async fn write_in(
        &self,
        txn: &Transaction<'_>,
        sequencer: &VerifiedSequencer,
        change: impl FnOnce(i64) -> i64,
    ) -> Result<i64, FenceError> {
        postgres::claim(txn, &self.scope, sequencer).await?;
        let table = &self.table;
        let sql = format!("SELECT n FROM {table}_value WHERE k = 'v'");
        let value = change(txn.query_one(&sql, &[]).await.unwrap().get(0));
        let sql = format!("UPDATE {table}_value SET n = $1 WHERE k = 'v'");
        txn.execute(&sql, &[&value]).await.unwrap();
        let token = sequencer.token().get() as i64;
        let sql = format!("INSERT INTO {table}_log (token) VALUES ($1)");
        txn.execute(&sql, &[&token]).await.unwrap();
        Ok(value)
    }
}

impl FenceHarness for Postgres {
    async fn connect_another(&self) -> Self {
        Postgres {
            url: self.url.clone(),
            table: self.table.clone(),
            scope: self.scope.clone(),
            client: Mutex::new(connect(&self.url).await),
        }
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        let mut client = self.client.lock().await;
        let txn = client.transaction().await.unwrap();
        postgres::claim_read(&txn, &self.scope, sequencer).await?;
        postgres::commit(txn).await
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        let mut client = self.client.lock().await;
        let txn = client.transaction().await.unwrap();
        self.write_in(&txn, sequencer, |_| value).await?;
        postgres::commit(txn).await
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        let mut client = self.client.lock().await;
        let txn = client.transaction().await.unwrap();
        let value = self.write_in(&txn, sequencer, |seen| seen + 1).await?;
        postgres::commit(txn).await.map(|()| value)
    }

    async fn write_and_roll_back(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        let mut client = self.client.lock().await;
        let txn = client.transaction().await.unwrap();
        let claimed = self.write_in(&txn, sequencer, |_| value).await.map(drop);
        txn.rollback().await.unwrap();
        Ok(claimed)
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        self.client = Mutex::new(connect(&self.url).await);
        Ok(())
    }

    async fn read(&self) -> Data {
        let client = self.client.lock().await;
        let table = &self.table;
        let sql = format!("SELECT n FROM {table}_value WHERE k = 'v'");
        let value = client.query_one(&sql, &[]).await.unwrap().get(0);
        let sql = format!("SELECT token FROM {table}_log ORDER BY id");
        let rows = client.query(&sql, &[]).await.unwrap();
        let log = rows.iter().map(|row| row.get::<_, i64>(0) as u64).collect();
        Data { value, log }
    }

    async fn state(&self) -> Option<FenceState> {
        let client = self.client.lock().await;
        postgres::fence_state(&*client, &self.scope).await.unwrap()
    }

    async fn clean_up(self) {
        let client = self.client.into_inner();
        let table = &self.table;
        let sql = format!("DROP TABLE {table}_log; DROP TABLE {table}_value;");
        client.batch_execute(&sql).await.unwrap();
        let sql = "DELETE FROM palisade_fence WHERE scope = $1";
        client.execute(sql, &[&self.scope]).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_fence_conformance_suite() {
    let Some(url) = database_url() else { return };
    testing::run_all(|| Postgres::fresh(url.clone())).await;
}

#[tokio::test]
async fn a_claim_expecting_one_lock_refuses_others_in_a_fresh_scope() {
    let Some(url) = database_url() else { return };
    let mut client = connect(&url).await;
    let txn = client.transaction().await.unwrap();
    let expecting = LockBinding::Expect("jobs");
    let (scope, holder) = (unique("fresh"), grant("x", 1, 1));
    let refused = postgres::claim_expecting(&txn, &scope, &holder, expecting).await;
    assert!(refused.unwrap_err().is_wrong_lock());
    assert_eq!(postgres::fence_state(&txn, &scope).await.unwrap(), None);
}

/// A database that stores another token than the one the fence advanced to (here a trigger
/// someone added) is reported as corrupt, never a panic in the caller's process.
#[tokio::test]
async fn a_database_that_changes_the_advanced_token_is_corrupt_not_a_panic() {
    let Some(url) = database_url() else { return };
    let mut client = connect(&url).await;
    let (trigger, scope) = (unique("pal_meddler"), unique("scope"));
    // Created inside the transaction and rolled back with it, so no other test ever sees it.
    let txn = client.transaction().await.unwrap();
    txn.batch_execute(&format!(
        "CREATE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN NEW.token_max := NEW.token_max + 1; RETURN NEW; END $$;
         CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE ON palisade_fence FOR EACH ROW
             WHEN (NEW.scope = '{scope}') EXECUTE FUNCTION {trigger}();"
    ))
    .await
    .unwrap();
    let refused = postgres::claim(&txn, &scope, &grant("report", 5, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, FenceError::Corrupt { scope: s, message }
            if *s == scope && message.contains("token 6 after advancing to 5")),
        "{refused:?}"
    );
    txn.rollback().await.unwrap();
}

/// A counter for the read-modify-write scenarios, starting at 5.
async fn create_counter(client: &Client, table: &str) {
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (k text PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO {table} VALUES ('c', 5);"
        ))
        .await
        .unwrap();
}

async fn drop_counter(client: &Client, table: &str, scope: &str) {
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
    client
        .execute("DELETE FROM palisade_fence WHERE scope = $1", &[&scope])
        .await
        .unwrap();
}

async fn read_counter(client: &impl tokio_postgres::GenericClient, table: &str) -> i64 {
    let sql = format!("SELECT n FROM {table} WHERE k = 'c'");
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// Waits until the backend `pid` is blocked on a lock (bounded: 10 s).
async fn wait_until_blocked(client: &Client, pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let row = client
            .query_one(
                "SELECT coalesce(wait_event_type, '') FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap();
        if row.get::<_, String>(0) == "Lock" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "backend {pid} never blocked on the fence row"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// In one READ COMMITTED transaction each: A (token 10) claims and reads; B (token 11) starts
/// while A is still open, reading and claiming in the order `b_claims_first` says; A writes its
/// increment and commits while B waits for the fence row; B writes its own. Returns the counter.
async fn overlapping_increments(b_claims_first: bool) -> Option<i64> {
    let url = database_url()?;
    let mut client = connect(&url).await;
    let (table, scope) = (unique("pal_overlap"), unique("scope"));
    create_counter(&client, &table).await;

    let txn_a = client.transaction().await.unwrap();
    postgres::claim(&txn_a, &scope, &grant("counter", 10, 1))
        .await
        .unwrap();
    let seen_by_a = read_counter(&txn_a, &table).await;

    let mut client_b = connect(&url).await;
    let pid_b: i32 = client_b
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let b = tokio::spawn({
        let (table, scope) = (table.clone(), scope.clone());
        async move {
            let holder = grant("counter", 11, 2);
            let txn = client_b.transaction().await.unwrap();
            let seen = if b_claims_first {
                postgres::claim(&txn, &scope, &holder).await.unwrap();
                read_counter(&txn, &table).await
            } else {
                let seen = read_counter(&txn, &table).await;
                postgres::claim(&txn, &scope, &holder).await.unwrap();
                seen
            };
            let sql = format!("UPDATE {table} SET n = $1 WHERE k = 'c'");
            txn.execute(&sql, &[&(seen + 1)]).await.unwrap();
            postgres::commit(txn).await.unwrap();
        }
    });
    let observer = connect(&url).await;
    wait_until_blocked(&observer, pid_b).await;

    let sql = format!("UPDATE {table} SET n = $1 WHERE k = 'c'");
    txn_a.execute(&sql, &[&(seen_by_a + 1)]).await.unwrap();
    postgres::commit(txn_a).await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), b)
        .await
        .expect("B finishes once A committed")
        .unwrap();

    let value = read_counter(&client, &table).await;
    drop_counter(&client, &table, &scope).await;
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
async fn a_read_before_the_claim_in_the_same_transaction_can_lose_an_update() {
    // Why the claim is the transaction's first statement: B's read, made before its claim,
    // returned what A was about to overwrite.
    let Some(value) = overlapping_increments(false).await else {
        return;
    };
    assert_eq!(value, 6, "two increments of 5, and one was lost");
}
