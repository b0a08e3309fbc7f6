//! `palisade status`, `locks`, `watch`, `pubkey`: reading the lock service's state.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use palisade_client::{Election, Leader, LockEvent, LockEventKind, QueryError, Read};
use serde_json::{Value, json};
use tokio_stream::{Stream, StreamExt as _};

use crate::Global;
use crate::exit;
use crate::output::{locks_table, shell_quote, status_json, status_text};

/// Longest pause between attempts to resume an interrupted watch.
const WATCH_RETRY_DELAY_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct StatusArgs {
    /// Name of the lock.
    pub name: String,
    /// Print a JSON object.
    #[arg(long)]
    pub json: bool,
    /// Let any node answer from its own copy, without confirming with the leader: cheaper, but
    /// possibly behind.
    #[arg(long)]
    pub stale: bool,
}

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct LocksArgs {
    /// Only locks whose names start with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Print a JSON array.
    #[arg(long)]
    pub json: bool,
    /// Let any node answer from its own copy, without confirming with the leader: cheaper, but
    /// possibly behind.
    #[arg(long)]
    pub stale: bool,
}

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct WatchArgs {
    /// Name of the lock.
    pub name: String,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct LeaderArgs {
    /// Name of the election (its lock).
    pub name: String,
    /// Follow the leader: one line now, then one per change (a new leader, a new value, nobody
    /// leading), until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Print JSON objects, one per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct PubkeyArgs {
    /// Print a JSON object.
    #[arg(long)]
    pub json: bool,
}

fn read(stale: bool) -> Read {
    if stale {
        Read::Stale
    } else {
        Read::Linearizable
    }
}

pub async fn status(args: StatusArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let status = client.status_with(&args.name, read(args.stale)).await?;
    if args.json {
        println!("{}", status_json(&status));
    } else {
        print!("{}", status_text(&status));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn locks(args: LocksArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let locks = client
        .list_locks_with(&args.prefix, read(args.stale))
        .await?;
    if args.json {
        let array: Vec<Value> = locks.iter().map(status_json).collect();
        println!("{}", Value::Array(array));
    } else {
        print!("{}", locks_table(&locks));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn watch(args: WatchArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let name = args.name.as_str();
    follow(
        name,
        || client.watch(name),
        |event: LockEvent| print_line(&event_line(&event, args.json)),
    )
    .await
}

/// `palisade leader NAME`: who leads the election, once or (`--watch`) as it changes.
pub async fn leader(args: LeaderArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let election = Election::new(&client, args.name.as_str());
    let print = |leader: Option<Leader>| print_line(&leader_line(&args.name, &leader, args.json));
    if !args.watch {
        print(election.leader().await?)?;
        return Ok(ExitCode::SUCCESS);
    }
    follow(&args.name, || election.observe(), print).await
}

/// Prints each item of the stream `open` gives, until interrupted. The first stream must open;
/// after that, interruptions are ridden out (each new stream starts with the state as it is
/// then, so nothing is silently missed).
async fn follow<S, T, F>(
    name: &str,
    open: impl Fn() -> F,
    mut print: impl FnMut(T) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode>
where
    F: Future<Output = Result<S, QueryError>>,
    S: Stream<Item = Result<T, QueryError>> + Unpin,
{
    let mut items = open().await?;
    let mut delay = Duration::from_millis(100);
    loop {
        match items.next().await {
            Some(Ok(item)) => {
                print(item)?;
                delay = Duration::from_millis(100);
                continue;
            }
            Some(Err(error)) if !resumable(&error) => return Err(error.into()),
            Some(Err(error)) => {
                eprintln!("palisade: watch of lock {name:?} interrupted: {error}; resuming");
            }
            None => {
                eprintln!("palisade: the lock service ended the watch of lock {name:?}; resuming")
            }
        }
        loop {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(WATCH_RETRY_DELAY_MAX);
            match open().await {
                Ok(resumed) => {
                    items = resumed;
                    break;
                }
                Err(error) if resumable(&error) => {
                    tracing::debug!(%error, "watch not resumed yet");
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
}

/// True for failures that watching again may get past.
fn resumable(error: &QueryError) -> bool {
    match error {
        QueryError::Unavailable(_) => true,
        QueryError::Rejected { code, .. } => matches!(
            code,
            tonic::Code::DataLoss | tonic::Code::Internal | tonic::Code::Aborted
        ),
        _ => false,
    }
}

fn event_line(event: &LockEvent, as_json: bool) -> String {
    if as_json {
        event_json(event).to_string()
    } else {
        event_text(event)
    }
}

/// `leader elections/db session=12 epoch=42 value=10.0.0.1:5432`, or `none elections/db`; as
/// JSON, `{"election": …, "leader": null | {"session", "epoch", "value"}}`.
fn leader_line(name: &str, leader: &Option<Leader>, as_json: bool) -> String {
    if as_json {
        let leader = leader.as_ref().map(|l| {
            json!({
                "session": l.session,
                "epoch": l.epoch,
                "value": l.value,
            })
        });
        return json!({ "election": name, "leader": leader }).to_string();
    }
    match leader {
        None => format!("none {name}"),
        Some(l) => format!(
            "leader {name} session={} epoch={}{}",
            l.session,
            l.epoch,
            value_field(l.value.as_deref())
        ),
    }
}

/// ` value=…`, quoted for a shell where needed; nothing without a value.
fn value_field(value: Option<&str>) -> String {
    value.map_or(String::new(), |v| format!(" value={}", shell_quote(v)))
}

fn print_line(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

fn event_json(event: &LockEvent) -> Value {
    let kind = match event.kind {
        LockEventKind::Other(raw) => format!("other({raw})"),
        kind => kind.as_str().to_string(),
    };
    json!({
        "kind": kind,
        "lock": event.lock,
        "session": event.session,
        "token": event.token,
        "waiters": event.waiters,
        "value": event.value,
        "shared": event.access == palisade_client::Access::Shared,
        "slot": event.access.slot(),
    })
}

/// `granted jobs/a session=12 token=42 waiters=0`, or `snapshot jobs/a free waiters=0`, with
/// ` shared` or ` slot=K` for a reader or a permit, and ` value=…` after it when the holding
/// carries one.
fn event_text(event: &LockEvent) -> String {
    let access = match event.access {
        palisade_client::Access::Exclusive => String::new(),
        palisade_client::Access::Shared => " shared".to_string(),
        palisade_client::Access::Slot(slot) => format!(" slot={slot}"),
    };
    let holder = match (event.session, event.token) {
        (Some(session), Some(token)) => format!("session={session} token={token}{access}"),
        (Some(session), None) => format!("session={session}"),
        (None, _) => "free".to_string(),
    };
    let kind = match event.kind {
        LockEventKind::Other(raw) => format!("other({raw})"),
        kind => kind.as_str().to_string(),
    };
    format!(
        "{kind} {} {holder} waiters={}{}",
        event.lock,
        event.waiters,
        value_field(event.value.as_deref())
    )
}

/// Prints the keys resources must trust: one line, the keys joined by commas (one key unless a
/// rotation is under way), which `--public-key` of a resource takes as it is. Standard error
/// gets each key's id and fingerprint, to compare out of band before trusting the key: the key
/// travels without TLS, and a key planted on the way could sign any token.
pub async fn pubkey(args: PubkeyArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let signing = client.public_key().await?;
    let published = client.public_keys().await?;
    for key in published.keys() {
        let role = if key.to_string() == signing {
            " (signing)"
        } else {
            ""
        };
        eprintln!("key {} fingerprint {}{role}", key.id(), key.fingerprint());
    }
    if args.json {
        let keys: Vec<_> = published
            .keys()
            .iter()
            .map(|key| {
                json!({
                    "key_id": key.id().to_string(),
                    "fingerprint": key.fingerprint(),
                    "public_key": key.to_string(),
                    "signing": key.to_string() == signing,
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "public_key": signing, "public_keys": published.to_string(), "keys": keys })
        );
    } else {
        println!("{published}");
    }
    Ok(ExitCode::SUCCESS)
}
