//! Scenarios for the store's HTTP API with a real server on a loopback port: status codes and
//! JSON bodies as a curl user sees them, and the typed errors of `StoreClient`.

use palisade_store::StoreClientError::Store;
use palisade_store::limits::{BATCH_BODY_BYTES_MAX, BATCH_OPS_MAX, VALUE_BYTES_MAX};
use palisade_store::{BatchOp, StoreClient, StoreError};
use palisade_testkit::{ServiceKey, StoreServer, impostor_grant};
use serde_json::{Value, json};

const SEQUENCER: &str = "Palisade-Sequencer";
const REQUEST_ID: &str = "Palisade-Request-Id";

async fn answer(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("HTTP {status}: body is not JSON: {body:?}"));
    (status, body)
}

#[tokio::test]
async fn a_curl_user_puts_and_gets_a_value_with_the_grant_that_wrote_it() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = reqwest::Client::new();
    let holder = service.grant("jobs/nightly", 9, 4);

    let (status, ack) = answer(
        http.put(format!("{}/v1/kv/reports/today", server.url))
            .header(SEQUENCER, &holder)
            .body("Tue Dec  2 03:00:00 UTC")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(
        ack,
        json!({"lock": "jobs/nightly", "token": 9, "session": 4, "replayed": false, "revision": 1,
               "ops": [{"op": "put", "key": "reports/today", "existed": false}]})
    );

    // Reads need no sequencer. A '/' in a key works raw or percent-encoded.
    for path in ["reports/today", "reports%2Ftoday"] {
        let (status, entry) = answer(
            http.get(format!("{}/v1/kv/{path}", server.url))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(
            entry,
            json!({"key": "reports/today", "value": "Tue Dec  2 03:00:00 UTC",
                   "lock": "jobs/nightly", "token": 9, "session": 4, "revision": 1})
        );
    }

    // The raw form returns the bytes, with the grant in headers.
    let raw = http
        .get(format!("{}/v1/kv/reports/today?format=raw", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.headers()["palisade-token"], "9");
    assert_eq!(raw.headers()["palisade-lock"], "jobs/nightly");
    assert_eq!(raw.headers()["palisade-revision"], "1");
    assert_eq!(raw.headers()["etag"], "\"1\"");
    assert_eq!(raw.text().await.unwrap(), "Tue Dec  2 03:00:00 UTC");

    // Binary values come back base64-encoded in JSON.
    http.put(format!("{}/v1/kv/blob", server.url))
        .header(SEQUENCER, &holder)
        .body(vec![0xff, 0x00, 0xfe])
        .send()
        .await
        .unwrap();
    let (_, entry) = answer(
        http.get(format!("{}/v1/kv/blob", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(entry["value_base64"], "/wD+");
    let client = StoreClient::new(&server.url).unwrap();
    assert_eq!(
        client.get("blob").await.unwrap().unwrap().value,
        vec![0xff, 0x00, 0xfe]
    );

    let (status, missing) = answer(
        http.get(format!("{}/v1/kv/nothing", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &missing["kind"]), (404, &json!("not_found")));
}

#[tokio::test]
async fn each_refusal_has_its_status_and_a_json_body_that_explains_it() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = reqwest::Client::new();
    let put = |sequencer: Option<String>, key: &str, value: &str| {
        let mut request = http
            .put(format!("{}/v1/kv/{key}", server.url))
            .body(value.to_owned());
        if let Some(sequencer) = sequencer {
            request = request.header(SEQUENCER, sequencer);
        }
        request.send()
    };
    let (status, _) = answer(
        put(Some(service.grant("jobs/nightly", 9, 4)), "report", "9")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);

    // Stale: the superseded holder learns who superseded it.
    let (status, stale) = answer(
        put(Some(service.grant("jobs/nightly", 7, 3)), "report", "7")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        (
            &stale["kind"],
            &stale["lock"],
            &stale["presented"],
            &stale["accepted"],
            &stale["holder_session"]
        ),
        (
            &json!("stale"),
            &json!("jobs/nightly"),
            &json!(7),
            &json!(9),
            &json!(4)
        )
    );
    assert!(
        stale["message"]
            .as_str()
            .unwrap()
            .contains("has accepted token 9"),
        "{stale}"
    );

    // Missing: 428, the sequencer being a precondition of the write.
    let response = put(None, "report", "x").await.unwrap();
    let (status, missing) = answer(response).await;
    assert_eq!((status, &missing["kind"]), (428, &json!("missing")));

    // Forged, malformed, another lock's.
    let cases = [
        (impostor_grant("jobs/nightly", 1_000_000, 1), 403, "forged"),
        ("pal1.garbage".to_owned(), 400, "malformed"),
        (service.grant("jobs/other", 100, 5), 403, "wrong_lock"),
    ];
    for (sequencer, expected_status, kind) in cases {
        let (status, body) = answer(put(Some(sequencer), "report", "x").await.unwrap()).await;
        assert_eq!(
            (status, body["kind"].as_str().unwrap()),
            (expected_status, kind),
            "{body}"
        );
        assert!(body["message"].is_string());
    }

    // A header that is not ASCII is malformed, not a crash.
    let (status, body) = answer(
        http.put(format!("{}/v1/kv/report", server.url))
            .header(
                SEQUENCER,
                reqwest::header::HeaderValue::from_bytes(b"pal1\xff").unwrap(),
            )
            .body("x")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["kind"]), (400, &json!("malformed")));

    // Nothing of it reached the data.
    let (_, entry) = answer(
        http.get(format!("{}/v1/kv/report", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((&entry["value"], &entry["token"]), (&json!("9"), &json!(9)));
}

#[tokio::test]
async fn oversized_values_and_batches_get_413_naming_the_limit_and_the_server_keeps_serving() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = reqwest::Client::new();
    let holder = service.grant("jobs/nightly", 1, 1);

    let (status, body) = answer(
        http.put(format!("{}/v1/kv/big", server.url))
            .header(SEQUENCER, &holder)
            .body(vec![b'x'; VALUE_BYTES_MAX + 1])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, &body["kind"], &body["limit"]),
        (413, &json!("too_large"), &json!("value_bytes_max"))
    );
    assert_eq!(body["size_max"], json!(VALUE_BYTES_MAX));

    let key = "k".repeat(2000);
    let (status, body) = answer(
        http.put(format!("{}/v1/kv/{key}", server.url))
            .header(SEQUENCER, &holder)
            .body("x")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["limit"]), (413, &json!("key_bytes_max")));

    let ops: Vec<Value> = (0..=BATCH_OPS_MAX)
        .map(|i| json!({"op": "put", "key": format!("k{i}"), "value": "v"}))
        .collect();
    let (status, body) = answer(
        http.post(format!("{}/v1/batch", server.url))
            .header(SEQUENCER, &holder)
            .json(&json!({ "ops": ops }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["limit"]), (413, &json!("batch_ops_max")));

    let (status, body) = answer(
        http.post(format!("{}/v1/batch", server.url))
            .header(SEQUENCER, &holder)
            .body(vec![b' '; BATCH_BODY_BYTES_MAX + 1])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, &body["limit"]),
        (413, &json!("batch_body_bytes_max"))
    );

    // Still serving, and a value at the limit is accepted.
    let (status, _) = answer(
        http.put(format!("{}/v1/kv/big", server.url))
            .header(SEQUENCER, &holder)
            .body(vec![b'x'; VALUE_BYTES_MAX])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_batch_over_http_is_one_fenced_unit_and_bad_json_is_a_400() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = reqwest::Client::new();
    let nightly = service.grant("jobs/nightly", 3, 1);
    http.put(format!("{}/v1/kv/theirs", server.url))
        .header(SEQUENCER, service.grant("jobs/other", 1, 2))
        .body("keep")
        .send()
        .await
        .unwrap();

    let batch = |body: Value| {
        http.post(format!("{}/v1/batch", server.url))
            .header(SEQUENCER, &nightly)
            .json(&body)
            .send()
    };
    let (status, body) = answer(
        batch(json!({"ops": [
            {"op": "put", "key": "mine", "value": "v"},
            {"op": "delete", "key": "theirs"}
        ]}))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (status, &body["kind"], &body["key"]),
        (403, &json!("wrong_lock"), &json!("theirs"))
    );
    let (status, _) = answer(
        http.get(format!("{}/v1/kv/mine", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404, "the put of a refused batch must not land");

    let (status, body) = answer(
        batch(json!({"ops": [
            {"op": "put", "key": "mine", "value": "v"},
            {"op": "put", "key": "bin", "value_base64": "AAE="},
            {"op": "delete", "key": "gone"}
        ]}))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ops"].as_array().unwrap().len(), 3);

    for bad in [
        json!({"ops": "nope"}),
        json!({"ops": [{"op": "put", "key": "k"}]}),
        json!({"ops": [{"op": "delete", "key": "k", "value": "v"}]}),
        json!({"ops": [{"op": "rename", "key": "k"}]}),
        json!({"ops": []}),
    ] {
        let (status, body) = answer(batch(bad.clone()).await.unwrap()).await;
        assert_eq!(
            (status, &body["kind"]),
            (400, &json!("invalid_request")),
            "{bad}: {body}"
        );
    }
}

#[tokio::test]
async fn a_retried_http_write_with_the_same_request_id_is_answered_but_not_applied_again() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = reqwest::Client::new();
    let holder = service.grant("jobs/nightly", 2, 1);
    let put = |value: &'static str, request_id: &'static str| {
        http.put(format!("{}/v1/kv/counter", server.url))
            .header(SEQUENCER, &holder)
            .header(REQUEST_ID, request_id)
            .body(value)
            .send()
    };

    let (_, first) = answer(put("1", "r1").await.unwrap()).await;
    answer(put("2", "r2").await.unwrap()).await;
    let (status, retry) = answer(put("1", "r1").await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&first["replayed"], &retry["replayed"]),
        (&json!(false), &json!(true))
    );
    assert_eq!(retry["request_id"], "r1");
    let (_, entry) = answer(
        http.get(format!("{}/v1/kv/counter", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(entry["value"], "2");

    let (status, body) = answer(put("other", "r1").await.unwrap()).await;
    assert_eq!((status, &body["kind"]), (422, &json!("request_id_reused")));
}

#[tokio::test]
async fn fence_health_and_unknown_routes_answer_json() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let http = reqwest::Client::new();
    http.put(format!("{}/v1/kv/report", server.url))
        .header(SEQUENCER, service.grant("jobs/nightly", 12, 3))
        .body("x")
        .send()
        .await
        .unwrap();

    let (status, fence) = answer(
        http.get(format!("{}/v1/fence/jobs/nightly", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        fence,
        json!({"lock": "jobs/nightly", "token_max": 12, "holder_session": 3})
    );
    let (_, never) = answer(
        http.get(format!("{}/v1/fence/never", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(never["token_max"], Value::Null);

    let (status, health) = answer(
        http.get(format!("{}/healthz", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));

    let (status, body) = answer(
        http.get(format!("{}/v2/whatever", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["kind"]), (404, &json!("no_such_route")));
    let (status, body) = answer(
        http.post(format!("{}/v1/kv/report", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["kind"]), (405, &json!("method_not_allowed")));
    let (status, body) = answer(
        http.put(format!("{}/v1/kv/", server.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["kind"]), (400, &json!("invalid_key")));
}

#[tokio::test]
async fn the_client_returns_the_servers_refusals_as_typed_errors() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let client = StoreClient::new(&server.url).unwrap();
    let new = service.grant("jobs/nightly", 9, 4);
    let old = service.grant("jobs/nightly", 7, 3);

    client.put("report", b"v9", Some(&new), None).await.unwrap();
    assert_eq!(
        client
            .put("report", b"v7", Some(&old), None)
            .await
            .unwrap_err(),
        Store(StoreError::Stale {
            lock: "jobs/nightly".into(),
            presented: 7,
            accepted: 9,
            holder_session: Some(4),
        })
    );
    assert_eq!(
        client.put("report", b"x", None, None).await.unwrap_err(),
        Store(StoreError::Missing)
    );
    let forged = impostor_grant("jobs/nightly", 99, 1);
    assert!(matches!(
        client
            .delete("report", Some(&forged), None)
            .await
            .unwrap_err(),
        Store(StoreError::Forged { .. })
    ));
    let wrong = service.grant("jobs/other", 1, 1);
    assert!(matches!(
        client.batch(&[BatchOp::Delete { key: "report".into() }], Some(&wrong), None).await.unwrap_err(),
        Store(StoreError::WrongLock { key: Some(key), .. }) if key == "report"
    ));
    assert!(matches!(
        client.put("report", &vec![0; VALUE_BYTES_MAX + 1], Some(&new), None).await.unwrap_err(),
        Store(StoreError::TooLarge { limit, .. }) if limit == "value_bytes_max"
    ));
    assert_eq!(client.get("absent").await.unwrap(), None);
    assert_eq!(
        client.fence("jobs/nightly").await.unwrap().token_max,
        Some(9)
    );
    client.health().await.unwrap();

    // A stopped server is "unavailable": nothing was applied, safe to retry.
    let url = server.url.clone();
    server.stop().await;
    let error = StoreClient::new(&url)
        .unwrap()
        .put("report", b"x", Some(&new), Some("r"))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(error.kind(), "unavailable");
}

/// A write without a sequencer has the status the fence gives a missing sequencer everywhere
/// (`FenceError::http_status`): 428 Precondition Required, not 401, which HTTP clients read as
/// "fix your credentials", and without a `WWW-Authenticate` challenge, which only a 401 carries.
#[tokio::test]
async fn a_missing_sequencer_is_428_as_the_fence_says_and_carries_no_credential_challenge() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let response = reqwest::Client::new()
        .put(format!("{}/v1/kv/report", server.url))
        .body("x")
        .send()
        .await
        .unwrap();
    let challenge = response.headers().get("www-authenticate").cloned();
    let (status, body) = answer(response).await;
    assert_eq!(
        (status, &body["kind"]),
        (
            palisade_fence::FenceError::Missing.http_status(),
            &json!("missing")
        )
    );
    assert_eq!(status, 428);
    assert_eq!(challenge, None);
    assert_eq!(StoreError::Missing.http_status(), 428);
}
