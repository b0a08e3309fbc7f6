//! The nemesis run: a three-node cluster of `palisade serve` processes and a fenced store
//! (`palisade store serve`), workers incrementing a counter in the store under `palisade lock`,
//! and a nemesis that `kill -9`s and restarts nodes, freezes (`SIGSTOP`) nodes and lock holders
//! past their lease, and cuts nodes off (network namespaces, with `PALISADE_TEST_NETNS=1`). What
//! the workers saw is recorded as a history and judged by `palisade-history`; the counter must
//! equal the acknowledged increments, give or take the writes of unknown outcome.
//!
//! Times are the machine's boot-time clock (`CLOCK_BOOTTIME`) as `/proc/uptime` shows it, in
//! hundredths of a second, read alike by the test and by the workers' shell: an invocation is
//! recorded at the tick it was read in (no later than it happened) and a completion one tick
//! later (no earlier), so the history never claims an order that did not hold.
//!
//! Every loop is bounded in count and time; the faults are drawn from a seed that is printed
//! (`NEMESIS_SEED` chooses it; it fixes the choice of faults, not the timing of processes).

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use palisade_core::{SessionId, Token};
use palisade_history::{Access, Action, ClientId, Grant, History, Op, Outcome, Reply};
use palisade_testkit::{LocalCluster, netns};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const LOCK: &str = "counter";
/// The holders' session lease: a frozen holder loses the lock after this.
const HOLDER_TTL: &str = "2s";
const HOLDER_TTL_NS: u64 = 2_000_000_000;
/// The drift bound given to the checker: every clock here is this machine's.
const DRIFT_BOUND_PPM: u32 = 10_000;
/// `/proc/uptime`'s resolution.
const TICK_NS: u64 = 10_000_000;

const WORKERS: usize = 3;
/// Critical sections per worker, at most.
const SECTIONS_PER_WORKER_MAX: usize = 150;
/// How long one `palisade lock` may take before the test kills it.
const SECTION_TIME_MAX: Duration = Duration::from_secs(40);
/// How long the nemesis injects faults, and how many at most.
const NEMESIS_TIME: Duration = Duration::from_secs(40);
const FAULTS_MAX: usize = 30;

/// One critical section, as a user writes it, logging each step with its time to `$D/log`:
/// the grant, a fenced read, a pause to think, the write of the value plus one.
const SECTION: &str = r#"
up() { read u _ < /proc/uptime; echo "$u"; }
echo $$ > "$D/pid"
echo "granted $(up) $PALISADE_TOKEN $PALISADE_SESSION" >> "$D/log"
echo "read $(up)" >> "$D/log"
v=$("$PAL" store get counter 2>> "$D/store.err"); rc=$?
echo "read-done $(up) $rc $v" >> "$D/log"
case $rc in 0) ;; 5) v=0 ;; *) exit 0 ;; esac
sleep 0.3
echo "write $(up) $((v + 1))" >> "$D/log"
"$PAL" store put counter $((v + 1)) --json > "$D/put.json" 2>> "$D/store.err"; rc=$?
echo "write-done $(up) $rc" >> "$D/log"
"#;

// ----- time -----

/// `/proc/uptime`'s first field (`SECONDS.HUNDREDTHS`) in nanoseconds.
fn parse_uptime(text: &str) -> u64 {
    let field = text.split_whitespace().next().expect("an uptime");
    let (seconds, hundredths) = field.split_once('.').expect("SECONDS.HUNDREDTHS");
    let seconds: u64 = seconds.parse().expect("whole seconds");
    let hundredths: u64 = hundredths.parse().expect("hundredths");
    assert_eq!(
        hundredths.to_string().len().max(2),
        2,
        "two digits: {field}"
    );
    seconds * 1_000_000_000 + hundredths * TICK_NS
}

/// Now, rounded down to the tick: a time no later than now.
fn now_ns() -> u64 {
    parse_uptime(&std::fs::read_to_string("/proc/uptime").expect("/proc/uptime"))
}

