//! The vocabulary of the lock table: commands in, replies, errors and events out.
//!
//! Every type here is plain data with serde, because commands are what the Raft log replicates
//! and the whole table is what a snapshot stores. Applying the same commands to the same state
//! always gives the same replies and events.

use serde::{Deserialize, Serialize};

use crate::limits::{GrantValueError, LockNameError, OpenKeyError};
use crate::{Access, AcquirePart, GrantedPart, Mode};

pub use crate::ids::{RequestId, SessionId, Token};
pub use crate::time::{DurationMs, TimeMs};

/// A client's random key for opening one session: a retried open with the same key, while the
/// session it opened lives, returns that session instead of opening another.
///
/// Unlike a [`RequestId`], which only has to differ from the other ids of one session, an open
/// key is compared with the keys of every client, so it must be impossible to pick twice by
/// accident and infeasible to guess. The type holds only keys that pass
/// [`crate::limits::validate_open_key`], including those read back from the log or a snapshot.
/// `Debug` shows the length only: while its session lives, the key is what a retry presents.
///
/// Serialised as lowercase hex (a string, so it can key a JSON map in a snapshot).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OpenKey(Vec<u8>);

impl OpenKey {
    /// A key from a client's bytes, refused unless it could be random.
    pub fn new(bytes: &[u8]) -> Result<OpenKey, OpenKeyError> {
        crate::limits::validate_open_key(bytes)?;
        Ok(OpenKey(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl TryFrom<String> for OpenKey {
    type Error = OpenKeyError;

    fn try_from(hex: String) -> Result<OpenKey, OpenKeyError> {
        let bytes = from_lowercase_hex(&hex).ok_or(OpenKeyError::NotHex)?;
        OpenKey::new(&bytes)
    }
}

impl From<OpenKey> for String {
    fn from(key: OpenKey) -> String {
        to_lowercase_hex(&key.0)
    }
}

/// Bytes as lowercase hex, two digits each.
fn to_lowercase_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lowercase hex back to bytes; `None` for anything else (odd length, another character).
fn from_lowercase_hex(hex: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).filter(|_| !c.is_ascii_uppercase());
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

/// A lock's name, checked once where it comes in (a call, a client, a sequencer, a binding).
///
/// The type holds only names of 1 to [`crate::limits::LOCK_NAME_BYTES_MAX`] bytes of UTF-8
/// with no control character, including those read back from a log or a snapshot. That
/// ceiling is the only limit it knows: a table configured with a lower
/// [`Limits::lock_name_bytes_max`](crate::Limits) refuses longer names itself
/// ([`LockName::with_limit`]), and the service checks that limit before it proposes a command.
/// Serialised as its string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LockName(String);

impl LockName {
    /// `name`, refused unless it is a lock name within the ceiling.
    pub fn new(name: impl Into<String>) -> Result<LockName, LockNameError> {
        LockName::with_limit(name, crate::limits::LOCK_NAME_BYTES_MAX as u32)
    }

    /// `name`, refused unless it is a lock name of at most `bytes_max` bytes: a table's
    /// configured limit, which the ceiling caps.
    pub fn with_limit(name: impl Into<String>, bytes_max: u32) -> Result<LockName, LockNameError> {
        let name = name.into();
        let bytes_max = (bytes_max as usize).min(crate::limits::LOCK_NAME_BYTES_MAX);
        crate::limits::validate_lock_name(&name, bytes_max)?;
        Ok(LockName(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl TryFrom<String> for LockName {
    type Error = LockNameError;

    fn try_from(name: String) -> Result<LockName, LockNameError> {
        LockName::new(name)
    }
}

impl From<LockName> for String {
    fn from(name: LockName) -> String {
        name.0
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for LockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a holder tells everyone about its grant: for a leader election, the leader's address.
///
/// Shown beside the holder by every read of the lock (status, listings, watches), set by the
/// acquire that is granted and replaced by the holder alone ([`Command::SetValue`]). The type
/// holds only values that pass [`crate::limits::validate_grant_value`] (1 to
/// [`crate::limits::GRANT_VALUE_BYTES_MAX`] bytes, no control character), including those read
/// back from the log or a snapshot. Serialised as its string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GrantValue(String);

impl GrantValue {
    pub fn new(value: impl Into<String>) -> Result<GrantValue, GrantValueError> {
        let value = value.into();
        crate::limits::validate_grant_value(&value)?;
        Ok(GrantValue(value))
    }

    /// The wire's form, where an empty string means no value: `None` for `""`.
    pub fn from_wire(value: &str) -> Result<Option<GrantValue>, GrantValueError> {
        match value {
            "" => Ok(None),
            value => GrantValue::new(value).map(Some),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for GrantValue {
    type Error = GrantValueError;

    fn try_from(value: String) -> Result<GrantValue, GrantValueError> {
        GrantValue::new(value)
    }
}

impl From<GrantValue> for String {
    fn from(value: GrantValue) -> String {
        value.0
    }
}

impl std::fmt::Display for GrantValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The SHA-256 digest of a session's secret: all the lock table keeps of it.
///
/// The secret is what a client presents to act for its session (renew, acquire, release,
/// close). The leader draws it, and only its digest enters the log, the table and the
/// snapshots; the server checks a presented secret against it before proposing anything for
/// the session. The table itself never checks it (it does no hashing and sees no secrets), it
/// only keeps the digest with the session, so that every member, and every later leader, can.
///
/// Serialised as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SecretDigest([u8; SecretDigest::BYTES]);

impl SecretDigest {
    /// The length of a digest: SHA-256's.
    pub const BYTES: usize = 32;

    pub fn new(bytes: [u8; SecretDigest::BYTES]) -> SecretDigest {
        SecretDigest(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; SecretDigest::BYTES] {
        &self.0
    }
}

impl TryFrom<String> for SecretDigest {
    type Error = String;

    fn try_from(hex: String) -> Result<SecretDigest, String> {
        from_lowercase_hex(&hex)
            .and_then(|bytes| <[u8; SecretDigest::BYTES]>::try_from(bytes).ok())
            .map(SecretDigest)
            .ok_or_else(|| {
                format!(
                    "a secret digest is {} lowercase hex digits",
                    2 * SecretDigest::BYTES
                )
            })
    }
}

impl From<SecretDigest> for String {
    fn from(digest: SecretDigest) -> String {
        to_lowercase_hex(&digest.0)
    }
}

impl std::fmt::Debug for SecretDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretDigest({}…)", to_lowercase_hex(&self.0[..4]))
    }
}

impl std::fmt::Debug for OpenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpenKey({} bytes)", self.0.len())
    }
}

/// Who a client is, as the server authenticated it (from a bearer token, or later a client
/// certificate): the name a policy grants rights to and the owner a session is recorded with.
///
/// The type holds only names that pass [`crate::limits::validate_identity`] (1 to
/// [`crate::limits::IDENTITY_BYTES_MAX`] bytes of ASCII letters, digits and `.`, `_`, `-`, `@`,
/// `:`), including those read back from the log or a snapshot. Serialised as the bare string.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Identity(String);

impl Identity {
    /// An identity named `name`, refused unless it is a valid identity name.
    pub fn new(name: &str) -> Result<Identity, String> {
        crate::limits::validate_identity(name)?;
        Ok(Identity(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Identity {
    type Error = String;

    fn try_from(name: String) -> Result<Identity, String> {
        crate::limits::validate_identity(&name)?;
        Ok(Identity(name))
    }
}

impl From<Identity> for String {
    fn from(identity: Identity) -> String {
        identity.0
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({:?})", self.0)
    }
}

/// What a policy grants an identity on a lock-name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Right {
    /// Open sessions and take, wait for and release locks.
    Lock,
    /// Read a lock's state: `Status`, `ListLocks`, `Watch`.
    Read,
    /// The cluster's administration: membership, keys, backups. Granted on every lock (`*`).
    Admin,
}

impl Right {
    /// Every right, in the order policies list them.
    pub const ALL: [Right; 3] = [Right::Lock, Right::Read, Right::Admin];

    /// The right's name, as policy files and error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            Right::Lock => "lock",
            Right::Read => "read",
            Right::Admin => "admin",
        }
    }

    /// The right named `name`, if any.
    pub fn from_name(name: &str) -> Option<Right> {
        Right::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One of the per-identity quotas: how much of the service's shared capacity one identity may
/// take, so that one client cannot take the global caps from everyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Quota {
    /// Sessions open at once.
    Sessions,
    /// Locks held, and waits that could become holds, at once.
    Locks,
    /// Acquires waiting in queues at once.
    Waiters,
    /// Watches open at once (on the member serving them).
    Watches,
}

impl Quota {
    pub const ALL: [Quota; 4] = [
        Quota::Sessions,
        Quota::Locks,
        Quota::Waiters,
        Quota::Watches,
    ];

    /// The quota's name, as policy files and error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            Quota::Sessions => "sessions",
            Quota::Locks => "locks",
            Quota::Waiters => "waiters",
            Quota::Watches => "watches",
        }
    }

    pub fn from_name(name: &str) -> Option<Quota> {
        Quota::ALL.into_iter().find(|q| q.name() == name)
    }
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a caller could not be authenticated. Found by the server, never by the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CredentialError {
    /// No `authorization: Bearer <token>` header, and no other credential.
    #[error(
        "this service requires a credential: send `authorization: Bearer <token>` (palisade --token-file FILE or $PALISADE_AUTH_TOKEN)"
    )]
    Missing,
    /// An `authorization` header that is not `Bearer <token>` with a token of printable ASCII
    /// within the length limit.
    #[error(
        "the authorization header is not `Bearer <token>` with a token of 1 to 256 printable ASCII characters"
    )]
    Malformed,
    /// A well-formed token that no entry of the service's token file has.
    #[error(
        "the bearer token is not one this service knows (revoked, mistyped, or for another service)"
    )]
    Unknown,
    /// A verified client certificate whose name (common name, else first DNS name) is not a
    /// valid identity name.
    #[error(
        "the client certificate's name is not a valid identity (1 to 64 ASCII letters, digits and . _ - @ :)"
    )]
    CertificateName,
    /// A client certificate and a bearer token that name different identities.
    #[error("the client certificate and the bearer token name different identities")]
    Conflict,
    /// A call that administers the cluster (a backup, a membership or key change, the token
    /// floor), on a server without a policy, without the cluster's admin token.
    #[error(
        "without a policy, administering the cluster takes the admin token each member keeps in admin.token in its data directory: \
         pass --token-file DATA_DIR/admin.token (or PALISADE_AUTH_TOKEN_FILE) on a member's host"
    )]
    AdminTokenNeeded,
}

impl CredentialError {
    /// The reason's stable name (the wire's `reason`).
    pub fn code(self) -> &'static str {
        match self {
            CredentialError::Missing => "credential_missing",
            CredentialError::Malformed => "credential_malformed",
            CredentialError::Unknown => "credential_unknown",
            CredentialError::CertificateName => "credential_certificate_name",
            CredentialError::Conflict => "credential_conflict",
            CredentialError::AdminTokenNeeded => "admin_token_needed",
        }
    }
}

