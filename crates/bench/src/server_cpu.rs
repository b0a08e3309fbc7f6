//! Server CPU time and context switches per lock operation, for every system a benchmark drives
//! (Palisade, etcd, ZooKeeper, Redis), read from `/proc` of each of its server processes — every
//! member of a cluster, not only the leader — at the start and at the end of the measured
//! window (after the warm-up, until the workload's clock stops).
//!
//! - **Lock operation**: one acquire or one release. An acquire+release cycle is two; the
//!   operations counted are those that *complete* inside the window, so the count matches the
//!   CPU spent in it (a cycle that straddles a boundary counts the half that ends inside).
//! - **CPU**: user + system time of the process from `/proc/PID/stat` (fields 14 and 15, in
//!   ticks of 1/100 s). For a whole process the kernel includes the time of threads that have
//!   exited, so nothing is lost.
//! - **Context switches**: `voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of every
//!   thread, from `/proc/PID/task/TID/status` (the kernel keeps these per thread only, and drops
//!   them when the thread exits). A thread present at both readings counts its difference; a
//!   thread that appeared inside the window counts all its switches (its whole life is in the
//!   window); a thread that exited inside the window loses what it did after the first reading
//!   (an undercount, reported as `threads_exited`); a thread born and gone inside the window is
//!   not seen at all.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::server_view::TICKS_PER_S;

/// Most server processes one target may name.
const PIDS_MAX: usize = 16;

/// `KIND=PID,PID,...`: the server processes of the targets of one kind (`--target-pids`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPids {
    /// The target kind, as [`crate::target::Target::kind`] names it.
    pub kind: &'static str,
    pub pids: Vec<u32>,
}

impl FromStr for TargetPids {
    type Err = String;

    fn from_str(text: &str) -> Result<TargetPids, String> {
        let (kind, pids) = text.split_once('=').ok_or_else(|| {
            format!(
                "invalid --target-pids {text:?}: expected KIND=PID,PID,... (e.g. etcd=41,42,43)"
            )
        })?;
        let kind = match kind {
            "palisade" => "palisade",
            "etcd" => "etcd",
            "zk" | "zookeeper" => "zookeeper",
            "redis" => "redis",
            _ => {
                return Err(format!(
                    "invalid --target-pids {text:?}: the kind must be palisade, etcd, zk or redis"
                ));
            }
        };
        let pids = pids
            .split(',')
            .map(|pid| match pid.trim().parse::<u32>() {
                Ok(pid) if pid > 0 => Ok(pid),
                _ => Err(format!(
                    "invalid --target-pids {text:?}: {pid:?} is not a process id"
                )),
            })
            .collect::<Result<Vec<u32>, String>>()?;
        if pids.len() > PIDS_MAX {
            return Err(format!(
                "invalid --target-pids {text:?}: at most {PIDS_MAX} processes per kind"
            ));
        }
        Ok(TargetPids { kind, pids })
    }
}

/// One reading of a set of server processes.
#[derive(Debug, Clone)]
pub struct Sample {
    at: Instant,
    processes: Vec<ProcessSample>,
}

#[derive(Debug, Clone, PartialEq)]
struct ProcessSample {
    pid: u32,
    cpu_ticks: u64,
    /// Each thread's context switches (voluntary + involuntary), by thread id.
    threads: BTreeMap<u32, u64>,
}

/// What the server processes of one target spent over the measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerCpu {
    pub pids: Vec<u32>,
    /// Between the two readings.
    pub window_s: f64,
    /// Lock operations (an acquire or a release) that completed inside the window.
    pub lock_operations: u64,
    /// User + system CPU time of all the processes.
    pub cpu_s: f64,
    /// CPU time per second of the window: 1.0 is one core busy.
    pub cpu_cores: f64,
    pub cpu_us_per_operation: Option<f64>,
    /// Voluntary + involuntary, summed over every thread of every process.
    pub context_switches: u64,
    pub context_switches_per_operation: Option<f64>,
    /// Threads at the end of the window, of all the processes.
    pub threads: usize,
    /// Threads that appeared inside the window (counted from their start).
    pub threads_started: usize,
    /// Threads that exited inside the window (their last switches are not counted).
    pub threads_exited: usize,
}

