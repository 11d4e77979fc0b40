//! `payments`: the payments example API on a real Idemraft cluster.
//!
//! ```text
//! payments --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 --listen 127.0.0.1:8080
//! ```

use std::time::Duration;

use clap::Parser;
use idemraft_client::{Client, ClientConfig};
use idemraft_payments_example::{default_layer, router, Bank};

/// The payments example: `POST /v1/charges` (exactly-once per Idempotency-Key),
/// `GET /v1/charges/{id}`, `GET /v1/bank/charges` (the bank's books).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Client addresses of the cluster's nodes, comma-separated.
    #[arg(
        long,
        env = "PAYMENTS_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
    )]
    endpoints: Vec<String>,
    /// Address to serve HTTP on.
    #[arg(long, env = "PAYMENTS_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// How long a duplicate waits for an in-flight first request, in ms; 0 answers 409 at once.
    #[arg(long, default_value_t = 5000)]
    wait_ms: u64,
    /// Lease held while a charge runs (extended in the background), in ms.
    #[arg(long, default_value_t = 10_000)]
    lease_ms: u64,
    /// How long to keep trying the cluster for a claim before answering 503, in ms.
    #[arg(long, default_value_t = 5000)]
    cluster_timeout_ms: u64,
    /// Run charges unprotected when the cluster is unreachable, instead of 503.
    #[arg(long)]
    fail_open: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("payments: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::new(ClientConfig::new(args.endpoints.clone()))?;
    let mut layer = default_layer(client)
        .lease(Duration::from_millis(args.lease_ms))
        .cluster_timeout(Duration::from_millis(args.cluster_timeout_ms))
        .fail_open(args.fail_open);
    layer = if args.wait_ms == 0 {
        layer.in_flight(idemraft_client::http::InFlight::Conflict)
    } else {
        layer.wait_for_in_flight(Duration::from_millis(args.wait_ms))
    };
    layer.validate()?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    tracing::info!(listen = %args.listen, endpoints = ?args.endpoints, "payments example serving");
    println!("payments: listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(Bank::new(), layer)).with_graceful_shutdown(shutdown()).await?;
    Ok(())
}

async fn shutdown() {
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
        () = ctrl_c => {}
        () = term => {}
    }
}
