//! Children a test spawns itself (a `palisade lock`, a `palisade watch`, …): killed if the test
//! ends before they do, waited for with a timeout, their output read line by line.

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Waits for a child to exit, or kills it and panics after `timeout`.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
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

/// The text of the file at `path` once something wrote it (it exists and is not empty): what
/// a child running a shell script says through a file. Panics after `timeout`, showing the
/// `stderr` file beside it, if there is one.
#[track_caller]
pub fn wait_for_file(path: &Path, timeout: Duration) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.is_empty()
        {
            return text;
        }
        assert!(
            started.elapsed() < timeout,
            "{} did not appear within {timeout:?}; stderr: {}",
            path.display(),
            std::fs::read_to_string(path.with_file_name("stderr")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A spawned process, resumed (`SIGCONT`) and killed if the test ends before it does. Only the
/// process itself is killed; its process group is left alone.
#[derive(Debug)]
pub struct Running {
    pub child: Child,
}

impl Running {
    pub fn spawn(mut command: Command) -> Running {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {command:?}: {e}"));
        Running { child }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Waits for exit, or kills and panics after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        wait_with_timeout(&mut self.child, timeout)
    }

    /// Everything the process wrote to its piped stdout (after it exited; empty if stdout was
    /// not piped or was taken, e.g. by [`Lines`]).
    pub fn stdout(&mut self) -> String {
        read_to_end(self.child.stdout.as_mut())
    }

    /// Everything the process wrote to its piped stderr (after it exited).
    pub fn stderr(&mut self) -> String {
        read_to_end(self.child.stderr.as_mut())
    }
}

fn read_to_end(pipe: Option<&mut impl std::io::Read>) -> String {
    let mut text = String::new();
    if let Some(pipe) = pipe {
        let _ = pipe.read_to_string(&mut text);
    }
    text
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(self.pid(), Signal::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads lines from a pipe on a thread, so a test can wait for one with a timeout.
#[derive(Debug)]
pub struct Lines {
    receiver: mpsc::Receiver<String>,
}

impl Lines {
    pub fn new(pipe: impl std::io::Read + Send + 'static) -> Lines {
        let (sender, receiver) = mpsc::channel();
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
