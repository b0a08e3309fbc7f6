//! What a benchmark drives: a Palisade lock service (through the client library, as an
//! application would), etcd (through its v3 lease and lock services, as `etcdctl lock` does),
//! ZooKeeper (its standard lock recipe, [`crate::zookeeper`]) or Redis (`SET NX PX`, the unsafe
//! reference point, [`crate::redis_lock`]).
//!
//! Each benchmark client owns one [`LockConn`]: its own connection and its own session (Palisade,
//! ZooKeeper), lease (etcd) or key TTL (Redis), opened before the clock starts and closed after
//! it stops.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, anyhow};
use palisade_client::{AcquireOptions, Client, LockGuard, Session, SessionOptions, Wait};
use tonic::transport::{Channel, Endpoint};

use crate::etcdserverpb::lease_client::LeaseClient;
use crate::etcdserverpb::{LeaseGrantRequest, LeaseRevokeRequest};
use crate::redis_lock::{RedisGrant, RedisLocks};
use crate::v3lockpb::lock_client::LockClient;
use crate::v3lockpb::{LockRequest, UnlockRequest};
use crate::zookeeper::{ZkGrant, ZkSession};

/// A service to benchmark: `palisade://HOST:PORT`, `etcd://HOST:PORT`, `zk://HOST:PORT` or
/// `redis://HOST:PORT`. A Palisade address may be a comma-separated list of a cluster's members:
/// its clients follow the leader. The others name one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Palisade {
        address: String,
    },
    Etcd {
        address: String,
    },
    ZooKeeper {
        address: String,
    },
    /// Unsafe: no fencing token, nothing durable.
    Redis {
        address: String,
    },
}

/// The schemes [`Target`] accepts, for error messages.
const SCHEMES: &str = "palisade://, etcd://, zk:// or redis://";

impl Target {
    /// The service's kind, as the report's column header names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Palisade { .. } => "palisade",
            Target::Etcd { .. } => "etcd",
            Target::ZooKeeper { .. } => "zookeeper",
            Target::Redis { .. } => "redis",
        }
    }

    /// The scheme of its `SCHEME://HOST:PORT` form.
    fn scheme(&self) -> &'static str {
        match self {
            Target::ZooKeeper { .. } => "zk",
            _ => self.kind(),
        }
    }

    pub fn address(&self) -> &str {
        match self {
            Target::Palisade { address }
            | Target::Etcd { address }
            | Target::ZooKeeper { address }
            | Target::Redis { address } => address,
        }
    }

    /// Whether its grants carry a fencing token and survive a crash of the service: false for
    /// Redis, which the report labels unsafe.
    pub fn is_safe(&self) -> bool {
        !matches!(self, Target::Redis { .. })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme(), self.address())
    }
}

impl FromStr for Target {
    type Err = String;

    fn from_str(text: &str) -> Result<Target, String> {
        let (scheme, address) = text.split_once("://").ok_or_else(|| {
            format!("invalid target {text:?}: expected SCHEME://HOST:PORT, the scheme {SCHEMES}")
        })?;
        let address = address.trim_end_matches('/');
        if address.is_empty() || !address.contains(':') {
            return Err(format!(
                "invalid target {text:?}: name a host and a port, e.g. {scheme}://127.0.0.1:2379"
            ));
        }
        if scheme != "palisade" && address.contains(',') {
            return Err(format!(
                "invalid target {text:?}: only a palisade:// target may list several members"
            ));
        }
        let address = address.to_string();
        match scheme {
            "palisade" => Ok(Target::Palisade { address }),
            "etcd" => Ok(Target::Etcd { address }),
            "zk" | "zookeeper" => Ok(Target::ZooKeeper { address }),
            "redis" => Ok(Target::Redis { address }),
            _ => Err(format!(
                "invalid target {text:?}: the scheme must be {SCHEMES}"
            )),
        }
    }
}

/// TLS to palisade targets (the global `--tls-ca`, `--tls-cert`, `--tls-key`), set once by
/// [`crate::bench::run`]: every benchmark client of the process uses it.
static TLS: std::sync::OnceLock<palisade_tls::ClientTls> = std::sync::OnceLock::new();

/// Connects palisade targets with `tls` from now on (once; later calls are ignored).
pub fn set_tls(tls: palisade_tls::ClientTls) {
    let _ = TLS.set(tls);
}

/// One benchmark client's connection and session (or lease).
#[derive(Debug)]
pub enum LockConn {
    Palisade { session: Session },
    Etcd(Box<EtcdConn>),
    ZooKeeper(Box<ZkSession>),
    Redis(Box<RedisLocks>),
}

