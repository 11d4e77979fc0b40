//! `idemraft-bench`: runs the same workloads against Idemraft, etcd, Redis and PostgreSQL
//! and prints one Markdown report with ratios taken within the run.
//!
//! It does not start servers: `scripts/bench.sh` starts them and hands their endpoints and
//! pids over with `--target`. Runs are interleaved (every target once per workload and
//! concurrency, then again in the next round) so drift on a shared machine hits every target
//! alike. `load` fills a cluster with records and reports memory and disk per record (and per
//! stored response byte, at any `--body-bytes`); `soak` runs a paced mixed-size load with
//! short TTLs and watches that memory and disk stay flat.

mod chart;
mod floor;
mod procstat;
mod report;
mod soak;
mod target;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use crate::procstat::Procs;
use crate::target::Spec;
use crate::workload::{RunSettings, Workload};

#[derive(Parser, Debug)]
#[command(name = "idemraft-bench", about = "Idemraft against etcd, Redis and PostgreSQL, side by side")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the workloads against every --target, interleaved, and print the report.
    Run(RunArgs),
    /// Print the machine's floor only.
    Floor {
        /// Directory for the fsync scratch file.
        #[arg(long, default_value = ".bench")]
        scratch_dir: PathBuf,
    },
    /// Fill an Idemraft cluster with completed records and report memory and disk per record.
    Load(LoadArgs),
    /// A paced mixed-size load with short TTLs, reporting RSS, disk, latency and leader
    /// changes every interval; exits 1 when RSS or disk drifted after the first TTL period.
    Soak(soak::SoakArgs),
}

#[derive(Parser, Debug)]
struct RunArgs {
    /// A system under test: 'name=N kind=idemraft|etcd|redis|postgres endpoints=H:P,.. pids=P,.. [only=W,..]'.
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    /// Workloads, in order.
    #[arg(long, default_value = "cycle,replay,contention", value_delimiter = ',')]
    workloads: Vec<String>,
    /// Concurrency levels (client tasks).
    #[arg(long, default_value = "1,16,64,256", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Measured time per run, e.g. 5s or 800ms.
    #[arg(long, default_value = "5s")]
    duration: String,
    /// Unmeasured warm-up before each run.
    #[arg(long, default_value = "1s")]
    warmup: String,
    /// Rounds: every run is repeated this many times, interleaved with the other targets'.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Completed keys made beforehand for the replay workload.
    #[arg(long, default_value_t = 4096)]
    replay_keys: usize,
    /// Sizes of the stored response bodies, bytes. Every workload runs at the first (cycle and
    /// contention complete with it; the replay keys are made with it, so replays return it);
    /// the --sized-workloads run again at each further size.
    #[arg(long, default_value = "256", value_delimiter = ',')]
    body_bytes: Vec<usize>,
    /// Workloads that also run at the sizes after the first of --body-bytes.
    #[arg(long, default_value = "cycle", value_delimiter = ',')]
    sized_workloads: Vec<String>,
    /// Write SVG charts of the figures into this directory (created if missing).
    #[arg(long)]
    charts_dir: Option<PathBuf>,
    /// How the report links the charts: this prefix and the file name.
    #[arg(long, default_value = "")]
    charts_link: String,
    /// A second anchor the targets compare against (the replicated PostgreSQL), if it runs.
    #[arg(long, default_value = "postgres-ha")]
    anchor: String,
    /// Target whose figures the ratios divide by.
    #[arg(long, default_value = "etcd-3")]
    baseline: String,
    /// Target the performance goals are judged on.
    #[arg(long, default_value = "idemraft-3")]
    subject: String,
    /// Directory for the floor's fsync scratch file.
    #[arg(long, default_value = ".bench")]
    scratch_dir: PathBuf,
    /// Short everything, for a smoke run: 1 round, 1 s runs, 300 ms warm-up, 256 replay keys.
    #[arg(long)]
    quick: bool,
}

#[derive(Parser, Debug)]
struct LoadArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Records to add.
    #[arg(long, default_value_t = 1_000_000)]
    records: usize,
    /// Client tasks.
    #[arg(long, default_value_t = 256)]
    clients: usize,
    /// Give up after this many seconds, reporting what was loaded.
    #[arg(long, default_value_t = 900)]
    max_secs: u64,
    /// Size of each stored response body, bytes.
    #[arg(long, default_value_t = workload::BODY_BYTES)]
    body_bytes: usize,
}

