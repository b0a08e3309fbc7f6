//! `palisade lock`: the command does not outlive palisade, nor palisade's hold on the lock — a
//! `kill -9` of palisade, a forwarded signal the command ignores, a lease that can no longer be
//! proven while the command takes long to die, and a grandchild that left the command's process
//! group (issue #14).

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
