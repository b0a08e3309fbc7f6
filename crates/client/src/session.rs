//! Sessions kept alive in the background, and the lock guards they hand out.
//!
//! A [`Session`] owns a keepalive task that pings the server over one bidirectional stream every
//! `ttl / 3`, reconnecting after transport errors: to the leader when a member names it, to the
//! client's next endpoint otherwise, as every call of the [`Client`] does. A stream whose oldest
//! ping has gone unanswered for a whole interval is stuck, and is reopened the same way: a
//! leader cut off from its quorum may take a renewal and never answer it while it still answers
//! HTTP/2 pings, so a healthy connection proves nothing about the renewals. A failover shorter
//! than the proven lease is ridden out, and the session is not reported lost. The task tracks the *proven* lease: a ping
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

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_clock::SharedClock;

use palisade_core::{RequestId, SessionId, Token};
use palisade_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, Grant, keep_alive_request};
use crate::credential::SessionCredential;
use crate::error::{
    AcquireError, CloseError, Failure, ProclaimError, ReleaseError, RenewError, SessionError,
};
use crate::retry::Backoff;

/// Pings that may wait for their acknowledgement at once; a stream is reopened long before
/// (see [`Pinger::one_stream`]), so this only bounds the channel.
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

/// How long an acquire may wait for a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Grant now or fail with [`AcquireError::Busy`].
    Try,
    /// Queue (FIFO) for at most this long, then fail with [`AcquireError::WaitEnded`].
    For(Duration),
    /// Queue until granted or the session ends.
    Forever,
}

/// How to acquire a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireOptions {
    pub wait: Wait,
    /// What the grant tells everyone who reads the lock (status, listings, watches): for a
    /// leader election, the leader's address. 1 to 1024 bytes, no control characters.
    pub value: Option<String>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            wait: Wait::Forever,
            value: None,
        }
    }
}

impl AcquireOptions {
    /// Options with this wait.
    pub fn wait(wait: Wait) -> AcquireOptions {
        AcquireOptions { wait, value: None }
    }

    /// The same options, with the grant carrying `value`.
    pub fn with_value(self, value: impl Into<String>) -> AcquireOptions {
        AcquireOptions {
            value: Some(value.into()),
            ..self
        }
    }
}

/// Why a session ended while its holder still used it. Every lock it held is gone (or must be
/// assumed gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionLost {
    /// The server no longer knows the session: it expired or was closed elsewhere.
    #[error("the lock service no longer knows the session (it expired or was closed)")]
    NotFound,
    /// No renewal was acknowledged within the lease, so the server may have expired it.
    #[error(
        "no keepalive was acknowledged within the session's ttl, so its lease may have run out"
    )]
    LeaseUnproven,
    /// The session was closed by this process.
    #[error("the session was closed")]
    Closed,
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
        let interval = options
            .keepalive_interval
            .unwrap_or(ttl / 3)
            .clamp(Duration::from_millis(10), ttl);
        let lease_deadline = first_sent_at + proven_lease(ttl);
        let state = Arc::new(watch::Sender::new(State::Alive { lease_deadline }));
        let keepalive = tokio::spawn(keepalive(
            client.clone(),
            lease.credential,
            ttl,
            interval,
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
            lock: Some(lock),
        };
        let result = tokio::select! {
            biased;
            reason = self.shared.lost() => Err(lost(reason)),
            result = self.shared.client.acquire_with_id(self.shared.credential, lock, options, request_id) => result,
        };
        cancel.lock = None;
        let grant = result?;
        Ok(LockGuard {
            shared: self.shared.clone(),
            grant,
            released: false,
        })
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

/// Releases the lock in the background if an acquire is dropped before it completes.
struct CancelledAcquire<'a> {
    shared: &'a Shared,
    lock: Option<&'a str>,
}

