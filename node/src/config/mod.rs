//! Node configuration: command-line flags, `IDEMRAFT_*` environment variables and an optional
//! TOML file, merged in that order of precedence (flags win), then checked as a whole. A bad
//! value is refused at start with a message that names the option and the fix, because a node
//! that starts half-configured is worse than one that does not start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use idemraft_store::planted::Bug;
use idemraft_store::Limits;
use serde::Deserialize;

pub use crate::error::ConfigError;

fn bad(option: &str, problem: impl Into<String>, fix: impl Into<String>) -> ConfigError {
    ConfigError { option: option.to_string(), problem: problem.into(), fix: fix.into() }
}

/// Every option of `idemraft`. Flags override `IDEMRAFT_*` variables, which override the file
/// given by `--config`; anything unset takes the default shown.
#[derive(Parser, Debug, Default, Clone, Deserialize)]
#[command(
    name = "idemraft",
    version,
    about = "Idemraft node: a Raft-replicated idempotency-key service",
    long_about = "Idemraft node: a Raft-replicated idempotency-key service.\n\n\
Every option can also be set with an IDEMRAFT_* environment variable (shown per option) or in a \
TOML file given with --config, using the flag's name as the key (e.g. `client-addr = \"127.0.0.1:7101\"`). \
Flags win over variables, variables over the file. Durations take a unit: 250ms, 5s, 10m, 24h, 7d."
)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Options {
    /// TOML file with any of the options below (keys are the flag names without dashes in front).
    #[arg(long, env = "IDEMRAFT_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// This node's id: a positive integer, unique in the cluster, never reused for a wiped node.
    #[arg(long, env = "IDEMRAFT_ID")]
    pub id: Option<u64>,

    /// Address the client and admin gRPC API listens on [default: 127.0.0.1:(7100+id)].
    #[arg(long, env = "IDEMRAFT_CLIENT_ADDR", value_name = "HOST:PORT")]
    pub client_addr: Option<SocketAddr>,

    /// Client address other nodes hand to callers as the leader's address [default: --client-addr].
    #[arg(long, env = "IDEMRAFT_ADVERTISE_CLIENT_ADDR", value_name = "HOST:PORT")]
    pub advertise_client_addr: Option<String>,

    /// Address the peer (Raft) gRPC service listens on [default: this node's entry in
    /// --initial-cluster, else 127.0.0.1:(7200+id)].
    #[arg(long, env = "IDEMRAFT_PEER_ADDR", value_name = "HOST:PORT")]
    pub peer_addr: Option<SocketAddr>,

    /// Address of the HTTP health endpoints /healthz, /readyz and /status [default: 127.0.0.1:(7300+id)].
    #[arg(long, env = "IDEMRAFT_HTTP_ADDR", value_name = "HOST:PORT")]
    pub http_addr: Option<SocketAddr>,

    /// Directory holding this node's log, state and snapshots [default: data/node-<id>].
    #[arg(long, env = "IDEMRAFT_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// The founding members, `ID=PEER_ADDR,...`, e.g. `1=127.0.0.1:7201,2=127.0.0.1:7202,3=127.0.0.1:7203`.
    /// Give every founding node the same list; forming the cluster is idempotent. Leave it out on a
    /// node that will join an existing cluster through `idemctl member add-learner`.
    #[arg(long, env = "IDEMRAFT_INITIAL_CLUSTER", value_name = "LIST")]
    pub initial_cluster: Option<String>,

    /// Leader heartbeat interval; also the deadline of one replication RPC [default: 100ms].
    #[arg(long, env = "IDEMRAFT_HEARTBEAT", value_name = "DURATION")]
    pub heartbeat: Option<String>,

    /// Shortest election timeout [default: 400ms].
    #[arg(long, env = "IDEMRAFT_ELECTION_TIMEOUT_MIN", value_name = "DURATION")]
    pub election_timeout_min: Option<String>,

    /// Longest election timeout [default: 800ms].
    #[arg(long, env = "IDEMRAFT_ELECTION_TIMEOUT_MAX", value_name = "DURATION")]
    pub election_timeout_max: Option<String>,

    /// Most client commands grouped into one log entry [default: 256].
    #[arg(long, env = "IDEMRAFT_BATCH_MAX", value_name = "N")]
    pub batch_max: Option<usize>,

    /// Most bytes of commands in one log entry; at least the largest command the limits admit
    /// (--max-response-bytes plus headers) [default: 1 MiB, or that command if larger].
    #[arg(long, env = "IDEMRAFT_ENTRY_MAX_BYTES", value_name = "BYTES")]
    pub entry_max_bytes: Option<usize>,

    /// Most bytes of entries one AppendEntries carries; at least --entry-max-bytes, at most 16 MiB.
    /// Each replication RPC must arrive within the heartbeat interval, so a follower catching up
    /// gets many small messages instead of one it cannot take in time [default: 4 MiB, or
    /// --entry-max-bytes if larger].
    #[arg(long, env = "IDEMRAFT_REPLICATION_MAX_BYTES", value_name = "BYTES")]
    pub replication_max_bytes: Option<usize>,

    /// How long the proposer waits for more commands before it proposes a batch. 0 groups only
    /// what queued while the previous batch was being written, which costs no latency [default: 0ms].
    #[arg(long, env = "IDEMRAFT_BATCH_WAIT", value_name = "DURATION")]
    pub batch_wait: Option<String>,

    /// Batches the proposer keeps in flight at once. openraft 0.9 writes one entry at a time
    /// anyway, so more than one in flight only splits what would have been one batch
    /// (measured: 1 beats 2, 4 and 8 at 64 and 256 clients) [default: 1].
    #[arg(long, env = "IDEMRAFT_MAX_INFLIGHT_BATCHES", value_name = "N")]
    pub max_inflight_batches: Option<usize>,

    /// Answer a claim on a COMPLETED record (or one whose fingerprint mismatches) on the leader
    /// with a linearizable read instead of a log append: a read-index round earns a leader
    /// lease of half the minimum election timeout, under which reads need no round trip
    /// (ARCHITECTURE.md explains the clock assumption); `true` or `false` [default: true].
    #[arg(long, env = "IDEMRAFT_REPLAY_FAST_PATH", value_name = "BOOL")]
    pub replay_fast_path: Option<bool>,

    /// Lease granted when a call asks for none [default: 30s].
    #[arg(long, env = "IDEMRAFT_DEFAULT_LEASE", value_name = "DURATION")]
    pub default_lease: Option<String>,

    /// Record lifetime and retention when a claim asks for none and its scope has no entry in
    /// --scope-retention [default: 24h].
    #[arg(long, env = "IDEMRAFT_DEFAULT_TTL", value_name = "DURATION")]
    pub default_ttl: Option<String>,

    /// Retention per scope, `SCOPE=DURATION,...`, e.g. `payments.create=7d,webhooks=1h`.
    #[arg(long, env = "IDEMRAFT_SCOPE_RETENTION", value_name = "LIST")]
    pub scope_retention: Option<String>,

    /// Largest stored response body in bytes, at most 4194304 [default: 262144].
    #[arg(long, env = "IDEMRAFT_MAX_RESPONSE_BYTES", value_name = "BYTES")]
    pub max_response_bytes: Option<usize>,

    /// How often the leader proposes an expiry sweep; at most 1s, so the log's clock keeps up
    /// with real time [default: 1s].
    #[arg(long, env = "IDEMRAFT_SWEEP_INTERVAL", value_name = "DURATION")]
    pub sweep_interval: Option<String>,

    /// Most expired records one sweep deletes [default: 1000].
    #[arg(long, env = "IDEMRAFT_SWEEP_LIMIT", value_name = "N")]
    pub sweep_limit: Option<u32>,

    /// Upper bound on how far a new leader pushes live leases back for the outage [default: 1m].
    #[arg(long, env = "IDEMRAFT_MAX_RESUME_STRETCH", value_name = "DURATION")]
    pub max_resume_stretch: Option<String>,

    /// Deadline of a call that brings no grpc-timeout of its own [default: 5s].
    #[arg(long, env = "IDEMRAFT_REQUEST_TIMEOUT", value_name = "DURATION")]
    pub request_timeout: Option<String>,

    /// Log entries between snapshots [default: 10000].
    #[arg(long, env = "IDEMRAFT_SNAPSHOT_EVERY", value_name = "N")]
    pub snapshot_every: Option<u64>,

    /// Log format: `text` or `json`. The level comes from RUST_LOG [default: text].
    #[arg(long, env = "IDEMRAFT_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,

    /// Addresses this node dials instead of a member's advertised peer address, `ID=HOST:PORT,...`
    /// (NAT, a sidecar, or a fault-injection proxy). Other nodes are not affected.
    #[arg(long, env = "IDEMRAFT_PEER_ROUTE", value_name = "LIST")]
    pub peer_route: Option<String>,

    /// FOR THE FAULT HARNESS ONLY: deliberately break a promise, to prove the checkers notice.
    /// Comma-separated names: skip-token-check, local-clock, ignore-leases, stale-local-reads.
    /// Never set this on a cluster that holds real data.
    #[arg(long, env = "IDEMRAFT_UNSAFE_PLANTED_BUGS", value_name = "LIST", hide_short_help = true)]
    pub unsafe_planted_bugs: Option<String>,

    /// Most writes queued on the leader for the next log entries. Past it a write is refused at
    /// once with RESOURCE_EXHAUSTED (never proposed, so safe to retry after a backoff) instead
    /// of waiting in an ever longer queue [default: 4096].
    #[arg(long, env = "IDEMRAFT_MAX_PENDING_WRITES", value_name = "N")]
    pub max_pending_writes: Option<usize>,
    /// Most calls one client connection may have open at once (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS), at most 2048. More wait in the client. The cap keeps
    /// a busy connection's unread request frames inside the HTTP/2 layer's small-frame
    /// budget, past which it closes the connection with every call on it [default: 1024].
    #[arg(long, env = "IDEMRAFT_MAX_STREAMS_PER_CONNECTION", value_name = "N")]
    pub max_streams_per_connection: Option<u32>,
    /// A name that, with --initial-cluster, makes up the cluster id the founders write into
    /// their data directories. Give a rebuilt or restored cluster on the same hosts a new
    /// token, so no old data directory can be mistaken for one of its own [default: empty].
    #[arg(long, env = "IDEMRAFT_INITIAL_CLUSTER_TOKEN", value_name = "NAME")]
    pub initial_cluster_token: Option<String>,

    /// Snapshot file (from `idemctl snapshot save`) to start a new cluster from. Give every
    /// founding node the same file and the same --initial-cluster, each on an empty data
    /// directory; on a directory already restored from this file it is ignored.
    #[arg(long, env = "IDEMRAFT_RESTORE_FROM", value_name = "FILE")]
    pub restore_from: Option<PathBuf>,
    /// Certificate chain (PEM) served on the client port. With --tls-key the client port
    /// speaks TLS only.
    #[arg(long, env = "IDEMRAFT_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "IDEMRAFT_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// CA (PEM) that client certificates must be signed by; set, the client port refuses
    /// clients without one [default: no client certificates asked for].
    #[arg(long, env = "IDEMRAFT_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// This node's certificate (PEM) for mutual TLS between peers: served on the peer port and
    /// presented when dialling a peer. Needs --peer-tls-key and --peer-tls-ca.
    #[arg(long, env = "IDEMRAFT_PEER_TLS_CERT", value_name = "FILE")]
    pub peer_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --peer-tls-cert.
    #[arg(long, env = "IDEMRAFT_PEER_TLS_KEY", value_name = "FILE")]
    pub peer_tls_key: Option<PathBuf>,

    /// CA (PEM) every peer's certificate must be signed by, both ways: the peer port refuses
    /// callers without such a certificate, and a dialled peer must present one valid for the
    /// host of its address.
    #[arg(long, env = "IDEMRAFT_PEER_TLS_CA", value_name = "FILE")]
    pub peer_tls_ca: Option<PathBuf>,

    /// Serve plaintext even on addresses other machines can reach. Without it, a port without
    /// TLS must listen on loopback (127.0.0.0/8, ::1) and peers must be loopback addresses.
    #[arg(long, env = "IDEMRAFT_INSECURE_PLAINTEXT")]
    #[serde(default)]
    pub insecure_plaintext: bool,

    /// Bearer tokens, hashed (TOML `[[token]]` entries with `sha256` and `tenant` or
    /// `admin = true`; see docs/security.md). Set, every client call needs a token, and the
    /// tenant of a record comes from it. Re-read on SIGHUP.
    #[arg(long, env = "IDEMRAFT_TOKENS_FILE", value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A checked configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// This node's id.
    pub id: u64,
    /// Client/admin gRPC listen address.
    pub client_addr: SocketAddr,
    /// Client address handed to callers.
    pub advertise_client_addr: String,
    /// Peer gRPC listen address.
    pub peer_addr: SocketAddr,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Founding members and their peer addresses; empty for a node that joins later.
    pub initial_cluster: BTreeMap<u64, String>,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Election timeout range.
    pub election_timeout: (Duration, Duration),
    /// Batch bound.
    pub batch_max: usize,
    /// Byte bound of one log entry's commands.
    pub entry_max_bytes: usize,
    /// Byte bound of one AppendEntries.
    pub replication_max_bytes: usize,
    /// Batch wait.
    pub batch_wait: Duration,
    /// Batches in flight.
    pub max_inflight_batches: usize,
    /// Settled claims answered by read index (see `fast_read`).
    pub replay_fast_path: bool,
    /// Default lease.
    pub default_lease: Duration,
    /// Default TTL.
    pub default_ttl: Duration,
    /// Retention per scope.
    pub scope_retention: BTreeMap<String, Duration>,
    /// Edge limits (stricter than or equal to the state machine's ceiling).
    pub limits: Limits,
    /// Sweep period.
    pub sweep_interval: Duration,
    /// Sweep batch.
    pub sweep_limit: u32,
    /// Resume stretch bound.
    pub max_resume_stretch: Duration,
    /// Default call deadline.
    pub request_timeout: Duration,
    /// Snapshot policy.
    pub snapshot_every: u64,
    /// Log format.
    pub log_format: LogFormat,
    /// Dial overrides per peer id.
    pub peer_routes: BTreeMap<u64, String>,
    /// Planted bugs (empty unless `--unsafe-planted-bugs`).
    pub planted_bugs: Vec<Bug>,
    /// Write queue bound on the leader.
    pub max_pending_writes: usize,
    /// HTTP/2 concurrent stream bound per client connection.
    pub max_streams_per_connection: u32,
    /// Part of the founders' cluster id (see `identity`).
    pub initial_cluster_token: String,
    /// Snapshot file to found a new cluster from (see `backup`).
    pub restore_from: Option<PathBuf>,
    /// TLS of the client port; `None`: plaintext.
    pub client_tls: Option<crate::security::tls::ClientPortTls>,
    /// Mutual TLS between peers; `None`: plaintext.
    pub peer_tls: Option<crate::security::tls::PeerTls>,
    /// Plaintext accepted on non-loopback addresses.
    pub insecure_plaintext: bool,
    /// The tokens file; `None`: no authentication, the tenant comes from the request.
    pub tokens_file: Option<PathBuf>,
}

