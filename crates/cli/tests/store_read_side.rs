//! Adversarial scenarios for the store's read side (issue #9), written from the documentation
//! alone — `docs/store-http.md`, `crates/cli/README.md`, ARCHITECTURE.md (the store section,
//! invariant 11) and the rustdoc of `Store`, `StoreClient` and the types — before reading the
//! implementation:
//!
//! - fenced reads: a read presenting a sequencer is checked like a write and advances the lock's
//!   accepted token, durably, before the value comes back; a read without one only looks;
//! - claims advance the accepted token and nothing else, and survive a restart (reopen, SIGKILL);
//! - revisions and conditional writes; transactions: compares, then ops, all or nothing, and a
//!   stale sequencer wins over a failing compare;
//! - limits and bad input: a clear error, nothing lost.
//!
//! This file holds the face `palisade store …`: in-process `execute` as in `store_cli.rs`, and
//! real child processes where the environment or a SIGKILL matters: the server is `palisade store
//! serve`, and each client command is this test executable re-run as the child (see
//! [`child_process_entry`]). The library and HTTP faces are in `crates/store/tests/read_side.rs`.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, ExitStatus};

use clap::Parser;
use palisade_cli::store::{
    EXIT_COMPARE_FAILED, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_STALE, StoreCommand, execute,
};
use palisade_store::limits::KEY_BYTES_MAX;
use palisade_store::{FenceView, StoreClient, StoreClientError, StoreError};
use palisade_testkit::{ServerProcess, ServiceKey, StoreServer};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const LOCK: &str = "jobs/nightly";
const OTHER_LOCK: &str = "jobs/hourly";
const SEQUENCER: &str = "Palisade-Sequencer";

// ---------------------------------------------------------------------------------------------
// Library helpers
// ---------------------------------------------------------------------------------------------

fn fence_of(lock: &str, token_max: u64, holder_session: u64) -> FenceView {
    FenceView {
        lock: lock.into(),
        token_max: Some(token_max),
        holder_session: Some(holder_session),
    }
}

// ---------------------------------------------------------------------------------------------
// Library: fenced reads
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// Status and JSON body; panics if the body is not JSON ("Every error is JSON").
async fn answer(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("HTTP {status}: body is not JSON: {body:?}"));
    (status, body)
}

struct Http {
    http: reqwest::Client,
    url: String,
}

impl Http {
    fn new(url: &str) -> Http {
        Http {
            http: reqwest::Client::new(),
            url: url.to_owned(),
        }
    }

