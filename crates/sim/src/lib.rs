//! A deterministic simulation of a Palisade cluster: the real server (openraft, the lock table,
//! the write-ahead log, tonic), the real client library and the fence's check at a resource,
//! on turmoil's simulated network and time, under faults chosen by one seed.
//!
//! One seed decides everything: turmoil's network and each host's tokio runtime, every random
//! draw of the server and the client (through [`palisade_clock::entropy`]), the workload and
//! the faults. Running a seed twice gives the same [`Report::trace`].
//!
//! A run has a *safety phase*, in which the nemesis ([`nemesis`]) injects faults while clients
//! take a lock and run read-modify-write sections at a fenced counter, and a *liveness phase*
//! in which every fault is healed and each client must again be granted the lock and write.
//! The record of the run ([`record`]) is then checked ([`check`]).

pub mod check;
pub mod clock;
pub mod nemesis;
pub mod net;
pub mod operator;
pub mod record;
mod workload;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use palisade_core::canary::{self, Canary};
use palisade_server::disk::{Disk, OnCrash};
use palisade_server::{Blocking, Platform, Server, ServerConfig};
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};

use crate::clock::DriftingClock;
use crate::record::{Event, What};

/// The port every simulated node listens on.
pub const PORT: u16 = 7457;

/// Nodes started empty, waiting to be added to the cluster by the operator's churn, each
/// under an id never used before.
pub const SPARE_NODES: usize = 4;

/// The lock every client takes.
pub const LOCK: &str = "sim/counter";

/// With [`Options::modes`]: the read-write lock, taken shared (readers) or exclusive (writers),
/// guarding a counter of its own.
pub const RW_LOCK: &str = "sim/rw";

/// With [`Options::modes`]: the semaphore, of [`POOL_PERMITS`] permits, each slot guarding a
/// counter of its own (the slot's scope at the resource).
pub const POOL_LOCK: &str = "sim/pool";

/// The size of [`POOL_LOCK`]: one less than the clients, so that a permit is sometimes waited
/// for.
pub const POOL_PERMITS: u32 = 2;

/// How a run is shaped.
#[derive(Debug, Clone)]
pub struct Options {
    /// Voting members of the cluster.
    pub nodes: usize,
    /// Clients, each a loop of acquire, read-modify-write at the resource, release.
    pub clients: usize,
    /// How long the nemesis injects faults.
    pub safety: Duration,
    /// How long after the healing every client must still be granted the lock and write.
    pub liveness: Duration,
    /// Whether the nemesis runs at all.
    pub faults: bool,
    /// A known bug switched back on for the run, which the checker must catch.
    pub canary: Option<Canary>,
    /// Whether the operator also carries out recoveries ([`operator`]): the token floor
    /// raised, backups, a disaster and a restore, a log lost or rolled back.
    pub recoveries: bool,
    /// Whether the clients also take the read-write lock ([`RW_LOCK`]: readers claim, and try
    /// a write the fence must refuse) and the semaphore ([`POOL_LOCK`]), beside the mutex,
    /// and now and then the mutex and the read-write lock at once (a multi-lock).
    pub modes: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            clients: 3,
            safety: Duration::from_secs(20),
            liveness: Duration::from_secs(15),
            faults: true,
            canary: None,
            recoveries: false,
            modes: false,
        }
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    /// Everything that happened, one line per event.
    pub trace: Vec<String>,
    /// What the checker found wrong; empty for a passing run.
    pub violations: Vec<String>,
    /// Faults injected.
    pub faults: usize,
    /// Client operations completed (acquires, releases, reads of the lock, resource
    /// operations).
    pub operations: usize,
    /// The mutex's counter's final value: one per accepted read-modify-write.
    pub counter: u64,
    /// Simulated time the run took.
    pub simulated: Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What the hosts of one run share: the record, the resource, the clocks the nemesis moves.
