//! The client API (`Idempotency`) of one node. Requests are checked here against the node's
//! configured limits before anything is proposed, so a bad request costs no log entry; each
//! becomes a [`Request`] and goes to [`Node::call`]; replies and errors are translated back.
//! The admin API (`super::admin`) shares [`ClientApi`]'s plumbing.

use std::sync::Arc;
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::{LEADER_ADDR_HEADER, SERVED_BY_HEADER};
use idemraft_store::validate::CheckOp;
use idemraft_store::{ListPage, ListQuery, Op, Outcome, RecordState, Token};
use pb::idempotency_server::Idempotency;
use tokio::time::Instant;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};

use super::convert::*;
use crate::cluster::node::Node;
use crate::error::NodeError;
use crate::ops::metrics::Metrics;
use crate::wire::{Reply, Request};

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

pub(super) fn deadline_of<T>(req: &GrpcRequest<T>, default: Duration) -> Instant {
    let given = req.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(parse_grpc_timeout);
    Instant::now() + given.unwrap_or(default).min(Duration::from_secs(600))
}

/// The client and admin services of one node.
#[derive(Clone)]
pub struct ClientApi {
    pub(super) node: Node,
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
    pub(super) fn open<T: crate::security::auth::Tenanted>(&self, req: GrpcRequest<T>) -> Result<(Instant, T), Status> {
        let req = crate::security::auth::bind(req)?;
        Ok((deadline_of(&req, self.node.config().request_timeout), req.into_inner()))
    }

    pub(super) async fn run(&self, deadline: Instant, call: Request) -> Result<Reply, Status> {
        self.node.call(call, deadline).await.map_err(|e| {
            let status = e.to_status();
            tracing::debug!(code = ?status.code(), error = %e, "call refused");
            status
        })
    }

    pub(super) fn reply<T>(&self, body: T) -> GrpcResponse<T> {
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
    pub(super) fn check(&self, op: Op) -> Result<Request, Status> {
        self.node.config().limits.check_op(&op).map_err(|e| NodeError::Invalid(e).to_status())?;
        Ok(Request::Write(op))
    }

    pub(super) async fn write(&self, deadline: Instant, op: Op) -> Result<GrpcResponse<pb::Outcome>, Status> {
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
    pub(super) async fn membership(
        &self,
        deadline: Instant,
        call: Request,
    ) -> Result<GrpcResponse<pb::MembersResponse>, Status> {
        match self.run(deadline, call).await? {
            Reply::Members(list, log_index) => {
                Ok(self.reply(pb::MembersResponse { members: list.into_iter().map(member_to_pb).collect(), log_index }))
            }
            other => Err(unexpected(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use idemraft_store::{RecordKey, RecordView, Response};

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
