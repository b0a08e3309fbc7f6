//! The web UI (`palisade serve --ui-listen ADDR`): a read-only live page of the cluster's
//! members and leader and of every lock (holder session, token, lease remaining, waiters and
//! how each waits; a shared phase's readers, a semaphore's permits and each slot's holder) with
//! its recent grants, releases and expiries ([`timeline`]), on a listener of its own.
//!
//! Routes:
//!
//! - `GET /`, `/ui.js`, `/ui.css`: the page, hand-written and embedded in the binary
//!   (`include_str!`), served with a Content-Security-Policy that allows only these files (no
//!   inline script, no eval). The page writes every lock name as text, never as markup.
//! - `GET /api/state?prefix=P&start_after=S&limit=N`: one page of the locks under `P`, as JSON
//!   ([`PageJson`]).
//! - `GET /api/stream?prefix=P&start_after=S`: the live view, `text/event-stream`: a
//!   `snapshot` event (a [`PageJson`] with timelines), then a `change` event ([`ChangeJson`])
//!   for each grant, release and expiry of a lock in view, and a `refresh` event (a
//!   [`PageJson`] without timelines) every [`UI_REFRESH_INTERVAL`]: leases counting down and
//!   renewals, which make no event. A view that falls behind gets a new `snapshot`. The page
//!   reads it with a streamed `fetch`, which, unlike `EventSource`, can send a bearer token.
//!
//! With a policy, `/api/*` needs `Authorization: Bearer TOKEN` (the gRPC API's tokens) of an
//! identity with the read right somewhere: 401 without one or with a wrong one, 403 for an
//! identity that may read nothing. An answer shows only the locks the identity may read
//! ([`Auth::readable_under`]), and the cluster (its term, leader and members with their
//! addresses) only to an identity that may see it over gRPC (`Cluster.Status`, the admin right):
//! `cluster` is `null` for the others. A live view is judged again after each reload of the
//! token file or the policy, and ends with a `refused` event if its token is gone or its
//! identity may read nothing. Without a policy everything is shown to whoever reaches the
//! listener, which is therefore held to loopback like the gRPC listener (`lib.rs`).
//!
//! Every view is this node's own copy of the table, as applied so far (a follower's may lag
//! the leader's, as `palisade locks --stale` does); the page says which node served it and
//! its role. Limits are in [`crate::limits`] (`UI_*`, `TIMELINE_*`): connections, live views
//! (each also counts against its identity's quota of watches), request heads, the prefix (a
//! lock name's length), locks per answer (with `next_start_after` when more match) and waiters
//! named per lock.
//!
//! **API Boundary:** the JSON is built only from [`LockView`] and [`HolderView`], through
//! [`LockJson::of`] and [`HolderJson::from`]: a field the service adds to a holder reaches the
//! page by one line there.

pub mod timeline;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use palisade_core::{
    Access, CoreError, DurationMs, ErrorCategory, GrantValue, LockName, LockStatus, Mode,
    SessionId, Token,
};
use palisade_tls::host::AllowedHosts;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::{Auth, Caller, Credential, LiveCaller, ReadScope};
use crate::limits::{ACCEPT_ERROR_PAUSE, STREAM_BUFFER_MESSAGES};
use crate::limits::{
    UI_CONNECTIONS_MAX, UI_HEADER_READ_TIMEOUT, UI_PAGE_LOCKS_MAX, UI_REFRESH_INTERVAL,
    UI_REQUEST_HEAD_BYTES_MAX, UI_SHARERS_SHOWN_MAX, UI_STREAMS_MAX, UI_WAITERS_SHOWN_MAX,
};
use crate::node::Node;
use crate::service::{HolderView, LockService, LockView};
use timeline::{Entry, Timeline, unix_ms_now};

const INDEX_HTML: &str = include_str!("assets/index.html");
const UI_JS: &str = include_str!("assets/ui.js");
const UI_CSS: &str = include_str!("assets/ui.css");

/// Only the page's own script, style and API: no inline script or style, no eval, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The web UI's listener, bound and not yet serving.
#[derive(Debug)]
pub struct Ui {
    listener: TcpListener,
    state: Arc<UiState>,
}

