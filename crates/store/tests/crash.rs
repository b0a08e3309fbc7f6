//! Crash scenario with a real process: the store server is killed with SIGKILL in the middle of
//! a stream of fenced writes, several times, and restarted on the same data directory. Every
//! acknowledged write must still be there, and the accepted token of each lock must not go
//! back — replaying an older grant is refused after every restart.
//!
//! This file has its own `main` (`harness = false`): run with `PALISADE_STORE_CHILD=<data dir>`,
//! the executable *is* the store server (what `palisade store serve` runs: [`Store::open`] and
//! [`StoreServer`], announcing its address on standard output), so the test needs no binary
//! from another crate. The kill delays come from a seed printed at the start;
//! set `PALISADE_CRASH_SEED` to replay one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use palisade_sequencer::PublicKey;
use palisade_store::{Store, StoreClient, StoreClientError, StoreError, StoreServer};
use palisade_testkit::ServiceKey;
use palisade_testkit::process::{Announce, ServerProcess};

const CHILD_ENV: &str = "PALISADE_STORE_CHILD";
const CHILD_KEY_ENV: &str = "PALISADE_STORE_CHILD_PUBLIC_KEY";
const CHILD_LISTEN_ENV: &str = "PALISADE_STORE_CHILD_LISTEN";
const TEST_NAME: &str = "a_store_killed_mid_stream_keeps_every_acknowledged_write_and_its_tokens";

const KILLS: u32 = 4;
const LOCKS: [&str; 2] = ["jobs/nightly", "jobs/hourly"];
const KEYS_PER_LOCK: u64 = 3;
const KILL_DELAY_MS_MIN: u64 = 40;
const KILL_DELAY_MS_MAX: u64 = 250;

fn main() {
    if let Ok(data_dir) = std::env::var(CHILD_ENV) {
        run_child(Path::new(&data_dir));
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--list") {
        println!("{TEST_NAME}: test");
        return;
    }
    // Respect a name filter, as libtest would.
    if let Some(filter) = args.iter().find(|arg| !arg.starts_with('-'))
        && !TEST_NAME.contains(filter.as_str())
    {
        println!("running 0 tests (filtered out {TEST_NAME})");
        return;
    }
    println!("running 1 test");
    let started = Instant::now();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(kill_9_scenario());
    println!("test {TEST_NAME} ... ok ({:.1?})", started.elapsed());
}

/// The child: a store server on the address in `PALISADE_STORE_CHILD_LISTEN` over the given
/// data directory, announcing `palisade store: listening on http://ADDR` as `palisade store
/// serve` does.
fn run_child(data_dir: &Path) {
    let public_key = PublicKey::parse(&std::env::var(CHILD_KEY_ENV).unwrap()).unwrap();
    let listen: SocketAddr = std::env::var(CHILD_LISTEN_ENV).unwrap().parse().unwrap();
    let store = Arc::new(Store::open(data_dir, public_key).unwrap());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let server = StoreServer::bind(store, listen).await.unwrap();
            println!(
                "palisade store: listening on http://{}",
                server.local_addr().unwrap()
            );
            // Killed with SIGKILL by the parent: it never shuts down on its own.
            server.run_until(std::future::pending()).await.unwrap();
        });
}

/// This executable as the store server child on `data_dir`: port 0 at its first start, the same
/// port at every restart.
fn server_process(data_dir: &Path, public_key: &PublicKey) -> ServerProcess {
    let exe = std::env::current_exe().unwrap();
    let (dir, key) = (data_dir.to_path_buf(), public_key.to_string());
    ServerProcess::custom(
        "the store server child",
        data_dir,
        Announce::Store,
        move |ports| {
            let mut command = palisade_testkit::command(&exe);
            command
                .env(CHILD_ENV, &dir)
                .env(CHILD_KEY_ENV, &key)
                .env(CHILD_LISTEN_ENV, ports.listen.to_string());
            command
        },
    )
}

/// What one writer knows about one key.
#[derive(Debug, Clone, Default)]
struct KeyHistory {
    /// The last write the store acknowledged: (token, value).
    acknowledged: Option<(u64, String)>,
    /// A write sent when the server died, whose outcome is unknown.
    in_flight: Option<(u64, String)>,
}

/// One lock's holder stream: each write is a new grant with the next token.
struct Writer {
    lock: &'static str,
    next_token: u64,
    keys: HashMap<String, KeyHistory>,
}

impl Writer {
    fn new(lock: &'static str) -> Writer {
        Writer {
            lock,
            next_token: 1,
            keys: HashMap::new(),
        }
    }

    fn token_acknowledged_max(&self) -> Option<u64> {
        self.keys
            .values()
            .filter_map(|history| history.acknowledged.as_ref().map(|(token, _)| *token))
            .max()
    }

