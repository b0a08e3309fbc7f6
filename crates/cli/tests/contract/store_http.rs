//! The fenced store's HTTP API, per `crates/store/docs/store-http.md`.

use palisade_testkit::Palisade;
use serde_json::{Value, json};

use crate::{BIN, Contract as _, Http, expect_error, id_string};

#[test]
fn store_http_writes_reads_and_replays() {
    let p = Palisade::start_with_store(BIN);
    let g = p.acquire("http/a", "20s");
    let http = Http::new(&p.store_url());

    let health = http.get("/healthz");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");

    // PUT a key containing '/'.
    let put = http.put("/v1/kv/reports/today", &g.sequencer, "sunny");
    assert_eq!(put.status, 200);
    let v = put.json();
    assert_eq!(v["lock"], "http/a");
    assert_eq!(v["token"], g.token);
    assert_eq!(id_string(&v["session"]), g.session);
    assert_eq!(v["replayed"], false);
    assert_eq!(
        v["ops"],
        json!([{"op": "put", "key": "reports/today", "existed": false}])
    );

    // GET as JSON, with %2F, and raw.
    let got = http.get("/v1/kv/reports/today");
    assert_eq!(got.status, 200);
    let v = got.json();
    assert_eq!(v["key"], "reports/today");
    assert_eq!(v["value"], "sunny");
    assert_eq!(v["lock"], "http/a");
    assert_eq!(v["token"], g.token);
    assert_eq!(http.get("/v1/kv/reports%2Ftoday").json()["value"], "sunny");
    let raw = http.get("/v1/kv/reports/today?format=raw");
    assert_eq!(raw.status, 200);
    assert_eq!(raw.body, b"sunny");
    assert_eq!(raw.header("palisade-token"), Some(g.token.to_string()));
    assert_eq!(raw.header("palisade-session"), Some(g.session.clone()));
    assert_eq!(raw.header("palisade-lock").as_deref(), Some("http/a"));

    // Binary values come back as value_base64.
    let bin = http.send(
        "PUT",
        "/v1/kv/bin",
        &[("Palisade-Sequencer", &g.sequencer)],
        vec![0u8, 1, 0xff],
    );
    assert_eq!(bin.status, 200);
    let v = http.get("/v1/kv/bin").json();
    assert!(v.get("value").is_none_or(Value::is_null), "{v}");
    assert_eq!(v["value_base64"], "AAH/");

    // Request ids: a retry is answered, not applied again; a different write is refused.
    let with_id = |body: &str| {
        http.send(
            "PUT",
            "/v1/kv/counter",
            &[
                ("Palisade-Sequencer", &g.sequencer),
                ("Palisade-Request-Id", "retry-1"),
            ],
            body.to_owned(),
        )
    };
    let first = with_id("1");
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["replayed"], false);
    let again = with_id("1");
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["replayed"], true);
    let body = expect_error(&with_id("2"), 422, "request_id_reused");
    assert_eq!(body["request_id"], "retry-1");
    assert_eq!(http.get("/v1/kv/counter").json()["value"], "1");

    // DELETE: existed, then not found, then deleting again still succeeds.
    let del = http.send(
        "DELETE",
        "/v1/kv/reports/today",
        &[("Palisade-Sequencer", &g.sequencer)],
        Vec::new(),
    );
    assert_eq!(del.status, 200);
    assert_eq!(
        del.json()["ops"],
        json!([{"op": "delete", "key": "reports/today", "existed": true}])
    );
    let body = expect_error(&http.get("/v1/kv/reports/today"), 404, "not_found");
    assert_eq!(body["key"], "reports/today");
    let del = http.send(
        "DELETE",
        "/v1/kv/reports/today",
        &[("Palisade-Sequencer", &g.sequencer)],
        Vec::new(),
    );
    assert_eq!(del.status, 200);
    assert_eq!(del.json()["ops"][0]["existed"], false);

    // Batch: all applied in order.
    let batch = http.send(
        "POST",
        "/v1/batch",
        &[
            ("Palisade-Sequencer", &g.sequencer),
            ("Content-Type", "application/json"),
        ],
        json!({"ops": [
            {"op": "put", "key": "a", "value": "text"},
            {"op": "put", "key": "b", "value_base64": "//8="},
            {"op": "delete", "key": "counter"}
        ]})
        .to_string(),
    );
    assert_eq!(
        batch.status,
        200,
        "{}",
        String::from_utf8_lossy(&batch.body)
    );
    assert_eq!(batch.json()["ops"].as_array().unwrap().len(), 3);
    assert_eq!(http.get("/v1/kv/a").json()["value"], "text");
    assert_eq!(http.get("/v1/kv/b").json()["value_base64"], "//8=");
    assert_eq!(http.get("/v1/kv/counter").status, 404);

    // The fence: what was accepted, and null for a lock never written.
    let fence = http.get("/v1/fence/http/a").json();
    assert_eq!(fence["lock"], "http/a");
    assert_eq!(fence["token_max"], g.token);
    assert_eq!(id_string(&fence["holder_session"]), g.session);
    let never = http.get("/v1/fence/http/never").json();
    assert!(never["token_max"].is_null() && never["holder_session"].is_null());
}

