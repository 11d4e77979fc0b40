//! The HTTP port: `/` (the status page, one self-contained HTML page that draws
//! `/status.json` and refreshes itself), `/status.json` (the page's data: [`StatusReport`]),
//! `/healthz` (the process is up), `/readyz` (a leader is known and this node is caught up, so a
//! load balancer may send it traffic), `/status` (the same view as the Admin Status call, as
//! JSON, for a human with curl) and `/metrics` (Prometheus).
//!
//! With `--tokens-file`, `/status` and `/status.json` need an admin token in
//! `Authorization: Bearer`, as the Admin API does: they show the membership and the cluster's
//! activity. The page itself holds no data (it asks for a token and fetches the JSON with it),
//! so it is served to anyone. Health, readiness and metrics stay open for load balancers and
//! scrapers, and show nothing of any tenant.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use std::sync::Arc;

use crate::cluster::node::Node;
use crate::ops::metrics::Metrics;
use crate::ops::status::{now_ms, Member, RecordsByState, StatusReport};
use crate::security::auth::{Auth, Caller};

/// The status page: inline CSS and script, no external asset, so it works offline and on a
/// management network without internet access.
const STATUS_PAGE: &str = include_str!("status_page.html");

#[derive(Clone)]
struct Shared {
    node: Node,
    metrics: Arc<Metrics>,
    auth: Option<Arc<Auth>>,
}

/// The HTTP routes. `auth` is the node's tokens, if it checks them.
pub fn router(node: Node, metrics: Arc<Metrics>, auth: Option<Arc<Auth>>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/status.json", get(status_json))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(render))
        .with_state(Shared { node, metrics, auth })
}

async fn readyz(State(s): State<Shared>) -> (StatusCode, String) {
    let st = s.node.status();
    if st.ready {
        (StatusCode::OK, format!("ready: {} of term {}, leader {}\n", st.role, st.term, st.leader_id.unwrap_or(0)))
    } else {
        let failed: Vec<String> =
            st.readiness.iter().filter(|r| !r.ok).map(|r| format!("{}: {}", r.check, r.detail)).collect();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {} of term {}; {}\n", st.role, st.term, failed.join("; ")),
        )
    }
}

async fn render(State(s): State<Shared>) -> ([(header::HeaderName, &'static str); 1], String) {
    ([(header::CONTENT_TYPE, crate::ops::metrics::CONTENT_TYPE)], crate::ops::metrics::render(&s.node, &s.metrics))
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // The page runs only its own inline script and talks only to this node.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
            ),
        ],
        STATUS_PAGE,
    )
}

/// Refuses the call unless tokens are off or the request carries an admin token; the
/// refusal names what to send.
fn admin_only(auth: Option<&Auth>, headers: &HeaderMap) -> Option<(StatusCode, String)> {
    let auth = auth?;
    match auth.authenticate(headers.get(header::AUTHORIZATION)) {
        Ok(Caller::Token { admin: true, .. } | Caller::Anyone) => None,
        Ok(Caller::Token { label, .. }) => Some((
            StatusCode::FORBIDDEN,
            format!("the status needs an admin token; this token ({label}) is a tenant's: use an admin token"),
        )),
        Err(status) => {
            Some((StatusCode::UNAUTHORIZED, format!("{} (the status needs an admin token)", status.message())))
        }
    }
}

fn refusal((code, why): (StatusCode, String)) -> Response {
    (code, [(header::WWW_AUTHENTICATE, "Bearer")], Json(serde_json::json!({ "error": why }))).into_response()
}

async fn status(State(s): State<Shared>, headers: HeaderMap) -> Response {
    match admin_only(s.auth.as_deref(), &headers) {
        None => Json(s.node.status()).into_response(),
        Some(refused) => refusal(refused),
    }
}

async fn status_json(State(s): State<Shared>, headers: HeaderMap) -> Response {
    match admin_only(s.auth.as_deref(), &headers) {
        None => ([(header::CACHE_CONTROL, "no-store")], Json(report(&s.node, &s.metrics))).into_response(),
        Some(refused) => refusal(refused),
    }
}

/// Builds the report from the node and what its metrics saw.
fn report(node: &Node, metrics: &Metrics) -> StatusReport {
    let s = node.status();
    let raft = node.raft().metrics().borrow().clone();
    let replication = raft.replication.as_ref();
    let members = s
        .members
        .iter()
        .map(|m| {
            let is_self = m.id == s.id;
            let matched = match replication {
                Some(r) => r.get(&m.id).map(|l| l.map_or(0, |l| l.index)),
                None if is_self => Some(s.last_log_index),
                None => None,
            };
            let role = if is_self {
                s.role.to_string()
            } else if Some(m.id) == s.leader_id {
                "leader".to_string()
            } else if m.voter {
                "follower".to_string()
            } else {
                "learner".to_string()
            };
            Member {
                id: m.id,
                peer_addr: m.peer_addr.clone(),
                voter: m.voter,
                role,
                matched_index: matched,
                lag: replication.and(matched).map(|i| s.last_log_index.saturating_sub(i)),
                is_self,
            }
        })
        .collect();
    let counts = node.record_counts();
    let (changes, last_change) = metrics.leader_changes();
    StatusReport {
        generated_ms: now_ms(),
        id: s.id,
        role: s.role,
        term: s.term,
        leader_id: s.leader_id,
        leader_client_addr: s.leader_client_addr.clone(),
        client_addr: s.client_addr.clone(),
        last_log_index: s.last_log_index,
        commit_index: metrics.committed_index().max(s.applied_index),
        applied_index: s.applied_index,
        clock_ms: s.clock_ms,
        ready: s.ready,
        readiness: s.readiness.clone(),
        members,
        leader_changes: changes,
        last_leader_change: last_change,
        records: RecordsByState { in_progress: counts.in_progress, completed: counts.completed, failed: counts.failed },
        recent: metrics.recent().window(),
        disk: metrics.disk_sizes(&node.config().data_dir, node.blob_bytes()),
    }
}
