//! `palisade lock`: the command does not outlive palisade — a `kill -9` of palisade, and a
//! forwarded signal the command ignores (issue #14).

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_testkit::{Lines, Palisade, Running};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

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
