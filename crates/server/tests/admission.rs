//! What a client can make the gRPC server hold before it is authenticated, over real sockets
//! on loopback, spoken in raw HTTP/2 as a hostile client would (the `h2` crate):
//!
//! - N4: the server limits the streams of a connection and its flow-control windows, answers a
//!   refused credential from the headers without waiting for the body, and refuses message
//!   bytes beyond its budgets, or arriving too slowly, instead of buffering them;
//! - N9: a connection with no call open is closed after the idle timeout even while it answers
//!   pings, one at its age limit is closed after the grace, and one source address over its
//!   cap is refused (and told why) while another address is served.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use palisade_server::ServerConfig;
use palisade_server::limits::{
    ConnectionLimits, HTTP2_STREAMS_PER_CONNECTION_MAX, REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX,
};
use palisade_testkit::LockServer;
use sha2::Digest as _;
use tokio::task::JoinHandle;
use tonic::codegen::http;

/// A bound on every wait here; nothing is timed against it.
const PATIENCE: Duration = Duration::from_secs(60);

/// A raw HTTP/2 connection from `from` to `server`, and the task driving it (it ends when the
/// connection does, answering the server's pings meanwhile).
async fn connect_from(
    from: IpAddr,
    server: SocketAddr,
) -> Result<
    (
        h2::client::SendRequest<Bytes>,
        JoinHandle<Result<(), h2::Error>>,
    ),
    h2::Error,
> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let tcp = socket.connect(server).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await?;
    Ok((send, tokio::spawn(connection)))
}

async fn connect(
    server: SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    JoinHandle<Result<(), h2::Error>>,
) {
    connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), server)
        .await
        .expect("an HTTP/2 connection")
}

/// A gRPC request's head for `method` of the `Locks` service, with `token` as bearer.
fn grpc_head(server: SocketAddr, method: &str, token: Option<&str>) -> http::Request<()> {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{server}/palisade.v1.Locks/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(()).unwrap()
}

/// A gRPC message: its prefix and `payload`.
fn message(payload: &[u8]) -> Bytes {
    let mut framed = vec![0];
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    framed.into()
}

/// `StatusRequest { lock: "x" }`, encoded.
const STATUS_OF_X: &[u8] = &[0x0a, 0x01, b'x'];

/// The gRPC status code of a response: from its headers (a trailers-only answer) or its
/// trailers.
async fn grpc_code(response: h2::client::ResponseFuture) -> Result<(i32, String), h2::Error> {
    let response = response.await?;
    let code_of = |headers: &http::HeaderMap| {
        headers.get("grpc-status").map(|code| {
            let message = headers
                .get("grpc-message")
                .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
                .unwrap_or_default();
            (code.to_str().unwrap().parse::<i32>().unwrap(), message)
        })
    };
    if let Some(found) = code_of(response.headers()) {
        return Ok(found);
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        let data = data?;
        let _ = body.flow_control().release_capacity(data.len());
    }
    let trailers = body.trailers().await?.expect("trailers with the status");
    Ok(code_of(&trailers).expect("a grpc-status trailer"))
}

fn token_files(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let tokens = dir.join("tokens");
    let digest = sha2::Sha256::digest(b"alice-secret-token");
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&tokens, format!("alice {hex}\n")).unwrap();
    let policy = dir.join("policy");
    std::fs::write(&policy, "grant alice lock,read x\n").unwrap();
    (tokens, policy)
}

/// N4: under a policy, a request without a credential or with an unknown token is refused as
/// soon as its headers are in; before, tonic waited for the whole message before the handler
/// looked at the credential, holding what had arrived of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_credential_is_answered_before_any_body_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = token_files(dir.path());
    let server = LockServer::start_with(&ServerConfig {
        tokens_file: Some(tokens),
        policy_file: Some(policy),
        ..LockServer::config(&dir.path().join("data"))
    })
    .await;
    let (mut send, _driver) = connect(server.addr).await;
    for token in [None, Some("not-a-known-token")] {
        // The head only: the body never comes, and the stream stays open from this side.
        let (response, _body) = send
            .send_request(grpc_head(server.addr, "Status", token), false)
            .unwrap();
        let (code, message) = tokio::time::timeout(PATIENCE, grpc_code(response))
            .await
            .unwrap_or_else(|_| panic!("{token:?}: no answer while the body is missing"))
            .unwrap();
        assert_eq!(
            code,
            tonic::Code::Unauthenticated as i32,
            "{token:?}: {message}"
        );
    }
    // A known token still reaches the handler, body and all.
    let (response, mut body) = send
        .send_request(
            grpc_head(server.addr, "Status", Some("alice-secret-token")),
            false,
        )
        .unwrap();
    body.send_data(message(STATUS_OF_X), true).unwrap();
    let (code, message) = tokio::time::timeout(PATIENCE, grpc_code(response))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, 0, "{message}");
    server.stop().await;
}

