//! [`Client`]: a connection to the lock service and the one-shot operations.
//!
//! Every operation here is one request (retried where safe) with no background task. They are
//! what shell scripts and tools need (`palisade acquire`, `renew`, `release`, `status`, …);
//! applications that hold locks for a while use [`Client::open_session`] instead, which keeps
//! the session alive.

use std::future::Future;
use std::time::Duration;

use palisade_core::error_chain::error_chain;
use palisade_core::limits::{LOCK_NAME_BYTES_MAX, validate_lock_name};
use palisade_core::{SessionId, Token};
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::{DEFAULT_ENDPOINT, MESSAGE_BYTES_MAX, v1 as pb};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::error::{
    AcquireError, CloseError, ConnectError, Failure, QueryError, ReleaseError, RenewError,
    SessionError,
};
use crate::retry::{Backoff, open_key, request_id, retry_until_known};
use crate::session::{AcquireOptions, Session, SessionOptions, Wait};
use crate::watch::LockEvents;

/// Environment variable naming the lock service's address.
pub const ENDPOINT_ENV: &str = "PALISADE_ENDPOINT";

/// Most pages [`Client::list_locks`] follows before deciding the server is misbehaving.
const LIST_PAGES_MAX: usize = 100_000;

/// How a [`Client`] talks to the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    /// Longest time to establish a connection.
    pub connect_timeout: Duration,
    /// Longest time one request may go unanswered (for an acquire: on top of its wait).
    pub request_timeout: Duration,
    /// Longest time spent retrying a request that failed for a transient reason.
    pub retry_budget: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            retry_budget: Duration::from_secs(10),
        }
    }
}

/// A connection to the lock service. Cheap to clone; clones share the connection, which is
/// re-established automatically after it breaks.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) raw: LocksClient<Channel>,
    pub(crate) options: ClientOptions,
    endpoint: String,
}

/// A session opened by [`Client::open_session_without_keepalive`]: it lives for `ttl` after
/// its last renewal, and nothing renews it unless the caller does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionLease {
    pub session: SessionId,
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
}

/// The state of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    pub lock: String,
    /// `None` when the lock is free.
    pub holder: Option<Holder>,
    /// The last token granted for this lock (0 if none since the lock was last forgotten).
    pub last_token: Token,
    /// Waiting sessions, first in line first.
    pub waiters: Vec<SessionId>,
    /// Time left in lock-delay after a holder's session expired.
    pub lock_delay_remaining: Option<Duration>,
}

/// The current holder of a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    pub session: SessionId,
    pub token: Token,
    /// Lease remaining on the holding session when the server answered.
    pub lease_remaining: Duration,
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

impl Client {
    /// Connects to the lock service at `endpoint` (e.g. `http://127.0.0.1:7457`; the scheme may
    /// be left out).
    pub async fn connect(endpoint: &str) -> Result<Client, ConnectError> {
        Client::connect_with(endpoint, ClientOptions::default()).await
    }

