//! The verifier middleware (`palisade_fence::http`) in front of real servers on loopback: axum
//! over each fence backend, tonic for gRPC, driven by real clients (reqwest, tonic).
//!
//! The request-by-request behaviour is written once, in `http_fence_cases.json`, and run here
//! and by the Python ASGI middleware's tests (`clients/python/tests/test_fence_asgi.py`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::http::Uri;
use palisade_core::{SessionId, Token};
use palisade_fence::http::{
    FenceBackend, FenceLayer, MemoryFence, PostgresFence, SEQUENCER_HEADER,
};
use palisade_fence::{FenceError, RedbFence, Verifier};
use palisade_sequencer::SigningKey;
use serde_json::{Value, json};

/// The lock service, and a key nobody trusts.
struct Keys {
    service: SigningKey,
    attacker: SigningKey,
}

impl Keys {
    fn new() -> Keys {
        Keys {
            service: SigningKey::generate(),
            attacker: SigningKey::generate(),
        }
    }

    fn verifier(&self) -> Arc<Verifier> {
        Arc::new(Verifier::new(self.service.public_key()))
    }

    fn grant(&self, lock: &str, token: u64, session: u64) -> String {
        sign(&self.service, lock, token, session)
    }
}

fn sign(key: &SigningKey, lock: &str, token: u64, session: u64) -> String {
    key.sign(lock, Token::new(token), SessionId::new(session))
        .unwrap()
        .to_string()
}

/// A grant of the case file, signed by `key`.
fn signed(key: &SigningKey, grant: &Value) -> String {
    sign(
        key,
        grant["lock"].as_str().unwrap(),
        grant["token"].as_u64().unwrap(),
        grant["session"].as_u64().unwrap(),
    )
}

/// The `Palisade-Sequencer` header values a case's `present` stands for.
fn header_values(keys: &Keys, present: &Value) -> Vec<String> {
    if present.is_null() {
        return Vec::new();
    }
    if let Some(grant) = present.get("forged") {
        return vec![signed(&keys.attacker, grant)];
    }
    if let Some(text) = present.get("text") {
        return vec![text.as_str().unwrap().to_owned()];
    }
    if let Some(grant) = present.get("twice") {
        let text = signed(&keys.service, grant);
        return vec![text.clone(), text];
    }
    vec![signed(&keys.service, present)]
}

