//! Sessions belong to whoever opened them: a `palisade serve` process (and a three-node cluster)
//! against raw gRPC clients that know a session's id — which `status`, `locks` and `watch` show
//! to anyone — but not its secret, as a grpcurl user who read the id off `palisade locks` would.
//!
//! Neither the id alone nor the id with a made-up secret renews, keeps alive, acquires in,
//! releases or closes the session; the owner, who presents the secret, keeps working
//! throughout, across a change of leader too, and the one-shot CLI carries the secret in
//! `PALISADE_SESSION`.

use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_testkit::{LocalCluster, ServerProcess, locks_client};
use tonic::transport::Channel;
use tonic::{Code, Status};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const TTL_MS: u64 = 60_000;

/// A session as its opener holds it.
#[derive(Clone)]
struct Opened {
    session: u64,
    secret: Vec<u8>,
}

async fn open(client: &mut LocksClient<Channel>, open_key: Vec<u8>) -> Opened {
    let opened = client
        .open_session(OpenSessionRequest {
            ttl_ms: TTL_MS,
            open_key,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        opened.session_secret.len(),
        32,
        "session {} came without a 32-byte secret",
        opened.session
    );
    Opened {
        session: opened.session,
        secret: opened.session_secret,
    }
}

fn acquire(session: &Opened, lock: &str, request_id: u64) -> AcquireRequest {
    AcquireRequest {
        session: session.session,
        lock: lock.into(),
        request_id,
        wait_ms: 0,
        wait_forever: false,
        session_secret: session.secret.clone(),
        value: String::new(),
        permits: 0,
        shared: false,
    }
}

fn release(session: &Opened, lock: &str, request_id: u64) -> ReleaseRequest {
    ReleaseRequest {
        session: session.session,
        lock: lock.into(),
        request_id,
        session_secret: session.secret.clone(),
    }
}

fn renewal(session: &Opened) -> KeepAliveRequest {
    KeepAliveRequest {
        session: session.session,
        session_secret: session.secret.clone(),
    }
}

/// The refusal of a call made without the session's secret: UNAUTHENTICATED, with the stable
/// kind in its `ErrorDetail`, and a message that says what is missing.
fn assert_unauthenticated<T: std::fmt::Debug>(result: Result<T, Status>, kind: &str, call: &str) {
    let status = match result {
        Ok(answer) => panic!("{call} without the session's secret was answered: {answer:?}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::Unauthenticated, "{call}: {status:?}");
    let detail = palisade_proto::error::core_from_status(&status)
        .unwrap_or_else(|| panic!("{call}: no ErrorDetail in {status:?}"));
    assert_eq!(detail.code(), kind, "{call}: {status:?}");
    assert!(
        status.message().contains("secret"),
        "{call}: {}",
        status.message()
    );
}

/// Every call that acts for a session, made by `stranger` as `pretender` (the owner's session
/// id with another secret, or none): each is refused with `kind`.
async fn every_call_is_refused(
    stranger: &mut LocksClient<Channel>,
    pretender: &Opened,
    held: &str,
    kind: &str,
) {
    assert_unauthenticated(stranger.renew(renewal(pretender)).await, kind, "Renew");
    assert_unauthenticated(
        stranger.acquire(acquire(pretender, "elsewhere", 7)).await,
        kind,
        "Acquire",
    );
    assert_unauthenticated(
        stranger.release(release(pretender, held, 8)).await,
        kind,
        "Release",
    );
    assert_unauthenticated(
        stranger
            .close_session(CloseSessionRequest {
                session: pretender.session,
                session_secret: pretender.secret.clone(),
            })
            .await,
        kind,
        "CloseSession",
    );
    // A keepalive stream opens, and its first renewal ends it with the refusal.
    let pings = tokio_stream::iter(vec![renewal(pretender)]);
    let first = match stranger.keep_alive(pings).await {
        Ok(stream) => stream.into_inner().message().await,
        Err(status) => Err(status),
    };
    assert_unauthenticated(first, kind, "KeepAlive");
}

async fn holder_of(client: &mut LocksClient<Channel>, lock: &str) -> Option<(u64, u64)> {
    client
        .status(StatusRequest {
            lock: lock.into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner()
        .holder
        .map(|h| (h.session, h.token))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_id_alone_or_with_a_wrong_secret_acts_for_nothing_while_its_owner_keeps_working()
{
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();

    // Phase 1: the owner opens a session and takes a lock; anyone can read the session's id
    // off the lock's status.
    let mut owner_client = locks_client(&service.endpoint()).await;
    let owner = open(&mut owner_client, Vec::new()).await;
    let granted = owner_client
        .acquire(acquire(&owner, "jobs/nightly", 1))
        .await
        .unwrap()
        .into_inner();
    let mut stranger = locks_client(&service.endpoint()).await;
    assert_eq!(
        holder_of(&mut stranger, "jobs/nightly").await,
        Some((owner.session, granted.token))
    );

    // Phase 2: the stranger, with the id alone, can do nothing for the session.
    let bare = Opened {
        session: owner.session,
        secret: Vec::new(),
    };
    every_call_is_refused(
        &mut stranger,
        &bare,
        "jobs/nightly",
        "session_secret_missing",
    )
    .await;

    // Phase 3: nor with a made-up secret, nor with the secret of a session of its own.
    let made_up = Opened {
        session: owner.session,
        secret: vec![0x5a; 32],
    };
    every_call_is_refused(
        &mut stranger,
        &made_up,
        "jobs/nightly",
        "session_secret_wrong",
    )
    .await;
    let own = open(&mut stranger, Vec::new()).await;
    assert_ne!(own.secret, owner.secret, "two sessions got the same secret");
    let borrowed = Opened {
        session: owner.session,
        secret: own.secret.clone(),
    };
    every_call_is_refused(
        &mut stranger,
        &borrowed,
        "jobs/nightly",
        "session_secret_wrong",
    )
    .await;

    // Phase 4: the owner's session and lock are untouched, and the owner keeps working: a
    // renewal, a second lock, a release, a close.
    assert_eq!(
        holder_of(&mut owner_client, "jobs/nightly").await,
        Some((owner.session, granted.token))
    );
    assert_eq!(
        holder_of(&mut owner_client, "elsewhere").await,
        None,
        "a stranger's acquire took a lock in the owner's session"
    );
    let renewed = owner_client
        .renew(renewal(&owner))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.session, owner.session);
    assert!(renewed.ttl_remaining_ms > TTL_MS / 2, "{renewed:?}");
    owner_client
        .acquire(acquire(&owner, "elsewhere", 2))
        .await
        .unwrap();
    let released = owner_client
        .release(release(&owner, "jobs/nightly", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.token, Some(granted.token));
    owner_client
        .close_session(CloseSessionRequest {
            session: owner.session,
            session_secret: owner.secret.clone(),
        })
        .await
        .unwrap();
    assert_eq!(holder_of(&mut owner_client, "elsewhere").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_open_gets_the_same_secret_and_the_one_shot_cli_carries_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = ServerProcess::lock_service(BIN, dir.path().join("data"));
    service.start();
    let mut client = locks_client(&service.endpoint()).await;

    // Phase 1: an open retried with its key gets the same session and the same secret, which
    // acts for it; another key gets another secret.
    let key: Vec<u8> = (1..=16).collect();
    let first = open(&mut client, key.clone()).await;
    let retried = open(&mut client, key.clone()).await;
    assert_eq!(
        (retried.session, &retried.secret),
        (first.session, &first.secret)
    );
    client.renew(renewal(&retried)).await.unwrap();
    let mut other_key = key.clone();
    other_key[0] = 99;
    assert_ne!(open(&mut client, other_key).await.secret, first.secret);

    // Phase 2: `palisade acquire` prints one opaque PALISADE_SESSION value, `<id>.<secret>`,
    // which `renew` and `release` take; the id alone is refused before anything is sent, with
    // an error that says what to pass instead.
    let endpoint = service.endpoint();
    let run = |args: &[&str]| {
        let mut command = palisade_testkit::command(BIN);
        command.args(["--endpoint", &endpoint]).args(args);
        palisade_testkit::run(command)
    };
    let granted = run(&["acquire", "reports", "--ttl", "60s"]);
    granted.expect_success();
    let values = granted.key_values();
    let credential = &values["PALISADE_SESSION"];
    let (id, secret) = credential
        .split_once('.')
        .unwrap_or_else(|| panic!("PALISADE_SESSION={credential} has no secret"));
    assert_eq!(secret.len(), 64, "{credential}");
    assert_eq!(
        holder_of(&mut client, "reports")
            .await
            .map(|(s, _)| s.to_string()),
        Some(id.to_string())
    );
    let bare = run(&["renew", "--session", id]);
    assert_eq!(bare.code(), Some(2), "{bare:?}");
    assert!(bare.stderr.contains("bare session id"), "{}", bare.stderr);
    let forged = format!("{id}.{}", "0".repeat(64));
    let wrong = run(&["release", "reports", "--session", &forged]);
    assert_eq!(wrong.code(), Some(1), "{wrong:?}");
    assert!(wrong.stderr.contains("secret"), "{}", wrong.stderr);
    assert!(holder_of(&mut client, "reports").await.is_some());
    // N16: the credential given as --session works, with a warning that it shows in `ps`;
    // exported as PALISADE_SESSION, it works without one.
    let flagged = run(&["renew", "--session", credential]);
    flagged.expect_success();
    assert!(
        flagged
            .stderr
            .contains("--session puts the session's secret in the process list")
            && flagged.stderr.contains("export PALISADE_SESSION"),
        "{}",
        flagged.stderr
    );
    let mut command = palisade_testkit::command(BIN);
    command
        .args(["--endpoint", &endpoint, "renew"])
        .env("PALISADE_SESSION", credential);
    let exported = palisade_testkit::run(command);
    exported.expect_success();
    assert!(!exported.stderr.contains("warning"), "{}", exported.stderr);
    run(&["release", "reports", "--session", credential]).expect_success();
    assert_eq!(holder_of(&mut client, "reports").await, None);
}

/// After the leader is killed, a session opened on it is still its owner's alone: the new
/// leader checks the same secret (it has the digest from the log), a retried keyed open there
/// returns the same secret, and a stranger with the id is refused there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_still_works_and_is_still_needed_after_a_change_of_leader() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let leader = cluster.leader();
    let first_address = cluster.nodes[&leader].address();
    let mut first = locks_client(&format!("http://{first_address}")).await;
    let key: Vec<u8> = (40..72).collect();
    let owner = open(&mut first, key.clone()).await;
    let granted = first
        .acquire(acquire(&owner, "jobs/failover", 1))
        .await
        .unwrap()
        .into_inner();

    cluster.node(leader).process.kill9();
    let next = cluster.leader();
    assert_ne!(next, leader);
    let mut second = locks_client(&format!("http://{}", cluster.nodes[&next].address())).await;

    // The stranger is refused by the new leader as by the old.
    let bare = Opened {
        session: owner.session,
        secret: Vec::new(),
    };
    every_call_is_refused(
        &mut second,
        &bare,
        "jobs/failover",
        "session_secret_missing",
    )
    .await;

    // The owner's retried open (its reply was lost with the old leader) returns the same
    // session and secret, which renews, keeps the lock and releases it.
    let retried = open(&mut second, key).await;
    assert_eq!(
        (retried.session, &retried.secret),
        (owner.session, &owner.secret)
    );
    second.renew(renewal(&owner)).await.unwrap();
    assert_eq!(
        holder_of(&mut second, "jobs/failover").await,
        Some((owner.session, granted.token))
    );
    let released = second
        .release(release(&owner, "jobs/failover", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.token, Some(granted.token));
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// N12: the log, the snapshot and a backup keep a keyed hash of an open key, never the key, so
/// what they hold hands nobody the session or its secret; and since every member derives the
/// same hash, a retry with the key still finds its session after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_file_holds_an_open_key_and_what_the_log_holds_opens_another_session() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut service = ServerProcess::lock_service(BIN, &data);
    service.start();
    let mut client = locks_client(&service.endpoint()).await;

    // Phase 1: a session opened with a key; then a backup, which needs the admin token.
    let key: Vec<u8> = (0..24u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let first = open(&mut client, key.clone()).await;
    let backup = dir.path().join("palisade.backup");
    let mut command = palisade_testkit::command(BIN);
    command
        .args(["--endpoint", &service.endpoint(), "--token-file"])
        .arg(data.join("admin.token"))
        .args(["cluster", "backup"])
        .arg(&backup);
    palisade_testkit::run(command).expect_success();

    // Phase 2: neither the key (as hex or as bytes) nor the secret is in any file.
    let mut files = files_under(&data);
    files.push(backup);
    let mut log = None;
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(&hex),
            "{} holds the open key",
            file.display()
        );
        for secret in [&key, &first.secret] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_slice()),
                "{} holds the open key or the secret as bytes",
                file.display()
            );
        }
        if let Some((_, after)) = text.split_once(r#""open_key":""#) {
            log = Some(after.split('"').next().unwrap().to_string());
        }
    }
    let stored = log.expect("an OpenSessionWithKey entry in the log");

    // Phase 3: presenting what the log holds opens another session, with another secret.
    let stored: Vec<u8> = (0..stored.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&stored[i..i + 2], 16).unwrap())
        .collect();
    let other = open(&mut client, stored).await;
    assert_ne!(other.session, first.session);
    assert_ne!(other.secret, first.secret);

    // Phase 4: after a restart (the table rebuilt from the files), the key finds its session.
    service.terminate();
    service.start();
    let mut client = locks_client(&service.endpoint()).await;
    let retried = open(&mut client, key).await;
    assert_eq!(
        (retried.session, &retried.secret),
        (first.session, &first.secret)
    );
    client.renew(renewal(&retried)).await.unwrap();
}
