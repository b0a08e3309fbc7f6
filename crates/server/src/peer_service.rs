//! The receiving side of the Raft network: the `palisade.raft.v1.Raft` gRPC service, which hands
//! each peer request to the local openraft instance. [`crate::peer`] is the sending side.
//!
//! It is served on the node's one listener, beside `palisade.v1.Locks`:
//!
//! ```text
//! tonic::transport::Server::builder()
//!     .add_service(locks_service)
//!     .add_service(RaftPeerServer::new(raft.clone(), node_id, cluster).into_service())
//! ```
//!
//! Before anything reaches Raft, the request's envelope must name this node's cluster and id:
//! otherwise the sender has a wrong address for the node it means, and the request is refused
//! with `FAILED_PRECONDITION`. A leader streams its log to a follower (`StreamAppend`), and
//! every request on the stream is checked as a unary one is. A snapshot arrives as a stream (a
//! header, then pieces of at most [`SNAPSHOT_CHUNK_BYTES_MAX`]); it is reassembled in memory,
//! never beyond the length its header declares nor beyond [`SNAPSHOT_BYTES_MAX`], and installed
//! only when exactly that many bytes arrived.

use std::io::Cursor;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use openraft::async_runtime::WatchReceiver;
use openraft::raft::AppendEntriesRequest;
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use palisade_core::canary::{self, Canary};
use palisade_proto::raft::v1::raft_server::{Raft, RaftServer};
use palisade_proto::raft::v1::{
    AdmitReply, AdmitRequest, Envelope, PeerReply, PeerRequest, SnapshotPart, snapshot_part,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status, Streaming};

use crate::limits::{PEER_MESSAGE_BYTES_MAX, SNAPSHOT_BYTES_MAX, SNAPSHOT_CHUNK_BYTES_MAX};
use crate::peer::ClusterName;
use crate::raft_types::{C, SnapshotData};
use crate::state_machine::PalisadeRaft;

/// What a node does when it is admitted to a cluster (see `Admit` in `palisade_raft.proto`).
pub trait Admission: Send + Sync + 'static {
    /// Takes the cluster's signing key (a 32-byte Ed25519 seed) from node `from`; returns this
    /// node's incarnation, or why it refuses.
    fn admit(&self, from: u64, signing_key: [u8; 32]) -> Result<u64, String>;

    /// Whether node `id` was a member of this cluster and was removed.
    fn was_removed(&self, id: u64) -> bool;

    /// The token floor this node keeps because it cut a damaged tail off its log and that is
    /// not applied yet (see `token-floor-pending`): every vote it casts carries it. An error
    /// (the file cannot be read) refuses the vote.
    fn pending_token_floor(&self) -> Result<Option<crate::counters::PendingFloor>, String>;
}

/// Who sends a Raft request, for [`RaftPeerServer::check_sender`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sender {
    /// Entries and snapshots: a leader.
    Leader,
    /// Votes, pre-votes and leadership transfers: only a member may ask.
    Candidate,
}

/// The `palisade.raft.v1.Raft` service of one node.
#[derive(Clone)]
pub struct RaftPeerServer {
    raft: PalisadeRaft,
    local_id: u64,
    local_incarnation: u64,
    cluster: ClusterName,
    admission: Option<Arc<dyn Admission>>,
    /// True once the node is stopping: append streams then end, so that a graceful shutdown
    /// does not wait for the leader's stream, which never ends by itself.
    stopping: Option<tokio::sync::watch::Receiver<bool>>,
}