    async fn get(&self, path: &str, sequencer: Option<&str>) -> (u16, Value) {
        let mut request = self.http.get(format!("{}{path}", self.url));
        if let Some(sequencer) = sequencer {
            request = request.header(SEQUENCER, sequencer);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn put(
        &self,
        key: &str,
        value: &str,
        sequencer: &str,
        condition: Option<(&str, &str)>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .put(format!("{}/v1/kv/{key}", self.url))
            .header(SEQUENCER, sequencer)
            .body(value.to_owned());
        if let Some((name, value)) = condition {
            request = request.header(name, value);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn post(&self, path: &str, sequencer: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body);
        if let Some(sequencer) = sequencer {
            request = request.header(SEQUENCER, sequencer);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn fence(&self, lock: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/fence/{lock}"), None).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn value(&self, key: &str) -> Option<(Value, Value)> {
        let (status, body) = self.get(&format!("/v1/kv/{key}"), None).await;
        match status {
            200 => Some((body["value"].clone(), body["revision"].clone())),
            404 => None,
            _ => panic!("GET {key}: {status} {body}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// `palisade store …`, in process (as store_cli.rs)
// ---------------------------------------------------------------------------------------------

/// The `palisade store` part of the command line, as the `palisade` binary nests it.
#[derive(Debug, Parser)]
#[command(name = "palisade-store")]
struct StoreCli {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Debug)]
struct Outcome {
    status: u8,
    stdout: String,
    stderr: String,
}

/// Runs a client subcommand in this process. Pass `--sequencer` explicitly: the environment is
/// shared by all tests of this process (the child-process tests cover `$PALISADE_SEQUENCER`).
async fn palisade_store(args: &[&str]) -> Outcome {
    let cli =
        StoreCli::try_parse_from(std::iter::once("palisade-store").chain(args.iter().copied()))
            .unwrap_or_else(|error| panic!("{args:?}: {error}"));
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let status = execute(cli.command, &mut stdout, &mut stderr).await;
    Outcome {
        status,
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

#[tokio::test]
async fn cli_get_under_a_lock_is_fenced_and_get_unfenced_only_looks() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let newest = service.grant(LOCK, 9, 3);
    let put = palisade_store(&["put", "counter", "41", "--sequencer", &old, "--store", url]).await;
    assert_eq!(put.status, 0, "{}", put.stderr);

    let get = palisade_store(&["get", "counter", "--sequencer", &new, "--store", url]).await;
    assert_eq!(
        (get.status, get.stdout.as_str(), get.stderr.as_str()),
        (0, "41\n", "")
    );
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));

    let refused =
        palisade_store(&["put", "counter", "42", "--sequencer", &old, "--store", url]).await;
    assert_eq!(refused.status, EXIT_STALE, "{}", refused.stderr);
    let stale_get = palisade_store(&["get", "counter", "--sequencer", &old, "--store", url]).await;
    assert_eq!(stale_get.status, EXIT_STALE, "{stale_get:?}");
    assert_eq!(stale_get.stdout, "", "a refused read prints no value");
    assert!(
        stale_get.stderr.starts_with(
            "palisade: refused: token 5 for lock \"jobs/nightly\" is stale; the store has accepted token 7 (presented by session 2)"
        ),
        "{}",
        stale_get.stderr
    );
    assert_eq!(
        stale_get.stderr, refused.stderr,
        "the same explanation as a write"
    );

    // --unfenced only looks, even with a newer sequencer at hand.
    let look = palisade_store(&[
        "get",
        "counter",
        "--unfenced",
        "--sequencer",
        &newest,
        "--store",
        url,
    ])
    .await;
    assert_eq!(
        (look.status, look.stdout.as_str()),
        (0, "41\n"),
        "{}",
        look.stderr
    );
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));
    // And so does a get with no sequencer at all.
    let look = palisade_store(&["get", "counter", "--store", url]).await;
    assert_eq!(look.status, 0);
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));

    // A fenced get of an absent key: 5, and the lock advanced anyway.
    let absent = palisade_store(&["get", "nothing", "--sequencer", &newest, "--store", url]).await;
    assert_eq!(absent.status, EXIT_NOT_FOUND, "{absent:?}");
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 9, 3));

    // --json has the revision.
    let json = palisade_store(&[
        "get",
        "counter",
        "--json",
        "--sequencer",
        &newest,
        "--store",
        url,
    ])
    .await;
    assert_eq!(json.status, 0, "{}", json.stderr);
    let entry: Value = serde_json::from_str(&json.stdout).unwrap();
    let revision = client.get("counter").await.unwrap().unwrap().revision;
    assert_eq!(
        (
            &entry["value"],
            &entry["token"],
            &entry["session"],
            &entry["revision"],
            &entry["lock"]
        ),
        (
            &json!("41"),
            &json!(5),
            &json!(1),
            &json!(revision),
            &json!(LOCK)
        ),
        "{entry}"
    );

    // Another lock's sequencer on a fenced get: refused, 1.
    let foreign = palisade_store(&[
        "get",
        "counter",
        "--sequencer",
        &service.grant(OTHER_LOCK, 50, 4),
        "--store",
        url,
    ])
    .await;
    assert_eq!(foreign.status, EXIT_REFUSED, "{foreign:?}");
}

#[tokio::test]
async fn cli_claim_announces_the_grant_and_a_stale_or_missing_claim_is_refused() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    assert_eq!(
        palisade_store(&["put", "a", "1", "--sequencer", &old, "--store", url])
            .await
            .status,
        0
    );
    let before = client.get("a").await.unwrap();
    let revision_before = before.as_ref().unwrap().revision;

