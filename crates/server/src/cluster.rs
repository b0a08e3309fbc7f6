//! The `palisade.v1.Cluster` gRPC service: the membership and the signing keys, for operators
//! (`palisade cluster`, `palisade keys`). Any node answers `Status` from its own view; only the
//! leader lists and changes the keys and changes the membership, and the others answer
//! UNAVAILABLE with the leader's address in metadata, as `Locks` does.
//!
//! Once a policy is configured, every call needs the admin right (`grant IDENTITY admin *`):
//! the membership decides who receives the signing key, and a backup holds it. Without a
//! policy, the calls that change the cluster or reveal its key (`Backup`, `AddMember`,
//! `RemoveMember`, `AddKey`, `RotateKey`, `RetireKey`, `RaiseTokenFloor`) need the cluster's
//! admin token ([`crate::admin_token`]); `Status` and `ListKeys`, which show what the web UI and
//! `PublicKey` show anyway, are answered to anyone.

use std::sync::Arc;

use palisade_proto::v1::cluster_server::{Cluster, ClusterServer};
use palisade_proto::v1::{
    AddKeyRequest, AddMemberRequest, BackupChunk, BackupRequest, ClusterMember,
    ClusterStatusRequest, ClusterStatusResponse, KeysResponse, ListKeysRequest, MembershipResponse,
    PublishedKey, RaiseTokenFloorRequest, RaiseTokenFloorResponse, RemoveMemberRequest,
    RetireKeyRequest, RotateKeyRequest,
};
use palisade_sequencer::KeyId;
use tonic::{Request, Response, Status};

use crate::auth::Auth;
use crate::keyring::KeyView;
use crate::limits::BACKUP_CHUNK_BYTES;
use crate::node::{ClusterView, KeyRequest, MemberView, MembershipError, Node};
use crate::service::ServiceError;

/// The `Cluster` service of one node.
#[derive(Debug, Clone)]
pub struct GrpcCluster {
    node: Arc<Node>,
    auth: Arc<Auth>,
    /// Why `AddMember` is refused on this node, if it is: its peers are not authenticated
    /// where they must be (see `PeerAuthentication` in `lib.rs`).
    growth_refused: Option<String>,
}

impl GrpcCluster {
    /// The service refusing every call of a caller without the admin right under `auth`.
    pub fn with_auth(node: Arc<Node>, auth: Arc<Auth>) -> GrpcCluster {
        GrpcCluster {
            node,
            auth,
            growth_refused: None,
        }
    }

    /// Refuses every `AddMember` with `why` (when `Some`).
    pub fn refusing_growth(mut self, why: Option<String>) -> GrpcCluster {
        self.growth_refused = why;
        self
    }

    /// Refuses `request` unless its caller may administer the cluster: the admin right under a
    /// policy; the cluster's admin token without one.
    fn require_admin<T>(&self, request: &Request<T>) -> Result<(), Status> {
        self.auth
            .identity(request)
            .and_then(|caller| self.auth.require_admin(&caller))
            .map_err(|e| palisade_proto::error::status_from_core(&e))
    }

    /// Refuses `request` to look at the cluster (its status, its public keys) unless its caller
    /// has the admin right under a policy; without one, anyone may look.
    fn require_viewer<T>(&self, request: &Request<T>) -> Result<(), Status> {
        self.auth
            .identity(request)
            .and_then(|caller| self.auth.require_viewer(&caller))
            .map_err(|e| palisade_proto::error::status_from_core(&e))
    }

    pub fn into_service(self) -> ClusterServer<GrpcCluster> {
        ClusterServer::new(self)
    }
}

fn member(m: &MemberView) -> ClusterMember {
    ClusterMember {
        id: m.id,
        address: m.addr.clone(),
        kind: if m.voter { "voter" } else { "learner" }.to_string(),
        matched_index: m.matched_index,
    }
}

fn members(view: &ClusterView) -> Vec<ClusterMember> {
    view.members.iter().map(member).collect()
}

fn keys(views: Vec<KeyView>) -> Response<KeysResponse> {
    Response::new(KeysResponse {
        keys: views
            .into_iter()
            .map(|k| PublishedKey {
                key_id: k.public_key.id().to_string(),
                public_key: k.public_key.to_string(),
                signing: k.signing,
            })
            .collect(),
    })
}

