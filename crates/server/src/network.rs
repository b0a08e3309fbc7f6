//! The Raft network of a one-member group: there is nobody to talk to.
//!
//! With a single voter, openraft never opens a connection, so every method reports the peer as
//! unreachable. Replication across machines replaces this module with a gRPC transport; nothing
//! else in the server assumes a single member.

use std::future::Future;

use openraft::OptionalSend;
use openraft::errors::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotOf, VoteOf};

use crate::raft_types::{C, SnapshotData};

#[derive(Debug, Clone, Default)]
pub struct SingleNodeNetwork;

#[derive(Debug)]
pub struct NoPeer;

fn unreachable() -> Unreachable<C> {
    Unreachable::from_string("this node runs a one-member group and has no peers")
}

impl RaftNetworkFactory<C> for SingleNodeNetwork {
    type Network = NoPeer;

    async fn new_client(
        &mut self,
        _target: u64,
        _node: &crate::raft_types::Member,
    ) -> Self::Network {
        NoPeer
    }
}

impl RaftNetworkV2<C> for NoPeer {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<C>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<C>,
        _option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn full_snapshot(
        &mut self,
        _vote: VoteOf<C>,
        _snapshot: SnapshotOf<C, SnapshotData>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        Err(StreamingError::Unreachable(unreachable()))
    }
}
