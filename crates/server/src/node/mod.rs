//! One lock-service node: the Raft instance, its log and state machine, the signing key, and
//! the tasks that lead, drive leases and keep the counters' mark.
//!
//! [`Node`] is the server's one handle on the replicated lock table: the services (`service`,
//! `cluster`, `peer_service`, `ui`) talk to it, never to openraft or the state machine behind
//! it. This file holds the node itself (start, accessors, shutdown); the rest lives by job:
//!
//! - `leadership`: the leader's clock, taking over a term, stepping back without a quorum;
//! - `propose`: proposing commands and linearizable reads, bound to the current term;
//! - `lease_driver`: proposing a `Tick` whenever the table's next deadline has come;
//! - `membership`: bootstrapping, adding, removing and admitting members;
//! - `admin`: backup, the token floor and the cluster's keys.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use openraft::storage::{RaftLogReader as _, RaftLogStorage as _};
use openraft::{Config, SnapshotPolicy};
use palisade_clock::SharedClock;
use palisade_core::{Limits, LockTable, TimeMs};
use palisade_proto::transport::Dialer;
use palisade_sequencer::{KeySet, PublicKey, SigningKey};

use crate::identity::Identity;
use crate::keyring::KeyView;
use crate::lock_watchers::{LockSubscription, Published};
use crate::log_store::LogStore;
use crate::peer::{ClusterName, PeerNetwork};
use crate::platform::Blocking;
use crate::raft_types::{C, Member};
use crate::state_machine::PalisadeRaft;
use crate::state_machine::{Shared, StateMachine, Waiters};

mod admin;
mod leadership;
mod lease_driver;
mod membership;
mod propose;

pub use admin::KeyRequest;
use leadership::Term;
pub use membership::{ClusterView, MemberView, MembershipError};
pub use propose::{LeaderHint, ProposeError};

const LOG_FILE: &str = "raft.wal";

/// Refuses an initial cluster above [`crate::limits::INITIAL_CLUSTER_MEMBERS_MAX`], or that does
/// not name this node at the address it advertises.
fn check_initial_cluster(config: &NodeConfig) -> Result<(), StartError> {
    let Some(cluster) = &config.initial_cluster else {
        return Ok(());
    };
    let members_max = crate::limits::INITIAL_CLUSTER_MEMBERS_MAX;
    if cluster.len() > members_max {
        return Err(StartError::Config(format!(
            "--initial-cluster names {} members; at most {members_max} members can start a cluster",
            cluster.len()
        )));
    }
    let me = config.node_id;
    match cluster.get(&me) {
        None => Err(StartError::Config(format!(
            "--initial-cluster does not name this node ({me})"
        ))),
        Some(own) if *own != config.advertise => Err(StartError::Config(format!(
            "--initial-cluster gives node {me} the address {own}, but it advertises {}",
            config.advertise
        ))),
        Some(_) => Ok(()),
    }
}

/// Why [`Node::start`] failed. Each is final for this start: nothing is served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The data directory, the signing key, the log or the snapshot could not be read or
    /// written (including a log whose acknowledged frames are corrupt), or the directory
    /// belongs to another node.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// openraft refused its configuration, failed to initialise, or this node did not become
    /// the leader of its one-member group.
    #[error("{0}")]
    Raft(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// Proposing `LeaderStart` or the new limits failed.
    #[error(transparent)]
    Propose(#[from] ProposeError),
    /// The lock table refused the configured limits.
    #[error("the new limits were refused: {0}")]
    LimitsRefused(palisade_core::CoreError),
    /// The configuration contradicts itself.
    #[error("{0}")]
    Config(String),
    /// The directory holds the signing key, but its log falls short of the counters' mark:
    /// starting would issue tokens and session ids again (invariant 13). The message names
    /// the recovery command.
    #[error("{0}")]
    CountersBehind(String),
}

impl StartError {
    fn raft(error: impl std::error::Error + Send + Sync + 'static) -> StartError {
        StartError::Raft(Box::new(error))
    }
}

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's id: never reused for another data directory.
    pub node_id: u64,
    pub data_dir: PathBuf,
    /// The lock table's limits; new ones are proposed once this node leads.
    pub limits: Limits,
    /// Where the node reads time: [`palisade_clock::TokioClock`] in production.
    pub clock: SharedClock,
    /// Where clients and peers reach this node.
    pub advertise: String,
    /// The members to bootstrap a new cluster with, by id; `None` makes a new directory a
    /// one-member group. Ignored once the directory holds a log.
    pub initial_cluster: Option<BTreeMap<u64, String>>,
    /// A new directory waits to be added to an existing cluster (`palisade cluster add`)
    /// instead of starting a one-member group.
    pub join: bool,
    /// How connections to peers are made: TCP when `None`.
    pub dialer: Option<Dialer>,
    /// Where the log's writes and snapshots run: [`Blocking::Threads`] in production.
    pub blocking: Blocking,
    /// How the log's file meets the disk: [`crate::disk::Disk::direct`] in production.
    pub disk: crate::disk::Disk,
}

