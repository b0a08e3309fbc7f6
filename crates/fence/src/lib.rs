//! The resource side of Palisade: accept reads and writes only from the current grant of a lock.
//!
//! A lock alone is advisory: a holder paused past its lease still writes. A resource protected
//! by a fence remembers, per *scope*, the highest fencing token it has accepted and refuses older
//! ones — and it does the comparison and the write in one atomic step, storing the accepted
//! maximum in the same commit as the data (invariant 3). Sequencers are verified with the lock
//! service's public key before anything is looked up (invariant 5), and a scope accepts only its
//! own lock's sequencers (invariant 4). The accepted token itself is accepted again only from the
//! session that presented it first: another session presenting it means the lock service issued
//! it twice, refused as [`FenceError::TokenReissued`]. Rejections say which lock, which token was
//! presented and which was accepted (invariant 9).
//!
//! # Claim, then read, then write
//!
//! Fencing the write alone does not protect a read-modify-write. Holder A (token 10) reads a
//! counter, 5, and pauses past its lease; B (token 11) reads 5; A wakes and writes 6 — accepted,
//! since nothing of token 11 has landed — and B writes 6. One increment is lost. So the holder
//! **claims** the scope (advances its accepted token) *before it reads*: once the claim returns,
//! no older grant can write to the scope, and A's write back is refused as
//! [`FenceError::Stale`]. Every backend offers that step:
//!
//! - SQL databases: `claim` is the first statement of the caller's transaction, before its
//!   reads; the reads, the writes and the advance then commit together. A holder that reads in
//!   one transaction and writes in a later one claims in both.
//! - Redis: [`RedisFence::read`] claims and reads in one script; [`RedisFence::write`] and
//!   [`RedisFence::write_if`] apply increments, reads and compare-and-set conditions in the same
//!   script as the check, so a read-modify-write needs no second round trip.
//! - redb: [`RedbFence::begin`] claims and hands over the one write transaction, reads included.
//!
//! # Backends
//!
//! - [`fence`]: the pure decision ([`check`]) every backend runs;
//! - [`Verifier`]: signature checks with a memory of the sequencers that verified;
//! - [`MemoryResource`]: a value behind a mutex;
//! - [`RedbFence`]: an embedded, durable redb database;
//! - [`postgres`]: inside a caller's PostgreSQL transaction;
//! - [`mysql`]: inside a caller's MySQL or MariaDB (InnoDB) transaction;
//! - [`sqlite`]: inside a caller's SQLite transaction;
//! - [`RedisFence`]: a Lua script that checks and applies atomically (read the [`redis`] module's
//!   durability caveats before using it);
//! - [`S3Fence`]: objects in S3-compatible storage, by conditional `PUT` on the ETag; the
//!   [`s3`] module says where the token lives and why;
//! - [`stream`]: the consumer side of a message stream, dropping a superseded producer's messages
//!   with the high-water mark in the consumer's own transaction (the producer side of NATS
//!   JetStream is the crate `palisade-fence-nats`).
//!
//! With the `testing` feature, [`testing`] is the conformance suite every backend passes, for
//! anyone writing a fence of their own.
//!
//! With the `http` feature, [`http::FenceLayer`] puts the fence in front of any axum or tonic
//! service: the sequencer from the `Palisade-Sequencer` header, verified, checked and advanced in
//! a pluggable backend before the service runs.
//!
//! [`FenceStats`] counts what a fence accepted and refused, per lock, for the application to read.
//!
//! Every failure is one [`FenceError`], which says whether the request did not happen and may be
//! retried ([`FenceError::is_retryable`]), did not happen and never will as sent
//! ([`FenceError::is_final`]), or may or may not have happened
//! ([`FenceError::is_outcome_unknown`]).
//!
//! # Protect your own resource (PostgreSQL)
//!
//! ```no_run
//! # async fn example(
//! #     client: &mut tokio_postgres::Client,
//! #     public_keys: &palisade_sequencer::KeySet,
//! #     presented: Option<&str>,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use palisade_fence::{postgres, verify_presented};
//!
//! postgres::ensure_schema(client).await?;
//! // The sequencer the lock holder passed along (e.g. $PALISADE_SEQUENCER or a header).
//! let sequencer = verify_presented(presented, public_keys)?;
//!
//! let txn = client.transaction().await?;
//! // First, before reading: locks the scope's fence row and advances its token, or refuses a
//! // stale sequencer. No older grant can commit to "counters" after this.
//! postgres::claim(&txn, "counters", &sequencer).await?;
//! let row = txn.query_one("SELECT n FROM counters WHERE id = 1", &[]).await?;
//! let n: i64 = row.get(0);
//! txn.execute("UPDATE counters SET n = $1 WHERE id = 1", &[&(n + 1)]).await?;
//! // The write and the token advance commit together; a lost answer is OutcomeUnknown.
//! postgres::commit(txn).await?;
//! # Ok(())
//! # }
//! ```

mod error;
pub mod fence;
#[cfg(feature = "http")]
pub mod http;
mod memory;
pub mod mysql;
pub mod postgres;
pub mod redb;
pub mod redis;
pub mod s3;
pub mod sqlite;
mod stats;
pub mod stream;
#[cfg(feature = "testing")]
pub mod testing;
mod verifier;

pub use error::{FenceError, FenceErrorClass};
pub use fence::{FenceState, Intent, LockBinding, SCOPE_BYTES_MAX, check, verify_presented};
pub use memory::MemoryResource;
pub use redb::{Advance, FenceTable, FencedTxn, RedbFence};
pub use redis::{RedisCondition, RedisFence, RedisOp, RedisOutcome, RedisReply};
pub use s3::{S3Config, S3Fence, S3Object};
pub use stats::{FENCE_STATS_LOCKS_MAX, FenceStats, LockStats, OTHER_LOCKS, UNVERIFIED};
pub use verifier::{VERIFIED_SEQUENCERS_CACHED_MAX, Verifier};
