//! The HTTP/JSON face of [`Store`] (axum): routes, header handling, and the answers to refused
//! requests: a [`StoreError`] of the store, or an [`HttpRefusal`] of the routes, sent in the wire
//! form of [`crate::wire`]. The API is described in `docs/store-http.md`.
//!
//! Every handler runs the store call on a blocking thread (redb blocks on fsync). A panic there
//! means a broken invariant, and a broken invariant stops the server: the process aborts rather
//! than keep serving from state it no longer trusts.
//!
//! What a client can hold is bounded, so neither idle nor slow clients nor huge bodies exhaust
//! the server (see [`ServeLimits`]): at most `connections_max` connections (further clients
//! wait in the accept backlog), a header read timeout (a connection that sends no request, or
//! sends it a byte at a time, is closed), a body read timeout, and a budget of body bytes in
//! memory at once that a request reserves before its body is read. The writer's queue behind
//! all this is bounded too ([`crate::limits::WRITE_QUEUE_JOBS_MAX`]).
//!
//! With TLS ([`StoreServer::with_tls`]), a connection's handshake must finish within the header
//! read timeout of its acceptance, so a client stalling in the handshake holds its permit no
//! longer than one that sends no request. Certificates are read at start; replacing them takes
//! a restart.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use palisade_tls::host::AllowedHosts;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::error::HttpRefusal;
use crate::limits::{
    BATCH_BODY_BYTES_MAX, BODY_BYTES_IN_FLIGHT_MAX, BODY_FIRST_BYTE_TIMEOUT_MS,
    BODY_READ_TIMEOUT_MS, CONNECTIONS_MAX, HEADER_READ_TIMEOUT_MS, PUT_BODY_BYTES_MAX,
};
use crate::types::{BatchOp, BatchRequest, Compare};
use crate::wire::ErrorBody;
use crate::{Store, StoreError};

/// The header carrying the sequencer of a write.
pub const SEQUENCER_HEADER: &str = "palisade-sequencer";
/// The header carrying the optional request id of a write, for idempotent retries.
pub const REQUEST_ID_HEADER: &str = "palisade-request-id";
/// Raw reads (`?format=raw`) carry the writing grant's token and session in these headers.
pub const TOKEN_HEADER: &str = "palisade-token";
pub const SESSION_HEADER: &str = "palisade-session";
pub const LOCK_HEADER: &str = "palisade-lock";
/// Raw reads carry the key's revision in this header (and as the `ETag`).
pub const REVISION_HEADER: &str = "palisade-revision";

/// What the server lets its clients hold (module docs); [`ServeLimits::default`] is the
/// limits of [`crate::limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once.
    pub connections_max: usize,
    /// Time to send a request's headers.
    pub header_read_timeout: Duration,
    /// Time to send a request's body.
    pub body_read_timeout: Duration,
    /// Time to send the first bytes of a request's body.
    pub body_first_byte_timeout: Duration,
    /// Bytes of request bodies in memory at once.
    pub body_bytes_in_flight_max: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            connections_max: CONNECTIONS_MAX,
            header_read_timeout: Duration::from_millis(HEADER_READ_TIMEOUT_MS),
            body_read_timeout: Duration::from_millis(BODY_READ_TIMEOUT_MS),
            body_first_byte_timeout: Duration::from_millis(BODY_FIRST_BYTE_TIMEOUT_MS),
            body_bytes_in_flight_max: BODY_BYTES_IN_FLIGHT_MAX,
        }
    }
}

/// The body budget: one permit per KiB of [`ServeLimits::body_bytes_in_flight_max`].
#[derive(Debug, Clone)]
struct BodyBudget {
    kib: Arc<Semaphore>,
    kib_max: u32,
    read_timeout: Duration,
    first_byte_timeout: Duration,
    /// Whose sequencers a write must carry before its body is read.
    store: Arc<Store>,
}

const KIB: u64 = 1024;

