//! Several endpoints: `--endpoint a,b,c` and `PALISADE_ENDPOINT=a,b,c` (the members of a
//! cluster). An address where nothing listens is skipped; a malformed list is a usage error.

use palisade_testkit::{Palisade, command, run, unused_port};

use crate::{BIN, Contract as _, id_string};

/// An address where nothing listens, without a scheme (`http://` is assumed).
fn dead() -> String {
    format!("127.0.0.1:{}", unused_port())
}

/// The live service's address without its scheme.
fn bare(endpoint: &str) -> String {
    endpoint
        .strip_prefix("http://")
        .expect("an http endpoint")
        .to_owned()
}

#[test]
fn a_list_whose_first_endpoint_is_dead_reaches_the_live_one() {
    let p = Palisade::start(BIN);
    let key = p.run(&["pubkey"]).expect_success().stdout.trim().to_owned();
    let list = format!("{},{}", dead(), p.endpoint());

    // The flag, before and after the command.
    let mut flag = command(BIN);
    flag.args(["--endpoint", &list, "pubkey"]);
    assert_eq!(run(flag).expect_success().stdout.trim(), key);
    let mut flag_after = command(BIN);
    flag_after.args(["status", "ep/a", "--json", "--endpoint", &list]);
    let status = run(flag_after).expect_success().json();
    assert!(status["holder"].is_null(), "{status}");

    // The environment, with spaces around the commas and addresses without a scheme.
    let env_list = format!("{} , {}", dead(), bare(&p.endpoint()));
    let mut acquire = command(BIN);
    acquire
        .env("PALISADE_ENDPOINT", &env_list)
        .args(["acquire", "ep/a", "--ttl", "10s", "--json"]);
    let grant = run(acquire).expect_success().json();
    assert!(grant["token"].as_u64().unwrap() > 0, "{grant}");
    let status = p.status("ep/a");
    assert_eq!(
        id_string(&status["holder"]["session"]),
        id_string(&grant["session"])
    );

    let mut release = command(BIN);
    release.env("PALISADE_ENDPOINT", &env_list).args([
        "release",
        "ep/a",
        "--session",
        grant["session_credential"].as_str().unwrap(),
    ]);
    run(release).expect_success();
    assert!(p.status("ep/a")["holder"].is_null());
}

#[test]
fn lock_passes_the_whole_list_on_to_its_command() {
    let p = Palisade::start(BIN);
    let dead = dead();
    let list = format!("{dead},{}", p.endpoint());
    let mut lock = command(BIN);
    lock.env("PALISADE_ENDPOINT", &list).args([
        "lock",
        "ep/lock",
        "--ttl",
        "10s",
        "--",
        "sh",
        "-c",
        // The command reaches the service through the list it was given.
        r#"printf '%s\n' "$PALISADE_ENDPOINT" && palisade_bin="$0" && "$palisade_bin" status ep/lock --json"#,
        BIN,
    ]);
    let out = run(lock);
    out.expect_success();
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next(),
        Some(format!("http://{dead},{}", p.endpoint()).as_str()),
        "{out:?}"
    );
    let status: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert!(!status["holder"].is_null(), "{status}");
}

#[test]
fn every_endpoint_dead_is_unavailable_and_names_them() {
    let (a, b) = (dead(), dead());
    let mut status = command(BIN);
    status.args(["--endpoint", &format!("{a},{b}"), "status", "ep/x"]);
    let out = run(status);
    out.expect_code(69);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    assert!(
        out.stderr.contains(&a) && out.stderr.contains(&b),
        "{out:?}"
    );
}

#[test]
fn a_malformed_list_is_a_usage_error_that_says_why() {
    let p = Palisade::start(BIN);
    let live = p.endpoint();
    let seventeen = vec![live.as_str(); 17].join(",");
    let cases = [
        (format!("{live},,{live}"), "empty"),
        (format!("{live},"), "empty"),
        (format!(",{live}"), "empty"),
        (String::new(), "no endpoint"),
        (seventeen, "at most 16"),
    ];
    for (list, says) in cases {
        for via_env in [false, true] {
            let mut acquire = command(BIN);
            if via_env {
                acquire.env("PALISADE_ENDPOINT", &list);
            } else {
                acquire.args(["--endpoint", &list]);
            }
            acquire.args(["acquire", "ep/bad", "--ttl", "10s"]);
            let out = run(acquire);
            out.expect_code(2);
            assert!(out.stderr.starts_with("palisade: "), "{list:?}: {out:?}");
            assert!(out.stderr.contains(says), "{list:?}: {out:?}");
            assert!(out.stdout.is_empty(), "{list:?}: {out:?}");
        }
    }
    // Nothing was acquired, and sixteen endpoints are fine.
    assert!(p.status("ep/bad")["holder"].is_null());
    let sixteen = vec![live.as_str(); 16].join(",");
    let mut status = command(BIN);
    status.args(["--endpoint", &sixteen, "status", "ep/bad"]);
    run(status).expect_success();
}
