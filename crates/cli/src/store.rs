//! The `palisade store` subcommands: `serve`, `put`, `get`, `delete`, `claim`, `txn`, `fence`.
//!
//! The command line, printing, retries and exit statuses of the fenced store; the store itself
//! (`palisade_store`) knows none of them.
//!
//! Exit statuses are those of the `palisade` binary as a whole (its README lists them), so a
//! script tells "unreachable" or "unknown" apart the same way for `acquire` and `store put`:
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done |
//! | [`EXIT_REFUSED`] = 1 | refused: the sequencer is missing, malformed, forged, of another lock or its token was issued twice, or the request is invalid |
//! | 2 | bad command line (clap) |
//! | [`EXIT_STALE`] = 3 | the sequencer is stale: a newer holder of the lock has claimed, read or written here |
//! | [`EXIT_NOT_FOUND`] = 5 | `get`: the key has no value |
//! | [`EXIT_COMPARE_FAILED`] = 8 | a compare (`--if-revision`, `--create-only`, `txn --if-…`) did not hold; nothing was applied |
//! | [`EXIT_UNAVAILABLE`] = 69 | the store is unreachable or failed; nothing was applied (also `serve` failing) |
//! | [`EXIT_INTERNAL`] = 70 | the store answered nonsense, or its data is corrupt |
//! | [`EXIT_OUTCOME_UNKNOWN`] = 77 | the request was sent but no answer came, even after retries |

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use palisade_client::{AttemptFailure, RetryPolicy, retry_until_known};
use palisade_sequencer::KeySet;

use palisade_store::server::ServeLimits;
use palisade_store::{
    BatchOp, BatchRequest, Bindings, ClaimAck, Compare, LockQuota, OpKind, Store, StoreClient,
    StoreClientError, StoreError, StoreErrorClass, StoreOptions, StoreServer, WriteAck,
};

/// The store URL clients use when neither `--store` nor `PALISADE_STORE` is given.
pub const DEFAULT_STORE_URL: &str = "http://127.0.0.1:7458";
/// The address `serve` listens on by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7458";

