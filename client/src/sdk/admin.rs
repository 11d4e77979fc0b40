//! The Admin calls: membership changes, quotas and node status (an admin token when tokens
//! are on), answered in the SDK's own types rather than the wire's.

use std::future::Future;
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::v1::admin_client::AdminClient;
use tonic::Status;

use super::*;

impl Client {
    /// Current membership, from the leader.
    pub async fn members(&self) -> Result<Members, Error> {
        self.admin(|mut a, t| async move { a.members(timed(pb::MembersRequest {}, t)).await }).await.map(Members::from)
    }

    /// Adds a learner.
    pub async fn add_learner(&self, id: u64, peer_addr: &str, wait_caught_up: bool) -> Result<Members, Error> {
        let req = pb::AddLearnerRequest { id, peer_addr: peer_addr.into(), wait_caught_up };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.add_learner(r).await }
        })
        .await
        .map(Members::from)
    }

    /// Promotes learners to voters.
    pub async fn promote(&self, ids: &[u64]) -> Result<Members, Error> {
        let req = pb::PromoteRequest { ids: ids.to_vec() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.promote(r).await }
        })
        .await
        .map(Members::from)
    }

    /// Removes members.
    pub async fn remove(&self, ids: &[u64]) -> Result<Members, Error> {
        let req = pb::RemoveRequest { ids: ids.to_vec() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.remove(r).await }
        })
        .await
        .map(Members::from)
    }

    /// Sets (`Some`) or clears (`None`) the record quota of `tenant`, or with `tenant = None`
    /// the default quota of tenants without their own. Needs an admin token.
    pub async fn set_quota(&self, tenant: Option<&str>, max_records: Option<u64>) -> Result<Quotas, Error> {
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
        .map(Quotas::from)
    }

    /// The quotas and the records each tenant holds: one tenant, or every tenant that holds
    /// records or has a quota. Needs an admin token.
    pub async fn get_quota(&self, tenant: Option<&str>) -> Result<Quotas, Error> {
        let req = pb::GetQuotaRequest { tenant: tenant.unwrap_or_default().to_string() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.get_quota(r).await }
        })
        .await
        .map(Quotas::from)
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

/// The membership, as the leader knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Members {
    /// Every member, voters and learners.
    pub members: Vec<Member>,
    /// The log index at which this membership was decided.
    pub log_index: u64,
}

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Node id.
    pub id: u64,
    /// Peer (Raft) address.
    pub peer_addr: String,
    /// A voter (else a learner).
    pub voter: bool,
}

impl Members {
    /// The voters' ids, ascending.
    pub fn voters(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        ids.sort_unstable();
        ids
    }
}

impl From<pb::Member> for Member {
    fn from(m: pb::Member) -> Member {
        Member { id: m.id, peer_addr: m.peer_addr, voter: m.voter }
    }
}

impl From<pb::MembersResponse> for Members {
    fn from(m: pb::MembersResponse) -> Members {
        Members { members: m.members.into_iter().map(Member::from).collect(), log_index: m.log_index }
    }
}

/// Record quotas and their use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// The default quota of tenants without their own; `None`: no default. A `set_quota` of
    /// one tenant leaves it `None`.
    pub default_max_records: Option<u64>,
    /// Tenants in name order (only the one named, for a `set_quota` of a tenant).
    pub tenants: Vec<TenantQuota>,
}

/// One tenant's quota and use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantQuota {
    /// The tenant.
    pub tenant: String,
    /// Records it holds (expired ones included until swept).
    pub records: u64,
    /// The quota in force for it (its own, else the default); `None`: no limit.
    pub max_records: Option<u64>,
    /// The quota is the tenant's own rather than the default.
    pub own: bool,
}

impl From<pb::QuotaResponse> for Quotas {
    fn from(q: pb::QuotaResponse) -> Quotas {
        Quotas {
            default_max_records: q.default_max_records,
            tenants: q
                .tenants
                .into_iter()
                .map(|t| TenantQuota { tenant: t.tenant, records: t.records, max_records: t.max_records, own: t.own })
                .collect(),
        }
    }
}

/// A node's Raft role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Follows a leader and votes.
    Follower,
    /// Campaigning for leadership.
    Candidate,
    /// The leader of the current term.
    Leader,
    /// Receives the log but does not vote.
    Learner,
    /// Shutting down.
    Shutdown,
    /// Not reported (a node of a newer release may report a role this SDK does not know).
    Unknown,
}

