//! A fence for Redis: one Lua script checks the scope's accepted token and, if the sequencer is
//! accepted, advances it and applies the caller's writes ([`RedisOp`]).
//!
//! Atomicity: Redis runs a script to completion with no other command in between, so the
//! check, the advance and the writes are one step; a rejected sequencer changes nothing. Tokens
//! are compared as canonical decimal strings inside the script (length, then bytes), because Lua
//! numbers are doubles and cannot hold every token up to `i64::MAX` exactly.
//!
//! **Durability and replication — read before relying on this backend.** Redis acknowledges the
//! script once it has run in memory. Whether the advance and the writes survive a crash depends
//! on the server's persistence (`appendonly yes` with `appendfsync always` for every write;
//! `everysec` can lose the last second; the Redis used by these tests persists nothing at all).
//! Replication is asynchronous: after a failover, the new primary may lack an acknowledged write
//! *and* the accepted maximum that came with it, and then a superseded holder's old token is
//! accepted again. That breaks invariant 3 as stated for durable resources. Use Redis fencing
//! where losing recent writes on a crash or failover is acceptable (caches, best-effort
//! coordination), and a transactional database ([`crate::postgres`], [`crate::sqlite`],
//! [`crate::RedbFence`]) where it is not.
//!
//! In Redis Cluster every key a script touches must hash to one slot: give the fence prefix,
//! scope and the caller's keys a common `{hash tag}`.

use palisade_core::limits::TOKEN_MAX;
use palisade_sequencer::VerifiedSequencer;
use redis::aio::ConnectionLike;

use crate::FenceError;
use crate::fence::{FenceState, LockBinding, check, validate_scope};

/// Most writes one fenced script call may apply.
pub const REDIS_OPS_MAX: usize = 64;

/// Default prefix of the fence hashes: `palisade:fence:<scope>`.
pub const FENCE_KEY_PREFIX_DEFAULT: &str = "palisade:fence:";

/// One write applied by the script if the sequencer is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisOp {
    /// `SET key value`.
    Set { key: String, value: Vec<u8> },
    /// `DEL key`.
    Del { key: String },
    /// `RPUSH key value`: append to a list (a log, a queue).
    RPush { key: String, value: Vec<u8> },
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

    fn parts(&self) -> (&str, &str, &[u8]) {
        match self {
            RedisOp::Set { key, value } => (key, "set", value),
            RedisOp::Del { key } => (key, "del", &[]),
            RedisOp::RPush { key, value } => (key, "rpush", value),
        }
    }
}

// KEYS[1]: the scope's fence hash; KEYS[1 + i]: the key of op i.
// ARGV[1..3]: lock, token, session; ARGV[2 + 2i], ARGV[3 + 2i]: kind and value of op i.
const SCRIPT: &str = r#"
local lock, token, session = ARGV[1], ARGV[2], ARGV[3]
local state = redis.call('HMGET', KEYS[1], 'lock', 'token', 'session')
if state[1] then
  if not state[2] or not state[3] then
    return {'corrupt', 'fence hash lacks its token or session'}
  end
  if state[1] ~= lock then
    return {'wrong_lock', state[1]}
  end
  local accepted = state[2]
  if #token < #accepted or (#token == #accepted and token < accepted) then
    return {'stale', accepted, state[3]}
  end
end
-- Redis does not roll a script back when a command in it fails, so everything that could
-- fail is checked before the first write: then the ops and the advance happen all or not at all.
for i = 1, #KEYS - 1 do
  local key, kind = KEYS[1 + i], ARGV[2 + 2 * i]
  if kind == 'rpush' then
    local existing = redis.call('TYPE', key)['ok']
    if existing ~= 'none' and existing ~= 'list' then
      return {'wrong_type', key, existing}
    end
  elseif kind ~= 'set' and kind ~= 'del' then
    return {'unknown_op', tostring(kind)}
  end
