//! Multi-locks (`AcquireAll`) against a real `palisade serve`: several locks granted at once or
//! not at all, each with its own token and sequencer and each released on its own, through the
//! Rust client, raw gRPC (the refusals' kinds, a retry) and `palisade lock A B -- CMD` (two
//! commands taking the same locks in opposite orders neither deadlock nor overlap).

use std::process::Stdio;
use std::time::Duration;

use palisade_client::{
    Access, AcquireError, BearerToken, Client, ClientOptions, LockPart, SessionOptions, Wait,
};
use palisade_core::limits::LockNameError;
use palisade_core::{CoreError, Right, SessionId};
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_testkit::{AuthFiles, Palisade, Running, ServerProcess};
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const TTL: Duration = Duration::from_secs(30);
/// A bound against a hung test, not a timing assertion.
const WAIT: Duration = Duration::from_secs(30);

/// Polls `done` every 25 ms until it holds, for at most [`WAIT`].
async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_grants_every_lock_its_own_sequencer_and_each_is_released_alone() {
    let server = Palisade::start(BIN);
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let keys = client.public_keys().await.unwrap();
    let alice = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let bob = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();

    // Three locks in three modes, at once: each has its own grant, in the order named.
    let parts = [
        LockPart::from("orders"),
        LockPart::shared("catalog"),
        LockPart::permit("workers", 2),
    ];
    let guards = alice.acquire_all(&parts, Wait::Try).await.unwrap();
    let names: Vec<&str> = guards.iter().map(|g| g.lock()).collect();
    assert_eq!(names, ["orders", "catalog", "workers"]);
    let access: Vec<Access> = guards.iter().map(|g| g.access()).collect();
    assert_eq!(access, [Access::Exclusive, Access::Shared, Access::Slot(0)]);
    for guard in &guards {
        let verified = keys.verify(guard.sequencer()).unwrap();
        assert_eq!(verified.lock(), guard.lock());
        assert_eq!(verified.token(), guard.token());
        assert_eq!(verified.session(), alice.id());
        assert_eq!(verified.access(), guard.access());
    }
    let mut tokens: Vec<u64> = guards.iter().map(|g| g.token().get()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "every lock has a token of its own");
    let orders = client.status("orders").await.unwrap();
    assert_eq!(orders.holder.as_ref().map(|h| h.session), Some(alice.id()));

    // All or none: a try of {ledger, orders} finds orders busy and leaves ledger free.
    let busy = bob
        .acquire_all(&["ledger".into(), "orders".into()], Wait::Try)
        .await
        .unwrap_err();
    assert!(
        matches!(&busy, AcquireError::Busy { lock, .. } if lock == "orders"),
        "{busy}"
    );
    assert!(client.status("ledger").await.unwrap().holder.is_none());

    // A wait for {ledger, orders} holds neither while it waits...
    let waiting = tokio::spawn(async move {
        let guards = bob
            .acquire_all(&["ledger".into(), "orders".into()], Wait::For(WAIT))
            .await;
        (bob, guards)
    });
    eventually("the multi-lock to wait in the ledger's queue", || async {
        !client.status("ledger").await.unwrap().waiters.is_empty()
    })
    .await;
    let ledger = client.status("ledger").await.unwrap();
    assert!(ledger.holder.is_none(), "{ledger:?}");
    assert_eq!(client.status("orders").await.unwrap().waiters.len(), 1);

    // ...and releasing one lock of alice's multi-grant releases that lock alone: the waiter
    // gets both of its locks at once, alice keeps the other two.
    let mut guards = guards.into_iter();
    let (orders, catalog, workers) = (
        guards.next().unwrap(),
        guards.next().unwrap(),
        guards.next().unwrap(),
    );
    let orders_token = orders.token();
    orders.release().await.unwrap();
    let (bob, granted) = waiting.await.unwrap();
    let granted = granted.unwrap();
    assert_eq!(
        granted.iter().map(|g| g.lock()).collect::<Vec<_>>(),
        ["ledger", "orders"]
    );
    assert!(granted[1].token() > orders_token);
    assert_ne!(granted[0].token(), granted[1].token());
    for guard in &granted {
        let verified = keys.verify(guard.sequencer()).unwrap();
        assert_eq!(
            (verified.lock(), verified.session()),
            (guard.lock(), bob.id())
        );
    }
    let catalog_status = client.status("catalog").await.unwrap();
    assert_eq!(
        catalog_status
            .sharers
            .iter()
            .map(|h| (h.session, h.token))
            .collect::<Vec<_>>(),
        [(alice.id(), catalog.token())]
    );
    let workers_status = client.status("workers").await.unwrap();
    assert_eq!(
        workers_status
            .sharers
            .iter()
            .map(|h| (h.session, h.token))
            .collect::<Vec<_>>(),
        [(alice.id(), workers.token())]
    );

    // A name given twice is refused by the client's own call too, as invalid.
    let repeated = alice
        .acquire_all(&["twice".into(), "twice".into()], Wait::Try)
        .await
        .unwrap_err();
    assert!(
        matches!(&repeated, AcquireError::InvalidArgument(m) if m.contains("\"twice\" twice")),
        "{repeated}"
    );
    drop((catalog, workers, granted));
    alice.close().await.unwrap();
    bob.close().await.unwrap();
}

