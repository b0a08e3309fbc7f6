//! openraft nodes talking over the peer transport (`palisade.raft.v1` on tonic) on loopback,
//! in-process: each node is a `LogStore` and a `StateMachine` on a temporary directory, a
//! `PeerNetwork`, and the `RaftPeerServer` on its own port. No `Node`: the lock table's commands
//! are proposed to Raft directly, stamped with a time the test chooses.
//!
//! Every wait is bounded by [`WAIT`]; nothing asserts how long anything took.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::errors::{ClientWriteError, RPCError, RaftError};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::VoteRequest;
use openraft::type_config::alias::{SnapshotMetaOf, VoteOf};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::{Config, ServerState, SnapshotPolicy, StoredMembership};
use palisade_core::{
    Command, DurationMs, Input, LockTable, OpenKey, Output, Reply, RequestId, SessionId, TimeMs,
    Token, Wait,
};
use palisade_proto::raft::v1::raft_client::RaftClient;
use palisade_proto::raft::v1::raft_server::{Raft, RaftServer};
use palisade_proto::raft::v1::{
    AdmitReply, AdmitRequest, Envelope, PeerReply, PeerRequest, SnapshotHeader, SnapshotPart,
    snapshot_part,
};
use palisade_server::limits::SHUTDOWN_GRACE;
use palisade_server::limits::{PEER_MESSAGE_BYTES_MAX, SNAPSHOT_BYTES_MAX};
use palisade_server::log_store::LogStore;
use palisade_server::peer::{ClusterName, PeerNetwork};
use palisade_server::peer_service::{AppendReplies, RaftPeerServer};
use palisade_server::raft_types::{C, Member, Proposal};
use palisade_server::state_machine::PalisadeRaft;
use palisade_server::state_machine::{Shared, StateMachine};
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;

const CLUSTER: &str = "peer-transport-test";
/// The bound on every wait: elections, replication, catching up.
const WAIT: Duration = Duration::from_secs(60);
/// Snapshot pieces are this small here, so a snapshot of a few dozen sessions takes several.
const SNAPSHOT_CHUNK_BYTES: u64 = 1024;

fn config() -> Arc<Config> {
    let config = Config {
        cluster_name: CLUSTER.to_string(),
        // Generous for a loaded two-core machine running debug builds.
        heartbeat_interval: 200,
        election_timeout_min: 1_000,
        election_timeout_max: 2_000,
        install_snapshot_timeout: 20_000,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        // Snapshots only when a test asks, so a learner's snapshot can only come from the leader.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Default::default()
    };
    Arc::new(config.validate().expect("valid raft config"))
}

fn cluster() -> ClusterName {
    ClusterName::new(CLUSTER).unwrap()
}

/// One running node: Raft on its own directory, serving the peer service on its own port.
struct TestNode {
    id: u64,
    addr: SocketAddr,
    raft: PalisadeRaft,
    log: LogStore,
    shared: Arc<Shared>,
    stop_serving: Option<oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
    /// What the node's peer service was asked.
    calls: Arc<PeerCalls>,
}

/// Which version of the peer service a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// This one.
    Current,
    /// One from before `StreamAppend`: it answers `UNIMPLEMENTED` to it.
    WithoutAppendStream,
}

/// The append-entries a node's peer service was asked to take, by way.
#[derive(Debug, Default)]
struct PeerCalls {
    unary_appends: AtomicU64,
    append_streams: AtomicU64,
}

/// The node's real [`RaftPeerServer`], counting the appends it is sent; as a
/// [`Version::WithoutAppendStream`] node it serves everything but `StreamAppend`.
#[derive(Clone)]
struct CountingPeer {
    inner: RaftPeerServer,
    version: Version,
    calls: Arc<PeerCalls>,
}

#[tonic::async_trait]
impl Raft for CountingPeer {
    async fn append_entries(
        &self,
        request: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.calls.unary_appends.fetch_add(1, Ordering::SeqCst);
        self.inner.append_entries(request).await
    }

    type StreamAppendStream = AppendReplies;

