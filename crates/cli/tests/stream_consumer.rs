//! The consumer-side token filter (`palisade_fence::stream`) with real processes: a `palisade`
//! lock service, NATS JetStream (`PALISADE_TEST_NATS`) as the broker, PostgreSQL
//! (`PALISADE_TEST_POSTGRES`) as the consumer's own database, and every producer and consumer a
//! process of its own (this test executable re-run in child mode).
//!
//! - Producer A runs under `palisade lock feed --ttl 1s` and publishes five messages, each
//!   carrying `$PALISADE_SEQUENCER` in its `Palisade-Sequencer` header; then it is frozen
//!   (`SIGSTOP`) past its lease.
//! - Producer B is granted the lock and publishes five messages.
//! - The consumer applies each message as an increment to a counter row, through the filter,
//!   with the high-water mark, the drop count and its stream position in the same transaction.
//!   It is killed with `kill -9` midway through B's messages and started again from the
//!   position it committed; killed again once it has read them all, and started again.
//! - A thaws and publishes five more messages: late, with its old token. B publishes five more.
//!
//! The broker is JetStream with plain (unfenced) publishes, so A's late messages do reach the
//! stream, and the last consumer reads them first: only the filter, and the mark it kept in
//! PostgreSQL, stands between them and the counter. At the end the counter equals the number of messages with a current
//! token (counted from the stream itself), A's late ones are each dropped as stale exactly once,
//! and no message was applied twice across the restart. A consumer whose mark lived in memory
//! would restart with none and apply A's late messages.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use palisade_fence::stream::{Admission, SEQUENCER_HEADER, admit_postgres};
use palisade_fence::{Verifier, postgres};
use palisade_testkit::{Running, ServerProcess, locks_client};
use tokio_stream::StreamExt as _;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const LOCK: &str = "feed";
/// Messages each producer publishes before the pause, and again after it.
const BURST: usize = 5;
/// How long any one step may take before the test gives up.
const STEP: Duration = Duration::from_secs(60);

/// What the children are told, through their environment.
struct Setup {
    pg: String,
    nats: String,
    /// The JetStream stream (its subjects are `<stream>.>`) and the consumer's table.
    stream: String,
    /// The fence scope of the consumer's high-water mark.
    scope: String,
    public_key: String,
}

impl Setup {
    fn subject(&self) -> String {
        format!("{}.{LOCK}", self.stream)
    }

    /// This test executable running `child` (a `#[test]` below), told the setup.
    fn child(&self, child: &str, dir: &Path) -> std::process::Command {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", child, "--test-threads=1", "--nocapture"])
            .env("SC_PG", &self.pg)
            .env("SC_NATS", &self.nats)
            .env("SC_STREAM", &self.stream)
            .env("SC_SCOPE", &self.scope)
            .env("SC_PUBLIC_KEY", &self.public_key)
            .env("SC_DIR", dir);
        command
    }

