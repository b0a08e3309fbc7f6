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
        Node = openraft::BasicNode,
);

pub type C = TypeConfig;
pub type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
/// A snapshot travels and rests as the bytes of one JSON document.
pub type SnapshotData = Cursor<Vec<u8>>;
pub type PalisadeRaft = openraft::Raft<TypeConfig, crate::state_machine::StateMachine>;
