//! Leader election on a lock: [`Election`].
//!
//! An election is a lock whose holder is the leader. A candidate campaigns by acquiring the
//! lock with a value (its address, say) and waiting in the lock's FIFO queue; it leads while
//! its session holds the lock. The grant's fencing token is the leader's **epoch**: every new
//! leader's epoch is higher than every earlier one's, so whatever the leader writes can be
//! fenced with it, exactly as a lock holder's writes are with its sequencer. A leader that was
//! paused past its lease, and has since been replaced, is refused by every resource that saw
//! its successor's epoch.
//!
//! Observers read the leader ([`Election::leader`]) or follow it ([`Election::observe`]): the
//! holder's session, epoch and value, from the lock's status and watch.
//!
//! ```no_run
//! use palisade_client::{Client, Election, SessionOptions};
//!
//! async fn lead(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
//!     let session = client.open_session(SessionOptions::default()).await?;
//!     let election = Election::new(client, "services/scheduler");
//!     // Waits, first come first served, until this session leads.
//!     let leadership = election.campaign(&session, Some("10.0.0.5:8080")).await?;
//!     println!("leading with epoch {}", leadership.epoch());
//!     leadership.proclaim(Some("10.0.0.5:9090")).await?; // moved: tell the observers
//!     let done = tokio::select! {
//!         reason = leadership.lost() => Err(reason),
//!         // Every side effect carries the epoch: here, the sequencer resources verify.
//!         () = schedule(leadership.sequencer()) => Ok(()),
//!     };
//!     match done {
//!         Ok(()) => leadership.resign().await?,
//!         Err(reason) => eprintln!("no longer leading: {reason}"),
//!     }
//!     session.close().await?;
//!     Ok(())
//! }
//!
//! async fn follow(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
//!     let election = Election::new(client, "services/scheduler");
//!     println!("now: {:?}", election.leader().await?);
//!     let mut changes = election.observe().await?;
//!     while let Some(leader) = changes.next().await {
//!         println!("{:?}", leader?); // Some(Leader { session, epoch, value }) or None
//!     }
//!     Ok(())
//! }
//!
//! async fn schedule(_sequencer: &str) {}
//! ```

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use palisade_core::{SessionId, Token};
use tokio_stream::Stream;

use crate::client::{AcquireOptions, Wait};
use crate::client::{Client, LockStatus};
use crate::error::SessionLost;
use crate::error::{AcquireError, ProclaimError, QueryError, ReleaseError};
use crate::session::{LockGuard, Session};
use crate::watch::{LockEvent, LockEventKind, LockEvents};

/// One election, named by its lock.
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: String,
}

/// Who leads an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's session.
    pub session: SessionId,
    /// The leader's epoch: its grant's fencing token, higher than every earlier leader's.
    pub epoch: Token,
    /// What the leader proclaimed (its campaign's value, or a later [`Leadership::proclaim`]).
    pub value: Option<String>,
}

impl Election {
    /// The election held on the lock `name`.
    pub fn new(client: &Client, name: impl Into<String>) -> Election {
        Election {
            client: client.clone(),
            name: name.into(),
        }
    }

    /// The election's lock.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaigns with `session`: waits (in FIFO order behind earlier candidates) until this
    /// session leads, then returns the [`Leadership`]. `value` is what observers see of the
    /// leader. Dropping the future before it completes withdraws the candidacy.
    pub async fn campaign(
        &self,
        session: &Session,
        value: Option<&str>,
    ) -> Result<Leadership, AcquireError> {
        let mut options = AcquireOptions::wait(Wait::Forever);
        options.value = value.map(str::to_string);
        let guard = session.acquire(&self.name, options).await?;
        Ok(Leadership { guard })
    }

    /// The current leader, or `None` while nobody leads; read linearizably (it reflects every
    /// change acknowledged before the call).
    pub async fn leader(&self) -> Result<Option<Leader>, QueryError> {
        Ok(leader_of(&self.client.status(&self.name).await?))
    }

    /// Follows the leader: the first item is the leader now, then one item per change (a new
    /// leader, a new value proclaimed, nobody leading). The stream reopens at another member as
    /// [`LockEvents`] does.
    pub async fn observe(&self) -> Result<LeaderChanges, QueryError> {
        Ok(LeaderChanges {
            events: self.client.watch(&self.name).await?,
            last: None,
        })
    }
}

