//! The operator: what an administrator does to a running cluster, asked for by the nemesis
//! and carried out inside the nodes' hosts through the server's own calls (those behind
//! `palisade cluster add|remove|backup|raise-token-floor`, `palisade restore`, `palisade
//! recover-counters`, and openraft's triggers):
//!
//! - membership churn: a node with a fresh id and a new data directory added as a voter, a
//!   member removed, keeping between three and five voters;
//! - leadership handed from the leader to another member;
//! - a snapshot of every node's state machine, and its log purged up to it, so that a node
//!   that falls behind afterwards catches up from the snapshot;
//! - the token floor raised (`raise-token-floor`, within what it allows without `--force`),
//!   and a backup taken (`cluster backup`);
//! - a disaster: every member lost for good, the last backup restored into a spare node's new
//!   directory (`palisade restore`), which serves as a new one-member cluster that the churn
//!   grows again;
//! - a node's log lost (deleted) or rolled back (an older copy put back) while its signing key
//!   and counters' mark survive. The start is refused, naming `recover-counters`; the operator
//!   runs it, and starts the node again. For a member of a larger cluster, `recover-counters`
//!   refuses, and the operator replaces the member (removes it; the churn adds a new one).
//!   If the members left are no majority, nothing can remove it: the operator treats the
//!   cluster as lost and restores the last backup into a spare, as after a disaster.
//!
//! An order goes to every member; only the node that believes it leads carries out those that
//! need a leader, and a stale leader's attempt fails as it would for an administrator.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use palisade_core::Token;
use palisade_server::node::Node;

use crate::record::What;
use crate::{PORT, Shared, node_name, now};

/// How often a node looks for orders.
const POLL: Duration = Duration::from_millis(50);
/// How long after a snapshot is asked for its log is purged.
const PURGE_AFTER: Duration = Duration::from_millis(300);
/// How far above the time floor the operator raises the token floor: 2^35, about 4.5 hours of
/// the time floor's growth, well within what `raise-token-floor` allows without `--force`
/// (2^40). Any recovery within a run is far closer to the raise than that, so floors placed by
/// the time floor alone (the `absolute-floors` canary) fall below the raised counter.
const FLOOR_ABOVE_TIME: u64 = 1 << 35;
/// The files that hold a node's log: what a lost or rolled-back log loses.
const LOG_FILES: [&str; 2] = ["raft.wal", "snapshot.bin"];

/// How a node's log is lost while its key and counters' mark survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLoss {
    /// `raft.wal` and `snapshot.bin` deleted.
    Deleted,
    /// The copy of both kept when the node last started put back.
    RolledBack,
}

/// The state of the operator's recoveries, in the world the hosts share.
#[derive(Debug, Default)]
pub(crate) struct Recoveries {
    /// The last backup taken.
    pub(crate) backup: Option<Vec<u8>>,
    /// Whether the token floor was raised.
    pub(crate) raised: bool,
    /// The node that restores the backup when it next starts.
    pub(crate) restore_into: Option<u64>,
    /// Nodes whose log is lost when they next start.
    pub(crate) lose_log: BTreeMap<u64, LogLoss>,
    /// Whether each start keeps a copy of the node's log, for a later rollback.
    pub(crate) keep_copies: bool,
    /// Per node under recovery: when it began, and what it is.
    pub(crate) began: BTreeMap<u64, (Duration, String)>,
    /// Nodes gone for good: a lost cluster's members, a replaced member.
    pub(crate) retired: BTreeSet<u64>,
    /// Nodes started alone (restored, or recovered as a single voter), without `--join`.
    pub(crate) alone: BTreeSet<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The leader hands its leadership to `to`.
    TransferLeader { to: u64 },
    /// The node snapshots its state machine, then purges its log up to the snapshot.
    SnapshotAndPurge,
    /// The leader adds node `id`, started empty and waiting to join, as a voter.
    Add { id: u64 },
    /// The leader removes node `id`.
    Remove { id: u64 },
    /// The leader raises the token floor [`FLOOR_ABOVE_TIME`] above the time floor.
    RaiseTokenFloor,
    /// The leader takes a backup.
    Backup,
}

