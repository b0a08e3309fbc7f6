//! A replicated lock service as real processes on loopback: a cluster bootstrapped with
//! `--initial-cluster`, a single node grown with `palisade cluster add`, `kill -9` of the
//! leader, a wiped node coming back under its old id, and removed members stopping.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use palisade_sequencer::PublicKey;
use palisade_testkit::{LocalCluster, Ran};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// `palisade acquire` printed as `KEY=VALUE` lines.
fn grant(ran: &Ran) -> BTreeMap<String, String> {
    ran.key_values()
}

/// Takes `lock` on the leader in a new session: its token, sequencer and session.
fn acquire_in_session(cluster: &mut LocalCluster, lock: &str, ttl: &str) -> (u64, String, String) {
    let leader = cluster.leader_address();
    let granted = grant(&cluster.palisade(&leader, &["acquire", lock, "--ttl", ttl]));
    (
        granted["PALISADE_TOKEN"].parse().expect("a token"),
        granted["PALISADE_SEQUENCER"].clone(),
        granted["PALISADE_SESSION"].clone(),
    )
}

fn acquire(cluster: &mut LocalCluster, lock: &str, ttl: &str) -> (u64, String) {
    let (token, sequencer, _) = acquire_in_session(cluster, lock, ttl);
    (token, sequencer)
}

/// `palisade pubkey` asked of the node at `address` first, with every other member after it:
/// the node answers, or names the leader, which a client without TLS follows only within its
/// list (N14).
fn pubkey(cluster: &LocalCluster, address: &str) -> String {
    let list = std::iter::once(address.to_string())
        .chain(
            cluster
                .nodes
                .values()
                .map(|n| n.address())
                .filter(|a| a != address),
        )
        .collect::<Vec<_>>()
        .join(",");
    let ran = cluster.palisade(&list, &["pubkey"]);
    ran.expect_success();
    ran.stdout.trim().to_string()
}

fn lock_status(cluster: &mut LocalCluster, lock: &str) -> serde_json::Value {
    let leader = cluster.leader_address();
    let ran = cluster.palisade(&leader, &["status", lock, "--json"]);
    ran.expect_success();
    ran.json()
}

fn voters(status: &serde_json::Value) -> Vec<u64> {
    status["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["kind"] == "voter")
        .map(|m| m["id"].as_u64().expect("an id"))
        .collect()
}

#[test]
fn three_nodes_elect_one_leader_and_sign_with_one_key() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let status = cluster.status();
    assert_eq!(voters(&status), [1, 2, 3], "{status}");
    let roles: Vec<&str> = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "leader").count(),
        1,
        "{status}"
    );
    let keys: Vec<String> = cluster
        .nodes
        .values()
        .map(|n| pubkey(&cluster, &n.address()))
        .collect();
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "nodes sign with different keys: {keys:?}"
    );

    // The text form names the leader, the term and each member's indexes.
    let endpoints = cluster.endpoints();
    let text = cluster.palisade(&endpoints, &["cluster", "status"]);
    text.expect_success();
    assert!(text.stdout.starts_with("leader: node "), "{}", text.stdout);
    assert!(text.stdout.contains("APPLIED") && text.stdout.contains("COMMITTED"));
}