/// Parses a duration such as `250ms`, `5s`, `10m`, `24h` or `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{text}' does not start with a whole number"))?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err(format!("'{text}' has no unit")),
        other => return Err(format!("'{text}' has an unknown unit '{other}'")),
    };
    n.checked_mul(ms_per).map(Duration::from_millis).ok_or_else(|| format!("'{text}' is too large"))
}

/// The most streams per client connection whose unread request frames fit the HTTP/2 layer's
/// small-frame budget. h2 (0.4.20) charges each buffered DATA frame of under 256 bytes up to 256
/// bytes against a per-connection budget of half the connection window (hyper's 1 MiB: 512 KiB)
/// and closes the connection with ENHANCE_YOUR_CALM when it runs out. A unary call sends its
/// message in one such frame, so 2048 streams can never exhaust it, however late the handlers
/// read.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 2048;

/// The largest `--replication-max-bytes`: a quarter of the peer port's message bound, so a
/// message cut at the budget (plus its one oversize entry, if any) never reaches that bound.
pub const MAX_REPLICATION_BYTES: usize = crate::wire::MAX_PEER_MESSAGE / 4;

/// The entry and AppendEntries byte budgets: the largest command `limits` admit fits one
/// entry, and one entry fits one message, whatever is configured.
fn byte_budgets(
    limits: &Limits,
    entry: Option<usize>,
    replication: Option<usize>,
) -> Result<(usize, usize), ConfigError> {
    let command = limits.max_command_bytes();
    let entry = entry.unwrap_or(command.max(1 << 20));
    if entry < command {
        return Err(bad(
            "--entry-max-bytes",
            format!("{entry} is smaller than the largest command the limits admit ({command} bytes)"),
            format!("use at least {command}, or lower --max-response-bytes"),
        ));
    }
    let replication = replication.unwrap_or(entry.max(4 << 20));
    if replication < entry || replication > MAX_REPLICATION_BYTES {
        return Err(bad(
            "--replication-max-bytes",
            format!("{replication} is out of range"),
            format!("use {entry} (--entry-max-bytes) to {MAX_REPLICATION_BYTES}"),
        ));
    }
    Ok((entry, replication))
}