/// One command together with the time at which it takes effect.
///
/// The time is the leader's monotonic clock mapped onto the table's timeline; the table never
/// moves its clock backwards (an older `now_ms` is treated as the table's current time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    pub now_ms: TimeMs,
    pub command: Command,
}

impl std::fmt::Display for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {} ms: {:?}", self.now_ms, self.command)
    }
}

/// How long an acquire may wait in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wait {
    /// Grant now or fail with [`CoreError::Busy`].
    Try,
    /// Queue for at most this long.
    ForMs(DurationMs),
    /// Queue until granted or the session ends.
    Forever,
}

/// A change to the lock table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Open a session whose lease lasts `ttl_ms` after each keepalive.
    ///
    /// With an `open_key`, an open retried with the same key while the session it opened lives
    /// returns that session (whatever its `ttl_ms`); once that session has ended the key opens a
    /// new one, never the old. Without a key every open opens a new session.
    ///
    /// Serialised under a name of its own, so that a log entry of an older version (which
    /// deduplicated opens by request id across every client) is never read as this command,
    /// and an older version refuses an entry of this one instead of misreading it.
    ///
    /// `secret_digest` is the digest of the secret the leader handed the opener; the session
    /// keeps it. An entry written before session secrets has none, and its session is acted for
    /// by its id alone, as it was then (see [`LockTable::session_secret_digest`]).
    ///
    /// A retried open (same key) returns the session as it was opened: its digest and owner are
    /// the first open's.
    ///
    /// The server proposes a keyed hash of the client's open key here, never the key (N12):
    /// the table only compares keys, so an entry of an earlier version, which holds the client's
    /// key itself, applies exactly as it did.
    ///
    /// [`LockTable::session_secret_digest`]: crate::LockTable::session_secret_digest
    #[serde(rename = "OpenSessionWithKey")]
    OpenSession {
        open_key: Option<OpenKey>,
        ttl_ms: DurationMs,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret_digest: Option<SecretDigest>,
        /// The authenticated identity that opened the session, its owner: only that identity
        /// acts for the session (the server checks it before proposing, beside the secret).
        /// `None` for an open by an unauthenticated client (a service without tokens) and for
        /// entries written before identities, whose sessions are acted for with their secret
        /// alone, as then.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<Identity>,
    },
    /// The open of versions before open keys, as their log entries spell it: deduplicated by
    /// `request_id` across every client, so two clients sending the same id shared a session.
    ///
    /// Nothing proposes it any more. It exists so that a log written by such a version replays
    /// into exactly the sessions it produced then (same ids, same sharing); the server never
    /// builds it from a request.
    #[serde(rename = "OpenSession")]
    OpenSessionByRequestId {
        request_id: RequestId,
        ttl_ms: DurationMs,
    },
    /// Renew a session's lease for another full TTL.
    KeepAlive { session: SessionId },
    /// End a session: release its locks and withdraw its waits.
    CloseSession { session: SessionId },
    /// Take `lock` for `session`, or queue behind its holder. The grant carries `value`, if
    /// any (a retry, or an acquire of a lock the session holds or waits for already, keeps the
    /// value the first one brought).
    Acquire {
        session: SessionId,
        lock: String,
        request_id: RequestId,
        wait: Wait,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<GrantValue>,
        /// Exclusive (a mutex or a writer), shared (a reader) or a semaphore's permit. Absent
        /// from logs of earlier versions, whose acquires were all exclusive.
        #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
        mode: Mode,
    },
    /// Take every lock of `parts` for `session` in one step, each in its own mode, or queue for
    /// all of them at once: a multi-lock. Nothing is held until everything is granted, and then
    /// everything is granted in the same entry, each lock with its own token; so there are no
    /// partial holds and no lock-order deadlocks. 1 to [`MULTI_LOCKS_MAX`](crate::MULTI_LOCKS_MAX) distinct names, none
    /// of which the session holds or waits for already. Once granted, each lock is held (and
    /// released) on its own.
    AcquireAll {
        session: SessionId,
        parts: Vec<AcquirePart>,
        request_id: RequestId,
        wait: Wait,
    },
    /// Replace the value of `session`'s grant `token` of `lock` (`None` removes it): what a
    /// leader proclaims. Refused unless that grant is the lock's current holding. Setting the
    /// same value twice is harmless, so a retry needs no request id.
    SetValue {
        session: SessionId,
        lock: String,
        token: Token,
        value: Option<GrantValue>,
    },
    /// Give up `lock` (or withdraw the session's wait for it).
    Release {
        session: SessionId,
        lock: String,
        request_id: RequestId,
    },
    /// Give up `release` (or withdraw the wait for it), then take `lock` as [`Command::Acquire`]
    /// takes it, in this one entry: a handoff to the next lock, or to the same lock again
    /// (behind its waiters, with a new token), for one log write where two commands take two.
    ///
    /// The release is decided first. Refused (the session neither holds nor waits for
    /// `release`), nothing changes and the acquire is not tried. Otherwise the release stands
    /// whatever the acquire answers (granted, queued, busy, or refused), as if the two commands
    /// had been sent one after the other with nothing in between. Each half is remembered under
    /// its own request id, which must differ. A retry is recognised by the acquire's request id
    /// before anything is released: it answers both halves' first outcomes again, and never
    /// releases the grant its first attempt took.
    ReleaseThenAcquire {
        session: SessionId,
        release: String,
        release_request_id: RequestId,
        lock: String,
        request_id: RequestId,
        wait: Wait,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<GrantValue>,
        #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
        mode: Mode,
    },
    /// Let time pass: expire leases, end waits past their deadline, end lock-delays.
    Tick,
    /// Replace the limits the table enforces from this point of the log on. Limits decide
    /// outcomes, so they change only through the log: a replay then applies every command
    /// under the limits it was first applied with (invariant 1 depends on it).
    SetLimits { limits: crate::Limits },
    /// A leader took over: every session's lease restarts its full TTL from now (invariant 6:
    /// leases are extended by a change of leader or a restart, never shortened).
    LeaderStart,
    /// Raise the shared token counter to at least `floor` (never lowers it), and the session
    /// counter to at least `session_floor` if given. Proposed after a node cut a damaged tail
    /// off its log or recovered its counters (`palisade recover-counters`): the lost entries
    /// may have held grants whose tokens, and sessions whose ids, clients and resources already
    /// saw, and the floors lie above every one issued before. Also an operator's
    /// `palisade cluster raise-token-floor`. `session_floor` is absent from logs of older
    /// versions, and stored only when present, so their entries read and write as before.
    RaiseTokenFloor {
        floor: Token,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_floor: Option<SessionId>,
    },
}

