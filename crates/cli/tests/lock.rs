//! `palisade lock`: running a command under a lock, against a real `palisade serve`.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_testkit::{Lines, Palisade, Running, run, unused_port};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// Exit statuses documented in `palisade --help`.
const NOT_ACQUIRED: i32 = 75;
const LOCK_LOST: i32 = 76;

fn token_of(stdout: &str) -> u64 {
    stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("not a token ({e}): {stdout:?}"))
}

#[test]
fn the_command_sees_its_lock_token_and_sequencer() {
    let server = Palisade::start(BIN);

    let stdout = server.run_ok(&[
        "lock",
        "jobs/env",
        "--",
        "sh",
        "-c",
        "echo \"$PALISADE_LOCK|$PALISADE_TOKEN|$PALISADE_SEQUENCER|$PALISADE_SESSION\"",
    ]);

    let fields: Vec<&str> = stdout.trim().split('|').collect();
    assert_eq!(fields.len(), 4, "{stdout}");
    assert_eq!(fields[0], "jobs/env");
    assert!(token_of(fields[1]) >= 1);
    assert!(fields[2].starts_with("pal2."), "{stdout}");
    // PALISADE_SESSION is the session's credential, `<id>.<secret>`, which acts for it.
    assert!(
        fields[3]
            .parse::<palisade_client::SessionCredential>()
            .is_ok(),
        "{stdout}"
    );
}

#[test]
fn sequential_runs_get_strictly_increasing_tokens() {
    let server = Palisade::start(BIN);

    let tokens: Vec<u64> = (0..3)
        .map(|_| {
            token_of(&server.run_ok(&[
                "lock",
                "jobs/sequential",
                "--",
                "sh",
                "-c",
                "echo $PALISADE_TOKEN",
            ]))
        })
        .collect();

    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // Each run released the lock when its command exited.
    let status = server.run_json(&["status", "jobs/sequential"]);
    assert!(status["holder"].is_null(), "{status}");
}

#[test]
fn the_commands_exit_status_is_passed_through() {
    let server = Palisade::start(BIN);

    let output = server.run(&["lock", "jobs/status", "--", "sh", "-c", "exit 7"]);
    assert_eq!(output.status.code(), Some(7), "{}", output.stderr);

    let output = server.run(&["lock", "jobs/status", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(output.status.code(), Some(128 + 9), "{}", output.stderr);

    let output = server.run(&["lock", "jobs/status", "--", "no-such-command-palisade"]);
    assert_eq!(output.status.code(), Some(127), "{}", output.stderr);
    assert!(output.stderr.contains("not found"), "{}", output.stderr);

    let status = server.run_json(&["status", "jobs/status"]);
    assert!(status["holder"].is_null(), "{status}");
}

#[test]
fn a_held_lock_not_granted_within_the_wait_exits_with_not_acquired() {
    let server = Palisade::start(BIN);
    let holder = server.run_json(&["acquire", "jobs/busy", "--ttl", "30s"]);

    let started = std::time::Instant::now();
    let output = server.run(&["lock", "jobs/busy", "--wait", "1s", "--", "true"]);

    assert_eq!(
        output.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        output.stderr
    );
    assert!(started.elapsed() >= Duration::from_secs(1));
    let message = &output.stderr;
    assert!(message.starts_with("palisade: "), "{message}");
    assert!(
        message.contains(&format!("held by session {}", holder["session"])),
        "{message}"
    );
    // The lock still belongs to its holder.
    let status = server.run_json(&["status", "jobs/busy"]);
    assert_eq!(status["holder"]["session"], holder["session"], "{status}");
}

#[test]
fn a_waiting_lock_runs_its_command_once_the_holder_releases() {
    let server = Palisade::start(BIN);
    let holder = server.run_json(&["acquire", "jobs/handoff", "--ttl", "30s"]);
    let mut command = server.command(&[
        "lock",
        "jobs/handoff",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $PALISADE_TOKEN",
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut waiter = Running::spawn(command);
    server.wait_for_status("jobs/handoff", Duration::from_secs(10), |s| {
        s["waiters"].as_array().is_some_and(|w| !w.is_empty())
    });

    let credential = holder["session_credential"].as_str().unwrap();
    server.run_ok(&["release", "jobs/handoff", "--session", credential]);

    let status = waiter.wait(Duration::from_secs(20));
    assert!(status.success(), "{}", waiter.stderr());
    assert!(token_of(&waiter.stdout()) > holder["token"].as_u64().unwrap());
}

#[test]
fn a_paused_holder_loses_the_lock_and_its_command_is_stopped() {
    let server = Palisade::start(BIN);
    // The command starts a grandchild and prints its pid: stopping must reach the whole group.
    let mut command = server.command(&[
        "lock",
        "jobs/paused",
        "--ttl",
        "2s",
        "--kill-grace",
        "2s",
        "--",
        "sh",
        "-c",
        "sleep 30 & echo $!; wait",
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut holder = Running::spawn(command);
    let lines = Lines::new(holder.child.stdout.take().unwrap());
    let grandchild = Pid::from_raw(lines.next(Duration::from_secs(20)).trim().parse().unwrap());
    let held = server.wait_for_status("jobs/paused", Duration::from_secs(10), |s| {
        !s["holder"].is_null()
    });
    let first_token = held["holder"]["token"].as_u64().unwrap();

    // Phase 1: the holder is paused past its lease; its keepalives stop.
    kill(holder.pid(), Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(4));

    // Phase 2: another client takes the lock with a larger token.
    let next = server.run_json(&["acquire", "jobs/paused", "--ttl", "30s", "--wait", "10s"]);
    assert!(next["token"].as_u64().unwrap() > first_token, "{next}");

    // Phase 3: resumed, the old holder notices, stops its command and says the lock was lost.
    kill(holder.pid(), Signal::SIGCONT).unwrap();
    let status = holder.wait(Duration::from_secs(20));
    let message = holder.stderr();
    assert_eq!(status.code(), Some(LOCK_LOST), "{message}");
    assert!(message.contains("lost"), "{message}");
    assert_eq!(
        kill(grandchild, None),
        Err(nix::errno::Errno::ESRCH),
        "the command's child survived"
    );
    // The new holder keeps the lock.
    let status = server.run_json(&["status", "jobs/paused"]);
    assert_eq!(status["holder"]["session"], next["session"], "{status}");
}

#[test]
fn a_terminated_lock_passes_the_signal_on_and_releases() {
    let server = Palisade::start(BIN);
    let mut command = server.command(&["lock", "jobs/term", "--", "sleep", "30"]);
    command.stderr(Stdio::piped());
    let mut holder = Running::spawn(command);
    server.wait_for_status("jobs/term", Duration::from_secs(10), |s| {
        !s["holder"].is_null()
    });

    kill(holder.pid(), Signal::SIGTERM).unwrap();

    let status = holder.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 15), "{}", holder.stderr());
    let status = server.run_json(&["status", "jobs/term"]);
    assert!(status["holder"].is_null(), "{status}");
}

#[test]
fn an_unreachable_service_is_reported_without_running_the_command() {
    let port = unused_port();
    let mut command = palisade_testkit::command(BIN);
    command
        .args(["lock", "jobs/none", "--endpoint"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--", "sh", "-c", "echo ran"]);
    let output = run(command);

    assert_eq!(output.status.code(), Some(69), "{}", output.stderr);
    assert!(output.stdout.is_empty());
    assert!(
        output.stderr.contains("palisade serve"),
        "{}",
        output.stderr
    );
}
