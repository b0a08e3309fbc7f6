//! How a grant holds its lock ([`Access`]) and how an acquire asks to hold it ([`Mode`]).
//!
//! Three primitives share one lock table and one token counter:
//!
//! - a **lock** held *exclusively* (a mutex, or a read-write lock's writer): one holder, its own
//!   token;
//! - a lock held *shared* (a read-write lock's readers): readers are admitted in phases, and a
//!   phase draws one token when it opens, which every reader admitted in it carries;
//! - a **semaphore** of `N` permits: each permit is a *slot* `k` in `0..N` with a token of its
//!   own, and a resource keeps its accepted maximum per slot.
//!
//! A lock name is either a lock (taken exclusive or shared) or a semaphore (taken by permit),
//! decided by the first acquire while the name is in use; a semaphore's `N` likewise.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The most permits a semaphore can have: slots are `0..N` with `N <= PERMITS_MAX`.
pub const PERMITS_MAX: u32 = 4096;

/// How one grant holds its lock. Part of the grant's sequencer (`pal2` for [`Access::Exclusive`],
/// `pal3` with the access for the others), so a resource can apply the rule of each.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub enum Access {
    /// The only holder: a mutex, or a read-write lock's writer.
    #[default]
    Exclusive,
    /// One reader of a shared phase: every reader of the phase carries the phase's token.
    Shared,
    /// The permit in slot `k` of a semaphore, `k < PERMITS_MAX`.
    Slot(u32),
}

impl Access {
    pub fn is_exclusive(&self) -> bool {
        *self == Access::Exclusive
    }

    /// The slot of a semaphore's permit.
    pub fn slot(&self) -> Option<u32> {
        match self {
            Access::Slot(slot) => Some(*slot),
            _ => None,
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Access::Exclusive => f.write_str("exclusive"),
            Access::Shared => f.write_str("shared"),
            Access::Slot(slot) => write!(f, "slot {slot}"),
        }
    }
}

/// How an acquire asks to hold a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Mode {
    /// Alone: a mutex, or a read-write lock's writer.
    #[default]
    Exclusive,
    /// Beside other shared holders, in a phase no writer interrupts.
    Shared,
    /// One permit of a semaphore of this many permits (`1..=PERMITS_MAX`).
    Permit(u32),
}

impl Mode {
    pub fn is_exclusive(&self) -> bool {
        *self == Mode::Exclusive
    }

    /// The semaphore's size, for a permit.
    pub fn permits(&self) -> Option<u32> {
        match self {
            Mode::Permit(permits) => Some(*permits),
            _ => None,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("exclusive"),
            Mode::Shared => f.write_str("shared"),
            Mode::Permit(permits) => write!(f, "a permit of {permits}"),
        }
    }
}

/// The most locks one multi-lock ([`crate::Command::AcquireAll`]) can name.
pub const MULTI_LOCKS_MAX: u32 = 32;

/// One lock of a multi-lock, and how it asks to hold it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AcquirePart {
    pub lock: String,
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
}

/// One lock of a granted multi-lock: its own token and access, as a single grant's.
///
/// Its access is always written, exclusive too: a remembered [`crate::Reply::GrantedAll`] is
/// stored in the snapshot's positional image, where a skipped field would shift the rest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GrantedPart {
    pub lock: String,
    pub token: crate::Token,
    pub access: Access,
}
