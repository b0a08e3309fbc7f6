//! One lock-service node: the Raft instance, the leader's clock, the lease driver and the key.
//!
//! **Time.** The lock table has no clock; every input carries the time at which it takes
//! effect. The leader stamps inputs with its own monotonic clock, mapped onto the table's
//! timeline: when the node takes over, the table's latest time becomes the base and the
//! monotonic time elapsed since then is added to it. The timeline therefore never runs
//! backwards across restarts, and wall-clock jumps cannot touch it (invariant 6).
//!
//! **Leases.** On taking over, the node first proposes `LeaderStart`, which gives every session
//! its full TTL again, measured from now: a restart or a change of leader extends leases, never
//! shortens them. From then on a lease driver proposes a `Tick` whenever the table's next
//! deadline (a lease end, a wait deadline, a lock-delay end) has come, so expiries are log
//! entries like everything else.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::Instant as _;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{
    ClientWriteError, ForwardToLeader, InitializeError, LinearizableReadError, RaftError,
};
use openraft::impls::ProgressResponder;
use openraft::storage::{RaftLogReader as _, RaftLogStorage as _};
use openraft::type_config::alias::{CommittedLeaderIdOf, InstantOf};
use openraft::vote::RaftLeaderId;
use openraft::{ChangeMembers, Config, ReadPolicy, ServerState, SnapshotPolicy};
use palisade_clock::SharedClock;
use palisade_core::canary::{self, Canary};
use palisade_core::{Command, DurationMs, Input, Limits, Output, TimeMs, Token};
use palisade_proto::transport::Dialer;
use palisade_sequencer::{KeyId, KeySet, PublicKey, SigningKey};

use crate::Blocking;
use crate::identity::Identity;
use crate::keyring::{KeyChange, KeyRefusal, KeyRing, KeyView, Secret};
use crate::log_store::LogStore;
use crate::peer::{AdmitError, ClusterName, PeerNetwork};
use crate::raft_types::{C, Member, PalisadeRaft, Proposal};
use crate::state_machine::{Shared, StateMachine};

const LOG_FILE: &str = "raft.wal";

/// Refuses an initial cluster that does not name this node at the address it advertises.
fn check_initial_cluster(config: &NodeConfig) -> Result<(), StartError> {
    let Some(cluster) = &config.initial_cluster else {
        return Ok(());
    };
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

/// The leader this node knows of, for a client to retry on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderHint {
    pub node_id: u64,
    /// Where clients reach it; empty if the membership does not record it.
    pub addr: String,
}

/// Why a command could not be applied. The outcome is unknown to the caller unless stated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// This node is not the leader (or no longer is): nothing was applied here; retry on the
    /// leader, if one is known.
    #[error("{}", not_leader_message(.leader))]
    NotLeader { leader: Option<LeaderHint> },
    /// The command was appended, but leadership changed before it committed: it may still
    /// commit through the new leader. Retry with the same request id.
    #[error("leadership changed while the command was in flight")]
    Discarded { leader: Option<LeaderHint> },
    /// The command was appended but not committed in time: this leader has probably lost its
    /// quorum. It may still commit (here, or through the next leader). Retry elsewhere with the
    /// same request id.
    #[error(
        "the command was not committed within {}ms; this node may be cut off from the others",
        crate::limits::PROPOSAL_COMMIT_TIMEOUT_MS
    )]
    NotCommittedInTime,
    /// The node has stopped (storage failure or shutdown); the command may or may not be applied.
    #[error("the lock service is stopping: {0}")]
    Stopped(String),
}

