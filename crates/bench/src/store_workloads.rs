//! The store workloads: what the fence costs a resource, for writes, reads and transactions.
//!
//! Each client holds its own lock on the lock service (so its sequencer is real, signed and
//! current) and works on keys of its own, bound to that lock. Every workload runs against a
//! [`Store`] opened in this process (the ratios are then the store alone) and, with `--store`,
//! also over HTTP against a running `palisade store serve`. Rounds of the paths of a workload
//! alternate, so drift of the machine (page cache, other load) hits them alike, and each
//! workload measures the fenced write of `fenced-write` again in the same run, as its yardstick.
//!
//! - `fenced-write`: the same clients write their key with the sequencer ([`Store::put`]) and
//!   through the store's unchecked path ([`Store::put_unfenced`]: the same writer thread, group
//!   commit, transaction, row shape and fsync, minus the sequencer verification, the
//!   check-and-advance, the key binding and the store revision). The ratio is what fencing costs.
//! - `fenced-read`: reads that present a sequencer, in two kinds. A holder re-reading with the
//!   grant the store has already accepted (`fenced-read`): it goes through the writer, which
//!   checks it and, with nothing to advance, commits nothing. A read by a grant the store has not
//!   seen yet (`advancing-read`): the lock's accepted token advances, durably (one fence row and
//!   one fsync per group), before the value comes back — the first read of every new holder.
//!   Every advancing read needs a grant of its own, so each client takes a pool of grants of a
//!   second lock before the clock starts (acquire, keep the sequencer, release, again); its
//!   measurement ends when the first client has used up its pool, or the window closes. Its
//!   yardstick is the same for writes (`advancing-write`: the first write of each new grant,
//!   which pays the same signature check and fence-row write), with the other half of the pool.
//! - `txn`: a transaction of one revision compare and one put under one sequencer check
//!   ([`Store::txn`], `POST /v1/txn`); each client is its key's only writer, so every compare
//!   holds and a failed one is reported as an error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use palisade_client::{AcquireOptions, Client, LockGuard, Session, SessionOptions, Wait};
use palisade_store::{BatchOp, BatchRequest, Compare, Store, StoreClient};
use tokio::time::Instant;

use crate::bench::{
    BenchArgs, DRAIN_MAX, Measurement, SESSION_TTL, WRITE_VALUE_BYTES, Window, WorkerStats,
    Workload, join_workers,
};
use crate::target::Target;

/// Alternating rounds of the paths of a workload; each gets `duration / ROUNDS`.
const ROUNDS: u32 = 2;
/// Grants each client takes for `advancing-read`, per second of `--duration`...
const ADVANCING_GRANTS_PER_CLIENT_PER_S: f64 = 200.0;
/// ...and at least this many, at most that many.
const ADVANCING_GRANTS_PER_CLIENT_MIN: usize = 16;
const ADVANCING_GRANTS_PER_CLIENT_MAX: usize = 4_000;
/// Longest the setup may take: sessions, locks, the grant pool and the first writes.
const SETUP_MAX: Duration = Duration::from_secs(300);
/// Most operations one client makes in one window, however long the window.
const OPERATIONS_PER_CLIENT_MAX: u64 = 10_000_000;

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// [`Store::put_unfenced`]: the write path without the fence (in-process only).
    UnfencedPut,
    /// A put with the holder's sequencer.
    Put,
    /// A read with the holder's sequencer, already the lock's accepted grant.
    Read,
    /// A read with a grant the store has not seen: the accepted token advances.
    AdvancingRead,
    /// A put with a grant the store has not seen: the accepted token advances.
    AdvancingPut,
    /// A revision compare and a put under one sequencer check.
    Txn,
}

/// How one operation is made: which operation, and in this process or over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Path {
    op: Op,
    http: bool,
}

impl Path {
    const fn new(op: Op, http: bool) -> Path {
        Path { op, http }
    }