/// Refused: the sequencer is missing, malformed, forged, of another lock or its token was issued
/// twice (`token_reissued`), or the request is invalid (too large, bad key, reused request id).
/// The `palisade` binary's "refused".
pub const EXIT_REFUSED: u8 = 1;
/// The sequencer is stale: a newer holder of the lock has claimed, read or written here.
pub const EXIT_STALE: u8 = 3;
/// `get`: the key has no value.
pub const EXIT_NOT_FOUND: u8 = 5;
/// A compare did not hold; nothing was applied.
pub const EXIT_COMPARE_FAILED: u8 = 8;
/// The store is unreachable or failed; nothing was applied. The `palisade` binary's
/// "unavailable".
pub const EXIT_UNAVAILABLE: u8 = 69;
/// The store answered something this client does not understand, or its data is corrupt.
pub const EXIT_INTERNAL: u8 = 70;
/// The request was sent but its outcome is unknown. The `palisade` binary's "unknown".
pub const EXIT_OUTCOME_UNKNOWN: u8 = 77;

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
    /// Print the value of KEY; under a lock ($PALISADE_SEQUENCER set) the read is fenced
    Get(GetArgs),
    /// Delete KEY, fenced by the lock holder's sequencer
    Delete(DeleteArgs),
    /// Announce the lock holder's grant to the store before reading anything: older grants of
    /// LOCK are refused from now on
    Claim(ClaimArgs),
    /// Compares and operations applied all or nothing under one sequencer check:
    /// `txn --if-revision counter=7 put counter 8 get other`
    Txn(TxnArgs),
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
    /// The lock service's public keys (what `palisade pubkey` prints: one key, or several
    /// separated by commas), to verify sequencers offline
    #[arg(
        long,
        env = "PALISADE_PUBLIC_KEY",
        value_parser = KeySet::parse,
        required_unless_present = "public_key_file",
        conflicts_with = "public_key_file"
    )]
    pub public_key: Option<KeySet>,
    /// A file holding the lock service's public keys (one per line, `#` comments), read at
    /// start and again on SIGHUP: how the store takes the new set during a key rotation without
    /// a restart. A file that does not parse on SIGHUP is reported and the keys stay as they were
    #[arg(long, env = "PALISADE_PUBLIC_KEY_FILE")]
    pub public_key_file: Option<PathBuf>,
    /// Give every key starting with PREFIX to LOCK alone (`--bind 'reports/=jobs/nightly'`;
    /// repeatable; the longest matching prefix wins; an empty prefix covers every other key).
    /// With any binding, a key no binding covers is refused to every sequencer. Without, a key
    /// is bound to the lock of its first fenced write, for ever
    #[arg(
        long = "bind",
        value_name = "PREFIX=LOCK",
        conflicts_with = "bindings_file"
    )]
    pub bind: Vec<String>,
    /// A file of bindings, one `PREFIX=LOCK` per line (`#` comment lines), as `--bind`
    #[arg(long, env = "PALISADE_STORE_BINDINGS_FILE", value_name = "FILE")]
    pub bindings_file: Option<PathBuf>,
    /// Most live keys one lock may hold in the store: a write that would take a lock past it is
    /// refused (`quota_reached`, HTTP 507), a delete never is. Default: no limit
    #[arg(
        long,
        env = "PALISADE_STORE_LOCK_KEYS_MAX",
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub lock_keys_max: Option<u64>,
    /// Most bytes one lock's keys may hold in the store: the names of its keys (a deleted key's
    /// name stays, with its binding) and the values of its live keys. Default: no limit
    #[arg(
        long,
        env = "PALISADE_STORE_LOCK_BYTES_MAX",
        value_name = "BYTES",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub lock_bytes_max: Option<u64>,
    /// Most connections served at once; further clients wait in the accept backlog
    #[arg(long, default_value_t = palisade_store::limits::CONNECTIONS_MAX)]
    pub connections_max: usize,
    /// A host name the store answers to besides localhost and IP addresses (repeatable; commas
    /// in the variable): the name clients reach it by through DNS. Requests naming any other
    /// host get 421, which keeps a web page from reading the store through a name it rebinds
    /// to this address
    #[arg(long = "store-host", env = "PALISADE_STORE_HOST", value_delimiter = ',', value_parser = palisade_tls::host::parse_host_name)]
    pub store_hosts: Vec<String>,
    /// Address of a Prometheus `/metrics` endpoint (off when not set): what the store's fence
    /// accepted and refused, per lock (`palisade_store_fence_accepted_total`,
    /// `palisade_store_fence_refused_total` by kind)
    #[arg(long, env = "PALISADE_STORE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Mutual TLS: refuse clients without a certificate chaining to this CA (PEM). TLS itself
    /// is on with the global --tls-cert and --tls-key (the store's certificate)
    #[arg(long = "tls-client-ca", env = "PALISADE_STORE_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// The store's certificate chain (PEM), from the global --tls-cert
    #[arg(skip)]
    pub tls_cert: Option<PathBuf>,
    /// Its key (PEM), from the global --tls-key
    #[arg(skip)]
    pub tls_key: Option<PathBuf>,
}

