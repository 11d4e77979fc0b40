//! The standard gRPC services on the client port, for load balancers and `grpcurl`:
//! `grpc.health.v1.Health` and server reflection (v1 and v1alpha, since older grpcurl
//! releases only speak v1alpha).
//!
//! Health follows the node's readiness (the same condition as `/readyz`): SERVING for
//! `idemraft.v1.Idempotency` and for `""` (the whole server) while this node knows a leader
//! it can reach through a quorum and is caught up, NOT_SERVING otherwise. A watcher task
//! re-evaluates it on every change of openraft's metrics and at least every heartbeat, since
//! losing the quorum shows up as time passing rather than as a change. The same task counts
//! leader changes for the metrics.

use std::sync::Arc;
use std::time::Duration;

use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};
use tonic_reflection::server::v1alpha;

use crate::cluster::node::Node;
use crate::ops::metrics::Metrics;

/// The service names health reports on: the client API and the server as a whole.
pub const IDEMPOTENCY: &str = idemraft_proto::v1::idempotency_server::SERVICE_NAME;

/// Builds the health service (NOT_SERVING until the watcher has looked) and starts its
/// watcher, which stops when Raft does.
pub async fn health(node: &Node, metrics: Arc<Metrics>) -> HealthServer<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    // The reporter starts with "" SERVING; nothing is known yet.
    set(&reporter, ServingStatus::NotServing).await;
    tokio::spawn(watch(node.clone(), metrics, reporter));
    service
}

/// The reflection services, advertising what the client port serves and nothing else (the
/// descriptor set also holds the peer service).
pub fn reflection() -> Result<
    (ServerReflectionServer<impl ServerReflection>, v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>),
    String,
> {
    let names = [
        IDEMPOTENCY,
        idemraft_proto::v1::admin_server::SERVICE_NAME,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    let builder = || {
        let b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(idemraft_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
        names.iter().fold(b, |b, n| b.with_service_name(*n))
    };
    let v1 = builder().build_v1().map_err(|e| format!("cannot build gRPC reflection: {e}"))?;
    let alpha = builder().build_v1alpha().map_err(|e| format!("cannot build gRPC reflection: {e}"))?;
    Ok((v1, alpha))
}

async fn set(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status(IDEMPOTENCY, status).await;
    reporter.set_service_status("", status).await;
}

async fn watch(node: Node, metrics: Arc<Metrics>, reporter: HealthReporter) {
    // The server metrics change with the vote, the role and the leader; the full metrics
    // change after every turn of the Raft core, and waking on those cost a thread hand-off
    // and a status computation per turn (several per write). Readiness, which also follows
    // the applied index, is read at each tick.
    let mut changes = node.raft().server_metrics();
    let tick = node.config().heartbeat.clamp(Duration::from_millis(20), Duration::from_millis(500));
    let mut serving = None;
    // Ends when Raft stops (its metrics sender is dropped); each turn waits at most a tick.
    loop {
        let stopped = tokio::select! {
            changed = changes.changed() => changed.is_err(),
            _ = tokio::time::sleep(tick) => false,
        };
        {
            let m = changes.borrow_and_update();
            metrics.observe_leader(m.id, m.vote.leader_id().term, m.current_leader);
        }
        let now = !stopped && node.status().ready;
        if serving != Some(now) {
            serving = Some(now);
            let status = if now { ServingStatus::Serving } else { ServingStatus::NotServing };
            set(&reporter, status).await;
            tracing::info!(status = %status, "gRPC health changed");
        }
        if stopped {
            return;
        }
    }
}
