//! [`LockEvents`]: the stream of one lock's holder changes.

use std::pin::Pin;
use std::task::{Context, Poll};

use palisade_core::{SessionId, Token};
use palisade_proto::v1 as pb;
use pb::watch_event::Kind;
use tokio_stream::Stream;

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
    /// A kind this client does not know (from a newer server).
    Other(i32),
}

impl LockEventKind {
    /// A lowercase name: `snapshot`, `granted`, `released`, `expired`, or `other`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LockEventKind::Snapshot => "snapshot",
            LockEventKind::Granted => "granted",
            LockEventKind::Released => "released",
            LockEventKind::Expired => "expired",
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
}

/// The events of one lock, from [`crate::Client::watch`]. Ends with an error if the connection
/// breaks; watch again to resume (the new stream starts with a snapshot).
#[derive(Debug)]
pub struct LockEvents {
    lock: String,
    inner: tonic::Streaming<pb::WatchEvent>,
}

impl LockEvents {
    pub(crate) fn new(lock: String, inner: tonic::Streaming<pb::WatchEvent>) -> LockEvents {
        LockEvents { lock, inner }
    }

    /// The next event; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Option<Result<LockEvent, QueryError>> {
        match self.inner.message().await {
            Ok(Some(event)) => Some(convert(&self.lock, event)),
            Ok(None) => None,
            Err(status) => Some(Err(QueryError::from_failure(Failure::from_status(&status)))),
        }
    }
}

impl Stream for LockEvents {
    type Item = Result<LockEvent, QueryError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        Pin::new(&mut this.inner).poll_next(cx).map(|item| {
            item.map(|result| match result {
                Ok(event) => convert(&this.lock, event),
                Err(status) => Err(QueryError::from_failure(Failure::from_status(&status))),
            })
        })
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
        Ok(Kind::Unspecified) | Err(_) => LockEventKind::Other(event.kind),
    };
    let held = event.session != 0;
    if kind == LockEventKind::Granted && (!held || event.token == 0) {
        return Err(QueryError::Protocol(format!(
            "watch of lock {lock:?} sent a grant to session {} with token {}",
            event.session, event.token
        )));
    }
    Ok(LockEvent {
        kind,
        lock: event.lock,
        session: held.then_some(event.session),
        token: (event.token != 0).then_some(event.token),
        waiters: event.waiters,
    })
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