    /// The measurement's `variant`.
    fn variant(self, workload: Workload) -> &'static str {
        match (workload, self.op, self.http) {
            (_, Op::UnfencedPut, _) => "unfenced",
            (Workload::FencedWrite, Op::Put, false) => "fenced",
            (Workload::FencedWrite, Op::Put, true) => "fenced-http",
            (_, Op::Put, false) => "fenced-write",
            (_, Op::Put, true) => "fenced-write-http",
            (_, Op::Read, false) => "fenced-read",
            (_, Op::Read, true) => "fenced-read-http",
            (_, Op::AdvancingRead, false) => "advancing-read",
            (_, Op::AdvancingRead, true) => "advancing-read-http",
            (_, Op::AdvancingPut, false) => "advancing-write",
            (_, Op::AdvancingPut, true) => "advancing-write-http",
            (_, Op::Txn, false) => "txn",
            (_, Op::Txn, true) => "txn-http",
        }
    }

    /// The measurement's `operation`.
    fn operation(self) -> &'static str {
        match self.op {
            Op::UnfencedPut | Op::Put | Op::AdvancingPut => "durable write",
            Op::Read => "fenced read",
            Op::AdvancingRead => "advancing read",
            Op::Txn => "transaction",
        }
    }
}

/// The paths `workload` alternates in rounds, and those it runs once each, after the rounds,
/// until a client's pool of grants is used up.
fn paths_of(workload: Workload, http: bool) -> (Vec<Path>, Vec<Path>) {
    let (rounds, once): (&[Op], &[Op]) = match workload {
        Workload::FencedWrite => (&[Op::UnfencedPut, Op::Put], &[]),
        Workload::FencedRead => (&[Op::Put, Op::Read], &[Op::AdvancingRead, Op::AdvancingPut]),
        Workload::Txn => (&[Op::Put, Op::Txn], &[]),
        other => unreachable!("{other:?} is not a store workload"),
    };
    // In this process first, then over HTTP: on each store the put comes before the read of
    // what it wrote. The unchecked path exists in this process only.
    let paths = |ops: &[Op]| -> Vec<Path> {
        let local = ops.iter().map(|op| Path::new(*op, false));
        let remote = ops
            .iter()
            .filter(|op| http && **op != Op::UnfencedPut)
            .map(|op| Path::new(*op, true));
        local.chain(remote).collect()
    };
    (paths(rounds), paths(once))
}

/// One client's keys and grants.
#[derive(Debug)]
struct Holder {
    /// The key `Put` writes and `Read` reads.
    key: String,
    /// The key `Txn` writes.
    txn_key: String,
    /// The key `AdvancingRead` reads and `AdvancingPut` writes (bound to the pool's lock).
    advancing_key: String,
    /// The sequencer of the lock this client holds throughout.
    sequencer: String,
    /// Sequencers of successive grants of a second lock, tokens increasing; the first one
    /// wrote `advancing_key`, then each is used once: the first half by `AdvancingRead`, the
    /// second by `AdvancingPut`, so on each store the writes come after the reads.
    pool: Vec<String>,
}

/// Where one path stands for each client, across rounds.
#[derive(Debug, Default)]
struct Cursor {
    /// The revision the client's transaction key is at (0: no value yet).
    revision: AtomicU64,
    /// The next grant of the pool to use...
    next_grant: AtomicUsize,
    /// ...and the end of this path's part of the pool.
    grants_end: usize,
}

/// What the workers of one run share.
#[derive(Debug)]
struct Shared {
    store: Arc<Store>,
    http: Option<StoreClient>,
    holders: Vec<Holder>,
    value: Vec<u8>,
}

