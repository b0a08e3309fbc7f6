//! [`Client`]: a connection to the lock service and the one-shot operations.
//!
//! Every operation here is one request (retried where safe) with no background task. They are
//! what shell scripts and tools need (`palisade acquire`, `renew`, `release`, `status`, …);
//! applications that hold locks for a while use [`Client::open_session`] instead, which keeps
//! the session alive.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_core::error_chain::error_chain;
use palisade_core::{Access, LockName, Mode, RequestId, SessionId, Token};
use palisade_proto::transport::{self, Dialer};
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::{DEFAULT_ENDPOINT, MESSAGE_BYTES_MAX, v1 as pb};
use palisade_sequencer::{KeySet, PublicKey};
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::bearer::{AUTH_TOKEN_ENV, Bearer, BearerToken};

use crate::credential::{SESSION_SECRET_BYTES, SessionCredential, SessionSecret};
use crate::error::{
    AcquireError, CloseError, ConnectError, Failure, ProclaimError, QueryError, ReleaseError,
    RenewError, SessionError,
};
use crate::limits::ENDPOINTS_MAX;
use crate::retry::{Backoff, open_key, request_id, retry_until_known};

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
    /// Exclusive (the default), shared (a reader of a read-write lock) or a permit of a
    /// semaphore of a given size: see `docs/locks.md`.
    pub mode: Mode,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            wait: Wait::Forever,
            value: None,
            mode: Mode::Exclusive,
        }
    }
}

impl AcquireOptions {
    /// Options with this wait.
    pub fn wait(wait: Wait) -> AcquireOptions {
        AcquireOptions {
            wait,
            ..AcquireOptions::default()
        }
    }

    /// The same options, taking the lock shared: a reader, beside the other readers of its
    /// phase, all with the phase's token.
    pub fn shared(self) -> AcquireOptions {
        AcquireOptions {
            mode: Mode::Shared,
            ..self
        }
    }

    /// The same options, taking one permit of the semaphore of `permits` permits (1 to
    /// [`palisade_core::PERMITS_MAX`]); the grant's [`Grant::access`] names its slot.
    pub fn permits(self, permits: u32) -> AcquireOptions {
        AcquireOptions {
            mode: Mode::Permit(permits),
            ..self
        }
    }

    /// The same options, with the grant carrying `value`.
    pub fn with_value(self, value: impl Into<String>) -> AcquireOptions {
        AcquireOptions {
            value: Some(value.into()),
            ..self
        }
    }
}

/// One lock of a multi-lock ([`Client::acquire_all`], [`crate::Session::acquire_all`]), and how
/// to hold it. A name converts to an exclusive part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockPart {
    pub lock: String,
    /// Exclusive (the default), shared, or a permit of a semaphore of a given size.
    pub mode: Mode,
}

impl LockPart {
    /// `lock`, held exclusively.
    pub fn exclusive(lock: impl Into<String>) -> LockPart {
        LockPart {
            lock: lock.into(),
            mode: Mode::Exclusive,
        }
    }

    /// `lock`, held shared (a reader).
    pub fn shared(lock: impl Into<String>) -> LockPart {
        LockPart {
            lock: lock.into(),
            mode: Mode::Shared,
        }
    }

    /// One permit of the semaphore `lock` of `permits` permits.
    pub fn permit(lock: impl Into<String>, permits: u32) -> LockPart {
        LockPart {
            lock: lock.into(),
            mode: Mode::Permit(permits),
        }
    }
}

impl From<&str> for LockPart {
    fn from(lock: &str) -> LockPart {
        LockPart::exclusive(lock)
    }
}

impl From<String> for LockPart {
    fn from(lock: String) -> LockPart {
        LockPart::exclusive(lock)
    }
}

/// Environment variable naming the lock service's address, or a comma-separated list of the
/// addresses of a cluster's members.
pub const ENDPOINT_ENV: &str = "PALISADE_ENDPOINT";

/// HTTP/2 pings on every connection, and how long one may go unanswered before the connection
/// is dropped. A server that stops answering while its socket stays open (a frozen process, a
/// paused VM) is noticed within about two seconds: the calls in flight fail and are sent again
/// (with the same request id) to the next endpoint, and a keepalive stream reopens there. A
/// session whose TTL is under about three seconds may not outlive a frozen leader.
pub const KEEPALIVE_PING_INTERVAL: Duration = Duration::from_secs(1);
pub const KEEPALIVE_PING_TIMEOUT: Duration = Duration::from_secs(1);

/// Most pages [`Client::list_locks`] follows before deciding the server is misbehaving.
const LIST_PAGES_MAX: usize = 100_000;

/// How a [`Client`] talks to the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Longest time to establish a connection.
    pub connect_timeout: Duration,
    /// Longest time one request may go unanswered (for an acquire: on top of its wait).
    pub request_timeout: Duration,
    /// Longest time spent retrying a request that failed for a transient reason.
    pub retry_budget: Duration,
    /// Sent as `authorization: Bearer <token>` with every call: what a lock service with a
    /// token file authenticates the client by. `None` sends no credential.
    pub bearer_token: Option<BearerToken>,
    /// TLS to every endpoint (plaintext when `None`): the CAs the servers' certificates are
    /// checked against and, for mutual TLS, the client's certificate. With it, an endpoint
    /// without a scheme is `https://`; `http://` is refused. Without it, `https://` is
    /// refused.
    pub tls: Option<palisade_tls::ClientTls>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            retry_budget: Duration::from_secs(10),
            bearer_token: None,
            tls: None,
        }
    }
}

/// A connection to the lock service: to one server, or to the members of a cluster, following
/// the leader. Cheap to clone; clones share the connections (re-established automatically
/// after they break) and the knowledge of which member leads.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) options: ClientOptions,
    pub(crate) endpoints: Arc<Endpoints>,
    /// The clock sessions prove their leases on: tokio's monotonic time, or a test's.
    pub(crate) clock: palisade_clock::SharedClock,
}

/// The endpoints a client was given, and the one it sends to now.
///
/// Every attempt of a call goes to the current endpoint ([`Endpoints::current`]); when it
/// fails, [`Endpoints::after_failure`] decides where the next attempt goes:
///
/// - an `UNAVAILABLE` naming the leader ([`Failure::NotLeader`]): to the leader, at
///   `http://<palisade-leader-addr>`, one of the configured endpoints if it is one of them; a
///   leader outside the list only with TLS, which authenticates the member that named it and
///   the server it names (N14: without, the bearer token and session secrets would go wherever
///   a hint points), else as below; a member naming itself, as below;
/// - any other failure that is not an answer about the request itself (an `UNAVAILABLE` without
///   a leader, a failed connection, a broken connection, no answer in time): to the next
///   configured endpoint, in order, wrapping around, passing over those whose own attempt
///   failed within [`FAILED_ENDPOINT_PASSED_OVER_FOR`] while one has not (so that members lost
///   for good, still in a client's list, cost one connection timeout each per period, not one
///   at every failover); when all have, the one that failed longest ago;
/// - a refusal or an answer: nowhere else (the member answered for the cluster).
///
/// Whether, and when, the next attempt is made is the retry policy's business
/// ([`crate::retry::Backoff`]), not this one's.
#[derive(Debug)]
pub(crate) struct Endpoints {
    /// The configured endpoints, in the order given, each with its own (lazily re-established)
    /// channel.
    configured: Vec<Target>,
    options: ClientOptions,
    /// How connections are made: TCP when `None`.
    dialer: Option<Dialer>,
    state: Mutex<State>,
}

/// The endpoint in use, and when an attempt at each configured endpoint last failed and moved
/// the client on.
#[derive(Debug)]
struct State {
    current: Current,
    failed_at: Vec<Option<tokio::time::Instant>>,
}

