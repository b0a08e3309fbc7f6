//! The adapters of `palisade-fence` against a replicated lock service, as a user's application
//! runs them: a three-node cluster of `palisade serve` processes, and in this process one
//! resource per backend (PostgreSQL, MySQL/MariaDB, SQLite, Redis), each with its own
//! [`Verifier`] built from what `palisade pubkey` printed, claiming and writing with the
//! sequencers `palisade acquire` printed.
//!
//! - Grants taken through successive leaders (each leader `kill -9`ed after its grant, and
//!   started again later) are accepted at every backend by a verifier configured once, and an
//!   older grant presented after a newer one is refused there as stale, writing nothing.
//! - A planned key rotation (`keys add`, every verifier given the new set, `keys rotate`,
//!   `keys retire`, every verifier given the set of one key): the new key's grants are accepted
//!   everywhere, and once the old key is dropped a grant of it that was never presented is
//!   refused everywhere as forged, naming the key, and writes nothing.
//!
//! A backend whose `PALISADE_TEST_*` variable is unset is skipped with one line on stderr;
//! SQLite needs no server and always runs.

use std::io::Write as _;
use std::time::Instant;

use mysql_async::prelude::Queryable as _;
use palisade_core::{SessionId, Token};
use palisade_fence::{
    FenceError, FenceState, RedisFence, RedisOp, Verifier, mysql, postgres, sqlite,
};
use palisade_sequencer::KeySet;
use palisade_testkit::{LocalCluster, Ran};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
/// The lock whose grants every resource's scope takes.
const LOCK: &str = "doc";
/// A lock whose grant is taken and released but never presented until the end.
const SPARE: &str = "spare";
/// Grants taken in the failover test, each through another leader.
const ROUNDS: usize = 3;

// ----- the lock service, through the `palisade` command -----

/// One grant as `palisade acquire` printed it.
#[derive(Debug, Clone)]
struct Grant {
    lock: String,
    token: u64,
    sequencer: String,
    session: u64,
    /// What acts for the session: `PALISADE_SESSION`, `<id>.<secret>`.
    credential: String,
}

/// `palisade acquire LOCK` at `endpoints`, parsed from its `KEY=VALUE` lines.
fn acquire(cluster: &LocalCluster, endpoints: &str, lock: &str) -> Grant {
    let printed = cluster
        .palisade(endpoints, &["acquire", lock, "--ttl", "30s"])
        .key_values();
    Grant {
        lock: lock.to_owned(),
        token: printed["PALISADE_TOKEN"].parse().expect("a token"),
        sequencer: printed["PALISADE_SEQUENCER"].clone(),
        session: printed["PALISADE_SESSION"]
            .split_once('.')
            .and_then(|(id, _)| id.parse().ok())
            .expect("PALISADE_SESSION is <id>.<secret>"),
        credential: printed["PALISADE_SESSION"].clone(),
    }
}

/// `palisade release`, so the next grant of the lock is a new one.
fn release(cluster: &LocalCluster, endpoints: &str, grant: &Grant) {
    cluster
        .palisade(
            endpoints,
            &["release", &grant.lock, "--session", &grant.credential],
        )
        .expect_success();
}

/// What `palisade pubkey` prints, read as a resource reads it.
fn published_keys(cluster: &LocalCluster, endpoints: &str) -> KeySet {
    let ran = cluster.palisade(endpoints, &["pubkey"]);
    ran.expect_success();
    ran.stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("`palisade pubkey` printed {:?}: {e}", ran.stdout))
}

fn key_ids(keys: &KeySet) -> Vec<String> {
    keys.keys().iter().map(|key| key.id().to_string()).collect()
}

/// The key id a sequencer names: its second field.
fn key_id_of(sequencer: &str) -> String {
    sequencer
        .split('.')
        .nth(1)
        .expect("a key id field")
        .to_owned()
}

fn expect_success(ran: Ran) -> Ran {
    ran.expect_success();
    ran
}

// ----- the resources, through `palisade-fence` -----

/// A name no other test run uses, for tables, scopes and keys on shared servers.
fn unique(prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_nanos();
    format!("{prefix}_{}_{nanos}_{count}", std::process::id())
}

/// Says that a backend did not run, past the harness's output capture.
fn skip(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

fn env_url(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|url| !url.is_empty())
}

