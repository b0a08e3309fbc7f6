//! `palisade lock NAME -- CMD…`: run a command while holding a lock.
//!
//! The session is kept alive while the command runs. The command gets the grant in its
//! environment (`PALISADE_LOCK`, `PALISADE_TOKEN`, `PALISADE_SEQUENCER`, `PALISADE_SESSION`,
//! `PALISADE_ENDPOINT`), so it can present the sequencer to the resources it writes.
//!
//! If the lock is lost while the command runs, the command is stopped — SIGTERM, then SIGKILL
//! after `--kill-grace` — and palisade exits with [`exit::LOCK_LOST`]. Stopping the command is
//! a courtesy, not the safety mechanism: a paused process learns of the loss late, which is why
//! resources check the sequencer.
//!
//! By default the command runs in its own process group and the signals go to the whole group,
//! so a shell's children are stopped too (as `timeout(1)` does). `--foreground` keeps it in
//! palisade's group instead, so it can read the terminal; then only the command itself is
//! signalled.
//!
//! The lock is given up only once the command is gone: after a loss the session is closed when
//! the command (and its group) has stopped, and the client library keeps renewing it meanwhile.
//! The command gets SIGKILL if palisade itself dies (`PR_SET_PDEATHSIG`), so a `kill -9` or an
//! OOM kill of palisade does not leave it running without a lease. A forwarded SIGTERM or SIGINT
//! that the command ignores is followed by SIGKILL after `--kill-grace`.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use anyhow::Context as _;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use palisade_client::{
    AcquireOptions, Client, LockGuard, ReleaseError, Session, SessionLost, SessionOptions, Wait,
};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};
use tokio::time::Instant;

use crate::Global;
use crate::args::{parse_duration, parse_wait};
use crate::exit::{self, Exit};
use crate::oneshot;
use crate::output::human_duration;

/// How often to check whether a stopped command's process group is gone.
const GROUP_POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct LockArgs {
    /// Name of the lock.
    pub name: String,
    /// Session lease: if palisade cannot renew it for this long (crash, pause, partition), the
    /// lock is released to the next waiter.
    #[arg(long, env = "PALISADE_TTL", default_value = "10s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// How long to wait for the lock: a duration (0 = only if free now) or `forever`.
    #[arg(long, default_value = "forever", value_parser = parse_wait)]
    pub wait: Wait,
    /// Time between SIGTERM and SIGKILL to the command: when the lock is lost, and after a
    /// SIGTERM or SIGINT passed on to it.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub kill_grace: Duration,
    /// Run the command in palisade's process group so it can use the terminal; on loss of the
    /// lock only the command itself, not its children, is signalled.
    #[arg(long)]
    pub foreground: bool,
    /// Claim the grant at this fenced store (`palisade store serve`'s URL) before the command
    /// starts, so no older holder can read or write there once it runs. Repeatable.
    #[arg(long, value_name = "STORE_URL")]
    pub claim: Vec<String>,
    /// The command to run while holding the lock, and its arguments.
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// Signals that palisade passes on to the command instead of dying of them.
const FORWARDED: [SignalKind; 4] = [
    SignalKind::interrupt(),
    SignalKind::terminate(),
    SignalKind::hangup(),
    SignalKind::quit(),
];

/// Receives the signals palisade forwards.
struct Signals {
    streams: Vec<(Signal, SignalStream)>,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        let mut streams = Vec::new();
        for kind in FORWARDED {
            let number = kind.as_raw_value();
            let signal_name = Signal::try_from(number).context("unknown signal number")?;
            let stream = signal(kind).with_context(|| format!("cannot handle {signal_name}"))?;
            streams.push((signal_name, stream));
        }
        Ok(Signals { streams })
    }

    /// The next signal received.
    async fn recv(&mut self) -> Signal {
        let futures = self.streams.iter_mut().map(|(name, stream)| {
            let name = *name;
            Box::pin(async move {
                stream.recv().await;
                name
            })
        });
        futures_select_all(futures).await
    }
}