const DURATION_FIX: &str = "write a whole number with a unit: ms, s, m, h or d (e.g. 500ms, 30s, 24h)";

fn duration(option: &str, value: Option<&String>, default: &str) -> Result<Duration, ConfigError> {
    let text = value.map(String::as_str).unwrap_or(default);
    parse_duration(text).map_err(|p| bad(option, p, DURATION_FIX))
}

/// Parses `ID=HOST:PORT,...` for `--initial-cluster`.
pub fn parse_initial_cluster(text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    parse_id_addrs("--initial-cluster", text)
}

/// Parses `--unsafe-planted-bugs`.
fn parse_planted_bugs(text: &str) -> Result<Vec<Bug>, ConfigError> {
    const OPT: &str = "--unsafe-planted-bugs";
    let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bug = Bug::from_name(name).ok_or_else(|| {
            bad(OPT, format!("'{name}' is not a planted bug"), format!("use one of {}", names.join(", ")))
        })?;
        if !out.contains(&bug) {
            out.push(bug);
        }
    }
    Ok(out)
}

fn parse_id_addrs(opt: &str, text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    const FIX: &str = "write ID=HOST:PORT entries separated by commas, e.g. 1=127.0.0.1:7201,2=127.0.0.1:7202";
    let mut out = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, addr) = entry.split_once('=').ok_or_else(|| bad(opt, format!("entry '{entry}' has no '='"), FIX))?;
        let id: u64 = id.trim().parse().map_err(|_| bad(opt, format!("'{id}' in '{entry}' is not a node id"), FIX))?;
        if id == 0 {
            return Err(bad(opt, format!("entry '{entry}' uses node id 0"), "node ids start at 1"));
        }
        let addr = addr.trim();
        check_host_port(addr).map_err(|p| bad(opt, format!("entry '{entry}': {p}"), FIX))?;
        if out.insert(id, addr.to_string()).is_some() {
            return Err(bad(opt, format!("node id {id} appears twice"), "give each node one entry"));
        }
    }
    if out.is_empty() {
        return Err(bad(opt, "the list is empty", FIX));
    }
    Ok(out)
}

