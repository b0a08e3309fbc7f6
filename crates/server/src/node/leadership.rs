//! Leadership: the leader's clock, taking over a term, and stepping back when no quorum answers.
//!
//! **Time.** The lock table has no clock; every input carries the time at which it takes
//! effect. The leader stamps inputs with its own monotonic clock, mapped onto the table's
//! timeline: when the node takes over, the table's latest time becomes the base and the
//! monotonic time elapsed since then is added to it. The timeline therefore never runs
//! backwards across restarts, and wall-clock jumps cannot touch it (invariant 6).
//!
//! **Taking over.** The new leader catches up with every committed entry, then proposes
//! `LeaderStart`, which gives every session its full TTL again, measured from now: a restart or
//! a change of leader extends leases, never shortens them. A leader no quorum acknowledges for
//! `QUORUM_SILENCE_MS` stops serving until one does again ([`Node::watch_quorum`]).
//!
//! A term is published (and the node serves) only if no end of leadership came since it began
//! (`leadership_ends`). On losing leadership, calls fail with `NotLeader` carrying the leader's
//! hint, and acquires waiting in the queue end with an unknown outcome: the wait goes on in
//! the table under the next leader.
use std::sync::Arc;
use std::time::Duration;

use openraft::Instant as _;
use openraft::ReadPolicy;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{LinearizableReadError, RaftError};
use openraft::type_config::alias::{CommittedLeaderIdOf, InstantOf};
use openraft::vote::RaftLeaderId;
use palisade_clock::SharedClock;
use palisade_core::canary::{self, Canary};
use palisade_core::{Command, DurationMs, TimeMs};

use super::membership::MembershipError;
use super::{LeaderWatch, Node, StartError};
use crate::raft_types::C;

/// The leader's clock, mapped onto the lock table's timeline: the table's time when this node
/// took over, plus the time elapsed on the node's [`Clock`](palisade_clock::Clock) since.
#[derive(Debug, Clone)]
pub(super) struct LeaderClock {
    pub(super) clock: SharedClock,
    pub(super) base_ms: TimeMs,
    pub(super) base: Duration,
}

impl LeaderClock {
    pub(super) fn new(clock: SharedClock, table_now_ms: TimeMs) -> LeaderClock {
        LeaderClock {
            base: clock.now(),
            clock,
            base_ms: table_now_ms,
        }
    }

    pub(super) fn now_ms(&self) -> TimeMs {
        let elapsed = self.clock.now().saturating_sub(self.base);
        self.base_ms
            .saturating_add(DurationMs::from_duration_floor(elapsed))
    }

    /// Resolves once the table's time `at_ms` has come on this clock.
    pub(super) fn sleep_until_ms(&self, at_ms: TimeMs) -> palisade_clock::Sleep {
        let after = Duration::from(at_ms.saturating_duration_since(self.base_ms));
        self.clock.sleep_until(self.base.saturating_add(after))
    }

    pub(super) fn sleep(&self, duration: Duration) -> palisade_clock::Sleep {
        self.clock.sleep(duration)
    }
}

/// When a quorum last acknowledged this node as its leader ([`Node::last_quorum_ack`]).
pub(super) enum QuorumAck {
    /// This node is the only voter: it is its own quorum.
    NotNeeded,
    /// No quorum has acknowledged it (or it does not lead).
    Never,
    At(InstantOf<C>),
}

/// One term of this node's leadership, from its `LeaderStart` on.
#[derive(Debug)]
pub(super) struct Term {
    /// Proposals are bound to it: once another leader is elected, they fail before they are
    /// appended instead of stamping the log with this leader's clock.
    pub(super) leader_id: CommittedLeaderIdOf<C>,
    pub(super) clock: LeaderClock,
}

impl Node {
    /// Waits until this node leads with its `LeaderStart` applied.
    pub(super) async fn until_leading(&self, timeout: Duration) -> Result<(), StartError> {
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

    /// Follows this node's leadership: on gaining it, take over; on losing it, stop proposing.
    pub(super) fn watch_leadership(self: &Arc<Self>) {
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
    pub(super) async fn take_over(
        self: Arc<Self>,
        leader_id: CommittedLeaderIdOf<C>,
        mut ends: u64,
    ) {
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
        let own = match crate::counters::pending_token_floor(&self.data_dir) {
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
    pub(super) async fn watch_quorum(&self, term: Arc<Term>) -> bool {
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
        let mut pause = crate::limits::PEER_BACKOFF_FIRST;
        loop {
            match self.raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
                Ok(_) => return true,
                Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e))) => {
                    tracing::info!(error = %e, "no quorum yet to take over with; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(crate::limits::PEER_BACKOFF_MAX);
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

    /// Resolves once `term` is no longer the term this node serves.
    pub(super) async fn term_ended(&self, term: &Arc<Term>) {
        let mut leading = self.leading.subscribe();
        let _ = leading
            .wait_for(|now| !now.as_ref().is_some_and(|now| Arc::ptr_eq(now, term)))
            .await;
    }

    /// The leader's term, or why this node may not change the membership.
    pub(super) fn leading_term(&self) -> Result<Arc<Term>, MembershipError> {
        self.leading
            .borrow()
            .clone()
            .ok_or_else(|| MembershipError::NotLeader(self.not_leader()))
    }
}
