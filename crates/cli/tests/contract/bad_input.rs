//! Bad input: a clear error, and both services keep serving.

use palisade_testkit::Palisade;

use crate::{BIN, Contract as _};

#[test]
fn bad_input_gets_a_clear_error_and_the_services_keep_serving() {
    let p = Palisade::start_with_store(BIN);
    let long_name = "n".repeat(5000);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());

    // An oversized lock name.
    let out = p.run(&["acquire", &long_name, "--ttl", "5s"]);
    out.expect_code(1);
    assert!(out.stderr.starts_with("palisade: "), "{out:?}");
    assert!(out.stderr.contains("name"), "{out:?}");
    let out = p.run(&["lock", &long_name, "--", "sh", "-c", &touch]);
    out.expect_code(1);
    assert!(!marker.exists());
    p.run(&["status", &long_name]).expect_code(1);
    p.run(&["acquire", "", "--ttl", "5s"]).expect_code(1);

    // Zero and huge TTLs: refused as invalid input (1) or a usage error (2), never granted.
    for ttl in ["0s", "0", "1000h", "99999999999999999999s"] {
        let out = p.run(&["acquire", "bad/ttl", "--ttl", ttl]);
        assert!(
            matches!(out.code(), Some(1) | Some(2)),
            "--ttl {ttl}: {out:?}"
        );
        assert!(!out.stderr.trim().is_empty(), "--ttl {ttl}: {out:?}");
        assert!(out.stdout.trim().is_empty(), "--ttl {ttl}: {out:?}");
        let out = p.run(&["lock", "bad/ttl", "--ttl", ttl, "--", "sh", "-c", &touch]);
        assert!(
            matches!(out.code(), Some(1) | Some(2)),
            "lock --ttl {ttl}: {out:?}"
        );
    }
    assert!(!marker.exists());
    assert!(p.status("bad/ttl")["holder"].is_null());

    // Usage errors.
    p.run(&["acquire", "x"]).expect_code(2);
    p.run(&["acquire", "x", "--ttl", "banana"]).expect_code(2);
    p.run(&["no-such-command"]).expect_code(2);

    // The store: an oversized key or value is an invalid request, refused (1).
    let g = p.acquire("bad/store", "20s");
    let long_key = "k".repeat(1025);
    p.run(&["store", "put", &long_key, "v", "--sequencer", &g.sequencer])
        .expect_code(1);
    p.run(&[
        "store",
        "put",
        "bad\u{1}key",
        "v",
        "--sequencer",
        &g.sequencer,
    ])
    .expect_code(1);

    // Both services still serve.
    let ok = p.acquire("bad/after", "5s");
    assert!(ok.token > 0);
    p.run(&["store", "put", "after", "fine", "--sequencer", &g.sequencer])
        .expect_success();
    assert_eq!(p.run(&["store", "get", "after"]).stdout.trim_end(), "fine");
}
