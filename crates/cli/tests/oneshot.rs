//! The one-shot flow (`acquire`, `renew`, `release`) and the reads (`status`, `locks`,
//! `watch`, `pubkey`), against a real `palisade serve`.

use std::process::Stdio;
use std::time::Duration;

use palisade_testkit::{Lines, Palisade, Running, run};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

#[test]
fn acquire_prints_a_grant_that_status_and_locks_show() {
    let server = Palisade::start(BIN);

    let grant = server.run_json(&["acquire", "db/primary", "--ttl", "30s"]);

    assert_eq!(grant["lock"], "db/primary");
    assert!(grant["token"].as_u64().unwrap() >= 1);
    assert!(grant["sequencer"].as_str().unwrap().starts_with("pal2."));
    assert_eq!(grant["ttl_ms"], 30_000);
    let status = server.run_json(&["status", "db/primary"]);
    assert_eq!(status["holder"]["session"], grant["session"]);
    assert_eq!(status["holder"]["token"], grant["token"]);
    assert_eq!(status["last_token"], grant["token"]);
    let lease = status["holder"]["lease_remaining_ms"].as_u64().unwrap();
    assert!(lease > 0 && lease <= 30_000, "{status}");

    let locks = server.run_json(&["locks", "--prefix", "db/"]);
    let locks = locks.as_array().unwrap();
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!(locks[0]["holder"]["session"], grant["session"]);
    let human = server.run_ok(&["locks", "--prefix", "db/"]);
    assert!(human.starts_with("LOCK"), "{human}");
    assert!(human.contains("db/primary"), "{human}");
}

#[test]
fn acquire_prints_assignments_a_shell_can_eval() {
    let server = Palisade::start(BIN);
    let script = "eval \"$(\"$PALISADE_BIN\" acquire 'reports/q 1' --ttl 30s)\" && \
                  echo \"$PALISADE_LOCK|$PALISADE_TOKEN|$PALISADE_SESSION\"";

    let mut command = palisade_testkit::command("sh");
    command
        .args(["-c", script])
        .env("PALISADE_BIN", BIN)
        .env("PALISADE_ENDPOINT", server.endpoint());
    let output = run(command);

    assert!(output.status.success(), "{}", output.stderr);
    let stdout = output.stdout;
    let fields: Vec<&str> = stdout.trim().split('|').collect();
    assert_eq!(fields[0], "reports/q 1");
    let status = server.run_json(&["status", "reports/q 1"]);
    assert_eq!(status["holder"]["token"].to_string(), fields[1]);
    // PALISADE_SESSION is the session's credential, `<id>.<secret>`.
    let (id, secret) = fields[2].split_once('.').expect("an id and a secret");
    assert_eq!(status["holder"]["session"].to_string(), id);
    assert_eq!(secret.len(), 64, "{stdout}");
}

#[test]
fn release_by_a_wrong_session_fails_and_names_the_holder() {
    let server = Palisade::start(BIN);
    let holder = server.run_json(&["acquire", "files/a", "--ttl", "30s"]);
    let other = server.run_json(&["acquire", "files/b", "--ttl", "30s"]);

    let output = server.run(&[
        "release",
        "files/a",
        "--session",
        other["session_credential"].as_str().unwrap(),
    ]);

    assert_eq!(output.status.code(), Some(1), "{}", output.stderr);
    let message = &output.stderr;
    assert!(message.starts_with("palisade: "), "{message}");
    assert!(
        message.contains(&format!("held by session {}", holder["session"])),
        "{message}"
    );
    assert!(
        message.contains(&format!("token {}", holder["token"])),
        "{message}"
    );
    // The holder is unaffected and can release.
    let released = server.run_json(&[
        "release",
        "files/a",
        "--session",
        holder["session_credential"].as_str().unwrap(),
    ]);
    assert_eq!(released["token"], holder["token"]);
    let status = server.run_json(&["status", "files/a"]);
    assert!(status["holder"].is_null(), "{status}");
}

#[test]
fn a_busy_lock_is_not_acquired_and_leaves_no_session_behind() {
    let server = Palisade::start(BIN);
    let holder = server.run_json(&["acquire", "q/busy", "--ttl", "30s"]);

    let output = server.run(&["acquire", "q/busy", "--ttl", "30s", "--json"]);

    assert_eq!(output.status.code(), Some(75), "{}", output.stderr);
    assert!(
        output
            .stderr
            .contains(&format!("held by session {}", holder["session"])),
        "{}",
        output.stderr
    );
    let status = server.run_json(&["status", "q/busy"]);
    assert!(status["waiters"].as_array().unwrap().is_empty(), "{status}");
}

#[test]
fn renew_keeps_a_one_shot_session_past_its_ttl() {
    let server = Palisade::start(BIN);
    let grant = server.run_json(&["acquire", "renew/a", "--ttl", "3s"]);
    let session = grant["session_credential"].as_str().unwrap();

    std::thread::sleep(Duration::from_secs(2));
    let renewed = server.run_json(&["renew", "--session", session]);
    assert_eq!(renewed["session"], grant["session"]);
    std::thread::sleep(Duration::from_secs(2));

    // Four seconds after a 3 s lease began, only the renewal keeps it held.
    let status = server.run_json(&["status", "renew/a"]);
    assert_eq!(status["holder"]["session"], grant["session"], "{status}");

    // Unrenewed, it expires and the lock is free again.
    server.wait_for_status("renew/a", Duration::from_secs(10), |s| {
        s["holder"].is_null()
    });
    let output = server.run(&["renew", "--session", session]);
    assert_eq!(output.status.code(), Some(1), "{}", output.stderr);
    assert!(
        output.stderr.contains("does not exist"),
        "{}",
        output.stderr
    );
}

#[test]
fn watch_streams_grants_and_releases() {
    let server = Palisade::start(BIN);
    let mut command = server.command(&["watch", "w/a", "--json"]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut watcher = Running::spawn(command);
    let lines = Lines::new(watcher.child.stdout.take().unwrap());
    let event = |line: String| -> serde_json::Value { serde_json::from_str(&line).unwrap() };

    let snapshot = event(lines.next(Duration::from_secs(10)));
    assert_eq!(snapshot["kind"], "snapshot");
    assert!(snapshot["session"].is_null(), "{snapshot}");

    let grant = server.run_json(&["acquire", "w/a", "--ttl", "30s"]);
    let granted = event(lines.next(Duration::from_secs(10)));
    assert_eq!(granted["kind"], "granted");
    assert_eq!(granted["session"], grant["session"]);
    assert_eq!(granted["token"], grant["token"]);

    server.run_ok(&[
        "release",
        "w/a",
        "--session",
        grant["session_credential"].as_str().unwrap(),
    ]);
    let released = event(lines.next(Duration::from_secs(10)));
    assert_eq!(released["kind"], "released");
    assert_eq!(released["token"], grant["token"]);
    drop(watcher);
}

#[test]
fn pubkey_prints_an_ed25519_key() {
    let server = Palisade::start(BIN);

    let key = server.run_ok(&["pubkey"]);

    let hex = key
        .trim()
        .strip_prefix("ed25519:")
        .expect("ed25519: prefix");
    assert_eq!(hex.len(), 64);
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn an_invalid_lock_name_is_refused_with_a_clear_message() {
    let server = Palisade::start(BIN);
    let long = "x".repeat(300);

    let output = server.run(&["acquire", &long, "--ttl", "5s"]);

    assert_eq!(output.status.code(), Some(1), "{}", output.stderr);
    assert!(output.stderr.contains("lock name"), "{}", output.stderr);
}