/// Runs the store workload `workload` (`fenced-write`, `fenced-read` or `txn`) with `clients`
/// clients; sequencers come from `lock_service`.
pub(crate) async fn store_workload(
    workload: Workload,
    lock_service: &Target,
    store_address: Option<&str>,
    clients: usize,
    args: &BenchArgs,
) -> anyhow::Result<Vec<Measurement>> {
    let client = Client::connect(&format!("http://{}", lock_service.address()))
        .await
        .with_context(|| format!("cannot connect to {lock_service}"))?;
    let public_key = client.public_key().await?;
    let public_key = palisade_sequencer::PublicKey::parse(&public_key)
        .map_err(|e| anyhow!("the lock service's public key does not parse: {e}"))?;

    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let name = workload.name();
    let (rounds, once) = paths_of(workload, store_address.is_some());
    let pool_size = if once.is_empty() {
        0
    } else {
        pool_size(args.duration)
    };

    let setup = async {
        let mut held: Vec<(Session, LockGuard)> = Vec::with_capacity(clients);
        for i in 0..clients {
            let session = client
                .open_session(SessionOptions::with_ttl(SESSION_TTL))
                .await?;
            let guard = session
                .acquire(
                    &format!("bench/{run_id}/{name}/{i}"),
                    AcquireOptions::wait(Wait::Try),
                )
                .await?;
            held.push((session, guard));
        }
        let pools = grant_pools(&client, run_id, name, clients, pool_size).await?;
        anyhow::Ok((held, pools))
    };
    let (held, pools) = tokio::time::timeout(SETUP_MAX, setup)
        .await
        .map_err(|_| anyhow!("taking locks and grants took over {SETUP_MAX:?}"))??;
    let holders = held
        .iter()
        .zip(pools)
        .enumerate()
        .map(|(i, ((_, guard), pool))| Holder {
            key: format!("bench/{run_id}/{i}"),
            txn_key: format!("bench/{run_id}/{i}/txn"),
            advancing_key: format!("bench/{run_id}/{i}/advancing"),
            sequencer: guard.sequencer().to_owned(),
            pool,
        })
        .collect();

    let dir = match &args.store_dir {
        Some(parent) => tempfile::Builder::new()
            .prefix("palisade-bench-store-")
            .tempdir_in(parent),
        None => tempfile::Builder::new()
            .prefix("palisade-bench-store-")
            .tempdir(),
    }
    .context("cannot create a directory for the benchmark store")?;
    let store = Arc::new(Store::open(dir.path(), public_key)?);
    let http = store_address
        .map(|address| StoreClient::new(&format!("http://{address}")))
        .transpose()?;
    let shared = Arc::new(Shared {
        store,
        http,
        holders,
        value: vec![b'x'; WRITE_VALUE_BYTES],
    });
    if pool_size > 0 {
        tokio::time::timeout(SETUP_MAX, write_advancing_keys(&shared))
            .await
            .map_err(|_| anyhow!("the first writes took over {SETUP_MAX:?}"))??;
    }

    let mut results: Vec<(Path, WorkerStats, Duration)> = Vec::new();
    let cursors: Vec<Arc<Vec<Cursor>>> = rounds
        .iter()
        .map(|_| Arc::new((0..clients).map(|_| Cursor::default()).collect()))
        .collect();
    let round = args.duration / ROUNDS;
    let mut totals: Vec<WorkerStats> = rounds.iter().map(|_| WorkerStats::default()).collect();
    for round_index in 0..ROUNDS {
        for ((path, total), cursors) in rounds.iter().zip(totals.iter_mut()).zip(&cursors) {
            // Warm up before the first round of each path only.
            let warmup = if round_index == 0 {
                args.warmup
            } else {
                Duration::ZERO
            };
            let window = Window::after_warmup(warmup, round);
            let handles = (0..clients)
                .map(|index| {
                    let worker = Worker {
                        path: *path,
                        shared: shared.clone(),
                        cursors: cursors.clone(),
                        index,
                    };
                    tokio::spawn(async move { worker.run(window).await.stats })
                })
                .collect();
            total.merge(join_workers(handles, window).await);
        }
    }
    for (path, stats) in rounds.iter().zip(totals) {
        results.push((*path, stats, args.duration));
    }
    for path in &once {
        let (stats, measured) = run_until_a_pool_is_empty(*path, &shared, clients, args).await;
        results.push((*path, stats, measured));
    }

    for (session, guard) in held {
        let _ = guard.release().await;
        let _ = session.close().await;
    }
    let store_target = |path: Path| match (path.http, store_address) {
        (true, Some(address)) => format!("http://{address}"),
        _ => format!("store in {}", dir.path().display()),
    };
    let measurements = results
        .into_iter()
        .map(|(path, stats, measured)| {
            let operations = stats.whole.count();
            let seconds = measured.as_secs_f64();
            Measurement {
                workload,
                variant: Some(path.variant(workload)),
                target: store_target(path),
                target_kind: "palisade",
                clients,
                locks: clients,
                operation: path.operation(),
                duration_s: seconds,
                operations,
                operations_per_s: if seconds > 0.0 {
                    operations as f64 / seconds
                } else {
                    0.0
                },
                errors: stats.errors,
                first_error: stats.first_error,
                latency: stats.whole.percentiles(),
                acquire: None,
                release: None,
                server: None,
                server_cpu: None,
            }
        })
        .collect();
    drop(shared);
    Ok(measurements)
}

