//! `palisade bench`: a load generator for the workloads of `docs/benchmarks.md`, against
//! Palisade or its peers (etcd, ZooKeeper, and Redis as the unsafe reference point).
//!
//! Every workload runs N clients, each with its own connection and session (or etcd lease, or
//! ZooKeeper session), opened before the clock starts. Operations that start during the warm-up or end after the
//! measured window are not counted. Latencies are recorded per client in hdrhistograms and merged.
//!
//! - `uncontended`: N clients, N locks (one each), acquire+release cycles per second;
//! - `contended`: N clients, one lock, grants per second (each grant is one FIFO handoff);
//! - `latency`: one client, one lock, acquire+release latency percentiles;
//! - `modes`: acquire+release cycles as a mutex (N clients, N locks), as readers (N clients
//!   sharing one lock) and as permits (N clients, one semaphore of N permits), back to back in
//!   one run: what a shared acquire and a permit cost against a mutex (Palisade only);
//! - `fenced-write`: N clients write to the fenced store with a sequencer, then the same writes
//!   through the store's unchecked path; the ratio is what fencing costs;
//! - `fenced-read`: N clients read from the fenced store with a sequencer — the holder's grant
//!   already accepted, and grants the store has not seen (the accepted token advances) — against
//!   fenced writes of the same run;
//! - `txn`: N clients run a transaction (revision compare + put) under one sequencer check,
//!   against fenced puts of the same run.
//!
//! The store workloads are in `store_workloads.rs`.
//!
//! Benchmarks report numbers; nothing here decides whether a number is good enough except the
//! comparison table, which prints our targets (`docs/benchmarks.md`, "Targets") next to the
//! measurements and, with `--floor`, each result as a fraction of what this machine allows.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use palisade_core::duration::parse_duration;
use serde::Serialize;
use tokio::time::Instant;

use crate::floor::{Bounds, Floor};
use crate::server_cpu::{ServerCpu, TargetPids};
use crate::server_view::{Probe, ServerView};
use crate::stats::{Latencies, Percentiles, format_us};
use crate::target::{Held, Hold, LockConn, Target};

/// Session (or lease) length of benchmark clients; long enough that no lease ends mid-run
/// however busy the machine, while keepalives stay rare.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(60);
/// How long workers may take to finish their last operation after the window closes.
pub(crate) const DRAIN_MAX: Duration = Duration::from_secs(30);
/// Longest `--duration` or `--warmup`.
const DURATION_MAX: Duration = Duration::from_secs(3_600);
/// Most clients one run may start.
const CLIENTS_MAX: usize = 1_024;
/// Bytes of each value the fenced-write workload writes.
pub const WRITE_VALUE_BYTES: usize = 128;

/// A workload of `docs/benchmarks.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// N clients, N locks: acquire+release cycles per second.
    Uncontended,
    /// N clients, one lock: grants per second.
    Contended,
    /// One client: acquire+release latency percentiles.
    Latency,
    /// Acquire+release cycles as a mutex (N clients, N locks), then as readers of one lock,
    /// then as permits of one semaphore of N permits, in one run (palisade only).
    Modes,
    /// Store writes with a sequencer against the same writes without the check.
    FencedWrite,
    /// Store reads with a sequencer (the holder's, and grants that advance the accepted token)
    /// against fenced writes.
    FencedRead,
    /// Store transactions (a revision compare and a put, one sequencer check) against fenced
    /// writes.
    Txn,
    /// uncontended, contended, latency and fenced-write in turn (what is compared with etcd;
    /// fenced-read and txn run by name).
    All,
    /// No service: this machine's fsync, loopback round trip, thread wake-up and signing
    /// times, and the bounds they put on the workloads above.
    Floor,
    /// How cost grows with the state: starts its own `palisade serve` (and etcd with
    /// --etcd-bin), grows sessions, held locks, waiters and watchers step by step, and measures
    /// latency, RSS, listing, snapshot and restart at each step (the `bench scale` flags).
    Scale,
}

impl Workload {
    const EACH: [Workload; 4] = [
        Workload::Uncontended,
        Workload::Contended,
        Workload::Latency,
        Workload::FencedWrite,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::Latency => "latency",
            Workload::Modes => "modes",
            Workload::FencedWrite => "fenced-write",
            Workload::FencedRead => "fenced-read",
            Workload::Txn => "txn",
            Workload::All => "all",
            Workload::Floor => "floor",
            Workload::Scale => "scale",
        }
    }

    /// A workload of the fenced store (sequencers from the lock service, no etcd counterpart).
    fn is_store(self) -> bool {
        matches!(
            self,
            Workload::FencedWrite | Workload::FencedRead | Workload::Txn
        )
    }

    /// Clients when `--clients` is not given: the shapes of the targets in
    /// `docs/benchmarks.md`.
    fn clients_default(self) -> usize {
        match self {
            Workload::Uncontended
            | Workload::Modes
            | Workload::FencedWrite
            | Workload::FencedRead
            | Workload::Txn
            | Workload::All => 32,
            Workload::Floor | Workload::Scale => 0,
            Workload::Contended => 16,
            Workload::Latency => 1,
        }
    }
}

/// Flags of `palisade bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Which workload to run.
    #[arg(value_enum, default_value = "all")]
    pub workload: Workload,
    /// Service to load: palisade://HOST:PORT, etcd://HOST:PORT, zk://HOST:PORT (ZooKeeper's lock
    /// recipe) or redis://HOST:PORT (SET NX PX: unsafe, no fencing, not durable). A Palisade
    /// cluster may be given as palisade://HOST:PORT,HOST:PORT,... (the clients follow its
    /// leader). Repeat to run the same workloads on each and print a comparison.
    #[arg(long = "target", default_value = "palisade://127.0.0.1:7457")]
    pub targets: Vec<Target>,
    /// A running fenced store (HOST:PORT, started with the palisade target's public key):
    /// `fenced-write`, `fenced-read` and `txn` then also measure their operations over HTTP.
    #[arg(long)]
    pub store: Option<String>,
    /// Where the store workloads put their in-process store, `floor` its fsync probe and `scale`
    /// its servers' data directories (a fresh directory inside; default: the system's temporary
    /// directory).
    #[arg(long)]
    pub store_dir: Option<std::path::PathBuf>,
    /// Concurrent clients (default: 32 uncontended and the store workloads, 16 contended;
    /// `latency` always uses one).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Measured time of each workload, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time each workload runs before measuring starts.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// The palisade target's Prometheus endpoint (http://HOST:PORT/metrics): each workload then
    /// also reports the server's log commits, writes per commit and request latency.
    #[arg(long)]
    pub metrics: Option<String>,
    /// The server processes of the targets of one kind, KIND=PID,PID,... (every member of a
    /// cluster, e.g. etcd=41,42,43; the kind is palisade, etcd, zk or redis). Each lock workload
    /// on such a target then reports the servers' CPU time and context switches per lock
    /// operation over the measured window. Repeat for each kind.
    #[arg(long = "target-pids", value_name = "KIND=PID,...")]
    pub target_pids: Vec<TargetPids>,
    /// The same as --target-pids palisade=PID (one server).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Members of each system (1: single nodes; 3: clusters): which of the floor's bounds the
    /// table relates results to (with --floor).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub nodes: u16,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json_file: Option<std::path::PathBuf>,
    /// Print a markdown comparison table (the default when there are two or more targets).
    #[arg(long)]
    pub markdown: bool,
    /// First measure this machine's floor (as `palisade bench floor` does, in --store-dir) and
    /// show each result as a fraction of it.
    #[arg(long)]
    pub floor: bool,
    /// TLS to palisade targets: the `palisade` binary sets it from the global `--tls-ca`,
    /// `--tls-cert` and `--tls-key`.
    #[arg(skip)]
    pub tls: Option<palisade_tls::ClientTls>,
    #[command(flatten)]
    pub scale: crate::scale::ScaleArgs,
}

