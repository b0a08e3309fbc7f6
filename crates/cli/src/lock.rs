//! `palisade lock NAME… -- CMD…`: run a command while holding a lock, or several.
//!
//! The session is kept alive while the command runs. The command gets the grant in its
//! environment (`PALISADE_LOCK`, `PALISADE_TOKEN`, `PALISADE_SEQUENCER`, `PALISADE_SESSION`,
//! `PALISADE_ENDPOINT`, `PALISADE_VALUE` with `--value`, and `PALISADE_SLOT` with `--permits`),
//! so it can present the sequencer to the resources it writes. `--shared` takes the lock as a
//! reader and `--permits N` one permit of a semaphore (docs/locks.md).
//!
//! Several names take a **multi-lock**: all of the locks at once, or none, so two commands
//! naming the same locks in any order cannot deadlock. Every name before `--` is a lock (the
//! `--` is what tells names from the command). Each lock has its own grant, so the command gets
//! them numbered in the order named (`PALISADE_LOCK_1`, `PALISADE_TOKEN_1`,
//! `PALISADE_SEQUENCER_1`, `PALISADE_SLOT_1`, …) with their count in `PALISADE_LOCK_COUNT`;
//! the unnumbered `PALISADE_LOCK`, `PALISADE_TOKEN`, `PALISADE_SEQUENCER` and `PALISADE_SLOT`
//! are set only for a single lock, so a script written for one lock cannot present one lock's
//! sequencer for another's resource by mistake.
//!
//! `palisade elect NAME -- CMD…` is the same with a wait as long as it takes: a candidate in
//! the election NAME runs the command while it leads, with its epoch (the grant's token, higher
//! than every earlier leader's) as `PALISADE_EPOCH`, and steps down when the command exits.
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
//!
//! palisade is a child subreaper (`PR_SET_CHILD_SUBREAPER`): an orphan among the command's
//! descendants, one that left its process group with `setsid()` included, is adopted by
//! palisade rather than by init, so stopping the command stops those too. Once the command is
//! reaped, its pid and group id are never signalled again (another process may have the number
//! by then); only palisade's own children are, whose pids stay palisade's until it reaps them.
//! Not covered: the command's children when palisade itself is killed (the parent-death signal
//! reaches the command alone), and what the command leaves running when it exits normally.
//!
//! The lease must not end while the command may still run: once the service expires it, it
//! can grant the lock to the next waiter. So when the lease palisade can prove
//! ([`Session::lease_remaining`]) is down to `min(--kill-grace, ttl/4)` with no renewal
//! acknowledged, palisade stops the command then, SIGKILL landing [`KILL_MARGIN`] before that
//! lease ends, and exits with [`exit::LOCK_LOST`]. The service's lease is at least the proven
//! one, so no next holder is granted while the command runs — unless palisade itself is frozen.

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
    AcquireError, AcquireOptions, Client, LockGuard, LockPart, ReleaseError, Session, SessionLost,
    SessionOptions, Wait,
};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};
use tokio::time::Instant;

use crate::Global;
use crate::args::{parse_duration, parse_value, parse_wait};
use crate::exit::{self, Exit};
use crate::oneshot;
use crate::output::human_duration;

