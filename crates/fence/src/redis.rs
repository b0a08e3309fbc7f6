//! A fence for Redis: one Lua script checks the scope's accepted token and, if the sequencer is
//! accepted, advances it and applies the caller's ops ([`RedisOp`]), returning each op's reply.
//!
//! **Claim first, then read, then write.** A holder's plain `GET` is not ordered: a superseded
//! holder could read, pause, and write back a value computed from what it read after a newer
//! holder has read the same value, and one update is lost. So read through the fence:
//!
//! - [`RedisFence::read`] advances the scope's token and returns the keys' values in one script:
//!   once it returns, no older grant can write to the scope, so what it returned cannot be
//!   changed behind the reader's back by a superseded holder;
//! - [`RedisFence::write`] applies ops in the same step as the check, and its ops include
//!   [`RedisOp::IncrBy`] and [`RedisOp::Get`], so a read-modify-write of one request needs no
//!   second round trip;
//! - [`RedisFence::write_if`] adds conditions ([`RedisCondition`]: a key equals a value, or is
//!   absent), checked against the data before the request: a compare-and-set applied all or
//!   nothing under the fence check. A failed condition writes nothing and reports the key's
//!   current value ([`RedisOutcome::CompareFailed`]).
//!
//! Atomicity: Redis runs a script to completion with no other command in between, so the
//! check, the advance, the conditions and the ops are one step; a rejected sequencer changes
//! nothing. Redis does not roll back a script whose command fails halfway, so before its first
//! write the script checks that every op can apply: the type each op needs (a list for `RPUSH`,
//! a string for `GET` and `INCRBY`), following the types the earlier ops of the same request
//! leave (`SET` makes a string, `DEL` removes the key, `RPUSH` makes a list), and that each
//! `INCRBY` finds an integer and stays within 64 bits. A request that cannot apply in full is
//! refused as [`FenceError::InvalidRequest`] with nothing written and the token not advanced.
//! The script declares itself with a `#!lua` shebang, so Redis refuses it before it starts when
//! the server is out of memory or read-only, rather than at its first write: **Redis 7.0 or
//! later** is required. Tokens are compared as canonical decimal strings inside the script
//! (length, then bytes), because Lua numbers are doubles and cannot hold every token up to
//! `i64::MAX` exactly; a stored token or session that is not canonical (`"007"`) is reported as
//! [`FenceError::Corrupt`].
//!
//! No key of a request may start with the fence key prefix ([`RedisFence::fence_key`]): an op
//! there would reset another scope's fence. Such a request is refused as
//! [`FenceError::InvalidRequest`] before it is sent (and again inside the script).
//!
//! Outcomes: a request refused by Redis before the script ran (connection refused, `BUSY`,
//! `OOM`, `READONLY`, `NOSCRIPT`, …) is a retryable [`FenceError::Storage`]. A request whose
//! answer was lost after it was sent (the connection dropped, an unreadable reply) is
//! [`FenceError::OutcomeUnknown`]: read the keys back with [`RedisFence::read`] before deciding.
//!
//! **Durability and replication — read before relying on this backend.** Redis acknowledges the
//! script once it has run in memory. Whether the advance and the writes survive a crash depends
//! on the server's persistence (`appendonly yes` with `appendfsync always` for every write;
//! `everysec` can lose the last second; the Redis used by these tests persists nothing at all).
//! Replication is asynchronous: after a failover, the new primary may lack an acknowledged write
//! *and* the accepted maximum that came with it, and then a superseded holder's old token is
//! accepted again. That breaks invariant 3 as stated for durable resources. Use Redis fencing
//! where losing recent writes on a crash or failover is acceptable (caches, best-effort
//! coordination), and a transactional database ([`crate::postgres`], [`crate::mysql`],
//! [`crate::sqlite`], [`crate::RedbFence`]) where it is not.
//!
//! In Redis Cluster every key a script touches must hash to one slot: give the fence prefix,
//! scope and the caller's keys a common `{hash tag}`.

use palisade_core::limits::TOKEN_MAX;
use palisade_core::{Access, SessionId, Token};
use palisade_sequencer::{VerifiedSequencer, display_binding};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::FenceError;
use crate::fence::{FenceState, Intent, LockBinding, precheck, stored_holder, validate_scope};

