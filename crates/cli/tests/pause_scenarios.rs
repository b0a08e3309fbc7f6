//! The failure fencing exists for, with real processes: a holder is frozen (`SIGSTOP`) past its
//! lease, another client takes the lock and writes, the first is thawed (`SIGCONT`) and writes
//! with its old sequencer. Every resource — the fenced store and each adapter backend — must
//! refuse that write and keep the second holder's data, also when the resource or the lock
//! service restarted in between.
//!
//! The frozen holder is this test executable itself, re-run in child mode (`PAUSE_CHILD_DIR`
//! set): it opens a session with a one-second lease, acquires the lock, says it is ready, and
//! writes as soon as it is told to, without checking whether it still holds the lock — exactly
//! what a process resuming from a long GC pause does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use palisade_client::{AcquireOptions, Client, SessionOptions, Wait};
use palisade_fence::{FenceError, RedisFence, RedisOp, Verifier, postgres, sqlite};
use palisade_store::{StoreClient, StoreClientError, StoreError};
use palisade_testkit::{ServerProcess, locks_client};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const LOCK: &str = "reports/nightly";
const KEY: &str = "report";
const HOLDER_TTL: Duration = Duration::from_secs(1);

/// A resource the holders write `KEY` to, under the fence of `LOCK`.
#[derive(Debug, Clone)]
enum Resource {
    /// The fenced store at this base URL.
    Store(String),
    /// A PostgreSQL connection string and the (test-unique) table to write.
    Postgres { url: String, table: String },
    /// An SQLite database file.
    Sqlite(PathBuf),
    /// A Redis URL and the (test-unique) key prefix.
    Redis { url: String, prefix: String },
}

/// What a write came to.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Written,
    Stale { presented: u64, accepted: u64 },
    Failed(String),
}

impl Outcome {
    fn encode(&self) -> String {
        match self {
            Outcome::Written => "written".into(),
            Outcome::Stale {
                presented,
                accepted,
            } => format!("stale {presented} {accepted}"),
            Outcome::Failed(message) => format!("failed {message}"),
        }
    }

    fn decode(text: &str) -> Outcome {
        let mut words = text.split_whitespace();
        match words.next() {
            Some("written") => Outcome::Written,
            Some("stale") => Outcome::Stale {
                presented: words.next().unwrap().parse().unwrap(),
                accepted: words.next().unwrap().parse().unwrap(),
            },
            _ => Outcome::Failed(text.to_string()),
        }
    }
}

fn from_fence(result: Result<(), FenceError>) -> Outcome {
    match result {
        Ok(()) => Outcome::Written,
        Err(FenceError::Stale {
            presented,
            accepted,
            ..
        }) => Outcome::Stale {
            presented: presented.get(),
            accepted: accepted.get(),
        },
        Err(other) => Outcome::Failed(other.to_string()),
    }
}

impl Resource {
    /// Writes `value` to `KEY` through the resource's fence, as the holder of `sequencer`.
    async fn write(&self, public_key: &str, sequencer: &str, value: &str) -> Outcome {
        let verifier = Verifier::new(public_key.parse::<palisade_sequencer::KeySet>().unwrap());
        match self {
            Resource::Store(url) => {
                let client = StoreClient::new(url).unwrap();
                match client
                    .put(KEY, value.as_bytes(), Some(sequencer), None)
                    .await
                {
                    Ok(_) => Outcome::Written,
                    Err(StoreClientError::Store(StoreError::Stale {
                        presented,
                        accepted,
                        ..
                    })) => Outcome::Stale {
                        presented,
                        accepted,
                    },
                    Err(other) => Outcome::Failed(other.to_string()),
                }
            }
            Resource::Postgres { url, table } => {
                let verified = match verifier.verify(Some(sequencer)) {
                    Ok(v) => v,
                    Err(e) => return from_fence(Err(e)),
                };
                let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                let txn = client.transaction().await.unwrap();
                let checked = postgres::claim(&txn, table, &verified).await;
                if checked.is_ok() {
                    let sql = format!("UPDATE {table} SET body = $1 WHERE name = '{KEY}'");
                    txn.execute(&sql, &[&value]).await.unwrap();
                    txn.commit().await.unwrap();
                }
                from_fence(checked)
            }
            Resource::Sqlite(path) => {
                let verified = match verifier.verify(Some(sequencer)) {
                    Ok(v) => v,
                    Err(e) => return from_fence(Err(e)),
                };
                let mut connection = rusqlite::Connection::open(path).unwrap();
                let txn = sqlite::begin(&mut connection).unwrap();
                let checked = sqlite::claim(&txn, LOCK, &verified);
                if checked.is_ok() {
                    txn.execute("UPDATE reports SET body = ?1 WHERE name = ?2", (value, KEY))
                        .unwrap();
                    txn.commit().unwrap();
                }
                from_fence(checked)
            }
            Resource::Redis { url, prefix } => {
                let verified = match verifier.verify(Some(sequencer)) {
                    Ok(v) => v,
                    Err(e) => return from_fence(Err(e)),
                };
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut connection = client.get_multiplexed_async_connection().await.unwrap();
                let fence = RedisFence::new().with_key_prefix(format!("{prefix}fence:"));
                let op = RedisOp::set(format!("{prefix}{KEY}"), value.as_bytes().to_vec());
                let written = fence.write(&mut connection, LOCK, &verified, &[op]).await;
                from_fence(written.map(|_replies| ()))
            }
        }
    }