// ----- workers -----

/// A `palisade lock` a worker ran: its directory, and what the test saw of the process.
#[derive(Debug)]
struct Section {
    client: u64,
    dir: PathBuf,
    spawned_ns: u64,
    exited_ns: u64,
    /// `None`: killed by the test after [`SECTION_TIME_MAX`].
    code: Option<i32>,
}

/// The sections running now: `palisade lock`'s pid and directory, one slot per worker.
type Running = Arc<Mutex<Vec<Option<(u32, PathBuf)>>>>;

fn spawn_section(endpoints: &str, store: &str, dir: &Path) -> Child {
    std::fs::create_dir_all(dir).unwrap();
    palisade_testkit::command(BIN)
        .args(["--endpoint", endpoints, "lock", LOCK, "--ttl", HOLDER_TTL])
        .args([
            "--wait",
            "10s",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            SECTION,
        ])
        .env("D", dir)
        .env("PAL", BIN)
        .env("PALISADE_STORE", store)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .process_group(0)
        .spawn()
        .expect("spawn palisade lock")
}

/// Waits for `child`, or kills it (thawed first) after [`SECTION_TIME_MAX`].
fn wait_section(child: &mut Child) -> Option<i32> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if started.elapsed() > SECTION_TIME_MAX {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn worker(
    endpoints: String,
    store: String,
    base: PathBuf,
    index: usize,
    running: Running,
    stop: Arc<AtomicBool>,
) -> Vec<Section> {
    let mut sections = Vec::new();
    for iteration in 0..SECTIONS_PER_WORKER_MAX {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let dir = base.join(format!("w{index}-{iteration:03}"));
        let spawned_ns = now_ns();
        let mut child = spawn_section(&endpoints, &store, &dir);
        running.lock().unwrap()[index] = Some((child.id(), dir.clone()));
        let code = wait_section(&mut child);
        running.lock().unwrap()[index] = None;
        let exited_ns = now_ns() + TICK_NS;
        sections.push(Section {
            client: index as u64,
            dir,
            spawned_ns,
            exited_ns,
            code,
        });
        if code != Some(0) {
            // The cluster may be electing or a node down: do not spin.
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    sections
}

// ----- the history -----

/// The lines of a section's log, split in words.
fn log_lines(dir: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// The step of `log` named `name`: its words after the name.
fn step<'a>(log: &'a [Vec<String>], name: &str) -> Option<&'a [String]> {
    log.iter()
        .find(|words| words.first().is_some_and(|w| w == name))
        .map(|words| &words[1..])
}

/// What the counts of a run came to.
#[derive(Debug, Default)]
struct Tally {
    sections: usize,
    granted: usize,
    writes_acknowledged: i64,
    writes_stale: usize,
    writes_unknown: i64,
    reads_stale: usize,
}

/// Adds what one section did to `h`: the session's opening (as a renewal sent when
/// `palisade lock` started), the acquire, the fenced read, the write and the release.
fn record_section(h: &mut History, section: &Section, tally: &mut Tally) {
    tally.sections += 1;
    let client = ClientId(section.client);
    let log = log_lines(&section.dir);
    let acquire = Action::Acquire {
        lock: LOCK.into(),
        ttl_ns: HOLDER_TTL_NS,
    };
    let Some(granted) = step(&log, "granted") else {
        // Not granted: not acquired in time (75) or the service unreachable (69) did nothing;
        // anything else may have acquired it.
        let outcome = match section.code {
            Some(75 | 69) => Outcome::Failed,
            _ => Outcome::Unknown,
        };
        push(
            h,
            client,
            acquire,
            section.spawned_ns,
            section.exited_ns,
            outcome,
        );
        return;
    };
    tally.granted += 1;
    let granted_ns = parse_uptime(&granted[0]) + TICK_NS;
    let grant = Grant {
        token: Token::new(granted[1].parse().expect("PALISADE_TOKEN")),
        // PALISADE_SESSION is the session's credential, `<id>.<secret>`.
        session: SessionId::new(
            granted[2]
                .split_once('.')
                .map_or(granted[2].as_str(), |(id, _)| id)
                .parse()
                .expect("PALISADE_SESSION starts with the session id"),
        ),
    };
    let renew = Action::Renew {
        session: grant.session,
        ttl_ns: HOLDER_TTL_NS,
    };
    let renewed = Outcome::Ok(Reply::Renewed);
    push(h, client, renew, section.spawned_ns, granted_ns, renewed);
    let acquired = Outcome::Ok(Reply::Granted(grant));
    push(h, client, acquire, section.spawned_ns, granted_ns, acquired);

    let mut last_ns = granted_ns - TICK_NS;
    if let Some(read) = step(&log, "read") {
        let invoke_ns = parse_uptime(&read[0]);
        let (complete_ns, outcome) = match step(&log, "read-done") {
            Some(done) => {
                let outcome = match done[1].as_str() {
                    "0" => Outcome::Ok(Reply::Accepted {
                        value: Some(done[2].parse().expect("a counter")),
                        position: None,
                    }),
                    "5" => Outcome::Ok(Reply::Accepted {
                        value: None,
                        position: None,
                    }),
                    "3" => {
                        tally.reads_stale += 1;
                        Outcome::Ok(Reply::Stale)
                    }
                    "1" | "69" => Outcome::Failed,
                    _ => Outcome::Unknown,
                };
                last_ns = parse_uptime(&done[0]);
                (Some(last_ns + TICK_NS), outcome)
            }
            None => (None, Outcome::Unknown),
        };
        let action = store_access(Some(grant), Access::Read);
        push_op(h, client, action, invoke_ns, complete_ns, outcome);
    }
    if let Some(write) = step(&log, "write") {
        let invoke_ns = parse_uptime(&write[0]);
        let value: i64 = write[1].parse().expect("a counter");
        let (complete_ns, outcome) = match step(&log, "write-done") {
            Some(done) => {
                let outcome = match done[1].as_str() {
                    "0" => {
                        tally.writes_acknowledged += 1;
                        Outcome::Ok(Reply::Accepted {
                            value: None,
                            position: Some(revision(&section.dir)),
                        })
                    }
                    "3" => {
                        tally.writes_stale += 1;
                        Outcome::Ok(Reply::Stale)
                    }
                    "1" | "69" => Outcome::Failed,
                    _ => {
                        tally.writes_unknown += 1;
                        Outcome::Unknown
                    }
                };
                last_ns = parse_uptime(&done[0]);
                (Some(last_ns + TICK_NS), outcome)
            }
            None => {
                tally.writes_unknown += 1;
                (None, Outcome::Unknown)
            }
        };
        let action = store_access(Some(grant), Access::Write { value });
        push_op(h, client, action, invoke_ns, complete_ns, outcome);
    }
    // `palisade lock` releases once the section is gone, which is after its last step; it
    // reports a release that failed as a warning, or as a lost lock (76).
    let Some(code) = section.code else { return };
    let stderr = std::fs::read_to_string(section.dir.join("stderr")).unwrap_or_default();
    let outcome = if code == 0 && !stderr.contains("could not release") {
        Outcome::Ok(Reply::Released)
    } else {
        Outcome::Unknown
    };
    let release = Action::Release {
        lock: LOCK.into(),
        session: grant.session,
        token: grant.token,
    };
    push(h, client, release, last_ns, section.exited_ns, outcome);
}

/// The store revision `palisade store put --json` reported: the write's place in the store's
/// order of writes.
fn revision(dir: &Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("put.json")).unwrap();
    let ack: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("put --json printed {text:?}: {e}"));
    ack["revision"].as_u64().expect("a revision")
}