    async fn stream_append(
        &self,
        request: tonic::Request<tonic::Streaming<PeerRequest>>,
    ) -> Result<tonic::Response<AppendReplies>, tonic::Status> {
        if self.version == Version::WithoutAppendStream {
            return Err(tonic::Status::unimplemented(
                "no StreamAppend in this version",
            ));
        }
        self.calls.append_streams.fetch_add(1, Ordering::SeqCst);
        self.inner.stream_append(request).await
    }

    async fn vote(
        &self,
        request: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.inner.vote(request).await
    }

    async fn pre_vote(
        &self,
        request: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.inner.pre_vote(request).await
    }

    async fn transfer_leader(
        &self,
        request: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.inner.transfer_leader(request).await
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<tonic::Streaming<SnapshotPart>>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.inner.install_snapshot(request).await
    }

    async fn admit(
        &self,
        request: tonic::Request<AdmitRequest>,
    ) -> Result<tonic::Response<AdmitReply>, tonic::Status> {
        self.inner.admit(request).await
    }
}

/// A stopped node's directory and address, to start it again.
struct Stopped {
    id: u64,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl TestNode {
    async fn start(id: u64) -> TestNode {
        TestNode::start_version(id, Version::Current).await
    }

    async fn start_version(id: u64, version: Version) -> TestNode {
        let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
        TestNode::start_in(id, tempfile::tempdir().unwrap(), any_port, version).await
    }

    /// Starts `stopped` again from its directory, on its address.
    async fn restart(stopped: Stopped) -> TestNode {
        TestNode::start_in(stopped.id, stopped.dir, stopped.addr, Version::Current).await
    }

    async fn start_in(
        id: u64,
        dir: tempfile::TempDir,
        listen: SocketAddr,
        version: Version,
    ) -> TestNode {
        let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = LogStore::open(&dir.path().join("raft.wal")).unwrap();
        let state_machine = StateMachine::open(dir.path(), log.durable_index()).unwrap();
        let shared = state_machine.shared();
        let raft = PalisadeRaft::new(
            id,
            config(),
            PeerNetwork::new(cluster(), id, 0),
            log.clone(),
            state_machine,
        )
        .await
        .unwrap();
        let calls = Arc::new(PeerCalls::default());
        let service = RaftServer::new(CountingPeer {
            inner: RaftPeerServer::new(raft.clone(), id, cluster()),
            version,
            calls: calls.clone(),
        })
        .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
        let (stop_serving, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("the peer service serves");
        });
        TestNode {
            id,
            addr,
            raft,
            log,
            shared,
            stop_serving: Some(stop_serving),
            serving,
            dir,
            calls,
        }
    }

    fn member(&self) -> Member {
        member(self.addr)
    }

    fn table(&self) -> LockTable {
        self.shared.read(|table| table.clone())
    }

    async fn applied_at_least(&self, index: u64) {
        self.raft
            .wait(Some(WAIT))
            .applied_index_at_least(Some(index), format!("node {} applies {index}", self.id))
            .await
            .unwrap();
    }

    /// Stops Raft and the peer service, and closes the log: to its peers the node is gone.
    async fn stop(mut self) -> Stopped {
        self.raft.shutdown().await.unwrap();
        let _ = self.stop_serving.take().unwrap().send(());
        // As `palisade serve` does: connections get SHUTDOWN_GRACE to close, then the service
        // stops anyway. Once in 30 runs a peer's connection outlived a 60 s wait here.
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.serving).await {
            Ok(served) => served.unwrap(),
            Err(_) => {
                eprintln!(
                    "node {}: connections still open after {SHUTDOWN_GRACE:?}; stopping anyway",
                    self.id
                );
                self.serving.abort();
            }
        }
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || log.close())
            .await
            .unwrap();
        Stopped {
            id: self.id,
            addr: self.addr,
            dir: self.dir,
        }
    }
}

async fn start_three() -> Vec<TestNode> {
    start_three_with(Version::Current).await
}

/// Nodes 1 and 2 of this version, node 3 of `third`.
async fn start_three_with(third: Version) -> Vec<TestNode> {
    let nodes = vec![
        TestNode::start(1).await,
        TestNode::start(2).await,
        TestNode::start_version(3, third).await,
    ];
    let members: BTreeMap<u64, Member> = nodes.iter().map(|n| (n.id, n.member())).collect();
    nodes[0].raft.initialize(members).await.unwrap();
    nodes
}

