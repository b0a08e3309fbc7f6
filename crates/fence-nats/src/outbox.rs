//! A fenced outbox over the PostgreSQL fence: the event is a row, written in the holder's fenced
//! transaction; a relay publishes the rows to JetStream with a `Nats-Msg-Id`, so the stream only
//! ever sees events whose transaction the fence accepted, and a relay that crashes between its
//! publish and its bookkeeping publishes again without a duplicate.
//!
//! ```text
//! holder:  BEGIN; postgres::claim(scope, sequencer); read; write; outbox::emit(subject, payload); COMMIT
//! relay:   BEGIN; SELECT unpublished rows FOR UPDATE (id order); publish each with
//!          Nats-Msg-Id = "<origin>/<id>" and the holder's Palisade-Sequencer; mark them; COMMIT
//! ```
//!
//! A stale holder's claim is refused, so its event row is never written, however late it runs.
//! Emits of one scope are ordered by the claim's row lock, so their ids are in commit order and
//! the relay publishes them in that order. The relay's `FOR UPDATE` makes a second relay wait
//! rather than publish the same rows out of order. The stream's duplicate window (two minutes
//! by default) must outlast a relay's restart; a longer outage can publish a row twice, which a
//! consumer filter ([`palisade_fence::stream`]) or an idempotent consumer absorbs.
//!
//! The same recipe over the MySQL/MariaDB fence is [`mysql`].

pub mod mysql;

use async_nats::jetstream::Context;
use async_nats::jetstream::message::PublishMessage;
use palisade_fence::FenceError;
use palisade_sequencer::VerifiedSequencer;
use tokio_postgres::{Client, GenericClient, Transaction};

use crate::SEQUENCER_HEADER;

/// Most rows one [`relay`] pass publishes.
pub const RELAY_BATCH_MAX: i64 = 1000;

/// The DDL of the outbox table.
pub fn create_table_sql() -> &'static str {
    "CREATE TABLE IF NOT EXISTS palisade_outbox (
        id bigserial PRIMARY KEY,
        subject text NOT NULL,
        payload bytea NOT NULL,
        sequencer text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        published_at timestamptz
    );
    CREATE INDEX IF NOT EXISTS palisade_outbox_unpublished ON palisade_outbox (id)
        WHERE published_at IS NULL"
}

/// Creates the outbox table if it does not exist.
pub async fn ensure_schema(client: &impl GenericClient) -> Result<(), FenceError> {
    client
        .batch_execute(create_table_sql())
        .await
        .map_err(|error| storage("creating palisade_outbox", error))
}

/// Writes an event for `subject` into the outbox, in `txn`, which must have claimed its scope
/// with `sequencer` first (`palisade_fence::postgres::claim`): the event commits with the
/// holder's other writes, or not at all. Returns the row's id.
pub async fn emit(
    txn: &Transaction<'_>,
    subject: &str,
    payload: &[u8],
    sequencer: &VerifiedSequencer,
) -> Result<i64, FenceError> {
    let row = txn
        .query_one(
            "INSERT INTO palisade_outbox (subject, payload, sequencer) VALUES ($1, $2, $3) RETURNING id",
            &[&subject, &payload, &sequencer.as_str()],
        )
        .await
        .map_err(|error| storage("writing the event", error))?;
    Ok(row.get(0))
}

/// Publishes up to `batch` (at most [`RELAY_BATCH_MAX`]) unpublished events in id order, each
/// with `Nats-Msg-Id` `"<origin>/<id>"` (`origin` names this outbox among those feeding the
/// stream, e.g. the database), and marks them published. Returns how many it published.
///
/// A failure before the commit leaves the rows unpublished for the next pass; the stream's
/// duplicate window drops what was already published.
pub async fn relay(
    client: &mut Client,
    context: &Context,
    origin: &str,
    batch: i64,
) -> Result<usize, FenceError> {
    let txn = client
        .transaction()
        .await
        .map_err(|error| storage("starting the relay's transaction", error))?;
    let rows = txn
        .query(
            "SELECT id, subject, payload, sequencer FROM palisade_outbox
             WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE",
            &[&batch.clamp(1, RELAY_BATCH_MAX)],
        )
        .await
        .map_err(|error| storage("reading unpublished events", error))?;
    for row in &rows {
        let (id, subject): (i64, String) = (row.get(0), row.get(1));
        let (payload, sequencer): (Vec<u8>, String) = (row.get(2), row.get(3));
        publish(context, origin, id, &subject, payload, &sequencer).await?;
        txn.execute(
            "UPDATE palisade_outbox SET published_at = now() WHERE id = $1",
            &[&id],
        )
        .await
        .map_err(|error| storage("marking an event published", error))?;
    }
    palisade_fence::postgres::commit(txn).await?;
    Ok(rows.len())
}

/// Publishes one outbox row with `Nats-Msg-Id` `"<origin>/<id>"` and its holder's sequencer,
/// and waits for the stream's ack.
async fn publish(
    context: &Context,
    origin: &str,
    id: impl std::fmt::Display,
    subject: &str,
    payload: Vec<u8>,
    sequencer: &str,
) -> Result<(), FenceError> {
    let message = PublishMessage::build()
        .payload(payload.into())
        .message_id(format!("{origin}/{id}"))
        .header(SEQUENCER_HEADER, sequencer);
    let failed = |error: &dyn std::fmt::Display| FenceError::Storage {
        message: format!("relaying event {id} to {subject:?}: {error}"),
    };
    // An ack marked duplicate is a row an earlier relay published and did not get to mark.
    context
        .send_publish(subject.to_owned(), message)
        .await
        .map_err(|error| failed(&error))?
        .await
        .map_err(|error| failed(&error))?;
    Ok(())
}

fn storage(what: &str, error: tokio_postgres::Error) -> FenceError {
    FenceError::Storage {
        message: format!("{what}: postgresql error: {error}"),
    }
}