/// What a successful command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    SessionOpened {
        session: SessionId,
        ttl_ms: DurationMs,
        expires_at_ms: TimeMs,
    },
    KeptAlive {
        session: SessionId,
        expires_at_ms: TimeMs,
    },
    SessionClosed {
        session: SessionId,
    },
    /// The session holds the lock with this token.
    Granted {
        lock: String,
        session: SessionId,
        token: Token,
    },
    /// The session waits in the lock's queue; `position` 0 is next in line.
    Queued {
        lock: String,
        session: SessionId,
        position: u32,
    },
    /// The session no longer holds the lock (`token`) or no longer waits for it (`token` None).
    Released {
        lock: String,
        session: SessionId,
        token: Option<Token>,
    },
    /// The grant's value after [`Command::SetValue`].
    ValueSet {
        lock: String,
        session: SessionId,
        token: Token,
    },
    Ticked,
    LimitsSet,
    LeaderStarted {
        sessions_extended: u32,
    },
    /// The shared counter after [`Command::RaiseTokenFloor`]: the next grant's token is above it.
    TokenFloorRaised {
        last_token: Token,
    },
    /// The session holds the lock with this token, in this access, which is not exclusive (a
    /// reader of a shared phase, or a semaphore's permit). An exclusive grant is
    /// [`Reply::Granted`], as the logs and snapshots of earlier versions spell it: a snapshot
    /// stores replies by position, so a new field in `Granted` would misread them.
    GrantedAs {
        lock: String,
        session: SessionId,
        token: Token,
        access: Access,
    },
    /// Every lock of a [`Command::AcquireAll`] is held, each with its own grant, in the order
    /// the command named them.
    GrantedAll {
        session: SessionId,
        grants: Vec<GrantedPart>,
    },
    /// The session waits for every lock of a [`Command::AcquireAll`]; it will be granted all of
    /// them in one step, or none.
    QueuedAll {
        session: SessionId,
    },
    /// A [`Command::ReleaseThenAcquire`]: the release's token (`None` if it withdrew a wait),
    /// and what the acquire answered ([`Reply::Granted`], [`Reply::GrantedAs`] or
    /// [`Reply::Queued`]). An acquire refused after the release is the command's error.
    ReleasedThenAcquired {
        released: Option<Token>,
        acquired: Box<Reply>,
    },
}

