//! The Raft network between the nodes of a cluster: the client side of `palisade.raft.v1`
//! (`crates/proto/proto/palisade_raft.proto`) over tonic. [`crate::peer_service`] is the
//! receiving side.
//!
//! - **Addresses** come from openraft's membership: a member's [`Member::addr`](crate::raft_types::Member) is the
//!   `host:port` of its gRPC listener, the one that serves the `Locks` API too.
//! - **One channel per peer.** [`PeerNetwork`] keeps one lazily connected tonic `Channel` per
//!   node id and hands it to every client openraft asks for (replication, heartbeats, votes,
//!   snapshots), so a call does not pay for a connection. A channel reconnects by itself after a
//!   failure; a new address for the same id replaces it.
//! - **Deadlines.** Every call is bounded by its `RPCOption::soft_ttl()`, on this side (the call
//!   is abandoned) and on the receiver's (`grpc-timeout`), so it returns before openraft's
//!   `hard_ttl()`.
//! - **Errors.** A call that ran out of time is a `Timeout`; every other failure (no connection,
//!   a refused handshake, a stopped peer, a reply this version cannot read) is `Unreachable`, so
//!   openraft backs off ([`PeerClient::backoff`]: 50 ms growing by half up to 1 s) instead of
//!   retrying at once. No failure is ever turned into an answer: a `pre_vote` that did not
//!   reach its peer is an error, never a granted vote.
//! - **Handshake.** Every request names the cluster and the node id it is for; the receiver
//!   refuses it if it is another node or belongs to another cluster, so a stale address in the
//!   membership reaches an error, not the wrong node.
//! - **Sizes.** An append-entries batch whose JSON is over [`APPEND_ENTRIES_BYTES_MAX`] is cut:
//!   its leading entries go, and the call reports a partial success up to the last of them,
//!   which openraft allows; it sends the rest next. A snapshot travels as a client stream: a
//!   header (vote, meta, length), then pieces of at most [`SNAPSHOT_CHUNK_BYTES_MAX`].
//!
//! **Wire format.** Bodies are openraft's messages as JSON, not a protobuf mapping of them: the
//! log already stores entries as JSON, so one serialisation serves disk and network, and JSON
//! names its fields, so a field openraft adds between alphas (all carry `#[serde(default)]`) does
//! not shift the others, as it would in bincode or postcard. The price is size and CPU, which do
//! not matter at the rate a lock service writes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use openraft::OptionalSend;
use openraft::base::{BoxFuture, BoxStream};
use openraft::entry::RaftEntry;
use openraft::errors::{RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable};
use openraft::network::{
    Backoff, RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2, stream_append_sequential,
};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{LogIdOf, SnapshotOf, VoteOf};
use palisade_core::Token;
use palisade_proto::raft::v1::raft_client::RaftClient;
use palisade_proto::raft::v1::{
    AdmitRequest, Envelope, PeerReply, PeerRequest, SnapshotHeader, SnapshotPart, snapshot_part,
};
use palisade_proto::transport::{self, Dialer};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use crate::limits::{
    APPEND_ENTRIES_BYTES_MAX, CLUSTER_NAME_BYTES_MAX, PEER_MESSAGE_BYTES_MAX, SNAPSHOT_BYTES_MAX,
    SNAPSHOT_CHUNK_BYTES_MAX,
};
use crate::limits::{
    PEER_ADMIT_TIMEOUT, PEER_BACKOFF_FIRST, PEER_BACKOFF_MAX, PEER_CONNECT_TIMEOUT,
    PEER_KEEPALIVE_INTERVAL, PEER_KEEPALIVE_TIMEOUT,
};
use crate::raft_types::{C, Member, SnapshotData};

mod append_stream;

/// The name every node of one cluster shares. Each peer request carries it and a node refuses
/// requests for another cluster, so two clusters whose addresses overlap cannot mix.
///
/// Between 1 and [`CLUSTER_NAME_BYTES_MAX`] bytes, without control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterName(String);

