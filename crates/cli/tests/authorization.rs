//! Nobody gets in who does not belong: a `palisade serve` process with a token file and a policy,
//! against clients that present no token, a wrong one, or the token of an identity the policy
//! does not allow what they ask; sessions that another identity cannot use even with their
//! secret; per-identity quotas that hold one identity at its caps while another works on; a
//! policy reloaded by SIGHUP; and the loopback-only default without a policy.
//!
//! Tokens are made by `palisade token new`, as an operator makes them. What is asserted is what
//! a user observes: status codes and error kinds of raw gRPC calls, the Rust client's errors,
//! and the exit statuses and messages of `palisade`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_client::{
    AcquireError, AcquireOptions, Bearer, BearerToken, Client, ClientOptions, ErrorClass,
    QueryError, SessionError, SessionOptions, Wait,
};
use palisade_core::{CoreError, CredentialError, Quota, Right};
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_testkit::ServerProcess;
use tempfile::TempDir;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const TTL: Duration = Duration::from_secs(60);

/// A token made by `palisade token new NAME`: the token, and the line for the token file.
fn new_token(name: &str) -> (String, String) {
    palisade_testkit::new_token(BIN, name)
}

/// A lock service with a token file naming `identities` and the policy `policy`.
struct Secured {
    server: ServerProcess,
    dir: TempDir,
    tokens: std::collections::BTreeMap<String, String>,
}

impl Secured {
    fn start(identities: &[&str], policy: &str) -> Secured {
        let dir = tempfile::tempdir().unwrap();
        let mut tokens = std::collections::BTreeMap::new();
        let mut file = String::from("# NAME SHA256HEX\n");
        for name in identities {
            let (token, line) = new_token(name);
            file.push_str(&line);
            file.push('\n');
            tokens.insert(name.to_string(), token);
        }
        std::fs::write(dir.path().join("tokens"), file).unwrap();
        std::fs::write(dir.path().join("policy"), policy).unwrap();
        let mut server = ServerProcess::lock_service(BIN, dir.path().join("data"))
            .arg("--tokens")
            .arg(dir.path().join("tokens"))
            .arg("--policy")
            .arg(dir.path().join("policy"));
        server.start();
        Secured {
            server,
            dir,
            tokens,
        }
    }

    fn token(&self, name: &str) -> String {
        self.tokens[name].clone()
    }

    fn policy_path(&self) -> PathBuf {
        self.dir.path().join("policy")
    }

    /// The Rust client, authenticating as `name` (`None`: no token).
    async fn client(&self, name: Option<&str>) -> Client {
        self.client_with(name.map(|n| self.token(n))).await
    }

    async fn client_with(&self, token: Option<String>) -> Client {
        Client::connect_with(
            &self.server.endpoint(),
            ClientOptions {
                bearer_token: token.map(|t| BearerToken::new(&t).unwrap()),
                ..ClientOptions::default()
            },
        )
        .await
        .unwrap()
    }

    /// A raw gRPC client, as grpcurl or a Python user would hold one, sending `name`'s token.
    async fn raw(&self, name: Option<&str>) -> LocksClient<InterceptedService<Channel, Bearer>> {
        let channel = Channel::from_shared(self.server.endpoint())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let token = name.map(|n| BearerToken::new(&self.token(n)).unwrap());
        LocksClient::with_interceptor(channel, Bearer::new(token))
    }

    /// `palisade ARGS` against this server, authenticating as `name`.
    fn palisade(&self, name: Option<&str>, args: &[&str]) -> palisade_testkit::Ran {
        let mut command = palisade_testkit::command(BIN);
        command
            .args(args)
            .args(["--endpoint", &self.server.endpoint()]);
        if let Some(name) = name {
            command.env("PALISADE_AUTH_TOKEN", self.token(name));
        }
        palisade_testkit::run(command)
    }
}

/// Polls `done` every 50 ms until it holds, for at most 10 s (a bound against a hung test, not a
/// timing assertion).
async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 10 s");
}

/// The lock-table error a status carries (its `ErrorDetail`), which must be there.
fn detail(status: &Status) -> CoreError {
    palisade_proto::error::core_from_status(status)
        .unwrap_or_else(|| panic!("no ErrorDetail in {status:?}"))
}

