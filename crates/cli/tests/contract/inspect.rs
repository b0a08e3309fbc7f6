//! Reading state: `status`, `locks`, `pubkey`, and where the endpoint comes from.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use palisade_testkit::{Palisade, command, run, unused_port, wait_until};

use crate::{BIN, Contract as _, id_string};

#[test]
fn status_and_locks_show_holder_token_waiters_and_lease() {
    let p = Palisade::start(BIN);
    let a = p.acquire("team/a", "10s");
    let b = p.acquire("team/b", "10s");
    let _c = p.acquire("other/c", "10s");

    let mut waiter = p.command(&["lock", "team/a", "--wait", "15s", "--", "true"]);
    waiter.stdout(Stdio::null());
    let waiter = std::thread::spawn(move || run(waiter));
    wait_until("a waiter on team/a", Duration::from_secs(10), || {
        p.status("team/a")["waiters"]
            .as_array()
            .is_some_and(|w| w.len() == 1)
    });

    let s = p.status("team/a");
    assert_eq!(s["lock"], "team/a");
    assert_eq!(id_string(&s["holder"]["session"]), a.session);
    assert_eq!(s["holder"]["token"], a.token);
    let remaining = s["holder"]["lease_remaining_ms"].as_u64().unwrap();
    assert!(
        remaining > 0 && remaining <= 10_000,
        "lease remaining {remaining}"
    );
    assert!(s["last_token"].as_u64().unwrap() >= a.token);

    let out = p.run(&["status", "team/a"]);
    out.expect_success();
    assert!(out.stdout.contains(&a.session) && out.stdout.contains(&a.token.to_string()));

    let out = p.run(&["locks", "--prefix", "team/", "--json"]);
    out.expect_success();
    let listed = out.json();
    let names: BTreeSet<&str> = listed
        .as_array()
        .expect("locks --json is an array")
        .iter()
        .map(|l| l["lock"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["team/a", "team/b"]));
    let team_b = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lock"] == "team/b")
        .unwrap();
    assert_eq!(team_b["holder"]["token"], b.token);

    let all = p.run(&["locks", "--json"]).expect_success().json();
    assert_eq!(all.as_array().unwrap().len(), 3, "{all}");

    // Hand-over to the waiter.
    p.run(&["release", "team/a", "--session", &a.credential])
        .expect_success();
    waiter.join().unwrap().expect_success();
}

#[test]
fn status_of_a_free_lock_still_reports_its_last_token() {
    let p = Palisade::start(BIN);
    let a = p.acquire("history/a", "10s");
    p.run(&["release", "history/a", "--session", &a.credential])
        .expect_success();
    let s = p.status("history/a");
    assert!(s["holder"].is_null());
    assert!(
        s["last_token"].as_u64().is_some_and(|t| t >= a.token),
        "status shows the last token granted ({}) after release: {s}",
        a.token
    );
}

#[test]
fn pubkey_is_an_ed25519_hex_key_and_the_endpoint_comes_from_flag_or_environment() {
    let p = Palisade::start(BIN);
    let dead = format!("http://127.0.0.1:{}", unused_port());

    // From the environment only.
    let out = p.run(&["pubkey"]);
    out.expect_success();
    let key = out.stdout.trim().to_owned();
    let hex = key.strip_prefix("ed25519:").expect("ed25519: prefix");
    assert_eq!(hex.len(), 64, "{key}");
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{key}");

    // From the flag only.
    let mut flag_only = command(BIN);
    flag_only.args(["--endpoint", &p.endpoint(), "pubkey"]);
    assert_eq!(run(flag_only).expect_success().stdout.trim(), key);
    let mut flag_after = command(BIN);
    flag_after.args(["pubkey", "--endpoint", &p.endpoint()]);
    assert_eq!(run(flag_after).expect_success().stdout.trim(), key);

    // The flag wins over the environment.
    let mut both = command(BIN);
    both.env("PALISADE_ENDPOINT", &dead)
        .args(["--endpoint", &p.endpoint(), "pubkey"]);
    assert_eq!(run(both).expect_success().stdout.trim(), key);

    // The environment is used: pointing it at nothing makes the service unreachable (69).
    let mut env_dead = command(BIN);
    env_dead.env("PALISADE_ENDPOINT", &dead).arg("pubkey");
    let out = run(env_dead);
    out.expect_code(69);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    let mut acquire_dead = command(BIN);
    acquire_dead
        .env("PALISADE_ENDPOINT", &dead)
        .args(["acquire", "x", "--ttl", "5s"]);
    run(acquire_dead).expect_code(69);

    // --json and stability across calls.
    let v = p.run(&["pubkey", "--json"]).expect_success().json();
    assert_eq!(v["public_key"], key);
    assert_eq!(p.run(&["pubkey"]).stdout.trim(), key);
}