/// Why a string cannot be a [`ClusterName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cluster name {name:?}: {why}")]
pub struct InvalidClusterName {
    name: String,
    why: String,
}

impl ClusterName {
    pub fn new(name: impl Into<String>) -> Result<ClusterName, InvalidClusterName> {
        let name = name.into();
        let why = if name.is_empty() {
            "it is empty".to_string()
        } else if name.len() > CLUSTER_NAME_BYTES_MAX {
            format!("it is longer than {CLUSTER_NAME_BYTES_MAX} bytes")
        } else if name.chars().any(char::is_control) {
            "it contains a control character".to_string()
        } else {
            return Ok(ClusterName(name));
        };
        Err(InvalidClusterName { name, why })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ClusterName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// openraft's network factory for a cluster: hands out a [`PeerClient`] per target, all
/// sharing one cached channel per peer. Pass it to `PalisadeRaft::new`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PeerNetwork {
    cluster: ClusterName,
    local_id: u64,
    local_incarnation: u64,
    channels: Arc<Mutex<HashMap<u64, PeerChannel>>>,
    /// Set when a member answers that this node was removed (see [`REMOVED_HEADER`]).
    removed: Option<tokio::sync::watch::Sender<bool>>,
    /// How connections to peers are made; TCP when `None`.
    dialer: Option<Dialer>,
    /// The highest token floor a voter's reply carried (see [`TOKEN_FLOOR_HEADER`]); 0 if none.
    learned_floor: Arc<AtomicU64>,
    /// The highest session floor a voter's reply carried ([`SESSION_FLOOR_HEADER`]); 0 if none.
    learned_session_floor: Arc<AtomicU64>,
}

/// Response metadata of a member refusing a vote or pre-vote from a node its state machine
/// records as removed: the removed node's id. A node that reads its own id there learned of its
/// removal from the others (it may never receive the entry that removed it) and stops.
pub const REMOVED_HEADER: &str = "palisade-removed-node";

/// Response metadata of a vote: the token floor the voter keeps because it cut a damaged tail
/// off its log (decimal). The cut may have taken entries Raft counted on the voter to commit;
/// a candidate this voter elects might not hold them either, so it learns the floor from the
/// vote itself and places every token it grants above it.
pub const TOKEN_FLOOR_HEADER: &str = "palisade-token-floor";

/// Response metadata of a vote beside [`TOKEN_FLOOR_HEADER`]: the session floor the voter keeps
/// (decimal), absent from votes of older versions.
pub const SESSION_FLOOR_HEADER: &str = "palisade-session-floor";

#[derive(Debug, Clone)]
struct PeerChannel {
    addr: String,
    channel: Channel,
    /// Set once the peer answered that it serves no `StreamAppend` (an older version): appends
    /// to it go as unary calls from then on.
    unary_only: Arc<AtomicBool>,
}

impl PeerNetwork {
    /// The network of node `local_id` in `cluster`, whose data directory has incarnation
    /// `local_incarnation` (0: not checked by peers).
    pub fn new(cluster: ClusterName, local_id: u64, local_incarnation: u64) -> PeerNetwork {
        PeerNetwork {
            cluster,
            local_id,
            local_incarnation,
            channels: Arc::new(Mutex::new(HashMap::new())),
            removed: None,
            dialer: None,
            learned_floor: Arc::new(AtomicU64::new(0)),
            learned_session_floor: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The highest token floor a voter's reply to this node carried so far, if any.
    pub fn learned_token_floor(&self) -> Option<crate::counters::PendingFloor> {
        let session = match self.learned_session_floor.load(Ordering::SeqCst) {
            0 => None,
            floor => Some(palisade_core::SessionId::new(floor)),
        };
        match self.learned_floor.load(Ordering::SeqCst) {
            0 if session.is_none() => None,
            floor => Some(crate::counters::PendingFloor {
                token: Token::new(floor),
                session,
            }),
        }
    }

    /// Connects to peers through `dialer` instead of TCP (a simulated network).
    pub fn with_dialer(mut self, dialer: Option<Dialer>) -> PeerNetwork {
        self.dialer = dialer;
        self
    }

    /// Sets `removed` to true when a member answers that this node was removed.
    pub fn with_removal_signal(mut self, removed: tokio::sync::watch::Sender<bool>) -> PeerNetwork {
        self.removed = Some(removed);
        self
    }

    /// The envelope of a request to `target`, whose incarnation the membership records as
    /// `incarnation` (0: unknown).
    fn envelope(&self, target: u64, incarnation: u64) -> Envelope {
        Envelope {
            cluster: self.cluster.as_str().to_string(),
            to_node_id: target,
            from_node_id: self.local_id,
            to_incarnation: incarnation,
            from_incarnation: self.local_incarnation,
        }
    }

    /// Admits node `target` at `addr` before it becomes a member: hands it the cluster's
    /// signing key and returns the incarnation of its data directory. Fails with the node's own
    /// words if it refuses (another node id at that address, a member of another cluster).
    pub async fn admit(
        &self,
        target: u64,
        addr: &str,
        signing_key: [u8; 32],
    ) -> Result<u64, AdmitError> {
        let peer = self.channel(target, addr).map_err(AdmitError::Refused)?;
        let mut client = RaftClient::new(peer.channel);
        let mut request = tonic::Request::new(AdmitRequest {
            envelope: Some(self.envelope(target, 0)),
            signing_key: signing_key.to_vec(),
        });
        request.set_timeout(PEER_ADMIT_TIMEOUT);
        let reply = tokio::time::timeout(PEER_ADMIT_TIMEOUT, client.admit(request))
            .await
            .map_err(|_| {
                AdmitError::Unreachable(format!(
                    "node {target} at {addr} did not answer within {PEER_ADMIT_TIMEOUT:?}"
                ))
            })?
            .map_err(|status| {
                let why = format!("node {target} at {addr}: {}", status.message());
                match status.code() {
                    tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled => AdmitError::Unreachable(why),
                    _ => AdmitError::Refused(why),
                }
            })?
            .into_inner();
        if reply.node_id != target {
            return Err(AdmitError::Refused(format!(
                "the node at {addr} is node {}, not node {target}",
                reply.node_id
            )));
        }
        Ok(reply.incarnation)
    }

    /// The cached channel to `target` at `addr`, made (not yet connected) if there is none or
    /// the address changed.
    fn channel(&self, target: u64, addr: &str) -> Result<PeerChannel, String> {
        let mut channels = self.channels.lock().expect("peer channel cache poisoned");
        if let Some(cached) = channels.get(&target)
            && cached.addr == addr
        {
            return Ok(cached.clone());
        }
        let peer = PeerChannel {
            addr: addr.to_string(),
            channel: transport::connect_lazy(endpoint(addr)?, self.dialer.as_ref()),
            unary_only: Arc::new(AtomicBool::new(false)),
        };
        channels.insert(target, peer.clone());
        Ok(peer)
    }
}

/// Why [`PeerNetwork::admit`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The node did not answer (not started yet, or gone): try again later.
    #[error("{0}")]
    Unreachable(String),
    /// The node answered and refused, or another node answered: trying again will not help.
    #[error("{0}")]
    Refused(String),
}

/// The endpoint of a member's address, `host:port` (a scheme, if present, is kept).
fn endpoint(addr: &str) -> Result<Endpoint, String> {
    if addr.is_empty() {
        return Err("it has no address in the membership".to_string());
    }
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|e| format!("its address {addr:?} in the membership is not valid: {e}"))?;
    Ok(endpoint
        .connect_timeout(PEER_CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(PEER_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(PEER_KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

impl RaftNetworkFactory<C> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &Member) -> PeerClient {
        let peer = self.channel(target, &node.addr);
        let unary_only = match &peer {
            Ok(peer) => peer.unary_only.clone(),
            Err(_) => Arc::new(AtomicBool::new(false)),
        };
        let client = peer.map(|peer| {
            RaftClient::new(peer.channel)
                .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
        });
        PeerClient {
            target,
            addr: node.addr.clone(),
            envelope: self.envelope(target, node.incarnation),
            client,
            unary_only,
            local_id: self.local_id,
            removed: self.removed.clone(),
            learned_floor: self.learned_floor.clone(),
            learned_session_floor: self.learned_session_floor.clone(),
        }
    }
}

/// The connection to one peer, as openraft uses it: every Raft RPC to that node.
#[derive(Debug)]
pub struct PeerClient {
    target: u64,
    addr: String,
    envelope: Envelope,
    /// The client, or why this peer cannot be called (no or a malformed address).
    client: Result<RaftClient<Channel>, String>,
    /// The peer serves no `StreamAppend`: appends go as unary calls.
    unary_only: Arc<AtomicBool>,
    local_id: u64,
    removed: Option<tokio::sync::watch::Sender<bool>>,
    learned_floor: Arc<AtomicU64>,
    learned_session_floor: Arc<AtomicU64>,
}

/// The unary calls of `palisade.raft.v1.Raft`.
#[derive(Debug, Clone, Copy)]
enum Unary {
    AppendEntries,
    Vote,
    PreVote,
    TransferLeader,
}

impl Unary {
    fn rpc_type(self) -> RPCTypes {
        match self {
            Unary::AppendEntries => RPCTypes::AppendEntries,
            Unary::Vote | Unary::PreVote => RPCTypes::Vote,
            Unary::TransferLeader => RPCTypes::TransferLeader,
        }
    }
}

impl PeerClient {
    fn unreachable(&self, why: impl std::fmt::Display) -> Unreachable<C> {
        Unreachable::from_string(format!("node {} at {:?}: {why}", self.target, self.addr))
    }

    fn timeout(&self, action: RPCTypes, timeout: Duration) -> Timeout<C> {
        Timeout {
            action,
            id: self.envelope.from_node_id,
            target: self.target,
            timeout,
        }
    }

    fn client(&self) -> Result<RaftClient<Channel>, Unreachable<C>> {
        self.client.clone().map_err(|why| self.unreachable(why))
    }

    /// What a failed call means to openraft: out of time, or unreachable (back off).
    fn failed(&self, action: RPCTypes, deadline: Duration, status: tonic::Status) -> RPCError<C> {
        let removed_id = status
            .metadata()
            .get(REMOVED_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let (Some(removed), Some(id)) = (&self.removed, removed_id)
            && id == self.local_id
            && !removed.send_replace(true)
        {
            tracing::error!(
                by = self.target,
                "this node was removed from the cluster (node {} says so); it stops serving. \
                 Its data directory cannot rejoin: add a new one under a new id",
                self.target
            );
        }
        if status.code() == tonic::Code::DeadlineExceeded {
            return RPCError::Timeout(self.timeout(action, deadline));
        }
        RPCError::Unreachable(self.unreachable(format_args!(
            "{:?}: {}",
            status.code(),
            status.message()
        )))
    }

    /// Sends `body` as JSON in one unary call within `option`'s soft deadline and reads the
    /// reply.
    async fn unary<Resp: DeserializeOwned>(
        &self,
        call: Unary,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<C>> {
        let mut client = self.client()?;
        let deadline = option.soft_ttl();
        let mut request = tonic::Request::new(PeerRequest {
            envelope: Some(self.envelope.clone()),
            body,
        });
        request.set_timeout(deadline);
        let reply = async {
            match call {
                Unary::AppendEntries => client.append_entries(request).await,
                Unary::Vote => client.vote(request).await,
                Unary::PreVote => client.pre_vote(request).await,
                Unary::TransferLeader => client.transfer_leader(request).await,
            }
        };
        let reply: PeerReply = match tokio::time::timeout(deadline, reply).await {
            Err(_elapsed) => {
                return Err(RPCError::Timeout(self.timeout(call.rpc_type(), deadline)));
            }
            Ok(Err(status)) => return Err(self.failed(call.rpc_type(), deadline, status)),
            Ok(Ok(reply)) => {
                if let Unary::Vote = call {
                    self.learn_floor(reply.metadata());
                }
                reply.into_inner()
            }
        };
        serde_json::from_slice(&reply.body).map_err(|e| {
            RPCError::Unreachable(self.unreachable(format_args!(
                "its {call:?} reply is not this version's JSON: {e}"
            )))
        })
    }

    /// Keeps the token floor a vote's reply carries, before openraft counts the vote: a
    /// leader it elects proposes the floor before it grants anything (`Node::take_over`).
    fn learn_floor(&self, metadata: &tonic::metadata::MetadataMap) {
        let Some(value) = metadata.get(TOKEN_FLOOR_HEADER) else {
            return;
        };
        match value.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(floor) => {
                tracing::warn!(
                    voter = self.target,
                    floor,
                    "a voter cut a damaged tail off its log: tokens of this node's leadership go above its floor"
                );
                self.learned_floor.fetch_max(floor, Ordering::SeqCst);
            }
            None => tracing::error!(
                voter = self.target,
                ?value,
                "a voter's token floor is not a number; ignored"
            ),
        }
        let Some(value) = metadata.get(SESSION_FLOOR_HEADER) else {
            return;
        };
        match value.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(floor) => {
                self.learned_session_floor
                    .fetch_max(floor, Ordering::SeqCst);
            }
            None => tracing::error!(
                voter = self.target,
                ?value,
                "a voter's session floor is not a number; ignored"
            ),
        }
    }

    fn encode<T: Serialize>(&self, what: &str, value: &T) -> Result<Vec<u8>, Unreachable<C>> {
        serde_json::to_vec(value)
            .map_err(|e| self.unreachable(format_args!("cannot encode the {what}: {e}")))
    }
}

/// The JSON body of `rpc`, cut to the leading entries that fit in [`APPEND_ENTRIES_BYTES_MAX`]
/// when the whole batch does not; `cut` is then the last entry's log id, which the call reports
/// as a partial success. An entry that alone is over the limit is an error (the limits make
/// that impossible for entries this version proposes).
#[derive(Debug)]
struct AppendBody {
    body: Vec<u8>,
    cut: Option<LogIdOf<C>>,
}

fn encode_append(mut rpc: AppendEntriesRequest<C>) -> Result<AppendBody, String> {
    let whole = serde_json::to_vec(&rpc).map_err(|e| e.to_string())?;
    if whole.len() <= APPEND_ENTRIES_BYTES_MAX {
        return Ok(AppendBody {
            body: whole,
            cut: None,
        });
    }
    let entries = std::mem::take(&mut rpc.entries);
    // An array of n entries is their bytes plus n - 1 commas on top of the empty request.
    let mut bytes = serde_json::to_vec(&rpc).map_err(|e| e.to_string())?.len();
    let mut keep = 0;
    for entry in &entries {
        let entry_bytes = serde_json::to_vec(entry).map_err(|e| e.to_string())?.len();
        if bytes + entry_bytes + 1 > APPEND_ENTRIES_BYTES_MAX {
            break;
        }
        bytes += entry_bytes + 1;
        keep += 1;
    }
    if keep == 0 {
        return Err(format!(
            "log entry {} is too large to replicate: with the request it is over the \
             {APPEND_ENTRIES_BYTES_MAX} bytes of one append-entries message",
            entries[0].index()
        ));
    }
    rpc.entries = entries;
    rpc.entries.truncate(keep);
    let cut = rpc.entries.last().map(|entry| entry.log_id());
    let body = serde_json::to_vec(&rpc).map_err(|e| e.to_string())?;
    assert!(
        body.len() <= APPEND_ENTRIES_BYTES_MAX,
        "a cut append-entries body of {} bytes is over the limit it was cut to",
        body.len()
    );
    Ok(AppendBody { body, cut })
}

/// openraft's backoff for an unreachable peer: [`PEER_BACKOFF_FIRST`], growing by half each
/// time, up to [`PEER_BACKOFF_MAX`], forever.
pub fn peer_backoff() -> impl Iterator<Item = Duration> + Send + 'static {
    std::iter::successors(Some(PEER_BACKOFF_FIRST), |wait| {
        Some(wait.mul_f64(1.5).min(PEER_BACKOFF_MAX))
    })
}

impl RaftNetworkV2<C> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        let AppendBody { body, cut } =
            encode_append(rpc).map_err(|why| RPCError::Unreachable(self.unreachable(why)))?;
        let response: AppendEntriesResponse<C> =
            self.unary(Unary::AppendEntries, body, &option).await?;
        Ok(match (response, cut) {
            (AppendEntriesResponse::Success, Some(last)) => {
                AppendEntriesResponse::PartialSuccess(Some(last))
            }
            (response, _) => response,
        })
    }

