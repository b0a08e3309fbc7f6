//! Which node a data directory belongs to: its node id and its *incarnation*, a random number
//! drawn when the directory is first used.
//!
//! A node id is never reused. A member whose directory was wiped and which comes back under its
//! old id has forgotten votes and log entries the cluster counted on, and could let two
//! quorums form. Its new directory has a new incarnation, and the cluster's membership records
//! the incarnation each member had when it was admitted, so peers refuse it (see
//! [`crate::raft_types::Member`]).

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::files::write_file_atomically;

const IDENTITY_FILE: &str = "node.json";

/// The identity of the node that owns a data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub node_id: u64,
    pub incarnation: u64,
}

/// Loads the identity in `dir`, or creates one for `node_id` in a directory that has none.
///
/// A directory from before identities existed holds a log of node 1 (the only id a single node
/// had): `had_log` says whether the directory already held one. Refuses a directory that
/// belongs to another node id.
pub fn load_or_create(dir: &Path, node_id: u64, had_log: bool) -> io::Result<Identity> {
    let path = dir.join(IDENTITY_FILE);
    let identity = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<Identity>(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a node identity: {e}", path.display()),
            )
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let identity = Identity {
                node_id: if had_log { 1 } else { node_id },
                incarnation: random_incarnation()?,
            };
            write_file_atomically(dir, IDENTITY_FILE, &serde_json::to_vec(&identity)?, None)?;
            identity
        }
        Err(e) => return Err(e),
    };
    if identity.node_id != node_id {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} belongs to node {}, not node {node_id}: start it with --node-id {}, or give \
                 node {node_id} a directory of its own",
                dir.display(),
                identity.node_id,
                identity.node_id
            ),
        ));
    }
    Ok(identity)
}

fn random_incarnation() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    crate::entropy::fill(&mut bytes).map_err(io::Error::other)?;
    // 0 is what members recorded before incarnations existed carry: never drawn.
    Ok(u64::from_le_bytes(bytes).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_keeps_its_node_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), 3, false).unwrap();
        assert_eq!(first.node_id, 3);
        assert_ne!(first.incarnation, 0);
        assert_eq!(load_or_create(dir.path(), 3, false).unwrap(), first);
        let refused = load_or_create(dir.path(), 4, false).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("belongs to node 3, not node 4"),
            "{refused}"
        );
    }

    #[test]
    fn a_directory_from_before_identities_is_node_one() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_or_create(dir.path(), 1, true).unwrap().node_id, 1);
        let other = tempfile::tempdir().unwrap();
        assert!(load_or_create(other.path(), 2, true).is_err());
    }
}
