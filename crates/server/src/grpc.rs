//! The gRPC API (`palisade.v1.Locks`): translates requests into lock-table commands and the
//! table's replies and errors into responses and precise status codes.
//!
//! **API Boundary:** every refusal of the lock table carries, in its status details, the
//! `ErrorDetail` of the [`CoreError`] it came from (`palisade_proto::error`), so clients in any
//! language can act on the holder, the token or the limit without parsing messages.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::Stream;
use palisade_core::{
    Command, CoreError, Event, LockStatus, OpenKey, Reply, SessionId, Wait, WaitEndCause,
};
use palisade_proto::v1::locks_server::Locks;
use palisade_proto::v1::*;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::limits::{LIST_PAGE_LOCKS_MAX, LONG_LIVED_CALLS_MAX};
use crate::node::{Node, ProposeError};
use crate::state_machine::WaitOutcome;

const SHUTTING_DOWN: &str = "the lock service is shutting down; retry";
/// Keepalive responses buffered per stream.
const KEEPALIVE_BUFFER: usize = 16;

/// The `Locks` service over one node.
#[derive(Debug, Clone)]
pub struct LockService {
    node: Arc<Node>,
    /// Permits for calls that stay open: keepalive streams, watches, queued acquires.
    long_lived: Arc<Semaphore>,
}

impl LockService {
    pub fn new(node: Arc<Node>) -> Self {
        LockService {
            node,
            long_lived: Arc::new(Semaphore::new(LONG_LIVED_CALLS_MAX)),
        }
    }

    fn long_lived_permit(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.long_lived.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{LONG_LIVED_CALLS_MAX} keepalive streams, watches and waiting acquires are open, \
                 the limit of this server; close unused ones or retry later"
            ))
        })
    }

    async fn apply(&self, command: Command) -> Result<Reply, Status> {
        let output = self.node.propose(command).await.map_err(propose_status)?;
        output.result.map_err(|e| core_status(&e))
    }

    fn granted(
        &self,
        lock: String,
        session: SessionId,
        token: u64,
    ) -> Result<AcquireResponse, Status> {
        let sequencer = self
            .node
            .signing_key()
            .sign(&lock, token, session)
            .map_err(|e| Status::internal(format!("signing the sequencer failed: {e}")))?;
        Ok(AcquireResponse {
            lock,
            session,
            token,
            sequencer: sequencer.as_str().to_string(),
        })
    }

    fn lock_info(&self, status: LockStatus) -> LockInfo {
        let now = self.node.now_ms();
        LockInfo {
            holder: status.holder.map(|grant| Holder {
                session: grant.session,
                token: grant.token,
                lease_remaining_ms: status
                    .holder_expires_at_ms
                    .unwrap_or(now)
                    .saturating_sub(now),
            }),
            last_token: status.last_token,
            waiters: status.waiters,
            lock_delay_remaining_ms: status.available_at_ms.map(|at| at.saturating_sub(now)),
            lock: status.lock,
        }
    }
}

/// Records a request's latency when dropped.
struct Timer {
    method: &'static str,
    started: Instant,
}