fn store_access(grant: Option<Grant>, access: Access) -> Action {
    Action::Resource {
        resource: "store".into(),
        scope: LOCK.into(),
        grant,
        access,
    }
}

fn push(
    h: &mut History,
    client: ClientId,
    action: Action,
    invoke: u64,
    complete: u64,
    outcome: Outcome,
) {
    push_op(h, client, action, invoke, Some(complete), outcome);
}

fn push_op(
    h: &mut History,
    client: ClientId,
    action: Action,
    invoke_ns: u64,
    complete_ns: Option<u64>,
    outcome: Outcome,
) {
    h.push(Op {
        client,
        action,
        invoke_ns,
        complete_ns,
        outcome,
    })
    .unwrap_or_else(|e| panic!("a bad record: {e}"));
}

// ----- the nemesis -----

/// A small deterministic generator for the faults.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low))
    }
}

#[derive(Debug, Default)]
struct Faults {
    kills: usize,
    node_pauses: usize,
    holder_pauses: usize,
    partitions: usize,
}

impl Faults {
    fn total(&self) -> usize {
        self.kills + self.node_pauses + self.holder_pauses + self.partitions
    }
}

/// Freezes a holder that has its grant and has not written yet, past its lease, then thaws
/// its section before its `palisade lock` (which would stop the section on finding the lock
/// lost). Returns whether it found one.
fn pause_holder(running: &Running, random: &mut XorShift) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    let holder = loop {
        let found = running
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .find_map(|(pid, dir)| {
                let log = log_lines(dir);
                let holding = step(&log, "granted").is_some() && step(&log, "write-done").is_none();
                let group = std::fs::read_to_string(dir.join("pid")).ok()?;
                let group: i32 = group.trim().parse().ok()?;
                holding.then_some((*pid, group))
            });
        if found.is_some() || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some((pid, group)) = holder else {
        return false;
    };
    let (lock, group) = (Pid::from_raw(pid as i32), Pid::from_raw(group));
    let _ = kill(lock, Signal::SIGSTOP);
    let _ = killpg(group, Signal::SIGSTOP);
    std::thread::sleep(random.millis(2_500, 4_000));
    let _ = killpg(group, Signal::SIGCONT);
    std::thread::sleep(random.millis(0, 300));
    let _ = kill(lock, Signal::SIGCONT);
    true
}

