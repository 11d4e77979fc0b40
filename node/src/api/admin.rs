//! The operator API (`Admin`): status, membership, quotas and the backup stream, served by
//! the same [`ClientApi`] as the client calls.

use idemraft_proto::v1 as pb;
use idemraft_store::{Op, Outcome, QuotaReport};
use openraft::ServerState;
use pb::admin_server::Admin;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};

use super::client::ClientApi;
use super::convert::*;
use crate::error::NodeError;
use crate::wire::{Reply, Request};

#[tonic::async_trait]
impl Admin for ClientApi {
    async fn status(&self, req: GrpcRequest<pb::StatusRequest>) -> Result<GrpcResponse<pb::StatusResponse>, Status> {
        let s = self.node.status();
        let (digest_index, state_digest) = if req.into_inner().with_digest {
            let (index, digest) = self.node.state_digest().await.map_err(|e| e.to_status())?;
            (index, digest.to_vec())
        } else {
            (0, Vec::new())
        };
        let role = match s.state {
            ServerState::Leader => pb::Role::Leader,
            ServerState::Follower => pb::Role::Follower,
            ServerState::Candidate => pb::Role::Candidate,
            ServerState::Learner => pb::Role::Learner,
            ServerState::Shutdown => pb::Role::Shutdown,
        };
        Ok(self.reply(pb::StatusResponse {
            id: s.id,
            role: role as i32,
            term: s.term,
            leader_id: s.leader_id.unwrap_or(0),
            last_log_index: s.last_log_index,
            commit_index: s.applied_index,
            applied_index: s.applied_index,
            members: s.members.into_iter().map(member_to_pb).collect(),
            client_addr: s.client_addr,
            leader_client_addr: s.leader_client_addr.unwrap_or_default(),
            clock_ms: s.clock_ms,
            records: s.records,
            version: env!("CARGO_PKG_VERSION").to_string(),
            state_digest,
            digest_index,
        }))
    }

    async fn members(&self, req: GrpcRequest<pb::MembersRequest>) -> Result<GrpcResponse<pb::MembersResponse>, Status> {
        let (deadline, _) = self.open(req)?;
        self.membership(deadline, Request::Members).await
    }

    async fn add_learner(
        &self,
        req: GrpcRequest<pb::AddLearnerRequest>,
    ) -> Result<GrpcResponse<pb::MembersResponse>, Status> {
        let (deadline, r) = self.open(req)?;
        if r.id == 0 {
            return Err(bad_request("id 0 is not a node id: node ids start at 1"));
        }
        if crate::config::parse_initial_cluster(&format!("{}={}", r.id, r.peer_addr)).is_err() {
            return Err(bad_request(format!("peer_addr '{}' is not HOST:PORT", r.peer_addr)));
        }
        self.membership(deadline, Request::AddLearner { id: r.id, peer_addr: r.peer_addr, wait: r.wait_caught_up })
            .await
    }

    async fn promote(&self, req: GrpcRequest<pb::PromoteRequest>) -> Result<GrpcResponse<pb::MembersResponse>, Status> {
        let (deadline, r) = self.open(req)?;
        let ids = r.ids;
        if ids.is_empty() {
            return Err(bad_request("ids is empty: name the learners to promote"));
        }
        self.membership(deadline, Request::Promote(ids)).await
    }

    async fn remove(&self, req: GrpcRequest<pb::RemoveRequest>) -> Result<GrpcResponse<pb::MembersResponse>, Status> {
        let (deadline, r) = self.open(req)?;
        let ids = r.ids;
        if ids.is_empty() {
            return Err(bad_request("ids is empty: name the members to remove"));
        }
        self.membership(deadline, Request::Remove(ids)).await
    }

    async fn set_quota(
        &self,
        req: GrpcRequest<pb::SetQuotaRequest>,
    ) -> Result<GrpcResponse<pb::QuotaResponse>, Status> {
        let (deadline, r) = self.open(req)?;
        let tenant = match (r.default_quota, r.tenant.is_empty()) {
            (true, true) => None,
            (false, false) => Some(r.tenant),
            (true, false) => {
                return Err(bad_request(format!(
                    "tenant '{}' and default_quota are both set: send one (the default applies to tenants \
                     without a quota of their own)",
                    r.tenant
                )))
            }
            (false, true) => return Err(bad_request("tenant is required: name the tenant, or set default_quota")),
        };
        let op = Op::SetQuota { tenant: tenant.clone(), max_records: r.max_records };
        let call = self.check(op)?;
        match self.run(deadline, call).await? {
            Reply::Outcome(Outcome::QuotaSet { limit, records }) => {
                tracing::info!(tenant = tenant.as_deref().unwrap_or("(default)"), max_records = ?r.max_records, "quota set");
                let report = match tenant {
                    None => QuotaReport { default: limit, tenants: Vec::new() },
                    Some(t) => QuotaReport {
                        default: None,
                        tenants: vec![idemraft_store::QuotaUsage {
                            tenant: t,
                            records,
                            limit,
                            own: r.max_records.is_some(),
                        }],
                    },
                };
                Ok(self.reply(quota_to_pb(report)))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn get_quota(
        &self,
        req: GrpcRequest<pb::GetQuotaRequest>,
    ) -> Result<GrpcResponse<pb::QuotaResponse>, Status> {
        let (deadline, r) = self.open(req)?;
        let tenant = if r.tenant.is_empty() { None } else { Some(r.tenant) };
        if let Some(t) = &tenant {
            idemraft_store::validate::tenant(t).map_err(|e| NodeError::Invalid(e).to_status())?;
        }
        match self.run(deadline, Request::Quota(tenant)).await? {
            Reply::Quota(report) => Ok(self.reply(quota_to_pb(report))),
            other => Err(unexpected(&other)),
        }
    }

    type SnapshotStream = crate::api::snapshot::ChunkStream;

    async fn snapshot(
        &self,
        req: GrpcRequest<pb::SnapshotRequest>,
    ) -> Result<GrpcResponse<Self::SnapshotStream>, Status> {
        let (deadline, _) = self.open(req)?;
        let stream = crate::api::snapshot::serve(&self.node, deadline).await.map_err(|e| e.to_status())?;
        Ok(self.reply(stream))
    }
}
