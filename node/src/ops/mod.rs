//! What operators see of a node: Prometheus metrics ([`metrics`]), per-RPC counting and
//! tracing ([`instrument`]), gRPC health and reflection ([`health`]), the status page's data
//! ([`status`]), and the HTTP endpoints `/` (the status page), `/status.json`, `/healthz`,
//! `/readyz`, `/status` and `/metrics` ([`http`]). Reads the cluster layer; the API layer above
//! reports into it.

pub mod health;
pub mod http;
pub mod instrument;
pub mod metrics;
pub mod status;
