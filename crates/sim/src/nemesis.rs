//! The nemesis: faults chosen by the run's seed, injected during the safety phase, each healed
//! after a while, and all healed when the liveness phase begins.
//!
//! - partitions: a node cut off from all others (a minority), with four or more nodes a split
//!   of several nodes from the majority, one link cut (a bridge through the others), a link cut
//!   one way, a client cut off from one node;
//! - delays: the messages of a link held and then released at once (late, in a burst), a slow
//!   link;
//! - a node crashed and restarted from its data directory;
//! - a node paused: nothing in or out of it for a while, then everything queued arrives;
//! - a client's clock jumping forward.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::seq::IndexedRandom as _;
use rand::{RngExt as _, SeedableRng as _};

use crate::record::What;
use crate::{Shared, node_name};

/// Most faults in effect at once.
const ACTIVE_MAX: usize = 2;

#[derive(Debug)]
pub struct Nemesis {
    rng: SmallRng,
    nodes: usize,
    clients: usize,
    safety_end: Duration,
    enabled: bool,
    next_at: Duration,
    active: Vec<(Duration, Undo, String)>,
    injected: usize,
    healed: bool,
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
    Nothing,
}

impl Nemesis {
    pub fn new(
        seed: u64,
        nodes: usize,
        clients: usize,
        safety_end: Duration,
        enabled: bool,
    ) -> Nemesis {
        Nemesis {
            rng: SmallRng::seed_from_u64(seed),
            nodes,
            clients,
            safety_end,
            enabled,
            next_at: Duration::from_secs(2),
            active: Vec::new(),
            injected: 0,
            healed: false,
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

    fn node(&mut self) -> String {
        node_name(self.rng.random_range(1..=self.nodes as u64))
    }

    fn two_nodes(&mut self) -> (String, String) {
        let ids: Vec<u64> = (1..=self.nodes as u64).collect();
        let pair: Vec<u64> = ids.sample(&mut self.rng, 2).copied().collect();
        (node_name(pair[0]), node_name(pair[1]))
    }

    fn inject(&mut self, sim: &mut turmoil::Sim<'_>, world: &Shared) -> (Undo, String) {
        // A split into a minority and a majority of several nodes needs four or more.
        let kinds = if self.nodes >= 4 { 10 } else { 9 };
        match self.rng.random_range(0..kinds) {
            0 => {
                let cut = self.node();
                let mut links = Vec::new();
                for id in 1..=self.nodes as u64 {
                    let other = node_name(id);
                    if other != cut {
                        sim.partition(cut.as_str(), other.as_str());
                        links.push((cut.clone(), other));
                    }
                }
                let fault = format!("{cut} cut off from the other nodes");
                (Undo::RepairAll(links), fault)
            }
            1 => {
                let (a, b) = self.two_nodes();
                sim.partition(a.as_str(), b.as_str());
                let fault = format!("link {a} - {b} cut");
                (Undo::Repair(a, b), fault)
            }
            2 => {
                let (a, b) = self.two_nodes();
                sim.partition_oneway(a.as_str(), b.as_str());
                let fault = format!("link {a} -> {b} cut one way");
                (Undo::RepairOneway(a, b), fault)
            }
            3 => {
                let client = format!("c{}", self.rng.random_range(1..=self.clients));
                let node = self.node();
                sim.partition(client.as_str(), node.as_str());
                let fault = format!("client {client} cut off from {node}");
                (Undo::Repair(client, node), fault)
            }
            4 => {
                let (a, b) = self.two_nodes();
                sim.hold(a.as_str(), b.as_str());
                let fault = format!("messages between {a} and {b} held");
                (Undo::Release(vec![(a, b)]), fault)
            }
            5 => {
                let (a, b) = self.two_nodes();
                let latency = Duration::from_millis(self.rng.random_range(20..=400));
                sim.set_link_latency(a.as_str(), b.as_str(), latency);
                let fault = format!("link {a} - {b} slowed to {latency:?}");
                (Undo::Latency(a, b), fault)
            }
            6 => {
                let node = self.node();
                sim.crash(node.as_str());
                let fault = format!("{node} crashed");
                (Undo::Bounce(node), fault)
            }
            7 => {
                let node = self.node();
                let mut links = Vec::new();
                let others = (1..=self.nodes as u64)
                    .map(node_name)
                    .chain((1..=self.clients).map(|c| format!("c{c}")))
                    .filter(|other| *other != node);
                for other in others {
                    sim.hold(node.as_str(), other.as_str());
                    links.push((node.clone(), other));
                }
                let fault = format!("{node} paused");
                (Undo::Release(links), fault)
            }
            9 => {
                let ids: Vec<u64> = (1..=self.nodes as u64).collect();
                let minority: Vec<u64> =
                    ids.sample(&mut self.rng, self.nodes / 2).copied().collect();
                let mut links = Vec::new();
                for &a in &minority {
                    for b in ids.iter().filter(|b| !minority.contains(b)) {
                        sim.partition(node_name(a).as_str(), node_name(*b).as_str());
                        links.push((node_name(a), node_name(*b)));
                    }
                }
                let names: Vec<String> = minority.iter().map(|&id| node_name(id)).collect();
                let fault = format!("{} split from the majority", names.join(","));
                (Undo::RepairAll(links), fault)
            }
            _ => {
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
        Undo::Nothing => {}
    }
}