#[derive(Debug)]
struct UiState {
    /// For its node, its [`Auth`] and its view of a lock; its permits go unused.
    service: LockService,
    timeline: Arc<Timeline>,
    streams: Arc<Semaphore>,
    /// The `Host` names it answers to (DNS rebinding, [`palisade_tls::host`]).
    hosts: AllowedHosts,
}

impl Ui {
    /// Binds `listen` (port 0 picks a free one) and starts recording the timeline of
    /// `service`'s node. It answers requests naming loopback, an IP address or one of `hosts`
    /// in their `Host` header; others get 421.
    pub async fn bind(
        listen: SocketAddr,
        service: LockService,
        hosts: AllowedHosts,
    ) -> std::io::Result<Ui> {
        let listener = TcpListener::bind(listen).await?;
        let timeline = Timeline::record_from(service.node().clone());
        Ok(Ui {
            listener,
            state: Arc::new(UiState {
                service,
                timeline,
                streams: Arc::new(Semaphore::new(UI_STREAMS_MAX)),
                hosts,
            }),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves. Then no connection is accepted; live views end when
    /// the node stops, and requests in flight end with the process.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        let connections = Arc::new(Semaphore::new(UI_CONNECTIONS_MAX));
        let app = router(self.state);
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(UI_HEADER_READ_TIMEOUT)
            .max_buf_size(UI_REQUEST_HEAD_BYTES_MAX);
        tokio::pin!(shutdown);
        loop {
            // Beyond the cap, clients wait in the accept backlog.
            let permit = tokio::select! {
                () = &mut shutdown => return,
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let stream = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!("web UI: cannot accept a connection: {error}");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        continue;
                    }
                },
            };
            let connection =
                http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
            tokio::spawn(async move {
                let _permit = permit;
                if let Err(error) = connection.await {
                    tracing::debug!("web UI connection ended: {error}");
                }
            });
        }
    }
}

fn router(state: Arc<UiState>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui.js",
            get(|| async { asset("text/javascript; charset=utf-8", UI_JS) }),
        )
        .route(
            "/ui.css",
            get(|| async { asset("text/css; charset=utf-8", UI_CSS) }),
        )
        .route("/api/state", get(state_handler))
        .route("/api/stream", get(stream_handler))
        .fallback(|| async { UiError::not_found() })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            answered_host,
        ))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

/// Refuses a request whose `Host` the UI does not answer to (DNS rebinding) with 421, before
/// anything else looks at it.
async fn answered_host(
    State(state): State<Arc<UiState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(HeaderValue::as_bytes);
    match state.hosts.check(host) {
        Ok(()) => next.run(request).await,
        Err(refused) => UiError {
            status: StatusCode::MISDIRECTED_REQUEST,
            kind: "misdirected_request",
            message: format!(
                "the web UI does not answer to the host name {refused:?}: it answers to localhost, IP addresses and the names given with --ui-host (PALISADE_UI_HOST). \
                 If you reach it by that name on purpose, start palisade serve with --ui-host NAME"
            ),
        }
        .into_response(),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Headers on every answer: the Content-Security-Policy, no type sniffing, no referrer, no
/// framing, and no caching of live data.
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A refusal, answered as `{"error": MESSAGE, "kind": KIND}` with its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    error: &'a str,
    kind: &'a str,
}

impl UiError {
    fn invalid(message: String) -> UiError {
        UiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_input",
            message,
        }
    }

    fn not_found() -> UiError {
        UiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found",
            message: "no such page; the web UI is at /".into(),
        }
    }

    fn body(&self) -> ErrorJson<'_> {
        ErrorJson {
            error: &self.message,
            kind: self.kind,
        }
    }
}

impl From<CoreError> for UiError {
    fn from(error: CoreError) -> UiError {
        let status = match error.category() {
            ErrorCategory::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorCategory::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorCategory::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorCategory::LimitReached => StatusCode::TOO_MANY_REQUESTS,
            ErrorCategory::SessionNotFound
            | ErrorCategory::Busy
            | ErrorCategory::NotHolder
            | ErrorCategory::WaitEnded
            | ErrorCategory::Exhausted
            | ErrorCategory::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        UiError {
            status,
            kind: error.code(),
            message: error.to_string(),
        }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"palisade\""),
            );
        }
        response
    }
}