impl Reply {
    /// The reply to a grant of `lock` to `session` with `token` in `access`.
    pub fn granted(lock: String, session: SessionId, token: Token, access: Access) -> Reply {
        match access {
            Access::Exclusive => Reply::Granted {
                lock,
                session,
                token,
            },
            access => Reply::GrantedAs {
                lock,
                session,
                token,
                access,
            },
        }
    }

    /// The grant this reply reports, whichever variant spells it: lock, session, token, access.
    pub fn grant(&self) -> Option<(&str, SessionId, Token, Access)> {
        match self {
            Reply::Granted {
                lock,
                session,
                token,
            } => Some((lock, *session, *token, Access::Exclusive)),
            Reply::GrantedAs {
                lock,
                session,
                token,
                access,
            } => Some((lock, *session, *token, *access)),
            _ => None,
        }
    }
}

/// Why a command was refused. Nothing in the table changed, except by the release of a
/// [`Command::ReleaseThenAcquire`] whose acquire was refused (see there).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CoreError {
    #[error("session {session} does not exist (it expired or was closed); open a new session")]
    SessionNotFound { session: SessionId },
    #[error("ttl {ttl_ms} ms is outside the allowed range {ttl_ms_min}..={ttl_ms_max} ms")]
    TtlOutOfRange {
        ttl_ms: DurationMs,
        ttl_ms_min: DurationMs,
        ttl_ms_max: DurationMs,
    },
    #[error("wait {wait_ms} ms is above the limit of {wait_ms_max} ms")]
    WaitOutOfRange {
        wait_ms: DurationMs,
        wait_ms_max: DurationMs,
    },
    #[error("invalid lock name: {0}")]
    InvalidLockName(LockNameError),
    #[error("invalid open key: {0}")]
    InvalidOpenKey(OpenKeyError),
    #[error("invalid value: {0}")]
    InvalidValue(GrantValueError),
    #[error("too many sessions: the limit is {sessions_max}; close unused sessions")]
    TooManySessions { sessions_max: u32 },
    #[error("too many locks: the limit is {locks_max}")]
    TooManyLocks { locks_max: u32 },
    #[error("lock {lock:?} already has {waiters_max} waiters, the limit")]
    TooManyWaiters { lock: String, waiters_max: u32 },
    #[error("lock {lock:?} is busy{}", describe_busy(*holder_session, *holder_token, *available_at_ms))]
    Busy {
        lock: String,
        holder_session: Option<SessionId>,
        holder_token: Option<Token>,
        /// Set while the lock sits out its lock-delay after a holder's session expired.
        available_at_ms: Option<TimeMs>,
    },
    #[error("session {session} does not hold lock {lock:?}{}", describe_holder(*holder_session))]
    NotHolder {
        lock: String,
        session: SessionId,
        holder_session: Option<SessionId>,
    },
    #[error("lock {lock:?} cannot be granted: its fencing tokens are exhausted")]
    TokensExhausted { lock: String },
    #[error(
        "the wait for lock {lock:?} ended before it was granted (deadline passed or withdrawn)"
    )]
    WaitEnded { lock: String },
    #[error("invalid limits: {message}")]
    InvalidLimits { message: String },
    #[error("request id {request_id} was already used for a different command in this session")]
    RequestIdConflict { request_id: RequestId },
    /// A call for a session came without the session's secret. Found by the server before it
    /// proposes anything, never by the table (which sees no secrets).
    #[error(
        "session {session} needs its secret: present the secret the session was opened with (a session id alone is no credential)"
    )]
    SessionSecretMissing { session: SessionId },
    /// A call for a session came with a secret that is not the session's.
    #[error(
        "the secret presented for session {session} is not the session's: only whoever opened the session may act for it"
    )]
    SessionSecretWrong { session: SessionId },
    /// The caller could not be authenticated, on a service that requires it. Found by the
    /// server before anything else, never by the table.
    #[error("not authenticated: {reason}")]
    Unauthenticated { reason: CredentialError },
    /// The policy grants the caller's identity no `right` on `scope`: a lock name, the prefix a
    /// listing asked for, or `*` (every lock) for the admin right.
    #[error(
        "identity {identity:?} has no {right} right on {scope:?}: the policy grants {identity:?} {right} on no prefix covering it"
    )]
    PermissionDenied {
        identity: String,
        right: Right,
        scope: String,
    },
    /// A call for a session, with its secret, from an identity other than the one that opened
    /// it.
    #[error(
        "session {session} belongs to another identity: only the identity that opened a session acts for it"
    )]
    SessionNotOwned { session: SessionId },
    /// The caller's identity is at its quota.
    #[error(
        "identity {identity:?} is at its quota of {quota_max} {quota}: end some, or ask for a larger quota in the policy"
    )]
    QuotaReached {
        identity: String,
        quota: Quota,
        quota_max: u32,
    },
    // New variants go last: a snapshot stores remembered refusals by variant position.
    /// A semaphore's size out of `1..=PERMITS_MAX`.
    #[error("a semaphore has 1 to {permits_max} permits, not {permits}")]
    PermitsOutOfRange { permits: u32, permits_max: u32 },
    /// The name is in use as the other kind (a lock or a semaphore), or as a semaphore of
    /// another size. `0` stands for "a lock, not a semaphore", in either field.
    #[error("{}", describe_permits_mismatch(lock, *permits, *requested))]
    PermitsMismatch {
        lock: String,
        permits: u32,
        requested: u32,
    },
    /// The session holds or waits for the lock in the other mode (shared or exclusive): no
    /// upgrade and no downgrade, since two readers upgrading at once would wait for each other
    /// forever, and a downgrade would let a writer in while the old reader still reads.
    #[error(
        "session {session} already {} lock {lock:?} {}; release it before asking for it {}",
        "holds or waits for",
        if *held_shared { "shared" } else { "exclusive" },
        if *held_shared { "exclusive" } else { "shared" }
    )]
    ModeConflict {
        lock: String,
        session: SessionId,
        /// The session's hold or wait is shared (so the refused acquire asked for exclusive).
        held_shared: bool,
    },
    /// A multi-lock named no lock, or more than [`MULTI_LOCKS_MAX`](crate::MULTI_LOCKS_MAX).
    #[error("a multi-lock takes 1 to {locks_max} locks, not {locks}")]
    MultiLockSize { locks: u32, locks_max: u32 },
    /// A multi-lock named the same lock twice.
    #[error("a multi-lock names {lock:?} twice; name each lock once")]
    MultiLockRepeated { lock: String },
    /// A multi-lock named a lock the session already holds or waits for.
    #[error(
        "session {session} already holds or waits for lock {lock:?}; a multi-lock takes only locks the session neither holds nor waits for"
    )]
    MultiLockHeld { lock: String, session: SessionId },
}

