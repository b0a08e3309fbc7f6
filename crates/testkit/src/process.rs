//! `palisade serve` and `palisade store serve` as child processes a test can crash (`kill -9`),
//! freeze (`SIGSTOP`), terminate (`SIGTERM`) and start again on the same data directory and
//! port.
//!
//! A first start gives the server port 0 and reads the address it announces once it is ready,
//! so no port is picked in advance and no other process can take it first. A restart asks for
//! the same address again, so clients and children that were given the endpoint keep working;
//! if the port is briefly in use, the start is retried until [`START_TIMEOUT`].
//!
//! Each process writes standard output and standard error to `<data dir>.log` (appended across
//! restarts), which failure messages quote.

use std::ffi::OsString;
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a server may take to announce that it is ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The error text of a bind to an address in use (`EADDRINUSE`) on Linux.
const ADDRESS_IN_USE: &str = "Address already in use";

/// How a server says it is ready, and where it listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announce {
    /// `palisade serve`: the log line `palisade lock service ready listen=ADDR …`, written once
    /// the node has recovered, leads its group and listens.
    LockService,
    /// `palisade store serve`: `palisade store: listening on http://ADDR` (`https://` with
    /// TLS) on standard output,
    /// written once the store is open and listening.
    Store,
}

impl Announce {
    /// The address a complete output line announces, if it is the announcement.
    fn address(self, line: &str) -> Option<SocketAddr> {
        let rest = match self {
            Announce::LockService => {
                if !line.contains("palisade lock service ready") {
                    return None;
                }
                line.split_once(" listen=")?.1
            }
            Announce::Store => {
                line.split_once("palisade store: listening on http://")
                    .or_else(|| line.split_once("palisade store: listening on https://"))?
                    .1
            }
        };
        rest.split_whitespace().next()?.parse().ok()
    }
}

/// The addresses of one start of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// The API address: port 0 on a first start, the announced address after it.
    pub listen: SocketAddr,
    /// The Prometheus `/metrics` address, if the server was asked to serve one.
    pub metrics: Option<SocketAddr>,
    /// The web UI's address, if the server was asked to serve one: port 0 on a first start,
    /// the announced address after it.
    pub ui: Option<SocketAddr>,
}

type Build = Box<dyn Fn(&Ports) -> Command + Send + Sync>;

/// A server process on a fixed data directory, started, stopped and restarted by the test, and
/// killed when dropped.
pub struct ServerProcess {
    /// For messages: `palisade serve`, `palisade store serve`, ….
    name: String,
    announce: Announce,
    /// The command of one start, before [`ServerProcess::arg`]'s arguments.
    build: Build,
    extra_args: Vec<OsString>,
    data_dir: PathBuf,
    log: PathBuf,
    metrics: bool,
    ui: bool,
    /// `None` until the first start; then the addresses every restart asks for.
    ports: Option<Ports>,
    child: Option<Child>,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("name", &self.name)
            .field("data_dir", &self.data_dir)
            .field("ports", &self.ports)
            .field("pid", &self.child.as_ref().map(Child::id))
            .finish_non_exhaustive()
    }
}

impl ServerProcess {
    /// `palisade serve` (the binary at `bin`) on `data_dir`. Not started yet.
    pub fn lock_service(bin: impl AsRef<Path>, data_dir: impl AsRef<Path>) -> ServerProcess {
        let bin = bin.as_ref().to_path_buf();
        let dir = data_dir.as_ref().to_path_buf();
        ServerProcess::custom(
            "palisade serve",
            data_dir,
            Announce::LockService,
            move |ports| {
                let mut command = crate::command(&bin);
                command
                    .args(["serve", "--listen", &ports.listen.to_string(), "--data-dir"])
                    .arg(&dir)
                    .env("RUST_LOG", "info");
                if let Some(metrics) = ports.metrics {
                    command.args(["--metrics-listen", &metrics.to_string()]);
                }
                if let Some(ui) = ports.ui {
                    command.args(["--ui-listen", &ui.to_string()]);
                }
                command
            },
        )
    }