/// Most ops one fenced script call may apply (and most keys one [`RedisFence::read`] returns).
pub const REDIS_OPS_MAX: usize = 64;

/// Most conditions one [`RedisFence::write_if`] may check.
pub const REDIS_CONDITIONS_MAX: usize = 64;

/// Default prefix of the fence hashes: `palisade:fence:<scope>`.
pub const FENCE_KEY_PREFIX_DEFAULT: &str = "palisade:fence:";

/// One op the script applies, in order, if the sequencer is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisOp {
    /// `SET key value`; replies [`RedisReply::Done`].
    Set { key: String, value: Vec<u8> },
    /// `DEL key`; replies [`RedisReply::Integer`]: 1 if the key existed, else 0.
    Del { key: String },
    /// `RPUSH key value`: append to a list (a log, a queue); replies [`RedisReply::Integer`],
    /// the list's length after the push.
    RPush { key: String, value: Vec<u8> },
    /// `INCRBY key delta`: the key must hold an integer (or not exist: it counts as 0) and the
    /// sum must fit in an `i64`; replies [`RedisReply::Integer`], the new value.
    IncrBy { key: String, delta: i64 },
    /// `GET key`, as the earlier ops of the request left it; replies [`RedisReply::Value`].
    Get { key: String },
}

impl RedisOp {
    /// `SET key value`.
    pub fn set(key: impl Into<String>, value: impl Into<Vec<u8>>) -> RedisOp {
        RedisOp::Set {
            key: key.into(),
            value: value.into(),
        }
    }

    /// `DEL key`.
    pub fn del(key: impl Into<String>) -> RedisOp {
        RedisOp::Del { key: key.into() }
    }

    /// `RPUSH key value`.
    pub fn rpush(key: impl Into<String>, value: impl Into<Vec<u8>>) -> RedisOp {
        RedisOp::RPush {
            key: key.into(),
            value: value.into(),
        }
    }

    /// `INCRBY key delta`.
    pub fn incr_by(key: impl Into<String>, delta: i64) -> RedisOp {
        RedisOp::IncrBy {
            key: key.into(),
            delta,
        }
    }

    /// `GET key`.
    pub fn get(key: impl Into<String>) -> RedisOp {
        RedisOp::Get { key: key.into() }
    }

    /// The key the op touches.
    pub fn key(&self) -> &str {
        match self {
            RedisOp::Set { key, .. }
            | RedisOp::Del { key }
            | RedisOp::RPush { key, .. }
            | RedisOp::IncrBy { key, .. }
            | RedisOp::Get { key } => key,
        }
    }

    /// The script's name for the op and its argument.
    fn script_args(&self) -> (&'static str, Vec<u8>) {
        match self {
            RedisOp::Set { value, .. } => ("set", value.clone()),
            RedisOp::Del { .. } => ("del", Vec::new()),
            RedisOp::RPush { value, .. } => ("rpush", value.clone()),
            RedisOp::IncrBy { delta, .. } => ("incrby", delta.to_string().into_bytes()),
            RedisOp::Get { .. } => ("get", Vec::new()),
        }
    }
}

/// What one [`RedisOp`] returned, in the order of the ops.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisReply {
    /// The op has no result to report (`SET`).
    Done,
    /// An integer result: `DEL`'s count, `RPUSH`'s new length, `INCRBY`'s new value.
    Integer(i64),
    /// `GET`'s value; `None` when the key does not exist.
    Value(Option<Vec<u8>>),
}

impl RedisReply {
    /// The integer, for `DEL`, `RPUSH` and `INCRBY`.
    pub fn integer(&self) -> Option<i64> {
        match self {
            RedisReply::Integer(value) => Some(*value),
            RedisReply::Done | RedisReply::Value(_) => None,
        }
    }

    /// The value, for `GET`: `Some(None)` when the key does not exist.
    pub fn value(&self) -> Option<Option<&[u8]>> {
        match self {
            RedisReply::Value(value) => Some(value.as_deref()),
            RedisReply::Done | RedisReply::Integer(_) => None,
        }
    }
}

/// A condition of [`RedisFence::write_if`], checked against the data as it is before the
/// request's ops.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisCondition {
    /// The key holds a string equal to `value`.
    Equals { key: String, value: Vec<u8> },
    /// The key does not exist.
    Absent { key: String },
}

