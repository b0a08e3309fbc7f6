//! The leader's side of `StreamAppend`: openraft's stream of append-entries requests to one
//! follower goes out on one long-lived gRPC stream, and the follower's results come back on it
//! in order. The leader sends each request as soon as openraft produces it, before the earlier
//! ones are answered; that replaces a unary call, with its own HTTP/2 stream and hand-offs, per
//! batch.
//!
//! The same rules as a unary call hold:
//!
//! - **A request must be answered within `RPCOption::soft_ttl()` of being sent.** Otherwise
//!   the stream ends with a `Timeout`, however long the stream itself has been open: a stream
//!   that hangs is detected as a call that hangs is. An idle stream (nothing sent, nothing owed)
//!   has no deadline; HTTP/2 keepalives watch the connection under it.
//! - **A batch over [`APPEND_ENTRIES_BYTES_MAX`](crate::limits::APPEND_ENTRIES_BYTES_MAX) is cut** ([`encode_append`]). The cut request
//!   is the last one of the stream: its answer is a partial success, and openraft opens the next
//!   stream from there.
//! - **A stream openraft gave up on** (a timeout, an error, a refusal) stops taking requests
//!   at once: its answers' end drops the [`requests`] stream's stop signal. openraft's next
//!   stream draws from the same source, so a forgotten one would take its requests.
//! - **Failures are the unary call's:** a refusal or a broken connection is `Unreachable`, so
//!   openraft backs off, and a peer's word that this node was removed is acted on.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use openraft::OptionalSend;
use openraft::errors::RPCError;
use openraft::network::RPCTypes;
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use palisade_proto::raft::v1::{PeerReply, PeerRequest};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::{AppendBody, PeerClient, encode_append};
use crate::raft_types::C;

/// What the two halves of one stream share: the requests sent and not yet answered, oldest
/// first, and why the sending half stopped early, if it did.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    state: Mutex<InFlightState>,
    /// Woken when a request is sent, so that the receiving half starts its deadline.
    sent: Notify,
}

#[derive(Debug, Default)]
struct InFlightState {
    unanswered: VecDeque<Sent>,
    /// A request that could not be encoded: the stream ends with this error once the requests
    /// before it are answered.
    failed: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Instant,
    /// Only the leading entries went: this request's answer is the stream's last.
    cut: bool,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, InFlightState> {
        self.state.lock().expect("append stream state poisoned")
    }

    fn sent(&self, cut: bool) {
        self.lock().unanswered.push_back(Sent {
            at: Instant::now(),
            cut,
        });
        self.sent.notify_one();
    }
}

/// openraft's `input` as the gRPC requests of one stream, each with `envelope`. The stream
/// ends after a cut request (see the module doc), before a request that cannot be encoded, and
/// as soon as `stop` fires or is dropped: when the [`Answers`] of the stream end or go away, so
/// that a stream openraft gave up on takes no more of its requests (openraft's next stream
/// draws from the same source).
pub(super) fn requests<S>(
    input: S,
    envelope: palisade_proto::raft::v1::Envelope,
    in_flight: Arc<InFlight>,
    stop: oneshot::Receiver<()>,
) -> impl futures::Stream<Item = PeerRequest> + Send + 'static
where
    S: futures::Stream<Item = AppendEntriesRequest<C>> + OptionalSend + Unpin + 'static,
{
    futures::stream::unfold(Some((input, stop)), move |state| {
        let envelope = envelope.clone();
        let in_flight = in_flight.clone();
        async move {
            let (mut input, mut stop) = state?;
            // On `stop`, `input` is dropped here, with any request openraft was making.
            let rpc = tokio::select! {
                biased;
                _ = &mut stop => return None,
                rpc = input.next() => rpc?,
            };
            match encode_append(rpc) {
                Ok(AppendBody { body, cut }) => {
                    let cut = cut.is_some();
                    in_flight.sent(cut);
                    let request = PeerRequest {
                        envelope: Some(envelope),
                        body,
                    };
                    Some((request, (!cut).then_some((input, stop))))
                }
                Err(why) => {
                    in_flight.lock().failed = Some(why);
                    in_flight.sent.notify_one();
                    None
                }
            }
        }
    })
}

