//! Proposing commands and linearizable reads, bound to the current term.

use std::time::Duration;

use openraft::ReadPolicy;
use openraft::errors::{ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError};
use openraft::impls::ProgressResponder;
use palisade_core::canary::{self, Canary};
use palisade_core::{Command, Input, Output};

use super::Node;
use super::leadership::Term;
use crate::raft_types::{C, Proposal};

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

pub(super) fn hint_of(forward: &ForwardToLeader<C>) -> Option<LeaderHint> {
    forward.leader_id.map(|node_id| LeaderHint {
        node_id,
        addr: forward
            .leader_node
            .as_ref()
            .map(|m| m.addr.clone())
            .unwrap_or_default(),
    })
}

impl Node {
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
    pub(super) async fn propose_in(
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
    pub(super) async fn propose_payload(
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
}
