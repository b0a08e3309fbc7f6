//! `palisade bench floor`: what this machine allows, measured on its primitives, and the bounds
//! they put on the lock workloads whatever the software above them does.
//!
//! A durable lock operation needs at least one `fdatasync`, one loopback round trip, and inside
//! the server a hand-off to the thread that syncs and one back; a grant also needs one Ed25519
//! signature. Each is measured here on its own, in this process, with nothing else of ours
//! running, so the bounds below are what a perfect implementation would reach on this machine.
//! A cluster's operation also waits for a follower: one peer round trip more, its fsync in
//! place of the leader's, which runs in parallel ([`Bounds`] gives every formula).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::server_view::{TICKS_PER_S, cpu_ticks};
use palisade_core::{SessionId, Token};

/// Synced writes per fsync measurement.
const SYNCS: usize = 1000;
/// Bytes per synced write: about one frame of a small batch of the Raft log.
const RECORD_BYTES: usize = 200;
/// Round trips per loopback and hand-off measurement.
const ROUND_TRIPS: usize = 20_000;
/// Signatures for the signing measurement.
const SIGNATURES: usize = 2_000;

/// The measured primitives, in microseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Floor {
    pub fsync_append_p50_us: f64,
    pub fsync_overwrite_p50_us: f64,
    /// The overwrite probe's tail: what a durable operation's p99 cannot beat.
    pub fsync_overwrite_p99_us: f64,
    /// The overwrite probe's p99.9 (of 1,000 syncs: close to its maximum).
    pub fsync_overwrite_p999_us: f64,
    pub loopback_round_trip_us: f64,
    /// CPU time (both ends, user and system) one loopback round trip costs.
    pub loopback_round_trip_cpu_us: f64,
    pub thread_handoff_us: f64,
    pub sign_us: f64,
    pub cpus: usize,
    /// Where the fsync probe ran: its file system is what the numbers describe.
    pub fsync_dir: std::path::PathBuf,
}

/// What the primitives leave for a perfect server, on one node or on a cluster.
///
/// One durable operation seen by one client (`op` below), with the fsync at its p50:
///
/// - **one node**: `fsync + round trip + 2 hand-offs` — the client's loopback round trip, and
///   inside the server a hand-off to the thread that syncs and one back;
/// - **a cluster** (3 nodes or more): `fsync + 2 × round trip + 2 hand-offs` — the single node's
///   operation plus one peer round trip. The leader sends the entry to its followers as soon as
///   it has it and syncs its own copy in parallel (openraft's `Replicate` waits on no flush), so
///   the leader's fsync is hidden behind the longer path in series: the peer hop, a follower's
///   hand-off to its syncing thread, the follower's fsync, its hand-off back, and the ack's way
///   back. That path is the single node's durable step moved to the follower, plus the peer
///   round trip (on this machine a loopback one, like the client's). A majority of three needs
///   one follower's ack; larger clusters need more acks, all in parallel, so the same sum is
///   still a lower bound.
///
/// From `op`: one-client acquire+release `2 × op + signature`; acquire alone `op + signature`;
/// contended handoffs/s `1 / (op + signature)` (each handoff is the release that grants the next
/// waiter, in series); the p99 and p99.9 references put the fsync at its p99 and p99.9.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Bounds {
    pub nodes: usize,
    pub one_operation_us: f64,
    pub acquire_us: f64,
    pub cycle_us: f64,
    /// Not a bound: both fsyncs of a cycle at their p99 are rarer than 1 in 100.
    pub cycle_p99_reference_us: f64,
    pub cycle_p999_reference_us: f64,
    pub contended_per_s: f64,
    /// An estimate of the uncontended throughput, not a bound, and on one node only (a
    /// cluster's batching of peer messages makes any per-cycle count of them arbitrary).
    pub cycles_estimate_per_s: Option<f64>,
}

