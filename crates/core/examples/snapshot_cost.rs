//! What a snapshot of a large lock table costs: clone, encode, decode, and memory per lock.
//!
//! Builds a table with N held locks (first argument, default 1,000,000, the ceiling) spread over
//! S sessions (second argument, default 50,000, the ceiling), each session remembering its last
//! acquires for retries as the server's would, then prints how long each step a snapshot and a restart take and
//! how much resident memory the table takes per held lock. Run it optimised:
//!
//! ```text
//! cargo run --release -p palisade-core --example snapshot_cost -- 1000000
//! ```
//!
//! Numbers from it are in docs/benchmarks.md ("Snapshot and restart at scale").

use std::time::{Duration, Instant};

use palisade_core::{
    Command, DurationMs, Input, Limits, LockTable, RequestId, SessionId, TableImage, TimeMs, Wait,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let locks: u64 = args
        .next()
        .map_or(1_000_000, |a| a.parse().expect("N: a count of locks"));
    let sessions: u64 = args
        .next()
        .map_or(50_000.min(locks), |a| a.parse().expect("sessions: a count"));
    assert!(
        locks >= 1 && sessions >= 1,
        "need at least one lock and one session"
    );

    let rss_before = rss_bytes();
    let started = Instant::now();
    let table = build(locks, sessions);
    let built = started.elapsed();
    let rss_table = rss_bytes().saturating_sub(rss_before);
    println!("table: {locks} held locks over {sessions} sessions");
    println!(
        "apply:  {} ({:.2} µs per command)",
        secs(built),
        built.as_secs_f64() * 1e6 / (locks + sessions) as f64
    );
    println!(
        "memory: {} MB resident, {} bytes per held lock",
        rss_table / 1_000_000,
        rss_table / locks
    );

    let started = Instant::now();
    let copy = table.clone();
    println!("clone:  {}", secs(started.elapsed()));
    drop(copy);

    let started = Instant::now();
    let json = serde_json::to_vec(&table).expect("a table serialises");
    println!(
        "json encode: {} for {} MB",
        secs(started.elapsed()),
        json.len() / 1_000_000
    );
    let started = Instant::now();
    let decoded: LockTable = serde_json::from_slice(&json).expect("the table decodes");
    decoded.validate().expect("the decoded table is valid");
    println!("json decode: {} (with validate)", secs(started.elapsed()));
    assert!(decoded == table, "the decoded table is the table");
    drop((json, decoded));

    let started = Instant::now();
    let bytes = postcard::to_allocvec(&table.image()).expect("the image encodes");
    println!(
        "image encode: {} for {} MB",
        secs(started.elapsed()),
        bytes.len() / 1_000_000
    );
    let started = Instant::now();
    let image: TableImage = postcard::from_bytes(&bytes).expect("the image decodes");
    let decoded_at = started.elapsed();
    let rss_before = rss_bytes();
    let restored = LockTable::from_image(image).expect("the image is of a valid table");
    println!(
        "image decode: {} ({} decoding, {} rebuilding and checking the table)",
        secs(started.elapsed()),
        secs(decoded_at),
        secs(started.elapsed() - decoded_at)
    );
    let rss_restored = rss_bytes().saturating_sub(rss_before);
    assert!(restored == table, "the restored table is the table");
    drop(table);
    println!(
        "memory after a restart: about {} bytes per held lock (the restored table's growth)",
        rss_restored / locks
    );
}

/// A table where `locks` locks are held by `sessions` sessions, one acquire per lock.
fn build(locks: u64, sessions: u64) -> LockTable {
    let limits = Limits::default();
    assert!(
        sessions <= u64::from(limits.sessions_max) && locks <= u64::from(limits.locks_max),
        "at most {} sessions and {} locks",
        limits.sessions_max,
        limits.locks_max
    );
    let mut table = LockTable::new(limits);
    let now_ms = TimeMs::from_millis(1);
    for _ in 0..sessions {
        let command = Command::OpenSession {
            open_key: None,
            ttl_ms: DurationMs::from_millis(60_000),
            secret_digest: None,
            owner: None,
        };
        table
            .apply(Input { now_ms, command })
            .result
            .expect("session opens");
    }
    for i in 0..locks {
        let command = Command::Acquire {
            session: SessionId::new(i % sessions + 1),
            lock: format!("jobs/{i:08}"),
            request_id: RequestId::new(i / sessions + 1),
            wait: Wait::Try,
            value: None,
            mode: palisade_core::Mode::Exclusive,
        };
        table
            .apply(Input { now_ms, command })
            .result
            .expect("lock granted");
    }
    table
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// This process's resident memory, from /proc/self/statm (0 where there is none).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