    let claim = palisade_store(&["claim", LOCK, "--sequencer", &new, "--store", url]).await;
    assert_eq!(claim.status, 0, "{claim:?}");
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));
    assert_eq!(client.get("a").await.unwrap(), before);

    let json =
        palisade_store(&["claim", LOCK, "--json", "--sequencer", &new, "--store", url]).await;
    assert_eq!(json.status, 0, "{json:?}");
    let ack: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        (&ack["advanced"], &ack["previous_token_max"]),
        (&json!(false), &json!(7))
    );

    let stale_claim = palisade_store(&["claim", LOCK, "--sequencer", &old, "--store", url]).await;
    assert_eq!(stale_claim.status, EXIT_STALE, "{stale_claim:?}");
    assert!(
        stale_claim.stderr.starts_with("palisade: refused: token 5"),
        "{}",
        stale_claim.stderr
    );
    let missing = palisade_store(&["claim", LOCK, "--store", url]).await;
    assert_eq!(missing.status, EXIT_REFUSED, "{missing:?}");
    let foreign = palisade_store(&[
        "claim",
        OTHER_LOCK,
        "--sequencer",
        &service.grant(LOCK, 20, 3),
        "--store",
        url,
    ])
    .await;
    assert_eq!(
        foreign.status, EXIT_REFUSED,
        "a claim of another lock than the sequencer's: {foreign:?}"
    );

    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 7, 2));
    assert_eq!(client.fence(OTHER_LOCK).await.unwrap().token_max, None);
    let put = palisade_store(&["put", "a", "x", "--sequencer", &old, "--store", url]).await;
    assert_eq!(put.status, EXIT_STALE);
    assert_eq!(
        client.get("a").await.unwrap().unwrap().revision,
        revision_before
    );
}