impl RedisCondition {
    /// The key holds a string equal to `value`.
    pub fn equals(key: impl Into<String>, value: impl Into<Vec<u8>>) -> RedisCondition {
        RedisCondition::Equals {
            key: key.into(),
            value: value.into(),
        }
    }

    /// The key does not exist.
    pub fn absent(key: impl Into<String>) -> RedisCondition {
        RedisCondition::Absent { key: key.into() }
    }

    /// The key the condition looks at.
    pub fn key(&self) -> &str {
        match self {
            RedisCondition::Equals { key, .. } | RedisCondition::Absent { key } => key,
        }
    }

    fn script_args(&self) -> (&'static str, &[u8]) {
        match self {
            RedisCondition::Equals { value, .. } => ("equals", value),
            RedisCondition::Absent { .. } => ("absent", &[]),
        }
    }
}

/// What [`RedisFence::write_if`] did, once the sequencer was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a failed condition means nothing was written"]
pub enum RedisOutcome {
    /// Every condition held: the ops were applied and the scope's token advanced. One reply per
    /// op, in order.
    Applied(Vec<RedisReply>),
    /// A condition did not hold: nothing was written and the token was not advanced.
    CompareFailed {
        /// The index of the first condition that failed, in request order.
        condition: usize,
        /// The key's value now, if it holds a string; `None` if it does not exist or holds
        /// another type.
        current: Option<Vec<u8>>,
    },
}

// The check, the conditions, the ops and the advance, in one script (`redis.lua`).
const SCRIPT: &str = include_str!("redis.lua");

/// Fences writes to a Redis database, per scope.
pub struct RedisFence {
    key_prefix: String,
    expected_lock: Option<String>,
    script: redis::Script,
}

impl Default for RedisFence {
    fn default() -> RedisFence {
        RedisFence::new()
    }
}

impl std::fmt::Debug for RedisFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFence")
            .field("key_prefix", &self.key_prefix)
            .field("expected_lock", &self.expected_lock)
            .finish_non_exhaustive()
    }
}

impl RedisFence {
    /// A fence whose scope hashes are `palisade:fence:<scope>`; each scope is bound to the lock
    /// of its first accepted writer.
    pub fn new() -> RedisFence {
        RedisFence {
            key_prefix: FENCE_KEY_PREFIX_DEFAULT.to_owned(),
            expected_lock: None,
            script: redis::Script::new(SCRIPT),
        }
    }