    /// Connects to the address in `PALISADE_ENDPOINT`, or the default loopback address.
    pub async fn from_env() -> Result<Client, ConnectError> {
        let endpoint = std::env::var(ENDPOINT_ENV).unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string());
        Client::connect(&endpoint).await
    }

    /// Connects with explicit timeouts and retry budget.
    pub async fn connect_with(
        endpoint: &str,
        options: ClientOptions,
    ) -> Result<Client, ConnectError> {
        let url = normalize_endpoint(endpoint);
        let invalid = |reason: String| ConnectError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason,
        };
        let uri: tonic::transport::Uri = url.parse().map_err(|e| invalid(format!("{e}")))?;
        if uri.host().is_none() {
            return Err(invalid("it names no host".to_string()));
        }
        let channel = Endpoint::from(uri)
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .connect()
            .await
            .map_err(|e| ConnectError::Unreachable {
                endpoint: url.clone(),
                reason: error_chain(&e),
            })?;
        let raw = LocksClient::new(channel)
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        Ok(Client {
            raw,
            options,
            endpoint: url,
        })
    }

    /// The address this client talks to, with its scheme.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Opens a session kept alive in the background until it is closed or dropped.
    pub async fn open_session(&self, options: SessionOptions) -> Result<Session, SessionError> {
        Session::open(self.clone(), options).await
    }

    /// Opens a session that nothing keeps alive: it expires `ttl` after it was opened or last
    /// renewed with [`Client::renew`]. For scripts that hand the session id around.
    pub async fn open_session_without_keepalive(
        &self,
        ttl: Duration,
    ) -> Result<SessionLease, SessionError> {
        self.open_session_raw(ttl).await.map(|(lease, _)| lease)
    }

    /// Opens a session; also returns when the first attempt was sent, the earliest instant the
    /// lease can have started.
    pub(crate) async fn open_session_raw(
        &self,
        ttl: Duration,
    ) -> Result<(SessionLease, Instant), SessionError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        // One key for every attempt: a retry after an unknown outcome gets the session the
        // first attempt may have opened, not a second one.
        let key = open_key().map_err(|reason| SessionError::NoRandomness { reason })?;
        let request = pb::OpenSessionRequest {
            request_id: 0,
            ttl_ms,
            open_key: key.as_bytes().to_vec(),
        };
        let first_sent_at = Instant::now();
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
        let lease = SessionLease {
            session: response.session,
            ttl: Duration::from_millis(response.ttl_ms),
        };
        Ok((lease, first_sent_at))
    }

    /// Renews a session's lease once; returns the lease remaining as the server applied it.
    pub async fn renew(&self, session: SessionId) -> Result<Duration, RenewError> {
        let response = self
            .call_with_retries(|mut raw| async move {
                raw.renew(pb::KeepAliveRequest { session }).await
            })
            .await
            .map_err(|f| RenewError::from_failure(f, session))?;
        if response.session != session {
            return Err(RenewError::Protocol(format!(
                "renewal of session {session} answered for session {}",
                response.session
            )));
        }
        Ok(Duration::from_millis(response.ttl_remaining_ms))
    }

    /// Ends a session: releases its locks and withdraws its waits.
    pub async fn close_session(&self, session: SessionId) -> Result<(), CloseError> {
        self.call_with_retries(|mut raw| async move {
            raw.close_session(pb::CloseSessionRequest { session }).await
        })
        .await
        .map(|_| ())
        .map_err(|f| CloseError::from_failure(f, session))
    }

    /// Takes `lock` for `session`, waiting as `options` says. Retries of transient failures
    /// reuse one request id, so they cannot grant twice.
    pub async fn acquire(
        &self,
        session: SessionId,
        lock: &str,
        options: AcquireOptions,
    ) -> Result<Grant, AcquireError> {
        validate_lock_name(lock, LOCK_NAME_BYTES_MAX)
            .map_err(|e| AcquireError::InvalidArgument(invalid_name(lock, &e)))?;
        let request_id = request_id();
        let started = Instant::now();
        let wait_deadline = match options.wait {
            Wait::For(wait) => Some(started + wait),
            Wait::Try | Wait::Forever => None,
        };
        let mut backoff = Backoff::new(self.options.retry_budget);
        let response = retry_until_known(&mut backoff, || {
            let remaining = wait_deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let request = pb::AcquireRequest {
                session,
                lock: lock.to_string(),
                request_id,
                wait_ms: remaining.map_or(0, |r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
                wait_forever: options.wait == Wait::Forever,
            };
            // A wait forever has no deadline of its own: a dead connection is found by HTTP/2
            // keepalive, and a lost session by the session's keepalive.
            let timeout = match options.wait {
                Wait::Forever => None,
                Wait::Try => Some(self.options.request_timeout),
                Wait::For(_) => Some(remaining.unwrap_or_default() + self.options.request_timeout),
            };
            let mut raw = self.raw.clone();
            bounded(timeout, async move { raw.acquire(request).await })
        })
        .await
        .map_err(|failure| AcquireError::from_failure(failure, session, lock))?;
        check_grant(response, session, lock)
    }

    /// Gives up `lock` held by `session` (or withdraws its wait). Returns the token of the grant
    /// that ended, or `None` if a wait was withdrawn.
    pub async fn release(
        &self,
        session: SessionId,
        lock: &str,
    ) -> Result<Option<Token>, ReleaseError> {
        validate_lock_name(lock, LOCK_NAME_BYTES_MAX)
            .map_err(|e| ReleaseError::InvalidArgument(invalid_name(lock, &e)))?;
        let request = pb::ReleaseRequest {
            session,
            lock: lock.to_string(),
            request_id: request_id(),
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
        Ok(response.token)
    }

    /// The state of one lock.
    pub async fn status(&self, lock: &str) -> Result<LockStatus, QueryError> {
        validate_lock_name(lock, LOCK_NAME_BYTES_MAX)
            .map_err(|e| QueryError::InvalidArgument(invalid_name(lock, &e)))?;
        let request = pb::StatusRequest {
            lock: lock.to_string(),
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
        let mut locks: Vec<LockStatus> = Vec::new();
        let mut start_after = String::new();
        for _ in 0..LIST_PAGES_MAX {
            let request = pb::ListLocksRequest {
                prefix: prefix.to_string(),
                start_after: start_after.clone(),
                limit: 0,
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

    /// Streams the holder changes of `lock`, starting with its current state.
    pub async fn watch(&self, lock: &str) -> Result<LockEvents, QueryError> {
        validate_lock_name(lock, LOCK_NAME_BYTES_MAX)
            .map_err(|e| QueryError::InvalidArgument(invalid_name(lock, &e)))?;
        let request = pb::WatchRequest {
            lock: lock.to_string(),
        };
        let stream = self
            .read_with_retries(|mut raw| {
                let request = request.clone();
                async move { raw.watch(request).await }
            })
            .await?;
        Ok(LockEvents::new(lock.to_string(), stream))
    }

    /// The public key resources use to verify sequencers: `ed25519:` and 64 hex digits.
    pub async fn public_key(&self) -> Result<String, QueryError> {
        let response = self
            .read_with_retries(
                |mut raw| async move { raw.public_key(pb::PublicKeyRequest {}).await },
            )
            .await?;
        let key = response.public_key;
        let hex = key.strip_prefix("ed25519:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(QueryError::Protocol(format!(
                "public key {key:?} is not \"ed25519:\" and 64 hex digits"
            )));
        }
        Ok(key)
    }

    /// A call repeated after transient failures within the retry budget. The caller makes the
    /// call idempotent (a fixed request id, or an operation that is idempotent by nature).
    pub(crate) async fn call_with_retries<T, F, Fut>(&self, mut call: F) -> Result<T, Failure>
    where
        F: FnMut(LocksClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff = Backoff::new(self.options.retry_budget);
        let timeout = self.options.request_timeout;
        retry_until_known(&mut backoff, || {
            bounded(Some(timeout), call(self.raw.clone()))
        })
        .await
    }

    async fn read_with_retries<T, F, Fut>(&self, call: F) -> Result<T, QueryError>
    where
        F: FnMut(LocksClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_with_retries(call)
            .await
            .map_err(QueryError::from_failure)
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

/// Checks an acquire response against the request and its own sequencer: the grant a caller
/// gets names the lock it asked for, in its session, with a token the sequencer carries too.
pub(crate) fn check_grant(
    response: pb::AcquireResponse,
    session: SessionId,
    lock: &str,
) -> Result<Grant, AcquireError> {
    let protocol = |what: String| Err(AcquireError::Protocol(what));
    if response.lock != lock || response.session != session {
        return protocol(format!(
            "asked for lock {lock:?} in session {session}, granted lock {:?} in session {}",
            response.lock, response.session
        ));
    }
    if response.token == 0 {
        return protocol(format!("lock {lock:?} granted with token 0"));
    }
    match palisade_sequencer::Sequencer::parse(&response.sequencer) {
        Ok(sequencer)
            if sequencer.lock() == lock
                && sequencer.token() == response.token
                && sequencer.session() == session => {}
        Ok(sequencer) => {
            return protocol(format!(
                "grant of lock {lock:?} with token {} in session {session} came with a sequencer for lock {:?}, token {}, session {}",
                response.token,
                sequencer.lock(),
                sequencer.token(),
                sequencer.session()
            ));
        }
        Err(error) => return protocol(format!("grant of lock {lock:?}: {error}")),
    }
    Ok(Grant {
        lock: response.lock,
        session: response.session,
        token: response.token,
        sequencer: response.sequencer,
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
    Ok(LockStatus {
        holder: info.holder.map(|h| Holder {
            session: h.session,
            token: h.token,
            lease_remaining: Duration::from_millis(h.lease_remaining_ms),
        }),
        lock: info.lock,
        last_token: info.last_token,
        waiters: info.waiters,
        lock_delay_remaining: info.lock_delay_remaining_ms.map(Duration::from_millis),
    })
}

/// The message for a refused lock name, quoting at most its first 64 characters: an oversized
/// name must not turn the error into a wall of text.
fn invalid_name(lock: &str, error: &palisade_core::limits::LockNameError) -> String {
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

    fn signed(lock: &str, token: u64, session: u64) -> String {
        palisade_sequencer::SigningKey::generate()
            .sign(lock, token, session)
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
        };
        assert_eq!(check_grant(good.clone(), 3, "a").unwrap().token, 7);
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
            let error = check_grant(case.clone(), 3, "a").unwrap_err();
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
            }),
            last_token: 4,
            waiters: vec![],
            lock_delay_remaining_ms: None,
        };
        assert!(matches!(lock_status(info), Err(QueryError::Protocol(_))));
    }
}