#[test]
fn killing_the_leader_keeps_held_locks_and_tokens_only_grow() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader_address();
    let key = PublicKey::parse(&pubkey(&cluster, &leader)).unwrap();
    // A lease that outlives every failover below.
    let (held_token, _) = acquire(&mut cluster, "held", "120s");
    let mut last = 0;
    for round in 0..2 {
        let (token, sequencer, session) = acquire_in_session(&mut cluster, "counter", "10s");
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        key.verify(&sequencer)
            .unwrap_or_else(|e| panic!("round {round}: the leader's sequencer: {e}"));
        // Released at once, so the next round's grant needs a fresh token.
        let leader = cluster.leader();
        let leader_address = cluster.nodes[&leader].address();
        cluster
            .palisade(
                &leader_address,
                &["release", "counter", "--session", &session],
            )
            .expect_success();

        let killed = Instant::now();
        cluster.node(leader).process.kill9();
        let next = cluster.leader();
        eprintln!(
            "round {round}: node {leader} killed, node {next} leads after {:?}",
            killed.elapsed()
        );
        assert_ne!(next, leader);
        let held = lock_status(&mut cluster, "held");
        assert_eq!(
            held["holder"]["token"].as_u64(),
            Some(held_token),
            "the lease of 120 s was lost in a failover: {held}"
        );
        cluster.node(leader).process.start();
    }
    let (token, sequencer) = acquire(&mut cluster, "counter", "1s");
    assert!(
        token > last,
        "after the failovers: token {token} after {last}"
    );
    key.verify(&sequencer)
        .expect("the last leader's sequencer verifies");
}

