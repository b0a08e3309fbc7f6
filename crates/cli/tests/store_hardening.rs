//! `palisade store serve` against clients that do not play fair (issue #14): key squatting by
//! the holder of another lock (bindings set by the operator), idle and slow connections past
//! the connection cap, a slowloris header, and huge bodies that never arrive. Every test runs
//! a real store process.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use palisade_store::{StoreClient, StoreClientError, StoreError};
use palisade_testkit::{ServerProcess, ServiceKey};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// A store process trusting `service`, with these extra flags.
fn store(service: &ServiceKey, dir: &Path, flags: &[&str]) -> ServerProcess {
    let key = service.key.public_key().to_string();
    let mut store = ServerProcess::store(BIN, dir.join("store-data"), &key);
    for flag in flags {
        store = store.arg(*flag);
    }
    store.start();
    store
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A fenced put of `key` under `sequencer`.
fn put(store: &ServerProcess, key: &str, sequencer: &str) -> Result<(), StoreClientError> {
    let client = StoreClient::new(&store.endpoint()).unwrap();
    runtime()
        .block_on(client.put(key, b"value", Some(sequencer), None))
        .map(|_| ())
}

#[test]
fn a_holder_of_another_lock_cannot_take_a_key_the_bindings_give_to_a_lock() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let squatter = service.grant("x", 5, 1);
    let owner = service.grant("jobs/nightly", 6, 2);

    // Without bindings the first writer binds the key: the holder of `x` takes `report`.
    let mut unbound = store(&service, dir.path(), &[]);
    put(&unbound, "report", &squatter).expect("first writer binds the key");
    let error = put(&unbound, "report", &owner).unwrap_err();
    assert_eq!(error.kind(), "wrong_lock", "{error}");
    unbound.terminate();

    // The operator gives `report` to `jobs/nightly`: the squatter's binding no longer counts.
    let bound = store(
        &service,
        dir.path(),
        &["--bind", "report=jobs/nightly", "--bind", "shared/=x"],
    );
    let error = put(&bound, "report", &squatter).unwrap_err();
    match &error {
        StoreClientError::Store(StoreError::WrongLock {
            expected,
            presented,
            ..
        }) => {
            assert_eq!(expected, "jobs/nightly");
            assert_eq!(presented, "x");
        }
        other => panic!("expected wrong_lock, got {other}"),
    }
    put(&bound, "report", &owner).expect("the bound lock writes its key");
    put(&bound, "shared/a", &squatter).expect("x writes what the bindings give it");

    // Default-deny: a key no binding covers is nobody's.
    let error = put(&bound, "elsewhere", &owner).unwrap_err();
    assert_eq!(error.kind(), "unbound", "{error}");
    assert!(
        error.to_string().contains("not bound to any lock"),
        "{error}"
    );
}

#[test]
fn a_bindings_file_is_read_and_bad_bindings_stop_the_store_with_the_reason() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bindings");
    std::fs::write(
        &file,
        "# reports belong to the nightly job\nreports/=jobs/nightly\n",
    )
    .unwrap();
    let bound = store(
        &service,
        dir.path(),
        &["--bindings-file", file.to_str().unwrap()],
    );
    put(
        &bound,
        "reports/today",
        &service.grant("jobs/nightly", 3, 1),
    )
    .unwrap();
    let error = put(&bound, "reports/today", &service.grant("x", 4, 2)).unwrap_err();
    assert_eq!(error.kind(), "wrong_lock", "{error}");
    drop(bound);

    std::fs::write(&file, "reports/=jobs/nightly\nno equals sign\n").unwrap();
    let key = service.key.public_key().to_string();
    let mut command = palisade_testkit::command(BIN);
    command.args([
        "store",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--public-key",
        &key,
        "--data-dir",
        dir.path().join("other").to_str().unwrap(),
        "--bindings-file",
        file.to_str().unwrap(),
    ]);
    let ran = palisade_testkit::run(command);
    assert!(!ran.status.success());
    assert!(ran.stderr.contains("line 2"), "{}", ran.stderr);
}

