//! Commands with a scrubbed environment, and running one to completion the way a shell user
//! observes it: exit status, standard output, standard error.

use std::ffi::OsStr;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long [`run`] lets one command take before the test gives up on it: a bound against a
/// hung test, not a timing assertion.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(20);

/// Removes every variable of the test's environment that `palisade` reads: all `PALISADE_*`
/// (endpoint, lock, token, sequencer, session, TTL, data directories, listen addresses, store,
/// public key, …) and `RUST_LOG`, so a developer's shell cannot change what a test observes.
/// Set what the test needs after this.
pub fn scrub(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PALISADE_") {
            command.env_remove(name);
        }
    }
    command.env_remove("RUST_LOG")
}

/// `program` (the `palisade` binary, or a test executable re-run as a child) with a
/// [scrubbed](scrub) environment and no standard input.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    scrub(&mut command).stdin(Stdio::null());
    command
}

/// What a user sees after running one command.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    /// Standard output, with invalid UTF-8 replaced.
    pub stdout: String,
    /// Standard error, with invalid UTF-8 replaced.
    pub stderr: String,
}

impl Ran {
    /// The exit status, or `None` if a signal ended the process.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Standard output parsed as one JSON value.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// The `KEY=VALUE` lines of standard output, after asserting the command succeeded: the
    /// grant `palisade acquire` prints (`PALISADE_TOKEN`, `PALISADE_SEQUENCER`, …).
    #[track_caller]
    pub fn key_values(&self) -> std::collections::BTreeMap<String, String> {
        self.expect_success();
        self.stdout
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code(), Some(code), "unexpected exit status: {self:?}");
        self
    }

    #[track_caller]
    pub fn expect_success(&self) -> &Self {
        self.expect_code(0)
    }
}

/// `palisade store put KEY VALUE` (the binary at `bin`) against the store at `store`, presenting
/// `sequencer`.
pub fn store_put(
    bin: impl AsRef<OsStr>,
    store: &str,
    sequencer: &str,
    key: &str,
    value: &str,
) -> Ran {
    let mut put = command(bin);
    put.args(["store", "put", key, value])
        .env("PALISADE_STORE", store)
        .env("PALISADE_SEQUENCER", sequencer);
    run(put)
}

/// Runs `command` to completion, capturing its output; kills it and panics after
/// [`COMMAND_DEADLINE`].
pub fn run(mut command: Command) -> Ran {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {command:?}: {e}"));
    let stdout = read_on_a_thread(child.stdout.take().expect("piped stdout"));
    let stderr = read_on_a_thread(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + COMMAND_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the command") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {COMMAND_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ran {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Reads a pipe to its end on a thread, so a full pipe never blocks the child.
fn read_on_a_thread(
    mut pipe: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// A bearer token made by `BIN token new NAME`: the token, and its line for a `--tokens` file
/// (checked to name the identity and to hold a digest, never the token itself).
pub fn new_token(bin: impl AsRef<OsStr>, name: &str) -> (String, String) {
    let mut command = command(bin);
    command.args(["token", "new", name]);
    let ran = run(command);
    ran.expect_success();
    let mut lines = ran.stdout.lines();
    let token = lines.next().expect("a token").to_string();
    let line = lines.next().expect("a token file line").to_string();
    assert!(token.starts_with("pst_") && token.len() == 68, "{token}");
    assert!(line.starts_with(&format!("{name} ")), "{line}");
    assert!(
        !line.contains(&token),
        "the file line holds the token itself: {line}"
    );
    (token, line)
}
