//! A lock service, and optionally a fenced store, as real processes on a temporary directory,
//! with `palisade` commands aimed at them: what the CLI's tests drive, the way a shell user
//! would.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::command::{Ran, run};
use crate::process::ServerProcess;

/// `palisade serve` (and `palisade store serve`, if asked) on a temporary directory; the
/// processes are killed and the directory removed when this is dropped.
#[derive(Debug)]
pub struct Palisade {
    bin: PathBuf,
    pub locks: ServerProcess,
    pub store: Option<ServerProcess>,
    // Declared last: the processes die before their directory is removed.
    dir: tempfile::TempDir,
}

impl Palisade {
    /// `palisade serve` (the binary at `bin`), ready to answer.
    pub fn start(bin: impl AsRef<Path>) -> Palisade {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut locks = ServerProcess::lock_service(&bin, dir.path().join("lock-data"));
        locks.start();
        Palisade {
            bin: bin.as_ref().to_path_buf(),
            locks,
            store: None,
            dir,
        }
    }

    /// [`Palisade::start`], and `palisade store serve --public-key "$(palisade pubkey)"`.
    pub fn start_with_store(bin: impl AsRef<Path>) -> Palisade {
        let mut this = Palisade::start(bin);
        let ran = this.run(&["pubkey"]);
        let key = ran.expect_success().stdout.trim();
        let mut store = ServerProcess::store(&this.bin, this.dir.path().join("store-data"), key);
        store.start();
        this.store = Some(store);
        this
    }

    /// The lock service's `http://ADDR`.
    pub fn endpoint(&self) -> String {
        self.locks.endpoint()
    }

    /// The fenced store's `http://ADDR`.
    pub fn store_url(&self) -> String {
        self.store.as_ref().expect("started with_store").endpoint()
    }

    /// The temporary directory holding the data directories and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `palisade ARGS…` with a [scrubbed](crate::scrub) environment, aimed at these servers
    /// through `PALISADE_ENDPOINT` (and `PALISADE_STORE`), with `PALISADE_AUTH_TOKEN_FILE`
    /// naming the service's admin token in its data directory, as an operator on its host
    /// sets it (the cluster's administration takes it without a policy; every other call
    /// accepts it).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = crate::command(&self.bin);
        command.env("PALISADE_ENDPOINT", self.endpoint());
        let admin_token = self.locks.data_dir().join("admin.token");
        if admin_token.exists() {
            command.env("PALISADE_AUTH_TOKEN_FILE", admin_token);
        }
        if let Some(store) = &self.store {
            command.env("PALISADE_STORE", store.endpoint());
        }
        command.args(args);
        command
    }

    /// Runs `palisade ARGS…` to completion.
    pub fn run(&self, args: &[&str]) -> Ran {
        run(self.command(args))
    }

    /// Runs `palisade ARGS…`, asserts it succeeded, and returns its stdout.
    #[track_caller]
    pub fn run_ok(&self, args: &[&str]) -> String {
        let ran = self.run(args);
        assert!(
            ran.status.success(),
            "palisade {args:?} failed with {}:\nstdout: {}\nstderr: {}",
            ran.status,
            ran.stdout,
            ran.stderr,
        );
        ran.stdout
    }

    /// Runs `palisade ARGS… --json`, asserts it succeeded, and parses its output.
    #[track_caller]
    pub fn run_json(&self, args: &[&str]) -> serde_json::Value {
        let mut args = args.to_vec();
        args.push("--json");
        let stdout = self.run_ok(&args);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("palisade {args:?} printed invalid JSON ({e}): {stdout}"))
    }

    /// Polls `palisade status LOCK --json` until `ready` holds for it, or panics.
    #[track_caller]
    pub fn wait_for_status(
        &self,
        lock: &str,
        timeout: Duration,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let status = self.run_json(&["status", lock]);
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