end
for i = 1, #KEYS - 1 do
  local key, kind, value = KEYS[1 + i], ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  if kind == 'set' then
    redis.call('SET', key, value)
  elseif kind == 'del' then
    redis.call('DEL', key)
  else
    redis.call('RPUSH', key, value)
  end
end
redis.call('HSET', KEYS[1], 'lock', lock, 'token', token, 'session', session)
return {'ok'}
"#;

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

    /// Stores the fence hashes under `prefix` instead.
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
    /// same atomic script; on a rejection nothing is written.
    pub async fn write(
        &self,
        conn: &mut impl ConnectionLike,
        scope: &str,
        sequencer: &VerifiedSequencer,
        ops: &[RedisOp],
    ) -> Result<(), FenceError> {
        validate_scope(scope)?;
        if ops.len() > REDIS_OPS_MAX {
            return Err(FenceError::Storage {
                message: format!(
                    "{} redis ops in one fenced write, the limit is {REDIS_OPS_MAX}",
                    ops.len()
                ),
            });
        }
        let binding = match &self.expected_lock {
            Some(lock) => LockBinding::Expect(lock),
            None => LockBinding::BindOnFirstWrite,
        };
        // The binding does not depend on stored state: refuse before touching Redis.
        check(None, binding, sequencer)?;

        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.fence_key(scope))
            .arg(sequencer.lock())
            .arg(sequencer.token().to_string())
            .arg(sequencer.session().to_string());
        for op in ops {
            let (key, kind, value) = op.parts();
            invocation.key(key).arg(kind).arg(value);
        }
        let reply: Vec<String> = invocation.invoke_async(conn).await.map_err(storage)?;
        match reply.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["ok"] => Ok(()),
            ["stale", accepted, holder] => {
                let accepted = parse_u64(scope, "token", accepted)?;
                let holder_session = parse_u64(scope, "session", holder)?;
                // Pair of the script's comparison: a stale reply must name a larger token.
                assert!(
                    accepted > sequencer.token(),
                    "redis called token {accepted} newer"
                );
                Err(FenceError::Stale {
                    lock: sequencer.lock().to_owned(),
                    presented: sequencer.token(),
                    accepted,
                    holder_session: Some(holder_session),
                })
            }
            ["wrong_lock", expected] => Err(FenceError::WrongLock {
                expected: expected.to_owned(),
                presented: sequencer.lock().to_owned(),
            }),
            ["wrong_type", key, existing] => Err(FenceError::Storage {
                message: format!(
                    "cannot RPUSH to {key:?}: it holds a {existing}, not a list; nothing was written"
                ),
            }),
            ["corrupt", message] => Err(FenceError::Corrupt {
                scope: scope.to_owned(),
                message: message.to_owned(),
            }),
            _ => Err(FenceError::Storage {
                message: format!("unexpected reply from the fence script: {reply:?}"),
            }),
        }
    }

    /// The scope's state, if any write was accepted.
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
            [None, ..] => Ok(None),
            [Some(lock), Some(token), Some(session)] => Ok(Some(FenceState {
                lock: lock.clone(),
                token_max: parse_u64(scope, "token", token)?,
                holder_session: parse_u64(scope, "session", session)?,
            })),
            _ => Err(FenceError::Corrupt {
                scope: scope.to_owned(),
                message: "fence hash lacks its token or session".into(),
            }),
        }
    }
}

fn parse_u64(scope: &str, field: &str, text: &str) -> Result<u64, FenceError> {
    let corrupt = || FenceError::Corrupt {
        scope: scope.to_owned(),
        message: format!("stored {field} {text:?} is not a number in range"),
    };
    let value: u64 = text.parse().map_err(|_| corrupt())?;
    if field == "token" && !(1..=TOKEN_MAX).contains(&value) {
        return Err(corrupt());
    }
    Ok(value)
}

fn storage(error: redis::RedisError) -> FenceError {
    FenceError::Storage {
        message: format!("redis error: {error}"),
    }
}
