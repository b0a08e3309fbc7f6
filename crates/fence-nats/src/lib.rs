//! A fenced publish to NATS JetStream: the broker itself refuses a message from a Palisade lock
//! holder that was superseded.
//!
//! The fence state of a subject lives on its last message: every fenced publish carries its
//! publisher's sequencer in the [`SEQUENCER_HEADER`]. A publish
//!
//! 1. reads the subject's last message (`$JS.API.STREAM.MSG.GET` with `last_by_subj`, answered by
//!    the stream's leader) and verifies the sequencer on it;
//! 2. checks its own sequencer against that one with the same pure [`palisade_fence::check`]
//!    every fence backend runs: an older token is refused as [`FenceError::Stale`], carrying the
//!    presented and the accepted tokens;
//! 3. publishes with `Nats-Expected-Last-Subject-Sequence` set to the sequence of the message it
//!    read (0 when the subject is empty). The broker stores the message only if that is still the
//!    subject's last one, so nothing can land between the check and the publish.
//!
//! If another message landed in between, the broker refuses with "wrong last sequence";
//! [`NatsFence::publish`] reads and checks again, a bounded number of times
//! ([`CONFLICT_RETRIES_MAX`]). A newer holder's message there makes the retry refuse ours as
//! stale. A read-modify-write whose payload depends on what it read uses
//! [`NatsFence::last`] and [`NatsFence::publish_after`] instead: a message landing in between is
//! then a retryable [`FenceError::Storage`] (read again, recompute), never a publish of a value
//! computed from a message that is no longer the last.
//!
//! ```no_run
//! # async fn example(
//! #     context: async_nats::jetstream::Context,
//! #     verifier: std::sync::Arc<palisade_fence::Verifier>,
//! # ) -> Result<(), palisade_fence::FenceError> {
//! use palisade_fence_nats::NatsFence;
//!
//! let fence = NatsFence::new(context, "EVENTS", verifier);
//! // The sequencer `palisade lock` exported to the holder.
//! let sequencer = fence.verify(std::env::var("PALISADE_SEQUENCER").ok().as_deref())?;
//! let ack = fence
//!     .publish("events.invoices", &sequencer, "invoice 42 sent".into(), None)
//!     .await?;
//! println!("stored as message {}", ack.sequence);
//! # Ok(())
//! # }
//! ```
//!
//! What this does not cover, in so many words:
//!
//! - **Every publisher on the subject goes through the fence.** The state is the last message's
//!   header: a plain publish in between carries none, and the next fenced publish then has no
//!   token to compare with (it is accepted, as on a fresh subject).
//! - **The last message must stay.** A stream limit that removes it (`max_msgs_per_subject`,
//!   `max_age`, a purge) forgets the token with it. Keep such limits off fenced subjects, or
//!   filter on the consumer side as well ([`palisade_fence::stream`]).
//! - **A stale holder can still publish before the new holder's first message lands**: nothing
//!   of the newer grant is on the subject yet. Consumers that must also drop those use the
//!   consumer filter; producers that must not emit them use a fenced outbox.
//!
//! Every failure is a [`FenceError`]: a refused sequencer (final), [`FenceError::Storage`]
//! (nothing was stored; retry), or [`FenceError::OutcomeUnknown`] (the publish was sent and no
//! answer came: read the subject before deciding; pass a `Nats-Msg-Id` header to let the stream's
//! duplicate window absorb a retry).

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use palisade_fence::fence::stored_holder;
use palisade_fence::{FenceError, FenceState, Intent, LockBinding, Verifier, check};
use palisade_sequencer::VerifiedSequencer;

pub use palisade_fence::stream::SEQUENCER_HEADER;

pub mod outbox;

/// How many times [`NatsFence::publish`] reads again after the broker refused a publish because
/// another message landed on the subject since its read (after a short, growing, jittered
/// pause each time).
pub const CONFLICT_RETRIES_MAX: u32 = 8;

/// Fenced publishes to the subjects of one JetStream stream.
#[derive(Debug, Clone)]
pub struct NatsFence {
    context: Context,
    stream: String,
    verifier: Arc<Verifier>,
    lock: Option<String>,
}