/// Whether the server closed `socket` within `timeout` (reads end or fail), reading and
/// discarding whatever it answers first.
fn closed_within(socket: &mut TcpStream, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut buffer = [0u8; 4096];
    while Instant::now() < deadline {
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        match socket.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn a_slowloris_and_an_idle_connection_are_closed_after_the_header_timeout() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store(&service, dir.path(), &[]);

    let mut idle = TcpStream::connect(server.addr()).unwrap();
    let mut slow = TcpStream::connect(server.addr()).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: store\r\n")
        .unwrap();
    // The header is never finished. Generous: the timeout is 10 s.
    assert!(
        closed_within(&mut slow, Duration::from_secs(60)),
        "a connection sending half a header was kept open"
    );
    assert!(
        closed_within(&mut idle, Duration::from_secs(60)),
        "a connection sending nothing was kept open"
    );
}

#[test]
fn idle_slow_and_huge_body_connections_past_the_cap_do_not_stop_an_honest_writer() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store(&service, dir.path(), &["--connections-max", "8"]);

    // Past the cap: idle sockets, half headers, and batches announcing 8 MiB bodies that never
    // come.
    let mut hostile = Vec::new();
    for index in 0..24 {
        let mut socket = TcpStream::connect(server.addr()).unwrap();
        match index % 3 {
            0 => {}
            1 => socket.write_all(b"PUT /v1/kv/x HTTP/1.1\r\nHost: s").unwrap(),
            _ => socket
                .write_all(
                    b"POST /v1/txn HTTP/1.1\r\nHost: store\r\nContent-Type: application/json\r\nContent-Length: 8388608\r\n\r\n{\"ops\":[",
                )
                .unwrap(),
        }
        hostile.push(socket);
    }

    // An honest holder's fenced writes are answered all the same, retried as a client does
    // when the store is busy (generous bound: the hostile connections are closed within the
    // header and body timeouts, 10 s and 30 s).
    let sequencer = service.grant("jobs/nightly", 7, 1);
    let client = StoreClient::new(&server.endpoint()).unwrap();
    let rt = runtime();
    for round in 0..3 {
        let key = format!("report/{round}");
        let request_id = format!("honest-{round}");
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut attempts = 0;
        let ack = loop {
            attempts += 1;
            let written =
                rt.block_on(client.put(&key, b"honest", Some(&sequencer), Some(&request_id)));
            match written {
                Ok(ack) => break ack,
                Err(error)
                    if (error.is_retryable() || error.is_outcome_unknown())
                        && Instant::now() < deadline
                        && attempts < 20 =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(error) => panic!("the honest write failed after {attempts} attempts: {error}"),
            }
        };
        assert!(ack.revision > 0);
    }
    drop(hostile);
}

#[test]
fn a_sequencer_from_a_file_or_standard_input_fences_a_write_without_showing_in_ps() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store(&service, dir.path(), &[]);
    let put = |value: &str, file: &str| {
        let mut command = palisade_testkit::command(BIN);
        command.args([
            "store",
            "put",
            "report",
            value,
            "--store",
            &server.endpoint(),
            "--sequencer-file",
            file,
        ]);
        command
    };

    let file = dir.path().join("sequencer");
    std::fs::write(&file, format!("{}\n", service.grant("jobs/nightly", 5, 1))).unwrap();
    let ran = palisade_testkit::run(put("from a file", file.to_str().unwrap()));
    assert!(ran.status.success(), "{}", ran.stderr);

    let mut command = put("from stdin", "-");
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = palisade_testkit::Running::spawn(command);
    child
        .child
        .stdin
        .take()
        .unwrap()
        .write_all(service.grant("jobs/nightly", 6, 1).as_bytes())
        .unwrap();
    let status = child.wait(Duration::from_secs(60));
    assert!(status.success(), "{}", child.stderr());
    let entry = runtime()
        .block_on(StoreClient::new(&server.endpoint()).unwrap().get("report"))
        .unwrap()
        .expect("written");
    assert_eq!(
        (entry.value.as_slice(), entry.token),
        (&b"from stdin"[..], 6)
    );

    // The file's sequencer is checked like any other: an older grant is stale (exit status 3).
    std::fs::write(&file, service.grant("jobs/nightly", 4, 1)).unwrap();
    let ran = palisade_testkit::run(put("stale", file.to_str().unwrap()));
    assert_eq!(ran.status.code(), Some(3), "{}", ran.stderr);
    let ran = palisade_testkit::run(put("missing", dir.path().join("none").to_str().unwrap()));
    assert!(!ran.status.success());
    assert!(
        ran.stderr.contains("cannot read the sequencer file"),
        "{}",
        ran.stderr
    );
}

