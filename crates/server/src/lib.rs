//! The Palisade lock service: the lock core driven by openraft, durable in a write-ahead file,
//! served over gRPC.
//!
//! - [`node`]: the Raft instance, the leader's clock, the lease driver and the signing key;
//! - [`log_store`]: the Raft log with group commit, on the write-ahead file of [`wal`];
//! - [`state_machine`]: the lock table as openraft's state machine, with snapshots;
//! - [`service`]: the lock service's operations, independent of any transport;
//! - [`grpc`]: the `palisade.v1.Locks` gRPC service, a conversion layer over [`service`];
//! - [`cluster`]: the `palisade.v1.Cluster` gRPC service (membership, for operators);
//! - [`auth`]: bearer tokens, the policy file and per-identity quotas;
//! - [`peer`] and [`peer_service`]: Raft traffic between nodes, sending and receiving;
//! - [`metrics`]: Prometheus metric names and exporter;
//! - [`ui`]: the read-only web UI (`--ui-listen`) and its timeline of grants.

pub mod admin_token;
mod admission;
mod applied;
pub mod auth;
pub mod backup;
pub mod cluster;
mod config;
mod connection;
pub mod counters;
pub mod disk;
mod entropy;
mod files;
pub mod grpc;
mod identity;
mod incoming;
pub mod keyring;
mod keys;
pub mod limits;
pub mod lock_watchers;
pub mod log_store;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod peer_service;
mod platform;
pub mod raft_types;
pub mod runtime;
mod server;
pub mod service;
pub mod session_secret;
mod snapshot_file;
pub mod state_machine;
pub mod tls;
pub mod ui;
pub mod wal;

pub use config::{ServeError, ServerConfig};
pub use files::{SECRET_FILE_MODE, write_file_atomically};
pub use incoming::Listener;
pub use limits::CONNECTIONS_MAX;
pub use platform::{Blocking, Platform};
pub use server::{Server, serve, shutdown_signal};
