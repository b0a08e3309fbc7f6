//! TLS with real processes: `palisade tls init` makes the certificates, `palisade serve` and
//! `palisade store serve` serve TLS, and the `palisade` client commands connect with the global
//! `--tls-ca`, `--tls-cert` and `--tls-key`. Each test asserts what a user sees: exit statuses,
//! output, error messages, a socket closed.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use palisade_testkit::process::Announce;
use palisade_testkit::{Ran, ServerProcess, command, run, unused_port};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// The files `palisade tls init` writes.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn init(dir: &Path, client_name: &str) -> Certs {
        let mut init = command(BIN);
        init.args(["tls", "init"])
            .arg(dir)
            .args(["--client-name", client_name]);
        run(init).expect_success();
        Certs {
            dir: dir.to_path_buf(),
        }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    /// The flags of a client trusting this CA and presenting no certificate.
    fn trust(&self) -> Vec<String> {
        vec!["--tls-ca".into(), self.file("ca.pem")]
    }

    /// The flags of a client trusting `ca` and presenting this directory's client certificate.
    fn client_of(&self, ca: &Certs) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            ca.file("ca.pem"),
            "--tls-cert".into(),
            self.file("client.pem"),
            "--tls-key".into(),
            self.file("client.key"),
        ]
    }

    /// The flags of a node serving this directory's node certificate.
    fn node(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.file("server.pem"),
            "--tls-key".into(),
            self.file("server.key"),
        ]
    }

    /// The flags of a fenced store serving this directory's store certificate.
    fn store(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.file("store.pem"),
            "--tls-key".into(),
            self.file("store.key"),
        ]
    }

    /// `--tls-client-ca` with this directory's client CA.
    fn client_ca(&self) -> [String; 2] {
        ["--tls-client-ca".into(), self.file("client-ca.pem")]
    }
}

fn lock_service(data_dir: &Path, flags: &[String]) -> ServerProcess {
    let mut service = ServerProcess::lock_service(BIN, data_dir);
    for flag in flags {
        service = service.arg(flag);
    }
    service.start();
    service
}

/// `palisade store serve` in `dir`, verifying sequencers with `key`, with the TLS `flags`.
fn tls_store(dir: &Path, key: &str, flags: &[String]) -> ServerProcess {
    let mut store = ServerProcess::custom("palisade store serve", dir, Announce::Store, {
        let dir = dir.to_path_buf();
        let key = key.to_owned();
        let flags = flags.to_vec();
        move |ports| {
            let mut cmd = command(BIN);
            cmd.args(["store", "serve", "--listen", &ports.listen.to_string()])
                .arg("--data-dir")
                .arg(&dir)
                .args(["--public-key", &key])
                .args(&flags)
                .env("RUST_LOG", "info");
            cmd
        }
    });
    store.start();
    store
}

/// `palisade` with `tls` flags against `endpoint`.
fn palisade(endpoint: &str, tls: &[String], args: &[&str]) -> Ran {
    let mut cmd = command(BIN);
    cmd.args(["--endpoint", endpoint]).args(tls).args(args);
    run(cmd)
}

fn bare(service: &ServerProcess) -> String {
    service.addr().to_string()
}