    /// `palisade store serve` (the binary at `bin`) on `data_dir`, verifying sequencers with
    /// `public_key` (`ed25519:<hex>`, or several joined by commas, as `palisade pubkey` prints
    /// them). Not started yet.
    pub fn store(
        bin: impl AsRef<Path>,
        data_dir: impl AsRef<Path>,
        public_key: &str,
    ) -> ServerProcess {
        ServerProcess::store_with(bin, data_dir, ["--public-key", public_key])
    }

    /// [`ServerProcess::store`] reading its keys from `key_file` (`--public-key-file`), again
    /// on each [`ServerProcess::hangup`].
    pub fn store_with_key_file(
        bin: impl AsRef<Path>,
        data_dir: impl AsRef<Path>,
        key_file: &Path,
    ) -> ServerProcess {
        let key_file = key_file.to_str().expect("a UTF-8 key file path");
        ServerProcess::store_with(bin, data_dir, ["--public-key-file", key_file])
    }

    fn store_with(
        bin: impl AsRef<Path>,
        data_dir: impl AsRef<Path>,
        keys: [&str; 2],
    ) -> ServerProcess {
        let bin = bin.as_ref().to_path_buf();
        let dir = data_dir.as_ref().to_path_buf();
        let keys = keys.map(str::to_owned);
        ServerProcess::custom(
            "palisade store serve",
            data_dir,
            Announce::Store,
            move |ports| {
                let mut command = crate::command(&bin);
                command
                    .args(["store", "serve", "--listen", &ports.listen.to_string()])
                    .arg("--data-dir")
                    .arg(&dir)
                    .args(&keys)
                    .env("RUST_LOG", "info");
                command
            },
        )
    }

    /// Any server that listens on `ports.listen` and announces itself as `announce` says: for a
    /// crate that cannot run the `palisade` binary and re-runs its own test executable as the
    /// server. `build` makes the command of one start; it should begin with [`crate::command`]
    /// so the child's environment is scrubbed. `data_dir` places the log beside it.
    pub fn custom(
        name: &str,
        data_dir: impl AsRef<Path>,
        announce: Announce,
        build: impl Fn(&Ports) -> Command + Send + Sync + 'static,
    ) -> ServerProcess {
        let data_dir = data_dir.as_ref().to_path_buf();
        ServerProcess {
            name: name.to_owned(),
            announce,
            build: Box::new(build),
            extra_args: Vec::new(),
            log: data_dir.with_extension("log"),
            data_dir,
            metrics: false,
            ui: false,
            ports: None,
            child: None,
        }
    }

    /// Also serve Prometheus `/metrics` (`palisade serve --metrics-listen`), on a port the kit
    /// picks, retried on another if it is taken; see [`ServerProcess::metrics_addr`].
    pub fn with_metrics(mut self) -> ServerProcess {
        assert!(self.ports.is_none(), "set before the first start");
        self.metrics = true;
        self
    }

    /// Also serve the web UI (`palisade serve --ui-listen`), on a port the server picks and
    /// announces; see [`ServerProcess::ui_addr`].
    pub fn with_ui(mut self) -> ServerProcess {
        self.ui = true;
        self
    }

    /// Also `--tokens` and `--policy`, naming `files`.
    pub fn with_auth(self, files: &crate::AuthFiles) -> ServerProcess {
        self.arg("--tokens")
            .arg(files.tokens_path())
            .arg("--policy")
            .arg(files.policy_path())
    }

    /// One more argument after the built-in ones, on every start.
    pub fn arg(mut self, arg: impl Into<OsString>) -> ServerProcess {
        self.extra_args.push(arg.into());
        self
    }