/// N4, the review's attack on one connection: many streams, each sending most of a message
/// that announces 65,000 bytes and never finishing it. The server announces its stream limit;
/// the streams past the connection's budget of incomplete messages are refused at once, and
/// those within it once their messages are overdue; an honest call on the same connection is
/// answered throughout. Before, the stream limit was unset, every stream's bytes were buffered
/// until the connection closed, and no stream was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_messages_are_refused_past_the_budget_and_when_overdue() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start(dir.path()).await;
    let (send, _driver) = connect(server.addr).await;
    let mut send = send.ready().await.unwrap();
    // A first honest call: by its answer, the server's SETTINGS are in.
    let (response, mut body) = send
        .send_request(grpc_head(server.addr, "Status", None), false)
        .unwrap();
    body.send_data(message(STATUS_OF_X), true).unwrap();
    assert_eq!(grpc_code(response).await.unwrap().0, 0);
    assert_eq!(
        send.current_max_send_streams(),
        HTTP2_STREAMS_PER_CONNECTION_MAX as usize,
        "the server's SETTINGS_MAX_CONCURRENT_STREAMS"
    );

    const STREAMS: usize = 100;
    const SENT: usize = 60_000;
    let mut partial = vec![0u8];
    partial.extend_from_slice(&65_000u32.to_be_bytes());
    partial.resize(SENT, 0x0a);
    let partial = Bytes::from(partial);
    let mut answers = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..STREAMS {
        send = send.ready().await.unwrap();
        let (response, mut body) = send
            .send_request(grpc_head(server.addr, "Status", None), false)
            .unwrap();
        body.reserve_capacity(SENT);
        // As much as the stream's window takes; the rest waits for capacity, as in the review.
        body.send_data(partial.clone(), false).unwrap();
        answers.push(tokio::spawn(grpc_code(response)));
        bodies.push(body);
    }

    // An honest call, in one frame, on the same connection.
    send = send.ready().await.unwrap();
    let (response, mut body) = send
        .send_request(grpc_head(server.addr, "Status", None), false)
        .unwrap();
    body.send_data(message(STATUS_OF_X), true).unwrap();
    let (code, text) = tokio::time::timeout(PATIENCE, grpc_code(response))
        .await
        .expect("the honest call is answered")
        .unwrap();
    assert_eq!(code, 0, "{text}");

    let (mut exhausted, mut overdue) = (0, 0);
    for answer in answers {
        let (code, text) = tokio::time::timeout(PATIENCE, answer)
            .await
            .expect("every half-sent stream is answered")
            .unwrap()
            .unwrap();
        match tonic::Code::from_i32(code) {
            tonic::Code::ResourceExhausted => exhausted += 1,
            tonic::Code::DeadlineExceeded => overdue += 1,
            other => panic!("{other:?}: {text}"),
        }
    }
    // Within the budget: as many streams as whole partial messages fit in it.
    let fit = REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX / SENT;
    assert!(overdue <= fit + 1, "{overdue} overdue, {exhausted} refused");
    assert!(
        exhausted >= STREAMS - fit - 1,
        "{overdue} overdue, {exhausted} refused"
    );
    drop(bodies);
    server.stop().await;
}

fn with_limits(dir: &Path, connections: ConnectionLimits) -> ServerConfig {
    ServerConfig {
        connections,
        ..LockServer::config(dir)
    }
}

