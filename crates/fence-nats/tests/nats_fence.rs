//! The fenced publish against a real NATS server with JetStream (`PALISADE_TEST_NATS`, started
//! by scripts/test-services.sh): what the broker stores and what each holder is told.

use std::sync::Arc;

use async_nats::jetstream::{self, Context};
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, Verifier};
use palisade_fence_nats::{NatsFence, SEQUENCER_HEADER};
use palisade_sequencer::{SigningKey, VerifiedSequencer};

const LOCK: &str = "invoices";

fn service_key() -> SigningKey {
    SigningKey::from_bytes([42; 32])
}

fn grant(token: u64, session: u64) -> VerifiedSequencer {
    let sequencer = service_key()
        .sign(LOCK, Token::new(token), SessionId::new(session))
        .unwrap();
    service_key()
        .public_key()
        .verify(sequencer.as_str())
        .unwrap()
}

/// A fresh stream of its own for one test, on the server `PALISADE_TEST_NATS` names.
async fn fresh_stream(name: &str) -> Option<(Context, NatsFence, String)> {
    let Ok(url) = std::env::var("PALISADE_TEST_NATS") else {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: PALISADE_TEST_NATS not set; the NATS fenced publish tests did not run"
        );
        return None;
    };
    let context = palisade_fence_nats::connect(&url).await.unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let stream = format!("{name}_{}_{nanos}", std::process::id());
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    let verifier = Arc::new(Verifier::new(service_key().public_key()));
    let fence = NatsFence::new(context.clone(), stream.clone(), verifier);
    let subject = format!("{stream}.events");
    Some((context, fence, subject))
}

/// Every message of the stream, in order: its payload and the verified token in its header.
async fn stored(context: &Context, stream: &str) -> Vec<(String, Option<u64>)> {
    let stream = context.get_stream(stream).await.unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut messages = Vec::new();
    for sequence in 1..=last {
        let message = stream.get_raw_message(sequence).await.unwrap();
        // A header that does not verify counts as none.
        let token = message.headers.get(SEQUENCER_HEADER).and_then(|text| {
            let verified = service_key().public_key().verify(text.as_str()).ok()?;
            Some(verified.token().get())
        });
        messages.push((String::from_utf8(message.payload.to_vec()).unwrap(), token));
    }
    messages
}

#[tokio::test]
async fn a_newer_holders_message_shuts_the_older_holder_out() {
    let Some((context, fence, subject)) = fresh_stream("shutout").await else {
        return;
    };
    let (a, b) = (grant(5, 1), grant(6, 2));
    fence
        .publish(&subject, &a, "a1".into(), None)
        .await
        .unwrap();
    fence
        .publish(&subject, &a, "a2".into(), None)
        .await
        .unwrap();
    fence
        .publish(&subject, &b, "b1".into(), None)
        .await
        .unwrap();
    let refused = fence
        .publish(&subject, &a, "a3".into(), None)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        FenceError::Stale {
            lock: LOCK.into(),
            presented: Token::new(5),
            accepted: Token::new(6),
            holder_session: Some(SessionId::new(2)),
        }
    );
    // Another session with B's token: the service issued it twice.
    let reissued = fence
        .publish(&subject, &grant(6, 9), "x".into(), None)
        .await
        .unwrap_err();
    assert!(reissued.is_token_reissued(), "{reissued:?}");
    let stream = subject.trim_end_matches(".events");
    assert_eq!(
        stored(&context, stream).await,
        [("a1", 5), ("a2", 5), ("b1", 6)].map(|(p, t)| (p.to_owned(), Some(t)))
    );
}

/// The Debian server honours `Nats-Expected-Last-Subject-Sequence`: a message landing between a
/// holder's read and its publish makes the broker refuse the publish, and the fence reports
/// who landed.
#[tokio::test]
async fn the_broker_refuses_a_publish_when_the_subject_moved_since_the_read() {
    let Some((context, fence, subject)) = fresh_stream("moved").await else {
        return;
    };
    let (a, b) = (grant(5, 1), grant(6, 2));
    // A reads the empty subject; B publishes; A's publish expecting "empty" is refused, as stale.
    let read_by_a = fence.last(&subject).await.unwrap();
    assert!(read_by_a.is_none());
    fence
        .publish_after(&subject, &b, None, "b1".into(), None)
        .await
        .unwrap();
    let refused = fence
        .publish_after(&subject, &a, read_by_a.as_ref(), "a1".into(), None)
        .await
        .unwrap_err();
    assert!(refused.is_stale(), "{refused:?}");

    // B reads, B publishes again, then B's publish computed from the first read is refused:
    // retryable, nothing stored, since its own message moved the subject.
    let read_by_b = fence.last(&subject).await.unwrap().unwrap();
    assert_eq!(read_by_b.payload, "b1");
    assert_eq!(
        read_by_b.accepted.as_ref().unwrap().token_max,
        Token::new(6)
    );
    fence
        .publish_after(&subject, &b, Some(&read_by_b), "b2".into(), None)
        .await
        .unwrap();
    let moved = fence
        .publish_after(&subject, &b, Some(&read_by_b), "b2 again".into(), None)
        .await
        .unwrap_err();
    assert!(moved.is_retryable(), "{moved:?}");
    assert!(
        moved.to_string().contains("changed since it was read"),
        "{moved}"
    );

    let stream = subject.trim_end_matches(".events");
    assert_eq!(
        stored(&context, stream).await,
        [("b1", 6), ("b2", 6)].map(|(p, t)| (p.to_owned(), Some(t)))
    );
}

#[tokio::test]
async fn concurrent_publishes_of_one_holder_all_land_through_the_bounded_retry() {
    let Some((context, fence, subject)) = fresh_stream("retry").await else {
        return;
    };
    let a = grant(5, 1);
    let mut tasks = Vec::new();
    for writer in 0..3 {
        let (fence, subject, a) = (fence.clone(), subject.clone(), a.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..10 {
                fence
                    .publish(&subject, &a, format!("{writer}-{n}").into(), None)
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let stream = subject.trim_end_matches(".events");
    assert_eq!(stored(&context, stream).await.len(), 30);
}

#[tokio::test]
async fn a_last_message_with_a_forged_sequencer_is_corrupt_and_nothing_is_published() {
    let Some((context, fence, subject)) = fresh_stream("forged").await else {
        return;
    };
    let attacker = SigningKey::from_bytes([13; 32]);
    let forged = attacker
        .sign(LOCK, Token::new(1_000_000), SessionId::new(666))
        .unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(SEQUENCER_HEADER, forged.as_str());
    context
        .publish_with_headers(subject.clone(), headers, "planted".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let refused = fence
        .publish(&subject, &grant(5, 1), "a1".into(), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, FenceError::Corrupt { scope, message }
            if scope == &subject && message.contains("does not verify")),
        "{refused:?}"
    );
    let stream = subject.trim_end_matches(".events");
    assert_eq!(stored(&context, stream).await.len(), 1);
}