    /// Stores the fence hashes under `prefix` instead. No data key may start with it: requests
    /// naming such a key are refused.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> RedisFence {
        self.key_prefix = prefix.into();
        self
    }

    /// Accepts sequencers of `lock` only, in every scope.
    pub fn expecting_lock(mut self, lock: impl Into<String>) -> RedisFence {
        self.expected_lock = Some(lock.into());
        self
    }

    /// The key of the hash holding `scope`'s state.
    pub fn fence_key(&self, scope: &str) -> String {
        format!("{}{scope}", self.key_prefix)
    }

    /// Applies `ops` if `sequencer` is accepted for `scope`, advancing the scope's token in the
    /// same atomic script, and returns one reply per op. On any error nothing was written,
    /// except [`FenceError::OutcomeUnknown`], after which it may have been.
    pub async fn write(
        &self,
        conn: &mut impl ConnectionLike,
        scope: &str,
        sequencer: &VerifiedSequencer,
        ops: &[RedisOp],
    ) -> Result<Vec<RedisReply>, FenceError> {
        match self
            .run(conn, scope, sequencer, &[], ops, Intent::Write)
            .await?
        {
            RedisOutcome::Applied(replies) => Ok(replies),
            RedisOutcome::CompareFailed { condition, .. } => Err(FenceError::Corrupt {
                scope: scope.to_owned(),
                message: format!(
                    "the fence script reported condition {condition} failed, but the request had none"
                ),
            }),
        }
    }

    /// [`RedisFence::write`] under `conditions`: if the sequencer is accepted and every
    /// condition holds (against the data before the ops), applies `ops` and advances the token;
    /// if a condition fails, writes nothing and reports it. A compare-and-set:
    /// `write_if(.., &[RedisCondition::equals(k, old)], &[RedisOp::set(k, new)])`.
    pub async fn write_if(
        &self,
        conn: &mut impl ConnectionLike,
        scope: &str,
        sequencer: &VerifiedSequencer,
        conditions: &[RedisCondition],
        ops: &[RedisOp],
    ) -> Result<RedisOutcome, FenceError> {
        self.run(conn, scope, sequencer, conditions, ops, Intent::Write)
            .await
    }

    /// A fenced read: checks `sequencer`, advances the scope's token to it and returns the
    /// values of `keys` (`None` for a key that does not exist), in one script. Once it returns,
    /// no older grant can write to the scope. A stale reader is refused with
    /// [`FenceError::Stale`], like a stale writer. Every key must hold a string or not exist.
    /// Any grant may read, a shared one (a reader of a read-write lock) included; `write` and
    /// `write_if` refuse a shared grant as [`FenceError::SharedWrite`].
    pub async fn read<K: AsRef<str>>(
        &self,
        conn: &mut impl ConnectionLike,
        scope: &str,
        sequencer: &VerifiedSequencer,
        keys: &[K],
    ) -> Result<Vec<Option<Vec<u8>>>, FenceError> {
        let ops: Vec<RedisOp> = keys.iter().map(|key| RedisOp::get(key.as_ref())).collect();
        let replies = match self
            .run(conn, scope, sequencer, &[], &ops, Intent::Read)
            .await?
        {
            RedisOutcome::Applied(replies) => replies,
            RedisOutcome::CompareFailed { condition, .. } => {
                return Err(FenceError::Corrupt {
                    scope: scope.to_owned(),
                    message: format!(
                        "the fence script reported condition {condition} failed, but the read had none"
                    ),
                });
            }
        };
        replies
            .into_iter()
            .map(|reply| match reply {
                RedisReply::Value(value) => Ok(value),
                other => Err(unexpected(format!("a GET replied {other:?}"))),
            })
            .collect()
    }

    async fn run(
        &self,
        conn: &mut impl ConnectionLike,
        scope: &str,
        sequencer: &VerifiedSequencer,
        conditions: &[RedisCondition],
        ops: &[RedisOp],
        intent: Intent,
    ) -> Result<RedisOutcome, FenceError> {
        validate_scope(scope)?;
        if ops.len() > REDIS_OPS_MAX {
            return Err(FenceError::invalid_request(format!(
                "{} redis ops in one fenced request, the limit is {REDIS_OPS_MAX}",
                ops.len()
            )));
        }
        if conditions.len() > REDIS_CONDITIONS_MAX {
            return Err(FenceError::invalid_request(format!(
                "{} conditions in one fenced request, the limit is {REDIS_CONDITIONS_MAX}",
                conditions.len()
            )));
        }
        let keys = conditions
            .iter()
            .map(RedisCondition::key)
            .chain(ops.iter().map(RedisOp::key));
        for key in keys {
            if key.starts_with(&self.key_prefix) {
                return Err(reserved_key(key));
            }
        }
        let binding = match &self.expected_lock {
            Some(lock) => LockBinding::Expect(lock),
            None => LockBinding::BindOnFirstWrite,
        };
        // The expected binding and a shared write do not depend on stored state: refuse before
        // touching Redis (the script refuses a shared grant's write too, for every client).
        precheck(binding, sequencer, intent)?;
        let session = match sequencer.access() {
            Access::Shared => "s".to_owned(),
            Access::Exclusive | Access::Slot(_) => sequencer.session().to_string(),
        };

        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.fence_key(scope))
            .arg(sequencer.binding().as_ref())
            .arg(sequencer.token().to_string())
            .arg(session)
            .arg(&self.key_prefix)
            .arg(conditions.len().to_string());
        for condition in conditions {
            let (kind, value) = condition.script_args();
            invocation.key(condition.key()).arg(kind).arg(value);
        }
        for op in ops {
            let (kind, value) = op.script_args();
            invocation.key(op.key()).arg(kind).arg(value);
        }
        let reply: Vec<Option<Vec<u8>>> = invocation
            .invoke_async(conn)
            .await
            .map_err(script_failure)?;
        decode_reply(scope, sequencer, ops, reply)
    }

    /// The scope's state, if any sequencer was accepted.
    pub async fn fence_state(
        &self,
        conn: &mut impl ConnectionLike,
        scope: &str,
    ) -> Result<Option<FenceState>, FenceError> {
        validate_scope(scope)?;
        let fields: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.fence_key(scope))
            .arg("lock")
            .arg("token")
            .arg("session")
            .query_async(conn)
            .await
            .map_err(storage)?;
        match &fields[..] {
            [None, None, None] => Ok(None),
            [Some(lock), Some(token), Some(session)] => Ok(Some(FenceState {
                lock: lock.clone(),
                token_max: Token::new(parse_u64(scope, "token", token)?),
                holder_session: SessionId::new(parse_u64(scope, "session", session)?),
            })),
            _ => Err(FenceError::Corrupt {
                scope: scope.to_owned(),
                message: "the fence hash lacks its lock, token or session".into(),
            }),
        }
    }
}

