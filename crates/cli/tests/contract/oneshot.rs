//! The one-shot flow: `acquire`, `renew`, `release`.

use palisade_testkit::{Palisade, run};

use crate::{BIN, Contract as _, Grant, id_string};

#[test]
fn acquire_prints_the_grant_and_only_the_holding_session_may_release_or_renew_it() {
    let p = Palisade::start(BIN);
    let out = p.run(&["acquire", "oneshot/a", "--ttl", "5s", "--json"]);
    out.expect_success();
    let v = out.json();
    for field in ["lock", "token", "sequencer", "session", "ttl_ms"] {
        assert!(v.get(field).is_some(), "acquire --json has {field}: {v}");
    }
    assert_eq!(v["lock"], "oneshot/a");
    assert_eq!(v["ttl_ms"], 5000);
    let a = Grant::from_json(&v);
    assert!(a.sequencer.starts_with("pal2."));

    // The plain form is KEY=value lines for eval.
    let out = p.run(&["acquire", "oneshot/b", "--ttl", "5s"]);
    out.expect_success();
    for key in [
        "PALISADE_LOCK=",
        "PALISADE_TOKEN=",
        "PALISADE_SEQUENCER=",
        "PALISADE_SESSION=",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(key)),
            "{key} in {out:?}"
        );
    }
    let b_session = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PALISADE_SESSION="))
        .unwrap()
        .trim_matches('\'')
        .to_owned();

    // Busy: a second acquire is not granted.
    p.run(&["acquire", "oneshot/a", "--ttl", "5s"])
        .expect_code(75);

    // renew: the holding session's lease is renewed; an unknown session is refused.
    p.run(&["renew", "--session", &a.credential])
        .expect_success();
    let mut renew = p.command(&["renew"]);
    renew.env("PALISADE_SESSION", &a.credential);
    run(renew).expect_success();
    let unknown = format!("999999.{}", "0".repeat(64));
    let out = p.run(&["renew", "--session", &unknown]);
    out.expect_code(1);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    // A bare id, without the secret that proves the session is the caller's, is no session.
    let out = p.run(&["renew", "--session", &a.session]);
    out.expect_code(2);
    assert!(out.stderr.contains("bare session id"), "{out:?}");

    // release by another (live) session: refused, names the holder, lock still held.
    let out = p.run(&["release", "oneshot/a", "--session", &b_session]);
    out.expect_code(1);
    assert!(out.stderr.contains(&a.session), "names the holder: {out:?}");
    p.run(&["release", "oneshot/a", "--session", &unknown])
        .expect_code(1);
    let status = p.status("oneshot/a");
    assert_eq!(id_string(&status["holder"]["session"]), a.session);
    assert_eq!(status["holder"]["token"], a.token);

    // release by the holder.
    p.run(&["release", "oneshot/a", "--session", &a.credential])
        .expect_success();
    assert!(p.status("oneshot/a")["holder"].is_null());

    // release with NAME and session from the environment, as after `eval "$(palisade acquire …)"`.
    let mut release = p.command(&["release"]);
    release
        .env("PALISADE_LOCK", "oneshot/b")
        .env("PALISADE_SESSION", &b_session);
    run(release).expect_success();
    assert!(p.status("oneshot/b")["holder"].is_null());
}

#[test]
fn an_unrenewed_one_shot_grant_expires_and_the_next_grant_has_a_larger_token() {
    let p = Palisade::start(BIN);
    let first = p.acquire("oneshot/expiring", "1s");
    let out = p.run(&[
        "acquire",
        "oneshot/expiring",
        "--ttl",
        "5s",
        "--wait",
        "10s",
        "--json",
    ]);
    out.expect_success();
    let second = Grant::from_json(&out.json());
    assert!(second.token > first.token);
    assert_ne!(second.session, first.session);
    // The expired session can no longer renew or release.
    p.run(&["renew", "--session", &first.credential])
        .expect_code(1);
    p.run(&[
        "release",
        "oneshot/expiring",
        "--session",
        &first.credential,
    ])
    .expect_code(1);
}