    /// Starts the server and returns once it has announced that it is ready. The first start
    /// binds port 0; later ones ask for the address announced then.
    ///
    /// Blocks the calling thread (inside a multi-thread tokio runtime, via `block_in_place`).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        blocking(|| {
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let ports = self.ports.unwrap_or_else(|| Ports {
                    listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                    metrics: self
                        .metrics
                        .then(|| SocketAddr::from((Ipv4Addr::LOCALHOST, crate::unused_port()))),
                    ui: self.ui.then(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
                });
                match self.try_start(&ports, deadline) {
                    Ok((listen, ui)) => {
                        self.ports = Some(Ports {
                            listen,
                            ui: ports.ui.and(ui),
                            ..ports
                        });
                        return;
                    }
                    Err(Failed::PortInUse(_)) if Instant::now() < deadline => {
                        // A first start picks new ports; a restart waits for its own.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(Failed::PortInUse(log) | Failed::Exited(log)) => {
                        panic!(
                            "{} exited before it was ready; its output:\n{log}",
                            self.name
                        )
                    }
                    Err(Failed::TimedOut(log)) => panic!(
                        "{} did not announce it was ready within {START_TIMEOUT:?}; its output:\n{log}",
                        self.name
                    ),
                }
            }
        })
    }

    /// Starts one attempt; returns the announced API address, and the web UI's if the
    /// announcement names one.
    fn try_start(
        &mut self,
        ports: &Ports,
        deadline: Instant,
    ) -> Result<(SocketAddr, Option<SocketAddr>), Failed> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log.display()));
        let offset = log.metadata().expect("log file metadata").len();
        let mut command = (self.build)(ports);
        command
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file handle"))
            .stderr(log);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {command:?}: {e}"));
        self.child = Some(child);
        loop {
            let output = self.log_since(offset);
            // Only complete lines: the last one may still be being written.
            let complete = output.rsplit_once('\n').map_or("", |(lines, _)| lines);
            if let Some(ready) = complete
                .lines()
                .find(|l| self.announce.address(l).is_some())
            {
                let addr = self.announce.address(ready).expect("an announcement");
                return Ok((addr, ui_address(ready)));
            }
            let child = self.child.as_mut().expect("spawned");
            if child.try_wait().expect("wait for the server").is_some() {
                self.child = None;
                let output = self.log_since(offset);
                return Err(if output.contains(ADDRESS_IN_USE) {
                    Failed::PortInUse(output)
                } else {
                    Failed::Exited(output)
                });
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(Failed::TimedOut(self.log_since(offset)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_since(&self, offset: u64) -> String {
        let mut bytes = Vec::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_end(&mut bytes);
        }
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// `kill -9`: no shutdown, no flush; whatever was in flight is cut off. A paused server
    /// dies without running again.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        child.wait().expect("wait for the killed server");
    }

    /// `SIGTERM`, and the exit status of the shutdown that follows.
    ///
    /// Blocks the calling thread (inside a multi-thread tokio runtime, via `block_in_place`).
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        kill(pid_of(&child), Signal::SIGTERM).expect("SIGTERM");
        blocking(|| child.wait().expect("wait for the terminated server"))
    }

    /// Freezes the server (`SIGSTOP`): it holds its port and data directory but answers nothing.
    pub fn pause(&self) {
        kill(self.pid(), Signal::SIGSTOP).expect("SIGSTOP");
    }

    /// Sends `SIGHUP` (a store with a key file re-reads it).
    pub fn hangup(&self) {
        kill(self.pid(), Signal::SIGHUP).expect("SIGHUP");
    }

    /// Thaws a [paused](ServerProcess::pause) server (`SIGCONT`).
    pub fn resume(&self) {
        kill(self.pid(), Signal::SIGCONT).expect("SIGCONT");
    }

    /// The running server's process id.
    pub fn pid(&self) -> Pid {
        pid_of(self.child.as_ref().expect("running"))
    }

    /// Whether the server was started and has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// The address the server listens on (announced at its first start).
    pub fn addr(&self) -> SocketAddr {
        self.ports().listen
    }

    /// `http://ADDR`, for a client or `PALISADE_ENDPOINT` / `PALISADE_STORE`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The web UI's address of a server started [with the UI](ServerProcess::with_ui).
    pub fn ui_addr(&self) -> SocketAddr {
        self.ports().ui.expect("started with_ui()")
    }

    /// The `/metrics` address of a server started [with metrics](ServerProcess::with_metrics).
    pub fn metrics_addr(&self) -> SocketAddr {
        self.ports().metrics.expect("started with_metrics()")
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Everything the server wrote, across its restarts.
    pub fn log(&self) -> String {
        self.log_since(0)
    }

    fn ports(&self) -> Ports {
        self.ports
            .unwrap_or_else(|| panic!("{} was never started", self.name))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The web UI's address in `palisade serve`'s ready line (`ui_listen=ADDR`), if it has one.
fn ui_address(ready: &str) -> Option<SocketAddr> {
    ready
        .split_once(" ui_listen=")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Why one attempt to start failed, with the server's output of that attempt.
enum Failed {
    PortInUse(String),
    Exited(String),
    TimedOut(String),
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("a pid fits in i32"))
}

/// Runs `f`, which blocks, without stalling a multi-thread tokio runtime's worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_announcements_of_both_servers_are_read() {
        let ready = "2025-01-01T00:00:00.000000Z  INFO palisade_server: palisade lock service \
                     ready listen=127.0.0.1:40123 data_dir=/tmp/x public_key=ed25519:00";
        assert_eq!(
            Announce::LockService.address(ready),
            Some("127.0.0.1:40123".parse().unwrap())
        );
        assert_eq!(
            Announce::LockService.address("INFO serving /metrics listen=127.0.0.1:9"),
            None
        );
        let store = "palisade store: listening on http://127.0.0.1:40124";
        assert_eq!(
            Announce::Store.address(store),
            Some("127.0.0.1:40124".parse().unwrap())
        );
        assert_eq!(Announce::Store.address(ready), None);
        assert_eq!(ui_address(ready), None);
        let with_ui = "INFO palisade_server: palisade lock service ready listen=127.0.0.1:40123 \
                       ui_listen=127.0.0.1:40125 data_dir=/tmp/x";
        assert_eq!(
            ui_address(with_ui),
            Some("127.0.0.1:40125".parse().unwrap())
        );
        assert_eq!(ui_address("ready listen=127.0.0.1:1 ui_listen=off"), None);
    }

    /// A stand-in server: `sh -c SCRIPT` with the address to listen on in `$LISTEN`.
    fn script_server(dir: &Path, script: String) -> ServerProcess {
        ServerProcess::custom(
            "a script",
            dir.join("data"),
            Announce::Store,
            move |ports| {
                let mut command = crate::command("sh");
                command
                    .args(["-c", &script])
                    .env("LISTEN", ports.listen.to_string());
                command
            },
        )
    }

    #[test]
    fn a_start_that_finds_its_port_in_use_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("refused-once");
        let script = format!(
            "if [ -e {m} ]; then echo 'palisade store: listening on http://127.0.0.1:40999'; \
             exec sleep 30; fi; touch {m}; echo 'cannot listen: {ADDRESS_IN_USE}' >&2; exit 1",
            m = marker.display()
        );
        let mut server = script_server(dir.path(), script);

        server.start();

        assert_eq!(server.addr(), "127.0.0.1:40999".parse().unwrap());
        assert!(server.log().contains(ADDRESS_IN_USE), "{}", server.log());
    }

    #[test]
    fn a_restart_asks_for_the_address_announced_at_the_first_start() {
        let dir = tempfile::tempdir().unwrap();
        let script = "case \"$LISTEN\" in \
                      *:0) echo 'palisade store: listening on http://127.0.0.1:40998' ;; \
                      *) echo \"asked for $LISTEN\"; echo \"palisade store: listening on http://$LISTEN\" ;; \
                      esac; exec sleep 30";
        let mut server = script_server(dir.path(), script.to_owned());

        server.start();
        server.kill9();
        server.start();

        assert_eq!(server.endpoint(), "http://127.0.0.1:40998");
        assert!(
            server.log().contains("asked for 127.0.0.1:40998"),
            "{}",
            server.log()
        );
    }

    #[test]
    #[should_panic(expected = "exited before it was ready")]
    fn a_server_that_exits_without_announcing_fails_the_start() {
        let dir = tempfile::tempdir().unwrap();
        script_server(
            dir.path(),
            "echo 'no such data directory' >&2; exit 1".to_owned(),
        )
        .start();
    }
}