/// A lock at its quota of keys is refused a new one by `palisade store put` (exit status 1,
/// the quota named) and over HTTP (507, kind `quota_reached`), keeps writing the keys it has,
/// and frees room by deleting one; another lock is unaffected, and a bad quota flag stops the
/// store with the reason.
#[test]
fn a_lock_at_its_quota_is_refused_a_new_key_and_frees_room_by_deleting_one() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store(
        &service,
        dir.path(),
        &["--lock-keys-max", "2", "--lock-bytes-max", "4096"],
    );
    let holder = service.grant("jobs/nightly", 5, 1);
    let cli_put = |key: &str, value: &str| {
        let mut command = palisade_testkit::command(BIN);
        command.args([
            "store",
            "put",
            key,
            value,
            "--store",
            &server.endpoint(),
            "--sequencer",
            &holder,
        ]);
        palisade_testkit::run(command)
    };
    assert!(cli_put("a", "1").status.success());
    assert!(cli_put("b", "2").status.success());

    let refused = cli_put("c", "3");
    assert_eq!(refused.status.code(), Some(1), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("lock \"jobs/nightly\" is at its quota of keys"),
        "{}",
        refused.stderr
    );
    let (status, body) = runtime().block_on(async {
        let response = reqwest::Client::new()
            .put(format!("{}/v1/kv/c", server.endpoint()))
            .header("Palisade-Sequencer", &holder)
            .body("3")
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<serde_json::Value>().await.unwrap())
    });
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["kind"], "quota_reached", "{body}");
    assert_eq!(body["quota_max"], 2, "{body}");

    assert!(
        cli_put("a", "10").status.success(),
        "an overwrite adds no key"
    );
    put(&server, "x", &service.grant("jobs/hourly", 1, 2)).expect("another lock's own quota");
    let mut delete = palisade_testkit::command(BIN);
    delete.args([
        "store",
        "delete",
        "b",
        "--store",
        &server.endpoint(),
        "--sequencer",
        &holder,
    ]);
    assert!(palisade_testkit::run(delete).status.success());
    assert!(cli_put("c", "3").status.success(), "room after a delete");

    let mut bad = palisade_testkit::command(BIN);
    bad.args(["store", "serve", "--public-key"])
        .arg(service.key.public_key().to_string())
        .args(["--lock-keys-max", "0", "--data-dir"])
        .arg(dir.path().join("other"));
    let ran = palisade_testkit::run(bad);
    assert_eq!(ran.status.code(), Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("--lock-keys-max"), "{}", ran.stderr);
}

/// Sends `head` (a request without its body, or with part of it) on a new connection and
/// returns the connection.
fn send_head(store: &ServerProcess, head: &str) -> TcpStream {
    let mut socket = TcpStream::connect(store.addr()).unwrap();
    socket.write_all(head.as_bytes()).unwrap();
    socket
}

/// The status code and body of the answer on `socket` (read until the server closes, or
/// `None` if none came within `timeout`).
fn answer_within(socket: &mut TcpStream, timeout: Duration) -> Option<(u16, String)> {
    let deadline = Instant::now() + timeout;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        socket
            .set_read_timeout(Some(left.min(Duration::from_millis(500))))
            .unwrap();
        match socket.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buffer[..n]);
                // A whole answer: its head, and a body as long as it says.
                let text = String::from_utf8_lossy(&answer);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|line| {
                            line.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|n| n.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break;
                    }
                }
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Some((status, body))
}