/// The query of `/api/state` and `/api/stream`.
#[derive(Debug, Deserialize)]
struct PageQuery {
    /// Locks whose names start with this (every lock when empty).
    #[serde(default)]
    prefix: String,
    /// The page begins after this name (the last answer's `next_start_after`).
    start_after: Option<String>,
    /// Most locks in the answer: 1 to [`UI_PAGE_LOCKS_MAX`] (more, or 0, is a full page).
    limit: Option<usize>,
}

/// A checked [`PageQuery`].
#[derive(Debug, Clone)]
struct PageAsk {
    prefix: String,
    start_after: Option<String>,
    limit: usize,
}

impl PageQuery {
    fn checked(self) -> Result<PageAsk, UiError> {
        // A prefix is a lock name's beginning: its limits, except that it may be empty.
        if !self.prefix.is_empty() {
            LockName::new(self.prefix.as_str())
                .map_err(|e| UiError::invalid(format!("prefix: {e}")))?;
        }
        if let Some(after) = &self.start_after {
            LockName::new(after.as_str())
                .map_err(|e| UiError::invalid(format!("start_after: {e}")))?;
        }
        Ok(PageAsk {
            prefix: self.prefix,
            start_after: self.start_after,
            limit: match self.limit {
                None | Some(0) => UI_PAGE_LOCKS_MAX,
                Some(n) => n.min(UI_PAGE_LOCKS_MAX),
            },
        })
    }
}

fn checked_query(query: Result<Query<PageQuery>, QueryRejection>) -> Result<PageAsk, UiError> {
    let Query(query) = query.map_err(|e| UiError::invalid(e.body_text()))?;
    query.checked()
}

/// What the page shows: one page of locks, the cluster, and who served it.
#[derive(Debug, Clone, Serialize)]
pub struct PageJson {
    pub served_by: ServedByJson,
    /// `None` for a caller that may not see the cluster ([`Auth::require_viewer`]).
    pub cluster: Option<ClusterJson>,
    /// The identity the bearer token named (`None` without one).
    pub identity: Option<String>,
    pub prefix: String,
    /// In name order: held, waited for, in lock-delay, or with recent entries in the timeline.
    pub locks: Vec<LockJson>,
    /// More locks match: the next page starts after this name. `None`: this is the last page.
    pub next_start_after: Option<String>,
    /// Events this node's timeline missed since it started (it fell behind).
    pub timeline_missed_events: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServedByJson {
    pub node_id: u64,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterJson {
    pub term: u64,
    pub leader: Option<u64>,
    pub members: Vec<MemberJson>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemberJson {
    pub id: u64,
    pub addr: String,
    pub voter: bool,
}

/// One lock.
#[derive(Debug, Clone, Serialize)]
pub struct LockJson {
    pub name: String,
    /// The exclusive holder (a mutex's, or a read-write lock's writer).
    pub holder: Option<HolderJson>,
    /// How many readers of the current shared phase, or permit holders of a semaphore, hold it.
    pub sharer_count: usize,
    /// The first [`UI_SHARERS_SHOWN_MAX`] of them, in session order.
    pub sharers: Vec<HolderJson>,
    /// A semaphore's number of permits; `None` for a lock.
    pub permits: Option<u32>,
    /// The last token granted for this lock (0 if never, or long forgotten).
    pub last_token: Token,
    /// How many sessions wait for it.
    pub waiters: usize,
    /// The first [`UI_WAITERS_SHOWN_MAX`] of them, first in line first.
    pub waiting_sessions: Vec<SessionId>,
    /// How each of `waiting_sessions` asks to hold the lock: `exclusive`, `shared` or `permit`.
    pub waiting_modes: Vec<&'static str>,
    pub lock_delay_remaining_ms: Option<DurationMs>,
    /// Its recent grants, releases and expiries, oldest first; absent from a `refresh`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<Entry>>,
}

/// Who holds a lock, and the value its grant carries (leader election: the holder's address),
/// which `ui.js` shows as text.
#[derive(Debug, Clone, Serialize)]
pub struct HolderJson {
    pub session: SessionId,
    pub token: Token,
    pub lease_remaining_ms: DurationMs,
    pub value: Option<GrantValue>,
    #[serde(flatten)]
    pub access: AccessJson,
}

/// How a grant holds its lock, as the page reads it: `"access"` is `exclusive`, `shared` (a
/// reader of the phase whose token it has) or `slot`, with the permit's `"slot"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AccessJson {
    pub access: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
}

impl From<Access> for AccessJson {
    fn from(access: Access) -> AccessJson {
        let name = match access {
            Access::Exclusive => "exclusive",
            Access::Shared => "shared",
            Access::Slot(_) => "slot",
        };
        AccessJson {
            access: name,
            slot: access.slot(),
        }
    }
}

/// A waiter's mode as the page names it.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Permit(_) => "permit",
    }
}