/// Grants per client for `advancing-read` over a window of `duration`.
fn pool_size(duration: Duration) -> usize {
    let wanted = (duration.as_secs_f64() * ADVANCING_GRANTS_PER_CLIENT_PER_S).ceil();
    (wanted as usize).clamp(
        ADVANCING_GRANTS_PER_CLIENT_MIN,
        ADVANCING_GRANTS_PER_CLIENT_MAX,
    )
}

/// For each client, `size + 1` successive grants of a lock of its own (none if `size` is 0):
/// acquire, keep the sequencer, release. The clients take theirs concurrently.
async fn grant_pools(
    client: &Client,
    run_id: u128,
    name: &str,
    clients: usize,
    size: usize,
) -> anyhow::Result<Vec<Vec<String>>> {
    if size == 0 {
        return Ok((0..clients).map(|_| Vec::new()).collect());
    }
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let client = client.clone();
            let lock = format!("bench/{run_id}/{name}/{i}/pool");
            tokio::spawn(async move {
                let session = client
                    .open_session(SessionOptions::with_ttl(SESSION_TTL))
                    .await?;
                let mut pool = Vec::with_capacity(size + 1);
                for _ in 0..=size {
                    let guard = session
                        .acquire(&lock, AcquireOptions::wait(Wait::Try))
                        .await
                        .with_context(|| format!("acquire {lock} for the grant pool"))?;
                    pool.push(guard.sequencer().to_owned());
                    guard.release().await?;
                }
                let _ = session.close().await;
                anyhow::Ok(pool)
            })
        })
        .collect();
    let mut pools = Vec::with_capacity(clients);
    for task in tasks {
        pools.push(task.await.context("a grant-pool task failed")??);
    }
    Ok(pools)
}

/// Writes each client's `advancing_key` with the first grant of its pool, in this process and
/// over HTTP, so the advancing reads find the value a previous holder left.
async fn write_advancing_keys(shared: &Arc<Shared>) -> anyhow::Result<()> {
    for holder in &shared.holders {
        let first = holder
            .pool
            .first()
            .ok_or_else(|| anyhow!("an empty grant pool"))?;
        shared
            .store
            .txn_async(
                Some(first),
                &put_request(&holder.advancing_key, &shared.value),
                None,
            )
            .await
            .context("the first write of an advancing-read key")?;
        if let Some(http) = &shared.http {
            http.put(&holder.advancing_key, &shared.value, Some(first), None)
                .await
                .context("the first write of an advancing-read key over HTTP")?;
        }
    }
    Ok(())
}

fn put_request(key: &str, value: &[u8]) -> BatchRequest {
    BatchRequest {
        compare: Vec::new(),
        ops: vec![BatchOp::Put {
            key: key.to_owned(),
            value: value.to_vec(),
        }],
    }
}