#[tokio::test]
async fn cli_conditional_writes_and_transactions_exit_8_when_a_compare_fails_and_3_when_stale() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 9, 2);
    assert_eq!(
        palisade_store(&["put", "counter", "7", "--sequencer", &old, "--store", url])
            .await
            .status,
        0
    );
    let at = client.get("counter").await.unwrap().unwrap().revision;
    let wrong = (at + 1).to_string();
    let right = at.to_string();

    let failed: Vec<Vec<&str>> = vec![
        vec!["put", "counter", "8", "--if-revision", &wrong],
        vec!["put", "counter", "8", "--if-revision", "0"],
        vec!["put", "counter", "8", "--create-only"],
        vec!["delete", "counter", "--if-revision", &wrong],
        vec!["txn", "--if-absent", "counter", "put", "counter", "8"],
        vec!["txn", "--if-exists", "other", "put", "counter", "8"],
        vec!["txn", "--if-value", "counter=6", "put", "counter", "8"],
    ];
    let revision_compare = format!("counter={wrong}");
    let mut failed = failed;
    failed.push(vec![
        "txn",
        "--if-revision",
        &revision_compare,
        "put",
        "counter",
        "8",
        "put",
        "other",
        "o",
    ]);
    for args in &failed {
        let mut full = args.clone();
        full.splice(1..1, ["--sequencer", &new, "--store", url]);
        let outcome = palisade_store(&full).await;
        assert_eq!(outcome.status, EXIT_COMPARE_FAILED, "{args:?}: {outcome:?}");
        assert!(
            outcome.stderr.starts_with("palisade: "),
            "{args:?}: {outcome:?}"
        );
        assert_eq!(outcome.stdout, "", "{args:?}");
    }
    assert_eq!(client.get("counter").await.unwrap().unwrap().value, b"7");
    assert_eq!(client.get("other").await.unwrap(), None);
    assert_eq!(
        client.fence(LOCK).await.unwrap(),
        fence_of(LOCK, 5, 1),
        "failed compares advance nothing"
    );

    // The stale holder: 3, whatever the compare says.
    for args in [
        vec![
            "txn",
            "--if-revision",
            &revision_compare,
            "put",
            "counter",
            "0",
        ],
        vec!["put", "counter", "0", "--create-only"],
    ] {
        // First let 9 write, once, so that 5 is stale.
        if client.fence(LOCK).await.unwrap().token_max == Some(5) {
            let put = palisade_store(&[
                "txn",
                "--sequencer",
                &new,
                "--store",
                url,
                "--if-revision",
                &format!("counter={right}"),
                "put",
                "counter",
                "8",
                "get",
                "counter",
            ])
            .await;
            assert_eq!(put.status, 0, "{put:?}");
        }
        let mut full = args.clone();
        full.splice(1..1, ["--sequencer", &old, "--store", url]);
        let outcome = palisade_store(&full).await;
        assert_eq!(outcome.status, EXIT_STALE, "{args:?}: {outcome:?}");
    }
    assert_eq!(client.get("counter").await.unwrap().unwrap().value, b"8");

    // Compares that hold.
    let at = client.get("counter").await.unwrap().unwrap().revision;
    let ok = palisade_store(&[
        "txn",
        "--sequencer",
        &new,
        "--store",
        url,
        "--if-value",
        "counter=8",
        "--if-absent",
        "other",
        "--if-exists",
        "counter",
        "--if-revision",
        &format!("counter={at}"),
        "put",
        "counter",
        "9",
        "delete",
        "other",
        "get",
        "counter",
    ])
    .await;
    assert_eq!(ok.status, 0, "{ok:?}");
    assert_eq!(client.get("counter").await.unwrap().unwrap().value, b"9");
    let at = client.get("counter").await.unwrap().unwrap().revision;
    let put = palisade_store(&[
        "put",
        "counter",
        "10",
        "--if-revision",
        &at.to_string(),
        "--sequencer",
        &new,
        "--store",
        url,
    ])
    .await;
    assert_eq!(put.status, 0, "{put:?}");
    let create = palisade_store(&[
        "put",
        "fresh",
        "f",
        "--create-only",
        "--sequencer",
        &new,
        "--store",
        url,
    ])
    .await;
    assert_eq!(create.status, 0, "{create:?}");
}

#[tokio::test]
async fn cli_bad_transactions_are_refused_and_apply_nothing() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();
    let client = StoreClient::new(url).unwrap();
    let holder = service.grant(LOCK, 5, 1);
    let newer = service.grant(LOCK, 6, 2);
    assert_eq!(
        palisade_store(&["put", "a", "1", "--sequencer", &holder, "--store", url])
            .await
            .status,
        0
    );
    let long_key = "k".repeat(KEY_BYTES_MAX + 1);
    let bad: Vec<Vec<&str>> = vec![
        vec!["txn", "put", "a", "2", "increment", "a"],
        vec!["txn", "put", "a"],
        vec!["txn", "put", "a", "2", "get"],
        vec!["txn"],
        vec!["txn", "--if-revision", "a=-1", "put", "a", "2"],
        vec![
            "txn",
            "--if-revision",
            "a=99999999999999999999999",
            "put",
            "a",
            "2",
        ],
        vec!["txn", "--if-revision", "a", "put", "a", "2"],
        vec!["txn", "put", "a", "2", "get", &long_key],
    ];
    for args in &bad {
        let mut full = args.clone();
        full.splice(1..1, ["--sequencer", &newer, "--store", url]);
        let Ok(cli) =
            StoreCli::try_parse_from(std::iter::once("palisade-store").chain(full.iter().copied()))
        else {
            continue; // refused by the command line parser: exit 2, nothing sent
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let status = execute(cli.command, &mut stdout, &mut stderr).await;
        let stderr = String::from_utf8(stderr).unwrap();
        assert!(
            status == EXIT_REFUSED || status == 2,
            "{args:?}: exit {status}: {stderr}"
        );
        assert!(stderr.starts_with("palisade: "), "{args:?}: {stderr}");
    }
    assert_eq!(client.get("a").await.unwrap().unwrap().value, b"1");
    assert_eq!(client.fence(LOCK).await.unwrap(), fence_of(LOCK, 5, 1));
}

