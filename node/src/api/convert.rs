//! Conversions between the protobuf messages of the gRPC API and the store's and the
//! cluster's types, and the statuses for malformed requests.

use idemraft_proto::v1 as pb;
use idemraft_store::{
    Fingerprint, Grant, ListPage, Outcome, QuotaReport, RecordKey, RecordState, RecordView, Response,
};
use tonic::Status;

use crate::error::NodeError;
use crate::wire::{MemberInfo, Reply};

pub(super) fn quota_to_pb(r: QuotaReport) -> pb::QuotaResponse {
    pb::QuotaResponse {
        default_max_records: r.default,
        tenants: r
            .tenants
            .into_iter()
            .map(|u| pb::TenantQuota { tenant: u.tenant, records: u.records, max_records: u.limit, own: u.own })
            .collect(),
    }
}

pub(super) fn unexpected(reply: &Reply) -> Status {
    Status::internal(format!("the leader answered with the wrong kind of reply: {reply:?}"))
}

pub(super) fn bad_request(msg: impl Into<String>) -> Status {
    NodeError::BadRequest(msg.into()).to_status()
}

pub(super) fn record_key(id: Option<pb::RecordId>) -> Result<RecordKey, Status> {
    let id = id.ok_or_else(|| bad_request("id is required: send the record's scope and key"))?;
    crate::ops::instrument::tag(&id.scope, &id.key);
    let tenant = if id.tenant.is_empty() { "default".to_string() } else { id.tenant };
    RecordKey::new(tenant, id.scope, id.key).map_err(|e| NodeError::Invalid(e).to_status())
}

pub(super) fn fingerprint(bytes: &[u8]) -> Result<Option<Fingerprint>, Status> {
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

pub(super) fn response_from_pb(r: pb::StoredResponse) -> Response {
    Response { status: r.status, headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(), body: r.body }
}

pub(super) fn response_to_pb(r: Response) -> pb::StoredResponse {
    pb::StoredResponse {
        status: r.status,
        headers: r.headers.into_iter().map(|(name, value)| pb::Header { name, value }).collect(),
        body: r.body,
    }
}

pub(super) fn state_to_pb(s: RecordState) -> pb::RecordState {
    match s {
        RecordState::InProgress => pb::RecordState::InProgress,
        RecordState::Completed => pb::RecordState::Completed,
        RecordState::Failed => pb::RecordState::Failed,
    }
}

pub(super) fn grant_to_pb(g: Grant) -> pb::Acquired {
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

pub(super) fn id_to_pb(id: &RecordKey) -> pb::RecordId {
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

pub(super) fn list_to_pb(page: ListPage) -> pb::ListResponse {
    pb::ListResponse {
        next_after: page.next_after.as_ref().map(id_to_pb),
        records: page.records.into_iter().map(record_to_pb).collect(),
    }
}

pub(super) fn member_to_pb(m: MemberInfo) -> pb::Member {
    pb::Member { id: m.id, peer_addr: m.peer_addr, voter: m.voter }
}