/// Runs `path` (an advancing read or write) on every client from one start until the first client has
/// used up its pool of grants, or the window closes. Only operations that end by then count,
/// so every client is busy throughout the measured time, which is returned with the stats.
async fn run_until_a_pool_is_empty(
    path: Path,
    shared: &Arc<Shared>,
    clients: usize,
    args: &BenchArgs,
) -> (WorkerStats, Duration) {
    // The rounds before warmed the store and the writer; the grants are too few to spend
    // on a warm-up.
    let window = Window::after_warmup(Duration::ZERO, args.duration);
    // Grant 0 wrote the key; the reads take the first half of the rest, the writes the second.
    let half = shared
        .holders
        .first()
        .map_or(0, |h| h.pool.len().saturating_sub(1) / 2);
    let (first, end) = match path.op {
        Op::AdvancingRead => (1, 1 + half),
        _ => (1 + half, 1 + 2 * half),
    };
    let cursors: Arc<Vec<Cursor>> = Arc::new(
        (0..clients)
            .map(|_| Cursor {
                next_grant: AtomicUsize::new(first),
                grants_end: end,
                ..Cursor::default()
            })
            .collect(),
    );
    let handles: Vec<_> = (0..clients)
        .map(|index| {
            let worker = Worker {
                path,
                shared: shared.clone(),
                cursors: cursors.clone(),
                index,
            };
            tokio::spawn(worker.run(window))
        })
        .collect();
    let mut runs = Vec::with_capacity(clients);
    let mut total = WorkerStats::default();
    for handle in handles {
        let abort = handle.abort_handle();
        match tokio::time::timeout_at(window.end + DRAIN_MAX, handle).await {
            Ok(Ok(run)) => runs.push(run),
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
    let cut = runs
        .iter()
        .filter_map(|run| run.ran_out)
        .min()
        .map_or(window.end, |ran_out| ran_out.min(window.end));
    let counted = Window {
        start: window.start,
        end: cut,
    };
    for run in runs {
        for (started, ended) in &run.samples {
            if counted.counts(*started, *ended) {
                total.whole.record(*ended - *started);
            }
        }
        total.errors += run.stats.errors;
        if total.first_error.is_none() {
            total.first_error = run.stats.first_error;
        }
    }
    (total, cut.saturating_duration_since(window.start))
}

/// What one client of one path did.
#[derive(Debug, Default)]
struct WorkerRun {
    stats: WorkerStats,
    /// Start and end of each advancing read (they are counted once the cut is known).
    samples: Vec<(Instant, Instant)>,
    /// When the client found its pool of grants empty.
    ran_out: Option<Instant>,
}

/// One client of one path.
struct Worker {
    path: Path,
    shared: Arc<Shared>,
    cursors: Arc<Vec<Cursor>>,
    index: usize,
}

impl Worker {
    async fn run(self, window: Window) -> WorkerRun {
        let mut run = WorkerRun::default();
        for _ in 0..OPERATIONS_PER_CLIENT_MAX {
            let started = Instant::now();
            if started >= window.end {
                break;
            }
            match self.once().await {
                Ok(true) => {}
                Ok(false) => {
                    run.ran_out = Some(started);
                    break;
                }
                Err(e) => {
                    run.stats.fail(&e);
                    break;
                }
            }
            let ended = Instant::now();
            if matches!(self.path.op, Op::AdvancingRead | Op::AdvancingPut) {
                run.samples.push((started, ended));
            } else if window.counts(started, ended) {
                run.stats.whole.record(ended - started);
            }
        }
        run
    }

    /// One operation; `false` if there was none left to make (the pool of grants is empty).
    async fn once(&self) -> anyhow::Result<bool> {
        let holder = &self.shared.holders[self.index];
        let cursor = &self.cursors[self.index];
        let shared = &self.shared;
        match (self.path.op, &shared.http) {
            (Op::Put, Some(http)) if self.path.http => {
                http.put(&holder.key, &shared.value, Some(&holder.sequencer), None)
                    .await?;
            }
            (Op::Read, Some(http)) if self.path.http => {
                found(
                    http.read(&holder.key, Some(&holder.sequencer)).await?,
                    &holder.key,
                )?;
            }
            (Op::AdvancingRead, Some(http)) if self.path.http => {
                let Some(sequencer) = next_grant(holder, cursor) else {
                    return Ok(false);
                };
                found(
                    http.read(&holder.advancing_key, Some(sequencer)).await?,
                    &holder.advancing_key,
                )?;
            }
            (Op::AdvancingPut, Some(http)) if self.path.http => {
                let Some(sequencer) = next_grant(holder, cursor) else {
                    return Ok(false);
                };
                http.put(&holder.advancing_key, &shared.value, Some(sequencer), None)
                    .await?;
            }
            (Op::Txn, Some(http)) if self.path.http => {
                let request = txn_request(holder, cursor, &shared.value);
                let ack = http.txn(&request, Some(&holder.sequencer), None).await?;
                cursor.revision.store(ack.revision, Ordering::Relaxed);
            }
            (_, _) if self.path.http => bail!("an HTTP path without a store client"),
            (op, _) => {
                // The store's plain methods block on the group's fsync: in-process operations
                // run on blocking threads, each waiting for its own answer.
                let shared = self.shared.clone();
                let index = self.index;
                let sequencer = match op {
                    Op::AdvancingRead | Op::AdvancingPut => match next_grant(holder, cursor) {
                        Some(sequencer) => sequencer.to_owned(),
                        None => return Ok(false),
                    },
                    _ => holder.sequencer.clone(),
                };
                let request = (op == Op::Txn).then(|| txn_request(holder, cursor, &shared.value));
                let revision = tokio::task::spawn_blocking(move || {
                    let holder = &shared.holders[index];
                    let store = &shared.store;
                    anyhow::Ok(match op {
                        Op::UnfencedPut => {
                            store.put_unfenced(&holder.key, &shared.value)?;
                            None
                        }
                        Op::Put => {
                            store.put(Some(&sequencer), &holder.key, &shared.value, None)?;
                            None
                        }
                        Op::Read => {
                            found(store.read(Some(&sequencer), &holder.key)?, &holder.key)?;
                            None
                        }
                        Op::AdvancingRead => {
                            let key = &holder.advancing_key;
                            found(store.read(Some(&sequencer), key)?, key)?;
                            None
                        }
                        Op::AdvancingPut => {
                            let key = &holder.advancing_key;
                            store.put(Some(&sequencer), key, &shared.value, None)?;
                            None
                        }
                        Op::Txn => {
                            let request = request.expect("a transaction has its request");
                            Some(store.txn(Some(&sequencer), &request, None)?.revision)
                        }
                    })
                })
                .await??;
                if let Some(revision) = revision {
                    cursor.revision.store(revision, Ordering::Relaxed);
                }
            }
        }
        Ok(true)
    }
}

/// The next unused grant of this path's part of the holder's pool, if any is left.
fn next_grant<'a>(holder: &'a Holder, cursor: &Cursor) -> Option<&'a str> {
    let next = cursor.next_grant.fetch_add(1, Ordering::Relaxed);
    if next >= cursor.grants_end {
        return None;
    }
    holder.pool.get(next).map(String::as_str)
}

