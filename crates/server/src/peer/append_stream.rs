//! The leader's side of `StreamAppend`: openraft's stream of append-entries requests to one
//! follower goes out on one long-lived gRPC stream, and the follower's results come back on it
//! in order. The leader sends each request as soon as openraft produces it, before the earlier
//! ones are answered; that replaces a unary call, with its own HTTP/2 stream and hand-offs, per
//! batch.
//!
//! The same rules as a unary call hold:
//!
//! - **A request must be answered within `RPCOption::soft_ttl()` of being queued for the
//!   connection** (which takes it as soon as it has written the one before). Otherwise
//!   the stream ends with a `Timeout`, however long the stream itself has been open: a stream
//!   that hangs is detected as a call that hangs is. An idle stream (nothing sent, nothing owed)
//!   has no deadline; HTTP/2 keepalives watch the connection under it.
//! - **A batch over [`APPEND_ENTRIES_BYTES_MAX`](crate::limits::APPEND_ENTRIES_BYTES_MAX) is cut** ([`encode_append`]). The cut request
//!   is the last one of the stream: its answer is a partial success, and openraft opens the next
//!   stream from there.
//! - **Failures are the unary call's:** a refusal or a broken connection is `Unreachable`, so
//!   openraft backs off, and a peer's word that this node was removed is acted on.
//!
//! **openraft's requests are taken only where its answers are read** ([`Answers::next`]), in
//! openraft's replication task, and handed to the connection through a queue of one; the
//! connection never takes one by itself. openraft checks whether it gave the stream up (this
//! node stepped down, a timeout) before it reads the answers, so a stream it gave up on builds
//! nothing more, except in the moment between that check and the request's read of the log,
//! which openraft's own request loop has too (and a single-threaded runtime, the simulation's,
//! does not). A request built then can read a log that a new leader has meanwhile cut back:
//! openraft 0.10.0-alpha.37 compares the old stream's position with the new last log id by term
//! first, finds a range that ends before it starts, and stops on a debug assertion (a release
//! build sends nothing and ends the stream). The deterministic simulation reached that often
//! when the connection took requests itself, at any time.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use openraft::OptionalSend;
use openraft::errors::RPCError;
use openraft::network::RPCTypes;
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use palisade_proto::raft::v1::{Envelope, PeerReply, PeerRequest};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{AppendBody, PeerClient, encode_append};
use crate::raft_types::C;

/// Requests built and not yet taken by the connection. One: the connection takes it as soon as
/// it has written the one before, so a request's deadline, which starts when it is queued,
/// does not also run while others wait in front of it (each may be up to
/// [`APPEND_ENTRIES_BYTES_MAX`](crate::limits::APPEND_ENTRIES_BYTES_MAX)).
const QUEUED_REQUESTS_MAX: usize = 1;

/// A request sent and not yet answered.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Instant,
    /// Only the leading entries went: this request's answer is the stream's last.
    cut: bool,
}

/// The sending half of one stream: openraft's requests, and the queue to the connection.
/// Dropped when nothing more may be sent, which ends the request stream.
pub(super) struct Sending<S> {
    input: S,
    queue: mpsc::Sender<PeerRequest>,
    envelope: Envelope,
}

/// Opens the two halves of one stream: the requests the connection sends (only those
/// [`Answers`] hands it), and the sending half to build [`Answers`] with.
pub(super) fn open<S>(
    input: S,
    envelope: Envelope,
) -> (
    Sending<S>,
    impl futures::Stream<Item = PeerRequest> + Send + 'static,
) {
    let (queue, queued) = mpsc::channel(QUEUED_REQUESTS_MAX);
    let sending = Sending {
        input,
        queue,
        envelope,
    };
    (sending, tokio_stream::wrappers::ReceiverStream::new(queued))
}

/// What became of one request offered to the stream.
#[derive(Debug)]
pub(super) enum Offered {
    /// Queued for the connection; `last` if only its leading entries went (it was cut), so
    /// that it is the stream's last.
    Queued { last: bool },
    /// Nothing more goes on this stream: openraft's input ended, the connection is gone, or
    /// the request could not be encoded (why).
    Done(Option<String>),
}

impl<S> Sending<S>
where
    S: futures::Stream<Item = AppendEntriesRequest<C>> + OptionalSend + Unpin + 'static,
{
    /// Queues `rpc`, the stream's first request, for the connection.
    pub(super) fn offer(&mut self, rpc: AppendEntriesRequest<C>) -> Offered {
        let permit = self
            .queue
            .try_reserve()
            .expect("a new stream's queue has room and its connection's end");
        self.queue_with(permit, rpc)
    }

    /// Waits for room in the queue and for openraft's next request, and queues it.
    /// Cancel-safe: dropped while waiting, it takes nothing (openraft's request stream keeps
    /// a request it was building for the next call).
    async fn send_next(&mut self) -> Offered {
        let Ok(permit) = self.queue.reserve().await else {
            return Offered::Done(None);
        };
        match self.input.next().await {
            Some(rpc) => self.queue_with(permit, rpc),
            None => Offered::Done(None),
        }
    }

    fn queue_with(
        &self,
        permit: mpsc::Permit<'_, PeerRequest>,
        rpc: AppendEntriesRequest<C>,
    ) -> Offered {
        match encode_append(rpc) {
            Ok(AppendBody { body, cut }) => {
                permit.send(PeerRequest {
                    envelope: Some(self.envelope.clone()),
                    body,
                });
                Offered::Queued {
                    last: cut.is_some(),
                }
            }
            Err(why) => Offered::Done(Some(why)),
        }
    }
}