/// One workload run against one target.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub workload: Workload,
    /// The store workloads' paths: `unfenced`, `fenced`, `fenced-http` (fenced-write);
    /// `fenced-write`, `fenced-read`, `advancing-read`, `advancing-write` (fenced-read);
    /// `fenced-write`, `txn` (txn); with `-http` when over HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<&'static str>,
    /// `palisade://…` or `etcd://…`; for the store workloads, the store.
    pub target: String,
    pub target_kind: &'static str,
    pub clients: usize,
    pub locks: usize,
    /// What one operation is, e.g. `acquire+release cycle`.
    pub operation: &'static str,
    pub duration_s: f64,
    /// Operations completed inside the measured window.
    pub operations: u64,
    pub operations_per_s: f64,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Latency of a whole operation.
    pub latency: Percentiles,
    /// For lock workloads: time until the grant, and time of the release.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquire: Option<Percentiles>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<Percentiles>,
    /// The lock service's own account (with `--metrics`), over the measured window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerView>,
    /// The servers' CPU time and context switches per lock operation (with `--target-pids`),
    /// over the measured window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu: Option<ServerCpu>,
}

/// Everything one `palisade bench` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub cpus: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    /// Members of each system (`--nodes`): the floor's bounds the table uses.
    pub nodes: usize,
    pub measurements: Vec<Measurement>,
    /// Workloads that were not run on some target, and why.
    pub skipped: Vec<String>,
    /// This machine's primitives, measured before the workloads (with `--floor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<Floor>,
}

impl BenchReport {
    /// The measurement of `workload` (and `variant`) on the target of this kind.
    pub fn find(
        &self,
        workload: Workload,
        variant: Option<&str>,
        target_kind: &str,
    ) -> Option<&Measurement> {
        self.measurements.iter().find(|m| {
            m.workload == workload && m.variant == variant && m.target_kind == target_kind
        })
    }
}

/// Runs `palisade bench` and prints its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(tls) = &args.tls {
        crate::target::set_tls(tls.clone());
    }
    if args.workload == Workload::Floor {
        let floor = measure_floor(&args).await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&floor)?);
        } else {
            print!("{}", crate::floor::markdown(&floor));
        }
        return Ok(());
    }
    if args.workload == Workload::Scale {
        return crate::scale::run(
            &args.scale,
            args.store_dir.clone(),
            args.json,
            args.json_file.as_deref(),
        )
        .await;
    }
    let report = measure(&args).await?;
    if let Some(path) = &args.json_file {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        if args.markdown || args.targets.len() > 1 {
            if let Some(floor) = &report.floor {
                println!("What this machine allows, measured on its primitives:\n");
                println!("{}", crate::floor::markdown(floor));
            }
            print!("{}", markdown_table(&report, &args.targets));
            let server = server_table(&report);
            if !server.is_empty() {
                println!(
                    "\nThe lock service's side (its /metrics and CPU, the measured window):\n"
                );
                print!("{server}");
            }
        }
        let modes = modes_table(&report);
        if !modes.is_empty() {
            println!("\nA mutex, a reader and a semaphore permit, in this run:\n");
            print!("{modes}");
        }
        for note in &report.skipped {
            eprintln!("note: {note}");
        }
    }
    let errors: u64 = report.measurements.iter().map(|m| m.errors).sum();
    if errors > 0 {
        bail!("{errors} operations failed; see first_error in the report");
    }
    Ok(())
}

/// Measures this machine's floor, with the fsync probe in `--store-dir` (or the system's
/// temporary directory).
async fn measure_floor(args: &BenchArgs) -> anyhow::Result<Floor> {
    let dir = args.store_dir.clone().unwrap_or_else(std::env::temp_dir);
    tokio::task::spawn_blocking(move || crate::floor::measure(&dir)).await?
}