/// How often to look whether what a stopped command left behind is gone.
const GROUP_POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct LockArgs {
    /// Name of the lock. Several names take all of these locks at once, or none (a
    /// multi-lock, up to 32): the command runs once every one is held, each with its own token
    /// and sequencer, numbered in the order named (PALISADE_LOCK_1, PALISADE_TOKEN_1,
    /// PALISADE_SEQUENCER_1, PALISADE_SLOT_1, …, and PALISADE_LOCK_COUNT); nothing is held
    /// while it waits, so commands that name the same locks in another order cannot deadlock.
    /// Every word before `--` is a lock name, so the `--` before the command is required.
    #[arg(value_name = "NAME", required = true, num_args = 1..)]
    pub names: Vec<String>,
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
    /// Attach this value to the grant: `status`, `locks`, `watch` and `leader` show it beside
    /// the holder (1 to 1024 bytes, no control characters). The command gets it as
    /// PALISADE_VALUE. One lock only: a multi-lock's grants carry no value.
    #[arg(long, value_parser = parse_value)]
    pub value: Option<String>,
    /// Take the lock shared, as a reader: readers run together, each with the token of its
    /// phase, and a writer (the same lock without --shared) waits until they are done. A
    /// reader's sequencer cannot write at a fenced resource. With several names, every lock
    /// is taken shared. See docs/locks.md.
    #[arg(long, conflicts_with = "permits")]
    pub shared: bool,
    /// Take one permit of the semaphore NAME of N permits (1 to 4096): at most N holders run
    /// at once, each in a slot 0..N with a token of its own; the command gets its slot as
    /// PALISADE_SLOT. Every holder must name the same N. With several names, one permit of
    /// each (PALISADE_SLOT_1, …). See docs/locks.md.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(palisade_client::PERMITS_MAX)))]
    pub permits: Option<u32>,
    /// Set by `palisade elect`: the command also gets PALISADE_EPOCH.
    #[arg(skip)]
    pub election: bool,
    /// The command to run while holding the lock, and its arguments, after `--`.
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        last = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// `palisade elect NAME -- CMD…`: campaign in the election NAME, run the command while leading.
#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct ElectArgs {
    /// Name of the election (its lock).
    pub name: String,
    /// What observers (`palisade leader`) see of this candidate once it leads: its address,
    /// say (1 to 1024 bytes, no control characters). The command gets it as PALISADE_VALUE.
    #[arg(long, value_parser = parse_value)]
    pub value: Option<String>,
    /// Session lease: if palisade cannot renew it for this long (crash, pause, partition), the
    /// next candidate leads.
    #[arg(long, env = "PALISADE_TTL", default_value = "10s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Time between SIGTERM and SIGKILL to the command: when leadership is lost, and after a
    /// SIGTERM or SIGINT passed on to it.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub kill_grace: Duration,
    /// Run the command in palisade's process group so it can use the terminal; on loss of
    /// leadership only the command itself, not its children, is signalled.
    #[arg(long)]
    pub foreground: bool,
    /// Claim the epoch at this fenced store (`palisade store serve`'s URL) before the command
    /// starts, so no earlier leader can read or write there once it runs. Repeatable.
    #[arg(long, value_name = "STORE_URL")]
    pub claim: Vec<String>,
    /// The command to run while leading, and its arguments.
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

impl LockArgs {
    /// Exclusive, shared, or a permit, as the flags ask.
    fn mode(&self) -> palisade_client::Mode {
        use palisade_client::Mode;
        match (self.shared, self.permits) {
            (_, Some(permits)) => Mode::Permit(permits),
            (true, None) => Mode::Shared,
            (false, None) => Mode::Exclusive,
        }
    }

    /// `lock "a"`, or `locks "a", "b"` for a multi-lock: what messages name.
    fn described(&self) -> String {
        let quoted: Vec<String> = self.names.iter().map(|n| format!("{n:?}")).collect();
        match quoted.as_slice() {
            [one] => format!("lock {one}"),
            all => format!("locks {}", all.join(", ")),
        }
    }
}

impl From<ElectArgs> for LockArgs {
    /// A campaign is a wait, as long as it takes, for the election's lock.
    fn from(args: ElectArgs) -> LockArgs {
        LockArgs {
            names: vec![args.name],
            ttl: args.ttl,
            wait: Wait::Forever,
            kill_grace: args.kill_grace,
            foreground: args.foreground,
            claim: args.claim,
            shared: false,
            permits: None,
            value: args.value,
            election: true,
            command: args.command,
        }
    }
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
}

pub async fn run(args: LockArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let mut signals = Signals::install()?;
    adopted::become_subreaper().context("cannot become a child subreaper")?;
    if args.names.len() > 1 && args.value.is_some() {
        return Err(Exit::new(
            exit::USAGE,
            "--value attaches to one lock's grant; a multi-lock's grants carry none",
        )
        .into());
    }
    let client = global.connect().await?;
    let session = client
        .open_session(SessionOptions::with_ttl(args.ttl))
        .await?;
    let acquired = tokio::select! {
        acquired = acquire(&args, &session) => acquired,
        signal = signals.recv() => {
            close_quietly(session).await;
            return Ok(ExitCode::from(128 + signal as u8));
        }
    };
    let guards = match acquired {
        Ok(guards) => guards,
        Err(error) => {
            let session_id = session.id();
            let closed = session.close().await;
            return Err(oneshot::not_acquired(&client, session_id, args.wait, error, closed).await);
        }
    };
    if let Err(error) = claim_stores(&args, &guards).await {
        release_quietly(guards).await;
        close_quietly(session).await;
        return Err(error);
    }
    let target = match spawn(&args, &client, &guards, global) {
        Ok(spawned) => spawned,
        Err(error) => {
            release_quietly(guards).await;
            close_quietly(session).await;
            return Err(error);
        }
    };
    let (mut child, target) = target;
    let lost = session.lost();
    tokio::pin!(lost);
    // Set by a forwarded SIGTERM or SIGINT: when the command must be gone, or gets SIGKILL.
    let mut escalate_at: Option<Instant> = None;
    // The lease must not run out while the command may still run: when less than this is left
    // of what palisade can prove, the command is stopped, SIGKILL landing before the lease ends.
    let lease_stop_budget = lease_stop_budget(args.kill_grace, session.ttl());
    let outcome = loop {
        tokio::select! {
            biased;
            reason = &mut lost => break Outcome::Lost(reason),
            // A command that has finished is not stopped: its status is passed on.
            status = child.wait() => break Outcome::Exited(status),
            remaining = lease_running_out(&session, lease_stop_budget) => {
                break Outcome::LeaseEnding(remaining)
            }
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
            finish(&args, guards, session, status).await
        }
        Outcome::Lost(reason) => {
            eprintln!(
                "palisade: {} was lost: {reason}; stopping the command (SIGTERM, then SIGKILL after {})",
                with_tokens(&guards),
                human_duration(args.kill_grace),
            );
            // The session is closed (and the lock given up) only once the command is gone;
            // until then the client library keeps renewing it as well as it can.
            stop(&mut child, target, args.kill_grace).await;
            drop(guards);
            close_quietly(session).await;
            Err(Exit::new(
                exit::LOCK_LOST,
                format!(
                    "{} was lost while the command ran ({reason}); the command was stopped",
                    args.described()
                ),
            )
            .into())
        }
        Outcome::LeaseEnding(remaining) => {
            // Once the proven lease is over, the service may expire the session and grant the
            // lock to the next waiter at any moment: the command must be gone by then, so it
            // gets what is left, less a margin for SIGKILL to take effect. If that is nothing,
            // palisade itself was held up (paused, starved) past the point where it could still
            // beat the lease: rushing gains nothing, and the command gets its usual grace.
            let grace = match remaining.checked_sub(KILL_MARGIN) {
                Some(grace) if !grace.is_zero() => grace,
                _ => args.kill_grace,
            };
            eprintln!(
                "palisade: {} is being lost: no renewal of its lease was acknowledged and it ends within {}; stopping the command (SIGTERM, then SIGKILL after {})",
                with_tokens(&guards),
                human_duration(remaining),
                human_duration(grace),
            );
            stop(&mut child, target, grace).await;
            drop(guards);
            close_quietly(session).await;
            Err(Exit::new(
                exit::LOCK_LOST,
                format!(
                    "{} was lost while the command ran (its lease could not be renewed); the command was stopped before the lease ended",
                    args.described()
                ),
            )
            .into())
        }
    }
}

/// Time SIGKILL is given to take effect before a lease ends.
const KILL_MARGIN: Duration = Duration::from_millis(100);

/// How much proven lease is left when palisade starts stopping the command: the kill grace,
/// but at most a quarter of the ttl. A healthy session renews every third of its ttl and so
/// never has less than about two thirds left; a quarter is left only once renewals have gone
/// unanswered for three quarters of the ttl, so a passing delay or a failover (which the
/// keepalive rides out well within that) does not stop the command. Safety does not depend on
/// the fraction: SIGKILL lands before the proven lease ends whatever it is; it only sets how
/// long the command may take to stop on its own.
fn lease_stop_budget(kill_grace: Duration, ttl: Duration) -> Duration {
    kill_grace.saturating_add(KILL_MARGIN).min(ttl / 4)
}

/// Resolves, with what is left of it, once the lease this process can prove is down to
/// `budget`; never while the session has ended (its `lost()` reports that).
///
/// The proven lease only grows between two looks (a renewal moves its end later), so sleeping
/// until it would reach `budget` and looking again is exact; each look either resolves or
/// sleeps until a later end, so the loop ends.
async fn lease_running_out(session: &Session, budget: Duration) -> Duration {
    loop {
        match session.lease_remaining() {
            None => return std::future::pending().await,
            Some(remaining) if remaining <= budget => return remaining,
            Some(remaining) => tokio::time::sleep(remaining - budget).await,
        }
    }
}

/// Takes the lock, or all the locks at once (a multi-lock), as the arguments say.
async fn acquire(args: &LockArgs, session: &Session) -> Result<Vec<LockGuard>, AcquireError> {
    match args.names.as_slice() {
        [name] => {
            let options = AcquireOptions {
                wait: args.wait,
                value: args.value.clone(),
                mode: args.mode(),
            };
            Ok(vec![session.acquire(name, options).await?])
        }
        names => {
            let parts: Vec<LockPart> = (names.iter())
                .map(|name| LockPart {
                    lock: name.clone(),
                    mode: args.mode(),
                })
                .collect();
            session.acquire_all(&parts, args.wait).await
        }
    }
}

/// `lock "a" (token 5)`, or `locks "a" (token 5), "b" (token 6)`.
fn with_tokens(guards: &[LockGuard]) -> String {
    let each: Vec<String> = (guards.iter())
        .map(|g| format!("{:?} (token {})", g.lock(), g.token()))
        .collect();
    match each.as_slice() {
        [one] => format!("lock {one}"),
        all => format!("locks {}", all.join(", ")),
    }
}

/// Announces each grant at every `--claim` store, in order; the first refusal stops the run
/// with that store's exit status (stale: 3, unreachable: 69, …).
async fn claim_stores(args: &LockArgs, guards: &[LockGuard]) -> anyhow::Result<()> {
    for url in &args.claim {
        for guard in guards {
            let claimed = match palisade_cli::store::store_client(url) {
                Ok(store) => {
                    store
                        .claim(Some(guard.lock()), Some(guard.sequencer()))
                        .await
                }
                Err(error) => Err(error),
            };
            if let Err(error) = claimed {
                let (code, prefix) = palisade_cli::store::exit_status(&error);
                return Err(Exit::new(
                    code,
                    format!(
                        "cannot claim lock {:?} at {url}: {prefix}{error}; the command was not started",
                        guard.lock()
                    ),
                )
                .into());
            }
            tracing::info!(store = %url, lock = guard.lock(), token = guard.token().get(), "claimed the grant");
        }
    }
    Ok(())
}

enum Outcome {
    Exited(std::io::Result<ExitStatus>),
    Lost(SessionLost),
    /// The proven lease is down to this, with no renewal acknowledged meanwhile.
    LeaseEnding(Duration),
}

/// Starts the command with the grants in its environment.
fn spawn(
    args: &LockArgs,
    client: &Client,
    guards: &[LockGuard],
    global: &Global,
) -> anyhow::Result<(Child, Target)> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Exit::new(exit::USAGE, "no command given after the lock name"))?;
    let first = guards
        .first()
        .ok_or_else(|| Exit::new(exit::INTERNAL, "no lock was granted"))?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("PALISADE_SESSION", first.session_credential().to_string())
        .env("PALISADE_ENDPOINT", client.endpoints().join(","))
        .env("PALISADE_LOCK_COUNT", guards.len().to_string());
    for (n, guard) in (1..).zip(guards) {
        command
            .env(format!("PALISADE_LOCK_{n}"), guard.lock())
            .env(format!("PALISADE_TOKEN_{n}"), guard.token().to_string())
            .env(format!("PALISADE_SEQUENCER_{n}"), guard.sequencer());
        if let Some(slot) = guard.slot() {
            command.env(format!("PALISADE_SLOT_{n}"), slot.to_string());
        }
    }
    if let [guard] = guards {
        command
            .env("PALISADE_LOCK", guard.lock())
            .env("PALISADE_TOKEN", guard.token().to_string())
            .env("PALISADE_SEQUENCER", guard.sequencer());
        if let Some(slot) = guard.slot() {
            command.env("PALISADE_SLOT", slot.to_string());
        }
        if args.election {
            // The epoch is the token: what the leader fences its side effects with.
            command.env("PALISADE_EPOCH", guard.token().to_string());
        }
    }
    if let Some(value) = &args.value {
        command.env("PALISADE_VALUE", value);
    }
    // The command reaches the service (and an https:// store) with the same TLS files.
    for (name, path) in &global.tls_files {
        command.env(name, path);
    }
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
            // without a lease. (The signal fires when the thread that forked ends, not the
            // process: that is the thread running the runtime's `block_on` or one of its
            // workers, and both live as long as palisade.)
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