pub(crate) struct World {
    pub(crate) events: Vec<Event>,
    pub(crate) resource: palisade_fence::MemoryResource<u64>,
    /// The counter of [`RW_LOCK`], and one per slot of [`POOL_LOCK`].
    pub(crate) rw: palisade_fence::MemoryResource<u64>,
    pub(crate) pool: Vec<palisade_fence::MemoryResource<u64>>,
    pub(crate) keys: Option<palisade_sequencer::KeySet>,
    pub(crate) client_clocks: BTreeMap<usize, DriftingClock>,
    /// Per client: the simulated time of its last accepted write (or a reader's claim).
    pub(crate) last_write: BTreeMap<usize, Duration>,
    /// Per node: the operator's orders it has not looked at yet.
    pub(crate) orders: BTreeMap<u64, Vec<operator::Order>>,
    /// The voters, as the operator's changes left them.
    pub(crate) members: BTreeSet<u64>,
    /// Nodes whose data directory is wiped when they next start (`node-id-reuse` canary).
    pub(crate) wiped: BTreeSet<u64>,
    /// Per node that believes it leads: the term it leads, as its operator last looked.
    pub(crate) leading: BTreeMap<u64, u64>,
    /// The nemesis's cuts of the leader from every other node: when each began, and when it
    /// was healed (`None` while it lasts).
    pub(crate) leader_cuts: Vec<(Duration, Option<Duration>)>,
    /// When each client's answers were lost on purpose (`workload::lose_answers`): the client,
    /// from, until.
    pub(crate) answers_lost: Vec<(usize, Duration, Duration)>,
    /// The operator's recoveries ([`operator`]): the last backup taken, the node that restores
    /// it when it next starts, the logs lost when their nodes next start, when each node's
    /// recovery began, and the nodes gone for good (a lost cluster's, a replaced member).
    pub(crate) recovery: operator::Recoveries,
}

pub(crate) type Shared = Rc<RefCell<World>>;

impl World {
    pub(crate) fn record(&mut self, what: What) -> usize {
        self.record_at(now(), what)
    }

    /// Records `what` at `at`: the nemesis, which runs between the simulation's steps, outside
    /// any host, passes the simulation's time.
    pub(crate) fn record_at(&mut self, at: Duration, what: What) -> usize {
        self.events.push(Event { at, what });
        self.events.len() - 1
    }
}

/// Simulated time since the run began.
pub(crate) fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The wall clock every simulated machine reads (through [`palisade_clock::wall`]), in
/// milliseconds since 1970, when a run begins: 2027-01-15. It then follows simulated time.
pub const WALL_CLOCK_START_MS: u64 = 1_800_000_000_000;

/// The simulated wall clock: where the server places its counters' floors and stamps backups.
fn wall_ms() -> u64 {
    WALL_CLOCK_START_MS + u64::try_from(now().as_millis()).unwrap_or(u64::MAX / 2)
}

/// The name of node `id` on the simulated network.
pub fn node_name(id: u64) -> String {
    format!("n{id}")
}

