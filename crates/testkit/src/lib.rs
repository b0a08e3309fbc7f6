//! The one test kit of Palisade's own tests: how a test runs the `palisade` command, starts a
//! lock service or a fenced store (as a child process or in this process), and signs the
//! sequencers a store is shown. A dev-dependency only; nothing here is shipped.
//!
//! - [`command`]: the `palisade` command (or any program) with the caller's `PALISADE_*` and
//!   `RUST_LOG` variables removed, and [`run()`] to run one to completion under a deadline;
//! - [`process`]: `palisade serve` and `palisade store serve` as child processes that a test can
//!   `kill -9`, freeze, terminate and start again on the same data directory and port;
//! - [`deployment`]: [`Palisade`], a lock service (and optionally a fenced store) on a temporary
//!   directory with `palisade` commands aimed at it, for the CLI's tests;
//! - [`in_process`]: the lock service and the store server in the test's own runtime;
//! - [`keys`]: a lock service's signing key without a lock service, for store tests;
//! - [`cluster`]: [`LocalCluster`], nodes of one replicated lock service as processes, on
//!   loopback or each in a network namespace of its own;
//! - [`netns`]: [`Network`], a bridge and one network namespace per node, with the faults a
//!   partition test puts between nodes (two-way cuts, one-way cuts, healing), torn down on
//!   drop; gated by [`netns::enabled`] (`PALISADE_TEST_NETNS`, root and iproute2);
//! - [`child`]: any child a test spawns, killed if the test ends first, its output (whole or
//!   line by line), and the files a child's script writes ([`wait_for_file`]);
//! - [`auth_files`]: [`AuthFiles`], a token file and a policy for a server started with them.
//!
//! # Ports
//!
//! No server started here is told a port picked in advance: a first start binds port 0 and the
//! kit reads the address the server announces (`palisade serve` logs it when it is ready,
//! `palisade store serve` prints it). A restart reuses that port. A port the kit must choose
//! itself (the metrics listener) is retried on another port when the child reports it in use.
//! [`unused_port`] is only for an address that must refuse connections.
//!
//! # Finding the binary
//!
//! Only the tests of `crates/cli` can name the `palisade` binary
//! (`env!("CARGO_BIN_EXE_palisade")`), so every function that runs it takes its path from the
//! caller. Tests of other crates use [`in_process`], or run their own test executable as the
//! child ([`process::ServerProcess::custom`]).
//!
//! [`cluster`] runs several `palisade serve` processes as one replicated lock service. Faults
//! between its nodes are network namespaces ([`netns`]), not a proxy: a member has one address
//! in the membership, which every peer and client uses, so a per-node proxy could not cut one
//! peer off from another without cutting it off from everyone.

pub mod auth_files;
pub mod child;
pub mod cluster;
pub mod command;
pub mod deployment;
pub mod in_process;
pub mod keys;
pub mod netns;
pub mod process;

use std::time::{Duration, Instant};

pub use auth_files::AuthFiles;
pub use child::{Lines, Running, wait_for_file};
pub use cluster::LocalCluster;
pub use command::{Ran, command, new_token, run, scrub, store_put};
pub use deployment::Palisade;
pub use in_process::{LockServer, StoreServer, locks_client};
pub use keys::{ServiceKey, impostor_grant};
pub use netns::Network;
pub use process::ServerProcess;

/// A loopback port that nothing listens on at the moment of the call, for a test of an
/// unreachable service. Never give it to a server: between this call and the server's bind,
/// someone else may take it. Servers bind port 0 (see [`process`]).
pub fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Polls `done` every 25 ms until it holds, or panics naming `what` after `timeout`.
#[track_caller]
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}