impl Floor {
    /// The bounds on a system of `nodes` members (1: a single node; 2 or more: a cluster, whose
    /// operations also wait for a follower).
    pub fn bounds(&self, nodes: usize) -> Bounds {
        let operation = |fsync_us: f64| {
            let single = fsync_us + self.loopback_round_trip_us + 2.0 * self.thread_handoff_us;
            if nodes > 1 {
                single + self.loopback_round_trip_us
            } else {
                single
            }
        };
        let one_operation_us = operation(self.fsync_overwrite_p50_us);
        Bounds {
            nodes,
            one_operation_us,
            acquire_us: one_operation_us + self.sign_us,
            cycle_us: 2.0 * one_operation_us + self.sign_us,
            cycle_p99_reference_us: 2.0 * operation(self.fsync_overwrite_p99_us) + self.sign_us,
            cycle_p999_reference_us: 2.0 * operation(self.fsync_overwrite_p999_us) + self.sign_us,
            contended_per_s: 1e6 / (one_operation_us + self.sign_us),
            // Every core doing nothing but move the two requests and two replies of each cycle
            // over loopback and sign its sequencer. Not a hard bound: with many clients a reader
            // often finds several messages per wake-up.
            cycles_estimate_per_s: (nodes <= 1).then(|| {
                self.cpus as f64 * 1e6 / (2.0 * self.loopback_round_trip_cpu_us + self.sign_us)
            }),
        }
    }
}

/// Measures every primitive, with the fsync probes in a fresh directory under `dir`.
pub fn measure(dir: &Path) -> anyhow::Result<Floor> {
    let probe_dir = tempfile::Builder::new()
        .prefix("palisade-floor.")
        .tempdir_in(dir)
        .with_context(|| format!("cannot create a directory in {}", dir.display()))?;
    let (append, overwrite) = fsyncs(&probe_dir.path().join("probe"))?;
    let (loopback_round_trip_us, loopback_round_trip_cpu_us) = loopback_round_trip()?;
    Ok(Floor {
        fsync_append_p50_us: percentile_us(&append, 0.5),
        fsync_overwrite_p50_us: percentile_us(&overwrite, 0.5),
        fsync_overwrite_p99_us: percentile_us(&overwrite, 0.99),
        fsync_overwrite_p999_us: percentile_us(&overwrite, 0.999),
        loopback_round_trip_us,
        loopback_round_trip_cpu_us,
        thread_handoff_us: thread_handoff(),
        sign_us: signing(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        fsync_dir: dir.to_path_buf(),
    })
}

/// The `q` quantile of sorted `samples`, in microseconds.
fn percentile_us(samples: &[Duration], q: f64) -> f64 {
    let i = ((samples.len() as f64 * q) as usize).min(samples.len() - 1);
    samples[i].as_secs_f64() * 1e6
}

/// The times of `write + fdatasync` appending to a file, and overwriting zeros already on disk,
/// each sorted.
fn fsyncs(path: &Path) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let record = [0x5a_u8; RECORD_BYTES];
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    // SYNCS records one after the other from the start of the file, each written and synced.
    let synced_writes = || -> std::io::Result<Vec<Duration>> {
        (0..SYNCS)
            .map(|i| {
                let started = Instant::now();
                file.write_all_at(&record, (i * RECORD_BYTES) as u64)?;
                file.sync_data()?;
                Ok(started.elapsed())
            })
            .collect()
    };
    let mut append = synced_writes()?;
    file.set_len(0)?;
    file.write_all_at(&vec![0; SYNCS * RECORD_BYTES], 0)?;
    file.sync_all()?;
    let mut overwrite = synced_writes()?;
    append.sort();
    overwrite.sort();
    Ok((append, overwrite))
}

/// Mean round trip of a small message over loopback TCP between two threads that each sleep in
/// `read` until the other's message arrives, as a client and a server do; and the CPU time of
/// both ends per round trip.
fn loopback_round_trip() -> anyhow::Result<(f64, f64)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut buffer = [0u8; 64];
        loop {
            match stream.read(&mut buffer)? {
                0 => return Ok(()),
                n => stream.write_all(&buffer[..n])?,
            }
        }
    });
    let mut stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let message = [1u8; 64];
    let mut reply = [0u8; 64];
    let cpu_before = cpu_ticks("/proc/self/stat").context("no CPU time in /proc/self/stat")?;
    let started = Instant::now();
    for _ in 0..ROUND_TRIPS {
        stream.write_all(&message)?;
        stream.read_exact(&mut reply)?;
    }
    let elapsed = started.elapsed();
    let cpu_ticks =
        cpu_ticks("/proc/self/stat").context("no CPU time in /proc/self/stat")? - cpu_before;
    drop(stream);
    echo.join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    let per_round_trip = |seconds: f64| seconds * 1e6 / ROUND_TRIPS as f64;
    Ok((
        per_round_trip(elapsed.as_secs_f64()),
        per_round_trip(cpu_ticks as f64 / TICKS_PER_S),
    ))
}