/// Runs `seed` and checks what happened.
pub fn run(seed: u64, options: &Options) -> Report {
    palisade_clock::entropy::seed_thread(Some(seed));
    palisade_clock::wall::simulate_thread(Some(wall_ms));
    canary::set(options.canary);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x005e_ed0f_fa17);
    let dir = tempfile::tempdir().expect("a temporary directory for the nodes' data");
    let end = options.safety + options.liveness;
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(end + Duration::from_secs(60))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(Duration::from_millis(rng.random_range(1..=20)))
        .tcp_capacity(1 << 16)
        .build();
    let world: Shared = Rc::new(RefCell::new(World {
        events: Vec::new(),
        resource: palisade_fence::MemoryResource::bound_to(LOCK, 0),
        rw: palisade_fence::MemoryResource::bound_to(RW_LOCK, 0),
        pool: pool_resources(),
        keys: None,
        client_clocks: BTreeMap::new(),
        last_write: BTreeMap::new(),
        orders: BTreeMap::new(),
        members: (1..=options.nodes as u64).collect(),
        wiped: BTreeSet::new(),
        leading: BTreeMap::new(),
        leader_cuts: Vec::new(),
        answers_lost: Vec::new(),
        recovery: operator::Recoveries::default(),
    }));
    let members: BTreeMap<u64, String> = (1..=options.nodes as u64)
        .map(|id| (id, format!("{}:{PORT}", node_name(id))))
        .collect();
    let hosts = (options.nodes + SPARE_NODES) as u64;
    for id in 1..=hosts {
        let data_dir = dir.path().join(node_name(id));
        // The spares start empty and wait to be added.
        let members = (id <= options.nodes as u64).then(|| members.clone());
        let world = world.clone();
        // Within what the client's lease accounting allows for (0.2 % between two clocks).
        let drift_ppm = rng.random_range(-900..=900);
        let offset = Duration::from_millis(rng.random_range(0..=30_000));
        let clock = DriftingClock::new(offset, drift_ppm);
        sim.host(node_name(id), move || {
            node(
                id,
                data_dir.clone(),
                members.clone(),
                clock.clone(),
                world.clone(),
            )
        });
    }
    // Clients know every node that may become a member.
    let endpoints: Vec<String> = (1..=hosts)
        .map(|id| format!("http://{}:{PORT}", node_name(id)))
        .collect();
    for client in 1..=options.clients {
        let drift_ppm = rng.random_range(-900..=900);
        let plan = workload::Plan {
            client,
            endpoints: endpoints.clone(),
            drift_ppm,
            stop_at: end,
            faults_until: options.safety,
            seed: rng.random(),
            modes: options.modes,
        };
        sim.client(format!("c{client}"), workload::run(plan, world.clone()));
    }
    let mut nemesis = nemesis::Nemesis::new(
        rng.random(),
        options.nodes,
        options.clients,
        options.safety,
        options.faults,
        options.canary == Some(Canary::NodeIdReuse),
        options.recoveries,
    );
    let mut failure = None;
    loop {
        // A panic in a host (an assertion of openraft's, say) ends the run as a failure of the
        // seed, with its record, instead of the process.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.step()));
        match step {
            Ok(Ok(true)) => break,
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                failure = Some(format!("the simulation stopped: {e}"));
                break;
            }
            Err(panic) => {
                failure = Some(format!("a host panicked: {}", panic_message(&*panic)));
                break;
            }
        }
        nemesis.step(&mut sim, &world);
    }
    let simulated = sim.elapsed();
    // Tearing down hosts a panic left behind may panic again: nothing more to learn there.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(sim)));
    palisade_clock::entropy::seed_thread(None);
    palisade_clock::wall::simulate_thread(None);
    canary::set(None);
    let counter = world.borrow().resource.read(|v| *v).unwrap_or_default();
    let finals = finals(&world.borrow());
    let world = match Rc::try_unwrap(world) {
        Ok(world) => world.into_inner(),
        // Only after a panic: some host's task still holds the world.
        Err(world) => {
            let world = world.borrow();
            World {
                events: world.events.clone(),
                resource: palisade_fence::MemoryResource::bound_to(LOCK, 0),
                rw: palisade_fence::MemoryResource::bound_to(RW_LOCK, 0),
                pool: pool_resources(),
                keys: None,
                client_clocks: BTreeMap::new(),
                last_write: world.last_write.clone(),
                orders: BTreeMap::new(),
                members: world.members.clone(),
                wiped: BTreeSet::new(),
                leading: BTreeMap::new(),
                leader_cuts: world.leader_cuts.clone(),
                answers_lost: world.answers_lost.clone(),
                recovery: operator::Recoveries::default(),
            }
        }
    };
    let mut violations = check::check(&world.events, &finals);
    violations.extend(check::sequencers(&world.events));
    violations.extend(check::liveness(
        &world.last_write,
        options.clients,
        options.safety,
    ));
    violations.extend(check::waiters_learn_during_leader_cuts(
        &world.events,
        &world.leader_cuts,
        &world.answers_lost,
        options.safety,
    ));
    violations.extend(failure);
    let operations = world
        .events
        .iter()
        .filter(|e| {
            matches!(
                e.what,
                What::AcquireCompleted { .. }
                    | What::ReleaseCompleted { .. }
                    | What::ReadCompleted { .. }
                    | What::Resource { .. }
            )
        })
        .count();
    Report {
        seed,
        trace: world.events.iter().map(ToString::to_string).collect(),
        violations,
        faults: nemesis.injected(),
        operations,
        counter,
        simulated,
    }
}

/// One counter per slot of [`POOL_LOCK`], each bound to its slot.
fn pool_resources() -> Vec<palisade_fence::MemoryResource<u64>> {
    (0..POOL_PERMITS)
        .map(|slot| {
            let binding = palisade_sequencer::binding(POOL_LOCK, palisade_core::Access::Slot(slot));
            palisade_fence::MemoryResource::bound_to(binding.into_owned(), 0)
        })
        .collect()
}

