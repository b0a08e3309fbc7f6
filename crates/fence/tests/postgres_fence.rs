//! Scenarios for the PostgreSQL fence against a real server (`PALISADE_TEST_POSTGRES`).

mod common;

use common::{assert_nondecreasing, forged_text, grant, public_keys, reissued, shuffled, unique};
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, LockBinding, postgres, verify_presented};
use tokio_postgres::{Client, NoTls};

fn database_url() -> Option<String> {
    let url = std::env::var("PALISADE_TEST_POSTGRES")
        .ok()
        .filter(|url| !url.is_empty());
    if url.is_none() {
        common::skip("SKIP: PALISADE_TEST_POSTGRES not set; PostgreSQL fence tests did not run");
    }
    url
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

/// A user table for one test: every applied write logged in commit order, plus the value.
async fn create_user_tables(client: &Client, table: &str) {
    client
        .batch_execute(&format!(
            "CREATE TABLE {table}_log (id bigserial PRIMARY KEY, token bigint NOT NULL);
             CREATE TABLE {table}_value (k text PRIMARY KEY, token bigint NOT NULL);"
        ))
        .await
        .unwrap();
}

async fn drop_user_tables(client: &Client, table: &str, scope: &str) {
    client
        .batch_execute(&format!(
            "DROP TABLE {table}_log; DROP TABLE {table}_value;"
        ))
        .await
        .unwrap();
    client
        .execute("DELETE FROM palisade_fence WHERE scope = $1", &[&scope])
        .await
        .unwrap();
}

/// One fenced write: advance the token and write the user's rows in one transaction.
async fn fenced_write(
    client: &mut Client,
    table: &str,
    scope: &str,
    lock: &str,
    token: u64,
    session: u64,
) -> Result<(), FenceError> {
    let txn = client.transaction().await.unwrap();
    postgres::claim(&txn, scope, &grant(lock, token, session)).await?;
    let token = token as i64;
    txn.execute(
        &format!("INSERT INTO {table}_log (token) VALUES ($1)"),
        &[&token],
    )
    .await
    .unwrap();
    txn.execute(
        &format!(
            "INSERT INTO {table}_value (k, token) VALUES ('v', $1)
             ON CONFLICT (k) DO UPDATE SET token = EXCLUDED.token"
        ),
        &[&token],
    )
    .await
    .unwrap();
    txn.commit().await.unwrap();
    Ok(())
}

async fn value(client: &Client, table: &str) -> Option<i64> {
    let row = client
        .query_opt(
            &format!("SELECT token FROM {table}_value WHERE k = 'v'"),
            &[],
        )
        .await
        .unwrap();
    row.map(|row| row.get(0))
}

#[tokio::test]
async fn a_fresh_connection_still_refuses_a_superseded_token() {
    let Some(url) = database_url() else { return };
    let mut client = connect(&url).await;
    let (table, scope) = (unique("pal_fresh"), unique("scope"));
    create_user_tables(&client, &table).await;

    fenced_write(&mut client, &table, &scope, "report", 3, 1)
        .await
        .unwrap();
    fenced_write(&mut client, &table, &scope, "report", 8, 2)
        .await
        .unwrap();
    drop(client);

    // A new client, as after a restart of the resource process.
    let mut client = connect(&url).await;
    let err = fenced_write(&mut client, &table, &scope, "report", 3, 1)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FenceError::Stale {
            lock: "report".into(),
            presented: Token::new(3),
            accepted: Token::new(8),
            holder_session: Some(SessionId::new(2))
        }
    );
    assert_eq!(value(&client, &table).await, Some(8));
    fenced_write(&mut client, &table, &scope, "report", 8, 2)
        .await
        .unwrap();
    drop_user_tables(&client, &table, &scope).await;
}

