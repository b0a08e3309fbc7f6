//! `palisade cluster status | add | remove`: the membership of a replicated lock service, and
//! `palisade keys list | add | rotate | retire`: its signing keys.
//!
//! `status` asks the first endpoint that answers for the membership, then every member for its
//! own view (role, term, indexes), so a member that is down shows as unreachable instead of
//! hiding the others. Every other command goes to the leader: a follower's answer names it.

use std::process::ExitCode;
use std::time::Duration;

use palisade_client::Bearer;
use palisade_proto::v1::cluster_client::ClusterClient;
use palisade_proto::v1::{
    AddKeyRequest, AddMemberRequest, BackupRequest, ClusterMember, ClusterStatusRequest,
    ClusterStatusResponse, ListKeysRequest, PublishedKey, RaiseTokenFloorRequest,
    RemoveMemberRequest, RetireKeyRequest, RotateKeyRequest,
};
use palisade_sequencer::KeyId;
use serde_json::{Value, json};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::exit::{self, Exit};

/// How long `status` waits for one member.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `add` may take: the new node catches up before it becomes a voter.
const ADD_TIMEOUT: Duration = Duration::from_secs(180);
/// How long `remove` may take.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a backup may take to arrive.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a `keys` command may take: one linearizable read or one committed entry.
const KEYS_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Members, their roles, the leader, the term and each member's applied and committed index.
    #[command(after_help = exit::HELP)]
    Status {
        /// Print a JSON object: `leader` (node id or null) and `members`
        /// (`[{id, address, role, kind, term, applied_index, committed_index}]`).
        #[arg(long)]
        json: bool,
    },
    /// Add the node at ADDR (started with `palisade serve --join --node-id ID`): it takes the
    /// cluster's key, catches up, then votes.
    #[command(after_help = exit::HELP)]
    Add {
        /// A node id never used in this cluster.
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
        /// HOST:PORT where the new node listens.
        address: String,
    },
    /// Remove a member; stop its process afterwards.
    #[command(after_help = exit::HELP)]
    Remove {
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
    },
    /// Write a backup of the cluster (lock table, limits, token counter, signing keys) to FILE,
    /// owner-readable only: it holds the keys. Restore it with `palisade restore`.
    #[command(after_help = exit::HELP)]
    Backup {
        /// Where to write it; replaced atomically if it exists.
        file: std::path::PathBuf,
    },
    /// Raise the token counter so every later grant's token is above FLOOR (never lowers it):
    /// after a resource accepted a token it should not have (a planted or leaked key, retired
    /// since), honest holders' tokens pass it again. See docs/security.md.
    ///
    /// A floor within 2^56 of the largest token (2^63 - 1) is refused. One above the counter
    /// and more than 2^40 above the time floor (2^21 per second since 1970) is refused unless
    /// --force is given; after a forced raise, take a new backup (a restore of an older one
    /// places the counter below it).
    #[command(after_help = exit::HELP)]
    RaiseTokenFloor {
        /// The largest token a resource accepted that the cluster did not grant.
        #[arg(value_parser = clap::value_parser!(u64).range(1..=palisade_core::limits::TOKEN_MAX.get()))]
        floor: u64,
        /// Raise the counter far above where it is: that token space is spent for ever (the
        /// counter never goes down), and every later restore or recovery builds on it.
        #[arg(long)]
        force: bool,
    },
}

/// Flags of `palisade recover-counters`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct RecoverCountersArgs {
    /// The stopped node's data directory.
    #[arg(long)]
    pub data_dir: std::path::PathBuf,
}