#[test]
fn a_wiped_node_cannot_come_back_under_its_old_id() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let (token, _) = acquire(&mut cluster, "l", "30s");

    // Node 3 loses its disk and is started again with the same flags.
    let leader = cluster.leader();
    let follower = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != 1)
        .expect("a follower other than node 1");
    cluster.node(follower).process.kill9();
    let dir = cluster.node(follower).process.data_dir().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    cluster.node(follower).process.start();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster
        .node(follower)
        .process
        .log()
        .contains("earlier incarnation of this node id")
    {
        assert!(
            Instant::now() < deadline,
            "the wiped node took part: {}",
            cluster.node(follower).process.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Asked anonymously: the wiped node has a key of its own, so it takes the cluster's admin
    // token for a credential it does not know.
    let endpoints = cluster.endpoints();
    let status = cluster.anonymous(&endpoints, &["cluster", "status", "--json"]);
    status.expect_success();
    let status = status.json();
    let wiped = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"].as_u64() == Some(follower))
        .unwrap()
        .clone();
    assert_eq!(
        wiped["applied_index"], 0,
        "the wiped node applied entries: {status}"
    );
    // The other two still serve.
    let (next, _) = acquire(&mut cluster, "l2", "30s");
    assert!(next > token);

    // Node 1, the bootstrapper, wiped: it would bootstrap again, and the others refuse it.
    cluster.node(1).process.kill9();
    let dir = cluster.node(1).process.data_dir().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    let mut serve = palisade_testkit::command(BIN);
    let initial = cluster
        .nodes
        .values()
        .map(|n| format!("{}={}", n.id, n.address()))
        .collect::<Vec<_>>()
        .join(",");
    serve
        .args([
            "serve",
            "--node-id",
            "1",
            "--listen",
            &cluster.nodes[&1].address(),
        ])
        .arg("--data-dir")
        .arg(&dir)
        .args(["--initial-cluster", &initial]);
    let ran = palisade_testkit::run(serve);
    assert_ne!(ran.code(), Some(0));
    assert!(
        ran.stderr.contains("cannot bootstrap the cluster")
            && ran.stderr.contains("another cluster"),
        "{}",
        ran.stderr
    );
}

#[test]
fn a_single_node_grows_to_three_and_outlives_its_first_node() {
    let mut cluster = LocalCluster::empty(BIN);
    let first = cluster.add_single().address();
    let key = pubkey(&cluster, &first);
    let (token, _) = acquire(&mut cluster, "l", "120s");

    for id in [2, 3] {
        let address = cluster.start_joining(id).address();
        let added = cluster.palisade(&first, &["cluster", "add", &id.to_string(), &address]);
        added.expect_success();
        assert!(
            added.stdout.contains(&format!("added node {id}")),
            "{}",
            added.stdout
        );
    }
    assert_eq!(voters(&cluster.status()), [1, 2, 3]);
    // An id in use is refused with a clear message.
    let again = cluster.palisade(&first, &["cluster", "add", "2", "127.0.0.1:1"]);
    assert_eq!(again.code(), Some(1), "{again:?}");
    assert!(again.stderr.contains("already a voter"), "{}", again.stderr);

    cluster.node(1).process.kill9();
    let leader = cluster.leader();
    assert!([2, 3].contains(&leader));
    let leader_address = cluster.nodes[&leader].address();
    assert_eq!(
        pubkey(&cluster, &leader_address),
        key,
        "the new members sign with another key"
    );
    let held = lock_status(&mut cluster, "l");
    assert_eq!(held["holder"]["token"].as_u64(), Some(token), "{held}");
    let (next, _) = acquire(&mut cluster, "m", "5s");
    assert!(next > token);

    // The dead first node is removed; two voters remain and still serve.
    let removed = cluster.palisade(&leader_address, &["cluster", "remove", "1"]);
    removed.expect_success();
    assert_eq!(voters(&cluster.status()), [2, 3]);
    let (after, _) = acquire(&mut cluster, "m2", "5s");
    assert!(after > next);
}

#[test]
fn a_frozen_leader_that_wakes_after_an_election_grants_nothing() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let old = cluster.leader();
    let old_address = cluster.nodes[&old].address();
    let (before, _) = acquire(&mut cluster, "l", "30s");

    cluster.node(old).process.pause();
    // The others elect a new leader while the old one sleeps.
    let new = cluster.leader();
    assert_ne!(new, old);
    let (during, _) = acquire(&mut cluster, "other", "30s");
    assert!(during > before);

    // Woken, the old leader still believes it leads until it hears the new term; whatever it
    // is asked first, it must not grant. Asked directly (no client that follows the leader),
    // with a session the real leader opened.
    let (_, _, session) = acquire_in_session(&mut cluster, "keeps-a-session", "30s");
    let credential: palisade_client::SessionCredential = session.parse().unwrap();
    cluster.node(old).process.resume();
    let answer = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client = palisade_testkit::locks_client(&format!("http://{old_address}")).await;
        client
            .acquire(palisade_proto::v1::AcquireRequest {
                session: credential.id().get(),
                lock: "fresh".into(),
                request_id: 1,
                wait_ms: 0,
                wait_forever: false,
                session_secret: credential.secret().as_bytes().to_vec(),
                value: String::new(),
                permits: 0,
                shared: false,
            })
            .await
    });
    let refused = answer.expect_err("the deposed leader granted a lock");
    assert!(
        matches!(
            refused.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::NotFound
        ),
        "{refused:?}"
    );
    // It steps down once it hears the new term: at its next exchange with the others, which
    // may wait out the backoff its peer links took while it was frozen. The refusal above can
    // come first (a command not committed in time is answered as of unknown outcome).
    let role_of_old = |cluster: &mut LocalCluster| {
        let status = cluster.status();
        status["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"].as_u64() == Some(old))
            .unwrap()["role"]
            .clone()
    };
    palisade_testkit::wait_until(
        "the woken leader to step down",
        Duration::from_secs(30),
        || role_of_old(&mut cluster) == "follower",
    );
    // The lock it was asked for is free on the real leader.
    let fresh = lock_status(&mut cluster, "fresh");
    assert!(fresh["holder"].is_null(), "{fresh}");
}