#[test]
fn a_client_trusting_the_ca_locks_and_writes_to_the_fenced_store_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let service = lock_service(&dir.path().join("data"), &certs.node());
    let endpoint = bare(&service);

    // Phase 1: a lock over TLS (no scheme: TLS makes it https://).
    let granted = palisade(
        &endpoint,
        &certs.trust(),
        &["acquire", "jobs/a", "--ttl", "30s"],
    );
    granted.expect_success();
    let grant = granted.key_values();
    assert_eq!(grant["PALISADE_TOKEN"], "1");
    let status = palisade(
        &format!("https://{endpoint}"),
        &certs.trust(),
        &["status", "jobs/a"],
    );
    status.expect_success();
    assert!(status.stdout.contains("session"), "{}", status.stdout);

    // Phase 2: the fenced store over TLS, verifying the service's key.
    let key = palisade(&endpoint, &certs.trust(), &["pubkey"]);
    key.expect_success();
    let store = tls_store(&dir.path().join("store"), key.stdout.trim(), &certs.store());
    let store_url = format!("https://{}", store.addr());
    let put = |tls: &[String]| {
        let mut cmd = command(BIN);
        cmd.args(tls)
            .args(["store", "put", "report", "v1"])
            .env("PALISADE_STORE", &store_url)
            .env("PALISADE_SEQUENCER", &grant["PALISADE_SEQUENCER"]);
        run(cmd)
    };
    put(&certs.trust()).expect_success();
    let mut get = command(BIN);
    get.args(certs.trust())
        .args(["store", "get", "report"])
        .env("PALISADE_STORE", &store_url);
    let got = run(get);
    got.expect_success();
    assert_eq!(got.stdout.trim(), "v1");

    // Phase 3: an https:// store without a CA to check it with is a clear refusal.
    let refused = put(&[]);
    assert_ne!(refused.code(), Some(0));
    assert!(
        refused.stderr.contains("no CA is given"),
        "{}",
        refused.stderr
    );

    // Phase 4: released over TLS.
    let mut release = command(BIN);
    release
        .args(["--endpoint", &endpoint])
        .args(certs.trust())
        .args(["release", "jobs/a"])
        .env("PALISADE_SESSION", &grant["PALISADE_SESSION"])
        .env("PALISADE_TOKEN", &grant["PALISADE_TOKEN"]);
    run(release).expect_success();
    let status = palisade(&endpoint, &certs.trust(), &["status", "jobs/a", "--json"]);
    status.expect_success();
    assert!(status.json()["holder"].is_null(), "{}", status.stdout);
}

#[test]
fn a_client_trusting_another_ca_or_none_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let other = Certs::init(&dir.path().join("other"), "ops");
    let service = lock_service(&dir.path().join("data"), &certs.node());
    let endpoint = bare(&service);

    // Another CA: the server's certificate does not verify.
    let refused = palisade(&endpoint, &other.trust(), &["status", "jobs/a"]);
    assert_eq!(refused.code(), Some(69), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("TLS handshake failed")
            && refused.stderr.contains("invalid peer certificate"),
        "{}",
        refused.stderr
    );

    // https:// without a CA, and http:// with one: usage errors that say what to do.
    let refused = palisade(&format!("https://{endpoint}"), &[], &["status", "jobs/a"]);
    assert_ne!(refused.code(), Some(0));
    assert!(refused.stderr.contains("--tls-ca"), "{}", refused.stderr);
    let refused = palisade(
        &format!("http://{endpoint}"),
        &certs.trust(),
        &["status", "jobs/a"],
    );
    assert_ne!(refused.code(), Some(0));
    assert!(
        refused.stderr.contains("asks for plaintext"),
        "{}",
        refused.stderr
    );

    // Plaintext against a TLS server: refused, not served and not hung.
    let refused = palisade(&endpoint, &[], &["status", "jobs/a"]);
    assert_eq!(refused.code(), Some(69), "{}", refused.stderr);

    // A bad CA file is named.
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not pem").unwrap();
    let refused = palisade(
        &endpoint,
        &["--tls-ca".into(), garbage.to_str().unwrap().into()],
        &["status", "jobs/a"],
    );
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("garbage.pem") && refused.stderr.contains("not valid PEM"),
        "{}",
        refused.stderr
    );
}

