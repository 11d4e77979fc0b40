//! A small load generator against a running cluster: `clients` concurrent workers each run
//! claim → complete cycles on fresh keys (256-byte responses) for `secs` seconds, then it prints
//! cycles/s and claim latency percentiles. Bounded in time; a rough figure, not the benchmark.
//!
//! `cargo run --release -p idemraft-client --example load -- [clients] [secs] [endpoints]`

use std::time::{Duration, Instant};

use idemraft_client::{ClaimOptions, Client, Outcome, StoredResponse};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let clients: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(16);
    let secs: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(5);
    let endpoints = args.get(3).cloned().unwrap_or_else(|| "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".into());
    let client = Client::connect(endpoints.split(','))?;
    client.discover().await;
    let run = format!("{:x}", std::process::id());
    let end = Instant::now() + Duration::from_secs(secs);
    let body = vec![b'r'; 256];
    let mut tasks = Vec::new();
    for w in 0..clients {
        let client = client.clone();
        let run = run.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < end {
                i += 1;
                let key = format!("load-{run}-{w}-{i:012}");
                let t = Instant::now();
                match client.claim("load.cycle", &key, "loader", &ClaimOptions::default()).await {
                    Ok(Outcome::Acquired(g)) => {
                        lat.push(t.elapsed());
                        if client
                            .complete("load.cycle", &key, g.token, &StoredResponse::new(200, body.clone()))
                            .await
                            .is_err()
                        {
                            errors += 1;
                        }
                    }
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        lat.extend(l);
        errors += e;
    }
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or_default()
    };
    println!(
        "clients={clients} secs={secs} cycles={} cycles/s={:.0} errors={errors} claim p50={:?} p99={:?} p999={:?}",
        lat.len(),
        lat.len() as f64 / secs as f64,
        pct(0.50),
        pct(0.99),
        pct(0.999)
    );
    Ok(())
}
