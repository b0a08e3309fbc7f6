//! The read-modify-write every critical section is made of, with real processes: workers run
//! `palisade lock counter -- <read the counter, think, write it plus one>` while holders are
//! frozen (`SIGSTOP`) past their one-second lease and the lock service and the store are killed
//! with `kill -9`. The fence must cover the holder's *read* as well as its write: at the end the
//! counter equals the number of acknowledged increments, plus at most the writes whose outcome
//! was unknown.
//!
//! Two scenarios, for the fenced store (through the `palisade` CLI) and for each adapter backend
//! (through the fence library, in this test executable re-run in child mode), NATS JetStream's
//! fenced publish among them (the counter is the last message's value, and a holder publishes
//! "last value + 1"); an S3 object's unfenced variant writes with a plain `PUT`:
//!
//! - **the interleaving, step by step**: A reads, is frozen, B is granted and reads, A thaws and
//!   writes, B writes. With an unfenced read both writes are acknowledged and the counter moves by
//!   one, a lost update; with a fenced read (or a claim first) A's write is refused as stale.
//! - **chaos**: several workers loop over the critical section while a pauser freezes whichever
//!   holder is thinking, and the lock service and the store are killed and restarted.
//!
//! On NATS the unfenced holders publish plainly, and the interleaving leaves two messages with
//! the same value (a duplicate); fenced, the broker refuses the second publish, since the
//! subject moved since that holder's read.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable as _;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use palisade_fence::s3::{PutCondition, envelope};
use palisade_fence::{
    FenceError, RedisFence, RedisOp, S3Config, S3Fence, Verifier, mysql, postgres, sqlite,
};
use palisade_fence_nats::{LastMessage, NatsFence};
use palisade_store::StoreClient;
use palisade_testkit::{ServerProcess, locks_client, wait_for_file};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const LOCK: &str = "counter";
const KEY: &str = "counter";
/// The holders' lease: a freeze longer than this hands the lock to the next worker.
const HOLDER_TTL: &str = "1s";
/// How long a holder thinks between its read and its write (chaos scenario).
const THINK: Duration = Duration::from_millis(600);

/// Exit statuses of one critical section, as the child records them in `result`. They follow
/// the `palisade` binary's scheme so the shell and the Rust child agree.
const ACKNOWLEDGED: i32 = 0;
const STALE: i32 = 3;
const UNKNOWN: i32 = 77;

// ----- what one critical section runs -----

/// How a worker reads and writes the counter.
#[derive(Debug, Clone)]
enum Rmw {
    /// `palisade store get` / `palisade store put` in a shell, against the fenced store.
    Store { url: String },
    /// The fence library against a database, in this executable's child mode.
    Adapter(Backend),
}

/// A database the counter lives in, with the fence beside it.
#[derive(Debug, Clone)]
enum Backend {
    /// A PostgreSQL connection string and the (test-unique) table, which is also the fence's
    /// scope: the fence table is shared by every test run against this server.
    Postgres { url: String, table: String },
    /// A MySQL/MariaDB URL and the (test-unique) table, which is also the fence's scope.
    Mysql { url: String, table: String },
    /// An SQLite database file.
    Sqlite(PathBuf),
    /// A Redis URL and the (test-unique) key prefix.
    Redis { url: String, prefix: String },
    /// `PALISADE_TEST_S3` ("endpoint bucket access-key secret-key") and the (test-unique) key.
    S3 { server: String, key: String },
    /// A NATS URL and the (test-unique) JetStream stream; the counter is the last message on
    /// `<stream>.counter`.
    Nats { url: String, stream: String },
}

/// What a holder read: the counter, and on NATS the message it came from (what its publish
/// expects to be still the last).
#[derive(Debug)]
struct Read {
    value: i64,
    last: Option<LastMessage>,
}

impl From<i64> for Read {
    fn from(value: i64) -> Read {
        Read { value, last: None }
    }
}

impl Backend {
    fn encode(&self) -> String {
        match self {
            Backend::Postgres { url, table } => format!("postgres|{url}|{table}"),
            Backend::Mysql { url, table } => format!("mysql|{url}|{table}"),
            Backend::Sqlite(path) => format!("sqlite|{}", path.display()),
            Backend::Redis { url, prefix } => format!("redis|{url}|{prefix}"),
            Backend::Nats { url, stream } => format!("nats|{url}|{stream}"),
            Backend::S3 { server, key } => format!("s3|{server}|{key}"),
        }
    }

    fn decode(text: &str) -> Backend {
        let parts: Vec<&str> = text.split('|').collect();
        match parts[..] {
            ["postgres", url, table] => Backend::Postgres {
                url: url.into(),
                table: table.into(),
            },
            ["mysql", url, table] => Backend::Mysql {
                url: url.into(),
                table: table.into(),
            },
            ["sqlite", path] => Backend::Sqlite(path.into()),
            ["redis", url, prefix] => Backend::Redis {
                url: url.into(),
                prefix: prefix.into(),
            },
            ["nats", url, stream] => Backend::Nats {
                url: url.into(),
                stream: stream.into(),
            },
            ["s3", server, key] => Backend::S3 {
                server: server.into(),
                key: key.into(),
            },
            _ => panic!("unknown backend {text:?}"),
        }
    }

