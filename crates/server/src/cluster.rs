//! The `palisade.v1.Cluster` gRPC service: the membership for operators (`palisade cluster`).
//! Any node answers `Status` from its own view; only the leader changes the membership, and
//! the others answer UNAVAILABLE with the leader's address in metadata, as `Locks` does.

use std::sync::Arc;

use palisade_proto::v1::cluster_server::{Cluster, ClusterServer};
use palisade_proto::v1::{
    AddMemberRequest, ClusterMember, ClusterStatusRequest, ClusterStatusResponse,
    MembershipResponse, RemoveMemberRequest,
};
use tonic::{Request, Response, Status};

use crate::node::{ClusterView, MemberView, MembershipError, Node};
use crate::service::ServiceError;

/// The `Cluster` service of one node.
#[derive(Debug, Clone)]
pub struct GrpcCluster {
    node: Arc<Node>,
}

impl GrpcCluster {
    pub fn new(node: Arc<Node>) -> GrpcCluster {
        GrpcCluster { node }
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
    async fn status(
        &self,
        _request: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
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
        let view = self
            .node
            .remove_member(request.into_inner().id)
            .await
            .map_err(status)?;
        Ok(Response::new(MembershipResponse {
            members: members(&view),
        }))
    }
}
