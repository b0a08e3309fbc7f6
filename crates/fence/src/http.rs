//! The fence in front of any HTTP or gRPC service: Chubby's `CheckSequencer`, as a `tower` layer
//! for axum and tonic servers (feature `http`).
//!
//! ```no_run
//! # async fn example(keys: palisade_sequencer::KeySet) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use palisade_fence::http::FenceLayer;
//! use palisade_fence::{RedbFence, Verifier};
//!
//! let fence = RedbFence::open("/var/lib/reports/fence.redb")?;
//! let layer = FenceLayer::new(Arc::new(Verifier::new(keys)), fence);
//! let stats = layer.stats(); // accepted and refused requests per lock, for the application
//! let app: axum::Router = axum::Router::new()
//!     .route("/reports", axum::routing::post(|| async { "published" }))
//!     .layer(layer);
//! # let _ = (app, stats);
//! # Ok(())
//! # }
//! ```
//!
//! Before the inner service runs, [`Fenced`] reads the sequencer from the [`SEQUENCER_HEADER`]
//! header (`Palisade-Sequencer`, the header the fenced store reads; `palisade lock` hands it to
//! a holder as `$PALISADE_SEQUENCER`), verifies it with the lock service's keys ([`Verifier`]),
//! and checks and advances the accepted token of the request's *scope* in a [`FenceBackend`]:
//! [`MemoryFence`] (tests, one process), [`RedbFence`] (durable, one host) or [`PostgresFence`]
//! (shared by every replica of the service). Only an accepted request reaches the inner service.
//!
//! **Scope.** By default one scope per lock: the scope is the sequencer's binding (its lock
//! name, or for a semaphore's permit the lock and the slot, so each slot has a scope of its own),
//! and the first accepted sequencer binds it. [`FenceLayer::scope_by`] sets any function of the request
//! and the verified sequencer instead (a scope per path, per tenant); a scope is bound to the lock
//! of its first accepted sequencer, so another lock's sequencer is refused there as `wrong_lock`.
//!
//! **Reads and writes.** `GET` and `HEAD` requests are reads ([`Intent::Read`]): any grant may
//! make them, the readers of a read-write lock's shared phase included. Every other method is a
//! write, which a shared grant may not make (`shared_write`).
//!
//! **Refusals** have the fenced store's JSON body and status (`crates/store/src/wire.rs`):
//! `{"kind":"stale","lock","presented","accepted","holder_session","message"}` with 409,
//! `token_reissued` 409, `wrong_lock` 403, `shared_write` 403 (a genuine grant that does not
//! permit writing, whatever the resource's state), `forged` 403, `malformed` 400 (also for a header that
//! is not ASCII or is sent twice), `missing` 428 — a precondition of the request, like
//! `If-Match`, not a credential, so not 401 — and `storage` 503 when the backend failed before
//! anything was applied. A gRPC request (`content-type: application/grpc…`) gets the same JSON as
//! its `grpc-message`, with `ABORTED` for a stale or reissued token (gRPC's own code for "a
//! sequencer check failure"), `FAILED_PRECONDITION` missing, `INVALID_ARGUMENT` malformed,
//! `PERMISSION_DENIED` forged, another lock's or a reader's write, `UNAVAILABLE` a storage failure.
//!
//! **What it orders.** The check and advance commit before the inner service runs, not with its
//! effects: a request admitted with token 10 may still be running when one with token 11 is
//! admitted, exactly as with Chubby's sequencers. What it guarantees is that once a request of
//! token 11 was admitted, no request of token 10 is admitted again, however long its holder was
//! paused. Where the inner service writes to a database, fence that write in the same transaction
//! instead (`postgres::claim`), which also orders the effects.
//!
//! Each admission is counted in the layer's [`FenceStats`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use palisade_sequencer::VerifiedSequencer;
use serde_json::{Value, json};

use crate::fence::{FenceState, Intent, LockBinding, assert_advance, check, validate_scope};
use crate::{FenceError, FenceStats, RedbFence, Verifier};

/// The request header carrying the holder's sequencer (HTTP header names are case-insensitive;
/// gRPC metadata and HTTP/2 spell it in lower case).
pub const SEQUENCER_HEADER: &str = "palisade-sequencer";

/// How many scopes a [`MemoryFence`] remembers; a new scope beyond that is refused, never a
/// remembered one forgotten (forgetting would let a stale token in again).
pub const MEMORY_FENCE_SCOPES_MAX: usize = 65_536;

