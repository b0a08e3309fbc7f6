//! The nemesis: faults chosen by the run's seed, injected during the safety phase, each healed
//! after a while, and all healed when the liveness phase begins.
//!
//! - partitions: a node cut off from all others (a minority), with four or more nodes a split
//!   of several nodes from the majority, one link cut (a bridge through the others), a link cut
//!   one way, a client cut off from one node, or only the answers of one node to a client lost
//!   (its requests are carried out);
//! - delays: the messages of a link held and then released at once (late, in a burst), a slow
//!   link;
//! - a node crashed and restarted from its data directory;
//! - a node paused: nothing in or out of it for a while, then everything queued arrives;
//! - the leader cut off from every other node for longer than an election, alone (what else is
//!   in effect is healed first), while its clients still reach it: drawn from a generator of its
//!   own, so that a run without one injects what it did before; the checker expects a waiter
//!   queued there to learn its grant elsewhere
//!   ([`crate::check::waiters_learn_during_leader_cuts`]);
//! - a lossy link: each message lost with some probability, which stalls the TCP connection
//!   it belonged to (turmoil does not retransmit), as a dead connection does;
//! - a client's clock jumping forward;
//! - the operator's work ([`crate::operator`]): a node with a fresh id added, a member removed
//!   (between three and five voters), leadership handed to another member, a snapshot and a
//!   purge of the log on every node; under the `node-id-reuse` canary only, instead of the
//!   churn, a member's data directory wiped and the node restarted empty under its id;
//! - with [`crate::Options::recoveries`], the operator's recoveries, on a schedule of their
//!   own (drawn from a generator of their own, so the other faults of a seed stay as they were
//!   until the first recovery): the
//!   token floor raised and a backup taken early in the run; then, in half of the runs each, a
//!   disaster (every member lost, the backup restored into a spare) and a node's log lost or
//!   rolled back, with `recover-counters` or the member's replacement.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::seq::IndexedRandom as _;
use rand::{RngExt as _, SeedableRng as _};

use crate::operator::{LogLoss, Order};
use crate::record::What;
use crate::{SPARE_NODES, Shared, node_name};

/// Most faults in effect at once.
const ACTIVE_MAX: usize = 2;
/// The chance that an injection is a cut of the leader, and how long such a cut lasts: long
/// enough for a new leader to be elected and serve for a few seconds before the heal.
const LEADER_CUT_CHANCE: f64 = 0.1;
const LEADER_CUT_MS: std::ops::RangeInclusive<u64> = 7_500..=9_500;
/// Voters the operator's churn keeps the cluster between.
const VOTERS_MIN: usize = 3;
const VOTERS_MAX: usize = 5;

#[derive(Debug)]
pub struct Nemesis {
    rng: SmallRng,
    /// Draws the leader cuts, apart from `rng`.
    leader_cut_rng: SmallRng,
    /// The cut of the leader in effect, if any: nothing else is injected meanwhile.
    leader_cut: Option<LeaderCut>,
    /// Every node host, members or not.
    hosts: u64,
    /// The next spare node's id: ids are never used twice.
    next_spare: u64,
    clients: usize,
    safety_end: Duration,
    enabled: bool,
    next_at: Duration,
    active: Vec<(Duration, Undo, String)>,
    injected: usize,
    healed: bool,
    /// The `node-id-reuse` canary: the operator's churn wipes a member's data directory and
    /// restarts it under the same id instead of adding and removing members.
    reuse_ids: bool,
    /// When the operator's recoveries come.
    recoveries: Schedule,
}

/// When the operator raises the token floor and takes a backup (each asked again every
/// [`ASK_AGAIN`] until done), restores the backup after a disaster, and loses a node's log.
#[derive(Debug, Default)]
struct Schedule {
    raise_at: Option<Duration>,
    backup_at: Option<Duration>,
    disaster_at: Option<Duration>,
    lose_log_at: Option<(Duration, LogLoss)>,
    /// Whether the world was told to keep copies of the logs (for a rollback).
    told: bool,
    /// When to ask again for the removal of the members replaced.
    remove_at: Duration,
    /// Whether the members left after a replacement were found to be no majority.
    majority_lost: bool,
}