/// A running Idemraft cluster the driver measures: where to call it, and which processes and
/// directories to read RSS and disk from.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Client addresses of the cluster.
    #[arg(long, value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// The nodes' pids.
    #[arg(long, value_delimiter = ',', required = true)]
    pub pids: Vec<u32>,
    /// The nodes' data directories.
    #[arg(long, value_delimiter = ',', required = true)]
    pub data_dirs: Vec<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("'{s}' is not a duration like 5s or 800ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(format!("'{s}' needs a unit: ms or s")),
    }
}

fn run_prefix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("b{:x}", (nanos as u64) ^ u64::from(std::process::id()))
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args).await,
        Command::Floor { scratch_dir } => floor::measure(&scratch_dir, 2000).map(|f| println!("{}", f.line())),
        Command::Load(args) => load(args).await,
        Command::Soak(args) => match soak::soak(args).await {
            Ok(true) => Ok(()),
            Ok(false) => std::process::exit(1),
            Err(e) => Err(e),
        },
    };
    if let Err(e) = result {
        eprintln!("idemraft-bench: {e}");
        std::process::exit(1);
    }
}

async fn run(mut args: RunArgs) -> Result<(), String> {
    if args.quick {
        args.rounds = 1;
        args.duration = "1s".into();
        args.warmup = "300ms".into();
        args.replay_keys = args.replay_keys.min(256);
    }
    let duration = parse_duration(&args.duration)?;
    let warmup = parse_duration(&args.warmup)?;
    let specs: Vec<Spec> = args.targets.iter().map(|t| Spec::parse(t)).collect::<Result<_, _>>()?;
    let workloads: Vec<Workload> = args.workloads.iter().map(|w| Workload::parse(w)).collect::<Result<_, _>>()?;
    if args.clients.iter().any(|c| *c == 0 || *c > 4096) {
        return Err("--clients takes 1 to 4096".into());
    }
    let first_size = *args.body_bytes.first().ok_or("--body-bytes needs at least one size")?;
    if args.body_bytes.iter().any(|b| *b > 4 << 20) {
        return Err("--body-bytes takes sizes up to 4 MiB (the largest response a node can be set to store)".into());
    }
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let procs: Vec<Procs> = specs.iter().map(|s| Procs::new(s.pids.clone())).collect();

    let floor = floor::measure(&args.scratch_dir, if args.quick { 300 } else { 2000 })?;
    println!("{}", floor.line());

    let prefix = run_prefix();
    let mut replay: Vec<Arc<Vec<String>>> = Vec::new();
    for s in &specs {
        target::prepare(s).await.map_err(|e| format!("{}: {e}", s.name))?;
        let keys = if workloads.contains(&Workload::Replay) && s.runs("replay") {
            let t = Instant::now();
            let keys = workload::completed_keys(s, &prefix, args.replay_keys, 32, first_size)
                .await
                .map_err(|e| format!("{}: preparing replay keys: {e}", s.name))?;
            eprintln!("{}: {} completed keys for replay in {:.1?}", s.name, keys.len(), t.elapsed());
            keys
        } else {
            Vec::new()
        };
        replay.push(Arc::new(keys));
    }

    let mut results = report::Results::new();
    let mut seq = 0u64;
    let sized: Vec<Workload> = args.sized_workloads.iter().map(|w| Workload::parse(w)).collect::<Result<_, _>>()?;
    // (body size, workload) in the order they run: every workload at the first size, then
    // the sized ones at each further size.
    let mut plan: Vec<(usize, Workload)> = workloads.iter().map(|w| (first_size, *w)).collect();
    for &size in args.body_bytes.iter().skip(1) {
        plan.extend(workloads.iter().filter(|w| sized.contains(w)).map(|w| (size, *w)));
    }
    let cells = args.rounds
        * args.clients.len()
        * plan.iter().map(|(_, w)| specs.iter().filter(|s| s.runs(w.name())).count()).sum::<usize>();
    let matrix_started = Instant::now();
    let mut idle_wait = IdleWait::default();
    for round in 1..=args.rounds {
        for &(size, w) in &plan {
            for &clients in &args.clients {
                for (t, s) in specs.iter().enumerate() {
                    if !s.runs(w.name()) {
                        continue;
                    }
                    seq += 1;
                    settle()?;
                    // A quick run is a smoke test, not a measurement: it does not wait.
                    let waited = if args.quick || idle_wait.spent() { Duration::ZERO } else { quiesce().await };
                    idle_wait.add(waited);
                    let settings =
                        RunSettings { clients, warmup, duration, prefix: format!("{prefix}-{seq}"), body_bytes: size };
                    let r = workload::run(s, &procs[t], w, &settings, replay[t].clone())
                        .await
                        .map_err(|e| format!("{} {} {size} B {clients} clients: {e}", s.name, w.name()))?;
                    eprintln!(
                        "{}[round {round}/{}] {:<10} {:>6} B {:>4} clients {:<16} {:>8.0} ops/s  p50 {:>7.2} ms  p99 {:>7.2} ms  errors {}{}{}",
                        progress(seq as usize, cells, matrix_started.elapsed()),
                        args.rounds,
                        w.name(),
                        size,
                        clients,
                        s.name,
                        r.rate(),
                        r.op.value_at_quantile(0.5) as f64 / 1000.0,
                        r.op.value_at_quantile(0.99) as f64 / 1000.0,
                        r.errors,
                        r.first_error.as_ref().map_or(String::new(), |e| format!(" (first: {e})")),
                        if waited >= Duration::from_secs(1) {
                            format!(" (after {:.1} s waiting for an idle machine)", waited.as_secs_f64())
                        } else {
                            String::new()
                        }
                    );
                    results.entry((w, size, t, clients)).and_modify(|a| a.absorb(&r)).or_insert(r);
                    target::forget(s, &settings.prefix).await.map_err(|e| format!("{}: {e}", s.name))?;
                }
            }
        }
    }
    println!("{}", idle_wait.line());
    // Again at the end: on a shared machine one measurement may land in someone else's burst
    // of disk writes. The lower of the two is the floor the targets are judged against.
    let end_floor = floor::measure(&args.scratch_dir, if args.quick { 300 } else { 2000 })?;
    println!("{} (at the end)", end_floor.line());
    let floor = if end_floor.total_us() < floor.total_us() { end_floor } else { floor };
    let roles = report::Roles { baseline: &args.baseline, subject: &args.subject, anchor: &args.anchor };
    let mut text = report::render(&results, &names, Some(floor), &roles);
    if let Some(dir) = &args.charts_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        text.push_str("\n**Charts** (made by this run from the figures above)\n\n");
        for c in report::charts(&results, &names) {
            let path = dir.join(&c.file);
            std::fs::write(&path, &c.svg).map_err(|e| format!("writing {}: {e}", path.display()))?;
            text.push_str(&format!("![{}]({}{})\n", c.title, args.charts_link, c.file));
        }
    }
    println!("{text}");
    Ok(())
}