/// Whether a request to `path` with `method` has a body its route reads: a write of a value
/// or a transaction. Every other route, and every path no route serves, is answered without
/// its body being read, and reserves nothing.
fn reads_body(method: &Method, path: &str) -> bool {
    (method == Method::PUT && path.starts_with("/v1/kv/"))
        || (method == Method::POST && (path == "/v1/txn" || path == "/v1/batch"))
}

/// Reads a write's body within the budget and the body read timeouts, then passes the request
/// on with its body in memory. The route's own body limit still applies after this.
///
/// Before a byte of the body is read, the write's sequencer must verify (its form, its key id
/// among the store's keys, its signature): a request without one is answered from its headers
/// and takes nothing from the budget. A verified write then takes budget for its body's bytes
/// as they arrive, a KiB at a time, never what its `Content-Length` declares.
async fn bounded_body(State(budget): State<BodyBudget>, request: Request, next: Next) -> Response {
    if !reads_body(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let hint = request.body().size_hint();
    // No body, or one declared larger than any route takes, which the route's own limit refuses
    // from the header alone, without reading it.
    if hint.exact() == Some(0)
        || hint
            .exact()
            .is_some_and(|size| size > BATCH_BODY_BYTES_MAX as u64)
    {
        return next.run(request).await;
    }
    let verified = sequencer_header(request.headers())
        .and_then(|sequencer| budget.store.check_sequencer(sequencer.as_deref()));
    if let Err(error) = verified {
        // The body is not read: the connection closes after the answer.
        let mut response = error.into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    let (parts, body) = request.into_parts();
    let started = tokio::time::Instant::now();
    let deadline = started + budget.read_timeout;
    let first_byte_due = (started + budget.first_byte_timeout).min(deadline);
    let mut body = body;
    let mut bytes: Vec<u8> = Vec::new();
    // Held until the answer: the body stays in memory until then.
    let mut permits: Option<tokio::sync::SemaphorePermit<'_>> = None;
    let mut kib_held: u32 = 0;
    let too_long = |parts: &axum::http::request::Parts| {
        let (what, limit, size_max) = if parts.uri.path().starts_with("/v1/kv/") {
            ("value", "value_bytes_max", PUT_BODY_BYTES_MAX)
        } else {
            ("batch body", "batch_body_bytes_max", BATCH_BODY_BYTES_MAX)
        };
        StoreError::too_large(what, limit, None, size_max).into_response()
    };
    let timed_out = |budget: &BodyBudget, first: bool| {
        let message = if first {
            format!(
                "the request body did not begin to arrive within {} ms; nothing was applied",
                budget.first_byte_timeout.as_millis()
            )
        } else {
            format!(
                "the request body did not arrive within {} ms; nothing was applied",
                budget.read_timeout.as_millis()
            )
        };
        let mut response = StoreError::Unavailable { message }.into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    };
    loop {
        let due = if bytes.is_empty() {
            first_byte_due
        } else {
            deadline
        };
        let next_frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx));
        let frame = match tokio::time::timeout_at(due, next_frame).await {
            Err(_) => return timed_out(&budget, bytes.is_empty()),
            Ok(None) => break,
            Ok(Some(Err(error))) => {
                return StoreError::InvalidRequest {
                    message: format!("cannot read the request body: {error}"),
                }
                .into_response();
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing to keep
        };
        if bytes.len() + data.len() > BATCH_BODY_BYTES_MAX {
            // Longer than any route takes: the refusal its route would give.
            return too_long(&parts);
        }
        // Room for what arrived, before it is kept.
        let kib_needed = u32::try_from(((bytes.len() + data.len()) as u64).div_ceil(KIB))
            .unwrap_or(budget.kib_max)
            .min(budget.kib_max);
        if kib_needed > kib_held {
            let more = kib_needed - kib_held;
            match tokio::time::timeout_at(deadline, budget.kib.acquire_many(more)).await {
                Ok(Ok(permit)) => match &mut permits {
                    Some(held) => held.merge(permit),
                    None => permits = Some(permit),
                },
                _ => {
                    return StoreError::Unavailable {
                        message: format!(
                            "the store is receiving too many request bodies at once; nothing was applied, retry (in-flight body budget {} bytes)",
                            u64::from(budget.kib_max) * KIB
                        ),
                    }
                    .into_response();
                }
            }
            kib_held = kib_needed;
        }
        bytes.extend_from_slice(&data);
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    drop(permits);
    response
}

/// The HTTP routes of the store, with the default [`ServeLimits`].
pub fn router(store: Arc<Store>) -> Router {
    router_with(store, &ServeLimits::default())
}

/// The HTTP routes of the store, bounding request bodies as `limits` say.
pub fn router_with(store: Arc<Store>, limits: &ServeLimits) -> Router {
    let kv = Router::new()
        .route(
            "/v1/kv/{*key}",
            get(get_key).put(put_key).delete(delete_key),
        )
        .route("/v1/kv/", get(empty_key).put(empty_key).delete(empty_key))
        .layer(DefaultBodyLimit::max(PUT_BODY_BYTES_MAX));
    let batch = Router::new()
        .route("/v1/txn", post(txn))
        .route("/v1/batch", post(txn))
        .layer(DefaultBodyLimit::max(BATCH_BODY_BYTES_MAX));
    Router::new()
        .merge(kv)
        .merge(batch)
        .route("/v1/claim", post(claim))
        .route("/v1/claim/{*lock}", post(claim))
        .route("/v1/fence/{*lock}", get(fence))
        .route("/healthz", get(health))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(store.clone())
        .layer(axum::middleware::from_fn_with_state(
            body_budget(limits, store),
            bounded_body,
        ))
}

fn body_budget(limits: &ServeLimits, store: Arc<Store>) -> BodyBudget {
    let kib_max = u32::try_from((limits.body_bytes_in_flight_max as u64 / KIB).max(1))
        .unwrap_or(u32::MAX)
        .min(Semaphore::MAX_PERMITS as u32);
    BodyBudget {
        kib: Arc::new(Semaphore::new(kib_max as usize)),
        kib_max,
        read_timeout: limits.body_read_timeout,
        first_byte_timeout: limits.body_first_byte_timeout,
        store,
    }
}

/// A bound, not yet serving, store server.
#[derive(Debug)]
pub struct StoreServer {
    listener: TcpListener,
    store: Arc<Store>,
    limits: ServeLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    hosts: AllowedHosts,
}

/// A connection the store serves: plain TCP or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Pause after a failed accept (out of file descriptors, say) before the next.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

impl StoreServer {
    /// Binds `addr` (port 0 picks a free port) for `store`.
    pub async fn bind(store: Arc<Store>, addr: SocketAddr) -> io::Result<StoreServer> {
        let listener = TcpListener::bind(addr).await?;
        Ok(StoreServer {
            listener,
            store,
            limits: ServeLimits::default(),
            tls: None,
            hosts: AllowedHosts::default(),
        })
    }

    /// Answers requests whose `Host` is `hosts` too, besides localhost and IP addresses (the
    /// default); any other `Host` gets 421 ([`palisade_tls::host`]).
    pub fn with_allowed_hosts(mut self, hosts: AllowedHosts) -> StoreServer {
        self.hosts = hosts;
        self
    }

    /// Serves TLS with `config` (see `palisade_tls::server_config`; mutual TLS if it
    /// verifies client certificates) instead of plaintext HTTP.
    pub fn with_tls(mut self, config: Arc<rustls::ServerConfig>) -> StoreServer {
        self.tls = Some(config);
        self
    }

    /// Serves with these limits instead of the defaults. A `connections_max` of 0 is taken
    /// as 1.
    pub fn with_limits(mut self, limits: ServeLimits) -> StoreServer {
        self.limits = limits;
        self
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then finishes the requests in flight (each bounded
    /// by the read timeouts) and closes idle connections.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        let limits = self.limits;
        let connections_max = limits.connections_max.clamp(1, u32::MAX as usize);
        let connections = Arc::new(Semaphore::new(connections_max));
        let app = router_with(self.store, &limits).layer(axum::middleware::from_fn_with_state(
            Arc::new(self.hosts),
            answered_host,
        ));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout);
        let (stopping, stop) = watch::channel(false);
        tokio::pin!(shutdown);
        loop {
            // A connection is accepted only with a permit: beyond the cap, clients wait in
            // the accept backlog.
            let permit = tokio::select! {
                () = &mut shutdown => break,
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let stream = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!("cannot accept a connection: {error}");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        continue;
                    }
                },
            };
            // Small request/response pairs: do not let Nagle hold an answer back.
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!("cannot set TCP_NODELAY: {error}");
            }
            let http = http.clone();
            let app = app.clone();
            let tls = self.tls.clone().map(tokio_rustls::TlsAcceptor::from);
            let handshake_timeout = limits.header_read_timeout;
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let stream: Box<dyn Io> = match tls {
                    None => Box::new(stream),
                    // The handshake shares the header read timeout's budget.
                    Some(tls) => {
                        match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                            Ok(Ok(stream)) => Box::new(stream),
                            Ok(Err(error)) => {
                                tracing::debug!("TLS handshake failed: {error}");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(
                                    "no TLS handshake within {handshake_timeout:?}; closed"
                                );
                                return;
                            }
                        }
                    }
                };
                let connection =
                    http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
                tokio::pin!(connection);
                tokio::select! {
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            tracing::debug!("connection ended: {error}");
                        }
                        return;
                    }
                    _ = stop.wait_for(|stopping| *stopping) => {}
                }
                connection.as_mut().graceful_shutdown();
                if let Err(error) = connection.await {
                    tracing::debug!("connection ended: {error}");
                }
            });
        }
        drop(self.listener);
        let _ = stopping.send(true);
        // Every connection holds a permit until it ends: all of them back means all ended.
        let _ = connections.acquire_many(connections_max as u32).await;
        Ok(())
    }
}

