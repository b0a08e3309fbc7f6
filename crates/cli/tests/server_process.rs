//! The lock service as a real process: `kill -9` in the middle of a stream of grants, lease
//! expiry, FIFO waiters, ownership, and hostile input — observed through the gRPC API.

use std::io::Write as _;
use std::time::Duration;

use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_testkit::{ServerProcess, locks_client};
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// A session as its opener holds it: its id, and the secret every call for it presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Session {
    id: u64,
    secret: [u8; 32],
}

async fn open(client: &mut LocksClient<Channel>, request_id: u64, ttl_ms: u64) -> Session {
    let opened = client
        .open_session(OpenSessionRequest {
            request_id,
            ttl_ms,
            open_key: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    Session {
        id: opened.session,
        secret: opened.session_secret.try_into().expect("a 32-byte secret"),
    }
}

fn waiting_acquire(session: Session, lock: &str, request_id: u64) -> AcquireRequest {
    AcquireRequest {
        wait_forever: true,
        ..try_acquire(session, lock, request_id)
    }
}

fn try_acquire(session: Session, lock: &str, request_id: u64) -> AcquireRequest {
    AcquireRequest {
        session: session.id,
        lock: lock.into(),
        request_id,
        wait_ms: 0,
        wait_forever: false,
        session_secret: session.secret.to_vec(),
        value: String::new(),
        permits: 0,
        shared: false,
    }
}

fn release(session: Session, lock: &str, request_id: u64) -> ReleaseRequest {
    ReleaseRequest {
        session: session.id,
        lock: lock.into(),
        request_id,
        session_secret: session.secret.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_repeated_kill_9_in_the_middle_of_a_stream_of_grants() {
    const ROUNDS: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    let mut acknowledged: Vec<u64> = Vec::new();
    let mut kept: Vec<(Session, String, u64)> = Vec::new(); // (session, lock, token) never released

    for round in 0..ROUNDS {
        service.start();
        let mut client = locks_client(&service.endpoint()).await;

        // Phase 1: every grant acknowledged before a crash is still there after it.
        for (session, lock, token) in &kept {
            let status = client
                .status(StatusRequest {
                    lock: lock.clone(),
                    stale: false,
                })
                .await
                .unwrap()
                .into_inner();
            let holder = status
                .holder
                .unwrap_or_else(|| panic!("{lock} lost its holder in round {round}"));
            assert_eq!(
                (holder.session, holder.token),
                (session.id, *token),
                "{lock} after restart"
            );
        }

        // Phase 2: a stream of acquire/release cycles from several tasks, cut off by kill -9.
        let session = open(&mut client, 1_000 + round, 60_000).await;
        let keep = format!("kept/{round}");
        let token = client
            .acquire(try_acquire(session, &keep, 1))
            .await
            .unwrap()
            .into_inner()
            .token;
        acknowledged.push(token);
        kept.push((session, keep, token));

        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut streams = Vec::new();
        for task in 0..4u64 {
            let mut client = client.clone();
            let tx = tx.clone();
            streams.push(tokio::spawn(async move {
                let session = open(&mut client, 10_000 + round * 10 + task, 60_000).await;
                let lock = format!("stream/{round}/{task}");
                for i in 0.. {
                    let id = 100 + 2 * i;
                    match client.acquire(try_acquire(session, &lock, id)).await {
                        Ok(granted) => tx.send(granted.into_inner().token).unwrap(),
                        Err(_) => return, // the server died under us: outcome unknown
                    }
                    if client
                        .release(release(session, &lock, id + 1))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }));
        }
        drop(tx);
        let cut_after = 20 + 37 * round as usize % 90;
        let mut seen = 0;
        while seen < cut_after {
            acknowledged.push(rx.recv().await.expect("grants keep coming"));
            seen += 1;
        }
        service.kill9();
        for stream in streams {
            stream.await.unwrap();
        }
        while let Some(token) = rx.recv().await {
            acknowledged.push(token);
        }
    }

    // Phase 3: one more start, one more grant; then judge the whole history.
    service.start();
    let mut client = locks_client(&service.endpoint()).await;
    let session = open(&mut client, 99, 60_000).await;
    acknowledged.push(
        client
            .acquire(try_acquire(session, "final", 1))
            .await
            .unwrap()
            .into_inner()
            .token,
    );
    let mut sorted = acknowledged.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        acknowledged.len(),
        "a token was granted twice: {acknowledged:?}"
    );
    assert_eq!(
        *acknowledged.last().unwrap(),
        *sorted.last().unwrap(),
        "the grant after the last restart must carry the highest token ever acknowledged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_holder_loses_its_lock_and_a_waiter_whose_session_ended_is_never_granted() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();
    let mut client = locks_client(&service.endpoint()).await;

    // Phase 1: a waiter that falls silent (1 s lease), then a holder that falls silent (2 s
    // lease), then two live waiters in line behind them.
    let doomed = open(&mut client, 1, 1_000).await;
    let holder = open(&mut client, 2, 2_000).await;
    let second = open(&mut client, 3, 60_000).await;
    let third = open(&mut client, 4, 60_000).await;
    let outsider = open(&mut client, 5, 60_000).await;
    let first = client
        .acquire(try_acquire(holder, "q", 1))
        .await
        .unwrap()
        .into_inner();
    let mut waits = Vec::new();
    for session in [doomed, second, third] {
        let mut waiter = client.clone();
        waits.push(tokio::spawn(async move {
            let request = waiting_acquire(session, "q", 7);
            waiter.acquire(request).await
        }));
        // Queue in a known order.
        while client
            .status(StatusRequest {
                lock: "q".into(),
                stale: false,
            })
            .await
            .unwrap()
            .into_inner()
            .waiters
            .len()
            < waits.len()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let third_wait = waits.pop().unwrap();
    let second_wait = waits.pop().unwrap();
    let doomed_wait = waits.pop().unwrap();

    // Phase 2: only the holding session may release.
    let refused = client.release(release(outsider, "q", 9)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        matches!(
            palisade_proto::error::core_from_status(&refused),
            Some(palisade_core::CoreError::NotHolder { holder_session, .. })
                if holder_session == Some(palisade_core::SessionId::new(holder.id))
        ),
        "names the holder: {refused:?}"
    );

    // Phase 3: the silent waiter's session ends first: its wait fails and it is skipped.
    let doomed_outcome = doomed_wait.await.unwrap().unwrap_err();
    assert_eq!(doomed_outcome.code(), Code::NotFound, "{doomed_outcome:?}");

    // Phase 4: the silent holder's lease runs out; the next live waiter gets a higher token.
    let granted_second = second_wait.await.unwrap().unwrap().into_inner();
    assert_eq!(granted_second.session, second.id);
    assert!(granted_second.token > first.token);
    let late_release = client.release(release(holder, "q", 2)).await.unwrap_err();
    assert_eq!(
        late_release.code(),
        Code::NotFound,
        "the expired holder's session is gone"
    );
    assert!(
        !third_wait.is_finished(),
        "the third waiter is still in line"
    );

    // Phase 5: a clean release hands the lock to the third, in order.
    client.release(release(second, "q", 8)).await.unwrap();
    let granted_third = third_wait.await.unwrap().unwrap().into_inner();
    assert_eq!(granted_third.session, third.id);
    assert!(granted_third.token > granted_second.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_clear_errors_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();
    let mut client = locks_client(&service.endpoint()).await;
    let session = open(&mut client, 1, 60_000).await;
    let held = client
        .acquire(try_acquire(session, "precious", 1))
        .await
        .unwrap()
        .into_inner();

    // Names, TTLs and waits out of range.
    let long_name = "x".repeat(257);
    let status = client
        .acquire(try_acquire(session, &long_name, 2))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("256"), "{}", status.message());
    let status = client
        .acquire(try_acquire(session, "", 3))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    for ttl_ms in [0, 1, u64::MAX] {
        let status = client
            .open_session(OpenSessionRequest {
                request_id: 50 + ttl_ms % 7,
                ttl_ms,
                open_key: Vec::new(),
            })
            .await;
        let status = status.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "ttl {ttl_ms}");
        assert!(status.message().contains("ttl"), "{}", status.message());
    }
    let request = AcquireRequest {
        wait_ms: u64::MAX,
        ..try_acquire(session, "w", 4)
    };
    assert_eq!(
        client.acquire(request).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    // An oversized request is refused before it is decoded.
    let huge = "y".repeat(palisade_proto::MESSAGE_BYTES_MAX + 1);
    let status = client
        .acquire(try_acquire(session, &huge, 5))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");

    // Garbage on the gRPC port: the connection is dropped, the server is unaffected.
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0xff; 4096][..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00",
    ] {
        let mut raw = std::net::TcpStream::connect(service.addr()).unwrap();
        let _ = raw.write_all(garbage);
    }

    // Thousands of sessions: all opened, all counted, nothing else disturbed.
    let mut opened = Vec::new();
    for chunk in 0..20u64 {
        let mut batch = Vec::new();
        for i in 0..150u64 {
            let mut client = client.clone();
            batch.push(tokio::spawn(async move {
                open(&mut client, 10_000 + chunk * 1_000 + i, 60_000).await
            }));
        }
        for task in batch {
            opened.push(task.await.unwrap());
        }
    }
    let mut ids: Vec<u64> = opened.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3_000, "every session got its own id");
    opened.sort_unstable();

    // Nothing acknowledged was lost, and the server still serves.
    let status = client
        .status(StatusRequest {
            lock: "precious".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.holder.map(|h| (h.session, h.token)),
        Some((session.id, held.token))
    );
    let next = client
        .acquire(try_acquire(opened[0], "after", 6))
        .await
        .unwrap()
        .into_inner();
    assert!(next.token > held.token);
    assert!(service.is_running(), "still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_and_sigterm_shuts_down_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data")).with_metrics();
    service.start();
    let metrics_port = service.metrics_addr().port();
    let mut client = locks_client(&service.endpoint()).await;
    let session = open(&mut client, 1, 60_000).await;
    let token = client
        .acquire(try_acquire(session, "m", 1))
        .await
        .unwrap()
        .into_inner()
        .token;

    // Phase 1: /metrics in the Prometheus text format, counting what just happened.
    let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        "palisade_grants_total",
        "palisade_sessions",
        "palisade_request_duration_seconds_bucket",
        "palisade_log_commit_duration_seconds_bucket",
    ] {
        assert!(text.contains(series), "/metrics lacks {series}:\n{text}");
    }
    let grants = text
        .lines()
        .find(|l| l.starts_with("palisade_grants_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap();
    assert!(grants >= 1.0, "grants counted: {grants}");

    // Phase 2: long-lived calls are open: a keepalive stream, a watch, an acquire waiting in
    // line. SIGTERM still stops the server, with status 0, instead of waiting for their clients.
    let (pings, ping_source) = tokio::sync::mpsc::channel(4);
    pings
        .send(KeepAliveRequest {
            session: session.id,
            session_secret: session.secret.to_vec(),
        })
        .await
        .unwrap();
    let mut keepalive = client
        .keep_alive(tokio_stream::wrappers::ReceiverStream::new(ping_source))
        .await
        .unwrap()
        .into_inner();
    keepalive
        .message()
        .await
        .unwrap()
        .expect("a keepalive answer");
    let mut watch = client
        .watch(WatchRequest { lock: "m".into() })
        .await
        .unwrap()
        .into_inner();
    watch
        .message()
        .await
        .unwrap()
        .expect("the watch's first event");
    let waiter = open(&mut client, 2, 60_000).await;
    let waiting = tokio::spawn({
        let mut client = client.clone();
        async move {
            let request = waiting_acquire(waiter, "m", 1);
            client.acquire(request).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = tokio::task::spawn_blocking(move || {
        let status = service.terminate();
        (service, status)
    });
    let (mut service, status) = tokio::time::timeout(Duration::from_secs(60), status)
        .await
        .expect("the server exits after SIGTERM despite open streams")
        .unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap_err().code(),
        Code::Unknown,
        "the waiter, whose wait stays in the table, is told its outcome is unknown: retry with \
         the same request id"
    );
    drop((pings, keepalive, watch));
    assert!(
        status.success(),
        "exit after SIGTERM: {status:?}\n{}",
        service.log()
    );
    assert!(service.log().contains("shutting down"), "{}", service.log());
    service.start();
    let mut client = locks_client(&service.endpoint()).await;
    let status = client
        .status(StatusRequest {
            lock: "m".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.holder.map(|h| h.token), Some(token));
}
