//! The lock service's operations, independent of any transport: what a client may ask of a
//! node, with typed answers and typed errors.
//!
//! **API Boundary:** this module owns everything a request does beyond decoding it: name
//! validation, permits for calls that stay open, proposing commands, waiting on queued
//! acquires, signing grants, linearizable reads and the watch stream's snapshot and
//! translation. A transport (`grpc` today) only converts its messages to these calls
//! and [`ServiceError`] to its status codes, so a second transport, or the peer RPC service of a
//! cluster, is a thin adapter.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use palisade_core::limits::WAIT_MS_MAX;
use palisade_core::{
    Access, AcquirePart, Command, CoreError, DurationMs, Event, Grant, GrantValue, LockName,
    LockStatus, LockTable, MULTI_LOCKS_MAX, Mode, OpenKey, ReleaseCause, Reply, RequestId, Right,
    SecretDigest, SessionId, TimeMs, Token, Wait, WaitEndCause,
};
use palisade_sequencer::{KeySet, PublicKey, Sequencer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::{Ask, Auth, Caller, LiveCaller};
use crate::limits::WATCH_BUFFER_EVENTS;
use crate::limits::{
    KEEPALIVE_BUFFER_RESPONSES, KEEPALIVE_STREAMS_MAX, LIST_PAGE_LOCKS_MAX,
    LONG_LIVED_CALLS_PER_CONNECTION_MAX, WAITING_ACQUIRES_MAX, WATCHES_MAX,
};
use crate::lock_watchers::Lagged;
use crate::lock_watchers::Published;
use crate::node::{LeaderHint, Node, ProposeError};
use crate::session_secret::{self, SessionSecret};
use crate::state_machine::{WaitOutcome, WaitRegistration};

/// Why an operation did not succeed. Each variant says whether the operation took effect, so a
/// transport maps it to a status without guessing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The lock table refused the command: applied as a refusal, nothing changed.
    #[error(transparent)]
    Refused(#[from] CoreError),
    /// This node is not the leader: nothing was applied; retry on the leader (`leader`, if
    /// this node knows it).
    #[error("{message}")]
    NotLeader {
        leader: Option<LeaderHint>,
        message: String,
    },
    /// The command may or may not have been applied; a retry with the same request id is
    /// answered from the table without applying it twice.
    #[error("{0}; the outcome is unknown, retry with the same request id")]
    OutcomeUnknown(String),
    /// The node is shutting down; a keepalive stream or a watch ends with this. (A queued
    /// acquire ends with [`ServiceError::OutcomeUnknown`]: its wait stays in the table, and a
    /// retry with the same request id picks it up.)
    #[error("the lock service is shutting down; retry")]
    ShuttingDown,
    /// Every permit of a budget for calls that stay open is taken: over all connections, on
    /// the caller's connection, or of the caller's identity.
    #[error(
        "{limit} {calls} are open{scope}, the limit of this server; close unused ones or retry \
         later",
        calls = .budget.calls(),
    )]
    TooManyOpenCalls {
        budget: Budget,
        limit: usize,
        scope: OpenScope,
    },
    /// A watcher fell behind the events and was cut off; it may watch again.
    #[error("the watch fell {missed} events behind and was stopped; watch again to resume")]
    WatchLagged { missed: u64 },
    /// A bug: the table answered a command with a reply of another command, or signing failed.
    #[error("{0}")]
    Internal(String),
}

/// Where a budget of calls that stay open ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenScope {
    /// Over all connections.
    Server,
    /// On the caller's connection.
    Connection,
    /// Of the caller's identity ([`Auth::keepalive_permit`]).
    Identity(String),
}

impl std::fmt::Display for OpenScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenScope::Server => Ok(()),
            OpenScope::Connection => f.write_str(" on this connection"),
            OpenScope::Identity(identity) => write!(
                f,
                " for identity {identity:?} (one per session its quota allows)"
            ),
        }
    }
}

impl From<ProposeError> for ServiceError {
    fn from(e: ProposeError) -> ServiceError {
        match e {
            ProposeError::NotLeader { ref leader } => ServiceError::NotLeader {
                leader: leader.clone(),
                message: e.to_string(),
            },
            ProposeError::Discarded { .. }
            | ProposeError::NotCommittedInTime
            | ProposeError::Stopped(_) => ServiceError::OutcomeUnknown(e.to_string()),
        }
    }
}

type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// How current a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Read {
    /// Reflects every write acknowledged before the read began: the leader answers, after a
    /// ReadIndex round confirms it still leads.
    #[default]
    Linearizable,
    /// This node's own copy, as applied so far: any node answers, with no round trip, possibly
    /// behind the leader.
    Stale,
}

/// A session just opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOpened {
    pub session: SessionId,
    pub ttl_ms: DurationMs,
    /// What acts for the session: presented with every call for it. `None` only for a session
    /// opened before session secrets, found again by a retried open.
    pub secret: Option<SessionSecret>,
}

/// A call for a session: its id, and the secret that proves the caller opened it (empty if the
/// caller sent none).
#[derive(Clone, PartialEq, Eq)]
pub struct SessionProof {
    pub session: SessionId,
    pub secret: Vec<u8>,
}

impl SessionProof {
    pub fn new(session: SessionId, secret: impl Into<Vec<u8>>) -> SessionProof {
        SessionProof {
            session,
            secret: secret.into(),
        }
    }
}

impl std::fmt::Debug for SessionProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionProof")
            .field("session", &self.session)
            .field("secret_bytes", &self.secret.len())
            .finish()
    }
}

/// What an acquire asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    pub lock: String,
    /// Identifies the acquire within its session: a retry with the same id acts once.
    pub request_id: RequestId,
    pub wait: Wait,
    /// What the grant carries for everyone who reads the lock.
    pub value: Option<GrantValue>,
    /// Exclusive, shared, or a permit of a semaphore of a given size.
    pub mode: Mode,
}

impl AcquireRequest {
    /// An acquire of `lock` without a value.
    pub fn new(lock: impl Into<String>, request_id: RequestId, wait: Wait) -> AcquireRequest {
        AcquireRequest {
            lock: lock.into(),
            request_id,
            wait,
            value: None,
            mode: Mode::Exclusive,
        }
    }
}

