//! The fenced outbox over the MySQL/MariaDB fence (`palisade_fence::mysql`): the same recipe as
//! the PostgreSQL one ([`super`]), in an InnoDB table.
//!
//! ```text
//! holder:  START TRANSACTION; mysql::claim(scope, sequencer); read; write; outbox::mysql::emit(...); COMMIT
//! relay:   START TRANSACTION (READ COMMITTED); SELECT unpublished rows FOR UPDATE (id order);
//!          publish each with Nats-Msg-Id = "<origin>/<id>"; mark them; COMMIT
//! ```
//!
//! Emits of one scope are ordered by the claim's row lock and take their `AUTO_INCREMENT` ids
//! after it, so their ids are in commit order. The relay reads under READ COMMITTED, so its
//! `FOR UPDATE` locks only the rows it read: under InnoDB's default REPEATABLE READ it would also
//! lock the gap after them and stall every holder's insert while it publishes. A second relay
//! waits on the first's rows and then finds them published (a row published twice anyway carries
//! the same `Nats-Msg-Id`, which the stream's duplicate window drops).

use async_nats::jetstream::Context;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, IsolationLevel, Transaction, TxOpts};
use palisade_fence::FenceError;
use palisade_sequencer::VerifiedSequencer;

use super::{RELAY_BATCH_MAX, publish};

/// An unpublished row as the relay reads it: id, subject, payload, sequencer.
type OutboxRow = (u64, Vec<u8>, Vec<u8>, Vec<u8>);

/// Longest subject an event may have (the column's width).
pub const SUBJECT_BYTES_MAX: usize = 1024;

/// The DDL of the outbox table.
pub fn create_table_sql() -> &'static str {
    "CREATE TABLE IF NOT EXISTS palisade_outbox (
        id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
        subject VARBINARY(1024) NOT NULL,
        payload LONGBLOB NOT NULL,
        sequencer VARBINARY(1024) NOT NULL,
        created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        published_at TIMESTAMP(6) NULL,
        INDEX palisade_outbox_unpublished (published_at, id)
    ) ENGINE = InnoDB"
}

/// Creates the outbox table if it does not exist. Run it outside a transaction: MySQL commits
/// the open transaction before any DDL.
pub async fn ensure_schema(conn: &mut impl Queryable) -> Result<(), FenceError> {
    conn.query_drop(create_table_sql())
        .await
        .map_err(|error| storage("creating palisade_outbox", error))
}

/// Writes an event for `subject` into the outbox, in `txn`, which must have claimed its scope
/// with `sequencer` first (`palisade_fence::mysql::claim`): the event commits with the holder's
/// other writes, or not at all. Returns the row's id.
pub async fn emit(
    txn: &mut Transaction<'_>,
    subject: &str,
    payload: &[u8],
    sequencer: &VerifiedSequencer,
) -> Result<u64, FenceError> {
    if subject.is_empty() || subject.len() > SUBJECT_BYTES_MAX {
        return Err(FenceError::Storage {
            message: format!(
                "an outbox subject is 1 to {SUBJECT_BYTES_MAX} bytes, not {}",
                subject.len()
            ),
        });
    }
    txn.exec_drop(
        "INSERT INTO palisade_outbox (subject, payload, sequencer) VALUES (?, ?, ?)",
        (subject.as_bytes(), payload, sequencer.as_str().as_bytes()),
    )
    .await
    .map_err(|error| storage("writing the event", error))?;
    txn.last_insert_id().ok_or_else(|| FenceError::Storage {
        message: "writing the event: the server returned no id for it".into(),
    })
}

/// Publishes up to `batch` (at most [`RELAY_BATCH_MAX`]) unpublished events in id order, each
/// with `Nats-Msg-Id` `"<origin>/<id>"`, and marks them published; returns how many. As
/// [`super::relay`]: a failure before the commit leaves the rows for the next pass.
pub async fn relay(
    conn: &mut Conn,
    context: &Context,
    origin: &str,
    batch: i64,
) -> Result<usize, FenceError> {
    let mut options = TxOpts::default();
    options.with_isolation_level(IsolationLevel::ReadCommitted);
    let mut txn = conn
        .start_transaction(options)
        .await
        .map_err(|error| storage("starting the relay's transaction", error))?;
    let rows: Vec<OutboxRow> = txn
        .exec(
            "SELECT id, subject, payload, sequencer FROM palisade_outbox
             WHERE published_at IS NULL ORDER BY id LIMIT ? FOR UPDATE",
            (batch.clamp(1, RELAY_BATCH_MAX),),
        )
        .await
        .map_err(|error| storage("reading unpublished events", error))?;
    for (id, subject, payload, sequencer) in &rows {
        let (Ok(subject), Ok(sequencer)) =
            (std::str::from_utf8(subject), std::str::from_utf8(sequencer))
        else {
            return Err(FenceError::Storage {
                message: format!("outbox event {id}: its subject or sequencer is not UTF-8"),
            });
        };
        publish(context, origin, *id, subject, payload.clone(), sequencer).await?;
        txn.exec_drop(
            "UPDATE palisade_outbox SET published_at = CURRENT_TIMESTAMP(6) WHERE id = ?",
            (*id,),
        )
        .await
        .map_err(|error| storage("marking an event published", error))?;
    }
    palisade_fence::mysql::commit(txn).await?;
    Ok(rows.len())
}

fn storage(what: &str, error: mysql_async::Error) -> FenceError {
    FenceError::Storage {
        message: format!("{what}: mysql error: {error}"),
    }
}
