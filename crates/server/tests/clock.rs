//! The lock service on a clock the test drives: leases end exactly when the clock says, and
//! never because the test machine was slow. Calls go through the transport-independent
//! [`LockService`], the layer every transport adapts.

use std::time::Duration;

use palisade_clock::ManualClock;
use palisade_core::{CoreError, DurationMs, RequestId, Wait};
use palisade_server::auth::{Caller, Credential, LiveCaller};
use palisade_server::service::{
    AcquireRequest, ChangeKind, LockService, Read, ServiceError, SessionProof,
};
use palisade_server::{Server, ServerConfig};

struct Running {
    service: LockService,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let config =
        ServerConfig::single_node(dir.path().to_path_buf(), "127.0.0.1:0".parse().unwrap());
    let clock = ManualClock::new();
    let server = Server::start_with_clock(&config, clock.shared())
        .await
        .expect("server starts");
    Running {
        service: LockService::new(server.node().clone()),
        clock,
        _dir: dir,
    }
}

/// A caller without a credential, for a call that stays open.
fn anonymous_live(service: &LockService) -> LiveCaller {
    service.auth().live_caller(Credential::default()).unwrap()
}

/// Opens a session: what acts for it, its id and its secret.
async fn open(service: &LockService, ttl_ms: u64) -> SessionProof {
    let opened = service
        .open_session(&Caller::anonymous(), b"", DurationMs::from_millis(ttl_ms))
        .await
        .unwrap();
    let secret = opened.secret.expect("a new session has a secret");
    SessionProof::new(opened.session, secret.as_bytes())
}