/// How long the operator waits before asking again for a raise or a backup not done yet, or
/// for the removal of a member replaced.
const ASK_AGAIN: Duration = Duration::from_secs(1);

impl Schedule {
    fn new(seed: u64, safety_end: Duration) -> Schedule {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x09e7_a70f_5eed);
        let ms = |fraction: f64| (safety_end.as_millis() as f64 * fraction) as u64;
        let mut at = |from: f64, to: f64| {
            Duration::from_millis(rng.random_range(ms(from)..=ms(to).max(ms(from))))
        };
        let raise_at = Some(at(0.05, 0.3));
        let backup_at = Some(at(0.05, 0.3));
        let disaster_at = at(0.35, 0.5);
        let lose_log_at = at(0.55, 0.7);
        let disaster = rng.random_bool(0.5);
        let lose = rng.random_bool(0.5);
        let loss = if rng.random_bool(0.5) {
            LogLoss::Deleted
        } else {
            LogLoss::RolledBack
        };
        Schedule {
            raise_at,
            backup_at,
            disaster_at: disaster.then_some(disaster_at),
            lose_log_at: lose.then_some((lose_log_at, loss)),
            told: false,
            remove_at: Duration::ZERO,
            majority_lost: false,
        }
    }
}

/// A cut of the leader in effect: when it is healed, the links cut, and its description.
#[derive(Debug)]
struct LeaderCut {
    until: Duration,
    links: Vec<(String, String)>,
    fault: String,
}

/// How a fault is healed.
#[derive(Debug)]
enum Undo {
    Repair(String, String),
    RepairAll(Vec<(String, String)>),
    RepairOneway(String, String),
    Release(Vec<(String, String)>),
    Bounce(String),
    Latency(String, String),
    Lossless(String, String),
    Nothing,
}

impl Nemesis {
    pub fn new(
        seed: u64,
        nodes: usize,
        clients: usize,
        safety_end: Duration,
        enabled: bool,
        reuse_ids: bool,
        recoveries: bool,
    ) -> Nemesis {
        Nemesis {
            rng: SmallRng::seed_from_u64(seed),
            leader_cut_rng: SmallRng::seed_from_u64(seed ^ 0x1ead_e2c0_7000),
            leader_cut: None,
            hosts: (nodes + SPARE_NODES) as u64,
            next_spare: nodes as u64 + 1,
            clients,
            safety_end,
            enabled,
            next_at: Duration::from_secs(2),
            active: Vec::new(),
            injected: 0,
            healed: false,
            reuse_ids,
            recoveries: if enabled && recoveries {
                Schedule::new(seed, safety_end)
            } else {
                Schedule::default()
            },
        }
    }

    /// Faults injected so far.
    pub fn injected(&self) -> usize {
        self.injected
    }

