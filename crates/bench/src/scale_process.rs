//! The servers `palisade bench scale` starts, measures and restarts as child processes: a
//! durable `palisade serve`, and etcd when asked. Each runs on a temporary data directory and
//! free loopback ports; its resident memory is read from `/proc/<pid>/status`, and a restart is
//! a `SIGKILL` (what `kill -9` sends) and a new process on the same directory.
//!
//! A child is killed when its [`Server`] is dropped, so no run leaves a server behind.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::SystemTime;

use anyhow::{Context, bail};

/// What a child server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Program {
    /// `palisade serve` from this executable (or another `palisade` binary).
    Palisade { bin: PathBuf },
    /// An etcd binary (etcd 3.4 or later: it must serve the v3 lock service).
    Etcd { bin: PathBuf },
}

impl Program {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Program::Palisade { .. } => "palisade",
            Program::Etcd { .. } => "etcd",
        }
    }
}

/// What the Palisade child logs: warnings, and openraft's line when it starts building a
/// snapshot, which is where a snapshot's time starts (see [`LogTail`]).
const PALISADE_LOG_FILTER: &str = "warn,openraft::core::sm::worker=info";
/// The line openraft logs when the state machine starts building a snapshot.
pub(crate) const SNAPSHOT_BUILD_LINE: &str = "build snapshot";

/// One child server and its data directory.
#[derive(Debug)]
pub(crate) struct Server {
    program: Program,
    child: Option<Child>,
    address: SocketAddr,
    /// etcd's peer port, or Palisade's metrics port.
    second_address: SocketAddr,
    log: PathBuf,
    // Declared last: removed after the child is killed (see `Drop`).
    dir: tempfile::TempDir,
}

/// A free loopback address: bound, read and released. Another process could take it in
/// between; on a benchmark machine that is rare enough.
fn free_address() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot bind a loopback port to find a free one")?;
    Ok(listener.local_addr()?)
}

