//! `palisade cluster status | add | remove`: the membership of a replicated lock service.
//!
//! `status` asks the first endpoint that answers for the membership, then every member for its
//! own view (role, term, indexes), so a member that is down shows as unreachable instead of
//! hiding the others. `add` and `remove` go to the leader: a follower's answer names it.

use std::process::ExitCode;
use std::time::Duration;

use palisade_proto::v1::cluster_client::ClusterClient;
use palisade_proto::v1::{
    AddMemberRequest, ClusterMember, ClusterStatusRequest, ClusterStatusResponse,
    RemoveMemberRequest,
};
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint};

use crate::exit::{self, Exit};

/// How long `status` waits for one member.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `add` may take: the new node catches up before it becomes a voter.
const ADD_TIMEOUT: Duration = Duration::from_secs(180);
/// How long `remove` may take.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(30);

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
}

pub async fn run(command: ClusterCommand, endpoints: &[String]) -> anyhow::Result<ExitCode> {
    match command {
        ClusterCommand::Status { json } => status(endpoints, json).await,
        ClusterCommand::Add { id, address } => {
            let members = on_leader(endpoints, ADD_TIMEOUT, |mut client| {
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
            let members = on_leader(endpoints, REMOVE_TIMEOUT, |mut client| async move {
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
    }
}

fn endpoint(address: &str, timeout: Duration) -> anyhow::Result<Endpoint> {
    let uri = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    Ok(Endpoint::from_shared(uri)
        .map_err(|e| Exit::new(exit::USAGE, format!("{address:?} is not an endpoint: {e}")))?
        .connect_timeout(STATUS_TIMEOUT)
        .timeout(timeout))
}

async fn connect(address: &str, timeout: Duration) -> anyhow::Result<ClusterClient<Channel>> {
    Ok(ClusterClient::new(
        endpoint(address, timeout)?.connect().await.map_err(|e| {
            Exit::new(
                exit::UNAVAILABLE,
                format!(
                    "cannot reach {address}: {}",
                    palisade_core::error_chain::error_chain(&e)
                ),
            )
        })?,
    ))
}

/// One node's own view, or why it could not be had.
async fn view_of(address: &str) -> Result<ClusterStatusResponse, String> {
    let mut client = connect(address, STATUS_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    client
        .status(ClusterStatusRequest {})
        .await
        .map(|r| r.into_inner())
        .map_err(|s| s.message().to_string())
}

async fn status(endpoints: &[String], json: bool) -> anyhow::Result<ExitCode> {
    let mut first = None;
    let mut errors = Vec::new();
    for address in endpoints {
        match view_of(address).await {
            Ok(view) => {
                first = Some(view);
                break;
            }
            Err(e) => errors.push(e),
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
            view_of(&member.address).await
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

/// Runs `call` on the leader: on each endpoint in turn, following a follower's hint once.
async fn on_leader<T, F, Fut>(endpoints: &[String], timeout: Duration, call: F) -> anyhow::Result<T>
where
    F: Fn(ClusterClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut last = String::from("no endpoint given");
    let mut queue: Vec<String> = endpoints.to_vec();
    let mut followed = 0;
    while let Some(address) = (!queue.is_empty()).then(|| queue.remove(0)) {
        let client = match connect(&address, timeout).await {
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
                last = format!("{address}: {}", status.message());
                if let Some(leader) = hint.filter(|_| followed < endpoints.len() + 1) {
                    followed += 1;
                    queue.insert(0, leader);
                }
            }
            Err(status) => {
                let code = match status.code() {
                    tonic::Code::FailedPrecondition | tonic::Code::InvalidArgument => exit::REFUSED,
                    tonic::Code::Unknown | tonic::Code::DeadlineExceeded => exit::OUTCOME_UNKNOWN,
                    _ => exit::INTERNAL,
                };
                return Err(Exit::new(code, format!("{address}: {}", status.message())).into());
            }
        }
    }
    Err(Exit::new(exit::UNAVAILABLE, last).into())
}