/// Mean time for one thread to wake another that sleeps on a channel: half a ping-pong.
fn thread_handoff() -> f64 {
    let (to_peer, peer_inbox) = std::sync::mpsc::channel::<usize>();
    let (to_main, main_inbox) = std::sync::mpsc::channel::<usize>();
    let peer = std::thread::spawn(move || {
        while let Ok(n) = peer_inbox.recv() {
            if to_main.send(n).is_err() {
                return;
            }
        }
    });
    let started = Instant::now();
    for n in 0..ROUND_TRIPS {
        to_peer.send(n).expect("the peer thread is alive");
        main_inbox.recv().expect("the peer thread answers");
    }
    let elapsed = started.elapsed();
    drop(to_peer);
    let _ = peer.join();
    elapsed.as_secs_f64() * 1e6 / (2 * ROUND_TRIPS) as f64
}

/// Mean time to sign one sequencer, as the server does for every grant.
fn signing() -> f64 {
    let key = palisade_sequencer::SigningKey::generate();
    let started = Instant::now();
    for token in 0..SIGNATURES as u64 {
        let signed = key.sign("jobs/nightly", Token::new(token + 1), SessionId::new(42));
        std::hint::black_box(signed.ok());
    }
    started.elapsed().as_secs_f64() * 1e6 / SIGNATURES as f64
}

/// The primitives and the bounds they imply, as a markdown table next to our targets
/// (`docs/benchmarks.md`, "Targets").
pub fn markdown(floor: &Floor) -> String {
    let ms = |us: f64| format!("{:.3} ms", us / 1e3);
    let mut out = format!(
        "fsync measured in {} (pass --store-dir to measure the data directory's file system)\n\n",
        floor.fsync_dir.display()
    );
    out.push_str("| primitive (this machine) | measured |\n|---|---:|\n");
    for (what, us) in [
        ("append + fdatasync, p50", floor.fsync_append_p50_us),
        (
            "overwrite of allocated zeros + fdatasync, p50",
            floor.fsync_overwrite_p50_us,
        ),
        ("the same overwrite, p99", floor.fsync_overwrite_p99_us),
        ("the same overwrite, p99.9", floor.fsync_overwrite_p999_us),
        (
            "loopback TCP round trip, both ends sleeping in read, mean",
            floor.loopback_round_trip_us,
        ),
        (
            "CPU time of that round trip, both ends, mean",
            floor.loopback_round_trip_cpu_us,
        ),
        (
            "hand-off to a sleeping thread (wake-up), mean",
            floor.thread_handoff_us,
        ),
        ("Ed25519 signature of one sequencer, mean", floor.sign_us),
    ] {
        out.push_str(&format!("| {what} | {us:.1} µs |\n"));
    }
    out.push_str(
        "\n| what that leaves for a perfect server on this machine | value | target |\n|---|---:|---|\n",
    );
    let one = floor.bounds(1);
    let three = floor.bounds(3);
    out.push_str(&format!(
        "| one-client acquire+release ≥ 2 × (fsync + round trip + 2 hand-offs) + signature | {} | ≤ 0.45 ms |\n",
        ms(one.cycle_us)
    ));
    out.push_str(&format!(
        "| reference, not a bound: one-client acquire+release with both fsyncs at their p99 | {} | ≤ 3 × our p50 |\n",
        ms(one.cycle_p99_reference_us)
    ));
    out.push_str(&format!(
        "| contended handoffs/s ≤ 1 / (fsync + round trip + 2 hand-offs + signature) | {:.0} | ≥ 20 × etcd |\n",
        one.contended_per_s
    ));
    if let Some(cycles) = one.cycles_estimate_per_s {
        out.push_str(&format!(
            "| estimate, not a bound: acquire+release cycles/s on {} CPUs doing nothing but 2 round trips (each message waking its reader) and 1 signature per cycle | {cycles:.0} | uncontended ≥ 10 × etcd |\n",
            floor.cpus,
        ));
    }
    out.push_str(&format!(
        "| 3 nodes: one-client acquire+release ≥ 2 × (fsync + client round trip + peer round trip + 2 hand-offs) + signature (the leader's fsync runs in parallel with the follower's path) | {} | p50 ≤ 1.3 × this |\n",
        ms(three.cycle_us)
    ));
    out.push_str(&format!(
        "| 3 nodes: reference, not a bound: the same with the follower's fsyncs at their p99 | {} | |\n",
        ms(three.cycle_p99_reference_us)
    ));
    out.push_str(&format!(
        "| 3 nodes: contended handoffs/s ≤ 1 / (fsync + client round trip + peer round trip + 2 hand-offs + signature) | {:.0} | ≥ 50 % of this |\n",
        three.contended_per_s
    ));
    out
}