/// The name every node of a Palisade cluster carries in its peer requests.
pub const CLUSTER_NAME: &str = "palisade";

/// A running lock-service node.
#[derive(Debug)]
pub struct Node {
    identity: Identity,
    raft: PalisadeRaft,
    log: LogStore,
    stopping: tokio::sync::watch::Sender<bool>,
    /// The current term of leadership, once its `LeaderStart` is applied; `None` otherwise.
    leading: tokio::sync::watch::Sender<Option<Arc<Term>>>,
    /// Bumped whenever openraft reports the end of a leadership, before `leading` is cleared:
    /// a takeover publishes its term only if no end came since its start.
    leadership_ends: std::sync::atomic::AtomicU64,
    /// Set once this node sees a membership without itself, having been a member.
    removed: tokio::sync::watch::Sender<bool>,
    shared: Arc<Shared>,
    clock: SharedClock,
    limits: Limits,
    advertise: String,
    data_dir: PathBuf,
    network: PeerNetwork,
    blocking: Blocking,
    /// The cluster's founding key: this node's own until it is admitted to a cluster, which
    /// hands it the cluster's (see [`crate::peer_service::Admission`]). It signs until the
    /// first rotation; then the replicated key ring says which key signs (see
    /// [`crate::keyring`]).
    founding_key: std::sync::RwLock<SigningKey>,
    leader_watch: std::sync::Mutex<LeaderWatch>,
    /// The counters' mark found (or written) at start: no leadership grants anything while
    /// the applied counters are below it, unless floors above it are pending (invariant 13).
    start_mark: crate::counters::CounterMark,
}

/// Keeps openraft's leader-change callbacks running while held.
#[derive(Default)]
struct LeaderWatch(Option<openraft::raft::WatchChangeHandle<C>>);

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "LeaderWatch(on)"
        } else {
            "LeaderWatch(off)"
        })
    }
}

fn raft_config() -> Result<Config, StartError> {
    let config = Config {
        cluster_name: "palisade".to_string(),
        heartbeat_interval: crate::limits::HEARTBEAT_INTERVAL_MS,
        election_timeout_min: crate::limits::ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: crate::limits::ELECTION_TIMEOUT_MAX_MS,
        max_payload_entries: 1024,
        max_append_entries: Some(4096),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(crate::limits::SNAPSHOT_INTERVAL_ENTRIES),
        max_in_snapshot_log_to_keep: 1_000,
        // A snapshot travels as one stream; on a slow link a large one needs its time.
        install_snapshot_timeout: crate::limits::INSTALL_SNAPSHOT_TIMEOUT_MS,
        // A member cut off alone asks first whether it could win, and raises no term until it
        // could: when the network heals, it does not depose a leader that served all along.
        enable_pre_vote: Some(true),
        // A leader no quorum answers stops its heartbeats for a while (then probes, then stops
        // again): followers it still reaches, though it hears nothing back, elect a new leader
        // instead of being held by its heartbeats for as long as the cut lasts.
        quorum_loss_probe_interval: Some(crate::limits::QUORUM_LOSS_PROBE_MS),
        ..Default::default()
    };
    config.validate().map_err(StartError::raft)
}