#[test]
fn a_server_requiring_client_certificates_refuses_clients_without_one_or_from_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let other = Certs::init(&dir.path().join("other"), "intruder");
    let mut flags = certs.node();
    flags.extend(certs.client_ca());
    let service = lock_service(&dir.path().join("data"), &flags);
    let endpoint = bare(&service);

    let answered = palisade(&endpoint, &certs.client_of(&certs), &["status", "jobs/a"]);
    answered.expect_success();

    let without = palisade(&endpoint, &certs.trust(), &["status", "jobs/a"]);
    assert_eq!(without.code(), Some(69), "{}", without.stderr);
    let stranger = palisade(&endpoint, &other.client_of(&certs), &["status", "jobs/a"]);
    assert_eq!(stranger.code(), Some(69), "{}", stranger.stderr);

    // The server says why, for the operator.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = service.log();
        let reasons = (
            log.contains("TLS handshake failed: peer sent no certificates"),
            log.contains("TLS handshake failed: invalid peer certificate"),
        );
        if reasons == (true, true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not log both refusals: {reasons:?}\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn three_nodes_with_tls_peer_links_elect_a_leader_and_keep_a_lock_past_the_leaders_death() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let members: Vec<(u64, SocketAddr)> = (1..=3)
        .map(|id| (id, SocketAddr::from(([127, 0, 0, 1], unused_port()))))
        .collect();
    let initial = members
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<(u64, ServerProcess)> = members
        .iter()
        .map(|&(id, addr)| {
            let data = dir.path().join(format!("node-{id}"));
            let mut flags = certs.node();
            flags.extend(["--tls-peer-ca".into(), certs.file("ca.pem")]);
            flags.extend(certs.client_ca());
            let initial = initial.clone();
            let process = ServerProcess::custom(
                &format!("palisade serve (node {id})"),
                &data,
                Announce::LockService,
                {
                    let data = data.clone();
                    move |_| {
                        let mut cmd = command(BIN);
                        cmd.args(["serve", "--listen", &addr.to_string(), "--data-dir"])
                            .arg(&data)
                            .args(["--node-id", &id.to_string()])
                            .args(["--initial-cluster", &initial])
                            .args(&flags)
                            .env("RUST_LOG", "info");
                        cmd
                    }
                },
            );
            (id, process)
        })
        .collect();
    // The lowest id bootstraps once the others answer, so it starts last.
    for (_, node) in nodes.iter_mut().rev() {
        node.start();
    }
    let endpoints = members
        .iter()
        .map(|(_, addr)| addr.to_string())
        .collect::<Vec<_>>()
        .join(",");

    // Clients present certificates of the client CA.
    let client = certs.client_of(&certs);

    // Phase 1: a leader is elected over TLS peer links, and a lock is granted.
    let deadline = Instant::now() + Duration::from_secs(20);
    let granted = loop {
        let granted = palisade(&endpoints, &client, &["acquire", "jobs/a", "--ttl", "60s"]);
        if granted.code() == Some(0) {
            break granted;
        }
        assert!(Instant::now() < deadline, "no grant: {}", granted.stderr);
        std::thread::sleep(Duration::from_millis(200));
    };
    let session = granted.key_values()["PALISADE_SESSION"].clone();
    let session_id = session.split('.').next().unwrap().to_owned();

    // Phase 2: the leader dies; the lock, replicated over TLS, is still held on the others.
    let cluster = palisade(&endpoints, &client, &["cluster", "status", "--json"]);
    cluster.expect_success();
    let leader = cluster.json()["leader"].as_u64().expect("a leader id");
    let (_, dead) = nodes.iter_mut().find(|(id, _)| *id == leader).unwrap();
    dead.kill9();
    let survivors = members
        .iter()
        .filter(|(id, _)| *id != leader)
        .map(|(_, addr)| addr.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = palisade(&survivors, &client, &["status", "jobs/a", "--json"]);
        if status.code() == Some(0) {
            let status = status.json();
            assert_eq!(
                status["holder"]["session"].to_string(),
                session_id,
                "{status}"
            );
            assert_eq!(status["holder"]["token"], 1, "{status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new leader: {}",
            status.stderr
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Phase 3: a client whose certificate the client CA signed gets no Raft call answered:
    // its certificate is no peer's, whatever it claims to be.
    let survivor = members.iter().find(|(id, _)| *id != leader).unwrap().1;
    let codes = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let tls = palisade_tls::ClientTls::from_files(
            Path::new(&certs.file("ca.pem")),
            Some(Path::new(&certs.file("client.pem"))),
            Some(Path::new(&certs.file("client.key"))),
            palisade_tls::ALPN_H2,
        )
        .unwrap();
        let dialer = palisade_proto::transport::TlsDialer::dialer(tls, None);
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("https://{survivor}")).unwrap();
        let channel = palisade_proto::transport::connect(endpoint, Some(&dialer))
            .await
            .unwrap();
        let mut raft = palisade_proto::raft::v1::raft_client::RaftClient::new(channel);
        let vote = raft
            .vote(palisade_proto::raft::v1::PeerRequest::default())
            .await
            .unwrap_err()
            .code();
        let append = raft
            .append_entries(palisade_proto::raft::v1::PeerRequest::default())
            .await
            .unwrap_err()
            .code();
        (vote, append)
    });
    assert_eq!(
        codes,
        (tonic::Code::Unauthenticated, tonic::Code::Unauthenticated)
    );
}

