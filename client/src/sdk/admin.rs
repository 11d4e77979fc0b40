//! The Admin calls: membership changes and quotas (an admin token when tokens are on).

use std::future::Future;
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::v1::admin_client::AdminClient;
use tonic::Status;

use super::*;

impl Client {
    /// Current membership, from the leader.
    pub async fn members(&self) -> Result<pb::MembersResponse, Error> {
        self.admin(|mut a, t| async move { a.members(timed(pb::MembersRequest {}, t)).await }).await
    }

    /// Adds a learner.
    pub async fn add_learner(
        &self,
        id: u64,
        peer_addr: &str,
        wait_caught_up: bool,
    ) -> Result<pb::MembersResponse, Error> {
        let req = pb::AddLearnerRequest { id, peer_addr: peer_addr.into(), wait_caught_up };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.add_learner(r).await }
        })
        .await
    }

    /// Promotes learners to voters.
    pub async fn promote(&self, ids: &[u64]) -> Result<pb::MembersResponse, Error> {
        let req = pb::PromoteRequest { ids: ids.to_vec() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.promote(r).await }
        })
        .await
    }

    /// Removes members.
    pub async fn remove(&self, ids: &[u64]) -> Result<pb::MembersResponse, Error> {
        let req = pb::RemoveRequest { ids: ids.to_vec() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.remove(r).await }
        })
        .await
    }

    /// Sets (`Some`) or clears (`None`) the record quota of `tenant`, or with `tenant = None`
    /// the default quota of tenants without their own. Needs an admin token.
    pub async fn set_quota(&self, tenant: Option<&str>, max_records: Option<u64>) -> Result<pb::QuotaResponse, Error> {
        let req = pb::SetQuotaRequest {
            tenant: tenant.unwrap_or_default().to_string(),
            default_quota: tenant.is_none(),
            max_records,
        };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.set_quota(r).await }
        })
        .await
    }

    /// The quotas and the records each tenant holds: one tenant, or every tenant that holds
    /// records or has a quota. Needs an admin token.
    pub async fn get_quota(&self, tenant: Option<&str>) -> Result<pb::QuotaResponse, Error> {
        let req = pb::GetQuotaRequest { tenant: tenant.unwrap_or_default().to_string() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.get_quota(r).await }
        })
        .await
    }

    pub(super) async fn admin<T, F, Fut>(&self, f: F) -> Result<T, Error>
    where
        F: Fn(AdminClient<Conn>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        // Membership changes wait for a learner to catch up or for joint consensus: give
        // each attempt the whole deadline.
        let deadline = self.deadline();
        self.call_with(deadline, self.inner.config.deadline, |ch, t| f(AdminClient::new(ch), t)).await
    }
}
