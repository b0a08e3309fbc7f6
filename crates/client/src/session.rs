//! Sessions kept alive in the background, and the lock guards they hand out.
//!
//! A [`Session`] owns a keepalive task that drives the keepalive engine (`keepalive.rs`, whose
//! rules every Palisade client shares, checked by the vectors in `spec/keepalive/v2`): it pings
//! the server over one bidirectional stream every `ttl / 3`, reconnecting after transport errors: to the leader when a member names it, to the
//! client's next endpoint otherwise, as every call of the [`Client`] does. A stream whose oldest
//! ping has gone unanswered for a whole interval is stuck, and is reopened the same way: a
//! leader cut off from its quorum may take a renewal and never answer it while it still answers
//! HTTP/2 pings, so a healthy connection proves nothing about the renewals. A failover shorter
//! than the proven lease is ridden out, and the session is not reported lost. The engine tracks
//! the *proven* lease: a ping
//! acknowledged with `ttl_remaining_ms` proves the lease lasts at least until the ping's **send**
//! time plus that remainder (the server applied it after we sent it), measured on the
//! monotonic clock. When the lease can no longer be proven — no acknowledgement in time — or
//! the server says the session is gone, the session is **lost**: a `watch` flips and every
//! [`LockGuard::lost`] future resolves. A lost session never comes back.
//!
//! A session lost because its lease could not be proven is **not** closed by the library: the
//! keepalive goes on renewing it, best effort, until the owner calls [`Session::close`] or
//! drops the session and its guards. The server may still hold the session (it is slow, not
//! gone); closing it at once would hand its locks to the next waiter while the owner is still
//! stopping whatever it did under them. So: on `lost()`, stop acting, then close or drop.
//!
//! Holding a lock this way is still advisory (a paused process learns of the loss late);
//! what makes it safe is that resources check the guard's [`LockGuard::sequencer`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_clock::SharedClock;

use palisade_core::{Access, RequestId, SessionId, Token};
use palisade_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{AcquireOptions, Client, Grant, keep_alive_request};
use crate::credential::SessionCredential;
use crate::error::{
    AcquireError, CloseError, Failure, ProclaimError, ReleaseError, RenewError, SessionError,
    SessionLost,
};
use crate::keepalive::{Action, CloseReason, Event, Keepalive, LostReason};

/// Pings that may wait for their acknowledgement at once, and messages of a stream not yet
/// taken; the engine finds a stream stuck long before, so this only bounds the channels.
const PINGS_OUTSTANDING_MAX: usize = 8;

/// How to open a [`Session`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// The session's lease: the server ends the session (and releases its locks) if it hears
    /// nothing for this long. The service accepts 1 s to 1 day.
    pub ttl: Duration,
    /// Time between keepalive pings; `None` for `ttl / 3`.
    pub keepalive_interval: Option<Duration>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: Duration::from_secs(10),
            keepalive_interval: None,
        }
    }
}

impl SessionOptions {
    /// Options with this lease length and the default ping interval.
    pub fn with_ttl(ttl: Duration) -> SessionOptions {
        SessionOptions {
            ttl,
            ..SessionOptions::default()
        }
    }
}

