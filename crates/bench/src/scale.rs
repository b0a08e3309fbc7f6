//! `palisade bench scale`: how the cost of a lock service grows with its state.
//!
//! The benchmark starts its own durable `palisade serve` (and, with `--etcd-bin`, an etcd) as a
//! child process ([`crate::scale_process`]), so that it can read the server's resident memory
//! and kill and restart it. It grows the state stepwise in four phases, each on a fresh server:
//! open sessions (1k → 10k → 100k), held locks (10k → 100k → 1M, held by `--lock-sessions`
//! sessions), waiters queued on one lock, and watchers. The state is filled fast — many
//! concurrent requests over several connections, bounded in flight — and at each step it
//! measures ([`StepReport`]):
//!
//! - acquire+release latency of a probe client on a lock of its own;
//! - the server's RSS, and its growth over the phase's empty baseline per session, lock, waiter
//!   or watcher;
//! - a full listing of the locks (the client library's paginated list; etcd: paginated Range);
//! - a snapshot: the log is driven (acquire+release cycles of loader sessions) until the
//!   server builds one; its size and time, and the probe's slowest cycle during it as a
//!   multiple of the probe's median outside it;
//! - restart: `SIGKILL` and a new process on the same directory, until it answers a status.
//!
//! etcd runs the same steps with its own recipe: a lease per session, a lock key (the v3 lock
//! service) per held lock or waiter, a Watch stream per watcher.
//!
//! Steps respect the server's limits: a step that asks for more than a cap allows is grown to
//! the cap, and the report says which cap. `--time-limit` bounds the whole run: a fill stops
//! at the deadline and the step is measured and reported with what it reached.

use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use palisade_client::{AcquireOptions, Client, ClientOptions, SessionCredential, Wait};
use serde::Serialize;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::etcdserverpb::kv_client::KvClient;
use crate::etcdserverpb::lease_client::LeaseClient;
use crate::etcdserverpb::watch_client::WatchClient;
use crate::etcdserverpb::{
    LeaseGrantRequest, RangeRequest, WatchCreateRequest, WatchRequest, watch_request,
};
use crate::scale_process::{LogTail, Program, SNAPSHOT_BUILD_LINE, Server};
use crate::stats::{Latencies, Percentiles, format_us};
use crate::v3lockpb::lock_client::LockClient;
use crate::v3lockpb::{LockRequest, UnlockRequest};

/// Longest `--time-limit`.
const TIME_LIMIT_MAX: Duration = Duration::from_secs(24 * 3600);
/// Largest step of `--sessions` and `--locks` (and `--max-*`) accepted; the server's own caps
/// are lower and are applied on top.
const STEP_MAX: usize = 10_000_000;
/// Most steps in one list.
const STEPS_MAX: usize = 32;
/// Most `--waiters` and `--watchers`.
const LONG_LIVED_MAX: usize = 100_000;
/// Most `--lock-sessions`.
const LOCK_SESSIONS_MAX: usize = 10_000;
/// Bounds of `--probe-cycles`.
const PROBE_CYCLES_MIN: usize = 10;
const PROBE_CYCLES_MAX: usize = 100_000;

/// Lease of every session the benchmark opens: nothing renews them, and none may end mid-run.
const SESSION_TTL: Duration = Duration::from_secs(6 * 3600);
/// Connections that fill the state, and requests in flight over all of them.
const FILL_CONNECTIONS: usize = 8;
const FILL_IN_FLIGHT: usize = 256;
/// Failed requests a fill tolerates before it stops (the first error is reported).
const FILL_ERRORS_MAX: u64 = 100;
/// Long-lived calls (waits, watches) put on one connection: below the server's
/// per-connection limit ([`palisade_server::limits::LONG_LIVED_CALLS_PER_CONNECTION_MAX`]).
const LONG_LIVED_PER_CONNECTION: usize = 900;
/// Sessions of the snapshot loader, and the probe's and the loader's locks, kept out of the
/// fill so that a fill to the server's cap leaves them room.
const LOADER_SESSIONS: usize = 16;
const SESSIONS_RESERVED: usize = LOADER_SESSIONS + 4;
const LOCKS_RESERVED: usize = LOADER_SESSIONS + 8;
/// Most acquire+release cycles the loader runs to bring on one snapshot (the server snapshots
/// every [`palisade_server::limits::SNAPSHOT_INTERVAL_ENTRIES`] log entries; a cycle is two).
const LOADER_CYCLES_MAX: u64 = 40_000;
/// Longest wait for a snapshot to start and to finish, for a server to answer after a restart,
/// for waiters to queue and watches to open.
const SNAPSHOT_WAIT_MAX: Duration = Duration::from_secs(180);
const RESTART_WAIT_MAX: Duration = Duration::from_secs(300);
const QUEUE_WAIT_MAX: Duration = Duration::from_secs(120);
/// How often the snapshot and queue monitors look.
const MONITOR_INTERVAL: Duration = Duration::from_millis(2);
/// Keys per page of etcd's listing (Palisade's page size is the server's).
const ETCD_PAGE_KEYS: i64 = 1_000;

const _: () = assert!(
    LONG_LIVED_PER_CONNECTION < palisade_server::limits::LONG_LIVED_CALLS_PER_CONNECTION_MAX
);
const _: () = assert!(SESSIONS_RESERVED < palisade_core::limits::SESSIONS_MAX);
const _: () = assert!(LOCKS_RESERVED < palisade_core::limits::LOCKS_MAX);
const _: () = assert!(
    FILL_IN_FLIGHT / FILL_CONNECTIONS
        <= palisade_server::limits::CONCURRENT_REQUESTS_PER_CONNECTION_MAX
);

/// At which steps a snapshot is brought on and timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotSteps {
    Every,
    /// The last step of each phase only.
    Last,
    None,
}