    /// `palisade lock feed -- <producer child>` writing its files to `dir`.
    fn producer(&self, endpoint: &str, dir: &Path, ttl: &str) -> Child {
        std::fs::create_dir_all(dir).unwrap();
        let child = self.child("producer_child", dir);
        palisade_testkit::command(BIN)
            .args(["--endpoint", endpoint, "lock", LOCK, "--ttl", ttl])
            .args(["--wait", "60s", "--kill-grace", "1s", "--"])
            .arg(child.get_program())
            .args(child.get_args())
            .envs(child.get_envs().map(|(k, v)| (k, v.unwrap())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .process_group(0)
            .spawn()
            .expect("spawn palisade lock")
    }

    /// A consumer process, its output in `dir`.
    /// Starts a consumer, and returns once it has recorded the position it starts from: a
    /// consumer killed before that would leave no trace of its start, and the test could not
    /// tell where it resumed.
    fn consumer(&self, dir: &Path) -> Running {
        std::fs::create_dir_all(dir).unwrap();
        let mut command = self.child("consumer_child", dir);
        command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
        let before = starts(dir).len();
        let consumer = Running::spawn(command);
        let spawned = Instant::now();
        while starts(dir).len() == before {
            assert!(
                spawned.elapsed() < STEP,
                "the consumer did not start within {STEP:?}; stderr: {}",
                std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        consumer
    }

    fn from_env() -> Option<(Setup, PathBuf)> {
        let var = |name: &str| std::env::var(name).ok();
        let setup = Setup {
            pg: var("SC_PG")?,
            nats: var("SC_NATS")?,
            stream: var("SC_STREAM")?,
            scope: var("SC_SCOPE")?,
            public_key: var("SC_PUBLIC_KEY")?,
        };
        Some((setup, PathBuf::from(var("SC_DIR")?)))
    }
}

/// The positions the consumers in `dir` started from, one per whole line of `started`.
fn starts(dir: &Path) -> Vec<i64> {
    let text = std::fs::read_to_string(dir.join("started")).unwrap_or_default();
    (text.split_inclusive('\n'))
        .filter(|line| line.ends_with('\n'))
        .map(|line| line.trim_end().parse().unwrap())
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn wait_for_file(path: &Path) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            started.elapsed() < STEP,
            "{} did not appear within {STEP:?}; stderr: {}",
            path.display(),
            std::fs::read_to_string(path.with_file_name("stderr")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ----- the children -----

/// A producer under `palisade lock`: publishes [`BURST`] messages with its sequencer, writes
/// `early`, waits for `go`, publishes [`BURST`] more and writes `late`.
#[test]
fn producer_child() {
    let Some((setup, dir)) = Setup::from_env() else {
        return;
    };
    let sequencer = std::env::var("PALISADE_SEQUENCER").expect("run under palisade lock");
    std::fs::write(dir.join("pid"), format!("{}\n", std::process::id())).unwrap();
    let name = dir.file_name().unwrap().to_str().unwrap().to_owned();
    runtime().block_on(async {
        let context = async_nats::jetstream::new(async_nats::connect(&setup.nats).await.unwrap());
        let publish = async |part: &str| {
            for index in 0..BURST {
                let mut headers = HeaderMap::new();
                headers.insert(SEQUENCER_HEADER, sequencer.as_str());
                let payload = format!("{name} {part} {index}");
                context
                    .publish_with_headers(setup.subject(), headers, payload.into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            std::fs::write(dir.join(part), "published\n").unwrap();
        };
        publish("early").await;
        let started = Instant::now();
        while !dir.join("go").exists() {
            assert!(started.elapsed() < STEP, "never told to go on");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        publish("late").await;
    });
}

/// A consumer: from the stream position it committed last, each message in one PostgreSQL
/// transaction (the filter, then the increment or the drop count, the log line and the new
/// position), acknowledged after the commit. Appends the position it started from to
/// `started`; runs until killed, or for [`STEP`] at most.
#[test]
fn consumer_child() {
    let Some((setup, dir)) = Setup::from_env() else {
        return;
    };
    let table = &setup.stream;
    runtime().block_on(async {
        let mut client = pg_connect(&setup.pg).await;
        let verifier = Verifier::new(
            setup
                .public_key
                .parse::<palisade_sequencer::KeySet>()
                .unwrap(),
        );
        let position: i64 = client
            .query_one(&format!("SELECT position FROM {table}"), &[])
            .await
            .unwrap()
            .get(0);
        let context = async_nats::jetstream::new(async_nats::connect(&setup.nats).await.unwrap());
        let consumer = context
            .get_stream(&setup.stream)
            .await
            .unwrap()
            .create_consumer(pull::Config {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: position as u64 + 1,
                },
                ack_policy: AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("started"))
            .unwrap();
        std::io::Write::write_all(&mut log, format!("{position}\n").as_bytes()).unwrap();

        let started = Instant::now();
        while started.elapsed() < STEP {
            let mut batch = consumer
                .fetch()
                .max_messages(4)
                .expires(Duration::from_millis(200))
                .messages()
                .await
                .unwrap();
            while let Some(message) = batch.next().await {
                let message = message.unwrap();
                let sequence = message.info().unwrap().stream_sequence as i64;
                let header = message
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get(SEQUENCER_HEADER))
                    .map(|value| value.as_str());
                let payload = String::from_utf8(message.payload.to_vec()).unwrap();
                let txn = client.transaction().await.unwrap();
                let decided = match admit_postgres(&txn, &setup.scope, header, &verifier)
                    .await
                    .unwrap()
                {
                    Admission::Process(_) => {
                        let sql = format!("UPDATE {table} SET counter = counter + 1");
                        txn.execute(&sql, &[]).await.unwrap();
                        "process".to_owned()
                    }
                    Admission::Drop(why) => {
                        let sql = format!("UPDATE {table} SET dropped = dropped + 1");
                        txn.execute(&sql, &[]).await.unwrap();
                        why.kind().to_owned()
                    }
                };
                let sql = format!("INSERT INTO {table}_log VALUES ($1, $2, $3)");
                txn.execute(&sql, &[&sequence, &payload, &decided])
                    .await
                    .unwrap();
                let sql = format!("UPDATE {table} SET position = $1");
                txn.execute(&sql, &[&sequence]).await.unwrap();
                postgres::commit(txn).await.unwrap();
                message.ack().await.unwrap();
            }
        }
    });
}

// ----- the scenario -----

fn freeze(lock: &Child, dir: &Path) {
    kill(Pid::from_raw(lock.id() as i32), Signal::SIGSTOP).unwrap();
    killpg(section_group(dir), Signal::SIGSTOP).unwrap();
}

/// The process group `palisade lock` put its child in: the child's pid, as it wrote it.
fn section_group(dir: &Path) -> Pid {
    Pid::from_raw(wait_for_file(&dir.join("pid")).trim().parse().unwrap())
}

/// The consumer's committed position, counter and drop count.
async fn consumer_state(client: &tokio_postgres::Client, table: &str) -> (i64, i64, i64) {
    let row = client
        .query_one(
            &format!("SELECT position, counter, dropped FROM {table}"),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Polls the consumer's committed position until it reaches `at_least`.
async fn wait_for_position(client: &tokio_postgres::Client, table: &str, at_least: i64) -> i64 {
    let started = Instant::now();
    loop {
        let (position, _, _) = consumer_state(client, table).await;
        if position >= at_least {
            return position;
        }
        assert!(
            started.elapsed() < STEP,
            "the consumer stayed at position {position}, short of {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}_{}_{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_consumer_drops_a_superseded_producers_late_messages_and_applies_each_once() {
    let (Ok(pg), Ok(nats)) = (
        std::env::var("PALISADE_TEST_POSTGRES"),
        std::env::var("PALISADE_TEST_NATS"),
    ) else {
        eprintln!(
            "SKIP: PALISADE_TEST_POSTGRES or PALISADE_TEST_NATS not set; the stream consumer scenario did not run"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut locks = ServerProcess::lock_service(BIN, dir.path().join("locks"));
    locks.start();
    let endpoint = locks.endpoint();
    let public_key = locks_client(&endpoint)
        .await
        .public_key(palisade_proto::v1::PublicKeyRequest {})
        .await
        .unwrap()
        .into_inner()
        .public_key;
    let setup = Setup {
        pg,
        nats,
        stream: unique("feed"),
        scope: unique("feed_consumer"),
        public_key,
    };
    let table = setup.stream.clone();
    let client = pg_connect(&setup.pg).await;
    postgres::ensure_schema(&client).await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (counter bigint NOT NULL, dropped bigint NOT NULL, position bigint NOT NULL);
             INSERT INTO {table} VALUES (0, 0, 0);
             CREATE TABLE {table}_log (sequence bigint NOT NULL, payload text NOT NULL, decided text NOT NULL);"
        ))
        .await
        .unwrap();
    let context = async_nats::jetstream::new(async_nats::connect(&setup.nats).await.unwrap());
    let mut stream = context
        .create_stream(async_nats::jetstream::stream::Config {
            name: setup.stream.clone(),
            subjects: vec![format!("{}.>", setup.stream)],
            ..Default::default()
        })
        .await
        .unwrap();

    let burst = BURST as i64;
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    let consumer_dir = dir.path().join("consumer");
    let mut first = setup.consumer(&consumer_dir);

    // A publishes and is frozen past its one-second lease; B is granted and publishes.
    let mut lock_a = setup.producer(&endpoint, &dir_a, "1s");
    wait_for_file(&dir_a.join("early"));
    freeze(&lock_a, &dir_a);
    let mut lock_b = setup.producer(&endpoint, &dir_b, "30s");
    wait_for_file(&dir_b.join("early"));

    // The consumer dies (kill -9) once it is into B's messages, wherever it is in its loop;
    // restarted, it dies again once it has read all of them, so that the first message the
    // third one reads is A's late one: only a durable mark can drop it.
    let reached = wait_for_position(&client, &table, burst + 2).await;
    first.child.kill().unwrap();
    first.wait(STEP);
    let mut second = setup.consumer(&consumer_dir);
    wait_for_position(&client, &table, 2 * burst).await;
    second.child.kill().unwrap();
    second.wait(STEP);
    let third = setup.consumer(&consumer_dir);

    // A thaws (its section first, so it publishes before its `palisade lock` finds the lease
    // lost): its late messages carry its old token. Then B's late ones.
    std::fs::write(dir_a.join("go"), b"").unwrap();
    killpg(section_group(&dir_a), Signal::SIGCONT).unwrap();
    wait_for_file(&dir_a.join("late"));
    kill(Pid::from_raw(lock_a.id() as i32), Signal::SIGCONT).unwrap();
    std::fs::write(dir_b.join("go"), b"").unwrap();
    wait_for_file(&dir_b.join("late"));
    palisade_testkit::child::wait_with_timeout(&mut lock_a, STEP);
    let b_status = palisade_testkit::child::wait_with_timeout(&mut lock_b, STEP);
    assert!(b_status.success(), "B's palisade lock: {b_status:?}");

    // What the stream holds, in order, and which messages carry a token at least as new as any
    // before them: those are the current ones.
    let last = stream.info().await.unwrap().state.last_sequence as i64;
    assert_eq!(last, 4 * burst, "every published message is on the stream");
    let verifier = Verifier::new(
        setup
            .public_key
            .parse::<palisade_sequencer::KeySet>()
            .unwrap(),
    );
    let mut expected = Vec::new();
    let mut newest = 0;
    for sequence in 1..=last {
        let message = stream.get_raw_message(sequence as u64).await.unwrap();
        let header = message.headers.get(SEQUENCER_HEADER).unwrap().as_str();
        let token = verifier.verify(Some(header)).unwrap().token().get();
        let payload = String::from_utf8(message.payload.to_vec()).unwrap();
        let decided = if token >= newest { "process" } else { "stale" };
        newest = newest.max(token);
        expected.push((sequence, payload, decided.to_owned()));
    }
    let current = expected.iter().filter(|m| m.2 == "process").count() as i64;
    let stale: Vec<&str> = expected
        .iter()
        .filter(|m| m.2 == "stale")
        .map(|m| m.1.as_str())
        .collect();
    assert_eq!(current, 3 * burst, "A's early and all of B's are current");
    assert_eq!(
        stale,
        ["a late 0", "a late 1", "a late 2", "a late 3", "a late 4"]
    );

    wait_for_position(&client, &table, last).await;
    drop(third);
    let (position, counter, dropped) = consumer_state(&client, &table).await;
    assert_eq!(position, last);
    assert_eq!(
        counter, current,
        "the counter is the number of current messages"
    );
    assert_eq!(
        dropped,
        stale.len() as i64,
        "each stale message is dropped once"
    );
    let decided: Vec<(i64, String, String)> = client
        .query(
            &format!("SELECT sequence, payload, decided FROM {table}_log ORDER BY sequence"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(
        decided, expected,
        "each message decided once, across the restart"
    );
    // Each restart resumed where the killed consumer's last commit left it: the first within
    // B's messages (or at their end), the second at their end, before A's late ones.
    let starts = starts(&consumer_dir);
    assert!(
        matches!(starts[..], [0, resumed, end] if (reached..=2 * burst).contains(&resumed) && end == 2 * burst),
        "consumers started at positions {starts:?}; the first was killed past {reached}"
    );

    context.delete_stream(&setup.stream).await.unwrap();
    client
        .batch_execute(&format!(
            "DROP TABLE {table}, {table}_log; DELETE FROM palisade_fence WHERE scope = '{}'",
            setup.scope
        ))
        .await
        .unwrap();
}