impl ServeArgs {
    /// The store's TLS configuration, `None` for plaintext; bad files stop the store at start.
    fn tls(&self) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        let (cert, key) = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => (cert, key),
            (None, None) if self.tls_client_ca.is_none() => return Ok(None),
            (None, None) => anyhow::bail!(
                "--tls-client-ca needs --tls-cert and --tls-key (the store's certificate)"
            ),
            (Some(_), None) => anyhow::bail!("--tls-cert needs --tls-key"),
            (None, Some(_)) => anyhow::bail!("--tls-key needs --tls-cert"),
        };
        let identity = palisade_tls::Identity::from_files(cert, key)?;
        let verifier = match &self.tls_client_ca {
            Some(ca) => Some(palisade_tls::Roots::from_file(ca)?.client_verifier(false)?),
            None => None,
        };
        Ok(Some(palisade_tls::server_config(
            &identity,
            verifier,
            palisade_tls::ALPN_HTTP1,
        )?))
    }

    /// The configured bindings, or `None` for first-writer binding.
    fn bindings(&self) -> anyhow::Result<Option<Bindings>> {
        if let Some(path) = &self.bindings_file {
            use std::io::Read as _;
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|file| file.take(BINDINGS_FILE_BYTES_MAX).read_to_string(&mut text))
                .with_context(|| format!("cannot read the bindings file {}", path.display()))?;
            if text.len() as u64 == BINDINGS_FILE_BYTES_MAX {
                anyhow::bail!(
                    "the bindings file {} is larger than {BINDINGS_FILE_BYTES_MAX} bytes",
                    path.display()
                );
            }
            let bindings = Bindings::parse(&text).map_err(|error| {
                anyhow::anyhow!(
                    "the bindings file {} is not usable: {error}",
                    path.display()
                )
            })?;
            return Ok(Some(bindings));
        }
        if self.bind.is_empty() {
            return Ok(None);
        }
        let bindings = Bindings::from_rules(self.bind.iter().map(String::as_str))
            .map_err(|error| anyhow::anyhow!("bad --bind: {error}"))?;
        Ok(Some(bindings))
    }
}

/// Largest bindings file read.
const BINDINGS_FILE_BYTES_MAX: u64 = 4 << 20;

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
    /// The lock holder's sequencer (set by `palisade lock NAME -- …`). Prefer the
    /// environment variable or --sequencer-file: a flag's value is visible to every user in
    /// `ps`, and a sequencer is a write capability until the next grant
    #[arg(long, env = "PALISADE_SEQUENCER", hide_env_values = true)]
    pub sequencer: Option<String>,
    /// Read the sequencer from this file (`-`: standard input) instead
    #[arg(long, value_name = "FILE")]
    pub sequencer_file: Option<PathBuf>,
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
    /// Write only if KEY is at this revision, as `get --json` shows it (0: only if it has no
    /// value)
    #[arg(long, value_name = "REVISION", conflicts_with = "create_only")]
    pub if_revision: Option<u64>,
    /// Write only if KEY has no value
    #[arg(long)]
    pub create_only: bool,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// `palisade store get`
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    pub key: String,
    /// The lock holder's sequencer: the read is fenced, refused if stale, and advances the
    /// lock's accepted token so no older grant can write after it (set by `palisade lock`)
    #[arg(long, env = "PALISADE_SEQUENCER", hide_env_values = true)]
    pub sequencer: Option<String>,
    /// Read the sequencer from this file (`-`: standard input) instead of the environment or
    /// --sequencer (which `ps` shows)
    #[arg(long, value_name = "FILE")]
    pub sequencer_file: Option<PathBuf>,
    /// Only look: present no sequencer even if $PALISADE_SEQUENCER is set
    #[arg(long)]
    pub unfenced: bool,
    /// Print the value with its lock, token, session and revision as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// `palisade store delete`
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    pub key: String,
    /// Delete only if KEY is at this revision
    #[arg(long, value_name = "REVISION")]
    pub if_revision: Option<u64>,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// `palisade store claim`
#[derive(Debug, clap::Args)]
pub struct ClaimArgs {
    /// The lock whose grant is announced; the sequencer must be of this lock
    pub lock: String,
    /// The lock holder's sequencer (set by `palisade lock NAME -- …`)
    #[arg(long, env = "PALISADE_SEQUENCER", hide_env_values = true)]
    pub sequencer: Option<String>,
    /// Read the sequencer from this file (`-`: standard input) instead of the environment or
    /// --sequencer (which `ps` shows)
    #[arg(long, value_name = "FILE")]
    pub sequencer_file: Option<PathBuf>,
    /// Print the store's answer as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub address: StoreAddress,
}

