//! `palisade lock`: the command does not outlive palisade, nor palisade's hold on the lock — a
//! `kill -9` of palisade, a forwarded signal the command ignores, a lease that can no longer be
//! proven while the command takes long to die, and a grandchild that left the command's process
//! group (issue #14).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_testkit::{Lines, Palisade, Running};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// `palisade lock`'s exit status when the lock was lost while the command ran.
const LOCK_LOST: i32 = 76;

/// True once `pid` has exited (gone, or a zombie nobody reaped yet).
fn exited(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn a_killed_palisade_takes_its_command_with_it() {
    let server = Palisade::start(BIN);
    let dir = tempfile::tempdir().unwrap();
    let heartbeat = dir.path().join("heartbeat");
    let script = format!(
        "echo $$; while :; do date +%s%N >> {}; sleep 0.1; done",
        heartbeat.display()
    );
    let mut command = server.command(&["lock", "jobs/killed", "--", "sh", "-c", &script]);
    command.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut holder = Running::spawn(command);
    let lines = Lines::new(holder.child.stdout.take().unwrap());
    let shell = Pid::from_raw(lines.next(Duration::from_secs(20)).trim().parse().unwrap());

    kill(holder.pid(), Signal::SIGKILL).unwrap();
    holder.wait(Duration::from_secs(10));

    let deadline = Instant::now() + Duration::from_secs(10);
    while !exited(shell) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let survived = !exited(shell);
    if survived {
        let _ = kill(shell, Signal::SIGKILL);
    }
    assert!(!survived, "the command outlived the killed palisade");
}

#[test]
fn a_forwarded_sigterm_the_command_ignores_is_escalated_after_the_grace() {
    let server = Palisade::start(BIN);
    let mut command = server.command(&[
        "lock",
        "jobs/stubborn",
        "--kill-grace",
        "1s",
        "--",
        "sh",
        "-c",
        "trap '' TERM INT; echo ready; while :; do sleep 0.1; done",
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut holder = Running::spawn(command);
    let lines = Lines::new(holder.child.stdout.take().unwrap());
    assert_eq!(lines.next(Duration::from_secs(20)).trim(), "ready");

    kill(holder.pid(), Signal::SIGTERM).unwrap();

    // Generous: the grace is 1 s.
    let status = holder.wait(Duration::from_secs(15));
    let message = holder.stderr();
    assert_eq!(status.code(), Some(128 + 9), "{message}");
    assert!(message.contains("SIGKILL"), "{message}");
    let status = server.run_json(&["status", "jobs/stubborn"]);
    assert!(status["holder"].is_null(), "{status}");
}

/// Waits (bounded) until `pid` has exited; true if it did.
fn wait_exited(pid: Pid, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !exited(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    exited(pid)
}

/// The lines of the journal both commands append to, in the order they were written.
fn journal(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_lease_that_cannot_be_proven_stops_the_command_before_the_lock_can_pass_on() {
    let server = Palisade::start(BIN);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("journal");
    // The first command ignores SIGTERM and would outlive a 30 s grace: only SIGKILL stops it.
    // Each of its loop's turns appends a line, so the journal orders its life against the
    // second command's start.
    let first_script = format!(
        "trap '' TERM; echo ready; while :; do echo first >> {log}; sleep 0.05; done",
        log = log.display()
    );
    let mut command = server.command(&[
        "lock",
        "jobs/handover",
        "--ttl",
        "2s",
        "--kill-grace",
        "30s",
        "--",
        "sh",
        "-c",
        &first_script,
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut first = Running::spawn(command);
    let stdout = Lines::new(first.child.stdout.take().unwrap());
    let stderr = Lines::new(first.child.stderr.take().unwrap());
    assert_eq!(stdout.next(Duration::from_secs(20)).trim(), "ready");

    // A second holder queues behind it, with a lease that outlives the freeze below.
    let second_script = format!("echo second >> {}", log.display());
    let mut second = Running::spawn(server.command(&[
        "lock",
        "jobs/handover",
        "--ttl",
        "60s",
        "--wait",
        "120s",
        "--",
        "sh",
        "-c",
        &second_script,
    ]));
    server.wait_for_status("jobs/handover", Duration::from_secs(20), |status| {
        status["waiters"]
            .as_array()
            .is_some_and(|waiters| waiters.len() == 1)
    });

    // The lock service freezes: no renewal is answered, so the first holder cannot prove its
    // lease. Its clock runs on, so once it thaws it expires that lease before anything else and
    // grants the lock to the second holder at once.
    server.locks.pause();
    let mut said = Vec::new();
    while !said
        .last()
        .is_some_and(|line: &String| line.contains("stopping the command"))
    {
        assert!(
            said.len() < 50,
            "palisade did not say it stops the command: {said:?}"
        );
        said.push(stderr.next(Duration::from_secs(20)));
    }
    // Past the first lease's end at the service, whatever palisade did meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    server.locks.resume();

    let status = second.wait(Duration::from_secs(60));
    assert!(status.success(), "the second holder failed: {status:?}");
    let status = first.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(LOCK_LOST));

    let lines = journal(&log);
    let started = lines
        .iter()
        .position(|line| line == "second")
        .unwrap_or_else(|| panic!("the second command never ran: {lines:?}"));
    assert!(
        lines[..started].iter().any(|line| line == "first"),
        "the first command wrote nothing before the second started"
    );
    let overlap = lines[started..]
        .iter()
        .filter(|line| *line == "first")
        .count();
    assert_eq!(
        overlap,
        0,
        "the first command was still running when the second one started: it wrote {overlap} of its {} lines after",
        lines.len() - 1
    );
}

#[test]
fn a_grandchild_that_left_the_process_group_is_stopped_with_the_command() {
    let server = Palisade::start(BIN);
    // The command starts a grandchild in a session (and so a process group) of its own, which
    // ignores SIGTERM and prints its pid.
    let script = "setsid sh -c 'trap \"\" TERM; echo $$; while :; do sleep 0.1; done' & wait";
    let mut command = server.command(&[
        "lock",
        "jobs/escapee",
        "--ttl",
        "2s",
        "--kill-grace",
        "1s",
        "--",
        "sh",
        "-c",
        script,
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut holder = Running::spawn(command);
    let lines = Lines::new(holder.child.stdout.take().unwrap());
    let grandchild = Pid::from_raw(lines.next(Duration::from_secs(20)).trim().parse().unwrap());

    // The lock is lost: the service freezes past the lease. Generous: the lease is 2 s.
    server.locks.pause();
    let survived = !wait_exited(grandchild, Duration::from_secs(30));
    server.locks.resume();
    if survived {
        let _ = kill(grandchild, Signal::SIGKILL);
    }
    let status = holder.wait(Duration::from_secs(60));
    assert!(
        !survived,
        "a grandchild in a session of its own outlived the lost lock"
    );
    assert_eq!(status.code(), Some(LOCK_LOST));
}
