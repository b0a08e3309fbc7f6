//! The operator: what an administrator does to a running cluster, asked for by the nemesis
//! and carried out inside the nodes' hosts through the server's own calls (those behind
//! `palisade cluster add|remove`, and openraft's triggers):
//!
//! - membership churn: a node with a fresh id and a new data directory added as a voter, a
//!   member removed, keeping between three and five voters;
//! - leadership handed from the leader to another member;
//! - a snapshot of every node's state machine, and its log purged up to it, so that a node
//!   that falls behind afterwards catches up from the snapshot.
//!
//! An order goes to every member; only the node that believes it leads carries out those that
//! need a leader, and a stale leader's attempt fails as it would for an administrator.

use std::sync::Arc;
use std::time::Duration;

use palisade_server::node::Node;

use crate::record::What;
use crate::{PORT, Shared, node_name};

/// How often a node looks for orders.
const POLL: Duration = Duration::from_millis(50);
/// How long after a snapshot is asked for its log is purged.
const PURGE_AFTER: Duration = Duration::from_millis(300);

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
        _ => {}
    }
}
