//! The fenced outbox against real PostgreSQL (`PALISADE_TEST_POSTGRES`) and NATS JetStream
//! (`PALISADE_TEST_NATS`): a stale holder's event never reaches the stream, and a relay that
//! publishes again after losing its bookkeeping adds no duplicate.

mod common;

use common::{assert_each_event_once, grant, unique};
use palisade_fence::postgres;
use palisade_fence_nats::outbox;
use palisade_sequencer::VerifiedSequencer;
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// One holder's critical section: claim, then write the event, then commit.
async fn emit(
    client: &mut Client,
    subject: &str,
    sequencer: &VerifiedSequencer,
    event: &str,
) -> bool {
    let txn = client.transaction().await.unwrap();
    if let Err(refused) = postgres::claim(&txn, "invoices", sequencer).await {
        assert!(refused.is_stale(), "{refused:?}");
        return false;
    }
    outbox::emit(&txn, subject, event.as_bytes(), sequencer)
        .await
        .unwrap();
    postgres::commit(txn).await.unwrap();
    true
}

#[tokio::test]
async fn only_accepted_events_are_relayed_and_a_relay_retry_adds_no_duplicate() {
    let (Ok(pg), Ok(nats)) = (
        std::env::var("PALISADE_TEST_POSTGRES"),
        std::env::var("PALISADE_TEST_NATS"),
    ) else {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: PALISADE_TEST_POSTGRES or PALISADE_TEST_NATS not set; the outbox test did not run"
        );
        return;
    };
    let schema = unique("outbox");
    let admin = connect(&pg).await;
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let mut client = connect(&format!("{pg} options='-c search_path={schema}'")).await;
    postgres::ensure_schema(&client).await.unwrap();
    outbox::ensure_schema(&client).await.unwrap();

    let context = palisade_fence_nats::connect(&nats).await.unwrap();
    let stream_name = unique("OUTBOX");
    let mut stream = common::stream(&context, &stream_name).await;

    let subject = format!("{stream_name}.invoices");
    let (a, b) = (grant(5, 1), grant(6, 2));
    assert!(emit(&mut client, &subject, &a, "from a").await);
    assert!(emit(&mut client, &subject, &b, "from b").await);
    assert!(
        !emit(&mut client, &subject, &a, "from a, late").await,
        "a stale holder's event is refused"
    );
    assert_eq!(
        outbox::relay(&mut client, &context, &schema, 100)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        outbox::relay(&mut client, &context, &schema, 100)
            .await
            .unwrap(),
        0
    );

    // The relay's bookkeeping is lost (as if it crashed after publishing, before its commit):
    // it publishes both again, and the stream's duplicate window keeps one of each.
    client
        .execute("UPDATE palisade_outbox SET published_at = NULL", &[])
        .await
        .unwrap();
    assert_eq!(
        outbox::relay(&mut client, &context, &schema, 100)
            .await
            .unwrap(),
        2
    );
    assert_each_event_once(&mut stream, &a).await;

    context.delete_stream(&stream_name).await.unwrap();
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