/// Flags of `palisade bench scale`.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "bench scale")]
pub struct ScaleArgs {
    /// Open sessions to grow to, step by step (`bench scale`).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub sessions: Vec<usize>,
    /// Held locks to grow to, step by step (`bench scale`).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    pub locks: Vec<usize>,
    /// Leave out session steps above this.
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Leave out lock steps above this.
    #[arg(long)]
    pub max_locks: Option<usize>,
    /// Sessions that hold the locks of the lock steps (one session holds many).
    #[arg(long, default_value_t = 1_000)]
    pub lock_sessions: usize,
    /// Waiters queued on one lock, each its own session (0: no waiters step).
    #[arg(long, default_value_t = 10_000)]
    pub waiters: usize,
    /// Watchers, each watching a lock of its own (0: no watchers step).
    #[arg(long, default_value_t = 10_000)]
    pub watchers: usize,
    /// Limit of the whole run: filling stops at it and the steps report what they reached.
    #[arg(long, default_value = "30m", value_parser = palisade_core::duration::parse_duration)]
    pub time_limit: Duration,
    /// Acquire+release cycles of the probe client at each step.
    #[arg(long, default_value_t = 300)]
    pub probe_cycles: usize,
    /// At which steps to bring on a snapshot and time it.
    #[arg(long, value_enum, default_value = "every")]
    pub snapshot: SnapshotSteps,
    /// Also run every step against etcd: the etcd binary to start (3.4 or later).
    #[arg(long)]
    pub etcd_bin: Option<PathBuf>,
    /// The palisade binary to start (default: this one).
    #[arg(long)]
    pub palisade_bin: Option<PathBuf>,
}

impl Default for ScaleArgs {
    /// The defaults of the flags (one place: their `default_value`s).
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            scale: ScaleArgs,
        }
        <Flags as clap::Parser>::parse_from(["scale"]).scale
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    pub cpus: usize,
    pub time_limit_s: f64,
    pub elapsed_s: f64,
    pub steps: Vec<StepReport>,
    pub goals: Vec<Goal>,
    /// Steps left out or cut short, caps that limited a step, and why.
    pub notes: Vec<String>,
}

/// What a step grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Sessions,
    Locks,
    Waiters,
    Watchers,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Sessions => "sessions",
            Phase::Locks => "locks",
            Phase::Waiters => "waiters",
            Phase::Watchers => "watchers",
        }
    }

    /// The unit RSS is divided by.
    fn unit(self) -> &'static str {
        match self {
            Phase::Sessions => "session",
            Phase::Locks => "lock",
            Phase::Waiters => "waiter",
            Phase::Watchers => "watcher",
        }
    }

    /// Share of the run's time this phase may use (unused time passes to the next).
    fn weight(self) -> u32 {
        match self {
            Phase::Sessions => 2,
            Phase::Locks => 6,
            Phase::Waiters | Phase::Watchers => 1,
        }
    }
}

/// One step: the state it reached and what was measured there.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// `palisade` or `etcd`.
    pub system: &'static str,
    pub phase: Phase,
    /// What the step asked for, and what it reached.
    pub target: usize,
    pub reached: usize,
    /// The server limit that lowered the target, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capped_by: Option<String>,
    /// The fill stopped at the time limit.
    pub cut_by_time_limit: bool,
    /// Seconds the fill of this step took, and units added per second.
    pub fill_s: f64,
    pub fill_per_s: f64,
    pub probe: Option<Percentiles>,
    pub rss_bytes: u64,
    /// RSS of the phase's server before the phase grew anything.
    pub rss_baseline_bytes: u64,
    /// (RSS − baseline) ÷ reached.
    pub rss_per_unit_bytes: Option<f64>,
    pub listing: Option<Listing>,
    pub snapshot: Option<SnapshotMeasure>,
    pub restart: Option<Restart>,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// A full listing of the locks.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Listing {
    pub ms: f64,
    /// Locks (Palisade) or lock keys (etcd) listed.
    pub entries: usize,
    /// Of them, locks with a holder (Palisade); for etcd every key.
    pub held: usize,
}

/// One snapshot the loader brought on.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SnapshotMeasure {
    /// Size of the snapshot file (etcd: its backend database) after the step.
    pub bytes: u64,
    /// From the server starting to build it to the new file in place; `None` when no build was
    /// seen (etcd, whose snapshot is not timed here, or none within the bound).
    pub build_ms: Option<f64>,
    /// The probe during the loader's run: slowest cycle that overlapped the build, median of the
    /// cycles that did not, and the median of the step's quiet probe.
    pub during_max_us: Option<f64>,
    pub outside_p50_us: Option<f64>,
    pub quiet_p50_us: Option<f64>,
    /// during_max ÷ outside_p50: the goal is at most 10.
    pub stall_ratio: Option<f64>,
    pub loader_cycles: u64,
}

/// A restart: `SIGKILL`, a new process on the same data directory, and the time until it
/// answers a status read (Palisade) or a Range (etcd).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Restart {
    pub signal: &'static str,
    pub ms: f64,
    /// Until the new process accepted a TCP connection. Palisade binds its port before it
    /// recovers its state, so `ms − bound_ms` is the recovery (snapshot load, log replay,
    /// election).
    pub bound_ms: Option<f64>,
    pub rss_after_bytes: Option<u64>,
}

/// A goal of issue #12 and whether the run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub goal: &'static str,
    pub measured: String,
    /// `None` when the run did not measure it.
    pub met: Option<bool>,
}