/// What a multi-lock asks for: every lock of `parts`, each in its mode, granted together or
/// not at all ([`Command::AcquireAll`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireAllRequest {
    /// 1 to [`MULTI_LOCKS_MAX`] distinct locks.
    pub parts: Vec<AcquirePart>,
    /// Identifies the multi-lock within its session: a retry with the same id acts once.
    pub request_id: RequestId,
    /// For the whole group.
    pub wait: Wait,
}

/// A lock granted, with the sequencer that proves it to a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedGrant {
    pub lock: String,
    pub session: SessionId,
    pub token: Token,
    /// Exclusive, shared, or a semaphore's slot; the sequencer says the same.
    pub access: Access,
    pub sequencer: Sequencer,
}

/// A lease renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub session: SessionId,
    /// How much of the lease is left, as this leader measures it now.
    pub ttl_remaining_ms: DurationMs,
}

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView {
    pub session: SessionId,
    pub token: Token,
    pub lease_remaining_ms: DurationMs,
    /// What the holder attached to its grant.
    pub value: Option<GrantValue>,
    pub access: Access,
}

/// One lock as a client sees it, with durations measured from now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockView {
    pub lock: String,
    pub holder: Option<HolderView>,
    /// The readers of the current shared phase, or a semaphore's permit holders.
    pub sharers: Vec<HolderView>,
    /// A semaphore's number of permits; `None` for a lock.
    pub permits: Option<u32>,
    /// The last token granted for this lock ([`Token::ZERO`] if never granted).
    pub last_token: Token,
    /// Waiting sessions, first in line first.
    pub waiters: Vec<SessionId>,
    /// How each waiter asks to hold the lock, in the order of `waiters`.
    pub waiter_modes: Vec<Mode>,
    /// Set while the lock sits out its lock-delay.
    pub lock_delay_remaining_ms: Option<DurationMs>,
}

impl LockView {
    /// A lock the table does not hold: free, with no waiter, `last_token` its last grant's.
    pub fn free(lock: String, last_token: Option<Token>) -> LockView {
        LockView {
            lock,
            holder: None,
            sharers: Vec::new(),
            permits: None,
            last_token: last_token.unwrap_or(Token::ZERO),
            waiters: Vec::new(),
            waiter_modes: Vec::new(),
            lock_delay_remaining_ms: None,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockPage {
    pub locks: Vec<LockView>,
    /// Where the next page starts (exclusive), or `None` if this was the last page.
    pub next_start_after: Option<String>,
}

/// What a watcher hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The lock's state when the watch began.
    Snapshot,
    Granted,
    Released,
    /// The holder's session expired.
    Expired,
    /// The holder proclaimed a new value.
    ValueSet,
}

/// One change of a watched lock (or its state when the watch began).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockChange {
    pub kind: ChangeKind,
    pub lock: String,
    /// The holder concerned (for a snapshot: the holder then, session 0 and [`Token::ZERO`]
    /// if none).
    pub session: SessionId,
    pub token: Token,
    /// Sessions waiting after the change.
    pub waiters: u64,
    /// The holding's value after a snapshot, a grant or a proclaim; `None` after a release.
    pub value: Option<GrantValue>,
    /// How the grant holds the lock (a grant, a snapshot's holder); exclusive otherwise.
    pub access: Access,
}

/// The budgets of calls that stay open, one per kind of call, so that no number of watches
/// keeps an acquire from waiting or a session from being renewed, and no number of waiting
/// acquires keeps a session from being renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    KeepAlive,
    Watch,
    WaitingAcquire,
}

impl Budget {
    fn calls(self) -> &'static str {
        match self {
            Budget::KeepAlive => "keepalive streams",
            Budget::Watch => "watches",
            Budget::WaitingAcquire => "acquires waiting in a queue",
        }
    }
}

/// The connection a call came in on, for the per-connection budgets: its peer's address
/// (`None` if the transport has none, which counts only toward the budgets of all connections).
pub type ConnectionId = Option<SocketAddr>;

/// How many calls of one budget each connection has open.
type OpenPerConnection = Arc<Mutex<HashMap<SocketAddr, usize>>>;

/// One budget of calls that stay open: at most `total` over all connections, at most
/// `per_connection` on any one.
#[derive(Debug)]
struct Permits {
    budget: Budget,
    total: Arc<Semaphore>,
    total_max: usize,
    per_connection_max: usize,
    per_connection: OpenPerConnection,
}

/// A call's place in a budget, given back when dropped.
#[derive(Debug)]
struct Permit {
    _total: OwnedSemaphorePermit,
    connection: Option<(OpenPerConnection, SocketAddr)>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some((counts, addr)) = &self.connection {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(open) = counts.get_mut(addr) {
                *open -= 1;
                if *open == 0 {
                    counts.remove(addr);
                }
            }
        }
    }
}

impl Permits {
    fn new(budget: Budget, total_max: usize) -> Permits {
        Permits {
            budget,
            total: Arc::new(Semaphore::new(total_max)),
            total_max,
            per_connection_max: LONG_LIVED_CALLS_PER_CONNECTION_MAX,
            per_connection: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn take(&self, connection: ConnectionId) -> Result<Permit> {
        let refused = |limit, scope| ServiceError::TooManyOpenCalls {
            budget: self.budget,
            limit,
            scope,
        };
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| refused(self.total_max, OpenScope::Server))?;
        let connection = match connection {
            None => None,
            Some(addr) => {
                let mut counts = self
                    .per_connection
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let open = counts.entry(addr).or_insert(0);
                if *open >= self.per_connection_max {
                    return Err(refused(self.per_connection_max, OpenScope::Connection));
                }
                *open += 1;
                Some((self.per_connection.clone(), addr))
            }
        };
        Ok(Permit {
            _total: total,
            connection,
        })
    }
}

/// The lock service over one node. Clones share the node, the permits and the [`Auth`].
#[derive(Debug, Clone)]
pub struct LockService {
    node: Arc<Node>,
    /// Who may do what, and the per-identity quotas: checked before anything is proposed.
    auth: Arc<Auth>,
    /// Permits for the calls that stay open, by kind.
    keepalive: Arc<Permits>,
    watches: Arc<Permits>,
    waiting_acquires: Arc<Permits>,
}

impl LockService {
    /// The service without authentication or authorization ([`Auth::open`]).
    pub fn new(node: Arc<Node>) -> Self {
        LockService::with_auth(node, Arc::new(Auth::open()))
    }

