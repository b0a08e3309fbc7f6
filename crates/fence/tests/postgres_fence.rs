//! Scenarios for the PostgreSQL fence against a real server (`PALISADE_TEST_POSTGRES`).

mod common;

use common::{assert_nondecreasing, forged_text, grant, public_key, shuffled, unique};
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
            presented: 3,
            accepted: 8,
            holder_session: Some(2)
        }
    );
    assert_eq!(value(&client, &table).await, Some(8));
    fenced_write(&mut client, &table, &scope, "report", 8, 2)
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
    assert_eq!(state.token_max, 2);
    fenced_write(&mut client, &table, &scope, "report", 3, 3)
        .await
        .unwrap();
    drop_user_tables(&client, &table, &scope).await;
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
    let forged = verify_presented(Some(&forged_text("report", 1 << 62)), &public_key());
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
                        assert!(presented == token && accepted > token);
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