/// A subject's last message, with the fence state its header carries.
#[derive(Debug, Clone)]
pub struct LastMessage {
    /// Its sequence in the stream: what the next publish expects.
    pub sequence: u64,
    pub payload: Bytes,
    pub headers: HeaderMap,
    /// The lock, token and session of its publisher's grant; `None` when it was published
    /// without a sequencer.
    pub accepted: Option<FenceState>,
}

impl NatsFence {
    /// Fenced publishes into `stream` (its name, not a subject), verifying sequencers with
    /// `verifier` (the lock service's public keys). The first fenced message on a subject binds it
    /// to its lock; see [`NatsFence::expect_lock`].
    pub fn new(context: Context, stream: impl Into<String>, verifier: Arc<Verifier>) -> NatsFence {
        NatsFence {
            context,
            stream: stream.into(),
            verifier,
            lock: None,
        }
    }

    /// Accepts sequencers of `lock` only, on every subject, from the first message on.
    pub fn expect_lock(mut self, lock: impl Into<String>) -> NatsFence {
        self.lock = Some(lock.into());
        self
    }

    /// Verifies a presented sequencer (`$PALISADE_SEQUENCER`) with this fence's keys.
    pub fn verify(&self, presented: Option<&str>) -> Result<VerifiedSequencer, FenceError> {
        self.verifier.verify(presented)
    }