fn key_id(text: &str) -> Result<KeyId, Status> {
    KeyId::parse(text).map_err(|e| {
        Status::invalid_argument(format!(
            "key id {:?}: {e}",
            text.chars().take(40).collect::<String>()
        ))
    })
}

fn status(e: MembershipError) -> Status {
    match e {
        MembershipError::NotLeader(e) => crate::grpc::status(ServiceError::from(e)),
        MembershipError::Refused(why) => Status::failed_precondition(why),
        MembershipError::Unavailable(why) => Status::unavailable(why),
        MembershipError::Failed(why) => Status::unknown(why),
    }
}

#[tonic::async_trait]
impl Cluster for GrpcCluster {
    type BackupStream = futures::stream::Iter<std::vec::IntoIter<Result<BackupChunk, Status>>>;

    async fn backup(
        &self,
        request: Request<BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        self.require_admin(&request)?;
        let bytes = self.node.backup().await.map_err(status)?;
        let chunks: Vec<Result<BackupChunk, Status>> = bytes
            .chunks(BACKUP_CHUNK_BYTES)
            .map(|chunk| {
                Ok(BackupChunk {
                    data: chunk.to_vec(),
                })
            })
            .collect();
        Ok(Response::new(futures::stream::iter(chunks)))
    }

    async fn status(
        &self,
        request: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        self.require_viewer(&request)?;
        let view = self.node.cluster_view();
        Ok(Response::new(ClusterStatusResponse {
            node_id: view.node_id,
            role: view.role.to_string(),
            term: view.term,
            leader: view.leader,
            applied_index: view.applied_index,
            committed_index: view.committed_index,
            last_log_index: view.last_log_index,
            members: members(&view),
        }))
    }

    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.require_admin(&request)?;
        if let Some(why) = &self.growth_refused {
            return Err(Status::failed_precondition(why.clone()));
        }
        let AddMemberRequest { id, address } = request.into_inner();
        palisade_proto::validate_member_address(&address).map_err(Status::invalid_argument)?;
        let view = self.node.add_member(id, address).await.map_err(status)?;
        Ok(Response::new(MembershipResponse {
            members: members(&view),
        }))
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.require_admin(&request)?;
        let view = self
            .node
            .remove_member(request.into_inner().id)
            .await
            .map_err(status)?;
        Ok(Response::new(MembershipResponse {
            members: members(&view),
        }))
    }

    async fn list_keys(
        &self,
        request: Request<ListKeysRequest>,
    ) -> Result<Response<KeysResponse>, Status> {
        self.require_viewer(&request)?;
        Ok(keys(self.node.list_keys().await.map_err(status)?))
    }

    async fn add_key(
        &self,
        request: Request<AddKeyRequest>,
    ) -> Result<Response<KeysResponse>, Status> {
        self.require_admin(&request)?;
        let views = self
            .node
            .change_keys(KeyRequest::Add)
            .await
            .map_err(status)?;
        Ok(keys(views))
    }

    async fn rotate_key(
        &self,
        request: Request<RotateKeyRequest>,
    ) -> Result<Response<KeysResponse>, Status> {
        self.require_admin(&request)?;
        let text = request.into_inner().key_id;
        let to = if text.is_empty() {
            None
        } else {
            Some(key_id(&text)?)
        };
        let views = self
            .node
            .change_keys(KeyRequest::Rotate(to))
            .await
            .map_err(status)?;
        Ok(keys(views))
    }

    async fn retire_key(
        &self,
        request: Request<RetireKeyRequest>,
    ) -> Result<Response<KeysResponse>, Status> {
        self.require_admin(&request)?;
        let key = key_id(&request.into_inner().key_id)?;
        let views = self
            .node
            .change_keys(KeyRequest::Retire(key))
            .await
            .map_err(status)?;
        Ok(keys(views))
    }

    async fn raise_token_floor(
        &self,
        request: Request<RaiseTokenFloorRequest>,
    ) -> Result<Response<RaiseTokenFloorResponse>, Status> {
        self.require_admin(&request)?;
        let request = request.into_inner();
        let floor = palisade_core::Token::new(request.floor);
        let last_token = self
            .node
            .raise_token_floor(floor, request.force)
            .await
            .map_err(status)?;
        Ok(Response::new(RaiseTokenFloorResponse {
            last_token: last_token.get(),
        }))
    }
}
