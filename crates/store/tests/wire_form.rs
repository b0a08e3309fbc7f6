//! The HTTP wire form of every store error kind, pinned byte for byte: the status and the JSON
//! body the server sends (and `palisade store --json` prints). The Python client, scripts and
//! `crates/store/docs/store-http.md` read these; a change here is a change of the HTTP API.

use palisade_store::StoreClientError::{self, Http, Store};
use palisade_store::{HttpRefusal, StoreError, wire};

/// One example of every kind (two where a field may be left out), its HTTP status, and its
/// JSON body exactly as sent.
fn golden() -> Vec<(StoreClientError, u16, &'static str)> {
    let detail = || "the detail".to_owned();
    vec![
        (
            Store(StoreError::Stale {
                lock: "jobs/nightly".into(),
                presented: 7,
                accepted: 9,
                holder_session: Some(4),
            }),
            409,
            r#"{"accepted":9,"holder_session":4,"kind":"stale","lock":"jobs/nightly","message":"token 7 for lock \"jobs/nightly\" is stale; the store has accepted token 9 (presented by session 4): a newer holder has claimed, read or written here; re-acquire the lock and re-read before writing","presented":7}"#,
        ),
        (
            Store(StoreError::Stale {
                lock: "jobs/nightly".into(),
                presented: 7,
                accepted: 9,
                holder_session: None,
            }),
            409,
            r#"{"accepted":9,"holder_session":null,"kind":"stale","lock":"jobs/nightly","message":"token 7 for lock \"jobs/nightly\" is stale; the store has accepted token 9: a newer holder has claimed, read or written here; re-acquire the lock and re-read before writing","presented":7}"#,
        ),
        (
            Store(StoreError::TokenReissued {
                lock: "jobs/nightly".into(),
                token: 9,
                first_session: 4,
                presented_session: 5,
            }),
            409,
            r#"{"first_session":4,"kind":"token_reissued","lock":"jobs/nightly","message":"token 9 of lock \"jobs/nightly\" was first presented to the store by session 4, and session 5 presents it now: the lock service issued this token twice (restored from a backup, or its log was lost or rolled back), so this grant is refused; tell the lock service's operator, then release the lock and acquire it again for a newer token","presented_session":5,"token":9}"#,
        ),
        (
            Store(StoreError::WrongLock {
                key: Some("report".into()),
                expected: "jobs/nightly".into(),
                presented: "jobs/other".into(),
            }),
            403,
            r#"{"expected":"jobs/nightly","key":"report","kind":"wrong_lock","message":"key \"report\" is protected by lock \"jobs/nightly\", but the sequencer is for lock \"jobs/other\": acquire \"jobs/nightly\" to write it","presented":"jobs/other"}"#,
        ),
        (
            Store(StoreError::WrongLock {
                key: None,
                expected: "jobs/nightly".into(),
                presented: "jobs/other".into(),
            }),
            403,
            r#"{"expected":"jobs/nightly","kind":"wrong_lock","message":"this resource is protected by lock \"jobs/nightly\", but the sequencer is for lock \"jobs/other\": acquire \"jobs/nightly\" to write it","presented":"jobs/other"}"#,
        ),
        (
            Store(StoreError::SharedWrite {
                lock: "jobs".into(),
                token: 6,
            }),
            403,
            r#"{"kind":"shared_write","lock":"jobs","message":"a reader (shared grant) cannot write: token 6 of lock \"jobs\" is a shared grant, so this write is refused; acquire the lock exclusive to write","token":6}"#,
        ),
        (
            Store(StoreError::Unbound {
                key: "report".into(),
            }),
            403,
            r#"{"key":"report","kind":"unbound","message":"key \"report\" is not bound to any lock by the store's bindings: no holder may write it; ask the store's operator to bind its prefix to your lock"}"#,
        ),
        (
            Store(StoreError::Missing),
            428,
            r#"{"kind":"missing","message":"no sequencer presented: writes need the lock holder's sequencer (run under `palisade lock NAME -- …`, pass --sequencer, or send the Palisade-Sequencer header)"}"#,
        ),
        (
            Store(StoreError::Malformed { message: detail() }),
            400,
            r#"{"detail":"the detail","kind":"malformed","message":"malformed sequencer: the detail"}"#,
        ),
        (
            Store(StoreError::Forged { message: detail() }),
            403,
            r#"{"detail":"the detail","kind":"forged","message":"forged sequencer: the detail"}"#,
        ),
        (
            Store(StoreError::TooLarge {
                what: "value".into(),
                limit: "value_bytes_max".into(),
                size: Some(2_000_000),
                size_max: 1_048_576,
            }),
            413,
            r#"{"kind":"too_large","limit":"value_bytes_max","message":"value is too large: 2000000, but value_bytes_max is 1048576","size":2000000,"size_max":1048576,"what":"value"}"#,
        ),
        (
            Store(StoreError::TooLarge {
                what: "value".into(),
                limit: "value_bytes_max".into(),
                size: None,
                size_max: 1_048_576,
            }),
            413,
            r#"{"kind":"too_large","limit":"value_bytes_max","message":"value is too large: value_bytes_max is 1048576","size":null,"size_max":1048576,"what":"value"}"#,
        ),
        (
            Store(StoreError::InvalidKey { message: detail() }),
            400,
            r#"{"detail":"the detail","kind":"invalid_key","message":"invalid key: the detail"}"#,
        ),
        (
            Store(StoreError::InvalidRequest { message: detail() }),
            400,
            r#"{"detail":"the detail","kind":"invalid_request","message":"invalid request: the detail"}"#,
        ),
        (
            Store(StoreError::RequestIdReused {
                request_id: "r-1".into(),
            }),
            422,
            r#"{"kind":"request_id_reused","message":"request id \"r-1\" was already used with this sequencer for a different request: use a fresh request id for a new request","request_id":"r-1"}"#,
        ),
        (
            Store(StoreError::QuotaReached {
                lock: "jobs/nightly".into(),
                quota: "keys".into(),
                used: 11,
                quota_max: 10,
            }),
            507,
            r#"{"kind":"quota_reached","lock":"jobs/nightly","message":"lock \"jobs/nightly\" is at its quota of keys in this store: the write would make it 11, over 10; nothing was applied. Delete keys under it, or ask the store's operator to raise the quota","quota":"keys","quota_max":10,"used":11}"#,
        ),
        (
            Store(StoreError::NotFound {
                key: "report".into(),
            }),
            404,
            r#"{"key":"report","kind":"not_found","message":"key \"report\" not found"}"#,
        ),
        (
            Store(StoreError::CompareFailed {
                compare: 1,
                key: "report".into(),
                revision: 0,
            }),
            412,
            r#"{"compare":1,"key":"report","kind":"compare_failed","message":"compare 1 failed: key \"report\" is absent: nothing was applied; re-read the key and decide again","revision":0}"#,
        ),
        (
            Store(StoreError::CompareFailed {
                compare: 0,
                key: "report".into(),
                revision: 12,
            }),
            412,
            r#"{"compare":0,"key":"report","kind":"compare_failed","message":"compare 0 failed: key \"report\" is at revision 12: nothing was applied; re-read the key and decide again","revision":12}"#,
        ),
        (
            Http(HttpRefusal::NoSuchRoute {
                method: "GET".into(),
                path: "/v2/kv".into(),
            }),
            404,
            r#"{"kind":"no_such_route","message":"no route for GET /v2/kv: see docs/store-http.md for the API","method":"GET","path":"/v2/kv"}"#,
        ),
        (
            Http(HttpRefusal::MethodNotAllowed {
                method: "PATCH".into(),
                path: "/v1/kv/report".into(),
            }),
            405,
            r#"{"kind":"method_not_allowed","message":"method PATCH is not allowed on /v1/kv/report","method":"PATCH","path":"/v1/kv/report"}"#,
        ),
        (
            Http(HttpRefusal::MisdirectedRequest {
                host: "evil.example".into(),
            }),
            421,
            r#"{"host":"evil.example","kind":"misdirected_request","message":"the store does not answer to the host name \"evil.example\": it answers to localhost, IP addresses and the names given with --store-host (PALISADE_STORE_HOST); if you reach it by that name on purpose, start palisade store serve with --store-host NAME"}"#,
        ),
        (
            Store(StoreError::Corrupt { message: detail() }),
            500,
            r#"{"detail":"the detail","kind":"corrupt","message":"store data is corrupt: the detail"}"#,
        ),
        (
            Store(StoreError::Storage { message: detail() }),
            503,
            r#"{"detail":"the detail","kind":"storage","message":"store storage error: the detail"}"#,
        ),
        (
            Store(StoreError::Unavailable { message: detail() }),
            503,
            r#"{"detail":"the detail","kind":"unavailable","message":"store unavailable: the detail"}"#,
        ),
        (
            Store(StoreError::OutcomeUnknown { message: detail() }),
            504,
            r#"{"detail":"the detail","kind":"outcome_unknown","message":"outcome unknown: the detail; retry with the same request id to learn whether it was applied"}"#,
        ),
        (
            StoreClientError::UnexpectedResponse {
                status: 502,
                message: detail(),
            },
            502,
            r#"{"detail":"the detail","kind":"unexpected_response","message":"unexpected response from the store (HTTP 502): the detail","status":502}"#,
        ),
        // The client's own failures print as the store's kinds of the same meaning.
        (
            StoreClientError::InvalidRequest { message: detail() },
            400,
            r#"{"detail":"the detail","kind":"invalid_request","message":"invalid request: the detail"}"#,
        ),
        (
            StoreClientError::Unavailable { message: detail() },
            503,
            r#"{"detail":"the detail","kind":"unavailable","message":"store unavailable: the detail"}"#,
        ),
        (
            StoreClientError::OutcomeUnknown { message: detail() },
            504,
            r#"{"detail":"the detail","kind":"outcome_unknown","message":"outcome unknown: the detail; retry with the same request id to learn whether it was applied"}"#,
        ),
    ]
}

