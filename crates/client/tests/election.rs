//! The election API against an in-process lock service on loopback: two candidates, the value
//! observers see, proclaims, resignation and the loss of a leader's session, and the epochs
//! that fence the leaders' side effects.

use std::time::Duration;

use palisade_client::{
    Client, Election, GRANT_VALUE_BYTES_MAX, Leader, ProclaimError, SessionOptions, Token,
};
use palisade_testkit::LockServer;

fn ttl(seconds: u64) -> SessionOptions {
    SessionOptions::with_ttl(Duration::from_secs(seconds))
}

/// A bounded wait for the next change an observer hears.
async fn next_change(changes: &mut palisade_client::LeaderChanges) -> Option<Leader> {
    tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("no change within 10 s")
        .expect("the observation ended")
        .expect("the observation failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_lead_in_turn_with_growing_epochs_and_observers_see_their_values() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let election = Election::new(&client, "elections/db-primary");
    assert_eq!(election.leader().await.unwrap(), None);
    let mut changes = election.observe().await.unwrap();
    assert_eq!(next_change(&mut changes).await, None);

    let a = client.open_session(ttl(10)).await.unwrap();
    let b = client.open_session(ttl(10)).await.unwrap();
    let first = election.campaign(&a, Some("10.0.0.1:5432")).await.unwrap();
    let expected_first = Leader {
        session: a.id(),
        epoch: first.epoch(),
        value: Some("10.0.0.1:5432".into()),
    };
    assert_eq!(
        next_change(&mut changes).await,
        Some(expected_first.clone())
    );
    assert_eq!(election.leader().await.unwrap(), Some(expected_first));
    assert!(first.sequencer().starts_with("pal2."));

    // b waits behind a; its value is not shown while it waits.
    let waiting = {
        let election = election.clone();
        tokio::spawn(async move {
            let leadership = election.campaign(&b, Some("10.0.0.2:5432")).await;
            (b, leadership)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        election.leader().await.unwrap().unwrap().value.as_deref(),
        Some("10.0.0.1:5432")
    );

    // The leader moves: it proclaims its new address.
    first.proclaim(Some("10.0.0.1:6432")).await.unwrap();
    let proclaimed = next_change(&mut changes).await.unwrap();
    assert_eq!(proclaimed.value.as_deref(), Some("10.0.0.1:6432"));
    assert_eq!(proclaimed.epoch, first.epoch());

    // a resigns; b leads with a higher epoch and its own value.
    let first_epoch = first.epoch();
    let first_guard_lock = first.guard().lock().to_string();
    first.resign().await.unwrap();
    let (b, second) = waiting.await.unwrap();
    let second = second.unwrap();
    assert!(second.epoch() > first_epoch, "epochs must grow");
    assert_eq!(first_guard_lock, "elections/db-primary");
    // The observer sees nobody leading (the release) and then b, or b at once.
    let mut seen = next_change(&mut changes).await;
    if seen.is_none() {
        seen = next_change(&mut changes).await;
    }
    assert_eq!(
        seen,
        Some(Leader {
            session: b.id(),
            epoch: second.epoch(),
            value: Some("10.0.0.2:5432".into()),
        })
    );

    // A session that no longer leads cannot proclaim, even for its old epoch.
    let refused = client
        .proclaim(
            a.credential(),
            "elections/db-primary",
            first_epoch,
            Some("x"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ProclaimError::NotHolder { .. }),
        "{refused:?}"
    );
    assert_eq!(
        election.leader().await.unwrap().unwrap().value.as_deref(),
        Some("10.0.0.2:5432")
    );

    // The leader's session ends: nobody leads.
    b.close().await.unwrap();
    assert_eq!(next_change(&mut changes).await, None);
    assert!(second.lost().await == palisade_client::SessionLost::Closed);
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_too_long_or_with_control_characters_is_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let client = Client::connect(&server.endpoint()).await.unwrap();
    let election = Election::new(&client, "elections/x");
    let session = client.open_session(ttl(10)).await.unwrap();
    let too_long = "v".repeat(GRANT_VALUE_BYTES_MAX + 1);
    for bad in [too_long.as_str(), "a\u{1b}[31mred", ""] {
        let refused = election.campaign(&session, Some(bad)).await.unwrap_err();
        assert!(
            matches!(refused, palisade_client::AcquireError::InvalidArgument(_)),
            "{bad:?}: {refused:?}"
        );
    }
    assert_eq!(election.leader().await.unwrap(), None);
    let leadership = election.campaign(&session, None).await.unwrap();
    assert_eq!(
        election.leader().await.unwrap(),
        Some(Leader {
            session: session.id(),
            epoch: leadership.epoch(),
            value: None,
        })
    );
    assert!(leadership.epoch() >= Token::FIRST);
    session.close().await.unwrap();
}