// ---------------------------------------------------------------------------------------------
// Real processes: `$PALISADE_SEQUENCER`, and `palisade store serve` killed with SIGKILL
// ---------------------------------------------------------------------------------------------

const CHILD_ROLE_ENV: &str = "PALISADE_READ_SIDE_TEST_CHILD";
const CHILD_ARGS_ENV: &str = "PALISADE_READ_SIDE_TEST_ARGS";
const OUTCOME_PREFIX: &str = "palisade-read-side-outcome ";

/// The entry point of the child processes: this test executable, run again with
/// `child_process_entry --exact --ignored`, is one client command.
#[test]
#[ignore = "entry point of the child processes the other tests start; does nothing alone"]
fn child_process_entry() {
    if std::env::var(CHILD_ROLE_ENV).as_deref() == Ok("cli") {
        run_cli_child();
    }
}

fn run_cli_child() -> ! {
    let args: Vec<String> = serde_json::from_str(&std::env::var(CHILD_ARGS_ENV).unwrap()).unwrap();
    let parsed = StoreCli::try_parse_from(
        std::iter::once("palisade-store").chain(args.iter().map(String::as_str)),
    );
    let (status, stdout, stderr) = match parsed {
        Err(error) => (2, Vec::new(), error.to_string().into_bytes()),
        Ok(cli) => {
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            let status = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(execute(cli.command, &mut stdout, &mut stderr));
            (status, stdout, stderr)
        }
    };
    let line = json!({
        "status": status,
        "stdout": String::from_utf8_lossy(&stdout),
        "stderr": String::from_utf8_lossy(&stderr),
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{OUTCOME_PREFIX}{line}").unwrap();
    out.flush().unwrap();
    std::process::exit(i32::from(status));
}

/// This executable as a child, with none of the user's palisade variables.
fn child_command(role: &str) -> Command {
    let mut command = palisade_testkit::command(std::env::current_exe().unwrap());
    command
        .args([
            "child_process_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE_ENV, role);
    command
}

/// `palisade store ARGS…` as a process, with `$PALISADE_SEQUENCER` set if given.
fn store_process(args: &[&str], sequencer_env: Option<&str>) -> (Outcome, ExitStatus) {
    let mut command = child_command("cli");
    command.env(CHILD_ARGS_ENV, serde_json::to_string(args).unwrap());
    if let Some(sequencer) = sequencer_env {
        command.env("PALISADE_SEQUENCER", sequencer);
    }
    let ran = palisade_testkit::run(command);
    let line = ran
        .stdout
        .lines()
        .find_map(|line| line.split_once(OUTCOME_PREFIX).map(|(_, outcome)| outcome))
        .unwrap_or_else(|| {
            panic!(
                "{args:?}: no outcome from the child ({}): {}\n{}",
                ran.status, ran.stdout, ran.stderr
            )
        });
    let outcome: Value = serde_json::from_str(line).unwrap();
    let outcome = Outcome {
        status: u8::try_from(outcome["status"].as_u64().unwrap()).unwrap(),
        stdout: outcome["stdout"].as_str().unwrap().to_owned(),
        stderr: outcome["stderr"].as_str().unwrap().to_owned(),
    };
    (outcome, ran.status)
}

/// `palisade store serve` on the data directory `store-data` in `dir`, started; the same `dir`
/// again is the same store.
fn store_serve(dir: &Path, service: &ServiceKey) -> ServerProcess {
    let public_key = service.key.public_key().to_string();
    let mut server = ServerProcess::store(BIN, dir.join("store-data"), &public_key);
    server.start();
    server
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn process_palisade_store_get_presents_palisade_sequencer_from_the_environment() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store_serve(dir.path(), &service);
    let url = server.endpoint();
    let rt = runtime();
    let client = StoreClient::new(&url).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    let newest = service.grant(LOCK, 9, 3);

    // put reads $PALISADE_SEQUENCER.
    let (put, status) = store_process(&["put", "counter", "41", "--store", &url], Some(&old));
    assert_eq!(put.status, 0, "{put:?}");
    assert_eq!(status.code(), Some(0));

    // get under a lock (the variable set) is fenced.
    let (get, _) = store_process(&["get", "counter", "--store", &url], Some(&new));
    assert_eq!((get.status, get.stdout.as_str()), (0, "41\n"), "{get:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 7, 2)
    );

    // So the older holder is out, for reads too.
    let (stale_put, status) = store_process(&["put", "counter", "42", "--store", &url], Some(&old));
    assert_eq!(stale_put.status, EXIT_STALE, "{stale_put:?}");
    assert_eq!(status.code(), Some(i32::from(EXIT_STALE)));
    let (stale_get, _) = store_process(&["get", "counter", "--store", &url], Some(&old));
    assert_eq!(stale_get.status, EXIT_STALE, "{stale_get:?}");
    assert_eq!(stale_get.stdout, "");

    // --unfenced, and no variable at all, only look.
    let (look, _) = store_process(
        &["get", "counter", "--unfenced", "--store", &url],
        Some(&newest),
    );
    assert_eq!((look.status, look.stdout.as_str()), (0, "41\n"), "{look:?}");
    let (look, _) = store_process(&["get", "counter", "--store", &url], None);
    assert_eq!((look.status, look.stdout.as_str()), (0, "41\n"), "{look:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 7, 2)
    );

    // claim reads the variable too.
    let (claim, _) = store_process(&["claim", LOCK, "--store", &url], Some(&newest));
    assert_eq!(claim.status, 0, "{claim:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 9, 3)
    );
    let (stale_claim, _) = store_process(&["claim", LOCK, "--store", &url], Some(&new));
    assert_eq!(stale_claim.status, EXIT_STALE, "{stale_claim:?}");

    // Read-modify-write as one step: txn takes the sequencer from the environment too.
    let (txn, _) = store_process(
        &[
            "txn",
            "--store",
            &url,
            "--if-value",
            "counter=41",
            "put",
            "counter",
            "42",
        ],
        Some(&newest),
    );
    assert_eq!(txn.status, 0, "{txn:?}");
    assert_eq!(
        rt.block_on(client.get("counter")).unwrap().unwrap().value,
        b"42"
    );
    drop(server);
}

#[test]
fn process_claims_and_fenced_reads_survive_a_sigkill_of_the_store_server() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let old = service.grant(LOCK, 5, 1);
    let reader = service.grant(LOCK, 7, 2);
    let claimer = service.grant(OTHER_LOCK, 11, 3);
    let rt = runtime();

    let mut server = store_serve(dir.path(), &service);
    rt.block_on(async {
        let http = Http::new(&server.endpoint());
        assert_eq!(http.put("a", "1", &old, None).await.0, 200);
        let (status, body) = http.get("/v1/kv/a", Some(&reader)).await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = http
            .post("/v1/claim/jobs/hourly", Some(&claimer), vec![])
            .await;
        assert_eq!(status, 200, "{body}");
    });
    server.kill9();

    for round in 0..2 {
        let mut server = store_serve(dir.path(), &service);
        rt.block_on(async {
            let http = Http::new(&server.endpoint());
            assert_eq!(
                http.fence(LOCK).await,
                json!({"lock": LOCK, "token_max": 7, "holder_session": 2}),
                "round {round}"
            );
            assert_eq!(
                http.fence(OTHER_LOCK).await,
                json!({"lock": OTHER_LOCK, "token_max": 11, "holder_session": 3})
            );
            let (status, body) = http.put("a", "x", &old, None).await;
            assert_eq!((status, &body["accepted"]), (409, &json!(7)), "{body}");
            let (status, body) = http.get("/v1/kv/a", Some(&old)).await;
            assert_eq!((status, &body["kind"]), (409, &json!("stale")), "{body}");
            let (status, body) = http
                .post(
                    "/v1/claim/jobs/hourly",
                    Some(&service.grant(OTHER_LOCK, 10, 4)),
                    vec![],
                )
                .await;
            assert_eq!((status, &body["accepted"]), (409, &json!(11)), "{body}");
            assert_eq!(http.value("a").await.unwrap().0, json!("1"));
        });
        server.kill9();
    }

    // The CLI against a restarted process: a claim there, then SIGKILL, then still refused.
    let mut server = store_serve(dir.path(), &service);
    let newer = service.grant(LOCK, 12, 5);
    let (claim, _) = store_process(
        &["claim", LOCK, "--store", &server.endpoint()],
        Some(&newer),
    );
    assert_eq!(claim.status, 0, "{claim:?}");
    server.kill9();
    let server = store_serve(dir.path(), &service);
    let (stale_get, _) = store_process(&["get", "a", "--store", &server.endpoint()], Some(&reader));
    assert_eq!(stale_get.status, EXIT_STALE, "{stale_get:?}");
    assert!(
        stale_get.stderr.contains("accepted token 12"),
        "{}",
        stale_get.stderr
    );
}

#[test]
fn process_revisions_keep_growing_after_a_sigkill() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let holder = service.grant(LOCK, 5, 1);
    let rt = runtime();
    let mut last = 0;
    for round in 0..3 {
        let mut server = store_serve(dir.path(), &service);
        let client = StoreClient::new(&server.endpoint()).unwrap();
        let revision = rt
            .block_on(client.put("a", format!("{round}").as_bytes(), Some(&holder), None))
            .unwrap()
            .revision;
        assert!(
            revision > last,
            "round {round}: revision {revision} after {last}"
        );
        // An If-Match of the revision before the kill must not match a later write.
        if last > 0 {
            let error = rt
                .block_on(client.put_if_revision("a", b"x", last, Some(&holder), None))
                .unwrap_err();
            assert!(
                matches!(
                    error,
                    StoreClientError::Store(StoreError::CompareFailed { .. })
                ),
                "{error:?}"
            );
        }
        last = revision;
        server.kill9();
    }
}

#[test]
fn process_get_unfenced_with_a_stale_palisade_sequencer_still_reads() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store_serve(dir.path(), &service);
    let rt = runtime();
    let client = StoreClient::new(&server.endpoint()).unwrap();
    let old = service.grant(LOCK, 5, 1);
    let new = service.grant(LOCK, 7, 2);
    rt.block_on(client.put("a", b"1", Some(&new), None))
        .unwrap();

    let (look, _) = store_process(
        &["get", "a", "--unfenced", "--store", &server.endpoint()],
        Some(&old),
    );
    assert_eq!((look.status, look.stdout.as_str()), (0, "1\n"), "{look:?}");
    let (fenced, _) = store_process(&["get", "a", "--store", &server.endpoint()], Some(&old));
    assert_eq!(fenced.status, EXIT_STALE, "{fenced:?}");
    assert_eq!(
        rt.block_on(client.fence(LOCK)).unwrap(),
        fence_of(LOCK, 7, 2)
    );
}