/// A boxed, sendable future, as [`FenceBackend`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where the middleware keeps each scope's accepted token: check the sequencer against it and
/// advance it, atomically, or refuse with the [`FenceError`] of the refusal.
///
/// Implement it over your own storage in a few lines with [`crate::check`] (or a backend's
/// claim) under that storage's atomicity; the shipped ones are [`MemoryFence`], [`RedbFence`] and
/// [`PostgresFence`].
pub trait FenceBackend: Send + Sync + 'static {
    /// Checks `sequencer` for `intent` ([`Intent::Read`] for `GET` and `HEAD`, [`Intent::Write`]
    /// for any other method) against `scope`, and advances it.
    fn check_and_advance(
        self: Arc<Self>,
        scope: String,
        sequencer: Arc<VerifiedSequencer>,
        intent: Intent,
    ) -> BoxFuture<Result<(), FenceError>>;
}

/// Every scope's state in this process's memory: for tests and single-process services whose
/// protected effects also die with the process. Bounded by [`MEMORY_FENCE_SCOPES_MAX`].
#[derive(Debug, Default)]
pub struct MemoryFence {
    scopes: Mutex<HashMap<String, FenceState>>,
}

impl MemoryFence {
    pub fn new() -> MemoryFence {
        MemoryFence::default()
    }

    /// The accepted state of `scope`, if a request was admitted there.
    pub fn fence_state(&self, scope: &str) -> Option<FenceState> {
        self.scopes().get(scope).cloned()
    }

    fn scopes(&self) -> std::sync::MutexGuard<'_, HashMap<String, FenceState>> {
        // Each entry is replaced whole, after its check: a panic cannot leave one half-written.
        self.scopes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn admit(
        &self,
        scope: String,
        sequencer: &VerifiedSequencer,
        intent: Intent,
    ) -> Result<(), FenceError> {
        let mut scopes = self.scopes();
        let accepted = scopes.get(&scope);
        if accepted.is_none() && scopes.len() >= MEMORY_FENCE_SCOPES_MAX {
            return Err(FenceError::InvalidRequest {
                message: format!(
                    "this in-memory fence already tracks {MEMORY_FENCE_SCOPES_MAX} scopes and \
                     forgets none; use a durable fence (redb, PostgreSQL) or fewer scopes"
                ),
            });
        }
        let next = check(accepted, LockBinding::BindOnFirstWrite, sequencer, intent)?;
        assert_advance(accepted, &next);
        scopes.insert(scope, next);
        Ok(())
    }
}

impl FenceBackend for MemoryFence {
    fn check_and_advance(
        self: Arc<Self>,
        scope: String,
        sequencer: Arc<VerifiedSequencer>,
        intent: Intent,
    ) -> BoxFuture<Result<(), FenceError>> {
        let outcome = self.admit(scope, &sequencer, intent);
        Box::pin(std::future::ready(outcome))
    }
}

/// One durable redb write transaction per admission (fsync before the inner service runs), on
/// a blocking thread.
impl FenceBackend for RedbFence {
    fn check_and_advance(
        self: Arc<Self>,
        scope: String,
        sequencer: Arc<VerifiedSequencer>,
        intent: Intent,
    ) -> BoxFuture<Result<(), FenceError>> {
        Box::pin(async move {
            let admit = move || self.begin_with(&sequencer, &scope, intent)?.commit();
            match tokio::task::spawn_blocking(admit).await {
                Ok(outcome) => outcome,
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(error) => Err(FenceError::storage(format!(
                    "the fence's transaction was cancelled: {error}"
                ))),
            }
        })
    }
}

/// The accepted tokens in PostgreSQL's `palisade_fence` table ([`crate::postgres`]), so every
/// replica of the service shares them. Each admission is one transaction (claim, commit) on one
/// connection, taken in turn: for more throughput, implement [`FenceBackend`] over your pool
/// with the same two calls.
#[derive(Debug)]
pub struct PostgresFence {
    client: tokio::sync::Mutex<tokio_postgres::Client>,
}

impl PostgresFence {
    /// Creates the fence table if it is missing, and admits through `client`.
    pub async fn new(client: tokio_postgres::Client) -> Result<PostgresFence, FenceError> {
        crate::postgres::ensure_schema(&client).await?;
        Ok(PostgresFence {
            client: tokio::sync::Mutex::new(client),
        })
    }
}

impl FenceBackend for PostgresFence {
    fn check_and_advance(
        self: Arc<Self>,
        scope: String,
        sequencer: Arc<VerifiedSequencer>,
        intent: Intent,
    ) -> BoxFuture<Result<(), FenceError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let txn = client.transaction().await.map_err(FenceError::storage)?;
            crate::postgres::claim_with(
                &txn,
                &scope,
                &sequencer,
                LockBinding::BindOnFirstWrite,
                intent,
            )
            .await?;
            crate::postgres::commit(txn).await
        })
    }
}