fn assert_denied(error: &CoreError, identity: &str, right: Right, scope: &str) {
    assert_eq!(
        *error,
        CoreError::PermissionDenied {
            identity: identity.into(),
            right,
            scope: scope.into(),
        }
    );
    let message = error.to_string();
    assert!(
        message.contains(&format!("no {right} right on {scope:?}")),
        "the message does not name the right and the scope: {message}"
    );
}

fn refused_query<T: std::fmt::Debug>(result: Result<T, QueryError>) -> CoreError {
    match result {
        Err(QueryError::Refused(core)) => core,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn refused_acquire<T: std::fmt::Debug>(result: Result<T, AcquireError>) -> CoreError {
    match result {
        Err(AcquireError::Refused(core)) => core,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

const TEAM_POLICY: &str = "\
# jobs run under alice; bob only looks; ops administers
grant alice lock,read jobs/
grant bob read jobs/
grant ops admin,read *
";

#[tokio::test(flavor = "multi_thread")]
async fn an_unauthenticated_client_and_a_wrong_token_are_refused_when_a_policy_is_configured() {
    let secured = Secured::start(&["alice"], "grant alice lock,read *\n");

    // Phase 1: raw gRPC without a token, and with a made-up one: UNAUTHENTICATED, with the
    // reason in the detail, for reads and for opening a session alike.
    let mut anonymous = secured.raw(None).await;
    let status = anonymous
        .status(StatusRequest {
            lock: "jobs/a".into(),
            stale: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(
        detail(&status),
        CoreError::Unauthenticated {
            reason: CredentialError::Missing
        }
    );
    let status = anonymous
        .open_session(OpenSessionRequest {
            ttl_ms: 10_000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let forged = secured
        .client_with(Some(format!("pst_{}", "0".repeat(64))))
        .await;
    match forged.open_session(SessionOptions::with_ttl(TTL)).await {
        Err(error @ SessionError::Refused(_)) => {
            assert_eq!(error.class(), ErrorClass::Refused);
            assert!(
                matches!(
                    error,
                    SessionError::Refused(CoreError::Unauthenticated {
                        reason: CredentialError::Unknown
                    })
                ),
                "{error:?}"
            );
        }
        other => panic!("a made-up token opened a session: {other:?}"),
    }

    // Phase 2: the same through `palisade`: exit status 1 (refused) and a message that says
    // what to send.
    let ran = secured.palisade(None, &["status", "jobs/a"]);
    ran.expect_code(1);
    assert!(ran.stderr.contains("requires a credential"), "{ran:?}");
    let mut command = palisade_testkit::command(BIN);
    command
        .args(["acquire", "jobs/a", "--ttl", "10s"])
        .args(["--endpoint", &secured.server.endpoint()])
        .env("PALISADE_AUTH_TOKEN", "pst_wrong");
    let ran = palisade_testkit::run(command);
    ran.expect_code(1);
    assert!(ran.stderr.contains("not one this service knows"), "{ran:?}");

    // Phase 3: alice's token works, and nothing was granted to anyone before.
    let alice = secured.client(Some("alice")).await;
    let status = alice.status("jobs/a").await.unwrap();
    assert!(status.holder.is_none() && status.last_token.get() == 0);
    let session = alice
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    session
        .acquire("jobs/a", AcquireOptions::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_identity_cannot_lock_outside_its_prefixes() {
    let secured = Secured::start(&["alice", "ops"], TEAM_POLICY);
    let alice = secured.client(Some("alice")).await;
    let session = alice
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();

    // Inside `jobs/`: granted.
    let guard = session
        .acquire("jobs/nightly", AcquireOptions::default())
        .await
        .unwrap();
    assert!(guard.token().get() > 0);

    // Outside: refused, naming the right and the lock, and nothing is held.
    let refused = refused_acquire(session.acquire("other/x", AcquireOptions::default()).await);
    assert_denied(&refused, "alice", Right::Lock, "other/x");
    let refused = refused_acquire(session.acquire("jobs", AcquireOptions::default()).await);
    assert_denied(&refused, "alice", Right::Lock, "jobs");
    let ops = secured.client(Some("ops")).await;
    let other = ops.status("other/x").await.unwrap();
    assert!(
        other.holder.is_none() && other.last_token.get() == 0,
        "{other:?}"
    );

    // Through `palisade acquire`: exit status 1 and the same message.
    let ran = secured.palisade(Some("alice"), &["acquire", "other/y", "--ttl", "10s"]);
    ran.expect_code(1);
    assert!(
        ran.stderr.contains("no lock right on \"other/y\""),
        "{ran:?}"
    );
    guard.release().await.unwrap();
}

/// N15: a prefix that covers other locks than it seems to (no separator at its end, a `*`
/// inside it) loads as before, and the server's log names its line and what to write instead.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefix_without_a_separator_or_with_a_star_loads_with_a_warning() {
    let secured = Secured::start(
        &["bob"],
        "grant bob lock jobs\ngrant bob lock jobs/*\ngrant bob lock reports/\n",
    );
    let log = secured.server.log();
    let at = |line: u32| format!("{}:{line}: ", secured.policy_path().display());
    assert!(
        log.contains(&at(1)) && log.contains("does not end in a separator"),
        "{log}"
    );
    assert!(
        log.contains(&at(2)) && log.contains("not a wildcard"),
        "{log}"
    );
    assert!(!log.contains(&at(3)), "{log}");

    // The lines mean what they always meant: `jobs` covers `jobs-prod`.
    let bob = secured.client(Some("bob")).await;
    let session = bob
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let guard = session
        .acquire("jobs-prod", AcquireOptions::default())
        .await
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_read_right_allows_status_list_and_watch_but_not_lock() {
    let secured = Secured::start(&["alice", "bob"], TEAM_POLICY);
    let alice = secured.client(Some("alice")).await;
    let held = alice
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let guard = held
        .acquire("jobs/nightly", AcquireOptions::default())
        .await
        .unwrap();

    let bob = secured.client(Some("bob")).await;
    // Reads under `jobs/`: answered.
    let status = bob.status("jobs/nightly").await.unwrap();
    assert_eq!(status.holder.map(|h| h.token), Some(guard.token()));
    let listed = bob.list_locks("jobs/").await.unwrap();
    assert_eq!(listed.len(), 1);
    let mut events = bob.watch("jobs/nightly").await.unwrap();
    let first = events.next().await.unwrap().unwrap();
    assert_eq!(first.token, Some(guard.token()));

    // Reads outside it, and a listing of everything: refused, naming the scope.
    assert_denied(
        &refused_query(bob.status("other/x").await),
        "bob",
        Right::Read,
        "other/x",
    );
    assert_denied(
        &refused_query(bob.list_locks("").await),
        "bob",
        Right::Read,
        "*",
    );
    assert!(matches!(
        refused_query(bob.watch("other/x").await.map(|_| ())),
        CoreError::PermissionDenied { .. }
    ));

    // Locking: refused, although a session opens.
    let session = bob
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    assert_denied(
        &refused_acquire(
            session
                .acquire("jobs/other", AcquireOptions::default())
                .await,
        ),
        "bob",
        Right::Lock,
        "jobs/other",
    );
    let ran = secured.palisade(Some("bob"), &["locks", "--prefix", "jobs/"]);
    ran.expect_success();
    assert!(ran.stdout.contains("jobs/nightly"), "{ran:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_right_is_needed_for_membership_and_keys() {
    let secured = Secured::start(&["alice", "ops"], TEAM_POLICY);

    // alice, without admin: every cluster and key command refused, exit status 1.
    for args in [
        &["keys", "list"][..],
        &["keys", "add"][..],
        &["cluster", "status"][..],
        &["cluster", "remove", "9"][..],
        &["cluster", "raise-token-floor", "1000"][..],
    ] {
        let ran = secured.palisade(Some("alice"), args);
        ran.expect_code(1);
        assert!(
            ran.stderr.contains("no admin right on \"*\""),
            "{args:?}: {ran:?}"
        );
    }
    let ran = secured.palisade(None, &["keys", "list"]);
    ran.expect_code(1);
    assert!(ran.stderr.contains("requires a credential"), "{ran:?}");

    // ops: answered; alice's `keys add` published nothing.
    let listed = secured.palisade(Some("ops"), &["keys", "list", "--json"]);
    listed.expect_success();
    assert_eq!(
        listed.json().as_array().map(Vec::len),
        Some(1),
        "{listed:?}"
    );
    secured
        .palisade(Some("ops"), &["keys", "add"])
        .expect_success();
    secured
        .palisade(Some("ops"), &["cluster", "status"])
        .expect_success();
    let raised = secured.palisade(Some("ops"), &["cluster", "raise-token-floor", "1000"]);
    raised.expect_success();
    assert!(raised.stdout.contains("at 1000"), "{raised:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_opened_by_one_identity_cannot_be_used_by_another_even_with_its_secret() {
    let secured = Secured::start(&["alice", "mallory"], "grant * lock,read shared/\n");
    let mut alice = secured.raw(Some("alice")).await;
    let opened = alice
        .open_session(OpenSessionRequest {
            ttl_ms: 60_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (session, secret) = (opened.session, opened.session_secret);

    // mallory learned the id (anyone can read it) and the secret (say, from a leaked
    // environment), and holds the same rights: still refused for every call for the session.
    let mut mallory = secured.raw(Some("mallory")).await;
    let not_owned = |status: Status| {
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert_eq!(
            detail(&status),
            CoreError::SessionNotOwned {
                session: palisade_core::SessionId::new(session)
            }
        );
    };
    let acquire = |lock: &str, request_id| AcquireRequest {
        session,
        lock: lock.into(),
        request_id,
        wait_ms: 0,
        wait_forever: false,
        session_secret: secret.clone(),
        value: String::new(),
        permits: 0,
        shared: false,
    };
    not_owned(mallory.acquire(acquire("shared/a", 1)).await.unwrap_err());
    not_owned(
        mallory
            .renew(KeepAliveRequest {
                session,
                session_secret: secret.clone(),
            })
            .await
            .unwrap_err(),
    );
    not_owned(
        mallory
            .close_session(CloseSessionRequest {
                session,
                session_secret: secret.clone(),
            })
            .await
            .unwrap_err(),
    );

    // alice acts for it; mallory cannot release alice's lock either.
    let granted = alice
        .acquire(acquire("shared/a", 2))
        .await
        .unwrap()
        .into_inner();
    not_owned(
        mallory
            .release(ReleaseRequest {
                session,
                lock: "shared/a".into(),
                request_id: 3,
                session_secret: secret.clone(),
            })
            .await
            .unwrap_err(),
    );
    let status = alice
        .status(StatusRequest {
            lock: "shared/a".into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.holder.map(|h| (h.session, h.token)),
        Some((session, granted.token))
    );
    alice
        .close_session(CloseSessionRequest {
            session,
            session_secret: secret.clone(),
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn quotas_hold_one_identity_at_its_caps_while_another_still_works() {
    let secured = Secured::start(
        &["greedy", "honest"],
        "grant * lock,read q/\nquota greedy sessions=3 locks=3 waiters=1 watches=1\n",
    );
    let greedy = secured.client(Some("greedy")).await;
    let honest = secured.client(Some("honest")).await;
    let quota_of = |error: &CoreError| match error {
        CoreError::QuotaReached {
            identity, quota, ..
        } => {
            assert_eq!(identity, "greedy");
            *quota
        }
        other => panic!("not a quota refusal: {other:?}"),
    };

    // Sessions: three, then refused.
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(
            greedy
                .open_session(SessionOptions::with_ttl(TTL))
                .await
                .unwrap(),
        );
    }
    let third = sessions.pop().unwrap();
    let second = sessions.pop().unwrap();
    let first = sessions.pop().unwrap();
    match greedy.open_session(SessionOptions::with_ttl(TTL)).await {
        Err(SessionError::Refused(error)) => {
            assert_eq!(quota_of(&error), Quota::Sessions);
            assert!(error.to_string().contains("quota of 3 sessions"), "{error}");
        }
        other => panic!("a fourth session opened: {other:?}"),
    }

    // honest holds q/h; greedy holds q/a and waits for q/h (one waiter, two of three locks).
    let honest_session = honest
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let honest_guard = honest_session
        .acquire("q/h", AcquireOptions::default())
        .await
        .unwrap();
    let _a = first
        .acquire("q/a", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let granted = second
            .acquire(
                "q/h",
                AcquireOptions::wait(Wait::For(Duration::from_secs(30))),
            )
            .await;
        (second, granted.map(|guard| guard.lock().to_string()))
    });
    eventually("greedy waits for q/h", || async {
        honest
            .status("q/h")
            .await
            .is_ok_and(|s| s.waiters.len() == 1)
    })
    .await;
    // A second wait: over the waiters quota.
    let refused = refused_acquire(
        third
            .acquire(
                "q/h",
                AcquireOptions::wait(Wait::For(Duration::from_secs(1))),
            )
            .await,
    );
    assert_eq!(quota_of(&refused), Quota::Waiters);
    // A third lock fits; a fourth does not.
    let _b = third
        .acquire("q/b", AcquireOptions::wait(Wait::Try))
        .await
        .unwrap();
    let refused = refused_acquire(third.acquire("q/c", AcquireOptions::wait(Wait::Try)).await);
    assert_eq!(quota_of(&refused), Quota::Locks);
    // Watches: one, then refused.
    let _watch = greedy.watch("q/a").await.unwrap();
    assert_eq!(
        quota_of(&refused_query(greedy.watch("q/b").await.map(|_| ()))),
        Quota::Watches
    );

    // honest, meanwhile: new sessions, locks, waits and watches as it pleases.
    let more = honest
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let mut held = Vec::new();
    for lock in ["q/x", "q/y", "q/z", "q/w"] {
        held.push(more.acquire(lock, AcquireOptions::default()).await.unwrap());
    }
    let _honest_watches = (
        honest.watch("q/a").await.unwrap(),
        honest.watch("q/b").await.unwrap(),
    );

    // Handing q/h on: greedy's wait is granted, within its quota of locks.
    honest_guard.release().await.unwrap();
    let (_second, granted) = waiting.await.unwrap();
    assert_eq!(granted.unwrap(), "q/h");
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_policy_and_a_bad_file_keeps_the_old_one() {
    let mut secured = Secured::start(&["alice"], "grant alice lock jobs/\n");
    let alice = secured.client(Some("alice")).await;
    let session = alice
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    assert!(matches!(
        refused_acquire(session.acquire("new/x", AcquireOptions::default()).await),
        CoreError::PermissionDenied { .. }
    ));

    // Phase 1: a new right, granted by SIGHUP without a restart.
    let pid = secured.server.pid();
    std::fs::write(
        secured.policy_path(),
        "grant alice lock jobs/\ngrant alice lock new/\n",
    )
    .unwrap();
    secured.server.hangup();
    eventually("the reloaded policy grants new/", || async {
        session
            .acquire("new/x", AcquireOptions::default())
            .await
            .is_ok()
    })
    .await;
    assert_eq!(secured.server.pid(), pid, "the server was restarted");

    // Phase 2: a bad file is refused with its line, and the policy of before stays.
    std::fs::write(
        secured.policy_path(),
        "grant alice lock jobs/\ngrant alice write everything/\n",
    )
    .unwrap();
    secured.server.hangup();
    eventually("the reload failure is logged", || async {
        secured.server.log().contains("reload failed")
    })
    .await;
    let log = secured.server.log();
    assert!(
        log.contains("line 2") && log.contains("unknown right"),
        "{log}"
    );
    session
        .acquire("new/y", AcquireOptions::default())
        .await
        .expect("the policy of before stays in force");
    assert!(secured.server.is_running());
}

/// The review's plaintext attack on a node with tokens and a policy: `Locks` refuses a call
/// without a token, and Raft refused it too. A one-member cluster takes Raft messages from no
/// one (its only member is itself): not from a made-up node 99 at a high term, not from "node 1"
/// itself, not from a node 2 it never added. Before, the first was answered and the node's
/// vote moved to the sender's term.
#[tokio::test(flavor = "multi_thread")]
async fn raft_without_a_credential_is_refused_by_a_node_with_a_policy() {
    use openraft::type_config::alias::VoteOf;
    use palisade_proto::raft::v1::raft_client::RaftClient;
    use palisade_proto::raft::v1::{Envelope, PeerRequest};
    use palisade_server::raft_types::C;

    let secured = Secured::start(&["alice"], "grant alice lock,read *\n");
    let mut raft = RaftClient::connect(secured.server.endpoint())
        .await
        .unwrap();
    for from in [99, 1, 2] {
        let heartbeat = openraft::raft::AppendEntriesRequest::<C> {
            vote: VoteOf::<C>::new_committed(777, from),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        let refused = raft
            .append_entries(PeerRequest {
                envelope: Some(Envelope {
                    cluster: palisade_server::node::CLUSTER_NAME.to_string(),
                    to_node_id: 1,
                    from_node_id: from,
                    to_incarnation: 0,
                    from_incarnation: 0,
                }),
                body: serde_json::to_vec(&heartbeat).unwrap(),
            })
            .await
            .expect_err("an append-entries without a credential was answered");
        assert_eq!(
            refused.code(),
            Code::FailedPrecondition,
            "from {from}: {refused:?}"
        );
    }
    // The node still leads and serves its clients.
    let client = secured.client(Some("alice")).await;
    let session = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let _held = session
        .acquire("jobs/a", AcquireOptions::default())
        .await
        .unwrap();
    let ran = secured.palisade(Some("alice"), &["status", "jobs/a", "--json"]);
    ran.expect_success();
    assert!(!ran.json()["holder"].is_null(), "{}", ran.stdout);
}

/// A single node with a policy needs no peer CA, but it does not grow into a cluster without
/// one: `cluster add` by an admin is refused, naming the flag, and nothing is admitted.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_a_policy_and_no_peer_ca_refuses_to_grow() {
    let secured = Secured::start(&["ops"], TEAM_POLICY);
    let ran = secured.palisade(Some("ops"), &["cluster", "add", "2", "127.0.0.1:9"]);
    assert_eq!(ran.code(), Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("no authenticated peers") && ran.stderr.contains("--insecure-peers"),
        "{}",
        ran.stderr
    );
    let status = secured.palisade(Some("ops"), &["cluster", "status", "--json"]);
    status.expect_success();
    assert_eq!(
        status.json()["members"].as_array().map(Vec::len),
        Some(1),
        "{}",
        status.stdout
    );
}

fn serve_without_policy(dir: &Path, listen: &str, extra: &[&str]) -> std::process::Command {
    let mut command = palisade_testkit::command(BIN);
    command
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(dir)
        .args(extra)
        .env("RUST_LOG", "info");
    command
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_policy_a_non_loopback_listen_is_refused_unless_insecure_listen_any() {
    let dir = tempfile::tempdir().unwrap();

    // Refused at start, saying why and what to do, before anything is created.
    let ran = palisade_testkit::run(serve_without_policy(
        &dir.path().join("refused"),
        "0.0.0.0:0",
        &[],
    ));
    assert_ne!(ran.code(), Some(0), "{ran:?}");
    assert!(
        ran.stderr
            .contains("refusing to listen on 0.0.0.0:0 without a policy")
            && ran.stderr.contains("--insecure-listen-any"),
        "{ran:?}"
    );
    assert!(!dir.path().join("refused").join("raft.wal").exists());

    // With --insecure-listen-any: it serves, with a loud warning.
    let data = dir.path().join("insecure");
    let mut server = ServerProcess::custom(
        "palisade serve --insecure-listen-any",
        &data,
        palisade_testkit::process::Announce::LockService,
        {
            let data = data.clone();
            move |_ports| serve_without_policy(&data, "0.0.0.0:0", &["--insecure-listen-any"])
        },
    );
    server.start();
    assert!(
        server.log().contains("NO POLICY CONFIGURED"),
        "{}",
        server.log()
    );
    let port = server.addr().port();
    let client = Client::connect(&format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    client.status("a").await.unwrap();

    // On loopback, no flag is needed: the warning is still given.
    let mut local = ServerProcess::lock_service(BIN, dir.path().join("local"));
    local.start();
    assert!(
        local.log().contains("NO POLICY CONFIGURED"),
        "{}",
        local.log()
    );
}
