//! The public contract of the `palisade` command, tested from the outside.
//!
//! Written from the invariants of ARCHITECTURE.md, the README, the CLI README
//! (exit statuses) and `crates/store/docs/store-http.md` alone, without reading the
//! implementation. Every test starts a real `palisade serve` (and, where needed, a real
//! `palisade store serve`) on a temporary directory and a free loopback port, drives them with
//! the real binary the way a shell user would, and asserts what that user observes: exit
//! statuses, printed grants, environment variables, error messages and HTTP answers.
//!
//! One test binary, one module per command group; the processes come from `palisade-testkit`.

mod bad_input;
mod endpoints;
mod fencing;
mod inspect;
mod lock;
mod oneshot;
mod store;
mod store_http;

use palisade_testkit::Palisade;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// What the contract reads back from the lock service, on top of the kit's [`Palisade`].
trait Contract {
    /// `palisade acquire NAME --ttl TTL --json`, which must succeed.
    fn acquire(&self, name: &str, ttl: &str) -> Grant;
    /// `palisade status NAME --json`, which must succeed.
    fn status(&self, name: &str) -> Value;
}

impl Contract for Palisade {
    #[track_caller]
    fn acquire(&self, name: &str, ttl: &str) -> Grant {
        let out = self.run(&["acquire", name, "--ttl", ttl, "--json"]);
        out.expect_success();
        let grant = Grant::from_json(&out.json());
        assert_eq!(grant.lock, name, "acquire --json names the lock");
        grant
    }

    fn status(&self, name: &str) -> Value {
        self.run(&["status", name, "--json"])
            .expect_success()
            .json()
    }
}

/// A grant as printed by `palisade acquire --json`.
#[derive(Debug, Clone)]
struct Grant {
    lock: String,
    token: u64,
    sequencer: String,
    session: String,
    /// What acts for the session: `PALISADE_SESSION`, `<id>.<secret>`.
    credential: String,
}

impl Grant {
    fn from_json(v: &Value) -> Grant {
        Grant {
            lock: v["lock"].as_str().expect("lock").to_owned(),
            token: v["token"].as_u64().expect("token is a number"),
            sequencer: v["sequencer"].as_str().expect("sequencer").to_owned(),
            session: id_string(&v["session"]),
            credential: v["session_credential"]
                .as_str()
                .expect("session_credential")
                .to_owned(),
        }
    }
}

/// A session id as a command-line argument, whether the JSON gives a number or a string.
fn id_string(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        other => panic!("not a session id: {other}"),
    }
}

/// The sequencer with one character of its signature changed.
fn flip_signature_char(sequencer: &str) -> String {
    let sig_start = sequencer.rfind('.').unwrap() + 1;
    let mut bytes = sequencer.as_bytes().to_vec();
    // The middle of the signature: every bit of these characters is significant.
    let at = sig_start + (bytes.len() - sig_start) / 2;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

/// The sequencer with its token replaced, signature kept: the classic forgery.
fn with_forged_token(sequencer: &str, token: u64) -> String {
    let mut fields: Vec<String> = sequencer.split('.').map(str::to_owned).collect();
    assert_eq!(
        fields.len(),
        6,
        "pal2.<key id>.<lock>.<token>.<session>.<sig>"
    );
    fields[3] = token.to_string();
    fields.join(".")
}

/// Blocking HTTP against the fenced store.
struct Http {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

struct Resp {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "answer ({}) is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

impl Http {
    fn new(base: &str) -> Http {
        Http {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            client: reqwest::Client::new(),
            base: base.to_owned(),
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> Resp {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.rt.block_on(async {
            let resp = req.send().await.expect("store answers");
            Resp {
                status: resp.status().as_u16(),
                headers: resp.headers().clone(),
                body: resp.bytes().await.unwrap().to_vec(),
            }
        })
    }

    fn get(&self, path: &str) -> Resp {
        self.send("GET", path, &[], Vec::new())
    }

    fn put(&self, path: &str, sequencer: &str, body: &str) -> Resp {
        self.send(
            "PUT",
            path,
            &[("Palisade-Sequencer", sequencer)],
            body.to_owned(),
        )
    }
}

#[track_caller]
fn expect_error(resp: &Resp, status: u16, kind: &str) -> Value {
    let body = resp.json();
    assert_eq!(resp.status, status, "status of {body}");
    assert_eq!(body["kind"], kind, "kind of {body}");
    body
}