/// Round primitives whose bounds are easy to check by hand, for the tests of this module and of
/// the report that relates results to them.
#[cfg(test)]
impl Floor {
    pub(crate) fn example() -> Floor {
        Floor {
            fsync_append_p50_us: 150.0,
            fsync_overwrite_p50_us: 100.0,
            fsync_overwrite_p99_us: 400.0,
            fsync_overwrite_p999_us: 900.0,
            loopback_round_trip_us: 80.0,
            loopback_round_trip_cpu_us: 40.0,
            thread_handoff_us: 25.0,
            sign_us: 20.0,
            cpus: 2,
            fsync_dir: "/data".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_follow_from_the_primitives() {
        let floor = Floor::example();
        let one = floor.bounds(1);
        // One operation: 100 + 80 + 2 × 25 = 230 µs.
        assert_eq!(one.one_operation_us, 230.0);
        assert_eq!(one.cycle_us, 480.0);
        assert_eq!(one.acquire_us, 250.0);
        // At the fsync's p99 (400 µs): 2 × 530 + 20.
        assert_eq!(one.cycle_p99_reference_us, 1080.0);
        assert_eq!(one.cycle_p999_reference_us, 2080.0);
        assert_eq!(one.contended_per_s, 1e6 / 250.0);
        assert_eq!(one.cycles_estimate_per_s, Some(2e6 / 100.0));
        // Three nodes: the follower's path adds one peer round trip (80 µs) to each operation;
        // the leader's own fsync runs in parallel and adds nothing.
        let three = floor.bounds(3);
        assert_eq!(three.one_operation_us, 310.0);
        assert_eq!(three.cycle_us, 640.0);
        assert_eq!(three.acquire_us, 330.0);
        assert_eq!(three.cycle_p99_reference_us, 2.0 * 610.0 + 20.0);
        assert_eq!(three.contended_per_s, 1e6 / 330.0);
        assert_eq!(three.cycles_estimate_per_s, None);
        assert_eq!(floor.bounds(5).cycle_us, three.cycle_us);

        let table = markdown(&floor);
        assert!(table.contains("| 0.480 ms | ≤ 0.45 ms |"), "{table}");
        assert!(
            table.contains("| the same overwrite, p99 | 400.0 µs |"),
            "{table}"
        );
        assert!(table.contains("| 1.080 ms | ≤ 3 × our p50 |"), "{table}");
        assert!(table.contains("| 4000 |"), "{table}");
        assert!(table.contains("| 0.640 ms | p50 ≤ 1.3 × this |"), "{table}");
        assert!(table.contains("| 3030 | ≥ 50 % of this |"), "{table}");
    }

    #[test]
    fn every_primitive_is_measured_as_a_positive_time() {
        let dir = tempfile::tempdir().unwrap();
        let floor = measure(dir.path()).unwrap();
        for (name, us) in [
            ("append", floor.fsync_append_p50_us),
            ("overwrite", floor.fsync_overwrite_p50_us),
            ("round trip", floor.loopback_round_trip_us),
            ("round trip CPU", floor.loopback_round_trip_cpu_us),
            ("hand-off", floor.thread_handoff_us),
            ("sign", floor.sign_us),
        ] {
            assert!(us > 0.0 && us.is_finite(), "{name}: {us}");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the probe files are removed"
        );
    }
}