/// `palisade store txn`
#[derive(Debug, clap::Args)]
pub struct TxnArgs {
    /// Operations, applied in order: `put KEY VALUE`, `delete KEY`, `get KEY`
    #[arg(value_name = "OP", allow_hyphen_values = true)]
    pub ops: Vec<String>,
    /// Compare: KEY is at REVISION (0: KEY has no value)
    #[arg(long, value_name = "KEY=REVISION")]
    pub if_revision: Vec<String>,
    /// Compare: KEY has exactly VALUE
    #[arg(long, value_name = "KEY=VALUE")]
    pub if_value: Vec<String>,
    /// Compare: KEY has no value
    #[arg(long, value_name = "KEY")]
    pub if_absent: Vec<String>,
    /// Compare: KEY has a value
    #[arg(long, value_name = "KEY")]
    pub if_exists: Vec<String>,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub address: StoreAddress,
}

impl TxnArgs {
    /// The transaction the arguments describe.
    pub fn request(&self) -> Result<BatchRequest, StoreClientError> {
        let invalid = |message: String| StoreClientError::InvalidRequest { message };
        let split = |text: &str, what: &str| {
            text.split_once('=')
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .ok_or_else(|| invalid(format!("{what} {text:?} is not KEY=…")))
        };
        let mut compare = Vec::new();
        for text in &self.if_revision {
            let (key, revision) = split(text, "--if-revision")?;
            let revision = revision.parse().map_err(|_| {
                invalid(format!(
                    "--if-revision {text:?}: {revision:?} is not a revision"
                ))
            })?;
            compare.push(Compare::Revision { key, revision });
        }
        for text in &self.if_value {
            let (key, value) = split(text, "--if-value")?;
            compare.push(Compare::Value {
                key,
                value: value.into_bytes(),
            });
        }
        for (keys, exists) in [(&self.if_absent, false), (&self.if_exists, true)] {
            for key in keys {
                compare.push(Compare::Exists {
                    key: key.clone(),
                    exists,
                });
            }
        }
        let mut ops = Vec::new();
        let mut words = self.ops.iter();
        while let Some(verb) = words.next() {
            let mut next = |what: &str| {
                words
                    .next()
                    .cloned()
                    .ok_or_else(|| invalid(format!("`{verb}` needs {what}")))
            };
            ops.push(match verb.as_str() {
                "put" => BatchOp::Put {
                    key: next("KEY VALUE")?,
                    value: next("a VALUE after its KEY")?.into_bytes(),
                },
                "delete" => BatchOp::Delete { key: next("KEY")? },
                "get" => BatchOp::Get { key: next("KEY")? },
                other => {
                    return Err(invalid(format!(
                        "unknown operation {other:?}: use put KEY VALUE, delete KEY or get KEY"
                    )));
                }
            });
        }
        Ok(BatchRequest { compare, ops })
    }
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
/// The client TLS settings of `palisade store` commands (the global `--tls-ca`, `--tls-cert`,
/// `--tls-key`), set once by the binary before it runs a command.
static CLIENT_TLS: std::sync::OnceLock<Option<palisade_tls::ClientTls>> =
    std::sync::OnceLock::new();

/// Sets the TLS settings every store client of this process uses (once; later calls are
/// ignored).
pub fn set_client_tls(tls: Option<palisade_tls::ClientTls>) {
    let _ = CLIENT_TLS.set(tls);
}

/// A client of the store at `url`, with the process's TLS settings.
pub fn store_client(url: &str) -> Result<StoreClient, StoreClientError> {
    StoreClient::with_tls(url, CLIENT_TLS.get().and_then(Option::as_ref))
}

/// Runs a `palisade store` command; `tls_cert` and `tls_key` are the global flags, the
/// store's certificate for `serve`.
pub async fn run(
    command: StoreCommand,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    match command {
        StoreCommand::Serve(mut args) => {
            args.tls_cert = tls_cert;
            args.tls_key = tls_key;
            serve(args, palisade_server::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        command => {
            let status = execute(command, &mut io::stdout(), &mut io::stderr()).await;
            Ok(ExitCode::from(status))
        }
    }
}

/// Reads and parses a key file of `--public-key-file`, refusing one larger than any key set.
fn read_key_file(path: &std::path::Path) -> anyhow::Result<KeySet> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| {
            file.take(palisade_sequencer::KEY_SET_TEXT_BYTES_MAX as u64 + 1)
                .read_to_string(&mut text)
        })
        .with_context(|| format!("cannot read the public key file {}", path.display()))?;
    KeySet::parse(&text)
        .with_context(|| format!("the public key file {} is not usable", path.display()))
}

/// On each SIGHUP, re-reads the key file and trusts its keys from then on; keeps the keys it
/// had if the file cannot be read or parsed.
fn reload_keys_on_hangup(store: Arc<Store>, path: PathBuf) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match read_key_file(&path) {
                Ok(keys) => {
                    tracing::info!(public_key = %keys, path = %path.display(), "public keys reloaded");
                    store.set_public_keys(keys);
                }
                Err(error) => tracing::error!(
                    error = %palisade_core::error_chain::error_chain(error.as_ref()),
                    "public keys not reloaded; the store keeps trusting the keys it had"
                ),
            }
        }
    });
    Ok(())
}