    /// The value of `KEY`, read directly from the resource.
    async fn read(&self) -> String {
        match self {
            Resource::Store(url) => {
                let entry = StoreClient::new(url)
                    .unwrap()
                    .get(KEY)
                    .await
                    .unwrap()
                    .expect("the key exists");
                String::from_utf8(entry.value).unwrap()
            }
            Resource::Postgres { url, table } => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                let sql = format!("SELECT body FROM {table} WHERE name = '{KEY}'");
                client.query_one(&sql, &[]).await.unwrap().get(0)
            }
            Resource::Sqlite(path) => rusqlite::Connection::open(path)
                .unwrap()
                .query_row("SELECT body FROM reports WHERE name = ?1", [KEY], |row| {
                    row.get(0)
                })
                .unwrap(),
            Resource::Redis { url, prefix } => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut connection = client.get_multiplexed_async_connection().await.unwrap();
                redis::cmd("GET")
                    .arg(format!("{prefix}{KEY}"))
                    .query_async(&mut connection)
                    .await
                    .unwrap()
            }
        }
    }
}

// ----- the frozen holder, run as a child process -----

#[test]
fn paused_holder_child() {
    let Some(dir) = std::env::var_os("PAUSE_CHILD_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let endpoint = std::env::var("PAUSE_ENDPOINT").unwrap();
    let public_key = std::env::var("PAUSE_PUBLIC_KEY").unwrap();
    let resource: Resource = decode_resource(&std::env::var("PAUSE_RESOURCE").unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let client = Client::connect(&endpoint).await.unwrap();
        let session = client
            .open_session(SessionOptions::with_ttl(HOLDER_TTL))
            .await
            .unwrap();
        let guard = session
            .acquire(
                LOCK,
                AcquireOptions::wait(Wait::For(Duration::from_secs(30))),
            )
            .await
            .unwrap();
        std::fs::write(dir.join("token"), guard.token().to_string()).unwrap();
        // Here the test freezes this process, long enough for the lease to run out.
        while !dir.join("go").exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let outcome = resource
            .write(
                &public_key,
                guard.sequencer(),
                "written by the paused holder A",
            )
            .await;
        std::fs::write(dir.join("outcome"), outcome.encode()).unwrap();
    });
}

fn encode_resource(resource: &Resource) -> String {
    match resource {
        Resource::Store(url) => format!("store|{url}"),
        Resource::Postgres { url, table } => format!("postgres|{url}|{table}"),
        Resource::Sqlite(path) => format!("sqlite|{}", path.display()),
        Resource::Redis { url, prefix } => format!("redis|{url}|{prefix}"),
    }
}

fn decode_resource(text: &str) -> Resource {
    let parts: Vec<&str> = text.split('|').collect();
    match parts[0] {
        "store" => Resource::Store(parts[1].into()),
        "postgres" => Resource::Postgres {
            url: parts[1].into(),
            table: parts[2].into(),
        },
        "sqlite" => Resource::Sqlite(parts[1].into()),
        "redis" => Resource::Redis {
            url: parts[1].into(),
            prefix: parts[2].into(),
        },
        other => panic!("unknown resource {other}"),
    }
}

/// The holder process, frozen and thawed by the test.
struct PausedHolder {
    child: Child,
    dir: PathBuf,
}