impl Client {
    /// Opens a session kept alive in the background until it is closed or dropped.
    pub async fn open_session(&self, options: SessionOptions) -> Result<Session, SessionError> {
        Session::open(self.clone(), options).await
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The lease is proven to last at least until `lease_deadline` (on the client's clock).
    Alive {
        lease_deadline: Duration,
    },
    Ended(SessionLost),
}

impl State {
    fn ended(&self) -> Option<SessionLost> {
        match self {
            State::Alive { .. } => None,
            State::Ended(reason) => Some(*reason),
        }
    }
}

/// What a session and all its guards share. Dropping the last handle stops the keepalive and
/// closes the session in the background.
#[derive(Debug)]
struct Shared {
    client: Client,
    id: SessionId,
    credential: SessionCredential,
    ttl: Duration,
    state: Arc<watch::Sender<State>>,
    keepalive: JoinHandle<()>,
    /// Background releases in flight, by lock; a new acquire of the lock waits for them, so a
    /// late release cannot end a newer grant.
    cleanups: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl Shared {
    fn ended(&self) -> Option<SessionLost> {
        self.state.borrow().ended()
    }

    fn lost(&self) -> impl Future<Output = SessionLost> + Send + 'static {
        let mut state = self.state.subscribe();
        async move {
            match state.wait_for(|s| s.ended().is_some()).await {
                Ok(s) => s.ended().unwrap_or(SessionLost::Closed),
                Err(_) => SessionLost::Closed,
            }
        }
    }

    /// Marks the session ended unless it already is; returns the earlier end if there was one.
    fn end(&self, reason: SessionLost) -> Option<SessionLost> {
        let mut earlier = None;
        self.state.send_if_modified(|s| match s.ended() {
            Some(reason) => {
                earlier = Some(reason);
                false
            }
            None => {
                *s = State::Ended(reason);
                true
            }
        });
        earlier
    }

    /// Releases `lock` in the background, after any earlier background release of it.
    fn spawn_release(&self, lock: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // No runtime: the lock is released when the session ends.
        };
        let mut cleanups = self.cleanups.lock().unwrap_or_else(|e| e.into_inner());
        let earlier = cleanups.remove(&lock);
        let client = self.client.clone();
        let credential = self.credential;
        let session = self.id;
        let name = lock.clone();
        let task = runtime.spawn(async move {
            if let Some(earlier) = earlier {
                let _ = earlier.await;
            }
            if let Err(error) = client.release(credential, &name).await {
                tracing::debug!(session = session.get(), lock = name, %error, "background release failed");
            }
        });
        cleanups.retain(|_, task| !task.is_finished());
        cleanups.insert(lock, task);
    }

    async fn wait_for_cleanup(&self, lock: &str) {
        let pending = self
            .cleanups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(lock);
        if let Some(task) = pending {
            let _ = task.await;
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.keepalive.abort();
        // A session lost for want of a proven lease may still be alive at the server (its
        // keepalive went on renewing it): close it too.
        if matches!(
            self.end(SessionLost::Closed),
            None | Some(SessionLost::LeaseUnproven)
        ) && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let client = self.client.clone();
            let credential = self.credential;
            let session = self.id;
            runtime.spawn(async move {
                if let Err(error) = client.close_session(credential).await {
                    tracing::debug!(session = session.get(), %error, "closing a dropped session failed");
                }
            });
        }
    }
}

/// A session with a lease kept alive in the background.
///
/// Dropping the session (and every guard from it) closes it in the background, best effort;
/// [`Session::close`] closes it and reports the outcome.
#[derive(Debug)]
pub struct Session {
    shared: Arc<Shared>,
}

impl Session {
    pub(crate) async fn open(
        client: Client,
        options: SessionOptions,
    ) -> Result<Session, SessionError> {
        let (lease, first_sent_at) = client.open_session_raw(options.ttl).await?;
        let ttl = lease.ttl;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let engine = Keepalive::new(
            millis(ttl),
            options.keepalive_interval.map(millis),
            millis(first_sent_at),
            palisade_clock::entropy::u64().ok(),
        );
        let lease_deadline = Duration::from_millis(engine.lease_deadline().unwrap_or_default());
        let state = Arc::new(watch::Sender::new(State::Alive { lease_deadline }));
        let keepalive = tokio::spawn(keepalive(
            client.clone(),
            lease.credential,
            engine,
            state.clone(),
        ));
        Ok(Session {
            shared: Arc::new(Shared {
                client,
                id: lease.session,
                credential: lease.credential,
                ttl,
                state,
                keepalive,
                cleanups: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The session's id: it names the session (in `status`, in errors) but acts for nothing.
    pub fn id(&self) -> SessionId {
        self.shared.id
    }

    /// What acts for the session (its id and secret), to hand to another process that must
    /// act for it, such as a child given `PALISADE_SESSION`.
    pub fn credential(&self) -> SessionCredential {
        self.shared.credential
    }

    /// The lease length the server granted.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// `Some(reason)` once the session has ended.
    pub fn ended(&self) -> Option<SessionLost> {
        self.shared.ended()
    }

    /// The lease this process can prove, or `None` once the session has ended.
    pub fn lease_remaining(&self) -> Option<Duration> {
        match *self.shared.state.borrow() {
            State::Alive { lease_deadline } => {
                Some(lease_deadline.saturating_sub(self.shared.client.clock.now()))
            }
            State::Ended(_) => None,
        }
    }

    /// Resolves when the session ends: lost, or closed.
    pub fn lost(&self) -> impl Future<Output = SessionLost> + Send + 'static {
        self.shared.lost()
    }

    /// Takes `lock`, waiting as `options` says. Fails with [`AcquireError::SessionLost`] if the
    /// session ends first. If the returned future is dropped before it completes, the lock is
    /// released (or the wait withdrawn) in the background.
    pub async fn acquire(
        &self,
        lock: &str,
        options: AcquireOptions,
    ) -> Result<LockGuard, AcquireError> {
        self.acquire_with_id(lock, options, crate::request_id())
            .await
    }

    /// [`Session::acquire`] with the caller's request id ([`crate::request_id`]): after an
    /// unknown outcome, an acquire with the same id is answered with the first attempt's
    /// outcome (the same grant, or the same wait), never a second grant.
    pub async fn acquire_with_id(
        &self,
        lock: &str,
        options: AcquireOptions,
        request_id: RequestId,
    ) -> Result<LockGuard, AcquireError> {
        let session = self.shared.id;
        let lost = |reason| AcquireError::SessionLost {
            lock: lock.to_string(),
            session,
            reason,
        };
        if let Some(reason) = self.shared.ended() {
            return Err(lost(reason));
        }
        self.shared.wait_for_cleanup(lock).await;
        let mut cancel = CancelledAcquire {
            shared: &self.shared,
            locks: vec![lock],
        };
        let result = tokio::select! {
            biased;
            reason = self.shared.lost() => Err(lost(reason)),
            result = self.shared.client.acquire_with_id(self.shared.credential, lock, options, request_id) => result,
        };
        cancel.locks.clear();
        Ok(self.guard(result?))
    }

    /// Takes every lock of `parts` at once, or none (a multi-lock; see
    /// [`Client::acquire_all`]): one [`LockGuard`] per lock, in the order of `parts`, each with
    /// its own token and sequencer and each released on its own. Fails with
    /// [`AcquireError::SessionLost`] if the session ends first. If the returned future is
    /// dropped before it completes, every lock is released (or the wait withdrawn) in the
    /// background.
    pub async fn acquire_all(
        &self,
        parts: &[crate::LockPart],
        wait: crate::Wait,
    ) -> Result<Vec<LockGuard>, AcquireError> {
        self.acquire_all_with_id(parts, wait, crate::request_id())
            .await
    }

    /// [`Session::acquire_all`] with the caller's request id ([`crate::request_id`]).
    pub async fn acquire_all_with_id(
        &self,
        parts: &[crate::LockPart],
        wait: crate::Wait,
        request_id: RequestId,
    ) -> Result<Vec<LockGuard>, AcquireError> {
        let session = self.shared.id;
        let locks: Vec<&str> = parts.iter().map(|part| part.lock.as_str()).collect();
        let lost = |reason| AcquireError::SessionLost {
            lock: locks.join(", "),
            session,
            reason,
        };
        if let Some(reason) = self.shared.ended() {
            return Err(lost(reason));
        }
        for lock in &locks {
            self.shared.wait_for_cleanup(lock).await;
        }
        let mut cancel = CancelledAcquire {
            shared: &self.shared,
            locks: locks.clone(),
        };
        let result = tokio::select! {
            biased;
            reason = self.shared.lost() => Err(lost(reason)),
            result = self.shared.client.acquire_all_with_id(self.shared.credential, parts, wait, request_id) => result,
        };
        cancel.locks.clear();
        Ok(result?.into_iter().map(|grant| self.guard(grant)).collect())
    }

    fn guard(&self, grant: Grant) -> LockGuard {
        LockGuard {
            shared: self.shared.clone(),
            grant,
            released: false,
        }
    }

    /// Ends the session: stops the keepalive, releases every lock, withdraws every wait.
    /// Guards of this session see [`SessionLost::Closed`]. After a
    /// [`SessionLost::LeaseUnproven`] this is what gives the locks up: call it once the work
    /// done under them has stopped.
    pub async fn close(self) -> Result<(), CloseError> {
        self.shared.keepalive.abort();
        if let Some(SessionLost::NotFound) = self.shared.end(SessionLost::Closed) {
            return Err(CloseError::SessionNotFound {
                session: self.shared.id,
            });
        }
        self.shared
            .client
            .close_session(self.shared.credential)
            .await
    }
}

/// Releases the locks in the background if an acquire is dropped before it completes: the
/// grants it may have had, or its wait (a multi-lock's wait ends at the first release).
struct CancelledAcquire<'a> {
    shared: &'a Shared,
    locks: Vec<&'a str>,
}

impl Drop for CancelledAcquire<'_> {
    fn drop(&mut self) {
        if self.shared.ended().is_none() {
            for lock in &self.locks {
                self.shared.spawn_release(lock.to_string());
            }
        }
    }
}

/// One grant of a lock, held while the session lives.
///
/// Dropping the guard releases the lock in the background (best effort; closing the session
/// or its expiry releases it otherwise). [`LockGuard::release`] reports the outcome.
#[derive(Debug)]
pub struct LockGuard {
    shared: Arc<Shared>,
    grant: Grant,
    released: bool,
}

impl LockGuard {
    /// The lock's name.
    pub fn lock(&self) -> &str {
        &self.grant.lock
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> Token {
        self.grant.token
    }

    /// The signed, lock-scoped token to present to resources.
    pub fn sequencer(&self) -> &str {
        &self.grant.sequencer
    }

    /// Exclusive, shared (a reader of the phase whose token this is) or a semaphore's slot.
    pub fn access(&self) -> Access {
        self.grant.access
    }

    /// The slot of a semaphore's permit ([`Access::Slot`]); `None` for a lock.
    pub fn slot(&self) -> Option<u32> {
        self.grant.access.slot()
    }

    /// The holding session's id.
    pub fn session_id(&self) -> SessionId {
        self.grant.session
    }

    /// What acts for the holding session (see [`Session::credential`]).
    pub fn session_credential(&self) -> SessionCredential {
        self.shared.credential
    }

    /// The grant, as the server gave it.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// `Some(reason)` once the session (and so this grant) has ended.
    pub fn ended(&self) -> Option<SessionLost> {
        self.shared.ended()
    }

    /// Resolves when the session is lost or closed: from then on this process must assume
    /// another holder may have the lock. Stop using the resource, then release the guard or
    /// close (or drop) the session.
    ///
    /// On [`SessionLost::LeaseUnproven`] the library neither closes the session nor releases
    /// the lock: the keepalive goes on trying to renew the lease, so a server that is only slow
    /// does not hand the lock to the next waiter while this process is still stopping. The
    /// lock is given up when the session is closed or dropped (or the server expires it).
    pub fn lost(&self) -> impl Future<Output = SessionLost> + Send + 'static {
        self.shared.lost()
    }

    /// Replaces the value this grant carries (`None` removes it), as readers of the lock see
    /// it: what a leader proclaims. Refused with [`ProclaimError::NotHolder`] once the grant has
    /// ended.
    pub async fn proclaim(&self, value: Option<&str>) -> Result<(), ProclaimError> {
        if self.shared.ended().is_some() {
            return Err(ProclaimError::SessionNotFound {
                session: self.grant.session,
            });
        }
        self.shared
            .client
            .proclaim(
                self.shared.credential,
                &self.grant.lock,
                self.grant.token,
                value,
            )
            .await
    }

    /// Gives the lock up and reports the outcome.
    pub async fn release(self) -> Result<(), ReleaseError> {
        self.release_with_id(crate::request_id()).await
    }

    /// [`LockGuard::release`] with the caller's request id: if the outcome is unknown, the
    /// caller retries with [`Client::release_with_id`] and the same id, and is answered with
    /// the first attempt's outcome.
    pub async fn release_with_id(mut self, request_id: RequestId) -> Result<(), ReleaseError> {
        self.released = true;
        let session = self.grant.session;
        if let Some(reason) = self.shared.ended() {
            tracing::debug!(session = session.get(), %reason, "release after the session ended");
            return Err(ReleaseError::SessionNotFound { session });
        }
        match self
            .shared
            .client
            .release_with_id(self.shared.credential, &self.grant.lock, request_id)
            .await?
        {
            Some(token) if token == self.grant.token => Ok(()),
            other => Err(ReleaseError::Protocol(format!(
                "release of lock {:?} with token {} ended {}",
                self.grant.lock,
                self.grant.token,
                other.map_or("a wait instead".to_string(), |t| format!("token {t}"))
            ))),
        }
    }
}

impl LockGuard {
    /// Gives this lock up and takes `lock` (another, or the same one again: behind its
    /// waiters, with a new token) in one call and one log write ([`Client::release_then_acquire`]):
    /// a handoff from one lock to the next. This guard ends either way. After a refusal of the
    /// acquire (an error of class [`crate::ErrorClass::NotAcquired`]: busy, the wait ended, a
    /// limit) this lock is released and `lock` is not held; a refused release (the grant had
    /// ended already) changed nothing. After any other error (the service unavailable, an
    /// outcome unknown) this lock may still be held, and `lock` may be held too after an
    /// unknown outcome, with no guard: until [`Client::release`] of each, or the session's end.
    /// If the returned future is dropped before it completes, both locks are released (or the
    /// wait withdrawn) in the background.
    pub async fn release_then_acquire(
        self,
        lock: &str,
        options: AcquireOptions,
    ) -> Result<LockGuard, AcquireError> {
        let ids = (crate::request_id(), crate::request_id());
        self.release_then_acquire_with_ids(lock, options, ids).await
    }

    /// [`LockGuard::release_then_acquire`] with the caller's request ids, the release's and
    /// the acquire's ([`crate::request_id`], two different ones): after an error of unknown
    /// outcome ([`AcquireError::outcome_unknown`]) the caller retries with
    /// [`Client::release_then_acquire_with_ids`], this guard's lock, `lock` and the same ids,
    /// and is answered with the first attempt's outcome: the same grant, never a second one,
    /// and never a release of the grant the first attempt took.
    pub async fn release_then_acquire_with_ids(
        mut self,
        lock: &str,
        options: AcquireOptions,
        (release_id, acquire_id): (RequestId, RequestId),
    ) -> Result<LockGuard, AcquireError> {
        self.released = true;
        let shared = self.shared.clone();
        let session = self.grant.session;
        let lost = |reason| AcquireError::SessionLost {
            lock: lock.to_string(),
            session,
            reason,
        };
        if let Some(reason) = shared.ended() {
            return Err(lost(reason));
        }
        let held = self.grant.lock.as_str();
        shared.wait_for_cleanup(lock).await;
        let mut cancel = CancelledAcquire {
            shared: &shared,
            locks: if held == lock {
                vec![lock]
            } else {
                vec![held, lock]
            },
        };
        let result = tokio::select! {
            biased;
            reason = shared.lost() => Err(lost(reason)),
            result = shared.client.release_then_acquire_with_ids(shared.credential, (held, release_id), lock, options, acquire_id) => result,
        };
        cancel.locks.clear();
        let (released, grant) = result?;
        let next = LockGuard {
            shared: shared.clone(),
            grant,
            released: false,
        };
        if released != Some(self.grant.token) {
            // `next` is dropped, so the new grant is released in the background.
            return Err(AcquireError::Protocol(format!(
                "a handoff from lock {held:?} with token {} ended {}",
                self.grant.token,
                released.map_or("a wait instead".to_string(), |t| format!("token {t}"))
            )));
        }
        Ok(next)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released && self.shared.ended().is_none() {
            self.shared.spawn_release(self.grant.lock.clone());
        }
    }
}

/// Drives the session's keepalive engine ([`Keepalive`]) until the session does not exist any
/// more or the session is closed (which aborts this task): feeds it what the streams and the
/// `Renew` calls answer, and does what it returns. A session lost for want of a proven lease
/// is not closed here: the engine goes on renewing it, best effort, until the owner closes or
/// drops it; closing it here would free its locks while the owner is still stopping.
async fn keepalive(
    client: Client,
    session: SessionCredential,
    mut engine: Keepalive,
    state: Arc<watch::Sender<State>>,
) {
    // As the wire and the logs spell it.
    let id = session.id().get();
    let clock = client.clock.clone();
    let now = || u64::try_from(clock.now().as_millis()).unwrap_or(u64::MAX);
    let (events, mut received) = mpsc::channel::<(u64, StreamMessage)>(PINGS_OUTSTANDING_MAX);
    let mut stream: Option<KeepaliveStream> = None;
    let mut renewal: Option<Renewal> = None;
    // The number of the stream whose messages are taken; a closed one's are dropped.
    let mut streams = 0;
    let mut event = Event::Start;
    loop {
        let actions = engine.on(event, now());
        if let Some(deadline) = engine.lease_deadline() {
            let lease_deadline = Duration::from_millis(deadline);
            state.send_if_modified(|s| match s {
                State::Alive { lease_deadline: d } if *d != lease_deadline => {
                    *d = lease_deadline;
                    true
                }
                _ => false,
            });
        }
        for action in actions {
            match action {
                Action::OpenStream => {
                    streams += 1;
                    stream = Some(KeepaliveStream::open(&client, session, streams, &events));
                }
                Action::SendPing => {
                    if let Some(stream) = &stream {
                        stream.ping();
                    }
                }
                Action::CloseStream(reason) => {
                    if let Some(closed) = stream.take()
                        && reason == CloseReason::Stuck
                    {
                        tracing::debug!(
                            session = id,
                            "keepalive stream is stuck; moving on from its endpoint"
                        );
                        let failure = Failure::Unknown("the keepalive stream is stuck".to_string());
                        client.endpoints.after_failure(closed.generation, &failure);
                    }
                }
                Action::Renew { .. } => {
                    // The engine's wake ends the call at the lease deadline (`CancelRenew`).
                    let client = client.clone();
                    renewal = Some(Box::pin(async move { client.renew(session).await }));
                }
                Action::CancelRenew => renewal = None,
                Action::Pause { until } => {
                    tracing::debug!(session = id, until_ms = until, "keepalive pauses");
                }
                Action::Lost(reason) => {
                    let reason = match reason {
                        LostReason::LeaseUnproven => SessionLost::LeaseUnproven,
                        LostReason::NotFound => SessionLost::NotFound,
                    };
                    let mut ended_now = false;
                    state.send_if_modified(|s| {
                        ended_now = s.ended().is_none();
                        if ended_now {
                            *s = State::Ended(reason);
                        }
                        ended_now
                    });
                    if ended_now {
                        // The application hears of it through `lost()`; it decides how loudly to log.
                        tracing::info!(session = id, %reason, "session lost");
                    }
                }
                Action::Stop => {
                    tracing::debug!(session = id, "the session is gone; keepalive stopped");
                    return;
                }
            }
        }
        let wake = engine.wake();
        event = loop {
            tokio::select! {
                biased;
                () = sleep_until(&clock, wake.map(Duration::from_millis)) => break Event::Tick,
                renewed = async { renewal.as_mut().expect("guarded").await }, if renewal.is_some() => {
                    renewal = None;
                    break match renewed {
                        Ok(remaining) => Event::RenewAnswered {
                            ttl_remaining_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
                        },
                        Err(RenewError::SessionNotFound { .. }) => Event::SessionGone,
                        Err(error) => {
                            tracing::debug!(session = id, %error, "renewal by Renew failed");
                            Event::RenewFailed
                        }
                    };
                }
                Some((number, message)) = received.recv() => {
                    let Some(open) = stream.as_ref().filter(|open| open.number == number) else {
                        continue; // From a stream closed earlier.
                    };
                    let failure = match message {
                        StreamMessage::Opened => break Event::StreamOpened,
                        StreamMessage::Ack(ack) if ack.session == id => break Event::Ack {
                            ttl_remaining_ms: ack.ttl_remaining_ms,
                        },
                        StreamMessage::Ack(ack) => {
                            tracing::warn!(session = id, answered = ack.session, "keepalive answered for another session; ignored");
                            continue;
                        }
                        StreamMessage::Ended => Failure::NotApplied("the keepalive stream ended".to_string()),
                        StreamMessage::Failed(status) => {
                            if session_gone(&status) {
                                stream = None;
                                break Event::SessionGone;
                            }
                            if status.code() == tonic::Code::ResourceExhausted {
                                // The server's budget of keepalive streams is taken (or this
                                // connection's): the engine renews by call.
                                tracing::debug!(session = id, %status, "no keepalive stream; renewing by Renew");
                                stream = None;
                                break Event::StreamRefused;
                            }
                            Failure::from_status(&status)
                        }
                    };
                    tracing::debug!(session = id, ?failure, "keepalive stream failed; reopening");
                    client.endpoints.after_failure(open.generation, &failure);
                    let leader_named = matches!(failure, Failure::NotLeader { .. });
                    stream = None;
                    break Event::StreamBroken { leader_named };
                }
            }
        };
    }
}

/// A `Renew` call in flight, for a connection with no keepalive stream to spare.
type Renewal = Pin<Box<dyn Future<Output = Result<Duration, RenewError>> + Send>>;

/// What a keepalive stream's task hands to the keepalive task.
enum StreamMessage {
    Opened,
    Ack(pb::KeepAliveResponse),
    Ended,
    Failed(tonic::Status),
}

/// One keepalive stream: its pings go through a channel, and a task of its own hands its
/// headers, answers and end to the keepalive task. Dropping it ends the stream.
struct KeepaliveStream {
    number: u64,
    /// The generation of the endpoint it went to, for [`crate::client::Endpoints::after_failure`].
    generation: u64,
    ping: pb::KeepAliveRequest,
    pings: mpsc::Sender<pb::KeepAliveRequest>,
    task: JoinHandle<()>,
}

impl KeepaliveStream {
    /// Opens a stream to the client's current endpoint (the leader as far as it knows), its
    /// first ping with it.
    fn open(
        client: &Client,
        session: SessionCredential,
        number: u64,
        events: &mpsc::Sender<(u64, StreamMessage)>,
    ) -> KeepaliveStream {
        let ping = keep_alive_request(&session);
        let (pings, receiver) = mpsc::channel::<pb::KeepAliveRequest>(PINGS_OUTSTANDING_MAX);
        let _ = pings.try_send(ping.clone());
        let used = client.endpoints.current();
        let mut raw = used.target.raw;
        let events = events.clone();
        let task = tokio::spawn(async move {
            let send = |message| events.send((number, message));
            let mut stream = match raw.keep_alive(ReceiverStream::new(receiver)).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    let _ = send(StreamMessage::Failed(status)).await;
                    return;
                }
            };
            let _ = send(StreamMessage::Opened).await;
            loop {
                let message = match stream.message().await {
                    Ok(Some(ack)) => StreamMessage::Ack(ack),
                    Ok(None) => StreamMessage::Ended,
                    Err(status) => StreamMessage::Failed(status),
                };
                let last = !matches!(message, StreamMessage::Ack(_));
                if send(message).await.is_err() || last {
                    return;
                }
            }
        });
        KeepaliveStream {
            number,
            generation: used.generation,
            ping,
            pings,
            task,
        }
    }

    fn ping(&self) {
        // A full channel means pings long unanswered: the engine finds the stream stuck.
        let _ = self.pings.try_send(self.ping.clone());
    }
}

impl Drop for KeepaliveStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sleeps until `deadline`; never wakes without one.
async fn sleep_until(clock: &SharedClock, deadline: Option<Duration>) {
    match deadline {
        Some(deadline) => clock.sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// True when a keepalive status says the session does not exist any more.
fn session_gone(status: &tonic::Status) -> bool {
    matches!(
        Failure::from_status(status),
        Failure::Core(palisade_core::CoreError::SessionNotFound { .. })
            | Failure::SessionNotFound(_)
    )
}