/// Runs beside node `id`'s server in its host, carrying out the orders addressed to it.
pub(crate) async fn carry_out(id: u64, node: Arc<Node>, world: Shared) {
    loop {
        tokio::time::sleep(POLL).await;
        // What the nemesis needs to cut the leader off: who believes it leads, in which term.
        let view = node.cluster_view();
        if view.leader == Some(id) {
            world.borrow_mut().leading.insert(id, view.term);
        } else {
            world.borrow_mut().leading.remove(&id);
        }
        let orders = world.borrow_mut().orders.remove(&id).unwrap_or_default();
        for order in orders {
            carry(id, &node, order, &world).await;
        }
    }
}

async fn carry(id: u64, node: &Node, order: Order, world: &Shared) {
    let leading = node.leader_hint().is_some_and(|hint| hint.node_id == id);
    match order {
        Order::TransferLeader { to } if leading => {
            let _ = node.raft().trigger().transfer_leader(to).await;
        }
        Order::SnapshotAndPurge => {
            let _ = node.raft().trigger().snapshot().await;
            tokio::time::sleep(PURGE_AFTER).await;
            let _ = node.raft().trigger().purge_log(u64::MAX).await;
        }
        Order::Add { id: new } if leading => {
            let addr = format!("{}:{PORT}", node_name(new));
            let line = match node.add_member(new, addr).await {
                Ok(_) => {
                    world.borrow_mut().members.insert(new);
                    format!("{} added {} as a voter", node_name(id), node_name(new))
                }
                Err(e) => format!("{} could not add {}: {e}", node_name(id), node_name(new)),
            };
            world.borrow_mut().record(What::Fault(line));
        }
        Order::Remove { id: gone } if leading => {
            let line = match node.remove_member(gone).await {
                Ok(_) => {
                    world.borrow_mut().members.remove(&gone);
                    format!("{} removed {}", node_name(id), node_name(gone))
                }
                Err(e) => format!(
                    "{} could not remove {}: {e}",
                    node_name(id),
                    node_name(gone)
                ),
            };
            world.borrow_mut().record(What::Fault(line));
        }
        Order::RaiseTokenFloor if leading => {
            let time = palisade_core::limits::restore_token_floor(wall_ms() / 1000);
            let floor = Token::new(time.get() + FLOOR_ABOVE_TIME);
            let line = match node.raise_token_floor(floor, false).await {
                Ok(counter) => {
                    // A backup taken before the raise would restore the counter below the
                    // tokens granted after it (docs/cluster.md): the operator takes a new one.
                    let mut world = world.borrow_mut();
                    world.recovery.raised = true;
                    world.recovery.backup = None;
                    format!(
                        "{} raised the token floor: the counter is at {counter}",
                        node_name(id)
                    )
                }
                Err(e) => format!("{} could not raise the token floor: {e}", node_name(id)),
            };
            world.borrow_mut().record(What::Fault(line));
        }
        Order::Backup if leading => {
            let line = match node.backup().await {
                Ok(backup) => {
                    let line = format!("{} took a backup of {} bytes", node_name(id), backup.len());
                    world.borrow_mut().recovery.backup = Some(backup);
                    line
                }
                Err(e) => format!("{} could not take a backup: {e}", node_name(id)),
            };
            world.borrow_mut().record(What::Fault(line));
        }
        _ => {}
    }
}

fn wall_ms() -> u64 {
    palisade_clock::wall::unix_ms()
}

/// What a node whose start was refused does next.
pub(crate) enum Next {
    StartAgain,
    StayDown,
}

/// If node `id` is to restore the backup, restores it into `dir` (`palisade restore`), which
/// must then be started as a one-member cluster. The directory is new: whatever the spare
/// held is removed first.
pub(crate) fn restore_here(id: u64, dir: &Path, world: &Shared) -> std::io::Result<bool> {
    let backup = {
        let mut world = world.borrow_mut();
        if world.recovery.restore_into != Some(id) {
            return Ok(false);
        }
        world.recovery.restore_into = None;
        world.recovery.backup.clone()
    };
    let Some(backup) = backup else {
        return Ok(false);
    };
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let mut world = world.borrow_mut();
    match palisade_server::backup::restore(&backup, dir, wall_ms()) {
        Ok(restored) => {
            world.recovery.alone.insert(id);
            world.record(What::Fault(format!(
                "operator: palisade restore into {}: tokens above {} (the backup's last {}), \
                 session ids above {} (the backup's last {})",
                node_name(id),
                restored.last_token,
                restored.last_token_in_backup,
                restored.last_session,
                restored.last_session_in_backup
            )));
            Ok(true)
        }
        Err(e) => {
            world.record(What::RecoveryFailed {
                node: id,
                why: without_run_dir(&format!("palisade restore refused: {e}"), dir),
            });
            Ok(false)
        }
    }
}

