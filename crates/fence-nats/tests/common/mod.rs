//! What the outbox tests (PostgreSQL and MySQL) share: a holder's grant, a unique name, a
//! JetStream stream of the test's own, and what the stream must hold after the relays.

use async_nats::jetstream::{self, Context, stream::Stream};
use palisade_core::{SessionId, Token};
use palisade_sequencer::{SigningKey, VerifiedSequencer};

/// A verified grant of the lock `invoices`.
pub fn grant(token: u64, session: u64) -> VerifiedSequencer {
    let key = SigningKey::from_bytes([42; 32]);
    let sequencer = key
        .sign("invoices", Token::new(token), SessionId::new(session))
        .unwrap();
    key.public_key().verify(sequencer.as_str()).unwrap()
}

/// `prefix` made unique to this process and moment (a schema, database or stream name).
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// A new stream `name` over the subjects `<name>.>`.
pub async fn stream(context: &Context, name: &str) -> Stream {
    context
        .create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .unwrap()
}

/// After the relays the stream holds each accepted event once, in order: "from a" with a's
/// sequencer in its header, then "from b".
pub async fn assert_each_event_once(stream: &mut Stream, a: &VerifiedSequencer) {
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!(state.messages, 2, "{state:?}");
    let first = stream.get_raw_message(1).await.unwrap();
    assert_eq!(first.payload, "from a");
    assert_eq!(
        first
            .headers
            .get(palisade_fence_nats::SEQUENCER_HEADER)
            .unwrap()
            .as_str(),
        a.as_str()
    );
    assert_eq!(stream.get_raw_message(2).await.unwrap().payload, "from b");
}