impl State {
    /// The configured endpoint to try after the current one, whose attempt just failed: the
    /// next in order that has not failed within [`FAILED_ENDPOINT_PASSED_OVER_FOR`], else the
    /// one that failed longest ago. The current endpoint is marked failed if it is a configured
    /// one (a leader followed outside the list is not, and the member that named it answered).
    fn next_after_failure(&mut self, configured: &[Target]) -> usize {
        let now = tokio::time::Instant::now();
        let current = self.current.index;
        if configured[current].url == self.current.target.url {
            self.failed_at[current] = Some(now);
        }
        let failed_at = &self.failed_at;
        let order = (1..=configured.len()).map(|step| (current + step) % configured.len());
        order
            .clone()
            .find(|&i| {
                failed_at[i]
                    .is_none_or(|at| now.duration_since(at) >= FAILED_ENDPOINT_PASSED_OVER_FOR)
            })
            .or_else(|| order.min_by_key(|&i| failed_at[i]))
            .unwrap_or(current)
    }
}

/// How long an endpoint whose attempt failed is passed over while another has not failed
/// since: longer than a few failovers, short enough that a member back from a restart is
/// tried again soon.
pub(crate) const FAILED_ENDPOINT_PASSED_OVER_FOR: Duration = Duration::from_secs(10);

/// One endpoint and a channel to it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) url: String,
    pub(crate) raw: RawLocks,
}

/// The generated client over a channel that adds the bearer token to every call.
pub(crate) type RawLocks = LocksClient<InterceptedService<Channel, Bearer>>;

/// The endpoint in use.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) target: Target,
    /// Bumped at every switch, so a failure seen by a call that used an endpoint no longer
    /// current moves nothing (another call already moved on).
    pub(crate) generation: u64,
    /// The configured endpoint in use, or the last one used before following a leader that is
    /// not in the list; rotation continues after it.
    index: usize,
}

/// A session opened by [`Client::open_session_without_keepalive`]: it lives for `ttl` after
/// its last renewal, and nothing renews it unless the caller does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionLease {
    pub session: SessionId,
    /// What acts for the session: every call for it presents it. Its text form is what
    /// `palisade acquire` prints as `PALISADE_SESSION`.
    pub credential: SessionCredential,
    /// The lease length the server granted.
    pub ttl: Duration,
}

/// One grant of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    pub lock: String,
    pub session: SessionId,
    /// The fencing token: larger than every earlier grant's token for this lock.
    pub token: Token,
    /// The signed, lock-scoped token to present to resources.
    pub sequencer: String,
    /// Exclusive, shared (a reader of the phase whose token this is) or a semaphore's slot.
    pub access: Access,
}

/// How current a read of the lock table must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Read {
    /// Reflects every write acknowledged before the read: the leader answers after confirming
    /// it still leads.
    #[default]
    Linearizable,
    /// Any node answers from its own copy, without a round to the others: cheaper, and possibly
    /// behind the leader (a node cut off from the others: by any amount).
    Stale,
}

/// The state of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    pub lock: String,
    /// The exclusive holder; `None` when nobody holds the lock exclusive (it is free, read, or
    /// a semaphore).
    pub holder: Option<Holder>,
    /// The readers of the current shared phase, or a semaphore's permit holders.
    pub sharers: Vec<Holder>,
    /// A semaphore's number of permits; `None` for a lock.
    pub permits: Option<u32>,
    /// The last token granted for this lock (0 if none since the lock was last forgotten).
    pub last_token: Token,
    /// Waiting sessions, first in line first.
    pub waiters: Vec<SessionId>,
    /// Time left in lock-delay after a holder's session expired.
    pub lock_delay_remaining: Option<Duration>,
}

/// The current holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    pub session: SessionId,
    pub token: Token,
    /// Lease remaining on the holding session when the server answered.
    pub lease_remaining: Duration,
    /// What the holder attached to its grant (for a leader election, the leader's address).
    pub value: Option<String>,
    /// Exclusive, shared or a semaphore's slot.
    pub access: Access,
}

/// Turns `127.0.0.1:7457` into `http://127.0.0.1:7457`; leaves URLs with a scheme alone.
pub(crate) fn normalize_endpoint(endpoint: &str) -> String {
    let endpoint = endpoint.trim();
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// Splits a comma-separated list of endpoints (`a:7457,b:7457`; one endpoint is a list of one)
/// and gives each without a scheme `http://`. Refuses an empty entry, more than
/// [`ENDPOINTS_MAX`] entries, and an entry that names no host.
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidEndpoint {
        endpoint: list.to_string(),
        reason,
    };
    let entries: Vec<&str> = list.split(',').map(str::trim).collect();
    if entries.len() > ENDPOINTS_MAX {
        return Err(invalid(format!(
            "{} endpoints given, at most {ENDPOINTS_MAX} are allowed",
            entries.len()
        )));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            if entry.is_empty() {
                let reason = if entries.len() == 1 {
                    "no endpoint given".to_string()
                } else {
                    format!(
                        "entry {} of {} is empty; separate endpoints with single commas",
                        i + 1,
                        entries.len()
                    )
                };
                return Err(invalid(reason));
            }
            let url = normalize_endpoint(entry);
            let uri: tonic::transport::Uri = url
                .parse()
                .map_err(|e| invalid(format!("{entry:?}: {e}")))?;
            if uri.host().is_none_or(str::is_empty) {
                return Err(invalid(format!("{entry:?} names no host")));
            }
            Ok(url)
        })
        .collect()
}

/// `url`, the checked form of the endpoint `given`, with the scheme TLS calls for: with TLS,
/// `https://` (an endpoint given without a scheme gets it; one given as `http://` is refused,
/// since it asks for plaintext); without, `https://` is refused (there is nothing to check the
/// server's certificate with).
fn with_scheme(given: &str, url: &str, tls: bool) -> Result<String, ConnectError> {
    let given = given.trim();
    let invalid = |reason: &str| ConnectError::InvalidEndpoint {
        endpoint: given.to_string(),
        reason: reason.to_string(),
    };
    match (tls, url.split_once("://")) {
        (true, Some(("http", rest))) if !given.starts_with("http://") => {
            Ok(format!("https://{rest}"))
        }
        (true, Some(("http", _))) => Err(invalid(
            "http:// asks for plaintext but TLS is configured; use https:// or leave the scheme out",
        )),
        (false, Some(("https", _))) => Err(invalid(
            "https:// needs TLS settings: the CA to check the server's certificate with (--tls-ca or PALISADE_TLS_CA)",
        )),
        _ => Ok(url.to_string()),
    }
}

/// A channel to `url` (already checked), connected on first use and re-established after it
/// breaks.
fn lazy_target(
    url: &str,
    options: &ClientOptions,
    dialer: Option<&Dialer>,
) -> Result<Target, ConnectError> {
    let endpoint = channel_endpoint(url, options)?;
    Ok(Target {
        url: url.to_string(),
        raw: locks_client(transport::connect_lazy(endpoint, dialer), options),
    })
}

/// The channel settings every connection of a client uses.
fn channel_endpoint(url: &str, options: &ClientOptions) -> Result<Endpoint, ConnectError> {
    let uri: tonic::transport::Uri = url.parse().map_err(|e| ConnectError::InvalidEndpoint {
        endpoint: url.to_string(),
        reason: format!("{e}"),
    })?;
    Ok(Endpoint::from(uri)
        .connect_timeout(options.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_PING_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_PING_TIMEOUT)
        .keep_alive_while_idle(true))
}

fn locks_client(channel: Channel, options: &ClientOptions) -> RawLocks {
    LocksClient::with_interceptor(channel, Bearer::new(options.bearer_token.clone()))
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX)
}

impl Endpoints {
    /// `configured` (not empty), sending to the one at `index` first.
    fn new(
        configured: Vec<Target>,
        index: usize,
        options: ClientOptions,
        dialer: Option<Dialer>,
    ) -> Endpoints {
        Endpoints {
            state: Mutex::new(State {
                current: Current {
                    target: configured[index].clone(),
                    generation: 0,
                    index,
                },
                failed_at: vec![None; configured.len()],
            }),
            configured,
            options,
            dialer,
        }
    }

    /// A leader hint (`http://host:port`) with this client's scheme: `https://` with TLS.
    fn leader_url(&self, hint: &str) -> String {
        match (&self.options.tls, hint.strip_prefix("http://")) {
            (Some(_), Some(address)) => format!("https://{address}"),
            _ => hint.to_string(),
        }
    }