impl Timer {
    fn start(method: &'static str) -> Timer {
        Timer {
            method,
            started: Instant::now(),
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        metrics::histogram!(crate::metrics::REQUEST_SECONDS, "method" => self.method)
            .record(self.started.elapsed().as_secs_f64());
    }
}

fn propose_status(e: ProposeError) -> Status {
    match e {
        ProposeError::NotLeader => Status::unavailable(e.to_string()),
        ProposeError::Stopped(_) => Status::unknown(format!(
            "{e}; the outcome is unknown, retry with the same request id"
        )),
    }
}

/// Maps a lock-table error to its status: the code of its category and its `ErrorDetail`,
/// both decided by `palisade_proto::error`, which owns the wire form.
pub fn core_status(e: &CoreError) -> Status {
    palisade_proto::error::status_from_core(e)
}

fn unexpected(reply: Reply) -> Status {
    Status::internal(format!("unexpected reply from the lock table: {reply:?}"))
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Locks for LockService {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let _timer = Timer::start("open_session");
        let r = request.into_inner();
        // `request_id` is ignored: it was compared across every client, so it could not tell
        // one client's retry from another client's open. An empty key opens a new session.
        let open_key = match r.open_key.as_slice() {
            [] => None,
            bytes => {
                Some(OpenKey::new(bytes).map_err(|e| core_status(&CoreError::InvalidOpenKey(e)))?)
            }
        };
        match self
            .apply(Command::OpenSession {
                open_key,
                ttl_ms: r.ttl_ms,
            })
            .await?
        {
            Reply::SessionOpened {
                session, ttl_ms, ..
            } => Ok(Response::new(OpenSessionResponse { session, ttl_ms })),
            other => Err(unexpected(other)),
        }
    }

    type KeepAliveStream = BoxStream<KeepAliveResponse>;

    async fn keep_alive(
        &self,
        request: Request<Streaming<KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let permit = self.long_lived_permit()?;
        let mut pings = request.into_inner();
        let (tx, rx) = mpsc::channel(KEEPALIVE_BUFFER);
        let service = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            loop {
                let next = tokio::select! {
                    next = pings.message() => next,
                    () = service.node.stopping() => {
                        let _ = tx.send(Err(Status::unavailable(SHUTTING_DOWN))).await;
                        return;
                    }
                };
                let ping = match next {
                    Ok(Some(ping)) => ping,
                    Ok(None) => return,
                    Err(status) => {
                        tracing::debug!(%status, "keepalive stream ended by the client");
                        return;
                    }
                };
                let answer = service.renew_once(ping.session).await;
                let failed = answer.is_err();
                if tx.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn renew(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<KeepAliveResponse>, Status> {
        let _timer = Timer::start("renew");
        self.renew_once(request.into_inner().session)
            .await
            .map(Response::new)
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let _timer = Timer::start("close_session");
        match self
            .apply(Command::CloseSession {
                session: request.into_inner().session,
            })
            .await?
        {
            Reply::SessionClosed { .. } => Ok(Response::new(CloseSessionResponse {})),
            other => Err(unexpected(other)),
        }
    }

    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let _timer = Timer::start("acquire");
        let r = request.into_inner();
        let wait = match (r.wait_forever, r.wait_ms) {
            (true, _) => Wait::Forever,
            (false, 0) => Wait::Try,
            (false, ms) => Wait::ForMs(ms),
        };
        // Taken before proposing, so a refused wait is never left queued in the table.
        let _permit = (wait != Wait::Try)
            .then(|| self.long_lived_permit())
            .transpose()?;
        // Register before proposing: a grant from the queue may be applied at any moment after.
        let registration =
            (wait != Wait::Try).then(|| self.node.shared().waiters.register(r.session, &r.lock));
        let command = Command::Acquire {
            session: r.session,
            lock: r.lock,
            request_id: r.request_id,
            wait,
        };
        let (index, output) = self
            .node
            .propose_indexed(command)
            .await
            .map_err(propose_status)?;
        match output.result.map_err(|e| core_status(&e))? {
            Reply::Granted {
                lock,
                session,
                token,
            } => Ok(Response::new(self.granted(lock, session, token)?)),
            Reply::Queued { lock, session, .. } => {
                let mut registration =
                    registration.ok_or_else(|| Status::internal("queued a try-only acquire"))?;
                metrics::gauge!(crate::metrics::WAITERS).increment(1.0);
                let outcome = tokio::select! {
                    outcome = registration.outcome_after(index) => Some(outcome.ok_or(())),
                    () = self.node.stopping() => None,
                };
                metrics::gauge!(crate::metrics::WAITERS).decrement(1.0);
                // The wait stays queued in the table: a retry with the same request id after
                // the restart picks it up.
                let outcome = outcome.ok_or_else(|| Status::unavailable(SHUTTING_DOWN))?;
                match outcome {
                    Ok(WaitOutcome::Granted(token)) => {
                        Ok(Response::new(self.granted(lock, session, token)?))
                    }
                    Ok(WaitOutcome::Ended(WaitEndCause::SessionEnded)) => {
                        Err(core_status(&CoreError::SessionNotFound { session }))
                    }
                    Ok(WaitOutcome::Ended(_)) => Err(core_status(&CoreError::WaitEnded { lock })),
                    Err(_) => Err(Status::unknown(
                        "the wait was interrupted; retry with the same request id",
                    )),
                }
            }
            other => Err(unexpected(other)),
        }
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let _timer = Timer::start("release");
        let r = request.into_inner();
        match self
            .apply(Command::Release {
                session: r.session,
                lock: r.lock,
                request_id: r.request_id,
            })
            .await?
        {
            Reply::Released { token, .. } => Ok(Response::new(ReleaseResponse { token })),
            other => Err(unexpected(other)),
        }
    }

    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<LockInfo>, Status> {
        let _timer = Timer::start("status");
        let lock = request.into_inner().lock;
        if lock.len() > palisade_core::limits::LOCK_NAME_BYTES_MAX {
            return Err(Status::invalid_argument(
                "lock name is longer than 256 bytes",
            ));
        }
        self.node
            .linearizable_read()
            .await
            .map_err(propose_status)?;
        let (status, last_token) = self
            .node
            .shared()
            .read(|t| (t.lock_status(&lock), t.last_token_of(&lock)));
        let info = match status {
            Some(status) => self.lock_info(status),
            None => LockInfo {
                lock,
                last_token: last_token.unwrap_or(0),
                ..LockInfo::default()
            },
        };
        Ok(Response::new(info))
    }

    async fn list_locks(
        &self,
        request: Request<ListLocksRequest>,
    ) -> Result<Response<ListLocksResponse>, Status> {
        let _timer = Timer::start("list_locks");
        let r = request.into_inner();
        let limit = match r.limit as usize {
            0 => LIST_PAGE_LOCKS_MAX,
            n => n.min(LIST_PAGE_LOCKS_MAX),
        };
        self.node
            .linearizable_read()
            .await
            .map_err(propose_status)?;
        let start_after = (!r.start_after.is_empty()).then_some(r.start_after.as_str());
        let statuses = self
            .node
            .shared()
            .read(|t| t.locks(&r.prefix, start_after, limit));
        let next_start_after = if statuses.len() == limit {
            statuses.last().map(|s| s.lock.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        let locks = statuses.into_iter().map(|s| self.lock_info(s)).collect();
        Ok(Response::new(ListLocksResponse {
            locks,
            next_start_after,
        }))
    }

    type WatchStream = BoxStream<WatchEvent>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let lock = request.into_inner().lock;
        palisade_core::limits::validate_lock_name(
            &lock,
            palisade_core::limits::LOCK_NAME_BYTES_MAX,
        )
        .map_err(|e| Status::invalid_argument(format!("invalid lock name: {e}")))?;
        let permit = self.long_lived_permit()?;
        // Subscribe before reading the current state, so no change falls in between.
        let mut events = self.node.shared().events.subscribe();
        self.node
            .linearizable_read()
            .await
            .map_err(propose_status)?;
        let current = self.node.shared().read(|t| t.lock_status(&lock));
        let (tx, rx) = mpsc::channel(crate::state_machine::WATCH_BUFFER_EVENTS);
        let first = WatchEvent {
            kind: watch_event::Kind::Snapshot as i32,
            lock: lock.clone(),
            session: current
                .as_ref()
                .and_then(|s| s.holder.as_ref())
                .map_or(0, |g| g.session),
            token: current
                .as_ref()
                .and_then(|s| s.holder.as_ref())
                .map_or(0, |g| g.token),
            waiters: current.as_ref().map_or(0, |s| s.waiters.len() as u64),
        };
        let shared_node = self.node.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            loop {
                let received = tokio::select! {
                    received = events.recv() => received,
                    () = shared_node.stopping() => {
                        let _ = tx.send(Err(Status::unavailable(SHUTTING_DOWN))).await;
                        return;
                    }
                };
                let event = match received {
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        let status = Status::data_loss(format!(
                            "the watch fell {missed} events behind and was stopped; watch again to resume"
                        ));
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if event.lock() != Some(lock.as_str()) {
                    continue;
                }
                let (kind, session, token) = match event {
                    Event::Granted { session, token, .. } => {
                        (watch_event::Kind::Granted, session, token)
                    }
                    Event::Released {
                        session,
                        token,
                        cause: palisade_core::ReleaseCause::SessionExpired,
                        ..
                    } => (watch_event::Kind::Expired, session, token),
                    Event::Released { session, token, .. } => {
                        (watch_event::Kind::Released, session, token)
                    }
                    _ => continue,
                };
                let waiters = shared_node
                    .shared()
                    .read(|t| t.lock_status(&lock).map_or(0, |s| s.waiters.len() as u64));
                let message = WatchEvent {
                    kind: kind as i32,
                    lock: lock.clone(),
                    session,
                    token,
                    waiters,
                };
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn public_key(
        &self,
        _request: Request<PublicKeyRequest>,
    ) -> Result<Response<PublicKeyResponse>, Status> {
        Ok(Response::new(PublicKeyResponse {
            public_key: self.node.public_key().to_string(),
        }))
    }
}

impl LockService {
    async fn renew_once(&self, session: SessionId) -> Result<KeepAliveResponse, Status> {
        match self.apply(Command::KeepAlive { session }).await? {
            Reply::KeptAlive {
                session,
                expires_at_ms,
            } => Ok(KeepAliveResponse {
                session,
                ttl_remaining_ms: expires_at_ms.saturating_sub(self.node.now_ms()),
            }),
            other => Err(unexpected(other)),
        }
    }
}