impl std::fmt::Debug for RaftPeerServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftPeerServer")
            .field("local_id", &self.local_id)
            .field("local_incarnation", &self.local_incarnation)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl RaftPeerServer {
    /// The peer service of node `local_id` of `cluster`, serving `raft`.
    pub fn new(raft: PalisadeRaft, local_id: u64, cluster: ClusterName) -> RaftPeerServer {
        RaftPeerServer {
            raft,
            local_id,
            local_incarnation: 0,
            cluster,
            admission: None,
            stopping: None,
        }
    }

    /// Ends every append stream once `stopping` turns true (`Node::stopping_signal`).
    pub fn with_stopping(mut self, stopping: tokio::sync::watch::Receiver<bool>) -> RaftPeerServer {
        self.stopping = Some(stopping);
        self
    }

    /// Refuse requests addressed to another incarnation of this node id, and answer `Admit`
    /// through `admission`.
    pub fn with_identity(
        mut self,
        incarnation: u64,
        admission: Arc<dyn Admission>,
    ) -> RaftPeerServer {
        self.local_incarnation = incarnation;
        self.admission = Some(admission);
        self
    }

    /// The tonic service to `add_service` to the node's server, with the peer message limits.
    pub fn into_service(self) -> RaftServer<RaftPeerServer> {
        RaftServer::new(self)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
    }

    /// Refuses a Raft request that is not for this node of this cluster, or not from a member
    /// as this node knows it; returns the sender's id.
    fn check_envelope(&self, envelope: Option<Envelope>, sender: Sender) -> Result<u64, Status> {
        let (from, from_incarnation, to_incarnation) = self.addressed_here(envelope)?;
        self.check_sender(from, from_incarnation, to_incarnation, sender)?;
        Ok(from)
    }

    /// An `Admit` comes from a node this one may not know yet: only the address is checked.
    fn admit_envelope(&self, envelope: Option<Envelope>) -> Result<u64, Status> {
        Ok(self.addressed_here(envelope)?.0)
    }

    /// Refuses a request that is not for this incarnation of this node of this cluster;
    /// returns the sender's id and incarnation, and the incarnation it names for this node.
    fn addressed_here(&self, envelope: Option<Envelope>) -> Result<(u64, u64, u64), Status> {
        let Some(envelope) = envelope else {
            return Err(Status::invalid_argument(
                "a peer request must carry an envelope naming its cluster and target node",
            ));
        };
        let Envelope {
            cluster,
            to_node_id,
            from_node_id,
            to_incarnation,
            from_incarnation,
        } = envelope;
        if cluster != self.cluster.as_str() {
            tracing::warn!(%from_node_id, %cluster, "refused a peer request for another cluster");
            return Err(Status::failed_precondition(format!(
                "this is node {} of cluster {:?}, not of cluster {cluster:?}: node {from_node_id} \
                 has an address of this node among its members; check its cluster name and \
                 membership",
                self.local_id,
                self.cluster.as_str(),
            )));
        }
        if to_node_id != self.local_id {
            tracing::warn!(%from_node_id, %to_node_id, "refused a peer request for another node");
            return Err(Status::failed_precondition(format!(
                "this is node {}, not node {to_node_id}: node {from_node_id}'s membership gives \
                 node {to_node_id} this node's address",
                self.local_id,
            )));
        }
        if to_incarnation != 0
            && self.local_incarnation != 0
            && to_incarnation != self.local_incarnation
            && !canary::active(Canary::NodeIdReuse)
        {
            tracing::error!(
                %from_node_id,
                "refused a peer request for an earlier incarnation of this node id: this data \
                 directory is not the one the cluster admitted as node {}; it was wiped or \
                 replaced. Start it under a new --node-id and add it with `palisade cluster add`",
                self.local_id
            );
            return Err(Status::failed_precondition(format!(
                "node {} at this address has a new data directory (incarnation {}, the \
                 membership records {to_incarnation}): a wiped node cannot rejoin under its old \
                 id; remove node {} and add the new directory under a new id",
                self.local_id, self.local_incarnation, self.local_id
            )));
        }
        Ok((from_node_id, from_incarnation, to_incarnation))
    }

    /// Once this node knows a membership, refuses a sender outside it (a node that was never
    /// added, a removed one, or anyone claiming an id it made up), a sender claiming to be this
    /// node, and an envelope whose incarnations are not the ones the membership records for
    /// the sender and for this node (0, "unknown", included, once a real one is recorded).
    /// A node that knows no membership yet (a new node waiting to be added) accepts any
    /// sender: only the leader that is adding it sends to it.
    ///
    /// A leader this node does not know is refused too, although this node may merely lag
    /// behind the entry that added it: entries are the whole replicated state, and a sender
    /// that is no member must not write them. Such a member catches up once a leader it knows
    /// leads again (see docs/cluster.md).
    fn check_sender(
        &self,
        from: u64,
        from_incarnation: u64,
        to_incarnation: u64,
        sender: Sender,
    ) -> Result<(), Status> {
        let membership = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .clone();
        let membership = membership.membership();
        if membership.voter_ids().next().is_none() {
            return Ok(());
        }
        if from == self.local_id {
            tracing::warn!(%from, "refused a Raft request claiming to come from this node itself");
            return Err(Status::failed_precondition(format!(
                "node {from} does not send Raft requests to itself: the sender is not node {from}"
            )));
        }
        let recorded_here = membership
            .get_node(&self.local_id)
            .map_or(0, |me| me.incarnation);
        if recorded_here != 0
            && to_incarnation != recorded_here
            && !canary::active(Canary::NodeIdReuse)
        {
            tracing::warn!(%from, ?sender, "refused a Raft request without this node's incarnation as the membership records it");
            return Err(Status::failed_precondition(format!(
                "the request names incarnation {to_incarnation} of node {}, but the membership \
                 records {recorded_here}: the sender's membership is not this cluster's",
                self.local_id
            )));
        }
        match membership.get_node(&from) {
            None if self.admission.as_ref().is_some_and(|a| a.was_removed(from)) => {
                let mut status = Status::failed_precondition(format!(
                    "node {from} was removed from this cluster; it must stop"
                ));
                status
                    .metadata_mut()
                    .insert(crate::peer::REMOVED_HEADER, from.into());
                Err(status)
            }
            None => {
                tracing::warn!(%from, ?sender, "refused a Raft request from a node outside the membership");
                Err(Status::failed_precondition(format!(
                    "node {from} is not a member of this cluster as node {} knows it (removed, \
                     never added, or added while this node was away)",
                    self.local_id
                )))
            }
            Some(member)
                if member.incarnation != 0
                    && member.incarnation != from_incarnation
                    && !canary::active(Canary::NodeIdReuse) =>
            {
                Err(Status::failed_precondition(format!(
                    "node {from} has a new data directory (incarnation {from_incarnation}, the \
                     membership records {}): a wiped node cannot take part under its old id",
                    member.incarnation
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// The request's openraft message, once the envelope is admitted.
    fn open<T: DeserializeOwned>(
        &self,
        request: PeerRequest,
        what: &str,
        sender: Sender,
    ) -> Result<T, Status> {
        self.check_envelope(request.envelope, sender)?;
        decode(&request.body, what)
    }

    fn stopped(&self, error: impl std::fmt::Display) -> Status {
        Status::unavailable(format!(
            "raft on node {} has stopped: {error}",
            self.local_id
        ))
    }
}

fn decode<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, Status> {
    serde_json::from_slice(body).map_err(|e| {
        Status::invalid_argument(format!(
            "the {what} is not this version's JSON (is the sender another openraft version?): {e}"
        ))
    })
}

fn encode_reply<T: Serialize>(value: &T) -> Result<PeerReply, Status> {
    let body = serde_json::to_vec(value)
        .map_err(|e| Status::internal(format!("cannot encode the reply: {e}")))?;
    Ok(PeerReply { body })
}

fn reply<T: Serialize>(value: &T) -> Result<Response<PeerReply>, Status> {
    encode_reply(value).map(Response::new)
}

/// The replies of a [`Raft::stream_append`] call.
pub type AppendReplies =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<PeerReply, Status>> + Send + 'static>>;

fn refused_snapshot(why: String) -> Status {
    Status::invalid_argument(format!("snapshot refused: {why}"))
}

#[tonic::async_trait]
impl Raft for RaftPeerServer {
    async fn append_entries(
        &self,
        request: Request<PeerRequest>,
    ) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(
            request.into_inner(),
            "append-entries request",
            Sender::Leader,
        )?;
        let response = self
            .raft
            .append_entries(rpc)
            .await
            .map_err(|e| self.stopped(e))?;
        reply(&response)
    }

    type StreamAppendStream = AppendReplies;

    /// A leader's stream of append-entries requests, handed to openraft's pipelined
    /// [`stream_append`](openraft::Raft::stream_append) as they arrive; its results go back in
    /// order. Each request is checked as [`Self::append_entries`] checks one: the first refused
    /// or unreadable request ends the input, its predecessors are still answered, and the stream
    /// ends with the refusal.
    async fn stream_append(
        &self,
        request: Request<Streaming<PeerRequest>>,
    ) -> Result<Response<AppendReplies>, Status> {
        // Why the stream ends before the leader ends it: the first refused request, or this
        // node stopping (UNAVAILABLE, so that the leader backs off). Sent after the replies.
        let ending = Arc::new(Mutex::new(None::<Status>));
        let end_with = |ending: &Mutex<Option<Status>>, status: Status| {
            ending
                .lock()
                .expect("stream ending poisoned")
                .get_or_insert(status);
        };
        let requests = {
            let ending = ending.clone();
            let server = self.clone();
            futures::stream::unfold(Some(request.into_inner()), move |stream| {
                let ending = ending.clone();
                let server = server.clone();
                async move {
                    let mut stream = stream?;
                    let opened = match stream.message().await {
                        Ok(Some(request)) => server.open::<AppendEntriesRequest<C>>(
                            request,
                            "append-entries request",
                            Sender::Leader,
                        ),
                        Ok(None) => return None,
                        Err(status) => Err(status),
                    };
                    match opened {
                        Ok(rpc) => Some((rpc, Some(stream))),
                        Err(status) => {
                            end_with(&ending, status);
                            None
                        }
                    }
                }
            })
        };
        let stopping = {
            let ending = ending.clone();
            let stopping = self.stopping.clone();
            let local_id = self.local_id;
            async move {
                let Some(mut stopping) = stopping else {
                    return std::future::pending().await;
                };
                if stopping.wait_for(|stopping| *stopping).await.is_err() {
                    return std::future::pending().await;
                }
                end_with(
                    &ending,
                    Status::unavailable(format!("node {local_id} is stopping")),
                );
            }
        };
        let server = self.clone();
        let replies = self
            .raft
            .stream_append(requests)
            .map(move |result| match result {
                Ok(result) => encode_reply(&result),
                Err(fatal) => Err(server.stopped(fatal)),
            })
            .take_until(stopping)
            .chain(
                futures::stream::once(async move {
                    ending.lock().expect("stream ending poisoned").take()
                })
                .filter_map(|ending| async move { ending.map(Err) }),
            );
        Ok(Response::new(Box::pin(replies)))
    }

    async fn vote(&self, request: Request<PeerRequest>) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(request.into_inner(), "vote request", Sender::Candidate)?;
        // Read before the vote is cast: a node that cannot tell its floor gives no vote.
        let floor = match &self.admission {
            Some(admission) => admission
                .pending_token_floor()
                .map_err(|why| Status::unavailable(format!("no vote: {why}")))?,
            None => None,
        };
        let response = self.raft.vote(rpc).await.map_err(|e| self.stopped(e))?;
        let mut response = reply(&response)?;
        if let Some(floor) = floor {
            response
                .metadata_mut()
                .insert(crate::peer::TOKEN_FLOOR_HEADER, floor.token.get().into());
            if let Some(session) = floor.session {
                response
                    .metadata_mut()
                    .insert(crate::peer::SESSION_FLOOR_HEADER, session.get().into());
            }
        }
        Ok(response)
    }

    async fn pre_vote(&self, request: Request<PeerRequest>) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(request.into_inner(), "pre-vote request", Sender::Candidate)?;
        let response = self.raft.pre_vote(rpc).await.map_err(|e| self.stopped(e))?;
        reply(&response)
    }

    async fn transfer_leader(
        &self,
        request: Request<PeerRequest>,
    ) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(
            request.into_inner(),
            "transfer-leader request",
            Sender::Candidate,
        )?;
        let response = self
            .raft
            .handle_transfer_leader(rpc)
            .await
            .map_err(|e| self.stopped(e))?;
        reply(&response)
    }

    async fn admit(&self, request: Request<AdmitRequest>) -> Result<Response<AdmitReply>, Status> {
        let request = request.into_inner();
        let from = self.admit_envelope(request.envelope)?;
        let Some(admission) = &self.admission else {
            return Err(Status::failed_precondition(format!(
                "node {} does not take admissions",
                self.local_id
            )));
        };
        let key: [u8; 32] = request.signing_key.as_slice().try_into().map_err(|_| {
            Status::invalid_argument(format!(
                "a signing key is 32 bytes, not {}",
                request.signing_key.len()
            ))
        })?;
        let incarnation = admission
            .admit(from, key)
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(AdmitReply {
            node_id: self.local_id,
            incarnation,
        }))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotPart>>,
    ) -> Result<Response<PeerReply>, Status> {
        let mut parts = request.into_inner();
        let header = match parts.message().await? {
            Some(SnapshotPart {
                part: Some(snapshot_part::Part::Header(header)),
            }) => header,
            Some(_) => {
                return Err(refused_snapshot(
                    "the stream must begin with the snapshot's header".to_string(),
                ));
            }
            None => return Err(refused_snapshot("the stream is empty".to_string())),
        };
        let from = self.check_envelope(header.envelope, Sender::Leader)?;
        let declared = usize::try_from(header.snapshot_bytes)
            .ok()
            .filter(|bytes| *bytes <= SNAPSHOT_BYTES_MAX)
            .ok_or_else(|| {
                refused_snapshot(format!(
                    "it is {} bytes, above the {SNAPSHOT_BYTES_MAX} bytes a node accepts",
                    header.snapshot_bytes
                ))
            })?;
        let vote: VoteOf<C> = decode(&header.vote, "snapshot's vote")?;
        let meta: SnapshotMetaOf<C> = decode(&header.meta, "snapshot's meta")?;
        let mut data = Vec::new();
        while let Some(part) = parts.message().await? {
            let chunk = match part.part {
                Some(snapshot_part::Part::Chunk(chunk)) => chunk,
                Some(snapshot_part::Part::Header(_)) => {
                    return Err(refused_snapshot(
                        "a second header in one stream".to_string(),
                    ));
                }
                None => return Err(refused_snapshot("an empty part".to_string())),
            };
            if chunk.len() > SNAPSHOT_CHUNK_BYTES_MAX {
                return Err(refused_snapshot(format!(
                    "a piece of {} bytes, above the {SNAPSHOT_CHUNK_BYTES_MAX} bytes of one piece",
                    chunk.len()
                )));
            }
            if data.len() + chunk.len() > declared {
                return Err(refused_snapshot(format!(
                    "more than the {declared} bytes its header declares"
                )));
            }
            data.extend_from_slice(&chunk);
        }
        if data.len() != declared {
            return Err(refused_snapshot(format!(
                "the stream ended after {} of the {declared} bytes its header declares",
                data.len()
            )));
        }
        tracing::info!(%from, bytes = declared, last_log_id = ?meta.last_log_id, "installing a snapshot");
        let snapshot = SnapshotOf::<C, SnapshotData> {
            meta,
            snapshot: Cursor::new(data),
        };
        let response = self
            .raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| self.stopped(e))?;
        reply(&response)
    }
}
