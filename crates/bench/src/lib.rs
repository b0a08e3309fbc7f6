//! `palisade demo` and `palisade bench`: seeing fencing work, and measuring what it costs.
//!
//! - [`demo`]: the pause scenario end to end on real components — a lock service and a fenced
//!   store started in this process on temporary directories — once through an unfenced write
//!   path (the paused holder's stale write wins: a lost update) and once fenced (it is refused);
//! - [`bench`]: the load generator of the workloads in `docs/benchmarks.md` against Palisade or its peers, with hdrhistogram
//!   percentiles and a markdown comparison table;
//! - [`target`]: what a benchmark client drives — the Palisade client library, a minimal etcd
//!   v3 client generated from `proto/` (leases and the lock service only), ZooKeeper's lock
//!   recipe on a minimal client ([`zookeeper`]), or Redis `SET NX PX` ([`redis_lock`], unsafe);
//! - [`local`]: the in-process lock service and store the demo and tests use;
//! - [`server_view`]: the lock service's own account of a workload (its `/metrics`);
//! - [`server_cpu`]: every system's servers' CPU and context switches per lock operation, from
//!   `/proc` over the measured window;
//! - [`scale`]: `palisade bench scale`, how cost grows with the state (sessions, held locks,
//!   waiters, watchers) on a `palisade serve` (and an etcd) it starts, measures and restarts as
//!   child processes ([`scale_process`]);
//! - [`floor`]: this machine's primitives (fsync, loopback round trip, wake-up, signing) and
//!   the bounds they set on every workload, for any implementation.
//!
//! **Architecture Invariant:** nothing here asserts speed. Benchmarks report numbers; tests check
//! that work was done and reported, never how fast.

pub mod bench;
pub mod demo;
pub mod floor;
pub mod local;
pub mod redis_lock;
pub mod scale;
mod scale_process;
pub mod server_cpu;
pub mod server_view;
pub mod stats;
mod store_workloads;
pub mod target;
pub mod zookeeper;

pub use bench::{BenchArgs, BenchReport, Measurement, Workload};
pub use demo::{DemoArgs, DemoReport};

/// etcd's `etcdserverpb` package: leases, and KV.Range and Watch for `bench scale` (generated from `proto/etcdserverpb.proto`).
#[allow(missing_debug_implementations, clippy::all)]
pub(crate) mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// etcd's lock service (generated from `proto/v3lockpb.proto`).
#[allow(missing_debug_implementations, clippy::all)]
pub(crate) mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}
