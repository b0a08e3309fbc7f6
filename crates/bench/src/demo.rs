//! `palisade demo`: the pause scenario (a holder paused past its lease writes after the next
//! holder), end to end on real components.
//!
//! A lock service (and, for the fenced run, a fenced store) start in this process on temporary
//! directories and free loopback ports. Then, twice:
//!
//! 1. client A takes lock `demo/report` with a short lease, reads the report, and pauses — a
//!    stop-the-world GC: no keepalives, no progress — for longer than its lease;
//! 2. the lock service expires A's session and grants the lock to client B, which was waiting:
//!    a higher token. B reads the report, adds its line, writes it;
//! 3. A wakes up, still believing it holds the lock, and writes the report it prepared before
//!    the pause, with its old sequencer.
//!
//! In the first run the resource is a plain file that trusts whoever holds the lock: A's write
//! lands and B's line is silently lost. In the second the resource is the fenced store: A's
//! write is refused (409, naming the token the store accepted) and B's line survives.
//!
//! The lock is advisory in both runs; what changes is only whether the resource checks tokens.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use palisade_client::{
    AcquireOptions, Client, Grant, LockEventKind, LockGuard, Session, SessionOptions, Token, Wait,
};
use palisade_core::duration::parse_duration;
use palisade_store::{StoreClient, StoreClientError, StoreError};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::local::{LocalLockService, LocalStore};

/// The lock both clients contend for.
pub const DEMO_LOCK: &str = "demo/report";
/// The resource's key (the fenced store's key; the plain file's name).
const REPORT_KEY: &str = "report";
/// Longest the demo waits for B to be granted and write, beyond A's pause.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);

/// Flags of `palisade demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Lease of client A's session (at least 1s).
    #[arg(long, default_value = "1500ms", value_parser = parse_duration)]
    pub ttl: Duration,
    /// How long A stays paused; must be longer than --ttl.
    #[arg(long, default_value = "2500ms", value_parser = parse_duration)]
    pub pause: Duration,
    /// Print the result as JSON (timelines included) instead of the live timeline.
    #[arg(long)]
    pub json: bool,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            ttl: Duration::from_millis(1_500),
            pause: Duration::from_millis(2_500),
            json: false,
        }
    }
}

/// Everything the demo showed.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub lock: &'static str,
    pub ttl_ms: u64,
    pub pause_ms: u64,
    /// The unfenced run, then the fenced run.
    pub runs: Vec<DemoRun>,
}

/// One run of the scenario.
#[derive(Debug, Clone, Serialize)]
pub struct DemoRun {
    pub fenced: bool,
    /// What the resource was.
    pub resource: String,
    /// A's grant (the paused holder) and B's (the next holder).
    pub token_a: Token,
    pub token_b: Token,
    pub b_write: WriteOutcome,
    /// A's write after its pause, with its old sequencer.
    pub a_stale_write: WriteOutcome,
    /// The report's lines at the end.
    pub final_report: Vec<String>,
    pub outcome: Outcome,
    pub verdict: String,
    pub timeline: Vec<TimelineEvent>,
}

/// What the resource did with a write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum WriteOutcome {
    Accepted,
    Refused {
        http_status: u16,
        /// For a stale token: the token the resource had accepted.
        accepted_token: Option<Token>,
        message: String,
    },
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The paused holder's write landed and erased the next holder's update.
    LostUpdate,
    /// The resource refused the paused holder's write; the next holder's update survived.
    StaleWriteRefused,
    /// Neither: something did not behave as the scenario expects.
    Unexpected,
}

/// One line of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineEvent {
    pub elapsed_ms: u64,
    pub actor: String,
    pub what: String,
}

/// Runs `palisade demo` and prints it.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let report = play(&args, !args.json).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if let Some(run) = report
        .runs
        .iter()
        .find(|r| r.outcome == Outcome::Unexpected)
    {
        bail!(
            "the {} run did not go as the scenario expects: {}",
            if run.fenced { "fenced" } else { "unfenced" },
            run.verdict
        );
    }
    Ok(())
}