    /// The endpoint the next attempt goes to.
    pub(crate) fn current(&self) -> Current {
        self.lock().current.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves on after an attempt sent to `used` (its [`Current::generation`]) failed with
    /// `failure`; see [`Endpoints`] for where to.
    pub(crate) fn after_failure(&self, used: u64, failure: &Failure) {
        let mut state = self.lock();
        if state.current.generation != used {
            return; // Another call has already moved on from that endpoint.
        }
        let next = match failure {
            Failure::NotLeader { leader, .. }
                if self.leader_url(leader) != state.current.target.url =>
            {
                let leader = &self.leader_url(leader);
                match self.configured.iter().position(|t| t.url == *leader) {
                    Some(index) => (self.configured[index].clone(), index),
                    // Outside the list, a hint is followed only with TLS (N14): it came from
                    // a member over an authenticated connection, and the new one sends the
                    // bearer token and session secrets only once its server has shown a
                    // certificate from the CA. Without TLS a hint is only what whoever answered
                    // says.
                    None if self.options.tls.is_none() => {
                        tracing::warn!(
                            leader = %leader,
                            "not following the leader hint to an address outside the configured endpoints \
                             (without TLS nothing proves it is a member): give the client every member's address"
                        );
                        let index = state.next_after_failure(&self.configured);
                        (self.configured[index].clone(), index)
                    }
                    None => match lazy_target(leader, &self.options, self.dialer.as_ref()) {
                        Ok(target) => (target, state.current.index),
                        Err(_) => return, // Checked when read; kept for safety.
                    },
                }
            }
            // A member naming itself as the leader it is not is confused: try another.
            Failure::NotLeader { .. } | Failure::NotApplied(_) | Failure::Unknown(_) => {
                let index = state.next_after_failure(&self.configured);
                (self.configured[index].clone(), index)
            }
            Failure::Core(_)
            | Failure::SessionNotFound(_)
            | Failure::InvalidArgument(_)
            | Failure::Rejected { .. } => return,
        };
        let (target, index) = next;
        let current = &mut state.current;
        if target.url == current.target.url && index == current.index {
            return; // One endpoint: nowhere else to go.
        }
        tracing::debug!(from = %current.target.url, to = %target.url, ?failure, "switching endpoint");
        current.target = target;
        current.index = index;
        current.generation += 1;
    }
}

impl Client {
    /// The same connections, with sessions opened from now on proving their leases on `clock`
    /// (their keepalive ticks, lease deadlines and `lease_remaining`). Production code keeps
    /// the default, tokio's monotonic time; tests drive a
    /// [`ManualClock`](palisade_clock::ManualClock).
    pub fn with_clock(mut self, clock: palisade_clock::SharedClock) -> Client {
        self.clock = clock;
        self
    }

    /// Connects to the lock service at `endpoints`: one address (`http://127.0.0.1:7457`; the
    /// scheme may be left out, `http://` is assumed), or a comma-separated list of the members
    /// of a cluster (`10.0.0.1:7457,10.0.0.2:7457,10.0.0.3:7457`, at most [`ENDPOINTS_MAX`]).
    /// See [`Client::connect_many`].
    pub async fn connect(endpoints: &str) -> Result<Client, ConnectError> {
        Client::connect_with(endpoints, ClientOptions::default()).await
    }

    /// Connects to the address or addresses in `PALISADE_ENDPOINT` (a comma-separated list), or
    /// the default loopback address.
    ///
    /// With `PALISADE_AUTH_TOKEN` set, every call carries that bearer token.
    pub async fn from_env() -> Result<Client, ConnectError> {
        let endpoint = std::env::var(ENDPOINT_ENV).unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string());
        let bearer_token =
            match std::env::var(AUTH_TOKEN_ENV) {
                Ok(token) => Some(BearerToken::new(&token).map_err(|reason| {
                    ConnectError::InvalidEndpoint {
                        endpoint: format!("${AUTH_TOKEN_ENV}"),
                        reason,
                    }
                })?),
                Err(_) => None,
            };
        Client::connect_with(
            &endpoint,
            ClientOptions {
                bearer_token,
                ..ClientOptions::default()
            },
        )
        .await
    }

    /// [`Client::connect`] with explicit timeouts and retry budget.
    pub async fn connect_with(
        endpoints: &str,
        options: ClientOptions,
    ) -> Result<Client, ConnectError> {
        parse_endpoints(endpoints)?;
        // Each entry as given: whether it named its scheme decides how TLS treats it.
        let entries: Vec<&str> = endpoints.split(',').map(str::trim).collect();
        Client::connect_many(&entries, options).await
    }

    /// Connects to the first of `endpoints` that accepts a connection, trying them in order,
    /// and keeps the others for later.
    ///
    /// Calls go to one endpoint at a time, the current one. A member that is not the leader
    /// answers `UNAVAILABLE`, naming the leader when it knows it: the client then makes the
    /// leader its current endpoint and sends the call there at once (nothing was applied, so
    /// that is always safe). A failed connection, or `UNAVAILABLE` naming no leader (an
    /// election), moves the client to the next endpoint in the list, after the usual short
    /// pause. Retries stay within [`ClientOptions::retry_budget`], and a request whose outcome
    /// may be unknown is only ever sent again with the same request id (or open key).
    ///
    /// Fails with [`ConnectError::InvalidEndpoint`] for an empty list, more than
    /// [`ENDPOINTS_MAX`] endpoints, or one that is not a URL, and with
    /// [`ConnectError::Unreachable`] when none accepts a connection.
    pub async fn connect_many(
        endpoints: &[impl AsRef<str>],
        options: ClientOptions,
    ) -> Result<Client, ConnectError> {
        Client::connect_many_via(endpoints, options, None).await
    }

