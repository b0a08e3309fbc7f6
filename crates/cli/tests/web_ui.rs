//! The web UI of `palisade serve --ui-listen`, against a real `palisade serve` process.
//!
//! Its JSON API and live stream over plain HTTP: a page of locks with holders, tokens and
//! timelines, pages and limits, and with a policy the refusals (401, 403, 429) and the locks an
//! identity may not read left out. Then the page itself in headless Chromium driven through
//! chromedriver (WebDriver over HTTP): a lock taken after the page loaded appears, without a
//! reload, with its token; a lock named like markup shows as text; with a policy the page asks
//! for a token, shows nothing without one, and with one limited to `a/` never shows `b/x`.
//!
//! The browser tests print `skipping:` and pass when `chromium` or `chromedriver` is not
//! installed, unless `PALISADE_TEST_BROWSER` is set (`.ci/run` sets it). With
//! `PALISADE_UPDATE_SCREENSHOT=1` the first one writes `docs/web-ui.png`.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use palisade_client::{AcquireOptions, BearerToken, Client, ClientOptions, SessionOptions};
use palisade_testkit::{Lines, Running, ServerProcess};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const TTL: Duration = Duration::from_secs(60);
/// A bound against a hung test, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(20);

/// A token made by `palisade token new NAME`: the token, and the line for the token file.
fn new_token(name: &str) -> (String, String) {
    palisade_testkit::new_token(BIN, name)
}

/// A lock service serving the web UI, with a token file and a policy if given.
struct Served {
    server: ServerProcess,
    _dir: TempDir,
    tokens: BTreeMap<String, String>,
    http: reqwest::Client,
}