    /// openraft's requests to this follower on one `StreamAppend` stream, pipelined (see
    /// [`append_stream`]). A follower of an older version, which answers `UNIMPLEMENTED`, gets
    /// unary calls from then on: this stream fails as unreachable, and openraft sends the same
    /// entries again after its backoff.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, Result<StreamAppendResult<C>, RPCError<C>>>, RPCError<C>>>
    where
        S: futures::Stream<Item = AppendEntriesRequest<C>> + OptionalSend + Unpin + 'static,
    {
        if self.unary_only.load(Ordering::Relaxed) {
            return stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            // The first request before the stream: openraft applies its backoff inside the
            // request stream, so a stream opened before it would dial an unreachable peer again
            // at once, in a loop.
            let mut input = input;
            let Some(first) = input.next().await else {
                let nothing: BoxStream<'s, _> = Box::pin(futures::stream::empty());
                return Ok(nothing);
            };
            let mut client = self.client()?;
            let deadline = option.soft_ttl();
            let (mut sending, requests) = append_stream::open(input, self.envelope.clone());
            let offered = sending.offer(first);
            if let append_stream::Offered::Done(Some(why)) = offered {
                return Err(RPCError::Unreachable(self.unreachable(why)));
            }
            let opened = tokio::time::timeout(deadline, client.stream_append(requests)).await;
            let replies = match opened {
                Err(_elapsed) => {
                    return Err(RPCError::Timeout(
                        self.timeout(RPCTypes::AppendEntries, deadline),
                    ));
                }
                Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                    self.unary_only.store(true, Ordering::Relaxed);
                    tracing::warn!(
                        peer = self.target,
                        "the peer serves no append stream (an older version): appends to it go \
                         one call at a time"
                    );
                    return Err(RPCError::Unreachable(self.unreachable(
                        "it serves no append stream; retrying with unary calls",
                    )));
                }
                Ok(Err(status)) => {
                    return Err(self.failed(RPCTypes::AppendEntries, deadline, status));
                }
                Ok(Ok(replies)) => replies.into_inner(),
            };
            let answers = append_stream::Answers::new(&*self, replies, deadline, sending, offered);
            let answers = futures::stream::unfold(answers, |mut answers| async move {
                let answer = answers.next().await?;
                Some((answer, answers))
            });
            let answers: BoxStream<'s, _> = Box::pin(answers);
            Ok(answers)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        let body = self.encode("vote request", &rpc)?;
        self.unary(Unary::Vote, body, &option).await
    }

