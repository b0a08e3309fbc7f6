//! A `palisade serve` or `palisade store serve` process on a fixed data directory and port, that
//! a test can crash (`kill -9`), terminate, and start again on the same data.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use palisade_proto::v1::StatusRequest;
use palisade_proto::v1::locks_client::LocksClient;
use tonic::transport::Channel;

/// How long a process may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct Service {
    pub data_dir: PathBuf,
    pub listen: String,
    /// The subcommand before the common flags: `["serve"]` or `["store", "serve"]`.
    command: Vec<String>,
    pub extra_args: Vec<String>,
    pub child: Option<Child>,
}

fn free_loopback_address() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

impl Service {
    /// The lock service.
    pub fn new(data_dir: &Path) -> Service {
        Service {
            data_dir: data_dir.to_path_buf(),
            listen: free_loopback_address(),
            command: vec!["serve".into()],
            extra_args: Vec::new(),
            child: None,
        }
    }

    /// The fenced store, verifying sequencers with `public_key`.
    pub fn store(data_dir: &Path, public_key: &str) -> Service {
        Service {
            data_dir: data_dir.to_path_buf(),
            listen: free_loopback_address(),
            command: vec!["store".into(), "serve".into()],
            extra_args: vec!["--public-key".into(), public_key.into()],
            child: None,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.listen)
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.with_extension("log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(&self.command)
            .args(["--listen", &self.listen, "--data-dir"])
            .arg(&self.data_dir)
            .args(&self.extra_args)
            .env_remove("PALISADE_ENDPOINT")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn palisade");
        self.child = Some(child);
    }

    fn check_alive(&mut self, started: Instant) {
        let exited = self.child.as_mut().unwrap().try_wait().unwrap();
        assert!(
            exited.is_none(),
            "{:?} exited: {exited:?}\n{}",
            self.command,
            self.log()
        );
        assert!(
            started.elapsed() < START_TIMEOUT,
            "not ready:\n{}",
            self.log()
        );
    }

    /// Starts the lock service and returns a client once it serves linearizable reads.
    pub async fn start(&mut self) -> LocksClient<Channel> {
        self.spawn();
        let started = Instant::now();
        loop {
            if let Ok(mut client) = LocksClient::connect(self.endpoint()).await
                && client
                    .status(StatusRequest {
                        lock: "probe".into(),
                    })
                    .await
                    .is_ok()
            {
                return client;
            }
            self.check_alive(started);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts the fenced store and returns once `/healthz` answers.
    pub async fn start_store(&mut self) {
        self.spawn();
        let started = Instant::now();
        let health = format!("{}/healthz", self.endpoint());
        loop {
            if reqwest::get(&health)
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            self.check_alive(started);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `kill -9`: no shutdown, no flush, whatever was in flight is cut off.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, and the exit status of a clean shutdown.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        child.wait().unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