fn not_leader_message(leader: &Option<LeaderHint>) -> String {
    match leader {
        Some(hint) if !hint.addr.is_empty() => format!(
            "this node is not the leader; node {} at {} is",
            hint.node_id, hint.addr
        ),
        Some(hint) => format!("this node is not the leader; node {} is", hint.node_id),
        None => "this node is not the leader and knows of none yet; retry".to_string(),
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

/// The leader's clock, mapped onto the lock table's timeline: the table's time when this node
/// took over, plus the time elapsed on the node's [`Clock`](palisade_clock::Clock) since.
#[derive(Debug, Clone)]
struct LeaderClock {
    clock: SharedClock,
    base_ms: TimeMs,
    base: Duration,
}

impl LeaderClock {
    fn new(clock: SharedClock, table_now_ms: TimeMs) -> LeaderClock {
        LeaderClock {
            base: clock.now(),
            clock,
            base_ms: table_now_ms,
        }
    }

    fn now_ms(&self) -> TimeMs {
        let elapsed = self.clock.now().saturating_sub(self.base);
        self.base_ms
            .saturating_add(DurationMs::from_duration_floor(elapsed))
    }

    /// Resolves once the table's time `at_ms` has come on this clock.
    fn sleep_until_ms(&self, at_ms: TimeMs) -> palisade_clock::Sleep {
        let after = Duration::from(at_ms.saturating_duration_since(self.base_ms));
        self.clock.sleep_until(self.base.saturating_add(after))
    }

    fn sleep(&self, duration: Duration) -> palisade_clock::Sleep {
        self.clock.sleep(duration)
    }
}

/// When a quorum last acknowledged this node as its leader ([`Node::last_quorum_ack`]).
enum QuorumAck {
    /// This node is the only voter: it is its own quorum.
    NotNeeded,
    /// No quorum has acknowledged it (or it does not lead).
    Never,
    At(InstantOf<C>),
}

/// One term of this node's leadership, from its `LeaderStart` on.
#[derive(Debug)]
struct Term {
    /// Proposals are bound to it: once another leader is elected, they fail before they are
    /// appended instead of stamping the log with this leader's clock.
    leader_id: CommittedLeaderIdOf<C>,
    clock: LeaderClock,
}

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
                .wait(Some(Duration::from_secs(10)))
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
            node.until_leading(Duration::from_secs(30)).await?;
        }
        Ok(node)
    }

    /// Initialises a new directory's group: a one-member group, or the initial cluster if this
    /// node has its lowest id (the others wait to be contacted).
    async fn bootstrap(&self, config: &NodeConfig) -> Result<(), StartError> {
        if self.raft.is_initialized().await.map_err(StartError::raft)? {
            return Ok(());
        }
        let me = self.identity.node_id;
        if config.join {
            tracing::info!(
                "waiting to be added to a cluster: run `palisade cluster add {me} {}` against it",
                self.advertise
            );
            return Ok(());
        }
        let members: BTreeMap<u64, Member> = match &config.initial_cluster {
            None => BTreeMap::from([(me, self.member())]),
            Some(cluster) => {
                if cluster.keys().next() != Some(&me) {
                    tracing::info!(
                        "waiting for node {} to bootstrap the cluster",
                        cluster.keys().next().copied().unwrap_or(me)
                    );
                    return Ok(());
                }
                let mut members = BTreeMap::from([(me, self.member())]);
                for (id, addr) in cluster.iter().filter(|(id, _)| **id != me) {
                    let incarnation = self.admit_at_bootstrap(*id, addr).await?;
                    members.insert(
                        *id,
                        Member {
                            addr: addr.clone(),
                            incarnation,
                        },
                    );
                }
                members
            }
        };
        match self.raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(StartError::raft(e)),
        }
    }

    /// Admits node `id` of the initial cluster, retrying until it answers: the nodes of a new
    /// cluster start in any order. A refusal (the node belongs to a cluster already, or another
    /// node answers at that address) is final.
    async fn admit_at_bootstrap(&self, id: u64, addr: &str) -> Result<u64, StartError> {
        let mut told = false;
        loop {
            match self
                .network
                .admit(id, addr, self.founding_key().to_bytes())
                .await
            {
                Ok(incarnation) => return Ok(incarnation),
                Err(AdmitError::Refused(why)) => {
                    return Err(StartError::Config(format!(
                        "cannot bootstrap the cluster: {why}"
                    )));
                }
                Err(AdmitError::Unreachable(why)) => {
                    if !told {
                        tracing::info!(node = id, %addr, reason = %why, "waiting for the node to start");
                        told = true;
                    }
                    if *self.stopping.borrow() {
                        return Err(StartError::Config("stopped while bootstrapping".into()));
                    }
                    tokio::time::sleep(crate::limits::BOOTSTRAP_RETRY).await;
                }
            }
        }
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

    /// Waits until this node leads with its `LeaderStart` applied.
    async fn until_leading(&self, timeout: Duration) -> Result<(), StartError> {
        let mut leading = self.leading.subscribe();
        tokio::time::timeout(timeout, leading.wait_for(|term| term.is_some()))
            .await
            .map_err(|_| {
                StartError::Config(format!(
                    "this node did not take over its one-member group within {timeout:?}"
                ))
            })?
            .map_err(|_| StartError::Config("the node stopped while starting".into()))?;
        Ok(())
    }

    /// Notices when this node is removed from its cluster: a member that applies a membership
    /// without itself stops serving (see [`Node::removed`]) instead of answering clients with
    /// a stale view. A node that learns of its removal only by being refused by the others
    /// stays idle: they answer none of its requests.
    fn watch_membership(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let mut metrics = self.raft.metrics();
        let me = self.identity.node_id;
        tokio::spawn(async move {
            let mut was_member = false;
            loop {
                let removed = {
                    let metrics = metrics.borrow_and_update();
                    let membership = metrics.membership_config.membership();
                    let member = membership.get_node(&me).is_some();
                    was_member |= member;
                    was_member && !member && membership.voter_ids().next().is_some()
                };
                if removed {
                    if let Some(node) = weak.upgrade() {
                        tracing::error!(
                            "this node was removed from the cluster; it stops serving. Its data \
                             directory cannot rejoin: add a new one under a new id"
                        );
                        node.removed.send_replace(true);
                    }
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
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

    /// Follows this node's leadership: on gaining it, take over; on losing it, stop proposing.
    fn watch_leadership(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let weak_stop = weak.clone();
        let handle = self.raft.on_leader_change(
            move |leader_id| {
                let weak = weak.clone();
                async move {
                    if let Some(node) = weak.upgrade() {
                        let ends = node
                            .leadership_ends
                            .load(std::sync::atomic::Ordering::SeqCst);
                        tokio::spawn(node.take_over(leader_id.to_committed(), ends));
                    }
                }
            },
            move |_| {
                let weak = weak_stop.clone();
                async move {
                    if let Some(node) = weak.upgrade() {
                        node.leadership_ends
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if node.leading.send_replace(None).is_some() {
                            tracing::info!("no longer the leader");
                        }
                    }
                }
            },
        );
        *self.leader_watch.lock().expect("leader watch lock") = LeaderWatch(Some(handle));
    }

    /// Takes over as leader of the term `leader_id` ([`Node::start_serving`]), then serves and
    /// drives the leases until the term ends, or until no quorum answers ([`Node::watch_quorum`]);
    /// in that case it takes over again once a quorum answers again in the same term. `ends` is
    /// the count of ended leaderships when the term began: if another ends meanwhile, this term
    /// is not published.
    async fn take_over(self: Arc<Self>, leader_id: CommittedLeaderIdOf<C>, mut ends: u64) {
        while let Some(term) = self.start_serving(leader_id, ends).await {
            tokio::spawn(self.clone().drive_leases(term.clone()));
            if !self.watch_quorum(term).await {
                return;
            }
            ends = self
                .leadership_ends
                .load(std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Catches up with every committed entry, re-anchors the clock on the table's latest time,
    /// extends every lease (`LeaderStart`), raises the token floor a cut log left, and
    /// publishes the term: from then on this node serves. `None` if the term ended first.
    async fn start_serving(
        self: &Arc<Self>,
        leader_id: CommittedLeaderIdOf<C>,
        ends: u64,
    ) -> Option<Arc<Term>> {
        if !self.catch_up_as_leader(leader_id).await {
            return None;
        }
        let skip_leader_start = canary::active(Canary::SkipLeaderStart);
        let table_now = if skip_leader_start {
            TimeMs::from_millis(self.clock.now().as_millis() as u64)
        } else {
            self.shared.read(|t| t.now_ms())
        };
        let term = Arc::new(Term {
            leader_id,
            clock: LeaderClock::new(self.clock.clone(), table_now),
        });
        tracing::debug!(?leader_id, base_ms = term.clock.base_ms.as_millis(), base = ?term.clock.base, "taking over");
        if !skip_leader_start {
            match self.propose_in(&term, Command::LeaderStart).await {
                Ok((_, started)) => tracing::info!(result = ?started.result, "took over as leader"),
                Err(e) => {
                    tracing::info!(error = %e, "could not take over");
                    return None;
                }
            }
        }
        // A cut of a log, or a recovery of the counters, may have taken grants resources saw
        // and sessions clients saw: this node's own, or a voter's that elected it (learned
        // from its vote). No grant or session of this term comes before the highest such
        // floors are applied.
        let own = match crate::wal::pending_token_floor(&self.data_dir) {
            Ok(own) => own,
            Err(e) => {
                tracing::error!(error = %e, "not taking over: the token floor left by a cut of the log cannot be read");
                return None;
            }
        };
        let floor = match (own.clone(), self.network.learned_token_floor()) {
            (Some(own), Some(learned)) => Some(own.max(learned)),
            (own, learned) => own.or(learned),
        };
        let (last_token, last_session) = self.shared.read(|t| (t.last_token(), t.last_session()));
        // Every entry committed before this term is applied: counters below this node's own
        // mark mean the log replayed without its beginning (a snapshot lost beside a log that
        // starts after it). The start's check cannot see that; this one does.
        let mark = &self.start_mark;
        let covered = floor.as_ref().is_some_and(|f| {
            f.token > mark.last_token && f.session.is_some_and(|s| s > mark.last_session)
        });
        if (last_token < mark.last_token || last_session < mark.last_session) && !covered {
            tracing::error!(
                token = last_token.get(),
                session = last_session.get(),
                mark_token = mark.last_token.get(),
                mark_session = mark.last_session.get(),
                "not taking over: the log replays to counters below this node's counters' mark, \
                 so part of it (its snapshot, say) was lost, and granting would issue tokens and \
                 session ids again. Stop the node and run `{} {}`",
                crate::counters::RECOVER_COMMAND,
                self.data_dir.display()
            );
            return None;
        }
        if let Some(floor) = floor.filter(|f| {
            f.token > last_token || f.session.is_some_and(|session| session > last_session)
        }) {
            let command = Command::RaiseTokenFloor {
                floor: floor.token,
                session_floor: floor.session,
            };
            match self.propose_in(&term, command).await {
                Ok((_, raised)) => {
                    tracing::warn!(result = ?raised.result, floor = floor.token.get(), session_floor = floor.session.map(palisade_core::SessionId::get), "raised the counters above every token and session id issued before a log was cut or lost");
                }
                Err(e) => {
                    tracing::info!(error = %e, "could not raise the token floor; not taking over");
                    return None;
                }
            }
        }
        if own.is_some() {
            self.forget_applied_floor();
        }
        // New limits (e.g. another --lock-delay) take effect at this point of the log, never
        // retroactively for entries replayed above.
        if self.shared.read(|t| *t.limits()) != self.limits {
            let limits = self.limits;
            match self.propose_in(&term, Command::SetLimits { limits }).await {
                Ok((_, set)) => match set.result {
                    Ok(_) => tracing::info!(?limits, "limits changed"),
                    Err(e) => tracing::error!(error = %e, "the new limits were refused"),
                },
                Err(e) => tracing::warn!(error = %e, "could not propose the new limits"),
            }
        }
        self.record_own_address();
        // Still this term? It may have ended while the entries above were in flight; checked
        // under the watch's lock, which the end of a leadership also takes after counting.
        let published = self.leading.send_if_modified(|leading| {
            let still = self
                .leadership_ends
                .load(std::sync::atomic::Ordering::SeqCst)
                == ends
                && self.leads_term(leader_id);
            if still {
                *leading = Some(term.clone());
            }
            still
        });
        published.then_some(term)
    }

    /// Ends `term` once no quorum has acknowledged this leader for
    /// [`QUORUM_SILENCE_MS`](crate::limits::QUORUM_SILENCE_MS), and takes over again if the
    /// same openraft term hears from a quorum later.
    ///
    /// openraft keeps a leader cut off from its quorum leading until it hears a higher term,
    /// which a partition may delay for as long as it lasts; only its new proposals are refused.
    /// Meanwhile an acquire queued here waits for an answer this node cannot give: the next
    /// leader may grant the lock to that waiter's session, whose keepalives it renews, and the
    /// lock would be held by a client that does not know it for the whole partition. Ending the
    /// term here ends every queued acquire, watch and keepalive stream with an answer that sends
    /// its client elsewhere, where a retry with the same request id learns the outcome.
    async fn watch_quorum(&self, term: Arc<Term>) -> bool {
        let silence_max = Duration::from_millis(crate::limits::QUORUM_SILENCE_MS);
        let poll = Duration::from_millis(crate::limits::HEARTBEAT_INTERVAL_MS);
        let published = InstantOf::<C>::now();
        let mut stopping = self.stopping.subscribe();
        // Serving: until the term ends otherwise, or its quorum goes silent.
        loop {
            tokio::select! {
                () = tokio::time::sleep(poll) => {}
                _ = stopping.changed() => return false,
                () = self.term_ended(&term) => return false,
            }
            let silence = match self.last_quorum_ack() {
                QuorumAck::NotNeeded => continue,
                QuorumAck::Never => published.elapsed(),
                QuorumAck::At(acked) => acked.max(published).elapsed(),
            };
            if silence <= silence_max || canary::active(Canary::LeaderNeverStepsDown) {
                continue;
            }
            let ended = self.leading.send_if_modified(|leading| {
                let ours = leading.as_ref().is_some_and(|now| Arc::ptr_eq(now, &term));
                if ours {
                    self.leadership_ends
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    *leading = None;
                }
                ours
            });
            if !ended {
                return false;
            }
            tracing::warn!(
                silence_ms = silence.as_millis() as u64,
                "no quorum has answered this leader; it stops serving, and its clients go to \
                 the next leader"
            );
            break;
        }
        let stepped_back = InstantOf::<C>::now();
        // Stepped back: a quorum that answers again in the same term gets a leader again.
        loop {
            tokio::select! {
                () = tokio::time::sleep(poll) => {}
                _ = stopping.changed() => return false,
            }
            if *self.stopping.borrow() || !self.leads_term(term.leader_id) {
                // A new term (here or elsewhere) is taken over through openraft's callbacks.
                return false;
            }
            let answered = match self.last_quorum_ack() {
                QuorumAck::NotNeeded => true,
                QuorumAck::Never => false,
                QuorumAck::At(acked) => acked > stepped_back,
            };
            if answered {
                tracing::info!("a quorum answers this leader again; taking over again");
                return true;
            }
        }
    }

    /// When a quorum last acknowledged this node as its leader.
    fn last_quorum_ack(&self) -> QuorumAck {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        if metrics.membership_config.membership().voter_ids().count() <= 1 {
            return QuorumAck::NotNeeded;
        }
        match &metrics.last_quorum_acked {
            Some(acked) if metrics.current_leader == Some(self.identity.node_id) => {
                QuorumAck::At(**acked)
            }
            _ => QuorumAck::Never,
        }
    }

    fn leads_term(&self, leader_id: CommittedLeaderIdOf<C>) -> bool {
        self.raft
            .as_leader()
            .map(|l| l.to_committed_leader_id())
            .ok()
            == Some(leader_id)
    }

    /// Waits until this new leader has applied every entry committed before it took over.
    /// A quorum may be slow to answer (a follower paused, a disk stalled): the read is tried
    /// again for as long as this node leads the term. False if the term ended first.
    async fn catch_up_as_leader(&self, leader_id: CommittedLeaderIdOf<C>) -> bool {
        let mut pause = crate::peer::PEER_BACKOFF_FIRST;
        loop {
            match self.raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
                Ok(_) => return true,
                Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e))) => {
                    tracing::info!(error = %e, "no quorum yet to take over with; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(crate::peer::PEER_BACKOFF_MAX);
                    // openraft's metrics may lag its callbacks, so this is asked only here.
                    if *self.stopping.borrow() || !self.leads_term(leader_id) {
                        return false;
                    }
                }
                Err(e) => {
                    tracing::info!(error = %e, "lost leadership while catching up");
                    return false;
                }
            }
        }
    }

    /// A one-member cluster whose membership does not record where this node is now (a data
    /// directory from before clusters has the empty address; a restart may listen elsewhere)
    /// records it, so that peers added later can reach it. Only a sole voter does this: in a
    /// larger cluster an address never changes under an id.
    fn record_own_address(self: &Arc<Self>) {
        let me = self.identity.node_id;
        let recorded = {
            let metrics = self.raft.metrics().borrow_watched().clone();
            metrics
                .membership_config
                .membership()
                .get_node(&me)
                .cloned()
        };
        if !self.is_sole_voter() || recorded.as_ref() == Some(&self.member()) {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            let change = ChangeMembers::SetNodes(BTreeMap::from([(me, node.member())]));
            match node.raft.change_membership(change, false).await {
                Ok(_) => tracing::info!(addr = %node.advertise, "recorded this node's address"),
                Err(e) => tracing::warn!(error = %e, "could not record this node's address"),
            }
        });
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

    /// The incarnation of this node's data directory (see [`crate::identity`]).
    pub fn incarnation(&self) -> u64 {
        self.identity.incarnation
    }

    pub fn raft(&self) -> &PalisadeRaft {
        &self.raft
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
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

    /// The leader as far as this node knows, for a client to go to.
    pub fn leader_hint(&self) -> Option<LeaderHint> {
        match self.raft.as_leader() {
            Ok(_) => Some(LeaderHint {
                node_id: self.identity.node_id,
                addr: self.advertise.clone(),
            }),
            Err(forward) => hint_of(&forward),
        }
    }

    /// Resolves when this node stops leading the term it leads now (at once if it leads none).
    pub async fn leadership_lost(&self) {
        let mut leading = self.leading.subscribe();
        let Some(term) = leading.borrow_and_update().clone() else {
            return;
        };
        let _ = leading
            .wait_for(|now| !now.as_ref().is_some_and(|now| Arc::ptr_eq(now, &term)))
            .await;
    }

    /// Stamps `command` with the leader's time, commits it durably and applies it.
    pub async fn propose(&self, command: Command) -> Result<Output, ProposeError> {
        Ok(self.propose_indexed(command).await?.1)
    }

    /// [`Node::propose`], also returning the log index at which the command was applied.
    pub async fn propose_indexed(&self, command: Command) -> Result<(u64, Output), ProposeError> {
        let term = self.leading.borrow().clone();
        let Some(term) = term else {
            return Err(self.not_leader());
        };
        // A leader cut off from its quorum takes proposals for up to its lease, and answers
        // them only once the partition heals; its callers go elsewhere in the meantime: when
        // the term ends (`watch_quorum` ends it once no quorum answers), or at the latest
        // after the timeout.
        let timeout = Duration::from_millis(crate::limits::PROPOSAL_COMMIT_TIMEOUT_MS);
        tokio::select! {
            proposed = tokio::time::timeout(timeout, self.propose_in(&term, command)) => {
                proposed.unwrap_or(Err(ProposeError::NotCommittedInTime))
            }
            () = self.term_ended(&term) => Err(ProposeError::Discarded { leader: None }),
        }
    }

    /// Resolves once `term` is no longer the term this node serves.
    async fn term_ended(&self, term: &Arc<Term>) {
        let mut leading = self.leading.subscribe();
        let _ = leading
            .wait_for(|now| !now.as_ref().is_some_and(|now| Arc::ptr_eq(now, term)))
            .await;
    }

    /// Reads the table if this node leads, as the checks before a proposal need it: a node
    /// leads only once it has applied every entry committed before its term (`take_over`), so
    /// the table holds every session any client was told of. `NotLeader` otherwise, as a
    /// proposal would answer.
    pub fn read_as_leader<T>(
        &self,
        read: impl FnOnce(&palisade_core::LockTable) -> T,
    ) -> Result<T, ProposeError> {
        if self.leading.borrow().is_none() {
            return Err(self.not_leader());
        }
        Ok(self.shared.read(read))
    }

    /// Why this node, not leading, does nothing: with the leader to go to, if it knows another.
    pub fn not_leader(&self) -> ProposeError {
        ProposeError::NotLeader {
            leader: self
                .leader_hint()
                .filter(|h| h.node_id != self.identity.node_id),
        }
    }

    /// Proposes `command` in `term`: it fails before it is appended if another term began.
    async fn propose_in(
        &self,
        term: &Term,
        command: Command,
    ) -> Result<(u64, Output), ProposeError> {
        let input = Input {
            now_ms: term.clock.now_ms(),
            command,
        };
        if canary::active(Canary::ReplyBeforeApply)
            && matches!(
                input.command,
                Command::Acquire { .. } | Command::Release { .. }
            )
        {
            return self.reply_before_apply(term, input).await;
        }
        self.propose_payload(term, Proposal::Lock(input)).await
    }

    /// The `reply-before-apply` canary: the answer is the command applied to a copy of the
    /// table as this node has applied it so far, given as soon as Raft took the entry, before
    /// it is committed (index 0: a queued acquire then takes the first outcome it hears).
    async fn reply_before_apply(
        &self,
        term: &Term,
        input: Input,
    ) -> Result<(u64, Output), ProposeError> {
        let output = self.shared.read(|t| t.clone().apply(input.clone()));
        let (responder, _answer) = ProgressResponder::complete_only();
        self.raft
            .write(Proposal::Lock(input))
            .with_leader(term.leader_id)
            .responder(responder)
            .await
            .map_err(|e| ProposeError::Stopped(e.to_string()))?;
        Ok((0, output))
    }

    /// Proposes `proposal` in `term`; see [`Node::propose_in`].
    async fn propose_payload(
        &self,
        term: &Term,
        proposal: Proposal,
    ) -> Result<(u64, Output), ProposeError> {
        let (responder, answer) = ProgressResponder::complete_only();
        self.raft
            .write(proposal)
            .with_leader(term.leader_id)
            .responder(responder)
            .await
            .map_err(|e| ProposeError::Stopped(e.to_string()))?;
        match answer.await {
            Ok(Ok(response)) => Ok((response.log_id.index, response.data)),
            Ok(Err(ClientWriteError::ForwardToLeader(forward))) => Err(ProposeError::NotLeader {
                leader: hint_of(&forward),
            }),
            Ok(Err(ClientWriteError::LogEntryDiscarded(forward))) => Err(ProposeError::Discarded {
                leader: hint_of(&forward),
            }),
            Ok(Err(e)) => Err(ProposeError::Stopped(e.to_string())),
            Err(_) => Err(ProposeError::Stopped(
                "raft dropped the proposal without an answer".into(),
            )),
        }
    }

    /// Waits until this node's table reflects every write committed before the call.
    pub async fn linearizable_read(&self) -> Result<(), ProposeError> {
        match self.raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
                Err(ProposeError::NotLeader {
                    leader: hint_of(&forward),
                })
            }
            // A leader that cannot reach a quorum cannot confirm it still leads: nothing was
            // read; another node may lead by now.
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {
                Err(ProposeError::NotLeader { leader: None })
            }
            Err(e) => Err(ProposeError::Stopped(e.to_string())),
        }
    }

    /// Proposes a `Tick` whenever the table's next deadline has come, for as long as `term`
    /// lasts.
    async fn drive_leases(self: Arc<Self>, term: Arc<Term>) {
        let mut stopping = self.stopping.subscribe();
        let ended = |node: &Node| {
            !node
                .leading
                .borrow()
                .as_ref()
                .is_some_and(|now| Arc::ptr_eq(now, &term))
        };
        loop {
            if *stopping.borrow_and_update() || ended(&self) {
                return;
            }
            let notified = self.shared.lease_alarm().notified();
            let next = self.shared.read(|t| t.next_deadline_ms());
            // Announce the alarm, then look again (see `LeaseAlarm`).
            let alarm = next.unwrap_or(TimeMs::MAX);
            self.shared.lease_alarm().set(alarm);
            if self
                .shared
                .read(|t| t.next_deadline_ms())
                .is_some_and(|deadline| deadline < alarm)
            {
                continue;
            }
            let now = term.clock.now_ms();
            match next {
                Some(deadline) if deadline <= now => {
                    tracing::debug!(
                        deadline = deadline.as_millis(),
                        now = now.as_millis(),
                        base_ms = term.clock.base_ms.as_millis(),
                        "lease driver ticks"
                    );
                    match self.propose_in(&term, Command::Tick).await {
                        Ok(_) => continue,
                        Err(ProposeError::Stopped(reason)) => {
                            tracing::info!(%reason, "lease driver stopping");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "lease driver could not tick");
                            term.clock.sleep(crate::limits::LEASE_DRIVER_RETRY).await;
                        }
                    }
                }
                deadline => {
                    let sleep = match deadline {
                        Some(deadline) => term.clock.sleep_until_ms(deadline),
                        None => Box::pin(std::future::pending()),
                    };
                    tokio::select! {
                        () = sleep => {}
                        _ = notified => {}
                        _ = stopping.changed() => {}
                        () = self.leadership_lost() => {}
                    }
                }
            }
        }
    }

    /// Resolves once shutdown has begun. Long-lived calls (keepalive and watch streams, acquires
    /// waiting in a queue) end on it, so a graceful shutdown does not wait for their clients.
    pub async fn stopping(&self) {
        let mut stopping = self.stopping.subscribe();
        let _ = stopping.wait_for(|stopping| *stopping).await;
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

/// A change to the cluster's keys an operator asks for (`palisade keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRequest {
    /// Publish a new key, which does not sign yet.
    Add,
    /// Sign with the given published key, or with the newest one published after the key that
    /// signs now.
    Rotate(Option<KeyId>),
    /// Stop publishing a key that no longer signs.
    Retire(KeyId),
}

/// Why a change to the cluster (its membership or its keys) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// Only the leader changes the cluster.
    #[error(transparent)]
    NotLeader(ProposeError),
    /// The request contradicts the membership (an id in use, the last voter, an unknown id) or
    /// the node to add refused or answered as another node.
    #[error("{0}")]
    Refused(String),
    /// The node to add is not reachable, or did not catch up in time; nothing was committed
    /// beyond what the message says.
    #[error("{0}")]
    Unavailable(String),
    /// Raft failed while changing the membership; the change may or may not have taken effect:
    /// look at `palisade cluster status`.
    #[error("{0}")]
    Failed(String),
}

/// One member as [`ClusterView`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub id: u64,
    pub addr: String,
    pub voter: bool,
    /// The last log index the leader knows the member stored (on the leader only).
    pub matched_index: Option<u64>,
}

/// This node's view of its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub node_id: u64,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: &'static str,
    pub term: u64,
    pub leader: Option<u64>,
    pub applied_index: u64,
    pub committed_index: u64,
    pub last_log_index: u64,
    pub members: Vec<MemberView>,
}

impl Node {
    /// This node's view of the cluster, from its Raft metrics (no round trip).
    pub fn cluster_view(&self) -> ClusterView {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership().clone();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let matched = metrics.replication.clone().unwrap_or_default();
        let members = membership
            .nodes()
            .map(|(id, member)| MemberView {
                id: *id,
                addr: member.addr.clone(),
                voter: voters.contains(id),
                matched_index: matched.get(id).map(|log_id| log_id.map_or(0, |l| l.index)),
            })
            .collect();
        let role = match metrics.state {
            ServerState::Leader => "leader",
            ServerState::Candidate => "candidate",
            ServerState::Shutdown => "shutdown",
            ServerState::Learner => "learner",
            ServerState::Follower if voters.contains(&self.identity.node_id) => "follower",
            ServerState::Follower => "learner",
        };
        ClusterView {
            node_id: self.identity.node_id,
            role,
            term: metrics.current_term,
            leader: metrics.current_leader,
            applied_index: metrics.last_applied.map_or(0, |l| l.index),
            committed_index: metrics.local_committed.map_or(0, |l| l.index),
            last_log_index: metrics.last_log_index.unwrap_or(0),
            members,
        }
    }

    /// A backup of everything committed before the call (see [`crate::backup`]).
    pub async fn backup(&self) -> Result<Vec<u8>, MembershipError> {
        self.leading_term()?;
        self.linearizable_read()
            .await
            .map_err(MembershipError::NotLeader)?;
        let now_ms = crate::counters::now_unix_ms();
        Ok(self.shared.backup(&self.founding_key(), now_ms))
    }

    /// The published keys and which one signs, read linearizably on the leader.
    pub async fn list_keys(&self) -> Result<Vec<KeyView>, MembershipError> {
        self.linearizable_read()
            .await
            .map_err(MembershipError::NotLeader)?;
        Ok(self.key_views())
    }

    /// Raises the token counter to at least `floor` (never lowers it): every later grant's
    /// token is above it. Returns the counter afterwards. A floor within
    /// [`palisade_core::limits::TOKEN_FLOOR_HEADROOM`] of the largest token is refused; one
    /// above both the counter and [`palisade_core::limits::unforced_raise_max`] only with
    /// `force` (finding N5).
    pub async fn raise_token_floor(
        &self,
        floor: Token,
        force: bool,
    ) -> Result<Token, MembershipError> {
        use palisade_core::limits::{FloorRefusal, check_raised_floor};
        let (token_max, last_token) = self.shared.read(|t| (t.limits().token_max, t.last_token()));
        let now_secs = crate::counters::now_unix_ms() / 1000;
        match check_raised_floor(floor, last_token, now_secs, token_max, force) {
            Ok(()) => {}
            Err(FloorRefusal::TooCloseToMax { highest }) => {
                return Err(MembershipError::Refused(format!(
                    "a floor of {} leaves too little room below the largest token ({}): the \
                     highest floor allowed is {}, even with --force. The counter never goes \
                     down, and every later recovery adds to it; at the limit no lock could be \
                     granted again. A resource that accepted a token this high needs its stored \
                     token reset by hand (docs/security.md)",
                    floor.get(),
                    token_max.get(),
                    highest.get()
                )));
            }
            Err(FloorRefusal::FarAbove { highest }) => {
                return Err(MembershipError::Refused(format!(
                    "a floor of {} is far above the time floor (2^21 a second since 1970) and \
                     the token counter ({}); without --force the highest is {}. Check the \
                     number: the counter never goes down, so --force spends that token space \
                     for ever, every later restore or recovery builds on it, and a backup taken \
                     before a forced raise restores below it: take a new backup after one",
                    floor.get(),
                    last_token.get(),
                    highest.get()
                )));
            }
        }
        let output = self
            .propose(Command::RaiseTokenFloor {
                floor,
                session_floor: None,
            })
            .await
            .map_err(|e| {
                administrative(
                    e,
                    "the floor may or may not have been raised: raising it again is harmless",
                )
            })?;
        match output.result {
            Ok(palisade_core::Reply::TokenFloorRaised { last_token }) => Ok(last_token),
            other => Err(MembershipError::Failed(format!(
                "unexpected answer to raising the token floor: {other:?}"
            ))),
        }
    }

    /// Changes the cluster's keys (see [`crate::keyring`]) and returns them as they are after.
    /// Checked here against the current ring, then committed as one Raft entry.
    pub async fn change_keys(&self, request: KeyRequest) -> Result<Vec<KeyView>, MembershipError> {
        let term = self.leading_term()?;
        // Every earlier change is applied here before the request is checked against the ring.
        self.linearizable_read()
            .await
            .map_err(MembershipError::NotLeader)?;
        let ring = self.shared.read_keys(KeyRing::clone);
        let change =
            match request {
                KeyRequest::Add => KeyChange::Add {
                    founding: Secret::of(&self.founding_key()),
                    key: Secret::of(&crate::entropy::signing_key().map_err(|e| {
                        MembershipError::Failed(format!("cannot generate a key: {e}"))
                    })?),
                },
                KeyRequest::Rotate(to) => KeyChange::Rotate {
                    key: match to {
                        Some(key) => key,
                        None => ring.next().ok_or_else(|| {
                            MembershipError::Refused(KeyRefusal::NothingToRotateTo.to_string())
                        })?,
                    },
                },
                KeyRequest::Retire(key) => KeyChange::Retire { key },
            };
        ring.clone()
            .apply(&change)
            .map_err(|refusal| MembershipError::Refused(refusal.to_string()))?;
        self.propose_payload(
            &term,
            Proposal::Keys {
                keys: change.clone(),
            },
        )
        .await
        .map_err(|e| {
            administrative(
                e,
                "the key change may or may not have taken effect: see `palisade keys list`",
            )
        })?;
        // Add and retire leave a non-empty ring, so the ring alone says whether they applied.
        let done = self.shared.read_keys(|after| match &change {
            KeyChange::Add { key, .. } => after.publishes(key.id()),
            KeyChange::Rotate { key } => after.signing().is_some_and(|k| k.key_id() == *key),
            KeyChange::Retire { key } => !after.publishes(*key),
        });
        if !done {
            return Err(MembershipError::Refused(
                "another key change was committed first and this one no longer applied: see `palisade keys list`".into(),
            ));
        }
        tracing::info!(?change, "keys changed");
        Ok(self.key_views())
    }

    /// The leader's term, or why this node may not change the membership.
    fn leading_term(&self) -> Result<Arc<Term>, MembershipError> {
        self.leading
            .borrow()
            .clone()
            .ok_or_else(|| MembershipError::NotLeader(self.not_leader()))
    }

    /// Adds node `id` at `addr`: admits it (it takes the cluster's key and reports its
    /// incarnation), adds it as a learner, waits until it has caught up (by snapshot if the log
    /// was compacted), then makes it a voter.
    pub async fn add_member(&self, id: u64, addr: String) -> Result<ClusterView, MembershipError> {
        let term = self.leading_term()?;
        if id == 0 {
            return Err(MembershipError::Refused("node ids start at 1".into()));
        }
        if self.shared.is_retired(id) {
            return Err(MembershipError::Refused(format!(
                "node {id} was a member of this cluster and was removed: an id names one data \
                 directory for the life of the cluster; add the new directory under a new id"
            )));
        }
        let view = self.cluster_view();
        let existing = view.members.iter().find(|m| m.id == id);
        if let Some(existing) = existing.filter(|m| m.voter) {
            return Err(MembershipError::Refused(format!(
                "node {id} is already a voter at {}",
                existing.addr
            )));
        }
        // A learner is added again (to finish a catch-up that timed out) only as it is: the
        // membership keeps the first address and incarnation it recorded for an id.
        if let Some(existing) = existing.filter(|m| m.addr != addr) {
            return Err(MembershipError::Refused(format!(
                "node {id} is a learner at {}, not at {addr}; remove node {id} first",
                existing.addr
            )));
        }
        if let Some(other) = view.members.iter().find(|m| m.addr == addr && m.id != id) {
            return Err(MembershipError::Refused(format!(
                "{addr} is the address of node {} already",
                other.id
            )));
        }
        let incarnation = self
            .network
            .admit(id, &addr, self.founding_key().to_bytes())
            .await
            .map_err(|e| match e {
                AdmitError::Unreachable(why) => MembershipError::Unavailable(format!(
                    "{why}; is it started with `palisade serve --join --node-id {id}`?"
                )),
                AdmitError::Refused(why) => MembershipError::Refused(why),
            })?;
        let recorded = self.member_incarnation(id);
        if recorded.is_some_and(|recorded| recorded != incarnation) {
            return Err(MembershipError::Refused(format!(
                "the node at {addr} has a new data directory, not the one admitted as learner \
                 {id}; remove node {id} first, then add the directory under a new id"
            )));
        }
        let member = Member { addr, incarnation };
        let added = tokio::time::timeout(
            crate::limits::ADD_MEMBER_CATCH_UP,
            self.raft.add_learner(id, member, true),
        )
        .await
        .map_err(|_| {
            MembershipError::Failed(format!(
                "node {id} is a learner but did not catch up within {:?}; add it again to \
                 retry, or remove it",
                crate::limits::ADD_MEMBER_CATCH_UP
            ))
        })?;
        added.map_err(|e| self.membership_failed(e))?;
        if self
            .leading
            .borrow()
            .as_ref()
            .is_none_or(|now| !Arc::ptr_eq(now, &term))
        {
            return Err(MembershipError::Failed(format!(
                "leadership changed while node {id} was catching up; it may be a learner: \
                 add it again on the new leader"
            )));
        }
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|e| self.membership_failed(e))?;
        tracing::info!(node = id, "added a voter");
        Ok(self.cluster_view())
    }

    /// Removes node `id` (voter or learner) from the cluster. The last voter cannot be removed.
    pub async fn remove_member(&self, id: u64) -> Result<ClusterView, MembershipError> {
        self.leading_term()?;
        let view = self.cluster_view();
        let Some(member) = view.members.iter().find(|m| m.id == id) else {
            return Err(MembershipError::Refused(format!(
                "node {id} is not a member"
            )));
        };
        let change = if member.voter {
            if view.members.iter().filter(|m| m.voter).count() == 1 {
                return Err(MembershipError::Refused(format!(
                    "node {id} is the last voter; a cluster cannot remove its last voter"
                )));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| self.membership_failed(e))?;
        tracing::info!(node = id, "removed a member");
        Ok(self.cluster_view())
    }

    /// Removes `token-floor-pending` once the table this node applied has its counter at or
    /// above the floor: a committed entry put every later token above it.
    fn forget_applied_floor(&self) {
        let (token, session) = self.shared.read(|t| (t.last_token(), t.last_session()));
        match crate::wal::pending_token_floor(&self.data_dir) {
            Ok(Some(floor))
                if floor.token <= token && floor.session.is_none_or(|floor| floor <= session) =>
            {
                // The mark first: without the file, a log short of an older mark would stop
                // the next start.
                if let Err(e) = self.shared.marks().record(self.shared.counter_mark()) {
                    tracing::warn!(error = %e, "could not write the counters' mark; the applied floor's file is kept");
                    return;
                }
                match crate::wal::forget_token_floor(&self.data_dir) {
                    Ok(()) => tracing::info!(
                        floor = floor.token.get(),
                        "the token floor left by a cut of the log is applied; its file is removed"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not remove the applied token floor (it will be proposed again, which changes nothing)")
                    }
                }
            }
            _ => {}
        }
    }

    /// The incarnation the membership records for node `id`, if it is a member.
    fn member_incarnation(&self, id: u64) -> Option<u64> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        membership.get_node(&id).map(|m| m.incarnation)
    }

    fn membership_failed(&self, e: RaftError<C, ClientWriteError<C>>) -> MembershipError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
                MembershipError::NotLeader(ProposeError::NotLeader {
                    leader: hint_of(&forward),
                })
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                MembershipError::Refused(e.to_string())
            }
            e => MembershipError::Failed(e.to_string()),
        }
    }
}

