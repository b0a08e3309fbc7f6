//! Metric names, and the Prometheus exporter on its own listen address.
//!
//! Histograms use explicit buckets so that the exported series are stable and comparable.

use std::net::SocketAddr;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

pub const GRANTS: &str = "palisade_grants_total";
pub const RELEASES: &str = "palisade_releases_total";
pub const SESSION_EXPIRIES: &str = "palisade_session_expiries_total";
pub const SESSIONS: &str = "palisade_sessions";
pub const LOCKS: &str = "palisade_locks";
pub const WAITERS: &str = "palisade_waiting_acquires";
pub const REQUEST_SECONDS: &str = "palisade_request_duration_seconds";
pub const FSYNC_SECONDS: &str = "palisade_log_commit_duration_seconds";
pub const LOG_BATCH_WRITES: &str = "palisade_log_commit_batch_writes";
pub const SNAPSHOT_BUILD_SECONDS: &str = "palisade_snapshot_build_duration_seconds";
pub const SNAPSHOT_LOCK_SECONDS: &str = "palisade_snapshot_table_lock_seconds";
pub const SNAPSHOT_BYTES: &str = "palisade_snapshot_bytes";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "palisade_connections_refused_total";

const SECONDS_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

/// Serves `/metrics` in the Prometheus text format on `listen`.
pub fn install(listen: SocketAddr) -> Result<(), metrics_exporter_prometheus::BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(LOG_BATCH_WRITES.into()), BATCH_BUCKETS)?
        .install()?;
    describe();
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        GRANTS,
        "Lock grants applied (each carries a new fencing token)"
    );
    describe_counter!(
        RELEASES,
        "Grants that ended, by cause: released, expired, closed"
    );
    describe_counter!(SESSION_EXPIRIES, "Sessions whose lease ran out");
    describe_counter!(
        CONNECTIONS_REFUSED_TOTAL,
        "Client connections closed at once: over their source address's cap, or over the share of connections without a client certificate"
    );
    describe_gauge!(SESSIONS, "Open sessions");
    describe_gauge!(LOCKS, "Locks that are held, waited for or in lock-delay");
    describe_gauge!(WAITERS, "Acquire requests waiting in a queue on this node");
    describe_histogram!(REQUEST_SECONDS, "gRPC request latency by method");
    describe_histogram!(
        FSYNC_SECONDS,
        "Raft log group commit latency, including fsync"
    );
    describe_histogram!(LOG_BATCH_WRITES, "Writes sharing one log commit");
    describe_histogram!(
        SNAPSHOT_BUILD_SECONDS,
        "Building a snapshot: copying the table, encoding it and writing the file"
    );
    describe_histogram!(
        SNAPSHOT_LOCK_SECONDS,
        "How long building a snapshot held the table's lock (applying waits meanwhile)"
    );
    describe_gauge!(
        SNAPSHOT_BYTES,
        "Size of the last snapshot file written or, until one is, of the one read at start (0: none)"
    );
    // A snapshot is built only every SNAPSHOT_INTERVAL_ENTRIES applied entries: registered now,
    // these are exported from the start (zero counts, size 0 or the size read at start), so a
    // dashboard shows "none yet" rather than "no data".
    let _ = metrics::gauge!(SNAPSHOT_BYTES);
    let _ = metrics::histogram!(SNAPSHOT_BUILD_SECONDS);
    let _ = metrics::histogram!(SNAPSHOT_LOCK_SECONDS);
    // Refusals are rare: a zero count says the caps were never reached.
    let _ = metrics::counter!(CONNECTIONS_REFUSED_TOTAL);
}