/// The scope of a request, from its head and its verified sequencer.
type ScopeFn = dyn Fn(&Parts, &VerifiedSequencer) -> String + Send + Sync;

/// The `tower` layer: wraps a service in [`Fenced`].
pub struct FenceLayer<F> {
    shared: Arc<Shared<F>>,
}

struct Shared<F> {
    verifier: Arc<Verifier>,
    fence: Arc<F>,
    scope: Box<ScopeFn>,
    stats: Arc<FenceStats>,
}

impl<F: FenceBackend> FenceLayer<F> {
    /// Verifies with `verifier` (share it to change the trusted keys later) and admits through
    /// `fence`, one scope per lock.
    pub fn new(verifier: Arc<Verifier>, fence: F) -> FenceLayer<F> {
        FenceLayer::with_shared_fence(verifier, Arc::new(fence))
    }

    /// [`FenceLayer::new`] with a fence the application also holds (to read its state).
    pub fn with_shared_fence(verifier: Arc<Verifier>, fence: Arc<F>) -> FenceLayer<F> {
        FenceLayer {
            shared: Arc::new(Shared {
                verifier,
                fence,
                scope: Box::new(|_, sequencer| sequencer.binding().into_owned()),
                stats: Arc::new(FenceStats::new()),
            }),
        }
    }

    /// Scopes each request by `scope` instead of by lock: a function of the request's head and
    /// the verified sequencer. A scope is 1..=[`crate::SCOPE_BYTES_MAX`] bytes; any other is
    /// refused as `invalid_scope` (400).
    pub fn scope_by(
        self,
        scope: impl Fn(&Parts, &VerifiedSequencer) -> String + Send + Sync + 'static,
    ) -> FenceLayer<F> {
        self.rebuild(|shared| Shared {
            scope: Box::new(scope),
            ..shared
        })
    }

    /// Counts into `stats` (shared with other fences of the application) instead of the layer's
    /// own.
    pub fn with_stats(self, stats: Arc<FenceStats>) -> FenceLayer<F> {
        self.rebuild(|shared| Shared { stats, ..shared })
    }

    /// The accepted and refused requests, per lock.
    pub fn stats(&self) -> Arc<FenceStats> {
        Arc::clone(&self.shared.stats)
    }

    fn rebuild(self, change: impl FnOnce(Shared<F>) -> Shared<F>) -> FenceLayer<F> {
        let shared = Arc::try_unwrap(self.shared)
            .unwrap_or_else(|_| panic!("configure a FenceLayer before cloning it"));
        FenceLayer {
            shared: Arc::new(change(shared)),
        }
    }
}

impl<F> Clone for FenceLayer<F> {
    fn clone(&self) -> Self {
        FenceLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<F> std::fmt::Debug for FenceLayer<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("FenceLayer").finish_non_exhaustive()
    }
}

impl<S, F> tower_layer::Layer<S> for FenceLayer<F> {
    type Service = Fenced<S, F>;