/// Refuses a request whose `Host` the store does not answer to (DNS rebinding) with 421,
/// before anything else looks at it.
async fn answered_host(
    State(hosts): State<Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(HeaderValue::as_bytes);
    match hosts.check(host) {
        Ok(()) => next.run(request).await,
        Err(host) => {
            let mut response = HttpRefusal::MisdirectedRequest { host }.into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// Runs a blocking store read off the async threads. (Writes go to the store's writer thread
/// and are awaited without a thread of their own.)
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result,
        Err(error) if error.is_panic() => {
            tracing::error!("store invariant broken, stopping the server: {error}");
            std::process::abort();
        }
        Err(error) => Err(StoreError::Storage {
            message: format!("the read was cancelled: {error}"),
        }),
    }
}

/// JSON success, or the error as JSON with its status.
fn reply<T: Serialize>(result: Result<T, StoreError>) -> Response {
    match result {
        Ok(body) => (StatusCode::OK, axum::Json(body)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// The answer to a refused request: the status of its kind and its body ([`crate::wire`]).
fn error_response(body: ErrorBody) -> Response {
    let status =
        StatusCode::from_u16(body.error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = body.error.kind();
    if status.is_server_error() {
        tracing::warn!(kind, "request failed: {}", body.message);
    } else {
        tracing::debug!(kind, "request refused: {}", body.message);
    }
    (status, axum::Json(body.to_json())).into_response()
}

impl IntoResponse for StoreError {
    fn into_response(self) -> Response {
        error_response(ErrorBody::from(&self))
    }
}

impl IntoResponse for HttpRefusal {
    fn into_response(self) -> Response {
        error_response(ErrorBody::from(&self))
    }
}

fn key_of(path: Result<Path<String>, PathRejection>) -> Result<String, StoreError> {
    match path {
        Ok(Path(key)) => Ok(key),
        Err(rejection) => Err(StoreError::InvalidKey {
            message: format!("key is not valid percent-encoded UTF-8: {rejection}"),
        }),
    }
}

/// The value of an optional ASCII header.
fn header_text(
    headers: &HeaderMap,
    name: &str,
    invalid: impl FnOnce(String) -> StoreError,
) -> Result<Option<String>, StoreError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => match value.to_str() {
            Ok(text) => Ok(Some(text.to_owned())),
            Err(_) => Err(invalid(format!("the {name} header is not printable ASCII"))),
        },
    }
}

struct WriteHeaders {
    sequencer: Option<String>,
    request_id: Option<String>,
}

fn write_headers(headers: &HeaderMap) -> Result<WriteHeaders, StoreError> {
    Ok(WriteHeaders {
        sequencer: sequencer_header(headers)?,
        request_id: header_text(headers, REQUEST_ID_HEADER, |message| {
            StoreError::InvalidRequest { message }
        })?,
    })
}

fn sequencer_header(headers: &HeaderMap) -> Result<Option<String>, StoreError> {
    header_text(headers, SEQUENCER_HEADER, |message| StoreError::Malformed {
        message,
    })
}

/// The compare a conditional write asks for: `If-Match: "<revision>"` (the key is at that
/// revision; `"0"`: it has no value) or `If-None-Match: *` (create only).
fn condition(headers: &HeaderMap, key: &str) -> Result<Option<Compare>, StoreError> {
    let invalid = |message: String| StoreError::InvalidRequest { message };
    let if_match = header_text(headers, header::IF_MATCH.as_str(), invalid)?;
    let if_none_match = header_text(headers, header::IF_NONE_MATCH.as_str(), invalid)?;
    match (if_match, if_none_match) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(invalid(
            "give If-Match or If-None-Match, not both".to_owned(),
        )),
        (None, Some(star)) if star.trim() == "*" => Ok(Some(Compare::Exists {
            key: key.to_owned(),
            exists: false,
        })),
        (None, Some(other)) => Err(invalid(format!(
            "If-None-Match {other:?} is not supported: use If-None-Match: * to create only"
        ))),
        (Some(tag), None) => {
            let text = tag.trim();
            // If-Match compares strongly (RFC 9110 §13.1.1): a weak tag can never match, and
            // revisions are strong validators, so a weak one is a client's mistake.
            if text.starts_with("W/") {
                return Err(invalid(format!(
                    "If-Match {tag:?} is a weak tag, which never matches: send If-Match: \"<revision>\""
                )));
            }
            let text = text.trim_matches('"');
            match text.parse::<u64>() {
                Ok(revision) => Ok(Some(Compare::Revision {
                    key: key.to_owned(),
                    revision,
                })),
                Err(_) => Err(invalid(format!(
                    "If-Match {tag:?} is not a revision: send If-Match: \"<revision>\" as a read returned it"
                ))),
            }
        }
    }
}

/// A one-key transaction: the operation, under the request's condition if it has one.
fn one_op(op: BatchOp, condition: Option<Compare>) -> BatchRequest {
    BatchRequest {
        compare: condition.into_iter().collect(),
        ops: vec![op],
    }
}

fn body_of(
    body: Result<Bytes, BytesRejection>,
    headers: &HeaderMap,
    what: &str,
    limit: &str,
    size_max: usize,
) -> Result<Bytes, StoreError> {
    match body {
        Ok(body) => Ok(body),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let size = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
                .and_then(|text| text.parse().ok());
            Err(StoreError::too_large(what, limit, size, size_max))
        }
        Err(rejection) => Err(StoreError::InvalidRequest {
            message: format!("cannot read the request body: {rejection}"),
        }),
    }
}

async fn put_key(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let key = key_of(path)?;
        let write = write_headers(&headers)?;
        let condition = condition(&headers, &key)?;
        let value = body_of(
            body,
            &headers,
            "value",
            "value_bytes_max",
            PUT_BODY_BYTES_MAX,
        )?;
        let request = one_op(
            BatchOp::Put {
                key,
                value: value.to_vec(),
            },
            condition,
        );
        Ok((write, request))
    })();
    let (write, request) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return StoreError::into_response(error),
    };
    reply(
        store
            .txn_async(
                write.sequencer.as_deref(),
                &request,
                write.request_id.as_deref(),
            )
            .await,
    )
}