/// An etcd connection and the lease its locks are attached to.
#[derive(Debug)]
pub struct EtcdConn {
    leases: LeaseClient<Channel>,
    locks: LockClient<Channel>,
    lease: i64,
}

/// A lock held through a [`LockConn`].
#[derive(Debug)]
pub enum Held {
    Palisade(LockGuard),
    /// The key etcd created for this holder; deleting it releases the lock.
    Etcd(Vec<u8>),
    ZooKeeper(ZkGrant),
    Redis(RedisGrant),
}

impl Held {
    /// The grant's fencing token, where this client reads one: Palisade's token and ZooKeeper's
    /// node creation zxid. etcd's (the key's create revision) is not read here; Redis has none.
    pub fn token(&self) -> Option<u64> {
        match self {
            Held::Palisade(guard) => Some(guard.token().get()),
            Held::ZooKeeper(grant) => u64::try_from(grant.czxid).ok(),
            Held::Etcd(_) | Held::Redis(_) => None,
        }
    }
}

/// How a benchmark client holds its lock: alone (every target), or as one reader of a shared
/// phase or one permit of a semaphore of this many permits (Palisade only, `bench modes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    Exclusive,
    Shared,
    Permit(u32),
}

/// How the benchmark's clients connect to Palisade: with the bearer token in
/// `PALISADE_AUTH_TOKEN`, if set (a service with `--tokens` and `--policy`).
fn options() -> anyhow::Result<palisade_client::ClientOptions> {
    let bearer_token = match std::env::var(palisade_client::AUTH_TOKEN_ENV) {
        Ok(token) => Some(
            palisade_client::BearerToken::new(&token)
                .map_err(|e| anyhow::anyhow!("${}: {e}", palisade_client::AUTH_TOKEN_ENV))?,
        ),
        Err(_) => None,
    };
    Ok(palisade_client::ClientOptions {
        bearer_token,
        ..Default::default()
    })
}

impl LockConn {
    /// Connects and opens a session (or lease) that lasts at least `ttl` without traffic.
    pub async fn open(target: &Target, ttl: Duration) -> anyhow::Result<LockConn> {
        match target {
            Target::Palisade { address } => {
                let mut options = options()?;
                let endpoint = match TLS.get() {
                    None => format!("http://{address}"),
                    Some(tls) => {
                        options.tls = Some(tls.clone());
                        address.to_string()
                    }
                };
                let client = Client::connect_with(&endpoint, options)
                    .await
                    .with_context(|| format!("cannot connect to {target}"))?;
                let session = client
                    .open_session(SessionOptions::with_ttl(ttl))
                    .await
                    .with_context(|| format!("cannot open a session on {target}"))?;
                Ok(LockConn::Palisade { session })
            }
            Target::Etcd { address } => {
                let channel = Endpoint::from_shared(format!("http://{address}"))?
                    .tcp_nodelay(true)
                    .connect_timeout(Duration::from_secs(5))
                    .connect()
                    .await
                    .with_context(|| format!("cannot connect to {target}"))?;
                let mut leases = LeaseClient::new(channel.clone());
                // etcd keeps a lease alive for its TTL; the benchmark renews nothing, so the
                // lease is as long as the session would be.
                let ttl_s = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
                let granted = leases
                    .lease_grant(LeaseGrantRequest { ttl: ttl_s, id: 0 })
                    .await
                    .with_context(|| format!("cannot grant a lease on {target}"))?
                    .into_inner();
                if !granted.error.is_empty() || granted.id == 0 {
                    return Err(anyhow!("etcd refused a lease: {:?}", granted.error));
                }
                Ok(LockConn::Etcd(Box::new(EtcdConn {
                    leases,
                    locks: LockClient::new(channel),
                    lease: granted.id,
                })))
            }
            Target::ZooKeeper { address } => {
                let session = ZkSession::connect(address, ttl)
                    .await
                    .with_context(|| format!("cannot open a session on {target}"))?;
                Ok(LockConn::ZooKeeper(Box::new(session)))
            }
            Target::Redis { address } => {
                let locks = RedisLocks::connect(address, ttl).await?;
                Ok(LockConn::Redis(Box::new(locks)))
            }
        }
    }

    /// Takes `lock`, waiting in line behind any holder.
    pub async fn acquire(&mut self, lock: &str) -> anyhow::Result<Held> {
        self.acquire_as(lock, Hold::Exclusive).await
    }