/// Runs the workloads `args` asks for and returns what they measured. Progress goes to stderr
/// unless `args.json`.
pub async fn measure(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    if args.targets.is_empty() {
        bail!("name at least one --target");
    }
    if args.duration.is_zero() || args.duration > DURATION_MAX || args.warmup > DURATION_MAX {
        bail!("--duration must be between 1ms and 1h, and --warmup at most 1h");
    }
    if let Some(clients) = args.clients
        && !(1..=CLIENTS_MAX).contains(&clients)
    {
        bail!("--clients must be between 1 and {CLIENTS_MAX}");
    }
    let workloads: Vec<Workload> = match args.workload {
        Workload::All => Workload::EACH.to_vec(),
        Workload::Floor => bail!("`floor` loads no service; run it with `palisade bench floor`"),
        Workload::Scale => {
            bail!("`scale` starts its own servers; run it with `palisade bench scale`")
        }
        one => vec![one],
    };
    let mut report = BenchReport {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        duration_s: args.duration.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        nodes: usize::from(args.nodes),
        measurements: Vec::new(),
        skipped: Vec::new(),
        floor: None,
    };
    let pids = server_pids(args)?;
    if args.floor {
        report.floor = Some(measure_floor(args).await.context("the floor")?);
    }
    for workload in workloads {
        let clients = match workload {
            Workload::Latency => 1,
            _ => args.clients.unwrap_or(workload.clients_default()),
        };
        if workload.is_store() {
            let name = workload.name();
            let Some(lock_service) = args
                .targets
                .iter()
                .find(|t| matches!(t, Target::Palisade { .. }))
            else {
                report
                    .skipped
                    .push(format!("{name} needs a palisade:// target for sequencers"));
                continue;
            };
            let unfenced: Vec<&str> = args
                .targets
                .iter()
                .filter(|t| !matches!(t, Target::Palisade { .. }))
                .map(Target::kind)
                .collect();
            if !unfenced.is_empty() {
                report.skipped.push(format!(
                    "{name} has no counterpart on {}: their resources are not fenced",
                    unfenced.join(", ")
                ));
            }
            let measured = crate::store_workloads::store_workload(
                workload,
                lock_service,
                args.store.as_deref(),
                clients,
                args,
            )
            .await
            .context(name)?;
            for m in measured {
                progress(args, &m);
                report.measurements.push(m);
            }
            continue;
        }
        for target in &args.targets {
            if workload == Workload::Modes && !matches!(target, Target::Palisade { .. }) {
                report.skipped.push(format!(
                    "modes has no counterpart on {}: read-write locks and semaphores are palisade's",
                    target.kind()
                ));
                continue;
            }
            let observe = Observe {
                pids: pids
                    .iter()
                    .find(|p| p.kind == target.kind())
                    .map(|p| p.pids.clone())
                    .unwrap_or_default(),
                probe: match (target, &args.metrics) {
                    (Target::Palisade { .. }, Some(url)) => Some(Probe {
                        metrics_url: url.clone(),
                    }),
                    _ => None,
                },
            };
            let holds: &[Hold] = match workload {
                Workload::Modes => &[Hold::Exclusive, Hold::Shared, Hold::Permit(clients as u32)],
                _ => &[Hold::Exclusive],
            };
            for &hold in holds {
                let m = lock_workload_as(
                    workload,
                    hold,
                    target,
                    clients,
                    args.warmup,
                    args.duration,
                    &observe,
                )
                .await
                .with_context(|| format!("{} on {target}", workload.name()))?;
                progress(args, &m);
                report.measurements.push(m);
            }
            if workload == Workload::Latency && matches!(target, Target::Palisade { .. }) {
                match handoff_workload(target, args.warmup, args.duration, &observe)
                    .await
                    .with_context(|| format!("latency (handoff) on {target}"))?
                {
                    Some(m) => {
                        progress(args, &m);
                        report.measurements.push(m);
                    }
                    None => report.skipped.push(format!(
                        "latency (handoff) skipped: {target} predates ReleaseThenAcquire"
                    )),
                }
            }
        }
    }
    Ok(report)
}

/// The server processes of each target kind (`--target-pids`, `--server-pid`), each checked
/// readable now, before any workload runs.
fn server_pids(args: &BenchArgs) -> anyhow::Result<Vec<TargetPids>> {
    let mut pids = args.target_pids.clone();
    if let Some(pid) = args.server_pid {
        pids.push(TargetPids {
            kind: "palisade",
            pids: vec![pid],
        });
    }
    for (i, named) in pids.iter().enumerate() {
        if pids[..i].iter().any(|earlier| earlier.kind == named.kind) {
            bail!("--target-pids names {} twice", named.kind);
        }
        if !args.targets.iter().any(|t| t.kind() == named.kind) {
            bail!("--target-pids names {}, but no --target is one", named.kind);
        }
        crate::server_cpu::sample(&named.pids)
            .with_context(|| format!("--target-pids {}", named.kind))?;
    }
    Ok(pids)
}

fn progress(args: &BenchArgs, m: &Measurement) {
    if !args.json {
        eprint!("{}", describe(m));
    }
}

/// The measured window: operations that start at or after `start` and end by `end` count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub start: Instant,
    pub end: Instant,
}

impl Window {
    pub fn after_warmup(warmup: Duration, duration: Duration) -> Window {
        let start = Instant::now() + warmup;
        Window {
            start,
            end: start + duration,
        }
    }

    pub fn counts(&self, started: Instant, ended: Instant) -> bool {
        started >= self.start && ended <= self.end
    }

    /// Whether something that ended at `ended` ended inside the window.
    pub fn holds(&self, ended: Instant) -> bool {
        ended >= self.start && ended <= self.end
    }
}

/// What is read from a target's servers at the start and the end of a workload's measured
/// window: their processes' CPU and context switches, and Palisade's `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Observe {
    pub pids: Vec<u32>,
    pub probe: Option<Probe>,
}

/// What [`Observe`] read over one window.
#[derive(Debug, Default)]
struct Observed {
    cpu: Option<(crate::server_cpu::Sample, crate::server_cpu::Sample)>,
    view: Option<ServerView>,
}

impl Observe {
    /// Waits for the window to open, reads, waits for it to close, reads again. The `/metrics`
    /// scrapes (which cost the server some CPU) happen outside the two `/proc` readings.
    async fn over(self, window: Window) -> anyhow::Result<Observed> {
        let sample = |pids: Vec<u32>| async move {
            if pids.is_empty() {
                return Ok(None);
            }
            tokio::task::spawn_blocking(move || crate::server_cpu::sample(&pids))
                .await?
                .map(Some)
        };
        tokio::time::sleep_until(window.start).await;
        let metrics_before = match &self.probe {
            Some(probe) => Some(probe.read().await?),
            None => None,
        };
        let cpu_before = sample(self.pids.clone()).await?;
        tokio::time::sleep_until(window.end).await;
        let cpu_after = sample(self.pids.clone()).await?;
        let view = match (&self.probe, metrics_before) {
            (Some(probe), Some(before)) => Some(probe.since(&before).await?),
            _ => None,
        };
        Ok(Observed {
            cpu: cpu_before.zip(cpu_after),
            view,
        })
    }
}

