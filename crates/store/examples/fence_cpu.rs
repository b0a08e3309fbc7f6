//! Benchmark program: the CPU a fenced store write costs against the same write unfenced, with
//! many concurrent writers (as `palisade bench fenced-write` runs them), measured as CPU time
//! per write rather than only as writes per second.
//!
//! On a machine shared with other work, writes per second move with the neighbours' load by
//! ±30 %; the CPU time this process and its writer thread spend per write moves much less, and
//! it is what the fence adds: the group commit shares one fsync among the writers, so with many
//! writers the store is bound by CPU, not by the disk. `THREADS` threads each hold a sequencer
//! of a lock of their own (signed here, no lock service needed) and write a key of their own,
//! with [`Store::put`] and with [`Store::put_unfenced`] in alternating rounds. Per path it
//! prints writes/s, the process's CPU per write (`/proc/self/stat`) and the writer thread's
//! (`/proc/self/task/*/schedstat`). Reports numbers; asserts nothing.
//!
//! `PATHS` (`both`, `fenced`, `unfenced`) runs one path alone: under
//! `valgrind --tool=callgrind`, which counts instructions, so the machine's load does not
//! matter, each path's instructions per write can be read from the inclusive counts of
//! `Store::put` / `Store::put_unfenced` (the caller's side) and `writer::run_job` (the writer's).
//!
//! ```text
//! cargo run --release -p palisade-store --example fence_cpu -- [THREADS] [ROUND_SECONDS] [ROUNDS] [PATHS]
//! ```

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use palisade_core::{SessionId, Token};
use palisade_sequencer::SigningKey;
use palisade_store::Store;

/// The writers' value size, as `palisade bench` writes.
const VALUE_BYTES: usize = 128;
const THREADS_MAX: usize = 1024;
const ROUND_SECONDS_MAX: u64 = 600;
const ROUNDS_MAX: usize = 100;
/// Kernel clock ticks per second of `/proc/self/stat` (`getconf CLK_TCK` on Linux).
const CLOCK_TICKS_PER_S: f64 = 100.0;

#[derive(Clone, Copy, PartialEq)]
enum Path {
    Unfenced,
    Fenced,
}

#[derive(Default, Clone, Copy)]
struct Totals {
    writes: u64,
    seconds: f64,
    process_cpu_s: f64,
    writer_cpu_s: f64,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |name: &str, default: u64, max: u64| -> u64 {
        let value = args.next().map_or(default, |arg| {
            arg.parse().unwrap_or_else(|_| panic!("{name}: a number"))
        });
        assert!((1..=max).contains(&value), "{name} must be 1..={max}");
        value
    };
    let threads = arg("THREADS", 32, THREADS_MAX as u64) as usize;
    let round = Duration::from_secs(arg("ROUND_SECONDS", 2, ROUND_SECONDS_MAX));
    let rounds = arg("ROUNDS", 6, ROUNDS_MAX as u64) as usize;
    let paths: &[Path] = match args.next().as_deref() {
        None | Some("both") => &[Path::Unfenced, Path::Fenced],
        Some("fenced") => &[Path::Fenced],
        Some("unfenced") => &[Path::Unfenced],
        Some(other) => panic!("PATHS is both, fenced or unfenced, not {other:?}"),
    };

    let service = SigningKey::generate();
    let dir = tempfile::tempdir_in(".").expect("a temporary directory on this disk");
    let store = Store::open(dir.path(), service.public_key()).expect("open the store");
    let sequencers: Vec<String> = (0..threads)
        .map(|i| {
            service
                .sign(&format!("bench/{i}"), Token::new(1), SessionId::new(1))
                .expect("sign")
                .as_str()
                .to_owned()
        })
        .collect();
    let value = vec![b'x'; VALUE_BYTES];

    let mut totals = [Totals::default(); 2];
    for round_index in 0..rounds {
        // Unfenced first in even rounds, fenced first in odd ones.
        let mut order = paths.to_vec();
        if round_index % 2 == 1 {
            order.reverse();
        }
        for path in order {
            let stop = AtomicBool::new(false);
            let writes = AtomicU64::new(0);
            let start = Barrier::new(threads + 1);
            let (counted, seconds, process_cpu_s, writer_cpu_s) = std::thread::scope(|scope| {
                for (i, sequencer) in sequencers.iter().enumerate() {
                    let (store, value, stop, writes, start) =
                        (&store, &value, &stop, &writes, &start);
                    scope.spawn(move || {
                        let key = format!("key-{i}");
                        start.wait();
                        while !stop.load(Ordering::Relaxed) {
                            match path {
                                Path::Unfenced => store.put_unfenced(&key, value),
                                Path::Fenced => {
                                    store.put(Some(sequencer), &key, value, None).map(drop)
                                }
                            }
                            .expect("a write");
                            writes.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                start.wait();
                let (cpu, writer, started) = (process_cpu_s(), writer_cpu_s(), Instant::now());
                std::thread::sleep(round);
                let counted = writes.load(Ordering::Relaxed);
                let measured = (
                    counted,
                    started.elapsed().as_secs_f64(),
                    process_cpu_s() - cpu,
                    writer_cpu_s() - writer,
                );
                stop.store(true, Ordering::Relaxed);
                measured
            });
            let total = &mut totals[path as usize];
            total.writes += counted;
            total.seconds += seconds;
            total.process_cpu_s += process_cpu_s;
            total.writer_cpu_s += writer_cpu_s;
        }
        eprint!("\rround {}/{rounds}", round_index + 1);
    }
    eprintln!();
    println!("{threads} writers, {rounds} rounds of {round:?} per path, value {VALUE_BYTES} B");
    println!(
        "{:<9} {:>10} {:>10} {:>18} {:>17}",
        "path", "writes", "writes/s", "process CPU/write", "writer CPU/write"
    );
    let per_write = |t: &Totals| {
        let writes = t.writes.max(1) as f64;
        (
            t.writes as f64 / t.seconds,
            t.process_cpu_s * 1e6 / writes,
            t.writer_cpu_s * 1e6 / writes,
        )
    };
    for (name, path) in [("unfenced", Path::Unfenced), ("fenced", Path::Fenced)] {
        let (rate, cpu, writer) = per_write(&totals[path as usize]);
        let writes = totals[path as usize].writes;
        println!("{name:<9} {writes:>10} {rate:>10.0} {cpu:>15.1} µs {writer:>14.1} µs");
    }
    let (u_rate, u_cpu, u_writer) = per_write(&totals[Path::Unfenced as usize]);
    let (f_rate, f_cpu, f_writer) = per_write(&totals[Path::Fenced as usize]);
    println!(
        "fencing cost: writes/s {:.3}x  process CPU {:.3}x  writer CPU {:.3}x",
        u_rate / f_rate,
        f_cpu / u_cpu,
        f_writer / u_writer
    );
}

/// User + system CPU time of this process so far.
fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..]
        .split(' ')
        .collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / CLOCK_TICKS_PER_S
}

/// CPU time of the store's writer thread so far (its name is truncated to 15 bytes).
fn writer_cpu_s() -> f64 {
    let mut total = 0.0;
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with("palisade-store") {
            let schedstat =
                std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            let nanos: f64 = schedstat
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0.0);
            total += nanos / 1e9;
        }
    }
    total
}
