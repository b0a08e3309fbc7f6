//! Who gets which session: clients that open sessions through the raw gRPC API, the way a
//! grpcurl or Python user does, against a real `palisade serve` process.
//!
//! A client that leaves every optional field of `OpenSession` at its proto3 default must get a
//! session of its own; sharing one would give two clients the same grant and the same fencing
//! token, and every resource would accept both.

use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_testkit::{ServerProcess, locks_client};
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const TTL_MS: u64 = 60_000;

async fn connect(service: &ServerProcess) -> LocksClient<Channel> {
    LocksClient::connect(service.endpoint()).await.unwrap()
}

/// An open with every field but the TTL left at its default: the session and its secret.
async fn open_with_defaults(client: &mut LocksClient<Channel>) -> (u64, Vec<u8>) {
    let opened = client
        .open_session(OpenSessionRequest {
            ttl_ms: TTL_MS,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (opened.session, opened.session_secret)
}

fn try_acquire((session, secret): &(u64, Vec<u8>), lock: &str) -> AcquireRequest {
    AcquireRequest {
        session: *session,
        lock: lock.into(),
        request_id: 0,
        wait_ms: 0,
        wait_forever: false,
        session_secret: secret.clone(),
        value: String::new(),
        permits: 0,
        shared: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_opening_with_default_fields_get_separate_sessions_and_only_one_holds_the_lock()
{
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();

    // Phase 1: two independent clients, each on its own connection, open a session the naive
    // way. They must not be handed the same session.
    let mut alice = connect(&service).await;
    let mut bob = connect(&service).await;
    let alice_opened = open_with_defaults(&mut alice).await;
    let bob_opened = open_with_defaults(&mut bob).await;
    let (alice_session, bob_session) = (alice_opened.0, bob_opened.0);
    assert_ne!(
        alice_session, bob_session,
        "two clients that sent OpenSession with default fields share a session"
    );

    // Phase 2: both try to take the same lock. Alice holds it; Bob is told it is busy, and told
    // by whom — not handed Alice's grant and token.
    let granted = alice
        .acquire(try_acquire(&alice_opened, "jobs/nightly"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.session, alice_session);
    let refused = bob
        .acquire(try_acquire(&bob_opened, "jobs/nightly"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let message = refused.message();
    assert!(
        message.contains(&format!(
            "held by session {alice_session} with token {}",
            granted.token
        )),
        "{message}"
    );

    // Phase 3: the lock's status names Alice alone; Bob can neither release it nor, by opening
    // the same way once more, get hold of Alice's session.
    let status = bob
        .status(StatusRequest {
            lock: "jobs/nightly".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    let holder = status.holder.expect("the lock is held");
    assert_eq!(
        (holder.session, holder.token),
        (alice_session, granted.token)
    );
    assert!(status.waiters.is_empty(), "{:?}", status.waiters);
    let release = bob
        .release(ReleaseRequest {
            session: bob_session,
            lock: "jobs/nightly".into(),
            // Request ids are per session: 0 is taken by Bob's acquire.
            request_id: 1,
            session_secret: bob_opened.1.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(release.code(), Code::PermissionDenied, "{release:?}");
    let (third, _) = open_with_defaults(&mut bob).await;
    assert!(
        third != alice_session && third != bob_session,
        "a third default open got session {third}, already in use"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_retried_with_its_key_gets_its_session_and_keys_that_cannot_be_random_are_refused()
{
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();
    let mut client = locks_client(&service.endpoint()).await;
    let open_with_key = |open_key: &[u8]| OpenSessionRequest {
        ttl_ms: TTL_MS,
        open_key: open_key.to_vec(),
        ..Default::default()
    };
    let key: Vec<u8> = (1..=16).collect();

    // Phase 1: the reply to an open was lost; the retry carries the same key and gets the same
    // session, which still holds what the first attempt's session took.
    let opened = client
        .open_session(open_with_key(&key))
        .await
        .unwrap()
        .into_inner();
    let first = opened.session;
    let first_opened = (first, opened.session_secret);
    client
        .acquire(try_acquire(&first_opened, "reports"))
        .await
        .unwrap();
    let retried = client
        .open_session(open_with_key(&key))
        .await
        .unwrap()
        .into_inner()
        .session;
    assert_eq!(retried, first);

    // Phase 2: another client's key, and the old request id field, get nothing of it.
    let mut other: Vec<u8> = (1..=16).collect();
    other[15] = 0;
    let stranger = client
        .open_session(OpenSessionRequest {
            request_id: 0,
            ttl_ms: TTL_MS,
            open_key: other,
        })
        .await
        .unwrap()
        .into_inner()
        .session;
    assert_ne!(stranger, first);

    // Phase 3: once the session is closed, its key opens a new session, holding nothing.
    client
        .close_session(CloseSessionRequest {
            session: first,
            session_secret: first_opened.1.clone(),
        })
        .await
        .unwrap();
    let reopened = client
        .open_session(open_with_key(&key))
        .await
        .unwrap()
        .into_inner()
        .session;
    assert!(reopened != first && reopened != stranger, "{reopened}");
    let status = client
        .status(StatusRequest {
            lock: "reports".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(status.holder.is_none(), "{status:?}");

    // Phase 4: keys that are too short, too long or not random are refused with a message
    // that says what to send, and open nothing.
    let too_long: Vec<u8> = (0..33).collect();
    for bad in [&[9u8; 15][..], &too_long, &[0u8; 16]] {
        let status = client.open_session(open_with_key(bad)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{} bytes", bad.len());
        assert!(
            status.message().contains("open key"),
            "{}",
            status.message()
        );
        assert!(
            matches!(
                palisade_proto::error::core_from_status(&status),
                Some(palisade_core::CoreError::InvalidOpenKey(_))
            ),
            "details {:?}",
            status.details()
        );
    }
    let longest: Vec<u8> = (100..132).collect();
    let next = client
        .open_session(open_with_key(&longest))
        .await
        .unwrap()
        .into_inner()
        .session;
    assert_eq!(next, reopened + 1, "a refused open took a session id");
}