    /// [`Client::connect_many`], making connections through `dialer` instead of TCP when one
    /// is given: a simulated network.
    pub async fn connect_many_via(
        endpoints: &[impl AsRef<str>],
        options: ClientOptions,
        dialer: Option<Dialer>,
    ) -> Result<Client, ConnectError> {
        let urls = endpoints
            .iter()
            .map(|e| {
                let list = e.as_ref();
                match parse_endpoints(list)?.as_slice() {
                    [one] => with_scheme(list, one, options.tls.is_some()),
                    _ => Err(ConnectError::InvalidEndpoint {
                        endpoint: list.to_string(),
                        reason: "one endpoint per entry, not a list".to_string(),
                    }),
                }
            })
            .collect::<Result<Vec<String>, ConnectError>>()?;
        if urls.is_empty() || urls.len() > ENDPOINTS_MAX {
            return Err(ConnectError::InvalidEndpoint {
                endpoint: urls.join(","),
                reason: format!(
                    "{} endpoints given, 1 to {ENDPOINTS_MAX} are allowed",
                    urls.len()
                ),
            });
        }
        let dialer = match &options.tls {
            Some(tls) => Some(transport::TlsDialer::dialer(tls.clone(), dialer)),
            None => dialer,
        };
        // Connect to one now, so that a wrong address is reported here rather than on the
        // first call; the others connect when first used.
        let mut failures = Vec::new();
        let mut connected = None;
        for (index, url) in urls.iter().enumerate() {
            match transport::connect(channel_endpoint(url, &options)?, dialer.as_ref()).await {
                Ok(channel) => {
                    connected = Some((index, channel));
                    break;
                }
                Err(error) => {
                    tracing::debug!(endpoint = %url, error = %error_chain(&error), "cannot connect");
                    failures.push(format!("{url}: {}", error_chain(&error)));
                }
            }
        }
        let Some((index, channel)) = connected else {
            return Err(ConnectError::Unreachable {
                endpoint: urls.join(","),
                reason: failures.join("; "),
            });
        };
        let configured = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                if i == index {
                    Ok(Target {
                        url: url.clone(),
                        raw: locks_client(channel.clone(), &options),
                    })
                } else {
                    lazy_target(url, &options, dialer.as_ref())
                }
            })
            .collect::<Result<Vec<Target>, ConnectError>>()?;
        Ok(Client {
            options: options.clone(),
            clock: palisade_clock::TokioClock::shared(),
            endpoints: Arc::new(Endpoints::new(configured, index, options, dialer)),
        })
    }

    /// The endpoint calls go to now, with its scheme: the leader, as far as this client knows.
    pub fn endpoint(&self) -> String {
        self.endpoints.current().target.url
    }

    /// The endpoints this client was given, in order, with their schemes: what to pass on to
    /// another client (joined with commas, e.g. in `PALISADE_ENDPOINT`).
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints
            .configured
            .iter()
            .map(|t| t.url.clone())
            .collect()
    }

    /// Opens a session that nothing keeps alive: it expires `ttl` after it was opened or last
    /// renewed with [`Client::renew`]. For scripts that hand the session id around.
    pub async fn open_session_without_keepalive(
        &self,
        ttl: Duration,
    ) -> Result<SessionLease, SessionError> {
        self.open_session_raw(ttl).await.map(|(lease, _)| lease)
    }

    /// Opens a session; also returns when the first attempt was sent (on the client's clock),
    /// the earliest instant the lease can have started.
    pub(crate) async fn open_session_raw(
        &self,
        ttl: Duration,
    ) -> Result<(SessionLease, Duration), SessionError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        // One key for every attempt: a retry after an unknown outcome gets the session the
        // first attempt may have opened, not a second one.
        let key = open_key().map_err(|reason| SessionError::NoRandomness { reason })?;
        let request = pb::OpenSessionRequest {
            request_id: 0,
            ttl_ms,
            open_key: key.as_bytes().to_vec(),
        };
        let first_sent_at = self.clock.now();
        let response = self
            .call_with_retries(|mut raw| {
                let request = request.clone();
                async move { raw.open_session(request).await }
            })
            .await
            .map_err(SessionError::from_failure)?;
        if response.session == 0 || response.ttl_ms == 0 {
            return Err(SessionError::Protocol(format!(
                "session {} with ttl {} ms",
                response.session, response.ttl_ms
            )));
        }
        let session = SessionId::new(response.session);
        let Some(secret) = SessionSecret::from_bytes(&response.session_secret) else {
            return Err(SessionError::Protocol(format!(
                "session {session} came with a secret of {} bytes instead of {SESSION_SECRET_BYTES} (a server from before session secrets sends none: upgrade every member before its clients)",
                response.session_secret.len()
            )));
        };
        let lease = SessionLease {
            session,
            credential: SessionCredential::new(session, secret),
            ttl: Duration::from_millis(response.ttl_ms),
        };
        Ok((lease, first_sent_at))
    }

    /// Renews a session's lease once; returns the lease remaining as the server applied it.
    pub async fn renew(&self, credential: SessionCredential) -> Result<Duration, RenewError> {
        let session = credential.id();
        let response = self
            .call_with_retries(
                |mut raw| async move { raw.renew(keep_alive_request(&credential)).await },
            )
            .await
            .map_err(|f| RenewError::from_failure(f, session))?;
        if response.session != session.get() {
            return Err(RenewError::Protocol(format!(
                "renewal of session {session} answered for session {}",
                response.session
            )));
        }
        Ok(Duration::from_millis(response.ttl_remaining_ms))
    }

    /// Ends a session: releases its locks and withdraws its waits.
    pub async fn close_session(&self, credential: SessionCredential) -> Result<(), CloseError> {
        let session = credential.id();
        self.call_with_retries(|mut raw| async move {
            raw.close_session(pb::CloseSessionRequest {
                session: session.get(),
                session_secret: credential.secret().as_bytes().to_vec(),
            })
            .await
        })
        .await
        .map(|_| ())
        .map_err(|f| CloseError::from_failure(f, session))
    }

    /// Takes `lock` for `session`, waiting as `options` says. Retries of transient failures
    /// reuse one request id, so they cannot grant twice.
    pub async fn acquire(
        &self,
        credential: SessionCredential,
        lock: &str,
        options: AcquireOptions,
    ) -> Result<Grant, AcquireError> {
        self.acquire_with_id(credential, lock, options, request_id())
            .await
    }

    /// [`Client::acquire`] with the caller's request id ([`crate::request_id`]): a caller that
    /// got an unknown outcome retries with the same id and is answered with the first
    /// attempt's outcome, never granted twice.
    pub async fn acquire_with_id(
        &self,
        credential: SessionCredential,
        lock: &str,
        options: AcquireOptions,
        request_id: RequestId,
    ) -> Result<Grant, AcquireError> {
        let session = credential.id();
        LockName::new(lock).map_err(|e| AcquireError::InvalidArgument(invalid_name(lock, &e)))?;
        let value = wire_value(options.value.as_deref())
            .map_err(|e| AcquireError::InvalidArgument(invalid_value(&e)))?;
        let response = self
            .send_acquire(options.wait, |mut raw, wait_ms| {
                let request = pb::AcquireRequest {
                    session: session.get(),
                    lock: lock.to_string(),
                    request_id: request_id.get(),
                    wait_ms,
                    wait_forever: options.wait == Wait::Forever,
                    session_secret: credential.secret().as_bytes().to_vec(),
                    value: value.clone(),
                    shared: options.mode == Mode::Shared,
                    permits: options.mode.permits().unwrap_or(0),
                };
                async move { raw.acquire(request).await }
            })
            .await
            .map_err(|failure| AcquireError::from_failure(failure, session, lock))?;
        check_grant(response, session, lock)
    }

    /// Gives up `release` (or withdraws the session's wait for it), then takes `lock` as
    /// [`Client::acquire`] does, in one call and one log write where the two calls take two:
    /// a handoff to the next lock, or to the same lock again (behind its waiters, with a new
    /// token). Returns the released grant's token (`None` if a wait was withdrawn) and the new
    /// grant.
    ///
    /// A refused release ([`AcquireError::SessionNotFound`], or [`AcquireError::Refused`] with
    /// [`palisade_core::CoreError::NotHolder`]) changes nothing, and the acquire is not tried.
    /// After a refusal of the acquire (an error of class [`crate::ErrorClass::NotAcquired`]:
    /// busy, the wait ended, a limit) the release took effect and `lock` is not held. After an
    /// error of unknown outcome ([`AcquireError::outcome_unknown`]) either may have happened:
    /// the same call with the same two ids ([`Client::release_then_acquire_with_ids`]) is
    /// answered with the first attempt's outcome. A server too old for it answers
    /// [`AcquireError::Rejected`] with [`tonic::Code::Unimplemented`], having released nothing.
    /// Retries of transient failures reuse both request ids, so they neither grant twice nor
    /// release the grant a first attempt took.
    pub async fn release_then_acquire(
        &self,
        credential: SessionCredential,
        release: &str,
        lock: &str,
        options: AcquireOptions,
    ) -> Result<(Option<Token>, Grant), AcquireError> {
        self.release_then_acquire_with_ids(
            credential,
            (release, request_id()),
            lock,
            options,
            request_id(),
        )
        .await
    }

    /// [`Client::release_then_acquire`] with the caller's request ids (the release's and the
    /// acquire's, which must differ): a retry after an unknown outcome, with the same ids and
    /// names, is answered with the first attempt's outcome.
    pub async fn release_then_acquire_with_ids(
        &self,
        credential: SessionCredential,
        (release, release_id): (&str, RequestId),
        lock: &str,
        options: AcquireOptions,
        request_id: RequestId,
    ) -> Result<(Option<Token>, Grant), AcquireError> {
        let session = credential.id();
        for name in [release, lock] {
            LockName::new(name)
                .map_err(|e| AcquireError::InvalidArgument(invalid_name(name, &e)))?;
        }
        let value = wire_value(options.value.as_deref())
            .map_err(|e| AcquireError::InvalidArgument(invalid_value(&e)))?;
        let response = self
            .send_acquire(options.wait, |mut raw, wait_ms| {
                let request = pb::ReleaseThenAcquireRequest {
                    acquire: Some(pb::AcquireRequest {
                        session: session.get(),
                        lock: lock.to_string(),
                        request_id: request_id.get(),
                        wait_ms,
                        wait_forever: options.wait == Wait::Forever,
                        session_secret: credential.secret().as_bytes().to_vec(),
                        value: value.clone(),
                        shared: options.mode == Mode::Shared,
                        permits: options.mode.permits().unwrap_or(0),
                    }),
                    release: release.to_string(),
                    release_request_id: release_id.get(),
                };
                async move { raw.release_then_acquire(request).await }
            })
            .await
            .map_err(|failure| AcquireError::from_failure(failure, session, lock))?;
        let Some(grant) = response.grant else {
            return Err(AcquireError::Protocol(format!(
                "a release of lock {release:?} then an acquire of {lock:?} answered no grant"
            )));
        };
        let grant = check_grant(grant, session, lock)?;
        Ok((response.released_token.map(Token::new), grant))
    }

    /// Takes every lock of `parts` for `session` at once, or none (a multi-lock): waits, as
    /// `wait` says, until all of them can be granted, then holds all of them, each with its own
    /// [`Grant`] (token and sequencer), in the order of `parts`. Nothing is held while it
    /// waits, so two multi-locks naming the same locks in any order cannot deadlock. Each lock
    /// is then released on its own ([`Client::release`]). 1 to
    /// [`palisade_core::MULTI_LOCKS_MAX`] locks, each named once, none held or waited for by
    /// the session already; a multi-lock's grants carry no value. Retries of transient
    /// failures reuse one request id, so they cannot grant twice.
    pub async fn acquire_all(
        &self,
        credential: SessionCredential,
        parts: &[LockPart],
        wait: Wait,
    ) -> Result<Vec<Grant>, AcquireError> {
        self.acquire_all_with_id(credential, parts, wait, request_id())
            .await
    }

    /// [`Client::acquire_all`] with the caller's request id: a retry after an unknown outcome,
    /// with the same id and parts, is answered with the first attempt's grants (or wait).
    pub async fn acquire_all_with_id(
        &self,
        credential: SessionCredential,
        parts: &[LockPart],
        wait: Wait,
        request_id: RequestId,
    ) -> Result<Vec<Grant>, AcquireError> {
        let session = credential.id();
        for part in parts {
            LockName::new(part.lock.as_str())
                .map_err(|e| AcquireError::InvalidArgument(invalid_name(&part.lock, &e)))?;
        }
        let wire_parts: Vec<pb::AcquirePart> = (parts.iter())
            .map(|part| pb::AcquirePart {
                lock: part.lock.clone(),
                shared: part.mode == Mode::Shared,
                permits: part.mode.permits().unwrap_or(0),
            })
            .collect();
        let names = (parts.iter().map(|part| part.lock.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        let response = self
            .send_acquire(wait, |mut raw, wait_ms| {
                let request = pb::AcquireAllRequest {
                    session: session.get(),
                    request_id: request_id.get(),
                    wait_ms,
                    wait_forever: wait == Wait::Forever,
                    session_secret: credential.secret().as_bytes().to_vec(),
                    parts: wire_parts.clone(),
                };
                async move { raw.acquire_all(request).await }
            })
            .await
            .map_err(|failure| AcquireError::from_failure(failure, session, &names))?;
        if response.session != session.get() || response.grants.len() != parts.len() {
            return Err(AcquireError::Protocol(format!(
                "asked for {} locks ({names}) in session {session}, granted {} in session {}",
                parts.len(),
                response.grants.len(),
                response.session
            )));
        }
        (response.grants.into_iter().zip(parts))
            .map(|(grant, part)| check_grant(grant, session, &part.lock))
            .collect()
    }

    /// Sends an acquire (of one lock or of several) until its outcome is known, each attempt
    /// built by `call` with the wait left, in ms; one request id throughout.
    async fn send_acquire<T, F, Fut>(&self, wait: Wait, mut call: F) -> Result<T, Failure>
    where
        F: FnMut(RawLocks, u64) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let wait_deadline = match wait {
            Wait::For(wait) => Some(Instant::now() + wait),
            Wait::Try | Wait::Forever => None,
        };
        let mut backoff = Backoff::new(self.options.retry_budget);
        retry_until_known(&mut backoff, || {
            let remaining = wait_deadline.map(|d| d.saturating_duration_since(Instant::now()));
            // A timed wait stays a wait when its time has run out (at least 1 ms): a retry
            // then joins the wait its first attempt queued, whose own deadline ends it,
            // instead of becoming a try-only acquire that leaves that wait behind.
            let wait_ms = remaining.map_or(0, |r| {
                u64::try_from(r.as_millis()).unwrap_or(u64::MAX).max(1)
            });
            // A wait forever has no deadline of its own: a dead connection is found by HTTP/2
            // keepalive, and a lost session by the session's keepalive.
            let timeout = match wait {
                Wait::Forever => None,
                Wait::Try => Some(self.options.request_timeout),
                Wait::For(_) => Some(remaining.unwrap_or_default() + self.options.request_timeout),
            };
            self.attempt(timeout, |raw| call(raw, wait_ms)).run()
        })
        .await
    }

    /// Gives up `lock` held by `session` (or withdraws its wait). Returns the token of the grant
    /// that ended, or `None` if a wait was withdrawn.
    pub async fn release(
        &self,
        credential: SessionCredential,
        lock: &str,
    ) -> Result<Option<Token>, ReleaseError> {
        self.release_with_id(credential, lock, request_id()).await
    }

    /// [`Client::release`] with the caller's request id: a retry after an unknown outcome,
    /// with the same id, is answered with the first attempt's outcome.
    pub async fn release_with_id(
        &self,
        credential: SessionCredential,
        lock: &str,
        request_id: RequestId,
    ) -> Result<Option<Token>, ReleaseError> {
        let session = credential.id();
        let name = LockName::new(lock)
            .map_err(|e| ReleaseError::InvalidArgument(invalid_name(lock, &e)))?;
        let request = pb::ReleaseRequest {
            session: session.get(),
            lock: name.into_string(),
            request_id: request_id.get(),
            session_secret: credential.secret().as_bytes().to_vec(),
        };
        let response = self
            .call_with_retries(|mut raw| {
                let request = request.clone();
                async move { raw.release(request).await }
            })
            .await
            .map_err(|f| ReleaseError::from_failure(f, session, lock))?;
        if response.token == Some(0) {
            return Err(ReleaseError::Protocol(format!(
                "release of lock {lock:?} reported token 0"
            )));
        }
        Ok(response.token.map(Token::new))
    }

    /// Replaces the value of `credential`'s grant `token` of `lock` (`None` removes it): what
    /// a leader proclaims. Refused with [`ProclaimError::NotHolder`] unless that grant is the
    /// lock's current holding. Setting a value twice is harmless, so failures of unknown outcome
    /// are retried like reads.
    pub async fn proclaim(
        &self,
        credential: SessionCredential,
        lock: &str,
        token: Token,
        value: Option<&str>,
    ) -> Result<(), ProclaimError> {
        let session = credential.id();
        let name = LockName::new(lock)
            .map_err(|e| ProclaimError::InvalidArgument(invalid_name(lock, &e)))?;
        let value =
            wire_value(value).map_err(|e| ProclaimError::InvalidArgument(invalid_value(&e)))?;
        let request = pb::ProclaimRequest {
            session: session.get(),
            lock: name.into_string(),
            token: token.get(),
            value,
            session_secret: credential.secret().as_bytes().to_vec(),
        };
        self.call_with_retries(|mut raw| {
            let request = request.clone();
            async move { raw.proclaim(request).await }
        })
        .await
        .map(|_| ())
        .map_err(|f| ProclaimError::from_failure(f, session, lock))
    }

    /// The state of one lock.
    pub async fn status(&self, lock: &str) -> Result<LockStatus, QueryError> {
        self.status_with(lock, Read::Linearizable).await
    }

    /// [`Client::status`], as current as `read` asks: [`Read::Stale`] lets any node answer
    /// from its own copy, without confirming with the leader.
    pub async fn status_with(&self, lock: &str, read: Read) -> Result<LockStatus, QueryError> {
        let name =
            LockName::new(lock).map_err(|e| QueryError::InvalidArgument(invalid_name(lock, &e)))?;
        let request = pb::StatusRequest {
            lock: name.into_string(),
            stale: read == Read::Stale,
        };
        let info = self
            .read_with_retries(|mut raw| {
                let request = request.clone();
                async move { raw.status(request).await }
            })
            .await?;
        let status = lock_status(info)?;
        if status.lock != lock {
            return Err(QueryError::Protocol(format!(
                "status of lock {lock:?} answered for lock {:?}",
                status.lock
            )));
        }
        Ok(status)
    }

    /// Every lock whose name starts with `prefix`, in name order (follows pagination).
    pub async fn list_locks(&self, prefix: &str) -> Result<Vec<LockStatus>, QueryError> {
        self.list_locks_with(prefix, Read::Linearizable).await
    }

    /// [`Client::list_locks`], as current as `read` asks.
    pub async fn list_locks_with(
        &self,
        prefix: &str,
        read: Read,
    ) -> Result<Vec<LockStatus>, QueryError> {
        let mut locks: Vec<LockStatus> = Vec::new();
        let mut start_after = String::new();
        for _ in 0..LIST_PAGES_MAX {
            let request = pb::ListLocksRequest {
                prefix: prefix.to_string(),
                start_after: start_after.clone(),
                limit: 0,
                stale: read == Read::Stale,
            };
            let page = self
                .read_with_retries(|mut raw| {
                    let request = request.clone();
                    async move { raw.list_locks(request).await }
                })
                .await?;
            for info in page.locks {
                let status = lock_status(info)?;
                let in_order = locks.last().is_none_or(|last| last.lock < status.lock)
                    && (start_after.is_empty() || start_after < status.lock);
                if !status.lock.starts_with(prefix) || !in_order {
                    return Err(QueryError::Protocol(format!(
                        "lock list for prefix {prefix:?} returned {:?} out of order or outside the prefix",
                        status.lock
                    )));
                }
                locks.push(status);
            }
            if page.next_start_after.is_empty() {
                return Ok(locks);
            }
            if page.next_start_after <= start_after {
                return Err(QueryError::Protocol(format!(
                    "lock list did not advance past {start_after:?}"
                )));
            }
            start_after = page.next_start_after;
        }
        Err(QueryError::Protocol(format!(
            "lock list for prefix {prefix:?} did not end after {LIST_PAGES_MAX} pages"
        )))
    }

    /// The public key that signs sequencers now: `ed25519:` and 64 hex digits. Resources
    /// should trust [`Client::public_keys`], which stays right across a key rotation.
    pub async fn public_key(&self) -> Result<String, QueryError> {
        Ok(self.public_keys_with_signing().await?.0.to_string())
    }

    /// Every key resources must trust now (as the answering member has them): the signing key,
    /// and during a rotation the key on its way in or out.
    pub async fn public_keys(&self) -> Result<KeySet, QueryError> {
        Ok(self.public_keys_with_signing().await?.1)
    }

    async fn public_keys_with_signing(&self) -> Result<(PublicKey, KeySet), QueryError> {
        let response = self
            .read_with_retries(
                |mut raw| async move { raw.public_key(pb::PublicKeyRequest {}).await },
            )
            .await?;
        let signing = PublicKey::parse(&response.public_key).map_err(|e| {
            QueryError::Protocol(format!("public key {:?}: {e}", response.public_key))
        })?;
        // A server from before key rotation sends only its one key.
        let published = if response.public_keys.is_empty() {
            KeySet::from(signing)
        } else {
            KeySet::parse(&response.public_keys.join(","))
                .map_err(|e| QueryError::Protocol(format!("published keys: {e}")))?
        };
        if published.get(signing.id()).is_none() {
            return Err(QueryError::Protocol(format!(
                "the signing key {signing} is not among the published keys {published}"
            )));
        }
        Ok((signing, published))
    }

    /// A call repeated after transient failures within the retry budget. The caller makes the
    /// call idempotent (a fixed request id, or an operation that is idempotent by nature).
    pub(crate) async fn call_with_retries<T, F, Fut>(&self, mut call: F) -> Result<T, Failure>
    where
        F: FnMut(RawLocks) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff = Backoff::new(self.options.retry_budget);
        let timeout = self.options.request_timeout;
        retry_until_known(&mut backoff, || {
            self.attempt(Some(timeout), &mut call).run()
        })
        .await
    }

    /// One attempt of a call at the current endpoint, bounded by `timeout` if given: `call`
    /// makes the request on that endpoint's channel. If it fails, the next attempt goes where
    /// [`Endpoints::after_failure`] says.
    pub(crate) fn attempt<T, Fut>(
        &self,
        timeout: Option<Duration>,
        call: impl FnOnce(RawLocks) -> Fut,
    ) -> Attempt<'_, Fut>
    where
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let used = self.endpoints.current();
        Attempt {
            endpoints: &self.endpoints,
            generation: used.generation,
            timeout,
            call: call(used.target.raw),
        }
    }

    pub(crate) async fn read_with_retries<T, F, Fut>(&self, call: F) -> Result<T, QueryError>
    where
        F: FnMut(RawLocks) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_with_retries(call)
            .await
            .map_err(QueryError::from_failure)
    }
}