/// SIGTERM, then SIGKILL to what is left after `grace`: the command (its process group), and
/// every process it left behind that palisade adopted.
///
/// The command's pid, and so its group's id, is signalled only while the command is not
/// reaped, when neither can have been reused. Once it is reaped, nothing is sent to either
/// again (an unrelated process or group may get the number): what is left of the command's
/// processes then descends from palisade's own children (palisade is a child subreaper, so it
/// adopts every orphan among them, those that left the group with `setsid()` included), whose
/// pids stay palisade's until it reaps them.
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
    }
    if let Err(error) = child.wait().await {
        tracing::warn!(%error, "cannot wait for the stopped command");
    }
    // The command is reaped. What it left behind got the group's SIGTERM, except what left the
    // group: those get theirs as they are adopted. Whatever runs at the deadline gets SIGKILL.
    let mut warned = false;
    let mut terminated = Vec::new();
    for _ in 0..ORPHAN_POLLS_MAX {
        let orphans = adopted::children();
        if orphans.is_empty() || Instant::now() >= deadline {
            break;
        }
        for pid in orphans {
            if !terminated.contains(&pid) {
                if !warned {
                    eprintln!(
                        "palisade: the command left processes behind; stopping them (SIGTERM, then SIGKILL at the end of the grace period)"
                    );
                    warned = true;
                }
                adopted::signal(pid, Signal::SIGTERM);
                terminated.push(pid);
            }
        }
        tokio::time::sleep(
            GROUP_POLL_INTERVAL.min(deadline.saturating_duration_since(Instant::now())),
        )
        .await;
        adopted::reap_exited();
    }
    adopted::kill_all().await;
}