impl Server {
    /// Starts `program` on a new directory under `parent` (the system's temporary directory
    /// when `None`). Returns once the process runs, not once it answers.
    pub(crate) fn start(program: Program, parent: Option<&Path>) -> anyhow::Result<Server> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("palisade-bench-scale-");
        let dir = match parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .context("cannot create a data directory for the benchmarked server")?;
        let mut server = Server {
            log: dir.path().join(format!("{}.log", program.kind())),
            program,
            child: None,
            address: free_address()?,
            second_address: free_address()?,
            dir,
        };
        server.spawn()?;
        Ok(server)
    }

    /// Where clients connect: `127.0.0.1:PORT`.
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.program.kind()
    }

    pub(crate) fn log_path(&self) -> &Path {
        &self.log
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let data = self.data_dir();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let mut command = match &self.program {
            Program::Palisade { bin } => {
                let mut command = Command::new(bin);
                command
                    .arg("serve")
                    .arg("--data-dir")
                    .arg(&data)
                    .arg("--listen")
                    .arg(self.address.to_string())
                    .arg("--metrics-listen")
                    .arg(self.second_address.to_string())
                    .env("RUST_LOG", PALISADE_LOG_FILTER);
                // The benchmark's own environment (an endpoint, a policy, TLS) is not the
                // child's: it serves plaintext on loopback with the defaults.
                for (name, _) in std::env::vars_os() {
                    if name.to_string_lossy().starts_with("PALISADE_") {
                        command.env_remove(name);
                    }
                }
                command
            }
            Program::Etcd { bin } => {
                let client = format!("http://{}", self.address);
                let peer = format!("http://{}", self.second_address);
                let mut command = Command::new(bin);
                command
                    .arg("--name")
                    .arg("scale")
                    .arg("--data-dir")
                    .arg(&data)
                    .arg("--listen-client-urls")
                    .arg(&client)
                    .arg("--advertise-client-urls")
                    .arg(&client)
                    .arg("--listen-peer-urls")
                    .arg(&peer)
                    .arg("--initial-advertise-peer-urls")
                    .arg(&peer)
                    .arg("--initial-cluster")
                    .arg(format!("scale={peer}"))
                    .arg("--log-level")
                    .arg("error");
                command
            }
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {:?}", self.program))?;
        self.child = Some(child);
        Ok(())
    }

    /// The child's process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The child's resident memory (`VmRSS`), in bytes.
    pub(crate) fn rss_bytes(&self) -> anyhow::Result<u64> {
        let pid = self.pid().context("the server is not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        parse_vm_rss_bytes(&status).with_context(|| format!("no VmRSS in /proc/{pid}/status"))
    }

    /// Ends the child with `SIGKILL` and waits for it to be gone. An error if it had already
    /// exited: the benchmark would otherwise measure a dead server.
    pub(crate) fn kill(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(status) = child.try_wait()? {
            bail!(
                "the {} server had exited ({status}); the end of its log, {}:\n{}",
                self.kind(),
                self.log.display(),
                self.log_tail_text()
            );
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Kills the child (`SIGKILL`) and starts a new one on the same directory and ports.
    pub(crate) fn kill_and_respawn(&mut self) -> anyhow::Result<()> {
        self.kill()?;
        self.spawn()
    }

    /// An error naming the end of the log if the child has exited.
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!(
                "the {} server exited ({status}); the end of its log, {}:\n{}",
                self.kind(),
                self.log.display(),
                self.log_tail_text()
            );
        }
        Ok(())
    }

    fn log_tail_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The newest snapshot file in the data directory, its size and modification time: for
    /// Palisade any `snapshot*` file not being written (`*.tmp`), for etcd its backend
    /// database (`member/snap/db`), which is what etcd snapshots.
    pub(crate) fn snapshot_file(&self) -> Option<(u64, SystemTime)> {
        let data = self.data_dir();
        match self.program {
            Program::Palisade { .. } => std::fs::read_dir(&data)
                .ok()?
                .filter_map(Result::ok)
                .filter(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    name.starts_with("snapshot") && !name.ends_with(".tmp")
                })
                .filter_map(|entry| {
                    let meta = entry.metadata().ok()?;
                    Some((meta.len(), meta.modified().ok()?))
                })
                .max_by_key(|(_, modified)| *modified),
            Program::Etcd { .. } => {
                let meta = std::fs::metadata(data.join("member/snap/db")).ok()?;
                Some((meta.len(), meta.modified().ok()?))
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `VmRSS:   123456 kB` → bytes.
fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Follows a growing log file and counts the lines containing a needle that appeared since
/// the last look.
#[derive(Debug)]
pub(crate) struct LogTail {
    path: PathBuf,
    offset: u64,
    /// An incomplete last line, kept for the next look.
    partial: String,
}

impl LogTail {
    /// Starts at the current end of the file: earlier lines are not counted.
    pub(crate) fn at_end(path: &Path) -> LogTail {
        let offset = std::fs::metadata(path).map_or(0, |m| m.len());
        LogTail {
            path: path.to_path_buf(),
            offset,
            partial: String::new(),
        }
    }

    /// Lines containing `needle` written since the last call.
    pub(crate) fn new_matches(&mut self, needle: &str) -> usize {
        let Ok(mut file) = File::open(&self.path) else {
            return 0;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return 0;
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return 0;
        }
        self.offset += bytes.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&bytes));
        let complete = match self.partial.rfind('\n') {
            Some(end) => {
                let rest = self.partial.split_off(end + 1);
                std::mem::replace(&mut self.partial, rest)
            }
            None => return 0,
        };
        complete.lines().filter(|l| l.contains(needle)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_from_proc_status_in_bytes() {
        let status = "Name:\tpalisade\nVmPeak:\t  999 kB\nVmRSS:\t   2048 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss_bytes(status), Some(2048 * 1024));
        assert_eq!(parse_vm_rss_bytes("Name:\tx\n"), None);
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(parse_vm_rss_bytes(&own).unwrap() > 0);
    }

    #[test]
    fn a_log_tail_counts_only_complete_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "old build snapshot\n").unwrap();
        let mut tail = LogTail::at_end(&path);
        assert_eq!(tail.new_matches(SNAPSHOT_BUILD_LINE), 0);
        let append = |text: &str| {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(text.as_bytes()).unwrap();
        };
        append("x: build snapshot\nother\nhalf: build snap");
        assert_eq!(tail.new_matches(SNAPSHOT_BUILD_LINE), 1);
        append("shot\n");
        assert_eq!(tail.new_matches(SNAPSHOT_BUILD_LINE), 1);
        assert_eq!(tail.new_matches(SNAPSHOT_BUILD_LINE), 0);
    }
}