    /// Writes until the server stops answering; returns how many writes were acknowledged.
    async fn stream(
        &mut self,
        service: &ServiceKey,
        client: &StoreClient,
        dead: &AtomicBool,
    ) -> u64 {
        let mut acknowledged = 0;
        while !dead.load(Ordering::SeqCst) {
            let token = self.next_token;
            self.next_token += 1;
            let key = format!("{}/key-{}", self.lock, token % KEYS_PER_LOCK);
            let value = format!("{} written with token {token}", self.lock);
            let sequencer = service.grant(self.lock, token, token);
            let result = client
                .put(&key, value.as_bytes(), Some(&sequencer), Some("crash-test"))
                .await;
            let history = self.keys.entry(key).or_default();
            match result {
                Ok(ack) => {
                    assert_eq!((ack.token, ack.replayed), (token, false));
                    history.acknowledged = Some((token, value));
                    history.in_flight = None;
                    acknowledged += 1;
                }
                Err(error) => {
                    assert!(
                        error.is_retryable() || error.is_outcome_unknown(),
                        "only the crash may fail a write, got {error:?}"
                    );
                    history.in_flight = Some((token, value));
                    dead.store(true, Ordering::SeqCst);
                }
            }
        }
        acknowledged
    }

    /// After a restart: every acknowledged write is present (or overwritten only by the one
    /// write in flight at the kill), and older grants are refused.
    async fn verify(&mut self, service: &ServiceKey, client: &StoreClient) {
        for (key, history) in &mut self.keys {
            let stored = client.get(key).await.unwrap();
            let stored = stored.map(|entry| (entry.token, String::from_utf8(entry.value).unwrap()));
            let possible: Vec<_> = history
                .acknowledged
                .iter()
                .chain(history.in_flight.iter())
                .cloned()
                .collect();
            match &stored {
                Some(found) => assert!(
                    possible.contains(found),
                    "key {key:?} holds {found:?} after the crash; expected one of {possible:?}"
                ),
                None => assert!(
                    history.acknowledged.is_none(),
                    "key {key:?} lost its acknowledged write {:?}",
                    history.acknowledged
                ),
            }
            // Whatever the store holds is now the key's known state.
            history.acknowledged = stored;
            history.in_flight = None;
        }

        let Some(token_max) = self.token_acknowledged_max() else {
            return;
        };
        let fence = client.fence(self.lock).await.unwrap();
        assert!(
            fence.token_max >= Some(token_max),
            "lock {} accepted {:?} after the crash, below the acknowledged {token_max}",
            self.lock,
            fence.token_max
        );
        if token_max > 1 {
            let old = service.grant(self.lock, token_max - 1, token_max - 1);
            let key = format!("{}/key-0", self.lock);
            match client.put(&key, b"replayed", Some(&old), None).await {
                Err(StoreClientError::Store(StoreError::Stale {
                    presented,
                    accepted,
                    ..
                })) => {
                    assert_eq!(presented, token_max - 1);
                    assert!(accepted >= token_max);
                }
                other => panic!(
                    "replaying token {} after a restart: {other:?}",
                    token_max - 1
                ),
            }
        }
        // Continue above anything the store may have accepted.
        self.next_token = self.next_token.max(fence.token_max.unwrap_or(0) + 1);
    }
}

async fn kill_9_scenario() {
    let seed: u64 = std::env::var("PALISADE_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
                .into()
        });
    println!("crash scenario seed: PALISADE_CRASH_SEED={seed}");
    let mut random = seed;
    let mut next_delay_ms = move || {
        random = random
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        KILL_DELAY_MS_MIN + (random >> 33) % (KILL_DELAY_MS_MAX - KILL_DELAY_MS_MIN)
    };

    let service = Arc::new(ServiceKey::new());
    let public_key = service.key.public_key();
    let dir = tempfile::tempdir().unwrap();
    let mut server = server_process(&dir.path().join("data"), &public_key);
    let mut writers: Vec<Writer> = LOCKS.into_iter().map(Writer::new).collect();

    for kill in 1..=KILLS {
        server.start();
        let client = StoreClient::new(&server.endpoint()).unwrap();
        for writer in &mut writers {
            writer.verify(&service, &client).await;
        }

        // Phase: both holders stream writes; the server is killed under them.
        let dead = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = writers
            .drain(..)
            .map(|mut writer| {
                let (service, client, dead) = (service.clone(), client.clone(), dead.clone());
                tokio::spawn(async move {
                    let acknowledged = writer.stream(&service, &client, &dead).await;
                    (writer, acknowledged)
                })
            })
            .collect();
        let delay_ms = next_delay_ms();
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        server.kill9();
        dead.store(true, Ordering::SeqCst);
        let mut acknowledged_total = 0;
        for handle in handles {
            let (writer, acknowledged) = handle.await.unwrap();
            acknowledged_total += acknowledged;
            writers.push(writer);
        }
        println!("kill {kill}: after {delay_ms} ms, {acknowledged_total} writes acknowledged");
        assert!(
            acknowledged_total > 0,
            "the stream never got going before the kill"
        );
    }

    // Phase: a final restart; everything acknowledged is there.
    server.start();
    let client = StoreClient::new(&server.endpoint()).unwrap();
    for writer in &mut writers {
        writer.verify(&service, &client).await;
        assert!(writer.token_acknowledged_max().is_some());
    }
    server.kill9();
}
