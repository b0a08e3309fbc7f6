//! A quick in-process load probe of the lock service: N clients each acquire and release their
//! own lock in a loop for a few seconds, over real gRPC on loopback. Prints cycles per second.
//! The full load generator with etcd comparison is `palisade bench`.

use std::time::{Duration, Instant};

use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_server::{Server, ServerConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clients: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(32);
    let seconds: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir()?;
    let args = ServerConfig::single_node(dir.path().to_path_buf(), "127.0.0.1:0".parse()?);
    let server = Server::start(&args).await?;
    if std::env::var_os("PROBE_DIRECT").is_some() {
        // Without gRPC: the Raft pipeline and the fsync alone.
        let node = server.node().clone();
        let opened = node
            .propose(palisade_core::Command::OpenSession {
                open_key: None,
                ttl_ms: palisade_core::DurationMs::from_millis(30_000),
                secret_digest: None,
                owner: None,
            })
            .await?;
        let Ok(palisade_core::Reply::SessionOpened { session, .. }) = opened.result else {
            return Err("the probe's session was not opened".into());
        };
        let started = Instant::now();
        let mut cycles = 0u64;
        while started.elapsed() < Duration::from_secs(seconds) {
            let lock = "direct".to_string();
            node.propose(palisade_core::Command::Acquire {
                session,
                lock: lock.clone(),
                request_id: palisade_core::RequestId::new(10 + 2 * cycles),
                wait: palisade_core::Wait::Try,
                value: None,
                mode: palisade_core::Mode::Exclusive,
            })
            .await?;
            node.propose(palisade_core::Command::Release {
                session,
                lock,
                request_id: palisade_core::RequestId::new(11 + 2 * cycles),
            })
            .await?;
            cycles += 1;
        }
        println!(
            "direct, one caller: {:.3} ms per acquire+release",
            started.elapsed().as_secs_f64() * 1e3 / cycles as f64
        );
        return Ok(());
    }
    let endpoint = format!("http://{}", server.local_addr());
    tokio::spawn(server.run_until(std::future::pending()));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let endpoint = endpoint.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = LocksClient::connect(endpoint).await.unwrap();
            let session = client
                .open_session(OpenSessionRequest {
                    request_id: c + 1,
                    ttl_ms: 30_000,
                    open_key: Vec::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .session;
            let lock = format!("probe/{c}");
            let mut cycles = 0u64;
            let mut request_id = 1000;
            while Instant::now() < deadline {
                request_id += 2;
                let acquire = AcquireRequest {
                    session,
                    lock: lock.clone(),
                    request_id,
                    wait_ms: 0,
                    wait_forever: false,
                    // Opened by a proposal without a digest, as before session secrets: the
                    // session is acted for by its id alone.
                    session_secret: Vec::new(),
                    value: String::new(),
                    permits: 0,
                    shared: false,
                };
                client.acquire(acquire).await.unwrap();
                let release = ReleaseRequest {
                    session,
                    lock: lock.clone(),
                    request_id: request_id + 1,
                    session_secret: Vec::new(),
                };
                client.release(release).await.unwrap();
                cycles += 1;
            }
            cycles
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await?;
    }
    println!(
        "{clients} clients, {seconds} s: {} acquire+release cycles/s",
        total / seconds
    );
    Ok(())
}
