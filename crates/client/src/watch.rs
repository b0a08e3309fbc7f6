//! [`LockEvents`]: the stream of one lock's holder changes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use palisade_core::{Access, LockName, SessionId, Token};
use palisade_proto::v1 as pb;
use pb::watch_event::Kind;
use tokio_stream::Stream;

use crate::client::{Client, invalid_name};
use crate::error::{Failure, QueryError};

/// What happened to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEventKind {
    /// The lock's state when the watch started.
    Snapshot,
    /// A session was granted the lock.
    Granted,
    /// The holder released the lock (or closed its session).
    Released,
    /// The holder's session expired.
    Expired,
    /// The holder proclaimed a new value ([`LockEvent::value`]).
    ValueSet,
    /// A kind this client does not know (from a newer server).
    Other(i32),
}

impl LockEventKind {
    /// A lowercase name: `snapshot`, `granted`, `released`, `expired`, `value_set`, or
    /// `other`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LockEventKind::Snapshot => "snapshot",
            LockEventKind::Granted => "granted",
            LockEventKind::Released => "released",
            LockEventKind::Expired => "expired",
            LockEventKind::ValueSet => "value_set",
            LockEventKind::Other(_) => "other",
        }
    }
}

/// One change of a lock's holder.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockEvent {
    pub kind: LockEventKind,
    pub lock: String,
    /// The holder after a grant (or in a snapshot), or the former holder after a release or an
    /// expiry; `None` if there is none.
    pub session: Option<SessionId>,
    /// The token of that holder's grant.
    pub token: Option<Token>,
    /// Sessions waiting for the lock.
    pub waiters: u64,
    /// The holding's value after a snapshot, a grant or a proclaim; `None` if it has none, and
    /// after a release or an expiry.
    pub value: Option<String>,
    /// How the grant holds the lock (after a grant, in a snapshot); exclusive otherwise.
    pub access: Access,
}

/// The events of one lock, from [`crate::Client::watch`].
///
/// When the stream fails in a way a new one may get past (the member is not, or no longer, the
/// leader; the connection broke; the member is shutting down), it is reopened at the client's
/// next endpoint, the leader if a member named it, as every call of the client does. The new
/// stream starts with a [`LockEventKind::Snapshot`] of the lock's state, which covers whatever
/// happened in between: a consumer that treats every snapshot as "the state is now this"
/// misses nothing. If no stream can be reopened within the client's retry budget, the error
/// is returned and the events end; a refusal (an invalid name, …) ends them at once.
pub struct LockEvents {
    client: Client,
    lock: String,
    /// The open stream and the generation of the endpoint it came from; `None` after the
    /// events ended.
    inner: Option<(tonic::Streaming<pb::WatchEvent>, u64)>,
    /// A new stream being opened.
    reopening: Option<Reopening>,
}

type Reopening = Pin<Box<dyn Future<Output = Result<Opened, QueryError>> + Send>>;

/// A watch stream and the generation of the endpoint it was opened at.
pub(crate) type Opened = (tonic::Streaming<pb::WatchEvent>, u64);

impl std::fmt::Debug for LockEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockEvents")
            .field("lock", &self.lock)
            .field("open", &self.inner.is_some())
            .field("reopening", &self.reopening.is_some())
            .finish_non_exhaustive()
    }
}

impl LockEvents {
    pub(crate) fn new(client: Client, lock: String, opened: Opened) -> LockEvents {
        LockEvents {
            client,
            lock,
            inner: Some(opened),
            reopening: None,
        }
    }

    /// The next event; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Option<Result<LockEvent, QueryError>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for LockEvents {
    type Item = Result<LockEvent, QueryError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(reopening) = this.reopening.as_mut() {
                let reopened = ready!(reopening.as_mut().poll(cx));
                this.reopening = None;
                match reopened {
                    Ok(opened) => this.inner = Some(opened),
                    Err(error) => return Poll::Ready(Some(Err(error))),
                }
            }
            let Some((stream, generation)) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            let status = match ready!(Pin::new(stream).poll_next(cx)) {
                Some(Ok(event)) => return Poll::Ready(Some(convert(&this.lock, event))),
                None => {
                    this.inner = None;
                    return Poll::Ready(None);
                }
                Some(Err(status)) => status,
            };
            let generation = *generation;
            this.inner = None;
            let failure = Failure::from_status(&status);
            let reopen = matches!(
                failure,
                Failure::NotApplied(_) | Failure::NotLeader { .. } | Failure::Unknown(_)
            );
            if !reopen {
                return Poll::Ready(Some(Err(QueryError::from_failure(failure))));
            }
            tracing::debug!(lock = this.lock, %status, "watch stream failed; reopening");
            this.client.endpoints.after_failure(generation, &failure);
            let client = this.client.clone();
            let lock = this.lock.clone();
            this.reopening = Some(Box::pin(async move { client.open_watch(&lock).await }));
        }
    }
}