/// The first of several futures to finish.
async fn futures_select_all<F: std::future::Future + Unpin>(
    futures: impl IntoIterator<Item = F>,
) -> F::Output {
    let mut futures: Vec<F> = futures.into_iter().collect();
    std::future::poll_fn(move |cx| {
        for future in futures.iter_mut() {
            if let std::task::Poll::Ready(output) = std::pin::Pin::new(future).poll(cx) {
                return std::task::Poll::Ready(output);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The exit status a shell would report for a process that ended with `status`.
pub fn shell_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::INTERNAL),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(exit::INTERNAL),
        (None, None) => exit::INTERNAL,
    }
}

/// Which processes to signal: the command's process group, or only the command.
#[derive(Debug, Clone, Copy)]
enum Target {
    Group(Pid),
    Process(Pid),
}

impl Target {
    /// Sends `signal`; false if nothing is left to receive it.
    fn send(self, signal: Signal) -> bool {
        let result = match self {
            Target::Group(group) => killpg(group, signal),
            Target::Process(pid) => kill(pid, signal),
        };
        match result {
            Ok(()) => true,
            Err(Errno::ESRCH) => false,
            Err(error) => {
                tracing::warn!(?self, %signal, %error, "cannot signal the command");
                false
            }
        }
    }

    /// True while some process of the target exists.
    fn alive(self) -> bool {
        let result = match self {
            Target::Group(group) => killpg(group, None),
            Target::Process(pid) => kill(pid, None),
        };
        !matches!(result, Err(Errno::ESRCH))
    }
}

pub async fn run(args: LockArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let mut signals = Signals::install()?;
    let client = global.connect().await?;
    let session = client
        .open_session(SessionOptions::with_ttl(args.ttl))
        .await?;
    let acquired = tokio::select! {
        acquired = session.acquire(&args.name, AcquireOptions::wait(args.wait)) => acquired,
        signal = signals.recv() => {
            close_quietly(session).await;
            return Ok(ExitCode::from(128 + signal as u8));
        }
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(error) => {
            let session_id = session.id();
            let closed = session.close().await;
            return Err(oneshot::not_acquired(&client, session_id, args.wait, error, closed).await);
        }
    };
    if let Err(error) = claim_stores(&args, &guard).await {
        release_quietly(guard).await;
        close_quietly(session).await;
        return Err(error);
    }
    let target = match spawn(&args, &client, &guard) {
        Ok(spawned) => spawned,
        Err(error) => {
            release_quietly(guard).await;
            close_quietly(session).await;
            return Err(error);
        }
    };
    let (mut child, target) = target;
    let lost = guard.lost();
    tokio::pin!(lost);
    // Set by a forwarded SIGTERM or SIGINT: when the command must be gone, or gets SIGKILL.
    let mut escalate_at: Option<Instant> = None;
    let outcome = loop {
        tokio::select! {
            biased;
            reason = &mut lost => break Outcome::Lost(reason),
            status = child.wait() => break Outcome::Exited(status),
            () = sleep_until(escalate_at) => {
                escalate_at = None;
                eprintln!(
                    "palisade: the command did not stop within {} of the signal; sending SIGKILL",
                    human_duration(args.kill_grace),
                );
                // The command is not reaped yet (`child.wait()` has not returned), so its pid,
                // and so its process group's id, cannot have been reused.
                target.send(Signal::SIGKILL);
            }
            signal = signals.recv() => {
                let forward = !args.foreground
                    || matches!(signal, Signal::SIGTERM | Signal::SIGHUP);
                if forward {
                    tracing::info!(%signal, "forwarding a signal to the command");
                    target.send(signal);
                    if matches!(signal, Signal::SIGTERM | Signal::SIGINT) && escalate_at.is_none() {
                        escalate_at = Some(Instant::now() + args.kill_grace);
                    }
                }
            }
        }
    };
    match outcome {
        Outcome::Exited(status) => {
            let status = status.context("cannot wait for the command")?;
            finish(&args, guard, session, status).await
        }
        Outcome::Lost(reason) => {
            eprintln!(
                "palisade: lock {:?} (token {}) was lost: {reason}; stopping the command (SIGTERM, then SIGKILL after {})",
                args.name,
                guard.token(),
                human_duration(args.kill_grace),
            );
            // The session is closed (and the lock given up) only once the command is gone;
            // until then the client library keeps renewing it as well as it can.
            stop(&mut child, target, args.kill_grace).await;
            drop(guard);
            close_quietly(session).await;
            Err(Exit::new(
                exit::LOCK_LOST,
                format!(
                    "lock {:?} was lost while the command ran ({reason}); the command was stopped",
                    args.name
                ),
            )
            .into())
        }
    }
}

/// Announces the grant at every `--claim` store, in order; the first refusal stops the run
/// with that store's exit status (stale: 3, unreachable: 69, …).
async fn claim_stores(args: &LockArgs, guard: &LockGuard) -> anyhow::Result<()> {
    for url in &args.claim {
        let claimed = match palisade_store::StoreClient::new(url) {
            Ok(store) => store.claim(Some(&args.name), Some(guard.sequencer())).await,
            Err(error) => Err(error),
        };
        if let Err(error) = claimed {
            let (code, prefix) = palisade_cli::store::exit_status(&error);
            return Err(Exit::new(
                code,
                format!(
                    "cannot claim lock {:?} at {url}: {prefix}{error}; the command was not started",
                    args.name
                ),
            )
            .into());
        }
        tracing::info!(store = %url, token = guard.token().get(), "claimed the grant");
    }
    Ok(())
}

enum Outcome {
    Exited(std::io::Result<ExitStatus>),
    Lost(SessionLost),
}

/// Starts the command with the grant in its environment.
fn spawn(args: &LockArgs, client: &Client, guard: &LockGuard) -> anyhow::Result<(Child, Target)> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Exit::new(exit::USAGE, "no command given after the lock name"))?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("PALISADE_LOCK", guard.lock())
        .env("PALISADE_TOKEN", guard.token().to_string())
        .env("PALISADE_SEQUENCER", guard.sequencer())
        .env("PALISADE_SESSION", guard.session_credential().to_string())
        .env("PALISADE_ENDPOINT", client.endpoints().join(","));
    if !args.foreground {
        command.process_group(0);
    }
    let parent = Pid::this();
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed. It makes two system calls, prctl(2) and getppid(2), and builds an
    // `io::Error` from an errno (no allocation); it takes no lock and touches no shared state.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            // If palisade dies (SIGKILL, OOM), the command dies with it rather than run on
            // without a lease. (The signal fires when the spawning thread ends: a runtime
            // worker, which lives as long as palisade.)
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // palisade may have died before the prctl: then the child was reparented already.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc_esrch()));
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|error| {
        let shown = program.to_string_lossy();
        match error.kind() {
            ErrorKind::NotFound => Exit::new(
                exit::COMMAND_NOT_FOUND,
                format!("{shown}: command not found"),
            ),
            _ => Exit::new(exit::CANNOT_EXECUTE, format!("cannot run {shown}: {error}")),
        }
    })?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .ok_or_else(|| Exit::new(exit::INTERNAL, "the command has no process id"))?;
    let target = if args.foreground {
        Target::Process(pid)
    } else {
        Target::Group(pid)
    };
    Ok((child, target))
}