#[tokio::test]
async fn a_token_issued_twice_is_refused_from_the_second_session_and_the_first_writes_on() {
    let Some(url) = database_url() else { return };
    let mut client = connect(&url).await;
    let (table, scope) = (unique("pal_reissue"), unique("scope"));
    create_user_tables(&client, &table).await;
    // Sessions above i64::MAX are stored bit for bit as negative bigints: compare them too.
    let (first, second) = (u64::MAX - 1, 7);

    fenced_write(&mut client, &table, &scope, "report", 5, first)
        .await
        .unwrap();
    let before = postgres::fence_state(&client, &scope).await.unwrap();
    // A lock service restored from a backup grants token 5 again, to another session.
    for presented in [second, u64::MAX] {
        let err = fenced_write(&mut client, &table, &scope, "report", 5, presented)
            .await
            .unwrap_err();
        assert_eq!(err, reissued("report", 5, first, presented));
    }
    assert_eq!(
        postgres::fence_state(&client, &scope).await.unwrap(),
        before
    );
    let logged: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}_log"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, 1, "nothing of the second session was written");

    // The first session writes on with token 5; a newer token advances as before.
    fenced_write(&mut client, &table, &scope, "report", 5, first)
        .await
        .unwrap();
    assert_eq!(
        postgres::fence_state(&client, &scope).await.unwrap(),
        before
    );
    fenced_write(&mut client, &table, &scope, "report", 6, second)
        .await
        .unwrap();
    drop_user_tables(&client, &table, &scope).await;
}

#[tokio::test]
async fn a_rolled_back_transaction_takes_the_token_advance_with_it() {
    let Some(url) = database_url() else { return };
    let mut client = connect(&url).await;
    let (table, scope) = (unique("pal_rollback"), unique("scope"));
    create_user_tables(&client, &table).await;
    fenced_write(&mut client, &table, &scope, "report", 2, 1)
        .await
        .unwrap();

    let txn = client.transaction().await.unwrap();
    postgres::claim(&txn, &scope, &grant("report", 50, 2))
        .await
        .unwrap();
    txn.rollback().await.unwrap();

    let state = postgres::fence_state(&client, &scope)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.token_max, Token::new(2));
    fenced_write(&mut client, &table, &scope, "report", 3, 3)
        .await
        .unwrap();
    drop_user_tables(&client, &table, &scope).await;
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