#[test]
fn store_http_rejections_have_documented_statuses_and_kinds() {
    let p = Palisade::start_with_store(BIN);
    let old = p.acquire("http/e", "20s");
    let other = p.acquire("http/other", "20s");
    let http = Http::new(&p.store_url());
    assert_eq!(http.put("/v1/kv/doc", &old.sequencer, "v0").status, 200);

    // 428 missing, without a credential challenge.
    let resp = http.send("PUT", "/v1/kv/doc", &[], "x");
    expect_error(&resp, 428, "missing");
    assert_eq!(resp.header("www-authenticate"), None);
    // 400 malformed.
    expect_error(&http.put("/v1/kv/doc", "garbage", "x"), 400, "malformed");
    // 403 wrong_lock.
    let body = expect_error(
        &http.put("/v1/kv/doc", &other.sequencer, "x"),
        403,
        "wrong_lock",
    );
    assert_eq!(body["key"], "doc");
    assert_eq!(body["expected"], "http/e");
    assert_eq!(body["presented"], "http/other");

    // 409 stale, after a newer grant of the lock has written.
    p.run(&["release", "http/e", "--session", &old.credential])
        .expect_success();
    let new = p.acquire("http/e", "20s");
    assert!(new.token > old.token);
    assert_eq!(http.put("/v1/kv/doc", &new.sequencer, "v1").status, 200);
    assert_eq!(
        http.put("/v1/kv/doc", &new.sequencer, "v2").status,
        200,
        "equal token"
    );
    let body = expect_error(
        &http.put("/v1/kv/doc", &old.sequencer, "late"),
        409,
        "stale",
    );
    assert_eq!(body["lock"], "http/e");
    assert_eq!(body["presented"], old.token);
    assert_eq!(body["accepted"], new.token);
    assert_eq!(id_string(&body["holder_session"]), new.session);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&new.token.to_string())
    );
    // Stale on any key of the lock, even one the new holder never touched.
    expect_error(
        &http.put("/v1/kv/untouched", &old.sequencer, "late"),
        409,
        "stale",
    );
    assert_eq!(http.get("/v1/kv/doc").json()["value"], "v2");

    // A batch that touches a key of another lock writes nothing.
    let batch = http.send(
        "POST",
        "/v1/batch",
        &[
            ("Palisade-Sequencer", &other.sequencer),
            ("Content-Type", "application/json"),
        ],
        json!({"ops": [
            {"op": "put", "key": "fresh", "value": "x"},
            {"op": "put", "key": "doc", "value": "x"}
        ]})
        .to_string(),
    );
    expect_error(&batch, 403, "wrong_lock");
    assert_eq!(http.get("/v1/kv/fresh").status, 404);
    assert!(http.get("/v1/fence/http/other").json()["token_max"].is_null());
    // An empty batch is an invalid request.
    let empty = http.send(
        "POST",
        "/v1/batch",
        &[
            ("Palisade-Sequencer", &new.sequencer),
            ("Content-Type", "application/json"),
        ],
        json!({"ops": []}).to_string(),
    );
    expect_error(&empty, 400, "invalid_request");

    // Bad keys and sizes.
    expect_error(
        &http.put("/v1/kv/bad%01key", &new.sequencer, "x"),
        400,
        "invalid_key",
    );
    let long_key = "k".repeat(1025);
    let body = expect_error(
        &http.put(&format!("/v1/kv/{long_key}"), &new.sequencer, "x"),
        413,
        "too_large",
    );
    assert_eq!(body["limit"], "key_bytes_max");
    let big = "v".repeat(1024 * 1024 + 1);
    let body = expect_error(
        &http.put("/v1/kv/big", &new.sequencer, &big),
        413,
        "too_large",
    );
    assert_eq!(body["limit"], "value_bytes_max");
    let exactly = "v".repeat(1024 * 1024);
    assert_eq!(http.put("/v1/kv/big", &new.sequencer, &exactly).status, 200);
    let long_id = "r".repeat(129);
    let resp = http.send(
        "PUT",
        "/v1/kv/doc",
        &[
            ("Palisade-Sequencer", &new.sequencer),
            ("Palisade-Request-Id", &long_id),
        ],
        "x",
    );
    assert!(resp.status == 413 || resp.status == 400, "{}", resp.status);

    // Unknown routes and methods.
    let body = expect_error(&http.get("/v1/nope"), 404, "no_such_route");
    assert_eq!(body["method"], "GET");
    assert_eq!(body["path"], "/v1/nope");
    let body = expect_error(
        &http.send("POST", "/v1/kv/doc", &[], "x"),
        405,
        "method_not_allowed",
    );
    assert_eq!(body["method"], "POST");

    // Every error carries a message a person can act on.
    for resp in [
        http.put("/v1/kv/doc", "garbage", "x"),
        http.put("/v1/kv/doc", &old.sequencer, "x"),
        http.get("/v1/kv/never-written"),
    ] {
        let body = resp.json();
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
}