/// Injects faults one at a time, each healed before the next, for [`NEMESIS_TIME`] or
/// [`FAULTS_MAX`] faults.
fn nemesis(cluster: &mut LocalCluster, partitions: bool, running: &Running, seed: u64) -> Faults {
    let mut random = XorShift(seed | 1);
    let mut faults = Faults::default();
    let started = Instant::now();
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for attempts in 0..FAULTS_MAX {
        if started.elapsed() > NEMESIS_TIME {
            break;
        }
        std::thread::sleep(random.millis(500, 1_500));
        let id = ids[random.below(ids.len() as u64) as usize];
        // The kinds of fault take turns, so each comes up; which node and how long is drawn.
        let kinds = if partitions { 4 } else { 3 };
        match attempts % kinds {
            0 => {
                eprintln!("nemesis: kill -9 node {id}");
                cluster.node(id).process.kill9();
                std::thread::sleep(random.millis(300, 1_500));
                cluster.node(id).process.start();
                faults.kills += 1;
            }
            1 => {
                eprintln!("nemesis: freeze node {id}");
                cluster.node(id).process.pause();
                std::thread::sleep(random.millis(1_000, 3_000));
                cluster.node(id).process.resume();
                faults.node_pauses += 1;
            }
            2 => {
                if pause_holder(running, &mut random) {
                    eprintln!("nemesis: froze a holder past its lease");
                    faults.holder_pauses += 1;
                }
            }
            _ => {
                let others: Vec<u64> = ids.iter().copied().filter(|&o| o != id).collect();
                eprintln!("nemesis: cut node {id} off from {others:?}");
                let network = cluster.network();
                network
                    .cut(&[id], &others)
                    .unwrap_or_else(|e| panic!("{e}"));
                std::thread::sleep(random.millis(1_500, 3_000));
                network.heal().unwrap_or_else(|e| panic!("{e}"));
                faults.partitions += 1;
            }
        }
    }
    faults
}