/// The receiving half of one stream: the follower's replies as openraft's results.
pub(super) struct Answers<'s> {
    pub(super) peer: &'s PeerClient,
    pub(super) replies: tonic::Streaming<PeerReply>,
    pub(super) in_flight: Arc<InFlight>,
    /// How long a request may stay unanswered.
    pub(super) deadline: Duration,
    /// Dropped when these answers end (or are dropped): the sending half then stops.
    pub(super) stop: Option<oneshot::Sender<()>>,
}

type Answer = Result<StreamAppendResult<C>, RPCError<C>>;

impl Answers<'_> {
    /// The next result, or `None` once the stream ended cleanly. After an error, or after the
    /// answer to a cut request or a refused append (a conflict, a higher vote), the stream is
    /// over.
    pub(super) async fn next(&mut self) -> Option<Answer> {
        self.stop.as_ref()?;
        let answer = self.receive().await;
        if !matches!(answer, Some(Ok(Ok(_)))) {
            self.end();
        }
        answer
    }

    fn end(&mut self) {
        self.stop = None;
    }

    async fn receive(&mut self) -> Option<Answer> {
        loop {
            let oldest = self.in_flight.lock().unanswered.front().map(|sent| sent.at);
            let due = oldest.map(|at| at + self.deadline);
            tokio::select! {
                biased;
                reply = self.replies.message() => return self.answer(reply),
                () = sleep_until(due), if due.is_some() => {
                    return Some(Err(RPCError::Timeout(
                        self.peer.timeout(RPCTypes::AppendEntries, self.deadline),
                    )));
                }
                () = self.in_flight.sent.notified() => {}
            }
        }
    }

    fn answer(&mut self, reply: Result<Option<PeerReply>, tonic::Status>) -> Option<Answer> {
        let reply = match reply {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                let state = self.in_flight.lock();
                if let Some(why) = &state.failed {
                    return Some(Err(RPCError::Unreachable(self.peer.unreachable(why))));
                }
                if !state.unanswered.is_empty() {
                    return Some(Err(RPCError::Unreachable(self.peer.unreachable(
                        format_args!(
                            "its append stream ended with {} requests unanswered",
                            state.unanswered.len()
                        ),
                    ))));
                }
                return None;
            }
            Err(status) => {
                return Some(Err(self.peer.failed(
                    RPCTypes::AppendEntries,
                    self.deadline,
                    status,
                )));
            }
        };
        let Some(sent) = self.in_flight.lock().unanswered.pop_front() else {
            return Some(Err(RPCError::Unreachable(
                self.peer
                    .unreachable("it answered an append it was not sent"),
            )));
        };
        let result: StreamAppendResult<C> = match serde_json::from_slice(&reply.body) {
            Ok(result) => result,
            Err(e) => {
                return Some(Err(RPCError::Unreachable(self.peer.unreachable(
                    format_args!("its append reply is not this version's JSON: {e}"),
                ))));
            }
        };
        if sent.cut {
            self.end();
        }
        Some(Ok(result))
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// openraft's request stream as the tests see it: it never yields (a leader with nothing
    /// new to send), and says when it is dropped.
    struct Idle(Arc<AtomicBool>);

    impl futures::Stream for Idle {
        type Item = AppendEntriesRequest<C>;

        fn poll_next(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Pending
        }
    }

    impl Drop for Idle {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Once the answers of a stream end (openraft gave up on it: a timeout, an error), its
    /// sending half takes no more of openraft's requests: they belong to the next stream.
    #[tokio::test]
    async fn a_stream_whose_answers_ended_takes_no_more_requests() {
        let dropped = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = oneshot::channel();
        let mut requests = Box::pin(requests(
            Idle(dropped.clone()),
            Default::default(),
            Arc::default(),
            stopped,
        ));
        let waiting = tokio::time::timeout(Duration::from_millis(50), requests.next()).await;
        assert!(waiting.is_err(), "an idle input yields nothing");
        drop(stop);
        let ended = tokio::time::timeout(Duration::from_secs(10), requests.next())
            .await
            .expect("the request stream still waits on openraft after its answers ended");
        assert!(ended.is_none());
        assert!(dropped.load(Ordering::SeqCst), "openraft's stream was kept");
    }
}