impl Drop for CancelledAcquire<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock
            && self.shared.ended().is_none()
        {
            self.shared.spawn_release(lock.to_string());
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

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released && self.shared.ended().is_none() {
            self.shared.spawn_release(self.grant.lock.clone());
        }
    }
}

/// Keeps `session` alive until it is lost, then records why.
async fn keepalive(
    client: Client,
    session: SessionCredential,
    ttl: Duration,
    interval: Duration,
    state: Arc<watch::Sender<State>>,
) {
    let lease_deadline = match *state.borrow() {
        State::Alive { lease_deadline } => Some(lease_deadline),
        State::Ended(_) => None,
    };
    let pinger = Pinger {
        client: &client,
        session,
        ttl,
        interval,
        state: &state,
    };
    let reason = match lease_deadline {
        Some(deadline) => pinger.until_lost(Some(deadline)).await,
        None => return,
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
        tracing::info!(session = session.id().get(), %reason, "session lost");
    }
    if reason == SessionLost::LeaseUnproven {
        // The server may still hold the session: keep renewing it, without a deadline, until
        // the owner closes or drops it (which aborts this task). Closing it here would free its
        // locks for the next holder while the owner is still stopping.
        let reason = pinger.until_lost(None).await;
        tracing::debug!(session = session.id().get(), %reason, "stopped renewing a lost session");
    }
}

/// The keepalive pings of one session, over one stream after another.
struct Pinger<'a> {
    client: &'a Client,
    session: SessionCredential,
    ttl: Duration,
    interval: Duration,
    state: &'a watch::Sender<State>,
}

/// How a keepalive stream ended.
enum StreamEnd {
    /// The session is lost: stop pinging.
    Lost(SessionLost),
    /// The stream failed, ended or got stuck, and the pause after it is over: open another.
    Reopen,
}