fn describe_permits_mismatch(lock: &str, permits: u32, requested: u32) -> String {
    match (permits, requested) {
        (0, _) => format!(
            "{lock:?} is in use as a lock, not a semaphore; acquire it without permits, or use another name"
        ),
        (permits, 0) => format!(
            "{lock:?} is in use as a semaphore of {permits} permits; acquire a permit of {permits}, or use another name"
        ),
        (permits, requested) => format!(
            "{lock:?} is a semaphore of {permits} permits, not {requested}: its size is fixed by the first acquire while the name is in use"
        ),
    }
}

fn describe_busy(
    session: Option<SessionId>,
    token: Option<Token>,
    until: Option<TimeMs>,
) -> String {
    match (session, token, until) {
        (Some(s), Some(t), _) => format!(": {}", HeldBy::with_token(s, t)),
        (_, _, Some(u)) => format!(": in lock-delay until {u} ms after its holder expired"),
        _ => String::new(),
    }
}

fn describe_holder(session: Option<SessionId>) -> String {
    holder_clause(session.map(HeldBy::session))
}

/// The holder of a lock as every message names it: `held by session 7 with token 42`, or
/// `held by session 7` where the token is not known.
///
/// The one place that text is written, so the lock table's refusals, the client library's
/// errors and the `palisade` command say it alike (scripts and tests look for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldBy {
    pub session: SessionId,
    pub token: Option<Token>,
}

impl HeldBy {
    /// A holder whose token is not known.
    pub fn session(session: SessionId) -> HeldBy {
        HeldBy {
            session,
            token: None,
        }
    }

    pub fn with_token(session: SessionId, token: Token) -> HeldBy {
        HeldBy {
            session,
            token: Some(token),
        }
    }
}

impl std::fmt::Display for HeldBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "held by session {}", self.session)?;
        match self.token {
            Some(token) => write!(f, " with token {token}"),
            None => Ok(()),
        }
    }
}

/// What a refused release adds about the lock: `; it is held by session …`, or `; it is free`.
pub fn holder_clause(holder: Option<HeldBy>) -> String {
    match holder {
        Some(holder) => format!("; it is {holder}"),
        None => "; it is free".to_string(),
    }
}

