//! Benchmark program: what the fence costs a store write ("fenced write vs the same write
//! unfenced", target ≤ 1.10×, see `docs/benchmarks.md`, "Targets").
//!
//! Both paths are one redb write transaction committed with `Durability::Immediate` (fsync) on
//! the same database. The fenced one adds the sequencer check (signature cached after the first
//! use), the fence row read and advance, and the key-binding read; the unfenced one is
//! [`Store::put_unfenced`], which exists only for this comparison. Runs alternate in rounds so
//! that drift of the disk affects both alike. Reports numbers; asserts nothing.
//!
//! ```text
//! cargo run --release -p palisade-store --example fence_overhead -- [WRITES] [VALUE_BYTES]
//! ```

use std::time::{Duration, Instant};

use palisade_core::{SessionId, Token};
use palisade_sequencer::SigningKey;
use palisade_store::Store;

const ROUNDS: usize = 10;

fn main() {
    let mut args = std::env::args().skip(1);
    let writes: usize = args.next().map_or(2000, |arg| arg.parse().expect("WRITES"));
    let value_bytes: usize = args
        .next()
        .map_or(100, |arg| arg.parse().expect("VALUE_BYTES"));
    let per_round = (writes / ROUNDS).max(1);

    let service = SigningKey::generate();
    let dir = tempfile::tempdir_in(".").expect("a temporary directory on this disk");
    let store = Store::open(dir.path(), service.public_key()).expect("open the store");
    let sequencer = service
        .sign("bench/lock", Token::new(1), SessionId::new(1))
        .unwrap();
    let value = vec![b'x'; value_bytes];

    let mut fenced = Vec::with_capacity(per_round * ROUNDS);
    let mut unfenced = Vec::with_capacity(per_round * ROUNDS);
    for round in 0..ROUNDS {
        for i in 0..per_round {
            let key = format!("key-{}", i % 64);
            let started = Instant::now();
            store.put_unfenced(&key, &value).unwrap();
            unfenced.push(started.elapsed());
            let started = Instant::now();
            store
                .put(Some(sequencer.as_str()), &key, &value, None)
                .unwrap();
            fenced.push(started.elapsed());
        }
        eprint!("\rround {}/{ROUNDS}", round + 1);
    }
    eprintln!();

    let fenced = Summary::of(&mut fenced);
    let unfenced = Summary::of(&mut unfenced);
    println!(
        "writes per path: {}  value: {value_bytes} B  durability: immediate (fsync)",
        fenced.count
    );
    println!(
        "{:<10} {:>10} {:>10} {:>10} {:>10}",
        "path", "mean", "p50", "p99", "writes/s"
    );
    for (name, summary) in [("unfenced", &unfenced), ("fenced", &fenced)] {
        println!(
            "{name:<10} {:>10.1?} {:>10.1?} {:>10.1?} {:>10.0}",
            summary.mean,
            summary.p50,
            summary.p99,
            1.0 / summary.mean.as_secs_f64()
        );
    }
    println!(
        "fenced / unfenced: mean {:.3}x  p50 {:.3}x  (target <= 1.10x)",
        fenced.mean.as_secs_f64() / unfenced.mean.as_secs_f64(),
        fenced.p50.as_secs_f64() / unfenced.p50.as_secs_f64()
    );
}

struct Summary {
    count: usize,
    mean: Duration,
    p50: Duration,
    p99: Duration,
}

impl Summary {
    fn of(samples: &mut [Duration]) -> Summary {
        samples.sort();
        let total: Duration = samples.iter().sum();
        Summary {
            count: samples.len(),
            mean: total / samples.len() as u32,
            p50: samples[samples.len() / 2],
            p99: samples[samples.len() * 99 / 100],
        }
    }
}