impl Pinger<'_> {
    /// Pings, reconnecting the stream after transport errors, until the session is lost:
    /// until the proven lease runs out (`LeaseUnproven`) while `lease_deadline` is `Some`, or
    /// the server says the session is gone (`NotFound`). With `None` — the session is already
    /// lost — the renewals are best effort: they extend the server's lease but not the proven
    /// one.
    async fn until_lost(&self, mut lease_deadline: Option<Duration>) -> SessionLost {
        let mut backoff = Backoff::new(self.ttl);
        loop {
            if let StreamEnd::Lost(reason) =
                self.one_stream(&mut lease_deadline, &mut backoff).await
            {
                return reason;
            }
        }
    }

    /// Opens one keepalive stream and pings over it, every `interval`, until it fails, ends or
    /// gets stuck; then pauses before the next one.
    async fn one_stream(
        &self,
        lease_deadline: &mut Option<Duration>,
        backoff: &mut Backoff,
    ) -> StreamEnd {
        // As the wire and the logs spell it.
        let session = self.session.id().get();
        let ping = keep_alive_request(&self.session);
        let clock = &self.client.clock;
        let (pings, receiver) = mpsc::channel::<pb::KeepAliveRequest>(PINGS_OUTSTANDING_MAX);
        let mut sent_at: VecDeque<Duration> = VecDeque::new();
        // The first ping goes out with the stream, so a fresh stream renews at once.
        sent_at.push_back(clock.now());
        let _ = pings.try_send(ping.clone());
        // The stream goes to the client's current endpoint, the leader as far as it knows.
        let used = self.client.endpoints.current();
        let mut raw = used.target.raw;
        let opened = tokio::select! {
            biased;
            () = sleep_until(clock, *lease_deadline) => return StreamEnd::Lost(SessionLost::LeaseUnproven),
            opened = raw.keep_alive(ReceiverStream::new(receiver)) => opened,
        };
        let mut stream = match opened {
            Ok(response) => response.into_inner(),
            Err(status) => {
                if session_gone(&status) {
                    return StreamEnd::Lost(SessionLost::NotFound);
                }
                if status.code() == tonic::Code::ResourceExhausted {
                    // The server's budget of keepalive streams is taken (or this connection's):
                    // renew with one call instead, and try a stream again an interval later.
                    tracing::debug!(session, %status, "no keepalive stream; renewing by Renew");
                    return self.renew_by_call(lease_deadline, backoff).await;
                }
                tracing::debug!(session, %status, endpoint = %used.target.url, "keepalive stream did not open");
                let failure = Failure::from_status(&status);
                return self
                    .failed(used.generation, &failure, backoff, *lease_deadline)
                    .await;
            }
        };
        // The next ping is due one interval after the last one went out (a late tick is not
        // made up for).
        let mut next_ping = clock.now() + self.interval;
        let failure = loop {
            tokio::select! {
                biased;
                () = sleep_until(clock, *lease_deadline) => return StreamEnd::Lost(SessionLost::LeaseUnproven),
                message = stream.message() => match message {
                    Ok(Some(ack)) => self.acknowledged(&ack, &mut sent_at, lease_deadline, backoff),
                    Ok(None) => {
                        tracing::debug!(session, "keepalive stream ended; reopening");
                        break Failure::NotApplied("the keepalive stream ended".to_string());
                    }
                    Err(status) => {
                        if session_gone(&status) {
                            return StreamEnd::Lost(SessionLost::NotFound);
                        }
                        tracing::debug!(session, %status, "keepalive stream failed; reopening");
                        break Failure::from_status(&status);
                    }
                },
                () = clock.sleep_until(next_ping) => {
                    // A renewal takes one commit, milliseconds; one unanswered for a whole
                    // interval will not be answered in time, wherever it is stuck.
                    let unanswered = sent_at
                        .front()
                        .is_some_and(|sent| clock.now().saturating_sub(*sent) >= self.interval);
                    if unanswered || pings.try_send(ping.clone()).is_err() {
                        tracing::debug!(session, "keepalive stream is stuck; reopening");
                        break Failure::Unknown("the keepalive stream is stuck".to_string());
                    }
                    let now = clock.now();
                    sent_at.push_back(now);
                    next_ping = now + self.interval;
                }
            }
        };
        self.failed(used.generation, &failure, backoff, *lease_deadline)
            .await
    }

    /// After a stream to the endpoint of `used` (its generation) failed: moves on, as every
    /// call of the client does ([`crate::client::Endpoints::after_failure`]), and reopens at
    /// once if a member named the leader (a few times in a row at most), after a pause
    /// otherwise. Renewals are idempotent, so sending one again is always safe.
    async fn failed(
        &self,
        used: u64,
        failure: &Failure,
        backoff: &mut Backoff,
        lease_deadline: Option<Duration>,
    ) -> StreamEnd {
        self.client.endpoints.after_failure(used, failure);
        if matches!(failure, Failure::NotLeader { .. }) && backoff.at_once() {
            return StreamEnd::Reopen;
        }
        self.pause(backoff, lease_deadline).await
    }

    /// Takes in a ping's acknowledgement: the lease is proven until the ping's send time plus
    /// the remainder the server reported.
    fn acknowledged(
        &self,
        ack: &pb::KeepAliveResponse,
        sent_at: &mut VecDeque<Duration>,
        lease_deadline: &mut Option<Duration>,
        backoff: &mut Backoff,
    ) {
        // As the wire and the logs spell it.
        let session = self.session.id().get();
        if ack.session != session {
            tracing::warn!(
                session,
                answered = ack.session,
                "keepalive answered for another session; ignored"
            );
            return;
        }
        // Acks answer pings in order; the oldest unanswered ping is the one answered, or an
        // earlier-sent one, which only shortens our view.
        let Some(sent) = sent_at.pop_front() else {
            tracing::warn!(session, "keepalive answer without a ping; ignored");
            return;
        };
        self.proven(
            sent,
            Duration::from_millis(ack.ttl_remaining_ms),
            lease_deadline,
        );
        backoff.reset(self.ttl);
    }

    /// A renewal sent at `sent` was applied with `remaining` of the lease left: the lease is
    /// proven until the send time plus that remainder.
    fn proven(&self, sent: Duration, remaining: Duration, lease_deadline: &mut Option<Duration>) {
        let proven = sent + proven_lease(remaining.min(self.ttl));
        if let Some(deadline) = lease_deadline.as_mut()
            && proven > *deadline
        {
            *deadline = proven;
            self.state.send_replace(State::Alive {
                lease_deadline: proven,
            });
        }
    }

    /// One renewal by the unary `Renew` call, for when the server has no keepalive stream to
    /// spare; then, an interval later, a stream is tried again.
    async fn renew_by_call(
        &self,
        lease_deadline: &mut Option<Duration>,
        backoff: &mut Backoff,
    ) -> StreamEnd {
        let clock = &self.client.clock;
        let sent = clock.now();
        let renewed = tokio::select! {
            biased;
            () = sleep_until(clock, *lease_deadline) => return StreamEnd::Lost(SessionLost::LeaseUnproven),
            renewed = self.client.renew(self.session) => renewed,
        };
        match renewed {
            Ok(remaining) => {
                self.proven(sent, remaining, lease_deadline);
                backoff.reset(self.ttl);
                tokio::select! {
                    biased;
                    () = sleep_until(clock, *lease_deadline) => StreamEnd::Lost(SessionLost::LeaseUnproven),
                    () = clock.sleep_until(sent + self.interval) => StreamEnd::Reopen,
                }
            }
            Err(RenewError::SessionNotFound { .. }) => StreamEnd::Lost(SessionLost::NotFound),
            Err(error) => {
                tracing::debug!(session = self.session.id().get(), %error, "renewal by Renew failed");
                self.pause(backoff, *lease_deadline).await
            }
        }
    }

    /// The pause before the next stream; the session is lost if its lease ran out meanwhile.
    async fn pause(&self, backoff: &mut Backoff, lease_deadline: Option<Duration>) -> StreamEnd {
        if pause(&self.client.clock, backoff, lease_deadline, self.interval).await {
            StreamEnd::Reopen
        } else {
            StreamEnd::Lost(SessionLost::LeaseUnproven)
        }
    }
}