/// The place of each kind of the schema: an exhaustive match, so a kind added to
/// [`wire::WireError`] does not compile here until the table has an example of it.
fn kind_index(error: &wire::WireError) -> usize {
    use wire::WireError as W;
    match error {
        W::Stale { .. } => 0,
        W::TokenReissued { .. } => 1,
        W::WrongLock { .. } => 2,
        W::Unbound { .. } => 3,
        W::Missing => 4,
        W::Malformed { .. } => 5,
        W::Forged { .. } => 6,
        W::TooLarge { .. } => 7,
        W::InvalidKey { .. } => 8,
        W::InvalidRequest { .. } => 9,
        W::RequestIdReused { .. } => 10,
        W::QuotaReached { .. } => 11,
        W::NotFound { .. } => 12,
        W::CompareFailed { .. } => 13,
        W::NoSuchRoute { .. } => 14,
        W::MethodNotAllowed { .. } => 15,
        W::MisdirectedRequest { .. } => 16,
        W::Corrupt { .. } => 17,
        W::Storage { .. } => 18,
        W::Unavailable { .. } => 19,
        W::OutcomeUnknown { .. } => 20,
        W::UnexpectedResponse { .. } => 21,
        W::SharedWrite { .. } => 22,
    }
}
const KINDS: usize = 23;