    /// The service checking every call against `auth`.
    pub fn with_auth(node: Arc<Node>, auth: Arc<Auth>) -> Self {
        LockService {
            node,
            auth,
            keepalive: Arc::new(Permits::new(Budget::KeepAlive, KEEPALIVE_STREAMS_MAX)),
            watches: Arc::new(Permits::new(Budget::Watch, WATCHES_MAX)),
            waiting_acquires: Arc::new(Permits::new(Budget::WaitingAcquire, WAITING_ACQUIRES_MAX)),
        }
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    pub fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    /// Opens a session. `open_key` (if not empty) makes a retried open return the session the
    /// first attempt opened, and the same secret, instead of a second one.
    ///
    /// The session belongs to `caller`'s identity, if it has one: only that identity acts for
    /// it. Once a policy is configured, opening needs an authenticated caller (no right: the
    /// locks taken in the session are checked one by one) and a place in its quota of sessions.
    pub async fn open_session(
        &self,
        caller: &Caller,
        open_key: &[u8],
        ttl_ms: DurationMs,
    ) -> Result<SessionOpened> {
        self.auth.require_authenticated(caller)?;
        let open_key = match open_key {
            [] => None,
            bytes => Some(OpenKey::new(bytes).map_err(CoreError::InvalidOpenKey)?),
        };
        // Checked before proposing, so a refused open costs no log entry.
        let (ttl_ms_min, ttl_ms_max) = self.node.read_as_leader(|t| {
            let limits = t.limits();
            (limits.session_ttl_ms_min, limits.session_ttl_ms_max)
        })?;
        if !(ttl_ms_min..=ttl_ms_max).contains(&ttl_ms) {
            return Err(CoreError::TtlOutOfRange {
                ttl_ms,
                ttl_ms_min,
                ttl_ms_max,
            }
            .into());
        }
        // The table indexes sessions by a keyed hash of the open key, never the key itself, so
        // the log holds nothing a stranger could present (N12); the secret comes from the key.
        let founding = self.node.founding_key();
        let index = match &open_key {
            Some(key) => Some(session_secret::open_key_index(&founding, key)?),
            None => None,
        };
        // A retried open (its key's session lives) takes nothing more: no quota is asked.
        let retried = match &index {
            Some(index) => self
                .node
                .read_as_leader(|t| t.session_opened_with(index).is_some())?,
            None => false,
        };
        let _reservation = if retried {
            None
        } else {
            self.auth.reserve(caller, Ask::Session, |owner| {
                Ok::<_, ServiceError>(self.node.read_as_leader(|t| t.usage_of(owner))?)
            })?
        };
        let secret = match &open_key {
            None => SessionSecret::draw().map_err(|e| ServiceError::Internal(e.to_string()))?,
            Some(key) => SessionSecret::for_open_key(&founding, key),
        };
        let command = Command::OpenSession {
            open_key: index,
            ttl_ms,
            secret_digest: Some(secret.digest()),
            owner: caller.identity().cloned(),
        };
        let (session, ttl_ms) = match self.apply(command).await? {
            Reply::SessionOpened {
                session, ttl_ms, ..
            } => (session, ttl_ms),
            other => return Err(unexpected(other)),
        };
        // A retried open finds the session its key opened, with the digest and the owner it
        // was opened with: only its owner is handed it.
        let (stored, owner) = self.node.read_table(|t| {
            (
                t.session_secret_digest(session),
                t.session_owner(session).flatten().cloned(),
            )
        });
        Auth::check_owner(caller, session, owner.as_ref())?;
        let secret = match stored {
            Some(Some(digest)) if digest != secret.digest() => {
                return Err(ServiceError::Internal(format!(
                    "session {session} was opened with another secret than its open key gives"
                )));
            }
            // Ended already, or opened with this secret.
            None | Some(Some(_)) => Some(secret),
            // Opened before session secrets: acted for by its id alone.
            Some(None) => None,
        };
        Ok(SessionOpened {
            session,
            ttl_ms,
            secret,
        })
    }

    /// Checks, before anything is proposed for a session, that the caller opened it: the
    /// session exists and `proof` carries its secret. Read on the leader, whose table holds
    /// every session a client was told of; a session it does not know is looked for again
    /// after a linearizable read (this node may have been deposed without knowing it yet),
    /// and refused as not found only then. A session's digest never changes and ids are never
    /// reused, so nothing can change the outcome between this check and the proposal.
    ///
    /// `read` picks what else the caller needs to check from the same table.
    ///
    /// Then the session's owner: a session opened by an identity is acted for by that identity
    /// alone, whoever else holds its secret (`session_not_owned`).
    async fn authorize<T>(
        &self,
        caller: &Caller,
        proof: &SessionProof,
        read: impl Fn(&LockTable) -> T,
    ) -> Result<T> {
        let look = |t: &LockTable| {
            (
                t.session_secret_digest(proof.session),
                t.session_owner(proof.session).flatten().cloned(),
                read(t),
            )
        };
        let (mut stored, mut owner, mut other) = self.node.read_as_leader(look)?;
        if stored.is_none() {
            self.node.linearizable_read().await?;
            (stored, owner, other) = self.node.read_as_leader(look)?;
        }
        let stored: Option<SecretDigest> = stored.ok_or(CoreError::SessionNotFound {
            session: proof.session,
        })?;
        session_secret::check(proof.session, &proof.secret, stored)?;
        Auth::check_owner(caller, proof.session, owner.as_ref())?;
        Ok(other)
    }

    /// Renews a session's lease once.
    ///
    /// Under a policy, the owner must still have the lock right on every lock the session holds
    /// or waits for: keeping a lock takes the right to take it, so a right a reload took away
    /// lets the lease run out (giving a lock up takes none).
    pub async fn renew(&self, caller: &Caller, proof: &SessionProof) -> Result<Renewal> {
        self.authorize_renewal(caller, proof).await?;
        let session = proof.session;
        match self.apply(Command::KeepAlive { session }).await? {
            Reply::KeptAlive {
                session,
                expires_at_ms,
            } => Ok(Renewal {
                session,
                ttl_remaining_ms: expires_at_ms.saturating_duration_since(self.node.now_ms()),
            }),
            other => Err(unexpected(other)),
        }
    }

    /// The checks of a renewal ([`LockService::renew`]), without renewing.
    async fn authorize_renewal(&self, caller: &Caller, proof: &SessionProof) -> Result<()> {
        let policy = self.auth.has_policy();
        let kept = self
            .authorize(caller, proof, |t| {
                policy
                    .then(|| t.session_status(proof.session))
                    .flatten()
                    .map(|s| [s.held, s.waiting].concat())
            })
            .await?;
        for lock in kept.iter().flatten() {
            self.auth.require(caller, Right::Lock, lock)?;
        }
        Ok(())
    }

    /// Renews a session each time `pings` yields, answering each renewal in order. The stream
    /// ends after the first failure, when `pings` ends, or with [`ServiceError::ShuttingDown`].
    ///
    /// After each reload of the token file or the policy, the stream is judged again at once:
    /// its caller must still be authenticated, and the last session it renewed must still pass
    /// a renewal's checks; otherwise it ends with the refusal.
    pub fn keep_alive<S>(
        &self,
        connection: ConnectionId,
        mut caller: LiveCaller,
        mut pings: S,
    ) -> Result<impl Stream<Item = Result<Renewal>> + use<S>>
    where
        S: Stream<Item = SessionProof> + Send + Unpin + 'static,
    {
        let identity_permit =
            self.auth
                .keepalive_permit(caller.caller())
                .map_err(|(identity, limit)| ServiceError::TooManyOpenCalls {
                    budget: Budget::KeepAlive,
                    limit: limit as usize,
                    scope: OpenScope::Identity(identity.to_string()),
                })?;
        let permit = self.keepalive.take(connection)?;
        let (tx, rx) = mpsc::channel(KEEPALIVE_BUFFER_RESPONSES);
        let service = self.clone();
        tokio::spawn(async move {
            let _permits = (permit, identity_permit);
            let mut last: Option<SessionProof> = None;
            loop {
                let proof = tokio::select! {
                    biased;
                    // First, so no ping is renewed for a caller a reload refuses.
                    () = caller.reloaded() => {
                        if let Err(refused) = service.still_renewing(&caller, last.as_ref()).await {
                            let _ = tx.send(Err(refused)).await;
                            return;
                        }
                        continue;
                    }
                    next = pings.next() => match next {
                        Some(proof) => proof,
                        None => return,
                    },
                    () = service.node.stopping() => {
                        let _ = tx.send(Err(ServiceError::ShuttingDown)).await;
                        return;
                    }
                };
                let answer = service.renew(caller.caller(), &proof).await;
                last = Some(proof);
                let failed = answer.is_err();
                if tx.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }

    /// After a reload: whether a keepalive stream of `caller` may go on, `last` the session it
    /// renewed last (none yet: only the caller is checked).
    async fn still_renewing(&self, caller: &LiveCaller, last: Option<&SessionProof>) -> Result<()> {
        caller.still_authenticated(&self.auth)?;
        match last {
            Some(proof) => self.authorize_renewal(caller.caller(), proof).await,
            None => Ok(()),
        }
    }

    /// Closes a session, releasing its locks and ending its waits.
    pub async fn close_session(&self, caller: &Caller, proof: &SessionProof) -> Result<()> {
        self.authorize(caller, proof, |_| ()).await?;
        let session = proof.session;
        match self.apply(Command::CloseSession { session }).await? {
            Reply::SessionClosed { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Acquires the request's lock for `session`, waiting in its queue as the request's wait
    /// allows, and signs the grant. A retry with the same request id returns the same grant (or
    /// joins the same wait) instead of acquiring again.
    ///
    /// Needs the lock right on `lock`, and a place in the identity's quotas of locks (and of
    /// waiters, if it may wait), unless the session already holds or waits for it (a retry).
    pub async fn acquire(
        &self,
        connection: ConnectionId,
        caller: &Caller,
        proof: &SessionProof,
        request: AcquireRequest,
    ) -> Result<SignedGrant> {
        self.check_acquire(caller, proof, &request.lock).await?;
        let session = proof.session;
        let reserved = self.reserve_acquire(
            connection,
            caller,
            session,
            std::slice::from_ref(&request.lock),
            request.wait,
        )?;
        let (lock, token, access) = self.propose_acquire(session, request, reserved).await?;
        self.sign(lock, session, token, access)
    }

    /// Releases `release` (or withdraws the session's wait for it), then acquires as `request`
    /// asks, in one log entry ([`Command::ReleaseThenAcquire`]): one round trip and one log
    /// write for a handoff to the next lock, or to the same lock again. Returns the released
    /// grant's token (`None` for a withdrawn wait) and the signed grant.
    ///
    /// A refused release (the session neither holds nor waits for `release`) changes nothing;
    /// any other error is the acquire's, after the release took effect. Needs what
    /// [`LockService::release`] and [`LockService::acquire`] need; the quota still counts the
    /// released lock while the request is checked.
    pub async fn release_then_acquire(
        &self,
        connection: ConnectionId,
        caller: &Caller,
        proof: &SessionProof,
        (release, release_request_id): (String, RequestId),
        request: AcquireRequest,
    ) -> Result<(Option<Token>, SignedGrant)> {
        let session = proof.session;
        let release = self
            .authorize_lock(caller, proof, release)
            .await?
            .into_string();
        self.check_acquire(caller, proof, &request.lock).await?;
        let reserved = self.reserve_acquire(
            connection,
            caller,
            session,
            std::slice::from_ref(&request.lock),
            request.wait,
        )?;
        let command = Command::ReleaseThenAcquire {
            session,
            release,
            release_request_id,
            lock: request.lock,
            request_id: request.request_id,
            wait: request.wait,
            value: request.value,
            mode: request.mode,
        };
        let (index, reply, reserved) = self.propose_reserved(command, reserved).await?;
        let (released, acquired) = match reply {
            Reply::ReleasedThenAcquired { released, acquired } => (released, *acquired),
            other => return Err(unexpected(other)),
        };
        let (lock, token, access) = self
            .acquired(session, index, acquired, reserved.registrations)
            .await?;
        Ok((released, self.sign(lock, session, token, access)?))
    }

    /// Acquires every lock of the request for `session` at once, or none (a multi-lock): the
    /// table grants them in one entry, each with its own token, or queues one waiter for all of
    /// them, which this call awaits as the request's wait allows. Returns the signed grants in
    /// the order of the request's parts. A retry with the same request id returns the same
    /// grants (or joins the same wait).
    ///
    /// Needs the lock right on every lock named (one lock outside the caller's scope refuses
    /// the whole request), and a place in the identity's quotas for each of them.
    pub async fn acquire_all(
        &self,
        connection: ConnectionId,
        caller: &Caller,
        proof: &SessionProof,
        request: AcquireAllRequest,
    ) -> Result<Vec<SignedGrant>> {
        let locks = self
            .check_acquire_all(caller, proof, &request.parts)
            .await?;
        let session = proof.session;
        let reserved = self.reserve_acquire(connection, caller, session, &locks, request.wait)?;
        let grants = self
            .propose_acquire_all(session, request, locks, reserved)
            .await?;
        (grants.into_iter())
            .map(|(lock, token, access)| self.sign(lock, session, token, access))
            .collect()
    }

    /// What a multi-lock must pass before it costs anything, as [`LockService::check_acquire`]
    /// for each lock: 1 to [`MULTI_LOCKS_MAX`] valid names, each once, each with the lock
    /// right. Returns the names, in order.
    async fn check_acquire_all(
        &self,
        caller: &Caller,
        proof: &SessionProof,
        parts: &[AcquirePart],
    ) -> Result<Vec<String>> {
        let count = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        if count == 0 || count > MULTI_LOCKS_MAX {
            return Err(CoreError::MultiLockSize {
                locks: count,
                locks_max: MULTI_LOCKS_MAX,
            }
            .into());
        }
        let name_bytes_max = self
            .authorize(caller, proof, |t| t.limits().lock_name_bytes_max)
            .await?;
        let mut locks: Vec<String> = Vec::with_capacity(parts.len());
        for part in parts {
            let lock = LockName::with_limit(part.lock.as_str(), name_bytes_max)
                .map_err(CoreError::InvalidLockName)?
                .into_string();
            if locks.contains(&lock) {
                return Err(CoreError::MultiLockRepeated { lock }.into());
            }
            locks.push(lock);
        }
        for lock in &locks {
            self.auth.require(caller, Right::Lock, lock)?;
        }
        Ok(locks)
    }

    /// What an acquire must pass before it costs anything: a live session of the caller's, a
    /// valid lock name, the lock right. Checked before proposing, as the table would check
    /// them: a refused acquire costs no log entry.
    async fn check_acquire(&self, caller: &Caller, proof: &SessionProof, lock: &str) -> Result<()> {
        let lock = self.authorize_lock(caller, proof, lock).await?;
        self.auth.require(caller, Right::Lock, lock.as_str())?;
        Ok(())
    }

    /// The caller's session authorized (see [`LockService::authorize`]) and `lock` checked
    /// as the table will check it: a lock name (within the ceiling every [`LockName`] keeps)
    /// and within the table's configured limit. Every call that proposes a command naming a
    /// lock takes this path first, so a refused name costs no log entry.
    async fn authorize_lock(
        &self,
        caller: &Caller,
        proof: &SessionProof,
        lock: impl Into<String>,
    ) -> Result<LockName> {
        let name_bytes_max = self
            .authorize(caller, proof, |t| t.limits().lock_name_bytes_max)
            .await?;
        Ok(LockName::with_limit(lock, name_bytes_max).map_err(CoreError::InvalidLockName)?)
    }

    /// Reserves what an acquire of `locks` (one, or a multi-lock's) holds while it is
    /// proposed: the caller's quota, and for a waiting acquire a place among the connection's
    /// waiting calls and a registration for the outcome of each lock's wait. Each is released
    /// when the returned value is dropped.
    fn reserve_acquire<'a>(
        &'a self,
        connection: ConnectionId,
        caller: &Caller,
        session: SessionId,
        locks: &[String],
        wait: Wait,
    ) -> Result<ReservedAcquire<'a>> {
        let quota = self.auth.reserve(
            caller,
            Ask::Locks {
                locks: locks.len(),
                waits: wait != Wait::Try,
            },
            |owner| {
                // A session that holds or waits for a lock named already: a retry, answered
                // from the table, or a multi-lock the table refuses; either takes nothing new.
                Ok::<_, ServiceError>(self.node.read_as_leader(|t| {
                    if locks
                        .iter()
                        .any(|lock| t.session_holds_or_waits(session, lock))
                    {
                        palisade_core::Usage::default()
                    } else {
                        t.usage_of(owner)
                    }
                })?)
            },
        )?;
        if let Wait::ForMs(wait_ms) = wait
            && wait_ms > WAIT_MS_MAX
        {
            return Err(CoreError::WaitOutOfRange {
                wait_ms,
                wait_ms_max: WAIT_MS_MAX,
            }
            .into());
        }
        // Taken before proposing, so a refused wait is never left queued in the table.
        let permit = (wait != Wait::Try)
            .then(|| self.waiting_acquires.take(connection))
            .transpose()?;
        // Registered before proposing: a grant from the queue may be applied at any moment
        // after.
        let registrations = match wait {
            Wait::Try => Vec::new(),
            _ => (locks.iter())
                .map(|lock| (lock.clone(), self.node.waiters().register(session, lock)))
                .collect(),
        };
        Ok(ReservedAcquire {
            quota,
            _permit: permit,
            registrations,
        })
    }

    /// Proposes the acquire and, if it was queued, waits for its outcome: the lock, the token
    /// and the access granted.
    async fn propose_acquire(
        &self,
        session: SessionId,
        request: AcquireRequest,
        reserved: ReservedAcquire<'_>,
    ) -> Result<(String, Token, Access)> {
        let AcquireRequest {
            lock,
            request_id,
            wait,
            value,
            mode,
        } = request;
        let command = Command::Acquire {
            session,
            lock,
            request_id,
            wait,
            value,
            mode,
        };
        let (index, reply, reserved) = self.propose_reserved(command, reserved).await?;
        self.acquired(session, index, reply, reserved.registrations)
            .await
    }

    /// Proposes `command`, an acquire that `reserved` holds places for. Once it is applied the
    /// table counts the holds or the waits, so the quota's places are given back; the rest
    /// (the wait's permit and registrations) is returned for the wait, with the entry's log
    /// index and the table's reply.
    async fn propose_reserved<'a>(
        &self,
        command: Command,
        mut reserved: ReservedAcquire<'a>,
    ) -> Result<(u64, Reply, ReservedAcquire<'a>)> {
        let (index, output) = self.node.propose_indexed(command).await?;
        reserved.quota = None;
        Ok((index, output.result?, reserved))
    }

    /// What an acquire the table answered with `reply` (at log `index`) comes to: granted now,
    /// or, if it was queued, granted once its wait (`registrations`) is.
    async fn acquired(
        &self,
        session: SessionId,
        index: u64,
        reply: Reply,
        registrations: Vec<(String, WaitRegistration<'_>)>,
    ) -> Result<(String, Token, Access)> {
        match reply {
            Reply::Granted { lock, token, .. } => Ok((lock, token, Access::Exclusive)),
            Reply::GrantedAs {
                lock,
                token,
                access,
                ..
            } => Ok((lock, token, access)),
            // A try-only acquire by a session that already waits for the lock (say a client's
            // retry of a timed wait whose time ran out): the table answers with the wait the
            // session has, but this call asked not to wait, so the lock is busy.
            Reply::Queued { lock, .. } if registrations.is_empty() => Err(self.busy(lock).into()),
            Reply::Queued { .. } => {
                let mut grants = self.await_grants(session, index, registrations).await?;
                grants
                    .pop()
                    .ok_or_else(|| ServiceError::Internal("a wait ended without outcome".into()))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Proposes the multi-lock and, if it was queued, waits for its outcome: each lock's
    /// token and access, in the order of `locks` (the request's parts).
    async fn propose_acquire_all(
        &self,
        session: SessionId,
        request: AcquireAllRequest,
        locks: Vec<String>,
        reserved: ReservedAcquire<'_>,
    ) -> Result<Vec<(String, Token, Access)>> {
        let AcquireAllRequest {
            parts,
            request_id,
            wait,
        } = request;
        let parts = (parts.into_iter().zip(&locks))
            .map(|(part, lock)| AcquirePart {
                lock: lock.clone(),
                mode: part.mode,
            })
            .collect();
        let command = Command::AcquireAll {
            session,
            parts,
            request_id,
            wait,
        };
        let (index, reply, reserved) = self.propose_reserved(command, reserved).await?;
        let grants = match reply {
            Reply::GrantedAll { grants, .. } => (grants.into_iter())
                .map(|g| (g.lock, g.token, g.access))
                .collect(),
            // A try-only retry of a multi-lock that waits already (as for one lock).
            Reply::QueuedAll { .. } if reserved.registrations.is_empty() => {
                return Err(self.busy_of_first(&locks).into());
            }
            Reply::QueuedAll { .. } => {
                self.await_grants(session, index, reserved.registrations)
                    .await?
            }
            other => return Err(unexpected(other)),
        };
        let granted: Vec<&String> = grants.iter().map(|(lock, _, _)| lock).collect();
        if granted != locks.iter().collect::<Vec<_>>() {
            return Err(ServiceError::Internal(format!(
                "a multi-lock of {locks:?} was granted {granted:?}"
            )));
        }
        Ok(grants)
    }

    /// Waits for the outcome of the acquire queued at log `index`: one lock's wait, or a
    /// multi-lock's, whose locks are all granted in one entry or all withdrawn in one. Returns
    /// each lock's token and access, in the order of `registrations`.
    async fn await_grants(
        &self,
        session: SessionId,
        index: u64,
        mut registrations: Vec<(String, WaitRegistration<'_>)>,
    ) -> Result<Vec<(String, Token, Access)>> {
        metrics::gauge!(crate::metrics::WAITERS).increment(1.0);
        let outcomes = async {
            let mut outcomes = Vec::with_capacity(registrations.len());
            for (_, registration) in &mut registrations {
                let outcome = registration.outcome_after(index).await;
                let granted = matches!(outcome, Some(WaitOutcome::Granted(..)));
                outcomes.push(outcome);
                if !granted {
                    break;
                }
            }
            outcomes
        };
        // The wait is in the table, committed: when this node stops serving it (shutdown, or
        // the end of its leadership), the wait goes on without it and may still be granted by
        // the next leader. The outcome is unknown to this call; the client's retry with the
        // same request id finds it.
        let outcomes = tokio::select! {
            outcomes = outcomes => Ok(outcomes),
            () = self.node.stopping() => Err(ServiceError::OutcomeUnknown(
                "the lock service is shutting down while the acquire waits in the queue".into(),
            )),
            () = self.node.leadership_lost() => Err(ServiceError::OutcomeUnknown(
                "this node stopped leading while the acquire waits in the queue".into(),
            )),
        };
        metrics::gauge!(crate::metrics::WAITERS).decrement(1.0);
        let outcomes = outcomes?;
        let mut grants = Vec::with_capacity(outcomes.len());
        for ((lock, _), outcome) in registrations.into_iter().zip(outcomes) {
            let ended = match outcome {
                Some(WaitOutcome::Granted(token, access)) => {
                    grants.push((lock, token, access));
                    continue;
                }
                Some(WaitOutcome::Ended(WaitEndCause::SessionEnded)) => {
                    CoreError::SessionNotFound { session }.into()
                }
                Some(WaitOutcome::Ended(WaitEndCause::TimedOut | WaitEndCause::Withdrawn)) => {
                    CoreError::WaitEnded { lock }.into()
                }
                None => ServiceError::OutcomeUnknown("the wait was interrupted".into()),
            };
            // The table grants a multi-lock's locks in one entry or none of them.
            return Err(if grants.is_empty() {
                ended
            } else {
                ServiceError::Internal(format!(
                    "a multi-lock was granted {} of its locks, then its wait ended: {ended}",
                    grants.len()
                ))
            });
        }
        Ok(grants)
    }

    /// The first of `locks` that is held or in lock-delay, busy as [`LockService::busy`]
    /// describes it (the first lock if none is).
    fn busy_of_first(&self, locks: &[String]) -> CoreError {
        let taken = locks.iter().find(|lock| {
            self.node.read_table(|t| {
                t.lock_status(lock).is_some_and(|s| {
                    s.holder.is_some() || !s.sharers.is_empty() || s.available_at_ms.is_some()
                })
            })
        });
        self.busy(taken.or(locks.first()).cloned().unwrap_or_default())
    }

    /// `lock` is busy, as the table holds it now.
    fn busy(&self, lock: String) -> CoreError {
        let status = self.node.read_table(|t| t.lock_status(&lock));
        let holder = status
            .as_ref()
            .and_then(|s| s.holder.as_ref().or(s.sharers.first()));
        CoreError::Busy {
            holder_session: holder.map(|g| g.session),
            holder_token: holder.map(|g| g.token),
            available_at_ms: status.and_then(|s| s.available_at_ms),
            lock,
        }
    }

    /// Releases `lock` held by `session`, or withdraws its wait for it: returns the token
    /// released, or `None` if the session was only waiting.
    ///
    /// Needs no right beyond owning the session: giving a lock up is always allowed, also after
    /// the policy stopped granting it.
    pub async fn release(
        &self,
        caller: &Caller,
        proof: &SessionProof,
        lock: String,
        request_id: RequestId,
    ) -> Result<Option<Token>> {
        let session = proof.session;
        let lock = self
            .authorize_lock(caller, proof, lock)
            .await?
            .into_string();
        match self
            .apply(Command::Release {
                session,
                lock,
                request_id,
            })
            .await?
        {
            Reply::Released { token, .. } => Ok(token),
            other => Err(unexpected(other)),
        }
    }

    /// Replaces the value of `session`'s grant `token` of `lock` (a leader's proclaim).
    ///
    /// Needs the lock right on `lock`: the value is part of holding it.
    pub async fn proclaim(
        &self,
        caller: &Caller,
        proof: &SessionProof,
        lock: String,
        token: Token,
        value: Option<GrantValue>,
    ) -> Result<()> {
        let session = proof.session;
        let lock = self
            .authorize_lock(caller, proof, lock)
            .await?
            .into_string();
        self.auth.require(caller, Right::Lock, &lock)?;
        match self
            .apply(Command::SetValue {
                session,
                lock,
                token,
                value,
            })
            .await?
        {
            Reply::ValueSet { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// One lock's state, reflecting every write committed before the call.
    /// Needs the read right on `lock`.
    pub async fn status(&self, caller: &Caller, lock: String, read: Read) -> Result<LockView> {
        // A read proposes nothing: the ceiling is its only limit.
        let lock = LockName::new(lock)
            .map_err(CoreError::InvalidLockName)?
            .into_string();
        self.auth.require(caller, Right::Read, &lock)?;
        self.before_read(read).await?;
        let (status, last_token) = self
            .node
            .read_table(|t| (t.lock_status(&lock), t.last_token_of(&lock)));
        Ok(match status {
            Some(status) => self.view(status),
            None => LockView::free(lock, last_token),
        })
    }

    async fn before_read(&self, read: Read) -> Result<()> {
        let local = palisade_core::canary::active(palisade_core::canary::Canary::LocalRead);
        match read {
            Read::Linearizable if local => Ok(()),
            Read::Linearizable => Ok(self.node.linearizable_read().await?),
            Read::Stale => Ok(()),
        }
    }

    /// Locks whose names start with `prefix`, in name order, after `start_after`; at most
    /// `limit` of them (0 or above the page limit: a full page).
    ///
    /// Needs the read right on every lock under `prefix`.
    pub async fn list(
        &self,
        caller: &Caller,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        read: Read,
    ) -> Result<LockPage> {
        self.auth.require_under(caller, Right::Read, prefix)?;
        let limit = match limit {
            0 => LIST_PAGE_LOCKS_MAX,
            n => n.min(LIST_PAGE_LOCKS_MAX),
        };
        self.before_read(read).await?;
        let statuses = self
            .node
            .read_table(|t| t.locks(prefix, start_after, limit));
        let next_start_after = (statuses.len() == limit)
            .then(|| statuses.last().map(|s| s.lock.clone()))
            .flatten();
        Ok(LockPage {
            locks: statuses.into_iter().map(|s| self.view(s)).collect(),
            next_start_after,
        })
    }

    /// The lock's state now, then each grant, release and expiry of it, in log order. The
    /// stream ends with [`ServiceError::WatchLagged`] if the watcher falls too far behind, or
    /// [`ServiceError::ShuttingDown`].
    ///
    /// Needs the read right on `lock`, and a place in the identity's quota of watches; ends,
    /// refused, after a reload that leaves the caller without its credential or the right.
    pub async fn watch(
        &self,
        connection: ConnectionId,
        mut caller: LiveCaller,
        lock: String,
    ) -> Result<impl Stream<Item = Result<LockChange>> + use<>> {
        // A read proposes nothing: the ceiling is its only limit.
        let lock = LockName::new(lock)
            .map_err(CoreError::InvalidLockName)?
            .into_string();
        self.auth.require(caller.caller(), Right::Read, &lock)?;
        let quota_permit = self.auth.watch_permit(caller.caller())?;
        let permit = self.watches.take(connection)?;
        // Subscribe before reading the current state, so no change falls in between.
        let mut events = self.node.subscribe_lock(&lock);
        let mut installs = self.node.subscribe_installs();
        self.node.linearizable_read().await?;
        let first = snapshot_change(&self.node, &lock);
        let (tx, rx) = mpsc::channel(WATCH_BUFFER_EVENTS);
        let node = self.node.clone();
        let auth = self.auth.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _quota_permit = quota_permit;
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            loop {
                // Events first: a snapshot install after them must not jump ahead of them.
                let received = tokio::select! {
                    biased;
                    // The files were reloaded: the caller must still be who it was, with the
                    // right to read the lock.
                    () = caller.reloaded() => {
                        let still = caller.still_authenticated(&auth).and_then(|()| {
                            auth.require(caller.caller(), Right::Read, &lock)
                        });
                        if let Err(refused) = still {
                            let _ = tx.send(Err(refused.into())).await;
                            return;
                        }
                        continue;
                    }
                    received = events.recv() => received,
                    Ok(()) = installs.changed() => {
                        // The table was replaced by a snapshot: its events are not in the
                        // stream, so the watcher gets the lock's state as it is now.
                        if tx.send(Ok(snapshot_change(&node, &lock))).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    () = node.stopping() => {
                        let _ = tx.send(Err(ServiceError::ShuttingDown)).await;
                        return;
                    }
                    // A watch is a linearizable read that goes on: once this node no longer
                    // leads, it could fall behind unseen (cut off from the others), so the
                    // watcher is sent to the leader, where it starts again from a snapshot.
                    () = node.leadership_lost() => {
                        let _ = tx.send(Err(node.not_leader().into())).await;
                        return;
                    }
                };
                // Built from the event alone: the table is not taken, and the cost does not
                // grow with the lock's queue (finding M4), nor with the watchers of other locks.
                let change = match received {
                    Ok(published) => match change_of(&published, &lock) {
                        Some(change) => change,
                        None => continue,
                    },
                    Err(Lagged { missed }) => {
                        let _ = tx.send(Err(ServiceError::WatchLagged { missed })).await;
                        return;
                    }
                };
                if tx.send(Ok(change)).await.is_err() {
                    return;
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }

    /// The key that signs sequencers now, and every key resources must trust now. Read
    /// linearizably, like the lock table: a member that has not applied a retirement yet must
    /// not hand resources a key the cluster no longer publishes.
    /// Needs an authenticated caller once a policy is configured, and no right.
    pub async fn public_keys(&self, caller: &Caller) -> Result<(PublicKey, KeySet)> {
        self.auth.require_authenticated(caller)?;
        self.node.linearizable_read().await?;
        Ok((self.node.public_key(), self.node.published_keys()))
    }

    async fn apply(&self, command: Command) -> Result<Reply> {
        Ok(self.node.propose(command).await?.result?)
    }

    fn sign(
        &self,
        lock: String,
        session: SessionId,
        token: Token,
        access: Access,
    ) -> Result<SignedGrant> {
        // The token leaves the server here: re-assert what the table promised.
        let token = Token::checked(token.get()).ok_or_else(|| {
            ServiceError::Internal(format!(
                "the lock table granted token {token}, outside 1..={}",
                palisade_core::limits::TOKEN_MAX
            ))
        })?;
        let sequencer = self
            .node
            .signing_key()
            .sign_access(&lock, access, token, session)
            .map_err(|e| ServiceError::Internal(format!("signing the sequencer failed: {e}")))?;
        Ok(SignedGrant {
            lock,
            session,
            token,
            access,
            sequencer,
        })
    }

    /// `status` as a client sees it, its durations measured from now (the web UI shows the
    /// same view).
    pub(crate) fn view(&self, status: LockStatus) -> LockView {
        let now = self.node.now_ms();
        let view = |grant: Grant, expires_at_ms: Option<TimeMs>| HolderView {
            session: grant.session,
            token: grant.token,
            lease_remaining_ms: expires_at_ms.unwrap_or(now).saturating_duration_since(now),
            value: grant.value,
            access: grant.access,
        };
        LockView {
            holder: (status.holder).map(|grant| view(grant, status.holder_expires_at_ms)),
            sharers: (status.sharers.into_iter())
                .zip(status.sharers_expire_at_ms)
                .map(|(grant, expires_at_ms)| view(grant, Some(expires_at_ms)))
                .collect(),
            permits: status.permits,
            last_token: status.last_token,
            waiters: status.waiters,
            waiter_modes: status.waiter_modes,
            lock_delay_remaining_ms: status
                .available_at_ms
                .map(|at| at.saturating_duration_since(now)),
            lock: status.lock,
        }
    }
}

/// The state of `lock` as the table holds it now, as a watch's `Snapshot` change: one holder
/// (the exclusive one, or the first reader or permit holder; a status lists them all).
fn snapshot_change(node: &Node, lock: &str) -> LockChange {
    // One holder and the count only: the queue itself is not copied.
    let (holder, waiters) = node.read_table(|t| {
        let holder = t.holder(lock).or_else(|| t.first_sharer(lock));
        (holder, t.waiter_count(lock) as u64)
    });
    LockChange {
        kind: ChangeKind::Snapshot,
        lock: lock.to_string(),
        session: holder.as_ref().map_or(SessionId::new(0), |g| g.session),
        token: holder.as_ref().map_or(Token::ZERO, |g| g.token),
        waiters,
        access: holder.as_ref().map_or(Access::Exclusive, |g| g.access),
        value: holder.and_then(|g| g.value),
    }
}

/// What a watcher of `lock` hears of `published`, if anything: a watcher of another lock stops
/// at comparing the name.
fn change_of(published: &Published, lock: &str) -> Option<LockChange> {
    let event = &published.event;
    if event.lock() != Some(lock) {
        return None;
    }
    let (kind, session, token, value) = change_kind(event)?;
    let access = match event {
        Event::Granted { access, .. } => *access,
        _ => Access::Exclusive,
    };
    Some(LockChange {
        kind,
        lock: lock.to_string(),
        session,
        token,
        waiters: published.waiters,
        value: value.clone(),
        access,
    })
}

/// The change a watcher of `event`'s lock hears of it, if any, with the holding's value.
pub(crate) fn change_kind(
    event: &Event,
) -> Option<(ChangeKind, SessionId, Token, &Option<GrantValue>)> {
    const NONE: &Option<GrantValue> = &None;
    match event {
        Event::Granted {
            session,
            token,
            value,
            ..
        } => Some((ChangeKind::Granted, *session, *token, value)),
        Event::ValueSet {
            session,
            token,
            value,
            ..
        } => Some((ChangeKind::ValueSet, *session, *token, value)),
        Event::Released {
            session,
            token,
            cause: ReleaseCause::SessionExpired,
            ..
        } => Some((ChangeKind::Expired, *session, *token, NONE)),
        Event::Released {
            session,
            token,
            cause: ReleaseCause::Released | ReleaseCause::SessionClosed,
            ..
        } => Some((ChangeKind::Released, *session, *token, NONE)),
        Event::WaitEnded { .. } | Event::SessionEnded { .. } => None,
    }
}

fn unexpected(reply: Reply) -> ServiceError {
    ServiceError::Internal(format!("unexpected reply from the lock table: {reply:?}"))
}

/// What [`LockService::reserve_acquire`] holds for an acquire until it is applied (the quota)
/// or answered (the rest).
struct ReservedAcquire<'a> {
    quota: Option<crate::auth::Reservation<'a>>,
    _permit: Option<Permit>,
    /// One per lock, for a waiting acquire; none for a try.
    registrations: Vec<(String, WaitRegistration<'a>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_reads_the_queue_length_from_the_event_and_other_locks_pass_by() {
        let published = |lock: &str, waiters| Published {
            event: Event::Granted {
                lock: lock.into(),
                session: SessionId::new(2),
                token: Token::new(7),
                request_id: palisade_core::RequestId::new(1),
                value: GrantValue::new("10.0.0.1:7000").ok(),
                access: palisade_core::Access::Exclusive,
            },
            waiters,
        };
        // No table here: the change comes from the event alone, whatever the queue's length.
        let change = change_of(&published("l", 10_000), "l").expect("a change of the lock");
        assert_eq!(
            change,
            LockChange {
                kind: ChangeKind::Granted,
                lock: "l".into(),
                session: SessionId::new(2),
                token: Token::new(7),
                waiters: 10_000,
                value: GrantValue::new("10.0.0.1:7000").ok(),
                access: Access::Exclusive,
            }
        );
        assert_eq!(change_of(&published("m", 10_000), "l"), None);
    }
}
