//! The openraft type configuration: what the Raft log carries and what applying it returns.
//!
//! A log entry's payload is a [`Proposal`]: almost always one [`palisade_core::Input`] (a
//! lock-table command stamped with the leader's clock), whose applying yields the table's
//! [`palisade_core::Output`]; rarely a change to the cluster's signing keys.

use std::io::Cursor;

use crate::keyring::KeyChange;

openraft::declare_raft_types!(
    /// The Raft types of the lock service.
    pub TypeConfig:
        D = Proposal,
        R = palisade_core::Output,
        NodeId = u64,
        Node = Member,
        AsyncRuntime = crate::runtime::PalisadeRuntime,
);

/// What a normal log entry carries.
///
/// Untagged, so that a lock-table input is stored exactly as before key changes existed
/// (`{"now_ms":…,"command":…}`) and logs from then load unchanged; a key change is
/// `{"keys":{…}}`, which no input matches.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Proposal {
    Lock(palisade_core::Input),
    Keys { keys: KeyChange },
}

impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proposal::Lock(input) => input.fmt(f),
            Proposal::Keys { keys } => write!(f, "key change: {keys:?}"),
        }
    }
}

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
    /// (recorded before incarnations existed). See `identity`.
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

#[cfg(test)]
mod tests {
    use palisade_core::{Command, Input, TimeMs};

    use super::*;
    use crate::keyring::{KeyChange, Secret};

    #[test]
    fn a_lock_input_is_stored_as_before_key_changes_and_both_read_back() {
        let input = Input {
            now_ms: TimeMs::from_millis(5),
            command: Command::Tick,
        };
        let stored = serde_json::to_string(&Proposal::Lock(input.clone())).unwrap();
        assert_eq!(stored, serde_json::to_string(&input).unwrap());
        assert_eq!(
            serde_json::from_str::<Proposal>(&stored).unwrap(),
            Proposal::Lock(input)
        );

        let key = Secret::of(&palisade_sequencer::SigningKey::from_bytes([3; 32]));
        let change = Proposal::Keys {
            keys: KeyChange::Rotate { key: key.id() },
        };
        let stored = serde_json::to_string(&change).unwrap();
        assert!(stored.starts_with(r#"{"keys":"#), "{stored}");
        assert_eq!(serde_json::from_str::<Proposal>(&stored).unwrap(), change);
    }
}