#[test]
fn a_palisade_lock_holder_keeps_its_lock_and_its_child_across_a_failover() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = cluster.endpoints();
    let marker = cluster.dir().join("child-ran");
    let mut lock = palisade_testkit::command(BIN);
    lock.args(["--endpoint", &endpoints, "lock", "job", "--ttl", "3s", "--"])
        .args([
            "sh",
            "-c",
            &format!("touch {} && sleep 60", marker.display()),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut holder = palisade_testkit::Running::spawn(lock);
    palisade_testkit::wait_until("the child to start", Duration::from_secs(20), || {
        marker.exists()
    });
    let token = lock_status(&mut cluster, "job")["holder"]["token"]
        .as_u64()
        .expect("held");

    let leader = cluster.leader();
    let killed = Instant::now();
    cluster.node(leader).process.kill9();
    let next = cluster.leader();
    eprintln!(
        "node {leader} killed, node {next} leads after {:?}",
        killed.elapsed()
    );
    // Several TTLs later, the holder's keepalive has followed the new leader.
    std::thread::sleep(Duration::from_secs(9));
    assert!(
        holder.child.try_wait().unwrap().is_none(),
        "palisade lock exited across the failover: {}",
        holder.stderr()
    );
    let status = lock_status(&mut cluster, "job");
    assert_eq!(status["holder"]["token"].as_u64(), Some(token), "{status}");

    // Every command given the whole list, dead node included, finds the leader.
    let all = cluster
        .nodes
        .values()
        .map(|n| n.address())
        .collect::<Vec<_>>()
        .join(",");
    let ran = cluster.palisade(&all, &["status", "job", "--json"]);
    ran.expect_success();
    assert_eq!(ran.json()["holder"]["token"].as_u64(), Some(token));
    let (later, _) = acquire(&mut cluster, "after", "5s");
    assert!(later > token);
}

/// Without TLS, a leader hint is followed only to an endpoint the command was given (N14: its
/// calls carry the bearer token and session secrets): given only a follower, a command fails
/// naming the leader; given the follower first and the leader after it, it goes to the leader.
#[test]
fn commands_given_a_follower_follow_the_leader() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let leader_address = cluster.nodes[&leader].address();
    let follower = cluster
        .nodes
        .values()
        .find(|n| n.id != leader)
        .unwrap()
        .address();
    let alone = cluster.palisade(&follower, &["acquire", "l", "--ttl", "10s"]);
    assert_eq!(alone.code(), Some(69), "{alone:?}");
    assert!(
        alone.stderr.contains("the leader is at") && alone.stderr.contains(&leader_address),
        "{}",
        alone.stderr
    );
    let listed = format!("{follower},{leader_address}");
    let granted = grant(&cluster.palisade(&listed, &["acquire", "l", "--ttl", "10s"]));
    let ran = cluster.palisade(&listed, &["status", "l", "--json"]);
    ran.expect_success();
    assert_eq!(
        ran.json()["holder"]["token"].as_u64(),
        Some(granted["PALISADE_TOKEN"].parse().unwrap())
    );
    // A membership change given only a follower is not sent on to the leader with the admin
    // token (N14); given the follower first and the leader after it, the leader makes it.
    let id = follower_id(&cluster, &follower);
    let alone = cluster.palisade(&follower, &["cluster", "remove", &id.to_string()]);
    assert_eq!(alone.code(), Some(69), "{alone:?}");
    assert!(
        alone.stderr.contains("not among the endpoints given")
            && alone.stderr.contains(&leader_address),
        "{}",
        alone.stderr
    );
    let removed = cluster.palisade(&listed, &["cluster", "remove", &id.to_string()]);
    removed.expect_success();
    cluster.node(id).process.kill9();
    let status = cluster.status();
    assert!(!voters(&status).contains(&id), "{status}");
    assert_eq!(voters(&status).len(), 2, "{status}");
}

/// A cluster command given while no member knows a live leader (the leader just killed, the
/// election not over) waits for the next leader instead of exiting 69 at once.
#[test]
fn a_cluster_command_given_during_an_election_waits_for_the_next_leader() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    // Every member, as the docs ask (without TLS a command follows a leader hint only to an
    // endpoint it was given): the followers name the dead leader until they elect.
    let endpoints = cluster.endpoints();
    cluster.node(leader).process.kill9();
    let started = Instant::now();
    let ran = cluster.palisade(&endpoints, &["keys", "list"]);
    println!(
        "keys list given every member right after the leader's kill: exit {:?} after {:?}",
        ran.code(),
        started.elapsed()
    );
    ran.expect_success();
    assert_ne!(cluster.leader(), leader);
}