/// Reads every process in `pids`. Fails if one is gone or unreadable.
pub fn sample(pids: &[u32]) -> anyhow::Result<Sample> {
    let processes = pids
        .iter()
        .map(|&pid| read_process(pid))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Sample {
        at: Instant::now(),
        processes,
    })
}

fn read_process(pid: u32) -> anyhow::Result<ProcessSample> {
    let stat_path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&stat_path)
        .with_context(|| format!("server process {pid} is gone or not readable ({stat_path})"))?;
    let cpu_ticks = parse_stat_cpu_ticks(&stat)
        .with_context(|| format!("no CPU time in {stat_path}: {stat:?}"))?;
    let mut threads = BTreeMap::new();
    let tasks = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&tasks).with_context(|| format!("cannot list {tasks}"))? {
        let entry = entry.with_context(|| format!("cannot list {tasks}"))?;
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // A thread that exits between the listing and this read is simply not there.
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if let Some(switches) = parse_status_switches(&status) {
            threads.insert(tid, switches);
        }
    }
    Ok(ProcessSample {
        pid,
        cpu_ticks,
        threads,
    })
}

/// User plus system CPU time, in ticks, from the text of a `/proc/…/stat`.
pub(crate) fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses; the fields after its last
    // closing parenthesis are plain. utime and stime are fields 14 and 15, i.e. the 12th and
    // 13th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

/// Voluntary plus involuntary context switches, from the text of a `/proc/…/status`.
pub(crate) fn parse_status_switches(status: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
            .trim()
            .parse()
            .ok()
    };
    field("voluntary_ctxt_switches")?.checked_add(field("nonvoluntary_ctxt_switches")?)
}