/// N7: requests that announce large bodies and never send them are answered from their
/// headers: an unknown route (404), a write without a sequencer (428) or with one the store's
/// keys did not sign (403). None takes budget, so an honest write meanwhile is answered at
/// once. Before, each reserved the declared body (or 8 MiB for a chunked one) before anything
/// looked at it, held it until the 30 s body timeout, and was answered 503; eight stalled the
/// store's writes for 30 s.
#[test]
fn requests_without_a_valid_sequencer_are_answered_before_their_bodies_and_take_no_budget() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store(&service, dir.path(), &[]);
    let forged = ServiceKey::new().grant("jobs/nightly", 9, 1);
    let declared = "Content-Length: 8388608\r\n";
    let chunked = "Transfer-Encoding: chunked\r\n";
    let mut hostile = Vec::new();
    for round in 0..4 {
        for (head, expected) in [
            (
                format!("POST /nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\n{declared}\r\n"),
                404,
            ),
            (
                format!("POST /nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\n{chunked}\r\n"),
                404,
            ),
            (
                format!("PUT /v1/kv/k{round} HTTP/1.1\r\nHost: 127.0.0.1\r\n{declared}\r\n"),
                428,
            ),
            (
                format!(
                    "POST /v1/txn HTTP/1.1\r\nHost: 127.0.0.1\r\npalisade-sequencer: {forged}\r\n{chunked}\r\n"
                ),
                403,
            ),
        ] {
            hostile.push((send_head(&server, &head), expected, head));
        }
    }
    let sequencer = service.grant("jobs/nightly", 7, 1);
    put(&server, "report", &sequencer).expect("the honest write is answered");
    for (socket, expected, head) in &mut hostile {
        // Generous: before, the answer came after the 30 s body timeout, as 503.
        let answer = answer_within(socket, Duration::from_secs(60));
        assert_eq!(
            answer.as_ref().map(|(status, _)| *status),
            Some(*expected),
            "{head:?}: {answer:?}"
        );
    }
}

/// N7: a holder's write whose body never begins is refused after the first-byte timeout, and
/// writes that announce large bodies and stall after a few bytes hold only what arrived: more
/// of them than the budget could hold at their declared sizes leave an honest write answered
/// while they still wait. Before, each reserved its declared 8 MiB, the ninth waited, and so
/// did every write behind it, until the stalled ones timed out.
#[test]
fn a_holders_stalled_bodies_hold_only_the_bytes_that_arrived() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store(&service, dir.path(), &[]);
    let sequencer = service.grant("jobs/nightly", 7, 1);
    let head = |key: &str| {
        format!(
            "PUT /v1/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\npalisade-sequencer: {sequencer}\r\nContent-Length: 8388608\r\n\r\n"
        )
    };

    // Ten stalled writes: 80 MiB declared, more than the 64 MiB budget.
    let mut stalled: Vec<TcpStream> = (0..10)
        .map(|i| {
            let mut socket = send_head(&server, &head(&format!("stalled/{i}")));
            socket.write_all(b"a few bytes").unwrap();
            socket
        })
        .collect();
    put(&server, "report", &sequencer).expect("the honest write is answered");
    for (i, socket) in stalled.iter_mut().enumerate() {
        assert_eq!(
            answer_within(socket, Duration::from_millis(100)),
            None,
            "stalled write {i} was answered before the honest write could be"
        );
    }

    // A write whose body never begins: refused after the first-byte timeout (5 s), not the
    // whole body's (30 s).
    let mut silent = send_head(&server, &head("silent"));
    let (status, body) = answer_within(&mut silent, Duration::from_secs(60)).expect("an answer");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("did not begin to arrive within 5000 ms"),
        "{body}"
    );
}

/// N10: the store answers only requests naming localhost, an IP address or a name given with
/// --store-host; any other Host (a name a web page rebinds to the store's address) gets 421
/// with the reason. Before, it answered every Host.
#[test]
fn the_store_answers_only_loopback_ip_and_configured_host_names() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let server = store(&service, dir.path(), &["--store-host", "store.example.com"]);
    put(&server, "payroll/q3", &service.grant("jobs/nightly", 7, 1)).unwrap();
    let port = server.addr().port();
    for (host, expected) in [
        (format!("attacker.example:{port}"), 421),
        ("attacker.example".to_owned(), 421),
        (format!("localhost.attacker.example:{port}"), 421),
        (format!("127.0.0.1:{port}"), 200),
        (format!("localhost:{port}"), 200),
        ("Store.Example.com".to_owned(), 200),
        (format!("[::1]:{port}"), 200),
    ] {
        let mut socket = send_head(
            &server,
            &format!("GET /v1/kv/payroll/q3 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        let (status, body) =
            answer_within(&mut socket, Duration::from_secs(60)).expect("an answer");
        assert_eq!(status, expected, "Host: {host}: {body}");
        if expected == 421 {
            assert!(body.contains("\"kind\":\"misdirected_request\""), "{body}");
            assert!(body.contains("--store-host"), "{body}");
            assert!(!body.contains("value"), "{body}");
        }
    }
}
