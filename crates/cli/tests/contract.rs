//! The public contract of the `palisade` command, tested from the outside.
//!
//! Written from the invariants of ARCHITECTURE.md, the README, the CLI README
//! (exit statuses) and `crates/store/docs/store-http.md` alone, without reading the
//! implementation. Every test starts a real `palisade serve` (and, where needed, a real
//! `palisade store serve`) on a temporary directory and a free loopback port, drives them with
//! the real binary the way a shell user would, and asserts what that user observes: exit
//! statuses, printed grants, environment variables, error messages and HTTP answers.

use std::collections::BTreeSet;
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// How long any single CLI invocation may take before the test gives up on it.
const CLI_DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Harness: real processes, killed on drop.
// ---------------------------------------------------------------------------------------------

/// A child process that is killed (and reaped) when the value is dropped.
struct KillOnDrop {
    child: Child,
    name: &'static str,
    log: std::path::PathBuf,
}

impl KillOnDrop {
    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a user sees after running one command.
#[derive(Debug)]
struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!("stdout is not JSON ({e}): {self:?}");
        })
    }

    #[track_caller]
    fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code(), Some(code), "unexpected exit status: {self:?}");
        self
    }

    #[track_caller]
    fn expect_success(&self) -> &Self {
        self.expect_code(0)
    }
}