async fn delete_key(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let prepared = key_of(path).and_then(|key| {
        let write = write_headers(&headers)?;
        let condition = condition(&headers, &key)?;
        Ok((write, one_op(BatchOp::Delete { key }, condition)))
    });
    let (write, request) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    reply(
        store
            .txn_async(
                write.sequencer.as_deref(),
                &request,
                write.request_id.as_deref(),
            )
            .await,
    )
}

async fn txn(
    State(store): State<Arc<Store>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let write = write_headers(&headers)?;
        let body = body_of(
            body,
            &headers,
            "batch body",
            "batch_body_bytes_max",
            BATCH_BODY_BYTES_MAX,
        )?;
        let request: BatchRequest =
            serde_json::from_slice(&body).map_err(|error| StoreError::InvalidRequest {
                message: format!(
                    "transaction body is not {{\"compare\": [{{\"key\": …, \"revision\"|\"value\"|\"exists\": …}}], \"ops\": [{{\"op\": \"put\"|\"delete\"|\"get\", \"key\": …, \"value\": …}}]}}: {error}"
                ),
            })?;
        Ok((write, request))
    })();
    let (write, request) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return StoreError::into_response(error),
    };
    reply(
        store
            .txn_async(
                write.sequencer.as_deref(),
                &request,
                write.request_id.as_deref(),
            )
            .await,
    )
}

