//! The single-instance Redis lock, as the unsafe reference point of `palisade bench`: acquire is
//! `SET key value NX PX ttl` with a value unique to the grant, retried after a short sleep while
//! the key is taken (Redis has no queue of waiters); release deletes the key only if it still
//! holds our value (a Lua script, so the check and the delete are one step).
//!
//! It is unsafe on purpose, and the report labels it so: no fencing token (the value is a random
//! name, not a number that grows), and nothing durable (the benchmark's Redis keeps nothing on
//! disk, and even with an append-only file a failover can lose the key). A holder paused past
//! its TTL loses the lock without knowing it, and nothing stops its late writes.

use std::time::Duration;

use anyhow::Context;
use redis::aio::MultiplexedConnection;

/// Pause between attempts while another client holds the key. Redis cannot wake a waiter, so a
/// waiter polls; shorter pauses grant sooner and load the server (and this machine's two cores)
/// with failed attempts.
pub const RETRY_PAUSE: Duration = Duration::from_millis(1);

/// Deletes KEYS[1] if it holds ARGV[1]; 1 if it did.
const RELEASE_SCRIPT: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
"#;

/// One client's connection, and the name its values carry.
pub struct RedisLocks {
    conn: MultiplexedConnection,
    /// Unique to this connection: the values of its grants are `owner:n`.
    owner: String,
    grants: u64,
    ttl_ms: u64,
    release: redis::Script,
}

impl std::fmt::Debug for RedisLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLocks")
            .field("owner", &self.owner)
            .field("grants", &self.grants)
            .finish_non_exhaustive()
    }
}

/// A key this client set: deleting it (if it still holds the value) releases the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisGrant {
    pub key: String,
    pub value: String,
}

impl RedisLocks {
    /// Connects to Redis at `address` (`HOST:PORT`, optionally `/DB`); its locks expire `ttl`
    /// after they are taken.
    pub async fn connect(address: &str, ttl: Duration) -> anyhow::Result<RedisLocks> {
        let client = redis::Client::open(format!("redis://{address}"))
            .with_context(|| format!("invalid redis address {address:?}"))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("cannot connect to redis at {address}"))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(RedisLocks {
            conn,
            owner: format!("{}-{nanos}-{n}", std::process::id()),
            grants: 0,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1),
            release: redis::Script::new(RELEASE_SCRIPT),
        })
    }

    /// Takes `lock`: sets its key if it is free, and tries again after [`RETRY_PAUSE`] while it
    /// is not.
    pub async fn acquire(&mut self, lock: &str) -> anyhow::Result<RedisGrant> {
        self.grants += 1;
        let value = format!("{}:{}", self.owner, self.grants);
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(lock)
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(self.ttl_ms)
                .query_async(&mut self.conn)
                .await
                .with_context(|| format!("redis SET {lock} NX"))?;
            if set.is_some() {
                return Ok(RedisGrant {
                    key: lock.to_string(),
                    value,
                });
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Releases `grant`: deletes its key if it still holds the grant's value. Whether it did:
    /// false means the key had expired (and perhaps been taken by another client).
    pub async fn release(&mut self, grant: &RedisGrant) -> anyhow::Result<bool> {
        let deleted: i64 = self
            .release
            .key(&grant.key)
            .arg(&grant.value)
            .invoke_async(&mut self.conn)
            .await
            .with_context(|| format!("redis delete-if-value-matches {}", grant.key))?;
        Ok(deleted == 1)
    }
}