/// The processes palisade adopted as a child subreaper: what the command left behind.
///
/// Each function here touches only palisade's own children: listed from `/proc`, their pids
/// cannot be reused before palisade reaps them, so a signal never reaches a stranger. The
/// command itself is reaped (by tokio) before any of this runs, and palisade starts no other
/// child, so reaping here never takes a status tokio waits for.
mod adopted {
    use std::time::Duration;

    use nix::errno::Errno;
    use nix::sys::signal::{Signal, kill};
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use nix::unistd::Pid;
    use tokio::time::Instant;

    /// Rounds of SIGKILL in [`kill_all`]: each takes one generation of the adopted processes'
    /// descendants (adopted in turn as their parents die).
    const KILL_ROUNDS_MAX: usize = 64;
    /// How long [`kill_all`] waits for the processes it killed to be gone.
    const KILL_WAIT_MAX: Duration = Duration::from_secs(10);
    /// Processes looked at in `/proc`: far above any system's pid limit.
    const PROC_ENTRIES_MAX: usize = 4 << 20;

    /// Makes this process a child subreaper: an orphan among its descendants is adopted by it
    /// rather than by init, so the command's processes stay within reach.
    pub fn become_subreaper() -> nix::Result<()> {
        nix::sys::prctl::set_child_subreaper(true)
    }

