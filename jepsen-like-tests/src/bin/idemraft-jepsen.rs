//! `idemraft-jepsen`: one seeded fault-injection run against real `idemraft` processes, judged
//! by the history checkers. Exit code 0: valid, no anomaly; 1: anomalies found; 2: the run is
//! invalid or the checker could not decide (never a pass); 3: the harness itself failed; 4:
//! no anomaly, but writes stopped for too long during a single-node fault.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idemraft_jepsen::nemesis::Fault;
use idemraft_jepsen::payload::Payloads;
use idemraft_jepsen::progress::Progress;
use idemraft_jepsen::report::{self, Judgement};
use idemraft_jepsen::run::{self, RunSpec};

/// Prove Idemraft under faults: partitions, crashes, pauses, clock skew, membership changes,
/// power loss and failing or slow disks.
#[derive(Parser, Debug)]
#[command(name = "idemraft-jepsen", version)]
struct Args {
    /// Founding nodes: 3 or 5.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Seconds of fault schedule (after the warm-up).
    #[arg(long, default_value_t = 60)]
    time: u64,
    /// Seconds of load before the first fault; the traffic-rate check uses this window.
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    /// The seed: the same seed gives the same schedule and the same client choices.
    #[arg(long)]
    seed: Option<u64>,
    /// Faults, comma-separated: names (kill-leader, partition-ring, ...) or families
    /// (partition, kill, pause, clock, membership, catch-up, power-loss, disk) or `all`.
    /// Power-loss and disk faults mount every node's data directory through the lazy
    /// filesystem, which needs root and /dev/fuse.
    #[arg(long, default_value = "partition,kill,pause")]
    faults: String,
    /// Let rounds combine two faults of different families.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    combine: bool,
    /// Planted bugs to switch on in every node, to prove the checkers catch them.
    #[arg(long, value_name = "LIST")]
    unsafe_planted_bugs: Option<String>,
    /// The idemraft binary [default: target/release/idemraft, else target/debug/idemraft].
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Where run directories go.
    #[arg(long, default_value = "target/jepsen")]
    out: PathBuf,
    /// Concurrent clients.
    #[arg(long, default_value_t = 10)]
    clients: u32,
    /// Live keys at once (small: contention is the point).
    #[arg(long, default_value_t = 12)]
    keys: u32,
    /// Answered ops/s required before the first fault, or the run is invalid.
    #[arg(long, default_value_t = 50.0)]
    min_rate: f64,
    /// Lease the workload's claims ask for, ms.
    #[arg(long, default_value_t = 1500)]
    lease_ms: u64,
    /// Bodies completions store: `mix` (64 B to 256 KiB, heavy-tailed, derived from key and
    /// token) or `tiny` (a few bytes).
    #[arg(long, default_value_t = Payloads::Mix)]
    payloads: Payloads,
    /// Checker budget per key, seconds (past it the key is Unknown, never guessed).
    #[arg(long, default_value_t = 10)]
    key_budget: u64,
}

fn default_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target"));
    let release = target.join("release/idemraft");
    if release.exists() {
        release
    } else {
        target.join("debug/idemraft")
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.nodes != 3 && args.nodes != 5 {
        eprintln!("error: --nodes {} is not supported; use 3 or 5", args.nodes);
        return ExitCode::from(3);
    }
    let faults = match Fault::parse_list(&args.faults, args.nodes) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: --faults: {e}");
            return ExitCode::from(3);
        }
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let spec = RunSpec {
        nodes: args.nodes,
        time: Duration::from_secs(args.time),
        warmup: Duration::from_secs(args.warmup),
        seed,
        faults,
        combine: args.combine,
        bugs: args
            .unsafe_planted_bugs
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        binary: args.binary.clone().unwrap_or_else(default_binary),
        dir: args.out.join(format!("run-{seed}")),
        clients: args.clients,
        keys: args.keys,
        min_rate: args.min_rate,
        lease: Duration::from_millis(args.lease_ms),
        recovery_bound: Duration::from_secs(15),
        payloads: args.payloads,
    };
    let reproduce = format!(
        "idemraft-jepsen --nodes {} --time {} --warmup {} --seed {seed} --faults {} --combine {} --clients {} --keys {} --payloads {}{}",
        args.nodes,
        args.time,
        args.warmup,
        args.faults,
        args.combine,
        args.clients,
        args.keys,
        args.payloads,
        args.unsafe_planted_bugs.as_ref().map(|b| format!(" --unsafe-planted-bugs {b}")).unwrap_or_default()
    );
    println!("seed {seed}; run directory {}", spec.dir.display());
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    // A status line on a terminal only: piped or captured output stays as it was.
    let progress = Progress::on_terminal(run::expected_length(&spec));
    let result = match rt.block_on(run::run_with(&spec, &progress)) {
        Ok(r) => r,
        Err(e) => {
            progress.finish();
            eprintln!("harness error: {e}\nreproduce: {reproduce}");
            return ExitCode::from(3);
        }
    };
    progress.phase(&format!("check {} ops", result.history.len()), Duration::from_secs(2));
    let judgement = report::judge(&spec, &result, Duration::from_secs(args.key_budget), &reproduce);
    progress.phase("write the run directory", Duration::from_secs(1));
    let written = report::write(&spec, &result, &judgement);
    progress.finish();
    print!("{}", judgement.summary);
    if let Err(e) = written {
        eprintln!("error: cannot write the run files: {e}");
    }
    match judgement.kind {
        Judgement::Valid => ExitCode::SUCCESS,
        Judgement::Anomalies => ExitCode::from(1),
        Judgement::Invalid | Judgement::Unknown => ExitCode::from(2),
        Judgement::Unavailable => ExitCode::from(4),
    }
}