impl From<HolderView> for HolderJson {
    fn from(holder: HolderView) -> HolderJson {
        HolderJson {
            session: holder.session,
            token: holder.token,
            lease_remaining_ms: holder.lease_remaining_ms,
            value: holder.value,
            access: holder.access.into(),
        }
    }
}

impl LockJson {
    fn of(view: LockView, timeline: Option<Vec<Entry>>) -> LockJson {
        LockJson {
            holder: view.holder.map(HolderJson::from),
            sharer_count: view.sharers.len(),
            sharers: (view.sharers.into_iter())
                .take(UI_SHARERS_SHOWN_MAX)
                .map(HolderJson::from)
                .collect(),
            permits: view.permits,
            last_token: view.last_token,
            waiters: view.waiters.len(),
            waiting_sessions: view
                .waiters
                .into_iter()
                .take(UI_WAITERS_SHOWN_MAX)
                .collect(),
            waiting_modes: (view.waiter_modes.into_iter())
                .take(UI_WAITERS_SHOWN_MAX)
                .map(mode_name)
                .collect(),
            lock_delay_remaining_ms: view.lock_delay_remaining_ms,
            timeline,
            name: view.lock,
        }
    }
}

/// A grant, release or expiry of a lock in view, as the live view sends it.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeJson {
    pub lock: String,
    /// Sessions waiting for the lock after the change.
    pub waiters: u64,
    #[serde(flatten)]
    pub entry: Entry,
}

impl UiState {
    fn node(&self) -> &Node {
        self.service.node()
    }

    fn auth(&self) -> &Auth {
        self.service.auth()
    }

    fn caller(&self, headers: &HeaderMap) -> Result<Caller, UiError> {
        Ok(self.auth().authenticate(&credential(headers))?)
    }

    /// The caller of a live view, judged again after each reload.
    fn live_caller(&self, headers: &HeaderMap) -> Result<LiveCaller, UiError> {
        Ok(self.auth().live_caller(credential(headers))?)
    }

    /// The page `ask` names, of the locks in `scope`.
    fn page(&self, caller: &Caller, scope: &ReadScope, ask: &PageAsk, timelines: bool) -> PageJson {
        // The first `limit + 1` names of the table and of the timeline: the first `limit + 1`
        // of their union is among them, and the one past `limit` says whether more match.
        let wanted = ask.limit + 1;
        let start_after = ask.start_after.as_deref();
        let mut rows: BTreeMap<String, Option<LockStatus>> = BTreeMap::new();
        self.node().read_table(|table| {
            for prefix in scope.prefixes() {
                let found = table.locks(prefix, start_after, wanted - rows.len().min(wanted));
                rows.extend(found.into_iter().map(|s| (s.lock.clone(), Some(s))));
                if rows.len() >= wanted {
                    break;
                }
            }
        });
        let mut recent = Vec::new();
        for prefix in scope.prefixes() {
            recent.extend(
                self.timeline
                    .names(prefix, start_after, wanted - recent.len()),
            );
            if recent.len() >= wanted {
                break;
            }
        }
        for name in recent {
            rows.entry(name).or_insert(None);
        }
        let more = rows.len() > ask.limit;
        let rows: Vec<(String, Option<LockStatus>)> = rows.into_iter().take(ask.limit).collect();
        // Locks the timeline knows and the table no longer holds: free, with their last token.
        let last_tokens: Vec<Option<Token>> = self.node().read_table(|table| {
            rows.iter()
                .map(|(name, status)| match status {
                    Some(_) => None,
                    None => table.last_token_of(name),
                })
                .collect()
        });
        let next_start_after = more
            .then(|| rows.last().map(|(name, _)| name.clone()))
            .flatten();
        let locks = rows
            .into_iter()
            .zip(last_tokens)
            .map(|((name, status), last_token)| {
                let view = match status {
                    Some(status) => self.service.view(status),
                    None => LockView::free(name, last_token),
                };
                let timeline = timelines.then(|| self.timeline.entries(&view.lock));
                LockJson::of(view, timeline)
            })
            .collect();
        let cluster = self.node().cluster_view();
        let may_view = self.auth().require_viewer(caller).is_ok();
        PageJson {
            served_by: ServedByJson {
                node_id: cluster.node_id,
                role: cluster.role,
            },
            cluster: may_view.then(|| ClusterJson {
                term: cluster.term,
                leader: cluster.leader,
                members: cluster
                    .members
                    .into_iter()
                    .map(|m| MemberJson {
                        id: m.id,
                        addr: m.addr,
                        voter: m.voter,
                    })
                    .collect(),
            }),
            identity: caller.identity().map(ToString::to_string),
            prefix: ask.prefix.clone(),
            locks,
            next_start_after,
            timeline_missed_events: self.timeline.missed_events(),
        }
    }
}