    /// This process's living (not zombie) children.
    pub fn children() -> Vec<Pid> {
        let me = nix::unistd::getpid().as_raw();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut children = Vec::new();
        for entry in entries.take(PROC_ENTRIES_MAX).flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid …`: the command name may hold anything but ends at the
            // last parenthesis.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(me) && state != Some("Z") {
                children.push(Pid::from_raw(pid));
            }
        }
        children
    }

    pub fn signal(pid: Pid, signal: Signal) {
        match kill(pid, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(error) => tracing::warn!(%pid, %signal, %error, "cannot signal a leftover process"),
        }
    }

    /// Reaps every child that has exited, without waiting.
    pub fn reap_exited() {
        for _ in 0..super::ORPHAN_POLLS_MAX {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// SIGKILL to every child, and to their descendants as they are adopted, until none is
    /// left or the bounds are reached.
    pub async fn kill_all() {
        let deadline = Instant::now() + KILL_WAIT_MAX;
        for _ in 0..KILL_ROUNDS_MAX {
            reap_exited();
            let children = children();
            if children.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    left = children.len(),
                    "leftover processes did not die in time"
                );
                return;
            }
            for pid in children {
                signal(pid, Signal::SIGKILL);
            }
            tokio::time::sleep(super::GROUP_POLL_INTERVAL).await;
        }
    }
}

/// Looks at the processes the command left behind at most this many times (each a
/// [`GROUP_POLL_INTERVAL`] apart, and never past the grace).
const ORPHAN_POLLS_MAX: usize = 100_000;

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
    guards: Vec<LockGuard>,
    session: Session,
    status: ExitStatus,
) -> anyhow::Result<ExitCode> {
    let code = shell_status(status);
    if let Some(reason) = session.ended() {
        drop(guards);
        close_quietly(session).await;
        return Err(lost_at_exit(args, &reason.to_string(), code).into());
    }
    for guard in guards {
        let (lock, token) = (guard.lock().to_string(), guard.token());
        match guard.release().await {
            Ok(()) => {}
            Err(ReleaseError::SessionNotFound { .. }) => {
                close_quietly(session).await;
                return Err(lost_at_exit(args, "the session had expired", code).into());
            }
            Err(error) => eprintln!(
                "palisade: warning: could not release lock {lock:?} (token {token}): {error}"
            ),
        }
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
            "{} was lost before the command finished ({reason}); the command exited with status {code}",
            args.described()
        ),
    )
}

/// Releases the locks, logging (not reporting) a failure: the caller is already exiting.
async fn release_quietly(guards: Vec<LockGuard>) {
    for guard in guards {
        if let Err(error) = guard.release().await {
            tracing::debug!(%error, "releasing the lock failed");
        }
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