    /// Asks the peer whether it would grant a vote. A peer that was not reached is an error,
    /// never a grant: an isolated node must not collect a quorum of imagined grants.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        let body = self.encode("pre-vote request", &rpc)?;
        self.unary(Unary::PreVote, body, &option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<C>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<C>, RPCError<C>> {
        let body = self.encode("transfer-leader request", &req)?;
        self.unary(Unary::TransferLeader, body, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<C>,
        snapshot: SnapshotOf<C, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        let mut client = self.client()?;
        let data = snapshot.snapshot.into_inner();
        if data.len() > SNAPSHOT_BYTES_MAX {
            return Err(self
                .unreachable(format_args!(
                    "the snapshot up to {:?} is {} bytes, above the {SNAPSHOT_BYTES_MAX} bytes a \
                     node sends",
                    snapshot.meta.last_log_id,
                    data.len()
                ))
                .into());
        }
        let header = SnapshotHeader {
            envelope: Some(self.envelope.clone()),
            vote: self.encode("snapshot's vote", &vote)?,
            meta: self.encode("snapshot's meta", &snapshot.meta)?,
            snapshot_bytes: data.len() as u64,
        };
        let chunk_bytes = option
            .snapshot_chunk_size()
            .unwrap_or(SNAPSHOT_CHUNK_BYTES_MAX)
            .clamp(1, SNAPSHOT_CHUNK_BYTES_MAX);
        let parts = futures::stream::once(async move {
            SnapshotPart {
                part: Some(snapshot_part::Part::Header(header)),
            }
        })
        .chain(snapshot_chunks(data, chunk_bytes));
        let deadline = option.soft_ttl();
        let mut request = tonic::Request::new(parts);
        request.set_timeout(deadline);
        let sent = tokio::time::timeout(deadline, client.install_snapshot(request));
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            sent = sent => match sent {
                Err(_elapsed) => {
                    return Err(self.timeout(RPCTypes::InstallSnapshot, deadline).into());
                }
                Ok(Err(status)) => {
                    return Err(match self.failed(RPCTypes::InstallSnapshot, deadline, status) {
                        RPCError::Timeout(timeout) => StreamingError::Timeout(timeout),
                        other => StreamingError::from(other),
                    });
                }
                Ok(Ok(reply)) => reply.into_inner(),
            },
        };
        serde_json::from_slice(&reply.body).map_err(|e| {
            self.unreachable(format_args!(
                "its snapshot reply is not this version's JSON: {e}"
            ))
            .into()
        })
    }

    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(peer_backoff()))
    }
}