/// An axum app answering `{"served": path}` behind a layer, on a loopback port; stopped when
/// dropped.
struct Served {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_axum<F: FenceBackend>(layer: FenceLayer<F>) -> Served {
    let app = axum::Router::new()
        .fallback(|uri: Uri| async move { Json(json!({"served": uri.path()})) })
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Served { addr, task }
}

/// Sends one request presenting `values`; the status and the JSON body.
async fn post(addr: SocketAddr, path: &str, values: &[String]) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(format!("http://{addr}{path}"));
    for value in values {
        request = request.header(SEQUENCER_HEADER, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn cases() -> Vec<Value> {
    let text = include_str!("http_fence_cases.json");
    let file: Value = serde_json::from_str(text).unwrap();
    file["cases"].as_array().unwrap().clone()
}

/// Runs the shared case on a fresh server; the layer's stats afterwards.
async fn run_case(case: &Value) -> Arc<palisade_fence::FenceStats> {
    let keys = Keys::new();
    let mut layer = FenceLayer::new(keys.verifier(), MemoryFence::new());
    if case["scope"] == "lock_and_path" {
        layer =
            layer.scope_by(|parts, sequencer| format!("{}:{}", sequencer.lock(), parts.uri.path()));
    }
    let stats = layer.stats();
    let server = serve_axum(layer).await;
    let addr = server.addr;
    let name = case["name"].as_str().unwrap();
    for (index, step) in case["steps"].as_array().unwrap().iter().enumerate() {
        let values = header_values(&keys, &step["present"]);
        let (status, body) = post(addr, step["path"].as_str().unwrap(), &values).await;
        let context = format!("case {name:?}, step {index}: {status} {body}");
        assert_eq!(status, step["status"].as_u64().unwrap() as u16, "{context}");
        for (field, expected) in step["body"].as_object().unwrap() {
            assert_eq!(&body[field], expected, "field {field}: {context}");
        }
        if status != 200 {
            let expected_fields = step["body"].as_object().unwrap().len();
            // Exactly the listed fields, the message, and a `detail` where the kind has one.
            let detail = usize::from(body.get("detail").is_some());
            assert_eq!(
                body.as_object().unwrap().len(),
                expected_fields + 1 + detail,
                "{context}"
            );
        }
        for piece in step["message_contains"].as_array().into_iter().flatten() {
            let message = body["message"].as_str().unwrap();
            assert!(message.contains(piece.as_str().unwrap()), "{context}");
        }
    }
    stats
}

#[tokio::test]
async fn every_shared_case_behind_axum() {
    let cases = cases();
    assert!(cases.len() >= 7);
    for case in &cases {
        run_case(case).await;
    }
}

#[tokio::test]
async fn the_layer_counts_what_it_accepted_and_refused_per_lock() {
    let stale_case = &cases()[0];
    let stats = run_case(stale_case).await;
    let jobs = stats.get("jobs").unwrap();
    assert_eq!((jobs.accepted, jobs.refused), (3, 1));
    assert_eq!(
        jobs.last_refusal,
        Some(FenceError::Stale {
            lock: "jobs".into(),
            presented: Token::new(5),
            accepted: Token::new(7),
            holder_session: Some(SessionId::new(2)),
        })
    );
    let forged_case = cases()
        .into_iter()
        .find(|case| case["name"].as_str().unwrap().starts_with("a forged"))
        .unwrap();
    let stats = run_case(&forged_case).await;
    let unverified = stats.get(palisade_fence::UNVERIFIED).unwrap();
    assert_eq!((unverified.accepted, unverified.refused), (0, 1));
    assert_eq!(stats.get("jobs").unwrap().accepted, 1);
}

#[tokio::test]
async fn a_redb_fence_keeps_refusing_a_stale_holder_after_the_service_restarts() {
    let keys = Keys::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fence.redb");
    let newer = keys.grant("jobs", 8, 2);
    let older = keys.grant("jobs", 6, 1);
    {
        let fence = Arc::new(RedbFence::open(&path).unwrap());
        let server = serve_axum(FenceLayer::with_shared_fence(
            keys.verifier(),
            fence.clone(),
        ))
        .await;
        let addr = server.addr;
        assert_eq!(
            post(addr, "/publish", std::slice::from_ref(&older)).await.0,
            200
        );
        assert_eq!(
            post(addr, "/publish", std::slice::from_ref(&newer)).await.0,
            200
        );
        assert_eq!(
            post(addr, "/publish", std::slice::from_ref(&older)).await.0,
            409
        );
        assert_eq!(
            fence.fence_state("jobs").unwrap().unwrap().token_max,
            Token::new(8)
        );
    }
    // The stopped server's connections end as their clients are gone, and with them the last
    // handle on the database (a restart is a new process in real life).
    let mut attempts = 0;
    let fence = loop {
        match RedbFence::open(&path) {
            Ok(fence) => break fence,
            Err(_) if attempts < 500 => {
                attempts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(error) => panic!("the database stays open after the server stopped: {error}"),
        }
    };
    let server = serve_axum(FenceLayer::new(keys.verifier(), fence)).await;
    let addr = server.addr;
    let (status, body) = post(addr, "/publish", &[older]).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        (body["presented"].as_u64(), body["accepted"].as_u64()),
        (Some(6), Some(8))
    );
    assert_eq!(post(addr, "/publish", &[newer]).await.0, 200);
}

#[tokio::test]
async fn replicas_sharing_a_postgres_fence_refuse_a_holder_superseded_at_another_replica() {
    let Ok(config) = std::env::var("PALISADE_TEST_POSTGRES") else {
        eprintln!("skipped: PALISADE_TEST_POSTGRES is not set");
        return;
    };
    let keys = Keys::new();
    // A lock of its own, so earlier runs' rows in the shared table do not matter.
    let lock = format!("http-replicas-{}", std::process::id());
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let (client, connection) = tokio_postgres::connect(&config, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let fence = PostgresFence::new(client).await.unwrap();
        replicas.push(serve_axum(FenceLayer::new(keys.verifier(), fence)).await);
    }
    let older = keys.grant(&lock, 10, 1);
    let newer = keys.grant(&lock, 11, 2);
    assert_eq!(
        post(replicas[0].addr, "/charge", std::slice::from_ref(&older))
            .await
            .0,
        200
    );
    assert_eq!(post(replicas[1].addr, "/charge", &[newer]).await.0, 200);
    let (status, body) = post(replicas[0].addr, "/charge", &[older]).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["kind"], "stale");
    assert_eq!(body["lock"], lock.as_str());
    assert_eq!(
        (body["presented"].as_u64(), body["accepted"].as_u64()),
        (Some(10), Some(11))
    );
}

/// A one-method gRPC service, `test.Echo/Say`, written the way tonic's generated code is.
mod echo {
    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::task::{Context, Poll};

    use tonic::body::Body;
    use tonic::codegen::http;
    use tonic_prost::ProstCodec;

    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Text {
        #[prost(string, tag = "1")]
        pub text: String,
    }

    #[derive(Clone, Debug)]
    pub struct EchoServer;

    impl tonic::server::NamedService for EchoServer {
        const NAME: &'static str = "test.Echo";
    }

    struct Say;

    impl tower_service::Service<tonic::Request<Text>> for Say {
        type Response = tonic::Response<Text>;
        type Error = tonic::Status;
        type Future = Ready<Result<tonic::Response<Text>, tonic::Status>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), tonic::Status>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: tonic::Request<Text>) -> Self::Future {
            ready(Ok(tonic::Response::new(request.into_inner())))
        }
    }

