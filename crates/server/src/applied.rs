//! [`Applied`]: everything the state machine has applied, as one value: the lock table, the
//! last log id applied, the membership, the retired node ids and the key ring. A snapshot and
//! a backup are this value encoded; it has a file of its own so that the state machine, the
//! snapshot codec and the backup each depend on it, and not on one another.

use std::collections::BTreeSet;

use openraft::type_config::alias::{LogIdOf, StoredMembershipOf};
use palisade_core::LockTable;
use serde::{Deserialize, Serialize};

use crate::keyring::KeyRing;
use crate::raft_types::C;

/// Everything applied up to `last_applied`: what a snapshot holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Applied {
    pub(crate) table: LockTable,
    pub(crate) last_applied: Option<LogIdOf<C>>,
    pub(crate) membership: StoredMembershipOf<C>,
    /// Ids of nodes that were members and were removed: never given to another directory.
    /// Absent from snapshots of versions before it, and from snapshots where it is empty.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) retired: BTreeSet<u64>,
    /// The signing keys, once anyone has rotated (see [`crate::keyring`]). Absent from
    /// snapshots of versions before it, and from snapshots where it is empty.
    #[serde(default, skip_serializing_if = "KeyRing::is_empty")]
    pub(crate) keys: KeyRing,
}
