//! Hostile clients against a real `palisade serve` process: requests that must be refused
//! before they reach the Raft log, idle sockets that take every connection permit, and
//! thousands of watches. In each, an honest client's lease stays alive and its calls are
//! answered.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use palisade_proto::v1::cluster_client::ClusterClient;
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_server::limits::{CONNECTIONS_MAX, LONG_LIVED_CALLS_PER_CONNECTION_MAX, WATCHES_MAX};
use palisade_testkit::{Ran, ServerProcess, command, locks_client, run};
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

fn palisade(service: &ServerProcess, args: &[&str]) -> Ran {
    let mut cmd = command(BIN);
    cmd.args(["--endpoint", &service.endpoint()]).args(args);
    run(cmd)
}

async fn last_log_index(service: &ServerProcess) -> u64 {
    let mut cluster = ClusterClient::connect(service.endpoint()).await.unwrap();
    cluster
        .status(ClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .last_log_index
}

async fn open(client: &mut LocksClient<Channel>, ttl_ms: u64) -> (u64, Vec<u8>) {
    let opened = client
        .open_session(OpenSessionRequest {
            ttl_ms,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (opened.session, opened.session_secret)
}

/// H1: every refusal a request can get for its own content comes before anything is proposed.
/// Before, acquires and releases with an invalid name were written to the log first (and a
/// control character costs six bytes of JSON there), so a stream of them grew the log and the
/// memory without bound, and could make a write frame too large to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_refused_as_before_and_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();
    let mut client = locks_client(&service.endpoint()).await;
    let (session, secret) = open(&mut client, 600_000).await;
    let before = last_log_index(&service).await;

    let acquire = |lock: String, wait_ms: u64| AcquireRequest {
        session,
        lock,
        request_id: 1,
        wait_ms,
        wait_forever: false,
        session_secret: secret.clone(),
        value: String::new(),
        permits: 0,
        shared: false,
    };
    let release = |lock: String| ReleaseRequest {
        session,
        lock,
        request_id: 2,
        session_secret: secret.clone(),
    };
    // Within the length limit, so that the control characters are what is refused.
    let control_characters = "\u{1}".repeat(200);
    let too_long = "n".repeat(palisade_core::limits::LOCK_NAME_BYTES_MAX + 1);
    for round in 0..20 {
        for (name, reason) in [
            (String::new(), "empty"),
            (control_characters.clone(), "control_character"),
            (too_long.clone(), "too_long"),
        ] {
            for status in [
                client.acquire(acquire(name.clone(), 0)).await.unwrap_err(),
                client.release(release(name.clone())).await.unwrap_err(),
            ] {
                assert_eq!(status.code(), Code::InvalidArgument, "{round}: {status:?}");
                let detail = palisade_proto::error::detail_from_core(
                    &palisade_proto::error::core_from_status(&status).expect("an ErrorDetail"),
                );
                assert_eq!(
                    (detail.kind.as_str(), detail.reason.as_str()),
                    ("invalid_lock_name", reason)
                );
            }
        }
        let wait = client
            .acquire(acquire("fine".into(), u64::MAX))
            .await
            .unwrap_err();
        assert_eq!(wait.code(), Code::InvalidArgument, "{wait:?}");
        assert_eq!(
            palisade_proto::error::core_from_status(&wait).map(|e| e.code()),
            Some("wait_out_of_range")
        );
        // A session that does not exist, with a name a table would refuse: not found, as
        // before, and nothing written.
        let stranger = client
            .acquire(AcquireRequest {
                session: session + 1_000,
                ..acquire(control_characters.clone(), 0)
            })
            .await
            .unwrap_err();
        assert_eq!(stranger.code(), Code::NotFound, "{stranger:?}");
        let ttl = client
            .open_session(OpenSessionRequest {
                ttl_ms: 1,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(ttl.code(), Code::InvalidArgument, "{ttl:?}");
    }
    assert_eq!(
        last_log_index(&service).await,
        before,
        "refused requests were written to the log"
    );

    // The same session still works, and its work is written.
    client.acquire(acquire("fine".into(), 0)).await.unwrap();
    assert!(last_log_index(&service).await > before);
}

/// Runs `palisade lock NAME --ttl 3s -- sleep SECONDS` in the background: it must keep its
/// lock, renewing a 3 s lease several times, for as long as the command runs.
fn hold_lock_in_background(
    service: &ServerProcess,
    lock: &str,
    seconds: u64,
) -> std::thread::JoinHandle<Ran> {
    let mut cmd = command(BIN);
    cmd.args(["--endpoint", &service.endpoint()]).args([
        "lock",
        lock,
        "--ttl",
        "3s",
        "--",
        "sleep",
        &seconds.to_string(),
    ]);
    std::thread::spawn(move || run(cmd))
}

/// Waits (bounded) until `lock` is held.
fn wait_until_held(service: &ServerProcess, lock: &str) {
    palisade_testkit::wait_until(&format!("{lock} is held"), Duration::from_secs(30), || {
        let ran = palisade(service, &["status", lock, "--json"]);
        ran.code() == Some(0) && !ran.json()["holder"].is_null()
    });
}

/// H2: idle sockets up to the connection cap. Before, each held its permit for ever, and every
/// new or reconnecting client waited in the accept backlog: a one-shot renewal failed and a
/// one-shot session lost its lease.
#[test]
fn idle_sockets_up_to_the_connection_cap_do_not_keep_an_honest_client_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();

    // Phase 1: an honest script holds a lock in a one-shot session with a 60 s lease, and a
    // `palisade lock` holds another with a 3 s lease.
    let granted = palisade(&service, &["acquire", "h2/script", "--ttl", "60s"]);
    granted.expect_success();
    let credential = granted.key_values()["PALISADE_SESSION"].clone();
    let holder = hold_lock_in_background(&service, "h2/held", 15);
    wait_until_held(&service, "h2/held");

    // Phase 2: idle sockets take every connection permit, and stay open (from this side) for
    // the rest of the test.
    const OPENERS: usize = 8;
    let addr = service.addr();
    let openers: Vec<_> = (0..OPENERS)
        .map(|opener| {
            std::thread::spawn(move || {
                (0..CONNECTIONS_MAX / OPENERS)
                    .map(|i| {
                        TcpStream::connect(addr).unwrap_or_else(|e| {
                            panic!("idle socket {i} of opener {opener} could not connect: {e}")
                        })
                    })
                    .collect::<Vec<TcpStream>>()
            })
        })
        .collect();
    let idle: Vec<TcpStream> = openers
        .into_iter()
        .flat_map(|opener| opener.join().unwrap())
        .collect();
    assert_eq!(idle.len(), CONNECTIONS_MAX);

    // Phase 3: the script renews four times, 3 s apart, as a new client each time, and is
    // answered; and a new script takes a lock.
    let started = Instant::now();
    let newcomer = palisade(&service, &["acquire", "h2/newcomer", "--ttl", "10s"]);
    assert_eq!(newcomer.code(), Some(0), "a new client: {newcomer:?}");
    for round in 0..4 {
        let renewed = palisade(&service, &["renew", "--session", &credential]);
        assert_eq!(
            renewed.code(),
            Some(0),
            "round {round} ({:?} after the idle sockets): {renewed:?}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    let status = palisade(&service, &["status", "h2/script", "--json"]);
    status.expect_success();
    let id = credential.split('.').next().unwrap();
    assert_eq!(status.json()["holder"]["session"].to_string(), id);

    // Phase 4: the lock holder kept its lock and its command ran to the end.
    let held = holder.join().unwrap();
    assert_eq!(held.code(), Some(0), "palisade lock: {held:?}");
    palisade(
        &service,
        &["release", "h2/script", "--session", &credential],
    )
    .expect_success();
    drop(idle);
}

/// H3: thousands of watches, as many as the server allows over all connections, opened by a
/// client over as few connections as the server lets it. Before, watches, queued acquires and
/// keepalive streams shared one budget, so the honest `palisade lock` could neither wait in the
/// queue nor keep its session alive.
#[test]
fn thousands_of_watches_do_not_starve_an_honest_clients_keepalives() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // Phase 1: watches until the server refuses more, one connection per full share of them.
    let endpoint = service.endpoint();
    let (opened, refused, streams) = runtime.block_on(async {
        let connections = WATCHES_MAX / LONG_LIVED_CALLS_PER_CONNECTION_MAX + 1;
        let mut streams = Vec::new();
        let (mut opened, mut refused) = (0usize, 0usize);
        for c in 0..connections {
            let client = locks_client(&endpoint).await;
            let mut tasks = Vec::new();
            for w in 0..LONG_LIVED_CALLS_PER_CONNECTION_MAX {
                let mut client = client.clone();
                tasks.push(tokio::spawn(async move {
                    let lock = format!("watched/{c}/{w}");
                    client.watch(WatchRequest { lock }).await
                }));
            }
            for task in tasks {
                match task.await.unwrap() {
                    Ok(stream) => {
                        opened += 1;
                        streams.push(stream.into_inner());
                    }
                    Err(status) => {
                        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                        refused += 1;
                    }
                }
            }
        }
        (opened, refused, streams)
    });
    assert_eq!(opened, WATCHES_MAX, "{refused} refused");
    assert!(refused > 0);

    // Phase 2: with every watch still open, an honest `palisade lock` takes a lock with a 3 s
    // lease and holds it while its command runs for 12 s.
    let holder = hold_lock_in_background(&service, "h3/held", 12);
    let held = holder.join().unwrap();
    assert_eq!(held.code(), Some(0), "palisade lock: {held:?}");

    // Phase 3: the watches did open: each starts with the lock's state.
    runtime.block_on(async {
        for mut stream in streams.into_iter().take(100) {
            let first = stream.message().await.unwrap().expect("a snapshot event");
            assert_eq!(first.kind, watch_event::Kind::Snapshot as i32);
        }
    });
}
