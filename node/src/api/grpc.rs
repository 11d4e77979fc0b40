//! The gRPC edge: the client API (`Idempotency`), the operator API (`Admin`) and the peer
//! service (`Raft`). Requests are checked here against the node's configured limits before
//! anything is proposed, so a bad request costs no log entry; each becomes a [`Request`] and
//! goes to [`Node::call`]; replies and errors are translated back.

use std::sync::Arc;
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::{LEADER_ADDR_HEADER, SERVED_BY_HEADER};
use idemraft_store::{
    Fingerprint, Grant, ListPage, ListQuery, Op, Outcome, QuotaReport, RecordKey, RecordState, RecordView, Response,
    Token,
};
use openraft::ServerState;
use pb::admin_server::Admin;
use pb::idempotency_server::Idempotency;
use pb::raft_server::Raft as RaftService;
use tokio::time::Instant;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};

use crate::cluster::node::Node;
use crate::error::NodeError;
use crate::ops::metrics::Metrics;
use crate::wire::{self, MemberInfo, Reply, Request};

/// The default page size of List, and its bound.
const LIST_DEFAULT: u32 = 100;
const LIST_MAX: u32 = 1000;
/// Default Wait timeout.
const WAIT_DEFAULT_MS: u64 = 5_000;

/// Parses a `grpc-timeout` header value (`<digits><unit>`, unit one of H M S m u n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    // ASCII only, so splitting off the last byte cannot cut a character in two.
    if !value.is_ascii() {
        return None;
    }
    let (num, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn deadline_of<T>(req: &GrpcRequest<T>, default: Duration) -> Instant {
    let given = req.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(parse_grpc_timeout);
    Instant::now() + given.unwrap_or(default).min(Duration::from_secs(600))
}

/// The client and admin services of one node.
#[derive(Clone)]
pub struct ClientApi {
    node: Node,
    metrics: Arc<Metrics>,
}

impl ClientApi {
    /// Services backed by `node`, counting outcomes in `metrics`.
    pub fn new(node: Node, metrics: Arc<Metrics>) -> ClientApi {
        ClientApi { node, metrics }
    }

    /// The call's deadline and its message, taken by value: a Complete carries a response body,
    /// which is not worth copying. The message's tenant fields are bound to the caller's
    /// credential first (`auth::bind`), so every record key built from it has the right tenant.
    fn open<T: crate::security::auth::Tenanted>(&self, req: GrpcRequest<T>) -> Result<(Instant, T), Status> {
        let req = crate::security::auth::bind(req)?;
        Ok((deadline_of(&req, self.node.config().request_timeout), req.into_inner()))
    }

    async fn run(&self, deadline: Instant, call: Request) -> Result<Reply, Status> {
        self.node.call(call, deadline).await.map_err(|e| {
            let status = e.to_status();
            tracing::debug!(code = ?status.code(), error = %e, "call refused");
            status
        })
    }

    fn reply<T>(&self, body: T) -> GrpcResponse<T> {
        let mut r = GrpcResponse::new(body);
        if let Ok(v) = self.node.config().id.to_string().parse() {
            r.metadata_mut().insert(SERVED_BY_HEADER, v);
        }
        if let Some(v) = self.node.leader_hint().and_then(|a| a.parse().ok()) {
            r.metadata_mut().insert(LEADER_ADDR_HEADER, v);
        }
        r
    }

    fn lease(&self, lease_ms: u64) -> u64 {
        if lease_ms == 0 {
            self.node.config().default_lease.as_millis() as u64
        } else {
            lease_ms
        }
    }

    /// Checks an operation against this node's limits: refused here, it never costs a log entry.
    fn check(&self, op: Op) -> Result<Request, Status> {
        self.node.config().limits.check_op(&op).map_err(|e| NodeError::Invalid(e).to_status())?;
        Ok(Request::Write(op))
    }

    async fn write(&self, deadline: Instant, op: Op) -> Result<GrpcResponse<pb::Outcome>, Status> {
        let rpc = crate::ops::metrics::op_rpc(&op);
        let call = self.check(op)?;
        match self.run(deadline, call).await? {
            Reply::Outcome(o) => {
                self.metrics.record_outcome(rpc, &o);
                if let Outcome::QuotaExceeded { tenant, limit, records } = o {
                    // Refused at apply (identically on every replica), so it is a decision,
                    // but one the caller cannot act on as an outcome: an error naming the fix.
                    let e = NodeError::QuotaExceeded { tenant, limit, records };
                    tracing::info!(error = %e, "claim refused by the record quota");
                    return Err(e.to_status());
                }
                Ok(self.reply(outcome_to_pb(o)))
            }
            other => Err(unexpected(&other)),
        }
    }
}

fn quota_to_pb(r: QuotaReport) -> pb::QuotaResponse {
    pb::QuotaResponse {
        default_max_records: r.default,
        tenants: r
            .tenants
            .into_iter()
            .map(|u| pb::TenantQuota { tenant: u.tenant, records: u.records, max_records: u.limit, own: u.own })
            .collect(),
    }
}

fn unexpected(reply: &Reply) -> Status {
    Status::internal(format!("the leader answered with the wrong kind of reply: {reply:?}"))
}

fn bad_request(msg: impl Into<String>) -> Status {
    NodeError::BadRequest(msg.into()).to_status()
}

fn record_key(id: Option<pb::RecordId>) -> Result<RecordKey, Status> {
    let id = id.ok_or_else(|| bad_request("id is required: send the record's scope and key"))?;
    crate::ops::instrument::tag(&id.scope, &id.key);
    let tenant = if id.tenant.is_empty() { "default".to_string() } else { id.tenant };
    RecordKey::new(tenant, id.scope, id.key).map_err(|e| NodeError::Invalid(e).to_status())
}

fn fingerprint(bytes: &[u8]) -> Result<Option<Fingerprint>, Status> {
    match bytes.len() {
        0 => Ok(None),
        32 => {
            let mut f = [0u8; 32];
            f.copy_from_slice(bytes);
            Ok(Some(f))
        }
        n => Err(bad_request(format!(
            "fingerprint is {n} bytes: a fingerprint must be a 32-byte SHA-256 digest, or empty for none"
        ))),
    }
}

fn response_from_pb(r: pb::StoredResponse) -> Response {
    Response { status: r.status, headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(), body: r.body }
}

fn response_to_pb(r: Response) -> pb::StoredResponse {
    pb::StoredResponse {
        status: r.status,
        headers: r.headers.into_iter().map(|(name, value)| pb::Header { name, value }).collect(),
        body: r.body,
    }
}

fn state_to_pb(s: RecordState) -> pb::RecordState {
    match s {
        RecordState::InProgress => pb::RecordState::InProgress,
        RecordState::Completed => pb::RecordState::Completed,
        RecordState::Failed => pb::RecordState::Failed,
    }
}

fn grant_to_pb(g: Grant) -> pb::Acquired {
    pb::Acquired {
        token: g.token.0,
        attempt: g.attempt,
        takeover: g.takeover,
        lease_expires_ms: g.lease_expires_ms,
        expires_ms: g.expires_ms,
        recovery_point: g.recovery_point,
        checkpoint: g.checkpoint,
    }
}

/// Translates a state machine outcome for the wire.
pub fn outcome_to_pb(o: Outcome) -> pb::Outcome {
    use pb::outcome::Result as R;
    let result = match o {
        Outcome::Acquired(g) => R::Acquired(grant_to_pb(g)),
        Outcome::Replay { token, completed_ms, response } => {
            R::Replay(pb::Replay { token: token.0, completed_ms, response: Some(response_to_pb(response)) })
        }
        Outcome::InProgress { lease_expires_ms, retry_after_ms } => {
            R::InProgress(pb::InProgress { lease_expires_ms, retry_after_ms })
        }
        Outcome::Mismatch => R::Mismatch(pb::Mismatch {}),
        Outcome::StaleToken { current } => R::StaleToken(pb::StaleToken { current: current.0 }),
        Outcome::NotFound => R::NotFound(pb::NotFound {}),
        Outcome::WrongState { state } => R::WrongState(pb::WrongState { state: state_to_pb(state) as i32 }),
        Outcome::Completed { token } => R::Completed(pb::Completed { token: token.0 }),
        Outcome::Failed { token, retryable } => R::Failed(pb::Failed { token: token.0, retryable }),
        Outcome::LeaseExtended { token, lease_expires_ms } => {
            R::LeaseExtended(pb::LeaseExtended { token: token.0, lease_expires_ms })
        }
        // Sweep, Resume and Invalid never reach a client: the first two are the leader's own
        // commands, and Invalid is turned into INVALID_ARGUMENT before this point, as a quota
        // refusal is into FAILED_PRECONDITION; QuotaSet answers the Admin API's SetQuota.
        Outcome::Swept { .. }
        | Outcome::Resumed { .. }
        | Outcome::Invalid(_)
        | Outcome::QuotaExceeded { .. }
        | Outcome::QuotaSet { .. } => return pb::Outcome { result: None },
    };
    pb::Outcome { result: Some(result) }
}

fn id_to_pb(id: &RecordKey) -> pb::RecordId {
    pb::RecordId { tenant: id.tenant().to_string(), scope: id.scope().to_string(), key: id.key().to_string() }
}

/// Translates a record view for the wire.
pub fn record_to_pb(v: RecordView) -> pb::Record {
    let r = v.record;
    pb::Record {
        id: Some(id_to_pb(&v.id)),
        state: state_to_pb(r.state) as i32,
        token: r.token.0,
        owner: r.owner,
        attempt: r.attempt,
        taken_over: r.taken_over,
        lease_expires_ms: r.lease_expires_ms,
        created_ms: r.created_ms,
        updated_ms: r.updated_ms,
        completed_ms: r.completed_ms.unwrap_or(0),
        expires_ms: r.expires_ms,
        retention_ms: r.retention_ms,
        recovery_point: r.recovery_point,
        checkpoint: r.checkpoint,
        response: r.response.map(response_to_pb),
        fingerprint: r.fingerprint.map(|f| f.to_vec()).unwrap_or_default(),
    }
}

fn list_to_pb(page: ListPage) -> pb::ListResponse {
    pb::ListResponse {
        next_after: page.next_after.as_ref().map(id_to_pb),
        records: page.records.into_iter().map(record_to_pb).collect(),
    }
}

fn member_to_pb(m: MemberInfo) -> pb::Member {
    pb::Member { id: m.id, peer_addr: m.peer_addr, voter: m.voter }
}

#[tonic::async_trait]
impl Idempotency for ClientApi {
    async fn claim(&self, req: GrpcRequest<pb::ClaimRequest>) -> Result<GrpcResponse<pb::Outcome>, Status> {
        let (deadline, r) = self.open(req)?;
        let id = record_key(r.id)?;
        let ttl_ms = if r.ttl_ms == 0 { self.node.config().ttl_for(id.scope()).as_millis() as u64 } else { r.ttl_ms };
        let op = Op::Claim {
            fingerprint: fingerprint(&r.fingerprint)?,
            owner: r.owner,
            lease_ms: self.lease(r.lease_ms),
            ttl_ms,
            allow_takeover: r.allow_takeover,
            id,
        };
        self.write(deadline, op).await
    }

    async fn complete(&self, req: GrpcRequest<pb::CompleteRequest>) -> Result<GrpcResponse<pb::Outcome>, Status> {
        let (deadline, r) = self.open(req)?;
        let response =
            r.response.ok_or_else(|| bad_request("response is required: send the response to store and replay"))?;
        let op = Op::Complete { id: record_key(r.id)?, token: Token(r.token), response: response_from_pb(response) };
        self.write(deadline, op).await
    }

    async fn fail(&self, req: GrpcRequest<pb::FailRequest>) -> Result<GrpcResponse<pb::Outcome>, Status> {
        let (deadline, r) = self.open(req)?;
        let op = Op::Fail {
            id: record_key(r.id)?,
            token: Token(r.token),
            retryable: r.retryable,
            response: r.response.map(response_from_pb),
        };
        self.write(deadline, op).await
    }

    async fn extend_lease(
        &self,
        req: GrpcRequest<pb::ExtendLeaseRequest>,
    ) -> Result<GrpcResponse<pb::Outcome>, Status> {
        let (deadline, r) = self.open(req)?;
        let op = Op::ExtendLease { id: record_key(r.id)?, token: Token(r.token), lease_ms: self.lease(r.lease_ms) };
        self.write(deadline, op).await
    }

    async fn checkpoint(&self, req: GrpcRequest<pb::CheckpointRequest>) -> Result<GrpcResponse<pb::Outcome>, Status> {
        let (deadline, r) = self.open(req)?;
        let op = Op::Checkpoint {
            id: record_key(r.id)?,
            token: Token(r.token),
            recovery_point: r.recovery_point,
            data: r.data,
            lease_ms: self.lease(r.lease_ms),
        };
        self.write(deadline, op).await
    }

    async fn takeover(&self, req: GrpcRequest<pb::TakeoverRequest>) -> Result<GrpcResponse<pb::Outcome>, Status> {
        let (deadline, r) = self.open(req)?;
        let op =
            Op::Takeover { id: record_key(r.id)?, owner: r.owner, force: r.force, lease_ms: self.lease(r.lease_ms) };
        self.write(deadline, op).await
    }

    async fn get(&self, req: GrpcRequest<pb::GetRequest>) -> Result<GrpcResponse<pb::GetResponse>, Status> {
        let (deadline, r) = self.open(req)?;
        let id = record_key(r.id)?;
        match self.run(deadline, Request::Get(id)).await? {
            Reply::Record(r) => Ok(self.reply(pb::GetResponse { record: r.map(record_to_pb) })),
            other => Err(unexpected(&other)),
        }
    }

    async fn wait(&self, req: GrpcRequest<pb::WaitRequest>) -> Result<GrpcResponse<pb::WaitResponse>, Status> {
        let req = crate::security::auth::bind(req)?;
        let asked = req.get_ref().timeout_ms;
        let timeout_ms = if asked == 0 { WAIT_DEFAULT_MS } else { asked.min(600_000) };
        // The call's own deadline bounds the wait too; without one, leave room for the wait.
        let deadline = deadline_of(&req, Duration::from_millis(timeout_ms) + Duration::from_secs(1));
        let id = record_key(req.into_inner().id)?;
        match self.node.call(Request::Wait { id, timeout_ms }, deadline).await.map_err(|e| e.to_status())? {
            Reply::Waited { record, timed_out } => {
                Ok(self.reply(pb::WaitResponse { record: record.map(record_to_pb), timed_out }))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn list(&self, req: GrpcRequest<pb::ListRequest>) -> Result<GrpcResponse<pb::ListResponse>, Status> {
        let (deadline, r) = self.open(req)?;
        let tenant = if r.tenant.is_empty() { "default".to_string() } else { r.tenant };
        idemraft_store::validate::tenant(&tenant).map_err(|e| NodeError::Invalid(e).to_status())?;
        let scope = if r.scope.is_empty() { None } else { Some(r.scope) };
        if let Some(s) = &scope {
            idemraft_store::validate::scope(s).map_err(|e| NodeError::Invalid(e).to_status())?;
        }
        let state = match pb::RecordState::try_from(r.state) {
            Ok(pb::RecordState::Unspecified) => None,
            Ok(pb::RecordState::InProgress) => Some(RecordState::InProgress),
            Ok(pb::RecordState::Completed) => Some(RecordState::Completed),
            Ok(pb::RecordState::Failed) => Some(RecordState::Failed),
            Err(_) => return Err(bad_request(format!("state {} is not a record state", r.state))),
        };
        let limit = match r.limit {
            0 => LIST_DEFAULT,
            n if n > LIST_MAX => {
                return Err(bad_request(format!("limit {n} is more than {LIST_MAX}: page through with next_after")))
            }
            n => n,
        };
        let start_after = match r.start_after {
            Some(id) => Some(record_key(Some(id))?),
            None => None,
        };
        let query =
            ListQuery { tenant, scope, state, abandoned_only: r.abandoned_only, start_after, limit: limit as usize };
        let page = match self.run(deadline, Request::List(query)).await? {
            Reply::Page(page) => page,
            Reply::Records(records) => {
                let next_after =
                    if records.len() == limit as usize { records.last().map(|v| v.id.clone()) } else { None };
                ListPage { records, next_after }
            }
            other => return Err(unexpected(&other)),
        };
        Ok(self.reply(list_to_pb(page)))
    }
}

impl ClientApi {
    async fn membership(&self, deadline: Instant, call: Request) -> Result<GrpcResponse<pb::MembersResponse>, Status> {
        match self.run(deadline, call).await? {
            Reply::Members(list, log_index) => {
                Ok(self.reply(pb::MembersResponse { members: list.into_iter().map(member_to_pb).collect(), log_index }))
            }
            other => Err(unexpected(&other)),
        }
    }
}

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

/// The peer service: Raft RPCs and forwarded calls.
#[derive(Clone)]
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

    fn seal<T: serde::Serialize>(value: &T) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        let payload = wire::encode(value).map_err(Status::internal)?;
        Ok(GrpcResponse::new(pb::RaftMessage { target: 0, payload }))
    }
}

#[tonic::async_trait]
impl RaftService for PeerApi {
    async fn append_entries(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.node.identity().admit(req.metadata(), "append-entries request", true)?;
        let rpc: openraft::raft::AppendEntriesRequest<idemraft_store::TypeConfig> =
            self.open("append-entries request", req.get_ref())?;
        self.node.leader_message(&rpc.vote);
        Self::seal(&self.node.raft().append_entries(rpc).await)
    }

    async fn vote(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.node.identity().admit(req.metadata(), "vote request", false)?;
        let rpc = self.open("vote request", req.get_ref())?;
        Self::seal(&self.node.raft().vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: GrpcRequest<pb::RaftMessage>,
    ) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.node.identity().admit(req.metadata(), "install-snapshot request", true)?;
        let rpc: openraft::raft::InstallSnapshotRequest<idemraft_store::TypeConfig> =
            self.open("install-snapshot request", req.get_ref())?;
        self.node.leader_message(&rpc.vote);
        Self::seal(&self.node.raft().install_snapshot(rpc).await)
    }

    async fn pre_vote(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.node.identity().admit(req.metadata(), "pre-vote request", false)?;
        let rpc: wire::PreVote = self.open("pre-vote request", req.get_ref())?;
        let reply = self.node.pre_vote(&rpc).await;
        if !reply.granted {
            tracing::debug!(candidate = rpc.candidate, term = rpc.term, why = %reply.why, "pre-vote refused");
        }
        Self::seal(&reply)
    }

    async fn forward(&self, req: GrpcRequest<pb::RaftMessage>) -> Result<GrpcResponse<pb::RaftMessage>, Status> {
        self.node.identity().admit(req.metadata(), "forwarded call", false)?;
        let call: Request = self.open("forwarded call", req.get_ref())?;
        let deadline = deadline_of(&req, self.node.config().request_timeout);
        Self::seal(&self.node.serve_forwarded(call, deadline).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
        assert_eq!(parse_grpc_timeout("10é"), None);
    }

    /// The largest record `limits` allow, every variable part at its maximum.
    fn largest_record(limits: &idemraft_store::Limits, key: &str) -> RecordView {
        let header_value = "v".repeat(limits.headers_max_bytes / limits.headers_max_count - 8);
        RecordView {
            id: RecordKey::new("t".repeat(64), "s".repeat(128), key.to_string()).unwrap_or_else(|e| panic!("{e}")),
            record: idemraft_store::Record {
                fingerprint: Some([0xff; 32]),
                state: RecordState::Completed,
                token: Token(u64::MAX),
                owner: "o".repeat(limits.owner_max_bytes),
                attempt: u32::MAX,
                taken_over: true,
                lease_expires_ms: u64::MAX,
                created_ms: u64::MAX,
                updated_ms: u64::MAX,
                completed_ms: Some(u64::MAX),
                expires_ms: u64::MAX,
                retention_ms: u64::MAX,
                recovery_point: "p".repeat(limits.recovery_point_max_bytes),
                checkpoint: vec![0xff; limits.checkpoint_max_bytes],
                response: Some(Response {
                    status: u32::MAX,
                    headers: (0..limits.headers_max_count)
                        .map(|h| (format!("x-h{h:04}"), header_value.clone()))
                        .collect(),
                    body: vec![0xff; limits.body_max_bytes],
                }),
            },
        }
    }

    /// A List page bounded by `LIST_PAGE_BYTES` fits the client port's message limit as a
    /// `ListResponse` and the peer port's as a forwarded reply: the size bound a page is cut
    /// by is never below a record's real encoding, and one record of the largest size the
    /// ceiling limits allow still fits alone.
    #[test]
    fn a_full_list_page_fits_both_ports_message_limits() {
        use idemraft_store::{Limits, LIST_PAGE_BYTES};
        use prost::Message;
        for limits in [Limits::DEFAULT, Limits::CEILING] {
            let one = largest_record(&limits, &"k".repeat(255));
            let pb_len = list_to_pb(ListPage { records: vec![one.clone()], next_after: None }).encoded_len();
            let peer_len = crate::wire::encode(&one).map(|b| b.len()).unwrap_or(usize::MAX);
            let bound = one.encoded_len_bound();
            assert!(
                pb_len <= bound && peer_len <= bound,
                "bound {bound} under protobuf {pb_len} or bincode {peer_len}"
            );
            assert!(bound < crate::server::MAX_CLIENT_MESSAGE, "one record of {bound} bytes cannot be listed");
        }
        // As many default-size maximal records as the page bound lets in, plus one more
        // than that to be sure: the page the bound cuts is comfortably inside both limits.
        let one = largest_record(&Limits::DEFAULT, &"k".repeat(255));
        let n = LIST_PAGE_BYTES / one.encoded_len_bound() + 1;
        let records: Vec<RecordView> = (0..n).map(|i| largest_record(&Limits::DEFAULT, &format!("{i:0255}"))).collect();
        let next_after = records.last().map(|v| v.id.clone());
        let page = ListPage { records, next_after };
        let pb_len = list_to_pb(page.clone()).encoded_len();
        assert!(pb_len < crate::server::MAX_CLIENT_MESSAGE, "{n} records: {pb_len} bytes");
        let peer_len = crate::wire::encode(&crate::wire::Reply::Page(page)).map(|b| b.len()).unwrap_or(usize::MAX);
        assert!(peer_len < crate::wire::MAX_PEER_MESSAGE, "{n} records: {peer_len} bytes over the peer port");
    }
}