/// Where a node's copy of its log, kept at its start, lives.
fn copy_dir(dir: &Path) -> PathBuf {
    dir.with_extension("older")
}

/// If node `id`'s log is to be lost, loses it, and returns `true`; otherwise keeps a copy of
/// it when a later rollback may need one.
pub(crate) fn lose_log_here(id: u64, dir: &Path, world: &Shared) -> std::io::Result<bool> {
    let (loss, keep_copies) = {
        let mut world = world.borrow_mut();
        (
            world.recovery.lose_log.remove(&id),
            world.recovery.keep_copies,
        )
    };
    let copies = copy_dir(dir);
    let Some(loss) = loss else {
        if keep_copies && dir.exists() {
            std::fs::create_dir_all(&copies)?;
            for file in LOG_FILES {
                let _ = std::fs::remove_file(copies.join(file));
                if dir.join(file).exists() {
                    std::fs::copy(dir.join(file), copies.join(file))?;
                }
            }
        }
        return Ok(false);
    };
    for file in LOG_FILES {
        if dir.join(file).exists() {
            std::fs::remove_file(dir.join(file))?;
        }
        if loss == LogLoss::RolledBack && copies.join(file).exists() {
            std::fs::copy(copies.join(file), dir.join(file))?;
        }
    }
    let what = match loss {
        LogLoss::Deleted => "deleted",
        LogLoss::RolledBack => "rolled back to the copy of its last start",
    };
    world.borrow_mut().record(What::Fault(format!(
        "operator: the log of {} {what}; its signing key and counters' mark kept",
        node_name(id)
    )));
    Ok(true)
}

/// Node `id`'s start was `refused` after its log was lost: the documented recovery,
/// `palisade recover-counters`, or for a member of a larger cluster (which it refuses) the
/// member's replacement.
pub(crate) fn recover_counters(id: u64, dir: &Path, refused: &str, world: &Shared) -> Next {
    let mut world = world.borrow_mut();
    let refused = &without_run_dir(refused, dir);
    let short: String = refused.chars().take(200).collect();
    world.record(What::Fault(format!(
        "{} refused to start: {short}",
        node_name(id)
    )));
    if !refused.contains("recover-counters") {
        world.record(What::RecoveryFailed {
            node: id,
            why: format!("its start was refused without naming recover-counters: {refused}"),
        });
        return Next::StayDown;
    }
    match palisade_server::counters::recover(dir, wall_ms()) {
        Ok(recovered) => {
            world.record(What::Fault(format!(
                "operator: palisade recover-counters on {}: tokens above {}, session ids above {}",
                node_name(id),
                recovered.floors.token,
                recovered
                    .floors
                    .session
                    .map_or("(not raised)".to_string(), |s| s.to_string())
            )));
            Next::StartAgain
        }
        Err(palisade_server::counters::RecoverError::Refused(why))
            if why.contains("replaced, not recovered") =>
        {
            world.record(What::Fault(format!(
                "operator: recover-counters refused on {}, a member of a larger cluster: it is \
                 replaced",
                node_name(id)
            )));
            world.recovery.began.remove(&id);
            world.recovery.retired.insert(id);
            Next::StayDown
        }
        Err(e) => {
            world.record(What::RecoveryFailed {
                node: id,
                why: without_run_dir(&format!("palisade recover-counters failed: {e}"), dir),
            });
            Next::StayDown
        }
    }
}

/// `text` with the run's temporary directory (the parent of the node's `dir`) left out: the
/// record of a seed is the same on every run.
pub(crate) fn without_run_dir(text: &str, dir: &Path) -> String {
    match dir.parent() {
        Some(run) => text.replace(&run.display().to_string(), "<run>"),
        None => text.to_string(),
    }
}

/// Node `id` serves: if it was under recovery, the recovery took effect.
pub(crate) fn recovered(id: u64, world: &Shared) {
    let mut world = world.borrow_mut();
    if let Some((from, what)) = world.recovery.began.remove(&id) {
        let at = now();
        world.record_at(
            at,
            What::Recovered {
                node: id,
                from,
                what,
            },
        );
    }
}
