//! Membership: bootstrapping, adding and removing members, and admitting a new node.
//!
//! Adding a member admits it first (it takes the cluster's founding key and tells its
//! incarnation), then adds it as a learner, waits until it has caught up (by a snapshot if the
//! log was purged past it), and only then makes it a voter. Removing one refuses the last
//! voter. A node that sees itself removed resolves [`Node::removed`], which ends the server's
//! `run_until`; its data directory never rejoins.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, InitializeError, RaftError};
use openraft::{ChangeMembers, ServerState};
use palisade_sequencer::SigningKey;

use super::propose::hint_of;
use super::{Node, NodeConfig, ProposeError, StartError};
use crate::peer::AdmitError;
use crate::raft_types::{C, Member};

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

impl crate::peer_service::Admission for Node {
    fn was_removed(&self, id: u64) -> bool {
        self.shared.is_retired(id)
    }

    fn pending_token_floor(&self) -> Result<Option<crate::counters::PendingFloor>, String> {
        self.forget_applied_floor();
        crate::counters::pending_token_floor(&self.data_dir).map_err(|e| e.to_string())
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

/// An operator's proposal that failed: not the leader (the caller goes there), or an outcome
/// the caller cannot know, with what to do about it.
pub(super) fn administrative(e: ProposeError, unknown_outcome: &str) -> MembershipError {
    match e {
        ProposeError::NotLeader { .. } => MembershipError::NotLeader(e),
        ProposeError::Discarded { .. }
        | ProposeError::NotCommittedInTime
        | ProposeError::Stopped(_) => MembershipError::Failed(format!("{e}; {unknown_outcome}")),
    }
}

impl Node {
    /// Initialises a new directory's group: a one-member group, or the initial cluster if this
    /// node has its lowest id (the others wait to be contacted).
    pub(super) async fn bootstrap(&self, config: &NodeConfig) -> Result<(), StartError> {
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

    /// Notices when this node is removed from its cluster: a member that applies a membership
    /// without itself stops serving (see [`Node::removed`]) instead of answering clients with
    /// a stale view. A node that learns of its removal only by being refused by the others
    /// stays idle: they answer none of its requests.
    ///
    /// It watches openraft's server metrics, which change only with the vote, the role, the
    /// leader or the membership, rather than its whole metrics, which the Raft core sends on
    /// every turn: that would wake this task once or more per lock operation for nothing.
    pub(super) fn watch_membership(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let mut metrics = self.raft.server_metrics();
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

    /// A one-member cluster whose membership does not record where this node is now (a data
    /// directory from before clusters has the empty address; a restart may listen elsewhere)
    /// records it, so that peers added later can reach it. Only a sole voter does this: in a
    /// larger cluster an address never changes under an id.
    pub(super) fn record_own_address(self: &Arc<Self>) {
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
    pub(super) fn forget_applied_floor(&self) {
        let (token, session) = self.shared.read(|t| (t.last_token(), t.last_session()));
        match crate::counters::pending_token_floor(&self.data_dir) {
            Ok(Some(floor))
                if floor.token <= token && floor.session.is_none_or(|floor| floor <= session) =>
            {
                // The mark first: without the file, a log short of an older mark would stop
                // the next start.
                if let Err(e) = self.shared.marks().record(self.shared.counter_mark()) {
                    tracing::warn!(error = %e, "could not write the counters' mark; the applied floor's file is kept");
                    return;
                }
                match crate::counters::forget_token_floor(&self.data_dir) {
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
