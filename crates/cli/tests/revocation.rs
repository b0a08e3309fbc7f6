//! What a reload takes away reaches the calls that stay open (N8), and one identity cannot take
//! every keepalive stream (N13): a `palisade serve` process with a token file and a policy,
//! changed and reloaded by SIGHUP while its clients hold keepalive streams, watches and web-UI
//! live views.
//!
//! What is asserted is what a client observes: the status a stream ends with and its
//! `ErrorDetail`, a lease that runs out and is granted to the next waiter, and the streams of
//! an identity the reload did not touch, still answered.

use std::time::Duration;

use palisade_client::{Bearer, BearerToken};
use palisade_core::{CoreError, CredentialError, Right};
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::*;
use palisade_testkit::{AuthFiles, ServerProcess};
use tempfile::TempDir;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
/// A bound against a hung test, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(20);
/// How often a keepalive stream of these tests renews its session.
const PING_INTERVAL: Duration = Duration::from_millis(200);

type Raw = LocksClient<InterceptedService<Channel, Bearer>>;

/// A lock service with a token file, a policy and the web UI.
struct Secured {
    server: ServerProcess,
    files: AuthFiles,
    _dir: TempDir,
}

impl Secured {
    fn start(identities: &[&str], policy: &str) -> Secured {
        let dir = tempfile::tempdir().unwrap();
        let files = AuthFiles::write(BIN, dir.path(), identities, policy);
        let mut server = ServerProcess::lock_service(BIN, dir.path().join("data"))
            .with_ui()
            .with_auth(&files);
        server.start();
        Secured {
            server,
            files,
            _dir: dir,
        }
    }

    /// A raw gRPC client sending `name`'s token, on a connection of its own.
    async fn raw(&self, name: &str) -> Raw {
        let channel = Channel::from_shared(self.server.endpoint())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let token = BearerToken::new(&self.files.token(name)).unwrap();
        LocksClient::with_interceptor(channel, Bearer::new(Some(token)))
    }

    /// Sends SIGHUP and returns once the server logged that it reloaded its files.
    async fn reload(&self) {
        const RELOADED: &str = "tokens and policy reloaded";
        let before = self.server.log().matches(RELOADED).count();
        self.server.hangup();
        let deadline = Instant::now() + PATIENCE;
        while self.server.log().matches(RELOADED).count() == before {
            assert!(Instant::now() < deadline, "no reload logged after SIGHUP");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The web UI's live view of `jobs/` as `name`, once its first snapshot arrived.
    async fn live_view(&self, name: &str) -> reqwest::Response {
        let mut view = reqwest::Client::new()
            .get(format!(
                "http://{}/api/stream?prefix=jobs/",
                self.server.ui_addr()
            ))
            .bearer_auth(self.files.token(name))
            .send()
            .await
            .unwrap();
        assert_eq!(view.status(), reqwest::StatusCode::OK);
        read_until(&mut view, "event: snapshot").await;
        view
    }
}

/// Reads a live view until its text holds `until`, and returns the text read.
async fn read_until(view: &mut reqwest::Response, until: &str) -> String {
    let mut text = String::new();
    let deadline = Instant::now() + PATIENCE;
    while !text.contains(until) {
        match tokio::time::timeout_at(deadline, view.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            other => panic!("no {until:?} in the live view ({other:?}); read: {text}"),
        }
    }
    text
}

#[derive(Debug, Clone)]
struct Session {
    id: u64,
    secret: Vec<u8>,
}

impl Session {
    fn ping(&self) -> KeepAliveRequest {
        KeepAliveRequest {
            session: self.id,
            session_secret: self.secret.clone(),
        }
    }

    fn acquire(&self, lock: &str, wait_forever: bool) -> AcquireRequest {
        AcquireRequest {
            session: self.id,
            lock: lock.into(),
            request_id: 1,
            wait_ms: 0,
            wait_forever,
            session_secret: self.secret.clone(),
            value: String::new(),
            permits: 0,
            shared: false,
        }
    }
}

async fn open(client: &mut Raw, ttl_ms: u64) -> Session {
    let opened = client
        .open_session(OpenSessionRequest {
            ttl_ms,
            ..OpenSessionRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    Session {
        id: opened.session,
        secret: opened.session_secret,
    }
}

/// A keepalive stream that renews `session` every [`PING_INTERVAL`], as a client holding on to
/// its lease does, for as long as the server reads it.
async fn keep_renewing(
    client: &mut Raw,
    session: &Session,
) -> Result<Streaming<KeepAliveResponse>, Status> {
    let (pings, receiver) = mpsc::channel(4);
    let ping = session.ping();
    tokio::spawn(async move {
        while pings.send(ping.clone()).await.is_ok() {
            tokio::time::sleep(PING_INTERVAL).await;
        }
    });
    Ok(client
        .keep_alive(ReceiverStream::new(receiver))
        .await?
        .into_inner())
}

/// A keepalive stream that sends nothing: the sender keeps it open.
type Idle = (mpsc::Sender<KeepAliveRequest>, Streaming<KeepAliveResponse>);

async fn idle_keepalive(client: &mut Raw) -> Result<Idle, Status> {
    let (pings, receiver) = mpsc::channel(1);
    let stream = client
        .keep_alive(ReceiverStream::new(receiver))
        .await?
        .into_inner();
    Ok((pings, stream))
}

async fn status(client: &mut Raw, lock: &str) -> LockInfo {
    client
        .status(StatusRequest {
            lock: lock.into(),
            stale: false,
        })
        .await
        .unwrap()
        .into_inner()
}

async fn watch(client: &mut Raw, lock: &str) -> Streaming<WatchEvent> {
    let mut events = client
        .watch(WatchRequest { lock: lock.into() })
        .await
        .unwrap()
        .into_inner();
    let first = events.message().await.unwrap().unwrap();
    assert_eq!(first.kind(), watch_event::Kind::Snapshot);
    events
}

/// Reads `stream`'s answers until it fails, and returns the status it failed with.
async fn failure<T: std::fmt::Debug>(what: &str, stream: &mut Streaming<T>) -> Status {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => panic!("{what} is still answered {PATIENCE:?} after the reload"),
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("{what} ended without an error"),
            Ok(Err(status)) => return status,
        }
    }
}

/// Reads a watch until an event of `kind` for `session` arrives.
async fn until_event(events: &mut Streaming<WatchEvent>, kind: watch_event::Kind, session: u64) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let event = tokio::time::timeout_at(deadline, events.message())
            .await
            .unwrap_or_else(|_| panic!("no {kind:?} event for session {session}"))
            .unwrap()
            .expect("the watch ended");
        if event.kind() == kind && event.session == session {
            return;
        }
    }
}