/// Runs the store server until `shutdown` completes. Prints the address it listens on (useful
/// with port 0) as `palisade store: listening on http://ADDR` on standard output.
pub async fn serve(
    args: ServeArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let data_dir = args.data_dir.clone();
    let public_keys = match (&args.public_key, &args.public_key_file) {
        (Some(keys), _) => keys.clone(),
        (None, Some(path)) => read_key_file(path)?,
        (None, None) => unreachable!("clap requires --public-key or --public-key-file"),
    };
    let bindings = args.bindings()?;
    match &bindings {
        Some(bindings) => {
            for (prefix, lock) in bindings.rules() {
                tracing::info!(prefix, lock, "key binding");
            }
        }
        None => tracing::warn!(
            "no key bindings configured: each key is bound to the lock of its first fenced write, so any lock holder can take a key first (--bind PREFIX=LOCK or --bindings-file)"
        ),
    }
    let quota = LockQuota {
        keys_max: args.lock_keys_max,
        bytes_max: args.lock_bytes_max,
    };
    if quota.is_limited() {
        tracing::info!(keys_max = ?quota.keys_max, bytes_max = ?quota.bytes_max, "per-lock quotas");
    } else {
        tracing::warn!(
            "no per-lock quotas: the holder of any lock can fill the disk with the keys it may write (--lock-keys-max, --lock-bytes-max)"
        );
    }
    if let Some(listen) = args.metrics_listen {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(listen)
            .install()
            .with_context(|| format!("cannot serve metrics on {listen}"))?;
        palisade_store::describe_metrics();
        tracing::info!(%listen, "serving /metrics");
    }
    let options = StoreOptions { bindings, quota };
    let store =
        tokio::task::spawn_blocking(move || Store::open_with(&data_dir, public_keys, options))
            .await
            .context("opening the store panicked")?
            .with_context(|| format!("cannot open the store in {}", args.data_dir.display()))?;
    let store = Arc::new(store);
    if let Some(path) = args.public_key_file.clone() {
        reload_keys_on_hangup(store.clone(), path)?;
    }
    let tls = args.tls()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut server = StoreServer::bind(store.clone(), args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?
        .with_limits(ServeLimits {
            connections_max: args.connections_max,
            ..ServeLimits::default()
        })
        .with_allowed_hosts(
            palisade_tls::host::AllowedHosts::new(&args.store_hosts)
                .map_err(|e| anyhow::anyhow!("--store-host: {e}"))?,
        );
    if let Some(tls) = tls {
        server = server.with_tls(tls);
    }
    let addr = server.local_addr()?;
    println!("palisade store: listening on {scheme}://{addr}");
    tracing::info!(
        %addr,
        data_dir = %args.data_dir.display(),
        public_key = %store.public_keys(),
        "fenced store serving"
    );
    server
        .run_until(shutdown)
        .await
        .context("store server failed")?;
    tracing::info!("fenced store stopped");
    Ok(())
}

/// Runs a client subcommand (`put`, `get`, `delete`, `fence`), writing its output to `stdout`
/// and `stderr`, and returns the exit status. `serve` is refused here: use [`run`] or
/// [`serve`].
pub async fn execute(
    command: StoreCommand,
    stdout: &mut impl Write,
    stderr: &mut impl Write,
) -> u8 {
    let mut command = command;
    if let Err(error) = read_sequencer_file(&mut command) {
        let (status, prefix) = exit_status(&error);
        let _ = writeln!(stderr, "palisade: {prefix}{error}");
        return status;
    }
    let (json, outcome) = match command {
        StoreCommand::Serve(_) => {
            let _ = writeln!(stderr, "palisade: `store serve` runs through store::run");
            return EXIT_UNAVAILABLE;
        }
        StoreCommand::Put(args) => {
            let condition = match (args.if_revision, args.create_only) {
                (Some(revision), _) => Some(Compare::Revision {
                    key: args.key.clone(),
                    revision,
                }),
                (None, true) => Some(Compare::Exists {
                    key: args.key.clone(),
                    exists: false,
                }),
                (None, false) => None,
            };
            let request = BatchRequest {
                compare: condition.into_iter().collect(),
                ops: vec![BatchOp::Put {
                    key: args.key.clone(),
                    value: args.value.into_bytes(),
                }],
            };
            (
                args.write.json,
                txn_command(&args.address, &args.write, request).await,
            )
        }
        StoreCommand::Delete(args) => {
            let request = BatchRequest {
                compare: args
                    .if_revision
                    .map(|revision| Compare::Revision {
                        key: args.key.clone(),
                        revision,
                    })
                    .into_iter()
                    .collect(),
                ops: vec![BatchOp::Delete {
                    key: args.key.clone(),
                }],
            };
            (
                args.write.json,
                txn_command(&args.address, &args.write, request).await,
            )
        }
        StoreCommand::Txn(args) => {
            let outcome = match args.request() {
                Ok(request) => txn_command(&args.address, &args.write, request).await,
                Err(error) => Err(error),
            };
            (args.write.json, outcome)
        }
        StoreCommand::Get(args) => {
            let sequencer = match args.sequencer.as_deref().map(str::trim) {
                _ if args.unfenced => None,
                None | Some("") => None,
                Some(sequencer) => Some(sequencer.to_owned()),
            };
            let outcome = with_retries(&args.address, |client| {
                let (key, sequencer) = (args.key.clone(), sequencer.clone());
                // A fenced read may be repeated: advancing to the same token again is a no-op.
                async move { client.read(&key, sequencer.as_deref()).await }
            })
            .await
            .and_then(|entry| match entry {
                Some(entry) if args.json => Ok(json_line(&entry)),
                Some(entry) => {
                    let mut output = entry.value;
                    output.push(b'\n');
                    Ok(output)
                }
                None => Err(StoreClientError::Store(StoreError::NotFound {
                    key: args.key.clone(),
                })),
            });
            (args.json, outcome)
        }
        StoreCommand::Claim(args) => {
            let outcome = match presented(args.sequencer.as_deref()) {
                Ok(sequencer) => with_retries(&args.address, |client| {
                    let (lock, sequencer) = (args.lock.clone(), sequencer.clone());
                    // Claiming again with the same token changes nothing.
                    async move { client.claim(Some(&lock), Some(&sequencer)).await }
                })
                .await
                .map(|ack| claim_output(&ack, args.json)),
                Err(error) => Err(error),
            };
            (args.json, outcome)
        }
        StoreCommand::Fence(args) => {
            let outcome = match store_client(&args.address.store) {
                Ok(client) => client.fence(&args.lock).await.map(|view| {
                    if args.json {
                        json_line(&view)
                    } else {
                        match (view.token_max, view.holder_session) {
                            (Some(token), Some(session)) => format!(
                                "lock {:?}: accepted token {token} (presented by session {session})\n",
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

/// Replaces the command's sequencer with the contents of its `--sequencer-file`, if given
/// (that file wins over `--sequencer` and `$PALISADE_SEQUENCER`).
fn read_sequencer_file(command: &mut StoreCommand) -> Result<(), StoreClientError> {
    let (sequencer, file) = match command {
        StoreCommand::Put(args) => (&mut args.write.sequencer, &args.write.sequencer_file),
        StoreCommand::Delete(args) => (&mut args.write.sequencer, &args.write.sequencer_file),
        StoreCommand::Txn(args) => (&mut args.write.sequencer, &args.write.sequencer_file),
        StoreCommand::Get(args) => (&mut args.sequencer, &args.sequencer_file),
        StoreCommand::Claim(args) => (&mut args.sequencer, &args.sequencer_file),
        StoreCommand::Serve(_) | StoreCommand::Fence(_) => return Ok(()),
    };
    let Some(path) = file else {
        return Ok(());
    };
    use std::io::Read as _;
    // A sequencer, a line end and some white space: anything longer is not one.
    let bytes_max = palisade_sequencer::SEQUENCER_BYTES_MAX as u64 + 64;
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        io::stdin().take(bytes_max + 1).read_to_string(&mut text)
    } else {
        std::fs::File::open(path)
            .and_then(|file| file.take(bytes_max + 1).read_to_string(&mut text))
    };
    read.map_err(|error| StoreClientError::InvalidRequest {
        message: format!("cannot read the sequencer file {}: {error}", path.display()),
    })?;
    if text.len() as u64 > bytes_max {
        return Err(StoreClientError::Store(StoreError::Malformed {
            message: format!(
                "the sequencer file {} holds more than a sequencer ({} bytes at most)",
                path.display(),
                palisade_sequencer::SEQUENCER_BYTES_MAX
            ),
        }));
    }
    *sequencer = Some(text.trim().to_owned());
    Ok(())
}

/// The exit status of a failed command, and how its message starts: one per
/// [`StoreErrorClass`], which has no wildcard to fall into, so a new class does not compile until
/// it has a status here.
pub fn exit_status(error: &StoreClientError) -> (u8, &'static str) {
    match error.class() {
        StoreErrorClass::Stale => (EXIT_STALE, "refused: "),
        StoreErrorClass::Rejected => (EXIT_REFUSED, "refused: "),
        StoreErrorClass::Invalid | StoreErrorClass::QuotaReached => (EXIT_REFUSED, ""),
        StoreErrorClass::NotFound => (EXIT_NOT_FOUND, ""),
        StoreErrorClass::CompareFailed => (EXIT_COMPARE_FAILED, ""),
        StoreErrorClass::Retryable => (EXIT_UNAVAILABLE, ""),
        StoreErrorClass::Internal => (EXIT_INTERNAL, ""),
        StoreErrorClass::OutcomeUnknown => (EXIT_OUTCOME_UNKNOWN, ""),
    }
}

/// The presented sequencer, refused locally when there is none: no point asking the store to
/// say the same.
fn presented(sequencer: Option<&str>) -> Result<String, StoreClientError> {
    match sequencer.map(str::trim) {
        None | Some("") => Err(StoreClientError::Store(StoreError::Missing)),
        Some(sequencer) => Ok(sequencer.to_owned()),
    }
}

/// `put`, `delete` and `txn`: one transaction, retried with one request id.
async fn txn_command(
    address: &StoreAddress,
    args: &WriteArgs,
    request: BatchRequest,
) -> Result<Vec<u8>, StoreClientError> {
    let sequencer = presented(args.sequencer.as_deref())?;
    let request_id = args.request_id.clone().unwrap_or_else(fresh_request_id);
    with_retries(address, |client| {
        let (request, sequencer, request_id) = (&request, sequencer.clone(), request_id.clone());
        async move {
            client
                .txn(request, Some(&sequencer), Some(&request_id))
                .await
        }
    })
    .await
    .map(|ack| write_output(&ack, args.json))
}

/// Runs one request, retrying while the store is unreachable, fails retryably, or does not
/// answer. Every attempt must be safe to repeat: a write carries one request id throughout,
/// and fenced reads and claims change nothing the second time.
async fn with_retries<T, F, Fut>(
    address: &StoreAddress,
    mut attempt: F,
) -> Result<T, StoreClientError>
where
    F: FnMut(StoreClient) -> Fut,
    Fut: Future<Output = Result<T, StoreClientError>>,
{
    let client = store_client(&address.store)?;
    retry_until_known(&mut StoreRetries::new(), || attempt(client.clone())).await
}

/// How a `palisade store` request is retried: [`WRITE_ATTEMPTS_MAX`] attempts, the pause
/// doubling from [`WRITE_RETRY_BACKOFF_MS`].
#[derive(Debug)]
struct StoreRetries {
    attempts_left: u32,
    backoff: Duration,
}

impl StoreRetries {
    fn new() -> StoreRetries {
        StoreRetries {
            attempts_left: WRITE_ATTEMPTS_MAX - 1,
            backoff: Duration::from_millis(WRITE_RETRY_BACKOFF_MS),
        }
    }
}

impl RetryPolicy<StoreClientError> for StoreRetries {
    fn classify(&self, error: &StoreClientError) -> AttemptFailure {
        match error.class() {
            StoreErrorClass::OutcomeUnknown => AttemptFailure::OutcomeUnknown,
            StoreErrorClass::Retryable => AttemptFailure::NotApplied,
            StoreErrorClass::Stale
            | StoreErrorClass::Rejected
            | StoreErrorClass::Invalid
            | StoreErrorClass::QuotaReached
            | StoreErrorClass::NotFound
            | StoreErrorClass::CompareFailed
            | StoreErrorClass::Internal => AttemptFailure::Final,
        }
    }

    async fn pause(&mut self) -> bool {
        if self.attempts_left == 0 {
            return false;
        }
        self.attempts_left -= 1;
        tokio::time::sleep(self.backoff).await;
        self.backoff *= 2;
        true
    }

    fn unknown_after(
        &self,
        _earlier: StoreClientError,
        last: StoreClientError,
    ) -> StoreClientError {
        StoreClientError::OutcomeUnknown {
            message: format!("an earlier attempt's outcome is unknown, and then: {last}"),
        }
    }
}

/// A fresh request id for one write: random, like the lock client's (the store compares it
/// only with the ids of the same sequencer).
fn fresh_request_id() -> String {
    format!("cli-{:016x}", palisade_client::request_id().get())
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
            (OpKind::Get, _) => {
                match &op.entry {
                    Some(entry) => text.push_str(&format!(
                        "{:?} = {} (revision {})\n",
                        op.key,
                        String::from_utf8_lossy(&entry.value),
                        entry.revision
                    )),
                    None => text.push_str(&format!("{:?} has no value\n", op.key)),
                }
                continue;
            }
        };
        text.push_str(&format!(
            "{verb} {:?} (lock {:?}, token {}, revision {}){}\n",
            op.key,
            ack.lock,
            ack.token,
            ack.revision,
            if ack.replayed {
                ", already applied by an earlier attempt"
            } else {
                ""
            }
        ));
    }
    text.into_bytes()
}

fn claim_output(ack: &ClaimAck, json: bool) -> Vec<u8> {
    if json {
        return json_line(ack);
    }
    let before = match ack.previous_token_max {
        Some(token) => format!("was {token}"),
        None => "no grant seen before".to_owned(),
    };
    let what = if ack.advanced {
        "claimed"
    } else {
        "already claimed"
    };
    format!(
        "{what} lock {:?} with token {} ({before}): older grants are refused from now on\n",
        ack.lock, ack.token
    )
    .into_bytes()
}

fn json_line(value: &impl serde::Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    line
}