// ----- the run -----

#[test]
fn a_counter_under_palisade_lock_survives_kills_pauses_and_partitions() {
    let partitions = netns::enabled("the nemesis's partitions");
    if !partitions {
        eprintln!("skipping: partition faults (kills and pauses still run)");
    }
    let seed = std::env::var("NEMESIS_SEED")
        .ok()
        .map(|s| s.parse().expect("NEMESIS_SEED is a number"))
        .unwrap_or_else(|| now_ns() ^ u64::from(std::process::id()));
    eprintln!("nemesis: seed {seed}");

    let mut cluster = if partitions {
        LocalCluster::start_in_namespaces(BIN, 3)
    } else {
        LocalCluster::start(BIN, 3)
    };
    let endpoints = cluster.endpoints();
    let pubkey = cluster.palisade(&endpoints, &["pubkey"]);
    pubkey.expect_success();
    let mut store = palisade_testkit::ServerProcess::store(
        BIN,
        cluster.dir().join("store"),
        pubkey.stdout.trim(),
    );
    store.start();
    let store_url = store.endpoint();
    let base = cluster.dir().join("sections");

    let running: Running = Arc::new(Mutex::new(vec![None; WORKERS]));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|index| {
            let (endpoints, store_url, base) = (endpoints.clone(), store_url.clone(), base.clone());
            let (running, stop) = (running.clone(), stop.clone());
            std::thread::spawn(move || worker(endpoints, store_url, base, index, running, stop))
        })
        .collect();
    let faults = nemesis(&mut cluster, partitions, &running, seed);
    stop.store(true, Ordering::Relaxed);
    let sections: Vec<Section> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("a worker"))
        .collect();

    // Everything has stopped: an observer reads the final value.
    let mut history = History::new(DRIFT_BOUND_PPM).unwrap();
    let mut tally = Tally::default();
    for section in &sections {
        record_section(&mut history, section, &mut tally);
    }
    let mut get = palisade_testkit::command(BIN);
    get.args(["store", "get", "--unfenced", "counter"])
        .env("PALISADE_STORE", &store_url);
    let read_ns = now_ns();
    let final_read = palisade_testkit::run(get);
    let counter: i64 = match final_read.code() {
        Some(0) => final_read.stdout.trim().parse().expect("a counter"),
        Some(5) => 0,
        _ => panic!("the final read failed: {final_read:?}"),
    };
    let read = store_access(None, Access::Read);
    let value = Outcome::Ok(Reply::Accepted {
        value: Some(counter),
        position: None,
    });
    push(
        &mut history,
        ClientId(WORKERS as u64),
        read,
        read_ns,
        now_ns() + TICK_NS,
        value,
    );

    let report = history.check();
    eprintln!(
        "nemesis: {} operations ({} sections, {} granted; writes: {} acknowledged, {} stale, \
         {} unknown; {} stale reads), faults injected: {} ({:?}), counter {counter}, verdict: {}",
        report.ops,
        tally.sections,
        tally.granted,
        tally.writes_acknowledged,
        tally.writes_stale,
        tally.writes_unknown,
        tally.reads_stale,
        faults.total(),
        faults,
        if report.is_clean() {
            "clean"
        } else {
            "VIOLATIONS"
        },
    );
    assert!(report.is_clean(), "seed {seed}: {report}");
    assert!(
        counter >= tally.writes_acknowledged
            && counter <= tally.writes_acknowledged + tally.writes_unknown,
        "the counter {counter} is not the {} acknowledged increments, plus at most {} of unknown \
         outcome ({tally:?})",
        tally.writes_acknowledged,
        tally.writes_unknown
    );
    assert!(
        tally.writes_acknowledged >= 10
            && faults.kills >= 1
            && faults.node_pauses >= 1
            && faults.holder_pauses >= 1
            && (faults.partitions >= 1 || !partitions),
        "too little happened to judge: {tally:?}, {faults:?}"
    );
}
