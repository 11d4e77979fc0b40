//! Checks the merged options as a whole and fills in the defaults, one section at a time:
//! addresses, Raft timing, batching, sizes, records and leases, then security (every file is
//! read now, so a typo refuses the start rather than the first handshake).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use idemraft_store::Limits;

use super::parse::*;
use super::{Config, ConfigError, LogFormat, Options, MAX_STREAMS_PER_CONNECTION};

/// Where a node listens and how it is reached.
struct Addresses {
    initial_cluster: BTreeMap<u64, String>,
    peer_addr: SocketAddr,
    client_addr: SocketAddr,
    http_addr: SocketAddr,
    advertise_client_addr: String,
}

/// Leases, retention and the sweeper.
struct Records {
    default_lease: Duration,
    default_ttl: Duration,
    scope_retention: BTreeMap<String, Duration>,
    sweep_interval: Duration,
    sweep_limit: u32,
    max_resume_stretch: Duration,
}

impl Options {
    /// Checks everything and fills in the defaults.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let id = self.resolve_id()?;
        let a = self.resolve_addresses(id)?;
        let (heartbeat, election_timeout) = self.resolve_timing()?;
        let (batch_max, batch_wait, max_inflight_batches) = self.resolve_batching()?;
        let (limits, entry_max_bytes, replication_max_bytes) = self.resolve_sizes()?;
        let r = self.resolve_records(&limits)?;
        let (request_timeout, snapshot_every, log_format) = self.resolve_runtime()?;
        let (max_pending_writes, max_streams_per_connection) = self.resolve_queues()?;
        let mut config = Config {
            id,
            client_addr: a.client_addr,
            advertise_client_addr: a.advertise_client_addr,
            peer_addr: a.peer_addr,
            http_addr: a.http_addr,
            data_dir: self.data_dir.clone().unwrap_or_else(|| PathBuf::from(format!("data/node-{id}"))),
            initial_cluster: a.initial_cluster,
            heartbeat,
            election_timeout,
            batch_max,
            entry_max_bytes,
            replication_max_bytes,
            batch_wait,
            max_inflight_batches,
            replay_fast_path: self.replay_fast_path.unwrap_or(true),
            compress_commands: self.compress_commands.unwrap_or(true),
            default_lease: r.default_lease,
            default_ttl: r.default_ttl,
            scope_retention: r.scope_retention,
            limits,
            sweep_interval: r.sweep_interval,
            sweep_limit: r.sweep_limit,
            max_resume_stretch: r.max_resume_stretch,
            request_timeout,
            snapshot_every,
            snapshot_log_bytes: self.resolve_snapshot_log_bytes(entry_max_bytes)?,
            snapshot_rate: self.resolve_snapshot_rate()?,
            db_cache_bytes: self.resolve_db_cache_bytes()?,
            log_format,
            peer_routes: match &self.peer_route {
                Some(text) => parse_id_addrs("--peer-route", text)?,
                None => BTreeMap::new(),
            },
            planted_bugs: match &self.unsafe_planted_bugs {
                Some(text) => parse_planted_bugs(text)?,
                None => Vec::new(),
            },
            max_pending_writes,
            max_streams_per_connection,
            initial_cluster_token: check_token(self.initial_cluster_token.as_deref())?,
            restore_from: self.resolve_restore()?,
            client_tls: None,
            peer_tls: None,
            insecure_plaintext: self.insecure_plaintext,
            tokens_file: None,
        };
        self.resolve_security(&mut config)?;
        Ok(config)
    }

    /// The node id: set, and small enough to offset the default ports.
    fn resolve_id(&self) -> Result<u64, ConfigError> {
        let id = self.id.ok_or_else(|| {
            bad("--id", "is not set", "give every node a unique positive id, e.g. --id 1 (or IDEMRAFT_ID=1)")
        })?;
        if id == 0 || id > 65_000 {
            return Err(bad("--id", format!("{id} is out of range"), "use an id from 1 to 65000"));
        }
        Ok(id)
    }

    /// The founding members and this node's listeners; defaults derive from the id.
    fn resolve_addresses(&self, id: u64) -> Result<Addresses, ConfigError> {
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

        Ok(Addresses { initial_cluster, peer_addr, client_addr, http_addr, advertise_client_addr })
    }

    /// Heartbeat and election timeouts, which must leave room for several heartbeats.
    fn resolve_timing(&self) -> Result<(Duration, (Duration, Duration)), ConfigError> {
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

        Ok((heartbeat, (emin, emax)))
    }

    /// How the proposer groups commands into entries.
    fn resolve_batching(&self) -> Result<(usize, Duration, usize), ConfigError> {
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

        Ok((batch_max, batch_wait, max_inflight_batches))
    }

    /// The record limits and the entry and message byte budgets that follow from them.
    fn resolve_sizes(&self) -> Result<(Limits, usize, usize), ConfigError> {
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
        let min_ttl = duration("--min-ttl", self.min_ttl.as_ref(), "60s")?;
        let min_ttl_ms = u64::try_from(min_ttl.as_millis()).unwrap_or(u64::MAX);
        if min_ttl_ms < Limits::CEILING.ttl_min_ms || min_ttl_ms > limits.ttl_max_ms {
            return Err(bad(
                "--min-ttl",
                format!("{min_ttl:?} is out of range"),
                format!("use {} ms to {} ms", Limits::CEILING.ttl_min_ms, limits.ttl_max_ms),
            ));
        }
        limits.ttl_min_ms = min_ttl_ms;
        let (entry_max_bytes, replication_max_bytes) =
            byte_budgets(&limits, self.entry_max_bytes, self.replication_max_bytes)?;
        limits
            .check_config()
            .map_err(|e| bad("--max-response-bytes", e.to_string(), "stay within the documented bounds"))?;

        Ok((limits, entry_max_bytes, replication_max_bytes))
    }

    /// Leases, retention and the sweeper, within the limits.
    fn resolve_records(&self, limits: &Limits) -> Result<Records, ConfigError> {
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
        ttl_in_bounds("--default-ttl", default_ttl, limits)?;
        let scope_retention = match &self.scope_retention {
            Some(text) => parse_scope_retention(text, limits)?,
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
        Ok(Records { default_lease, default_ttl, scope_retention, sweep_interval, sweep_limit, max_resume_stretch })
    }

    /// The log size that triggers a snapshot: at least [`snapshot_log_floor`].
    fn resolve_snapshot_log_bytes(&self, entry_max_bytes: usize) -> Result<u64, ConfigError> {
        let bytes = self.snapshot_log_bytes.unwrap_or(512 * 1024 * 1024);
        let floor = snapshot_log_floor(entry_max_bytes);
        if bytes < floor {
            return Err(bad(
                "--snapshot-log-bytes",
                format!("{bytes} is too small"),
                format!("use at least {floor} (16 MiB, and four entries of --entry-max-bytes)"),
            ));
        }
        Ok(bytes)
    }

    /// The bound on one snapshot stream: 0 (none), or at least 1 MiB/s, below which a
    /// gigabyte state would take longer to send than its log takes to outgrow it.
    fn resolve_snapshot_rate(&self) -> Result<u64, ConfigError> {
        let rate = self.snapshot_rate.unwrap_or(128 * 1024 * 1024);
        if rate != 0 && rate < 1024 * 1024 {
            return Err(bad(
                "--snapshot-rate",
                format!("{rate} bytes per second is too slow to catch a follower up"),
                "use 0 (no bound) or at least 1048576 (1 MiB/s)",
            ));
        }
        Ok(rate)
    }

    /// sled's page cache: at least 1 MiB, below which every lookup of a record reads the tree
    /// from disk again.
    fn resolve_db_cache_bytes(&self) -> Result<u64, ConfigError> {
        let bytes = self.db_cache_bytes.unwrap_or(idemraft_store::DB_CACHE_BYTES);
        if bytes < 1024 * 1024 {
            return Err(bad(
                "--db-cache-bytes",
                format!("{bytes} bytes is too small a cache"),
                format!(
                    "use at least 1048576 (1 MiB); the default is {} ({} MiB)",
                    idemraft_store::DB_CACHE_BYTES,
                    idemraft_store::DB_CACHE_BYTES >> 20
                ),
            ));
        }
        Ok(bytes)
    }

    /// Call deadlines, snapshot frequency and the log format.
    fn resolve_runtime(&self) -> Result<(Duration, u64, LogFormat), ConfigError> {
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
        Ok((request_timeout, snapshot_every, log_format))
    }

    /// How many writes may wait, and how many calls share one client connection.
    fn resolve_queues(&self) -> Result<(usize, u32), ConfigError> {
        let max_pending_writes = match self.max_pending_writes.unwrap_or(4096) {
            n @ 1..=1_000_000 => n,
            n => {
                return Err(bad(
                    "--max-pending-writes",
                    format!("{n} is out of range"),
                    "use 1 to 1000000 (the default 4096 absorbs bursts of thousands of callers)",
                ))
            }
        };
        let max_streams_per_connection = match self.max_streams_per_connection.unwrap_or(1024) {
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
        };
        Ok((max_pending_writes, max_streams_per_connection))
    }

    /// A restore founds a cluster, so it needs the founding members.
    fn resolve_restore(&self) -> Result<Option<PathBuf>, ConfigError> {
        let restore_from = match &self.restore_from {
            Some(_) if self.initial_cluster.is_none() => return Err(bad(
                "--restore-from",
                "is set without --initial-cluster",
                "a restore founds a new cluster: give every founding node the same --initial-cluster and the same file",
            )),
            other => other.clone(),
        };
        Ok(restore_from)
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

/// The smallest log worth a snapshot: 16 MiB and four of the largest entries, so a snapshot
/// never follows every entry.
pub fn snapshot_log_floor(entry_max_bytes: usize) -> u64 {
    (16 * 1024 * 1024u64).max(4 * entry_max_bytes as u64)
}