    /// Called after every step of the simulation.
    pub(crate) fn step(&mut self, sim: &mut turmoil::Sim<'_>, world: &Shared) {
        if !self.enabled {
            return;
        }
        let now = sim.elapsed();
        if let Some(cut) = &self.leader_cut
            && (cut.until <= now || now >= self.safety_end)
        {
            self.heal_leader_cut(sim, world, now);
        }
        if now >= self.safety_end {
            if !self.healed {
                self.healed = true;
                for (_, undo, fault) in std::mem::take(&mut self.active) {
                    heal(sim, undo);
                    world
                        .borrow_mut()
                        .record_at(now, What::Fault(format!("healed: {fault}")));
                }
                world.borrow_mut().record_at(
                    now,
                    What::Fault("every fault healed: liveness phase".into()),
                );
            }
            return;
        }
        self.operate(sim, world, now);
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].0 <= now {
                let (_, undo, fault) = self.active.remove(i);
                heal(sim, undo);
                world
                    .borrow_mut()
                    .record_at(now, What::Fault(format!("healed: {fault}")));
            } else {
                i += 1;
            }
        }
        if self.leader_cut.is_some() {
            return;
        }
        if now >= self.next_at
            && self.leader_cut_rng.random_bool(LEADER_CUT_CHANCE)
            && self.cut_leader(sim, world, now)
        {
            self.next_at = now + Duration::from_millis(self.rng.random_range(200..=2_000));
            return;
        }
        if now >= self.next_at && self.active.len() < ACTIVE_MAX {
            self.next_at = now + Duration::from_millis(self.rng.random_range(200..=2_000));
            let (undo, fault) = self.inject(sim, world);
            self.injected += 1;
            world
                .borrow_mut()
                .record_at(now, What::Fault(fault.clone()));
            let lasts = Duration::from_millis(self.rng.random_range(300..=5_000));
            self.active.push((now + lasts, undo, fault));
        }
    }

    /// Cuts the node that leads the highest term from every other node, if one is known to
    /// lead.
    fn cut_leader(&mut self, sim: &mut turmoil::Sim<'_>, world: &Shared, now: Duration) -> bool {
        let leader = world
            .borrow()
            .leading
            .iter()
            .max_by_key(|(_, term)| **term)
            .map(|(id, _)| *id);
        let Some(leader) = leader else {
            return false;
        };
        // Alone: what else is in effect is healed first.
        for (_, undo, fault) in std::mem::take(&mut self.active) {
            heal(sim, undo);
            world
                .borrow_mut()
                .record_at(now, What::Fault(format!("healed: {fault}")));
        }
        let cut = node_name(leader);
        let mut links = Vec::new();
        for other in self.others(&cut) {
            sim.partition(cut.as_str(), other.as_str());
            links.push((cut.clone(), other));
        }
        let lasts = Duration::from_millis(self.leader_cut_rng.random_range(LEADER_CUT_MS));
        let fault = format!("leader {cut} cut off from the other nodes for {lasts:?}");
        self.injected += 1;
        let mut world = world.borrow_mut();
        world.record_at(now, What::Fault(fault.clone()));
        world.leader_cuts.push((now, None));
        self.leader_cut = Some(LeaderCut {
            until: now + lasts,
            links,
            fault,
        });
        true
    }

    fn heal_leader_cut(&mut self, sim: &mut turmoil::Sim<'_>, world: &Shared, now: Duration) {
        let Some(LeaderCut { links, fault, .. }) = self.leader_cut.take() else {
            return;
        };
        heal(sim, Undo::RepairAll(links));
        let mut world = world.borrow_mut();
        world.record_at(now, What::Fault(format!("healed: {fault}")));
        if let Some((_, healed)) = world.leader_cuts.last_mut() {
            *healed = Some(now);
        }
    }

    /// The operator's recoveries that are due.
    fn operate(&mut self, sim: &mut turmoil::Sim<'_>, world: &Shared, now: Duration) {
        let plan = &mut self.recoveries;
        if !plan.told {
            plan.told = true;
            world.borrow_mut().recovery.keep_copies =
                matches!(plan.lose_log_at, Some((_, LogLoss::RolledBack)));
        }
        if let Some(at) = plan.raise_at.filter(|at| now >= *at) {
            if world.borrow().recovery.raised {
                plan.raise_at = None;
            } else {
                plan.raise_at = Some(at + ASK_AGAIN);
                Nemesis::order(world, Order::RaiseTokenFloor);
                world
                    .borrow_mut()
                    .record_at(now, What::Fault("asked: raise the token floor".into()));
            }
        }
        if let Some(at) = plan.backup_at.filter(|at| now >= *at) {
            if world.borrow().recovery.backup.is_some() {
                // Done, unless a raise still to come makes the operator take another.
                plan.backup_at = plan.raise_at.map(|_| at + ASK_AGAIN);
            } else {
                plan.backup_at = Some(at + ASK_AGAIN);
                Nemesis::order(world, Order::Backup);
                world
                    .borrow_mut()
                    .record_at(now, What::Fault("asked: take a backup".into()));
            }
        }
        if plan.disaster_at.is_some_and(|at| now >= at) {
            plan.disaster_at = None;
            self.disaster(sim, world, now, "disaster");
        }
        let plan = &mut self.recoveries;
        if let Some((_, loss)) = plan.lose_log_at.filter(|(at, _)| now >= *at) {
            plan.lose_log_at = None;
            self.lose_log(sim, world, now, loss);
        }
        // A member replaced: removed as soon as a leader carries out the order.
        let replaced: Vec<u64> = {
            let world = world.borrow();
            world
                .members
                .intersection(&world.recovery.retired)
                .copied()
                .collect()
        };
        if !replaced.is_empty() && now >= self.recoveries.remove_at {
            self.recoveries.remove_at = now + ASK_AGAIN;
            let members = world.borrow().members.len();
            if 2 * (members - replaced.len()) <= members {
                // Those left are no majority: nothing can remove the replaced members, and the
                // cluster never commits again. The operator does what docs/cluster.md says for
                // a majority lost for good: the newest backup restored as a new cluster. Once:
                // without a backup or a spare, nothing else is left to do.
                if !self.recoveries.majority_lost {
                    self.recoveries.majority_lost = true;
                    let names: Vec<String> = replaced.iter().map(|&id| node_name(id)).collect();
                    let why = format!(
                        "majority lost for good ({} replaced, the rest are no majority of {members})",
                        names.join(",")
                    );
                    self.disaster(sim, world, now, &why);
                }
            } else {
                for id in replaced {
                    Nemesis::order(world, Order::Remove { id });
                }
            }
        }
    }

    /// Every member lost for good (`why`: a disaster, or a majority lost); the backup restored
    /// into a spare node, a new one-member cluster.
    fn disaster(&mut self, sim: &mut turmoil::Sim<'_>, world: &Shared, now: Duration, why: &str) {
        let asked = if world.borrow().recovery.backup.is_none() {
            format!("{why}: nothing done (no backup to restore)")
        } else if self.next_spare > self.hosts {
            format!("{why}: nothing done (no spare node to restore into)")
        } else {
            let spare = self.next_spare;
            self.next_spare += 1;
            let lost = Nemesis::members(world);
            for &id in &lost {
                sim.crash(node_name(id).as_str());
            }
            // None of them restarts.
            for (_, undo, _) in &mut self.active {
                if let Undo::Bounce(node) = undo
                    && lost.iter().any(|&id| node_name(id) == *node)
                {
                    *undo = Undo::Nothing;
                }
            }
            {
                let mut world = world.borrow_mut();
                world.members = [spare].into();
                world.recovery.retired.extend(lost.iter().copied());
                world.recovery.restore_into = Some(spare);
                world
                    .recovery
                    .began
                    .insert(spare, (now, "a restore of the backup".into()));
            }
            // Its waiting server stops; it starts again on the restored directory.
            sim.bounce(node_name(spare).as_str());
            self.injected += 1;
            let names: Vec<String> = lost.iter().map(|&id| node_name(id)).collect();
            format!(
                "{why}: {} lost for good; the last backup is restored into {}, a new \
                 one-member cluster",
                names.join(","),
                node_name(spare)
            )
        };
        world.borrow_mut().record_at(now, What::Fault(asked));
    }

    /// A member crashed, its log lost or rolled back when it restarts.
    fn lose_log(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        world: &Shared,
        now: Duration,
        loss: LogLoss,
    ) {
        let retired = world.borrow().recovery.retired.clone();
        let up: Vec<u64> = self
            .members_up(world)
            .into_iter()
            .filter(|id| !retired.contains(id))
            .collect();
        let Some(&id) = up.choose(&mut self.rng) else {
            world.borrow_mut().record_at(
                now,
                What::Fault("asked: nothing (no member up to lose its log)".into()),
            );
            return;
        };
        let node = node_name(id);
        sim.crash(node.as_str());
        {
            let mut world = world.borrow_mut();
            world.recovery.lose_log.insert(id, loss);
            let what = match loss {
                LogLoss::Deleted => "its log deleted",
                LogLoss::RolledBack => "its log rolled back",
            };
            world.recovery.began.insert(id, (now, what.into()));
        }
        self.injected += 1;
        let fault = format!("{node} crashed; its log is lost when it restarts");
        world
            .borrow_mut()
            .record_at(now, What::Fault(fault.clone()));
        let lasts = Duration::from_millis(self.rng.random_range(300..=2_000));
        self.active.push((now + lasts, Undo::Bounce(node), fault));
    }

    /// The members not crashed by a fault still in effect.
    fn members_up(&self, world: &Shared) -> Vec<u64> {
        let down: Vec<&String> = self
            .active
            .iter()
            .filter_map(|(_, undo, _)| match undo {
                Undo::Bounce(node) => Some(node),
                _ => None,
            })
            .collect();
        Nemesis::members(world)
            .into_iter()
            .filter(|&id| !down.contains(&&node_name(id)))
            .collect()
    }

    fn members(world: &Shared) -> Vec<u64> {
        world.borrow().members.iter().copied().collect()
    }

    fn node(&mut self, world: &Shared) -> String {
        let members = Nemesis::members(world);
        node_name(
            *members
                .choose(&mut self.rng)
                .expect("a cluster has members"),
        )
    }

    fn two_nodes(&mut self, world: &Shared) -> (String, String) {
        let members = Nemesis::members(world);
        let pair: Vec<u64> = members.sample(&mut self.rng, 2).copied().collect();
        match pair[..] {
            [a, b] => (node_name(a), node_name(b)),
            // A one-member cluster (restored): the member and another node.
            _ => {
                let one = node_name(pair[0]);
                let other = self
                    .others(&one)
                    .choose(&mut self.rng)
                    .cloned()
                    .expect("several node hosts");
                (one, other)
            }
        }
    }

    /// Every other node host, member or not.
    fn others(&self, node: &str) -> Vec<String> {
        (1..=self.hosts)
            .map(node_name)
            .filter(|other| other != node)
            .collect()
    }

    /// Sends `order` to every member.
    fn order(world: &Shared, order: Order) {
        let mut world = world.borrow_mut();
        let members: Vec<u64> = world.members.iter().copied().collect();
        for id in members {
            world.orders.entry(id).or_default().push(order);
        }
    }

    fn inject(&mut self, sim: &mut turmoil::Sim<'_>, world: &Shared) -> (Undo, String) {
        let voters = world.borrow().members.len();
        // A split into a minority and a majority of several nodes needs four or more.
        let kinds = if voters >= 4 { 14 } else { 13 };
        match self.rng.random_range(0..kinds) {
            0 => {
                let cut = self.node(world);
                let mut links = Vec::new();
                for other in self.others(&cut) {
                    sim.partition(cut.as_str(), other.as_str());
                    links.push((cut.clone(), other));
                }
                let fault = format!("{cut} cut off from the other nodes");
                (Undo::RepairAll(links), fault)
            }
            1 => {
                let (a, b) = self.two_nodes(world);
                sim.partition(a.as_str(), b.as_str());
                let fault = format!("link {a} - {b} cut");
                (Undo::Repair(a, b), fault)
            }
            2 => {
                let (a, b) = self.two_nodes(world);
                sim.partition_oneway(a.as_str(), b.as_str());
                let fault = format!("link {a} -> {b} cut one way");
                (Undo::RepairOneway(a, b), fault)
            }
            3 => {
                let client = format!("c{}", self.rng.random_range(1..=self.clients));
                let node = self.node(world);
                if self.rng.random_bool(0.5) {
                    sim.partition(client.as_str(), node.as_str());
                    let fault = format!("client {client} cut off from {node}");
                    (Undo::Repair(client, node), fault)
                } else {
                    // The requests arrive and are carried out; the answers are lost.
                    sim.partition_oneway(node.as_str(), client.as_str());
                    let fault = format!("answers of {node} to client {client} lost");
                    (Undo::RepairOneway(node, client), fault)
                }
            }
            4 => {
                let (a, b) = self.two_nodes(world);
                sim.hold(a.as_str(), b.as_str());
                let fault = format!("messages between {a} and {b} held");
                (Undo::Release(vec![(a, b)]), fault)
            }
            5 => {
                let (a, b) = self.two_nodes(world);
                let latency = Duration::from_millis(self.rng.random_range(20..=400));
                sim.set_link_latency(a.as_str(), b.as_str(), latency);
                let fault = format!("link {a} - {b} slowed to {latency:?}");
                (Undo::Latency(a, b), fault)
            }
            6 => {
                let up = self.members_up(world);
                // Another crash of a node that is down already would only restart it twice.
                let Some(&id) = up.choose(&mut self.rng) else {
                    return (
                        Undo::Nothing,
                        "asked: nothing (every member is down)".into(),
                    );
                };
                let node = node_name(id);
                sim.crash(node.as_str());
                let fault = format!("{node} crashed");
                (Undo::Bounce(node), fault)
            }
            7 => {
                let node = self.node(world);
                let mut links = Vec::new();
                let others = self
                    .others(&node)
                    .into_iter()
                    .chain((1..=self.clients).map(|c| format!("c{c}")));
                for other in others {
                    sim.hold(node.as_str(), other.as_str());
                    links.push((node.clone(), other));
                }
                let fault = format!("{node} paused");
                (Undo::Release(links), fault)
            }
            8 => {
                let client = self.rng.random_range(1..=self.clients);
                let by = Duration::from_millis(self.rng.random_range(100..=3_000));
                if let Some(clock) = world.borrow().client_clocks.get(&client) {
                    clock.jump(by);
                }
                (
                    Undo::Nothing,
                    format!("clock of c{client} jumped forward {by:?}"),
                )
            }
            9 => {
                let (a, b) = self.two_nodes(world);
                let rate = self.rng.random_range(0.01..=0.2);
                sim.set_link_fail_rate(a.as_str(), b.as_str(), rate);
                let fault = format!("link {a} - {b} loses {:.0} % of messages", rate * 100.0);
                (Undo::Lossless(a, b), fault)
            }
            // A one-member cluster (restored) has no one to hand its leadership to.
            10 if voters == 1 => (
                Undo::Nothing,
                "asked: nothing (one member, no one to hand leadership to)".into(),
            ),
            10 => {
                let to = self.node(world);
                let id = to[1..].parse().expect("node names are n<id>");
                Nemesis::order(world, Order::TransferLeader { to: id });
                (Undo::Nothing, format!("asked: leadership to {to}"))
            }
            11 => {
                Nemesis::order(world, Order::SnapshotAndPurge);
                (Undo::Nothing, "asked: snapshot and purge the log".into())
            }
            12 if self.reuse_ids => {
                let node = self.node(world);
                let id = node[1..].parse().expect("node names are n<id>");
                world.borrow_mut().wiped.insert(id);
                sim.crash(node.as_str());
                let fault =
                    format!("{node} crashed, its data directory wiped, restarted under its id");
                (Undo::Bounce(node), fault)
            }
            12 => {
                let grow =
                    voters <= VOTERS_MIN || (voters < VOTERS_MAX && self.rng.random_bool(0.5));
                if grow && self.next_spare <= self.hosts {
                    let id = self.next_spare;
                    self.next_spare += 1;
                    Nemesis::order(world, Order::Add { id });
                    (Undo::Nothing, format!("asked: add {}", node_name(id)))
                } else if voters > VOTERS_MIN {
                    let gone = self.node(world);
                    let id = gone[1..].parse().expect("node names are n<id>");
                    Nemesis::order(world, Order::Remove { id });
                    (Undo::Nothing, format!("asked: remove {gone}"))
                } else {
                    (Undo::Nothing, "asked: nothing (no spare node left)".into())
                }
            }
            _ => {
                let members = Nemesis::members(world);
                let minority: Vec<u64> = members
                    .sample(&mut self.rng, members.len() / 2)
                    .copied()
                    .collect();
                let mut links = Vec::new();
                for &a in &minority {
                    for b in members.iter().filter(|b| !minority.contains(b)) {
                        sim.partition(node_name(a).as_str(), node_name(*b).as_str());
                        links.push((node_name(a), node_name(*b)));
                    }
                }
                let names: Vec<String> = minority.iter().map(|&id| node_name(id)).collect();
                let fault = format!("{} split from the majority", names.join(","));
                (Undo::RepairAll(links), fault)
            }
        }
    }
}

fn heal(sim: &mut turmoil::Sim<'_>, undo: Undo) {
    match undo {
        Undo::Repair(a, b) => sim.repair(a.as_str(), b.as_str()),
        Undo::RepairOneway(a, b) => sim.repair_oneway(a.as_str(), b.as_str()),
        Undo::RepairAll(links) => {
            for (a, b) in links {
                sim.repair(a.as_str(), b.as_str());
            }
        }
        Undo::Release(links) => {
            for (a, b) in links {
                sim.release(a.as_str(), b.as_str());
            }
        }
        Undo::Bounce(node) => sim.bounce(node.as_str()),
        Undo::Latency(a, b) => sim.set_link_latency(a.as_str(), b.as_str(), Duration::ZERO),
        Undo::Lossless(a, b) => sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0),
        Undo::Nothing => {}
    }
}