/// What one worker measured.
#[derive(Debug, Default)]
pub(crate) struct WorkerStats {
    pub whole: Latencies,
    pub first: Latencies,
    pub second: Latencies,
    /// Lock operations (each acquire, each release) that ended inside the window, whenever they
    /// started: what the servers' CPU in the window is divided by.
    pub lock_operations_in_window: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl WorkerStats {
    pub fn fail(&mut self, error: &anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{error:#}"));
        }
    }

    pub fn merge(&mut self, other: WorkerStats) {
        self.whole.merge(&other.whole);
        self.first.merge(&other.first);
        self.second.merge(&other.second);
        self.lock_operations_in_window += other.lock_operations_in_window;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Waits for every worker, bounded by the window's end plus [`DRAIN_MAX`].
pub(crate) async fn join_workers(
    handles: Vec<tokio::task::JoinHandle<WorkerStats>>,
    window: Window,
) -> WorkerStats {
    let mut total = WorkerStats::default();
    for handle in handles {
        let abort = handle.abort_handle();
        match tokio::time::timeout_at(window.end + DRAIN_MAX, handle).await {
            Ok(Ok(stats)) => total.merge(stats),
            Ok(Err(e)) => total.fail(&anyhow!("a benchmark client failed: {e}")),
            Err(_) => {
                abort.abort();
                total.fail(&anyhow!(
                    "a benchmark client was still busy {} s after the window closed",
                    DRAIN_MAX.as_secs()
                ));
            }
        }
    }
    total
}

/// Runs `uncontended`, `contended` or `latency` on one target, reading what `observe` names
/// over the measured window.
pub async fn lock_workload(
    workload: Workload,
    target: &Target,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    observe: &Observe,
) -> anyhow::Result<Measurement> {
    let hold = Hold::Exclusive;
    lock_workload_as(workload, hold, target, clients, warmup, duration, observe).await
}

/// [`lock_workload`], each client holding its lock as `hold` says: `modes` runs it as a mutex
/// (a lock per client), then with every client on one lock as a reader, or as a permit of one
/// semaphore.
async fn lock_workload_as(
    workload: Workload,
    hold: Hold,
    target: &Target,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    observe: &Observe,
) -> anyhow::Result<Measurement> {
    // A fresh lock-name prefix per run, so locks of an earlier run (and their waiters) are
    // never in the way.
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let one_lock = workload == Workload::Contended || hold != Hold::Exclusive;
    let variant = (workload == Workload::Modes).then_some(match hold {
        Hold::Exclusive => "mutex",
        Hold::Shared => "shared",
        Hold::Permit(_) => "permit",
    });
    let label = variant.unwrap_or(workload.name());
    let lock_name = |client: usize| {
        if one_lock {
            format!("bench/{run_id}/{label}")
        } else {
            format!("bench/{run_id}/{label}/{client}")
        }
    };
    let locks = if one_lock { 1 } else { clients };
    let conns = futures_join_all((0..clients).map(|_| {
        let target = target.clone();
        async move { LockConn::open(&target, SESSION_TTL).await }
    }))
    .await;
    let conns = conns.into_iter().collect::<anyhow::Result<Vec<_>>>()?;

    let window = Window::after_warmup(warmup, duration);
    let observer = tokio::spawn(observe.clone().over(window));
    let handles = conns
        .into_iter()
        .enumerate()
        .map(|(i, conn)| tokio::spawn(lock_worker(conn, lock_name(i), hold, window)))
        .collect();
    let stats = join_workers(handles, window).await;
    let observed = observer
        .await
        .context("the window's observer failed")?
        .with_context(|| format!("reading {target}'s servers over the window"))?;
    let operations = stats.whole.count();
    Ok(Measurement {
        workload,
        variant,
        target: target.to_string(),
        target_kind: target.kind(),
        clients,
        locks,
        operation: "acquire+release cycle",
        duration_s: duration.as_secs_f64(),
        operations,
        operations_per_s: operations as f64 / duration.as_secs_f64(),
        errors: stats.errors,
        first_error: stats.first_error,
        latency: stats.whole.percentiles(),
        acquire: Some(stats.first.percentiles()),
        release: Some(stats.second.percentiles()),
        server: observed.view,
        server_cpu: observed.cpu.map(|(before, after)| {
            crate::server_cpu::over_window(&before, &after, stats.lock_operations_in_window)
        }),
    })
}

async fn lock_worker(mut conn: LockConn, lock: String, hold: Hold, window: Window) -> WorkerStats {
    let mut stats = WorkerStats::default();
    loop {
        let started = Instant::now();
        if started >= window.end {
            break;
        }
        let held = match conn.acquire_as(&lock, hold).await {
            Ok(held) => held,
            Err(e) => {
                stats.fail(&e.context(format!("acquire {lock}")));
                break;
            }
        };
        let granted = Instant::now();
        if let Err(e) = conn.release(held).await {
            stats.fail(&e.context(format!("release {lock}")));
            break;
        }
        let released = Instant::now();
        stats.lock_operations_in_window +=
            u64::from(window.holds(granted)) + u64::from(window.holds(released));
        if window.counts(started, released) {
            stats.whole.record(released - started);
            stats.first.record(granted - started);
            stats.second.record(released - granted);
        }
    }
    conn.close().await;
    stats
}

/// `latency`'s second row on Palisade: one client hands its lock to itself, a release and an
/// acquire of the same lock in one call (`ReleaseThenAcquire`) per cycle, each cycle a new
/// grant with a new token, made durable by one log write where `latency` makes two. `None` if
/// the server predates the call (it answers `UNIMPLEMENTED`).
async fn handoff_workload(
    target: &Target,
    warmup: Duration,
    duration: Duration,
    observe: &Observe,
) -> anyhow::Result<Option<Measurement>> {
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let lock = format!("bench/{run_id}/handoff");
    let mut conn = LockConn::open(target, SESSION_TTL).await?;
    let held = conn.acquire(&lock).await?;
    let held = match conn.handoff(held).await {
        Ok(held) => held,
        Err(e) if is_unimplemented(&e) => {
            conn.close().await;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let window = Window::after_warmup(warmup, duration);
    let observer = tokio::spawn(observe.clone().over(window));
    let worker = handoff_worker(conn, held, lock, window);
    let stats = join_workers(vec![tokio::spawn(worker)], window).await;
    let observed = observer
        .await
        .context("the window's observer failed")?
        .with_context(|| format!("reading {target}'s servers over the window"))?;
    let operations = stats.whole.count();
    Ok(Some(Measurement {
        workload: Workload::Latency,
        variant: Some("handoff"),
        target: target.to_string(),
        target_kind: target.kind(),
        clients: 1,
        locks: 1,
        operation: "release+acquire call",
        duration_s: duration.as_secs_f64(),
        operations,
        operations_per_s: operations as f64 / duration.as_secs_f64(),
        errors: stats.errors,
        first_error: stats.first_error,
        latency: stats.whole.percentiles(),
        acquire: None,
        release: None,
        server: observed.view,
        server_cpu: observed.cpu.map(|(before, after)| {
            crate::server_cpu::over_window(&before, &after, stats.lock_operations_in_window)
        }),
    }))
}

/// A Palisade server too old for the call refused it.
fn is_unimplemented(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<palisade_client::AcquireError>(),
        Some(palisade_client::AcquireError::Rejected {
            code: tonic::Code::Unimplemented,
            ..
        })
    )
}

async fn handoff_worker(
    mut conn: LockConn,
    mut held: Held,
    lock: String,
    window: Window,
) -> WorkerStats {
    let mut stats = WorkerStats::default();
    loop {
        let started = Instant::now();
        if started >= window.end {
            break;
        }
        held = match conn.handoff(held).await {
            Ok(next) => next,
            Err(e) => {
                stats.fail(&e.context(format!("release and acquire {lock}")));
                conn.close().await;
                return stats;
            }
        };
        let done = Instant::now();
        // A release and an acquire, in one call.
        stats.lock_operations_in_window += 2 * u64::from(window.holds(done));
        if window.counts(started, done) {
            stats.whole.record(done - started);
        }
    }
    let _ = conn.release(held).await;
    conn.close().await;
    stats
}

/// Awaits every future concurrently, in order.
pub(crate) async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        outputs.push(handle.await.expect("a setup task does not panic"));
    }
    outputs
}

/// `32 clients, 32 locks` or `1 client, 1 lock`.
fn shape(m: &Measurement) -> String {
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    format!(
        "{}, {}",
        plural(m.clients, "client"),
        plural(m.locks, "lock")
    )
}

/// A human-readable account of one measurement.
pub fn describe(m: &Measurement) -> String {
    let mut out = String::new();
    let variant = m.variant.map(|v| format!(" ({v})")).unwrap_or_default();
    let _ = writeln!(
        out,
        "{}{variant} on {}: {}, {:.1} s measured",
        m.workload.name(),
        m.target,
        shape(m),
        m.duration_s
    );
    let _ = writeln!(
        out,
        "  {:>10.1} {}s/s ({} in the window, {} errors)",
        m.operations_per_s, m.operation, m.operations, m.errors
    );
    let _ = writeln!(out, "  {:<8} {}", "whole", m.latency);
    if let Some(p) = &m.acquire {
        let _ = writeln!(out, "  {:<8} {p}", "acquire");
    }
    if let Some(p) = &m.release {
        let _ = writeln!(out, "  {:<8} {p}", "release");
    }
    if let Some(v) = &m.server {
        let show = |v: Option<f64>, scale: f64, unit: &str| {
            v.map_or("?".to_string(), |v| format!("{:.2}{unit}", v * scale))
        };
        let _ = writeln!(
            out,
            "  server   {} log commits/s, mean {} each, {} records per commit; \
             {} server-side; bench CPU {} cores",
            show(v.log_commits_per_s, 1.0, ""),
            show(v.log_commit_mean_us, 1e-3, " ms"),
            show(v.writes_per_commit, 1.0, ""),
            v.call_means(),
            show(v.bench_cpu_cores, 1.0, ""),
        );
    }
    if let Some(c) = &m.server_cpu {
        let per_op =
            |v: Option<f64>, digits: usize| v.map_or("—".into(), |v| format!("{v:.digits$}"));
        let _ = writeln!(
            out,
            "  servers  {} µs CPU and {} context switches per lock operation \
             ({} operations, {:.2} cores, {} threads of pids {:?})",
            per_op(c.cpu_us_per_operation, 0),
            per_op(c.context_switches_per_operation, 2),
            c.lock_operations,
            c.cpu_cores,
            c.threads,
            c.pids,
        );
    }
    if let Some(e) = &m.first_error {
        let _ = writeln!(out, "  first error: {e}");
    }
    out
}

/// `modes` side by side: each way of holding a lock, its cycles per second (and as a fraction of
/// the mutex's) and latency; empty when `modes` did not run.
pub fn modes_table(report: &BenchReport) -> String {
    let measured: Vec<&Measurement> = (report.measurements.iter())
        .filter(|m| m.workload == Workload::Modes)
        .collect();
    let Some(mutex) = measured.iter().find(|m| m.variant == Some("mutex")) else {
        return String::new();
    };
    let mut out = String::from(
        "| held as | clients, locks | cycles/s | ÷ mutex | cycle p50 | cycle p99 | acquire p50 |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for m in &measured {
        let ratio = match mutex.operations_per_s {
            base if base > 0.0 => format!("{:.2}", m.operations_per_s / base),
            _ => "—".into(),
        };
        let kind = match m.variant {
            Some("shared") => "reader (`--shared`)".to_string(),
            Some("permit") => format!("permit (`--permits {}`)", m.clients),
            _ => "mutex".to_string(),
        };
        let _ = writeln!(
            out,
            "| {kind} | {} | {:.0} | {ratio} | {} | {} | {} |",
            shape(m),
            m.operations_per_s,
            format_us(m.latency.p50_us),
            format_us(m.latency.p99_us),
            m.acquire
                .as_ref()
                .map_or("—".into(), |a| format_us(a.p50_us)),
        );
    }
    out
}

/// The server's side of each palisade lock workload, when it was probed.
pub fn server_table(report: &BenchReport) -> String {
    let probed: Vec<&Measurement> = report
        .measurements
        .iter()
        .filter(|m| m.server.is_some())
        .collect();
    if probed.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "| workload | client cycle p50 | server acquire mean | server release mean | \
         server release-then-acquire mean | log commits/s | commit (fsync) mean | \
         records per commit | server CPU | bench CPU |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let us = |v: Option<f64>| v.map_or("—".to_string(), format_us);
    let num =
        |v: Option<f64>, digits: usize| v.map_or("—".to_string(), |v| format!("{v:.digits$}"));
    for m in probed {
        let v = m.server.expect("filtered on server views");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            m.variant.map_or_else(
                || m.workload.name().to_string(),
                |variant| format!("{} ({variant})", m.workload.name())
            ),
            format_us(m.latency.p50_us),
            us(v.acquire_mean_us),
            us(v.release_mean_us),
            us(v.handoff_mean_us),
            num(v.log_commits_per_s, 0),
            us(v.log_commit_mean_us),
            num(v.writes_per_commit, 2),
            num(m.server_cpu.as_ref().map(|c| c.cpu_cores), 2),
            num(v.bench_cpu_cores, 2),
        );
    }
    out
}

/// The comparison table: one column per target kind; with `--floor` a floor column and each
/// result as a fraction of it; with two kinds or more, the first one's advantage over each other
/// safe kind (above 1× means the first is better) and our target where there is one.
pub fn markdown_table(report: &BenchReport, targets: &[Target]) -> String {
    let columns = Columns::new(report, targets);
    let mut out = columns.header();
    for row in lock_rows(report, &columns) {
        out.push_str(&row.show(&columns));
    }
    out.push_str(&fenced_write_rows(report, &columns));
    for workload in [Workload::FencedRead, Workload::Txn] {
        out.push_str(&store_rows(report, workload, &columns));
    }
    out
}

/// The columns of the comparison table.
struct Columns<'a> {
    /// One per target kind, in the order the targets were given: its kind and whether it is safe.
    kinds: Vec<(&'static str, bool)>,
    floor: Option<&'a Floor>,
    /// Kinds (indices into `kinds`) the first kind's advantage is shown against: every other
    /// safe one.
    rivals: Vec<usize>,
}

impl<'a> Columns<'a> {
    fn new(report: &'a BenchReport, targets: &[Target]) -> Columns<'a> {
        let mut kinds: Vec<(&'static str, bool)> = Vec::new();
        for target in targets {
            if !kinds.iter().any(|(kind, _)| *kind == target.kind()) {
                kinds.push((target.kind(), target.is_safe()));
            }
        }
        let rivals = (1..kinds.len()).filter(|&i| kinds[i].1).collect();
        Columns {
            kinds,
            floor: report.floor.as_ref(),
            rivals,
        }
    }

    /// Whether the advantage and target columns are shown.
    fn compare(&self) -> bool {
        !self.rivals.is_empty()
    }

    fn header(&self) -> String {
        let mut out = String::from("| workload | metric |");
        let mut line = String::from("|---|---|");
        if self.floor.is_some() {
            out.push_str(" floor |");
            line.push_str("---:|");
        }
        for (kind, safe) in &self.kinds {
            if *safe {
                let _ = write!(out, " {kind} |");
            } else {
                let _ = write!(out, " {kind} (unsafe: no fencing, not durable) |");
            }
            line.push_str("---:|");
        }
        if self.compare() {
            for &rival in &self.rivals {
                let _ = write!(out, " {} ÷ {} |", self.kinds[0].0, self.kinds[rival].0);
                line.push_str("---:|");
            }
            out.push_str(" target |");
            line.push_str("---|");
        }
        format!("{out}\n{line}\n")
    }

    /// A row measured on the first kind only (the fenced store's): `cell` under it, `n/a` under
    /// the others, and `target` in the target column.
    fn first_only(&self, label: &str, metric: &str, cell: &str, target: &str) -> String {
        let mut out = format!("| {label} | {metric} |");
        if self.floor.is_some() {
            out.push_str(" — |");
        }
        let _ = write!(out, " {cell} |");
        out.push_str(&" n/a |".repeat(self.kinds.len().saturating_sub(1)));
        if self.compare() {
            out.push_str(&" — |".repeat(self.rivals.len()));
            let _ = write!(out, " {target} |");
        }
        out.push('\n');
        out
    }
}

/// One row of the comparison table for the lock workloads: a metric measured on every target.
struct Row {
    workload: String,
    metric: &'static str,
    /// One value per target kind, in the table's column order.
    values: Vec<Option<f64>>,
    /// What this machine allows for the metric, when the floor was measured and bounds it.
    floor: Option<f64>,
    higher_better: bool,
    target: &'static str,
    unit: Unit,
}

impl Row {
    fn show(&self, columns: &Columns<'_>) -> String {
        let mut out = String::new();
        let _ = write!(out, "| {} | {} |", self.workload, self.metric);
        if columns.floor.is_some() {
            let _ = write!(out, " {} |", self.unit.show(self.floor));
        }
        for v in &self.values {
            let fraction = match self.floor {
                Some(_) => self.fraction_of_floor(*v),
                None => String::new(),
            };
            let _ = write!(out, " {}{fraction} |", self.unit.show(*v));
        }
        if columns.compare() {
            for &rival in &columns.rivals {
                let advantage = match (self.values[0], self.values[rival]) {
                    (Some(a), Some(b)) if a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite() => {
                        let ratio = if self.higher_better { a / b } else { b / a };
                        format!("{ratio:.2}×")
                    }
                    _ => "—".into(),
                };
                let _ = write!(out, " {advantage} |");
            }
            let _ = write!(out, " {} |", self.target);
        }
        out.push('\n');
        out
    }

    /// ` (12 %)`: how much of what the machine allows a value reaches — a rate divided by its
    /// ceiling, or the floor's latency divided by the measured one.
    fn fraction_of_floor(&self, value: Option<f64>) -> String {
        let (Some(floor), Some(value)) = (self.floor, value) else {
            return String::new();
        };
        if !(floor > 0.0 && value > 0.0 && floor.is_finite() && value.is_finite()) {
            return String::new();
        }
        let fraction = if self.higher_better {
            value / floor
        } else {
            floor / value
        };
        let percent = fraction * 100.0;
        if percent < 10.0 {
            format!(" ({percent:.1} %)")
        } else {
            format!(" ({percent:.0} %)")
        }
    }
}

/// A metric of a lock workload, as the comparison table shows it.
struct LockMetric {
    workload: Workload,
    metric: &'static str,
    value: fn(&Measurement) -> Option<f64>,
    /// What the machine allows for it (`palisade bench floor`), where the floor bounds it.
    floor: Option<fn(&Bounds) -> Option<f64>>,
    higher_better: bool,
    /// Our target against etcd, where there is one.
    target: &'static str,
    unit: Unit,
}

/// Row labels of the servers' CPU and context switches (one lock operation: an acquire or a
/// release; a cycle is two).
const CPU_METRIC: &str = "server CPU per lock operation (acquire or release; all members)";
const SWITCHES_METRIC: &str =
    "server context switches per lock operation (voluntary + involuntary; all members)";

/// The servers' CPU and context switches per lock operation, after each workload's throughput
/// (or, for `latency`, its percentiles).
const fn cpu_metrics(workload: Workload) -> [LockMetric; 2] {
    [
        LockMetric {
            workload,
            metric: CPU_METRIC,
            value: |m| m.server_cpu.as_ref()?.cpu_us_per_operation,
            floor: None,
            higher_better: false,
            target: "",
            unit: Unit::CpuMicros,
        },
        LockMetric {
            workload,
            metric: SWITCHES_METRIC,
            value: |m| m.server_cpu.as_ref()?.context_switches_per_operation,
            floor: None,
            higher_better: false,
            target: "",
            unit: Unit::Count,
        },
    ]
}

/// The rows of the lock workloads, in the table's order.
const LOCK_METRICS: [&[LockMetric]; 6] = [
    &[LockMetric {
        workload: Workload::Uncontended,
        metric: "acquire+release cycles/s",
        value: |m| Some(m.operations_per_s),
        floor: Some(|b| b.cycles_estimate_per_s),
        higher_better: true,
        target: "≥ 10×",
        unit: Unit::PerSecond,
    }],
    &cpu_metrics(Workload::Uncontended),
    &[
        LockMetric {
            workload: Workload::Uncontended,
            metric: "cycle latency p50",
            value: |m| Some(m.latency.p50_us),
            floor: Some(|b| Some(b.cycle_us)),
            higher_better: false,
            target: "",
            unit: Unit::Micros,
        },
        LockMetric {
            workload: Workload::Contended,
            metric: "grants/s",
            value: |m| Some(m.operations_per_s),
            floor: Some(|b| Some(b.contended_per_s)),
            higher_better: true,
            target: "≥ 20×",
            unit: Unit::PerSecond,
        },
    ],
    &cpu_metrics(Workload::Contended),
    &[
        LockMetric {
            workload: Workload::Contended,
            metric: "wait for the grant p99",
            value: |m| Some(m.acquire?.p99_us),
            floor: None,
            higher_better: false,
            target: "",
            unit: Unit::Micros,
        },
        LockMetric {
            workload: Workload::Latency,
            metric: "acquire+release p50",
            value: |m| Some(m.latency.p50_us),
            floor: Some(|b| Some(b.cycle_us)),
            higher_better: false,
            target: "≤ 0.45 ms",
            unit: Unit::Micros,
        },
        LockMetric {
            workload: Workload::Latency,
            metric: "acquire+release p99",
            value: |m| Some(m.latency.p99_us),
            floor: Some(|b| Some(b.cycle_p99_reference_us)),
            higher_better: false,
            target: "",
            unit: Unit::Micros,
        },
        LockMetric {
            workload: Workload::Latency,
            metric: "acquire+release p99.9",
            value: |m| Some(m.latency.p999_us),
            floor: Some(|b| Some(b.cycle_p999_reference_us)),
            higher_better: false,
            target: "",
            unit: Unit::Micros,
        },
        LockMetric {
            workload: Workload::Latency,
            metric: "acquire alone p50",
            value: |m| Some(m.acquire?.p50_us),
            floor: Some(|b| Some(b.acquire_us)),
            higher_better: false,
            target: "",
            unit: Unit::Micros,
        },
    ],
    &cpu_metrics(Workload::Latency),
];

/// The rows of the lock workloads (`uncontended`, `contended`, `latency`) that were measured.
fn lock_rows(report: &BenchReport, columns: &Columns<'_>) -> Vec<Row> {
    let label_of = |workload: Workload| {
        report
            .measurements
            .iter()
            .find(|m| m.workload == workload)
            .map(|m| format!("{} ({})", workload.name(), shape(m)))
    };
    let bounds = columns.floor.map(|f| f.bounds(report.nodes));
    LOCK_METRICS
        .iter()
        .flat_map(|metrics| metrics.iter())
        .filter_map(|metric| {
            let workload = label_of(metric.workload)?;
            let values: Vec<Option<f64>> = columns
                .kinds
                .iter()
                .map(|(k, _)| {
                    // A workload that completed no operation (it failed) has no figures.
                    let measured = report
                        .find(metric.workload, None, k)
                        .filter(|m| m.operations > 0)?;
                    (metric.value)(measured)
                })
                .collect();
            // The servers' rows only when some server was read.
            if metric.unit.is_server_side() && values.iter().all(Option::is_none) {
                return None;
            }
            Some(Row {
                workload,
                metric: metric.metric,
                values,
                floor: bounds.zip(metric.floor).and_then(|(b, bound)| bound(&b)),
                higher_better: metric.higher_better,
                target: metric.target,
                unit: metric.unit,
            })
        })
        .collect()
}

/// The rows of `fenced-write`: unfenced, fenced (and over HTTP) writes per second, and what
/// fencing costs. Measured on Palisade's store only, so every other target's cell is `n/a`.
fn fenced_write_rows(report: &BenchReport, columns: &Columns<'_>) -> String {
    let find = |variant: &str| {
        report
            .measurements
            .iter()
            .find(|m| m.workload == Workload::FencedWrite && m.variant == Some(variant))
    };
    let (Some(f), Some(u)) = (find("fenced"), find("unfenced")) else {
        return String::new();
    };
    let mut out = String::new();
    let label = format!("fenced-write ({})", shape(f));
    let mut rate_row = |metric: &str, m: &Measurement| {
        let cell = format!(
            "{} ({})",
            Unit::PerSecond.show(Some(m.operations_per_s)),
            format_us(m.latency.p50_us)
        );
        out.push_str(&columns.first_only(&label, metric, &cell, ""));
    };
    rate_row("unfenced writes/s (p50)", u);
    rate_row("fenced writes/s (p50)", f);
    if let Some(h) = find("fenced-http") {
        rate_row("fenced writes over HTTP/s (p50)", h);
    }
    let cost = if f.operations_per_s > 0.0 {
        u.operations_per_s / f.operations_per_s
    } else {
        f64::NAN
    };
    out.push_str(&columns.first_only(
        &label,
        "fencing cost (unfenced ÷ fenced throughput)",
        &format!("{cost:.3}×"),
        "≤ 1.05×",
    ));
    out
}

/// The rows of `fenced-read` or `txn`: each path's rate and median, and what one operation costs
/// against a fenced write of the same run on the same store (fenced writes/s ÷ its
/// operations/s: 1× costs the same, below 1× is cheaper).
fn store_rows(report: &BenchReport, workload: Workload, columns: &Columns<'_>) -> String {
    let measured: Vec<&Measurement> = report
        .measurements
        .iter()
        .filter(|m| m.workload == workload)
        .collect();
    let Some(first) = measured.first() else {
        return String::new();
    };
    let label = format!("{} ({})", workload.name(), shape(first));
    let mut out = String::new();
    for m in &measured {
        let metric = format!("{}: {}s/s (p50)", m.variant.unwrap_or(""), m.operation);
        let cell = format!(
            "{} ({})",
            Unit::PerSecond.show(Some(m.operations_per_s)),
            format_us(m.latency.p50_us)
        );
        out.push_str(&columns.first_only(&label, &metric, &cell, ""));
    }
    let rate = |variant: &str| {
        measured
            .iter()
            .find(|m| m.variant == Some(variant))
            .map(|m| m.operations_per_s)
    };
    for m in &measured {
        let variant = m.variant.unwrap_or("");
        if variant.starts_with("fenced-write") {
            continue;
        }
        let http = if variant.ends_with("-http") {
            "-http"
        } else {
            ""
        };
        // A holder's fenced write, and for the first read of a new grant also the first write
        // of one (both verify a sequencer not seen before and advance the token).
        let mut yardsticks = vec![format!("fenced-write{http}")];
        if variant.starts_with("advancing-read") {
            yardsticks.push(format!("advancing-write{http}"));
        }
        for yardstick in yardsticks {
            let cost = match rate(&yardstick) {
                Some(write) if m.operations_per_s > 0.0 => write / m.operations_per_s,
                _ => f64::NAN,
            };
            let metric = format!("cost of one {variant} ({yardstick} ÷ {variant} throughput)");
            out.push_str(&columns.first_only(&label, &metric, &format!("{cost:.3}×"), ""));
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Unit {
    PerSecond,
    Micros,
    /// `137 µs`: CPU time per operation.
    CpuMicros,
    /// `4.2`: a count per operation.
    Count,
}

impl Unit {
    fn show(self, value: Option<f64>) -> String {
        match value {
            Some(v) if v.is_finite() => match self {
                Unit::PerSecond => format!("{v:.0}"),
                Unit::Micros => format_us(v),
                Unit::CpuMicros => format!("{v:.0} µs"),
                Unit::Count => format!("{v:.1}"),
            },
            _ => "—".into(),
        }
    }

    /// Read from the servers' `/proc` (shown only when some target's servers were named).
    fn is_server_side(self) -> bool {
        matches!(self, Unit::CpuMicros | Unit::Count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(workload: Workload, kind: &'static str, per_s: f64, p50_us: f64) -> Measurement {
        let percentiles = Percentiles {
            samples: 10,
            mean_us: p50_us,
            p50_us,
            p90_us: p50_us,
            p99_us: p50_us,
            p999_us: p50_us,
            max_us: p50_us,
        };
        Measurement {
            workload,
            variant: None,
            target: format!("{kind}://127.0.0.1:1"),
            target_kind: kind,
            clients: 1,
            locks: 1,
            operation: "acquire+release cycle",
            duration_s: 1.0,
            operations: per_s as u64,
            operations_per_s: per_s,
            errors: 0,
            first_error: None,
            latency: percentiles,
            acquire: Some(percentiles),
            release: Some(percentiles),
            server: None,
            server_cpu: None,
        }
    }

    #[test]
    fn the_table_shows_every_peer_labels_redis_unsafe_and_relates_each_result_to_the_floor() {
        let targets: Vec<Target> = [
            "palisade://127.0.0.1:1",
            "etcd://127.0.0.1:2",
            "zk://127.0.0.1:3",
            "redis://127.0.0.1:4",
        ]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
        let floor = Floor::example();
        // The contended ceiling is 1e6 / 250 = 4000 grants/s; the latency floor 0.480 ms.
        let report = BenchReport {
            cpus: 2,
            duration_s: 1.0,
            warmup_s: 0.0,
            nodes: 1,
            measurements: vec![
                measured(Workload::Contended, "palisade", 2000.0, 960.0),
                measured(Workload::Contended, "etcd", 400.0, 4800.0),
                measured(Workload::Contended, "zookeeper", 1000.0, 1920.0),
                measured(Workload::Contended, "redis", 8000.0, 240.0),
            ],
            skipped: Vec::new(),
            floor: Some(floor),
        };
        let table = markdown_table(&report, &targets);
        let header = table.lines().next().unwrap();
        assert_eq!(
            header,
            "| workload | metric | floor | palisade | etcd | zookeeper \
             | redis (unsafe: no fencing, not durable) | palisade ÷ etcd \
             | palisade ÷ zookeeper | target |"
        );
        let grants = table
            .lines()
            .find(|l| l.contains("grants/s"))
            .expect("a grants/s row");
        assert_eq!(
            grants,
            "| contended (1 client, 1 lock) | grants/s | 4000 | 2000 (50 %) | 400 (10 %) \
             | 1000 (25 %) | 8000 (200 %) | 5.00× | 2.00× | ≥ 20× |"
        );
        // A metric with no bound gets no floor and no fraction.
        let wait = table
            .lines()
            .find(|l| l.contains("wait for the grant p99"))
            .expect("a wait row");
        assert!(wait.contains("| — | 0.960 ms |"), "{wait}");

        // Without the floor, and with one target, the table has neither column.
        let alone = BenchReport {
            floor: None,
            ..report.clone()
        };
        let table = markdown_table(&alone, &targets[..1]);
        assert_eq!(
            table.lines().next().unwrap(),
            "| workload | metric | palisade |"
        );
    }

    #[test]
    fn every_system_gets_cpu_and_switch_rows_and_a_cluster_its_three_node_bounds() {
        let targets: Vec<Target> = ["palisade://127.0.0.1:1", "etcd://127.0.0.1:2"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let with_cpu = |kind: &'static str, cpu_us: f64, switches: f64| {
            let mut m = measured(Workload::Latency, kind, 1000.0, 800.0);
            m.server_cpu = Some(ServerCpu {
                pids: vec![1, 2, 3],
                window_s: 1.0,
                lock_operations: 2000,
                cpu_s: cpu_us * 2000.0 / 1e6,
                cpu_cores: cpu_us * 2000.0 / 1e6,
                cpu_us_per_operation: Some(cpu_us),
                context_switches: (switches * 2000.0) as u64,
                context_switches_per_operation: Some(switches),
                threads: 30,
                threads_started: 0,
                threads_exited: 0,
            });
            m
        };
        let report = BenchReport {
            cpus: 2,
            duration_s: 1.0,
            warmup_s: 0.0,
            nodes: 3,
            measurements: vec![
                with_cpu("palisade", 150.0, 4.0),
                with_cpu("etcd", 300.0, 10.0),
            ],
            skipped: Vec::new(),
            floor: Some(Floor::example()),
        };
        let table = markdown_table(&report, &targets);
        let row = |metric: &str| {
            table
                .lines()
                .find(|l| l.contains(metric))
                .unwrap_or_else(|| panic!("no {metric} row: {table}"))
                .to_string()
        };
        // Lower is better: etcd's 300 µs is twice palisade's 150 µs, a 2× advantage.
        assert_eq!(
            row(CPU_METRIC),
            format!(
                "| latency (1 client, 1 lock) | {CPU_METRIC} | — | 150 µs | 300 µs | 2.00× |  |"
            )
        );
        assert_eq!(
            row(SWITCHES_METRIC),
            format!(
                "| latency (1 client, 1 lock) | {SWITCHES_METRIC} | — | 4.0 | 10.0 | 2.50× |  |"
            )
        );
        // The floor column holds the 3-node bound: 2 × (100 + 80 + 80 + 2 × 25) + 20 µs.
        assert!(
            row("acquire+release p50").contains("| 0.640 ms | 0.800 ms (80 %) |"),
            "{table}"
        );

        // A system whose workload failed (no operation completed) shows no figure, not 0 ms.
        let mut failed = measured(Workload::Latency, "etcd", 0.0, 0.0);
        failed.errors = 1;
        let one_failed = BenchReport {
            measurements: vec![with_cpu("palisade", 150.0, 4.0), failed],
            ..report.clone()
        };
        let table = markdown_table(&one_failed, &targets);
        let p50 = table
            .lines()
            .find(|l| l.contains("acquire+release p50"))
            .unwrap();
        assert!(p50.contains("| 0.800 ms (80 %) | — |"), "{p50}");

        // Without any server read, no CPU rows at all.
        let unread = BenchReport {
            measurements: vec![measured(Workload::Latency, "palisade", 1000.0, 800.0)],
            ..report.clone()
        };
        assert!(!markdown_table(&unread, &targets).contains("server CPU"));
    }
}
