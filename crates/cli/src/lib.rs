//! The parts of the `palisade` binary that its integration tests drive in-process.
//!
//! The binary (`main.rs`) dispatches to these as to its other command modules; they live in a
//! library target only so that `tests/` can call them without spawning a process.

pub mod store;
pub mod tls;
