//! gRPC definitions of the Palisade lock service, generated from `proto/palisade.proto`, and of
//! the Raft traffic between its nodes, generated from `proto/palisade_raft.proto`.
//!
//! `palisade.proto` is the contract for clients in other languages; this crate is the Rust
//! rendering of it, shared by the server and the Rust client. [`error`] owns the wire form of
//! the lock table's errors. [`raft::v1`] is spoken only between the nodes of one cluster.

pub mod error;
pub mod transport;

/// Version 1 of the API: `palisade.v1`.
#[allow(missing_debug_implementations, clippy::all)]
pub mod v1 {
    tonic::include_proto!("palisade.v1");
}

/// Raft traffic between the nodes of a cluster: `palisade.raft.v1`.
pub mod raft {
    /// Version 1 of the peer protocol: `palisade.raft.v1`.
    #[allow(missing_debug_implementations, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("palisade.raft.v1");
    }
}

/// The lock service's default gRPC address, on loopback.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7457";
/// The default listen address of `palisade serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7457";
/// Largest gRPC message the server or client accepts, in bytes.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024;

/// Response metadata naming the leader's node id, sent with `UNAVAILABLE` by a member that is
/// not the leader (and knows who is).
pub const LEADER_ID_HEADER: &str = "palisade-leader-id";
/// Response metadata with the leader's address (`host:port`), beside [`LEADER_ID_HEADER`].
pub const LEADER_ADDR_HEADER: &str = "palisade-leader-addr";

/// The longest address a cluster member may have (`--advertise`, `--initial-cluster`,
/// `AddMember`).
pub const MEMBER_ADDRESS_BYTES_MAX: usize = 255;

/// Checks a cluster member's address: `HOST:PORT`, a port from 1 to 65535, no spaces or control
/// characters, at most [`MEMBER_ADDRESS_BYTES_MAX`] bytes. The error says what is wrong.
pub fn validate_member_address(address: &str) -> Result<(), String> {
    if address.len() > MEMBER_ADDRESS_BYTES_MAX {
        return Err(format!(
            "an address is at most {MEMBER_ADDRESS_BYTES_MAX} bytes, this one has {}",
            address.len()
        ));
    }
    if address.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{address:?} is not an address: it contains a space or control character"
        ));
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(())
        }
        _ => Err(format!(
            "{address:?} is not HOST:PORT with a port from 1 to 65535"
        )),
    }
}