impl PausedHolder {
    /// Starts the holder and waits until it holds the lock; returns its token.
    fn start(
        dir: &Path,
        endpoint: &str,
        public_key: &str,
        resource: &Resource,
    ) -> (PausedHolder, u64) {
        std::fs::create_dir_all(dir).unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "paused_holder_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PAUSE_CHILD_DIR", dir)
            .env("PAUSE_ENDPOINT", endpoint)
            .env("PAUSE_PUBLIC_KEY", public_key)
            .env("PAUSE_RESOURCE", encode_resource(resource))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut holder = PausedHolder {
            child,
            dir: dir.to_path_buf(),
        };
        let started = Instant::now();
        let token = loop {
            if let Ok(text) = std::fs::read_to_string(dir.join("token")) {
                break text.parse().unwrap();
            }
            assert!(
                holder.child.try_wait().unwrap().is_none(),
                "the holder exited before acquiring"
            );
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the holder never acquired"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        holder.signal(nix::sys::signal::Signal::SIGSTOP);
        (holder, token)
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Thaws the holder, which immediately writes with its old sequencer; returns what happened.
    fn resume_and_write(mut self) -> Outcome {
        std::fs::write(self.dir.join("go"), b"").unwrap();
        self.signal(nix::sys::signal::Signal::SIGCONT);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the holder process failed: {status:?}");
        Outcome::decode(&std::fs::read_to_string(self.dir.join("outcome")).unwrap())
    }
}

impl Drop for PausedHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ----- the scenario -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Between {
    Nothing,
    /// The resource is killed (`kill -9`) and restarted between B's write and A's.
    ResourceRestart,
    /// The lock service is killed (`kill -9`) and restarted between A's grant and B's.
    LockServiceRestart,
}

/// A is frozen past its lease, B takes the lock and writes, A thaws and writes: A is refused,
/// with B's token as the accepted one, and the resource holds B's write.
async fn a_paused_holder_is_refused(
    dir: &Path,
    resource: Resource,
    store: Option<&mut ServerProcess>,
    between: Between,
) {
    let mut locks = ServerProcess::lock_service(BIN, dir.join("locks"));
    locks.start();
    let client = Client::connect(&locks.endpoint()).await.unwrap();
    let public_key = client.public_key().await.unwrap();

    // Phase 1: A holds the lock, and freezes.
    let (holder_a, token_a) = PausedHolder::start(
        &dir.join("holder-a"),
        &locks.endpoint(),
        &public_key,
        &resource,
    );
    let client = if between == Between::LockServiceRestart {
        locks.kill9();
        locks.start();
        Client::connect(&locks.endpoint()).await.unwrap()
    } else {
        client
    };

    // Phase 2: A's lease runs out; B acquires with a higher token and writes.
    let session_b = client
        .open_session(SessionOptions::with_ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let guard_b = session_b
        .acquire(
            LOCK,
            AcquireOptions::wait(Wait::For(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    assert!(
        guard_b.token().get() > token_a,
        "B's token {} must exceed A's {token_a}",
        guard_b.token()
    );
    let written = resource
        .write(
            &public_key,
            guard_b.sequencer(),
            "written by the new holder B",
        )
        .await;
    assert_eq!(written, Outcome::Written);

    if between == Between::ResourceRestart {
        let store = store.expect("a restartable resource");
        store.kill9();
        store.start();
    }

    // Phase 3: A wakes and writes with its old sequencer: refused, B's token named.
    let outcome = holder_a.resume_and_write();
    assert_eq!(
        outcome,
        Outcome::Stale {
            presented: token_a,
            accepted: guard_b.token().get()
        }
    );
    assert_eq!(
        resource.read().await,
        "written by the new holder B",
        "B's write survives"
    );
}

fn unique(name: &str) -> String {
    format!(
        "{name}_{}_{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() % 1_000_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fenced_store_refuses_a_paused_holder_also_after_restarts() {
    for between in [
        Between::Nothing,
        Between::ResourceRestart,
        Between::LockServiceRestart,
    ] {
        let dir = tempfile::tempdir().unwrap();
        // The lock service's key is made by the lock service: start it once to create it.
        let locks_dir = dir.path().join("locks");
        let mut locks = ServerProcess::lock_service(BIN, &locks_dir);
        locks.start();
        let mut client = locks_client(&locks.endpoint()).await;
        let public_key = client
            .public_key(palisade_proto::v1::PublicKeyRequest {})
            .await
            .unwrap()
            .into_inner()
            .public_key;
        locks.terminate();
        let mut store = ServerProcess::store(BIN, dir.path().join("store"), &public_key);
        store.start();
        let resource = Resource::Store(store.endpoint());
        a_paused_holder_is_refused(dir.path(), resource, Some(&mut store), between).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_a_paused_holder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reports.sqlite");
    let connection = rusqlite::Connection::open(&path).unwrap();
    sqlite::ensure_schema(&connection).unwrap();
    connection
        .execute_batch("CREATE TABLE reports (name TEXT PRIMARY KEY, body TEXT); INSERT INTO reports VALUES ('report', '');")
        .unwrap();
    drop(connection);
    a_paused_holder_is_refused(dir.path(), Resource::Sqlite(path), None, Between::Nothing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_paused_holder() {
    let Ok(url) = std::env::var("PALISADE_TEST_POSTGRES") else {
        eprintln!(
            "SKIP: PALISADE_TEST_POSTGRES not set; the PostgreSQL pause scenario did not run"
        );
        return;
    };
    let table = unique("pause_reports");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    postgres::ensure_schema(&client).await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (name text PRIMARY KEY, body text); INSERT INTO {table} VALUES ('{KEY}', '');"
        ))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let resource = Resource::Postgres {
        url,
        table: table.clone(),
    };
    a_paused_holder_is_refused(dir.path(), resource, None, Between::Nothing).await;
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_a_paused_holder() {
    let Ok(url) = std::env::var("PALISADE_TEST_REDIS") else {
        eprintln!("SKIP: PALISADE_TEST_REDIS not set; the Redis pause scenario did not run");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let resource = Resource::Redis {
        url,
        prefix: format!("{}:", unique("pause")),
    };
    a_paused_holder_is_refused(dir.path(), resource, None, Between::Nothing).await;
}