    /// Takes `lock` as `hold` says, waiting in line; a reader or a permit on Palisade only.
    pub async fn acquire_as(&mut self, lock: &str, hold: Hold) -> anyhow::Result<Held> {
        if hold != Hold::Exclusive && !matches!(self, LockConn::Palisade { .. }) {
            return Err(anyhow!(
                "only a palisade:// target has read-write locks and semaphores"
            ));
        }
        match self {
            LockConn::Palisade { session } => {
                let options = AcquireOptions::wait(Wait::Forever);
                let options = match hold {
                    Hold::Exclusive => options,
                    Hold::Shared => options.shared(),
                    Hold::Permit(permits) => options.permits(permits),
                };
                Ok(Held::Palisade(session.acquire(lock, options).await?))
            }
            LockConn::Etcd(etcd) => {
                let lease = etcd.lease;
                let response = etcd
                    .locks
                    .lock(LockRequest {
                        name: lock.as_bytes().to_vec(),
                        lease,
                    })
                    .await?
                    .into_inner();
                Ok(Held::Etcd(response.key))
            }
            LockConn::ZooKeeper(session) => Ok(Held::ZooKeeper(session.acquire(lock).await?)),
            LockConn::Redis(locks) => Ok(Held::Redis(locks.acquire(lock).await?)),
        }
    }

    /// Gives `held` up and takes the same lock again in one call (Palisade's
    /// `ReleaseThenAcquire`, a handoff to itself): the new grant, with a new token.
    pub async fn handoff(&mut self, held: Held) -> anyhow::Result<Held> {
        match (self, held) {
            (LockConn::Palisade { .. }, Held::Palisade(guard)) => {
                let lock = guard.lock().to_string();
                let options = AcquireOptions::wait(Wait::Forever);
                Ok(Held::Palisade(
                    guard.release_then_acquire(&lock, options).await?,
                ))
            }
            _ => Err(anyhow!(
                "only a palisade:// target releases and acquires in one call"
            )),
        }
    }

    /// Gives up a lock taken with [`LockConn::acquire`].
    pub async fn release(&mut self, held: Held) -> anyhow::Result<()> {
        match (self, held) {
            (LockConn::Palisade { .. }, Held::Palisade(guard)) => Ok(guard.release().await?),
            (LockConn::Etcd(etcd), Held::Etcd(key)) => {
                etcd.locks.unlock(UnlockRequest { key }).await?;
                Ok(())
            }
            (LockConn::ZooKeeper(session), Held::ZooKeeper(grant)) => session.release(&grant).await,
            (LockConn::Redis(locks), Held::Redis(grant)) => {
                if locks.release(&grant).await? {
                    Ok(())
                } else {
                    Err(anyhow!(
                        "redis key {} had expired before its release: the lock was lost",
                        grant.key
                    ))
                }
            }
            _ => Err(anyhow!(
                "a lock held through one kind of target was released on another"
            )),
        }
    }

    /// Ends the session (or revokes the lease), best effort.
    pub async fn close(self) {
        match self {
            LockConn::Palisade { session } => {
                let _ = session.close().await;
            }
            LockConn::Etcd(mut etcd) => {
                let id = etcd.lease;
                let _ = etcd.leases.lease_revoke(LeaseRevokeRequest { id }).await;
            }
            LockConn::ZooKeeper(session) => {
                let _ = session.close().await;
            }
            // Its keys are released one by one; the connection closes when dropped.
            LockConn::Redis(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_their_scheme_and_refuse_anything_else() {
        assert_eq!(
            "palisade://127.0.0.1:7457".parse(),
            Ok(Target::Palisade {
                address: "127.0.0.1:7457".into()
            })
        );
        assert_eq!(
            "etcd://localhost:2379/".parse(),
            Ok(Target::Etcd {
                address: "localhost:2379".into()
            })
        );
        // A cluster's members, for a client that follows the leader.
        let cluster: Target = "palisade://127.0.0.1:7001,127.0.0.1:7002".parse().unwrap();
        assert_eq!(cluster.address(), "127.0.0.1:7001,127.0.0.1:7002");
        assert_eq!(
            cluster.to_string(),
            "palisade://127.0.0.1:7001,127.0.0.1:7002"
        );
        assert_eq!(
            "zk://127.0.0.1:2181".parse(),
            Ok(Target::ZooKeeper {
                address: "127.0.0.1:2181".into()
            })
        );
        let redis: Target = "redis://127.0.0.1:6379/".parse().unwrap();
        assert_eq!(redis.to_string(), "redis://127.0.0.1:6379");
        assert!(!redis.is_safe());
        assert_eq!(
            "zk://localhost:2181".parse::<Target>().unwrap().to_string(),
            "zk://localhost:2181"
        );
        // One server only, for the targets whose clients here connect to one.
        assert!("zk://127.0.0.1:1,127.0.0.1:2".parse::<Target>().is_err());
        assert!("http://127.0.0.1:1".parse::<Target>().is_err());
        assert!("127.0.0.1:7457".parse::<Target>().is_err());
        assert!("etcd://".parse::<Target>().is_err());
    }
}
