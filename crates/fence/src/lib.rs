//! The resource side of Palisade: accept a write only from the current grant of a lock.
//!
//! A lock alone is advisory: a holder paused past its lease still writes. A resource protected
//! by a fence remembers, per *scope*, the highest fencing token it has accepted and refuses older
//! ones — and it does the comparison and the write in one atomic step, storing the accepted
//! maximum in the same commit as the data (invariant 3). Sequencers are verified with the lock
//! service's public key before anything is looked up (invariant 5), and a scope accepts only its
//! own lock's sequencers (invariant 4). Rejections say which lock, which token was presented and
//! which was accepted (invariant 9).
//!
//! - [`fence`]: the pure decision ([`check`]) every backend runs;
//! - [`Verifier`]: signature checks with a memory of the sequencers that verified;
//! - [`MemoryResource`]: a value behind a mutex;
//! - [`RedbFence`]: an embedded, durable redb database;
//! - [`postgres`]: inside a caller's PostgreSQL transaction;
//! - [`sqlite`]: inside a caller's SQLite transaction;
//! - [`RedisFence`]: a Lua script that checks and writes atomically (read the [`redis`] module's
//!   durability caveats before using it).
//!
//! # Protect your own resource (PostgreSQL)
//!
//! ```no_run
//! # async fn example(
//! #     client: &mut tokio_postgres::Client,
//! #     public_key: &palisade_sequencer::PublicKey,
//! #     presented: Option<&str>,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use palisade_fence::{postgres, verify_presented};
//!
//! postgres::ensure_schema(client).await?;
//! // The sequencer the lock holder passed along (e.g. $PALISADE_SEQUENCER or a header).
//! let sequencer = verify_presented(presented, public_key)?;
//!
//! let txn = client.transaction().await?;
//! // Locks the scope's fence row and advances its token, or refuses a stale sequencer.
//! postgres::claim(&txn, "reports", &sequencer).await?;
//! txn.execute("UPDATE reports SET body = $1 WHERE id = 1", &[&"nightly"]).await?;
//! txn.commit().await?; // the write and the token advance commit together
//! # Ok(())
//! # }
//! ```

mod error;
pub mod fence;
mod memory;
pub mod mysql;
pub mod postgres;
pub mod redb;
pub mod redis;
pub mod sqlite;
mod verifier;

pub use error::FenceError;
pub use fence::{FenceState, LockBinding, SCOPE_BYTES_MAX, check, verify_presented};
pub use memory::MemoryResource;
pub use redb::{Advance, FencedTxn, RedbFence};
pub use redis::{RedisFence, RedisOp};
pub use verifier::{VERIFIED_SEQUENCERS_CACHED_MAX, Verifier};
