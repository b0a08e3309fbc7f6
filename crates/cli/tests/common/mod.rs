//! A real `palisade serve` process for the CLI tests, and helpers to run `palisade` against it.
//!
//! The server runs on a free loopback port with its own data directory and is killed when the
//! [`Server`] is dropped, so a failing test leaves nothing behind.

#![allow(dead_code)]

use std::io::Read as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `palisade` binary under test.
pub fn palisade_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_palisade"))
}

/// How long a server may take to start answering.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts to start a server (a free port can be taken by someone else before we bind it).
const SERVER_START_ATTEMPTS: usize = 3;

/// Variables `palisade` reads, removed so the caller's environment cannot leak into a test.
const PALISADE_VARIABLES: [&str; 7] = [
    "PALISADE_ENDPOINT",
    "PALISADE_LOCK",
    "PALISADE_TOKEN",
    "PALISADE_SEQUENCER",
    "PALISADE_SESSION",
    "PALISADE_TTL",
    "PALISADE_DATA_DIR",
];

/// A running lock service.
#[derive(Debug)]
pub struct Server {
    child: Child,
    pub endpoint: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts `palisade serve` and waits until it answers requests.
    pub fn start() -> Server {
        let mut last_log = String::new();
        for _ in 0..SERVER_START_ATTEMPTS {
            match Server::try_start() {
                Ok(server) => return server,
                Err(log) => last_log = log,
            }
        }
        panic!("palisade serve did not start; its log:\n{last_log}");
    }

    fn try_start() -> Result<Server, String> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let listen = format!("127.0.0.1:{port}");
        let log = dir.path().join("serve.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(palisade_bin());
        for variable in PALISADE_VARIABLES {
            command.env_remove(variable);
        }
        let child = command
            .args(["serve", "--listen", &listen, "--data-dir"])
            .arg(dir.path().join("data"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn palisade serve");
        let mut server = Server {
            child,
            endpoint: format!("http://{listen}"),
            log,
            _dir: dir,
        };
        let started = Instant::now();
        while started.elapsed() < SERVER_START_TIMEOUT {
            if let Ok(Some(_)) = server.child.try_wait() {
                return Err(server.log());
            }
            // A linearizable read answers only once the node leads its group.
            let probe = server.palisade(&["status", "readiness-probe"]);
            if probe.status.success() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "not ready after {SERVER_START_TIMEOUT:?}\n{}",
            server.log()
        ))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// A `palisade` command aimed at this server, with a clean environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(palisade_bin());
        for variable in PALISADE_VARIABLES {
            command.env_remove(variable);
        }
        command
            .env("PALISADE_ENDPOINT", &self.endpoint)
            .env("RUST_LOG", "warn")
            .args(args)
            .stdin(Stdio::null());
        command
    }

    /// Runs `palisade ARGS…` to completion.
    pub fn palisade(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run palisade")
    }

    /// Runs `palisade ARGS…`, asserts it succeeded, and returns its stdout.
    pub fn palisade_ok(&self, args: &[&str]) -> String {
        let output = self.palisade(args);
        assert!(
            output.status.success(),
            "palisade {args:?} failed with {}:\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        String::from_utf8(output.stdout).expect("utf-8 output")
    }

    /// Runs `palisade ARGS… --json` and parses its output.
    pub fn palisade_json(&self, args: &[&str]) -> serde_json::Value {
        let mut args = args.to_vec();
        args.push("--json");
        let stdout = self.palisade_ok(&args);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("palisade {args:?} printed invalid JSON ({e}): {stdout}"))
    }

    /// Polls `palisade status LOCK --json` until `ready` holds for it, or panics.
    pub fn wait_for_status(
        &self,
        lock: &str,
        timeout: Duration,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let status = self.palisade_json(&["status", lock]);
            if ready(&status) {
                return status;
            }
            assert!(
                started.elapsed() < timeout,
                "lock {lock} did not reach the expected state within {timeout:?}: {status}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// `kill -9`s the server (its data directory stays).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same address and data directory, after [`Server::kill`],
    /// and waits until it answers.
    pub fn restart(&mut self) {
        let listen = self.endpoint.trim_start_matches("http://").to_string();
        let log_file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut command = Command::new(palisade_bin());
        for variable in PALISADE_VARIABLES {
            command.env_remove(variable);
        }
        self.child = command
            .args(["serve", "--listen", &listen, "--data-dir"])
            .arg(self._dir.path().join("data"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawn palisade serve");
        let started = Instant::now();
        while started.elapsed() < SERVER_START_TIMEOUT {
            if let Ok(Some(_)) = self.child.try_wait() {
                panic!("palisade serve did not restart; its log:\n{}", self.log());
            }
            if self
                .palisade(&["status", "readiness-probe"])
                .status
                .success()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("palisade serve did not restart; its log:\n{}", self.log());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a child process to exit, or kills it and panics after `timeout`.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The stderr of an `Output`, for assertions and failure messages.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A spawned `palisade` process, killed (with its process group left alone) if the test ends
/// before it does.
#[derive(Debug)]
pub struct Running {
    pub child: Child,
}

impl Running {
    pub fn spawn(mut command: Command) -> Running {
        let child = command.spawn().expect("spawn palisade");
        Running { child }
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// Waits for exit, or kills and panics after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        wait_with_timeout(&mut self.child, timeout)
    }

    /// Everything the process wrote to its piped stderr (after it exited).
    pub fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(stderr) = self.child.stderr.as_mut() {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads lines from a pipe on a thread, so a test can wait for one with a timeout.
#[derive(Debug)]
pub struct Lines {
    receiver: std::sync::mpsc::Receiver<String>,
}

impl Lines {
    pub fn new(pipe: impl std::io::Read + Send + 'static) -> Lines {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { receiver }
    }

    /// The next line, or a panic after `timeout`.
    pub fn next(&self, timeout: Duration) -> String {
        self.receiver
            .recv_timeout(timeout)
            .unwrap_or_else(|e| panic!("no line within {timeout:?}: {e}"))
    }
}