    impl tower_service::Service<http::Request<Body>> for EchoServer {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = std::pin::Pin<
            Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>,
        >;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Text, Text>::default());
                Ok(grpc.unary(Say, request).await)
            })
        }
    }

    /// Calls `test.Echo/Say` with `sequencer` in the request's metadata.
    pub async fn say(
        channel: tonic::transport::Channel,
        sequencer: &str,
    ) -> Result<String, tonic::Status> {
        let mut client = tonic::client::Grpc::new(channel);
        client.ready().await.unwrap();
        let mut request = tonic::Request::new(Text {
            text: "hello".into(),
        });
        request
            .metadata_mut()
            .insert(super::SEQUENCER_HEADER, sequencer.parse().unwrap());
        let path = http::uri::PathAndQuery::from_static("/test.Echo/Say");
        let codec = ProstCodec::<Text, Text>::default();
        Ok(client.unary(request, path, codec).await?.into_inner().text)
    }
}

#[tokio::test]
async fn a_tonic_service_behind_the_layer_refuses_a_stale_call_with_aborted_and_the_same_body() {
    let keys = Keys::new();
    let layer = FenceLayer::new(keys.verifier(), MemoryFence::new());
    let stats = layer.stats();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(echo::EchoServer)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap()
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let newer = keys.grant("jobs", 3, 9);
    let older = keys.grant("jobs", 2, 8);
    assert_eq!(echo::say(channel.clone(), &newer).await.unwrap(), "hello");
    let refused = echo::say(channel.clone(), &older).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    let body: Value = serde_json::from_str(refused.message()).unwrap();
    assert_eq!(
        body,
        json!({
            "kind": "stale", "lock": "jobs", "presented": 2, "accepted": 3, "holder_session": 9,
            "message": body["message"].clone(),
        })
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("older than the accepted token 3")
    );
    let forged = sign(&keys.attacker, "jobs", 50, 1);
    let refused = echo::say(channel.clone(), &forged).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(echo::say(channel, &newer).await.unwrap(), "hello");
    let jobs = stats.get("jobs").unwrap();
    assert_eq!((jobs.accepted, jobs.refused), (2, 1));
}

/// Sends a `method` request presenting `text`; the status and the JSON body.
async fn send(addr: SocketAddr, method: reqwest::Method, path: &str, text: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .request(method.clone(), format!("http://{addr}{path}"))
        .header(SEQUENCER_HEADER, text)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if method == reqwest::Method::HEAD {
        return (status, Value::Null);
    }
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn readers_of_a_phase_get_and_head_but_a_readers_post_is_refused_with_403_shared_write() {
    use palisade_core::Access;
    let keys = Keys::new();
    let server = serve_axum(FenceLayer::new(keys.verifier(), MemoryFence::new())).await;
    let reader = |session: u64| {
        keys.service
            .sign_access(
                "jobs",
                Access::Shared,
                Token::new(6),
                SessionId::new(session),
            )
            .unwrap()
            .to_string()
    };
    let (get, head, post) = (
        reqwest::Method::GET,
        reqwest::Method::HEAD,
        reqwest::Method::POST,
    );
    assert_eq!(
        send(server.addr, get.clone(), "/a", &reader(2)).await.0,
        200
    );
    assert_eq!(send(server.addr, head, "/a", &reader(3)).await.0, 200);
    let (status, body) = send(server.addr, post.clone(), "/a", &reader(2)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["kind"], "shared_write", "{body}");
    assert_eq!((&body["lock"], &body["token"]), (&json!("jobs"), &json!(6)));
    // A writer after the phase; then the phase's readers are stale.
    let writer = keys.grant("jobs", 7, 4);
    assert_eq!(send(server.addr, post, "/a", &writer).await.0, 200);
    let (status, body) = send(server.addr, get, "/a", &reader(2)).await;
    assert_eq!((status, &body["kind"]), (409, &json!("stale")), "{body}");
}
