//! The gRPC API (`palisade.v1.Locks`): converts requests into calls of the
//! [`LockService`](crate::service::LockService) and its answers and errors into responses and
//! status codes. Nothing here decides anything.
//!
//! **API Boundary:** every refusal of the lock table carries, in its status details, the
//! `ErrorDetail` of the [`CoreError`] it came from (`palisade_proto::error`), so clients in any
//! language can act on the holder, the token or the limit without parsing messages.

use std::pin::Pin;
use std::time::Instant;

use futures::{Stream, StreamExt};
use palisade_core::{
    Access, AcquirePart, CoreError, DurationMs, GrantValue, Mode, RequestId, SessionId, Token, Wait,
};
use palisade_proto::v1::locks_server::Locks;
use palisade_proto::v1::*;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Caller, Credential, LiveCaller};
use crate::node::LeaderHint;
use crate::service::{
    self, ChangeKind, HolderView, LockChange, LockService, LockView, Renewal, ServiceError,
    SessionProof, SignedGrant,
};

/// The `Locks` gRPC service over the lock service.
#[derive(Debug, Clone)]
pub struct GrpcLocks {
    service: LockService,
}

impl GrpcLocks {
    pub fn new(service: LockService) -> Self {
        GrpcLocks { service }
    }

    /// Who sent `request` ([`crate::auth::Auth::identity`]); an unauthenticated caller of a
    /// service that requires a credential is refused here, before anything else.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        self.service
            .auth()
            .identity(request)
            .map_err(|e| core_status(&e))
    }

    /// The caller of a call that stays open, judged again after each reload
    /// ([`crate::auth::LiveCaller`]).
    fn live_caller<T>(&self, request: &Request<T>) -> Result<LiveCaller, Status> {
        self.service
            .auth()
            .live_caller(Credential::of(request))
            .map_err(|e| core_status(&e))
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

fn read_of(stale: bool) -> crate::service::Read {
    if stale {
        crate::service::Read::Stale
    } else {
        crate::service::Read::Linearizable
    }
}

/// The status of each way a call can fail.
pub fn status(e: ServiceError) -> Status {
    match e {
        ServiceError::Refused(e) => core_status(&e),
        ServiceError::NotLeader { ref leader, .. } => {
            let mut status = Status::unavailable(e.to_string());
            if let Some(leader) = leader {
                leader_metadata(status.metadata_mut(), leader);
            }
            status
        }
        ServiceError::ShuttingDown => Status::unavailable(e.to_string()),
        ServiceError::OutcomeUnknown(_) => Status::unknown(e.to_string()),
        ServiceError::TooManyOpenCalls { .. } => Status::resource_exhausted(e.to_string()),
        ServiceError::WatchLagged { .. } => Status::data_loss(e.to_string()),
        ServiceError::Internal(_) => Status::internal(e.to_string()),
    }
}

/// Names the leader in a response's metadata, so a client goes there next:
/// [`palisade_proto::LEADER_ID_HEADER`] and [`palisade_proto::LEADER_ADDR_HEADER`].
fn leader_metadata(metadata: &mut tonic::metadata::MetadataMap, leader: &LeaderHint) {
    metadata.insert(palisade_proto::LEADER_ID_HEADER, leader.node_id.into());
    if let Ok(addr) = leader.addr.parse() {
        metadata.insert(palisade_proto::LEADER_ADDR_HEADER, addr);
    }
}

/// Maps a lock-table error to its status: the code of its category and its `ErrorDetail`,
/// both decided by `palisade_proto::error`, which owns the wire form.
pub fn core_status(e: &CoreError) -> Status {
    palisade_proto::error::status_from_core(e)
}

fn grant_response(grant: SignedGrant) -> AcquireResponse {
    AcquireResponse {
        lock: grant.lock,
        session: grant.session.get(),
        token: grant.token.get(),
        sequencer: grant.sequencer.as_str().to_string(),
        access: wire_access(grant.access),
    }
}

/// How a grant holds its lock, as the wire spells it: `None` for exclusive.
fn wire_access(access: Access) -> Option<palisade_proto::v1::Access> {
    match access {
        Access::Exclusive => None,
        Access::Shared => Some(palisade_proto::v1::Access {
            shared: true,
            slot: None,
        }),
        Access::Slot(slot) => Some(palisade_proto::v1::Access {
            shared: false,
            slot: Some(slot),
        }),
    }
}

/// The mode an acquire asks for: shared, a permit, or (neither) exclusive.
fn mode_of(r: &AcquireRequest) -> Result<Mode, Status> {
    mode_from(r.shared, r.permits)
}

fn mode_from(shared: bool, permits: u32) -> Result<Mode, Status> {
    match (shared, permits) {
        (false, 0) => Ok(Mode::Exclusive),
        (true, 0) => Ok(Mode::Shared),
        (false, permits) => Ok(Mode::Permit(permits)),
        (true, _) => Err(Status::invalid_argument(
            "an acquire is shared or a permit of a semaphore, not both: a semaphore's permits \
             are exclusive, one holder per slot",
        )),
    }
}

fn keep_alive_response(renewal: Renewal) -> KeepAliveResponse {
    KeepAliveResponse {
        session: renewal.session.get(),
        ttl_remaining_ms: renewal.ttl_remaining_ms.as_millis(),
    }
}

fn lock_info(view: LockView) -> LockInfo {
    LockInfo {
        lock: view.lock,
        holder: view.holder.map(wire_holder),
        last_token: view.last_token.get(),
        waiters: view.waiters.into_iter().map(SessionId::get).collect(),
        lock_delay_remaining_ms: view.lock_delay_remaining_ms.map(DurationMs::as_millis),
        sharers: view.sharers.into_iter().map(wire_holder).collect(),
        permits: view.permits,
    }
}

fn wire_holder(h: HolderView) -> Holder {
    Holder {
        session: h.session.get(),
        token: h.token.get(),
        lease_remaining_ms: h.lease_remaining_ms.as_millis(),
        value: wire_value(h.value),
        access: wire_access(h.access),
    }
}

fn watch_event(change: LockChange) -> WatchEvent {
    let kind = match change.kind {
        ChangeKind::Snapshot => watch_event::Kind::Snapshot,
        ChangeKind::Granted => watch_event::Kind::Granted,
        ChangeKind::Released => watch_event::Kind::Released,
        ChangeKind::Expired => watch_event::Kind::Expired,
        ChangeKind::ValueSet => watch_event::Kind::ValueSet,
    };
    WatchEvent {
        kind: kind as i32,
        lock: change.lock,
        session: change.session.get(),
        token: change.token.get(),
        waiters: change.waiters,
        value: wire_value(change.value),
        access: wire_access(change.access),
    }
}

/// A grant's value as the wire spells it: empty for none.
fn wire_value(value: Option<GrantValue>) -> String {
    value.map(String::from).unwrap_or_default()
}

/// A value from the wire, checked before anything is proposed.
fn value_of(value: &str) -> Result<Option<GrantValue>, Status> {
    GrantValue::from_wire(value).map_err(|e| core_status(&CoreError::InvalidValue(e)))
}

fn wait_of(r: &AcquireRequest) -> Wait {
    wait_from(r.wait_forever, r.wait_ms)
}

fn wait_from(wait_forever: bool, wait_ms: u64) -> Wait {
    match (wait_forever, wait_ms) {
        (true, _) => Wait::Forever,
        (false, 0) => Wait::Try,
        (false, ms) => Wait::ForMs(DurationMs::from_millis(ms)),
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Locks for GrpcLocks {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let _timer = Timer::start("open_session");
        let caller = self.caller(&request)?;
        // `request_id` is ignored: it was compared across every client, so it could not tell
        // one client's retry from another client's open. An empty key opens a new session.
        let r = request.into_inner();
        let opened = self
            .service
            .open_session(&caller, &r.open_key, DurationMs::from_millis(r.ttl_ms))
            .await
            .map_err(status)?;
        Ok(Response::new(OpenSessionResponse {
            session: opened.session.get(),
            ttl_ms: opened.ttl_ms.as_millis(),
            session_secret: opened
                .secret
                .map(|secret| secret.as_bytes().to_vec())
                .unwrap_or_default(),
        }))
    }

    type KeepAliveStream = BoxStream<KeepAliveResponse>;

    async fn keep_alive(
        &self,
        request: Request<Streaming<KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let connection = request.remote_addr();
        let caller = self.live_caller(&request)?;
        // The pings end at the client's first error, which only the client can act on.
        let pings = request
            .into_inner()
            .take_while(|ping| {
                if let Err(status) = ping {
                    tracing::debug!(%status, "keepalive stream ended by the client");
                }
                std::future::ready(ping.is_ok())
            })
            .filter_map(|ping| {
                std::future::ready(
                    ping.ok()
                        .map(|p| SessionProof::new(SessionId::new(p.session), p.session_secret)),
                )
            });
        let renewals = self
            .service
            .keep_alive(connection, caller, Box::pin(pings))
            .map_err(status)?;
        Ok(Response::new(Box::pin(renewals.map(|renewal| {
            renewal.map(keep_alive_response).map_err(status)
        }))))
    }

    async fn renew(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<KeepAliveResponse>, Status> {
        let _timer = Timer::start("renew");
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let renewal = self
            .service
            .renew(
                &caller,
                &SessionProof::new(SessionId::new(r.session), r.session_secret),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(keep_alive_response(renewal)))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let _timer = Timer::start("close_session");
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        self.service
            .close_session(
                &caller,
                &SessionProof::new(SessionId::new(r.session), r.session_secret),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let _timer = Timer::start("acquire");
        let connection = request.remote_addr();
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let wait = wait_of(&r);
        let value = value_of(&r.value)?;
        let mode = mode_of(&r)?;
        let grant = self
            .service
            .acquire(
                connection,
                &caller,
                &SessionProof::new(SessionId::new(r.session), r.session_secret),
                service::AcquireRequest {
                    lock: r.lock,
                    request_id: RequestId::new(r.request_id),
                    wait,
                    value,
                    mode,
                },
            )
            .await
            .map_err(status)?;
        Ok(Response::new(grant_response(grant)))
    }

    async fn release_then_acquire(
        &self,
        request: Request<ReleaseThenAcquireRequest>,
    ) -> Result<Response<ReleaseThenAcquireResponse>, Status> {
        let _timer = Timer::start("release_then_acquire");
        let connection = request.remote_addr();
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let a = r
            .acquire
            .ok_or_else(|| Status::invalid_argument("release_then_acquire names no acquire"))?;
        let wait = wait_of(&a);
        let value = value_of(&a.value)?;
        let mode = mode_of(&a)?;
        let (released, grant) = self
            .service
            .release_then_acquire(
                connection,
                &caller,
                &SessionProof::new(SessionId::new(a.session), a.session_secret),
                (r.release, RequestId::new(r.release_request_id)),
                service::AcquireRequest {
                    lock: a.lock,
                    request_id: RequestId::new(a.request_id),
                    wait,
                    value,
                    mode,
                },
            )
            .await
            .map_err(status)?;
        Ok(Response::new(ReleaseThenAcquireResponse {
            released_token: released.map(Token::get),
            grant: Some(grant_response(grant)),
        }))
    }

    async fn acquire_all(
        &self,
        request: Request<AcquireAllRequest>,
    ) -> Result<Response<AcquireAllResponse>, Status> {
        let _timer = Timer::start("acquire_all");
        let connection = request.remote_addr();
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let parts = (r.parts.into_iter())
            .map(|part| {
                Ok(AcquirePart {
                    mode: mode_from(part.shared, part.permits)?,
                    lock: part.lock,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let session = SessionId::new(r.session);
        let grants = self
            .service
            .acquire_all(
                connection,
                &caller,
                &SessionProof::new(session, r.session_secret),
                service::AcquireAllRequest {
                    parts,
                    request_id: RequestId::new(r.request_id),
                    wait: wait_from(r.wait_forever, r.wait_ms),
                },
            )
            .await
            .map_err(status)?;
        Ok(Response::new(AcquireAllResponse {
            session: session.get(),
            grants: grants.into_iter().map(grant_response).collect(),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let _timer = Timer::start("proclaim");
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let value = value_of(&r.value)?;
        self.service
            .proclaim(
                &caller,
                &SessionProof::new(SessionId::new(r.session), r.session_secret),
                r.lock,
                Token::new(r.token),
                value,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(ProclaimResponse {}))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let _timer = Timer::start("release");
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let token = self
            .service
            .release(
                &caller,
                &SessionProof::new(SessionId::new(r.session), r.session_secret),
                r.lock,
                RequestId::new(r.request_id),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(ReleaseResponse {
            token: token.map(Token::get),
        }))
    }

    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<LockInfo>, Status> {
        let _timer = Timer::start("status");
        let caller = self.caller(&request)?;
        let request = request.into_inner();
        let view = self
            .service
            .status(&caller, request.lock, read_of(request.stale))
            .await
            .map_err(status)?;
        Ok(Response::new(lock_info(view)))
    }

    async fn list_locks(
        &self,
        request: Request<ListLocksRequest>,
    ) -> Result<Response<ListLocksResponse>, Status> {
        let _timer = Timer::start("list_locks");
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let start_after = (!r.start_after.is_empty()).then_some(r.start_after.as_str());
        let page = self
            .service
            .list(
                &caller,
                &r.prefix,
                start_after,
                r.limit as usize,
                read_of(r.stale),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(ListLocksResponse {
            locks: page.locks.into_iter().map(lock_info).collect(),
            next_start_after: page.next_start_after.unwrap_or_default(),
        }))
    }

    type WatchStream = BoxStream<WatchEvent>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let connection = request.remote_addr();
        let caller = self.live_caller(&request)?;
        let changes = self
            .service
            .watch(connection, caller, request.into_inner().lock)
            .await
            .map_err(status)?;
        Ok(Response::new(Box::pin(
            changes.map(|change| change.map(watch_event).map_err(status)),
        )))
    }

    async fn public_key(
        &self,
        request: Request<PublicKeyRequest>,
    ) -> Result<Response<PublicKeyResponse>, Status> {
        let caller = self.caller(&request)?;
        let (signing, published) = self.service.public_keys(&caller).await.map_err(status)?;
        Ok(Response::new(PublicKeyResponse {
            public_key: signing.to_string(),
            public_keys: published.keys().iter().map(ToString::to_string).collect(),
        }))
    }
}