/// A request made on the current endpoint's channel, not yet awaited ([`Client::attempt`]).
pub(crate) struct Attempt<'a, Fut> {
    endpoints: &'a Endpoints,
    generation: u64,
    timeout: Option<Duration>,
    call: Fut,
}

impl<T, Fut> Attempt<'_, Fut>
where
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    /// Awaits the answer; after a failure, moves the client on.
    pub(crate) async fn run(self) -> Result<T, Failure> {
        let result = bounded(self.timeout, self.call).await;
        if let Err(failure) = &result {
            self.endpoints.after_failure(self.generation, failure);
        }
        result
    }
}

/// One attempt of a call, bounded by `timeout` if given.
async fn bounded<T>(
    timeout: Option<Duration>,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, Failure> {
    let result = match timeout {
        Some(timeout) => match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => return Err(Failure::timed_out(timeout)),
        },
        None => call.await,
    };
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| Failure::from_status(&status))
}

/// One renewal of the session `credential` acts for, as `Renew` and each keepalive ping send it.
pub(crate) fn keep_alive_request(credential: &SessionCredential) -> pb::KeepAliveRequest {
    pb::KeepAliveRequest {
        session: credential.id().get(),
        session_secret: credential.secret().as_bytes().to_vec(),
    }
}

/// Checks an acquire response against the request and its own sequencer: the grant a caller
/// gets names the lock it asked for, in its session, with a token the sequencer carries too.
pub(crate) fn check_grant(
    response: pb::AcquireResponse,
    session: SessionId,
    lock: &str,
) -> Result<Grant, AcquireError> {
    let protocol = |what: String| Err(AcquireError::Protocol(what));
    if response.lock != lock || response.session != session.get() {
        return protocol(format!(
            "asked for lock {lock:?} in session {session}, granted lock {:?} in session {}",
            response.lock, response.session
        ));
    }
    if response.token == 0 {
        return protocol(format!("lock {lock:?} granted with token 0"));
    }
    let Some(access) = access_of(response.access) else {
        return protocol(format!(
            "grant of lock {lock:?} is both shared and a permit"
        ));
    };
    match palisade_sequencer::Sequencer::parse(&response.sequencer) {
        Ok(sequencer)
            if sequencer.lock() == lock
                && sequencer.token() == Token::new(response.token)
                && sequencer.session() == session
                && sequencer.access() == access => {}
        Ok(sequencer) => {
            return protocol(format!(
                "grant of lock {lock:?} with token {} in session {session} ({access}) came with a sequencer for lock {:?}, token {}, session {} ({})",
                response.token,
                sequencer.lock(),
                sequencer.token(),
                sequencer.session(),
                sequencer.access()
            ));
        }
        Err(error) => return protocol(format!("grant of lock {lock:?}: {error}")),
    }
    Ok(Grant {
        lock: response.lock,
        session: SessionId::new(response.session),
        token: Token::new(response.token),
        sequencer: response.sequencer,
        access,
    })
}