/// `palisade recover-counters`: floors above every token and session id the node can have
/// issued, for it to propose before it grants anything.
pub fn recover_counters(args: RecoverCountersArgs) -> anyhow::Result<ExitCode> {
    use palisade_server::counters::{RecoverError, now_unix_ms, recover};
    let recovered = recover(&args.data_dir, now_unix_ms()).map_err(|e| {
        let code = match e {
            RecoverError::Refused(_) => exit::REFUSED,
            RecoverError::Io(_) => exit::INTERNAL,
        };
        Exit::new(code, e.to_string())
    })?;
    match &recovered.mark {
        Some(mark) => println!(
            "the counters' mark of {} records token {} and session {}, read at {} ms since 1970",
            args.data_dir.display(),
            mark.last_token,
            mark.last_session,
            mark.read_at_unix_ms
        ),
        None => println!(
            "{} has no counters' mark: the floors are the time floor (2^21 a second since 1970)",
            args.data_dir.display()
        ),
    }
    println!(
        "tokens will continue above {} and session ids above {}, proposed before anything is \
         granted; start the node with `palisade serve --data-dir {}`",
        recovered.floors.token,
        recovered
            .floors
            .session
            .map_or_else(|| "the current counter".to_string(), |s| s.to_string()),
        args.data_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Flags of `palisade restore`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct RestoreArgs {
    /// A file written by `palisade cluster backup`.
    pub backup: std::path::PathBuf,
    /// The data directory to create (absent or empty). Start it with `palisade serve
    /// --data-dir DIR`: a new one-member cluster, to grow with `palisade cluster add`.
    #[arg(long)]
    pub data_dir: std::path::PathBuf,
}

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// The published keys, oldest first, and which one signs.
    #[command(after_help = exit::HELP)]
    List {
        /// Print a JSON array of `{key_id, public_key, signing}`.
        #[arg(long)]
        json: bool,
    },
    /// Publish a new key; it does not sign yet. Then give every resource the new
    /// `palisade pubkey`, and run `palisade keys rotate`.
    #[command(after_help = exit::HELP)]
    Add,
    /// Sign with the newest key published after the signing key (or KEY_ID) from now on. The
    /// key that signed until now stays published, so current holders' sequencers still verify.
    #[command(after_help = exit::HELP)]
    Rotate {
        /// The key to sign with (16 hex digits, from `palisade keys list`).
        #[arg(value_parser = KeyId::parse)]
        key_id: Option<KeyId>,
    },
    /// Stop publishing a key that no longer signs. Do it once no holder still presents its
    /// sequencers (after the longest lease), then drop it from every resource.
    #[command(after_help = exit::HELP)]
    Retire {
        #[arg(value_parser = KeyId::parse)]
        key_id: KeyId,
    },
}

pub async fn keys(
    command: KeysCommand,
    endpoints: &[String],
    bearer: &Bearer,
) -> anyhow::Result<ExitCode> {
    let (keys, done, json) = match command {
        KeysCommand::List { json } => {
            let keys = on_leader(endpoints, bearer, KEYS_TIMEOUT, |mut client| async move {
                client.list_keys(ListKeysRequest {}).await
            })
            .await?;
            (keys, None, json)
        }
        KeysCommand::Add => {
            let keys = on_leader(endpoints, bearer, KEYS_TIMEOUT, |mut client| async move {
                client.add_key(AddKeyRequest {}).await
            })
            .await?;
            let added = keys.get_ref().keys.last().map(|k| k.key_id.clone());
            let message = format!(
                "published key {}; it does not sign yet: give every resource the keys \
                 `palisade pubkey` prints, then run `palisade keys rotate`",
                added.unwrap_or_default()
            );
            (keys, Some(message), false)
        }
        KeysCommand::Rotate { key_id } => {
            let key_id = key_id.map(|k| k.to_string()).unwrap_or_default();
            let keys = on_leader(endpoints, bearer, KEYS_TIMEOUT, |mut client| {
                let key_id = key_id.clone();
                async move { client.rotate_key(RotateKeyRequest { key_id }).await }
            })
            .await?;
            let signing = signing_id(&keys.get_ref().keys);
            (
                keys,
                Some(format!("key {signing} signs from now on")),
                false,
            )
        }
        KeysCommand::Retire { key_id } => {
            let keys = on_leader(endpoints, bearer, KEYS_TIMEOUT, |mut client| async move {
                client
                    .retire_key(RetireKeyRequest {
                        key_id: key_id.to_string(),
                    })
                    .await
            })
            .await?;
            (keys, Some(format!("retired key {key_id}")), false)
        }
    };
    let keys = keys.into_inner().keys;
    if json {
        let keys: Vec<Value> = keys
            .iter()
            .map(
                |k| json!({ "key_id": k.key_id, "public_key": k.public_key, "signing": k.signing }),
            )
            .collect();
        println!("{}", Value::Array(keys));
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(done) = done {
        println!("{done}");
    }
    print!("{}", keys_table(&keys));
    Ok(ExitCode::SUCCESS)
}

fn signing_id(keys: &[PublishedKey]) -> String {
    keys.iter()
        .find(|k| k.signing)
        .map(|k| k.key_id.clone())
        .unwrap_or_default()
}

fn keys_table(keys: &[PublishedKey]) -> String {
    let mut table = format!("{:<16}  {:<7}  {}\n", "KEY ID", "SIGNING", "PUBLIC KEY");
    for k in keys {
        let signing = if k.signing { "yes" } else { "no" };
        table.push_str(&format!(
            "{:<16}  {:<7}  {}\n",
            k.key_id, signing, k.public_key
        ));
    }
    table
}

pub async fn run(
    command: ClusterCommand,
    endpoints: &[String],
    bearer: &Bearer,
) -> anyhow::Result<ExitCode> {
    match command {
        ClusterCommand::Status { json } => status(endpoints, bearer, json).await,
        ClusterCommand::Add { id, address } => {
            let members = on_leader(endpoints, bearer, ADD_TIMEOUT, |mut client| {
                let address = address.clone();
                async move {
                    client
                        .add_member(AddMemberRequest { id, address })
                        .await
                        .map(|r| r.into_inner().members)
                }
            })
            .await?;
            println!("added node {id}");
            print!("{}", members_table(&members));
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Remove { id } => {
            let members = on_leader(endpoints, bearer, REMOVE_TIMEOUT, |mut client| async move {
                client
                    .remove_member(RemoveMemberRequest { id })
                    .await
                    .map(|r| r.into_inner().members)
            })
            .await?;
            println!("removed node {id}");
            print!("{}", members_table(&members));
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Backup { file } => backup(endpoints, bearer, &file).await,
        ClusterCommand::RaiseTokenFloor { floor, force } => {
            let last_token =
                on_leader(endpoints, bearer, REMOVE_TIMEOUT, |mut client| async move {
                    client
                        .raise_token_floor(RaiseTokenFloorRequest { floor, force })
                        .await
                        .map(|r| r.into_inner().last_token)
                })
                .await?;
            println!("token counter at {last_token}: every later grant's token is above it");
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn backup(
    endpoints: &[String],
    bearer: &Bearer,
    file: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let limit = palisade_server::limits::SNAPSHOT_BYTES_MAX;
    let bytes = on_leader(endpoints, bearer, BACKUP_TIMEOUT, |mut client| async move {
        let mut chunks = client.backup(BackupRequest {}).await?.into_inner();
        let mut bytes = Vec::new();
        while let Some(chunk) = chunks.message().await? {
            if bytes.len() + chunk.data.len() > limit {
                return Err(tonic::Status::resource_exhausted(format!(
                    "the backup is larger than any lock table ({limit} bytes)"
                )));
            }
            bytes.extend_from_slice(&chunk.data);
        }
        Ok(bytes)
    })
    .await?;
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let name = file.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        Exit::new(
            exit::USAGE,
            format!("{} is not a file name", file.display()),
        )
    })?;
    palisade_server::write_file_atomically(
        dir,
        name,
        &bytes,
        Some(palisade_server::SECRET_FILE_MODE),
    )
    .map_err(|e| {
        Exit::new(
            exit::INTERNAL,
            format!("cannot write {}: {e}", file.display()),
        )
    })?;
    println!(
        "wrote a backup of {} bytes to {}",
        bytes.len(),
        file.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `palisade restore`: a new data directory from a backup, without a server.
pub fn restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(&args.backup)
        .and_then(|f| {
            f.take(palisade_server::limits::SNAPSHOT_BYTES_MAX as u64 + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(|e| {
            Exit::new(
                exit::USAGE,
                format!("cannot read {}: {e}", args.backup.display()),
            )
        })?;
    let now = palisade_server::counters::now_unix_ms();
    let restored = palisade_server::backup::restore(&bytes, &args.data_dir, now).map_err(|e| {
        let code = match e {
            palisade_server::backup::RestoreError::Io(_) => exit::INTERNAL,
            palisade_server::backup::RestoreError::Backup(_)
            | palisade_server::backup::RestoreError::NotEmpty { .. }
            | palisade_server::backup::RestoreError::ClockBehind { .. }
            | palisade_server::backup::RestoreError::Exhausted { .. } => exit::REFUSED,
        };
        Exit::new(code, e.to_string())
    })?;
    println!(
        "restored into {}: a new cluster whose tokens continue above {} (the backup's last was {}) \
         and session ids above {} (the backup's last was {}); \
         {} sessions and {} locks were not carried over, clients open new sessions",
        args.data_dir.display(),
        restored.last_token,
        restored.last_token_in_backup,
        restored.last_session,
        restored.last_session_in_backup,
        restored.sessions_dropped,
        restored.locks_dropped,
    );
    println!(
        "start it with `palisade serve --data-dir {}`, then add members with `palisade cluster add`",
        args.data_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The client TLS settings of the global flags, set once by `main` before a command runs:
/// every cluster and keys call, and the leader hints they follow, use them.
static TLS: std::sync::OnceLock<Option<palisade_tls::ClientTls>> = std::sync::OnceLock::new();

/// Sets the TLS settings of this process's cluster calls (once; later calls are ignored).
pub fn set_tls(tls: Option<palisade_tls::ClientTls>) {
    let _ = TLS.set(tls);
}

fn tls() -> Option<&'static palisade_tls::ClientTls> {
    TLS.get().and_then(Option::as_ref)
}

/// `address` without its scheme and a trailing `/`, to compare a hint with the endpoints given.
fn bare_address(address: &str) -> &str {
    let address = address.trim();
    let bare = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("https://"))
        .unwrap_or(address);
    bare.strip_suffix('/').unwrap_or(bare)
}

fn endpoint(address: &str, timeout: Duration) -> anyhow::Result<Endpoint> {
    let bare = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("https://"));
    let uri = match (tls(), bare) {
        (Some(_), Some(bare)) => format!("https://{bare}"),
        (Some(_), None) => format!("https://{address}"),
        (None, _) if address.contains("://") => address.to_string(),
        (None, _) => format!("http://{address}"),
    };
    Ok(Endpoint::from_shared(uri)
        .map_err(|e| Exit::new(exit::USAGE, format!("{address:?} is not an endpoint: {e}")))?
        .connect_timeout(STATUS_TIMEOUT)
        .timeout(timeout))
}

/// The cluster service on `address`, every call carrying the bearer token, if any.
type Admin = ClusterClient<InterceptedService<Channel, Bearer>>;

async fn connect(address: &str, timeout: Duration, bearer: &Bearer) -> anyhow::Result<Admin> {
    let dialer = tls().map(|tls| palisade_proto::transport::TlsDialer::dialer(tls.clone(), None));
    let endpoint = endpoint(address, timeout)?;
    Ok(ClusterClient::with_interceptor(
        palisade_proto::transport::connect(endpoint, dialer.as_ref())
            .await
            .map_err(|e| {
                Exit::new(
                    exit::UNAVAILABLE,
                    format!(
                        "cannot reach {address}: {}",
                        palisade_core::error_chain::error_chain(&e)
                    ),
                )
            })?,
        bearer.clone(),
    ))
}

/// One node's own view, or why it could not be had.
async fn view_of(address: &str, bearer: &Bearer) -> Result<ClusterStatusResponse, String> {
    let mut client = connect(address, STATUS_TIMEOUT, bearer)
        .await
        .map_err(|e| e.to_string())?;
    client
        .status(ClusterStatusRequest {})
        .await
        .map(|r| r.into_inner())
        .map_err(|s| s.message().to_string())
}

async fn status(endpoints: &[String], bearer: &Bearer, json: bool) -> anyhow::Result<ExitCode> {
    let mut first = None;
    let mut errors = Vec::new();
    for address in endpoints {
        let mut client = match connect(address, STATUS_TIMEOUT, bearer).await {
            Ok(client) => client,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        match client.status(ClusterStatusRequest {}).await {
            Ok(view) => {
                first = Some(view.into_inner());
                break;
            }
            // A refusal of the credential or the right is the answer: asking another member
            // changes nothing.
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
                ) =>
            {
                return Err(Exit::new(exit::REFUSED, status.message().to_string()).into());
            }
            Err(status) => errors.push(status.message().to_string()),
        }
    }
    let Some(first) = first else {
        return Err(Exit::new(exit::UNAVAILABLE, errors.join("; ")).into());
    };
    let mut rows = Vec::new();
    for member in &first.members {
        let view = if member.id == first.node_id {
            Ok(first.clone())
        } else {
            view_of(&member.address, bearer).await
        };
        rows.push((member.clone(), view));
    }
    // The leader as the members report it: the highest term's claim wins.
    let leader = rows
        .iter()
        .filter_map(|(_, v)| v.as_ref().ok())
        .max_by_key(|v| v.term)
        .and_then(|v| v.leader);
    if json {
        let members: Vec<Value> = rows
            .iter()
            .map(|(m, view)| match view {
                Ok(v) => json!({
                    "id": m.id, "address": m.address, "kind": m.kind, "role": v.role,
                    "term": v.term, "applied_index": v.applied_index,
                    "committed_index": v.committed_index,
                }),
                Err(e) => json!({
                    "id": m.id, "address": m.address, "kind": m.kind, "role": "unreachable",
                    "error": e,
                }),
            })
            .collect();
        println!("{}", json!({ "leader": leader, "members": members }));
    } else {
        match leader {
            Some(leader) => println!("leader: node {leader}"),
            None => println!("leader: none known (an election may be under way)"),
        }
        let mut table = format!(
            "{:<4} {:<24} {:<8} {:<12} {:>6} {:>10} {:>10}\n",
            "ID", "ADDRESS", "KIND", "ROLE", "TERM", "APPLIED", "COMMITTED"
        );
        for (m, view) in &rows {
            match view {
                Ok(v) => table.push_str(&format!(
                    "{:<4} {:<24} {:<8} {:<12} {:>6} {:>10} {:>10}\n",
                    m.id, m.address, m.kind, v.role, v.term, v.applied_index, v.committed_index
                )),
                Err(e) => table.push_str(&format!(
                    "{:<4} {:<24} {:<8} {:<12} ({e})\n",
                    m.id, m.address, m.kind, "unreachable"
                )),
            }
        }
        print!("{table}");
    }
    Ok(ExitCode::SUCCESS)
}

fn members_table(members: &[ClusterMember]) -> String {
    let mut table = format!("{:<4} {:<24} {:<8}\n", "ID", "ADDRESS", "KIND");
    for m in members {
        table.push_str(&format!("{:<4} {:<24} {:<8}\n", m.id, m.address, m.kind));
    }
    table
}

/// How long a cluster command keeps asking while the members it reaches know no leader: an
/// election, or a leader that stopped serving until a quorum answers it again.
const LEADER_WAIT: Duration = Duration::from_secs(10);
/// The first and the longest pause between two rounds of the endpoints.
const LEADER_WAIT_PAUSE: Duration = Duration::from_millis(100);
const LEADER_WAIT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Runs `call` on the leader: on each endpoint in turn, following a follower's hint once, to an
/// address not among `endpoints` only with TLS (N14: every call carries the bearer token, the
/// admin token without a policy, and without TLS nothing proves a hinted address a member).
/// While a member answers but knows no leader, the round is repeated for up to
/// [`LEADER_WAIT`]; when no endpoint answers at all, or the leader is known but may not be
/// followed, the command ends at once.
async fn on_leader<T, F, Fut>(
    endpoints: &[String],
    bearer: &Bearer,
    timeout: Duration,
    call: F,
) -> anyhow::Result<T>
where
    F: Fn(Admin) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut last = String::from("no endpoint given");
    let deadline = tokio::time::Instant::now() + LEADER_WAIT;
    let mut pause = LEADER_WAIT_PAUSE;
    loop {
        // Whether a member answered but could not serve (no leader yet, or a dead one named),
        // and whether it named a leader this command may not go to.
        let (mut answered, mut unfollowable) = (false, false);
        let mut queue: Vec<String> = endpoints.to_vec();
        let mut followed = 0;
        while let Some(address) = (!queue.is_empty()).then(|| queue.remove(0)) {
            let client = match connect(&address, timeout, bearer).await {
                Ok(client) => client,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            match call(client).await {
                Ok(value) => return Ok(value),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    let hint = status
                        .metadata()
                        .get(palisade_proto::LEADER_ADDR_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    answered = true;
                    last = format!("{address}: {}", status.message());
                    let Some(leader) = hint.filter(|_| followed < endpoints.len() + 1) else {
                        continue;
                    };
                    let given = endpoints
                        .iter()
                        .any(|e| bare_address(e) == bare_address(&leader));
                    if given || tls().is_some() {
                        followed += 1;
                        queue.insert(0, leader);
                    } else {
                        unfollowable = true;
                        last = format!(
                            "{last} (the leader is at {leader}, which is not among the endpoints given: \
                             without TLS a leader hint is followed only to one of them; give every member)"
                        );
                    }
                }
                Err(status) => {
                    let code = match status.code() {
                        tonic::Code::FailedPrecondition
                        | tonic::Code::InvalidArgument
                        | tonic::Code::PermissionDenied
                        | tonic::Code::Unauthenticated => exit::REFUSED,
                        tonic::Code::Unknown | tonic::Code::DeadlineExceeded => {
                            exit::OUTCOME_UNKNOWN
                        }
                        _ => exit::INTERNAL,
                    };
                    return Err(Exit::new(code, format!("{address}: {}", status.message())).into());
                }
            }
        }
        if !answered || unfollowable || tokio::time::Instant::now() + pause > deadline {
            break;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LEADER_WAIT_PAUSE_MAX);
    }
    Err(Exit::new(exit::UNAVAILABLE, last).into())
}