/// Where one resource keeps its data and its fence.
enum Backend {
    /// A table `table (id, scope, token)` beside the shared `palisade_fence`.
    Postgres {
        client: tokio_postgres::Client,
        table: String,
    },
    /// The same table, InnoDB.
    Mysql {
        conn: mysql_async::Conn,
        table: String,
    },
    /// A table `writes (id, scope, token)` in a database file of its own.
    Sqlite {
        conn: rusqlite::Connection,
        _dir: tempfile::TempDir,
    },
    /// A list per scope under `prefix`, fenced by hashes under `prefix:fence:`.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        fence: RedisFence,
        prefix: String,
    },
}

/// One protected resource of the application, with its own verifier.
struct Resource {
    name: &'static str,
    verifier: Verifier,
    backend: Backend,
    /// Prefixes the scopes, which share the `palisade_fence` tables with other test runs.
    tag: String,
}

impl Resource {
    /// Every backend whose server is configured, each with a [`Verifier`] of `keys`.
    async fn connect_all(test: &str, keys: &KeySet) -> Vec<Resource> {
        let mut resources = Vec::new();
        let tag = |name: &str| unique(&format!("across_{name}"));

        match env_url("PALISADE_TEST_POSTGRES") {
            None => skip(&format!(
                "SKIP: PALISADE_TEST_POSTGRES not set; the PostgreSQL adapter did not run in adapters_across_leaders ({test})"
            )),
            Some(url) => {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect to PostgreSQL");
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        eprintln!("postgresql connection ended: {error}");
                    }
                });
                postgres::ensure_schema(&client).await.unwrap();
                let table = tag("pg");
                client
                    .batch_execute(&format!(
                        "CREATE TABLE {table} (id bigserial PRIMARY KEY, scope text NOT NULL, \
                         token bigint NOT NULL)"
                    ))
                    .await
                    .unwrap();
                resources.push(Resource {
                    name: "postgresql",
                    verifier: Verifier::new(keys.clone()),
                    tag: table.clone(),
                    backend: Backend::Postgres { client, table },
                });
            }
        }

        match env_url("PALISADE_TEST_MYSQL") {
            None => skip(&format!(
                "SKIP: PALISADE_TEST_MYSQL not set; the MySQL/MariaDB adapter did not run in adapters_across_leaders ({test})"
            )),
            Some(url) => {
                let mut conn = mysql_async::Conn::from_url(url.as_str())
                    .await
                    .expect("connect to MySQL/MariaDB");
                mysql::ensure_schema(&mut conn).await.unwrap();
                let table = tag("my");
                conn.query_drop(format!(
                    "CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                     scope VARCHAR(600) NOT NULL, token BIGINT NOT NULL) ENGINE = InnoDB"
                ))
                .await
                .unwrap();
                resources.push(Resource {
                    name: "mysql",
                    verifier: Verifier::new(keys.clone()),
                    tag: table.clone(),
                    backend: Backend::Mysql { conn, table },
                });
            }
        }

        let dir = tempfile::tempdir().unwrap();
        let conn = rusqlite::Connection::open(dir.path().join("app.sqlite")).unwrap();
        sqlite::ensure_schema(&conn).unwrap();
        conn.execute_batch(
            "CREATE TABLE writes (id INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL, \
             token INTEGER NOT NULL)",
        )
        .unwrap();
        resources.push(Resource {
            name: "sqlite",
            verifier: Verifier::new(keys.clone()),
            tag: tag("lite"),
            backend: Backend::Sqlite { conn, _dir: dir },
        });

        match env_url("PALISADE_TEST_REDIS") {
            None => skip(&format!(
                "SKIP: PALISADE_TEST_REDIS not set; the Redis adapter did not run in adapters_across_leaders ({test})"
            )),
            Some(url) => {
                let conn = redis::Client::open(url)
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect to Redis");
                let prefix = tag("redis");
                resources.push(Resource {
                    name: "redis",
                    verifier: Verifier::new(keys.clone()),
                    tag: prefix.clone(),
                    backend: Backend::Redis {
                        conn,
                        fence: RedisFence::new().with_key_prefix(format!("{prefix}:fence:")),
                        prefix,
                    },
                });
            }
        }
        resources
    }

    fn scope(&self, lock: &str) -> String {
        format!("{}/{lock}", self.tag)
    }

    /// What the application does with a presented sequencer: verify it, claim the lock's scope
    /// and record the token in the same transaction (or script), and commit.
    async fn write(&mut self, lock: &str, presented: &str) -> Result<(), FenceError> {
        let scope = self.scope(lock);
        let sequencer = self.verifier.verify(Some(presented))?;
        let token = i64::try_from(sequencer.token().get()).expect("tokens fit in an i64");
        match &mut self.backend {
            Backend::Postgres { client, table } => {
                let txn = client.transaction().await.unwrap();
                postgres::claim(&txn, &scope, &sequencer).await?;
                txn.execute(
                    &format!("INSERT INTO {table} (scope, token) VALUES ($1, $2)"),
                    &[&scope, &token],
                )
                .await
                .unwrap();
                postgres::commit(txn).await
            }
            Backend::Mysql { conn, table } => {
                let mut txn = conn
                    .start_transaction(mysql_async::TxOpts::default())
                    .await
                    .unwrap();
                mysql::claim(&mut txn, &scope, &sequencer).await?;
                txn.exec_drop(
                    format!("INSERT INTO {table} (scope, token) VALUES (?, ?)"),
                    (scope.as_str(), token),
                )
                .await
                .unwrap();
                mysql::commit(txn).await
            }
            Backend::Sqlite { conn, .. } => {
                let txn = sqlite::begin(conn)?;
                sqlite::claim(&txn, &scope, &sequencer)?;
                txn.execute(
                    "INSERT INTO writes (scope, token) VALUES (?1, ?2)",
                    (scope.as_str(), token),
                )
                .unwrap();
                txn.commit().unwrap();
                Ok(())
            }
            Backend::Redis {
                conn,
                fence,
                prefix,
            } => {
                let list = format!("{prefix}:writes:{scope}");
                fence
                    .write(
                        conn,
                        &scope,
                        &sequencer,
                        &[RedisOp::rpush(list, token.to_string())],
                    )
                    .await
                    .map(drop)
            }
        }
    }

    /// The fence state the resource stored for `lock`'s scope.
    async fn accepted(&mut self, lock: &str) -> Option<FenceState> {
        let scope = self.scope(lock);
        match &mut self.backend {
            Backend::Postgres { client, .. } => postgres::fence_state(client, &scope).await,
            Backend::Mysql { conn, .. } => mysql::fence_state(conn, &scope).await,
            Backend::Sqlite { conn, .. } => sqlite::fence_state(conn, &scope),
            Backend::Redis { conn, fence, .. } => fence.fence_state(conn, &scope).await,
        }
        .unwrap_or_else(|e| panic!("{}: reading the fence state: {e}", self.name))
    }

    /// The tokens written to `lock`'s scope, in the order they were committed.
    async fn written(&mut self, lock: &str) -> Vec<u64> {
        let scope = self.scope(lock);
        let tokens: Vec<i64> = match &mut self.backend {
            Backend::Postgres { client, table } => client
                .query(
                    &format!("SELECT token FROM {table} WHERE scope = $1 ORDER BY id"),
                    &[&scope],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect(),
            Backend::Mysql { conn, table } => conn
                .exec(
                    format!("SELECT token FROM {table} WHERE scope = ? ORDER BY id"),
                    (scope.as_str(),),
                )
                .await
                .unwrap(),
            Backend::Sqlite { conn, .. } => conn
                .prepare("SELECT token FROM writes WHERE scope = ?1 ORDER BY id")
                .unwrap()
                .query_map([scope.as_str()], |row| row.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap(),
            Backend::Redis { conn, prefix, .. } => {
                let values: Vec<String> = redis::cmd("LRANGE")
                    .arg(format!("{prefix}:writes:{scope}"))
                    .arg(0)
                    .arg(-1)
                    .query_async(conn)
                    .await
                    .unwrap();
                values.iter().map(|v| v.parse().unwrap()).collect()
            }
        };
        tokens.into_iter().map(|t| t as u64).collect()
    }

    /// Removes what the test left on the shared servers.
    async fn clean_up(self, locks: &[&str]) {
        let scopes: Vec<String> = locks.iter().map(|lock| self.scope(lock)).collect();
        match self.backend {
            Backend::Postgres { client, table } => {
                client
                    .batch_execute(&format!("DROP TABLE {table}"))
                    .await
                    .unwrap();
                client
                    .execute(
                        "DELETE FROM palisade_fence WHERE scope = ANY($1)",
                        &[&scopes],
                    )
                    .await
                    .unwrap();
            }
            Backend::Mysql { mut conn, table } => {
                conn.query_drop(format!("DROP TABLE {table}"))
                    .await
                    .unwrap();
                for scope in &scopes {
                    conn.exec_drop(
                        "DELETE FROM palisade_fence WHERE scope = ?",
                        (scope.as_bytes(),),
                    )
                    .await
                    .unwrap();
                }
                conn.disconnect().await.unwrap();
            }
            Backend::Sqlite { .. } => {}
            Backend::Redis {
                mut conn,
                fence,
                prefix,
            } => {
                let mut keys: Vec<String> = scopes.iter().map(|s| fence.fence_key(s)).collect();
                keys.extend(scopes.iter().map(|s| format!("{prefix}:writes:{s}")));
                let _: () = redis::cmd("DEL")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The state a resource stores once `grant` was accepted.
fn accepted_state(grant: &Grant) -> Option<FenceState> {
    Some(FenceState {
        lock: grant.lock.clone(),
        token_max: Token::new(grant.token),
        holder_session: SessionId::new(grant.session),
    })
}

/// `grant` is accepted at `resource`: the claim succeeds, the token advances to it, and the
/// write lands after the ones of `before`.
async fn assert_accepted(resource: &mut Resource, grant: &Grant, before: &[&Grant], what: &str) {
    let name = resource.name;
    resource
        .write(&grant.lock, &grant.sequencer)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{name}: {what}: token {} refused ({}): {e}",
                grant.token,
                e.kind()
            )
        });
    assert_eq!(
        resource.accepted(&grant.lock).await,
        accepted_state(grant),
        "{name}: {what}"
    );
    let expected: Vec<u64> = before.iter().chain([&grant]).map(|g| g.token).collect();
    assert_eq!(
        resource.written(&grant.lock).await,
        expected,
        "{name}: {what}"
    );
}

/// `older` is refused at `resource` as stale, since `newest` was accepted; nothing changes.
async fn assert_stale(resource: &mut Resource, older: &Grant, newest: &Grant, what: &str) {
    let name = resource.name;
    let written = resource.written(&older.lock).await;
    let refused = resource
        .write(&older.lock, &older.sequencer)
        .await
        .expect_err("an older grant's write after a newer one");
    assert_eq!(refused.kind(), "stale", "{name}: {what}: {refused}");
    assert_eq!(
        refused,
        FenceError::Stale {
            lock: newest.lock.clone(),
            presented: Token::new(older.token),
            accepted: Token::new(newest.token),
            holder_session: Some(SessionId::new(newest.session)),
        },
        "{name}: {what}"
    );
    assert_eq!(
        resource.accepted(&older.lock).await,
        accepted_state(newest),
        "{name}: {what}"
    );
    assert_eq!(
        resource.written(&older.lock).await,
        written,
        "{name}: {what}: the stale write landed"
    );
}

#[test]
fn every_adapter_accepts_the_grants_of_successive_leaders_and_refuses_older_ones() {
    let started = Instant::now();
    let runtime = runtime();
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = cluster.endpoints();
    // Each resource is configured once, before any failover.
    let keys = published_keys(&cluster, &endpoints);
    assert_eq!(key_ids(&keys).len(), 1, "one key before any rotation");
    let cluster_key = key_ids(&keys).remove(0);
    let mut resources =
        runtime.block_on(Resource::connect_all("the successive leaders test", &keys));

    let mut grants: Vec<Grant> = Vec::new();
    let mut leaders: Vec<u64> = Vec::new();
    let mut down: Option<u64> = None;
    for round in 0..ROUNDS {
        let leader = cluster.leader();
        if let Some(&previous) = leaders.last() {
            assert_ne!(leader, previous, "round {round}: the killed leader leads");
        }
        leaders.push(leader);
        let address = cluster.nodes[&leader].address();
        let grant = acquire(&cluster, &address, LOCK);
        release(&cluster, &address, &grant);
        assert_eq!(
            key_id_of(&grant.sequencer),
            cluster_key,
            "round {round}: node {leader} signs with the cluster's key"
        );
        if let Some(last) = grants.last() {
            assert!(
                grant.token > last.token,
                "round {round}: token {} after {}",
                grant.token,
                last.token
            );
        }

        for resource in &mut resources {
            runtime.block_on(async {
                let what = format!("round {round}, node {leader}'s grant");
                let before: Vec<&Grant> = grants.iter().collect();
                assert_accepted(resource, &grant, &before, &what).await;
                for older in &grants {
                    let what = format!("round {round}, token {} presented again", older.token);
                    assert_stale(resource, older, &grant, &what).await;
                }
            });
        }
        grants.push(grant);

        if round + 1 < ROUNDS {
            // The node killed last round comes back first, so two of three keep serving.
            if let Some(id) = down.take() {
                cluster.node(id).process.start();
            }
            cluster.node(leader).process.kill9();
            down = Some(leader);
        }
    }
    if let Some(id) = down {
        cluster.node(id).process.start();
    }

    let names: Vec<&str> = resources.iter().map(|r| r.name).collect();
    runtime.block_on(async {
        for resource in resources {
            resource.clean_up(&[LOCK]).await;
        }
    });
    eprintln!(
        "grants through leaders {leaders:?} at {names:?} in {:?}",
        started.elapsed()
    );
}

#[test]
fn a_key_rotation_keeps_every_adapter_verifying_and_a_retired_keys_grant_is_forged() {
    let started = Instant::now();
    let runtime = runtime();
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = cluster.endpoints();
    let founding_keys = published_keys(&cluster, &endpoints);
    let founding = key_ids(&founding_keys);
    assert_eq!(founding.len(), 1, "one key before any rotation");
    let founding = founding[0].clone();
    let mut resources = runtime.block_on(Resource::connect_all(
        "the key rotation test",
        &founding_keys,
    ));

    // A founding-key grant written everywhere, and one of another lock never presented.
    let before = acquire(&cluster, &endpoints, LOCK);
    assert_eq!(key_id_of(&before.sequencer), founding);
    let spare = acquire(&cluster, &endpoints, SPARE);
    release(&cluster, &endpoints, &spare);
    for resource in &mut resources {
        runtime.block_on(assert_accepted(resource, &before, &[], "the founding key"));
    }

    // 1. A new key is published; every resource takes the new set before it signs.
    let added = expect_success(cluster.palisade(&endpoints, &["keys", "add"]));
    let both = published_keys(&cluster, &endpoints);
    let mut ids = key_ids(&both);
    assert_eq!(ids.len(), 2, "{both}");
    assert!(ids.contains(&founding), "{both}");
    ids.retain(|id| *id != founding);
    let new_key = ids.remove(0);
    assert!(added.stdout.contains(&new_key), "{}", added.stdout);
    for resource in &resources {
        resource.verifier.set_keys(both.clone());
    }

    // 2. The new key signs: its grants are accepted everywhere, and the founding key's grant,
    //    still trusted, is refused only as stale.
    release(&cluster, &endpoints, &before);
    let rotated = expect_success(cluster.palisade(&endpoints, &["keys", "rotate"]));
    assert!(rotated.stdout.contains(&new_key), "{}", rotated.stdout);
    let after = acquire(&cluster, &endpoints, LOCK);
    assert_eq!(key_id_of(&after.sequencer), new_key, "the new key signs");
    assert!(after.token > before.token);
    for resource in &mut resources {
        runtime.block_on(async {
            assert_accepted(resource, &after, &[&before], "the rotated key").await;
            assert_stale(resource, &before, &after, "the founding key's grant").await;
        });
    }
    release(&cluster, &endpoints, &after);

    // 3. The founding key is retired; every resource takes the set of one key.
    expect_success(cluster.palisade(&endpoints, &["keys", "retire", &founding]));
    let only_new = published_keys(&cluster, &endpoints);
    assert_eq!(
        key_ids(&only_new),
        std::slice::from_ref(&new_key),
        "{only_new}"
    );
    for resource in &resources {
        resource.verifier.set_keys(only_new.clone());
    }
    // The spare grant is genuine (it verifies with the key it was signed with) and its scope
    // has seen no other grant: only the resource's trust refuses it.
    founding_keys
        .verify(&spare.sequencer)
        .expect("the spare grant is genuine");
    let last = acquire(&cluster, &endpoints, LOCK);
    assert_eq!(key_id_of(&last.sequencer), new_key);
    for resource in &mut resources {
        runtime.block_on(async {
            let name = resource.name;
            let refused = resource
                .write(SPARE, &spare.sequencer)
                .await
                .expect_err("a retired key's grant");
            assert_eq!(refused.kind(), "forged", "{name}: {refused}");
            let FenceError::Forged { message } = &refused else {
                panic!("{name}: {refused:?}");
            };
            assert!(message.contains(&founding), "{name}: {message}");
            assert_eq!(resource.accepted(SPARE).await, None, "{name}");
            assert_eq!(resource.written(SPARE).await, Vec::<u64>::new(), "{name}");
            // The new key alone still verifies.
            assert_accepted(resource, &last, &[&before, &after], "after the retirement").await;
        });
    }

    let names: Vec<&str> = resources.iter().map(|r| r.name).collect();
    runtime.block_on(async {
        for resource in resources {
            resource.clean_up(&[LOCK, SPARE]).await;
        }
    });
    eprintln!(
        "a rotation from {founding} to {new_key} at {names:?} in {:?}",
        started.elapsed()
    );
}