impl crate::peer_service::Admission for Node {
    fn was_removed(&self, id: u64) -> bool {
        self.shared.is_retired(id)
    }

    fn pending_token_floor(&self) -> Result<Option<crate::wal::PendingFloor>, String> {
        self.forget_applied_floor();
        crate::wal::pending_token_floor(&self.data_dir).map_err(|e| e.to_string())
    }

    fn admit(&self, from: u64, signing_key: [u8; 32]) -> Result<u64, String> {
        let key = SigningKey::from_bytes(signing_key);
        let mut current = self.founding_key.write().expect("founding key lock");
        if current.to_bytes() == signing_key {
            return Ok(self.identity.incarnation);
        }
        let member_of_a_cluster = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .next()
            .is_some();
        if member_of_a_cluster {
            tracing::error!(%from, "refused admission: this node is a member of a cluster with another key");
            return Err(format!(
                "node {} is a member of another cluster (its signing key differs); a node \
                 joins one cluster once: start a new data directory under a new id",
                self.identity.node_id
            ));
        }
        crate::keys::store(&self.data_dir, &key).map_err(|e| {
            format!(
                "node {} cannot store the cluster key: {e}",
                self.identity.node_id
            )
        })?;
        crate::admin_token::write(&self.data_dir, &key).map_err(|e| {
            format!(
                "node {} cannot write the cluster's admin token: {e}",
                self.identity.node_id
            )
        })?;
        *current = key;
        tracing::info!(%from, public_key = %current.public_key(), "admitted: took the cluster's signing key");
        Ok(self.identity.incarnation)
    }
}

fn hint_of(forward: &ForwardToLeader<C>) -> Option<LeaderHint> {
    forward.leader_id.map(|node_id| LeaderHint {
        node_id,
        addr: forward
            .leader_node
            .as_ref()
            .map(|m| m.addr.clone())
            .unwrap_or_default(),
    })
}

/// An operator's proposal that failed: not the leader (the caller goes there), or an outcome
/// the caller cannot know, with what to do about it.
fn administrative(e: ProposeError, unknown_outcome: &str) -> MembershipError {
    match e {
        ProposeError::NotLeader { .. } => MembershipError::NotLeader(e),
        ProposeError::Discarded { .. }
        | ProposeError::NotCommittedInTime
        | ProposeError::Stopped(_) => MembershipError::Failed(format!("{e}; {unknown_outcome}")),
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