impl Role {
    /// The role's name, lower case, as `idemctl status` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Leader => "leader",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
            Role::Unknown => "unknown",
        }
    }
}

impl From<i32> for Role {
    fn from(role: i32) -> Role {
        match pb::Role::try_from(role) {
            Ok(pb::Role::Follower) => Role::Follower,
            Ok(pb::Role::Candidate) => Role::Candidate,
            Ok(pb::Role::Leader) => Role::Leader,
            Ok(pb::Role::Learner) => Role::Learner,
            Ok(pb::Role::Shutdown) => Role::Shutdown,
            Ok(pb::Role::Unspecified) | Err(_) => Role::Unknown,
        }
    }
}

/// What one node reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// The node's id.
    pub id: u64,
    /// Its role.
    pub role: Role,
    /// Its current term.
    pub term: u64,
    /// The leader it knows, 0 when none.
    pub leader_id: u64,
    /// Index of the last log entry it has.
    pub last_log_index: u64,
    /// Highest index it knows committed (its applied index: openraft 0.9 does not publish the
    /// commit index, and applies as soon as an entry commits).
    pub commit_index: u64,
    /// Index of the last applied entry.
    pub applied_index: u64,
    /// Members as this node knows them.
    pub members: Vec<Member>,
    /// Its client address, as it advertises it.
    pub client_addr: String,
    /// The leader's client address, when known (else empty).
    pub leader_client_addr: String,
    /// Its state machine's clock, Unix ms.
    pub clock_ms: u64,
    /// Records it stores (expired ones until swept).
    pub records: u64,
    /// Its build version.
    pub version: String,
    /// From [`Client::node_digest`]: SHA-256 over the state machine's clock and every record;
    /// equal on replicas at equal `digest_index`. Empty from [`Client::node_status`].
    pub state_digest: Vec<u8>,
    /// From [`Client::node_digest`]: the applied index the digest was taken at.
    pub digest_index: u64,
}

impl NodeStatus {
    /// This node leads.
    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }
}

impl From<pb::StatusResponse> for NodeStatus {
    fn from(s: pb::StatusResponse) -> NodeStatus {
        NodeStatus {
            id: s.id,
            role: Role::from(s.role),
            term: s.term,
            leader_id: s.leader_id,
            last_log_index: s.last_log_index,
            commit_index: s.commit_index,
            applied_index: s.applied_index,
            members: s.members.into_iter().map(Member::from).collect(),
            client_addr: s.client_addr,
            leader_client_addr: s.leader_client_addr,
            clock_ms: s.clock_ms,
            records: s.records,
            version: s.version,
            state_digest: s.state_digest,
            digest_index: s.digest_index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_answers_become_typed_results() {
        let status = NodeStatus::from(pb::StatusResponse {
            id: 2,
            role: pb::Role::Leader as i32,
            members: vec![pb::Member { id: 1, peer_addr: "a:1".into(), voter: true }],
            ..Default::default()
        });
        assert!(status.is_leader());
        assert_eq!(status.members, vec![Member { id: 1, peer_addr: "a:1".into(), voter: true }]);
        assert_eq!(Role::from(99), Role::Unknown, "a role of a newer release");
        assert_eq!(Role::from(pb::Role::Learner as i32).name(), "learner");
        let members = Members::from(pb::MembersResponse {
            members: vec![
                pb::Member { id: 3, peer_addr: "c:1".into(), voter: true },
                pb::Member { id: 4, peer_addr: "d:1".into(), voter: false },
                pb::Member { id: 1, peer_addr: "a:1".into(), voter: true },
            ],
            log_index: 7,
        });
        assert_eq!((members.voters(), members.log_index), (vec![1, 3], 7));
        let quotas = Quotas::from(pb::QuotaResponse {
            default_max_records: Some(10),
            tenants: vec![pb::TenantQuota { tenant: "acme".into(), records: 4, max_records: None, own: false }],
        });
        assert_eq!(quotas.tenants[0], TenantQuota { tenant: "acme".into(), records: 4, max_records: None, own: false });
        assert_eq!(quotas.default_max_records, Some(10));
    }
}