/// A node refuses to start where its peers would not be authenticated, naming the flag that
/// would run it anyway: one CA for clients and peers (the set-up `tls init` and the docs once
/// showed, which made every client certificate a peer's), and a cluster of several nodes with a
/// policy over plaintext. Nothing is created in the data directory.
#[test]
fn a_node_whose_peers_would_not_be_authenticated_refuses_to_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let serve = |data: &str, flags: &[String]| {
        let mut cmd = command(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join(data))
            .args(flags);
        run(cmd)
    };

    let mut shared = certs.node();
    shared.extend([
        "--tls-client-ca".into(),
        certs.file("ca.pem"),
        "--tls-peer-ca".into(),
        certs.file("ca.pem"),
    ]);
    let refused = serve("shared", &shared);
    assert_ne!(refused.code(), Some(0), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("is also a client CA (--tls-client-ca), so every client certificate")
            && refused.stderr.contains("--insecure-peers"),
        "{}",
        refused.stderr
    );
    assert!(!dir.path().join("shared").join("raft.wal").exists());

    let policy = dir.path().join("policy");
    std::fs::write(&policy, "grant ops lock,read jobs/\n").unwrap();
    let cluster = format!(
        "1=127.0.0.1:{},2=127.0.0.1:{}",
        unused_port(),
        unused_port()
    );
    let plaintext_cluster = [
        "--policy".to_string(),
        policy.to_str().unwrap().to_string(),
        "--node-id".into(),
        "1".into(),
        "--initial-cluster".into(),
        cluster,
    ];
    let refused = serve("plaintext", &plaintext_cluster);
    assert_ne!(refused.code(), Some(0), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("a member of a cluster of several nodes and it has a policy")
            && refused.stderr.contains("serves no TLS")
            && refused.stderr.contains("--insecure-peers"),
        "{}",
        refused.stderr
    );
    assert!(!dir.path().join("plaintext").join("raft.wal").exists());
}

/// A TLS handshake is under the connection's preface deadline (5 s): a client that starts one
/// and stalls is closed there, its permit freed, while an honest client is served meanwhile.
#[test]
fn a_stalled_tls_handshake_is_closed_at_the_preface_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let service = lock_service(&dir.path().join("data"), &certs.node());
    let endpoint = bare(&service);

    // The first five bytes of a TLS record carrying a ClientHello, then nothing.
    let started = Instant::now();
    let mut stalled = TcpStream::connect(service.addr()).unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();

    palisade(&endpoint, &certs.trust(), &["status", "jobs/a"]).expect_success();

    let mut buf = [0u8; 64];
    let read = stalled.read(&mut buf);
    let closed_after = started.elapsed();
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut),
        "the stalled connection was not closed: {read:?} after {closed_after:?}"
    );
    assert!(
        closed_after >= Duration::from_secs(4) && closed_after < Duration::from_secs(8),
        "closed after {closed_after:?}, expected the 5 s preface deadline"
    );
}

