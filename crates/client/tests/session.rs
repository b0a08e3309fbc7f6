//! The client library against an in-process lock service on loopback: guards, loss of a
//! session, keepalive across a connection outage, cancellation, the one-shot calls and watches,
//! and several endpoints (a dead one skipped; calls, keepalives and watches moving to the next
//! endpoint when the current one goes away).
//!
//! Network trouble is made with a TCP proxy between client and server that can cut every
//! connection and refuse new ones. A server stops when its test ends: dropping the kit's
//! `LockServer` drops its stop sender, which begins the server's shutdown (long-lived calls such
//! as keepalive streams are ended at once), and the end of the test's runtime stops whatever is
//! left.

use std::net::SocketAddr;
use std::time::Duration;

use palisade_client::{
    AcquireError, AcquireOptions, Client, LockEventKind, ReleaseError, SessionLost, SessionOptions,
    Token, Wait,
};
use palisade_testkit::LockServer;
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy to the server whose connections can be cut.
struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cut_watch) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *cut_watch.borrow() {
                    continue; // Dropped: the client sees the connection close at once.
                }
                let mut cut_watch = cut_watch.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Proxy { addr, cut }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts every connection and refuses new ones (`true`), or lets them through again.
    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

fn ttl(secs: u64) -> SessionOptions {
    SessionOptions::with_ttl(Duration::from_secs(secs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_carries_the_grant_and_release_frees_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let session = client.open_session(ttl(10)).await.unwrap();

    let guard = session
        .acquire("jobs/a", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();

    assert_eq!(guard.lock(), "jobs/a");
    assert_eq!(guard.session_id(), session.id());
    assert!(guard.token() >= Token::FIRST);
    assert!(guard.sequencer().starts_with("pal2."));
    assert!(guard.ended().is_none());
    let status = client.status("jobs/a").await.unwrap();
    assert_eq!(status.holder.as_ref().unwrap().session, session.id());
    assert_eq!(status.holder.as_ref().unwrap().token, guard.token());

    guard.release().await.unwrap();
    assert!(client.status("jobs/a").await.unwrap().holder.is_none());
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_names_its_holder_and_a_short_wait_ends() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let holder = client.open_session(ttl(10)).await.unwrap();
    let guard = holder
        .acquire("jobs/b", AcquireOptions::default())
        .await
        .unwrap();
    let other = client.open_session(ttl(10)).await.unwrap();

    let busy = other
        .acquire("jobs/b", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap_err();
    assert_eq!(
        busy,
        AcquireError::Busy {
            lock: "jobs/b".into(),
            holder_session: Some(holder.id()),
            holder_token: Some(guard.token()),
            in_lock_delay: false,
        }
    );
    assert!(busy.is_retryable());

    let started = tokio::time::Instant::now();
    let ended = other
        .acquire(
            "jobs/b",
            AcquireOptions::wait(Wait::For(Duration::from_millis(300))),
        )
        .await
        .unwrap_err();
    assert_eq!(
        ended,
        AcquireError::WaitEnded {
            lock: "jobs/b".into()
        }
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_before_the_next_acquire_of_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let session = client.open_session(ttl(10)).await.unwrap();
    let first = session
        .acquire("jobs/c", AcquireOptions::default())
        .await
        .unwrap();
    let first_token = first.token();

    drop(first);
    // The background release runs before this acquire, so this is a new grant rather than the
    // old one about to be released under it.
    let second = session
        .acquire("jobs/c", AcquireOptions::default())
        .await
        .unwrap();

    assert!(second.token() > first_token);
    let status = client.status("jobs/c").await.unwrap();
    assert_eq!(status.holder.as_ref().unwrap().token, second.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_closed_elsewhere_is_lost_and_its_guards_hear_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let session = client.open_session(ttl(3)).await.unwrap();
    let guard = session
        .acquire("jobs/d", AcquireOptions::default())
        .await
        .unwrap();

    client.close_session(session.credential()).await.unwrap();

    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss is noticed within a keepalive interval or two");
    assert_eq!(reason, SessionLost::NotFound);
    assert_eq!(session.ended(), Some(SessionLost::NotFound));
    assert!(matches!(
        guard.release().await,
        Err(ReleaseError::SessionNotFound { .. })
    ));
    let refused = session.acquire("jobs/d", AcquireOptions::default()).await;
    assert!(matches!(refused, Err(AcquireError::SessionLost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_for_longer_than_the_ttl_loses_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let proxy = Proxy::start(server.addr).await;
    let client = Client::connect(&proxy.endpoint()).await.unwrap();
    let session = client.open_session(ttl(2)).await.unwrap();
    let guard = session
        .acquire("jobs/e", AcquireOptions::default())
        .await
        .unwrap();

    let cut_at = tokio::time::Instant::now();
    proxy.set_cut(true);

    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss is noticed once the lease cannot be proven");
    assert_eq!(reason, SessionLost::LeaseUnproven);
    // Not before the last proven lease ran out: at least ttl minus one keepalive interval.
    assert!(cut_at.elapsed() >= Duration::from_millis(1_300));
    assert!(session.lease_remaining().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_rides_out_a_connection_outage_shorter_than_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let proxy = Proxy::start(server.addr).await;
    let client = Client::connect(&proxy.endpoint()).await.unwrap();
    let session = client.open_session(ttl(4)).await.unwrap();
    let guard = session
        .acquire("jobs/f", AcquireOptions::default())
        .await
        .unwrap();

    proxy.set_cut(true);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    proxy.set_cut(false);
    // Two full ttls later the session is still alive, renewed over a new connection.
    tokio::time::sleep(Duration::from_secs(8)).await;

    assert!(guard.ended().is_none(), "{:?}", guard.ended());
    let status = client.status("jobs/f").await.unwrap();
    assert_eq!(status.holder.as_ref().unwrap().session, session.id());
    assert_eq!(status.holder.as_ref().unwrap().token, guard.token());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_withdraws_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let holder = client.open_session(ttl(10)).await.unwrap();
    let _guard = holder
        .acquire("jobs/g", AcquireOptions::default())
        .await
        .unwrap();
    let waiter = client.open_session(ttl(10)).await.unwrap();

    let cancelled = tokio::time::timeout(
        Duration::from_millis(500),
        waiter.acquire("jobs/g", AcquireOptions::wait(Wait::Forever)),
    )
    .await;
    assert!(cancelled.is_err(), "the acquire should still be waiting");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status = client.status("jobs/g").await.unwrap();
        if status.waiters.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_shot_calls_work_without_a_keepalive() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let lease = client
        .open_session_without_keepalive(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(lease.ttl, Duration::from_secs(5));

    let grant = client
        .acquire(lease.credential, "one/a", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    let remaining = client.renew(lease.credential).await.unwrap();
    assert!(remaining > Duration::from_secs(4) && remaining <= Duration::from_secs(5));
    let listed = client.list_locks("one/").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].holder.as_ref().unwrap().token, grant.token);

    let other = client
        .open_session_without_keepalive(Duration::from_secs(5))
        .await
        .unwrap();
    let refused = client.release(other.credential, "one/a").await.unwrap_err();
    assert_eq!(
        refused,
        ReleaseError::NotHolder {
            lock: "one/a".into(),
            session: other.session,
            holder_session: Some(lease.session),
        }
    );
    assert_eq!(
        client.release(lease.credential, "one/a").await.unwrap(),
        Some(grant.token)
    );
    assert!(client.public_key().await.unwrap().starts_with("ed25519:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_starts_with_a_snapshot_and_follows_grants_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let mut events = client.watch("w/a").await.unwrap();

    let snapshot = next_event(&mut events).await;
    assert_eq!(
        (snapshot.kind, snapshot.session),
        (LockEventKind::Snapshot, None)
    );
    let session = client.open_session(ttl(10)).await.unwrap();
    let guard = session
        .acquire("w/a", AcquireOptions::default())
        .await
        .unwrap();
    let granted = next_event(&mut events).await;
    assert_eq!(granted.kind, LockEventKind::Granted);
    assert_eq!(granted.session, Some(session.id()));
    assert_eq!(granted.token, Some(guard.token()));
    let token = guard.token();
    guard.release().await.unwrap();
    let released = next_event(&mut events).await;
    assert_eq!(released.kind, LockEventKind::Released);
    assert_eq!(released.token, Some(token));
}

async fn next_event(events: &mut palisade_client::LockEvents) -> palisade_client::LockEvent {
    tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event")
        .expect("the stream goes on")
        .expect("a valid event")
}

/// An address where nothing listens.
fn dead_endpoint() -> String {
    format!("http://127.0.0.1:{}", palisade_testkit::unused_port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_first_endpoint_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let dead = dead_endpoint();

    let list = format!("{dead},{}", server.endpoint());
    let client = Client::connect(&list).await.unwrap();
    assert_eq!(client.endpoint(), server.endpoint());
    assert_eq!(client.endpoints(), [dead.clone(), server.endpoint()]);
    let session = client.open_session(ttl(10)).await.unwrap();
    let guard = session
        .acquire("many/a", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    let status = client.status("many/a").await.unwrap();
    assert_eq!(status.holder.as_ref().unwrap().token, guard.token());
    guard.release().await.unwrap();
    session.close().await.unwrap();

    // The same as a slice.
    let client = Client::connect_many(
        &[dead.as_str(), server.endpoint().as_str()],
        palisade_client::ClientOptions::default(),
    )
    .await
    .unwrap();
    assert!(client.public_key().await.unwrap().starts_with("ed25519:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_keepalives_and_watches_move_to_the_next_endpoint_when_one_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let upstream: SocketAddr = server
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    // Two ways to the one server: when the first goes away, the second still leads there.
    let first = Proxy::start(upstream).await;
    let second = Proxy::start(upstream).await;
    let client = Client::connect(&format!("{},{}", first.endpoint(), second.endpoint()))
        .await
        .unwrap();
    assert_eq!(client.endpoint(), first.endpoint());

    let session = client
        .open_session(SessionOptions {
            ttl: Duration::from_secs(2),
            keepalive_interval: Some(Duration::from_millis(300)),
        })
        .await
        .unwrap();
    let guard = session
        .acquire("move/a", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    let mut events = client.watch("move/a").await.unwrap();
    let snapshot = next_event(&mut events).await;
    assert_eq!(
        (snapshot.kind, snapshot.session),
        (LockEventKind::Snapshot, Some(session.id()))
    );

    // The first endpoint goes away for good: open connections are cut, new ones refused.
    first.set_cut(true);

    // The keepalive moves on: after three lease lengths the session is still alive, and its
    // proven lease was renewed meanwhile (a lease can only be proven by an acknowledged ping).
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(session.ended(), None);
    assert!(
        session.lease_remaining().unwrap() > Duration::from_millis(500),
        "{:?}",
        session.lease_remaining()
    );
    assert_eq!(client.endpoint(), second.endpoint());
    let status = client.status("move/a").await.unwrap();
    assert_eq!(status.holder.as_ref().unwrap().token, guard.token());

    // The watch reopened at the second endpoint: the release shows, as a release or as a
    // snapshot of a free lock taken after it.
    guard.release().await.unwrap();
    loop {
        let event = next_event(&mut events).await;
        match event.kind {
            LockEventKind::Released => break,
            LockEventKind::Snapshot if event.session.is_none() => break,
            LockEventKind::Snapshot => {} // Taken before the release: the release follows.
            other => panic!("unexpected {other:?}: {event:?}"),
        }
    }
    session.close().await.unwrap();
}

/// The lease accounting runs on the client's clock: with the server out of reach, the session is
/// lost exactly when its proven lease ends on that clock, and not a moment before, however
/// little real time has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_off_is_lost_exactly_when_its_proven_lease_ends_on_the_clients_clock() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let proxy = Proxy::start(server.addr).await;
    let clock = palisade_clock::ManualClock::new();
    let client = Client::connect(&proxy.endpoint())
        .await
        .unwrap()
        .with_clock(clock.shared());
    let session = client.open_session(ttl(3)).await.unwrap();
    // The clock stands still: the proven lease is the whole TTL less the client's margins.
    let proven = session.lease_remaining().expect("alive");
    assert!(
        proven > Duration::from_millis(2_900) && proven <= Duration::from_secs(3),
        "{proven:?}"
    );

    proxy.set_cut(true);
    clock.advance(proven - Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(session.ended(), None, "lost before its proven lease ended");
    assert_eq!(session.lease_remaining(), Some(Duration::from_millis(1)));

    clock.advance(Duration::from_millis(2));
    let lost = tokio::time::timeout(Duration::from_secs(1), session.lost())
        .await
        .expect("lost once the proven lease ended on the client's clock");
    assert_eq!(lost, SessionLost::LeaseUnproven);
}

/// A process with more sessions than the server allows keepalive streams on one connection (all
/// of a `Client`'s sessions share its connection): the sessions whose stream is refused are
/// renewed by `Renew` instead, and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_refused_a_keepalive_stream_are_renewed_by_renew_and_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    // A lease long enough to outlast opening them all on a slow machine.
    let ttl = Duration::from_secs(30);
    let sessions_max = palisade_server::limits::LONG_LIVED_CALLS_PER_CONNECTION_MAX + 1;
    let mut opening = Vec::new();
    for _ in 0..sessions_max {
        let client = client.clone();
        opening.push(tokio::spawn(async move {
            client.open_session(SessionOptions::with_ttl(ttl)).await
        }));
    }
    let mut sessions = Vec::new();
    for task in opening {
        sessions.push(task.await.unwrap().unwrap());
    }

    // Past a whole lease after the last open: a session that could not renew is lost by then.
    tokio::time::sleep(ttl + Duration::from_secs(5)).await;
    let lost: Vec<_> = sessions
        .iter()
        .filter_map(|s| s.ended().map(|reason| (s.id(), reason)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} sessions lost, the first: {:?}",
        lost.len(),
        sessions.len(),
        &lost[..lost.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_hands_its_lock_to_itself_and_then_to_the_next_lock_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let session = client.open_session(ttl(10)).await.unwrap();
    let first = session
        .acquire("handoff/a", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    let first_token = first.token();

    // To itself: a new grant of the same lock, with a higher token and its own sequencer.
    let again = first
        .release_then_acquire("handoff/a", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    assert_eq!(again.lock(), "handoff/a");
    assert!(again.token() > first_token);
    let holder = client.status("handoff/a").await.unwrap().holder.unwrap();
    assert_eq!(
        (holder.session, holder.token),
        (session.id(), again.token())
    );

    // To the next lock: the first is free, the second held.
    let next = again
        .release_then_acquire("handoff/b", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    assert_eq!(next.lock(), "handoff/b");
    assert!(client.status("handoff/a").await.unwrap().holder.is_none());
    let holder = client.status("handoff/b").await.unwrap().holder.unwrap();
    assert_eq!((holder.session, holder.token), (session.id(), next.token()));
    next.release().await.unwrap();
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_to_itself_lets_a_waiter_go_first() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let session = client.open_session(ttl(10)).await.unwrap();
    let other = client.open_session(ttl(10)).await.unwrap();
    let held = session
        .acquire("handoff/q", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    let token = held.token();
    let waiter = tokio::spawn(async move {
        let guard = other
            .acquire("handoff/q", AcquireOptions::wait(Wait::Forever))
            .await
            .unwrap();
        (other, guard)
    });
    while client.status("handoff/q").await.unwrap().waiters.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let wait = Wait::For(Duration::from_secs(10));
    let mine = tokio::spawn(async move {
        held.release_then_acquire("handoff/q", AcquireOptions::wait(wait))
            .await
    });
    let (other, theirs) = waiter.await.unwrap();
    assert_eq!(theirs.token(), Token::new(token.get() + 1));
    let status = client.status("handoff/q").await.unwrap();
    assert_eq!(status.holder.unwrap().session, other.id());
    assert_eq!(status.waiters.len(), 1, "the handoff waits behind it");
    assert!(!mine.is_finished());

    theirs.release().await.unwrap();
    let mine = mine.await.unwrap().unwrap();
    assert_eq!(mine.token(), Token::new(token.get() + 2));
    assert_eq!(mine.session_id(), session.id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_refused_by_its_release_takes_nothing_and_a_busy_one_keeps_its_release() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let mine = client
        .open_session_without_keepalive(Duration::from_secs(10))
        .await
        .unwrap();
    let theirs = client
        .open_session_without_keepalive(Duration::from_secs(10))
        .await
        .unwrap();
    let try_now = || AcquireOptions::wait(Wait::Try);

    // Releasing a lock another session holds: refused, and the acquire is not tried.
    let held = client
        .acquire(theirs.credential, "handoff/x", try_now())
        .await
        .unwrap();
    let refused = client
        .release_then_acquire(mine.credential, "handoff/x", "handoff/y", try_now())
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            AcquireError::Refused(palisade_core::CoreError::NotHolder { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(
        client
            .status("handoff/x")
            .await
            .unwrap()
            .holder
            .unwrap()
            .token,
        held.token
    );
    assert!(client.status("handoff/y").await.unwrap().holder.is_none());

    // A try of a held lock after a release that stands: busy, and the released lock is free.
    client
        .acquire(mine.credential, "handoff/z", try_now())
        .await
        .unwrap();
    let busy = client
        .release_then_acquire(mine.credential, "handoff/z", "handoff/x", try_now())
        .await
        .unwrap_err();
    assert!(matches!(busy, AcquireError::Busy { .. }), "{busy:?}");
    assert!(client.status("handoff/z").await.unwrap().holder.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_handoff_answers_its_first_grant_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let lease = client
        .open_session_without_keepalive(Duration::from_secs(10))
        .await
        .unwrap();
    let try_now = || AcquireOptions::wait(Wait::Try);
    let first = client
        .acquire(lease.credential, "handoff/r", try_now())
        .await
        .unwrap();
    let ids = (palisade_client::request_id(), palisade_client::request_id());
    let handoff = || {
        client.release_then_acquire_with_ids(
            lease.credential,
            ("handoff/r", ids.0),
            "handoff/r",
            try_now(),
            ids.1,
        )
    };
    let (released, grant) = handoff().await.unwrap();
    assert_eq!(released, Some(first.token));
    // The same two ids again, as after a lost answer: the same grant, still held.
    let (released_again, retried) = handoff().await.unwrap();
    assert_eq!((released_again, retried.token), (released, grant.token));
    assert_eq!(
        client
            .status("handoff/r")
            .await
            .unwrap()
            .holder
            .unwrap()
            .token,
        grant.token
    );
}

/// A guard's handoff with the caller's ids can be retried through the client after an unknown
/// outcome: the retry is answered with the guard's grant, which stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guards_handoff_with_ids_is_answered_again_by_the_same_ids() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let session = client.open_session(ttl(10)).await.unwrap();
    let try_now = || AcquireOptions::wait(Wait::Try);
    let first = session.acquire("handoff/g", try_now()).await.unwrap();
    let first_token = first.token();
    let ids = (palisade_client::request_id(), palisade_client::request_id());
    let next = first
        .release_then_acquire_with_ids("handoff/h", try_now(), ids)
        .await
        .unwrap();
    assert_ne!(next.token(), first_token);
    // As after a lost answer: the same call with the same ids, through the client.
    let (released, retried) = client
        .release_then_acquire_with_ids(
            session.credential(),
            ("handoff/g", ids.0),
            "handoff/h",
            try_now(),
            ids.1,
        )
        .await
        .unwrap();
    assert_eq!((released, retried.token), (Some(first_token), next.token()));
    let holder = client.status("handoff/h").await.unwrap().holder.unwrap();
    assert_eq!(holder.token, next.token());
    assert!(client.status("handoff/g").await.unwrap().holder.is_none());
    next.release().await.unwrap();
}