/// The leader a lock's status shows.
fn leader_of(status: &LockStatus) -> Option<Leader> {
    status.holder.as_ref().map(|holder| Leader {
        session: holder.session,
        epoch: holder.token,
        value: holder.value.clone(),
    })
}

/// This process leads an election: it holds the election's lock.
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The epoch to fence side effects with: the grant's fencing token.
    pub fn epoch(&self) -> Token {
        self.guard.token()
    }

    /// The signed, lock-scoped form of the epoch, for resources that verify sequencers.
    pub fn sequencer(&self) -> &str {
        self.guard.sequencer()
    }

    /// The lock held, with its session and grant.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Tells observers a new value (`None` removes it). Refused with
    /// [`ProclaimError::NotHolder`] once this leadership has ended.
    pub async fn proclaim(&self, value: Option<&str>) -> Result<(), ProclaimError> {
        self.guard.proclaim(value).await
    }

    /// Resolves when the leadership is lost (the session ended or its lease is unproven): from
    /// then on another candidate may lead, so stop acting as the leader.
    pub fn lost(&self) -> impl Future<Output = SessionLost> + Send + 'static {
        self.guard.lost()
    }

    /// Steps down: the next candidate in line leads.
    pub async fn resign(self) -> Result<(), ReleaseError> {
        self.guard.release().await
    }
}

/// The changes of an election's leader, from [`Election::observe`]: `Some(leader)` or `None`
/// (nobody leads), each item different from the one before.
#[derive(Debug)]
pub struct LeaderChanges {
    events: LockEvents,
    /// What was reported last, so that a snapshot after a reopened stream that changes nothing
    /// is not reported again.
    last: Option<Option<Leader>>,
}

impl LeaderChanges {
    /// The next change; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Option<Result<Option<Leader>, QueryError>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

/// The leader after `event`, or `None` for an event that says nothing about it.
fn leader_after(event: LockEvent) -> Option<Option<Leader>> {
    match event.kind {
        LockEventKind::Snapshot | LockEventKind::Granted | LockEventKind::ValueSet => {
            Some(match (event.session, event.token) {
                (Some(session), Some(epoch)) => Some(Leader {
                    session,
                    epoch,
                    value: event.value,
                }),
                _ => None,
            })
        }
        LockEventKind::Released | LockEventKind::Expired => Some(None),
        LockEventKind::Other(_) => None,
    }
}

impl Stream for LeaderChanges {
    type Item = Result<Option<Leader>, QueryError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            let event = match ready!(Pin::new(&mut this.events).poll_next(cx)) {
                Some(Ok(event)) => event,
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => return Poll::Ready(None),
            };
            let Some(leader) = leader_after(event) else {
                continue;
            };
            if this.last.as_ref() == Some(&leader) {
                continue;
            }
            this.last = Some(leader.clone());
            return Poll::Ready(Some(Ok(leader)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: LockEventKind, holder: Option<(u64, u64)>, value: Option<&str>) -> LockEvent {
        LockEvent {
            kind,
            lock: "election".into(),
            session: holder.map(|h| SessionId::new(h.0)),
            token: holder.map(|h| Token::new(h.1)),
            waiters: 0,
            value: value.map(str::to_string),
            access: palisade_core::Access::Exclusive,
        }
    }

    #[test]
    fn grants_and_proclaims_name_the_leader_and_releases_leave_nobody() {
        let leader = leader_after(event(LockEventKind::Granted, Some((3, 9)), Some("a:1")));
        assert_eq!(
            leader,
            Some(Some(Leader {
                session: SessionId::new(3),
                epoch: Token::new(9),
                value: Some("a:1".into()),
            }))
        );
        let proclaimed = leader_after(event(LockEventKind::ValueSet, Some((3, 9)), Some("a:2")));
        assert_eq!(proclaimed.unwrap().unwrap().value.as_deref(), Some("a:2"));
        // A release names the former holder, but nobody leads after it.
        assert_eq!(
            leader_after(event(LockEventKind::Released, Some((3, 9)), None)),
            Some(None)
        );
        assert_eq!(
            leader_after(event(LockEventKind::Snapshot, None, None)),
            Some(None)
        );
        assert_eq!(
            leader_after(event(LockEventKind::Other(42), Some((3, 9)), None)),
            None
        );
    }
}
