//! The fenced outbox over MySQL/MariaDB (`PALISADE_TEST_MYSQL`) and NATS JetStream
//! (`PALISADE_TEST_NATS`): a stale holder's event never reaches the stream, and a relay that
//! publishes again after losing its bookkeeping adds no duplicate.

mod common;

use common::{assert_each_event_once, grant, unique};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, TxOpts};
use palisade_fence::mysql;
use palisade_fence_nats::outbox;
use palisade_sequencer::VerifiedSequencer;

/// One holder's critical section: claim, then write the event, then commit.
async fn emit(conn: &mut Conn, subject: &str, sequencer: &VerifiedSequencer, event: &str) -> bool {
    let mut txn = conn.start_transaction(TxOpts::default()).await.unwrap();
    if let Err(refused) = mysql::claim(&mut txn, "invoices", sequencer).await {
        assert!(refused.is_stale(), "{refused:?}");
        return false;
    }
    outbox::mysql::emit(&mut txn, subject, event.as_bytes(), sequencer)
        .await
        .unwrap();
    mysql::commit(txn).await.unwrap();
    true
}

#[tokio::test]
async fn only_accepted_events_are_relayed_and_a_relay_retry_adds_no_duplicate() {
    let (Ok(url), Ok(nats)) = (
        std::env::var("PALISADE_TEST_MYSQL"),
        std::env::var("PALISADE_TEST_NATS"),
    ) else {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: PALISADE_TEST_MYSQL or PALISADE_TEST_NATS not set; the MySQL outbox test did not run"
        );
        return;
    };
    let database = unique("outbox");
    let mut admin = Conn::from_url(&url).await.unwrap();
    admin
        .query_drop(format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let opts = Opts::from(
        OptsBuilder::from_opts(Opts::from_url(&url).unwrap()).db_name(Some(database.clone())),
    );
    let mut conn = Conn::new(opts.clone()).await.unwrap();
    mysql::ensure_schema(&mut conn).await.unwrap();
    outbox::mysql::ensure_schema(&mut conn).await.unwrap();

    let context = palisade_fence_nats::connect(&nats).await.unwrap();
    let stream_name = unique("OUTBOX_MYSQL");
    let mut stream = common::stream(&context, &stream_name).await;

    let subject = format!("{stream_name}.invoices");
    let (a, b) = (grant(5, 1), grant(6, 2));
    assert!(emit(&mut conn, &subject, &a, "from a").await);
    assert!(emit(&mut conn, &subject, &b, "from b").await);
    assert!(
        !emit(&mut conn, &subject, &a, "from a, late").await,
        "a stale holder's event is refused"
    );
    assert_eq!(
        outbox::mysql::relay(&mut conn, &context, &database, 100)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        outbox::mysql::relay(&mut conn, &context, &database, 100)
            .await
            .unwrap(),
        0
    );

    // The relay's bookkeeping is lost (as if it crashed after publishing, before its commit):
    // it publishes both again, and the stream's duplicate window keeps one of each.
    conn.query_drop("UPDATE palisade_outbox SET published_at = NULL")
        .await
        .unwrap();
    assert_eq!(
        outbox::mysql::relay(&mut conn, &context, &database, 100)
            .await
            .unwrap(),
        2
    );
    assert_each_event_once(&mut stream, &a).await;

    context.delete_stream(&stream_name).await.unwrap();
    admin
        .query_drop(format!("DROP DATABASE {database}"))
        .await
        .unwrap();
}
