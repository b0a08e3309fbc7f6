//! The `palisade store` subcommands: `serve`, `put`, `get`, `delete`, `fence`.
//!
//! Exit statuses (stable, for scripts):
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | the store is unreachable or failed (nothing was applied), or `serve` failed |
//! | 2 | bad command line (clap) |
//! | [`EXIT_STALE`] = 3 | the sequencer is stale: a newer holder of the lock has written |
//! | [`EXIT_REFUSED`] = 4 | the sequencer was refused: missing, malformed, forged, or for another lock |
//! | [`EXIT_NOT_FOUND`] = 5 | `get`: the key has no value |
//! | [`EXIT_INVALID`] = 6 | the request is invalid: key or value too large, bad key, reused request id |
//! | [`EXIT_OUTCOME_UNKNOWN`] = 7 | a write was sent but no answer came, even after retries |

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use palisade_sequencer::PublicKey;

use crate::types::{OpKind, WriteAck};
use crate::{Store, StoreClient, StoreError, StoreServer};

/// The store URL clients use when neither `--store` nor `PALISADE_STORE` is given.
pub const DEFAULT_STORE_URL: &str = "http://127.0.0.1:7458";
/// The address `serve` listens on by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7458";

/// The store is unreachable or failed; nothing was applied.
pub const EXIT_FAILURE: u8 = 1;
/// The sequencer is stale: a newer holder of the lock has written.
pub const EXIT_STALE: u8 = 3;
/// The sequencer was refused: missing, malformed, forged, or of another lock.
pub const EXIT_REFUSED: u8 = 4;
/// `get`: the key has no value.
pub const EXIT_NOT_FOUND: u8 = 5;
/// The request is invalid (too large, bad key, reused request id).
pub const EXIT_INVALID: u8 = 6;
/// A write was sent but its outcome is unknown.
pub const EXIT_OUTCOME_UNKNOWN: u8 = 7;

/// Attempts of one write when the store is unreachable or does not answer; every attempt
/// carries the same request id, so a write is applied at most once.
pub const WRITE_ATTEMPTS_MAX: u32 = 3;
/// Pause before the second attempt; doubled for each further attempt.
pub const WRITE_RETRY_BACKOFF_MS: u64 = 200;

/// `palisade store …`
#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// Run the fenced store: a durable key/value server that accepts a write only from the
    /// current holder of the key's lock
    Serve(ServeArgs),
    /// Set KEY to VALUE, fenced by the lock holder's sequencer
    Put(PutArgs),
    /// Print the value of KEY (reads need no sequencer)
    Get(GetArgs),
    /// Delete KEY, fenced by the lock holder's sequencer
    Delete(DeleteArgs),
    /// Show the highest token of LOCK the store has accepted
    Fence(FenceArgs),
}

/// `palisade store serve`
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Directory of the store's database file
    #[arg(long, env = "PALISADE_STORE_DATA_DIR", default_value = "./store-data")]
    pub data_dir: PathBuf,
    /// Address to listen on
    #[arg(long, env = "PALISADE_STORE_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// The lock service's public key (`palisade pubkey`), to verify sequencers offline
    #[arg(long, env = "PALISADE_PUBLIC_KEY", value_parser = PublicKey::parse)]
    pub public_key: PublicKey,
}

/// Where the store is.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreAddress {
    /// URL of the store server
    #[arg(long = "store", env = "PALISADE_STORE", default_value = DEFAULT_STORE_URL)]
    pub store: String,
}

/// What a fenced write presents.
#[derive(Debug, Clone, clap::Args)]
pub struct WriteArgs {
    /// The lock holder's sequencer (set by `palisade lock NAME -- …`)
    #[arg(long, env = "PALISADE_SEQUENCER", hide_env_values = true)]
    pub sequencer: Option<String>,
    /// Request id for retries: a repeated write with the same sequencer and request id is
    /// applied once (default: a fresh id, reused by this command's own retries)
    #[arg(long)]
    pub request_id: Option<String>,
    /// Print the store's answer as JSON
    #[arg(long)]
    pub json: bool,
}