/// Writes every dirty page out before a run starts. The target before this one may have
/// left seconds of writeback behind (a 64 KiB cell writes gigabytes), which would otherwise
/// land in this run's window; and since the targets run in the same order in every cell, it
/// would land on the same target each time.
fn settle() -> Result<(), String> {
    let status = std::process::Command::new("sync").status().map_err(|e| format!("running sync: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("sync failed: {status}"))
    }
}

/// The longest [`quiesce`] waits before giving up: a machine that never calms down (another
/// tenant's load) still gets its runs, and the report says how often that happened.
const QUIESCE_MAX: Duration = Duration::from_secs(10);

/// All the waiting one benchmark may do; past it the runs go on without waiting, so a busy
/// machine adds at most this much to a run.
const QUIESCE_BUDGET: Duration = Duration::from_secs(300);

/// Waits until the machine has been at least 90 % idle for a quarter of a second, at most
/// [`QUIESCE_MAX`]. `sync` settles dirty pages, but a target's own background work (a
/// checkpoint, a snapshot, a compaction) may run on after its cell and would be measured as
/// part of the next target's run. Returns how long it waited.
async fn quiesce() -> Duration {
    let started = Instant::now();
    while started.elapsed() < QUIESCE_MAX {
        let Some((idle0, total0)) = procstat::machine_ticks() else { break };
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Some((idle1, total1)) = procstat::machine_ticks() else { break };
        let (idle, total) = (idle1.saturating_sub(idle0), total1.saturating_sub(total0));
        if total > 0 && idle.saturating_mul(10) >= total.saturating_mul(9) {
            break;
        }
    }
    started.elapsed()
}

/// How long the runs waited for an idle machine, for the report.
#[derive(Default)]
struct IdleWait {
    runs: u32,
    total: Duration,
    longest: Duration,
    gave_up: u32,
}

impl IdleWait {
    fn add(&mut self, waited: Duration) {
        self.runs += 1;
        self.total += waited;
        self.longest = self.longest.max(waited);
        self.gave_up += u32::from(waited >= QUIESCE_MAX);
    }

    /// Whether the waiting budget is used up.
    fn spent(&self) -> bool {
        self.total >= QUIESCE_BUDGET
    }

    fn line(&self) -> String {
        format!(
            "idle wait: {} runs waited {:.1} s in all for a machine at least 90% idle (longest {:.1} s; {} gave up after {} s{})",
            self.runs,
            self.total.as_secs_f64(),
            self.longest.as_secs_f64(),
            self.gave_up,
            QUIESCE_MAX.as_secs(),
            if self.spent() {
                format!("; the {} s budget ran out, and later runs did not wait", QUIESCE_BUDGET.as_secs())
            } else {
                String::new()
            }
        )
    }
}

async fn records(client: &idemraft_client::Client) -> Result<u64, String> {
    client.node_status(0).await.map(|s| s.records).map_err(|e| format!("status: {e}"))
}

async fn load(args: LoadArgs) -> Result<(), String> {
    let spec = Spec {
        name: "load".into(),
        kind: target::Kind::Idemraft,
        endpoints: args.cluster.endpoints.clone(),
        pids: args.cluster.pids.clone(),
        only: Vec::new(),
    };
    target::prepare(&spec).await?;
    let client = idemraft_client::Client::connect(args.cluster.endpoints.iter().cloned()).map_err(|e| e.to_string())?;
    let procs = Procs::new(args.cluster.pids.clone());
    let before_records = records(&client).await?;
    let before_rss = procs.rss_bytes();
    let disk_of = || -> u64 { args.cluster.data_dirs.iter().map(|d| procstat::dir_bytes(d)).sum() };
    let before_disk = disk_of();
    let nodes = args.cluster.pids.len().max(1) as f64;
    let t = Instant::now();
    // In slices, so a cap on time stops it between slices and progress shows.
    let slice = 50_000usize;
    let mut loaded = 0usize;
    let prefix = run_prefix();
    let mut part = 0;
    let mut stopped = None;
    while loaded < args.records && t.elapsed() < Duration::from_secs(args.max_secs) {
        let n = slice.min(args.records - loaded);
        part += 1;
        match workload::completed_keys(&spec, &format!("{prefix}-{part}"), n, args.clients, args.body_bytes).await {
            Ok(keys) => loaded += keys.len(),
            // Report what was loaded rather than nothing; the figures say it stopped early.
            Err(e) => {
                stopped = Some(e);
                break;
            }
        }
        eprintln!("{}loaded {loaded} records in {:.0?}", progress(loaded, args.records, t.elapsed()), t.elapsed());
    }
    if let Some(e) = &stopped {
        println!("load: stopped early after about {loaded} records: {e}");
    }
    let secs = t.elapsed().as_secs_f64();
    // Let the last applies and a snapshot settle before reading memory.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_records = records(&client).await?;
    let rss = procs.rss_bytes();
    let hwm = procs.peak_rss_bytes();
    let disk = disk_of();
    let added = after_records.saturating_sub(before_records).max(1);
    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!(
        "load: {loaded} completed records ({}-byte responses) in {secs:.0} s = {:.0} cycles/s",
        args.body_bytes,
        loaded as f64 / secs
    );
    println!(
        "load: records per node {after_records}; RSS per node {:.0} MiB (peak {:.0} MiB), was {:.0} MiB before the load",
        mib(rss as f64 / nodes),
        mib(hwm as f64 / nodes),
        mib(before_rss as f64 / nodes)
    );
    println!(
        "load: memory per added record {:.0} bytes (RSS growth per node / records added); disk per record {:.0} bytes ({:.0} MiB per node data dir / records)",
        (rss.saturating_sub(before_rss) as f64 / nodes) / added as f64,
        (disk as f64 / nodes) / after_records.max(1) as f64,
        mib(disk as f64 / nodes)
    );
    // The records there before (another run's, of other sizes) are not this load's: what an
    // added record costs is the growth.
    println!(
        "load: disk growth per added record {:.0} bytes ({:.0} MiB per node before the load)",
        (disk.saturating_sub(before_disk) as f64 / nodes) / added as f64,
        mib(before_disk as f64 / nodes)
    );
    // What an operator sizes disks and memory by: bytes per byte of stored response.
    let payload = (added as f64) * args.body_bytes as f64;
    println!(
        "load: per added response byte, per node: disk growth {:.2} bytes, RSS growth {:.2} bytes ({:.0} MB of responses added)",
        (disk.saturating_sub(before_disk) as f64 / nodes) / payload.max(1.0),
        (rss.saturating_sub(before_rss) as f64 / nodes) / payload.max(1.0),
        payload / 1e6
    );
    Ok(())
}

/// `[done/total, elapsed, ~left] ` for a line of progress when standard error is a terminal;
/// empty otherwise, so logs and CI output keep their plain lines.
fn progress(done: usize, total: usize, elapsed: Duration) -> String {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() || done == 0 || total == 0 {
        return String::new();
    }
    let left = elapsed.as_secs_f64() * (total.saturating_sub(done)) as f64 / done as f64;
    format!("[{done}/{total}, {:.0} s elapsed, ~{:.0} s left] ", elapsed.as_secs_f64(), left)
}
