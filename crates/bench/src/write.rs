//! The `fenced-write` workload: what the fence costs a resource.
//!
//! Each client holds its own lock on the lock service (so its sequencer is real, signed and
//! current) and writes one key over and over. The same clients then write the same keys through
//! the store's unchecked path ([`Store::put_unfenced`]: the same transaction, row shape and fsync,
//! minus the sequencer verification, the check-and-advance and the key binding). Rounds of the
//! two alternate, so drift of the machine (page cache, other load) hits both alike.
//!
//! Both run against a [`Store`] opened in this process, so the ratio is the fence alone; with
//! `--store` the fenced writes are also measured over HTTP against a running `palisade store`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use palisade_client::{AcquireOptions, Client, LockGuard, Session, SessionOptions, Wait};
use palisade_store::{Store, StoreClient};
use tokio::time::Instant;

use crate::bench::{
    BenchArgs, Measurement, WRITE_VALUE_BYTES, Window, WorkerStats, Workload, join_workers,
};
use crate::target::Target;

/// Alternating rounds of unfenced and fenced writes; each gets `duration / ROUNDS`.
const ROUNDS: u32 = 2;

/// How one write is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Unfenced,
    Fenced,
    FencedHttp,
}

impl Path {
    fn variant(self) -> &'static str {
        match self {
            Path::Unfenced => "unfenced",
            Path::Fenced => "fenced",
            Path::FencedHttp => "fenced-http",
        }
    }
}

/// Runs `fenced-write` with `clients` writers; sequencers come from `lock_service`.
pub(crate) async fn fenced_write(
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
    let mut holders: Vec<(Session, LockGuard)> = Vec::with_capacity(clients);
    for i in 0..clients {
        let session = client
            .open_session(SessionOptions::with_ttl(Duration::from_secs(60)))
            .await?;
        let guard = session
            .acquire(
                &format!("bench/{run_id}/fenced-write/{i}"),
                AcquireOptions::wait(Wait::Try),
            )
            .await?;
        holders.push((session, guard));
    }
    let writers: Arc<Vec<(String, String)>> = Arc::new(
        holders
            .iter()
            .enumerate()
            .map(|(i, (_, guard))| (format!("bench/{run_id}/{i}"), guard.sequencer().to_string()))
            .collect(),
    );

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

    let mut paths = vec![Path::Unfenced, Path::Fenced];
    let http = match store_address {
        Some(address) => {
            paths.push(Path::FencedHttp);
            Some(StoreClient::new(&format!("http://{address}"))?)
        }
        None => None,
    };
    let round = args.duration / ROUNDS;
    let mut totals: Vec<WorkerStats> = paths.iter().map(|_| WorkerStats::default()).collect();
    for round_index in 0..ROUNDS {
        for (path, total) in paths.iter().zip(totals.iter_mut()) {
            // Warm up before the first round of each path only.
            let warmup = if round_index == 0 {
                args.warmup
            } else {
                Duration::ZERO
            };
            let window = Window::after_warmup(warmup, round);
            let handles = (0..clients)
                .map(|i| {
                    let writer = Writer {
                        path: *path,
                        store: store.clone(),
                        http: http.clone(),
                        writers: writers.clone(),
                        index: i,
                    };
                    tokio::spawn(writer.run(window))
                })
                .collect();
            total.merge(join_workers(handles, window).await);
        }
    }

    for (session, guard) in holders {
        let _ = guard.release().await;
        let _ = session.close().await;
    }
    drop(store);
    let store_target = |path: Path| match (path, store_address) {
        (Path::FencedHttp, Some(address)) => format!("http://{address}"),
        _ => format!("store in {}", dir.path().display()),
    };
    Ok(paths
        .iter()
        .zip(totals)
        .map(|(path, stats)| {
            let operations = stats.whole.count();
            Measurement {
                workload: Workload::FencedWrite,
                variant: Some(path.variant()),
                target: store_target(*path),
                target_kind: "palisade",
                clients,
                locks: clients,
                operation: "durable write",
                duration_s: args.duration.as_secs_f64(),
                operations,
                operations_per_s: operations as f64 / args.duration.as_secs_f64(),
                errors: stats.errors,
                first_error: stats.first_error,
                latency: stats.whole.percentiles(),
                acquire: None,
                release: None,
                server: None,
            }
        })
        .collect())
}

/// One writing client.
struct Writer {
    path: Path,
    store: Arc<Store>,
    http: Option<StoreClient>,
    /// (key, sequencer) of every client.
    writers: Arc<Vec<(String, String)>>,
    index: usize,
}

impl Writer {
    async fn run(self, window: Window) -> WorkerStats {
        let mut stats = WorkerStats::default();
        let value = vec![b'x'; WRITE_VALUE_BYTES];
        loop {
            let started = Instant::now();
            if started >= window.end {
                break;
            }
            if let Err(e) = self.write_once(&value).await {
                stats.fail(&e);
                break;
            }
            let ended = Instant::now();
            if window.counts(started, ended) {
                stats.whole.record(ended - started);
            }
        }
        stats
    }

    async fn write_once(&self, value: &[u8]) -> anyhow::Result<()> {
        let (key, sequencer) = &self.writers[self.index];
        match self.path {
            Path::FencedHttp => {
                let http = self.http.as_ref().expect("the HTTP path has a client");
                http.put(key, value, Some(sequencer), None).await?;
            }
            path => {
                let store = self.store.clone();
                let writers = self.writers.clone();
                let index = self.index;
                let value = value.to_vec();
                tokio::task::spawn_blocking(move || {
                    let (key, sequencer) = &writers[index];
                    match path {
                        Path::Unfenced => store.put_unfenced(key, &value),
                        _ => store.put(Some(sequencer), key, &value, None).map(|_| ()),
                    }
                })
                .await??;
            }
        }
        Ok(())
    }
}
