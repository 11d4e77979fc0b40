//! The peer service (`Raft`): openraft's RPCs, forwarded client calls and pre-votes from the
//! other nodes, each checked for its addressee and its sender's identity.

use idemraft_proto::v1 as pb;
use pb::raft_server::Raft as RaftService;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};

use super::client::deadline_of;
use crate::cluster::identity::CLUSTER_ID_HEADER;
use crate::cluster::node::Node;
use crate::cluster::transport::PeerCall;
use crate::wire::{self, Request};
use tokio::time::Instant;

/// The peer service: Raft RPCs and forwarded calls.
pub struct PeerApi {
    node: Node,
}

impl PeerApi {
    /// Peer service backed by `node`.
    pub fn new(node: Node) -> PeerApi {
        PeerApi { node }
    }

    fn open<T: serde::de::DeserializeOwned>(&self, what: &str, msg: &pb::RaftMessage) -> Result<T, Status> {
        let me = self.node.config().id;
        if msg.target != me {
            return Err(Status::failed_precondition(format!(
                "a {what} meant for node {} reached node {me}: the membership has a wrong address for node {}",
                msg.target, msg.target
            )));
        }
        wire::decode(what, &msg.payload).map_err(Status::invalid_argument)
    }

    fn seal<T: serde::Serialize>(value: &T) -> Result<pb::RaftMessage, Status> {
        let payload = wire::encode(value).map_err(Status::internal)?;
        Ok(pb::RaftMessage { target: 0, payload })
    }

    /// Handles one unary peer message, whichever way it came (gRPC or the peer link):
    /// `cluster` is the sender's cluster id, `deadline` when a forwarded call's caller stops
    /// waiting.
    pub async fn handle(
        &self,
        kind: PeerCall,
        cluster: Option<&str>,
        msg: &pb::RaftMessage,
        deadline: Instant,
    ) -> Result<pb::RaftMessage, Status> {
        let identity = self.node.identity();
        match kind {
            PeerCall::AppendEntries => {
                identity.admit_id(cluster, "append-entries request", true)?;
                let rpc: openraft::raft::AppendEntriesRequest<idemraft_store::TypeConfig> =
                    self.open("append-entries request", msg)?;
                self.node.leader_message(&rpc.vote);
                Self::seal(&self.node.raft().append_entries(rpc).await)
            }
            PeerCall::Vote => {
                identity.admit_id(cluster, "vote request", false)?;
                let rpc = self.open("vote request", msg)?;
                Self::seal(&self.node.raft().vote(rpc).await)
            }
            PeerCall::InstallSnapshot => {
                identity.admit_id(cluster, "install-snapshot request", true)?;
                let rpc: openraft::raft::InstallSnapshotRequest<idemraft_store::TypeConfig> =
                    self.open("install-snapshot request", msg)?;
                self.node.leader_message(&rpc.vote);
                Self::seal(&self.node.raft().install_snapshot(rpc).await)
            }
            PeerCall::PreVote => {
                identity.admit_id(cluster, "pre-vote request", false)?;
                let rpc: wire::PreVote = self.open("pre-vote request", msg)?;
                let reply = self.node.pre_vote(&rpc).await;
                if !reply.granted {
                    tracing::debug!(candidate = rpc.candidate, term = rpc.term, why = %reply.why, "pre-vote refused");
                }
                Self::seal(&reply)
            }
            PeerCall::Forward => {
                identity.admit_id(cluster, "forwarded call", false)?;
                let call: Request = self.open("forwarded call", msg)?;
                Self::seal(&self.node.serve_forwarded(call, deadline).await)
            }
        }
    }

    async fn unary(
        &self,
        kind: PeerCall,
        req: GrpcRequest<pb::RaftMessage>,
    ) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        let deadline = deadline_of(&req, self.node.config().request_timeout);
        let cluster = req.metadata().get(CLUSTER_ID_HEADER).and_then(|v| v.to_str().ok());
        self.handle(kind, cluster, req.get_ref(), deadline).await.map(GrpcResponse::new)
    }
}

#[tonic::async_trait]
impl RaftService for PeerApi {
    async fn append_entries(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.unary(PeerCall::AppendEntries, req).await
    }

    async fn vote(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.unary(PeerCall::Vote, req).await
    }

    async fn install_snapshot(
        &self,
        req: GrpcRequest<pb::RaftMessage>,
    ) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.unary(PeerCall::InstallSnapshot, req).await
    }

    async fn stream_snapshot(
        &self,
        req: GrpcRequest<tonic::Streaming<pb::SnapshotFrame>>,
    ) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.node.identity().admit(req.metadata(), "snapshot stream", true)?;
        let mut frames = req.into_inner();
        let first = frames
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("a snapshot stream without its header frame"))?;
        let me = self.node.config().id;
        if first.target != me {
            return Err(Status::failed_precondition(format!(
                "a snapshot meant for node {} reached node {me}: the membership has a wrong address for node {}",
                first.target, first.target
            )));
        }
        let heard = |vote: &openraft::Vote<u64>| self.node.leader_message(vote);
        crate::cluster::snapshot_stream::receive(self.node.raft(), heard, first, frames).await.map(GrpcResponse::new)
    }

    async fn pre_vote(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.unary(PeerCall::PreVote, req).await
    }

    async fn forward(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.unary(PeerCall::Forward, req).await
    }
}