/// A session as raw gRPC holds it.
struct RawSession {
    id: u64,
    secret: Vec<u8>,
}

async fn open_raw(client: &mut LocksClient<Channel>) -> RawSession {
    let opened = client
        .open_session(OpenSessionRequest {
            request_id: 0,
            ttl_ms: 30_000,
            open_key: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    RawSession {
        id: opened.session,
        secret: opened.session_secret,
    }
}

fn acquire_all(session: &RawSession, request_id: u64, locks: &[&str]) -> AcquireAllRequest {
    AcquireAllRequest {
        session: session.id,
        request_id,
        wait_ms: 0,
        wait_forever: false,
        session_secret: session.secret.clone(),
        parts: locks
            .iter()
            .map(|lock| AcquirePart {
                lock: lock.to_string(),
                shared: false,
                permits: 0,
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_refusals_carry_their_kinds_and_a_retry_returns_the_same_grants() {
    let server = Palisade::start(BIN);
    let mut raw = palisade_testkit::locks_client(&server.endpoint()).await;
    let session = open_raw(&mut raw).await;
    let refused = |status: tonic::Status| {
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        palisade_proto::error::core_from_status(&status)
    };

    let none = raw.acquire_all(acquire_all(&session, 1, &[])).await;
    assert_eq!(
        refused(none.unwrap_err()),
        Some(CoreError::MultiLockSize {
            locks: 0,
            locks_max: 32
        })
    );
    let names: Vec<String> = (0..33).map(|n| format!("many/{n}")).collect();
    let many: Vec<&str> = names.iter().map(String::as_str).collect();
    let too_many = raw.acquire_all(acquire_all(&session, 2, &many)).await;
    assert_eq!(
        refused(too_many.unwrap_err()),
        Some(CoreError::MultiLockSize {
            locks: 33,
            locks_max: 32
        })
    );
    let twice = raw
        .acquire_all(acquire_all(&session, 3, &["a", "b", "a"]))
        .await;
    assert_eq!(
        refused(twice.unwrap_err()),
        Some(CoreError::MultiLockRepeated { lock: "a".into() })
    );
    let empty_name = raw.acquire_all(acquire_all(&session, 4, &["a", ""])).await;
    assert_eq!(
        refused(empty_name.unwrap_err()),
        Some(CoreError::InvalidLockName(LockNameError::Empty))
    );
    let mut both = acquire_all(&session, 5, &["a"]);
    both.parts[0].shared = true;
    both.parts[0].permits = 2;
    let both = raw.acquire_all(both).await.unwrap_err();
    assert_eq!(both.code(), Code::InvalidArgument, "{both:?}");
    // Nothing refused above was taken.
    let a = raw
        .status(StatusRequest {
            lock: "a".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(a.holder.is_none() && a.last_token == 0, "{a:?}");

    // A lock the session holds already cannot be part of its multi-lock.
    raw.acquire(AcquireRequest {
        session: session.id,
        lock: "held".into(),
        request_id: 6,
        wait_ms: 0,
        wait_forever: false,
        session_secret: session.secret.clone(),
        value: String::new(),
        shared: false,
        permits: 0,
    })
    .await
    .unwrap();
    let held = raw
        .acquire_all(acquire_all(&session, 7, &["free", "held"]))
        .await;
    assert_eq!(
        refused(held.unwrap_err()),
        Some(CoreError::MultiLockHeld {
            lock: "held".into(),
            session: SessionId::new(session.id)
        })
    );

    // A retry with the same request id is answered with the same grants, not new ones.
    let first = raw
        .acquire_all(acquire_all(&session, 8, &["r/1", "r/2"]))
        .await
        .unwrap()
        .into_inner();
    let again = raw
        .acquire_all(acquire_all(&session, 8, &["r/1", "r/2"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first, again);
    assert_eq!(first.grants.len(), 2);
    assert_eq!(first.session, session.id);
    for (grant, lock) in first.grants.iter().zip(["r/1", "r/2"]) {
        assert_eq!((grant.lock.as_str(), grant.session), (lock, session.id));
        assert!(grant.sequencer.starts_with("pal2."), "{grant:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_outside_the_callers_scope_refuses_the_whole_multi_lock() {
    let dir = tempfile::tempdir().unwrap();
    let files = AuthFiles::write(BIN, dir.path(), &["alice"], "grant alice lock,read jobs/\n");
    let mut server = ServerProcess::lock_service(BIN, dir.path().join("data")).with_auth(&files);
    server.start();
    let client = Client::connect_with(
        &server.endpoint(),
        ClientOptions {
            bearer_token: Some(BearerToken::new(&files.token("alice")).unwrap()),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let session = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();

    let refused = session
        .acquire_all(&["jobs/a".into(), "billing/b".into()], Wait::Try)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        AcquireError::Refused(CoreError::PermissionDenied {
            identity: "alice".into(),
            right: Right::Lock,
            scope: "billing/b".into(),
        })
    );
    assert!(client.status("jobs/a").await.unwrap().holder.is_none());

    // Within the scope, the same call is granted.
    let guards = session
        .acquire_all(&["jobs/a".into(), "jobs/b".into()], Wait::Try)
        .await
        .unwrap();
    assert_eq!(guards.len(), 2);
    drop(guards);
    session.close().await.unwrap();
}

/// `palisade lock FIRST SECOND -- sh -c …` whose command appends its start (with the locks and
/// tokens it got) and its end to `log`, tagged `tag`.
fn lock_both(server: &Palisade, log: &std::path::Path, tag: &str, names: [&str; 2]) -> Running {
    let script = "echo \"start $TAG $PALISADE_LOCK_COUNT $PALISADE_LOCK_1=$PALISADE_TOKEN_1 \
                  $PALISADE_LOCK_2=$PALISADE_TOKEN_2 ${PALISADE_SEQUENCER:-none}\" >> \"$LOG\"; \
                  sleep 0.2; echo \"end $TAG\" >> \"$LOG\"";
    let mut command = server.command(&[
        "lock", names[0], names[1], "--wait", "30s", "--", "sh", "-c", script,
    ]);
    command
        .env("TAG", tag)
        .env("LOG", log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Running::spawn(command)
}

#[test]
fn two_commands_taking_two_locks_in_opposite_orders_never_deadlock_nor_overlap() {
    let server = Palisade::start(BIN);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    const ROUNDS: usize = 3;
    for round in 0..ROUNDS {
        let mut ab = lock_both(&server, &log, &format!("ab{round}"), ["A", "B"]);
        let mut ba = lock_both(&server, &log, &format!("ba{round}"), ["B", "A"]);
        for running in [&mut ab, &mut ba] {
            let status = running.wait(WAIT);
            assert!(status.success(), "{status}: {}", running.stderr());
        }
    }

    // Each command held both locks while it ran and nobody else held either: its start and
    // end are adjacent in the log, and every grant of a lock has a larger token than the last.
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * ROUNDS, "{text}");
    let mut last = std::collections::HashMap::new();
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let [_, tag, count, first, second, sequencer] = start.as_slice() else {
            panic!("{text}");
        };
        assert_eq!(pair[1], format!("end {tag}"), "{text}");
        assert_eq!(*count, "2", "{text}");
        assert_eq!(
            *sequencer, "none",
            "no unnumbered sequencer for several locks"
        );
        let order = if tag.starts_with("ab") {
            ["A", "B"]
        } else {
            ["B", "A"]
        };
        for (grant, lock) in [first, second].into_iter().zip(order) {
            let (name, token) = grant.split_once('=').unwrap();
            assert_eq!(name, lock, "{text}");
            let token: u64 = token.parse().unwrap();
            let previous = last.insert(lock, token).unwrap_or(0);
            assert!(token > previous, "{text}");
        }
    }
}
