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

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use openraft::errors::{InitializeError, RaftError};
use openraft::{BasicNode, Config, ReadPolicy, ServerState, SnapshotPolicy};
use palisade_clock::SharedClock;
use palisade_core::{Command, Input, Limits, Output};
use palisade_sequencer::{PublicKey, SigningKey};

use crate::log_store::LogStore;
use crate::network::SingleNodeNetwork;
use crate::raft_types::PalisadeRaft;
use crate::state_machine::{Shared, StateMachine};

const NODE_ID: u64 = 1;
const LOG_FILE: &str = "raft.wal";

/// Why a command could not be applied. The outcome is unknown to the caller unless stated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// This node is not the leader (or no longer is): nothing was applied here; retry.
    #[error("this node is not the leader; retry")]
    NotLeader,
    /// The node has stopped (storage failure or shutdown); the command may or may not be applied.
    #[error("the lock service is stopping: {0}")]
    Stopped(String),
}

/// Why [`Node::start`] failed. Each is final for this start: nothing is served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The data directory, the signing key, the log or the snapshot could not be read or
    /// written (including a log whose acknowledged frames are corrupt).
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
}

impl StartError {
    fn raft(error: impl std::error::Error + Send + Sync + 'static) -> StartError {
        StartError::Raft(Box::new(error))
    }
}

/// The leader's clock, mapped onto the lock table's timeline: the table's time when this node
/// took over, plus the time elapsed on the node's [`Clock`](palisade_clock::Clock) since.
#[derive(Debug, Clone)]
struct LeaderClock {
    clock: SharedClock,
    base_ms: u64,
    base: Duration,
}

impl LeaderClock {
    fn new(clock: SharedClock, table_now_ms: u64) -> LeaderClock {
        LeaderClock {
            base: clock.now(),
            clock,
            base_ms: table_now_ms,
        }
    }

    fn now_ms(&self) -> u64 {
        let elapsed = self.clock.now().saturating_sub(self.base);
        self.base_ms.saturating_add(elapsed.as_millis() as u64)
    }

    /// Resolves once the table's time `at_ms` has come on this clock.
    fn sleep_until_ms(&self, at_ms: u64) -> palisade_clock::Sleep {
        let after = Duration::from_millis(at_ms.saturating_sub(self.base_ms));
        self.clock.sleep_until(self.base.saturating_add(after))
    }

    fn sleep(&self, duration: Duration) -> palisade_clock::Sleep {
        self.clock.sleep(duration)
    }
}

/// A running lock-service node.
#[derive(Debug)]
pub struct Node {
    raft: PalisadeRaft,
    log: LogStore,
    stopping: tokio::sync::watch::Sender<bool>,
    shared: Arc<Shared>,
    clock: LeaderClock,
    signing_key: SigningKey,
    public_key: PublicKey,
}

fn raft_config() -> Result<Config, StartError> {
    let config = Config {
        cluster_name: "palisade".to_string(),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        max_payload_entries: 1024,
        max_append_entries: Some(4096),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(crate::limits::SNAPSHOT_INTERVAL_ENTRIES),
        max_in_snapshot_log_to_keep: 1_000,
        ..Default::default()
    };
    config.validate().map_err(StartError::raft)
}

