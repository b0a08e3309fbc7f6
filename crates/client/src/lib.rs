//! Rust client for the Palisade lock service.
//!
//! Connect with [`Client::connect`], open a [`Session`] (its lease is kept alive in the
//! background), and [`Session::acquire`] a lock: the [`LockGuard`] carries the grant's fencing
//! [`token`](LockGuard::token) and the signed [`sequencer`](LockGuard::sequencer) to present to
//! the resources the lock protects, and [`LockGuard::lost`] resolves if the session is lost.
//!
//! ```no_run
//! use std::time::Duration;
//! use palisade_client::{AcquireOptions, Client, SessionOptions, Wait};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect("http://127.0.0.1:7457").await?;
//! let session = client.open_session(SessionOptions::with_ttl(Duration::from_secs(10))).await?;
//! let guard = session
//!     .acquire("jobs/nightly", AcquireOptions::wait(Wait::For(Duration::from_secs(30))))
//!     .await?;
//! let lost = guard.lost();
//! tokio::select! {
//!     reason = lost => eprintln!("lock lost: {reason}; stop writing"),
//!     () = async {
//!         // Write to the resource, presenting the sequencer so it can refuse stale holders.
//!         println!("token {} sequencer {}", guard.token(), guard.sequencer());
//!     } => {}
//! }
//! guard.release().await?;
//! session.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! **Leader election.** [`Election`] campaigns for a lock with a value (the candidate's address,
//! say), hands the leader a [`Leadership`] whose [`epoch`](Leadership::epoch) (its fencing
//! token) fences the leader's side effects, and lets anyone read or follow the leader
//! ([`Election::leader`], [`Election::observe`]).
//!
//! **Several locks at once.** [`Session::acquire_all`] takes every lock of a list of
//! [`LockPart`]s (a name, or a name and a [`Mode`]) together or not at all: nothing is held
//! while it waits, so two sessions naming the same locks in another order cannot deadlock. It
//! returns one [`LockGuard`] per lock, in the order named, each with its own token and
//! sequencer (checked against the grant, as for one lock) and each released on its own.
//!
//! **A cluster.** Give every member's address, comma-separated
//! (`Client::connect("10.0.0.1:7457,10.0.0.2:7457,10.0.0.3:7457")`) or as a slice
//! ([`Client::connect_many`]). Calls go to one member at a time; a member that is not the
//! leader answers `UNAVAILABLE` and names the leader, and the client sends the call there at
//! once. A member that cannot be reached, or an election without a leader yet, moves the client
//! to the next address after a short pause. Sessions' keepalives and watches follow the same
//! way, so a failover shorter than a session's lease does not lose the session.
//!
//! **Sessions belong to whoever opened them.** Opening a session returns a secret with its id
//! ([`SessionCredential`]); every call for the session presents it, and the service refuses a
//! call with the id alone. The ids `status`, `locks` and `watch` show are no credential.
//!
//! Scripts that pass a session credential between processes use the one-shot operations on [`Client`]
//! instead ([`Client::open_session_without_keepalive`], [`Client::acquire`], [`Client::renew`],
//! [`Client::release`]), plus the reads [`Client::status`], [`Client::list_locks`],
//! [`Client::watch`] and [`Client::public_key`].
//!
//! **Errors.** Each operation has its own `#[non_exhaustive]` error enum with `is_retryable()`.
//! A request whose outcome is unknown (a timeout, a connection that broke after sending) is
//! reported as `Unknown`, never as failed (invariant 8): retries of one call reuse one request
//! id, so the server returns the first outcome instead of acting twice, whichever member the
//! retry reaches.
//!
//! **API Boundary:** the library never panics on what the server sends; a malformed or
//! inconsistent answer (a grant whose sequencer names another lock, a token of 0, a page that
//! does not advance) is a `Protocol` error.

mod bearer;
mod client;
mod credential;
mod election;
mod error;
mod keepalive;
mod limits;
mod retry;
mod session;
mod watch;

pub use bearer::{AUTH_TOKEN_ENV, BEARER_TOKEN_BYTES_MAX, Bearer, BearerToken};
pub use client::{
    AcquireOptions, Client, ClientOptions, ENDPOINT_ENV, Grant, Holder, LockPart, LockStatus, Read,
    SessionLease, Wait, parse_endpoints,
};
pub use credential::{CredentialError, SESSION_SECRET_BYTES, SessionCredential, SessionSecret};
pub use election::{Election, Leader, LeaderChanges, Leadership};
pub use error::{
    AcquireError, CloseError, ConnectError, ErrorClass, ProclaimError, QueryError, ReleaseError,
    RenewError, SessionError, SessionLost,
};
pub use limits::ENDPOINTS_MAX;
pub use palisade_core::limits::GRANT_VALUE_BYTES_MAX;
pub use palisade_core::{
    Access, DurationMs, MULTI_LOCKS_MAX, Mode, PERMITS_MAX, RequestId, SessionId, Token,
};
pub use retry::{AttemptFailure, RetryPolicy, request_id, retry_until_known};
pub use session::{LockGuard, Session, SessionOptions};
pub use watch::{LockEvent, LockEventKind, LockEvents};