/// Turns the script's reply into the request's outcome or the error it explains.
fn decode_reply(
    scope: &str,
    sequencer: &VerifiedSequencer,
    ops: &[RedisOp],
    reply: Vec<Option<Vec<u8>>>,
) -> Result<RedisOutcome, FenceError> {
    let text = |index: usize| -> Result<String, FenceError> {
        match reply.get(index) {
            Some(Some(bytes)) => String::from_utf8(bytes.clone())
                .map_err(|_| unexpected(format!("field {index} is not UTF-8: {reply:?}"))),
            _ => Err(unexpected(format!("field {index} is missing: {reply:?}"))),
        }
    };
    let op_index = |index: usize| -> Result<usize, FenceError> {
        let text = text(index)?;
        text.parse()
            .map_err(|_| unexpected(format!("{text:?} is not an index")))
    };
    match text(0)?.as_str() {
        "ok" => {
            let pairs = &reply[1..];
            if pairs.len() != 2 * ops.len() {
                return Err(unexpected(format!(
                    "{} replies for {} ops",
                    pairs.len() / 2,
                    ops.len()
                )));
            }
            let replies = pairs
                .chunks(2)
                .map(|pair| decode_op_reply(&pair[0], &pair[1]))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(RedisOutcome::Applied(replies))
        }
        "stale" => {
            let accepted = Token::new(parse_u64(scope, "token", &text(1)?)?);
            let holder_session = SessionId::new(parse_u64(scope, "session", &text(2)?)?);
            if accepted <= sequencer.token() {
                // Pair of the script's comparison: a stale reply must name a larger token.
                return Err(FenceError::Corrupt {
                    scope: scope.to_owned(),
                    message: format!(
                        "redis called the stored token {accepted} newer than token {}",
                        sequencer.token()
                    ),
                });
            }
            Err(FenceError::Stale {
                lock: display_binding(&sequencer.binding()).into_owned(),
                presented: sequencer.token(),
                accepted,
                holder_session: Some(holder_session),
            })
        }
        "token_reissued" => {
            let accepted = Token::new(parse_u64(scope, "token", &text(1)?)?);
            let first_session = SessionId::new(parse_u64(scope, "session", &text(2)?)?);
            if accepted != sequencer.token() || first_session == stored_holder(sequencer) {
                // Pair of the script's comparison: the same token, another session.
                return Err(FenceError::Corrupt {
                    scope: scope.to_owned(),
                    message: format!(
                        "redis called token {} of session {} a re-issue of token {accepted} of session {first_session}",
                        sequencer.token(),
                        sequencer.session()
                    ),
                });
            }
            Err(FenceError::TokenReissued {
                lock: display_binding(&sequencer.binding()).into_owned(),
                token: accepted,
                first_session,
                presented_session: sequencer.session(),
            })
        }
        "wrong_lock" => Err(FenceError::WrongLock {
            expected: display_binding(&text(1)?).into_owned(),
            presented: display_binding(&sequencer.binding()).into_owned(),
        }),
        "shared_write" => {
            if sequencer.access() != Access::Shared {
                return Err(unexpected(format!(
                    "redis called a write of a {} grant a shared write",
                    sequencer.access()
                )));
            }
            Err(FenceError::SharedWrite {
                lock: sequencer.lock().to_owned(),
                token: sequencer.token(),
            })
        }
        "corrupt" => Err(FenceError::Corrupt {
            scope: scope.to_owned(),
            message: text(1)?,
        }),
        "compare_failed" => Ok(RedisOutcome::CompareFailed {
            condition: op_index(1)?,
            current: reply.get(2).cloned().flatten(),
        }),
        "reserved_key" => Err(reserved_key(&text(1)?)),
        "wrong_type" => {
            let (index, key, found, needed) = (op_index(1)?, text(2)?, text(3)?, text(4)?);
            Err(FenceError::invalid_request(format!(
                "op {index} needs key {key:?} to hold a {needed} or not exist, but it holds a {found} (after the ops before it); nothing was written"
            )))
        }
        "not_integer" => Err(FenceError::invalid_request(format!(
            "op {} increments key {:?}, which does not hold a 64-bit integer (after the ops before it); nothing was written",
            op_index(1)?,
            text(2)?
        ))),
        "overflow" => Err(FenceError::invalid_request(format!(
            "op {} would take key {:?} beyond the 64-bit integer range; nothing was written",
            op_index(1)?,
            text(2)?
        ))),
        "invalid" => Err(FenceError::invalid_request(text(1)?)),
        _ => Err(unexpected(format!("{reply:?}"))),
    }
}