/// SIGTERM, then SIGKILL to what is left after `grace`.
///
/// Once the command is reaped its pid is free, and once its group is seen empty the group's id
/// is free too: from then on nothing is signalled, so an unrelated process or group that got
/// the number is never hit.
async fn stop(child: &mut Child, target: Target, grace: Duration) {
    let deadline = Instant::now() + grace;
    target.send(Signal::SIGTERM);
    let exited = tokio::time::timeout_at(deadline, child.wait())
        .await
        .is_ok();
    if !exited {
        // Not reaped: the pid, and so the group's id, is still ours.
        eprintln!("palisade: the command did not stop within the grace period; sending SIGKILL");
        target.send(Signal::SIGKILL);
    } else if let Target::Group(_) = target {
        // The command is gone; other processes of its group may live on, and keep its id
        // taken while they do. Poll until the group is empty or the grace is over.
        let mut gone = !target.alive();
        while !gone && Instant::now() < deadline {
            tokio::time::sleep(GROUP_POLL_INTERVAL).await;
            gone = !target.alive();
        }
        if !gone {
            eprintln!(
                "palisade: the command's process group did not stop within the grace period; sending SIGKILL"
            );
            target.send(Signal::SIGKILL);
            while target.alive() && Instant::now() < deadline + grace {
                tokio::time::sleep(GROUP_POLL_INTERVAL).await;
            }
        }
    }
    if let Err(error) = child.wait().await {
        tracing::warn!(%error, "cannot wait for the stopped command");
    }
}

/// Sleeps until `deadline`; never wakes without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// ESRCH: the process (here, palisade as the command's parent) no longer exists.
fn libc_esrch() -> i32 {
    Errno::ESRCH as i32
}

/// After the command exited: release, close, and pass its status on — unless the lock turned
/// out to be lost before the end, which is reported instead.
async fn finish(
    args: &LockArgs,
    guard: LockGuard,
    session: Session,
    status: ExitStatus,
) -> anyhow::Result<ExitCode> {
    let code = shell_status(status);
    let token = guard.token();
    if let Some(reason) = guard.ended() {
        drop(guard);
        close_quietly(session).await;
        return Err(lost_at_exit(args, &reason.to_string(), code).into());
    }
    match guard.release().await {
        Ok(()) => {}
        Err(ReleaseError::SessionNotFound { .. }) => {
            close_quietly(session).await;
            return Err(lost_at_exit(args, "the session had expired", code).into());
        }
        Err(error) => eprintln!(
            "palisade: warning: could not release lock {:?} (token {token}): {error}",
            args.name
        ),
    }
    if let Err(error) = session.close().await {
        tracing::debug!(%error, "closing the session failed");
    }
    Ok(ExitCode::from(code))
}

fn lost_at_exit(args: &LockArgs, reason: &str, code: u8) -> Exit {
    Exit::new(
        exit::LOCK_LOST,
        format!(
            "lock {:?} was lost before the command finished ({reason}); the command exited with status {code}",
            args.name
        ),
    )
}

/// Releases the lock, logging (not reporting) a failure: the caller is already exiting.
async fn release_quietly(guard: LockGuard) {
    if let Err(error) = guard.release().await {
        tracing::debug!(%error, "releasing the lock failed");
    }
}

async fn close_quietly(session: Session) {
    if let Err(error) = session.close().await {
        tracing::debug!(%error, "closing the session failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_pass_through_and_signals_become_128_plus() {
        assert_eq!(shell_status(ExitStatus::from_raw(0)), 0);
        assert_eq!(shell_status(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(shell_status(ExitStatus::from_raw(255 << 8)), 255);
        assert_eq!(shell_status(ExitStatus::from_raw(9)), 137);
        assert_eq!(shell_status(ExitStatus::from_raw(15)), 143);
    }
}