impl Node {
    /// Opens the data directory, recovers the lock table, takes leadership of the one-member
    /// group and extends every lease. Returns when the node is ready to serve. Time is read
    /// from `clock` ([`palisade_clock::TokioClock`] in production).
    pub async fn start(
        data_dir: &Path,
        limits: Limits,
        clock: SharedClock,
    ) -> Result<Arc<Node>, StartError> {
        std::fs::create_dir_all(data_dir)?;
        // The log takes the data directory's lock: nothing in it, the key included, is created
        // before this process knows it is the only one using the directory.
        let log = LogStore::open(&data_dir.join(LOG_FILE))?;
        let signing_key = crate::keys::load_or_create(data_dir)?;
        let public_key = signing_key.public_key();
        let state_machine = StateMachine::open(data_dir, log.durable_index())?;
        let shared = state_machine.shared();
        let raft = PalisadeRaft::new(
            NODE_ID,
            Arc::new(raft_config()?),
            SingleNodeNetwork,
            log.clone(),
            state_machine,
        )
        .await
        .map_err(StartError::raft)?;
        if !raft.is_initialized().await.map_err(StartError::raft)? {
            let members = BTreeMap::from([(NODE_ID, BasicNode::new(""))]);
            match raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(StartError::raft(e)),
            }
        }
        raft.wait(Some(Duration::from_secs(30)))
            .state(ServerState::Leader, "become leader")
            .await
            .map_err(StartError::raft)?;
        // Everything committed before the restart is applied once a linearizable read passes.
        raft.ensure_linearizable(ReadPolicy::ReadIndex)
            .await
            .map_err(StartError::raft)?;
        let clock = LeaderClock::new(clock, shared.read(|t| t.now_ms()));
        let (stopping, _) = tokio::sync::watch::channel(false);
        let node = Arc::new(Node {
            raft,
            log,
            stopping,
            shared,
            clock,
            signing_key,
            public_key,
        });
        let started = node.propose(Command::LeaderStart).await?;
        tracing::info!(result = ?started.result, "took over as leader");
        // New limits (e.g. another --lock-delay) take effect at this point of the log, never
        // retroactively for entries replayed above.
        if node.shared.read(|t| *t.limits()) != limits {
            let set = node.propose(Command::SetLimits { limits }).await?;
            set.result.map_err(StartError::LimitsRefused)?;
            tracing::info!(?limits, "limits changed");
        }
        tokio::spawn(node.clone().drive_leases());
        Ok(node)
    }

    /// The time on the lock table's timeline, as this leader sees it now.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    pub fn public_key(&self) -> &PublicKey {
        &self.public_key
    }

    pub fn signing_key(&self) -> &SigningKey {
        &self.signing_key
    }

    /// Stamps `command` with the leader's time, commits it durably and applies it.
    pub async fn propose(&self, command: Command) -> Result<Output, ProposeError> {
        Ok(self.propose_indexed(command).await?.1)
    }

    /// [`Node::propose`], also returning the log index at which the command was applied.
    pub async fn propose_indexed(&self, command: Command) -> Result<(u64, Output), ProposeError> {
        let input = Input {
            now_ms: self.clock.now_ms(),
            command,
        };
        match self.raft.client_write(input).await {
            Ok(response) => Ok((response.log_id.index, response.data)),
            Err(RaftError::APIError(openraft::errors::ClientWriteError::ForwardToLeader(_))) => {
                Err(ProposeError::NotLeader)
            }
            Err(e) => Err(ProposeError::Stopped(e.to_string())),
        }
    }

    /// Waits until this node's table reflects every write committed before the call.
    pub async fn linearizable_read(&self) -> Result<(), ProposeError> {
        match self.raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(_)) => Err(ProposeError::NotLeader),
            Err(e) => Err(ProposeError::Stopped(e.to_string())),
        }
    }

    /// Proposes a `Tick` whenever the table's next deadline has come.
    async fn drive_leases(self: Arc<Self>) {
        let mut stopping = self.stopping.subscribe();
        loop {
            if *stopping.borrow_and_update() {
                return;
            }
            let notified = self.shared.applied_notify.notified();
            let next = self.shared.read(|t| t.next_deadline_ms());
            // Announce the alarm, then look again: a batch applied between the two reads either
            // shows here or, reading the alarm after it was set, signals (see `Shared`).
            let alarm = next.unwrap_or(u64::MAX);
            self.shared.lease_alarm_ms.store(alarm, SeqCst);
            if self
                .shared
                .read(|t| t.next_deadline_ms())
                .is_some_and(|deadline| deadline < alarm)
            {
                continue;
            }
            let now = self.now_ms();
            match next {
                Some(deadline) if deadline <= now => match self.propose(Command::Tick).await {
                    Ok(_) => continue,
                    Err(ProposeError::Stopped(reason)) => {
                        tracing::info!(%reason, "lease driver stopping");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease driver could not tick");
                        self.clock.sleep(crate::limits::LEASE_DRIVER_RETRY).await;
                    }
                },
                Some(deadline) => {
                    tokio::select! {
                        () = self.clock.sleep_until_ms(deadline) => {}
                        _ = notified => {}
                        _ = stopping.changed() => {}
                    }
                }
                None => {
                    tokio::select! {
                        _ = notified => {}
                        _ = stopping.changed() => {}
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
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown reported an error");
        }
        let log = self.log.clone();
        let _ = tokio::task::spawn_blocking(move || log.close()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_data_directory_in_use_gets_no_signing_key_from_a_second_server() {
        let dir = tempfile::tempdir().unwrap();
        // Another process holds the directory's lock (the log's lock file) and has not yet
        // created its key.
        let lock = std::fs::File::create(dir.path().join(LOG_FILE).with_extension("lock")).unwrap();
        lock.try_lock().unwrap();

        let refused = Node::start(
            dir.path(),
            Limits::default(),
            palisade_clock::TokioClock::shared(),
        )
        .await
        .unwrap_err();
        assert!(refused.to_string().contains("in use"), "{refused}");
        assert!(
            !dir.path().join("signing.key").exists(),
            "a refused server created a signing key in a directory it does not own"
        );
    }
}