fn convert(lock: &str, event: pb::WatchEvent) -> Result<LockEvent, QueryError> {
    if event.lock != lock {
        return Err(QueryError::Protocol(format!(
            "watch of lock {lock:?} sent an event for lock {:?}",
            event.lock
        )));
    }
    let kind = match Kind::try_from(event.kind) {
        Ok(Kind::Snapshot) => LockEventKind::Snapshot,
        Ok(Kind::Granted) => LockEventKind::Granted,
        Ok(Kind::Released) => LockEventKind::Released,
        Ok(Kind::Expired) => LockEventKind::Expired,
        Ok(Kind::ValueSet) => LockEventKind::ValueSet,
        Ok(Kind::Unspecified) | Err(_) => LockEventKind::Other(event.kind),
    };
    let held = event.session != 0;
    let names_a_holding = matches!(kind, LockEventKind::Granted | LockEventKind::ValueSet);
    if names_a_holding && (!held || event.token == 0) {
        return Err(QueryError::Protocol(format!(
            "watch of lock {lock:?} sent a {} of session {} with token {}",
            kind.as_str(),
            event.session,
            event.token
        )));
    }
    Ok(LockEvent {
        kind,
        lock: event.lock,
        session: held.then_some(SessionId::new(event.session)),
        token: (event.token != 0).then_some(Token::new(event.token)),
        waiters: event.waiters,
        value: (!event.value.is_empty()).then_some(event.value),
        access: crate::client::access_of(event.access).unwrap_or(Access::Exclusive),
    })
}

impl Client {
    /// Streams the holder changes of `lock`, starting with its current state.
    pub async fn watch(&self, lock: &str) -> Result<LockEvents, QueryError> {
        LockName::new(lock).map_err(|e| QueryError::InvalidArgument(invalid_name(lock, &e)))?;
        let opened = self.open_watch(lock).await?;
        Ok(LockEvents::new(self.clone(), lock.to_string(), opened))
    }

    /// Opens a watch stream, with retries; also returns the generation of the endpoint that
    /// answered, for [`Endpoints::after_failure`] when the stream fails.
    pub(crate) async fn open_watch(&self, lock: &str) -> Result<Opened, QueryError> {
        let request = pb::WatchRequest {
            lock: lock.to_string(),
        };
        self.read_with_retries(|mut raw| {
            let request = request.clone();
            async move { raw.watch(request).await }
        })
        .await
        .map(|stream| (stream, self.endpoints.current().generation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: Kind, session: u64, token: u64) -> pb::WatchEvent {
        pb::WatchEvent {
            kind: kind as i32,
            lock: "a".into(),
            session,
            token,
            waiters: 2,
            value: String::new(),
            access: None,
        }
    }

    #[test]
    fn a_free_snapshot_has_no_holder() {
        let e = convert("a", event(Kind::Snapshot, 0, 0)).unwrap();
        assert_eq!(
            (e.kind, e.session, e.token, e.waiters),
            (LockEventKind::Snapshot, None, None, 2)
        );
    }

    #[test]
    fn a_grant_without_a_token_is_a_protocol_error() {
        assert!(matches!(
            convert("a", event(Kind::Granted, 4, 0)),
            Err(QueryError::Protocol(_))
        ));
        assert!(matches!(
            convert("b", event(Kind::Granted, 4, 1)),
            Err(QueryError::Protocol(_))
        ));
    }

    #[test]
    fn an_unknown_kind_is_passed_on() {
        let mut raw = event(Kind::Released, 4, 9);
        raw.kind = 42;
        assert_eq!(convert("a", raw).unwrap().kind, LockEventKind::Other(42));
    }
}