fn decode_op_reply(
    kind: &Option<Vec<u8>>,
    value: &Option<Vec<u8>>,
) -> Result<RedisReply, FenceError> {
    match (kind.as_deref(), value) {
        (Some(b"done"), _) => Ok(RedisReply::Done),
        (Some(b"value"), value) => Ok(RedisReply::Value(value.clone())),
        (Some(b"int"), Some(digits)) => std::str::from_utf8(digits)
            .ok()
            .and_then(|digits| digits.parse().ok())
            .map(RedisReply::Integer)
            .ok_or_else(|| unexpected(format!("op reply {digits:?} is not an integer"))),
        _ => Err(unexpected(format!("op reply {kind:?} {value:?}"))),
    }
}

fn reserved_key(key: &str) -> FenceError {
    FenceError::invalid_request(format!(
        "key {key:?} is under the fence key prefix, which holds the fences of every scope; nothing was written"
    ))
}

/// The script's reply does not say what happened: it ran, but its effect is unknown.
fn unexpected(detail: String) -> FenceError {
    FenceError::OutcomeUnknown {
        message: format!("unexpected reply from the fence script: {detail}"),
    }
}

/// Parses a stored decimal, which must be canonical (what the script writes): `"007"` is
/// corruption, never 7.
fn parse_u64(scope: &str, field: &str, text: &str) -> Result<u64, FenceError> {
    let corrupt = || FenceError::Corrupt {
        scope: scope.to_owned(),
        message: format!("the stored {field} {text:?} is not a canonical decimal in range"),
    };
    let value: u64 = text.parse().map_err(|_| corrupt())?;
    if value.to_string() != text {
        return Err(corrupt());
    }
    if field == "token" && !(Token::FIRST..=TOKEN_MAX).contains(&Token::new(value)) {
        return Err(corrupt());
    }
    Ok(value)
}

/// Classifies a failed script call: refused before it ran (retryable), or sent and unanswered
/// (outcome unknown).
fn script_failure(error: RedisError) -> FenceError {
    if refused_before_running(&error) {
        storage(error)
    } else {
        FenceError::OutcomeUnknown {
            message: format!("redis error after the fence script was sent: {error}"),
        }
    }
}

/// Errors Redis answers with instead of running a script (or that happen before sending).
fn refused_before_running(error: &RedisError) -> bool {
    if error.is_connection_refusal() {
        return true;
    }
    match error.kind() {
        ErrorKind::Server(
            ServerErrorKind::NoScript
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            // Redis checks the keys of EVAL against the user's ACL before the script runs, and
            // the script checks every command it will call before its first write.
            | ServerErrorKind::NoPerm,
        )
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig => true,
        ErrorKind::Extension => matches!(
            error.code(),
            Some("BUSY" | "OOM" | "NOAUTH" | "WRONGPASS" | "MISCONF" | "NOREPLICAS")
        ),
        // Anything else (an I/O error mid-call, a script error, a reply we cannot parse) may
        // have come after the script ran.
        _ => false,
    }
}

fn storage(error: RedisError) -> FenceError {
    FenceError::Storage {
        message: format!("redis error: {error}"),
    }
}
