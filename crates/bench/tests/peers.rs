//! The peer targets of `palisade bench` against real servers: ZooKeeper's lock recipe
//! (`PALISADE_TEST_ZOOKEEPER`, e.g. `127.0.0.1:2181`) and Redis `SET NX PX`
//! (`PALISADE_TEST_REDIS`, e.g. `redis://127.0.0.1:6379/`). Each prints a "skipping:" line and
//! passes when its variable is unset.
//!
//! What is checked is what the clients observe — one holder at a time, no lost update of a
//! counter they share, ZooKeeper's tokens growing — and that a short benchmark run completes
//! with no errors. Never how fast.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use palisade_bench::bench::{Observe, Workload, lock_workload};
use palisade_bench::target::{LockConn, Target};

/// Clients contending for the one lock.
const CLIENTS: usize = 4;
/// Grants each client takes.
const ROUNDS: usize = 20;
/// The whole scenario's time limit.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(60);

fn target_from(var: &str, scheme: &str) -> Option<Target> {
    let Ok(value) = std::env::var(var) else {
        println!("skipping: {var} is not set; the {scheme}:// bench target was not tested");
        return None;
    };
    let text = if value.contains("://") {
        value
    } else {
        format!("{scheme}://{value}")
    };
    Some(
        text.parse()
            .unwrap_or_else(|e| panic!("{var}={text:?} is no target: {e}")),
    )
}

/// What the clients saw while they took turns.
#[derive(Default)]
struct Observed {
    /// Clients holding the lock right now, by their own account.
    holders: AtomicUsize,
    /// Times a client found another holder when it was granted the lock.
    overlaps: AtomicUsize,
    /// A counter the holders increment with a read, a pause and a write: a lost update if two
    /// hold at once.
    counter: AtomicU64,
    /// The highest token granted so far, and grants whose token was not higher.
    last_token: std::sync::Mutex<u64>,
    tokens_not_rising: AtomicUsize,
}

/// Phase 1: CLIENTS clients, each with its own connection and session, take the one lock ROUNDS
/// times each, and inside each grant check they are alone and increment the shared counter.
/// Phase 2: a one-second contended benchmark run on the same target completes without errors.
async fn one_holder_at_a_time(target: Target) {
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let lock = format!("palisade-test/{run}/mutex");
    let observed = Arc::new(Observed::default());

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut conn = LockConn::open(&target, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("a client connects to {target}: {e:#}"));
        let (lock, observed) = (lock.clone(), observed.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let held = conn.acquire(&lock).await.expect("acquire");
                if observed.holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    observed.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                if let Some(token) = held.token() {
                    let mut last = observed.last_token.lock().unwrap();
                    if token <= *last {
                        observed.tokens_not_rising.fetch_add(1, Ordering::SeqCst);
                    }
                    *last = token;
                }
                let read = observed.counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                observed.counter.store(read + 1, Ordering::SeqCst);
                observed.holders.fetch_sub(1, Ordering::SeqCst);
                conn.release(held).await.expect("release");
            }
            conn.close().await;
        }));
    }
    tokio::time::timeout(SCENARIO_TIMEOUT, async {
        for client in clients {
            client.await.expect("a client finishes its rounds");
        }
    })
    .await
    .expect("every client finished its rounds within the time limit");

    assert_eq!(
        observed.overlaps.load(Ordering::SeqCst),
        0,
        "two holders at once"
    );
    assert_eq!(
        observed.counter.load(Ordering::SeqCst),
        (CLIENTS * ROUNDS) as u64,
        "every grant's increment survived"
    );
    assert_eq!(observed.tokens_not_rising.load(Ordering::SeqCst), 0);
    if matches!(target, Target::ZooKeeper { .. }) {
        assert!(
            *observed.last_token.lock().unwrap() > 0,
            "zookeeper grants carry their node's czxid"
        );
    }

    let m = lock_workload(
        Workload::Contended,
        &target,
        CLIENTS,
        Duration::from_millis(200),
        Duration::from_secs(1),
        &Observe::default(),
    )
    .await
    .expect("the contended workload runs");
    assert_eq!(m.errors, 0, "{m:#?}");
    assert!(m.operations > 0, "{m:#?}");
    assert_eq!(m.target_kind, target.kind());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_recipe_grants_one_holder_at_a_time_with_rising_zxids() {
    if let Some(target) = target_from("PALISADE_TEST_ZOOKEEPER", "zk") {
        one_holder_at_a_time(target).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_set_nx_grants_one_holder_at_a_time() {
    if let Some(target) = target_from("PALISADE_TEST_REDIS", "redis") {
        one_holder_at_a_time(target).await;
    }
}
