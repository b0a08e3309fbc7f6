//! The Palisade lock service: the lock core driven by openraft, durable in a write-ahead file,
//! served over gRPC.
//!
//! **The API** (what `palisade-cli`, the simulation and embedders use):
//!
//! - [`Server`], [`ServerConfig`], [`Platform`] and [`serve`]: start and run a node;
//! - [`node`]: the running node ([`node::Node`]) and its operations: propose, read, membership,
//!   backup, the token floor and the keys;
//! - [`auth`], [`tls`]: the token file, the policy and TLS, as `palisade serve` loads them;
//! - [`backup`], [`counters`]: `palisade restore` and `palisade recover-counters` on a data
//!   directory;
//! - [`disk`]: how the log's file meets the disk (a simulation injects faults here);
//! - [`limits`]: every bound the server enforces.
//!
//! **Inside** (private): the gRPC services (`grpc`, `cluster`, the web UI `ui`), connection
//! admission (`incoming`, `connection`, `admission`), the log (`wal`) and the key ring.
//!
//! **Reached by tests only** (`#[doc(hidden)]`, not API): [`log_store`], [`state_machine`],
//! [`raft_types`], [`peer`], [`peer_service`] and [`service`], which `server/tests` (openraft's
//! storage suite, the peer transport) and `cli/tests` drive directly.

mod admin_token;
mod admission;
mod applied;
pub mod auth;
pub mod backup;
mod cluster;
mod config;
mod connection;
pub mod counters;
pub mod disk;
mod entropy;
mod files;
mod grpc;
mod identity;
mod incoming;
mod keyring;
mod keys;
pub mod limits;
mod lock_watchers;
#[doc(hidden)]
pub mod log_store;
mod metrics;
pub mod node;
#[doc(hidden)]
pub mod peer;
#[doc(hidden)]
pub mod peer_service;
mod platform;
#[doc(hidden)]
pub mod raft_types;
mod runtime;
mod server;
#[doc(hidden)]
pub mod service;
mod session_secret;
mod snapshot_file;
#[doc(hidden)]
pub mod state_machine;
pub mod tls;
mod ui;
mod wal;

pub use config::{ServeError, ServerConfig};
pub use files::{SECRET_FILE_MODE, write_file_atomically};
pub use incoming::Listener;
pub use limits::CONNECTIONS_MAX;
pub use platform::{Blocking, Platform};
pub use server::{Server, serve, shutdown_signal};