/// Waits before reconnecting; false if the lease ran out meanwhile.
///
/// Without a deadline (a lost session renewed best effort) the wait is at most `interval`, so
/// a server that comes back finds the session renewed before its fresh lease runs out.
async fn pause(
    clock: &SharedClock,
    backoff: &mut Backoff,
    lease_deadline: Option<Duration>,
    interval: Duration,
) -> bool {
    let mut delay = backoff.next_delay().unwrap_or(crate::retry::BACKOFF_MAX);
    if lease_deadline.is_none() {
        delay = delay.min(interval);
    }
    let wake = clock.now() + delay;
    clock
        .sleep_until(lease_deadline.map_or(wake, |deadline| wake.min(deadline)))
        .await;
    lease_deadline.is_none_or(|deadline| clock.now() < deadline)
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

/// How much of a lease the server reported this client counts on. The server's lease is
/// measured from when it applied the renewal, which is after this client sent it, so counting
/// from the send time is already conservative; the margin also covers a late timer here and the
/// two machines' monotonic clocks running at slightly different rates (up to 0.2 %), so that
/// `lost()` fires no later than the server could grant the lock to someone else.
fn proven_lease(remaining: Duration) -> Duration {
    const TIMER_LATENESS_MAX: Duration = Duration::from_millis(20);
    const CLOCK_RATE_DIFFERENCE_PER_MILLE: u32 = 2;
    let margin = TIMER_LATENESS_MAX + remaining * CLOCK_RATE_DIFFERENCE_PER_MILLE / 1000;
    remaining.saturating_sub(margin)
}