/// Polls (in real time, boundedly) until `lock` has no holder; false if it still has one.
async fn becomes_free(service: &LockService, lock: &str) -> bool {
    for _ in 0..200 {
        if service
            .status(&Caller::anonymous(), lock.into(), Read::Linearizable)
            .await
            .unwrap()
            .holder
            .is_none()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Polls until `lock` has `n` waiters.
async fn wait_for_waiters(service: &LockService, lock: &str, n: usize) {
    for _ in 0..500 {
        if service
            .status(&Caller::anonymous(), lock.into(), Read::Linearizable)
            .await
            .unwrap()
            .waiters
            .len()
            == n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{lock} never had {n} waiters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_when_the_clock_passes_its_ttl_and_not_a_millisecond_before() {
    let Running { service, clock, .. } = start().await;
    let session = open(&service, 1_000).await;
    let grant = service
        .acquire(
            None,
            &Caller::anonymous(),
            &session,
            AcquireRequest::new("l", RequestId::new(1), Wait::Try),
        )
        .await
        .unwrap();

    clock.advance(Duration::from_millis(999));
    // However long the machine takes now, no time passes for the lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = service
        .status(&Caller::anonymous(), "l".into(), Read::Linearizable)
        .await
        .unwrap();
    assert_eq!(held.holder.as_ref().map(|h| h.token), Some(grant.token));
    assert_eq!(
        held.holder.map(|h| h.lease_remaining_ms),
        Some(DurationMs::from_millis(1))
    );

    clock.advance(Duration::from_millis(1));
    assert!(
        becomes_free(&service, "l").await,
        "the lease outlived its TTL"
    );
    assert_eq!(
        service.renew(&Caller::anonymous(), &session).await,
        Err(ServiceError::Refused(CoreError::SessionNotFound {
            session: session.session
        }))
    );
}

/// The lease driver sleeps until the earliest deadline it knows. A session with a shorter lease
/// opened while it sleeps must still expire on time, not when the driver's earlier alarm rings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_lease_opened_while_the_driver_sleeps_expires_on_time() {
    let Running { service, clock, .. } = start().await;
    let long = open(&service, 600_000).await;
    service
        .acquire(
            None,
            &Caller::anonymous(),
            &long,
            AcquireRequest::new("held-long", RequestId::new(1), Wait::Try),
        )
        .await
        .unwrap();
    // The driver now sleeps until the long lease's end.
    clock.advance(Duration::from_millis(10));
    let short = open(&service, 1_000).await;
    service
        .acquire(
            None,
            &Caller::anonymous(),
            &short,
            AcquireRequest::new("held-briefly", RequestId::new(2), Wait::Try),
        )
        .await
        .unwrap();
    clock.advance(Duration::from_millis(1_000));
    assert!(
        becomes_free(&service, "held-briefly").await,
        "the 1 s session outlived its lease while the driver slept for the 600 s one"
    );
    let long_holder = service
        .status(&Caller::anonymous(), "held-long".into(), Read::Linearizable)
        .await
        .unwrap()
        .holder;
    assert_eq!(long_holder.map(|h| h.session), Some(long.session));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_the_order_they_queued_and_a_watch_sees_each_handover() {
    let Running { service, .. } = start().await;
    let first = open(&service, 60_000).await;
    let second = open(&service, 60_000).await;
    let third = open(&service, 60_000).await;
    let held = service
        .acquire(
            None,
            &Caller::anonymous(),
            &first,
            AcquireRequest::new("q", RequestId::new(1), Wait::Try),
        )
        .await
        .unwrap();
    let mut changes = Box::pin(
        service
            .watch(None, anonymous_live(&service), "q".into())
            .await
            .unwrap(),
    );

    let queue = |session: &SessionProof, request_id| {
        let service = service.clone();
        let session = session.clone();
        tokio::spawn(async move {
            service
                .acquire(
                    None,
                    &Caller::anonymous(),
                    &session,
                    AcquireRequest::new("q", RequestId::new(request_id), Wait::Forever),
                )
                .await
        })
    };
    let second_waits = queue(&second, 2);
    wait_for_waiters(&service, "q", 1).await;
    let third_waits = queue(&third, 3);
    wait_for_waiters(&service, "q", 2).await;
    assert_eq!(
        service
            .status(&Caller::anonymous(), "q".into(), Read::Linearizable)
            .await
            .unwrap()
            .waiters,
        vec![second.session, third.session]
    );

    service
        .release(&Caller::anonymous(), &first, "q".into(), RequestId::new(4))
        .await
        .unwrap();
    let second_grant = second_waits.await.unwrap().unwrap();
    assert_eq!(second_grant.session, second.session);
    service
        .release(&Caller::anonymous(), &second, "q".into(), RequestId::new(5))
        .await
        .unwrap();
    let third_grant = third_waits.await.unwrap().unwrap();
    assert_eq!(third_grant.session, third.session);
    assert!(held.token < second_grant.token && second_grant.token < third_grant.token);
    assert_eq!(third_grant.sequencer.token(), third_grant.token);

    use futures::StreamExt;
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let change = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("the watch goes quiet")
            .expect("the watch ends")
            .unwrap();
        seen.push((change.kind, change.session, change.token));
    }
    assert_eq!(
        seen,
        vec![
            (ChangeKind::Snapshot, first.session, held.token),
            (ChangeKind::Released, first.session, held.token),
            (ChangeKind::Granted, second.session, second_grant.token),
            (ChangeKind::Released, second.session, second_grant.token),
            (ChangeKind::Granted, third.session, third_grant.token),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_name_the_table_would_refuse_is_refused_by_status_and_watch_alike() {
    let Running { service, .. } = start().await;
    for bad in ["", "tab\there", &"x".repeat(257)] {
        let status = service
            .status(&Caller::anonymous(), bad.into(), Read::Linearizable)
            .await
            .unwrap_err();
        assert!(
            matches!(status, ServiceError::Refused(CoreError::InvalidLockName(_))),
            "status of {bad:?}: {status:?}"
        );
        let watch = service
            .watch(None, anonymous_live(&service), bad.into())
            .await
            .err()
            .expect("refused");
        assert!(
            matches!(watch, ServiceError::Refused(CoreError::InvalidLockName(_))),
            "watch of {bad:?}: {watch:?}"
        );
    }
}