impl Node {
    /// Opens the data directory and recovers the lock table. A new directory bootstraps a
    /// one-member group, or the cluster of `config.initial_cluster` if this node has its lowest
    /// id. A node that is the only voter of its group returns once it leads and every lease is
    /// extended; a member of a larger group returns at once and follows (or leads, once
    /// elected).
    pub async fn start(config: NodeConfig) -> Result<Arc<Node>, StartError> {
        // Flags that contradict themselves are refused before the directory is touched, so the
        // corrected command finds it as it was.
        check_initial_cluster(&config)?;
        let data_dir = &config.data_dir;
        crate::files::create_data_dir(data_dir)?;

        // The log takes the data directory's lock: nothing in it, the key included, is created
        // before this process knows it is the only one using the directory.
        let log = LogStore::open_with(
            &data_dir.join(LOG_FILE),
            config.blocking,
            config.disk.clone(),
        )?;
        // A directory from before node ids holds entries (or a vote) of node 1; an empty log is
        // only a first start that stopped before it wrote its identity.
        let had_log = {
            let mut log = log.clone();
            log.get_log_state().await?.last_log_id.is_some() || log.read_vote().await?.is_some()
        };
        let identity = crate::identity::load_or_create(data_dir, config.node_id, had_log)?;
        let state_machine =
            StateMachine::open_with(data_dir, log.durable_index(), config.blocking)?;
        let shared = state_machine.shared();
        // Invariant 13: before the key is loaded (or created), the log must reach the counters'
        // mark, or a recovery's floor must lie above it.
        let key_existed = std::fs::symlink_metadata(data_dir.join("signing.key")).is_ok();
        let wal_reach = log.clone().get_log_state().await?.last_log_id;
        let snapshot_log_id = shared.last_applied();
        let (snapshot_token, snapshot_session) =
            shared.read(|t| (t.last_token(), t.last_session()));
        let mark = crate::counters::check_at_start(&crate::counters::Found {
            key_existed,
            log_reach: wal_reach.max(snapshot_log_id),
            snapshot_log_id,
            snapshot_token,
            snapshot_session,
            snapshot_exists: crate::state_machine::snapshot_exists(data_dir)?,
            dir: data_dir,
        })
        .map_err(StartError::CountersBehind)?;
        shared.marks().start_from(mark.clone());
        let signing_key = crate::keys::load_or_create(data_dir)?;
        let (removed, _) = tokio::sync::watch::channel(false);
        let network = PeerNetwork::new(
            ClusterName::new(CLUSTER_NAME).expect("the cluster name is valid"),
            identity.node_id,
            identity.incarnation,
        )
        .with_removal_signal(removed.clone())
        .with_dialer(config.dialer.clone());
        let raft = PalisadeRaft::new(
            identity.node_id,
            Arc::new(raft_config()?),
            network.clone(),
            log.clone(),
            state_machine,
        )
        .await
        .map_err(StartError::raft)?;
        let (stopping, _) = tokio::sync::watch::channel(false);
        let (leading, _) = tokio::sync::watch::channel(None);
        let node = Arc::new(Node {
            identity,
            raft,
            log,
            stopping,
            leading,
            leadership_ends: std::sync::atomic::AtomicU64::new(0),
            removed,
            shared,
            clock: config.clock.clone(),
            limits: config.limits,
            advertise: config.advertise.clone(),
            data_dir: data_dir.clone(),
            network,
            blocking: config.blocking,
            founding_key: std::sync::RwLock::new(signing_key),
            leader_watch: std::sync::Mutex::new(LeaderWatch::default()),
            start_mark: mark,
        });
        node.watch_leadership();
        node.watch_membership();
        node.keep_counter_mark();
        node.bootstrap(&config).await?;
        if node.raft.is_initialized().await.map_err(StartError::raft)? {
            // The membership reaches the metrics a moment after initialisation or recovery.
            node.raft
                .wait(Some(crate::limits::MEMBERSHIP_KNOWN_TIMEOUT))
                .metrics(
                    |m| {
                        m.membership_config
                            .membership()
                            .voter_ids()
                            .next()
                            .is_some()
                    },
                    "membership known",
                )
                .await
                .map_err(StartError::raft)?;
        }
        if node.is_sole_voter() {
            node.until_leading(crate::limits::SOLE_VOTER_TAKEOVER_TIMEOUT)
                .await?;
        }
        Ok(node)
    }

