//! The HTTP port: `/healthz` (the process is up), `/readyz` (a leader is known and this node
//! is caught up, so a load balancer may send it traffic), `/status` (the same view as the
//! Admin Status call, as JSON, for a human with curl) and `/metrics` (Prometheus).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::{Json, Router};

use std::sync::Arc;

use crate::cluster::node::{Node, StatusInfo};
use crate::ops::metrics::Metrics;

/// The HTTP routes.
pub fn router(node: Node, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(render))
        .with_state((node, metrics))
}

type Shared = State<(Node, Arc<Metrics>)>;

async fn readyz(State((node, _)): Shared) -> (StatusCode, String) {
    let s = node.status();
    if s.ready {
        (StatusCode::OK, format!("ready: {} of term {}, leader {}\n", s.role, s.term, s.leader_id.unwrap_or(0)))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {} of term {}, no leader known, no quorum, or catching up\n", s.role, s.term),
        )
    }
}

async fn render(State((node, metrics)): Shared) -> ([(header::HeaderName, &'static str); 1], String) {
    ([(header::CONTENT_TYPE, crate::ops::metrics::CONTENT_TYPE)], crate::ops::metrics::render(&node, &metrics))
}

async fn status(State((node, _)): Shared) -> Json<StatusInfo> {
    Json(node.status())
}