/// `palisade store put`
#[derive(Debug, clap::Args)]
pub struct PutArgs {
    pub key: String,
    #[arg(allow_hyphen_values = true)]
    pub value: String,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// `palisade store get`
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    pub key: String,
    /// Print the value with its lock, token and session as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// `palisade store delete`
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    pub key: String,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// `palisade store fence`
#[derive(Debug, clap::Args)]
pub struct FenceArgs {
    pub lock: String,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// Runs one `palisade store` subcommand and returns the process exit code.
pub async fn run(command: StoreCommand) -> anyhow::Result<ExitCode> {
    match command {
        StoreCommand::Serve(args) => {
            serve(args, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        command => {
            let status = execute(command, &mut io::stdout(), &mut io::stderr()).await;
            Ok(ExitCode::from(status))
        }
    }
}

/// Runs the store server until `shutdown` completes. Prints the address it listens on (useful
/// with port 0) as `palisade store: listening on http://ADDR` on standard output.
pub async fn serve(
    args: ServeArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let data_dir = args.data_dir.clone();
    let public_key = args.public_key;
    let store = tokio::task::spawn_blocking(move || Store::open(&data_dir, public_key))
        .await
        .context("opening the store panicked")?
        .with_context(|| format!("cannot open the store in {}", args.data_dir.display()))?;
    let server = StoreServer::bind(Arc::new(store), args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = server.local_addr()?;
    println!("palisade store: listening on http://{addr}");
    tracing::info!(
        %addr,
        data_dir = %args.data_dir.display(),
        public_key = %public_key,
        "fenced store serving"
    );
    server
        .run_until(shutdown)
        .await
        .context("store server failed")?;
    tracing::info!("fenced store stopped");
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// Runs a client subcommand (`put`, `get`, `delete`, `fence`), writing its output to `stdout`
/// and `stderr`, and returns the exit status. `serve` is refused here: use [`run`] or
/// [`serve`].
pub async fn execute(
    command: StoreCommand,
    stdout: &mut impl Write,
    stderr: &mut impl Write,
) -> u8 {
    let (json, outcome) = match command {
        StoreCommand::Serve(_) => {
            let _ = writeln!(stderr, "palisade: `store serve` runs through cli::run");
            return EXIT_FAILURE;
        }
        StoreCommand::Put(args) => {
            let value = args.value.into_bytes();
            let outcome =
                write_with_retries(&args.address, &args.write, |client, sequencer, id| {
                    let (key, value) = (args.key.clone(), value.clone());
                    async move { client.put(&key, &value, Some(&sequencer), Some(&id)).await }
                })
                .await
                .map(|ack| write_output(&ack, args.write.json));
            (args.write.json, outcome)
        }
        StoreCommand::Delete(args) => {
            let outcome =
                write_with_retries(&args.address, &args.write, |client, sequencer, id| {
                    let key = args.key.clone();
                    async move { client.delete(&key, Some(&sequencer), Some(&id)).await }
                })
                .await
                .map(|ack| write_output(&ack, args.write.json));
            (args.write.json, outcome)
        }
        StoreCommand::Get(args) => {
            let outcome = match StoreClient::new(&args.address.store) {
                Ok(client) => match client.get(&args.key).await {
                    Ok(Some(entry)) if args.json => Ok(json_line(&entry)),
                    Ok(Some(entry)) => {
                        let mut output = entry.value;
                        output.push(b'\n');
                        Ok(output)
                    }
                    Ok(None) => Err(StoreError::NotFound { key: args.key }),
                    Err(error) => Err(error),
                },
                Err(error) => Err(error),
            };
            (args.json, outcome)
        }
        StoreCommand::Fence(args) => {
            let outcome = match StoreClient::new(&args.address.store) {
                Ok(client) => client.fence(&args.lock).await.map(|view| {
                    if args.json {
                        json_line(&view)
                    } else {
                        match (view.token_max, view.holder_session) {
                            (Some(token), Some(session)) => format!(
                                "lock {:?}: accepted token {token} (written by session {session})\n",
                                view.lock
                            ),
                            _ => format!("lock {:?}: no write accepted yet\n", view.lock),
                        }
                        .into_bytes()
                    }
                }),
                Err(error) => Err(error),
            };
            (args.json, outcome)
        }
    };
    match outcome {
        Ok(output) => {
            let _ = stdout.write_all(&output);
            let _ = stdout.flush();
            0
        }
        Err(error) => {
            if json {
                let _ = stdout.write_all(&json_line(&error.to_json()));
            }
            let (status, prefix) = exit_status(&error);
            let _ = writeln!(stderr, "palisade: {prefix}{error}");
            status
        }
    }
}

/// The exit status of a failed command, and how its message starts.
pub fn exit_status(error: &StoreError) -> (u8, &'static str) {
    match error {
        StoreError::Stale { .. } => (EXIT_STALE, "refused: "),
        error if error.is_rejection() => (EXIT_REFUSED, "refused: "),
        StoreError::NotFound { .. } => (EXIT_NOT_FOUND, ""),
        StoreError::TooLarge { .. }
        | StoreError::InvalidKey { .. }
        | StoreError::InvalidRequest { .. }
        | StoreError::RequestIdReused { .. } => (EXIT_INVALID, ""),
        StoreError::OutcomeUnknown { .. } => (EXIT_OUTCOME_UNKNOWN, ""),
        _ => (EXIT_FAILURE, ""),
    }
}

/// Runs one write, retrying (with the same request id) while the store is unreachable, fails
/// retryably, or does not answer.
async fn write_with_retries<F, Fut>(
    address: &StoreAddress,
    args: &WriteArgs,
    mut attempt: F,
) -> Result<WriteAck, StoreError>
where
    F: FnMut(StoreClient, String, String) -> Fut,
    Fut: Future<Output = Result<WriteAck, StoreError>>,
{
    // Refuse locally: no point asking the store to say the same.
    let sequencer = match args.sequencer.as_deref().map(str::trim) {
        None | Some("") => return Err(StoreError::Missing),
        Some(sequencer) => sequencer.to_owned(),
    };
    let client = StoreClient::new(&address.store)?;
    let request_id = args.request_id.clone().unwrap_or_else(fresh_request_id);
    let mut backoff = Duration::from_millis(WRITE_RETRY_BACKOFF_MS);
    let mut unknown = false;
    for attempt_number in 1..=WRITE_ATTEMPTS_MAX {
        match attempt(client.clone(), sequencer.clone(), request_id.clone()).await {
            Err(error)
                if (error.is_retryable() || error.is_outcome_unknown())
                    && attempt_number < WRITE_ATTEMPTS_MAX =>
            {
                unknown |= error.is_outcome_unknown();
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            // An earlier attempt may have been applied: a final "unavailable" cannot rule it out.
            Err(StoreError::Unavailable { message }) if unknown => {
                return Err(StoreError::OutcomeUnknown { message });
            }
            result => return result,
        }
    }
    unreachable!("the last attempt always returns")
}

/// A request id unique enough for one sequencer: this process and the current time.
fn fresh_request_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!("cli-{}-{nanos:x}", std::process::id())
}

fn write_output(ack: &WriteAck, json: bool) -> Vec<u8> {
    if json {
        return json_line(ack);
    }
    let mut text = String::new();
    for op in &ack.ops {
        let verb = match (op.op, op.existed) {
            (OpKind::Put, _) => "stored",
            (OpKind::Delete, true) => "deleted",
            (OpKind::Delete, false) => "nothing to delete at",
        };
        text.push_str(&format!(
            "{verb} {:?} (lock {:?}, token {}){}\n",
            op.key,
            ack.lock,
            ack.token,
            if ack.replayed {
                ", already applied by an earlier attempt"
            } else {
                ""
            }
        ));
    }
    text.into_bytes()
}

fn json_line(value: &impl serde::Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    line
}