    fn layer(&self, inner: S) -> Fenced<S, F> {
        Fenced {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A service behind the fence: runs the inner service only for a request whose sequencer the
/// fence accepts, and answers the refusal itself otherwise.
pub struct Fenced<S, F> {
    inner: S,
    shared: Arc<Shared<F>>,
}

impl<S: Clone, F> Clone for Fenced<S, F> {
    fn clone(&self) -> Self {
        Fenced {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, F> std::fmt::Debug for Fenced<S, F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Fenced").finish_non_exhaustive()
    }
}

/// The body of a fenced service's answer: the inner service's, or a refusal's JSON.
pub type FencedBody<B> = Either<B, Full<Bytes>>;

impl<S, F, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for Fenced<S, F>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    F: FenceBackend,
    ReqBody: Send + 'static,
{
    type Response = Response<FencedBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was made ready is the one that serves; a fresh clone stays behind.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            match shared.admit(&parts).await {
                Ok(()) => {
                    let response = inner.call(Request::from_parts(parts, body)).await?;
                    Ok(response.map(Either::Left))
                }
                Err(refusal) => Ok(refusal_response(&parts, &refusal).map(Either::Right)),
            }
        })
    }
}

impl<F: FenceBackend> Shared<F> {
    async fn admit(&self, parts: &Parts) -> Result<(), FenceError> {
        let sequencer = match presented(parts).and_then(|text| self.verifier.verify_shared(text)) {
            Ok(sequencer) => sequencer,
            Err(refusal) => {
                self.stats.record::<()>(None, &Err(refusal.clone()));
                return Err(refusal);
            }
        };
        let scope = (self.scope)(parts, &sequencer);
        let intent = match parts.method {
            http::Method::GET | http::Method::HEAD => Intent::Read,
            _ => Intent::Write,
        };
        let outcome = match validate_scope(&scope) {
            Ok(()) => {
                Arc::clone(&self.fence)
                    .check_and_advance(scope, Arc::clone(&sequencer), intent)
                    .await
            }
            Err(invalid) => Err(invalid),
        };
        self.stats.record(Some(sequencer.lock()), &outcome);
        outcome
    }
}

/// The sequencer text of the request's one [`SEQUENCER_HEADER`], if any.
fn presented(parts: &Parts) -> Result<Option<&str>, FenceError> {
    let mut values = parts.headers.get_all(SEQUENCER_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(FenceError::Malformed {
            message: "more than one Palisade-Sequencer header; send exactly one".into(),
        });
    }
    value.to_str().map(Some).map_err(|_| FenceError::Malformed {
        message: "the Palisade-Sequencer header is not ASCII".into(),
    })
}

/// The JSON body of a refusal, in the fenced store's wire form (`crates/store/src/wire.rs`):
/// the kind, its fields, and `message` for a person. Kinds the store does not have (the
/// middleware's `invalid_scope`, say) carry their text as `detail`, as the store's do.
pub fn refusal_body(refusal: &FenceError) -> Value {
    let mut body = match refusal {
        FenceError::Stale {
            lock,
            presented,
            accepted,
            holder_session,
        } => json!({
            "kind": "stale",
            "lock": lock,
            "presented": presented.get(),
            "accepted": accepted.get(),
            "holder_session": holder_session.map(|session| session.get()),
        }),
        FenceError::TokenReissued {
            lock,
            token,
            first_session,
            presented_session,
        } => json!({
            "kind": "token_reissued",
            "lock": lock,
            "token": token.get(),
            "first_session": first_session.get(),
            "presented_session": presented_session.get(),
        }),
        FenceError::WrongLock {
            expected,
            presented,
        } => json!({"kind": "wrong_lock", "expected": expected, "presented": presented}),
        FenceError::SharedWrite { lock, token } => {
            json!({"kind": "shared_write", "lock": lock, "token": token.get()})
        }
        FenceError::Missing => json!({"kind": "missing"}),
        FenceError::Malformed { message }
        | FenceError::Forged { message }
        | FenceError::InvalidScope { message }
        | FenceError::InvalidRequest { message }
        | FenceError::Storage { message }
        | FenceError::OutcomeUnknown { message }
        | FenceError::Corrupt { message, .. } => {
            json!({"kind": refusal.kind(), "detail": message})
        }
    };
    body["message"] = Value::String(refusal.to_string());
    body
}

/// The answer to a refused request: JSON with the refusal's HTTP status, or, to a gRPC request,
/// a gRPC status carrying the same JSON.
fn refusal_response(parts: &Parts, refusal: &FenceError) -> Response<Full<Bytes>> {
    let body = refusal_body(refusal).to_string();
    let grpc = parts
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
    let mut response = Response::new(Full::new(Bytes::new()));
    let headers = response.headers_mut();
    if grpc {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(grpc_code(refusal)));
        let message = percent_encode(&body);
        headers.insert(
            "grpc-message",
            HeaderValue::from_str(&message).expect("percent-encoded text is a valid header"),
        );
    } else {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        *response.status_mut() = StatusCode::from_u16(refusal.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        *response.body_mut() = Full::new(Bytes::from(body));
    }
    response
}

/// The gRPC status code of a refusal (the codes of `google.rpc.Code`).
fn grpc_code(refusal: &FenceError) -> u16 {
    match refusal {
        // "ABORTED: ... typically due to a concurrency issue such as a sequencer check failure".
        FenceError::Stale { .. } | FenceError::TokenReissued { .. } => 10,
        FenceError::Missing => 9,
        FenceError::Malformed { .. }
        | FenceError::InvalidScope { .. }
        | FenceError::InvalidRequest { .. } => 3,
        FenceError::Forged { .. }
        | FenceError::WrongLock { .. }
        | FenceError::SharedWrite { .. } => 7,
        FenceError::Corrupt { .. } => 13,
        FenceError::Storage { .. } => 14,
        FenceError::OutcomeUnknown { .. } => 4,
    }
}

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX` (gRPC over HTTP/2).
fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}