/// Every counter's final value, by its scope (the fence binding of its grants).
fn finals(world: &World) -> BTreeMap<String, u64> {
    let value = |r: &palisade_fence::MemoryResource<u64>| r.read(|v| *v).unwrap_or_default();
    let mut finals = BTreeMap::from([(LOCK.to_string(), value(&world.resource))]);
    if world
        .events
        .iter()
        .any(|e| matches!(&e.what, What::AcquireInvoked { lock, .. } if lock != LOCK))
    {
        finals.insert(RW_LOCK.to_string(), value(&world.rw));
        for (slot, resource) in (0..).zip(&world.pool) {
            let binding = palisade_sequencer::binding(POOL_LOCK, palisade_core::Access::Slot(slot));
            finals.insert(binding.into_owned(), value(resource));
        }
    }
    finals
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "(no message)".to_string())
}

/// One start of node `id`: recovers its data directory, or bootstraps the cluster with
/// `members` (or, without them, waits to be added), carries out the operator's orders, and
/// serves until the simulation crashes the host or the node is removed.
async fn node(
    id: u64,
    data_dir: PathBuf,
    members: Option<BTreeMap<u64, String>>,
    clock: DriftingClock,
    world: Shared,
) -> turmoil::Result {
    if world.borrow().recovery.retired.contains(&id) {
        // Gone for good: its machine stays off.
        return std::future::pending().await;
    }
    // Wiped by the operator (the `node-id-reuse` canary): an empty directory under the old id,
    // waiting to be added, as `palisade serve --join --node-id <old id>` would start.
    let members = if world.borrow_mut().wiped.remove(&id) {
        std::fs::remove_dir_all(&data_dir)?;
        None
    } else {
        members
    };
    // The operator's recoveries: a backup restored here, or this node's log lost.
    // A node restored or recovered alone is started as `palisade serve` starts a single node,
    // then and at every restart: its command line has no `--join`.
    let single = BTreeMap::from([(id, format!("{}:{PORT}", node_name(id)))]);
    let members = if operator::restore_here(id, &data_dir, &world)?
        || world.borrow().recovery.alone.contains(&id)
    {
        Some(single.clone())
    } else {
        members
    };
    let lost = operator::lose_log_here(id, &data_dir, &world)?;
    let server = match start(id, &data_dir, members.clone(), &clock).await {
        Ok(server) => server,
        Err(refused) if lost => {
            // The refused process exits: what its start opened (the directory's lock) closes.
            tokio::time::sleep(Duration::from_millis(100)).await;
            match operator::recover_counters(id, &data_dir, &refused, &world) {
                operator::Next::StartAgain => {}
                operator::Next::StayDown => return std::future::pending().await,
            }
            // Recovered: a single voter, or `recover-counters` would have refused.
            world.borrow_mut().recovery.alone.insert(id);
            match start(id, &data_dir, Some(single), &clock).await {
                Ok(server) => server,
                Err(e) => {
                    world.borrow_mut().record(What::RecoveryFailed {
                        node: id,
                        why: operator::without_run_dir(
                            &format!("after recover-counters the start failed again: {e}"),
                            &data_dir,
                        ),
                    });
                    return std::future::pending().await;
                }
            }
        }
        Err(e) => return Err(e.into()),
    };
    operator::recovered(id, &world);
    tokio::task::spawn_local(operator::carry_out(id, server.node().clone(), world));
    server.run_until(std::future::pending()).await?;
    Ok(())
}

/// Starts node `id` on `data_dir`: its error with every cause, as `palisade serve` prints it.
async fn start(
    id: u64,
    data_dir: &std::path::Path,
    members: Option<BTreeMap<u64, String>>,
    clock: &DriftingClock,
) -> Result<Server, String> {
    let listener = net::listen(PORT).await.map_err(|e| e.to_string())?;
    let config = ServerConfig {
        data_dir: data_dir.to_path_buf(),
        listen: listener.local_addr(),
        metrics_listen: None,
        ui_listen: None,
        lock_delay: Duration::ZERO,
        node_id: id,
        advertise: Some(format!("{}:{PORT}", node_name(id))),
        join: members.is_none(),
        initial_cluster: members,
        tokens_file: None,
        policy_file: None,
        insecure_listen_any: false,
        tls: None,
        insecure_peers: false,
        connections: Default::default(),
        ui_hosts: Vec::new(),
    };
    let platform = Platform {
        clock: clock.shared(),
        listener: Some(listener),
        dialer: Some(net::dialer()),
        blocking: Blocking::Inline,
        // A crash loses what the log did not sync, page by page.
        disk: Disk::volatile(OnCrash::TearPages),
    };
    Server::start_on(&config, platform).await.map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    })
}