fn check_host_port(addr: &str) -> Result<(), String> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("'{addr}' has no port"))?;
    if host.is_empty() {
        return Err(format!("'{addr}' has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("'{port}' in '{addr}' is not a port number")),
    }
}

fn parse_scope_retention(text: &str, limits: &Limits) -> Result<BTreeMap<String, Duration>, ConfigError> {
    const OPT: &str = "--scope-retention";
    const FIX: &str = "write SCOPE=DURATION entries separated by commas, e.g. payments.create=7d,webhooks=1h";
    let mut out = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (scope, d) = entry.split_once('=').ok_or_else(|| bad(OPT, format!("entry '{entry}' has no '='"), FIX))?;
        idemraft_store::validate::scope(scope).map_err(|e| bad(OPT, format!("entry '{entry}': {e}"), FIX))?;
        let d = parse_duration(d).map_err(|p| bad(OPT, format!("entry '{entry}': {p}"), DURATION_FIX))?;
        ttl_in_bounds(OPT, d, limits)?;
        out.insert(scope.to_string(), d);
    }
    Ok(out)
}

fn ttl_in_bounds(option: &str, d: Duration, limits: &Limits) -> Result<(), ConfigError> {
    let ms = d.as_millis() as u64;
    if ms < limits.ttl_min_ms || ms > limits.ttl_max_ms {
        return Err(bad(
            option,
            format!("{ms} ms is outside the TTL bounds {}..={} ms", limits.ttl_min_ms, limits.ttl_max_ms),
            "choose a retention between 1m and 30d",
        ));
    }
    Ok(())
}

impl Options {
    /// Parses flags and environment, then fills unset options from the `--config` file.
    pub fn load() -> Result<Options, ConfigError> {
        Options::parse().with_file()
    }

    /// Fills every unset option from the TOML file named by `config`, if any.
    pub fn with_file(self) -> Result<Options, ConfigError> {
        let Some(path) = self.config.clone() else { return Ok(self) };
        let file = read_file(&path)?;
        Ok(self.or(file))
    }

    fn or(self, f: Options) -> Options {
        Options {
            config: self.config,
            id: self.id.or(f.id),
            client_addr: self.client_addr.or(f.client_addr),
            advertise_client_addr: self.advertise_client_addr.or(f.advertise_client_addr),
            peer_addr: self.peer_addr.or(f.peer_addr),
            http_addr: self.http_addr.or(f.http_addr),
            data_dir: self.data_dir.or(f.data_dir),
            initial_cluster: self.initial_cluster.or(f.initial_cluster),
            heartbeat: self.heartbeat.or(f.heartbeat),
            election_timeout_min: self.election_timeout_min.or(f.election_timeout_min),
            election_timeout_max: self.election_timeout_max.or(f.election_timeout_max),
            batch_max: self.batch_max.or(f.batch_max),
            entry_max_bytes: self.entry_max_bytes.or(f.entry_max_bytes),
            replication_max_bytes: self.replication_max_bytes.or(f.replication_max_bytes),
            batch_wait: self.batch_wait.or(f.batch_wait),
            max_inflight_batches: self.max_inflight_batches.or(f.max_inflight_batches),
            replay_fast_path: self.replay_fast_path.or(f.replay_fast_path),
            default_lease: self.default_lease.or(f.default_lease),
            default_ttl: self.default_ttl.or(f.default_ttl),
            scope_retention: self.scope_retention.or(f.scope_retention),
            max_response_bytes: self.max_response_bytes.or(f.max_response_bytes),
            sweep_interval: self.sweep_interval.or(f.sweep_interval),
            sweep_limit: self.sweep_limit.or(f.sweep_limit),
            max_resume_stretch: self.max_resume_stretch.or(f.max_resume_stretch),
            request_timeout: self.request_timeout.or(f.request_timeout),
            snapshot_every: self.snapshot_every.or(f.snapshot_every),
            log_format: self.log_format.or(f.log_format),
            peer_route: self.peer_route.or(f.peer_route),
            unsafe_planted_bugs: self.unsafe_planted_bugs.or(f.unsafe_planted_bugs),
            max_pending_writes: self.max_pending_writes.or(f.max_pending_writes),
            max_streams_per_connection: self.max_streams_per_connection.or(f.max_streams_per_connection),
            initial_cluster_token: self.initial_cluster_token.or(f.initial_cluster_token),
            restore_from: self.restore_from.or(f.restore_from),
            tls_cert: self.tls_cert.or(f.tls_cert),
            tls_key: self.tls_key.or(f.tls_key),
            tls_client_ca: self.tls_client_ca.or(f.tls_client_ca),
            peer_tls_cert: self.peer_tls_cert.or(f.peer_tls_cert),
            peer_tls_key: self.peer_tls_key.or(f.peer_tls_key),
            peer_tls_ca: self.peer_tls_ca.or(f.peer_tls_ca),
            insecure_plaintext: self.insecure_plaintext || f.insecure_plaintext,
            tokens_file: self.tokens_file.or(f.tokens_file),
        }
    }