fn follower_id(cluster: &LocalCluster, address: &str) -> u64 {
    cluster
        .nodes
        .values()
        .find(|n| n.address() == address)
        .unwrap()
        .id
}

/// A follower removed while it was down never receives the entry that removed it. When it comes
/// back it hears from no leader, asks the members for a (pre-)vote, and learns from their
/// refusal that it was removed: it stops by itself instead of staying up, idle, for ever.
#[test]
fn a_follower_removed_while_down_learns_it_from_the_others_and_stops() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let gone = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    cluster.node(gone).process.kill9();
    let endpoints = cluster.endpoints();
    cluster
        .palisade(&endpoints, &["cluster", "remove", &gone.to_string()])
        .expect_success();

    cluster.node(gone).process.start();
    palisade_testkit::wait_until(
        "the removed follower to stop",
        Duration::from_secs(30),
        || !cluster.node(gone).process.is_running(),
    );
    let log = cluster.node(gone).process.log();
    assert!(
        log.contains("this node was removed from the cluster"),
        "{log}"
    );
    let status = cluster.status();
    assert!(!voters(&status).contains(&gone), "{status}");
    let (token, _) = acquire(&mut cluster, "after", "5s");
    assert!(token > 0);
}

#[test]
fn a_removed_leader_stops_serving_and_the_rest_go_on() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let (token, _) = acquire(&mut cluster, "l", "60s");
    let leader = cluster.leader();
    let endpoints = cluster.endpoints();
    cluster
        .palisade(&endpoints, &["cluster", "remove", &leader.to_string()])
        .expect_success();
    palisade_testkit::wait_until(
        "the removed leader to stop",
        Duration::from_secs(30),
        || !cluster.node(leader).process.is_running(),
    );
    assert!(
        cluster
            .node(leader)
            .process
            .log()
            .contains("this node was removed from the cluster"),
        "{}",
        cluster.node(leader).process.log()
    );
    let status = cluster.status();
    assert_eq!(voters(&status).len(), 2, "{status}");
    assert!(!voters(&status).contains(&leader), "{status}");
    let held = lock_status(&mut cluster, "l");
    assert_eq!(held["holder"]["token"].as_u64(), Some(token), "{held}");
    let (next, _) = acquire(&mut cluster, "m", "5s");
    assert!(next > token);
}

#[test]
fn a_stale_read_is_answered_by_a_node_cut_off_from_the_others() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let (token, _) = acquire(&mut cluster, "l", "60s");
    let leader = cluster.leader();
    let lone = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    // Wait until the lone node has applied the grant, then freeze the other two.
    let lone_address = cluster.nodes[&lone].address();
    palisade_testkit::wait_until(
        "the grant to reach every node",
        Duration::from_secs(20),
        || {
            let ran = cluster.palisade(&lone_address, &["status", "l", "--stale", "--json"]);
            ran.code() == Some(0) && ran.json()["holder"]["token"].as_u64() == Some(token)
        },
    );
    let others: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|id| *id != lone)
        .collect();
    for id in &others {
        cluster.node(*id).process.pause();
    }
    // Without a quorum the node cannot confirm anything: a linearizable read fails...
    let linearizable = cluster.palisade(&lone_address, &["status", "l", "--json"]);
    assert_eq!(linearizable.code(), Some(69), "{linearizable:?}");
    // ...and a stale one answers from its own copy.
    let stale = cluster.palisade(&lone_address, &["status", "l", "--stale", "--json"]);
    stale.expect_success();
    assert_eq!(stale.json()["holder"]["token"].as_u64(), Some(token));
    let listed = cluster.palisade(&lone_address, &["locks", "--stale", "--json"]);
    listed.expect_success();
    assert_eq!(listed.json()[0]["lock"], "l", "{}", listed.stdout);
    for id in &others {
        cluster.node(*id).process.resume();
    }
}