impl CoreError {
    /// The error's stable, machine-readable name, in `snake_case`: what clients in any language
    /// branch on (it is the `kind` of the wire's `ErrorDetail`). A name never changes meaning
    /// and is never reused; a new variant gets a new name.
    pub fn code(&self) -> &'static str {
        // Every variant is listed, so a new one does not compile until it is named.
        match self {
            CoreError::SessionNotFound { .. } => "session_not_found",
            CoreError::TtlOutOfRange { .. } => "ttl_out_of_range",
            CoreError::WaitOutOfRange { .. } => "wait_out_of_range",
            CoreError::InvalidLockName(_) => "invalid_lock_name",
            CoreError::InvalidOpenKey(_) => "invalid_open_key",
            CoreError::InvalidValue(_) => "invalid_value",
            CoreError::TooManySessions { .. } => "too_many_sessions",
            CoreError::TooManyLocks { .. } => "too_many_locks",
            CoreError::TooManyWaiters { .. } => "too_many_waiters",
            CoreError::Busy { .. } => "busy",
            CoreError::NotHolder { .. } => "not_holder",
            CoreError::TokensExhausted { .. } => "tokens_exhausted",
            CoreError::WaitEnded { .. } => "wait_ended",
            CoreError::InvalidLimits { .. } => "invalid_limits",
            CoreError::RequestIdConflict { .. } => "request_id_conflict",
            CoreError::SessionSecretMissing { .. } => "session_secret_missing",
            CoreError::SessionSecretWrong { .. } => "session_secret_wrong",
            CoreError::Unauthenticated { .. } => "unauthenticated",
            CoreError::PermissionDenied { .. } => "permission_denied",
            CoreError::SessionNotOwned { .. } => "session_not_owned",
            CoreError::QuotaReached { .. } => "quota_reached",
            CoreError::PermitsOutOfRange { .. } => "permits_out_of_range",
            CoreError::PermitsMismatch { .. } => "permits_mismatch",
            CoreError::ModeConflict { .. } => "mode_conflict",
            CoreError::MultiLockSize { .. } => "multi_lock_size",
            CoreError::MultiLockRepeated { .. } => "multi_lock_repeated",
            CoreError::MultiLockHeld { .. } => "multi_lock_held",
        }
    }

    /// How a caller should react to the error. Crates that map errors to status codes, client
    /// error classes or exit statuses match on this exhaustively instead of on the
    /// `#[non_exhaustive]` variants, so a new variant is classified here, once, or does not
    /// compile.
    pub fn category(&self) -> ErrorCategory {
        match self {
            CoreError::SessionNotFound { .. } => ErrorCategory::SessionNotFound,
            CoreError::TtlOutOfRange { .. }
            | CoreError::WaitOutOfRange { .. }
            | CoreError::InvalidLockName(_)
            | CoreError::InvalidOpenKey(_)
            | CoreError::InvalidValue(_)
            | CoreError::RequestIdConflict { .. }
            | CoreError::PermitsOutOfRange { .. }
            | CoreError::PermitsMismatch { .. }
            | CoreError::ModeConflict { .. }
            | CoreError::MultiLockSize { .. }
            | CoreError::MultiLockRepeated { .. }
            | CoreError::MultiLockHeld { .. } => ErrorCategory::InvalidInput,
            CoreError::TooManySessions { .. }
            | CoreError::TooManyLocks { .. }
            | CoreError::TooManyWaiters { .. } => ErrorCategory::LimitReached,
            CoreError::Busy { .. } => ErrorCategory::Busy,
            CoreError::NotHolder { .. } => ErrorCategory::NotHolder,
            CoreError::WaitEnded { .. } => ErrorCategory::WaitEnded,
            CoreError::TokensExhausted { .. } => ErrorCategory::Exhausted,
            CoreError::InvalidLimits { .. } => ErrorCategory::Internal,
            CoreError::SessionSecretMissing { .. }
            | CoreError::SessionSecretWrong { .. }
            | CoreError::Unauthenticated { .. } => ErrorCategory::Unauthenticated,
            CoreError::PermissionDenied { .. } | CoreError::SessionNotOwned { .. } => {
                ErrorCategory::PermissionDenied
            }
            CoreError::QuotaReached { .. } => ErrorCategory::LimitReached,
        }
    }

    /// True when the same command may succeed later without the caller changing anything.
    pub fn is_retryable(&self) -> bool {
        self.category().is_retryable()
    }

    /// One value of every variant, and of every reason inside one, with every optional field
    /// set and unset: for tests of the mappings in other crates (the wire round-trip above
    /// all). A unit test here fails to compile until a new variant is added to it.
    pub fn examples() -> Vec<CoreError> {
        use crate::limits::{GrantValueError, LockNameError, OpenKeyError};
        vec![
            CoreError::SessionNotFound {
                session: SessionId::new(7),
            },
            CoreError::TtlOutOfRange {
                ttl_ms: DurationMs::from_millis(10),
                ttl_ms_min: DurationMs::from_millis(1_000),
                ttl_ms_max: DurationMs::from_millis(600_000),
            },
            CoreError::WaitOutOfRange {
                wait_ms: DurationMs::from_millis(99_000_000),
                wait_ms_max: DurationMs::from_millis(3_600_000),
            },
            CoreError::InvalidLockName(LockNameError::Empty),
            CoreError::InvalidLockName(LockNameError::TooLong {
                bytes: 300,
                bytes_max: 256,
            }),
            CoreError::InvalidLockName(LockNameError::ControlCharacter),
            CoreError::InvalidOpenKey(OpenKeyError::Length {
                bytes: 3,
                bytes_min: 16,
                bytes_max: 32,
            }),
            CoreError::InvalidOpenKey(OpenKeyError::NotRandom),
            CoreError::InvalidOpenKey(OpenKeyError::NotHex),
            CoreError::InvalidValue(GrantValueError::Empty),
            CoreError::InvalidValue(GrantValueError::TooLong {
                bytes: 2_000,
                bytes_max: 1_024,
            }),
            CoreError::InvalidValue(GrantValueError::ControlCharacter),
            CoreError::TooManySessions { sessions_max: 100 },
            CoreError::TooManyLocks { locks_max: 200 },
            CoreError::TooManyWaiters {
                lock: "jobs/nightly".into(),
                waiters_max: 300,
            },
            CoreError::Busy {
                lock: "jobs/nightly".into(),
                holder_session: Some(SessionId::new(3)),
                holder_token: Some(Token::new(42)),
                available_at_ms: None,
            },
            CoreError::Busy {
                lock: "jobs/nightly".into(),
                holder_session: None,
                holder_token: None,
                available_at_ms: Some(TimeMs::from_millis(5_000)),
            },
            CoreError::NotHolder {
                lock: "a".into(),
                session: SessionId::new(3),
                holder_session: Some(SessionId::new(9)),
            },
            CoreError::NotHolder {
                lock: "a".into(),
                session: SessionId::new(3),
                holder_session: None,
            },
            CoreError::TokensExhausted { lock: "a".into() },
            CoreError::WaitEnded { lock: "a".into() },
            CoreError::InvalidLimits {
                message: "sessions_max is 0".into(),
            },
            CoreError::RequestIdConflict {
                request_id: RequestId::new(11),
            },
            CoreError::SessionSecretMissing {
                session: SessionId::new(5),
            },
            CoreError::SessionSecretWrong {
                session: SessionId::new(5),
            },
            CoreError::Unauthenticated {
                reason: CredentialError::Missing,
            },
            CoreError::Unauthenticated {
                reason: CredentialError::Malformed,
            },
            CoreError::Unauthenticated {
                reason: CredentialError::Unknown,
            },
            CoreError::Unauthenticated {
                reason: CredentialError::CertificateName,
            },
            CoreError::Unauthenticated {
                reason: CredentialError::Conflict,
            },
            CoreError::Unauthenticated {
                reason: CredentialError::AdminTokenNeeded,
            },
            CoreError::PermissionDenied {
                identity: "alice".into(),
                right: Right::Lock,
                scope: "jobs/nightly".into(),
            },
            CoreError::SessionNotOwned {
                session: SessionId::new(5),
            },
            CoreError::QuotaReached {
                identity: "alice".into(),
                quota: Quota::Sessions,
                quota_max: 10,
            },
            CoreError::PermitsOutOfRange {
                permits: 5_000,
                permits_max: crate::PERMITS_MAX,
            },
            CoreError::PermitsMismatch {
                lock: "shards".into(),
                permits: 3,
                requested: 4,
            },
            CoreError::PermitsMismatch {
                lock: "shards".into(),
                permits: 0,
                requested: 4,
            },
            CoreError::PermitsMismatch {
                lock: "shards".into(),
                permits: 3,
                requested: 0,
            },
            CoreError::ModeConflict {
                lock: "config".into(),
                session: SessionId::new(5),
                held_shared: true,
            },
            CoreError::ModeConflict {
                lock: "config".into(),
                session: SessionId::new(5),
                held_shared: false,
            },
            CoreError::MultiLockSize {
                locks: 0,
                locks_max: crate::MULTI_LOCKS_MAX,
            },
            CoreError::MultiLockRepeated {
                lock: "accounts/7".into(),
            },
            CoreError::MultiLockHeld {
                lock: "accounts/7".into(),
                session: SessionId::new(5),
            },
        ]
    }
}

