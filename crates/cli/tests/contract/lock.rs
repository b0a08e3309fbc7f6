//! `palisade lock NAME -- CMD`: the command runs with its grant in the environment, waits in
//! line, is not run without the lock, and is stopped when the lock is lost.

use std::process::Stdio;
use std::time::{Duration, Instant};

use palisade_testkit::{Palisade, Running, run, wait_until};

use crate::{BIN, Contract as _};

#[test]
fn lock_runs_the_command_with_its_grant_in_the_environment_and_passes_its_exit_status_through() {
    let p = Palisade::start(BIN);
    let out = p.run(&[
        "lock",
        "jobs/env",
        "--",
        "sh",
        "-c",
        r#"printf '%s\n%s\n%s\n%s\n' "$PALISADE_LOCK" "$PALISADE_TOKEN" "$PALISADE_SEQUENCER" "$PALISADE_SESSION"; exit 7"#,
    ]);
    out.expect_code(7);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{out:?}");
    assert_eq!(lines[0], "jobs/env");
    let token: u64 = lines[1].parse().expect("PALISADE_TOKEN is a number");
    assert!(token > 0);
    let fields: Vec<&str> = lines[2].split('.').collect();
    assert_eq!(
        fields.len(),
        6,
        "pal2.<key id>.<lock>.<token>.<session>.<sig>: {}",
        lines[2]
    );
    assert_eq!(fields[0], "pal2");
    assert_eq!(fields[3], lines[1], "the sequencer carries the token");
    assert!(!lines[3].is_empty(), "PALISADE_SESSION is set");
    assert!(lines[2].is_ascii() && !lines[2].contains(' '));

    // Released when the command exited: the next user gets it at once, with a larger token.
    assert!(p.status("jobs/env")["holder"].is_null());
    let out = p.run(&[
        "lock",
        "jobs/env",
        "--wait",
        "0",
        "--",
        "sh",
        "-c",
        r#"echo "$PALISADE_TOKEN""#,
    ]);
    out.expect_success();
    let second: u64 = out.stdout.trim().parse().unwrap();
    assert!(second > token, "tokens grow: {token} then {second}");

    // Exit statuses: success, a signal (128+N), a command that does not exist.
    p.run(&["lock", "jobs/env", "--", "true"]).expect_success();
    p.run(&["lock", "jobs/env", "--", "sh", "-c", "kill -9 $$"])
        .expect_code(128 + 9);
    let out = p.run(&[
        "lock",
        "jobs/env",
        "--",
        "/nonexistent/palisade-test-command",
    ]);
    out.expect_code(127);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
}

#[test]
fn lock_not_acquired_within_wait_exits_75_without_running_the_command() {
    let p = Palisade::start_with_store(BIN);
    let holder = p.acquire("jobs/busy", "20s");
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());

    let started = Instant::now();
    let out = p.run(&[
        "lock",
        "jobs/busy",
        "--wait",
        "300ms",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    out.expect_code(75);
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited");
    assert!(
        !marker.exists(),
        "the command must not run without the lock"
    );
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");

    p.run(&["lock", "jobs/busy", "--wait", "0", "--", "sh", "-c", &touch])
        .expect_code(75);
    assert!(!marker.exists());
    p.run(&["acquire", "jobs/busy", "--ttl", "5s"])
        .expect_code(75);

    // Once the holder lets go, the same command runs.
    p.run(&["release", "jobs/busy", "--session", &holder.credential])
        .expect_success();
    p.run(&[
        "lock",
        "jobs/busy",
        "--wait",
        "5s",
        "--",
        "sh",
        "-c",
        &touch,
    ])
    .expect_success();
    assert!(marker.exists());
}

#[test]
fn lock_waits_in_line_and_runs_once_the_holder_releases() {
    let p = Palisade::start(BIN);
    let holder = p.acquire("queue/a", "20s");
    let mut waiter = p.command(&[
        "lock",
        "queue/a",
        "--wait",
        "15s",
        "--",
        "sh",
        "-c",
        "echo $PALISADE_TOKEN",
    ]);
    waiter.stdout(Stdio::piped()).stderr(Stdio::piped());
    let waiter = std::thread::spawn(move || run(waiter));
    wait_until("the waiter to queue", Duration::from_secs(10), || {
        p.status("queue/a")["waiters"]
            .as_array()
            .is_some_and(|w| w.len() == 1)
    });
    p.run(&["release", "queue/a", "--session", &holder.credential])
        .expect_success();
    let out = waiter.join().unwrap();
    out.expect_success();
    let token: u64 = out.stdout.trim().parse().unwrap();
    assert!(token > holder.token);
}

#[test]
fn lock_lost_while_the_command_runs_stops_it_and_exits_76() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let p = Palisade::start(BIN);
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let termed = dir.path().join("got-sigterm");
    let script = format!(
        "trap 'touch {t}; exit 0' TERM; touch {s}; while :; do sleep 0.1; done",
        t = termed.display(),
        s = started.display()
    );
    let mut cmd = p.command(&[
        "lock",
        "jobs/paused",
        "--ttl",
        "1s",
        "--kill-grace",
        "2s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut lock = Running::spawn(cmd);
    wait_until("the command to start", Duration::from_secs(10), || {
        started.exists()
    });
    let pid = Pid::from_raw(lock.child.id() as i32);

    // A stop-the-world pause of the holder, longer than its lease.
    kill(pid, Signal::SIGSTOP).unwrap();
    wait_until("the lease to expire", Duration::from_secs(10), || {
        p.status("jobs/paused")["holder"].is_null()
    });
    kill(pid, Signal::SIGCONT).unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = lock.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "palisade lock kept running");
        std::thread::sleep(Duration::from_millis(25));
    };
    assert_eq!(status.code(), Some(76), "lost lock: {status:?}");
    assert!(termed.exists(), "the command was sent SIGTERM");
}