/// What happened between `before` and `after` (two readings of the same processes), with
/// `lock_operations` completed in between.
pub fn over_window(before: &Sample, after: &Sample, lock_operations: u64) -> ServerCpu {
    let window_s = after.at.saturating_duration_since(before.at).as_secs_f64();
    let mut cpu_ticks = 0u64;
    let mut context_switches = 0u64;
    let (mut threads, mut threads_started, mut threads_exited) = (0, 0, 0);
    for end in &after.processes {
        let start = before.processes.iter().find(|p| p.pid == end.pid);
        let empty = BTreeMap::new();
        let start_threads = start.map_or(&empty, |p| &p.threads);
        cpu_ticks += end
            .cpu_ticks
            .saturating_sub(start.map_or(0, |p| p.cpu_ticks));
        for (tid, switches) in &end.threads {
            match start_threads.get(tid) {
                Some(earlier) => context_switches += switches.saturating_sub(*earlier),
                None => {
                    context_switches += switches;
                    threads_started += 1;
                }
            }
        }
        threads += end.threads.len();
        threads_exited += start_threads
            .keys()
            .filter(|tid| !end.threads.contains_key(tid))
            .count();
    }
    let cpu_s = cpu_ticks as f64 / TICKS_PER_S;
    let per_operation = |total: f64| (lock_operations > 0).then(|| total / lock_operations as f64);
    ServerCpu {
        pids: after.processes.iter().map(|p| p.pid).collect(),
        window_s,
        lock_operations,
        cpu_s,
        cpu_cores: if window_s > 0.0 {
            cpu_s / window_s
        } else {
            0.0
        },
        cpu_us_per_operation: per_operation(cpu_s * 1e6),
        context_switches,
        context_switches_per_operation: per_operation(context_switches as f64),
        threads,
        threads_started,
        threads_exited,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A `/proc/PID/stat` of a process whose name has a space and a parenthesis in it, with
    /// utime 1234 and stime 56.
    const STAT: &str = "4242 (my (odd) server) S 1 4242 4242 0 -1 4194560 2047 0 0 0 \
                        1234 56 0 0 20 0 7 0 123456 987654321 4321 18446744073709551615 \
                        1 1 0 0 0 0 0 4096 17642 0 0 0 17 1 0 0 0 0 0\n";

    const STATUS: &str = "Name:\tetcd\nState:\tS (sleeping)\nTgid:\t4242\n\
                          voluntary_ctxt_switches:\t1500\n\
                          nonvoluntary_ctxt_switches:\t25\n";

    #[test]
    fn stat_and_status_parse_to_ticks_and_switches() {
        assert_eq!(parse_stat_cpu_ticks(STAT), Some(1290));
        assert_eq!(parse_status_switches(STATUS), Some(1525));
        // Truncated or foreign text is no reading.
        assert_eq!(parse_stat_cpu_ticks("4242 (x) S 1 2 3"), None);
        assert_eq!(parse_stat_cpu_ticks("no parenthesis"), None);
        assert_eq!(parse_status_switches("voluntary_ctxt_switches:\t3\n"), None);
        // A live process of this machine parses too.
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_stat_cpu_ticks(&own).is_some(), "{own}");
        let own = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert!(parse_status_switches(&own).is_some(), "{own}");
    }

    #[test]
    fn target_pids_name_a_kind_and_its_processes() {
        assert_eq!(
            "etcd=41,42, 43".parse(),
            Ok(TargetPids {
                kind: "etcd",
                pids: vec![41, 42, 43]
            })
        );
        assert_eq!("zk=7".parse::<TargetPids>().unwrap().kind, "zookeeper");
        for bad in [
            "etcd",
            "etcd=",
            "etcd=1,,2",
            "etcd=0",
            "consul=1",
            "etcd=-3",
        ] {
            assert!(bad.parse::<TargetPids>().is_err(), "{bad}");
        }
        let many = format!("redis={}", vec!["1"; PIDS_MAX + 1].join(","));
        assert!(many.parse::<TargetPids>().is_err());
    }

    fn process(pid: u32, cpu_ticks: u64, threads: &[(u32, u64)]) -> ProcessSample {
        ProcessSample {
            pid,
            cpu_ticks,
            threads: threads.iter().copied().collect(),
        }
    }

    #[test]
    fn the_window_sums_every_member_and_divides_by_the_operations() {
        let start = Instant::now();
        let before = Sample {
            at: start,
            processes: vec![
                process(10, 1_000, &[(10, 500), (11, 300), (12, 40)]),
                process(20, 2_000, &[(20, 100)]),
            ],
        };
        let after = Sample {
            at: start + Duration::from_secs(2),
            processes: vec![
                // Thread 12 exited; thread 13 started inside the window.
                process(10, 1_150, &[(10, 700), (11, 350), (13, 50)]),
                process(20, 2_050, &[(20, 200)]),
            ],
        };
        let cpu = over_window(&before, &after, 4_000);
        assert_eq!(cpu.pids, vec![10, 20]);
        assert_eq!(cpu.window_s, 2.0);
        // 150 + 50 ticks of 10 ms.
        assert_eq!(cpu.cpu_s, 2.0);
        assert_eq!(cpu.cpu_cores, 1.0);
        assert_eq!(cpu.cpu_us_per_operation, Some(500.0));
        // 200 + 50 + 50 (the new thread, from 0) + 100; the exited thread's are not seen.
        assert_eq!(cpu.context_switches, 400);
        assert_eq!(cpu.context_switches_per_operation, Some(0.1));
        assert_eq!(
            (cpu.threads, cpu.threads_started, cpu.threads_exited),
            (4, 1, 1)
        );

        // No operation in the window: nothing to divide by.
        let idle = over_window(&before, &after, 0);
        assert_eq!(idle.cpu_us_per_operation, None);
        assert_eq!(idle.context_switches_per_operation, None);
    }

    #[test]
    fn this_process_can_be_sampled_and_a_missing_one_cannot() {
        let own = sample(&[std::process::id()]).unwrap();
        assert!(!own.processes[0].threads.is_empty());
        // Process ids are below 2^22 on Linux.
        let error = sample(&[u32::MAX]).unwrap_err();
        assert!(format!("{error:#}").contains("is gone"), "{error:#}");
    }
}