/// The classes of [`CoreError`], one per way a caller reacts.
///
/// Deliberately not `#[non_exhaustive]`: a match on it in another crate needs no wildcard, so a
/// new category does not compile until every mapping (gRPC code, client error, exit status)
/// handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    /// The session does not exist (it expired or was closed): open a new session.
    SessionNotFound,
    /// The request is invalid; sent again unchanged it is refused again.
    InvalidInput,
    /// A limit on sessions, locks or waiters was reached; retrying later may succeed.
    LimitReached,
    /// The lock is held by another session, or sits out its lock-delay; wait or retry.
    Busy,
    /// The session does not hold the lock it tried to release.
    NotHolder,
    /// A wait for a lock ended (its deadline passed, or it was withdrawn) before the grant.
    WaitEnded,
    /// The lock can never be granted again: its fencing tokens are used up.
    Exhausted,
    /// The lock table's own configuration is wrong; no request of a client causes this.
    Internal,
    /// A call for a session without the session's secret, or with another: only whoever opened
    /// a session acts for it; or a call without a credential the service knows. Sent again
    /// unchanged it is refused again.
    Unauthenticated,
    /// The caller is authenticated but not allowed: the policy grants its identity no such
    /// right there, or the session belongs to another identity. Sent again unchanged it is
    /// refused again.
    PermissionDenied,
}

impl ErrorCategory {
    /// True when the same command may succeed later without the caller changing anything.
    pub fn is_retryable(self) -> bool {
        match self {
            ErrorCategory::LimitReached | ErrorCategory::Busy => true,
            ErrorCategory::SessionNotFound
            | ErrorCategory::InvalidInput
            | ErrorCategory::NotHolder
            | ErrorCategory::WaitEnded
            | ErrorCategory::Exhausted
            | ErrorCategory::Internal
            | ErrorCategory::Unauthenticated
            | ErrorCategory::PermissionDenied => false,
        }
    }

    /// The category's stable name, in `snake_case`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCategory::SessionNotFound => "session_not_found",
            ErrorCategory::InvalidInput => "invalid_input",
            ErrorCategory::LimitReached => "limit_reached",
            ErrorCategory::Busy => "busy",
            ErrorCategory::NotHolder => "not_holder",
            ErrorCategory::WaitEnded => "wait_ended",
            ErrorCategory::Exhausted => "exhausted",
            ErrorCategory::Internal => "internal",
            ErrorCategory::Unauthenticated => "unauthenticated",
            ErrorCategory::PermissionDenied => "permission_denied",
        }
    }
}

/// Why a holder stopped holding a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseCause {
    Released,
    SessionExpired,
    SessionClosed,
}

/// Why a waiter left a queue without being granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitEndCause {
    TimedOut,
    Withdrawn,
    SessionEnded,
}

/// Something that happened while a command was applied, for watchers and waiting clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    Granted {
        lock: String,
        session: SessionId,
        token: Token,
        request_id: RequestId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<GrantValue>,
        #[serde(default, skip_serializing_if = "Access::is_exclusive")]
        access: Access,
    },
    /// The holder replaced its grant's value.
    ValueSet {
        lock: String,
        session: SessionId,
        token: Token,
        value: Option<GrantValue>,
    },
    Released {
        lock: String,
        session: SessionId,
        token: Token,
        cause: ReleaseCause,
    },
    WaitEnded {
        lock: String,
        session: SessionId,
        request_id: RequestId,
        cause: WaitEndCause,
    },
    SessionEnded {
        session: SessionId,
        expired: bool,
    },
}