/// The lock-table error a status carries (its `ErrorDetail`), which must be there.
fn detail(status: &Status) -> CoreError {
    palisade_proto::error::core_from_status(status)
        .unwrap_or_else(|| panic!("no ErrorDetail in {status:?}"))
}

/// N8: alice holds `jobs/a` on a 3 s lease renewed over a keepalive stream, watches it over
/// gRPC and in the web UI, and bob waits for it. Her token line is removed and the server gets
/// SIGHUP: her three streams end, refused as an unknown token, her lease runs out, and bob is
/// granted the lock, while his own keepalive stream and watch are answered throughout. Before,
/// her stream renewed her lease for as long as it stayed open, and bob waited for ever.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_ends_its_streams_and_its_lease_runs_out_while_others_work_on() {
    let secured = Secured::start(&["alice", "bob"], "grant * lock,read jobs/\n");
    let mut alice = secured.raw("alice").await;
    let mut bob = secured.raw("bob").await;

    let holding = open(&mut alice, 3_000).await;
    let first = alice
        .acquire(holding.acquire("jobs/a", false))
        .await
        .unwrap()
        .into_inner();
    let mut alice_renewals = keep_renewing(&mut alice, &holding).await.unwrap();
    assert!(alice_renewals.message().await.unwrap().is_some());
    let mut alice_watch = watch(&mut alice, "jobs/a").await;
    let mut alice_view = secured.live_view("alice").await;

    let waiting = open(&mut bob, 60_000).await;
    let mut bob_renewals = keep_renewing(&mut bob, &waiting).await.unwrap();
    let mut bob_watch = watch(&mut bob, "jobs/a").await;
    let queued = tokio::spawn({
        let mut bob = bob.clone();
        let request = waiting.acquire("jobs/a", true);
        async move { bob.acquire(request).await }
    });
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = status(&mut bob, "jobs/a").await;
        if status.waiters == [waiting.id] {
            break;
        }
        assert!(Instant::now() < deadline, "bob never waited: {status:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    secured.files.remove_token("alice");
    secured.reload().await;

    let unknown = CoreError::Unauthenticated {
        reason: CredentialError::Unknown,
    };
    let renewals_ended = failure("alice's keepalive stream", &mut alice_renewals).await;
    let watch_ended = failure("alice's watch", &mut alice_watch).await;
    for ended in [renewals_ended, watch_ended] {
        assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
        assert_eq!(detail(&ended), unknown, "{ended:?}");
    }
    let refused = read_until(&mut alice_view, "event: refused").await;
    assert!(
        refused.contains("\"kind\":\"unauthenticated\""),
        "{refused}"
    );

    // Her lease runs out: the lock goes to bob, with a greater token.
    let granted = tokio::time::timeout(PATIENCE, queued)
        .await
        .expect("bob's wait was never granted: alice's lease is still renewed")
        .unwrap()
        .unwrap()
        .into_inner();
    assert!(granted.token > first.token, "{granted:?} after {first:?}");
    let holder = status(&mut bob, "jobs/a").await.holder.unwrap();
    assert_eq!(holder.session, waiting.id);

    // Bob's streams went on: his watch saw alice's lease expire and his grant, and his renewals
    // are still answered.
    until_event(&mut bob_watch, watch_event::Kind::Expired, holding.id).await;
    until_event(&mut bob_watch, watch_event::Kind::Granted, waiting.id).await;
    let renewed = bob_renewals.message().await.unwrap().unwrap();
    assert_eq!(renewed.session, waiting.id);
    assert!(renewed.ttl_remaining_ms > 0);
}