    /// Checks everything and fills in the defaults.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let id = self.id.ok_or_else(|| {
            bad("--id", "is not set", "give every node a unique positive id, e.g. --id 1 (or IDEMRAFT_ID=1)")
        })?;
        if id == 0 || id > 65_000 {
            return Err(bad("--id", format!("{id} is out of range"), "use an id from 1 to 65000"));
        }
        let port = |base: u16| u16::try_from(id).ok().and_then(|i| base.checked_add(i)).unwrap_or(base);
        let local = |base: u16| SocketAddr::from(([127, 0, 0, 1], port(base)));
        let initial_cluster = match &self.initial_cluster {
            Some(text) => {
                let members = parse_initial_cluster(text)?;
                if !members.contains_key(&id) {
                    return Err(bad(
                        "--initial-cluster",
                        format!("it does not list this node's id {id}"),
                        "list every founding node including this one, or leave the option out on a node that joins later",
                    ));
                }
                members
            }
            None => BTreeMap::new(),
        };
        let peer_addr = match (self.peer_addr, initial_cluster.get(&id)) {
            (Some(a), _) => a,
            (None, Some(listed)) => listed.parse().map_err(|_| {
                bad(
                    "--peer-addr",
                    format!("this node's --initial-cluster address '{listed}' is not a local IP:PORT to listen on"),
                    "set --peer-addr to the IP:PORT this node should listen on",
                )
            })?,
            (None, None) => local(7200),
        };
        let client_addr = self.client_addr.unwrap_or_else(|| local(7100));
        let http_addr = self.http_addr.unwrap_or_else(|| local(7300));
        let distinct = [client_addr, peer_addr, http_addr];
        if distinct[0] == distinct[1] || distinct[0] == distinct[2] || distinct[1] == distinct[2] {
            return Err(bad(
                "--client-addr/--peer-addr/--http-addr",
                format!("two of them are the same address ({client_addr}, {peer_addr}, {http_addr})"),
                "give each listener its own port",
            ));
        }
        let advertise_client_addr = self.advertise_client_addr.clone().unwrap_or_else(|| client_addr.to_string());
        check_host_port(&advertise_client_addr)
            .map_err(|p| bad("--advertise-client-addr", p, "write HOST:PORT, e.g. node1.internal:7101"))?;

        let heartbeat = duration("--heartbeat", self.heartbeat.as_ref(), "100ms")?;
        let emin = duration("--election-timeout-min", self.election_timeout_min.as_ref(), "400ms")?;
        let emax = duration("--election-timeout-max", self.election_timeout_max.as_ref(), "800ms")?;
        if heartbeat < Duration::from_millis(10) {
            return Err(bad("--heartbeat", format!("{heartbeat:?} is too short"), "use at least 10ms"));
        }
        if emin <= heartbeat * 2 {
            return Err(bad(
                "--election-timeout-min",
                format!("{emin:?} is not more than twice the heartbeat {heartbeat:?}"),
                "make the election timeout several heartbeats long (e.g. heartbeat 100ms, election 400ms..800ms)",
            ));
        }
        if emax <= emin {
            return Err(bad(
                "--election-timeout-max",
                format!("{emax:?} is not greater than --election-timeout-min {emin:?}"),
                "the range needs room to randomise, e.g. 400ms..800ms",
            ));
        }

        let batch_max = self.batch_max.unwrap_or(256);
        // One slot of an entry is kept for the Resume a new term's first entry carries.
        let most_commands = idemraft_store::Token::MAX_BATCH - 1;
        if batch_max == 0 || batch_max > most_commands {
            return Err(bad(
                "--batch-max",
                format!("{batch_max} is out of range"),
                format!("use 1 to {most_commands} (an entry numbers at most {} commands, one of them kept for the leader's own Resume)", idemraft_store::Token::MAX_BATCH),
            ));
        }
        let batch_wait = duration("--batch-wait", self.batch_wait.as_ref(), "0ms")?;
        if batch_wait > Duration::from_millis(100) {
            return Err(bad(
                "--batch-wait",
                format!("{batch_wait:?} would add that much to every write"),
                "use at most 100ms (0ms is usually best)",
            ));
        }
        let max_inflight_batches = self.max_inflight_batches.unwrap_or(1);
        if max_inflight_batches == 0 || max_inflight_batches > 64 {
            return Err(bad(
                "--max-inflight-batches",
                format!("{max_inflight_batches} is out of range"),
                "use 1 to 64",
            ));
        }

        let mut limits = Limits::DEFAULT;
        let max_response = self.max_response_bytes.unwrap_or(limits.body_max_bytes);
        if max_response == 0 || max_response > Limits::CEILING.body_max_bytes {
            return Err(bad(
                "--max-response-bytes",
                format!("{max_response} is out of range"),
                format!("use 1 to {}", Limits::CEILING.body_max_bytes),
            ));
        }
        limits.body_max_bytes = max_response;
        let (entry_max_bytes, replication_max_bytes) =
            byte_budgets(&limits, self.entry_max_bytes, self.replication_max_bytes)?;
        limits
            .check_config()
            .map_err(|e| bad("--max-response-bytes", e.to_string(), "stay within the documented bounds"))?;

        let default_lease = duration("--default-lease", self.default_lease.as_ref(), "30s")?;
        let lease_ms = default_lease.as_millis() as u64;
        if lease_ms < limits.lease_min_ms || lease_ms > limits.lease_max_ms {
            return Err(bad(
                "--default-lease",
                format!("{lease_ms} ms is outside {}..={} ms", limits.lease_min_ms, limits.lease_max_ms),
                "choose a lease between 1s and 10m",
            ));
        }
        let default_ttl = duration("--default-ttl", self.default_ttl.as_ref(), "24h")?;
        ttl_in_bounds("--default-ttl", default_ttl, &limits)?;
        let scope_retention = match &self.scope_retention {
            Some(text) => parse_scope_retention(text, &limits)?,
            None => BTreeMap::new(),
        };

        let sweep_interval = duration("--sweep-interval", self.sweep_interval.as_ref(), "1s")?;
        if sweep_interval < Duration::from_millis(10) || sweep_interval > Duration::from_secs(1) {
            return Err(bad(
                "--sweep-interval",
                format!("{sweep_interval:?} is out of range"),
                "use 10ms to 1s: the sweep is what keeps the log's clock close to real time",
            ));
        }
        let sweep_limit = self.sweep_limit.unwrap_or(1000);
        if sweep_limit == 0 || sweep_limit > limits.sweep_limit_max {
            return Err(bad(
                "--sweep-limit",
                format!("{sweep_limit} is out of range"),
                format!("use 1 to {}", limits.sweep_limit_max),
            ));
        }
        let max_resume_stretch = duration("--max-resume-stretch", self.max_resume_stretch.as_ref(), "1m")?;
        if max_resume_stretch.as_millis() as u64 > limits.lease_max_ms {
            return Err(bad(
                "--max-resume-stretch",
                format!("{max_resume_stretch:?} is longer than the longest lease"),
                "use at most 10m",
            ));
        }
        let request_timeout = duration("--request-timeout", self.request_timeout.as_ref(), "5s")?;
        if request_timeout < Duration::from_millis(100) || request_timeout > Duration::from_secs(600) {
            return Err(bad("--request-timeout", format!("{request_timeout:?} is out of range"), "use 100ms to 10m"));
        }
        let snapshot_every = self.snapshot_every.unwrap_or(10_000);
        if snapshot_every < 100 {
            return Err(bad("--snapshot-every", format!("{snapshot_every} is too small"), "use at least 100 entries"));
        }
        let log_format = match self.log_format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(bad("--log-format", format!("'{other}' is not a format"), "use text or json")),
        };
        let mut config = Config {
            id,
            client_addr,
            advertise_client_addr,
            peer_addr,
            http_addr,
            data_dir: self.data_dir.clone().unwrap_or_else(|| PathBuf::from(format!("data/node-{id}"))),
            initial_cluster,
            heartbeat,
            election_timeout: (emin, emax),
            batch_max,
            entry_max_bytes,
            replication_max_bytes,
            batch_wait,
            max_inflight_batches,
            replay_fast_path: self.replay_fast_path.unwrap_or(true),
            default_lease,
            default_ttl,
            scope_retention,
            limits,
            sweep_interval,
            sweep_limit,
            max_resume_stretch,
            request_timeout,
            snapshot_every,
            log_format,
            peer_routes: match &self.peer_route {
                Some(text) => parse_id_addrs("--peer-route", text)?,
                None => BTreeMap::new(),
            },
            planted_bugs: match &self.unsafe_planted_bugs {
                Some(text) => parse_planted_bugs(text)?,
                None => Vec::new(),
            },
            max_pending_writes: match self.max_pending_writes.unwrap_or(4096) {
                n @ 1..=1_000_000 => n,
                n => {
                    return Err(bad(
                        "--max-pending-writes",
                        format!("{n} is out of range"),
                        "use 1 to 1000000 (the default 4096 absorbs bursts of thousands of callers)",
                    ))
                }
            },
            max_streams_per_connection: match self.max_streams_per_connection.unwrap_or(1024) {
                n @ 1..=MAX_STREAMS_PER_CONNECTION => n,
                n => {
                    return Err(bad(
                        "--max-streams-per-connection",
                        format!("{n} is out of range"),
                        format!(
                            "use 1 to {MAX_STREAMS_PER_CONNECTION} (more calls per connection would let their unread \
                             frames exhaust the HTTP/2 small-frame budget; open more connections instead)"
                        ),
                    ))
                }
            },
            initial_cluster_token: check_token(self.initial_cluster_token.as_deref())?,
            restore_from: match &self.restore_from {
                Some(_) if self.initial_cluster.is_none() => {
                    return Err(bad(
                        "--restore-from",
                        "is set without --initial-cluster",
                        "a restore founds a new cluster: give every founding node the same --initial-cluster and the same file",
                    ))
                }
                other => other.clone(),
            },
            client_tls: None,
            peer_tls: None,
            insecure_plaintext: self.insecure_plaintext,
            tokens_file: None,
        };
        self.resolve_security(&mut config)?;
        Ok(config)
    }

    /// TLS files, the plaintext rule and the tokens file: every file is read and checked now,
    /// so a typo refuses the start instead of surfacing at the first handshake.
    fn resolve_security(&self, config: &mut Config) -> Result<(), ConfigError> {
        use crate::security::tls::{load_cert, load_key};
        config.client_tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(crate::security::tls::ClientPortTls {
                cert: load_cert("--tls-cert", cert)?,
                key: load_key("--tls-key", key)?,
                client_ca: match &self.tls_client_ca {
                    Some(ca) => Some(load_cert("--tls-client-ca", ca)?),
                    None => None,
                },
            }),
            (None, None) if self.tls_client_ca.is_some() => {
                return Err(bad(
                    "--tls-client-ca",
                    "is set but the client port has no TLS",
                    "give --tls-cert and --tls-key too: client certificates are checked only over TLS",
                ))
            }
            (None, None) => None,
            (Some(_), None) => {
                return Err(bad("--tls-key", "is not set but --tls-cert is", "give both, or neither for plaintext"))
            }
            (None, Some(_)) => {
                return Err(bad("--tls-cert", "is not set but --tls-key is", "give both, or neither for plaintext"))
            }
        };
        config.peer_tls = match (&self.peer_tls_cert, &self.peer_tls_key, &self.peer_tls_ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => Some(crate::security::tls::PeerTls {
                cert: load_cert("--peer-tls-cert", cert)?,
                key: load_key("--peer-tls-key", key)?,
                ca: load_cert("--peer-tls-ca", ca)?,
            }),
            (cert, key, _) => {
                let missing = if cert.is_none() {
                    "--peer-tls-cert"
                } else if key.is_none() {
                    "--peer-tls-key"
                } else {
                    "--peer-tls-ca"
                };
                return Err(bad(
                    missing,
                    "is not set but another --peer-tls-* option is",
                    "mutual TLS between peers needs all three: --peer-tls-cert, --peer-tls-key and --peer-tls-ca",
                ));
            }
        };
        let peers: Vec<&str> =
            config.initial_cluster.values().chain(config.peer_routes.values()).map(String::as_str).collect();
        crate::security::tls::check_plaintext(
            config.insecure_plaintext,
            (config.client_addr, config.client_tls.is_some()),
            (config.peer_addr, config.peer_tls.is_some()),
            &peers,
        )?;
        if let Some(path) = &self.tokens_file {
            crate::security::auth::TokenSet::load(path).map_err(|problem| {
                bad(
                    "--tokens-file",
                    problem,
                    "fix the entry (see docs/security.md: [[token]] with sha256 = \"<64 hex>\" and tenant = \"...\" or admin = true; `idemctl token new` makes one)",
                )
            })?;
            config.tokens_file = Some(path.clone());
        }
        Ok(())
    }
}