/// The node that leads now, once there is one among `nodes`.
async fn leader(nodes: &[TestNode]) -> &TestNode {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        for node in nodes {
            if node.raft.metrics().borrow_watched().state == ServerState::Leader {
                return node;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader among nodes {:?} within {WAIT:?}",
            nodes.iter().map(|n| n.id).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Commits `command` at `now_ms` through whichever node leads and returns its log index and
/// output. It retries when the entry was refused before it was appended (`ForwardToLeader`)
/// and when its outcome is unknown (`LogEntryDiscarded`, no answer): every command here is
/// deduplicated by the lock table (open keys, request ids), so a retry never applies twice.
async fn propose(nodes: &[TestNode], now_ms: u64, command: Command) -> (u64, Output) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{command:?} was not committed within {WAIT:?}"
        );
        let input = Input {
            now_ms: TimeMs::from_millis(now_ms),
            command: command.clone(),
        };
        let leader = leader(nodes).await;
        match tokio::time::timeout(
            Duration::from_secs(10),
            leader.raft.client_write(Proposal::Lock(input)),
        )
        .await
        {
            Ok(Ok(response)) => return (response.log_id.index, response.data),
            Ok(Err(RaftError::APIError(
                ClientWriteError::ForwardToLeader(_) | ClientWriteError::LogEntryDiscarded(_),
            )))
            | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Ok(Err(e)) => panic!("{command:?} failed: {e}"),
        }
    }
}

fn open_key(seed: u8) -> OpenKey {
    let bytes: Vec<u8> = (0..16).map(|i| seed.wrapping_add(i)).collect();
    OpenKey::new(&bytes).unwrap()
}

async fn open_session(nodes: &[TestNode], now_ms: u64, seed: u8) -> (u64, SessionId) {
    let command = Command::OpenSession {
        open_key: Some(open_key(seed)),
        ttl_ms: DurationMs::from_millis(3_600_000),
        secret_digest: None,
        owner: None,
    };
    match propose(nodes, now_ms, command).await {
        (
            index,
            Output {
                result: Ok(Reply::SessionOpened { session, .. }),
                ..
            },
        ) => (index, session),
        (_, other) => panic!("open session: {other:?}"),
    }
}

async fn acquire(
    nodes: &[TestNode],
    now_ms: u64,
    session: SessionId,
    lock: &str,
    request_id: u64,
) -> (u64, Token) {
    let command = Command::Acquire {
        session,
        lock: lock.to_string(),
        request_id: RequestId::new(request_id),
        wait: Wait::Try,
        value: None,
        mode: palisade_core::Mode::Exclusive,
    };
    match propose(nodes, now_ms, command).await {
        (
            index,
            Output {
                result: Ok(Reply::Granted { token, .. }),
                ..
            },
        ) => (index, token),
        (_, other) => panic!("acquire: {other:?}"),
    }
}

