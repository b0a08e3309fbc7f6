//! The deterministic lock table of Palisade.
//!
//! Sessions with leases, exclusive locks with FIFO waiters, fencing tokens and deduplication of
//! retries (request ids within one session; random open keys, compared across every client, for
//! opening a session), as a pure state machine: [`Input`]s (a [`Command`] and the time it takes
//! effect) go in, [`Output`]s (a reply and [`Event`]s) come out.
//!
//! **Architecture Invariant:** this crate does no I/O, reads no clock, spawns nothing and uses
//! no randomness; it depends on no async runtime (`.ci/run` checks its dependency tree). That is
//! what lets the Raft log replicate its inputs and the property tests drive it exhaustively.

mod access;
pub mod canary;
pub mod duration;
pub mod error_chain;
mod ids;
pub mod limits;
mod table;
mod time;
mod types;

pub use access::{Access, AcquirePart, GrantedPart, MULTI_LOCKS_MAX, Mode, PERMITS_MAX};
pub use limits::Limits;
pub use table::{InvalidTable, LockTable, TableImage, TableImageV1, TableImageV2, Usage};
pub use types::*;