fn check_token(token: Option<&str>) -> Result<String, ConfigError> {
    let token = token.unwrap_or("").trim();
    if token.len() > 200 || token.chars().any(char::is_control) {
        return Err(bad(
            "--initial-cluster-token",
            "is longer than 200 bytes or holds control characters",
            "use a short printable name, e.g. payments-prod-2025-06",
        ));
    }
    Ok(token.to_string())
}

fn read_file(path: &Path) -> Result<Options, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        bad("--config", format!("cannot read {}: {e}", path.display()), "check the path and its permissions")
    })?;
    toml::from_str(&text).map_err(|e| {
        bad(
            "--config",
            format!("{} is not a valid config file: {e}", path.display()),
            "use the flag names as keys, e.g. id = 1, client-addr = \"127.0.0.1:7101\"",
        )
    })
}

impl Config {
    /// Retention (TTL) for a claim that asked for none.
    pub fn ttl_for(&self, scope: &str) -> Duration {
        self.scope_retention.get(scope).copied().unwrap_or(self.default_ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(id: u64) -> Options {
        Options { id: Some(id), ..Options::default() }
    }

    #[test]
    fn defaults_follow_the_id() {
        let c = opts(2).resolve().map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.client_addr.to_string(), "127.0.0.1:7102");
        assert_eq!(c.peer_addr.to_string(), "127.0.0.1:7202");
        assert_eq!(c.http_addr.to_string(), "127.0.0.1:7302");
        assert_eq!(c.data_dir, PathBuf::from("data/node-2"));
    }

    /// Whatever sizes are configured, the largest admitted command fits one entry, one entry
    /// fits one AppendEntries, and an AppendEntries cut at its budget plus one oversize entry
    /// stays under the peer port's message bound.
    #[test]
    fn no_accepted_size_configuration_lets_a_message_pass_the_peer_bound() {
        let sizes = [None, Some(300 * 1024), Some(1 << 20), Some(4 << 20), Some(16 << 20), Some(64 << 20)];
        let mut accepted = 0;
        for response in [None, Some(1024), Some(256 * 1024), Some(4 << 20)] {
            for entry in sizes {
                for replication in sizes {
                    let o = Options {
                        max_response_bytes: response,
                        entry_max_bytes: entry,
                        replication_max_bytes: replication,
                        ..opts(1)
                    };
                    let Ok(c) = o.resolve() else { continue };
                    accepted += 1;
                    assert!(c.limits.max_command_bytes() <= c.entry_max_bytes, "{o:?}");
                    assert!(c.entry_max_bytes <= c.replication_max_bytes, "{o:?}");
                    assert!(c.replication_max_bytes + c.entry_max_bytes < crate::wire::MAX_PEER_MESSAGE, "{o:?}");
                }
            }
        }
        assert!(accepted > 20, "only {accepted} configurations were accepted");
        let c = opts(1).resolve().map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.entry_max_bytes, c.replication_max_bytes), (1 << 20, 4 << 20));
    }

    #[test]
    fn bad_values_name_their_option() {
        let cases: Vec<(Options, &str)> = vec![
            (Options::default(), "--id"),
            (Options { initial_cluster: Some("1=127.0.0.1".into()), ..opts(1) }, "--initial-cluster"),
            (Options { initial_cluster: Some("2=127.0.0.1:7202".into()), ..opts(1) }, "--initial-cluster"),
            (Options { initial_cluster: Some("1=a:1,1=b:2".into()), ..opts(1) }, "--initial-cluster"),
            (Options { heartbeat: Some("100".into()), ..opts(1) }, "--heartbeat"),
            (Options { election_timeout_min: Some("150ms".into()), ..opts(1) }, "--election-timeout-min"),
            (Options { election_timeout_max: Some("300ms".into()), ..opts(1) }, "--election-timeout-max"),
            (Options { batch_max: Some(0), ..opts(1) }, "--batch-max"),
            (Options { batch_max: Some(idemraft_store::Token::MAX_BATCH), ..opts(1) }, "--batch-max"),
            (Options { entry_max_bytes: Some(64 * 1024), ..opts(1) }, "--entry-max-bytes"),
            (
                Options { max_response_bytes: Some(4 << 20), entry_max_bytes: Some(2 << 20), ..opts(1) },
                "--entry-max-bytes",
            ),
            (Options { replication_max_bytes: Some(512 * 1024), ..opts(1) }, "--replication-max-bytes"),
            (Options { replication_max_bytes: Some(1 << 30), ..opts(1) }, "--replication-max-bytes"),
            (Options { max_response_bytes: Some(1 << 30), ..opts(1) }, "--max-response-bytes"),
            (Options { default_lease: Some("1h".into()), ..opts(1) }, "--default-lease"),
            (Options { scope_retention: Some("bad scope!=1d".into()), ..opts(1) }, "--scope-retention"),
            (Options { sweep_interval: Some("5s".into()), ..opts(1) }, "--sweep-interval"),
            (Options { log_format: Some("xml".into()), ..opts(1) }, "--log-format"),
            (Options { http_addr: "127.0.0.1:7101".parse().ok(), ..opts(1) }, "--client-addr/--peer-addr/--http-addr"),
            (Options { peer_route: Some("2=nowhere".into()), ..opts(1) }, "--peer-route"),
            (Options { unsafe_planted_bugs: Some("ignore-leases,typo".into()), ..opts(1) }, "--unsafe-planted-bugs"),
            (Options { max_pending_writes: Some(0), ..opts(1) }, "--max-pending-writes"),
            (Options { max_streams_per_connection: Some(4096), ..opts(1) }, "--max-streams-per-connection"),
        ];
        for (o, option) in cases {
            match o.resolve() {
                Ok(_) => panic!("{o:?} was accepted"),
                Err(e) => assert_eq!(e.option, option, "{e}"),
            }
        }
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "id = 3\nbatch-max = 64\ndefault-lease = \"10s\"\n").unwrap_or_else(|e| panic!("{e}"));
        let o = Options { config: Some(path.clone()), batch_max: Some(8), ..Options::default() };
        let c = o.with_file().and_then(|o| o.resolve()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.id, 3);
        assert_eq!(c.batch_max, 8);
        assert_eq!(c.default_lease, Duration::from_secs(10));

        std::fs::write(&path, "id = 3\nbatch_maximum = 64\n").unwrap_or_else(|e| panic!("{e}"));
        let err = Options { config: Some(path), ..Options::default() }.with_file().err();
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("batch_maximum"), "{err}");
    }

    #[test]
    fn routes_and_planted_bugs_parse() {
        let o = Options {
            peer_route: Some("2=127.0.0.1:9002, 3=127.0.0.1:9003".into()),
            unsafe_planted_bugs: Some("ignore-leases,ignore-leases,stale-local-reads".into()),
            ..opts(1)
        };
        let c = o.resolve().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.peer_routes.get(&3).map(String::as_str), Some("127.0.0.1:9003"));
        assert_eq!(c.planted_bugs, vec![Bug::IgnoreLeases, Bug::StaleLocalReads]);
        assert!(opts(1).resolve().unwrap_or_else(|e| panic!("{e}")).planted_bugs.is_empty());
    }

    #[test]
    fn plaintext_beyond_loopback_is_refused_unless_chosen() {
        let open: Option<SocketAddr> = "0.0.0.0:7101".parse().ok();
        let err = Options { client_addr: open, ..opts(1) }.resolve().err().unwrap_or_else(|| panic!("accepted"));
        assert_eq!(err.option, "--client-addr");
        assert!(err.fix.contains("--tls-cert") && err.fix.contains("--insecure-plaintext"), "{err}");
        let remote_peer = Options { initial_cluster: Some("1=127.0.0.1:7201,2=10.1.2.3:7202".into()), ..opts(1) };
        let err = remote_peer.clone().resolve().err().unwrap_or_else(|| panic!("accepted"));
        assert_eq!(err.option, "--peer-addr");
        assert!(err.problem.contains("10.1.2.3:7202"), "{err}");
        assert!(Options { client_addr: open, insecure_plaintext: true, ..opts(1) }.resolve().is_ok());
        assert!(Options { insecure_plaintext: true, ..remote_peer }.resolve().is_ok());
        // Loopback needs no choice: the quick start and the tests run as they always did.
        let local =
            Options { initial_cluster: Some("1=127.0.0.1:7201,2=localhost:7202,3=[::1]:7203".into()), ..opts(1) };
        assert!(local.resolve().is_ok());
    }

    #[test]
    fn tls_files_are_read_and_checked_at_start() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let certs = idemraft_client::certs::generate(dir.path(), 1, &[]).unwrap_or_else(|e| panic!("{e}"));
        let (cert, key) = certs.nodes[0].clone();
        let missing = dir.path().join("missing.pem");
        let full = Options {
            tls_cert: Some(cert.clone()),
            tls_key: Some(key.clone()),
            tls_client_ca: Some(certs.ca.clone()),
            peer_tls_cert: Some(cert.clone()),
            peer_tls_key: Some(key.clone()),
            peer_tls_ca: Some(certs.ca.clone()),
            client_addr: "0.0.0.0:7101".parse().ok(),
            ..opts(1)
        };
        let c = full.clone().resolve().unwrap_or_else(|e| panic!("{e}"));
        assert!(c.client_tls.as_ref().is_some_and(|t| t.client_ca.is_some()) && c.peer_tls.is_some());
        assert!(!format!("{c:?}").contains("PRIVATE KEY"), "a logged config must not show keys");

        let cases: Vec<(Options, &str, String)> = vec![
            (Options { tls_cert: Some(missing.clone()), ..full.clone() }, "--tls-cert", missing.display().to_string()),
            (Options { tls_key: Some(cert.clone()), ..full.clone() }, "--tls-key", "no usable PEM private key".into()),
            (Options { tls_cert: Some(key.clone()), ..full.clone() }, "--tls-cert", "no PEM certificate".into()),
            (Options { tls_key: None, ..full.clone() }, "--tls-key", "is not set".into()),
            (Options { tls_cert: None, tls_key: None, ..full.clone() }, "--tls-client-ca", "no TLS".into()),
            (Options { peer_tls_ca: None, ..full.clone() }, "--peer-tls-ca", "all three".into()),
            (Options { peer_tls_ca: Some(missing.clone()), ..full.clone() }, "--peer-tls-ca", "cannot read".into()),
        ];
        for (o, option, says) in cases {
            match o.resolve() {
                Ok(_) => panic!("accepted, wanted an error on {option}"),
                Err(e) => {
                    assert_eq!(e.option, option, "{e}");
                    assert!(e.to_string().contains(&says), "wanted '{says}' in: {e}");
                }
            }
        }
    }

    #[test]
    fn a_bad_tokens_file_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("tokens.toml");
        let hash = "ab".repeat(32);
        std::fs::write(
            &path,
            format!(
                "[[token]]\ntenant = \"acme\"\nsha256 = \"{hash}\"\n\n[[token]]\nsha256 = \"zz\"\ntenant = \"b\"\n"
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let err = Options { tokens_file: Some(path.clone()), ..opts(1) }.resolve().err();
        let err = err.unwrap_or_else(|| panic!("accepted"));
        assert_eq!(err.option, "--tokens-file");
        assert!(err.problem.contains("tokens.toml line 6") && err.problem.contains("64 hex digits"), "{err}");
        std::fs::write(&path, format!("[[token]]\ntenant = \"acme\"\nsha256 = \"{hash}\"\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        let c = Options { tokens_file: Some(path.clone()), ..opts(1) }.resolve().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.tokens_file, Some(path));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("s").is_err());
    }
}