/// Put the value if the key is still at the revision this client last wrote.
fn txn_request(holder: &Holder, cursor: &Cursor, value: &[u8]) -> BatchRequest {
    BatchRequest {
        compare: vec![Compare::Revision {
            key: holder.txn_key.clone(),
            revision: cursor.revision.load(Ordering::Relaxed),
        }],
        ops: vec![BatchOp::Put {
            key: holder.txn_key.clone(),
            value: value.to_vec(),
        }],
    }
}

/// A read of a key this benchmark wrote must find a value.
fn found<T>(entry: Option<T>, key: &str) -> anyhow::Result<T> {
    entry.ok_or_else(|| anyhow!("the fenced read of {key} found no value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_workload_measures_the_fenced_write_as_its_yardstick_and_http_only_with_a_store() {
        for workload in [Workload::FencedWrite, Workload::FencedRead, Workload::Txn] {
            let (local, local_once) = paths_of(workload, false);
            assert!(local.iter().chain(&local_once).all(|path| !path.http));
            assert!(local.contains(&Path::new(Op::Put, false)), "{workload:?}");
            let (remote, remote_once) = paths_of(workload, true);
            assert_eq!(
                remote.iter().filter(|path| path.http).count(),
                local.iter().filter(|p| p.op != Op::UnfencedPut).count()
            );
            assert_eq!(remote_once.len(), 2 * local_once.len());
            // On each store the advancing reads take their grants before the writes.
            let ops: Vec<Op> = remote_once.iter().map(|path| path.op).collect();
            if workload == Workload::FencedRead {
                assert_eq!(
                    ops,
                    [
                        Op::AdvancingRead,
                        Op::AdvancingPut,
                        Op::AdvancingRead,
                        Op::AdvancingPut
                    ]
                );
            }
            let mut variants: Vec<&str> = remote
                .iter()
                .chain(&remote_once)
                .map(|path| path.variant(workload))
                .collect();
            let all = variants.len();
            variants.sort_unstable();
            variants.dedup();
            assert_eq!(variants.len(), all, "variants are distinct: {variants:?}");
        }
        let (rounds, _) = paths_of(Workload::FencedWrite, true);
        let variants: Vec<&str> = rounds
            .iter()
            .map(|path| path.variant(Workload::FencedWrite))
            .collect();
        assert_eq!(variants, ["unfenced", "fenced", "fenced-http"]);
    }

    #[test]
    fn the_grant_pool_grows_with_the_window_within_its_bounds() {
        assert_eq!(
            pool_size(Duration::from_millis(1)),
            ADVANCING_GRANTS_PER_CLIENT_MIN
        );
        assert_eq!(pool_size(Duration::from_secs(5)), 1_000);
        assert_eq!(
            pool_size(Duration::from_secs(3_600)),
            ADVANCING_GRANTS_PER_CLIENT_MAX
        );
    }
}