/// The receiving half of one stream: the follower's replies as openraft's results. It also
/// takes openraft's requests and queues them for the connection (see the module doc).
pub(super) struct Answers<'s, S> {
    peer: &'s PeerClient,
    replies: tonic::Streaming<PeerReply>,
    /// How long a request may stay unanswered.
    deadline: Duration,
    /// `None` once nothing more is sent on this stream.
    sending: Option<Sending<S>>,
    /// The requests sent and not yet answered, oldest first.
    unanswered: VecDeque<Sent>,
    /// A request that could not be encoded: the stream ends with this error once the requests
    /// before it are answered.
    failed: Option<String>,
    /// Set once the stream ended cleanly, or after an error, or after the answer to a cut
    /// request or a refused append (a conflict, a higher vote): the stream is over.
    over: bool,
}

type Answer = Result<StreamAppendResult<C>, RPCError<C>>;

impl<'s, S> Answers<'s, S>
where
    S: futures::Stream<Item = AppendEntriesRequest<C>> + OptionalSend + Unpin + 'static,
{
    /// The answers to the requests of `sending`, the first of which was already `offered`.
    pub(super) fn new(
        peer: &'s PeerClient,
        replies: tonic::Streaming<PeerReply>,
        deadline: Duration,
        sending: Sending<S>,
        offered: Offered,
    ) -> Self {
        let mut answers = Self {
            peer,
            replies,
            deadline,
            sending: Some(sending),
            unanswered: VecDeque::new(),
            failed: None,
            over: false,
        };
        answers.offered(offered);
        answers
    }

    fn offered(&mut self, offered: Offered) {
        match offered {
            Offered::Queued { last } => {
                self.unanswered.push_back(Sent {
                    at: Instant::now(),
                    cut: last,
                });
                if last {
                    self.sending = None;
                }
            }
            Offered::Done(failed) => {
                self.failed = failed;
                self.sending = None;
            }
        }
    }

    /// The next result, or `None` once the stream ended cleanly. After an error, or after the
    /// answer to a cut request or a refused append (a conflict, a higher vote), the stream is
    /// over.
    pub(super) async fn next(&mut self) -> Option<Answer> {
        if self.over {
            return None;
        }
        let answer = self.receive().await;
        if !matches!(answer, Some(Ok(Ok(_)))) {
            self.end();
        }
        answer
    }

    fn end(&mut self) {
        self.over = true;
        self.sending = None;
    }

    async fn receive(&mut self) -> Option<Answer> {
        loop {
            let due = self.unanswered.front().map(|sent| sent.at + self.deadline);
            tokio::select! {
                biased;
                reply = self.replies.message() => return self.answer(reply),
                () = sleep_until(due) => {
                    return Some(Err(RPCError::Timeout(
                        self.peer.timeout(RPCTypes::AppendEntries, self.deadline),
                    )));
                }
                offered = send_next(self.sending.as_mut()) => self.offered(offered),
            }
        }
    }

    fn answer(&mut self, reply: Result<Option<PeerReply>, tonic::Status>) -> Option<Answer> {
        let reply = match reply {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                if let Some(why) = &self.failed {
                    return Some(Err(RPCError::Unreachable(self.peer.unreachable(why))));
                }
                if !self.unanswered.is_empty() {
                    return Some(Err(RPCError::Unreachable(self.peer.unreachable(
                        format_args!(
                            "its append stream ended with {} requests unanswered",
                            self.unanswered.len()
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
        let Some(sent) = self.unanswered.pop_front() else {
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

async fn send_next<S>(sending: Option<&mut Sending<S>>) -> Offered
where
    S: futures::Stream<Item = AppendEntriesRequest<C>> + OptionalSend + Unpin + 'static,
{
    match sending {
        Some(sending) => sending.send_next().await,
        None => std::future::pending().await,
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use openraft::type_config::alias::VoteOf;

    use super::*;

    /// An empty append-entries request, as openraft would build a heartbeat.
    fn request() -> AppendEntriesRequest<C> {
        AppendEntriesRequest {
            vote: VoteOf::<C>::new(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        }
    }

    /// openraft's request stream as the tests see it: a request is always ready, and each one
    /// taken is counted.
    struct Eager(Arc<AtomicUsize>);

    impl futures::Stream for Eager {
        type Item = AppendEntriesRequest<C>;

        fn poll_next(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::task::Poll::Ready(Some(request()))
        }
    }

    /// The connection sends what it is handed and takes nothing from openraft by itself: a
    /// stream openraft stopped reading the answers of gets no request built after that.
    #[tokio::test]
    async fn the_connection_takes_no_request_from_openraft_by_itself() {
        let taken = Arc::new(AtomicUsize::new(0));
        let (mut sending, requests) = open(Eager(taken.clone()), Envelope::default());
        let mut requests = Box::pin(requests);
        let offered = sending.offer(request());
        assert!(
            matches!(offered, Offered::Queued { last: false }),
            "{offered:?}"
        );
        let first = tokio::time::timeout(Duration::from_secs(10), requests.next())
            .await
            .expect("the offered request reaches the connection");
        assert!(first.is_some());
        let waiting = tokio::time::timeout(Duration::from_millis(50), requests.next()).await;
        assert!(
            waiting.is_err(),
            "the connection sent a request no one handed it"
        );
        assert_eq!(
            taken.load(Ordering::SeqCst),
            0,
            "openraft's requests were taken"
        );
        // Taken only when the answers' side asks for the next one.
        let next = sending.send_next().await;
        assert!(matches!(next, Offered::Queued { last: false }), "{next:?}");
        assert_eq!(taken.load(Ordering::SeqCst), 1);
        drop(sending);
        assert!(
            requests.next().await.is_some(),
            "the queued request is still sent"
        );
        assert!(
            requests.next().await.is_none(),
            "the stream ends with its sending half"
        );
    }
}