#[tokio::test]
async fn foreign_locks_and_forgeries_are_refused_and_honest_writers_continue() {
    let Some(url) = database_url() else { return };
    let mut client = connect(&url).await;
    let (table, scope) = (unique("pal_foreign"), unique("scope"));
    create_user_tables(&client, &table).await;
    fenced_write(&mut client, &table, &scope, "report", 5, 1)
        .await
        .unwrap();

    let err = fenced_write(&mut client, &table, &scope, "other", 1000, 9)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FenceError::WrongLock {
            expected: "report".into(),
            presented: "other".into()
        }
    );
    let forged = verify_presented(Some(&forged_text("report", 1 << 62)), &public_keys());
    assert_eq!(forged.unwrap_err().kind(), "forged");

    let txn = client.transaction().await.unwrap();
    let expecting = LockBinding::Expect("jobs");
    let err = postgres::claim_expecting(&txn, &unique("fresh"), &grant("x", 1, 1), expecting)
        .await
        .unwrap_err();
    assert!(err.is_wrong_lock());
    drop(txn);

    fenced_write(&mut client, &table, &scope, "report", 6, 2)
        .await
        .unwrap();
    assert_eq!(value(&client, &table).await, Some(6));
    drop_user_tables(&client, &table, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_commit_in_token_order_and_the_highest_token_wins() {
    const WRITERS: usize = 6;
    const TOKENS: u64 = 150;
    let Some(url) = database_url() else { return };
    let client = connect(&url).await;
    let (table, scope) = (unique("pal_race"), unique("scope"));
    create_user_tables(&client, &table).await;
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
            // exist yet, so the first inserts race too.
            let mut client = connect(&url).await;
            for token in mine {
                match fenced_write(&mut client, &table, &scope, "race", token, writer as u64).await
                {
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
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let rows = client
        .query(&format!("SELECT token FROM {table}_log ORDER BY id"), &[])
        .await;
    let applied: Vec<u64> = rows
        .unwrap()
        .iter()
        .map(|row| row.get::<_, i64>(0) as u64)
        .collect();
    assert_nondecreasing(&applied);
    assert_eq!(applied.last(), Some(&TOKENS));
    assert_eq!(value(&client, &table).await, Some(TOKENS as i64));
    drop_user_tables(&client, &table, &scope).await;
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

/// Reads the counter in a transaction of its own, claiming first when `claim` is set.
async fn read_step(
    client: &mut Client,
    table: &str,
    scope: &str,
    holder: &palisade_sequencer::VerifiedSequencer,
    claim: bool,
) -> i64 {
    let txn = client.transaction().await.unwrap();
    if claim {
        postgres::claim(&txn, scope, holder).await.unwrap();
    }
    let seen = read_counter(&txn, table).await;
    postgres::commit(txn).await.unwrap();
    seen
}

/// Writes `value` to the counter under a claim, in a transaction of its own.
async fn write_step(
    client: &mut Client,
    table: &str,
    scope: &str,
    holder: &palisade_sequencer::VerifiedSequencer,
    value: i64,
) -> Result<(), FenceError> {
    let txn = client.transaction().await.unwrap();
    postgres::claim(&txn, scope, holder).await?;
    let sql = format!("UPDATE {table} SET n = $1 WHERE k = 'c'");
    txn.execute(&sql, &[&value]).await.unwrap();
    postgres::commit(txn).await
}

/// Holder A (token 10) reads the counter, B (token 11) reads it, A writes back its increment,
/// B writes back its own, each step its own transaction. Returns the counter at the end and
/// what A's write came to.
async fn two_increments(claim_reads: bool) -> Option<(i64, Result<(), FenceError>)> {
    let url = database_url()?;
    let mut client = connect(&url).await;
    let (table, scope) = (unique("pal_incr"), unique("scope"));
    create_counter(&client, &table).await;
    let (a, b) = (grant("counter", 10, 1), grant("counter", 11, 2));

    let seen_by_a = read_step(&mut client, &table, &scope, &a, claim_reads).await;
    // A pauses past its lease here; B is granted the lock.
    let seen_by_b = read_step(&mut client, &table, &scope, &b, claim_reads).await;
    let written_by_a = write_step(&mut client, &table, &scope, &a, seen_by_a + 1).await;
    write_step(&mut client, &table, &scope, &b, seen_by_b + 1)
        .await
        .unwrap();

    let value = read_counter(&client, &table).await;
    drop_counter(&client, &table, &scope).await;
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
    assert!(
        written_by_a.is_ok(),
        "no newer grant had claimed, so A's write is accepted"
    );
    assert_eq!(value, 6, "two increments of 5, and one was lost");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claimers_read_modify_write_and_lose_no_increment() {
    const CLAIMERS: usize = 5;
    const TOKENS: u64 = 100;
    let Some(url) = database_url() else { return };
    let client = connect(&url).await;
    let (table, scope) = (unique("pal_claimers"), unique("scope"));
    create_counter(&client, &table).await;
    client
        .batch_execute(&format!(
            "CREATE TABLE {table}_log (id bigserial PRIMARY KEY, token bigint NOT NULL)"
        ))
        .await
        .unwrap();
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
            let mut client = connect(&url).await;
            let mut committed = 0u64;
            for token in mine {
                let txn = client.transaction().await.unwrap();
                match postgres::claim(&txn, &scope, &grant("c", token, claimer as u64)).await {
                    Ok(()) => {}
                    Err(FenceError::Stale { accepted, .. }) => {
                        assert!(accepted > Token::new(token));
                        continue;
                    }
                    Err(other) => panic!("unexpected error {other}"),
                }
                let seen = read_counter(&txn, &table).await;
                let sql = format!("UPDATE {table} SET n = $1 WHERE k = 'c'");
                txn.execute(&sql, &[&(seen + 1)]).await.unwrap();
                let sql = format!("INSERT INTO {table}_log (token) VALUES ($1)");
                txn.execute(&sql, &[&(token as i64)]).await.unwrap();
                postgres::commit(txn).await.unwrap();
                committed += 1;
            }
            committed
        }));
    }
    let mut committed = 0;
    for task in tasks {
        committed += task.await.unwrap();
    }

    assert_eq!(
        read_counter(&client, &table).await,
        5 + committed as i64,
        "every committed increment counted"
    );
    let rows = client
        .query(&format!("SELECT token FROM {table}_log ORDER BY id"), &[])
        .await
        .unwrap();
    let applied: Vec<u64> = rows.iter().map(|row| row.get::<_, i64>(0) as u64).collect();
    assert_eq!(applied.len() as u64, committed);
    assert_nondecreasing(&applied);
    assert_eq!(applied.last(), Some(&TOKENS));
    client
        .batch_execute(&format!("DROP TABLE {table}_log"))
        .await
        .unwrap();
    drop_counter(&client, &table, &scope).await;
}
