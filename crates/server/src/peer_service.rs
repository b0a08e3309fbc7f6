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
//! with `FAILED_PRECONDITION`. A snapshot arrives as a stream (a header, then pieces of at most
//! [`SNAPSHOT_CHUNK_BYTES_MAX`]); it is reassembled in memory, never beyond the length its header
//! declares nor beyond [`SNAPSHOT_BYTES_MAX`], and installed only when exactly that many bytes
//! arrived.

use std::io::Cursor;

use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use palisade_proto::raft::v1::raft_server::{Raft, RaftServer};
use palisade_proto::raft::v1::{Envelope, PeerReply, PeerRequest, SnapshotPart, snapshot_part};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status, Streaming};

use crate::limits::{PEER_MESSAGE_BYTES_MAX, SNAPSHOT_BYTES_MAX, SNAPSHOT_CHUNK_BYTES_MAX};
use crate::peer::ClusterName;
use crate::raft_types::{C, PalisadeRaft, SnapshotData};

/// The `palisade.raft.v1.Raft` service of one node.
#[derive(Debug, Clone)]
pub struct RaftPeerServer {
    raft: PalisadeRaft,
    local_id: u64,
    cluster: ClusterName,
}

impl RaftPeerServer {
    /// The peer service of node `local_id` of `cluster`, serving `raft`.
    pub fn new(raft: PalisadeRaft, local_id: u64, cluster: ClusterName) -> RaftPeerServer {
        RaftPeerServer {
            raft,
            local_id,
            cluster,
        }
    }

    /// The tonic service to `add_service` to the node's server, with the peer message limits.
    pub fn into_service(self) -> RaftServer<RaftPeerServer> {
        RaftServer::new(self)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
    }

    /// Refuses a request that is not for this node of this cluster; returns the sender's id.
    fn admit(&self, envelope: Option<Envelope>) -> Result<u64, Status> {
        let Some(envelope) = envelope else {
            return Err(Status::invalid_argument(
                "a peer request must carry an envelope naming its cluster and target node",
            ));
        };
        let Envelope {
            cluster,
            to_node_id,
            from_node_id,
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
        Ok(from_node_id)
    }

    /// The request's openraft message, once the envelope is admitted.
    fn open<T: DeserializeOwned>(&self, request: PeerRequest, what: &str) -> Result<T, Status> {
        self.admit(request.envelope)?;
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

fn reply<T: Serialize>(value: &T) -> Result<Response<PeerReply>, Status> {
    let body = serde_json::to_vec(value)
        .map_err(|e| Status::internal(format!("cannot encode the reply: {e}")))?;
    Ok(Response::new(PeerReply { body }))
}

fn refused_snapshot(why: String) -> Status {
    Status::invalid_argument(format!("snapshot refused: {why}"))
}

#[tonic::async_trait]
impl Raft for RaftPeerServer {
    async fn append_entries(
        &self,
        request: Request<PeerRequest>,
    ) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(request.into_inner(), "append-entries request")?;
        let response = self
            .raft
            .append_entries(rpc)
            .await
            .map_err(|e| self.stopped(e))?;
        reply(&response)
    }

    async fn vote(&self, request: Request<PeerRequest>) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(request.into_inner(), "vote request")?;
        let response = self.raft.vote(rpc).await.map_err(|e| self.stopped(e))?;
        reply(&response)
    }

    async fn pre_vote(&self, request: Request<PeerRequest>) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(request.into_inner(), "pre-vote request")?;
        let response = self.raft.pre_vote(rpc).await.map_err(|e| self.stopped(e))?;
        reply(&response)
    }

    async fn transfer_leader(
        &self,
        request: Request<PeerRequest>,
    ) -> Result<Response<PeerReply>, Status> {
        let rpc = self.open(request.into_inner(), "transfer-leader request")?;
        let response = self
            .raft
            .handle_transfer_leader(rpc)
            .await
            .map_err(|e| self.stopped(e))?;
        reply(&response)
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
        let from = self.admit(header.envelope)?;
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