/// Runs `palisade bench scale`: prints the markdown table, writes the JSON report if asked.
pub async fn run(
    args: &ScaleArgs,
    store_dir: Option<PathBuf>,
    json: bool,
    json_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let report = measure(args, store_dir).await?;
    if let Some(path) = json_file {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// Sorted, deduplicated steps at most `max`, each checked.
fn steps(list: &[usize], max: Option<usize>, flag: &str) -> anyhow::Result<Vec<usize>> {
    if list.len() > STEPS_MAX {
        bail!("--{flag} takes at most {STEPS_MAX} steps");
    }
    if let Some(&bad) = list.iter().find(|&&n| n == 0 || n > STEP_MAX) {
        bail!("--{flag}: {bad} is outside 1..={STEP_MAX}");
    }
    let mut steps: Vec<usize> = list
        .iter()
        .copied()
        .filter(|&n| max.is_none_or(|max| n <= max))
        .collect();
    steps.sort_unstable();
    steps.dedup();
    Ok(steps)
}

/// Checks the flags, then runs every phase on Palisade and, if asked, on etcd.
pub async fn measure(args: &ScaleArgs, store_dir: Option<PathBuf>) -> anyhow::Result<ScaleReport> {
    let sessions = steps(&args.sessions, args.max_sessions, "sessions")?;
    let locks = steps(&args.locks, args.max_locks, "locks")?;
    if args.time_limit.is_zero() || args.time_limit > TIME_LIMIT_MAX {
        bail!("--time-limit must be between 1ms and 24h");
    }
    if !(PROBE_CYCLES_MIN..=PROBE_CYCLES_MAX).contains(&args.probe_cycles) {
        bail!("--probe-cycles must be between {PROBE_CYCLES_MIN} and {PROBE_CYCLES_MAX}");
    }
    if !(1..=LOCK_SESSIONS_MAX).contains(&args.lock_sessions) {
        bail!("--lock-sessions must be between 1 and {LOCK_SESSIONS_MAX}");
    }
    if args.waiters > LONG_LIVED_MAX || args.watchers > LONG_LIVED_MAX {
        bail!("--waiters and --watchers must be at most {LONG_LIVED_MAX}");
    }
    let palisade_bin = match &args.palisade_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe().context(
            "cannot find this executable to start `palisade serve` from (pass --palisade-bin)",
        )?,
    };
    let mut programs = vec![Program::Palisade { bin: palisade_bin }];
    if let Some(bin) = &args.etcd_bin {
        programs.push(Program::Etcd { bin: bin.clone() });
    }
    let started = Instant::now();
    let run_deadline = started + args.time_limit;
    let mut report = ScaleReport {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        time_limit_s: args.time_limit.as_secs_f64(),
        elapsed_s: 0.0,
        steps: Vec::new(),
        goals: Vec::new(),
        notes: Vec::new(),
    };
    let plan: Vec<(Phase, Vec<usize>)> = [
        (Phase::Sessions, sessions),
        (Phase::Locks, locks),
        (Phase::Waiters, vec![args.waiters]),
        (Phase::Watchers, vec![args.watchers]),
    ]
    .into_iter()
    .filter(|(_, steps)| steps.iter().any(|&n| n > 0))
    .collect();
    let systems = programs.len();
    for (i, program) in programs.into_iter().enumerate() {
        // Each system gets an equal share of what is left; what one leaves passes on.
        let now = Instant::now();
        let system_deadline =
            now + run_deadline.saturating_duration_since(now) / (systems - i) as u32;
        let mut weights_left: u32 = plan.iter().map(|(p, _)| p.weight()).sum();
        for (phase, targets) in &plan {
            let now = Instant::now();
            let left = system_deadline.saturating_duration_since(now);
            let deadline = now + left.mul_f64(f64::from(phase.weight()) / f64::from(weights_left));
            weights_left -= phase.weight();
            let context = format!("{} {} phase", program.kind(), phase.name());
            eprintln!(
                "bench scale: {context} (until {:.0} s from the start)",
                (deadline - started).as_secs_f64()
            );
            let mut runner = PhaseRun::start(
                program.clone(),
                store_dir.as_deref(),
                args,
                *phase,
                deadline,
            )
            .await
            .context(context.clone())?;
            let outcome = runner.run(targets, &mut report).await;
            runner.stop().await;
            outcome.context(context)?;
        }
    }
    report.elapsed_s = started.elapsed().as_secs_f64();
    report.goals = goals(&report.steps);
    Ok(report)
}

/// A future that fills one unit of state.
type FillFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;
/// Makes the future that fills unit `i`.
type FillFn = Arc<dyn Fn(usize) -> FillFuture + Send + Sync>;

/// What a fill did.
#[derive(Debug, Default)]
struct Filled {
    done: usize,
    errors: u64,
    first_error: Option<String>,
    cut_by_time_limit: bool,
}

/// Runs `fill(i)` for `i` in `range`, `in_flight` at a time, until the range is done, the
/// deadline passes, or more than [`FILL_ERRORS_MAX`] fail.
async fn fill(
    range: std::ops::Range<usize>,
    in_flight: usize,
    deadline: Instant,
    fill: FillFn,
) -> Filled {
    let next = Arc::new(AtomicUsize::new(range.start));
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let timed_out = Arc::new(AtomicBool::new(false));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let workers: Vec<_> = (0..in_flight.max(1))
        .map(|_| {
            let (next, done, errors, timed_out, first_error, fill) = (
                next.clone(),
                done.clone(),
                errors.clone(),
                timed_out.clone(),
                first_error.clone(),
                fill.clone(),
            );
            let end = range.end;
            tokio::spawn(async move {
                loop {
                    if errors.load(Ordering::Relaxed) > FILL_ERRORS_MAX {
                        return;
                    }
                    if Instant::now() >= deadline {
                        timed_out.store(true, Ordering::Relaxed);
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return;
                    }
                    match fill(i).await {
                        Ok(()) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            first_error
                                .lock()
                                .expect("no panics while holding it")
                                .get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    let first_error = first_error
        .lock()
        .expect("no panics while holding it")
        .take();
    Filled {
        done: done.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        first_error,
        cut_by_time_limit: timed_out.load(Ordering::Relaxed),
    }
}

/// Opens `count` sessions (leases) over `conns`, pipelined, until the deadline; returns them
/// and how the fill went.
async fn open_sessions(conns: &Conns, count: usize, deadline: Instant) -> (Vec<Owner>, Filled) {
    let opened = Arc::new(std::sync::Mutex::new(Vec::with_capacity(count)));
    let (sink, conns) = (opened.clone(), conns.clone());
    let filled = fill(
        0..count,
        FILL_IN_FLIGHT,
        deadline,
        Arc::new(move |i| {
            let (conns, sink) = (conns.clone(), sink.clone());
            Box::pin(async move {
                let owner = conns.open(i).await?;
                sink.lock().expect("no panics while holding it").push(owner);
                Ok(())
            })
        }),
    )
    .await;
    let owners = std::mem::take(&mut *opened.lock().expect("no panics while holding it"));
    (owners, filled)
}

/// Connections to one system.
#[derive(Clone)]
enum Conns {
    Palisade(Vec<Client>),
    Etcd(Vec<Channel>),
}

/// A session (Palisade) or a lease (etcd).
#[derive(Debug, Clone, Copy)]
enum Owner {
    Palisade(SessionCredential),
    Etcd(i64),
}

impl Conns {
    async fn connect(server: &Server, count: usize) -> anyhow::Result<Conns> {
        let address = server.address();
        match server.kind() {
            "palisade" => {
                let mut clients = Vec::with_capacity(count);
                for _ in 0..count {
                    clients.push(palisade_client(&address.to_string()).await?);
                }
                Ok(Conns::Palisade(clients))
            }
            _ => {
                let mut channels = Vec::with_capacity(count);
                for _ in 0..count {
                    channels.push(etcd_channel(&address.to_string()).await?);
                }
                Ok(Conns::Etcd(channels))
            }
        }
    }

    /// Opens a session (lease) over connection `i` (modulo their number).
    async fn open(&self, i: usize) -> anyhow::Result<Owner> {
        match self {
            Conns::Palisade(clients) => {
                let lease = clients[i % clients.len()]
                    .open_session_without_keepalive(SESSION_TTL)
                    .await?;
                Ok(Owner::Palisade(lease.credential))
            }
            Conns::Etcd(channels) => {
                let granted = LeaseClient::new(channels[i % channels.len()].clone())
                    .lease_grant(LeaseGrantRequest {
                        ttl: SESSION_TTL.as_secs() as i64,
                        id: 0,
                    })
                    .await?
                    .into_inner();
                if !granted.error.is_empty() || granted.id == 0 {
                    bail!("etcd refused a lease: {:?}", granted.error);
                }
                Ok(Owner::Etcd(granted.id))
            }
        }
    }

    /// Takes `lock` for `owner` over connection `i`: try-only on Palisade (the fill's locks are
    /// free), etcd's Lock otherwise (which waits when the lock is held). Returns etcd's key.
    async fn acquire(
        &self,
        i: usize,
        owner: Owner,
        lock: &str,
        wait: Wait,
    ) -> anyhow::Result<Vec<u8>> {
        match (self, owner) {
            (Conns::Palisade(clients), Owner::Palisade(credential)) => {
                clients[i % clients.len()]
                    .acquire(credential, lock, AcquireOptions::wait(wait))
                    .await?;
                Ok(Vec::new())
            }
            (Conns::Etcd(channels), Owner::Etcd(lease)) => {
                let response = LockClient::new(channels[i % channels.len()].clone())
                    .lock(LockRequest {
                        name: lock.as_bytes().to_vec(),
                        lease,
                    })
                    .await?
                    .into_inner();
                Ok(response.key)
            }
            _ => Err(anyhow!("a session of one system used on another")),
        }
    }

    async fn release(
        &self,
        i: usize,
        owner: Owner,
        lock: &str,
        key: Vec<u8>,
    ) -> anyhow::Result<()> {
        match (self, owner) {
            (Conns::Palisade(clients), Owner::Palisade(credential)) => {
                clients[i % clients.len()].release(credential, lock).await?;
                Ok(())
            }
            (Conns::Etcd(channels), Owner::Etcd(_)) => {
                LockClient::new(channels[i % channels.len()].clone())
                    .unlock(UnlockRequest { key })
                    .await?;
                Ok(())
            }
            _ => Err(anyhow!("a session of one system used on another")),
        }
    }

    /// One acquire+release cycle of `lock`.
    async fn cycle(&self, i: usize, owner: Owner, lock: &str) -> anyhow::Result<()> {
        let key = self.acquire(i, owner, lock, Wait::Try).await?;
        self.release(i, owner, lock, key).await
    }
}

async fn palisade_client(address: &str) -> anyhow::Result<Client> {
    Client::connect_with(&format!("http://{address}"), ClientOptions::default())
        .await
        .with_context(|| format!("cannot connect to palisade at {address}"))
}

async fn etcd_channel(address: &str) -> anyhow::Result<Channel> {
    Endpoint::from_shared(format!("http://{address}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .with_context(|| format!("cannot connect to etcd at {address}"))
}

/// Lock names of the fill, waiters and watchers: one prefix, so one listing finds them all.
fn lock_name(i: usize) -> String {
    format!("scale/lock/{i:08}")
}
const PROBE_LOCK: &str = "scale/probe";
const QUEUE_LOCK: &str = "scale/queue";

/// One phase on one fresh server.
struct PhaseRun<'a> {
    args: &'a ScaleArgs,
    phase: Phase,
    deadline: Instant,
    server: Server,
    fill_conns: Conns,
    probe_conn: Conns,
    probe_owner: Owner,
    loaders: Vec<Owner>,
    /// Sessions (leases) that hold the locks of the locks phase.
    holders: Arc<Vec<Owner>>,
    rss_baseline_bytes: u64,
    /// Units in place so far.
    reached: usize,
    /// Long-lived calls (waits, watches) kept open for the phase.
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl<'a> PhaseRun<'a> {
    async fn start(
        program: Program,
        parent: Option<&std::path::Path>,
        args: &'a ScaleArgs,
        phase: Phase,
        deadline: Instant,
    ) -> anyhow::Result<PhaseRun<'a>> {
        let mut server = Server::start(program, parent)?;
        wait_until_answering(&mut server).await?;
        let fill_conns = Conns::connect(&server, FILL_CONNECTIONS).await?;
        let probe_conn = Conns::connect(&server, 1).await?;
        let probe_owner = probe_conn.open(0).await?;
        let mut loaders = Vec::with_capacity(LOADER_SESSIONS);
        for i in 0..LOADER_SESSIONS {
            loaders.push(fill_conns.open(i).await?);
        }
        let mut holders = Vec::new();
        if phase == Phase::Locks {
            let filled;
            (holders, filled) = open_sessions(&fill_conns, args.lock_sessions, deadline).await;
            if holders.is_empty() {
                bail!(
                    "no lock-holding session opened: {}",
                    filled.first_error.unwrap_or_default()
                );
            }
        }
        let rss_baseline_bytes = server.rss_bytes()?;
        Ok(PhaseRun {
            args,
            phase,
            deadline,
            server,
            fill_conns,
            probe_conn,
            probe_owner,
            loaders,
            holders: Arc::new(holders),
            rss_baseline_bytes,
            reached: 0,
            background: Vec::new(),
        })
    }

    async fn stop(mut self) {
        for task in self.background.drain(..) {
            task.abort();
        }
        let _ = self.server.kill();
    }

    /// The most this phase can reach on this server, and the limit that says so.
    fn cap(&self) -> Option<(usize, String)> {
        use palisade_core::limits::{LOCKS_MAX, SESSIONS_MAX, WAITERS_PER_LOCK_MAX};
        use palisade_server::limits::WATCHES_MAX;
        if self.server.kind() != "palisade" {
            return None;
        }
        Some(match self.phase {
            Phase::Sessions => (
                SESSIONS_MAX - SESSIONS_RESERVED,
                format!(
                    "SESSIONS_MAX {SESSIONS_MAX}, less {SESSIONS_RESERVED} for the probe and loader"
                ),
            ),
            Phase::Locks => (
                LOCKS_MAX - LOCKS_RESERVED,
                format!("LOCKS_MAX {LOCKS_MAX}, less {LOCKS_RESERVED} for the probe and loader"),
            ),
            Phase::Waiters => (
                WAITERS_PER_LOCK_MAX.min(SESSIONS_MAX - SESSIONS_RESERVED),
                format!("WAITERS_PER_LOCK_MAX {WAITERS_PER_LOCK_MAX}"),
            ),
            Phase::Watchers => (WATCHES_MAX, format!("WATCHES_MAX {WATCHES_MAX}")),
        })
    }

    async fn run(&mut self, targets: &[usize], report: &mut ScaleReport) -> anyhow::Result<()> {
        let system = self.server.kind();
        let last = targets.len().saturating_sub(1);
        for (index, &asked) in targets.iter().enumerate() {
            if Instant::now() >= self.deadline {
                report.notes.push(format!(
                    "{system}: the {} step to {asked} was not run: the time limit was reached",
                    self.phase.name()
                ));
                continue;
            }
            let (target, capped_by) = match self.cap() {
                Some((cap, why)) if asked > cap => (cap, Some(why)),
                _ => (asked, None),
            };
            if let Some(why) = &capped_by {
                report.notes.push(format!(
                    "{system}: the {} step asked for {asked}, the server allows {target} ({why})",
                    self.phase.name()
                ));
            }
            if target <= self.reached {
                continue;
            }
            eprintln!(
                "bench scale: {system}: growing {} to {target}",
                self.phase.name()
            );
            let fill_started = Instant::now();
            let filled = self.grow(target).await?;
            let fill_s = fill_started.elapsed().as_secs_f64();
            let added = filled.done;
            self.reached += added;
            self.server.check_running()?;
            if filled.cut_by_time_limit {
                report.notes.push(format!(
                    "{system}: the {} step to {target} stopped at the time limit with {}",
                    self.phase.name(),
                    self.reached
                ));
            }
            let snapshot_here = match self.args.snapshot {
                SnapshotSteps::Every => true,
                SnapshotSteps::Last => index == last || filled.cut_by_time_limit,
                SnapshotSteps::None => false,
            };
            let step = self
                .measure_step(target, capped_by, filled, fill_s, added, snapshot_here)
                .await?;
            eprint!("{}", describe(&step));
            let cut = step.cut_by_time_limit;
            report.steps.push(step);
            if cut {
                break;
            }
        }
        Ok(())
    }

    /// Grows the phase's state to `target` units.
    async fn grow(&mut self, target: usize) -> anyhow::Result<Filled> {
        let conns = self.fill_conns.clone();
        let range = self.reached..target;
        match self.phase {
            Phase::Sessions => Ok(fill(
                range,
                FILL_IN_FLIGHT,
                self.deadline,
                Arc::new(move |i| {
                    let conns = conns.clone();
                    Box::pin(async move { conns.open(i).await.map(drop) })
                }),
            )
            .await),
            Phase::Locks => {
                let holders = self.holders.clone();
                Ok(fill(
                    range,
                    FILL_IN_FLIGHT,
                    self.deadline,
                    Arc::new(move |i| {
                        let (conns, owner) = (conns.clone(), holders[i % holders.len()]);
                        Box::pin(async move {
                            conns
                                .acquire(i, owner, &lock_name(i), Wait::Try)
                                .await
                                .map(drop)
                        })
                    }),
                )
                .await)
            }
            Phase::Waiters => self.queue_waiters(target).await,
            Phase::Watchers => self.open_watchers(target).await,
        }
    }

    /// Queues `target` waiters on one held lock, each its own session, over as many
    /// connections as the per-connection limit on waiting calls needs.
    async fn queue_waiters(&mut self, target: usize) -> anyhow::Result<Filled> {
        let conns = self.fill_conns.clone();
        let holder = conns.open(0).await?;
        conns.acquire(0, holder, QUEUE_LOCK, Wait::Try).await?;
        let (waiters, mut filled) = open_sessions(&conns, target, self.deadline).await;
        let wait_conns = Conns::connect(
            &self.server,
            waiters.len().div_ceil(LONG_LIVED_PER_CONNECTION),
        )
        .await?;
        let errors = Arc::new(AtomicU64::new(0));
        let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
        for (i, owner) in waiters.iter().copied().enumerate() {
            let (conns, errors, first_error) =
                (wait_conns.clone(), errors.clone(), first_error.clone());
            // Each waits until the phase ends (its task is aborted then).
            self.background.push(tokio::spawn(async move {
                let connection = i / LONG_LIVED_PER_CONNECTION;
                if let Err(e) = conns
                    .acquire(connection, owner, QUEUE_LOCK, Wait::Forever)
                    .await
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                    first_error
                        .lock()
                        .expect("no panics while holding it")
                        .get_or_insert_with(|| format!("{e:#}"));
                }
            }));
        }
        // Queued: what the server says waits, until all do or the bound.
        let give_up = Instant::now() + QUEUE_WAIT_MAX;
        let mut queued;
        loop {
            queued = self.queued(&conns).await.unwrap_or(0);
            if queued >= waiters.len() || Instant::now() >= give_up.min(self.deadline) {
                break;
            }
            tokio::time::sleep(MONITOR_INTERVAL * 50).await;
        }
        if queued < waiters.len() {
            filled.cut_by_time_limit = Instant::now() >= self.deadline;
            let why = format!(
                "{queued} of {} waiters queued when the wait for them ended (after at most {} s, or at the time limit)",
                waiters.len(),
                QUEUE_WAIT_MAX.as_secs()
            );
            filled.first_error.get_or_insert(why);
        }
        filled.errors += errors.load(Ordering::Relaxed);
        if let Some(e) = first_error
            .lock()
            .expect("no panics while holding it")
            .take()
        {
            filled.first_error.get_or_insert(e);
        }
        filled.done = queued;
        Ok(filled)
    }

    /// Waiters queued on [`QUEUE_LOCK`], as the server reports them.
    async fn queued(&self, conns: &Conns) -> anyhow::Result<usize> {
        match conns {
            Conns::Palisade(clients) => Ok(clients[0].status(QUEUE_LOCK).await?.waiters.len()),
            Conns::Etcd(channels) => {
                let prefix = format!("{QUEUE_LOCK}/");
                let response = KvClient::new(channels[0].clone())
                    .range(RangeRequest {
                        range_end: prefix_end(prefix.as_bytes()),
                        key: prefix.into_bytes(),
                        count_only: true,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                // The holder's key is one of them.
                Ok(usize::try_from(response.count)
                    .unwrap_or(0)
                    .saturating_sub(1))
            }
        }
    }

    /// Opens `target` watchers, each on a lock of its own, as many per connection as the
    /// server allows.
    async fn open_watchers(&mut self, target: usize) -> anyhow::Result<Filled> {
        let conns =
            Conns::connect(&self.server, target.div_ceil(LONG_LIVED_PER_CONNECTION)).await?;
        let (opened_tx, mut opened_rx) = tokio::sync::mpsc::channel::<anyhow::Result<()>>(1024);
        for i in 0..target {
            let (conns, opened) = (conns.clone(), opened_tx.clone());
            let connection = i / LONG_LIVED_PER_CONNECTION;
            self.background.push(tokio::spawn(async move {
                let name = format!("scale/watch/{i:08}");
                match conns {
                    Conns::Palisade(clients) => match clients[connection].watch(&name).await {
                        Ok(mut events) => {
                            let _ = opened.send(Ok(())).await;
                            // Kept open, reading events, until the phase ends.
                            while let Some(Ok(_)) = events.next().await {}
                        }
                        Err(e) => {
                            let _ = opened.send(Err(e.into())).await;
                        }
                    },
                    Conns::Etcd(channels) => {
                        let request = WatchRequest {
                            request_union: Some(watch_request::RequestUnion::CreateRequest(
                                WatchCreateRequest {
                                    key: name.into_bytes(),
                                    range_end: Vec::new(),
                                },
                            )),
                        };
                        let requests = tokio_stream::StreamExt::chain(
                            tokio_stream::iter([request]),
                            tokio_stream::pending(),
                        );
                        match WatchClient::new(channels[connection].clone())
                            .watch(requests)
                            .await
                        {
                            Ok(response) => {
                                let mut stream = response.into_inner();
                                let mut announced = false;
                                while let Ok(Some(message)) = stream.message().await {
                                    if message.created && !announced {
                                        announced = true;
                                        let _ = opened.send(Ok(())).await;
                                    }
                                }
                            }
                            Err(e) => {
                                let _ = opened.send(Err(e.into())).await;
                            }
                        }
                    }
                }
            }));
        }
        drop(opened_tx);
        let mut filled = Filled::default();
        let give_up = (Instant::now() + QUEUE_WAIT_MAX).min(self.deadline);
        while filled.done + (filled.errors as usize) < target {
            match tokio::time::timeout_at(give_up, opened_rx.recv()).await {
                Ok(Some(Ok(()))) => filled.done += 1,
                Ok(Some(Err(e))) => {
                    filled.errors += 1;
                    filled.first_error.get_or_insert_with(|| format!("{e:#}"));
                }
                Ok(None) => break,
                Err(_) => {
                    filled.cut_by_time_limit = Instant::now() >= self.deadline;
                    filled.first_error.get_or_insert_with(|| {
                        format!(
                            "{} of {target} watches open when the wait for them ended",
                            filled.done
                        )
                    });
                    break;
                }
            }
        }
        Ok(filled)
    }

    #[allow(clippy::too_many_arguments)]
    async fn measure_step(
        &mut self,
        target: usize,
        capped_by: Option<String>,
        filled: Filled,
        fill_s: f64,
        added: usize,
        snapshot_here: bool,
    ) -> anyhow::Result<StepReport> {
        let rss_bytes = self.server.rss_bytes()?;
        let probe = self.probe().await?;
        let listing = Some(self.listing().await?);
        let snapshot = if snapshot_here {
            Some(self.snapshot(probe.p50_us).await?)
        } else {
            None
        };
        let restart = Some(self.restart().await?);
        let per_unit = (self.reached > 0)
            .then(|| (rss_bytes as f64 - self.rss_baseline_bytes as f64) / self.reached as f64);
        Ok(StepReport {
            system: self.server.kind(),
            phase: self.phase,
            target,
            reached: self.reached,
            capped_by,
            cut_by_time_limit: filled.cut_by_time_limit,
            fill_s,
            fill_per_s: if fill_s > 0.0 {
                added as f64 / fill_s
            } else {
                0.0
            },
            probe: Some(probe),
            rss_bytes,
            rss_baseline_bytes: self.rss_baseline_bytes,
            rss_per_unit_bytes: per_unit,
            listing,
            snapshot,
            restart,
            errors: filled.errors,
            first_error: filled.first_error,
        })
    }

    /// Acquire+release cycles of the probe client on its own lock.
    async fn probe(&self) -> anyhow::Result<Percentiles> {
        let mut latencies = Latencies::default();
        for _ in 0..self.args.probe_cycles {
            let started = Instant::now();
            self.probe_conn
                .cycle(0, self.probe_owner, PROBE_LOCK)
                .await
                .context("the probe's acquire+release")?;
            latencies.record(started.elapsed());
        }
        Ok(latencies.percentiles())
    }

    /// Lists every lock (etcd: every key under the benchmark's prefix) on a new connection.
    async fn listing(&self) -> anyhow::Result<Listing> {
        let address = self.server.address().to_string();
        match self.server.kind() {
            "palisade" => {
                let client = palisade_client(&address).await?;
                let started = Instant::now();
                let locks = client.list_locks("").await.context("the full listing")?;
                let ms = started.elapsed().as_secs_f64() * 1e3;
                Ok(Listing {
                    ms,
                    entries: locks.len(),
                    held: locks.iter().filter(|l| l.holder.is_some()).count(),
                })
            }
            _ => {
                let mut kv = KvClient::new(etcd_channel(&address).await?);
                let prefix = b"scale/".to_vec();
                let end = prefix_end(&prefix);
                let mut key = prefix;
                let mut entries = 0usize;
                let started = Instant::now();
                loop {
                    let page = kv
                        .range(RangeRequest {
                            key: key.clone(),
                            range_end: end.clone(),
                            limit: ETCD_PAGE_KEYS,
                            keys_only: true,
                            ..Default::default()
                        })
                        .await
                        .context("the full listing")?
                        .into_inner();
                    entries += page.kvs.len();
                    match page.kvs.last() {
                        Some(last) if page.more => {
                            key = last.key.clone();
                            key.push(0);
                        }
                        _ => break,
                    }
                }
                Ok(Listing {
                    ms: started.elapsed().as_secs_f64() * 1e3,
                    entries,
                    held: entries,
                })
            }
        }
    }

    /// Drives the log with loader cycles until the server builds a snapshot, while the probe
    /// cycles on; times the build and the probe's cycles during it.
    async fn snapshot(&mut self, quiet_p50_us: f64) -> anyhow::Result<SnapshotMeasure> {
        if self.server.kind() != "palisade" {
            return Ok(SnapshotMeasure {
                bytes: self.server.snapshot_file().map_or(0, |(bytes, _)| bytes),
                build_ms: None,
                during_max_us: None,
                outside_p50_us: None,
                quiet_p50_us: Some(quiet_p50_us),
                stall_ratio: None,
                loader_cycles: 0,
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        let loaders: Vec<_> = self
            .loaders
            .iter()
            .copied()
            .enumerate()
            .map(|(k, owner)| {
                let (conns, stop, cycles) = (self.fill_conns.clone(), stop.clone(), cycles.clone());
                tokio::spawn(async move {
                    let lock = format!("scale/load/{k}");
                    while !stop.load(Ordering::Relaxed)
                        && cycles.load(Ordering::Relaxed) < LOADER_CYCLES_MAX
                    {
                        if conns.cycle(k, owner, &lock).await.is_err() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let probe = {
            let (conns, owner, stop) = (self.probe_conn.clone(), self.probe_owner, stop.clone());
            tokio::spawn(async move {
                let mut samples: Vec<(Instant, Instant)> = Vec::new();
                while !stop.load(Ordering::Relaxed) && samples.len() < 1_000_000 {
                    let started = Instant::now();
                    if conns.cycle(0, owner, PROBE_LOCK).await.is_ok() {
                        samples.push((started, Instant::now()));
                    }
                }
                samples
            })
        };
        let mut tail = LogTail::at_end(self.server.log_path());
        let file_before = self.server.snapshot_file();
        let give_up = Instant::now() + SNAPSHOT_WAIT_MAX;
        let mut build_started: Option<Instant> = None;
        let mut built: Option<Instant> = None;
        while Instant::now() < give_up {
            tokio::time::sleep(MONITOR_INTERVAL).await;
            if build_started.is_none() && tail.new_matches(SNAPSHOT_BUILD_LINE) > 0 {
                build_started = Some(Instant::now());
            }
            if build_started.is_some() && self.server.snapshot_file() != file_before {
                built = Some(Instant::now());
                break;
            }
            if cycles.load(Ordering::Relaxed) >= LOADER_CYCLES_MAX && build_started.is_none() {
                break;
            }
        }
        // A little of the probe after the build, then everything stops.
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.store(true, Ordering::Relaxed);
        for loader in loaders {
            let _ = loader.await;
        }
        let samples = probe.await.context("the probe task")?;
        let bytes = self.server.snapshot_file().map_or(0, |(bytes, _)| bytes);
        let mut measure = SnapshotMeasure {
            bytes,
            build_ms: None,
            during_max_us: None,
            outside_p50_us: None,
            quiet_p50_us: Some(quiet_p50_us),
            stall_ratio: None,
            loader_cycles: cycles.load(Ordering::Relaxed),
        };
        if let (Some(from), Some(to)) = (build_started, built) {
            measure.build_ms = Some((to - from).as_secs_f64() * 1e3);
            let us = |(a, b): (Instant, Instant)| (b - a).as_secs_f64() * 1e6;
            let (during, outside): (Vec<_>, Vec<_>) =
                samples.into_iter().partition(|&(a, b)| a < to && b > from);
            measure.during_max_us = during.into_iter().map(us).reduce(f64::max);
            let mut outside: Vec<f64> = outside.into_iter().map(us).collect();
            outside.sort_by(f64::total_cmp);
            measure.outside_p50_us = outside.get(outside.len() / 2).copied();
            if let (Some(max), Some(p50)) = (measure.during_max_us, measure.outside_p50_us) {
                measure.stall_ratio = Some(max / p50);
            }
        }
        Ok(measure)
    }

    /// `SIGKILL`, a new process on the same directory, and the time until it answers.
    async fn restart(&mut self) -> anyhow::Result<Restart> {
        self.server.kill_and_respawn()?;
        let started = Instant::now();
        let mut bound_ms = None;
        while started.elapsed() < RESTART_WAIT_MAX {
            if tokio::net::TcpStream::connect(self.server.address())
                .await
                .is_ok()
            {
                bound_ms = Some(started.elapsed().as_secs_f64() * 1e3);
                break;
            }
            self.server.check_running()?;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        wait_until_answering(&mut self.server).await?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(Restart {
            signal: "SIGKILL",
            ms,
            bound_ms,
            rss_after_bytes: self.server.rss_bytes().ok(),
        })
    }
}

/// Polls a freshly started server until it answers a status read (Palisade: of the probe's
/// lock; etcd: a Range), within [`RESTART_WAIT_MAX`].
async fn wait_until_answering(server: &mut Server) -> anyhow::Result<()> {
    let give_up = Instant::now() + RESTART_WAIT_MAX;
    let address = server.address().to_string();
    loop {
        server.check_running()?;
        let answered = match server.kind() {
            "palisade" => {
                match Client::connect_with(&format!("http://{address}"), ClientOptions::default())
                    .await
                {
                    Ok(client) => client.status(PROBE_LOCK).await.is_ok(),
                    Err(_) => false,
                }
            }
            _ => match etcd_channel(&address).await {
                Ok(channel) => KvClient::new(channel)
                    .range(RangeRequest {
                        key: PROBE_LOCK.as_bytes().to_vec(),
                        ..Default::default()
                    })
                    .await
                    .is_ok(),
                Err(_) => false,
            },
        };
        if answered {
            return Ok(());
        }
        if Instant::now() >= give_up {
            bail!(
                "the {} server did not answer within {:?} of its start",
                server.kind(),
                RESTART_WAIT_MAX
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The end of etcd's range for a prefix: the prefix with its last byte incremented.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Held locks at which the goals "at 1M held locks" are judged: 1M less what the server's cap
/// and the benchmark's reserve leave out. A smaller run shows its numbers, unjudged.
const GOAL_LOCKS_MIN: usize = 990_000;

/// The goals, checked against the Palisade steps.
fn goals(steps: &[StepReport]) -> Vec<Goal> {
    let locks: Vec<&StepReport> = steps
        .iter()
        .filter(|s| s.system == "palisade" && s.phase == Phase::Locks)
        .collect();
    let smallest = locks.iter().min_by_key(|s| s.reached);
    let largest = locks.iter().max_by_key(|s| s.reached);
    let judged = largest.is_some_and(|s| s.reached >= GOAL_LOCKS_MIN);
    let at = |s: &StepReport| {
        if s.reached >= GOAL_LOCKS_MIN {
            format!("{} locks", s.reached)
        } else {
            format!("{} locks, not judged below {GOAL_LOCKS_MIN}", s.reached)
        }
    };
    let mut goals = Vec::new();
    let latency = match (smallest, largest) {
        (Some(small), Some(large)) if small.reached < large.reached => {
            let (a, b) = (
                small.probe.map_or(f64::NAN, |p| p.p50_us),
                large.probe.map_or(f64::NAN, |p| p.p50_us),
            );
            let ratio = b / a;
            Goal {
                goal: "acquire+release p50 at 1M held locks ≤ 1.2 × at 10k",
                measured: format!(
                    "{} at {} vs {} at {}: {ratio:.2}×",
                    format_us(b),
                    at(large),
                    format_us(a),
                    at(small)
                ),
                met: (judged && ratio.is_finite()).then_some(ratio <= 1.2),
            }
        }
        _ => Goal {
            goal: "acquire+release p50 at 1M held locks ≤ 1.2 × at 10k",
            measured: "fewer than two lock steps".into(),
            met: None,
        },
    };
    goals.push(latency);
    goals.push(match largest.and_then(|s| Some((s, s.restart?))) {
        Some((s, restart)) => Goal {
            goal: "restart with 1M held locks ≤ 3 s",
            measured: format!(
                "{} at {} ({})",
                format_us(restart.ms * 1e3),
                at(s),
                restart.signal
            ),
            met: judged.then_some(restart.ms <= 3_000.0),
        },
        None => Goal {
            goal: "restart with 1M held locks ≤ 3 s",
            measured: "not measured".into(),
            met: None,
        },
    });
    goals.push(
        match largest.and_then(|s| Some((s, s.rss_per_unit_bytes?))) {
            Some((s, per_lock)) => Goal {
                goal: "≤ 300 bytes of RSS per held lock",
                measured: format!("{per_lock:.0} bytes at {}", at(s)),
                met: judged.then_some(per_lock <= 300.0),
            },
            None => Goal {
                goal: "≤ 300 bytes of RSS per held lock",
                measured: "not measured".into(),
                met: None,
            },
        },
    );
    let stalls: Vec<(&StepReport, f64)> = steps
        .iter()
        .filter(|s| s.system == "palisade")
        .filter_map(|s| Some((s, s.snapshot?.stall_ratio?)))
        .collect();
    goals.push(match stalls.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
        Some((s, ratio)) => Goal {
            goal: "no request slower than 10 × p50 while a snapshot is taken",
            measured: format!(
                "worst {ratio:.1}× (at {} {}), over {} snapshots",
                s.reached,
                s.phase.name(),
                stalls.len()
            ),
            met: Some(*ratio <= 10.0),
        },
        None => Goal {
            goal: "no request slower than 10 × p50 while a snapshot is taken",
            measured: "no snapshot timed".into(),
            met: None,
        },
    });
    goals
}

/// `1.2 MB`, `640 B`.
fn format_bytes(bytes: f64) -> String {
    if bytes.abs() >= 1e9 {
        format!("{:.2} GB", bytes / 1e9)
    } else if bytes.abs() >= 1e6 {
        format!("{:.1} MB", bytes / 1e6)
    } else if bytes.abs() >= 1e3 {
        format!("{:.1} kB", bytes / 1e3)
    } else {
        format!("{bytes:.0} B")
    }
}

/// One line of progress on stderr.
fn describe(s: &StepReport) -> String {
    format!(
        "bench scale: {} {} {} (asked {}): probe p50 {}, RSS {}, listing {} ms, restart {}\n",
        s.system,
        s.reached,
        s.phase.name(),
        s.target,
        s.probe.map_or("—".into(), |p| format_us(p.p50_us)),
        format_bytes(s.rss_bytes as f64),
        s.listing.map_or("—".into(), |l| format!("{:.0}", l.ms)),
        s.restart.map_or("—".into(), |r| format_us(r.ms * 1e3)),
    )
}

/// The report as markdown: the steps, the goals, the notes.
pub fn markdown(report: &ScaleReport) -> String {
    let mut out = String::from(
        "| system | step | acq+rel p50 | p99 | RSS | RSS per unit over baseline | full listing | snapshot size | snapshot build | slowest cycle during it ÷ p50 | restart (SIGKILL) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let dash = || "—".to_string();
    for s in &report.steps {
        let mut step = format!("{} {}", s.reached, s.phase.name());
        if s.capped_by.is_some() {
            step.push_str(" (capped)");
        }
        if s.cut_by_time_limit {
            step.push_str(" (time limit)");
        }
        if s.errors > 0 {
            let _ = write!(step, " ({} errors)", s.errors);
        }
        let snapshot = s.snapshot;
        let _ = writeln!(
            out,
            "| {} | {step} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.system,
            s.probe.map_or_else(dash, |p| format_us(p.p50_us)),
            s.probe.map_or_else(dash, |p| format_us(p.p99_us)),
            format_bytes(s.rss_bytes as f64),
            s.rss_per_unit_bytes.map_or_else(dash, |b| format!(
                "{} per {}",
                format_bytes(b),
                s.phase.unit()
            )),
            s.listing.map_or_else(dash, |l| format!(
                "{} in {}",
                l.entries,
                format_us(l.ms * 1e3)
            )),
            snapshot.map_or_else(dash, |m| format_bytes(m.bytes as f64)),
            snapshot
                .and_then(|m| m.build_ms)
                .map_or_else(dash, |ms| format_us(ms * 1e3)),
            snapshot.and_then(|m| m.stall_ratio).map_or_else(dash, |r| {
                format!(
                    "{r:.1}× ({} ÷ {})",
                    format_us(snapshot.and_then(|m| m.during_max_us).unwrap_or(0.0)),
                    format_us(snapshot.and_then(|m| m.outside_p50_us).unwrap_or(0.0))
                )
            }),
            s.restart.map_or_else(dash, |r| format_us(r.ms * 1e3)),
        );
    }
    out.push_str("\n| goal (issue #12) | measured | met |\n|---|---|---|\n");
    for g in &report.goals {
        let met = match g.met {
            Some(true) => "met",
            Some(false) => "not met",
            None => "not measured",
        };
        let _ = writeln!(out, "| {} | {} | {met} |", g.goal, g.measured);
    }
    if !report.notes.is_empty() {
        out.push('\n');
        for note in &report.notes {
            let _ = writeln!(out, "- {note}");
        }
    }
    for s in report.steps.iter().filter(|s| s.first_error.is_some()) {
        let _ = writeln!(
            out,
            "- {} {} step: {} errors, first: {}",
            s.system,
            s.phase.name(),
            s.errors,
            s.first_error.as_deref().unwrap_or("")
        );
    }
    let _ = writeln!(
        out,
        "\n{} CPUs; {:.0} s of a {:.0} s time limit. The probe's median for the snapshot column is \
         of its own cycles outside the build while the loader ran.",
        report.cpus, report.elapsed_s, report.time_limit_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_sorted_deduplicated_bounded_and_checked() {
        assert_eq!(
            steps(&[100, 10, 100, 1000], Some(500), "locks").unwrap(),
            vec![10, 100]
        );
        assert!(steps(&[0], None, "locks").is_err());
        assert!(steps(&[STEP_MAX + 1], None, "locks").is_err());
        assert!(steps(&vec![1; STEPS_MAX + 1], None, "locks").is_err());
    }

    #[test]
    fn a_prefix_range_ends_at_the_next_prefix() {
        assert_eq!(prefix_end(b"scale/"), b"scale0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
    }
}
