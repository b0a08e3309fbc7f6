//! The consumer-side token filter against a real PostgreSQL (`PALISADE_TEST_POSTGRES`): which
//! messages a consumer processes, and that its high-water mark survives a restart and rolls back
//! with the output.

mod common;

use common::{forged_text, grant, public_keys, unique};
use palisade_fence::stream::{Admission, admit_postgres};
use palisade_fence::{Verifier, postgres};
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// One delivery: the filter and the output in one transaction. Returns what was decided, as
/// "process" or the refusal's kind.
async fn consume(
    client: &mut Client,
    table: &str,
    scope: &str,
    verifier: &Verifier,
    payload: &str,
    header: Option<&str>,
) -> String {
    let txn = client.transaction().await.unwrap();
    let admission = admit_postgres(&txn, scope, header, verifier).await.unwrap();
    if admission.is_process() {
        txn.execute(
            &format!("INSERT INTO {table} (payload) VALUES ($1)"),
            &[&payload],
        )
        .await
        .unwrap();
    }
    postgres::commit(txn).await.unwrap();
    match admission {
        Admission::Process(_) => "process".into(),
        Admission::Drop(refusal) => refusal.kind().into(),
    }
}

#[tokio::test]
async fn a_superseded_producers_late_messages_are_dropped_even_after_a_restart() {
    let Ok(url) = std::env::var("PALISADE_TEST_POSTGRES") else {
        common::skip("SKIP: PALISADE_TEST_POSTGRES not set; the stream filter test did not run");
        return;
    };
    let (table, scope) = (unique("output"), unique("consumer/invoices"));
    let verifier = Verifier::new(public_keys());
    let (a, b) = (grant("invoices", 5, 1), grant("invoices", 6, 2));
    let forged = forged_text("invoices", 99);
    let mut client = connect(&url).await;
    postgres::ensure_schema(&client).await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text NOT NULL)"
        ))
        .await
        .unwrap();

    // The stream as the consumer reads it: A, then B's first message, then A's late one.
    let delivered = [
        ("a1", Some(a.as_str())),
        ("b1", Some(b.as_str())),
        ("a2", Some(a.as_str())),
        ("forged", Some(forged.as_str())),
        ("none", None),
        ("b2", Some(b.as_str())),
    ];
    let mut decided = Vec::new();
    for (payload, header) in delivered {
        decided.push(consume(&mut client, &table, &scope, &verifier, payload, header).await);
    }
    assert_eq!(
        decided,
        [
            "process", "process", "stale", "forged", "missing", "process"
        ]
    );

    // A newer grant's message whose processing rolls back leaves the mark where it was.
    let txn = client.transaction().await.unwrap();
    let c = grant("invoices", 7, 3);
    assert!(
        admit_postgres(&txn, &scope, Some(c.as_str()), &verifier)
            .await
            .unwrap()
            .is_process()
    );
    drop(txn);

    // A restarted consumer (a new connection) still drops A's messages and still takes B's.
    let mut restarted = connect(&url).await;
    let late = consume(
        &mut restarted,
        &table,
        &scope,
        &verifier,
        "a3",
        Some(a.as_str()),
    )
    .await;
    assert_eq!(late, "stale");
    let more = consume(
        &mut restarted,
        &table,
        &scope,
        &verifier,
        "b3",
        Some(b.as_str()),
    )
    .await;
    assert_eq!(more, "process");
    let rows = restarted
        .query(&format!("SELECT payload FROM {table} ORDER BY id"), &[])
        .await
        .unwrap();
    let output: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(output, ["a1", "b1", "b2", "b3"]);

    restarted
        .batch_execute(&format!(
            "DROP TABLE {table}; DELETE FROM palisade_fence WHERE scope = '{scope}'"
        ))
        .await
        .unwrap();
}