#[test]
fn a_store_requiring_client_certificates_takes_a_write_only_from_a_client_of_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let other = Certs::init(&dir.path().join("other"), "intruder");
    let service = lock_service(&dir.path().join("data"), &[]);
    let endpoint = service.endpoint();
    let granted = palisade(&endpoint, &[], &["acquire", "jobs/a", "--ttl", "30s"]);
    granted.expect_success();
    let sequencer = granted.key_values()["PALISADE_SEQUENCER"].clone();
    let key = palisade(&endpoint, &[], &["pubkey"]);
    key.expect_success();

    let mut flags = certs.store();
    flags.extend(certs.client_ca());
    let store = tls_store(&dir.path().join("store"), key.stdout.trim(), &flags);
    let store_url = format!("https://{}", store.addr());
    let put = |tls: &[String], value: &str| {
        let mut cmd = command(BIN);
        cmd.args(tls)
            .args(["store", "put", "report", value])
            .env("PALISADE_STORE", &store_url)
            .env("PALISADE_SEQUENCER", &sequencer);
        run(cmd)
    };

    // Refused in the handshake: nothing reaches the store (unavailable, or unknown when the
    // TLS 1.3 refusal arrives after the request was sent; either way not written, below).
    let without = put(&certs.trust(), "anonymous");
    assert!(
        matches!(without.code(), Some(69 | 77)),
        "{}",
        without.stderr
    );
    let stranger = put(&other.client_of(&certs), "intruder");
    assert!(
        matches!(stranger.code(), Some(69 | 77)),
        "{}",
        stranger.stderr
    );
    let mut get = command(BIN);
    get.args(certs.client_of(&certs))
        .args(["store", "get", "report"])
        .env("PALISADE_STORE", &store_url);
    assert_eq!(run(get).code(), Some(5), "nothing was written");
    put(&certs.client_of(&certs), "v1").expect_success();

    let mut get = command(BIN);
    get.args(certs.client_of(&certs))
        .args(["store", "get", "report"])
        .env("PALISADE_STORE", &store_url);
    let got = run(get);
    got.expect_success();
    assert_eq!(got.stdout.trim(), "v1");
}

/// Mutual TLS names the caller: the client certificate's name is the identity a policy grants
/// rights to, and a bearer token naming someone else beside it is refused.
#[test]
fn a_client_certificate_is_the_identity_a_policy_grants_rights_to() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::init(&dir.path().join("tls"), "ops");
    let policy = dir.path().join("policy");
    std::fs::write(&policy, "grant ops lock,read jobs/\n").unwrap();
    let mut new_token = command(BIN);
    new_token.args(["token", "new", "robot"]);
    let made = run(new_token);
    made.expect_success();
    let mut lines = made.stdout.lines();
    let token = lines.next().unwrap().to_owned();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{}\n", lines.next().unwrap())).unwrap();

    let mut flags = certs.node();
    flags.extend(certs.client_ca());
    flags.extend([
        "--policy".into(),
        policy.to_str().unwrap().into(),
        "--tokens".into(),
        tokens.to_str().unwrap().into(),
    ]);
    let service = lock_service(&dir.path().join("data"), &flags);
    let endpoint = bare(&service);
    let ops = certs.client_of(&certs);

    palisade(&endpoint, &ops, &["lock", "jobs/a", "--", "true"]).expect_success();
    let outside = palisade(&endpoint, &ops, &["lock", "other/a", "--", "true"]);
    assert_ne!(outside.code(), Some(0), "{}", outside.stderr);
    for word in ["ops", "lock", "other/a"] {
        assert!(
            outside.stderr.contains(word),
            "the refusal names {word}: {}",
            outside.stderr
        );
    }

    let mut both = ops.clone();
    both.extend(["--token".into(), token]);
    let conflict = palisade(&endpoint, &both, &["lock", "jobs/a", "--", "true"]);
    assert_ne!(conflict.code(), Some(0), "{}", conflict.stderr);
    assert!(
        conflict.stderr.contains("different identities"),
        "{}",
        conflict.stderr
    );
}
