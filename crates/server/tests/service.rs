//! The lock service over real gRPC on loopback, in-process: grants, queues, restarts.

use std::time::Duration;

use palisade_core::{CoreError, SessionId, Token};
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_server::ServerConfig;
use palisade_server::limits::{LIST_PAGE_LOCKS_MAX, LOCK_NAME_BYTES_MAX};
use palisade_testkit::{LockServer, locks_client};
use tonic::transport::Channel;

/// A session as its opener holds it: its id, and the secret every call for it presents.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    id: u64,
    secret: Vec<u8>,
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
        secret: opened.session_secret,
    }
}

fn acquire(session: &Session, lock: &str, request_id: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        session: session.id,
        lock: lock.into(),
        request_id,
        wait_ms,
        wait_forever: false,
        session_secret: session.secret.clone(),
        value: String::new(),
        permits: 0,
        shared: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_across_release_queue_handoff_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut tokens = Vec::new();

    // Phase 1: a holder, a queued waiter, and a handoff on release.
    let running = LockServer::start(dir.path()).await;
    let client = locks_client(&running.endpoint()).await;
    let mut a = client.clone();
    let mut b = client.clone();
    let session_a = open(&mut a, 1, 30_000).await;
    let session_b = open(&mut b, 2, 30_000).await;
    let first = a
        .acquire(acquire(&session_a, "jobs/nightly", 10, 0))
        .await
        .unwrap()
        .into_inner();
    tokens.push(first.token);
    assert!(
        first.sequencer.starts_with("pal2."),
        "sequencer {:?}",
        first.sequencer
    );

    let busy = b
        .acquire(acquire(&session_b, "jobs/nightly", 20, 0))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), tonic::Code::FailedPrecondition, "{busy:?}");
    assert_eq!(
        palisade_proto::error::core_from_status(&busy),
        Some(CoreError::Busy {
            lock: "jobs/nightly".into(),
            holder_session: Some(SessionId::new(session_a.id)),
            holder_token: Some(Token::new(first.token)),
            available_at_ms: None,
        }),
        "the details name the holder and its token: {busy:?}"
    );

    // A live session that does not hold the lock cannot release it; a session that does not
    // exist is told so, not that it is not the holder.
    let bystander = open(&mut b, 3, 30_000).await;
    let release = |session: &Session| ReleaseRequest {
        session: session.id,
        lock: "jobs/nightly".into(),
        request_id: 5,
        session_secret: session.secret.clone(),
    };
    let not_holder = b.release(release(&bystander)).await.unwrap_err();
    assert_eq!(
        not_holder.code(),
        tonic::Code::PermissionDenied,
        "{not_holder:?}"
    );
    assert_eq!(
        palisade_proto::error::core_from_status(&not_holder),
        Some(CoreError::NotHolder {
            lock: "jobs/nightly".into(),
            session: SessionId::new(bystander.id),
            holder_session: Some(SessionId::new(session_a.id)),
        })
    );
    let no_session = session_a.id.max(session_b.id).max(bystander.id) + 100;
    let not_found = b
        .release(release(&Session {
            id: no_session,
            secret: Vec::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(not_found.code(), tonic::Code::NotFound, "{not_found:?}");
    assert_eq!(
        palisade_proto::error::core_from_status(&not_found),
        Some(CoreError::SessionNotFound {
            session: SessionId::new(no_session)
        })
    );

    let waiting = tokio::spawn({
        let mut b = b.clone();
        let session_b = session_b.clone();
        async move {
            b.acquire(acquire(&session_b, "jobs/nightly", 21, 10_000))
                .await
        }
    });
    // Lets the waiter queue before the release below. A sleep, because the server's clock is
    // the real one; ordering this without one needs a clock the test controls.
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.release(ReleaseRequest {
        session: session_a.id,
        lock: "jobs/nightly".into(),
        request_id: 11,
        session_secret: session_a.secret.clone(),
    })
    .await
    .unwrap();
    let handed_over = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(handed_over.session, session_b.id);
    tokens.push(handed_over.token);

    let status = a
        .status(StatusRequest {
            lock: "jobs/nightly".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.holder.map(|h| (h.session, h.token)),
        Some((session_b.id, handed_over.token))
    );
    running.stop().await;

    // Phase 2: after a restart the holder is still there, and new grants keep growing.
    let running = LockServer::start(dir.path()).await;
    let mut c = locks_client(&running.endpoint()).await;
    let status = c
        .status(StatusRequest {
            lock: "jobs/nightly".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.holder.map(|h| h.token),
        Some(handed_over.token),
        "grant survives restart"
    );
    let session_c = open(&mut c, 3, 30_000).await;
    let other = c
        .acquire(acquire(&session_c, "jobs/other", 30, 0))
        .await
        .unwrap()
        .into_inner();
    tokens.push(other.token);
    c.close_session(CloseSessionRequest {
        session: session_b.id,
        session_secret: session_b.secret.clone(),
    })
    .await
    .unwrap();
    let again = c
        .acquire(acquire(&session_c, "jobs/nightly", 31, 0))
        .await
        .unwrap()
        .into_inner();
    tokens.push(again.token);
    running.stop().await;

    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_another_lock_delay_replays_the_log_under_the_limits_it_was_written_with() {
    let dir = tempfile::tempdir().unwrap();

    // Phase 1, no lock-delay: a holder expires, the first waiter is granted at once, releases,
    // and the second waiter is granted.
    let running = LockServer::start(dir.path()).await;
    let mut client = locks_client(&running.endpoint()).await;
    let silent = open(&mut client, 1, 1_000).await;
    let second = open(&mut client, 2, 60_000).await;
    let third = open(&mut client, 3, 60_000).await;
    client.acquire(acquire(&silent, "l", 1, 0)).await.unwrap();
    let forever = |session: &Session| AcquireRequest {
        session: session.id,
        lock: "l".into(),
        request_id: 2,
        wait_ms: 0,
        wait_forever: true,
        session_secret: session.secret.clone(),
        value: String::new(),
        permits: 0,
        shared: false,
    };
    let mut waiter = client.clone();
    let request = forever(&second);
    let second_granted = tokio::spawn(async move { waiter.acquire(request).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut waiter = client.clone();
    let request = forever(&third);
    let third_granted = tokio::spawn(async move { waiter.acquire(request).await });
    second_granted.await.unwrap().unwrap();
    client
        .release(ReleaseRequest {
            session: second.id,
            lock: "l".into(),
            request_id: 3,
            session_secret: second.secret.clone(),
        })
        .await
        .unwrap();
    let token = third_granted.await.unwrap().unwrap().into_inner().token;
    running.stop().await;

    // Phase 2: restarted with a lock-delay, the replayed history is the same history.
    let running = LockServer::start_with(&ServerConfig {
        lock_delay: Duration::from_secs(5),
        ..LockServer::config(dir.path())
    })
    .await;
    let mut client = locks_client(&running.endpoint()).await;
    let status = client
        .status(StatusRequest {
            lock: "l".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.holder.map(|h| (h.session, h.token)),
        Some((third.id, token)),
        "the log replayed under other limits gave another outcome"
    );
    let next = client
        .acquire(acquire(&second, "other", 4, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(next.token > token);
    running.stop().await;
}

/// The lease driver sleeps until the earliest deadline it knows. A session with a shorter lease
/// opened while it sleeps must still expire on time, not when the driver's earlier alarm rings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_lease_opened_while_the_driver_sleeps_expires_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let running = LockServer::start(dir.path()).await;
    let client = &mut locks_client(&running.endpoint()).await;
    let _long = open(client, 1, 600_000).await;
    // Let the driver arm its alarm for the long lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let short = open(client, 2, 1_000).await;
    client
        .acquire(acquire(&short, "held-briefly", 3, 0))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let info = client
            .status(StatusRequest {
                lock: "held-briefly".into(),
                stale: false,
            })
            .await
            .unwrap()
            .into_inner();
        if info.holder.is_none() {
            break;
        }
        // Far beyond the 1 s lease, far short of the long session's 600 s.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the 1 s session still holds the lock after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await;
}

/// A full page of locks whose names are as long as allowed must fit in one response, and the
/// listing must carry on to the next page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_page_of_the_longest_lock_names_is_listed_and_paginates() {
    let dir = tempfile::tempdir().unwrap();
    let running = LockServer::start(dir.path()).await;
    let client = &mut locks_client(&running.endpoint()).await;
    let session = open(client, 1, 60_000).await;
    let names: Vec<String> = (0..=LIST_PAGE_LOCKS_MAX)
        .map(|i| format!("{i:06}{}", "n".repeat(LOCK_NAME_BYTES_MAX - 6)))
        .collect();
    for (i, name) in names.iter().enumerate() {
        client
            .acquire(acquire(&session, name, i as u64 + 10, 0))
            .await
            .unwrap();
    }

    let list = |start_after: String| ListLocksRequest {
        prefix: String::new(),
        start_after,
        limit: 0,
        stale: false,
    };
    let first = client
        .list_locks(list(String::new()))
        .await
        .expect("a full page of the longest names fits in one message")
        .into_inner();
    assert_eq!(first.locks.len(), LIST_PAGE_LOCKS_MAX);
    assert_eq!(first.next_start_after, names[LIST_PAGE_LOCKS_MAX - 1]);
    let rest = client
        .list_locks(list(first.next_start_after))
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<String> = first
        .locks
        .into_iter()
        .chain(rest.locks)
        .map(|info| info.lock)
        .collect();
    assert_eq!(listed, names);
    assert!(rest.next_start_after.is_empty());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_hears_each_handoff_with_the_queue_left_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let running = LockServer::start(dir.path()).await;
    let client = locks_client(&running.endpoint()).await;

    // Phase 1: A holds the lock, B and C queue behind it in that order.
    let mut a = client.clone();
    let holder = open(&mut a, 1, 30_000).await;
    a.acquire(acquire(&holder, "jobs/queue", 10, 0))
        .await
        .unwrap();
    let mut queued = Vec::new();
    for (n, request_id) in [(2u64, 20u64), (3, 30)] {
        let mut c = client.clone();
        let session = open(&mut c, n, 30_000).await;
        let waiting = tokio::spawn(async move {
            c.acquire(acquire(&session, "jobs/queue", request_id, 60_000))
                .await
                .map(|granted| (session, granted.into_inner().token))
        });
        queued.push(waiting);
        let mut status = client.clone();
        for attempt in 0.. {
            let info = status
                .status(StatusRequest {
                    lock: "jobs/queue".into(),
                    stale: false,
                })
                .await
                .unwrap()
                .into_inner();
            if info.waiters.len() as u64 == n - 1 {
                break;
            }
            assert!(attempt < 3_000, "waiter {n} never queued: {info:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    // Phase 2: a watcher starts with the lock's state, then hears the release and the handoff,
    // each with the one session still waiting.
    let mut watcher = client.clone();
    let mut events = watcher
        .watch(WatchRequest {
            lock: "jobs/queue".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = events.message().await.unwrap().unwrap();
    assert_eq!(first.kind(), watch_event::Kind::Snapshot);
    assert_eq!((first.session, first.waiters), (holder.id, 2));
    a.release(ReleaseRequest {
        session: holder.id,
        lock: "jobs/queue".into(),
        request_id: 11,
        session_secret: holder.secret.clone(),
    })
    .await
    .unwrap();
    let released = events.message().await.unwrap().unwrap();
    assert_eq!(released.kind(), watch_event::Kind::Released);
    assert_eq!((released.session, released.waiters), (holder.id, 1));
    let granted = events.message().await.unwrap().unwrap();
    let (next, token) = queued.remove(0).await.unwrap().unwrap();
    assert_eq!(granted.kind(), watch_event::Kind::Granted);
    assert_eq!(
        (granted.session, granted.token, granted.waiters),
        (next.id, token, 1)
    );
}

/// The frames of a log file: (start, end) of each, header included, up to the first empty one.
fn log_frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 8 + len > bytes.len() {
            break;
        }
        frames.push((at, at + 8 + len));
        at += 8 + len;
    }
    frames
}

/// H6: the last frame of the log rots after it was synced and its grant reached a resource.
/// On replay it looks exactly like a torn write and is cut, so the grant is forgotten: the node
/// must still never hand that token, or a lower one, to anyone again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_cut_off_with_a_rotten_last_frame_is_never_granted_again() {
    let dir = tempfile::tempdir().unwrap();
    let running = LockServer::start(dir.path()).await;
    let mut client = locks_client(&running.endpoint()).await;
    let session = open(&mut client, 1, 30_000).await;
    let seen = client
        .acquire(acquire(&session, "rot/a", 10, 0))
        .await
        .unwrap()
        .into_inner()
        .token;
    running.stop().await;

    // The grant's entry is in the last frame naming the lock: it becomes the log's last frame
    // (as if the node had stopped right after syncing it) and one byte of it flips.
    let path = dir.path().join("raft.wal");
    let mut bytes = std::fs::read(&path).unwrap();
    let (start, end) = log_frames(&bytes)
        .into_iter()
        .rfind(|&(start, end)| String::from_utf8_lossy(&bytes[start + 8..end]).contains("rot/a"))
        .expect("a frame holds the acquire");
    bytes[end..].fill(0);
    bytes[(start + end) / 2] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    let running = LockServer::start(dir.path()).await;
    let mut client = locks_client(&running.endpoint()).await;
    let session = open(&mut client, 2, 30_000).await;
    let next = client
        .acquire(acquire(&session, "rot/a", 20, 5_000))
        .await
        .unwrap()
        .into_inner()
        .token;
    running.stop().await;
    assert!(
        !dir.path().join("token-floor-pending").exists(),
        "the floor kept for the cut is forgotten once applied"
    );
    assert!(
        next > seen,
        "token {seen} reached a resource before the log's last frame rotted; the next grant \
         got {next}, which that resource refuses or, if equal, accepts for a second holder"
    );
}

/// A grant's value over the wire, as a client written from the `.proto` meets it: carried by
/// the acquire, shown by Status, ListLocks and Watch, replaced only by the holding's own
/// Proclaim, refused (before anything is proposed) when it is too long or holds a control
/// character, and kept across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grants_value_is_shown_replaced_only_by_its_holder_and_checked_on_the_wire() {
    use palisade_core::limits::{GRANT_VALUE_BYTES_MAX, GrantValueError};
    let dir = tempfile::tempdir().unwrap();
    let running = LockServer::start(dir.path()).await;
    let mut client = locks_client(&running.endpoint()).await;
    let leader = open(&mut client, 1, 30_000).await;
    let other = open(&mut client, 2, 30_000).await;
    let with_value = |session: &Session, value: &str, request_id| AcquireRequest {
        value: value.into(),
        ..acquire(session, "elections/db", request_id, 0)
    };

    for (bad, reason) in [
        ("v".repeat(GRANT_VALUE_BYTES_MAX + 1), "too_long"),
        ("ok\u{7}".to_string(), "control_character"),
    ] {
        let refused = client
            .acquire(with_value(&leader, &bad, 9))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        let Some(CoreError::InvalidValue(error)) =
            palisade_proto::error::core_from_status(&refused)
        else {
            panic!("not an invalid value: {refused:?}");
        };
        assert_eq!(error.code(), reason);
        if let GrantValueError::TooLong { bytes_max, .. } = error {
            assert_eq!(bytes_max, GRANT_VALUE_BYTES_MAX as u64);
        }
    }
    let status = |client: &mut LocksClient<Channel>| {
        let mut client = client.clone();
        async move {
            client
                .status(StatusRequest {
                    lock: "elections/db".into(),
                    stale: false,
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    assert!(
        status(&mut client).await.holder.is_none(),
        "a refused acquire took the lock"
    );

    let granted = client
        .acquire(with_value(&leader, "10.0.0.1:5432", 10))
        .await
        .unwrap()
        .into_inner();
    let mut watch = client
        .watch(WatchRequest {
            lock: "elections/db".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let snapshot = watch.message().await.unwrap().unwrap();
    assert_eq!(snapshot.value, "10.0.0.1:5432");
    assert_eq!(
        status(&mut client).await.holder.unwrap().value,
        "10.0.0.1:5432"
    );

    let proclaim = |session: &Session, token, value: &str| ProclaimRequest {
        session: session.id,
        lock: "elections/db".into(),
        token,
        value: value.into(),
        session_secret: session.secret.clone(),
    };
    // Another session, even naming the holding's token, is refused; so is a stale token.
    let refused = client
        .proclaim(proclaim(&other, granted.token, "10.0.0.2:5432"))
        .await
        .unwrap_err();
    assert!(matches!(
        palisade_proto::error::core_from_status(&refused),
        Some(CoreError::NotHolder { .. })
    ));
    let refused = client
        .proclaim(proclaim(&leader, granted.token - 1, "x"))
        .await
        .unwrap_err();
    assert!(matches!(
        palisade_proto::error::core_from_status(&refused),
        Some(CoreError::NotHolder { .. })
    ));
    // Nor is a session's id enough without its secret.
    let mut no_secret = proclaim(&leader, granted.token, "x");
    no_secret.session_secret.clear();
    let refused = client.proclaim(no_secret).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    client
        .proclaim(proclaim(&leader, granted.token, "10.0.0.1:6432"))
        .await
        .unwrap();
    let changed = watch.message().await.unwrap().unwrap();
    assert_eq!(changed.kind, watch_event::Kind::ValueSet as i32);
    assert_eq!(
        (changed.token, changed.value.as_str()),
        (granted.token, "10.0.0.1:6432")
    );
    let listed = client
        .list_locks(ListLocksRequest {
            prefix: "elections/".into(),
            ..ListLocksRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.locks[0].holder.as_ref().unwrap().value,
        "10.0.0.1:6432"
    );
    drop(watch);
    drop(client);

    running.stop().await;
    let restarted = LockServer::start(dir.path()).await;
    let mut client = locks_client(&restarted.endpoint()).await;
    let holder = status(&mut client).await.holder.unwrap();
    assert_eq!(
        (holder.token, holder.value.as_str()),
        (granted.token, "10.0.0.1:6432")
    );
}

/// A try-only acquire by a session that already waits for the lock (a client's retry of a
/// timed wait whose time ran out sends a wait of 0) is answered as busy, naming the holder: the
/// table answers "queued" for the wait the session already has, which the service used to
/// report as an internal error ("queued a try-only acquire"). Found by the simulation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_by_a_session_already_waiting_for_the_lock_is_busy_not_an_internal_error() {
    let dir = tempfile::tempdir().unwrap();
    let running = LockServer::start(dir.path()).await;
    let client = locks_client(&running.endpoint()).await;
    let mut holder_client = client.clone();
    let holder = open(&mut holder_client, 1, 30_000).await;
    let held = holder_client
        .acquire(acquire(&holder, "jobs/q", 10, 0))
        .await
        .unwrap()
        .into_inner();
    let mut waiter_client = client.clone();
    let waiter = open(&mut waiter_client, 2, 30_000).await;
    let waiting = {
        let mut client = waiter_client.clone();
        let request = acquire(&waiter, "jobs/q", 20, 20_000);
        tokio::spawn(async move { client.acquire(request).await })
    };
    // The wait is in the table once the lock's status lists it.
    let mut status_client = client.clone();
    for _ in 0..200 {
        let status = status_client
            .status(StatusRequest {
                lock: "jobs/q".into(),
                stale: false,
            })
            .await
            .unwrap()
            .into_inner();
        if !status.waiters.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for request_id in [20, 21] {
        let refused = waiter_client
            .acquire(acquire(&waiter, "jobs/q", request_id, 0))
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            matches!(
                palisade_proto::error::core_from_status(&refused),
                Some(CoreError::Busy { holder_token: Some(token), .. }) if token.get() == held.token
            ),
            "{refused:?}"
        );
    }
    // The wait itself goes on, and is granted when the holder lets go.
    holder_client
        .release(ReleaseRequest {
            session: holder.id,
            lock: "jobs/q".into(),
            request_id: 11,
            session_secret: holder.secret.clone(),
        })
        .await
        .unwrap();
    let granted = waiting.await.unwrap().unwrap().into_inner();
    assert!(granted.token > held.token);
}
