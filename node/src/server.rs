//! Process wiring: binds the three listeners (failing fast, naming the option, when a port is
//! taken), serves until a shutdown signal, then drains: listeners stop accepting, in-flight
//! calls finish, Raft stops and applied state is flushed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use idemraft_proto::v1::admin_server::AdminServer;
use idemraft_proto::v1::idempotency_server::IdempotencyServer;
use idemraft_proto::v1::raft_server::RaftServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::api::client::ClientApi;
use crate::api::peer::PeerApi;
use crate::cluster::node::Node;
use crate::config::Config;
use crate::ops::instrument::Observed;
use crate::ops::metrics::Metrics;
use crate::wire::MAX_PEER_MESSAGE;

/// Client messages may carry a response of up to the configured size plus headers.
pub(crate) const MAX_CLIENT_MESSAGE: usize = 8 * 1024 * 1024;
/// The largest HTTP/2 frame a peer may send us (h2's default is 16 KiB): an AppendEntries of
/// large bodies then arrives in a few DATA frames, not in one per 16 KiB.
const MAX_FRAME: u32 = 1 << 20;

async fn bind(option: &str, addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        format!("cannot listen on {addr} ({option}): {e}; stop whatever holds the port or choose another with {option}")
    })
}

/// Runs a node until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), String> {
    // Bind first: a taken port is reported before any state is opened.
    let client = bind("--client-addr", config.client_addr).await?;
    let peer = bind("--peer-addr", config.peer_addr).await?;
    let http = bind("--http-addr", config.http_addr).await?;
    if !config.planted_bugs.is_empty() {
        let names: Vec<&str> = config.planted_bugs.iter().map(|b| b.name()).collect();
        tracing::error!(
            bugs = %names.join(","),
            "UNSAFE: this node runs with planted bugs for the fault harness; it breaks Idemraft's promises on purpose"
        );
        idemraft_store::planted::plant(&config.planted_bugs);
    }
    if !config.peer_routes.is_empty() {
        tracing::info!(routes = ?config.peer_routes, "dialling peers through --peer-route");
    }
    // Tokens and TLS are checked before any state is opened, like the ports.
    let auth = match &config.tokens_file {
        Some(path) => Some(crate::security::auth::Auth::load(path).map_err(|e| format!("--tokens-file: {e}"))?),
        None => None,
    };
    let client_builder = crate::security::tls::client_server(config.client_tls.as_ref())?;
    let peer_builder = crate::security::tls::peer_server(config.peer_tls.as_ref())?;
    let metrics = Arc::new(Metrics::new());
    let node = Node::start(config.clone(), metrics.clone()).await.map_err(|e| e.to_string())?;
    tracing::info!(
        id = config.id,
        client = %config.client_addr,
        peer = %config.peer_addr,
        http = %config.http_addr,
        data_dir = %config.data_dir.display(),
        "idemraft node started"
    );
    tracing::info!(
        client_tls = config.client_tls.is_some(),
        client_certs_required = config.client_tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        peer_mtls = config.peer_tls.is_some(),
        tokens = auth.is_some(),
        "security"
    );
    if config.client_tls.is_none() || config.peer_tls.is_none() {
        if config.insecure_plaintext {
            tracing::warn!("--insecure-plaintext: a port without TLS may be reachable from other machines");
        }
        if auth.is_some() && config.client_tls.is_none() {
            tracing::warn!("--tokens-file without --tls-cert: bearer tokens travel in plaintext");
        }
    }
    #[cfg(unix)]
    if let Some(auth) = &auth {
        tokio::spawn(crate::security::auth::reload_on_sighup(auth.clone()));
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let api = ClientApi::new(node.clone(), metrics.clone());
    let health = crate::ops::health::health(&node, metrics.clone()).await;
    let (reflection, reflection_alpha) = crate::ops::health::reflection()?;
    // Unbounded streams let one busy connection pile up more unread request frames than h2's
    // small-frame budget allows, and h2 then closes it, failing every call on it (see
    // `config::MAX_STREAMS_PER_CONNECTION`).
    let client_server = client_builder
        .max_concurrent_streams(config.max_streams_per_connection)
        .tcp_nodelay(true)
        .layer(crate::security::auth::AuthLayer::new(auth.clone()))
        .add_service(Observed::new(
            IdempotencyServer::new(api.clone())
                .max_decoding_message_size(MAX_CLIENT_MESSAGE)
                .max_encoding_message_size(MAX_CLIENT_MESSAGE),
            metrics.clone(),
        ))
        .add_service(Observed::new(AdminServer::new(api), metrics.clone()))
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .serve_with_incoming_shutdown(TcpIncoming::from(client).with_nodelay(Some(true)), stopped());
    // The peer port serves the peer link itself and hands every other connection to gRPC.
    let peer_api = Arc::new(PeerApi::new(node.clone()));
    let (peer_grpc, peer_link) =
        crate::api::peer_link::accept(peer, config.peer_tls.is_none(), peer_api.clone(), stopped());
    // Followers forward client calls to the leader over one connection each: the same bound
    // keeps a flood of small forwarded calls inside h2's small-frame budget.
    // Windows that take a whole AppendEntries (`--replication-max-bytes`) without waiting for a
    // WINDOW_UPDATE: on a busy node each update waits for the reading task to be scheduled,
    // and hyper's 1 MiB default turned one 4 MiB message into four such waits.
    let stream_window = u32::try_from(config.replication_max_bytes.saturating_mul(2)).unwrap_or(u32::MAX);
    let peer_server = peer_builder
        .max_concurrent_streams(crate::config::MAX_STREAMS_PER_CONNECTION)
        .initial_stream_window_size(stream_window)
        .initial_connection_window_size(stream_window.saturating_mul(2))
        .max_frame_size(MAX_FRAME)
        .tcp_nodelay(true)
        .add_service(
            RaftServer::from_arc(peer_api.clone())
                .max_decoding_message_size(MAX_PEER_MESSAGE)
                .max_encoding_message_size(MAX_PEER_MESSAGE),
        )
        .serve_with_incoming_shutdown(peer_grpc, stopped());
    let http_server =
        axum::serve(http, crate::ops::http::router(node.clone(), metrics, auth)).with_graceful_shutdown(stopped());

    let client_task = tokio::spawn(client_server);
    let http_task = tokio::spawn(async move { http_server.await });
    // The peer port outlives the client port during a drain: in-flight writes still need
    // their quorum.
    let peer_task = tokio::spawn(peer_server);
    let peer_link_task = tokio::spawn(peer_link);

    tokio::select! {
        _ = shutdown => {}
        reason = node.fatal() => {
            // Nothing can be served any more; stop at once rather than answer INTERNAL forever.
            tracing::error!(%reason, "raft stopped on a fatal error; exiting so the node can be restarted from its data directory");
            let _ = stop_tx.send(true);
            client_task.abort();
            http_task.abort();
            peer_task.abort();
            peer_link_task.abort();
            return Err(format!("raft stopped on a fatal error: {reason}; fix the cause (see the log above: a full disk, an IO error) and restart the node"));
        }
    }
    tracing::info!("shutting down: no new calls; finishing in-flight calls");
    let _ = stop_tx.send(true);
    let drain = async {
        let _ = client_task.await;
        let _ = http_task.await;
    };
    if tokio::time::timeout(Duration::from_secs(10), drain).await.is_err() {
        tracing::warn!("in-flight calls did not finish within 10 s; stopping anyway");
    }
    node.shutdown().await;
    peer_task.abort();
    peer_link_task.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