fn store_put(store: &str, sequencer: &str, key: &str, value: &str) -> Ran {
    palisade_testkit::store_put(BIN, store, sequencer, key, value)
}

#[test]
fn a_rolling_restart_keeps_the_service_and_the_store_accepts_every_leaders_sequencers() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = cluster.endpoints();
    let key = pubkey(&cluster, &endpoints);
    let mut store = palisade_testkit::ServerProcess::store(BIN, cluster.dir().join("store"), &key);
    store.start();
    let store_url = store.endpoint();

    let mut last = 0;
    let mut stale_sequencer = None;
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for id in ids {
        // Restart node `id` (SIGTERM, then the same flags and directory).
        cluster.node(id).process.terminate();
        let during = grant(&cluster.palisade(&endpoints, &["acquire", "doc", "--ttl", "2s"]));
        cluster.node(id).process.start();
        let token: u64 = during["PALISADE_TOKEN"].parse().unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
        // The store, configured once with the first key, takes every leader's sequencer.
        store_put(
            &store_url,
            &during["PALISADE_SEQUENCER"],
            "doc",
            &format!("v{token}"),
        )
        .expect_success();
        cluster
            .palisade(
                &endpoints,
                &["release", "doc", "--session", &during["PALISADE_SESSION"]],
            )
            .expect_success();
        if let Some(old) = stale_sequencer.replace(during["PALISADE_SEQUENCER"].clone()) {
            // An older grant's sequencer is refused once a newer one was accepted.
            let refused = store_put(&store_url, &old, "doc", "late");
            assert_ne!(refused.code(), Some(0), "{refused:?}");
            assert!(refused.stderr.contains("stale"), "{}", refused.stderr);
        }
    }
}

#[test]
fn a_cluster_grows_from_one_to_five_and_back_to_one_under_load() {
    let mut cluster = LocalCluster::empty(BIN);
    let first = cluster.add_single().address();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let endpoints = std::sync::Arc::new(std::sync::Mutex::new(first.clone()));
    // A client takes and releases locks the whole time, given the members as they are now.
    let load = {
        let (stop, endpoints) = (stop.clone(), endpoints.clone());
        std::thread::spawn(move || {
            let mut tokens = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                let list = endpoints.lock().unwrap().clone();
                let mut cmd = palisade_testkit::command(BIN);
                cmd.args([
                    "--endpoint",
                    &list,
                    "acquire",
                    "load",
                    "--ttl",
                    "2s",
                    "--wait",
                    "5s",
                ]);
                let ran = palisade_testkit::run(cmd);
                if ran.code() != Some(0) {
                    continue;
                }
                let granted = grant(&ran);
                tokens.push(granted["PALISADE_TOKEN"].parse::<u64>().unwrap());
                let mut release = palisade_testkit::command(BIN);
                release
                    .args(["--endpoint", &list, "release", "load"])
                    .args(["--session", &granted["PALISADE_SESSION"]]);
                palisade_testkit::run(release);
            }
            tokens
        })
    };
    for id in 2..=5 {
        let address = cluster.start_joining(id).address();
        cluster
            .palisade(&first, &["cluster", "add", &id.to_string(), &address])
            .expect_success();
        *endpoints.lock().unwrap() = cluster.endpoints();
    }
    assert_eq!(voters(&cluster.status()), [1, 2, 3, 4, 5]);
    for id in [5, 4, 3, 2] {
        let list = cluster.endpoints();
        cluster
            .palisade(&list, &["cluster", "remove", &id.to_string()])
            .expect_success();
        if cluster.node(id).process.is_running() {
            cluster.node(id).process.kill9();
        }
        *endpoints.lock().unwrap() = cluster.endpoints();
    }
    assert_eq!(voters(&cluster.status()), [1]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let tokens = load.join().unwrap();
    // The last node serves alone.
    let (after, _) = acquire(&mut cluster, "after", "5s");
    assert!(
        tokens.len() >= 3,
        "the load made too few grants: {tokens:?}"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens went back: {tokens:?}"
    );
    assert!(after > *tokens.last().unwrap());
}