/// The credential of a request (only the `authorization` header), in the form the gRPC side
/// reads.
fn credential(headers: &HeaderMap) -> Credential {
    let mut credential = HeaderMap::new();
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        credential.insert(header::AUTHORIZATION, value.clone());
    }
    Credential::from_metadata(&tonic::metadata::MetadataMap::from_headers(credential))
}

async fn state_handler(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, UiError> {
    let caller = ui.caller(&headers)?;
    let ask = checked_query(query)?;
    let scope = ui.auth().readable_under(&caller, &ask.prefix)?;
    Ok(axum::Json(ui.page(&caller, &scope, &ask, true)).into_response())
}

/// One server-sent event: `event: NAME` and its JSON on one `data:` line (JSON holds no raw
/// line break).
fn sse(name: &str, data: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(data).expect("the UI's JSON serializes");
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

async fn stream_handler(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, UiError> {
    let mut live = ui.live_caller(&headers)?;
    let caller = live.caller().clone();
    let ask = checked_query(query)?;
    let mut scope = ui.auth().readable_under(&caller, &ask.prefix)?;
    let quota_permit = ui.auth().watch_permit(&caller)?;
    let permit = ui
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| UiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "too_many_views",
            message: format!(
                "{UI_STREAMS_MAX} live views are open, the limit of this server; close one or retry later"
            ),
        })?;
    // Subscribe before reading the first page, so no change falls in between.
    let mut events = ui.node().subscribe_events();
    let mut installs = ui.node().subscribe_installs();
    let first = ui.page(&caller, &scope, &ask, true);
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_BUFFER_MESSAGES);
    tokio::spawn(async move {
        let _permits = (permit, quota_permit);
        if tx.send(sse("snapshot", &first)).await.is_err() {
            return;
        }
        let mut refresh = tokio::time::interval_at(
            tokio::time::Instant::now() + UI_REFRESH_INTERVAL,
            UI_REFRESH_INTERVAL,
        );
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let message = tokio::select! {
                biased;
                // The files were reloaded: the token must still name the identity, and what it
                // may read is read again.
                () = live.reloaded() => {
                    let still = live
                        .still_authenticated(ui.auth())
                        .and_then(|()| ui.auth().readable_under(&caller, &ask.prefix));
                    match still {
                        Ok(now) => {
                            scope = now;
                            sse("snapshot", &ui.page(&caller, &scope, &ask, true))
                        }
                        Err(refused) => {
                            let _ = tx.send(sse("refused", &UiError::from(refused).body())).await;
                            return;
                        }
                    }
                }
                received = events.recv() => match received {
                    Ok(published) => {
                        let Some(lock) = published.event.lock().filter(|l| scope.covers(l)) else {
                            continue;
                        };
                        let Some(entry) = Entry::of(&published.event, unix_ms_now()) else {
                            continue;
                        };
                        sse("change", &ChangeJson {
                            lock: lock.to_string(),
                            waiters: published.waiters,
                            entry,
                        })
                    }
                    // Behind: start afresh from the table as it is now.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        sse("snapshot", &ui.page(&caller, &scope, &ask, true))
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                // A snapshot replaced the table without events.
                Ok(()) = installs.changed() => sse("snapshot", &ui.page(&caller, &scope, &ask, true)),
                _ = refresh.tick() => sse("refresh", &ui.page(&caller, &scope, &ask, false)),
                () = ui.node().stopping() => return,
                () = tx.closed() => return,
            };
            if tx.send(message).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        body,
    )
        .into_response())
}
