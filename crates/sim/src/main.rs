//! `palisade-sim`: runs seeds of the deterministic simulation and reports each failing one with
//! its trace.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

/// Runs the deterministic simulation of a Palisade cluster.
#[derive(Debug, Parser)]
#[command(name = "palisade-sim")]
struct Args {
    /// How many random seeds to run.
    #[arg(long, default_value_t = 10, conflicts_with = "seed")]
    seeds: u64,
    /// Run only this seed (and print its whole trace).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds of simulated time with faults.
    #[arg(long, default_value_t = 20)]
    safety_secs: u64,
    /// Seconds of simulated time after the faults are healed.
    #[arg(long, default_value_t = 15)]
    liveness_secs: u64,
    /// Voting members of the simulated cluster (3 to 5).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(3..=5))]
    nodes: u64,
    /// Run without faults.
    #[arg(long)]
    no_faults: bool,
    /// The operator also raises the token floor, takes backups, restores one after losing
    /// every member, and loses or rolls back a node's log (then runs recover-counters).
    #[arg(long)]
    recoveries: bool,
    /// The clients also take a read-write lock (readers, writers), a semaphore's permits, and
    /// the mutex and the read-write lock at once (a multi-lock).
    #[arg(long)]
    modes: bool,
    /// Switch a known bug back on (the checker must catch it): skip-leader-start,
    /// fence-refuses-equal-token, ack-before-fsync, reply-before-apply, local-read,
    /// node-id-reuse, drop-request-dedup, leader-never-steps-down, absolute-floors; with
    /// --modes: semaphore-admits-when-full, multi-lock-partial-grant,
    /// fence-accepts-shared-write, fence-lets-writer-past-phase.
    #[arg(long, value_parser = parse_canary)]
    canary: Option<palisade_core::canary::Canary>,
}

fn parse_canary(name: &str) -> Result<palisade_core::canary::Canary, String> {
    palisade_core::canary::Canary::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = palisade_core::canary::Canary::ALL
            .iter()
            .map(|c| c.name())
            .collect();
        format!("no canary {name:?}; the canaries are {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The nodes' logs, on standard error, when RUST_LOG asks for them (`RUST_LOG=info`).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let options = palisade_sim::Options {
        safety: Duration::from_secs(args.safety_secs),
        liveness: Duration::from_secs(args.liveness_secs),
        faults: !args.no_faults,
        canary: args.canary,
        recoveries: args.recoveries,
        modes: args.modes,
        nodes: args.nodes as usize,
        ..palisade_sim::Options::default()
    };
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => {
            let start = palisade_clock::entropy::u64().unwrap_or(1);
            (0..args.seeds).map(|i| start.wrapping_add(i)).collect()
        }
    };
    let started = Instant::now();
    let (mut passed, mut failed, mut faults, mut operations) = (0, 0, 0, 0);
    for seed in seeds.iter().copied() {
        let run = Instant::now();
        let report = palisade_sim::run(seed, &options);
        faults += report.faults;
        operations += report.operations;
        println!(
            "seed {seed}: {} in {:.1}s ({:.0}s simulated): {} faults, {} operations, counter {}",
            if report.passed() { "passed" } else { "FAILED" },
            run.elapsed().as_secs_f64(),
            report.simulated.as_secs_f64(),
            report.faults,
            report.operations,
            report.counter
        );
        if args.seed.is_some() || !report.passed() {
            for line in &report.trace {
                println!("  {line}");
            }
        }
        if report.passed() {
            passed += 1;
        } else {
            for violation in &report.violations {
                println!("  violation: {violation}");
            }
            println!("  replay: palisade-sim --seed {seed}");
            failed += 1;
        }
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    println!(
        "{} faults injected, {} operations, {:.1} seeds per minute",
        faults,
        operations,
        seeds.len() as f64 / minutes.max(f64::EPSILON)
    );
    println!("seeds: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
