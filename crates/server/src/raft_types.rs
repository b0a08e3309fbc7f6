//! The openraft type configuration: what the Raft log carries and what applying it returns.
//!
//! A log entry's payload is one [`palisade_core::Input`] (a lock-table command stamped with the
//! leader's clock); applying it yields the table's [`palisade_core::Output`].

use std::io::Cursor;

openraft::declare_raft_types!(
    /// The Raft types of the lock service.
    pub TypeConfig:
        D = palisade_core::Input,
        R = palisade_core::Output,
        NodeId = u64,
        Node = Member,
);

/// A member of the cluster as the membership records it.
///
/// Serialised exactly like openraft's `BasicNode` (`{"addr": ...}`) plus `incarnation`, so the
/// logs and snapshots of single nodes from before clusters load unchanged (their one member has
/// address "" and incarnation 0).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Where clients and peers reach the member (`host:port`).
    pub addr: String,
    /// The incarnation of the member's data directory when it was admitted; 0 if unknown
    /// (recorded before incarnations existed). See [`crate::identity`].
    #[serde(default)]
    pub incarnation: u64,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.addr)
    }
}

pub type C = TypeConfig;
pub type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
/// A snapshot travels and rests as the bytes of one JSON document.
pub type SnapshotData = Cursor<Vec<u8>>;
pub type PalisadeRaft = openraft::Raft<TypeConfig, crate::state_machine::StateMachine>;