/// N9: a connection that opens no call and answers every ping is closed once idle for the
/// timeout; one with a call open (a watch) is not. Before, both were held for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_no_call_is_closed_when_idle_and_one_with_a_watch_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let idle_timeout = Duration::from_secs(2);
    let server = LockServer::start_with(&with_limits(
        dir.path(),
        ConnectionLimits {
            idle_timeout,
            ..ConnectionLimits::default()
        },
    ))
    .await;

    // A connection with a watch open, and one that only answers pings.
    let (send, watching_driver) = connect(server.addr).await;
    let mut send = send.ready().await.unwrap();
    let (watch, mut body) = send
        .send_request(grpc_head(server.addr, "Watch", None), false)
        .unwrap();
    body.send_data(message(&[0x0a, 0x01, b'w']), true).unwrap();
    let watch = tokio::time::timeout(PATIENCE, watch)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(watch.status(), 200);
    let (_idle_send, idle_driver) = connect(server.addr).await;

    let ended = tokio::time::timeout(PATIENCE, idle_driver)
        .await
        .expect("the idle connection is closed");
    assert!(ended.is_ok(), "{ended:?}");
    // Idle for longer than the timeout thrice over by now: the watching one is still open.
    tokio::time::sleep(3 * idle_timeout).await;
    assert!(
        !watching_driver.is_finished(),
        "the watching connection was closed"
    );
    server.stop().await;
}

/// N9: at its age limit a connection is asked to go away, and after the grace it is closed,
/// even with a watch open. Before, a connection could stay for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_its_age_and_grace_is_closed_even_with_a_call_open() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start_with(&with_limits(
        dir.path(),
        ConnectionLimits {
            age_max: Duration::from_secs(1),
            age_grace: Duration::from_secs(1),
            ..ConnectionLimits::default()
        },
    ))
    .await;
    let (send, driver) = connect(server.addr).await;
    let mut send = send.ready().await.unwrap();
    let (watch, mut body) = send
        .send_request(grpc_head(server.addr, "Watch", None), false)
        .unwrap();
    body.send_data(message(&[0x0a, 0x01, b'w']), true).unwrap();
    let watch = tokio::time::timeout(PATIENCE, watch)
        .await
        .unwrap()
        .unwrap();
    let mut events = watch.into_body();
    // The watch's stream ends (with an error: the connection was closed under it).
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(Ok(data)) = events.data().await {
            let _ = events.flow_control().release_capacity(data.len());
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the watch outlived the connection's age and grace"
    );
    tokio::time::timeout(PATIENCE, driver)
        .await
        .expect("the connection is closed")
        .unwrap()
        .ok();
    server.stop().await;
}

/// N9: one source address over its cap is refused at once, told why, while a connection from
/// another address is served. Before, one address could take every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_over_its_cap_is_refused_while_another_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = LockServer::start_with(&with_limits(
        dir.path(),
        ConnectionLimits {
            per_address_max: 2,
            per_address_loopback: true,
            ..ConnectionLimits::default()
        },
    ))
    .await;
    let hog = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let other = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(connect_from(hog, server.addr).await.unwrap());
    }
    // The third from the same address: closed, with a GOAWAY saying why.
    let refused = match connect_from(hog, server.addr).await {
        Err(error) => error,
        Ok((_send, driver)) => tokio::time::timeout(PATIENCE, driver)
            .await
            .expect("the connection over the cap is closed")
            .unwrap()
            .expect_err("closed with an error"),
    };
    assert_eq!(
        refused.reason(),
        Some(h2::Reason::ENHANCE_YOUR_CALM),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("connections open, its most"),
        "{refused}"
    );

    // Another address is served, while the first two still are.
    let (send, _driver) = connect_from(other, server.addr).await.unwrap();
    let mut send = send.ready().await.unwrap();
    let (response, mut body) = send
        .send_request(grpc_head(server.addr, "Status", None), false)
        .unwrap();
    body.send_data(message(STATUS_OF_X), true).unwrap();
    let (code, text) = tokio::time::timeout(PATIENCE, grpc_code(response))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, 0, "{text}");
    for (_, driver) in &held {
        assert!(!driver.is_finished());
    }

    // Once one of the address's connections closes, it may open another.
    let (send, driver) = held.pop().unwrap();
    drop(send);
    driver.abort();
    let _ = driver.await;
    let reopened = tokio::time::timeout(PATIENCE, async {
        loop {
            // Closing is seen by the server after a moment: retried until it is.
            if let Ok((send, driver)) = connect_from(hog, server.addr).await {
                let ready = send.ready().await;
                if ready.is_ok() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if !driver.is_finished() {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(reopened.is_ok(), "the address could not connect again");
    server.stop().await;
}
