//! Adversarial tests of the replicated lock service, written from the documentation alone
//! (`docs/cluster.md`, `crates/cli/README.md`, ARCHITECTURE "What changes with more than one
//! node"): what a user of `palisade` observes while leaders are killed, followers frozen, and
//! `palisade serve` and `palisade cluster` are given bad input.
//!
//! Every load loop is bounded in iterations and in time.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_sequencer::PublicKey;
use palisade_testkit::process::Announce;
use palisade_testkit::{Lines, LocalCluster, Ran, Running, ServerProcess, command, run};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// `palisade ARGS...` with `--endpoint ENDPOINTS`, run to completion.
fn palisade(endpoints: &str, args: &[&str]) -> Ran {
    let mut cmd = command(BIN);
    cmd.args(["--endpoint", endpoints]).args(args);
    run(cmd)
}

/// `palisade serve ARGS...` (no built-in flags), run to completion.
fn serve(args: &[&str], envs: &[(&str, &str)]) -> Ran {
    let mut cmd = command(BIN);
    cmd.arg("serve").args(args).env("RUST_LOG", "warn");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run(cmd)
}

/// A `palisade serve` process under the kit's control, with our own flags: port 0 on first
/// start, so no port is picked in advance.
fn server(dir: &Path, id: u64, flags: &[&str]) -> ServerProcess {
    let data = dir.join(format!("node-{id}"));
    let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    let d = data.clone();
    ServerProcess::custom(
        &format!("palisade serve (node {id})"),
        data,
        Announce::LockService,
        move |ports| {
            let mut c = command(BIN);
            c.args(["serve", "--listen", &ports.listen.to_string(), "--data-dir"])
                .arg(&d)
                .args(["--node-id", &id.to_string()])
                .args(&flags)
                .env("RUST_LOG", "info");
            c
        },
    )
}

fn all_endpoints(cluster: &LocalCluster) -> String {
    cluster
        .nodes
        .values()
        .map(|n| n.address())
        .collect::<Vec<_>>()
        .join(",")
}

fn members(status: &serde_json::Value) -> Vec<serde_json::Value> {
    status["members"].as_array().expect("members").clone()
}

fn member(status: &serde_json::Value, id: u64) -> serde_json::Value {
    members(status)
        .into_iter()
        .find(|m| m["id"].as_u64() == Some(id))
        .unwrap_or_else(|| panic!("no member {id} in {status}"))
}

fn ids_of_kind(status: &serde_json::Value, kind: &str) -> Vec<u64> {
    members(status)
        .iter()
        .filter(|m| m["kind"] == kind)
        .map(|m| m["id"].as_u64().expect("an id"))
        .collect()
}

fn status_json(endpoints: &str) -> serde_json::Value {
    let ran = palisade(endpoints, &["cluster", "status", "--json"]);
    ran.expect_success();
    ran.json()
}

fn pubkey(endpoints: &str) -> String {
    let ran = palisade(endpoints, &["pubkey"]);
    ran.expect_success();
    ran.stdout.trim().to_string()
}