/// Plays both runs; with `live`, prints each timeline line as it happens.
pub async fn play(args: &DemoArgs, live: bool) -> anyhow::Result<DemoReport> {
    if args.ttl < Duration::from_secs(1) {
        bail!("--ttl must be at least 1s (the lock service's shortest lease)");
    }
    if args.pause <= args.ttl || args.pause > Duration::from_secs(60) {
        bail!("--pause must be longer than --ttl (and at most 60s)");
    }
    if live {
        println!(
            "palisade demo: a lock holder pauses past its lease\n\
             lock {DEMO_LOCK}, client A's lease {} ms, A pauses {} ms; \
             lock service and store run in this process on temporary directories",
            args.ttl.as_millis(),
            args.pause.as_millis()
        );
    }
    let mut runs = Vec::with_capacity(2);
    for fenced in [false, true] {
        if live {
            println!(
                "\n── run {} of 2: {} ──",
                if fenced { 2 } else { 1 },
                if fenced {
                    "the resource checks sequencers (palisade fenced store)"
                } else {
                    "the resource trusts the lock (a plain file, no fencing)"
                }
            );
        }
        let run = play_once(args, fenced, live).await?;
        if live {
            println!("verdict: {}", run.verdict);
        }
        runs.push(run);
    }
    if live {
        println!(
            "\nThe lock service behaved the same both times: A's lease ran out, B got a higher \
             token. Only the resource that checked the token could stop A's late write."
        );
    }
    Ok(DemoReport {
        lock: DEMO_LOCK,
        ttl_ms: millis(args.ttl),
        pause_ms: millis(args.pause),
        runs,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The timeline of one run: recorded, and printed as it happens when live.
#[derive(Debug)]
struct Timeline {
    start: Instant,
    live: bool,
    events: Mutex<Vec<TimelineEvent>>,
}

impl Timeline {
    fn new(live: bool) -> Timeline {
        if live {
            println!("{:>9}  {:<13} what", "elapsed", "who");
        }
        Timeline {
            start: Instant::now(),
            live,
            events: Mutex::new(Vec::new()),
        }
    }

    fn log(&self, actor: &str, what: impl Into<String>) {
        let event = TimelineEvent {
            elapsed_ms: millis(self.start.elapsed()),
            actor: actor.to_string(),
            what: what.into(),
        };
        if self.live {
            println!(
                "{:>6} ms  {:<13} {}",
                event.elapsed_ms, event.actor, event.what
            );
        }
        self.events
            .lock()
            .expect("the timeline lock is never poisoned")
            .push(event);
    }

    fn events(&self) -> Vec<TimelineEvent> {
        self.events
            .lock()
            .expect("the timeline lock is never poisoned")
            .clone()
    }
}

/// The protected resource of one run.
#[derive(Debug)]
enum Resource {
    /// A file that trusts whoever holds the lock.
    PlainFile(PathBuf),
    /// The fenced store: checks each write's sequencer.
    Fenced(StoreClient),
}

impl Resource {
    fn actor(&self) -> &'static str {
        match self {
            Resource::PlainFile(_) => "report file",
            Resource::Fenced(_) => "fenced store",
        }
    }

    async fn read(&self) -> anyhow::Result<Vec<String>> {
        let text = match self {
            Resource::PlainFile(path) => match tokio::fs::read_to_string(path).await {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(e).context("cannot read the report file"),
            },
            Resource::Fenced(store) => match store.get(REPORT_KEY).await? {
                Some(entry) => String::from_utf8_lossy(&entry.value).into_owned(),
                None => String::new(),
            },
        };
        Ok(text.lines().map(str::to_string).collect())
    }

    async fn write(&self, lines: &[String], sequencer: &str) -> anyhow::Result<WriteOutcome> {
        let text = lines.join("\n");
        match self {
            Resource::PlainFile(path) => {
                tokio::fs::write(path, text)
                    .await
                    .context("cannot write the report file")?;
                Ok(WriteOutcome::Accepted)
            }
            Resource::Fenced(store) => {
                match store
                    .put(REPORT_KEY, text.as_bytes(), Some(sequencer), None)
                    .await
                {
                    Ok(_) => Ok(WriteOutcome::Accepted),
                    Err(error @ StoreClientError::Store(StoreError::Stale { accepted, .. })) => {
                        Ok(WriteOutcome::Refused {
                            http_status: error.http_status(),
                            accepted_token: Some(Token::new(accepted)),
                            message: error.to_string(),
                        })
                    }
                    Err(error) if !error.is_retryable() => Ok(WriteOutcome::Refused {
                        http_status: error.http_status(),
                        accepted_token: None,
                        message: error.to_string(),
                    }),
                    Err(error) => Err(error).context("the store could not be reached"),
                }
            }
        }
    }
}

fn show(lines: &[String]) -> String {
    if lines.is_empty() {
        "(empty)".to_string()
    } else {
        lines
            .iter()
            .map(|l| format!("{l:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn show_outcome(outcome: &WriteOutcome) -> String {
    match outcome {
        WriteOutcome::Accepted => "ACCEPTED".to_string(),
        WriteOutcome::Refused {
            http_status,
            message,
            ..
        } => format!("REFUSED ({http_status}): {message}"),
    }
}

async fn play_once(args: &DemoArgs, fenced: bool, live: bool) -> anyhow::Result<DemoRun> {
    let service = LocalLockService::start()
        .await
        .context("cannot start the demo's lock service")?;
    let store = if fenced {
        Some(
            LocalStore::start(service.public_key())
                .await
                .context("cannot start the demo's fenced store")?,
        )
    } else {
        None
    };
    let file_dir = tempfile::Builder::new()
        .prefix("palisade-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let (resource, resource_name) = match &store {
        Some(store) => (
            Resource::Fenced(StoreClient::new(&store.url())?),
            format!("fenced store {} key {REPORT_KEY:?}", store.url()),
        ),
        None => {
            let path = file_dir.path().join("report.txt");
            let name = format!("plain file {}", path.display());
            (Resource::PlainFile(path), name)
        }
    };
    let result = scenario(args, fenced, live, &service, resource, resource_name).await;
    if let Some(store) = store {
        store.stop().await?;
    }
    service.stop().await?;
    result
}

async fn scenario(
    args: &DemoArgs,
    fenced: bool,
    live: bool,
    service: &LocalLockService,
    resource: Resource,
    resource_name: String,
) -> anyhow::Result<DemoRun> {
    let resource = Arc::new(resource);
    // Two connections, as if A and B were two processes.
    let client_a = Client::connect(&service.endpoint()).await?;
    let client_b = Client::connect(&service.endpoint()).await?;
    let timeline = Arc::new(Timeline::new(live));

    let expiry_seen = Arc::new(Notify::new());
    let watcher = watch_expiry(&client_b, args.ttl, &timeline, &expiry_seen).await?;
    let a = a_takes_the_lock_and_pauses(&client_a, args, &resource, &timeline).await?;
    let a_wakes_at = Instant::now() + args.pause;

    // B: an ordinary session with keepalive; waits in line for the lock.
    let b_wrote = Arc::new(Notify::new());
    let b_task = tokio::spawn(b_takes_over(
        client_b.clone(),
        resource.clone(),
        timeline.clone(),
        b_wrote.clone(),
        expiry_seen.clone(),
    ));

    // A wakes up after its pause (and, so the story is the same on a slow machine, not before
    // B wrote), and writes what it prepared before the pause, with its old sequencer.
    tokio::time::sleep_until(a_wakes_at).await;
    tokio::time::timeout(STEP_TIMEOUT, b_wrote.notified())
        .await
        .map_err(|_| anyhow!("client B was not granted the lock and did not write in time"))?;
    let (session_b, guard_b, b_write) = b_task.await??;
    let a_stale_write = a_wakes_and_writes(&a, &resource, &timeline).await?;
    let final_report = resource.read().await?;
    timeline.log(
        resource.actor(),
        format!("the report is now: {}", show(&final_report)),
    );

    let token_a = a.grant.token;
    let token_b = guard_b.token();
    let (outcome, verdict) = judge(token_a, token_b, &b_write, &a_stale_write, &final_report);

    let _ = guard_b.release().await;
    let _ = session_b.close().await;
    watcher.abort();
    Ok(DemoRun {
        fenced,
        resource: resource_name,
        token_a,
        token_b,
        b_write,
        a_stale_write,
        final_report,
        outcome,
        verdict,
        timeline: timeline.events(),
    })
}

/// The lock service's own view of the lock, from a watch: logs when A's lease runs out, and
/// tells `expiry_seen`.
async fn watch_expiry(
    client: &Client,
    ttl: Duration,
    timeline: &Arc<Timeline>,
    expiry_seen: &Arc<Notify>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut events = client.watch(DEMO_LOCK).await?;
    let timeline = timeline.clone();
    let expiry_seen = expiry_seen.clone();
    Ok(tokio::spawn(async move {
        while let Some(Ok(event)) = events.next().await {
            if event.kind == LockEventKind::Expired {
                timeline.log(
                    "lock service",
                    format!(
                        "A's lease ran out (no keepalive for {} ms): its grant, token {}, is over",
                        millis(ttl),
                        event.token.unwrap_or(Token::ZERO)
                    ),
                );
                expiry_seen.notify_one();
            }
        }
    }))
}

/// What A holds while it is paused: its grant, and the report as it read it before the pause.
struct PausedHolder {
    grant: Grant,
    read: Vec<String>,
}

/// A: a session that nothing keeps alive once A stops running — like a paused process. A takes
/// the lock, reads the report, and pauses.
async fn a_takes_the_lock_and_pauses(
    client: &Client,
    args: &DemoArgs,
    resource: &Resource,
    timeline: &Timeline,
) -> anyhow::Result<PausedHolder> {
    let lease = client.open_session_without_keepalive(args.ttl).await?;
    let grant = client
        .acquire(lease.credential, DEMO_LOCK, AcquireOptions::wait(Wait::Try))
        .await?;
    timeline.log(
        "A",
        format!(
            "is granted {DEMO_LOCK}: token {} (lease {} ms)",
            grant.token,
            lease.ttl.as_millis()
        ),
    );
    let read = resource.read().await?;
    timeline.log("A", format!("read the report: {}", show(&read)));
    timeline.log(
        "A",
        format!(
            "PAUSED (stop-the-world GC): no keepalives, no progress for {} ms",
            args.pause.as_millis()
        ),
    );
    Ok(PausedHolder { grant, read })
}

/// B waits in line for the lock, is granted it once A's lease ran out, and adds its line to the
/// report; tells `b_wrote` when its write is done.
async fn b_takes_over(
    client: Client,
    resource: Arc<Resource>,
    timeline: Arc<Timeline>,
    b_wrote: Arc<Notify>,
    expiry_seen: Arc<Notify>,
) -> anyhow::Result<(Session, LockGuard, WriteOutcome)> {
    let session = client
        .open_session(SessionOptions::with_ttl(Duration::from_secs(10)))
        .await?;
    timeline.log("B", format!("asks for {DEMO_LOCK} and waits in line"));
    let guard = session
        .acquire(DEMO_LOCK, AcquireOptions::wait(Wait::For(STEP_TIMEOUT)))
        .await?;
    // Let the service's account of the expiry (from the watch) come first in the
    // timeline: it happened first.
    let _ = tokio::time::timeout(Duration::from_millis(200), expiry_seen.notified()).await;
    timeline.log(
        "B",
        format!(
            "is granted {DEMO_LOCK}: token {} (higher than A's)",
            guard.token()
        ),
    );
    let mut lines = resource.read().await?;
    timeline.log("B", format!("read the report: {}", show(&lines)));
    lines.push(format!("B's update (token {})", guard.token()));
    let outcome = resource.write(&lines, guard.sequencer()).await?;
    timeline.log(
        "B",
        format!(
            "writes the report, presenting token {}: {}",
            guard.token(),
            show_outcome(&outcome)
        ),
    );
    b_wrote.notify_one();
    Ok((session, guard, outcome))
}

/// A, awake and still believing it holds the lock, writes the report it prepared before the
/// pause with its old sequencer.
async fn a_wakes_and_writes(
    a: &PausedHolder,
    resource: &Resource,
    timeline: &Timeline,
) -> anyhow::Result<WriteOutcome> {
    timeline.log(
        "A",
        format!(
            "wakes up, still believing it holds {DEMO_LOCK} with token {}",
            a.grant.token
        ),
    );
    let mut lines = a.read.clone();
    lines.push(format!("A's update (token {})", a.grant.token));
    let outcome = resource.write(&lines, &a.grant.sequencer).await?;
    timeline.log(
        "A",
        format!(
            "writes the report it prepared before the pause, presenting token {}: {}",
            a.grant.token,
            show_outcome(&outcome)
        ),
    );
    Ok(outcome)
}

/// How the run ended, and the verdict line that says so.
fn judge(
    token_a: Token,
    token_b: Token,
    b_write: &WriteOutcome,
    a_stale_write: &WriteOutcome,
    final_report: &[String],
) -> (Outcome, String) {
    let b_line = format!("B's update (token {token_b})");
    let b_survived = final_report.contains(&b_line);
    match (a_stale_write, b_survived) {
        (WriteOutcome::Accepted, false) if *b_write == WriteOutcome::Accepted => (
            Outcome::LostUpdate,
            format!(
                "LOST UPDATE: A's stale write (token {token_a}) replaced B's (token {token_b}); \
                 B's update is gone and nobody was told"
            ),
        ),
        (
            WriteOutcome::Refused {
                accepted_token: Some(accepted),
                ..
            },
            true,
        ) if *accepted == token_b => (
            Outcome::StaleWriteRefused,
            format!(
                "SAFE: the store refused A's stale token {token_a} (it had accepted token \
                 {accepted}); B's update survived"
            ),
        ),
        _ => (
            Outcome::Unexpected,
            format!(
                "unexpected: A's write {}, B's update {}",
                show_outcome(a_stale_write),
                if b_survived { "survived" } else { "is missing" }
            ),
        ),
    }
}