async fn claim(
    State(store): State<Arc<Store>>,
    path: Option<Path<String>>,
    headers: HeaderMap,
) -> Response {
    let sequencer = match sequencer_header(&headers) {
        Ok(sequencer) => sequencer,
        Err(error) => return error.into_response(),
    };
    let lock = path.map(|Path(lock)| lock);
    reply(
        store
            .claim_async(sequencer.as_deref(), lock.as_deref())
            .await,
    )
}

async fn get_key(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let raw = match query.as_deref() {
        None | Some("") | Some("format=json") => false,
        Some("format=raw") => true,
        Some(other) => {
            return StoreError::InvalidRequest {
                message: format!("unknown query {other:?}: use ?format=raw or ?format=json"),
            }
            .into_response();
        }
    };
    let (key, sequencer) = match key_of(path).and_then(|key| Ok((key, sequencer_header(&headers)?)))
    {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    // With a sequencer the read is fenced: checked like a write, and the lock's accepted token
    // advanced before the value is returned. Without one it only looks.
    let result = match sequencer {
        Some(sequencer) => store.read_async(Some(&sequencer), &key).await,
        None => {
            blocking({
                let key = key.clone();
                move || store.get(&key)
            })
            .await
        }
    }
    .and_then(|entry| entry.ok_or(StoreError::NotFound { key }));
    match result {
        Ok(entry) if raw => {
            let mut response = (StatusCode::OK, entry.value).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(TOKEN_HEADER, HeaderValue::from(entry.token));
            headers.insert(REVISION_HEADER, HeaderValue::from(entry.revision));
            if let Ok(tag) = HeaderValue::from_str(&format!("\"{}\"", entry.revision)) {
                headers.insert(header::ETAG, tag);
            }
            headers.insert(SESSION_HEADER, HeaderValue::from(entry.session));
            // Lock names are UTF-8; only ASCII ones fit in a header. JSON reads always name it.
            if let Ok(lock) = HeaderValue::from_str(&entry.lock) {
                headers.insert(LOCK_HEADER, lock);
            }
            response
        }
        other => reply(other),
    }
}

async fn empty_key() -> Response {
    StoreError::InvalidKey {
        message: "key is empty: use /v1/kv/{key}".into(),
    }
    .into_response()
}

async fn fence(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let lock = match path {
        Ok(Path(lock)) => lock,
        Err(rejection) => {
            return StoreError::InvalidRequest {
                message: format!("lock name is not valid percent-encoded UTF-8: {rejection}"),
            }
            .into_response();
        }
    };
    reply(blocking(move || store.fence_state(&lock)).await)
}

async fn health(State(store): State<Arc<Store>>) -> Response {
    reply(
        blocking(move || store.health())
            .await
            .map(|()| serde_json::json!({ "status": "ok" })),
    )
}

async fn no_route(method: Method, uri: Uri) -> Response {
    HttpRefusal::NoSuchRoute {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
    .into_response()
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    HttpRefusal::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
    .into_response()
}
