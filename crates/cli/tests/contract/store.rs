//! The fenced store from the command line: `palisade store put|get|delete|fence`.

use palisade_testkit::{Palisade, run};

use crate::{BIN, Contract as _, Http, expect_error, flip_signature_char, with_forged_token};

#[test]
fn store_put_get_delete_take_the_sequencer_from_the_flag_or_the_environment() {
    let p = Palisade::start_with_store(BIN);
    let g = p.acquire("kv/lock", "20s");

    p.run(&[
        "store",
        "put",
        "greeting",
        "hello",
        "--sequencer",
        &g.sequencer,
    ])
    .expect_success();
    let out = p.run(&["store", "get", "greeting"]);
    out.expect_success();
    assert_eq!(out.stdout.trim_end(), "hello");
    let v = p
        .run(&["store", "get", "greeting", "--json"])
        .expect_success()
        .json();
    assert_eq!(v["key"], "greeting");
    assert_eq!(v["value"], "hello");
    assert_eq!(v["lock"], "kv/lock");
    assert_eq!(v["token"], g.token);

    // $PALISADE_SEQUENCER is the default.
    let mut put = p.command(&["store", "put", "greeting", "hello again"]);
    put.env("PALISADE_SEQUENCER", &g.sequencer);
    run(put).expect_success();
    assert_eq!(
        p.run(&["store", "get", "greeting"]).stdout.trim_end(),
        "hello again"
    );

    // No sequencer at all: refused (1, the binary's one "refused"), nothing written.
    let out = p.run(&["store", "put", "greeting", "unfenced"]);
    out.expect_code(1);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    p.run(&["store", "delete", "greeting"]).expect_code(1);
    assert_eq!(
        p.run(&["store", "get", "greeting"]).stdout.trim_end(),
        "hello again"
    );

    // delete, fenced by the environment's sequencer; then the key is gone (5).
    let mut delete = p.command(&["store", "delete", "greeting"]);
    delete.env("PALISADE_SEQUENCER", &g.sequencer);
    run(delete).expect_success();
    let out = p.run(&["store", "get", "greeting"]);
    out.expect_code(5);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    p.run(&["store", "delete", "greeting", "--sequencer", &g.sequencer])
        .expect_success();

    // What the store has accepted for the lock.
    let fence = p
        .run(&["store", "fence", "kv/lock", "--json"])
        .expect_success()
        .json();
    assert_eq!(fence["token_max"], g.token);
}

#[test]
fn forged_and_malformed_sequencers_are_refused_distinctly_from_stale_ones() {
    let p = Palisade::start_with_store(BIN);
    let g = p.acquire("kv/forge", "20s");

    // A huge token with the honest signature: forged, exit 1 (not 3, not 0).
    let huge = with_forged_token(&g.sequencer, g.token + 1_000_000);
    let out = p.run(&["store", "put", "k", "evil", "--sequencer", &huge]);
    out.expect_code(1);
    assert!(!out.stderr.contains("stale"), "{out:?}");

    // One character of the signature changed.
    let flipped = flip_signature_char(&g.sequencer);
    assert_ne!(flipped, g.sequencer);
    let mut put = p.command(&["store", "put", "k", "evil"]);
    put.env("PALISADE_SEQUENCER", &flipped);
    let out = run(put);
    out.expect_code(1);
    assert!(!out.stderr.contains("stale"), "{out:?}");

    // Truncated.
    let truncated = &g.sequencer[..g.sequencer.len() / 2];
    p.run(&["store", "put", "k", "evil", "--sequencer", truncated])
        .expect_code(1);

    // None of that moved the fence: the honest holder still writes.
    p.run(&["store", "get", "k"]).expect_code(5);
    p.run(&["store", "put", "k", "honest", "--sequencer", &g.sequencer])
        .expect_success();
    let fence = p
        .run(&["store", "fence", "kv/forge", "--json"])
        .expect_success()
        .json();
    assert_eq!(fence["token_max"], g.token);

    // Over HTTP the two refusals have their own kinds.
    let http = Http::new(&p.store_url());
    expect_error(&http.put("/v1/kv/k", &huge, "evil"), 403, "forged");
    expect_error(&http.put("/v1/kv/k", &flipped, "evil"), 403, "forged");
    expect_error(&http.put("/v1/kv/k", truncated, "evil"), 400, "malformed");
}

#[test]
fn store_refuses_another_locks_sequencer_for_a_bound_key() {
    let p = Palisade::start_with_store(BIN);
    let mine = p.acquire("kv/mine", "20s");
    let theirs = p.acquire("kv/theirs", "20s");
    p.run(&[
        "store",
        "put",
        "bound",
        "v1",
        "--sequencer",
        &mine.sequencer,
    ])
    .expect_success();
    let out = p.run(&[
        "store",
        "put",
        "bound",
        "v2",
        "--sequencer",
        &theirs.sequencer,
    ]);
    out.expect_code(1);
    // Deleting keeps the binding.
    p.run(&["store", "delete", "bound", "--sequencer", &mine.sequencer])
        .expect_success();
    p.run(&[
        "store",
        "put",
        "bound",
        "v3",
        "--sequencer",
        &theirs.sequencer,
    ])
    .expect_code(1);
    p.run(&["store", "get", "bound"]).expect_code(5);
}
