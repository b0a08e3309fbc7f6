//! Fencing a message stream from the consumer's side: any broker whose messages carry headers
//! (Kafka, RabbitMQ, NATS core or JetStream).
//!
//! A producer puts its grant's sequencer in the [`SEQUENCER_HEADER`] of every message. A
//! consumer drops a message whose token is older than the highest token it has accepted for
//! that lock, and keeps that high-water mark **in its own durable state, in the same commit as
//! its output**: here, the `palisade_fence` row of a scope in the consumer's own database,
//! claimed inside the transaction that writes what the message produced.
//!
//! ```text
//! BEGIN;
//!   admit_postgres(txn, "billing-consumer/invoices", header, verifier)  -- Process or Drop
//!   Process: write the output;   Drop: write nothing (record the drop, if you keep a log)
//!   advance the consumer's offset
//! COMMIT; then ack the message
//! ```
//!
//! The mark must never live only in memory: a consumer that restarts, or a second consumer
//! taking over its partition, would start again from nothing and accept the superseded
//! holder's late messages. That is how xtdb's reader-side fence regressed when its term came
//! from a source that could go back to 1. Kept in the same commit as the output, the mark
//! moves forward exactly when the output does: a crash before the commit loses both, and the
//! message is delivered again and decided again.
//!
//! What a message's header can be, and what the filter decides:
//!
//! - a sequencer of the newest grant seen so far, or of the same grant again: **processed**, and
//!   the mark moves to its token;
//! - an older token, the same token from another session, another lock's sequencer, a forged or
//!   malformed header, or none: **dropped**, with the [`FenceError`] that says why (the stale
//!   one with the presented and the accepted tokens);
//! - the database failed: an `Err`, nothing decided; roll back and let the message be delivered
//!   again.
//!
//! The filter orders messages in the order the consumer reads them. A stale holder's message
//! that reaches the stream *before* the new holder's first message is processed: the filter
//! cannot know yet that the lock moved. A fenced publish (`palisade-fence-nats`) or a fenced
//! outbox closes that gap on the producer's side.

use palisade_sequencer::VerifiedSequencer;

use crate::{FenceError, Verifier, mysql, postgres};

/// The message header that carries the producer's sequencer (its text, as `palisade lock`
/// exports it in `$PALISADE_SEQUENCER`).
pub const SEQUENCER_HEADER: &str = "Palisade-Sequencer";

/// What the consumer filter decided for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The message comes from the newest grant the consumer has seen: process it. The mark was
    /// advanced in the consumer's transaction, and commits with the output.
    Process(VerifiedSequencer),
    /// The message must not take effect; the error says why (stale, reissued, wrong lock, a
    /// reader's message (a producer's message is a write, so a shared grant's is
    /// [`FenceError::SharedWrite`]), missing, malformed or forged sequencer). The mark is
    /// unchanged.
    Drop(FenceError),
}

impl Admission {
    /// Whether the message is to be processed.
    pub fn is_process(&self) -> bool {
        matches!(self, Admission::Process(_))
    }
}

/// Decides, inside the consumer's PostgreSQL transaction, whether a message whose
/// [`SEQUENCER_HEADER`] is `presented` takes effect, advancing the high-water mark of `scope`
/// (one scope per lock the consumer follows) when it does.
///
/// Call it first in the transaction that writes the message's output; the transaction stays
/// usable after a `Drop`, so the consumer can record its offset in it either way. An `Err` is
/// a database failure: roll back and leave the message unacknowledged.
pub async fn admit_postgres(
    txn: &tokio_postgres::Transaction<'_>,
    scope: &str,
    presented: Option<&str>,
    verifier: &Verifier,
) -> Result<Admission, FenceError> {
    let sequencer = match verifier.verify(presented) {
        Ok(sequencer) => sequencer,
        Err(refused) => return Ok(Admission::Drop(refused)),
    };
    let claimed = postgres::claim(txn, scope, &sequencer).await;
    settle(claimed, sequencer)
}

/// [`admit_postgres`] for a consumer whose state lives in MySQL or MariaDB (InnoDB).
pub async fn admit_mysql(
    txn: &mut mysql_async::Transaction<'_>,
    scope: &str,
    presented: Option<&str>,
    verifier: &Verifier,
) -> Result<Admission, FenceError> {
    let sequencer = match verifier.verify(presented) {
        Ok(sequencer) => sequencer,
        Err(refused) => return Ok(Admission::Drop(refused)),
    };
    let claimed = mysql::claim(txn, scope, &sequencer).await;
    settle(claimed, sequencer)
}

/// A claim's result as an admission: a refused sequencer drops the message, any other failure
/// decides nothing.
fn settle(
    claimed: Result<(), FenceError>,
    sequencer: VerifiedSequencer,
) -> Result<Admission, FenceError> {
    match claimed {
        Ok(()) => Ok(Admission::Process(sequencer)),
        Err(refused) if refused.is_rejection() => Ok(Admission::Drop(refused)),
        Err(failed) => Err(failed),
    }
}
