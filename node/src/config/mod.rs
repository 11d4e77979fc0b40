//! Node configuration: command-line flags, `IDEMRAFT_*` environment variables and an optional
//! TOML file, merged in that order of precedence (flags win), then checked as a whole. A bad
//! value is refused at start with a message that names the option and the fix, because a node
//! that starts half-configured is worse than one that does not start.
//!
//! [`Options`] is what can be given (here), `parse` turns single values into typed ones, and
//! `resolve` checks the options section by section into a [`Config`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use idemraft_store::planted::Bug;
use idemraft_store::Limits;
use serde::Deserialize;

pub use crate::error::ConfigError;
use parse::bad;
pub use parse::{parse_duration, parse_initial_cluster};
pub use resolve::snapshot_log_floor;

mod parse;
mod resolve;
#[cfg(test)]
mod tests;

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

    /// Address of the HTTP port: the status page at /, /status.json, /healthz, /readyz, /status and /metrics [default: 127.0.0.1:(7300+id)].
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
    /// (docs/decisions/0011 explains the clock assumption); `true` or `false` [default: true].
    #[arg(long, env = "IDEMRAFT_REPLAY_FAST_PATH", value_name = "BOOL")]
    pub replay_fast_path: Option<bool>,

    /// As leader, compress a command whose response body or checkpoint data is 8 KiB or more
    /// (zstd) before logging and replicating it, once every other member is known to decode
    /// compressed commands (docs/decisions/0030). `false` keeps every new entry readable by the
    /// release before; `true` or `false` [default: true].
    #[arg(long, env = "IDEMRAFT_COMPRESS_COMMANDS", value_name = "BOOL")]
    pub compress_commands: Option<bool>,

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

    /// Shortest TTL/retention a claim may ask for, from 1s up to the 30-day maximum; lower it
    /// for short-lived dedup windows (and for tests of expiry) [default: 60s].
    #[arg(long, env = "IDEMRAFT_MIN_TTL", value_name = "DURATION")]
    pub min_ttl: Option<String>,

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

    /// Also take a snapshot (and purge the log behind it) once the log holds this many bytes
    /// of entries above the last snapshot, whatever their number: with large responses a few
    /// thousand entries are gigabytes [default: 512 MiB].
    #[arg(long, env = "IDEMRAFT_SNAPSHOT_LOG_BYTES", value_name = "BYTES")]
    pub snapshot_log_bytes: Option<u64>,

    /// Most bytes per second a leader streams a snapshot to one follower that fell behind the
    /// log, so catching one up leaves disk and network for live traffic; 0 sets no bound
    /// [default: 128 MiB].
    #[arg(long, env = "IDEMRAFT_SNAPSHOT_RATE", value_name = "BYTES")]
    pub snapshot_rate: Option<u64>,

    /// Most bytes sled keeps in its page cache. Records' bodies of 512 B and more are files
    /// beside sled, so the tree is small; a larger cache buys little but grows RSS toward it
    /// [default: 4 MiB].
    #[arg(long, env = "IDEMRAFT_DB_CACHE_BYTES", value_name = "BYTES")]
    pub db_cache_bytes: Option<u64>,

    /// Log format: `text` or `json`. The level comes from RUST_LOG [default: text].
    #[arg(long, env = "IDEMRAFT_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,

    /// Addresses this node dials instead of a member's advertised peer address, `ID=HOST:PORT,...`
    /// (NAT, a sidecar, or a fault-injection proxy). Other nodes are not affected.
    #[arg(long, env = "IDEMRAFT_PEER_ROUTE", value_name = "LIST")]
    pub peer_route: Option<String>,

    /// FOR THE FAULT HARNESS ONLY: deliberately break a promise, to prove the checkers notice.
    /// Comma-separated names: skip-token-check, local-clock, ignore-leases, stale-local-reads,
    /// early-lease-expiry, retry-new-token, replay-expired, ack-before-fsync, skip-dir-fsync,
    /// unsynced-snapshot.
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
    /// Large commands compressed by the leader (see `proposer`).
    pub compress_commands: bool,
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
    /// Snapshot once the log holds this many bytes above the last one.
    pub snapshot_log_bytes: u64,
    /// Bytes per second of one snapshot stream; 0: unbounded.
    pub snapshot_rate: u64,
    /// Bound of sled's page cache.
    pub db_cache_bytes: u64,
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
            compress_commands: self.compress_commands.or(f.compress_commands),
            default_lease: self.default_lease.or(f.default_lease),
            default_ttl: self.default_ttl.or(f.default_ttl),
            scope_retention: self.scope_retention.or(f.scope_retention),
            max_response_bytes: self.max_response_bytes.or(f.max_response_bytes),
            min_ttl: self.min_ttl.or(f.min_ttl),
            sweep_interval: self.sweep_interval.or(f.sweep_interval),
            sweep_limit: self.sweep_limit.or(f.sweep_limit),
            max_resume_stretch: self.max_resume_stretch.or(f.max_resume_stretch),
            request_timeout: self.request_timeout.or(f.request_timeout),
            snapshot_every: self.snapshot_every.or(f.snapshot_every),
            snapshot_log_bytes: self.snapshot_log_bytes.or(f.snapshot_log_bytes),
            snapshot_rate: self.snapshot_rate.or(f.snapshot_rate),
            db_cache_bytes: self.db_cache_bytes.or(f.db_cache_bytes),
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