    /// The last message on `subject`, or `None` if the subject has none.
    ///
    /// Its sequencer header is verified: one that does not verify (forged, or signed by keys this
    /// fence does not trust) is [`FenceError::Corrupt`], since it was not published through a
    /// fence that trusts the same keys.
    pub async fn last(&self, subject: &str) -> Result<Option<LastMessage>, FenceError> {
        let stream = self
            .context
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|error| storage(format!("stream {:?}: {error}", self.stream)))?;
        let message = match stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => message,
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {
                return Ok(None);
            }
            Err(error) => {
                return Err(storage(format!(
                    "reading the last message on {subject:?} in stream {:?}: {error}",
                    self.stream
                )));
            }
        };
        let accepted = match message.headers.get(SEQUENCER_HEADER) {
            None => None,
            Some(text) => {
                let verified = self.verifier.verify(Some(text.as_str())).map_err(|refused| {
                    FenceError::Corrupt {
                        scope: subject.to_owned(),
                        message: format!(
                            "the last message (sequence {}) carries a {SEQUENCER_HEADER} that does not verify: {refused}",
                            message.sequence
                        ),
                    }
                })?;
                Some(FenceState {
                    lock: verified.binding().into_owned(),
                    token_max: verified.token(),
                    holder_session: stored_holder(&verified),
                })
            }
        };
        Ok(Some(LastMessage {
            sequence: message.sequence,
            payload: message.payload,
            headers: message.headers,
            accepted,
        }))
    }

    /// Publishes `payload` to `subject` as the holder of `sequencer`, provided `last` (what
    /// [`NatsFence::last`] returned) is still the subject's last message.
    ///
    /// Refuses a sequencer older than `last`'s ([`FenceError::Stale`]) before sending anything.
    /// If another message landed after `last`, the broker refuses the publish: a newer holder's
    /// message makes that [`FenceError::Stale`]; any other is a retryable [`FenceError::Storage`]
    /// (read again and recompute). `headers` are sent along (a `Nats-Msg-Id`, say); the fence
    /// sets its own two.
    pub async fn publish_after(
        &self,
        subject: &str,
        sequencer: &VerifiedSequencer,
        last: Option<&LastMessage>,
        payload: Bytes,
        headers: Option<HeaderMap>,
    ) -> Result<PublishAck, FenceError> {
        self.check(last, sequencer)?;
        let expected = last.map_or(0, |last| last.sequence);
        match self
            .send(subject, sequencer, expected, payload, headers)
            .await?
        {
            Sent::Stored(ack) => Ok(ack),
            Sent::Conflict => {
                // Whoever landed in between decides what we report.
                let now = self.last(subject).await?;
                self.check(now.as_ref(), sequencer)?;
                Err(storage(format!(
                    "{subject:?} changed since it was read (its last message was {expected}, it is {} now); read it again",
                    now.map_or(0, |now| now.sequence)
                )))
            }
        }
    }

    /// Publishes `payload` to `subject` as the holder of `sequencer`: reads the last message,
    /// checks, and publishes expecting it to be still the last; reads and checks again when
    /// another message landed in between, at most [`CONFLICT_RETRIES_MAX`] times.
    pub async fn publish(
        &self,
        subject: &str,
        sequencer: &VerifiedSequencer,
        payload: Bytes,
        headers: Option<HeaderMap>,
    ) -> Result<PublishAck, FenceError> {
        for attempt in 0..=CONFLICT_RETRIES_MAX {
            if attempt > 0 {
                // Publishers that collided would collide again in lockstep: wait a little,
                // longer each time, and not the same time as the others.
                tokio::time::sleep(backoff(attempt)).await;
            }
            let last = self.last(subject).await?;
            self.check(last.as_ref(), sequencer)?;
            let expected = last.map_or(0, |last| last.sequence);
            let sent = self
                .send(
                    subject,
                    sequencer,
                    expected,
                    payload.clone(),
                    headers.clone(),
                )
                .await?;
            if let Sent::Stored(ack) = sent {
                return Ok(ack);
            }
        }
        Err(storage(format!(
            "{subject:?} kept changing: {} fenced publishes in a row found another message landed since their read",
            CONFLICT_RETRIES_MAX + 1
        )))
    }

    fn check(
        &self,
        last: Option<&LastMessage>,
        sequencer: &VerifiedSequencer,
    ) -> Result<FenceState, FenceError> {
        let binding = match &self.lock {
            Some(lock) => LockBinding::Expect(lock),
            None => LockBinding::BindOnFirstWrite,
        };
        check(
            last.and_then(|last| last.accepted.as_ref()),
            binding,
            sequencer,
            // A publish is a write: a shared grant (a reader) is refused as SharedWrite.
            Intent::Write,
        )
    }

    async fn send(
        &self,
        subject: &str,
        sequencer: &VerifiedSequencer,
        expected: u64,
        payload: Bytes,
        headers: Option<HeaderMap>,
    ) -> Result<Sent, FenceError> {
        let mut headers = headers.unwrap_or_default();
        headers.insert(SEQUENCER_HEADER, sequencer.as_str());
        let publish = PublishMessage::build()
            .payload(payload)
            .headers(headers)
            .expected_last_subject_sequence(expected)
            .expected_stream(&self.stream);
        let pending = self
            .context
            .send_publish(subject.to_owned(), publish)
            .await
            .map_err(|error| match error.kind() {
                PublishErrorKind::MaxPayloadExceeded => FenceError::InvalidRequest {
                    message: format!("publish to {subject:?}: {error}"),
                },
                _ => storage(format!("publish to {subject:?} was not sent: {error}")),
            })?;
        match pending.await {
            Ok(ack) => Ok(Sent::Stored(ack)),
            Err(error) => match error.kind() {
                PublishErrorKind::WrongLastSequence => Ok(Sent::Conflict),
                // No stream listens on the subject, or the stream answered with an error: the
                // message was not stored.
                PublishErrorKind::StreamNotFound
                | PublishErrorKind::WrongLastMessageId
                | PublishErrorKind::MaxAckPending
                | PublishErrorKind::MaxPayloadExceeded
                | PublishErrorKind::Other => Err(storage(format!(
                    "stream {:?} did not store the message on {subject:?}: {error}",
                    self.stream
                ))),
                PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                    Err(FenceError::OutcomeUnknown {
                        message: format!(
                            "the publish to {subject:?} was sent but not acknowledged ({error})"
                        ),
                    })
                }
            },
        }
    }
}

/// What the broker answered a conditional publish.
enum Sent {
    Stored(PublishAck),
    /// Another message is the subject's last now: nothing was stored.
    Conflict,
}

/// Up to `attempt` × 4 ms, jittered by the clock's nanoseconds (no random source needed).
fn backoff(attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let ceiling_micros = u64::from(attempt) * 4_000;
    Duration::from_micros(1 + u64::from(nanos) % ceiling_micros)
}

fn storage(message: String) -> FenceError {
    FenceError::Storage { message }
}

/// Connects a JetStream context to `url` (`nats://127.0.0.1:4222`), as the examples and tests
/// do; a deployment builds its own [`async_nats::ConnectOptions`] (credentials, TLS).
pub async fn connect(url: &str) -> Result<Context, FenceError> {
    let client = async_nats::connect(url)
        .await
        .map_err(|error| storage(format!("connecting to NATS at {url}: {error}")))?;
    Ok(jetstream::new(client))
}