/// A `palisade` command with no `PALISADE_*` variable inherited from the test's environment.
fn bare_palisade() -> Command {
    let mut cmd = Command::new(BIN);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PALISADE_") {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs a command to completion (with a deadline), capturing its output.
fn run(mut cmd: Command) -> Out {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn palisade");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CLI_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {CLI_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[track_caller]
fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A lock service, optionally with a fenced store, on temporary directories.
struct Palisade {
    endpoint: String,
    store_url: String,
    // Field order matters: the processes die before their directory is removed.
    _store: Option<KillOnDrop>,
    _lock: KillOnDrop,
    _dir: tempfile::TempDir,
}

impl Palisade {
    /// `palisade serve` only.
    fn start() -> Palisade {
        Self::start_inner(false)
    }

    /// `palisade serve` and `palisade store serve --public-key "$(palisade pubkey)"`.
    fn start_with_store() -> Palisade {
        Self::start_inner(true)
    }

    fn start_inner(with_store: bool) -> Palisade {
        let dir = tempfile::tempdir().unwrap();
        let (lock, endpoint) = Self::spawn_ready(dir.path(), "serve", |port| {
            let mut cmd = bare_palisade();
            cmd.arg("serve")
                .arg("--data-dir")
                .arg(dir.path().join("lock-data"))
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"));
            cmd
        });
        let mut this = Palisade {
            endpoint,
            store_url: String::new(),
            _store: None,
            _lock: lock,
            _dir: dir,
        };
        if with_store {
            let key = this
                .run(&["pubkey"])
                .expect_success()
                .stdout
                .trim()
                .to_owned();
            let data = this._dir.path().join("store-data");
            let (store, url) = Self::spawn_ready(this._dir.path(), "store", |port| {
                let mut cmd = bare_palisade();
                cmd.args(["store", "serve", "--data-dir"])
                    .arg(&data)
                    .arg("--listen")
                    .arg(format!("127.0.0.1:{port}"))
                    .arg("--public-key")
                    .arg(&key);
                cmd
            });
            this.store_url = url;
            this._store = Some(store);
        }
        this
    }

    /// Spawns a server on a free port and polls until it answers a client, retrying on
    /// another port if the first one was taken in the meantime.
    fn spawn_ready(
        dir: &Path,
        name: &'static str,
        command: impl Fn(u16) -> Command,
    ) -> (KillOnDrop, String) {
        for attempt in 0..3 {
            let port = free_port();
            let url = format!("http://127.0.0.1:{port}");
            let log = dir.join(format!("{name}-{attempt}.log"));
            let file = std::fs::File::create(&log).unwrap();
            let mut cmd = command(port);
            cmd.stdout(file.try_clone().unwrap()).stderr(file);
            let mut proc = KillOnDrop {
                child: cmd.spawn().expect("spawn server"),
                name,
                log,
            };
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if !proc.is_running() {
                    eprintln!("{} exited early:\n{}", proc.name, proc.log());
                    break;
                }
                let mut probe = bare_palisade();
                let expected = if name == "store" {
                    probe.args(["store", "get", "readiness-probe", "--store", &url]);
                    5 // key not found: the store answered
                } else {
                    probe.args(["--endpoint", &url, "locks", "--json"]);
                    0
                };
                if run(probe).code() == Some(expected) {
                    return (proc, url);
                }
                assert!(
                    Instant::now() < deadline,
                    "{name} not ready on {url}:\n{}",
                    proc.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("could not start {name}");
    }

    /// A `palisade` command pointed at these servers through the environment.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = bare_palisade();
        cmd.env("PALISADE_ENDPOINT", &self.endpoint);
        if !self.store_url.is_empty() {
            cmd.env("PALISADE_STORE", &self.store_url);
        }
        cmd.args(args);
        cmd
    }

    fn run(&self, args: &[&str]) -> Out {
        run(self.cmd(args))
    }

    /// `palisade acquire NAME --ttl TTL --json`, which must succeed.
    #[track_caller]
    fn acquire(&self, name: &str, ttl: &str) -> Grant {
        let out = self.run(&["acquire", name, "--ttl", ttl, "--json"]);
        out.expect_success();
        let grant = Grant::from_json(&out.json());
        assert_eq!(grant.lock, name, "acquire --json names the lock");
        grant
    }

    fn status(&self, name: &str) -> Value {
        self.run(&["status", name, "--json"])
            .expect_success()
            .json()
    }
}

/// A grant as printed by `palisade acquire --json`.
#[derive(Debug, Clone)]
struct Grant {
    lock: String,
    token: u64,
    sequencer: String,
    session: String,
}

impl Grant {
    fn from_json(v: &Value) -> Grant {
        Grant {
            lock: v["lock"].as_str().expect("lock").to_owned(),
            token: v["token"].as_u64().expect("token is a number"),
            sequencer: v["sequencer"].as_str().expect("sequencer").to_owned(),
            session: id_string(&v["session"]),
        }
    }
}

/// A session id as a command-line argument, whether the JSON gives a number or a string.
fn id_string(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        other => panic!("not a session id: {other}"),
    }
}

/// The sequencer with one character of its signature changed.
fn flip_signature_char(sequencer: &str) -> String {
    let sig_start = sequencer.rfind('.').unwrap() + 1;
    let mut bytes = sequencer.as_bytes().to_vec();
    // The middle of the signature: every bit of these characters is significant.
    let at = sig_start + (bytes.len() - sig_start) / 2;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

/// The sequencer with its token replaced, signature kept: the classic forgery.
fn with_forged_token(sequencer: &str, token: u64) -> String {
    let mut fields: Vec<String> = sequencer.split('.').map(str::to_owned).collect();
    assert_eq!(fields.len(), 5, "pal1.<lock>.<token>.<session>.<sig>");
    fields[2] = token.to_string();
    fields.join(".")
}

/// Blocking HTTP against the fenced store.
struct Http {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

struct Resp {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "answer ({}) is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

impl Http {
    fn new(base: &str) -> Http {
        Http {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            client: reqwest::Client::new(),
            base: base.to_owned(),
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> Resp {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.rt.block_on(async {
            let resp = req.send().await.expect("store answers");
            Resp {
                status: resp.status().as_u16(),
                headers: resp.headers().clone(),
                body: resp.bytes().await.unwrap().to_vec(),
            }
        })
    }

    fn get(&self, path: &str) -> Resp {
        self.send("GET", path, &[], Vec::new())
    }

    fn put(&self, path: &str, sequencer: &str, body: &str) -> Resp {
        self.send(
            "PUT",
            path,
            &[("Palisade-Sequencer", sequencer)],
            body.to_owned(),
        )
    }
}

#[track_caller]
fn expect_error(resp: &Resp, status: u16, kind: &str) -> Value {
    let body = resp.json();
    assert_eq!(resp.status, status, "status of {body}");
    assert_eq!(body["kind"], kind, "kind of {body}");
    body
}

// ---------------------------------------------------------------------------------------------
// `palisade lock NAME -- CMD`
// ---------------------------------------------------------------------------------------------

#[test]
fn lock_runs_the_command_with_its_grant_in_the_environment_and_passes_its_exit_status_through() {
    let p = Palisade::start();
    let out = p.run(&[
        "lock",
        "jobs/env",
        "--",
        "sh",
        "-c",
        r#"printf '%s\n%s\n%s\n%s\n' "$PALISADE_LOCK" "$PALISADE_TOKEN" "$PALISADE_SEQUENCER" "$PALISADE_SESSION"; exit 7"#,
    ]);
    out.expect_code(7);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{out:?}");
    assert_eq!(lines[0], "jobs/env");
    let token: u64 = lines[1].parse().expect("PALISADE_TOKEN is a number");
    assert!(token > 0);
    let fields: Vec<&str> = lines[2].split('.').collect();
    assert_eq!(
        fields.len(),
        5,
        "pal1.<lock>.<token>.<session>.<sig>: {}",
        lines[2]
    );
    assert_eq!(fields[0], "pal1");
    assert_eq!(fields[2], lines[1], "the sequencer carries the token");
    assert!(!lines[3].is_empty(), "PALISADE_SESSION is set");
    assert!(lines[2].is_ascii() && !lines[2].contains(' '));

    // Released when the command exited: the next user gets it at once, with a larger token.
    assert!(p.status("jobs/env")["holder"].is_null());
    let out = p.run(&[
        "lock",
        "jobs/env",
        "--wait",
        "0",
        "--",
        "sh",
        "-c",
        r#"echo "$PALISADE_TOKEN""#,
    ]);
    out.expect_success();
    let second: u64 = out.stdout.trim().parse().unwrap();
    assert!(second > token, "tokens grow: {token} then {second}");

    // Exit statuses: success, a signal (128+N), a command that does not exist.
    p.run(&["lock", "jobs/env", "--", "true"]).expect_success();
    p.run(&["lock", "jobs/env", "--", "sh", "-c", "kill -9 $$"])
        .expect_code(128 + 9);
    let out = p.run(&[
        "lock",
        "jobs/env",
        "--",
        "/nonexistent/palisade-test-command",
    ]);
    out.expect_code(127);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
}

#[test]
fn lock_not_acquired_within_wait_exits_75_without_running_the_command() {
    let p = Palisade::start_with_store();
    let holder = p.acquire("jobs/busy", "20s");
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());

    let started = Instant::now();
    let out = p.run(&[
        "lock",
        "jobs/busy",
        "--wait",
        "300ms",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    out.expect_code(75);
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited");
    assert!(
        !marker.exists(),
        "the command must not run without the lock"
    );
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");

    p.run(&["lock", "jobs/busy", "--wait", "0", "--", "sh", "-c", &touch])
        .expect_code(75);
    assert!(!marker.exists());
    p.run(&["acquire", "jobs/busy", "--ttl", "5s"])
        .expect_code(75);

    // Once the holder lets go, the same command runs.
    p.run(&["release", "jobs/busy", "--session", &holder.session])
        .expect_success();
    p.run(&[
        "lock",
        "jobs/busy",
        "--wait",
        "5s",
        "--",
        "sh",
        "-c",
        &touch,
    ])
    .expect_success();
    assert!(marker.exists());
}

#[test]
fn lock_waits_in_line_and_runs_once_the_holder_releases() {
    let p = Palisade::start();
    let holder = p.acquire("queue/a", "20s");
    let mut waiter = p.cmd(&[
        "lock",
        "queue/a",
        "--wait",
        "15s",
        "--",
        "sh",
        "-c",
        "echo $PALISADE_TOKEN",
    ]);
    waiter.stdout(Stdio::piped()).stderr(Stdio::piped());
    let waiter = std::thread::spawn(move || run(waiter));
    wait_until("the waiter to queue", Duration::from_secs(10), || {
        p.status("queue/a")["waiters"]
            .as_array()
            .is_some_and(|w| w.len() == 1)
    });
    p.run(&["release", "queue/a", "--session", &holder.session])
        .expect_success();
    let out = waiter.join().unwrap();
    out.expect_success();
    let token: u64 = out.stdout.trim().parse().unwrap();
    assert!(token > holder.token);
}

#[test]
fn lock_lost_while_the_command_runs_stops_it_and_exits_76() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let p = Palisade::start();
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let termed = dir.path().join("got-sigterm");
    let script = format!(
        "trap 'touch {t}; exit 0' TERM; touch {s}; while :; do sleep 0.1; done",
        t = termed.display(),
        s = started.display()
    );
    let mut cmd = p.cmd(&[
        "lock",
        "jobs/paused",
        "--ttl",
        "1s",
        "--kill-grace",
        "2s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut lock = KillOnDrop {
        child: cmd.spawn().unwrap(),
        name: "lock",
        log: dir.path().join("none"),
    };
    wait_until("the command to start", Duration::from_secs(10), || {
        started.exists()
    });
    let pid = Pid::from_raw(lock.child.id() as i32);

    // A stop-the-world pause of the holder, longer than its lease.
    kill(pid, Signal::SIGSTOP).unwrap();
    wait_until("the lease to expire", Duration::from_secs(10), || {
        p.status("jobs/paused")["holder"].is_null()
    });
    kill(pid, Signal::SIGCONT).unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = lock.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "palisade lock kept running");
        std::thread::sleep(Duration::from_millis(25));
    };
    assert_eq!(status.code(), Some(76), "lost lock: {status:?}");
    assert!(termed.exists(), "the command was sent SIGTERM");
}

// ---------------------------------------------------------------------------------------------
// The README's promise: fenced without thinking about it.
// ---------------------------------------------------------------------------------------------

#[test]
fn readme_lock_around_store_put_is_fenced_end_to_end() {
    let p = Palisade::start_with_store();
    p.run(&[
        "lock",
        "jobs/nightly",
        "--",
        BIN,
        "store",
        "put",
        "report",
        "written at dawn",
    ])
    .expect_success();
    let out = p.run(&["store", "get", "report"]);
    out.expect_success();
    assert_eq!(out.stdout.trim_end(), "written at dawn");

    let http = Http::new(&p.store_url);
    let stored = http.get("/v1/kv/report");
    assert_eq!(stored.status, 200);
    let stored = stored.json();
    assert_eq!(stored["lock"], "jobs/nightly");
    assert_eq!(stored["value"], "written at dawn");
    let fence = http.get("/v1/fence/jobs/nightly").json();
    assert_eq!(fence["token_max"], stored["token"]);
}

#[test]
fn a_paused_holders_late_write_is_refused_and_names_the_accepted_token() {
    let p = Palisade::start_with_store();

    // A takes the lock for a script and writes.
    let a = p.acquire("jobs/nightly", "1s");
    let mut put = p.cmd(&["store", "put", "report", "from A"]);
    put.env("PALISADE_SEQUENCER", &a.sequencer);
    run(put).expect_success();

    // A stalls past its lease; B waits for the lock and writes.
    p.run(&[
        "lock",
        "jobs/nightly",
        "--wait",
        "10s",
        "--",
        BIN,
        "store",
        "put",
        "report",
        "from B",
    ])
    .expect_success();
    let b_token = p
        .run(&["store", "get", "report", "--json"])
        .expect_success()
        .json()["token"]
        .as_u64()
        .unwrap();
    assert!(b_token > a.token);

    // A wakes up and writes with its old sequencer from the environment.
    let mut late = p.cmd(&["store", "put", "report", "late from A"]);
    late.env("PALISADE_SEQUENCER", &a.sequencer);
    let out = run(late);
    assert_ne!(out.code(), Some(0));
    out.expect_code(3);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    assert!(out.stderr.contains("stale"), "{out:?}");
    assert!(out.stderr.contains("jobs/nightly"), "{out:?}");
    assert!(
        out.stderr.contains(&format!("accepted token {b_token}")),
        "the message names the accepted token: {out:?}"
    );
    assert!(out.stderr.contains(&a.token.to_string()), "{out:?}");

    // B's write stands; A cannot write any other key of the lock either.
    let out = p.run(&["store", "get", "report"]);
    assert_eq!(out.stdout.trim_end(), "from B");
    p.run(&[
        "store",
        "put",
        "other-key",
        "x",
        "--sequencer",
        &a.sequencer,
    ])
    .expect_code(3);
    p.run(&["store", "delete", "report", "--sequencer", &a.sequencer])
        .expect_code(3);
    assert_eq!(
        p.run(&["store", "get", "report"]).stdout.trim_end(),
        "from B"
    );
}

// ---------------------------------------------------------------------------------------------
// The one-shot flow: acquire / renew / release.
// ---------------------------------------------------------------------------------------------

#[test]
fn acquire_prints_the_grant_and_only_the_holding_session_may_release_or_renew_it() {
    let p = Palisade::start();
    let out = p.run(&["acquire", "oneshot/a", "--ttl", "5s", "--json"]);
    out.expect_success();
    let v = out.json();
    for field in ["lock", "token", "sequencer", "session", "ttl_ms"] {
        assert!(v.get(field).is_some(), "acquire --json has {field}: {v}");
    }
    assert_eq!(v["lock"], "oneshot/a");
    assert_eq!(v["ttl_ms"], 5000);
    let a = Grant::from_json(&v);
    assert!(a.sequencer.starts_with("pal1."));

    // The plain form is KEY=value lines for eval.
    let out = p.run(&["acquire", "oneshot/b", "--ttl", "5s"]);
    out.expect_success();
    for key in [
        "PALISADE_LOCK=",
        "PALISADE_TOKEN=",
        "PALISADE_SEQUENCER=",
        "PALISADE_SESSION=",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(key)),
            "{key} in {out:?}"
        );
    }
    let b_session = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PALISADE_SESSION="))
        .unwrap()
        .trim_matches('\'')
        .to_owned();

    // Busy: a second acquire is not granted.
    p.run(&["acquire", "oneshot/a", "--ttl", "5s"])
        .expect_code(75);

    // renew: the holding session's lease is renewed; an unknown session is refused.
    p.run(&["renew", "--session", &a.session]).expect_success();
    let mut renew = p.cmd(&["renew"]);
    renew.env("PALISADE_SESSION", &a.session);
    run(renew).expect_success();
    let out = p.run(&["renew", "--session", "999999"]);
    out.expect_code(1);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");

    // release by another (live) session: refused, names the holder, lock still held.
    let out = p.run(&["release", "oneshot/a", "--session", &b_session]);
    out.expect_code(1);
    assert!(out.stderr.contains(&a.session), "names the holder: {out:?}");
    p.run(&["release", "oneshot/a", "--session", "999999"])
        .expect_code(1);
    let status = p.status("oneshot/a");
    assert_eq!(id_string(&status["holder"]["session"]), a.session);
    assert_eq!(status["holder"]["token"], a.token);

    // release by the holder.
    p.run(&["release", "oneshot/a", "--session", &a.session])
        .expect_success();
    assert!(p.status("oneshot/a")["holder"].is_null());

    // release with NAME and session from the environment, as after `eval "$(palisade acquire …)"`.
    let mut release = p.cmd(&["release"]);
    release
        .env("PALISADE_LOCK", "oneshot/b")
        .env("PALISADE_SESSION", &b_session);
    run(release).expect_success();
    assert!(p.status("oneshot/b")["holder"].is_null());
}

#[test]
fn an_unrenewed_one_shot_grant_expires_and_the_next_grant_has_a_larger_token() {
    let p = Palisade::start();
    let first = p.acquire("oneshot/expiring", "1s");
    let out = p.run(&[
        "acquire",
        "oneshot/expiring",
        "--ttl",
        "5s",
        "--wait",
        "10s",
        "--json",
    ]);
    out.expect_success();
    let second = Grant::from_json(&out.json());
    assert!(second.token > first.token);
    assert_ne!(second.session, first.session);
    // The expired session can no longer renew or release.
    p.run(&["renew", "--session", &first.session])
        .expect_code(1);
    p.run(&["release", "oneshot/expiring", "--session", &first.session])
        .expect_code(1);
}

// ---------------------------------------------------------------------------------------------
// Reading state: status, locks, pubkey, endpoint selection.
// ---------------------------------------------------------------------------------------------

#[test]
fn status_and_locks_show_holder_token_waiters_and_lease() {
    let p = Palisade::start();
    let a = p.acquire("team/a", "10s");
    let b = p.acquire("team/b", "10s");
    let _c = p.acquire("other/c", "10s");

    let mut waiter = p.cmd(&["lock", "team/a", "--wait", "15s", "--", "true"]);
    waiter.stdout(Stdio::null());
    let waiter = std::thread::spawn(move || run(waiter));
    wait_until("a waiter on team/a", Duration::from_secs(10), || {
        p.status("team/a")["waiters"]
            .as_array()
            .is_some_and(|w| w.len() == 1)
    });

    let s = p.status("team/a");
    assert_eq!(s["lock"], "team/a");
    assert_eq!(id_string(&s["holder"]["session"]), a.session);
    assert_eq!(s["holder"]["token"], a.token);
    let remaining = s["holder"]["lease_remaining_ms"].as_u64().unwrap();
    assert!(
        remaining > 0 && remaining <= 10_000,
        "lease remaining {remaining}"
    );
    assert!(s["last_token"].as_u64().unwrap() >= a.token);

    let out = p.run(&["status", "team/a"]);
    out.expect_success();
    assert!(out.stdout.contains(&a.session) && out.stdout.contains(&a.token.to_string()));

    let out = p.run(&["locks", "--prefix", "team/", "--json"]);
    out.expect_success();
    let listed = out.json();
    let names: BTreeSet<&str> = listed
        .as_array()
        .expect("locks --json is an array")
        .iter()
        .map(|l| l["lock"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["team/a", "team/b"]));
    let team_b = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lock"] == "team/b")
        .unwrap();
    assert_eq!(team_b["holder"]["token"], b.token);

    let all = p.run(&["locks", "--json"]).expect_success().json();
    assert_eq!(all.as_array().unwrap().len(), 3, "{all}");

    // Hand-over to the waiter.
    p.run(&["release", "team/a", "--session", &a.session])
        .expect_success();
    waiter.join().unwrap().expect_success();
}

#[test]
fn status_of_a_free_lock_still_reports_its_last_token() {
    let p = Palisade::start();
    let a = p.acquire("history/a", "10s");
    p.run(&["release", "history/a", "--session", &a.session])
        .expect_success();
    let s = p.status("history/a");
    assert!(s["holder"].is_null());
    assert!(
        s["last_token"].as_u64().is_some_and(|t| t >= a.token),
        "status shows the last token granted ({}) after release: {s}",
        a.token
    );
}

#[test]
fn pubkey_is_an_ed25519_hex_key_and_the_endpoint_comes_from_flag_or_environment() {
    let p = Palisade::start();
    let dead = format!("http://127.0.0.1:{}", free_port());

    // From the environment only.
    let out = p.run(&["pubkey"]);
    out.expect_success();
    let key = out.stdout.trim().to_owned();
    let hex = key.strip_prefix("ed25519:").expect("ed25519: prefix");
    assert_eq!(hex.len(), 64, "{key}");
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{key}");

    // From the flag only.
    let mut flag_only = bare_palisade();
    flag_only.args(["--endpoint", &p.endpoint, "pubkey"]);
    assert_eq!(run(flag_only).expect_success().stdout.trim(), key);
    let mut flag_after = bare_palisade();
    flag_after.args(["pubkey", "--endpoint", &p.endpoint]);
    assert_eq!(run(flag_after).expect_success().stdout.trim(), key);

    // The flag wins over the environment.
    let mut both = bare_palisade();
    both.env("PALISADE_ENDPOINT", &dead)
        .args(["--endpoint", &p.endpoint, "pubkey"]);
    assert_eq!(run(both).expect_success().stdout.trim(), key);

    // The environment is used: pointing it at nothing makes the service unreachable (69).
    let mut env_dead = bare_palisade();
    env_dead.env("PALISADE_ENDPOINT", &dead).arg("pubkey");
    let out = run(env_dead);
    out.expect_code(69);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    let mut acquire_dead = bare_palisade();
    acquire_dead
        .env("PALISADE_ENDPOINT", &dead)
        .args(["acquire", "x", "--ttl", "5s"]);
    run(acquire_dead).expect_code(69);

    // --json and stability across calls.
    let v = p.run(&["pubkey", "--json"]).expect_success().json();
    assert_eq!(v["public_key"], key);
    assert_eq!(p.run(&["pubkey"]).stdout.trim(), key);
}

// ---------------------------------------------------------------------------------------------
// The fenced store from the command line.
// ---------------------------------------------------------------------------------------------

#[test]
fn store_put_get_delete_take_the_sequencer_from_the_flag_or_the_environment() {
    let p = Palisade::start_with_store();
    let g = p.acquire("kv/lock", "20s");

    p.run(&[
        "store",
        "put",
        "greeting",
        "hello",
        "--sequencer",
        &g.sequencer,
    ])
    .expect_success();
    let out = p.run(&["store", "get", "greeting"]);
    out.expect_success();
    assert_eq!(out.stdout.trim_end(), "hello");
    let v = p
        .run(&["store", "get", "greeting", "--json"])
        .expect_success()
        .json();
    assert_eq!(v["key"], "greeting");
    assert_eq!(v["value"], "hello");
    assert_eq!(v["lock"], "kv/lock");
    assert_eq!(v["token"], g.token);

    // $PALISADE_SEQUENCER is the default.
    let mut put = p.cmd(&["store", "put", "greeting", "hello again"]);
    put.env("PALISADE_SEQUENCER", &g.sequencer);
    run(put).expect_success();
    assert_eq!(
        p.run(&["store", "get", "greeting"]).stdout.trim_end(),
        "hello again"
    );

    // No sequencer at all: refused (1, the binary's one "refused"), nothing written.
    let out = p.run(&["store", "put", "greeting", "unfenced"]);
    out.expect_code(1);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    p.run(&["store", "delete", "greeting"]).expect_code(1);
    assert_eq!(
        p.run(&["store", "get", "greeting"]).stdout.trim_end(),
        "hello again"
    );

    // delete, fenced by the environment's sequencer; then the key is gone (5).
    let mut delete = p.cmd(&["store", "delete", "greeting"]);
    delete.env("PALISADE_SEQUENCER", &g.sequencer);
    run(delete).expect_success();
    let out = p.run(&["store", "get", "greeting"]);
    out.expect_code(5);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    p.run(&["store", "delete", "greeting", "--sequencer", &g.sequencer])
        .expect_success();

    // What the store has accepted for the lock.
    let fence = p
        .run(&["store", "fence", "kv/lock", "--json"])
        .expect_success()
        .json();
    assert_eq!(fence["token_max"], g.token);
}

#[test]
fn forged_and_malformed_sequencers_are_refused_distinctly_from_stale_ones() {
    let p = Palisade::start_with_store();
    let g = p.acquire("kv/forge", "20s");

    // A huge token with the honest signature: forged, exit 1 (not 3, not 0).
    let huge = with_forged_token(&g.sequencer, g.token + 1_000_000);
    let out = p.run(&["store", "put", "k", "evil", "--sequencer", &huge]);
    out.expect_code(1);
    assert!(!out.stderr.contains("stale"), "{out:?}");

    // One character of the signature changed.
    let flipped = flip_signature_char(&g.sequencer);
    assert_ne!(flipped, g.sequencer);
    let mut put = p.cmd(&["store", "put", "k", "evil"]);
    put.env("PALISADE_SEQUENCER", &flipped);
    let out = run(put);
    out.expect_code(1);
    assert!(!out.stderr.contains("stale"), "{out:?}");

    // Truncated.
    let truncated = &g.sequencer[..g.sequencer.len() / 2];
    p.run(&["store", "put", "k", "evil", "--sequencer", truncated])
        .expect_code(1);

    // None of that moved the fence: the honest holder still writes.
    p.run(&["store", "get", "k"]).expect_code(5);
    p.run(&["store", "put", "k", "honest", "--sequencer", &g.sequencer])
        .expect_success();
    let fence = p
        .run(&["store", "fence", "kv/forge", "--json"])
        .expect_success()
        .json();
    assert_eq!(fence["token_max"], g.token);

    // Over HTTP the two refusals have their own kinds.
    let http = Http::new(&p.store_url);
    expect_error(&http.put("/v1/kv/k", &huge, "evil"), 403, "forged");
    expect_error(&http.put("/v1/kv/k", &flipped, "evil"), 403, "forged");
    expect_error(&http.put("/v1/kv/k", truncated, "evil"), 400, "malformed");
}

#[test]
fn store_refuses_another_locks_sequencer_for_a_bound_key() {
    let p = Palisade::start_with_store();
    let mine = p.acquire("kv/mine", "20s");
    let theirs = p.acquire("kv/theirs", "20s");
    p.run(&[
        "store",
        "put",
        "bound",
        "v1",
        "--sequencer",
        &mine.sequencer,
    ])
    .expect_success();
    let out = p.run(&[
        "store",
        "put",
        "bound",
        "v2",
        "--sequencer",
        &theirs.sequencer,
    ]);
    out.expect_code(1);
    // Deleting keeps the binding.
    p.run(&["store", "delete", "bound", "--sequencer", &mine.sequencer])
        .expect_success();
    p.run(&[
        "store",
        "put",
        "bound",
        "v3",
        "--sequencer",
        &theirs.sequencer,
    ])
    .expect_code(1);
    p.run(&["store", "get", "bound"]).expect_code(5);
}

// ---------------------------------------------------------------------------------------------
// The fenced store's HTTP API, per store-http.md.
// ---------------------------------------------------------------------------------------------

#[test]
fn store_http_writes_reads_and_replays() {
    let p = Palisade::start_with_store();
    let g = p.acquire("http/a", "20s");
    let http = Http::new(&p.store_url);

    let health = http.get("/healthz");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");

    // PUT a key containing '/'.
    let put = http.put("/v1/kv/reports/today", &g.sequencer, "sunny");
    assert_eq!(put.status, 200);
    let v = put.json();
    assert_eq!(v["lock"], "http/a");
    assert_eq!(v["token"], g.token);
    assert_eq!(id_string(&v["session"]), g.session);
    assert_eq!(v["replayed"], false);
    assert_eq!(
        v["ops"],
        json!([{"op": "put", "key": "reports/today", "existed": false}])
    );

    // GET as JSON, with %2F, and raw.
    let got = http.get("/v1/kv/reports/today");
    assert_eq!(got.status, 200);
    let v = got.json();
    assert_eq!(v["key"], "reports/today");
    assert_eq!(v["value"], "sunny");
    assert_eq!(v["lock"], "http/a");
    assert_eq!(v["token"], g.token);
    assert_eq!(http.get("/v1/kv/reports%2Ftoday").json()["value"], "sunny");
    let raw = http.get("/v1/kv/reports/today?format=raw");
    assert_eq!(raw.status, 200);
    assert_eq!(raw.body, b"sunny");
    assert_eq!(raw.header("palisade-token"), Some(g.token.to_string()));
    assert_eq!(raw.header("palisade-session"), Some(g.session.clone()));
    assert_eq!(raw.header("palisade-lock").as_deref(), Some("http/a"));

    // Binary values come back as value_base64.
    let bin = http.send(
        "PUT",
        "/v1/kv/bin",
        &[("Palisade-Sequencer", &g.sequencer)],
        vec![0u8, 1, 0xff],
    );
    assert_eq!(bin.status, 200);
    let v = http.get("/v1/kv/bin").json();
    assert!(v.get("value").is_none_or(Value::is_null), "{v}");
    assert_eq!(v["value_base64"], "AAH/");

    // Request ids: a retry is answered, not applied again; a different write is refused.
    let with_id = |body: &str| {
        http.send(
            "PUT",
            "/v1/kv/counter",
            &[
                ("Palisade-Sequencer", &g.sequencer),
                ("Palisade-Request-Id", "retry-1"),
            ],
            body.to_owned(),
        )
    };
    let first = with_id("1");
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["replayed"], false);
    let again = with_id("1");
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["replayed"], true);
    let body = expect_error(&with_id("2"), 422, "request_id_reused");
    assert_eq!(body["request_id"], "retry-1");
    assert_eq!(http.get("/v1/kv/counter").json()["value"], "1");

    // DELETE: existed, then not found, then deleting again still succeeds.
    let del = http.send(
        "DELETE",
        "/v1/kv/reports/today",
        &[("Palisade-Sequencer", &g.sequencer)],
        Vec::new(),
    );
    assert_eq!(del.status, 200);
    assert_eq!(
        del.json()["ops"],
        json!([{"op": "delete", "key": "reports/today", "existed": true}])
    );
    let body = expect_error(&http.get("/v1/kv/reports/today"), 404, "not_found");
    assert_eq!(body["key"], "reports/today");
    let del = http.send(
        "DELETE",
        "/v1/kv/reports/today",
        &[("Palisade-Sequencer", &g.sequencer)],
        Vec::new(),
    );
    assert_eq!(del.status, 200);
    assert_eq!(del.json()["ops"][0]["existed"], false);

    // Batch: all applied in order.
    let batch = http.send(
        "POST",
        "/v1/batch",
        &[
            ("Palisade-Sequencer", &g.sequencer),
            ("Content-Type", "application/json"),
        ],
        json!({"ops": [
            {"op": "put", "key": "a", "value": "text"},
            {"op": "put", "key": "b", "value_base64": "//8="},
            {"op": "delete", "key": "counter"}
        ]})
        .to_string(),
    );
    assert_eq!(
        batch.status,
        200,
        "{}",
        String::from_utf8_lossy(&batch.body)
    );
    assert_eq!(batch.json()["ops"].as_array().unwrap().len(), 3);
    assert_eq!(http.get("/v1/kv/a").json()["value"], "text");
    assert_eq!(http.get("/v1/kv/b").json()["value_base64"], "//8=");
    assert_eq!(http.get("/v1/kv/counter").status, 404);

    // The fence: what was accepted, and null for a lock never written.
    let fence = http.get("/v1/fence/http/a").json();
    assert_eq!(fence["lock"], "http/a");
    assert_eq!(fence["token_max"], g.token);
    assert_eq!(id_string(&fence["holder_session"]), g.session);
    let never = http.get("/v1/fence/http/never").json();
    assert!(never["token_max"].is_null() && never["holder_session"].is_null());
}

#[test]
fn store_http_rejections_have_documented_statuses_and_kinds() {
    let p = Palisade::start_with_store();
    let old = p.acquire("http/e", "20s");
    let other = p.acquire("http/other", "20s");
    let http = Http::new(&p.store_url);
    assert_eq!(http.put("/v1/kv/doc", &old.sequencer, "v0").status, 200);

    // 401 missing, with the challenge header.
    let resp = http.send("PUT", "/v1/kv/doc", &[], "x");
    expect_error(&resp, 401, "missing");
    assert_eq!(
        resp.header("www-authenticate").as_deref(),
        Some("Palisade-Sequencer")
    );
    // 400 malformed.
    expect_error(&http.put("/v1/kv/doc", "garbage", "x"), 400, "malformed");
    // 403 wrong_lock.
    let body = expect_error(
        &http.put("/v1/kv/doc", &other.sequencer, "x"),
        403,
        "wrong_lock",
    );
    assert_eq!(body["key"], "doc");
    assert_eq!(body["expected"], "http/e");
    assert_eq!(body["presented"], "http/other");

    // 409 stale, after a newer grant of the lock has written.
    p.run(&["release", "http/e", "--session", &old.session])
        .expect_success();
    let new = p.acquire("http/e", "20s");
    assert!(new.token > old.token);
    assert_eq!(http.put("/v1/kv/doc", &new.sequencer, "v1").status, 200);
    assert_eq!(
        http.put("/v1/kv/doc", &new.sequencer, "v2").status,
        200,
        "equal token"
    );
    let body = expect_error(
        &http.put("/v1/kv/doc", &old.sequencer, "late"),
        409,
        "stale",
    );
    assert_eq!(body["lock"], "http/e");
    assert_eq!(body["presented"], old.token);
    assert_eq!(body["accepted"], new.token);
    assert_eq!(id_string(&body["holder_session"]), new.session);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&new.token.to_string())
    );
    // Stale on any key of the lock, even one the new holder never touched.
    expect_error(
        &http.put("/v1/kv/untouched", &old.sequencer, "late"),
        409,
        "stale",
    );
    assert_eq!(http.get("/v1/kv/doc").json()["value"], "v2");

    // A batch that touches a key of another lock writes nothing.
    let batch = http.send(
        "POST",
        "/v1/batch",
        &[
            ("Palisade-Sequencer", &other.sequencer),
            ("Content-Type", "application/json"),
        ],
        json!({"ops": [
            {"op": "put", "key": "fresh", "value": "x"},
            {"op": "put", "key": "doc", "value": "x"}
        ]})
        .to_string(),
    );
    expect_error(&batch, 403, "wrong_lock");
    assert_eq!(http.get("/v1/kv/fresh").status, 404);
    assert!(http.get("/v1/fence/http/other").json()["token_max"].is_null());
    // An empty batch is an invalid request.
    let empty = http.send(
        "POST",
        "/v1/batch",
        &[
            ("Palisade-Sequencer", &new.sequencer),
            ("Content-Type", "application/json"),
        ],
        json!({"ops": []}).to_string(),
    );
    expect_error(&empty, 400, "invalid_request");

    // Bad keys and sizes.
    expect_error(
        &http.put("/v1/kv/bad%01key", &new.sequencer, "x"),
        400,
        "invalid_key",
    );
    let long_key = "k".repeat(1025);
    let body = expect_error(
        &http.put(&format!("/v1/kv/{long_key}"), &new.sequencer, "x"),
        413,
        "too_large",
    );
    assert_eq!(body["limit"], "key_bytes_max");
    let big = "v".repeat(1024 * 1024 + 1);
    let body = expect_error(
        &http.put("/v1/kv/big", &new.sequencer, &big),
        413,
        "too_large",
    );
    assert_eq!(body["limit"], "value_bytes_max");
    let exactly = "v".repeat(1024 * 1024);
    assert_eq!(http.put("/v1/kv/big", &new.sequencer, &exactly).status, 200);
    let long_id = "r".repeat(129);
    let resp = http.send(
        "PUT",
        "/v1/kv/doc",
        &[
            ("Palisade-Sequencer", &new.sequencer),
            ("Palisade-Request-Id", &long_id),
        ],
        "x",
    );
    assert!(resp.status == 413 || resp.status == 400, "{}", resp.status);

    // Unknown routes and methods.
    let body = expect_error(&http.get("/v1/nope"), 404, "no_such_route");
    assert_eq!(body["method"], "GET");
    assert_eq!(body["path"], "/v1/nope");
    let body = expect_error(
        &http.send("POST", "/v1/kv/doc", &[], "x"),
        405,
        "method_not_allowed",
    );
    assert_eq!(body["method"], "POST");

    // Every error carries a message a person can act on.
    for resp in [
        http.put("/v1/kv/doc", "garbage", "x"),
        http.put("/v1/kv/doc", &old.sequencer, "x"),
        http.get("/v1/kv/never-written"),
    ] {
        let body = resp.json();
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_input_gets_a_clear_error_and_the_services_keep_serving() {
    let p = Palisade::start_with_store();
    let long_name = "n".repeat(5000);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());

    // An oversized lock name.
    let out = p.run(&["acquire", &long_name, "--ttl", "5s"]);
    out.expect_code(1);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    assert!(out.stderr.contains("name"), "{out:?}");
    let out = p.run(&["lock", &long_name, "--", "sh", "-c", &touch]);
    out.expect_code(1);
    assert!(!marker.exists());
    p.run(&["status", &long_name]).expect_code(1);
    p.run(&["acquire", "", "--ttl", "5s"]).expect_code(1);

    // Zero and huge TTLs: refused as invalid input (1) or a usage error (2), never granted.
    for ttl in ["0s", "0", "1000h", "99999999999999999999s"] {
        let out = p.run(&["acquire", "bad/ttl", "--ttl", ttl]);
        assert!(
            matches!(out.code(), Some(1) | Some(2)),
            "--ttl {ttl}: {out:?}"
        );
        assert!(!out.stderr.trim().is_empty(), "--ttl {ttl}: {out:?}");
        assert!(out.stdout.trim().is_empty(), "--ttl {ttl}: {out:?}");
        let out = p.run(&["lock", "bad/ttl", "--ttl", ttl, "--", "sh", "-c", &touch]);
        assert!(
            matches!(out.code(), Some(1) | Some(2)),
            "lock --ttl {ttl}: {out:?}"
        );
    }
    assert!(!marker.exists());
    assert!(p.status("bad/ttl")["holder"].is_null());

    // Usage errors.
    p.run(&["acquire", "x"]).expect_code(2);
    p.run(&["acquire", "x", "--ttl", "banana"]).expect_code(2);
    p.run(&["no-such-command"]).expect_code(2);

    // The store: an oversized key or value is an invalid request, refused (1).
    let g = p.acquire("bad/store", "20s");
    let long_key = "k".repeat(1025);
    p.run(&["store", "put", &long_key, "v", "--sequencer", &g.sequencer])
        .expect_code(1);
    p.run(&[
        "store",
        "put",
        "bad\u{1}key",
        "v",
        "--sequencer",
        &g.sequencer,
    ])
    .expect_code(1);

    // Both services still serve.
    let ok = p.acquire("bad/after", "5s");
    assert!(ok.token > 0);
    p.run(&["store", "put", "after", "fine", "--sequencer", &g.sequencer])
        .expect_success();
    assert_eq!(p.run(&["store", "get", "after"]).stdout.trim_end(), "fine");
}