/// Converts a `LockInfo`, checking what must hold for any lock: a holder's token is at most the
/// last token granted, and never 0.
pub(crate) fn lock_status(info: pb::LockInfo) -> Result<LockStatus, QueryError> {
    if let Some(holder) = &info.holder
        && (holder.token == 0 || holder.token > info.last_token)
    {
        return Err(QueryError::Protocol(format!(
            "lock {:?} is held with token {} but its last token is {}",
            info.lock, holder.token, info.last_token
        )));
    }
    let holder = |h: pb::Holder| {
        let access = access_of(h.access).ok_or_else(|| {
            QueryError::Protocol(format!(
                "a holder of lock {:?} is both shared and a permit",
                info.lock
            ))
        })?;
        Ok(Holder {
            session: SessionId::new(h.session),
            token: Token::new(h.token),
            lease_remaining: Duration::from_millis(h.lease_remaining_ms),
            value: (!h.value.is_empty()).then_some(h.value),
            access,
        })
    };
    Ok(LockStatus {
        holder: info.holder.clone().map(holder).transpose()?,
        sharers: (info.sharers.clone().into_iter())
            .map(holder)
            .collect::<Result<_, _>>()?,
        permits: info.permits,
        lock: info.lock,
        last_token: Token::new(info.last_token),
        waiters: info.waiters.into_iter().map(SessionId::new).collect(),
        lock_delay_remaining: info.lock_delay_remaining_ms.map(Duration::from_millis),
    })
}