#[test]
fn every_kind_has_the_status_and_the_json_body_it_always_had() {
    let mut seen = [false; KINDS];
    for (error, status, json) in golden() {
        let printed = serde_json::to_string(&error.to_json()).unwrap();
        assert_eq!(
            (error.http_status(), printed.as_str()),
            (status, json),
            "{error:?}"
        );
        // What the server sends of the same error: the same status and bytes.
        let sent = match &error {
            Store(refusal) => Some((refusal.http_status(), refusal.to_json())),
            Http(refusal) => Some((
                refusal.http_status(),
                wire::ErrorBody::from(refusal).to_json(),
            )),
            _ => None,
        };
        if let Some((sent_status, body)) = sent {
            let sent = serde_json::to_string(&body).unwrap();
            assert_eq!((sent_status, sent.as_str()), (status, json), "{error:?}");
        }
        let body: wire::ErrorBody = serde_json::from_str(json).unwrap();
        assert_eq!(body.error.kind(), error.kind());
        seen[kind_index(&body.error)] = true;
    }
    assert_eq!(
        seen, [true; KINDS],
        "a kind without an example in the table"
    );
}

#[test]
fn what_the_server_sends_a_client_reads_back_as_the_same_error() {
    for (error, status, json) in golden() {
        if matches!(error, Store(_) | Http(_)) {
            assert_eq!(wire::client_error(status, json.as_bytes()), error, "{json}");
        }
    }
    // An answer that is not an error body is kept, cut short, as an unexpected response.
    let garbage = "<html>".repeat(100);
    let read = wire::client_error(502, garbage.as_bytes());
    assert!(
        matches!(&read, StoreClientError::UnexpectedResponse { status: 502, message } if message.len() == 200),
        "{read:?}"
    );
}