impl Event {
    /// The lock this event concerns, if any.
    pub fn lock(&self) -> Option<&str> {
        match self {
            Event::Granted { lock, .. }
            | Event::ValueSet { lock, .. }
            | Event::Released { lock, .. }
            | Event::WaitEnded { lock, .. } => Some(lock),
            Event::SessionEnded { .. } => None,
        }
    }
}

/// The result of applying one [`Input`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub result: Result<Reply, CoreError>,
    pub events: Vec<Event>,
}

/// The current holding of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub session: SessionId,
    pub token: Token,
    pub granted_at_ms: TimeMs,
    pub request_id: RequestId,
    /// What the holder attached to the grant, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<GrantValue>,
    /// Exclusive, shared (a reader of the phase whose token this is) or a semaphore's slot.
    #[serde(default, skip_serializing_if = "Access::is_exclusive")]
    pub access: Access,
}

/// A read-only view of one lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockStatus {
    pub lock: String,
    /// The exclusive holder (of a lock; a semaphore has none).
    pub holder: Option<Grant>,
    /// The readers of the current shared phase (all with the phase's token), or a semaphore's
    /// permit holders, in session order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sharers: Vec<Grant>,
    /// A semaphore's number of permits; `None` for a lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// When each sharer's lease ends, in the order of `sharers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sharers_expire_at_ms: Vec<TimeMs>,
    /// The last token granted for this lock since it was last created.
    pub last_token: Token,
    /// Waiting sessions, first in line first.
    pub waiters: Vec<SessionId>,
    /// How each waiter asks to hold the lock, in the order of `waiters`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiter_modes: Vec<Mode>,
    /// When the holder's lease ends (the holding session's expiry), if held.
    pub holder_expires_at_ms: Option<TimeMs>,
    /// Set while the lock sits out its lock-delay.
    pub available_at_ms: Option<TimeMs>,
}

/// A read-only view of one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub session: SessionId,
    pub ttl_ms: DurationMs,
    pub expires_at_ms: TimeMs,
    pub held: Vec<String>,
    pub waiting: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{GrantValueError, LockNameError, OpenKeyError};
    use std::collections::HashSet;

    /// Adding a variant breaks this match, which sends its author to [`CoreError::examples`].
    fn example_slot(error: &CoreError) -> usize {
        match error {
            CoreError::SessionNotFound { .. } => 0,
            CoreError::TtlOutOfRange { .. } => 1,
            CoreError::WaitOutOfRange { .. } => 2,
            CoreError::InvalidLockName(LockNameError::Empty) => 3,
            CoreError::InvalidLockName(LockNameError::TooLong { .. }) => 4,
            CoreError::InvalidLockName(LockNameError::ControlCharacter) => 5,
            CoreError::InvalidOpenKey(OpenKeyError::Length { .. }) => 6,
            CoreError::InvalidOpenKey(OpenKeyError::NotRandom) => 7,
            CoreError::InvalidOpenKey(OpenKeyError::NotHex) => 8,
            CoreError::TooManySessions { .. } => 9,
            CoreError::TooManyLocks { .. } => 10,
            CoreError::TooManyWaiters { .. } => 11,
            CoreError::Busy { .. } => 12,
            CoreError::NotHolder { .. } => 13,
            CoreError::TokensExhausted { .. } => 14,
            CoreError::WaitEnded { .. } => 15,
            CoreError::InvalidLimits { .. } => 16,
            CoreError::RequestIdConflict { .. } => 17,
            CoreError::SessionSecretMissing { .. } => 18,
            CoreError::SessionSecretWrong { .. } => 19,
            CoreError::Unauthenticated {
                reason: CredentialError::Missing,
            } => 20,
            CoreError::Unauthenticated {
                reason: CredentialError::Malformed,
            } => 21,
            CoreError::Unauthenticated {
                reason: CredentialError::Unknown,
            } => 22,
            CoreError::PermissionDenied { .. } => 23,
            CoreError::SessionNotOwned { .. } => 24,
            CoreError::QuotaReached { .. } => 25,
            CoreError::Unauthenticated {
                reason: CredentialError::CertificateName,
            } => 26,
            CoreError::Unauthenticated {
                reason: CredentialError::Conflict,
            } => 27,
            CoreError::InvalidValue(GrantValueError::Empty) => 28,
            CoreError::InvalidValue(GrantValueError::TooLong { .. }) => 29,
            CoreError::InvalidValue(GrantValueError::ControlCharacter) => 30,
            CoreError::Unauthenticated {
                reason: CredentialError::AdminTokenNeeded,
            } => 31,
            CoreError::PermitsOutOfRange { .. } => 32,
            CoreError::PermitsMismatch { .. } => 33,
            CoreError::ModeConflict { .. } => 34,
            CoreError::MultiLockSize { .. } => 35,
            CoreError::MultiLockRepeated { .. } => 36,
            CoreError::MultiLockHeld { .. } => 37,
        }
    }

    #[test]
    fn the_examples_cover_every_variant_and_reason() {
        let slots: HashSet<usize> = CoreError::examples().iter().map(example_slot).collect();
        assert_eq!(slots, (0..38).collect::<HashSet<usize>>());
    }

    #[test]
    fn every_variant_has_its_own_stable_code() {
        let examples = CoreError::examples();
        let codes: HashSet<&str> = examples.iter().map(CoreError::code).collect();
        assert_eq!(codes.len(), 27, "one code per variant: {codes:?}");
        for code in codes {
            assert!(
                code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{code} is not snake_case"
            );
        }
    }

    #[test]
    fn only_busy_locks_and_reached_limits_are_worth_retrying() {
        for error in CoreError::examples() {
            let expected = matches!(
                error.category(),
                ErrorCategory::Busy | ErrorCategory::LimitReached
            );
            assert_eq!(error.is_retryable(), expected, "{error:?}");
        }
        let busy = &CoreError::examples()[15];
        assert_eq!(busy.category(), ErrorCategory::Busy);
        assert_eq!(busy.category().name(), "busy");
    }
}