    /// Creates the counter (and the fence table), at zero.
    async fn create(&self) {
        match self {
            Backend::Postgres { url, table } => {
                let client = pg_connect(url).await;
                postgres::ensure_schema(&client).await.unwrap();
                client
                    .batch_execute(&format!(
                        "CREATE TABLE {table} (name text PRIMARY KEY, v bigint NOT NULL);
                         INSERT INTO {table} VALUES ('{KEY}', 0);"
                    ))
                    .await
                    .unwrap();
            }
            Backend::Mysql { url, table } => {
                let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                mysql::ensure_schema(&mut conn).await.unwrap();
                conn.query_drop(format!(
                    "CREATE TABLE {table} (name VARCHAR(64) PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB"
                ))
                .await
                .unwrap();
                conn.query_drop(format!("INSERT INTO {table} VALUES ('{KEY}', 0)"))
                    .await
                    .unwrap();
                conn.disconnect().await.unwrap();
            }
            Backend::Sqlite(path) => {
                let connection = rusqlite::Connection::open(path).unwrap();
                sqlite::ensure_schema(&connection).unwrap();
                connection
                    .execute_batch(
                        "CREATE TABLE counters (name TEXT PRIMARY KEY, v INTEGER NOT NULL);
                         INSERT INTO counters VALUES ('counter', 0);",
                    )
                    .unwrap();
            }
            Backend::Redis { .. } | Backend::S3 { .. } => {}
            Backend::Nats { url, stream } => {
                nats_context(url)
                    .await
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: stream.clone(),
                        subjects: vec![format!("{stream}.>")],
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
        }
        self.reset().await;
    }

    /// Sets the counter to zero without a sequencer: the fence state stays as it is, which is what
    /// a later holder's (higher) token expects. On NATS the subject is purged (an empty subject
    /// reads as zero), which forgets the fence state with it.
    async fn reset(&self) {
        match self {
            Backend::Postgres { url, table } => {
                pg_connect(url)
                    .await
                    .execute(&format!("UPDATE {table} SET v = 0"), &[])
                    .await
                    .unwrap();
            }
            Backend::Mysql { url, table } => {
                let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                conn.query_drop(format!("UPDATE {table} SET v = 0"))
                    .await
                    .unwrap();
                conn.disconnect().await.unwrap();
            }
            Backend::Sqlite(path) => {
                rusqlite::Connection::open(path)
                    .unwrap()
                    .execute("UPDATE counters SET v = 0", [])
                    .unwrap();
            }
            Backend::Redis { url, prefix } => {
                let mut connection = redis_connect(url).await;
                let _: () = redis::cmd("SET")
                    .arg(format!("{prefix}{KEY}"))
                    .arg(0)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
            }
            Backend::Nats { url, stream } => {
                nats_context(url)
                    .await
                    .get_stream(stream)
                    .await
                    .unwrap()
                    .purge()
                    .filter(format!("{stream}.{KEY}"))
                    .await
                    .unwrap();
            }
            Backend::S3 { server, key } => {
                // The object keeps its fence state; only the data goes back to zero.
                let fence = s3_fence(server);
                if let Some(object) = fence.get(key).await.unwrap() {
                    let body = envelope(&object.state, Some(b"0"));
                    fence
                        .put_raw(
                            key,
                            &object.state,
                            body,
                            PutCondition::Matches(&object.etag),
                        )
                        .await
                        .unwrap();
                }
            }
        }
    }

    /// The counter as an observer sees it: no sequencer, no claim.
    async fn observe(&self) -> i64 {
        match self {
            Backend::Postgres { url, table } => pg_connect(url)
                .await
                .query_one(&format!("SELECT v FROM {table} WHERE name = '{KEY}'"), &[])
                .await
                .unwrap()
                .get(0),
            Backend::Mysql { url, table } => {
                let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                let sql = format!("SELECT v FROM {table} WHERE name = '{KEY}'");
                let value: i64 = conn.query_first(sql).await.unwrap().unwrap();
                conn.disconnect().await.unwrap();
                value
            }
            Backend::Sqlite(path) => rusqlite::Connection::open(path)
                .unwrap()
                .query_row("SELECT v FROM counters WHERE name = ?1", [KEY], |row| {
                    row.get(0)
                })
                .unwrap(),
            Backend::Redis { url, prefix } => {
                let mut connection = redis_connect(url).await;
                let value: String = redis::cmd("GET")
                    .arg(format!("{prefix}{KEY}"))
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                value.parse().unwrap()
            }
            Backend::Nats { .. } => self.nats_values().await.last().copied().unwrap_or(0),
            Backend::S3 { server, key } => s3_value(s3_fence(server).get(key).await.unwrap()),
        }
    }

    /// Every value on the NATS counter's subject, in stream order.
    async fn nats_values(&self) -> Vec<i64> {
        let Backend::Nats { url, stream } = self else {
            panic!("not a NATS backend: {self:?}");
        };
        let stream = nats_context(url).await.get_stream(stream).await.unwrap();
        let mut stream = stream;
        let state = stream.info().await.unwrap().state.clone();
        let mut values = Vec::new();
        for sequence in state.first_sequence..=state.last_sequence {
            // Purged messages are gone; what is left is the counter's history since the reset.
            if let Ok(message) = stream.get_raw_message(sequence).await {
                values.push(
                    String::from_utf8(message.payload.to_vec())
                        .unwrap()
                        .parse()
                        .unwrap(),
                );
            }
        }
        values
    }

    async fn drop_data(&self) {
        match self {
            Backend::Postgres { url, table } => pg_connect(url)
                .await
                .batch_execute(&format!("DROP TABLE {table}"))
                .await
                .unwrap(),
            Backend::Mysql { url, table } => {
                let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                conn.query_drop(format!("DROP TABLE {table}"))
                    .await
                    .unwrap();
                conn.disconnect().await.unwrap();
            }
            Backend::Nats { url, stream } => {
                nats_context(url).await.delete_stream(stream).await.unwrap();
            }
            Backend::Sqlite(_) | Backend::Redis { .. } | Backend::S3 { .. } => {}
        }
    }

    /// Reads the counter as the holder of `sequencer`: a claim first (which orders the read
    /// after every older grant's write), or with `unfenced` a plain read that orders nothing.
    async fn holder_read(&self, sequencer: &str, key: &str, unfenced: bool) -> Result<Read, i32> {
        let verified = Verifier::new(key.parse::<palisade_sequencer::KeySet>().unwrap())
            .verify(Some(sequencer))
            .map_err(|error| status_of(&error))?;
        match self {
            Backend::Postgres { url, table } => {
                let mut client = pg_connect(url).await;
                let txn = client.transaction().await.map_err(|_| 1)?;
                if !unfenced {
                    postgres::claim(&txn, table, &verified)
                        .await
                        .map_err(|error| status_of(&error))?;
                }
                let sql = format!("SELECT v FROM {table} WHERE name = '{KEY}'");
                let value: i64 = txn.query_one(&sql, &[]).await.map_err(|_| 1)?.get(0);
                postgres::commit(txn)
                    .await
                    .map_err(|error| status_of(&error))?;
                Ok(value.into())
            }
            Backend::Mysql { url, table } => {
                let mut conn = mysql_async::Conn::from_url(url.as_str())
                    .await
                    .map_err(|_| 1)?;
                let mut txn = conn
                    .start_transaction(mysql_async::TxOpts::default())
                    .await
                    .map_err(|_| 1)?;
                if !unfenced {
                    mysql::claim(&mut txn, table, &verified)
                        .await
                        .map_err(|error| status_of(&error))?;
                }
                let sql = format!("SELECT v FROM {table} WHERE name = '{KEY}'");
                let value: Option<i64> = txn.query_first(sql).await.map_err(|_| 1)?;
                mysql::commit(txn)
                    .await
                    .map_err(|error| status_of(&error))?;
                Ok(value.expect("the counter exists").into())
            }
            Backend::Sqlite(path) => {
                let mut connection = rusqlite::Connection::open(path).map_err(|_| 1)?;
                let txn = sqlite::begin(&mut connection).map_err(|_| 1)?;
                if !unfenced {
                    sqlite::claim(&txn, LOCK, &verified).map_err(|error| status_of(&error))?;
                }
                let value: i64 = txn
                    .query_row("SELECT v FROM counters WHERE name = ?1", [KEY], |row| {
                        row.get(0)
                    })
                    .map_err(|_| 1)?;
                txn.commit().map_err(|_| UNKNOWN)?;
                Ok(value.into())
            }
            Backend::Redis { url, prefix } => {
                let mut connection = redis_connect(url).await;
                let key = format!("{prefix}{KEY}");
                let value: Vec<u8> = if unfenced {
                    redis::cmd("GET")
                        .arg(&key)
                        .query_async(&mut connection)
                        .await
                        .map_err(|_| 1)?
                } else {
                    let mut values = redis_fence(prefix)
                        .read(&mut connection, LOCK, &verified, &[key])
                        .await
                        .map_err(|error| status_of(&error))?;
                    values.remove(0).expect("the counter exists")
                };
                Ok(String::from_utf8(value)
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
                    .into())
            }
            Backend::Nats { url, stream } => {
                // The fence's read verifies the sequencer on the last message; unfenced, the
                // same read is taken as it is.
                let last = nats_fence(url, stream, key)
                    .await
                    .last(&format!("{stream}.{KEY}"))
                    .await
                    .map_err(|error| status_of(&error))?;
                let value = last.as_ref().map_or(0, |last| {
                    String::from_utf8(last.payload.to_vec())
                        .unwrap()
                        .parse()
                        .unwrap()
                });
                Ok(Read { value, last })
            }
            Backend::S3 {
                server,
                key: object_key,
            } => {
                let fence = s3_fence(server);
                let object = if unfenced {
                    fence.get(object_key).await
                } else {
                    fence.read(object_key, &verified).await.map(Some)
                };
                Ok(s3_value(object.map_err(|error| status_of(&error))?).into())
            }
        }
    }

    /// Writes `value` as the holder of `sequencer`, through the fence. On NATS, `read` is what
    /// the publish expects to be still the last message, and `unfenced` publishes plainly; an S3
    /// object's unfenced variant writes with a plain `PUT`.
    async fn holder_write(
        &self,
        sequencer: &str,
        key: &str,
        value: i64,
        read: &Read,
        unfenced: bool,
    ) -> i32 {
        let verified = match Verifier::new(key.parse::<palisade_sequencer::KeySet>().unwrap())
            .verify(Some(sequencer))
        {
            Ok(verified) => verified,
            Err(error) => return status_of(&error),
        };
        match self {
            Backend::Postgres { url, table } => {
                let mut client = pg_connect(url).await;
                let Ok(txn) = client.transaction().await else {
                    return 1;
                };
                if let Err(error) = postgres::claim(&txn, table, &verified).await {
                    return status_of(&error);
                }
                let sql = format!("UPDATE {table} SET v = $1 WHERE name = '{KEY}'");
                if txn.execute(&sql, &[&value]).await.is_err() {
                    return 1;
                }
                match postgres::commit(txn).await {
                    Ok(()) => ACKNOWLEDGED,
                    Err(error) => status_of(&error),
                }
            }
            Backend::Mysql { url, table } => {
                let Ok(mut conn) = mysql_async::Conn::from_url(url.as_str()).await else {
                    return 1;
                };
                let Ok(mut txn) = conn.start_transaction(mysql_async::TxOpts::default()).await
                else {
                    return 1;
                };
                if let Err(error) = mysql::claim(&mut txn, table, &verified).await {
                    return status_of(&error);
                }
                let sql = format!("UPDATE {table} SET v = {value} WHERE name = '{KEY}'");
                if txn.query_drop(sql).await.is_err() {
                    return 1;
                }
                match mysql::commit(txn).await {
                    Ok(()) => ACKNOWLEDGED,
                    Err(error) => status_of(&error),
                }
            }
            Backend::Sqlite(path) => {
                let Ok(mut connection) = rusqlite::Connection::open(path) else {
                    return 1;
                };
                let Ok(txn) = sqlite::begin(&mut connection) else {
                    return 1;
                };
                if let Err(error) = sqlite::claim(&txn, LOCK, &verified) {
                    return status_of(&error);
                }
                if txn
                    .execute("UPDATE counters SET v = ?1 WHERE name = ?2", (value, KEY))
                    .is_err()
                {
                    return 1;
                }
                match txn.commit() {
                    Ok(()) => ACKNOWLEDGED,
                    Err(_) => UNKNOWN,
                }
            }
            Backend::Redis { url, prefix } => {
                let mut connection = redis_connect(url).await;
                let op = RedisOp::set(format!("{prefix}{KEY}"), value.to_string().into_bytes());
                match redis_fence(prefix)
                    .write(&mut connection, LOCK, &verified, &[op])
                    .await
                {
                    Ok(_replies) => ACKNOWLEDGED,
                    Err(error) => status_of(&error),
                }
            }
            Backend::Nats { url, stream } => {
                let subject = format!("{stream}.{KEY}");
                let payload = value.to_string().into();
                if unfenced {
                    let context = nats_context(url).await;
                    return match context.publish(subject, payload).await {
                        Ok(pending) => match pending.await {
                            Ok(_ack) => ACKNOWLEDGED,
                            Err(_) => UNKNOWN,
                        },
                        Err(_) => 1,
                    };
                }
                let fence = nats_fence(url, stream, key).await;
                match fence
                    .publish_after(&subject, &verified, read.last.as_ref(), payload, None)
                    .await
                {
                    Ok(_ack) => ACKNOWLEDGED,
                    Err(error) => status_of(&error),
                }
            }
            Backend::S3 {
                server,
                key: object_key,
            } => {
                let fence = s3_fence(server);
                let data = value.to_string().into_bytes();
                let written = if unfenced {
                    // The unfenced variant: a plain PUT, as most code writes to a bucket.
                    let state = palisade_fence::FenceState {
                        lock: LOCK.into(),
                        token_max: verified.token(),
                        holder_session: verified.session(),
                    };
                    let body = envelope(&state, Some(&data));
                    fence
                        .put_raw(object_key, &state, body, PutCondition::None)
                        .await
                        .map(drop)
                } else {
                    fence.put(object_key, &verified, &data).await.map(drop)
                };
                match written {
                    Ok(()) => ACKNOWLEDGED,
                    Err(error) => status_of(&error),
                }
            }
        }
    }
}

fn s3_fence(server: &str) -> S3Fence {
    let [endpoint, bucket, access_key, secret_key] =
        server.split_whitespace().collect::<Vec<_>>()[..]
    else {
        panic!("PALISADE_TEST_S3 is \"endpoint bucket access-key secret-key\", not {server:?}");
    };
    S3Fence::new(S3Config {
        endpoint: endpoint.into(),
        region: "us-east-1".into(),
        bucket: bucket.into(),
        access_key: access_key.into(),
        secret_key: secret_key.into(),
    })
}

/// The counter in an S3 object: no object, or one without data, is zero.
fn s3_value(object: Option<palisade_fence::S3Object>) -> i64 {
    object
        .and_then(|object| object.data)
        .map_or(0, |data| String::from_utf8(data).unwrap().parse().unwrap())
}

/// The fence hashes live beside the data, under their own prefix.
fn redis_fence(prefix: &str) -> RedisFence {
    RedisFence::new().with_key_prefix(format!("{prefix}fence:"))
}

fn status_of(error: &FenceError) -> i32 {
    if error.is_stale() {
        STALE
    } else if error.is_outcome_unknown() {
        UNKNOWN
    } else {
        1
    }
}

async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

async fn nats_context(url: &str) -> async_nats::jetstream::Context {
    palisade_fence_nats::connect(url).await.unwrap()
}

async fn nats_fence(url: &str, stream: &str, key: &str) -> NatsFence {
    let keys = key.parse::<palisade_sequencer::KeySet>().unwrap();
    NatsFence::new(
        nats_context(url).await,
        stream,
        Arc::new(Verifier::new(keys)),
    )
}

async fn redis_connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// One critical section of the Rust child, with the same files as the shell's: `pid`, `read`
/// (the value read), `attempt` (just before the write), `result` (its status).
#[test]
fn rmw_child() {
    let Some(dir) = std::env::var_os("RMW_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let backend = Backend::decode(&std::env::var("RMW_BACKEND").unwrap());
    let unfenced = std::env::var_os("RMW_UNFENCED").is_some();
    let gated = std::env::var_os("RMW_GATED").is_some();
    let sequencer = std::env::var("PALISADE_SEQUENCER").unwrap();
    let key = std::env::var("RMW_PUBLIC_KEY").unwrap();
    std::fs::write(dir.join("pid"), std::process::id().to_string()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let read = match backend.holder_read(&sequencer, &key, unfenced).await {
            Ok(read) => read,
            Err(status) => {
                std::fs::write(dir.join("result"), format!("read {status}")).unwrap();
                return;
            }
        };
        std::fs::write(dir.join("read"), read.value.to_string()).unwrap();
        think(&dir, gated);
        std::fs::write(dir.join("attempt"), b"").unwrap();
        let status = backend
            .holder_write(&sequencer, &key, read.value + 1, &read, unfenced)
            .await;
        std::fs::write(dir.join("result"), status.to_string()).unwrap();
    });
}

fn think(dir: &Path, gated: bool) {
    if !gated {
        std::thread::sleep(THINK);
        return;
    }
    let started = Instant::now();
    while !dir.join("go").exists() {
        assert!(started.elapsed() < Duration::from_secs(120), "never let go");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The shell's critical section against the fenced store: exactly the pattern users write.
const STORE_RMW: &str = r#"
echo $$ > "$D/pid"
v=$("$PAL" store get $UNFENCED counter) || { echo "read $?" > "$D/result"; exit 0; }
echo "$v" > "$D/read"
if [ -n "$GATED" ]; then
  while [ ! -e "$D/go" ]; do sleep 0.01; done
else
  sleep 0.6
fi
: > "$D/attempt"
"$PAL" store put counter $((v + 1)) > /dev/null
echo $? > "$D/result"
"#;

// ----- workers: `palisade lock` around one critical section -----

#[derive(Debug, Clone)]
struct Harness {
    endpoint: String,
    public_key: String,
    rmw: Rmw,
    unfenced: bool,
}

impl Harness {
    /// Starts `palisade lock counter -- <critical section>` writing its files to `dir`.
    fn spawn(&self, dir: &Path, ttl: &str, gated: bool) -> Child {
        std::fs::create_dir_all(dir).unwrap();
        let mut command = palisade_testkit::command(BIN);
        command
            .args(["--endpoint", &self.endpoint, "lock", LOCK, "--ttl", ttl])
            .args(["--wait", "60s", "--kill-grace", "1s", "--"]);
        match &self.rmw {
            Rmw::Store { url } => {
                command
                    .args(["sh", "-c", STORE_RMW])
                    .env("PALISADE_STORE", url)
                    .env("PAL", BIN)
                    .env("UNFENCED", if self.unfenced { "--unfenced" } else { "" });
            }
            Rmw::Adapter(backend) => {
                command
                    .arg(std::env::current_exe().unwrap())
                    .args(["--exact", "rmw_child", "--test-threads=1"])
                    .env("RMW_BACKEND", backend.encode())
                    .env("RMW_PUBLIC_KEY", &self.public_key);
                if self.unfenced {
                    command.env("RMW_UNFENCED", "1");
                }
            }
        }
        if gated {
            command.env("GATED", "1").env("RMW_GATED", "1");
        }
        command
            .env("D", dir)
            .env("RMW_DIR", dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .process_group(0)
            .spawn()
            .expect("spawn palisade lock")
    }
}

fn wait_child(child: &mut Child, limit: Duration) {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("palisade lock did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pid of the critical section's process group, as it wrote it.
fn section_group(dir: &Path) -> Option<Pid> {
    let text = std::fs::read_to_string(dir.join("pid")).ok()?;
    text.trim().parse().ok().map(Pid::from_raw)
}

fn freeze(lock: &Child, dir: &Path) {
    let _ = kill(Pid::from_raw(lock.id() as i32), Signal::SIGSTOP);
    if let Some(group) = section_group(dir) {
        let _ = killpg(group, Signal::SIGSTOP);
    }
}

// ----- the interleaving, step by step -----

/// A reads and is frozen past its lease; B is granted and reads; A thaws and writes; B writes.
/// Returns A's and B's results and the counter's final value.
fn interleave(harness: &Harness, dir: &Path) -> (String, String) {
    let (dir_a, dir_b) = (dir.join("a"), dir.join("b"));
    let mut lock_a = harness.spawn(&dir_a, HOLDER_TTL, true);
    let read_a = wait_for_file(&dir_a.join("read"), Duration::from_secs(60));
    freeze(&lock_a, &dir_a);

    // B's lease is long: only A is meant to lose the lock here.
    let mut lock_b = harness.spawn(&dir_b, "30s", true);
    let read_b = wait_for_file(&dir_b.join("read"), Duration::from_secs(60));
    assert_eq!(read_a.trim(), read_b.trim(), "both read the same value");

    // Thaw A's critical section first (its `palisade lock` would stop it on finding the lease
    // lost), let it write, then thaw its `palisade lock`.
    std::fs::write(dir_a.join("go"), b"").unwrap();
    let group_a = section_group(&dir_a).unwrap();
    killpg(group_a, Signal::SIGCONT).unwrap();
    let result_a = wait_for_file(&dir_a.join("result"), Duration::from_secs(60));
    kill(Pid::from_raw(lock_a.id() as i32), Signal::SIGCONT).unwrap();

    std::fs::write(dir_b.join("go"), b"").unwrap();
    let result_b = wait_for_file(&dir_b.join("result"), Duration::from_secs(60));
    wait_child(&mut lock_a, Duration::from_secs(60));
    wait_child(&mut lock_b, Duration::from_secs(60));
    (result_a.trim().to_owned(), result_b.trim().to_owned())
}

/// What the fenced interleaving ends with: A's result, B's result, the counter, and why.
type Outcome = (&'static str, &'static str, i64, &'static str);

/// A fenced read: a claim orders it after every older grant's write, so A's write is refused.
const CLAIMED_READ: Outcome = (
    "3",
    "0",
    1,
    "a fenced read: the superseded holder's write is refused as stale",
);

/// Runs [`interleave`] unfenced, then fenced, from a counter at zero each time (`reset` sets it
/// and `observe` reads it). Unfenced, both writes are acknowledged and one is lost; fenced, the
/// run ends as `fenced` says and the counter equals the acknowledged increments.
async fn the_read_is_ordered<R, O>(
    dir: &Path,
    endpoint: &str,
    public_key: &str,
    rmw: Rmw,
    fenced: Outcome,
    reset: R,
    observe: O,
) where
    R: AsyncFn(),
    O: AsyncFn() -> i64,
{
    for unfenced in [true, false] {
        reset().await;
        let harness = Harness {
            endpoint: endpoint.to_owned(),
            public_key: public_key.to_owned(),
            rmw: rmw.clone(),
            unfenced,
        };
        let run = dir.join(if unfenced { "unfenced" } else { "fenced" });
        let (a, b) = tokio::task::block_in_place(|| interleave(&harness, &run));
        let counter = observe().await;
        if unfenced {
            assert_eq!(
                (a.as_str(), b.as_str(), counter),
                ("0", "0", 1),
                "an unfenced read: two acknowledged increments, one effect (a lost update)"
            );
        } else {
            let (a_expected, b_expected, counter_expected, why) = fenced;
            assert_eq!(
                (a.as_str(), b.as_str(), counter),
                (a_expected, b_expected, counter_expected),
                "{why}"
            );
        }
    }
}

// ----- chaos -----

/// What the chaos run did, read back from every critical section's files.
#[derive(Debug, Default)]
struct Tally {
    sections: usize,
    acknowledged: i64,
    stale: usize,
    unknown: i64,
    pauses: u64,
    /// The sections that were not acknowledged: directory, result and `palisade lock`'s stderr.
    others: Vec<String>,
}

/// A small deterministic generator for pause lengths; the seed is printed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low))
    }
}

/// The running critical sections: each worker's `palisade lock` pid and directory.
type Running = Arc<Mutex<Vec<Option<(u32, PathBuf)>>>>;

/// Freezes whichever holder is thinking (read done, write not attempted) for longer than its
/// lease, thaws its critical section, then its `palisade lock`.
fn pauser(running: Running, stop: Arc<AtomicBool>, pauses: Arc<AtomicU64>, seed: u64) {
    let mut random = XorShift(seed | 1);
    while !stop.load(Ordering::Relaxed) {
        let thinking = running
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .find_map(|(pid, dir)| {
                let thinking = dir.join("read").exists()
                    && !dir.join("attempt").exists()
                    && !dir.join("result").exists();
                thinking.then(|| (*pid, dir.clone()))
            });
        let Some((pid, dir)) = thinking else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let Some(group) = section_group(&dir) else {
            continue;
        };
        let lock = Pid::from_raw(pid as i32);
        let _ = kill(lock, Signal::SIGSTOP);
        let _ = killpg(group, Signal::SIGSTOP);
        pauses.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(random.millis(1000, 2000));
        let _ = killpg(group, Signal::SIGCONT);
        std::thread::sleep(random.millis(0, 300));
        let _ = kill(lock, Signal::SIGCONT);
        std::thread::sleep(random.millis(300, 1200));
    }
}

/// One worker: critical section after critical section until told to stop.
fn worker(harness: Harness, base: PathBuf, index: usize, running: Running, stop: Arc<AtomicBool>) {
    for iteration in 0..200 {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let dir = base.join(format!("w{index}-{iteration}"));
        let mut lock = harness.spawn(&dir, HOLDER_TTL, false);
        running.lock().unwrap()[index] = Some((lock.id(), dir));
        wait_child(&mut lock, Duration::from_secs(120));
        running.lock().unwrap()[index] = None;
        if !lock.wait().unwrap().success() {
            // The lock service may be down: do not spin.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn tally(base: &Path) -> Tally {
    let mut tally = Tally::default();
    for entry in std::fs::read_dir(base).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        tally.sections += 1;
        let attempted = dir.join("attempt").exists();
        let result = std::fs::read_to_string(dir.join("result")).unwrap_or_default();
        let status = result.trim().parse::<i32>();
        if status != Ok(ACKNOWLEDGED) {
            let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
            let name = dir.file_name().unwrap().to_string_lossy();
            tally.others.push(format!("{name}: {result:?} {stderr}"));
        }
        match status {
            Ok(ACKNOWLEDGED) => tally.acknowledged += 1,
            Ok(STALE) => tally.stale += 1,
            Ok(UNKNOWN) => tally.unknown += 1,
            // Refused, unreachable, or not even attempted: nothing was applied.
            Ok(_) => {}
            // Attempted, then killed before it could record what happened.
            Err(_) if attempted => tally.unknown += 1,
            Err(_) => {}
        }
    }
    tally
}

/// What the chaos run restarts in the middle, besides freezing holders.
struct Restarts<'a> {
    locks: &'a mut ServerProcess,
    store: Option<&'a mut ServerProcess>,
}

/// Runs `workers` workers for at most `limit`: kills (`kill -9`) and restarts the store at a
/// quarter of it and the lock service at half, and ends once both restarts are behind it and
/// `target` increments were acknowledged.
async fn chaos(
    harness: Harness,
    base: &Path,
    workers: usize,
    target: i64,
    limit: Duration,
    restarts: Restarts<'_>,
) -> Tally {
    std::fs::create_dir_all(base).unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("chaos: pause seed {seed}");
    let running: Running = Arc::new(Mutex::new(vec![None; workers]));
    let stop = Arc::new(AtomicBool::new(false));
    let pauses = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for index in 0..workers {
        let (harness, base) = (harness.clone(), base.to_path_buf());
        let (running, stop) = (running.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            worker(harness, base, index, running, stop);
        }));
    }
    {
        let (running, stop, pauses) = (running.clone(), stop.clone(), pauses.clone());
        threads.push(std::thread::spawn(move || {
            pauser(running, stop, pauses, seed)
        }));
    }

    let started = Instant::now();
    let Restarts { locks, mut store } = restarts;
    let (mut store_restarted, mut locks_restarted) = (store.is_none(), false);
    while started.elapsed() < limit
        && !(store_restarted && locks_restarted && tally(base).acknowledged >= target)
    {
        if !store_restarted && started.elapsed() > limit / 4 {
            let store = store.as_deref_mut().unwrap();
            store.kill9();
            tokio::time::sleep(Duration::from_millis(300)).await;
            store.start();
            store_restarted = true;
        }
        if !locks_restarted && started.elapsed() > limit / 2 {
            locks.kill9();
            tokio::time::sleep(Duration::from_millis(300)).await;
            locks.start();
            locks_restarted = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    tokio::task::block_in_place(|| {
        for thread in threads {
            thread.join().unwrap();
        }
    });
    Tally {
        pauses: pauses.load(Ordering::Relaxed),
        ..tally(base)
    }
}

/// acknowledged ≤ counter ≤ acknowledged + unknown, and the run did real work.
fn assert_no_lost_update(tally: &Tally, counter: i64) {
    eprintln!("chaos: counter {counter}, {tally:#?}");
    assert!(
        tally.acknowledged >= 10,
        "too little work to judge: {tally:?}"
    );
    assert!(tally.pauses >= 3, "too few pauses to judge: {tally:?}");
    assert!(
        counter >= tally.acknowledged,
        "lost updates: {} increments acknowledged, the counter is {counter} ({tally:?})",
        tally.acknowledged
    );
    assert!(
        counter <= tally.acknowledged + tally.unknown,
        "the counter {counter} exceeds acknowledged plus unknown increments ({tally:?})"
    );
    assert!(
        tally.stale >= 1,
        "no frozen holder ever tried to write after being superseded: {tally:?}"
    );
}

// ----- setups -----

/// A lock service on a fixed port and data directory, its endpoint and public key.
async fn lock_service(dir: &Path) -> (ServerProcess, String) {
    let mut locks = ServerProcess::lock_service(BIN, dir.join("locks"));
    locks.start();
    let mut client = locks_client(&locks.endpoint()).await;
    let public_key = client
        .public_key(palisade_proto::v1::PublicKeyRequest {})
        .await
        .unwrap()
        .into_inner()
        .public_key;
    (locks, public_key)
}

async fn store_counter(url: &str) -> i64 {
    let entry = StoreClient::new(url).unwrap().get(KEY).await.unwrap();
    let entry = entry.expect("the counter exists");
    String::from_utf8(entry.value)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Sets the store's counter to zero under the lock, as a user would.
fn reset_store_counter(endpoint: &str, url: &str) {
    let status = palisade_testkit::command(BIN)
        .args(["--endpoint", endpoint, "lock", LOCK, "--"])
        .args([BIN, "store", "put", KEY, "0"])
        .env("PALISADE_STORE", url)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "cannot reset the counter: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_orders_a_holders_read_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let (locks, public_key) = lock_service(dir.path()).await;
    let mut store = ServerProcess::store(BIN, dir.path().join("store"), &public_key);
    store.start();
    let url = store.endpoint();
    let endpoint = locks.endpoint();
    the_read_is_ordered(
        dir.path(),
        &endpoint,
        &public_key,
        Rmw::Store { url: url.clone() },
        CLAIMED_READ,
        async || reset_store_counter(&endpoint, &url),
        async || store_counter(&url).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_loses_no_increment_under_pauses_and_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (mut locks, public_key) = lock_service(dir.path()).await;
    let mut store = ServerProcess::store(BIN, dir.path().join("store"), &public_key);
    store.start();
    let url = store.endpoint();
    reset_store_counter(&locks.endpoint(), &url);
    let harness = Harness {
        endpoint: locks.endpoint(),
        public_key,
        rmw: Rmw::Store { url: url.clone() },
        unfenced: false,
    };
    let restarts = Restarts {
        locks: &mut locks,
        store: Some(&mut store),
    };
    let tally = chaos(
        harness,
        &dir.path().join("chaos"),
        4,
        40,
        Duration::from_secs(45),
        restarts,
    )
    .await;
    assert_no_lost_update(&tally, store_counter(&url).await);
}

/// Both scenarios against one adapter backend; `fenced` is how its fenced interleaving ends.
async fn adapter_scenarios(backend: Backend, fenced: Outcome) {
    let dir = tempfile::tempdir().unwrap();
    let (mut locks, public_key) = lock_service(dir.path()).await;
    backend.create().await;
    let nats = matches!(backend, Backend::Nats { .. });
    // On NATS, every message the subject held before each reset.
    let histories = Mutex::new(Vec::new());
    let reset = async || {
        if nats {
            let values = backend.nats_values().await;
            histories.lock().unwrap().push(values);
        }
        backend.reset().await
    };
    the_read_is_ordered(
        dir.path(),
        &locks.endpoint(),
        &public_key,
        Rmw::Adapter(backend.clone()),
        fenced,
        reset,
        async || backend.observe().await,
    )
    .await;
    if nats {
        let unfenced = histories.lock().unwrap()[1].clone();
        assert_eq!(
            unfenced,
            [1, 1],
            "plain publishes: both holders published \"last value + 1\", a duplicate"
        );
        assert_eq!(
            backend.nats_values().await,
            [1],
            "fenced: one message, no duplicate"
        );
    }

    backend.reset().await;
    let harness = Harness {
        endpoint: locks.endpoint(),
        public_key,
        rmw: Rmw::Adapter(backend.clone()),
        unfenced: false,
    };
    let restarts = Restarts {
        locks: &mut locks,
        store: None,
    };
    let tally = chaos(
        harness,
        &dir.path().join("chaos"),
        3,
        25,
        Duration::from_secs(40),
        restarts,
    )
    .await;
    assert_no_lost_update(&tally, backend.observe().await);
    if nats {
        let values = backend.nats_values().await;
        let expected: Vec<i64> = (1..=values.len() as i64).collect();
        assert_eq!(
            values, expected,
            "the fenced stream holds each value once, in order"
        );
    }
    backend.drop_data().await;
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}_{}_{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_orders_a_holders_read() {
    let dir = tempfile::tempdir().unwrap();
    adapter_scenarios(
        Backend::Sqlite(dir.path().join("counter.sqlite")),
        CLAIMED_READ,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_orders_a_holders_read() {
    let Ok(url) = std::env::var("PALISADE_TEST_POSTGRES") else {
        eprintln!("SKIP: PALISADE_TEST_POSTGRES not set; the PostgreSQL counter did not run");
        return;
    };
    let table = unique("counter");
    adapter_scenarios(Backend::Postgres { url, table }, CLAIMED_READ).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_orders_a_holders_read() {
    let Ok(url) = std::env::var("PALISADE_TEST_REDIS") else {
        eprintln!("SKIP: PALISADE_TEST_REDIS not set; the Redis counter did not run");
        return;
    };
    let prefix = format!("{}:", unique("counter"));
    adapter_scenarios(Backend::Redis { url, prefix }, CLAIMED_READ).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_orders_a_holders_read() {
    let Ok(url) = std::env::var("PALISADE_TEST_MYSQL") else {
        eprintln!("SKIP: PALISADE_TEST_MYSQL not set; the MySQL/MariaDB counter did not run");
        return;
    };
    let table = unique("counter");
    adapter_scenarios(Backend::Mysql { url, table }, CLAIMED_READ).await;
}

/// NATS JetStream: holders publish "last value + 1" after reading the subject's last message.
/// A fenced publish expects that message to be still the last one, so in the interleaving A
/// (thawed first) publishes 1 and B's publish of 1 is refused, nothing stored (status 1); plain
/// publishes store 1 twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_publishes_no_duplicate_value() {
    let Ok(url) = std::env::var("PALISADE_TEST_NATS") else {
        eprintln!("SKIP: PALISADE_TEST_NATS not set; the NATS counter did not run");
        return;
    };
    let stream = unique("counter");
    let fenced = (
        "0",
        "1",
        1,
        "a fenced publish: the broker refuses B's, since the subject moved since B's read",
    );
    adapter_scenarios(Backend::Nats { url, stream }, fenced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_orders_a_holders_read() {
    let Some(server) = std::env::var("PALISADE_TEST_S3")
        .ok()
        .filter(|server| !server.trim().is_empty())
    else {
        eprintln!("SKIP: PALISADE_TEST_S3 not set; the S3 counter did not run");
        return;
    };
    let key = format!("counter/{}", unique("counter"));
    adapter_scenarios(Backend::S3 { server, key }, CLAIMED_READ).await;
}