/// H6 in a cluster: a follower that cut a damaged tail off its log may have lost entries Raft
/// counted on it to commit. If the members still holding them fail, a leader it elects might
/// not hold them either: that leader learns the follower's floor from its vote and grants
/// nothing below it. Here the follower's cut is its `token-floor-pending` file, as the log's
/// open writes it (the cut itself: `server/tests/service.rs`); its log lags the other
/// survivor's, so the survivor, not the follower, is elected.
#[test]
fn a_leader_elected_by_a_follower_that_cut_its_log_grants_above_that_followers_floor() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let first = cluster.leader();
    let (before, _) = acquire(&mut cluster, "a", "60s");
    let cut = *cluster.nodes.keys().find(|&&id| id != first).unwrap();
    let survivor = *cluster
        .nodes
        .keys()
        .find(|&&id| id != first && id != cut)
        .unwrap();
    cluster.node(cut).process.kill9();
    let (token, _) = acquire(&mut cluster, "b", "60s");
    assert!(token > before);
    let floor = token + 1_000_000;
    let floor_file = cluster
        .node(cut)
        .process
        .data_dir()
        .join("token-floor-pending");
    std::fs::write(&floor_file, format!("{floor}\n")).unwrap();

    cluster.node(first).process.kill9();
    cluster.node(cut).process.start();
    let elected = cluster.leader();
    assert_eq!(
        elected, survivor,
        "node {cut}'s log lacks the grant of `b`: only node {survivor} can be elected"
    );
    let (after, _) = acquire(&mut cluster, "c", "60s");
    assert!(
        after > floor,
        "node {survivor}, elected with node {cut}'s vote, granted token {after}, not above the \
         floor {floor} node {cut} kept after cutting its log"
    );
    assert!(
        cluster
            .node(survivor)
            .process
            .log()
            .contains("a voter cut a damaged tail off its log"),
        "{}",
        cluster.node(survivor).process.log()
    );

    // Once node `cut` applied the floor, its next vote leaves the file behind.
    let applied_everywhere = |cluster: &mut LocalCluster| {
        let status = cluster.status();
        let members = status["members"].as_array().cloned().unwrap_or_default();
        let index = |id: u64| {
            members
                .iter()
                .find(|m| m["id"].as_u64() == Some(id))
                .and_then(|m| m["applied_index"].as_u64())
        };
        index(cut).is_some() && index(cut) == index(survivor)
    };
    palisade_testkit::wait_until(
        "the floor to be applied on the node that cut its log",
        Duration::from_secs(30),
        || applied_everywhere(&mut cluster),
    );
    cluster.node(first).process.start();
    cluster.node(survivor).process.kill9();
    cluster.leader();
    palisade_testkit::wait_until(
        "the applied floor's file to be removed",
        Duration::from_secs(30),
        || !floor_file.exists(),
    );
    let (last, _) = acquire(&mut cluster, "d", "60s");
    assert!(last > after);
}

