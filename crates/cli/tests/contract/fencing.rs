//! The README's promise: `palisade lock … -- palisade store put …` is fenced without thinking
//! about it, and a paused holder's late write is refused.

use palisade_testkit::{Palisade, run};

use crate::{BIN, Contract as _, Http};

#[test]
fn readme_lock_around_store_put_is_fenced_end_to_end() {
    let p = Palisade::start_with_store(BIN);
    p.run(&[
        "lock",
        "jobs/nightly",
        "--",
        BIN,
        "store",
        "put",
        "report",
        "written at dawn",
    ])
    .expect_success();
    let out = p.run(&["store", "get", "report"]);
    out.expect_success();
    assert_eq!(out.stdout.trim_end(), "written at dawn");

    let http = Http::new(&p.store_url());
    let stored = http.get("/v1/kv/report");
    assert_eq!(stored.status, 200);
    let stored = stored.json();
    assert_eq!(stored["lock"], "jobs/nightly");
    assert_eq!(stored["value"], "written at dawn");
    let fence = http.get("/v1/fence/jobs/nightly").json();
    assert_eq!(fence["token_max"], stored["token"]);
}

#[test]
fn a_paused_holders_late_write_is_refused_and_names_the_accepted_token() {
    let p = Palisade::start_with_store(BIN);

    // A takes the lock for a script and writes.
    let a = p.acquire("jobs/nightly", "1s");
    let mut put = p.command(&["store", "put", "report", "from A"]);
    put.env("PALISADE_SEQUENCER", &a.sequencer);
    run(put).expect_success();

    // A stalls past its lease; B waits for the lock and writes.
    p.run(&[
        "lock",
        "jobs/nightly",
        "--wait",
        "10s",
        "--",
        BIN,
        "store",
        "put",
        "report",
        "from B",
    ])
    .expect_success();
    let b_token = p
        .run(&["store", "get", "report", "--json"])
        .expect_success()
        .json()["token"]
        .as_u64()
        .unwrap();
    assert!(b_token > a.token);

    // A wakes up and writes with its old sequencer from the environment.
    let mut late = p.command(&["store", "put", "report", "late from A"]);
    late.env("PALISADE_SEQUENCER", &a.sequencer);
    let out = run(late);
    assert_ne!(out.code(), Some(0));
    out.expect_code(3);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    assert!(out.stderr.contains("stale"), "{out:?}");
    assert!(out.stderr.contains("jobs/nightly"), "{out:?}");
    assert!(
        out.stderr.contains(&format!("accepted token {b_token}")),
        "the message names the accepted token: {out:?}"
    );
    assert!(out.stderr.contains(&a.token.to_string()), "{out:?}");

    // B's write stands; A cannot write any other key of the lock either.
    let out = p.run(&["store", "get", "report"]);
    assert_eq!(out.stdout.trim_end(), "from B");
    p.run(&[
        "store",
        "put",
        "other-key",
        "x",
        "--sequencer",
        &a.sequencer,
    ])
    .expect_code(3);
    p.run(&["store", "delete", "report", "--sequencer", &a.sequencer])
        .expect_code(3);
    assert_eq!(
        p.run(&["store", "get", "report"]).stdout.trim_end(),
        "from B"
    );
}