    fn member(&self) -> Member {
        Member {
            addr: self.advertise.clone(),
            incarnation: self.identity.incarnation,
        }
    }

    fn is_sole_voter(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let voters: Vec<u64> = metrics.membership_config.membership().voter_ids().collect();
        voters == [self.identity.node_id]
    }

    /// Rewrites the counters' mark (see [`crate::counters`]) at most every
    /// [`crate::counters::MARK_INTERVAL`] while entries apply, off the apply path, until the
    /// node stops (the shutdown writes the last one).
    fn keep_counter_mark(self: &Arc<Self>) {
        let shared = self.shared.clone();
        let blocking = self.blocking;
        let clock = self.clock.clone();
        let mut stopping = self.stopping.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = clock.sleep(crate::counters::MARK_INTERVAL) => {}
                    _ = stopping.changed() => {}
                }
                if *stopping.borrow() {
                    return;
                }
                if !shared.marks().is_behind(shared.last_applied()) {
                    continue;
                }
                let writing = shared.clone();
                let written = blocking
                    .run(move || writing.marks().record(writing.counter_mark()))
                    .await;
                if let Err(e) = written.and_then(|written| written) {
                    tracing::error!(error = %e, "could not write the counters' mark; retrying");
                }
            }
        });
    }

    /// Resolves once this node has seen itself removed from its cluster.
    pub async fn removed(&self) {
        let mut removed = self.removed.subscribe();
        let _ = removed.wait_for(|removed| *removed).await;
    }

    /// The time on the lock table's timeline, as this node's leader clock sees it now (the
    /// table's latest applied time when this node does not lead).
    pub fn now_ms(&self) -> TimeMs {
        match &*self.leading.borrow() {
            Some(term) => term.clock.now_ms(),
            None => self.shared.read(|t| t.now_ms()),
        }
    }

    pub fn node_id(&self) -> u64 {
        self.identity.node_id
    }

    /// The incarnation of this node's data directory (see `identity`).
    pub fn incarnation(&self) -> u64 {
        self.identity.incarnation
    }

    /// The Raft instance: what the peer service serves.
    pub fn raft(&self) -> &PalisadeRaft {
        &self.raft
    }

    /// Reads the lock table as this node has applied it. Not linearizable by itself: a
    /// caller that must see every committed write calls [`Node::linearizable_read`] first, or
    /// reads as the leader ([`Node::read_as_leader`]).
    pub fn read_table<R>(&self, f: impl FnOnce(&LockTable) -> R) -> R {
        self.shared.read(f)
    }

    /// The sessions waiting for an acquire's outcome, by lock.
    pub(crate) fn waiters(&self) -> &Waiters {
        self.shared.waiters()
    }

    /// Every event applied from now on, with each lock's queue length.
    pub(crate) fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<Published> {
        self.shared.subscribe_events()
    }

    /// The changes of `lock` applied from now on.
    pub(crate) fn subscribe_lock(&self, lock: &str) -> LockSubscription {
        self.shared.subscribe_lock(lock)
    }

    /// Counts the snapshots installed: after one, a watcher reads the table afresh.
    pub(crate) fn subscribe_installs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.subscribe_installs()
    }

    /// The public half of the key that signs sequencers now.
    pub fn public_key(&self) -> PublicKey {
        self.signing_key().public_key()
    }

    /// The key that signs sequencers now: the key ring's signing key, or the founding key
    /// while nobody has rotated.
    pub fn signing_key(&self) -> SigningKey {
        self.shared
            .signing_key()
            .unwrap_or_else(|| self.founding_key())
    }

    /// Every key resources must trust now, as this node's state machine has them.
    pub fn published_keys(&self) -> KeySet {
        let founding = self.founding_key();
        self.shared.read_keys(|ring| ring.published(&founding))
    }

    /// The published keys and which one signs, as this node's state machine has them.
    pub fn key_views(&self) -> Vec<KeyView> {
        let founding = self.founding_key();
        self.shared.read_keys(|ring| ring.view(&founding))
    }

    /// The cluster's founding key (this node's own until it is admitted to a cluster).
    pub(crate) fn founding_key(&self) -> SigningKey {
        self.founding_key.read().expect("founding key lock").clone()
    }

    /// Resolves once shutdown has begun. Long-lived calls (keepalive and watch streams, acquires
    /// waiting in a queue) end on it, so a graceful shutdown does not wait for their clients.
    pub async fn stopping(&self) {
        let mut stopping = self.stopping.subscribe();
        let _ = stopping.wait_for(|stopping| *stopping).await;
    }

    /// What [`Node::stopping`] waits for, as a watch: true once the node is stopping.
    pub(crate) fn stopping_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Marks the node as stopping: see [`Node::stopping`].
    pub fn begin_shutdown(&self) {
        self.stopping.send_replace(true);
    }

    /// Stops the lease driver and Raft, then closes the log; in-flight requests fail with
    /// [`ProposeError::Stopped`].
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.leading.send_replace(None);
        let watch = std::mem::take(&mut *self.leader_watch.lock().expect("leader watch lock"));
        if let Some(mut watch) = watch.0 {
            watch.close().await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown reported an error");
        }
        // The last mark, of everything applied: a log lost after a clean stop is caught to
        // the entry.
        let shared = self.shared.clone();
        match self
            .blocking
            .run(move || shared.marks().record(shared.counter_mark()))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(error = %e, "could not write the counters' mark at shutdown")
            }
        }
        let log = self.log.clone();
        let _ = self.blocking.run(move || log.close()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path, node_id: u64) -> NodeConfig {
        NodeConfig {
            node_id,
            data_dir: dir.to_path_buf(),
            limits: Limits::default(),
            clock: palisade_clock::TokioClock::shared(),
            advertise: "127.0.0.1:1".into(),
            initial_cluster: None,
            join: true,
            dialer: None,
            blocking: Blocking::Threads,
            disk: crate::disk::Disk::direct(),
        }
    }

    /// The cap held only in the CLI before: an embedder (or the simulation) starting a node
    /// with a larger initial cluster started it.
    #[tokio::test]
    async fn an_initial_cluster_above_the_member_cap_is_refused_before_the_directory_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let members = crate::limits::INITIAL_CLUSTER_MEMBERS_MAX as u64 + 1;
        let mut config = config(&data_dir, members);
        config.join = false;
        config.advertise = format!("127.0.0.1:{members}");
        config.initial_cluster = Some(
            (1..=members)
                .map(|id| (id, format!("127.0.0.1:{id}")))
                .collect(),
        );
        let refused = Node::start(config)
            .await
            .expect_err("ten members are above the cap");
        assert!(
            refused.to_string().contains("at most 9 members"),
            "{refused}"
        );
        assert!(!data_dir.exists(), "the directory was created");
    }

    #[tokio::test]
    async fn a_start_cut_off_before_its_identity_was_written_keeps_the_node_id() {
        let dir = tempfile::tempdir().unwrap();
        // A first start of node 3 died after creating its empty log, before writing node.json.
        LogStore::open(&dir.path().join(LOG_FILE)).unwrap().close();
        assert!(!dir.path().join("node.json").exists());

        let node = Node::start(config(dir.path(), 3))
            .await
            .expect("the directory holds no entry of any node, so it is node 3's");
        assert_eq!(node.node_id(), 3);
        node.shutdown().await;
    }

    #[tokio::test]
    async fn a_data_directory_in_use_gets_no_signing_key_from_a_second_server() {
        let dir = tempfile::tempdir().unwrap();
        // Another process holds the directory's lock (the log's lock file) and has not yet
        // created its key.
        let lock = std::fs::File::create(dir.path().join(LOG_FILE).with_extension("lock")).unwrap();
        lock.try_lock().unwrap();

        let refused = Node::start(NodeConfig {
            join: false,
            ..config(dir.path(), 1)
        })
        .await
        .unwrap_err();
        assert!(refused.to_string().contains("in use"), "{refused}");
        assert!(
            !dir.path().join("signing.key").exists(),
            "a refused server created a signing key in a directory it does not own"
        );
    }
}