/// Every node in `nodes` applied `index` and holds the same lock table.
async fn assert_same_table_everywhere(nodes: &[TestNode], index: u64) {
    for node in nodes {
        node.applied_at_least(index).await;
    }
    let first = nodes[0].table();
    for node in &nodes[1..] {
        assert!(
            node.table() == first,
            "node {} and node {} applied up to {index} but hold different tables",
            nodes[0].id,
            node.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_every_node_and_continue_after_the_leader_is_killed_and_restarted() {
    let mut nodes = start_three().await;

    // Phase 1: a session takes a lock through the leader; every node applies it.
    let (_, holder) = open_session(&nodes, 1_000, 1).await;
    let (_, waiter) = open_session(&nodes, 1_001, 50).await;
    let (index, first_token) = acquire(&nodes, 1_002, holder, "l", 1).await;
    assert_same_table_everywhere(&nodes, index).await;

    // Phase 2: the leader is killed; the other two elect a leader among themselves.
    let old_leader = leader(&nodes).await.id;
    let position = nodes.iter().position(|n| n.id == old_leader).unwrap();
    let killed = nodes.remove(position).stop().await;
    let new_leader = leader(&nodes).await.id;
    assert_ne!(new_leader, old_leader);

    // Phase 3: writes continue, and tokens keep growing across the failover.
    let release = Command::Release {
        session: holder,
        lock: "l".to_string(),
        request_id: RequestId::new(2),
    };
    let (_, released) = propose(&nodes, 1_003, release).await;
    assert!(
        matches!(released.result, Ok(Reply::Released { .. })),
        "{released:?}"
    );
    let (index, second_token) = acquire(&nodes, 1_004, waiter, "l", 1).await;
    assert!(
        second_token > first_token,
        "token {second_token} after the failover does not beat {first_token} before it"
    );
    assert_same_table_everywhere(&nodes, index).await;

    // Phase 4: the old leader starts again from its directory, on its address. The others'
    // cached channels to it reconnect, and it catches up with what it missed.
    nodes.push(TestNode::restart(killed).await);
    let (index, _) = open_session(&nodes, 1_005, 100).await;
    assert_same_table_everywhere(&nodes, index).await;

    for node in nodes {
        node.stop().await;
    }
}

/// The leader streams its log to each follower (`StreamAppend`): no append goes as a unary
/// call between nodes of this version. A follower of an older version, which serves no stream,
/// still takes every entry, by unary calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_stream_to_followers_and_fall_back_to_calls_for_an_older_one() {
    for third in [Version::Current, Version::WithoutAppendStream] {
        let nodes = start_three_with(third).await;
        let (_, session) = open_session(&nodes, 1_000, 1).await;
        let mut index = 0;
        for (request, lock) in ["a", "b", "c", "d"].into_iter().enumerate() {
            (index, _) = acquire(&nodes, 1_001, session, lock, request as u64 + 1).await;
        }
        assert_same_table_everywhere(&nodes, index).await;
        let leader = leader(&nodes).await.id;
        for node in nodes.iter().filter(|node| node.id != leader) {
            let unary = node.calls.unary_appends.load(Ordering::SeqCst);
            let streams = node.calls.append_streams.load(Ordering::SeqCst);
            if third == Version::WithoutAppendStream && node.id == 3 {
                assert_eq!(streams, 0, "node 3 serves no stream");
                assert!(unary > 0, "node 3 took its entries without a single call");
            } else {
                assert_eq!(
                    unary, 0,
                    "node {} ({third:?} cluster) got unary appends",
                    node.id
                );
                assert!(streams > 0, "node {} got no append stream", node.id);
            }
        }
        for node in nodes {
            node.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_added_after_the_log_was_purged_catches_up_from_a_streamed_snapshot() {
    let mut nodes = start_three().await;

    // Phase 1: enough sessions that the snapshot takes several pieces (the binary snapshot
    // stores about 50 bytes per session).
    let mut last = 0;
    for seed in 0..100 {
        (last, _) = open_session(&nodes, 1_000 + u64::from(seed), seed).await;
    }
    assert_same_table_everywhere(&nodes, last).await;

    // Phase 2: the leader snapshots and purges its log up to the snapshot: entry 1 is gone.
    let leader_id = leader(&nodes).await.id;
    let leader_node = nodes.iter().find(|n| n.id == leader_id).unwrap();
    leader_node.raft.trigger().snapshot().await.unwrap();
    let snapshot = leader_node
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= last),
            "the leader snapshots",
        )
        .await
        .unwrap()
        .snapshot
        .unwrap();
    leader_node
        .raft
        .trigger()
        .purge_log(snapshot.index)
        .await
        .unwrap();
    leader_node
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index >= snapshot.index),
            "the leader purges its log",
        )
        .await
        .unwrap();
    let snapshot_bytes = leader_node
        .raft
        .get_snapshot()
        .await
        .unwrap()
        .expect("the leader has a snapshot")
        .snapshot
        .into_inner()
        .len();
    assert!(
        snapshot_bytes as u64 > 3 * SNAPSHOT_CHUNK_BYTES,
        "a snapshot of {snapshot_bytes} bytes would not need several pieces"
    );

    // Phase 3: node 4 joins as a learner. The entries it lacks are purged, so only the
    // snapshot, streamed in pieces, can bring it up to date.
    let learner = TestNode::start(4).await;
    let added = tokio::time::timeout(
        WAIT,
        leader_node
            .raft
            .add_learner(learner.id, learner.member(), true),
    )
    .await
    .expect("the learner catches up in time")
    .unwrap();
    learner.applied_at_least(added.log_id.index).await;
    let installed = learner.raft.metrics().borrow_watched().snapshot;
    assert!(
        installed.is_some_and(|s| s.index >= snapshot.index),
        "the learner's state came from the leader's snapshot (up to {}), it has {installed:?}",
        snapshot.index
    );
    // Watchers and the lease driver hear of the new table, which no event announced.
    assert_eq!(
        learner.shared.installs(),
        1,
        "the install was not signalled to watchers"
    );
    nodes.push(learner);
    assert_same_table_everywhere(&nodes, added.log_id.index).await;

    // Phase 4: after the snapshot, the learner follows the log like any member.
    let (index, _) = open_session(&nodes, 2_000, 200).await;
    assert_same_table_everywhere(&nodes, index).await;

    for node in nodes {
        node.stop().await;
    }
}

fn vote_body(from: u64) -> Vec<u8> {
    let request = VoteRequest::<C>::new(VoteOf::<C>::new(1, from), None);
    serde_json::to_vec(&request).unwrap()
}

fn envelope(cluster: &str, to_node_id: u64) -> Option<Envelope> {
    Some(Envelope {
        cluster: cluster.to_string(),
        to_node_id,
        from_node_id: 1,
        to_incarnation: 0,
        from_incarnation: 0,
    })
}

/// Once a node knows its membership, it takes neither entries nor votes from a node outside
/// it: a sender it does not know may be anyone who reaches its listener, and entries are the
/// whole replicated state. (A member that merely lags behind the entry that added today's
/// leader waits for a leader it knows; docs/cluster.md.) Nor from a sender claiming to be the
/// node itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_takes_no_entries_and_gives_no_vote_to_a_node_outside_its_membership() {
    let node = TestNode::start(2).await;
    let members: BTreeMap<u64, Member> = [1, 2, 3]
        .into_iter()
        .map(|id| (id, member(format!("127.0.0.1:{id}"))))
        .collect();
    node.raft.initialize(members).await.unwrap();
    node.raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.membership_config.membership().voter_ids().count() == 3,
            "node 2 knows its membership",
        )
        .await
        .unwrap();
    let mut client = RaftClient::connect(format!("http://{}", node.addr))
        .await
        .unwrap();
    let from_4 = Some(Envelope {
        cluster: CLUSTER.to_string(),
        to_node_id: 2,
        from_node_id: 4,
        to_incarnation: 0,
        from_incarnation: 0,
    });

    let heartbeat = openraft::raft::AppendEntriesRequest::<C> {
        vote: VoteOf::<C>::new_committed(5, 4),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let refused = client
        .append_entries(PeerRequest {
            envelope: from_4.clone(),
            body: serde_json::to_vec(&heartbeat).unwrap(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("node 4 is not a member"),
        "{}",
        refused.message()
    );
    // On the append stream, the same request is refused the same way: the stream ends with
    // the refusal, and nothing reached Raft.
    let vote_before = node.raft.metrics().borrow_watched().vote;
    let mut replies = client
        .stream_append(futures::stream::iter([PeerRequest {
            envelope: from_4.clone(),
            body: serde_json::to_vec(&heartbeat).unwrap(),
        }]))
        .await
        .unwrap()
        .into_inner();
    let refused = replies.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("node 4 is not a member"),
        "{}",
        refused.message()
    );
    assert_eq!(
        node.raft.metrics().borrow_watched().vote,
        vote_before,
        "the refused stream moved this node's vote"
    );
    let from_itself = Some(Envelope {
        from_node_id: 2,
        ..from_4.clone().unwrap()
    });
    let refused = client
        .append_entries(PeerRequest {
            envelope: from_itself,
            body: serde_json::to_vec(&heartbeat).unwrap(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);

    let refused = client
        .vote(PeerRequest {
            envelope: from_4,
            body: vote_body(4),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_another_node_or_another_cluster_is_refused() {
    let node = TestNode::start(2).await;
    let mut client = RaftClient::connect(format!("http://{}", node.addr))
        .await
        .unwrap();

    // A vote addressed to node 2 reaches its Raft and is answered.
    let addressed = PeerRequest {
        envelope: envelope(CLUSTER, 2),
        body: vote_body(1),
    };
    client
        .vote(addressed)
        .await
        .expect("node 2 answers a vote for node 2");

    // The same vote meant for node 3 (whose address, in the sender's membership, is wrong).
    let misaddressed = PeerRequest {
        envelope: envelope(CLUSTER, 3),
        body: vote_body(1),
    };
    let refused = client.vote(misaddressed).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("this is node 2, not node 3"),
        "{}",
        refused.message()
    );

    // The same vote from a node of another cluster.
    let foreign = PeerRequest {
        envelope: envelope("another-cluster", 2),
        body: vote_body(1),
    };
    let refused = client.vote(foreign).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains("not of cluster \"another-cluster\""),
        "{}",
        refused.message()
    );

    // Through the transport, the refusal reaches openraft as an unreachable peer (it backs
    // off), never as an answer from the wrong node.
    let mut network = PeerNetwork::new(cluster(), 1, 0);
    let mut to_node_3 = network.new_client(3, &member(node.addr)).await;
    let request = VoteRequest::<C>::new(VoteOf::<C>::new(1, 1), None);
    let option = RPCOption::new(Duration::from_secs(10));
    match to_node_3.vote(request.clone(), option.clone()).await {
        Err(RPCError::Unreachable(e)) => {
            assert!(e.to_string().contains("not node 3"), "{e}");
        }
        other => panic!("a misaddressed vote: {other:?}"),
    }
    match to_node_3.pre_vote(request, option).await {
        Err(RPCError::Unreachable(_)) => {}
        other => panic!("a misaddressed pre-vote must fail, not be granted: {other:?}"),
    }

    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_nobody_listens_at_is_unreachable_and_grants_no_pre_vote() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut network = PeerNetwork::new(cluster(), 1, 0);
    let mut client = network.new_client(2, &member(addr)).await;
    let request = VoteRequest::<C>::new(VoteOf::<C>::new(1, 1), None);
    let option = RPCOption::new(Duration::from_secs(10));
    match client.pre_vote(request.clone(), option.clone()).await {
        Err(RPCError::Unreachable(_)) => {}
        other => panic!("a pre-vote to nobody: {other:?}"),
    }
    match client.vote(request, option).await {
        Err(RPCError::Unreachable(_)) => {}
        other => panic!("a vote to nobody: {other:?}"),
    }
    let backoff: Vec<Duration> = client.backoff().expect("a backoff").take(3).collect();
    assert!(backoff[0] < backoff[2], "{backoff:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_over_the_limit_or_cut_short_is_refused_before_it_reaches_raft() {
    let node = TestNode::start(2).await;
    let mut client = RaftClient::connect(format!("http://{}", node.addr))
        .await
        .unwrap();
    let header = |snapshot_bytes: u64| SnapshotPart {
        part: Some(snapshot_part::Part::Header(SnapshotHeader {
            envelope: envelope(CLUSTER, 2),
            vote: serde_json::to_vec(&VoteOf::<C>::new_committed(1, 1)).unwrap(),
            meta: serde_json::to_vec(&SnapshotMetaOf::<C> {
                last_log_id: None,
                last_membership: StoredMembership::default(),
            })
            .unwrap(),
            snapshot_bytes,
        })),
    };
    let chunk = |bytes: usize| SnapshotPart {
        part: Some(snapshot_part::Part::Chunk(vec![b' '; bytes])),
    };

    let too_large = futures::stream::iter(vec![header(SNAPSHOT_BYTES_MAX as u64 + 1)]);
    let refused = client.install_snapshot(too_large).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("a node accepts"),
        "{}",
        refused.message()
    );

    let cut_short = futures::stream::iter(vec![header(100), chunk(60)]);
    let refused = client.install_snapshot(cut_short).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused
            .message()
            .contains("ended after 60 of the 100 bytes"),
        "{}",
        refused.message()
    );

    let overlong = futures::stream::iter(vec![header(100), chunk(60), chunk(60)]);
    let refused = client.install_snapshot(overlong).await.unwrap_err();
    assert!(
        refused.message().contains("more than the 100 bytes"),
        "{}",
        refused.message()
    );

    node.stop().await;
}

/// A member at `addr` (as a node of this test, incarnation 0).
fn member(addr: impl std::fmt::Display) -> Member {
    Member {
        addr: addr.to_string(),
        incarnation: 0,
    }
}