/// N8, a right taken away: alice loses the lock right on `jobs/` while she holds `jobs/a` and
/// keeps the read right. Her keepalive stream ends, refused for the lock right on `jobs/a`, as
/// does a renewal by a single call, and her lease runs out; her watch goes on (she still may
/// read) and sees the expiry. Then the read right goes too, and the watch ends, refused.
/// Before, the stream renewed her lease and the watch ran on after both rights were gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_right_a_reload_takes_away_ends_the_streams_that_need_it() {
    let secured = Secured::start(&["alice"], "grant alice lock,read jobs/\n");
    let mut alice = secured.raw("alice").await;
    let holding = open(&mut alice, 3_000).await;
    alice
        .acquire(holding.acquire("jobs/a", false))
        .await
        .unwrap();
    let mut renewals = keep_renewing(&mut alice, &holding).await.unwrap();
    assert!(renewals.message().await.unwrap().is_some());
    let mut events = watch(&mut alice, "jobs/a").await;

    secured.files.set_policy("grant alice read jobs/\n");
    secured.reload().await;
    let no_lock = CoreError::PermissionDenied {
        identity: "alice".into(),
        right: Right::Lock,
        scope: "jobs/a".into(),
    };
    let status = failure("alice's keepalive stream", &mut renewals).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(detail(&status), no_lock);
    let status = alice.renew(holding.ping()).await.unwrap_err();
    assert_eq!(detail(&status), no_lock);
    until_event(&mut events, watch_event::Kind::Expired, holding.id).await;

    secured.files.set_policy("# nothing for alice\n");
    secured.reload().await;
    let status = failure("alice's watch", &mut events).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        detail(&status),
        CoreError::PermissionDenied {
            identity: "alice".into(),
            right: Right::Read,
            scope: "jobs/a".into(),
        }
    );
}

/// N13: an identity may have as many keepalive streams open on a node as its quota of sessions
/// (one per session is all a client needs). Past it, the next stream is refused with
/// `RESOURCE_EXHAUSTED`, naming the identity and the limit; another identity opens and renews
/// as before; a stream closed gives its place back. Before, one identity could take every
/// keepalive permit of the server.
#[tokio::test(flavor = "multi_thread")]
async fn one_identity_cannot_take_every_keepalive_stream() {
    let secured = Secured::start(
        &["greedy", "honest"],
        "grant * lock q/\nquota greedy sessions=2\n",
    );
    let mut greedy = secured.raw("greedy").await;
    let mut open_streams = vec![
        idle_keepalive(&mut greedy).await.unwrap(),
        idle_keepalive(&mut greedy).await.unwrap(),
    ];
    let refused = idle_keepalive(&mut greedy).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("2 keepalive streams are open")
            && refused.message().contains("\"greedy\""),
        "{refused:?}"
    );

    let mut honest = secured.raw("honest").await;
    let session = open(&mut honest, 60_000).await;
    let mut renewals = keep_renewing(&mut honest, &session).await.unwrap();
    assert_eq!(
        renewals.message().await.unwrap().unwrap().session,
        session.id
    );

    open_streams.pop();
    let deadline = Instant::now() + PATIENCE;
    loop {
        match idle_keepalive(&mut greedy).await {
            Ok(stream) => {
                open_streams.push(stream);
                break;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    Instant::now() < deadline,
                    "the closed stream kept its place"
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    }
    assert_eq!(open_streams.len(), 2);
}