/// `data` as a stream of snapshot pieces of at most `chunk_bytes` each, copied one at a time.
fn snapshot_chunks(
    data: Vec<u8>,
    chunk_bytes: usize,
) -> impl futures::Stream<Item = SnapshotPart> + Send + 'static {
    futures::stream::unfold((data, 0usize), move |(data, at)| async move {
        if at >= data.len() {
            return None;
        }
        let end = data.len().min(at + chunk_bytes);
        let part = SnapshotPart {
            part: Some(snapshot_part::Part::Chunk(data[at..end].to_vec())),
        };
        Some((part, (data, end)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_at_50ms_and_grows_to_at_most_1s() {
        let waits: Vec<Duration> = peer_backoff().take(20).collect();
        assert_eq!(waits[0], PEER_BACKOFF_FIRST);
        assert!(waits.windows(2).all(|pair| pair[0] <= pair[1]), "{waits:?}");
        assert!(waits[1] > waits[0], "{waits:?}");
        assert_eq!(*waits.last().unwrap(), PEER_BACKOFF_MAX);
    }

    #[test]
    fn cluster_names_are_checked() {
        assert!(ClusterName::new("palisade").is_ok());
        for (bad, why) in [
            (String::new(), "empty"),
            ("x".repeat(CLUSTER_NAME_BYTES_MAX + 1), "longer"),
            ("a\nb".to_string(), "control"),
        ] {
            let refused = ClusterName::new(bad).unwrap_err().to_string();
            assert!(refused.contains(why), "{refused}");
        }
    }

    /// An append-entries request of `count` entries from index 1, each carrying a lock name of
    /// `name_bytes` bytes.
    fn append_of(count: u64, name_bytes: usize) -> AppendEntriesRequest<C> {
        use openraft::testing::log_id;
        use palisade_core::{Command, Input, RequestId, SessionId, TimeMs, Wait};
        let entries = (1..=count)
            .map(|index| {
                let command = Command::Acquire {
                    session: SessionId::new(1),
                    lock: "x".repeat(name_bytes),
                    request_id: RequestId::new(index),
                    wait: Wait::Try,
                    value: None,
                    mode: palisade_core::Mode::Exclusive,
                };
                crate::raft_types::Entry::new_normal(
                    log_id::<C>(1, 1, index),
                    crate::raft_types::Proposal::Lock(Input {
                        now_ms: TimeMs::ZERO,
                        command,
                    }),
                )
            })
            .collect();
        AppendEntriesRequest {
            vote: VoteOf::<C>::new_committed(1, 1),
            prev_log_id: None,
            entries,
            leader_commit: None,
        }
    }

    #[test]
    fn a_batch_over_the_message_limit_is_cut_to_the_entries_that_fit() {
        let small = encode_append(append_of(3, 10)).unwrap();
        assert!(small.cut.is_none(), "a small batch goes whole");

        let entry_bytes = APPEND_ENTRIES_BYTES_MAX / 5;
        let large = encode_append(append_of(12, entry_bytes)).unwrap();
        assert!(large.body.len() <= APPEND_ENTRIES_BYTES_MAX);
        let sent: AppendEntriesRequest<C> = serde_json::from_slice(&large.body).unwrap();
        assert_eq!(
            sent.entries.len(),
            4,
            "four entries of a fifth of the limit fit"
        );
        assert_eq!(large.cut, Some(sent.entries[3].log_id()));

        let refused = encode_append(append_of(1, APPEND_ENTRIES_BYTES_MAX)).unwrap_err();
        assert!(refused.contains("log entry 1 is too large"), "{refused}");
    }

    /// One-member data directories made before the cluster have their node with the address
    /// `""` in the membership; such a member can only be unreachable until it gets an address.
    #[tokio::test]
    async fn a_member_without_an_address_is_unreachable() {
        let mut network = PeerNetwork::new(ClusterName::new("palisade").unwrap(), 2, 0);
        let mut client = network.new_client(1, &Member::default()).await;
        let vote = VoteRequest::<C>::new(VoteOf::<C>::new(1, 2), None);
        match client
            .vote(vote, RPCOption::new(Duration::from_secs(1)))
            .await
        {
            Err(RPCError::Unreachable(e)) => {
                assert!(
                    e.to_string().contains("node 1 at \"\": it has no address"),
                    "{e}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn member_addresses_are_host_and_port_with_or_without_a_scheme() {
        assert_eq!(
            endpoint("127.0.0.1:7457").unwrap().uri().to_string(),
            "http://127.0.0.1:7457/"
        );
        assert_eq!(
            endpoint("http://node-2.example:7457")
                .unwrap()
                .uri()
                .to_string(),
            "http://node-2.example:7457/"
        );
        let refused = endpoint("not an address").unwrap_err();
        assert!(refused.contains("is not valid"), "{refused}");
    }

    #[tokio::test]
    async fn snapshot_chunks_cover_the_snapshot_in_order() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let parts: Vec<SnapshotPart> = snapshot_chunks(data.clone(), 4096).collect().await;
        let mut joined = Vec::new();
        for part in &parts {
            let Some(snapshot_part::Part::Chunk(chunk)) = &part.part else {
                panic!("not a chunk: {part:?}");
            };
            assert!(chunk.len() <= 4096);
            joined.extend_from_slice(chunk);
        }
        assert_eq!(parts.len(), 3);
        assert_eq!(joined, data);
    }
}