impl Served {
    fn start(policy: Option<(&[&str], &str)>) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let mut server = ServerProcess::lock_service(BIN, dir.path().join("data")).with_ui();
        let mut tokens = BTreeMap::new();
        if let Some((identities, policy)) = policy {
            let mut file = String::new();
            for name in identities {
                let (token, line) = new_token(name);
                file.push_str(&line);
                file.push('\n');
                tokens.insert(name.to_string(), token);
            }
            std::fs::write(dir.path().join("tokens"), file).unwrap();
            std::fs::write(dir.path().join("policy"), policy).unwrap();
            server = server
                .arg("--tokens")
                .arg(dir.path().join("tokens"))
                .arg("--policy")
                .arg(dir.path().join("policy"));
        }
        server.start();
        Served {
            server,
            _dir: dir,
            tokens,
            http: reqwest::Client::new(),
        }
    }

    fn token(&self, name: &str) -> String {
        self.tokens[name].clone()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.ui_addr())
    }

    /// The Rust client, authenticating as `name` (`None`: no token).
    async fn client(&self, name: Option<&str>) -> Client {
        Client::connect_with(
            &self.server.endpoint(),
            ClientOptions {
                bearer_token: name.map(|n| BearerToken::new(&self.token(n)).unwrap()),
                ..ClientOptions::default()
            },
        )
        .await
        .unwrap()
    }

    async fn get(&self, path: &str, bearer: Option<&str>) -> reqwest::Response {
        let mut request = self.http.get(self.url(path));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        request.send().await.unwrap()
    }

    /// Waits until `lock` has `n` waiters, as the API says.
    async fn wait_for_waiters(&self, lock: &str, n: usize) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, page) = self.json(&format!("/api/state?prefix={lock}"), None).await;
            let waiters = page["locks"][0]["waiters"].as_u64();
            if page["locks"][0]["name"] == lock && waiters == Some(n as u64) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{lock} never had {n} waiters: {page:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET path` as JSON, with its status.
    async fn json(&self, path: &str, bearer: Option<&str>) -> (StatusCode, Value) {
        let response = self.get(path, bearer).await;
        let status = response.status();
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "{path}"
        );
        (status, response.json().await.unwrap())
    }
}

fn names(page: &Value) -> Vec<&str> {
    page["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lock| lock["name"].as_str().unwrap())
        .collect()
}

fn lock<'a>(page: &'a Value, name: &str) -> &'a Value {
    page["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lock| lock["name"] == name)
        .unwrap_or_else(|| panic!("no lock {name:?} in {page:#}"))
}

/// A refusal's status and `kind`, and that its message says `words`.
fn assert_refused(answer: &(StatusCode, Value), status: StatusCode, kind: &str, words: &str) {
    assert_eq!(answer.0, status, "{:#}", answer.1);
    assert_eq!(answer.1["kind"], kind, "{:#}", answer.1);
    let message = answer.1["error"].as_str().unwrap();
    assert!(
        message.contains(words),
        "{message:?} does not say {words:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_json_api_answers_a_page_of_locks_with_holders_tokens_and_timelines() {
    let served = Served::start(None);

    // Phase 1: the page and its files, with a policy of what the browser may load.
    let page = served.get("/", None).await;
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("<script src=\"/ui.js\"")
    );
    let script = served.get("/ui.js", None).await;
    assert!(
        script.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(!script.text().await.unwrap().contains("innerHTML"));

    // Phase 2: one lock held, one released.
    let client = served.client(None).await;
    let session = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let held = session
        .acquire(
            "jobs/a",
            AcquireOptions::default().with_value("<b>10.0.0.1:5432</b>"),
        )
        .await
        .unwrap();
    let released = session
        .acquire("jobs/b", AcquireOptions::default())
        .await
        .unwrap();
    let released_token = released.token().get();
    released.release().await.unwrap();

    let (status, page) = served.json("/api/state", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(names(&page), ["jobs/a", "jobs/b"]);
    let a = lock(&page, "jobs/a");
    assert_eq!(a["holder"]["token"], held.token().get());
    assert_eq!(a["holder"]["session"], session.id().get());
    let lease = a["holder"]["lease_remaining_ms"].as_u64().unwrap();
    assert!(lease > 0 && lease <= TTL.as_millis() as u64, "{lease}");
    assert_eq!(a["timeline"][0]["kind"], "granted");
    // The grant's value, as the holder wrote it (the page shows it as text).
    assert_eq!(a["holder"]["value"], "<b>10.0.0.1:5432</b>");
    let b = lock(&page, "jobs/b");
    assert_eq!(b["holder"], Value::Null);
    assert_eq!(b["last_token"], released_token);
    let kinds: Vec<_> = b["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["token"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [("granted", released_token), ("released", released_token)]
    );
    assert_eq!(page["served_by"]["role"], "leader");
    assert_eq!(page["cluster"]["leader"], page["served_by"]["node_id"]);
    assert_eq!(page["cluster"]["members"].as_array().unwrap().len(), 1);
    assert_eq!(page["identity"], Value::Null);

    // Phase 3: pages, with the place the next one starts.
    let (_, first) = served.json("/api/state?prefix=jobs/&limit=1", None).await;
    assert_eq!(names(&first), ["jobs/a"]);
    assert_eq!(first["next_start_after"], "jobs/a");
    let (_, second) = served
        .json("/api/state?prefix=jobs/&limit=1&start_after=jobs/a", None)
        .await;
    assert_eq!(names(&second), ["jobs/b"]);
    assert_eq!(second["next_start_after"], Value::Null);
    let (_, none) = served.json("/api/state?prefix=other/", None).await;
    assert!(names(&none).is_empty());

    // Phase 4: every input has a limit, and a refusal says which.
    let long = "p".repeat(257);
    assert_refused(
        &served
            .json(&format!("/api/state?prefix={long}"), None)
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_input",
        "256",
    );
    assert_refused(
        &served.json("/api/state?prefix=a%0Ab", None).await,
        StatusCode::BAD_REQUEST,
        "invalid_input",
        "control character",
    );
    assert_refused(
        &served.json("/api/state?limit=many", None).await,
        StatusCode::BAD_REQUEST,
        "invalid_input",
        "limit",
    );
    // A request head over the limit is refused before it is read whole.
    let huge = served
        .get(&format!("/api/state?prefix={}", "q".repeat(20_000)), None)
        .await;
    assert!(huge.status().is_client_error(), "{}", huge.status());
    // Too large a page is a full page.
    let (status, _) = served.json("/api/state?limit=100000", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_refused(
        &served.json("/api/nothing", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "/",
    );
    drop(held);
}

/// Reads the live view until its text holds `until`; returns everything read.
async fn read_until(stream: &mut reqwest::Response, text: &mut String, until: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !text.contains(until) {
        let chunk = tokio::time::timeout_at(deadline.into(), stream.chunk())
            .await
            .unwrap_or_else(|_| panic!("no {until:?} in the live view; read:\n{text}"))
            .unwrap()
            .expect("the live view goes on");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_live_view_sends_a_snapshot_then_each_grant_and_release_under_its_prefix() {
    let served = Served::start(None);
    let mut stream = served.get("/api/stream?prefix=jobs/", None).await;
    assert_eq!(stream.status(), StatusCode::OK);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    read_until(&mut stream, &mut text, "event: snapshot\ndata: ").await;

    let client = served.client(None).await;
    let session = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    // Outside the prefix first: by the time the second change arrives, the first would have.
    let other = session
        .acquire("other/x", AcquireOptions::default())
        .await
        .unwrap();
    let job = session
        .acquire("jobs/x", AcquireOptions::default())
        .await
        .unwrap();
    let token = job.token().get();
    read_until(
        &mut stream,
        &mut text,
        &format!("\"lock\":\"jobs/x\",\"waiters\":0,\"kind\":\"granted\",\"session\":{},\"token\":{token}", session.id().get()),
    )
    .await;
    job.release().await.unwrap();
    read_until(
        &mut stream,
        &mut text,
        &format!(
            "\"kind\":\"released\",\"session\":{},\"token\":{token}",
            session.id().get()
        ),
    )
    .await;
    assert!(!text.contains("other/x"), "{text}");
    // The page is sent afresh with the lease counting down.
    read_until(&mut stream, &mut text, "event: refresh\ndata: ").await;
    drop(other);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_policy_the_api_needs_a_read_token_and_shows_only_what_it_may_read() {
    let served = Served::start(Some((
        &["alice", "bob", "ops"],
        "grant alice read a/\n\
         grant bob lock b/\n\
         grant ops lock,read *\n\
         quota alice watches=1\n",
    )));
    let ops = served.client(Some("ops")).await;
    let session = ops
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let _a = session
        .acquire("a/x", AcquireOptions::default())
        .await
        .unwrap();
    let _b = session
        .acquire("b/x", AcquireOptions::default())
        .await
        .unwrap();

    // No token, a made-up one: 401, asking for a bearer token.
    let none = served.get("/api/state", None).await;
    assert_eq!(none.status(), StatusCode::UNAUTHORIZED);
    assert!(
        none.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    assert_refused(
        &served.json("/api/state", None).await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
        "not authenticated",
    );
    assert_refused(
        &served.json("/api/state", Some("pst_made_up")).await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
        "not authenticated",
    );
    assert_eq!(
        served.get("/api/stream", None).await.status(),
        StatusCode::UNAUTHORIZED
    );
    // The page itself holds no data: it loads, and asks.
    assert_eq!(served.get("/", None).await.status(), StatusCode::OK);

    // An identity that may read nothing: 403, naming it and the right.
    assert_refused(
        &served.json("/api/state", Some(&served.token("bob"))).await,
        StatusCode::FORBIDDEN,
        "permission_denied",
        "\"bob\" has no read right",
    );

    // Alice reads `a/` only: `b/x` is left out, not refused.
    let alice = served.token("alice");
    let (status, page) = served.json("/api/state", Some(&alice)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(names(&page), ["a/x"]);
    assert_eq!(page["identity"], "alice");
    let (status, page) = served.json("/api/state?prefix=b/", Some(&alice)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(names(&page).is_empty());
    let (_, page) = served.json("/api/state", Some(&served.token("ops"))).await;
    assert_eq!(names(&page), ["a/x", "b/x"]);

    // Live views count against the identity's quota of watches.
    let mut first = served.get("/api/stream", Some(&alice)).await;
    assert_eq!(first.status(), StatusCode::OK);
    let mut text = String::new();
    read_until(&mut first, &mut text, "event: snapshot").await;
    assert!(text.contains("a/x") && !text.contains("b/x"), "{text}");
    assert_refused(
        &served.json("/api/stream", Some(&alice)).await,
        StatusCode::TOO_MANY_REQUESTS,
        "quota_reached",
        "watches",
    );
    // Closed, the view gives its place back.
    drop(first);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let again = served.get("/api/stream", Some(&alice)).await;
        if again.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "the closed view kept its place");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// N10: the UI answers only requests naming localhost, an IP address or a name given with
/// --ui-host; any other Host (a name a web page rebinds to the UI's address, to read it as its
/// own origin) gets 421 with the reason, on the page and the API alike. Before, it answered
/// every Host with every lock and its holder.
#[tokio::test(flavor = "multi_thread")]
async fn the_ui_answers_only_loopback_ip_and_configured_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::lock_service(BIN, dir.path().join("data"))
        .with_ui()
        .arg("--ui-host")
        .arg("locks.example.com");
    server.start();
    let port = server.ui_addr().port();
    let http = reqwest::Client::new();
    for path in ["/", "/api/state"] {
        for (host, expected) in [
            (
                format!("attacker.example:{port}"),
                StatusCode::MISDIRECTED_REQUEST,
            ),
            (
                "attacker.example".to_owned(),
                StatusCode::MISDIRECTED_REQUEST,
            ),
            (
                format!("127.0.0.1.attacker.example:{port}"),
                StatusCode::MISDIRECTED_REQUEST,
            ),
            (format!("127.0.0.1:{port}"), StatusCode::OK),
            (format!("localhost:{port}"), StatusCode::OK),
            ("LOCKS.example.com:443".to_owned(), StatusCode::OK),
        ] {
            let response = http
                .get(format!("http://{}{path}", server.ui_addr()))
                .header("host", &host)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), expected, "{path} with Host {host}");
            if expected == StatusCode::MISDIRECTED_REQUEST {
                let body: Value = response.json().await.unwrap();
                assert_refused(
                    &(expected, body),
                    expected,
                    "misdirected_request",
                    "--ui-host",
                );
            }
        }
    }
}

/// Without a policy, the web UI and the metrics endpoint (N17) are held to loopback like the
/// gRPC listener, each refusal saying what the listener would expose. Before, `--metrics-listen`
/// took any address.
#[test]
fn without_a_policy_the_ui_and_the_metrics_are_refused_a_non_loopback_address() {
    for (flag, exposes) in [
        ("--ui-listen", "could read every lock"),
        ("--metrics-listen", "could read the service's metrics"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut command = palisade_testkit::command(BIN);
        command
            .args(["serve", "--listen", "127.0.0.1:0", flag, "0.0.0.0:0"])
            .arg("--data-dir")
            .arg(dir.path().join("data"));
        let ran = palisade_testkit::run(command);
        assert!(!ran.status.success(), "{flag}: {ran:?}");
        assert!(
            ran.stderr
                .contains("refusing to listen on 0.0.0.0:0 without a policy")
                && ran.stderr.contains(exposes),
            "{flag}: {}",
            ran.stderr
        );
    }
}

/// N17: with a policy, the cluster (term, leader, members and their addresses) is shown only
/// to an identity with the admin right, as gRPC's `Cluster.Status` is; a reader gets its locks,
/// the node that served them, and `cluster: null`, in a page and in a live view. Before, every
/// reader saw the members and their addresses.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_policy_only_an_administrator_sees_the_cluster() {
    let served = Served::start(Some((
        &["reader", "ops"],
        "grant reader read a/\ngrant ops admin,read *\n",
    )));
    let reader = served.token("reader");
    let (status, page) = served.json("/api/state", Some(&reader)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page["cluster"].is_null(), "{page:#}");
    assert_eq!(page["served_by"]["role"], "leader");
    let mut view = served.get("/api/stream", Some(&reader)).await;
    let mut text = String::new();
    read_until(&mut view, &mut text, "event: snapshot").await;
    assert!(text.contains("\"cluster\":null"), "{text}");

    let (status, page) = served.json("/api/state", Some(&served.token("ops"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["cluster"]["leader"], page["served_by"]["node_id"]);
    let members = page["cluster"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{page:#}");
    assert!(
        members[0]["addr"]
            .as_str()
            .is_some_and(|addr| !addr.is_empty())
    );
}

// The page in a real browser.

/// The first of `names` found on `PATH`.
fn program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Chromium and chromedriver, or `None` (the test skips) when either is missing and
/// `PALISADE_TEST_BROWSER` is not set.
fn browser_programs() -> Option<(PathBuf, PathBuf)> {
    let chromium = program(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = program(&["chromedriver"]);
    if let (Some(chromium), Some(driver)) = (chromium.clone(), driver.clone()) {
        return Some((chromium, driver));
    }
    let missing = match (chromium, driver) {
        (None, None) => "chromium and chromedriver",
        (None, _) => "chromium",
        _ => "chromedriver",
    };
    if std::env::var_os("PALISADE_TEST_BROWSER").is_some_and(|v| !v.is_empty() && v != "0") {
        panic!(
            "PALISADE_TEST_BROWSER is set but {missing} is not installed (apt-get install chromium chromium-driver)"
        );
    }
    println!(
        "skipping: {missing} not installed (apt-get install chromium chromium-driver; PALISADE_TEST_BROWSER=1 makes this a failure)"
    );
    None
}

/// Headless Chromium through chromedriver, one WebDriver session.
struct Browser {
    http: reqwest::Client,
    driver: String,
    session: String,
    _chromedriver: Running,
    _profile: TempDir,
}

impl Browser {
    async fn start((chromium, chromedriver): (PathBuf, PathBuf)) -> Browser {
        // Port 0: chromedriver picks a free port and says which.
        let mut command = std::process::Command::new(chromedriver);
        command
            .arg("--port=0")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut running = Running::spawn(command);
        let lines = Lines::new(running.child.stdout.take().unwrap());
        let port = loop {
            let line = lines.next(PATIENCE);
            if let Some(rest) = line.split_once("started successfully on port ") {
                break rest.1.trim_end_matches('.').parse::<u16>().unwrap();
            }
        };
        let driver = format!("http://127.0.0.1:{port}");
        let profile = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let created = webdriver(
            &http,
            reqwest::Method::POST,
            &format!("{driver}/session"),
            json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--window-size=1280,900",
                        format!("--user-data-dir={}", profile.path().display()),
                    ],
                },
            }}}),
        )
        .await;
        Browser {
            http,
            driver,
            session: created["sessionId"].as_str().unwrap().to_string(),
            _chromedriver: running,
            _profile: profile,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.driver, self.session);
        webdriver(&self.http, method, &url, body).await
    }

    async fn open(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    /// Runs `script` (a function body) in the page with `args`; returns what it returns.
    async fn eval(&self, script: &str, args: Value) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({ "script": script, "args": args }),
        )
        .await
    }

    /// What the page shows: its status, its refusal if any, and each lock row's cells.
    async fn shown(&self) -> Value {
        self.eval(
            "const text = (row, cell) => row.querySelector(cell).textContent;
             return {
               status: document.getElementById('status').textContent,
               auth: document.getElementById('auth').hidden ? null
                 : document.getElementById('auth-message').textContent,
               identity: document.getElementById('identity').textContent,
               title: document.title,
               images: document.querySelectorAll('main img').length,
               loaded: window.palisadeTestMark === 1,
               locks: Array.from(document.querySelectorAll('#lock-rows tr')).map((row) => ({
                 name: row.dataset.lock, shown_name: text(row, '.name'),
                 mode: text(row, '.mode'),
                 session: text(row, '.session'), token: text(row, '.token'),
                 lease: text(row, '.lease'), waiters: text(row, '.waiters'),
                 events: text(row, '.events'),
               })),
             };",
            json!([]),
        )
        .await
    }

    /// Waits until `done` holds of what the page shows; returns that.
    async fn wait_for(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let shown = self.shown().await;
            if done(&shown) {
                return shown;
            }
            assert!(
                Instant::now() < deadline,
                "the page did not show {what}; it shows {shown:#}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let encoded = self
            .command(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser {
    /// Ends the session (chromedriver then stops its Chromium), synchronously, so a failed
    /// test leaves no browser behind.
    fn drop(&mut self) {
        let address = self.driver.trim_start_matches("http://");
        if let Ok(mut stream) = std::net::TcpStream::connect(address) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = write!(
                stream,
                "DELETE /session/{} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.session
            );
            let _ = stream.read_to_end(&mut Vec::new());
        }
    }
}

/// One WebDriver call; its `value`, or a panic with the driver's error.
async fn webdriver(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Value,
) -> Value {
    let mut request = http.request(method.clone(), url);
    if method != reqwest::Method::GET {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let answer: Value = response.json().await.unwrap();
    assert!(status.is_success(), "WebDriver {url}: {status} {answer:#}");
    answer["value"].clone()
}

fn row<'a>(shown: &'a Value, name: &str) -> Option<&'a Value> {
    shown["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name)
}

fn shown_names(shown: &Value) -> Vec<&str> {
    shown["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["name"].as_str().unwrap())
        .collect()
}

fn docs_path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(file)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_shows_a_lock_taken_after_it_loaded_with_its_token_without_a_reload() {
    let Some(programs) = browser_programs() else {
        return;
    };
    let served = Served::start(None);
    let browser = Browser::start(programs).await;

    // Phase 1: the page loads and goes live, before any lock exists.
    browser.open(&served.url("/")).await;
    browser
        .wait_for("the live view", |shown| shown["status"] == "live")
        .await;
    // A mark a reload would wipe.
    browser
        .eval("window.palisadeTestMark = 1; return true;", json!([]))
        .await;

    // Phase 2: locks taken, waited for and released after the page loaded.
    let client = served.client(None).await;
    let holder = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let build = holder
        .acquire("jobs/build", AcquireOptions::default())
        .await
        .unwrap();
    let deploy = holder
        .acquire("jobs/deploy", AcquireOptions::default())
        .await
        .unwrap();
    let deploy_token = deploy.token().get();
    deploy.release().await.unwrap();
    let waiter = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let waiter_id = waiter.id().get();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .acquire("jobs/build", AcquireOptions::default())
            .await;
        (waiter, guard)
    });
    // A lock name is user input: this one must show as text, never run.
    let hostile = "<img src=x onerror=\"document.title='pwned'\">";
    let hostile_guard = holder
        .acquire(hostile, AcquireOptions::default())
        .await
        .unwrap();

    // Phase 3: the page shows each, live.
    let build_token = build.token().get().to_string();
    let shown = browser
        .wait_for("jobs/build with its token and its waiter", |shown| {
            row(shown, "jobs/build").is_some_and(|row| {
                row["token"] == build_token.as_str()
                    && row["waiters"]
                        .as_str()
                        .unwrap()
                        .contains(&waiter_id.to_string())
            })
        })
        .await;
    assert_eq!(
        row(&shown, "jobs/build").unwrap()["session"],
        holder.id().get().to_string()
    );
    let hostile_token = hostile_guard.token().get().to_string();
    let shown = browser
        .wait_for("the lock named like markup, as text", |shown| {
            row(shown, hostile).is_some_and(|row| row["token"] == hostile_token.as_str())
        })
        .await;
    assert_eq!(row(&shown, hostile).unwrap()["shown_name"], hostile);
    assert_eq!(shown["images"], 0, "{shown:#}");
    assert_eq!(shown["title"], "Palisade: locks");
    let released = format!("released #{deploy_token}");
    let shown = browser
        .wait_for("jobs/deploy's release in its timeline", |shown| {
            row(shown, "jobs/deploy")
                .is_some_and(|row| row["events"].as_str().unwrap().contains(&released))
        })
        .await;
    assert_eq!(shown["loaded"], true, "the page was reloaded");
    // The lease counts down from the server's refresh.
    browser
        .wait_for("jobs/build's lease", |shown| {
            row(shown, "jobs/build")
                .is_some_and(|row| row["lease"].as_str().unwrap().ends_with(" s"))
        })
        .await;

    // Phase 4: a read-write lock's shared phase, with a writer waiting and a reader behind it,
    // and a semaphore with one of its three permits taken.
    let reader = client
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let first_reader = holder
        .acquire("jobs/config", AcquireOptions::default().shared())
        .await
        .unwrap();
    let second_reader = reader
        .acquire("jobs/config", AcquireOptions::default().shared())
        .await
        .unwrap();
    let phase = first_reader.token().get().to_string();
    let mut queued = Vec::new();
    for options in [
        AcquireOptions::default(),
        AcquireOptions::default().shared(),
    ] {
        let session = client
            .open_session(SessionOptions::with_ttl(TTL))
            .await
            .unwrap();
        queued.push(session.id().get());
        tokio::spawn(async move {
            let guard = session.acquire("jobs/config", options).await;
            (session, guard)
        });
        // In this order: the writer first, then a reader behind it.
        served.wait_for_waiters("jobs/config", queued.len()).await;
    }
    let permit = reader
        .acquire("jobs/shards", AcquireOptions::default().permits(3))
        .await
        .unwrap();
    let slot = permit.slot().unwrap();
    let config_waiters = format!("2 (s{} exclusive, s{} shared)", queued[0], queued[1]);
    let shown = browser
        .wait_for(
            "the readers of jobs/config and how its waiters wait",
            |shown| {
                row(shown, "jobs/config")
                    .is_some_and(|row| row["waiters"] == config_waiters.as_str())
            },
        )
        .await;
    let config = row(&shown, "jobs/config").unwrap();
    assert_eq!(config["mode"], "shared phase, 2 readers", "{shown:#}");
    assert_eq!(config["token"], format!("phase {phase}"));
    let sessions = config["session"].as_str().unwrap();
    for session in [&holder, &reader] {
        assert!(
            sessions.contains(&session.id().get().to_string()),
            "{sessions}"
        );
    }
    let shown = browser
        .wait_for("the semaphore jobs/shards", |shown| {
            row(shown, "jobs/shards").is_some_and(|row| row["mode"] == "3 permits, 2 free")
        })
        .await;
    let shards = row(&shown, "jobs/shards").unwrap();
    assert_eq!(
        shards["session"],
        format!("slot {slot}: {}", reader.id().get())
    );
    assert_eq!(shards["token"], permit.token().get().to_string());
    assert!(
        shards["events"]
            .as_str()
            .unwrap()
            .contains(&format!("granted slot {slot} #{}", permit.token().get())),
        "{shards}"
    );
    // The API the page reads says the same.
    let (_, page) = served.json("/api/state?prefix=jobs/", None).await;
    let config = lock(&page, "jobs/config");
    assert_eq!(config["sharer_count"], 2, "{config:#}");
    assert_eq!(config["sharers"][0]["access"], "shared");
    assert_eq!(config["waiting_modes"], json!(["exclusive", "shared"]));
    let shards = lock(&page, "jobs/shards");
    assert_eq!(shards["permits"], 3, "{shards:#}");
    assert_eq!(shards["sharers"][0]["slot"], slot);

    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    if std::env::var_os("PALISADE_UPDATE_SCREENSHOT").is_some() {
        std::fs::write(docs_path("web-ui.png"), &png).unwrap();
        println!("wrote {}", docs_path("web-ui.png").display());
    }
    drop(hostile_guard);
    drop(build);
    drop((first_reader, second_reader, permit));
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_policy_the_page_asks_for_a_token_and_never_shows_a_lock_outside_its_prefixes() {
    let Some(programs) = browser_programs() else {
        return;
    };
    let served = Served::start(Some((
        &["alice", "ops"],
        "grant alice read a/\ngrant ops lock,read *\n",
    )));
    let ops = served.client(Some("ops")).await;
    let session = ops
        .open_session(SessionOptions::with_ttl(TTL))
        .await
        .unwrap();
    let b = session
        .acquire("b/x", AcquireOptions::default())
        .await
        .unwrap();
    let browser = Browser::start(programs).await;

    // Phase 1: without a token, a prompt and no locks.
    browser.open(&served.url("/")).await;
    let shown = browser
        .wait_for("the token prompt", |shown| {
            shown["auth"]
                .as_str()
                .is_some_and(|m| m.contains("requires a bearer token"))
        })
        .await;
    assert!(shown_names(&shown).is_empty(), "{shown:#}");

    // Phase 2: with alice's token (read on `a/` only), `a/x` shows live and `b/x` never.
    browser
        .eval(
            "document.getElementById('token').value = arguments[0];
             document.querySelector('#auth-form button').click();
             return true;",
            json!([served.token("alice")]),
        )
        .await;
    browser
        .wait_for("the live view as alice", |shown| {
            shown["status"] == "live" && shown["identity"] == "identity: alice"
        })
        .await;
    let b_later = session
        .acquire("b/y", AcquireOptions::default())
        .await
        .unwrap();
    let a = session
        .acquire("a/x", AcquireOptions::default())
        .await
        .unwrap();
    let token = a.token().get().to_string();
    let shown = browser
        .wait_for("a/x with its token", |shown| {
            row(shown, "a/x").is_some_and(|row| row["token"] == token.as_str())
        })
        .await;
    // `b/y` was granted before `a/x`, in the same stream: it was left out, not late.
    assert_eq!(shown_names(&shown), ["a/x"], "{shown:#}");
    b.release().await.unwrap();
    b_later.release().await.unwrap();
    let released = format!("released #{token}");
    a.release().await.unwrap();
    let shown = browser
        .wait_for("a/x released", |shown| {
            row(shown, "a/x").is_some_and(|row| row["events"].as_str().unwrap().contains(&released))
        })
        .await;
    assert_eq!(shown_names(&shown), ["a/x"], "{shown:#}");
}