/// A heartbeat at `term` from `from`, as a hostile client would send it to depose the leader
/// and then write entries of its own.
fn heartbeat(term: u64, from: u64) -> Vec<u8> {
    use openraft::type_config::alias::VoteOf;
    let request = openraft::raft::AppendEntriesRequest::<palisade_server::raft_types::C> {
        vote: VoteOf::<palisade_server::raft_types::C>::new_committed(term, from),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    serde_json::to_vec(&request).expect("an append-entries request")
}

/// Raft messages that claim a node id outside the membership, or a member's id without the
/// incarnations the membership records, are refused by every member: AppendEntries (which
/// would have moved the follower to the sender's term and taken its entries), InstallSnapshot
/// and Vote. The follower's term is where it was.
#[test]
fn raft_messages_from_outside_the_membership_are_refused() {
    use palisade_proto::raft::v1::raft_client::RaftClient;
    use palisade_proto::raft::v1::{
        Envelope, PeerRequest, SnapshotHeader, SnapshotPart, snapshot_part,
    };

    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let target = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let address = cluster.nodes[&target].address();
    let term_of = |cluster: &LocalCluster| {
        let ran = cluster.palisade(&address, &["cluster", "status", "--json"]);
        ran.expect_success();
        let status = ran.json();
        status["members"]
            .as_array()
            .expect("members")
            .iter()
            .find(|m| m["id"].as_u64() == Some(target))
            .and_then(|m| m["term"].as_u64())
            .unwrap_or_else(|| panic!("node {target}'s term in {status}"))
    };
    let term = term_of(&cluster);
    let envelope = |from: u64| {
        Some(Envelope {
            cluster: palisade_server::node::CLUSTER_NAME.to_string(),
            to_node_id: target,
            from_node_id: from,
            to_incarnation: 0,
            from_incarnation: 0,
        })
    };
    let refusals = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut raft = RaftClient::connect(format!("http://{address}"))
            .await
            .unwrap();
        let mut refusals = Vec::new();
        // Node 99 was never added; node `leader` is a member, but the envelope leaves the
        // incarnations at 0 ("unknown"), as someone who does not know them must.
        for from in [99, leader] {
            let appended = raft
                .append_entries(PeerRequest {
                    envelope: envelope(from),
                    body: heartbeat(term + 1_000, from),
                })
                .await;
            refusals.push((format!("append-entries from {from}"), appended.err()));
        }
        let header = SnapshotPart {
            part: Some(snapshot_part::Part::Header(SnapshotHeader {
                envelope: envelope(99),
                ..SnapshotHeader::default()
            })),
        };
        let installed = raft.install_snapshot(tokio_stream::iter([header])).await;
        refusals.push(("install-snapshot from 99".into(), installed.err()));
        let vote = openraft::raft::VoteRequest::<palisade_server::raft_types::C>::new(
            openraft::type_config::alias::VoteOf::<palisade_server::raft_types::C>::new(
                term + 1_000,
                99,
            ),
            None,
        );
        let voted = raft
            .vote(PeerRequest {
                envelope: envelope(99),
                body: serde_json::to_vec(&vote).unwrap(),
            })
            .await;
        refusals.push(("vote from 99".into(), voted.err()));
        refusals
    });
    for (what, refusal) in refusals {
        let refusal = refusal.unwrap_or_else(|| panic!("{what} was answered"));
        assert_eq!(
            refusal.code(),
            tonic::Code::FailedPrecondition,
            "{what}: {refusal:?}"
        );
    }
    let now = term_of(&cluster);
    assert!(
        now < term + 1_000,
        "the follower took the sender's term: {now}"
    );
    let (token, _) = acquire(&mut cluster, "jobs/after", "30s");
    assert!(token > 0);
}

/// A follower asked to stop (SIGTERM) does not wait for its leader: the leader's append stream
/// to it, which never ends by itself, ends when the node begins to stop. Before, every follower
/// waited out its shutdown grace for that stream and logged "connections still open".
#[test]
fn a_follower_stops_without_waiting_out_its_leaders_append_stream() {
    let mut cluster = LocalCluster::start(BIN, 3);
    acquire(&mut cluster, "replicated", "5s");
    let leader = cluster.leader();
    let follower = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader)
        .expect("a follower");
    let node = cluster.node(follower);
    node.process.terminate();
    let log = node.process.log();
    assert!(log.contains("shutting down"), "{log}");
    assert!(!log.contains("connections still open"), "{log}");
}