fn session_arg(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Grants under repeated kill -9 of the leader, from several clients with every endpoint.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Grant {
    worker: usize,
    lock: String,
    token: u64,
    session: String,
    /// The acquire command's start and end (acknowledgement).
    start: Instant,
    end: Instant,
    /// When the release command started, and its exit status.
    release_start: Option<Instant>,
    release_end: Option<Instant>,
    release_code: Option<i32>,
    release_stderr: String,
}

const CHAOS_TTL: Duration = Duration::from_secs(8);

const CHAOS_LOCKS: [&str; 2] = ["chaos/a", "chaos/b"];

#[test]
fn grants_stay_exclusive_ordered_and_durable_across_repeated_leader_kills() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = all_endpoints(&cluster);
    let key_text = pubkey(&endpoints);
    let key = PublicKey::parse(&key_text).expect("palisade pubkey prints a key");

    let stop = Arc::new(AtomicBool::new(false));
    let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
    let odd: Arc<Mutex<Vec<String>>> = Arc::default();
    let bad_sequencers: Arc<Mutex<Vec<String>>> = Arc::default();
    let started = Instant::now();
    let hard_deadline = started + Duration::from_secs(60);

    let mut workers = Vec::new();
    for worker in 0..3 {
        let (stop, grants, odd, bad, endpoints, key) = (
            stop.clone(),
            grants.clone(),
            odd.clone(),
            bad_sequencers.clone(),
            endpoints.clone(),
            key,
        );
        workers.push(std::thread::spawn(move || {
            for i in 0..200 {
                if stop.load(Ordering::SeqCst) || Instant::now() > hard_deadline {
                    return;
                }
                let lock = CHAOS_LOCKS[(i + worker) % CHAOS_LOCKS.len()];
                let start = Instant::now();
                let ttl = format!("{}s", CHAOS_TTL.as_secs());
                let ran = palisade(
                    &endpoints,
                    &["acquire", lock, "--ttl", &ttl, "--wait", "3s", "--json"],
                );
                let end = Instant::now();
                match ran.code() {
                    Some(0) => {}
                    Some(75 | 69 | 77) => continue,
                    other => {
                        odd.lock().unwrap().push(format!(
                            "acquire {lock} exited {other:?} after {:?}: {}",
                            end - start,
                            ran.stderr.trim()
                        ));
                        continue;
                    }
                }
                let json = ran.json();
                let token = json["token"].as_u64().expect("a token");
                let session = session_arg(&json["session"]);
                let credential = session_arg(&json["session_credential"]);
                let sequencer = json["sequencer"].as_str().expect("a sequencer").to_owned();
                if let Err(e) = key.verify(&sequencer) {
                    bad.lock()
                        .unwrap()
                        .push(format!("{lock} token {token}: {e}"));
                }
                let index = {
                    let mut g = grants.lock().unwrap();
                    g.push(Grant {
                        worker,
                        lock: lock.to_owned(),
                        token,
                        session: session.clone(),
                        start,
                        end,
                        release_start: None,
                        release_end: None,
                        release_code: None,
                        release_stderr: String::new(),
                    });
                    g.len() - 1
                };
                std::thread::sleep(Duration::from_millis(30));
                let release_start = Instant::now();
                let released = palisade(&endpoints, &["release", lock, "--session", &credential]);
                let release_end = Instant::now();
                let mut g = grants.lock().unwrap();
                g[index].release_start = Some(release_start);
                g[index].release_end = Some(release_end);
                g[index].release_code = released.code();
                g[index].release_stderr = released.stderr.trim().to_owned();
            }
        }));
    }

    // Kill the leader three times (restarting it each time), and once freeze it past an
    // election and thaw it, a deposed leader that wakes up.
    let mut failovers = Vec::new();
    for round in 0..4 {
        std::thread::sleep(Duration::from_secs(3));
        let leader = cluster.leader();
        let killed = Instant::now();
        if round == 2 {
            cluster.node(leader).process.pause();
            let next = cluster.leader();
            failovers.push((leader, next, "frozen", killed.elapsed()));
            std::thread::sleep(Duration::from_secs(2));
            cluster.node(leader).process.resume();
        } else {
            cluster.node(leader).process.kill9();
            let next = cluster.leader();
            failovers.push((leader, next, "killed", killed.elapsed()));
            cluster.node(leader).process.start();
        }
    }
    let last_failover_done = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a worker thread panicked");
    }
    eprintln!("failovers (old, new, how, took): {failovers:?}");
    // Then the whole cluster crashes at once and comes back: acknowledged grants are durable.
    for node in cluster.nodes.values_mut() {
        node.process.kill9();
    }
    for node in cluster.nodes.values_mut().rev() {
        node.process.start();
    }
    cluster.leader();

    let grants = grants.lock().unwrap().clone();
    let odd = odd.lock().unwrap().clone();
    let bad = bad_sequencers.lock().unwrap().clone();
    eprintln!("{} acknowledged grants", grants.len());
    let mut problems: Vec<String> = Vec::new();
    problems.extend(odd);
    problems.extend(
        bad.into_iter()
            .map(|b| format!("sequencer does not verify: {b}")),
    );

    for g in &grants {
        match g.release_code {
            Some(0 | 69 | 77) => {}
            Some(1) if g.release_start.unwrap() >= g.start + CHAOS_TTL => {}
            other => problems.push(format!(
                "release of {} token {} (worker {}) by session {} exited {other:?} {:?} after the \
                 acquire started: {}",
                g.lock,
                g.token,
                g.worker,
                g.session,
                g.release_end.map(|e| e - g.start),
                g.release_stderr
            )),
        }
    }

    for lock in CHAOS_LOCKS {
        let mine: Vec<&Grant> = grants.iter().filter(|g| g.lock == lock).collect();
        let mut tokens = BTreeSet::new();
        for g in &mine {
            if !tokens.insert(g.token) {
                problems.push(format!("{lock}: token {} acknowledged twice", g.token));
            }
        }
        for a in &mine {
            for b in &mine {
                // Acknowledged before the other was asked for: its token is smaller.
                if a.end < b.start && b.token <= a.token {
                    problems.push(format!(
                        "{lock}: token {} acknowledged after token {} was (in real time)",
                        b.token, a.token
                    ));
                }
                // b was granted after a (larger token) and acknowledged while a still held for
                // certain (before a's release was sent and before a's session could expire).
                let a_holds_until = a
                    .release_start
                    .unwrap_or(a.start + CHAOS_TTL)
                    .min(a.start + CHAOS_TTL);
                if b.token > a.token && b.end < a_holds_until {
                    problems.push(format!(
                        "{lock}: token {} (worker {}) acknowledged {:?} before token {} (worker \
                         {}) was released or could expire: two holders at once",
                        b.token,
                        b.worker,
                        a_holds_until - b.end,
                        a.token,
                        a.worker
                    ));
                }
            }
        }
        // No acknowledged grant is lost: the lock's last token is at least the largest one.
        if let Some(max) = mine.iter().map(|g| g.token).max() {
            let ran = palisade(&endpoints, &["status", lock, "--json"]);
            ran.expect_success();
            let status = ran.json();
            let last = status["last_token"].as_u64().unwrap_or(0);
            if last < max {
                problems.push(format!(
                    "{lock}: acknowledged token {max} lost, status says {status}"
                ));
            }
        }
    }
    let after_last = grants
        .iter()
        .filter(|g| g.start > last_failover_done)
        .count();
    if after_last == 0 {
        problems.push("no grant was acknowledged after the last failover".into());
    }
    if grants.len() < 10 {
        problems.push(format!("only {} grants in the whole run", grants.len()));
    }
    // Every node, the restarted ones included, still gives the key printed at the start
    // (asked first, with the others after it, whose leader a hint names: N14).
    let all = all_endpoints(&cluster);
    for node in cluster.nodes.values() {
        let k = pubkey(&format!("{},{all}", node.address()));
        if k != key_text {
            problems.push(format!("node {} prints key {k}, not {key_text}", node.id));
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), {
        problems.join("\n")
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Bad cluster flags to `palisade serve`.
// ---------------------------------------------------------------------------------------------

#[test]
fn serve_refuses_bad_cluster_flags_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let ten: String = (1..=10)
        .map(|i| format!("{i}=127.0.0.1:{}", 7000 + i))
        .collect::<Vec<_>>()
        .join(",");
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "missing =",
            vec!["--initial-cluster".into(), "1-127.0.0.1:7001".into()],
            "1-127.0.0.1:7001",
        ),
        (
            "id 0",
            vec![
                "--initial-cluster".into(),
                "1=127.0.0.1:7001,0=127.0.0.1:7002".into(),
            ],
            "0",
        ),
        (
            "duplicate id",
            vec![
                "--initial-cluster".into(),
                "1=127.0.0.1:7001,1=127.0.0.1:7002".into(),
            ],
            "twice",
        ),
        (
            "duplicate address",
            vec![
                "--initial-cluster".into(),
                "1=127.0.0.1:7001,2=127.0.0.1:7001".into(),
            ],
            "127.0.0.1:7001",
        ),
        (
            "no port",
            vec![
                "--initial-cluster".into(),
                "1=localhost,2=127.0.0.1:7002".into(),
            ],
            "localhost",
        ),
        (
            "empty entry",
            vec![
                "--initial-cluster".into(),
                "1=127.0.0.1:7001,,2=127.0.0.1:7002".into(),
            ],
            "initial-cluster",
        ),
        (
            "more than 9 members",
            vec!["--initial-cluster".into(), ten.clone()],
            "9",
        ),
        (
            "--join with --initial-cluster",
            vec![
                "--join".into(),
                "--initial-cluster".into(),
                "1=127.0.0.1:7001,2=127.0.0.1:7002".into(),
            ],
            "--join",
        ),
        (
            "this node not named",
            vec![
                "--node-id".into(),
                "4".into(),
                "--initial-cluster".into(),
                "1=127.0.0.1:7001,2=127.0.0.1:7002".into(),
            ],
            "4",
        ),
        ("node id 0", vec!["--node-id".into(), "0".into()], "0"),
    ];
    let mut problems = Vec::new();
    for (i, (what, flags, mention)) in cases.iter().enumerate() {
        let data = dir.path().join(format!("d{i}"));
        let listen = format!("127.0.0.1:{}", palisade_testkit::unused_port());
        let mut args: Vec<&str> = vec!["--listen", &listen, "--data-dir", data.to_str().unwrap()];
        args.extend(flags.iter().map(String::as_str));
        let ran = serve(&args, &[]);
        let text = format!("{}{}", ran.stderr, ran.stdout);
        if ran.code() == Some(0) || ran.code().is_none() {
            problems.push(format!("{what}: exit {:?}: {text}", ran.code()));
            continue;
        }
        if !text.contains(mention) {
            problems.push(format!(
                "{what}: the message does not mention {mention:?}: {text}"
            ));
        }
        if std::net::TcpStream::connect(&listen).is_ok() {
            problems.push(format!("{what}: something still listens on {listen}"));
        }
    }
    // The same through the environment.
    let data = dir.path().join("env");
    let listen = format!("127.0.0.1:{}", palisade_testkit::unused_port());
    let ran = serve(
        &["--listen", &listen, "--data-dir", data.to_str().unwrap()],
        &[
            ("PALISADE_JOIN", "true"),
            (
                "PALISADE_INITIAL_CLUSTER",
                "1=127.0.0.1:7001,2=127.0.0.1:7002",
            ),
        ],
    );
    if ran.code() == Some(0) || ran.code().is_none() {
        problems.push(format!(
            "PALISADE_JOIN with PALISADE_INITIAL_CLUSTER: exit {:?}: {}",
            ran.code(),
            ran.stderr
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A start refused for its flags (this node is not in `--initial-cluster`) leaves the data
/// directory free for the corrected command: a directory gets an id by serving under it.
#[test]
fn a_node_missing_from_initial_cluster_is_a_usage_error_that_claims_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node-1");
    let listen = format!("127.0.0.1:{}", palisade_testkit::unused_port());
    let initial = format!("1={listen}");
    let ran = serve(
        &[
            "--listen",
            &listen,
            "--data-dir",
            data.to_str().unwrap(),
            "--node-id",
            "4",
            "--initial-cluster",
            &initial,
        ],
        &[],
    );
    assert!(ran.code().is_some_and(|c| c != 0), "{ran:?}");
    assert!(ran.stderr.contains("does not name this node"), "{ran:?}");
    // The operator fixes the typo in --node-id: the directory must not belong to node 4.
    let mut cmd = command(BIN);
    cmd.args(["serve", "--listen", &listen, "--data-dir"])
        .arg(&data)
        .args(["--node-id", "1", "--initial-cluster", &initial])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut fixed = Running::spawn(cmd);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(exit) = fixed.child.try_wait().unwrap() {
            panic!("the corrected start exited {exit}: {}", fixed.stderr());
        }
        let ran = palisade(&listen, &["cluster", "status", "--json"]);
        if ran.code() == Some(0) && ran.json()["leader"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no leader: {ran:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------------
// 3. `palisade cluster add` / `remove` edge cases.
// ---------------------------------------------------------------------------------------------

#[test]
fn cluster_add_and_remove_refuse_bad_requests_and_leave_the_cluster_unchanged() {
    let mut cluster = LocalCluster::empty(BIN);
    let first = cluster.add_single().address();
    let key = pubkey(&first);
    let joining = cluster.start_joining(2).address();
    let before = status_json(&first);
    let mut problems = Vec::new();

    let mut expect_refused = |what: &str, args: &[&str], codes: &[i32], mention: &str| {
        let t = Instant::now();
        let ran = cluster.palisade(&first, args);
        let ok_code = ran.code().is_some_and(|c| codes.contains(&c));
        if !ok_code || !ran.stderr.to_lowercase().contains(&mention.to_lowercase()) {
            problems.push(format!(
                "{what}: expected exit {codes:?} mentioning {mention:?}, got {:?} after {:?}: \
                 stdout={:?} stderr={:?}",
                ran.code(),
                t.elapsed(),
                ran.stdout,
                ran.stderr
            ));
        }
        let now = status_json(&first);
        if members(&now).len() != members(&before).len()
            || ids_of_kind(&now, "voter") != ids_of_kind(&before, "voter")
        {
            problems.push(format!("{what}: the membership changed: {now}"));
        }
    };
    expect_refused("add id 0", &["cluster", "add", "0", &joining], &[2], "0");
    expect_refused(
        "add an id that is a voter",
        &["cluster", "add", "1", &joining],
        &[1],
        "voter",
    );
    expect_refused(
        "add a new id at the address of a member",
        &["cluster", "add", "3", &first],
        &[1],
        "node 1",
    );
    expect_refused(
        "add the joining node under the wrong id",
        &["cluster", "add", "3", &joining],
        &[1],
        "node 2",
    );
    let nobody = format!("127.0.0.1:{}", palisade_testkit::unused_port());
    expect_refused(
        "add an address where nothing listens",
        &["cluster", "add", "4", &nobody],
        &[1, 69],
        &nobody,
    );
    expect_refused(
        "add a malformed address",
        &["cluster", "add", "4", "not-an-address"],
        &[1, 2],
        "not-an-address",
    );
    expect_refused(
        "remove an unknown id",
        &["cluster", "remove", "9"],
        &[1],
        "9",
    );
    expect_refused(
        "remove the last voter",
        &["cluster", "remove", "1"],
        &[1],
        "last",
    );

    // A node started without --join is a one-member cluster of its own: adding it is refused
    // and it keeps its own key and membership.
    let dir = tempfile::tempdir().unwrap();
    let mut standalone = server(dir.path(), 7, &[]);
    standalone.start();
    let standalone_addr = standalone.addr().to_string();
    let standalone_key = pubkey(&standalone_addr);
    expect_refused(
        "add a node that runs its own cluster",
        &["cluster", "add", "7", &standalone_addr],
        &[1],
        "cluster",
    );
    let own = status_json(&standalone_addr);
    if ids_of_kind(&own, "voter") != [7] || pubkey(&standalone_addr) != standalone_key {
        problems.push(format!(
            "the standalone node changed: {own}, key {}",
            pubkey(&standalone_addr)
        ));
    }
    // The cluster can still grow after all the refusals.
    let added = cluster.palisade(&first, &["cluster", "add", "2", &joining]);
    if added.code() != Some(0) {
        problems.push(format!("the real add failed: {added:?}"));
    } else {
        let now = status_json(&first);
        if ids_of_kind(&now, "voter") != [1, 2] {
            problems.push(format!("after adding node 2: {now}"));
        }
        // Asked of node 2 first, with node 1 after it, whom a hint names (N14).
        if pubkey(&format!("{joining},{first}")) != key {
            problems.push("node 2 signs with another key".into());
        }
        // Adding it again is refused.
        let again = cluster.palisade(&first, &["cluster", "add", "2", &joining]);
        if again.code() != Some(1) {
            problems.push(format!("adding a voter again: {again:?}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 4. `palisade cluster status --json` as documented, with a dead and a frozen member.
// ---------------------------------------------------------------------------------------------

fn check_member_shape(m: &serde_json::Value, problems: &mut Vec<String>) {
    let keys: BTreeSet<&str> = m
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let role = m["role"].as_str().unwrap_or("");
    let mut expected: BTreeSet<&str> = [
        "id",
        "address",
        "kind",
        "role",
        "term",
        "applied_index",
        "committed_index",
    ]
    .into();
    if role == "unreachable" {
        expected.insert("error");
        // An unreachable member has no term or indexes to report; accept their absence.
        let present: BTreeSet<&str> = keys.iter().copied().collect();
        for k in ["id", "address", "kind", "role", "error"] {
            if !present.contains(k) {
                problems.push(format!("unreachable member lacks {k:?}: {m}"));
            }
        }
        if !m["error"].is_string() || m["error"].as_str() == Some("") {
            problems.push(format!("unreachable member without an error text: {m}"));
        }
    } else if keys != expected {
        problems.push(format!(
            "member keys {keys:?}, documented {expected:?}: {m}"
        ));
    }
    if !keys.iter().all(|k| expected.contains(k)) {
        problems.push(format!("undocumented member keys: {m}"));
    }
    if !m["id"].is_u64() || !m["address"].is_string() {
        problems.push(format!("id/address types: {m}"));
    }
    if !["voter", "learner"].contains(&m["kind"].as_str().unwrap_or("")) {
        problems.push(format!("kind: {m}"));
    }
    if !["leader", "follower", "candidate", "learner", "unreachable"].contains(&role) {
        problems.push(format!("role: {m}"));
    }
    if role != "unreachable" {
        for k in ["term", "applied_index", "committed_index"] {
            if !m[k].is_u64() {
                problems.push(format!("{k} is not a number: {m}"));
            }
        }
    }
}

#[test]
fn cluster_status_json_is_as_documented_with_dead_and_frozen_members() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = all_endpoints(&cluster);
    let leader = cluster.leader();
    let mut problems = Vec::new();

    let status = status_json(&endpoints);
    let top: BTreeSet<&str> = status
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    if top != BTreeSet::from(["leader", "members"]) {
        problems.push(format!("top-level keys {top:?}: {status}"));
    }
    if status["leader"].as_u64() != Some(leader) {
        problems.push(format!("leader: {status}"));
    }
    for m in members(&status) {
        check_member_shape(&m, &mut problems);
        let id = m["id"].as_u64().unwrap();
        if m["address"].as_str() != Some(&cluster.nodes[&id].address()) {
            problems.push(format!("address of {id}: {m}"));
        }
    }

    // A killed follower: the others report it as unreachable, with an error.
    let followers: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|&i| i != leader)
        .collect();
    let (dead, frozen) = (followers[0], followers[1]);
    cluster.node(dead).process.kill9();
    // The dead node first in the list: the command moves on to the next address.
    let dead_first = format!(
        "{},{}",
        cluster.nodes[&dead].address(),
        cluster.nodes[&leader].address()
    );
    let status = status_json(&dead_first);
    let d = member(&status, dead);
    if d["role"] != "unreachable" {
        problems.push(format!("a killed member is not unreachable: {status}"));
    }
    for m in members(&status) {
        check_member_shape(&m, &mut problems);
    }
    let text = palisade(&dead_first, &["cluster", "status"]);
    if text.code() != Some(0) || !text.stdout.contains("unreachable") {
        problems.push(format!("text status with a dead member: {text:?}"));
    }

    // A frozen follower (SIGSTOP) first in the list: it accepts connections but answers
    // nothing. The command still answers within its retry time and shows it unreachable.
    cluster.node(frozen).process.pause();
    let frozen_first = format!(
        "{},{}",
        cluster.nodes[&frozen].address(),
        cluster.nodes[&leader].address()
    );
    let t = Instant::now();
    let ran = palisade(&frozen_first, &["cluster", "status", "--json"]);
    let took = t.elapsed();
    cluster.node(frozen).process.resume();
    if ran.code() != Some(0) {
        problems.push(format!(
            "status with a frozen member first: {ran:?} after {took:?}"
        ));
    } else {
        let status = ran.json();
        if member(&status, frozen)["role"] != "unreachable" {
            problems.push(format!("a frozen member is not unreachable: {status}"));
        }
        for m in members(&status) {
            check_member_shape(&m, &mut problems);
        }
    }
    if took > Duration::from_secs(10) {
        problems.push(format!("status with a frozen member took {took:?}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 5. A frozen follower catches up.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_frozen_follower_catches_up_after_sigcont() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let leader_addr = cluster.nodes[&leader].address();
    let follower = *cluster.nodes.keys().find(|&&i| i != leader).unwrap();
    cluster.node(follower).process.pause();
    let t = Instant::now();
    for i in 0..15 {
        if t.elapsed() > Duration::from_secs(20) {
            break;
        }
        let lock = format!("frozen/{i}");
        let ran = palisade(&leader_addr, &["acquire", &lock, "--ttl", "30s", "--json"]);
        ran.expect_success();
        let credential = session_arg(&ran.json()["session_credential"]);
        palisade(&leader_addr, &["release", &lock, "--session", &credential]).expect_success();
    }
    let target = member(&status_json(&leader_addr), leader)["applied_index"]
        .as_u64()
        .expect("the leader's applied index");
    cluster.node(follower).process.resume();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = status_json(&leader_addr);
        let m = member(&status, follower);
        if m["applied_index"].as_u64().unwrap_or(0) >= target {
            assert_eq!(m["role"], "follower", "{status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the thawed follower did not reach applied index {target}: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its own view agrees, and it serves through the leader.
    let own = status_json(&cluster.nodes[&follower].address());
    assert!(
        member(&own, follower)["applied_index"]
            .as_u64()
            .unwrap_or(0)
            >= target,
        "{own}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. `palisade watch` with every endpoint across a leader kill, and sequencers from every leader.
// ---------------------------------------------------------------------------------------------

fn next_event(lines: &Lines, deadline: Instant) -> Option<serde_json::Value> {
    let left = deadline.checked_duration_since(Instant::now())?;
    // Lines::next panics on timeout; the caller sees None instead.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lines.next(left)))
        .ok()
        .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
}

#[test]
fn watch_keeps_reporting_and_every_leader_signs_with_the_first_key() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = all_endpoints(&cluster);
    let key_text = pubkey(&endpoints);
    let key = PublicKey::parse(&key_text).unwrap();

    let mut cmd = command(BIN);
    cmd.args(["--endpoint", &endpoints, "watch", "w", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut watcher = Running::spawn(cmd);
    let lines = Lines::new(watcher.child.stdout.take().unwrap());
    let first = next_event(&lines, Instant::now() + Duration::from_secs(10)).expect("a snapshot");
    assert_eq!(first["kind"], "snapshot", "{first}");

    let mut seen_events: Vec<serde_json::Value> = Vec::new();
    let mut problems = Vec::new();
    let mut last_token = 0;
    for round in 0..3 {
        let ran = palisade(&endpoints, &["acquire", "w", "--ttl", "30s", "--json"]);
        ran.expect_success();
        let grant = ran.json();
        let token = grant["token"].as_u64().unwrap();
        if token <= last_token {
            problems.push(format!("round {round}: token {token} after {last_token}"));
        }
        last_token = token;
        if let Err(e) = key.verify(grant["sequencer"].as_str().unwrap()) {
            problems.push(format!("round {round}: sequencer of token {token}: {e}"));
        }
        // The watch reports this grant (as an event, or in a fresh snapshot after a switch).
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut reported = false;
        while let Some(ev) = next_event(&lines, deadline) {
            seen_events.push(ev.clone());
            if ev["token"].as_u64() == Some(token) && ev["session"] == grant["session"] {
                reported = true;
                break;
            }
        }
        if !reported {
            problems.push(format!(
                "round {round}: the watch did not report token {token} within 15 s; saw \
                 {seen_events:?}; watcher alive: {}",
                watcher.child.try_wait().unwrap().is_none()
            ));
            break;
        }
        let credential = session_arg(&grant["session_credential"]);
        palisade(&endpoints, &["release", "w", "--session", &credential]).expect_success();
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut released = false;
        while let Some(ev) = next_event(&lines, deadline) {
            seen_events.push(ev.clone());
            if ev["kind"] == "released" || (ev["kind"] == "snapshot" && ev["session"].is_null()) {
                released = true;
                break;
            }
        }
        if !released {
            problems.push(format!(
                "round {round}: the watch did not report the release of {token}; saw \
                 {seen_events:?}"
            ));
            break;
        }

        let leader = cluster.leader();
        cluster.node(leader).process.kill9();
        let next = cluster.leader();
        assert_ne!(next, leader);
        cluster.node(leader).process.start();
    }
    if watcher.child.try_wait().unwrap().is_some() {
        problems.push(format!("the watch exited: {}", watcher.stderr()));
    }
    let all = all_endpoints(&cluster);
    for node in cluster.nodes.values() {
        let k = pubkey(&format!("{},{all}", node.address()));
        if k != key_text {
            problems.push(format!("node {} now prints {k}", node.id));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 7. An acquire waiting in the leader's queue when the leader dies.
// ---------------------------------------------------------------------------------------------

#[test]
fn an_acquire_queued_on_a_killed_leader_is_granted_by_the_next_one() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = all_endpoints(&cluster);
    let held = palisade(&endpoints, &["acquire", "q", "--ttl", "60s", "--json"]);
    held.expect_success();
    let held = held.json();
    let first_token = held["token"].as_u64().unwrap();

    let mut cmd = command(BIN);
    cmd.args([
        "--endpoint",
        &endpoints,
        "acquire",
        "q",
        "--ttl",
        "30s",
        "--wait",
        "25s",
        "--json",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut waiter = Running::spawn(cmd);
    let out = Lines::new(waiter.child.stdout.take().unwrap());
    palisade_testkit::wait_until("the waiter to queue", Duration::from_secs(10), || {
        let ran = palisade(&endpoints, &["status", "q", "--json"]);
        ran.code() == Some(0) && ran.stdout.contains("waiter") && {
            let s = ran.json();
            s["waiters"].as_u64().map_or_else(
                || s["waiters"].as_array().is_some_and(|a| !a.is_empty()),
                |n| n > 0,
            )
        }
    });

    let leader = cluster.leader();
    cluster.node(leader).process.kill9();
    cluster.leader();
    cluster.node(leader).process.start();
    palisade(
        &endpoints,
        &[
            "release",
            "q",
            "--session",
            &session_arg(&held["session_credential"]),
        ],
    )
    .expect_success();

    let status = waiter.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "the queued acquire did not get the released lock: {status:?} {}",
        waiter.stderr()
    );
    let grant: serde_json::Value = serde_json::from_str(&out.next(Duration::from_secs(5))).unwrap();
    let token = grant["token"].as_u64().unwrap();
    assert!(token > first_token, "{token} after {first_token}");
    let now = palisade(&endpoints, &["status", "q", "--json"]);
    now.expect_success();
    let now = now.json();
    assert_eq!(now["holder"]["token"].as_u64(), Some(token), "{now}");
    assert_eq!(now["holder"]["session"], grant["session"], "{now}");
}

// ---------------------------------------------------------------------------------------------
// 8. A removed follower still in the client's endpoint list.
// ---------------------------------------------------------------------------------------------

#[test]
fn commands_still_work_with_a_removed_follower_first_in_the_list() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let leader_addr = cluster.nodes[&leader].address();
    let removed = *cluster.nodes.keys().find(|&&i| i != leader).unwrap();
    cluster
        .palisade(&leader_addr, &["cluster", "remove", &removed.to_string()])
        .expect_success();
    let status = status_json(&leader_addr);
    assert!(
        !ids_of_kind(&status, "voter").contains(&removed),
        "{status}"
    );
    assert!(
        members(&status)
            .iter()
            .all(|m| m["id"].as_u64() != Some(removed)),
        "{status}"
    );
    std::thread::sleep(Duration::from_secs(1));

    let mut list = vec![cluster.nodes[&removed].address()];
    list.extend(
        cluster
            .nodes
            .values()
            .filter(|n| n.id != removed)
            .map(|n| n.address()),
    );
    let list = list.join(",");
    let t = Instant::now();
    let granted = palisade(&list, &["acquire", "r", "--ttl", "10s", "--json"]);
    assert_eq!(
        granted.code(),
        Some(0),
        "{granted:?} after {:?}",
        t.elapsed()
    );
    let token = granted.json()["token"].as_u64().unwrap();
    let status = palisade(&list, &["status", "r", "--json"]);
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(status.json()["holder"]["token"].as_u64(), Some(token));
    // The removed node did not come back as a member.
    let status = status_json(&leader_addr);
    assert!(
        members(&status)
            .iter()
            .all(|m| m["id"].as_u64() != Some(removed)),
        "{status}"
    );
}

// ---------------------------------------------------------------------------------------------
// 9. No quorum: commands end with the documented status in bounded time, and "nothing was done"
//    holds once the quorum is back.
// ---------------------------------------------------------------------------------------------

#[test]
fn without_a_quorum_commands_end_unavailable_and_nothing_was_done() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let leader_addr = cluster.nodes[&leader].address();
    let endpoints = all_endpoints(&cluster);
    let followers: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|&i| i != leader)
        .collect();
    for &f in &followers {
        cluster.node(f).process.kill9();
    }
    let mut problems = Vec::new();

    let t = Instant::now();
    let acquire = palisade(&endpoints, &["acquire", "nq", "--ttl", "30s", "--json"]);
    let acquire_took = t.elapsed();
    if !matches!(acquire.code(), Some(69 | 77)) {
        problems.push(format!(
            "acquire without quorum: {acquire:?} after {acquire_took:?}"
        ));
    }
    let t = Instant::now();
    let status = palisade(&endpoints, &["status", "nq", "--json"]);
    if status.code() != Some(69) {
        problems.push(format!(
            "status without quorum: {status:?} after {:?}",
            t.elapsed()
        ));
    }
    let view = palisade(&leader_addr, &["cluster", "status", "--json"]);
    if view.code() != Some(0) {
        problems.push(format!("cluster status without quorum: {view:?}"));
    } else {
        let view = view.json();
        for &f in &followers {
            if member(&view, f)["role"] != "unreachable" {
                problems.push(format!("node {f} is dead but shown as {view}"));
            }
        }
    }

    // Quorum back.
    cluster.node(followers[0]).process.start();
    cluster.leader();
    std::thread::sleep(Duration::from_secs(1));
    let after = palisade(&endpoints, &["status", "nq", "--json"]);
    after.expect_success();
    let after = after.json();
    if acquire.code() == Some(69) && !after["holder"].is_null() {
        problems.push(format!(
            "acquire exited 69 (nothing was done), yet the lock is held once the quorum is \
             back: {after}"
        ));
    }
    let again = palisade(&endpoints, &["acquire", "nq2", "--ttl", "5s"]);
    if again.code() != Some(0) {
        problems.push(format!("no acquire after the quorum is back: {again:?}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 10. Endpoint lists are validated by the cluster commands like by every command.
// ---------------------------------------------------------------------------------------------

#[test]
fn cluster_commands_refuse_a_bad_endpoint_list_before_sending_anything() {
    let seventeen = (0..17)
        .map(|i| format!("127.0.0.1:{}", 7000 + i))
        .collect::<Vec<_>>()
        .join(",");
    let mut problems = Vec::new();
    for list in [
        "127.0.0.1:7001,,127.0.0.1:7002",
        "127.0.0.1:7001,",
        seventeen.as_str(),
        "not an address",
    ] {
        for args in [
            &["cluster", "status"][..],
            &["cluster", "add", "5", "127.0.0.1:7005"][..],
            &["cluster", "remove", "5"][..],
            &["pubkey"][..],
        ] {
            let ran = palisade(list, args);
            if ran.code() != Some(2) {
                problems.push(format!("{args:?} with {list:?}: {ran:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 11. A failover never shortens a lease.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_failover_gives_the_holder_its_full_ttl_again() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = all_endpoints(&cluster);
    let ran = palisade(&endpoints, &["acquire", "lease", "--ttl", "6s", "--json"]);
    ran.expect_success();
    let token = ran.json()["token"].as_u64().unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let leader = cluster.leader();
    let killed = Instant::now();
    cluster.node(leader).process.kill9();
    cluster.leader();
    let status = palisade(&endpoints, &["status", "lease", "--json"]);
    let since_kill = killed.elapsed();
    status.expect_success();
    let status = status.json();
    assert_eq!(
        status["holder"]["token"].as_u64(),
        Some(token),
        "the lease was lost in the failover: {status}"
    );
    let remaining = status["holder"]["lease_remaining_ms"].as_u64().unwrap();
    // The new leader took over after the kill and gave the session 6 s from then.
    let floor = 6000u64.saturating_sub(since_kill.as_millis() as u64 + 100);
    assert!(
        remaining >= floor,
        "lease remaining {remaining} ms, at least {floor} ms expected {since_kill:?} after the kill"
    );
    let other = palisade(
        &endpoints,
        &["acquire", "lease", "--ttl", "5s", "--wait", "0"],
    );
    assert_eq!(other.code(), Some(75), "{other:?}");
}

// ---------------------------------------------------------------------------------------------
// 12. A frozen leader (SIGSTOP: its connections stay open, nothing answers). The docs: "an
//     address that stops answering ... moves the command to the next address in the list after
//     a short pause, within its usual retry time"; "palisade lock keeps its session alive, and
//     palisade watch its stream, across the switch to another member".
// ---------------------------------------------------------------------------------------------

/// The addresses of every node but `id`, comma-separated.
fn others_than(cluster: &mut LocalCluster, id: u64) -> String {
    cluster
        .nodes
        .values()
        .filter(|n| n.id != id)
        .map(|n| n.address())
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until `others` (the nodes other than `old`) agree on a new leader.
fn new_leader_among(others: &str, old: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = status_json(others);
        if let Some(l) = s["leader"]
            .as_u64()
            .filter(|&l| l != old && member(&s, l)["role"] == "leader")
        {
            return l;
        }
        assert!(Instant::now() < deadline, "no new leader: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_lock_holder_keeps_its_lock_when_the_leader_freezes() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = all_endpoints(&cluster);
    let marker = cluster.dir().join("child-ran");
    let mut lock = command(BIN);
    lock.args(["--endpoint", &endpoints, "lock", "job", "--ttl", "3s", "--"])
        .args([
            "sh",
            "-c",
            &format!("touch {} && sleep 60", marker.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut holder = Running::spawn(lock);
    palisade_testkit::wait_until("the child to start", Duration::from_secs(20), || {
        marker.exists()
    });
    let st = palisade(&endpoints, &["status", "job", "--json"]);
    st.expect_success();
    let token = st.json()["holder"]["token"].as_u64().expect("held");

    let leader = cluster.leader();
    let others = others_than(&mut cluster, leader);
    cluster.node(leader).process.pause();
    let frozen_at = Instant::now();
    let next = new_leader_among(&others, leader);
    eprintln!(
        "node {next} leads {:?} after the freeze",
        frozen_at.elapsed()
    );
    // Several ttls later, with the old leader still frozen, the holder keeps its lock.
    std::thread::sleep(Duration::from_secs(8));
    let exited = holder.child.try_wait().unwrap();
    let st = palisade(&others, &["status", "job", "--json"]);
    cluster.node(leader).process.resume();
    assert!(
        exited.is_none(),
        "palisade lock exited {exited:?} while the leader was frozen: {}",
        holder.stderr()
    );
    st.expect_success();
    assert_eq!(st.json()["holder"]["token"].as_u64(), Some(token), "{st:?}");
}

/// How long a watch may take to report a grant while the leader it streamed from is frozen.
const WATCH_WAIT: u64 = 10;

#[test]
fn a_watch_reports_changes_when_the_leader_freezes() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = all_endpoints(&cluster);
    let mut cmd = command(BIN);
    cmd.args(["--endpoint", &endpoints, "watch", "fw", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut watcher = Running::spawn(cmd);
    let lines = Lines::new(watcher.child.stdout.take().unwrap());
    let first = next_event(&lines, Instant::now() + Duration::from_secs(10)).expect("snapshot");
    assert_eq!(first["kind"], "snapshot", "{first}");

    let leader = cluster.leader();
    let others = others_than(&mut cluster, leader);
    cluster.node(leader).process.pause();
    new_leader_among(&others, leader);
    let ran = palisade(&others, &["acquire", "fw", "--ttl", "30s", "--json"]);
    ran.expect_success();
    let token = ran.json()["token"].as_u64().unwrap();
    let granted = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(WATCH_WAIT);
    let mut seen = Vec::new();
    let mut reported = false;
    while let Some(ev) = next_event(&lines, deadline) {
        seen.push(ev.clone());
        if ev["token"].as_u64() == Some(token) {
            reported = true;
            eprintln!("reported {:?} after the grant", granted.elapsed());
            break;
        }
    }
    let alive = watcher.child.try_wait().unwrap().is_none();
    cluster.node(leader).process.resume();
    assert!(
        reported,
        "the watch did not report token {token} within {WATCH_WAIT} s of the grant while the old \
         leader was frozen; saw {seen:?}; watch running: {alive}"
    );
}

#[test]
fn a_command_given_a_frozen_leader_first_moves_on_to_the_others() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let others = others_than(&mut cluster, leader);
    let list = format!("{},{others}", cluster.nodes[&leader].address());
    cluster.node(leader).process.pause();
    let t = Instant::now();
    let ran = palisade(&list, &["acquire", "fa", "--ttl", "30s", "--json"]);
    let took = t.elapsed();
    let st = palisade(&others, &["status", "fa", "--json"]);
    cluster.node(leader).process.resume();
    assert_eq!(ran.code(), Some(0), "{ran:?} after {took:?}");
    st.expect_success();
    assert_eq!(st.json()["holder"]["token"], ran.json()["token"], "{st:?}");
}

// ---------------------------------------------------------------------------------------------
// 13. A node id names one data directory forever: a removed id is not given to a new one.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_removed_id_is_not_given_to_a_new_data_directory() {
    let mut cluster = LocalCluster::empty(BIN);
    let first = cluster.add_single().address();
    let second = cluster.start_joining(2).address();
    cluster
        .palisade(&first, &["cluster", "add", "2", &second])
        .expect_success();
    cluster
        .palisade(&first, &["cluster", "remove", "2"])
        .expect_success();
    cluster.node(2).process.kill9();
    // A new directory under the removed id.
    let dir = tempfile::tempdir().unwrap();
    let mut fresh = server(dir.path(), 2, &["--join"]);
    fresh.start();
    let ran = cluster.palisade(&first, &["cluster", "add", "2", &fresh.addr().to_string()]);
    let status = status_json(&first);
    assert_eq!(
        ran.code(),
        Some(1),
        "an id once used in this cluster was given to a new data directory: {ran:?}, {status}"
    );
    assert_eq!(ids_of_kind(&status, "voter"), [1], "{status}");
}