/// How a grant holds its lock, from the wire: `None` for an access both shared and a slot.
pub(crate) fn access_of(access: Option<pb::Access>) -> Option<Access> {
    match access {
        None => Some(Access::Exclusive),
        Some(pb::Access {
            shared: false,
            slot: None,
        }) => Some(Access::Exclusive),
        Some(pb::Access {
            shared: true,
            slot: None,
        }) => Some(Access::Shared),
        Some(pb::Access {
            shared: false,
            slot: Some(slot),
        }) => Some(Access::Slot(slot)),
        Some(pb::Access {
            shared: true,
            slot: Some(_),
        }) => None,
    }
}

/// The message for a refused lock name, quoting at most its first 64 characters: an oversized
/// name must not turn the error into a wall of text.
/// A grant's value as the wire spells it (empty for none), checked as the server will.
fn wire_value(value: Option<&str>) -> Result<String, palisade_core::limits::GrantValueError> {
    match value {
        None => Ok(String::new()),
        Some(value) => palisade_core::GrantValue::new(value).map(String::from),
    }
}

fn invalid_value(error: &palisade_core::limits::GrantValueError) -> String {
    format!("invalid value: {error}")
}

pub(crate) fn invalid_name(lock: &str, error: &palisade_core::limits::LockNameError) -> String {
    const QUOTED_CHARS_MAX: usize = 64;
    match lock.char_indices().nth(QUOTED_CHARS_MAX) {
        Some((cut, _)) => format!("invalid lock name {:?}…: {error}", &lock[..cut]),
        None => format!("invalid lock name {lock:?}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_decides_the_scheme_and_refuses_the_other_one_given_explicitly() {
        let url = |given: &str, tls: bool| {
            let parsed = parse_endpoints(given).unwrap();
            with_scheme(given, &parsed[0], tls)
        };
        assert_eq!(url("10.0.0.1:7457", true).unwrap(), "https://10.0.0.1:7457");
        assert_eq!(url("https://c:443", true).unwrap(), "https://c:443");
        assert_eq!(url("10.0.0.1:7457", false).unwrap(), "http://10.0.0.1:7457");
        let refused = url("http://10.0.0.1:7457", true).unwrap_err().to_string();
        assert!(refused.contains("asks for plaintext"), "{refused}");
        let refused = url("https://c:443", false).unwrap_err().to_string();
        assert!(refused.contains("--tls-ca"), "{refused}");
    }

    #[test]
    fn endpoints_without_a_scheme_get_http() {
        assert_eq!(
            normalize_endpoint("127.0.0.1:7457"),
            "http://127.0.0.1:7457"
        );
        assert_eq!(
            normalize_endpoint(" https://locks.internal:443 "),
            "https://locks.internal:443"
        );
    }

    #[tokio::test]
    async fn an_invalid_endpoint_is_refused_before_connecting() {
        let error = Client::connect("http://exa mple:1").await.unwrap_err();
        assert!(
            matches!(error, ConnectError::InvalidEndpoint { .. }),
            "{error}"
        );
        assert!(!error.is_retryable());
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_and_says_what_to_check() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let error = Client::connect(&format!("127.0.0.1:{port}"))
            .await
            .unwrap_err();
        assert!(matches!(error, ConnectError::Unreachable { .. }), "{error}");
        assert!(error.to_string().contains("palisade serve"), "{error}");
    }

    #[test]
    fn endpoint_lists_are_split_checked_and_given_a_scheme() {
        assert_eq!(
            parse_endpoints("10.0.0.1:7457, http://10.0.0.2:7457 ,https://c:443").unwrap(),
            [
                "http://10.0.0.1:7457",
                "http://10.0.0.2:7457",
                "https://c:443"
            ]
        );
        assert_eq!(
            parse_endpoints("127.0.0.1:7457").unwrap(),
            ["http://127.0.0.1:7457"]
        );
        let refused = |list: &str, says: &str| {
            let error = parse_endpoints(list).unwrap_err();
            assert!(
                matches!(error, ConnectError::InvalidEndpoint { .. }),
                "{list:?}: {error}"
            );
            assert!(error.to_string().contains(says), "{list:?}: {error}");
        };
        refused("", "no endpoint given");
        refused("a:1,,b:1", "entry 2 of 3 is empty");
        refused("a:1,", "entry 2 of 2 is empty");
        refused(" , a:1", "entry 1 of 2 is empty");
        refused("a:1,http://exa mple:1", "exa mple");
        let sixteen = vec!["a:1"; ENDPOINTS_MAX].join(",");
        assert_eq!(parse_endpoints(&sixteen).unwrap().len(), ENDPOINTS_MAX);
        refused(&format!("{sixteen},a:1"), "17 endpoints given, at most 16");
    }

    /// Endpoints over three configured addresses, the first current; nothing is connected.
    fn three() -> Endpoints {
        let options = ClientOptions::default();
        let configured: Vec<Target> = [
            "http://10.0.0.1:7457",
            "http://10.0.0.2:7457",
            "http://10.0.0.3:7457",
        ]
        .iter()
        .map(|url| lazy_target(url, &options, None).unwrap())
        .collect();
        Endpoints::new(configured, 0, options, None)
    }

    fn not_leader(leader: &str) -> Failure {
        Failure::NotLeader {
            leader: leader.to_string(),
            message: "not the leader".to_string(),
        }
    }

    #[tokio::test]
    async fn a_leader_hint_becomes_the_current_endpoint() {
        let endpoints = three();
        // A configured member named as the leader: its own channel is reused.
        endpoints.after_failure(0, &not_leader("http://10.0.0.3:7457"));
        let current = endpoints.current();
        assert_eq!(
            (
                current.target.url.as_str(),
                current.index,
                current.generation
            ),
            ("http://10.0.0.3:7457", 2, 1)
        );
        // A leader outside the list, without TLS (N14): not followed, since nothing proves
        // it a member; the next configured endpoint instead.
        endpoints.after_failure(1, &not_leader("http://10.0.0.9:7457"));
        let current = endpoints.current();
        assert_eq!(current.target.url, "http://10.0.0.1:7457");
        assert_eq!(current.generation, 2);
    }

    #[tokio::test]
    async fn failures_without_a_hint_rotate_through_the_list_and_refusals_stay() {
        let endpoints = three();
        let urls = |e: &Endpoints| e.current().target.url;
        endpoints.after_failure(0, &Failure::NotApplied("election".into()));
        assert_eq!(urls(&endpoints), "http://10.0.0.2:7457");
        endpoints.after_failure(1, &Failure::Unknown("connection reset".into()));
        assert_eq!(urls(&endpoints), "http://10.0.0.3:7457");
        endpoints.after_failure(2, &Failure::NotApplied("connection refused".into()));
        assert_eq!(urls(&endpoints), "http://10.0.0.1:7457");
        // A failure seen by a call that used an endpoint no longer current moves nothing:
        // another call already moved on.
        endpoints.after_failure(1, &Failure::NotApplied("late".into()));
        endpoints.after_failure(0, &not_leader("http://10.0.0.2:7457"));
        assert_eq!(
            (urls(&endpoints), endpoints.current().generation),
            ("http://10.0.0.1:7457".to_string(), 3)
        );
        // An answer about the request itself: the member spoke for the cluster; stay.
        endpoints.after_failure(3, &Failure::InvalidArgument("bad name".into()));
        endpoints.after_failure(3, &Failure::SessionNotFound("gone".into()));
        assert_eq!(endpoints.current().generation, 3);
        // A member naming itself as the leader it is not: try the next one.
        endpoints.after_failure(3, &not_leader("http://10.0.0.1:7457"));
        assert_eq!(urls(&endpoints), "http://10.0.0.2:7457");
    }

    /// A member whose attempt failed is passed over at the next failovers, for a while, while
    /// another has not failed: a member lost for good, still in the list, does not cost a
    /// connection timeout at every failover. After the period it is tried again.
    #[tokio::test(start_paused = true)]
    async fn a_member_that_just_failed_is_passed_over_for_a_while() {
        let endpoints = three();
        let urls = |e: &Endpoints| e.current().target.url;
        // The first fails (a member lost for good); the second names the third as the leader.
        endpoints.after_failure(0, &Failure::Unknown("connect timed out".into()));
        assert_eq!(urls(&endpoints), "http://10.0.0.2:7457");
        endpoints.after_failure(1, &not_leader("http://10.0.0.3:7457"));
        assert_eq!(urls(&endpoints), "http://10.0.0.3:7457");
        // The leader fails: the next in order is the first, which failed a moment ago.
        tokio::time::advance(Duration::from_secs(2)).await;
        endpoints.after_failure(2, &Failure::NotApplied("election".into()));
        assert_eq!(urls(&endpoints), "http://10.0.0.2:7457");
        // All three have failed within the period: the one that failed longest ago.
        endpoints.after_failure(3, &Failure::NotApplied("no leader yet".into()));
        assert_eq!(urls(&endpoints), "http://10.0.0.1:7457");
        // Once the period is over, a failed member is next in order again.
        tokio::time::advance(FAILED_ENDPOINT_PASSED_OVER_FOR).await;
        endpoints.after_failure(4, &Failure::Unknown("connect timed out".into()));
        assert_eq!(urls(&endpoints), "http://10.0.0.2:7457");
    }

    /// The endpoints of a client given `url` alone.
    fn only(url: &str, options: ClientOptions) -> Endpoints {
        let only = lazy_target(url, &options, None).unwrap();
        Endpoints::new(vec![only], 0, options, None)
    }

    #[tokio::test]
    async fn one_endpoint_stays_unless_it_names_another_leader() {
        let endpoints = only("http://10.0.0.1:7457", ClientOptions::default());
        endpoints.after_failure(0, &Failure::NotApplied("down".into()));
        assert_eq!(endpoints.current().generation, 0);
        // Another leader, outside the list, without TLS: not followed (N14).
        endpoints.after_failure(0, &not_leader("http://10.0.0.2:7457"));
        assert_eq!(
            (
                endpoints.current().target.url,
                endpoints.current().generation
            ),
            ("http://10.0.0.1:7457".to_string(), 0)
        );
    }

    /// Client options with TLS, trusting a CA made for the test (nothing is connected).
    fn with_tls() -> ClientOptions {
        let dir = tempfile::tempdir().unwrap();
        let generated =
            palisade_tls::generate::init(dir.path(), &["10.0.0.1".to_string()], "client").unwrap();
        let tls = palisade_tls::ClientTls::from_files(
            &generated.ca_cert,
            None,
            None,
            palisade_tls::ALPN_H2,
        )
        .unwrap();
        ClientOptions {
            tls: Some(tls),
            ..ClientOptions::default()
        }
    }

    /// N14: with TLS, a leader outside the list is followed (as `https://`): the member that
    /// named it was authenticated, and the connection sends nothing before its server shows a
    /// certificate from the CA. A failure there goes back to the list.
    #[tokio::test]
    async fn with_tls_a_leader_outside_the_list_is_followed() {
        let options = with_tls();
        let endpoints = only("https://10.0.0.1:7457", options);
        endpoints.after_failure(0, &not_leader("http://10.0.0.2:7457"));
        assert_eq!(endpoints.current().target.url, "https://10.0.0.2:7457");
        endpoints.after_failure(1, &Failure::NotApplied("down".into()));
        assert_eq!(endpoints.current().target.url, "https://10.0.0.1:7457");
    }

    /// A leader followed outside the list (TLS) that fails does not count against the member
    /// that named it: that member answered, and is not passed over.
    #[tokio::test(start_paused = true)]
    async fn a_leader_outside_the_list_that_fails_does_not_mark_the_member_that_named_it() {
        let options = with_tls();
        let configured = [
            "https://10.0.0.1:7457",
            "https://10.0.0.2:7457",
            "https://10.0.0.3:7457",
        ]
        .iter()
        .map(|url| lazy_target(url, &options, None).unwrap())
        .collect();
        let endpoints = Endpoints::new(configured, 2, options, None);
        let urls = |e: &Endpoints| e.current().target.url;
        // The third fails; the first names a leader outside the list, which is followed.
        endpoints.after_failure(0, &Failure::Unknown("connect timed out".into()));
        assert_eq!(urls(&endpoints), "https://10.0.0.1:7457");
        tokio::time::advance(Duration::from_secs(1)).await;
        endpoints.after_failure(1, &not_leader("http://10.0.0.9:7457"));
        assert_eq!(urls(&endpoints), "https://10.0.0.9:7457");
        // That leader fails: on to the second, and the first is not marked failed.
        endpoints.after_failure(2, &Failure::Unknown("connect timed out".into()));
        assert_eq!(urls(&endpoints), "https://10.0.0.2:7457");
        // The second fails: the first has not failed, the third has, so the first.
        endpoints.after_failure(3, &Failure::NotApplied("no leader yet".into()));
        assert_eq!(urls(&endpoints), "https://10.0.0.1:7457");
    }

    #[tokio::test]
    async fn connect_skips_a_dead_endpoint_and_reports_all_when_none_answers() {
        let dead = || {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            format!("127.0.0.1:{port}")
        };
        let (a, b) = (dead(), dead());
        let error = Client::connect(&format!("{a},{b}")).await.unwrap_err();
        assert!(matches!(error, ConnectError::Unreachable { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains(&a) && message.contains(&b), "{message}");
        let error = Client::connect_many(&[] as &[&str], ClientOptions::default())
            .await
            .unwrap_err();
        assert!(
            matches!(error, ConnectError::InvalidEndpoint { .. }),
            "{error}"
        );
        let error = Client::connect_many(&["a:1,b:1"], ClientOptions::default())
            .await
            .unwrap_err();
        assert!(
            matches!(error, ConnectError::InvalidEndpoint { .. }),
            "{error}"
        );
    }

    fn signed(lock: &str, token: u64, session: u64) -> String {
        palisade_sequencer::SigningKey::generate()
            .sign(lock, Token::new(token), SessionId::new(session))
            .unwrap()
            .as_str()
            .to_string()
    }

    #[test]
    fn a_grant_whose_sequencer_disagrees_is_a_protocol_error() {
        let good = pb::AcquireResponse {
            lock: "a".into(),
            session: 3,
            token: 7,
            sequencer: signed("a", 7, 3),
            access: None,
        };
        let session = SessionId::new(3);
        assert_eq!(
            check_grant(good.clone(), session, "a").unwrap().token,
            Token::new(7)
        );
        let cases = [
            pb::AcquireResponse {
                sequencer: signed("b", 7, 3),
                ..good.clone()
            },
            pb::AcquireResponse {
                sequencer: signed("a", 8, 3),
                ..good.clone()
            },
            pb::AcquireResponse {
                sequencer: String::new(),
                ..good.clone()
            },
            pb::AcquireResponse {
                token: 0,
                ..good.clone()
            },
            pb::AcquireResponse {
                lock: "b".into(),
                ..good.clone()
            },
            pb::AcquireResponse {
                session: 4,
                ..good.clone()
            },
        ];
        for case in cases {
            let error = check_grant(case.clone(), session, "a").unwrap_err();
            assert!(matches!(error, AcquireError::Protocol(_)), "{case:?}");
            assert!(error.outcome_unknown());
        }
    }

    #[test]
    fn a_holder_token_above_the_last_token_is_a_protocol_error() {
        let info = pb::LockInfo {
            lock: "a".into(),
            holder: Some(pb::Holder {
                session: 1,
                token: 5,
                lease_remaining_ms: 900,
                value: String::new(),
                access: None,
            }),
            last_token: 4,
            waiters: vec![],
            lock_delay_remaining_ms: None,
            permits: None,
            sharers: Vec::new(),
        };
        assert!(matches!(lock_status(info), Err(QueryError::Protocol(_))));
    }
}
