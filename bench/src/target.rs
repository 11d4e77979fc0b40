//! The systems under test and the one operation pair every workload is built from: claim a
//! key (create it if absent, else read what is there) and complete it with a response.
//!
//! | kind     | claim                                                       | complete            |
//! |----------|-------------------------------------------------------------|---------------------|
//! | idemraft | `Claim` through the SDK                                     | `Complete`          |
//! | etcd     | `Txn(If CreateRevision(k)==0 Then Put(k,p) Else Get(k))`    | `Put(k, c+body)`    |
//! | redis    | `SET k p NX PX ttl GET` (one round trip: nil means created) | `SET k c+body PX ttl` |
//! | postgres | `INSERT .. ON CONFLICT DO NOTHING` + read of the row, one statement | `UPDATE`     |
//!
//! The stores other than Idemraft keep a one-byte state marker in front of the value: `p`
//! (in progress) or `c` (completed, the response follows).

use std::sync::Arc;
use std::time::Duration;

use idemraft_client::{ClaimOptions, Client, ClientConfig, Outcome, StoredResponse};

/// Idemraft scope every benchmark key lives in.
pub const SCOPE: &str = "bench";
/// Record lifetime given to every store: long enough that nothing expires during a run.
pub const TTL_MS: u64 = 24 * 3600 * 1000;
/// gRPC targets share this many connections among their client tasks at most.
const GRPC_POOL: usize = 8;

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// Created: the caller owns the key; the token to complete it with.
    Acquired(u64),
    /// Completed before: the stored response's length.
    Replay(usize),
    /// Someone else holds it.
    InProgress,
}

/// Kinds of system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Idemraft, through its SDK.
    Idemraft,
    /// etcd v3 through etcd-client.
    Etcd,
    /// Redis through the redis crate.
    Redis,
    /// PostgreSQL through tokio-postgres.
    Postgres,
}

impl Kind {
    fn parse(s: &str) -> Result<Kind, String> {
        Ok(match s {
            "idemraft" => Kind::Idemraft,
            "etcd" => Kind::Etcd,
            "redis" => Kind::Redis,
            "postgres" => Kind::Postgres,
            other => return Err(format!("unknown kind '{other}': use idemraft, etcd, redis or postgres")),
        })
    }
}

/// One system under test, as given on the command line.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Name in the tables, e.g. `idemraft-3`.
    pub name: String,
    /// Which client to use.
    pub kind: Kind,
    /// `host:port` of every node.
    pub endpoints: Vec<String>,
    /// Server process ids, for CPU and memory.
    pub pids: Vec<u32>,
    /// Workloads this target runs (all when empty).
    pub only: Vec<String>,
}

impl Spec {
    /// Parses `name=N kind=K endpoints=A,B pids=1,2 [only=cycle,replay]`.
    pub fn parse(text: &str) -> Result<Spec, String> {
        let (mut name, mut kind, mut endpoints, mut pids, mut only) = (None, None, Vec::new(), Vec::new(), Vec::new());
        for part in text.split_whitespace() {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("'{part}' in --target is not key=value"))?;
            let list = || v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>();
            match k {
                "name" => name = Some(v.to_string()),
                "kind" => kind = Some(Kind::parse(v)?),
                "endpoints" => endpoints = list(),
                "pids" => {
                    pids = list()
                        .iter()
                        .map(|p| p.parse().map_err(|_| format!("pid '{p}' is not a number")))
                        .collect::<Result<_, _>>()?
                }
                "only" => only = list(),
                other => return Err(format!("unknown key '{other}' in --target")),
            }
        }
        let name = name.ok_or("--target needs name=")?;
        let kind = kind.ok_or("--target needs kind=")?;
        if endpoints.is_empty() {
            return Err(format!("target {name} has no endpoints="));
        }
        Ok(Spec { name, kind, endpoints, pids, only })
    }

    /// Whether this target runs `workload`.
    pub fn runs(&self, workload: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|w| w == workload)
    }
}

/// One client task's connection. Cloning shares the underlying connection.
#[derive(Clone)]
pub enum Conn {
    /// Idemraft SDK client (HTTP/2, shared by several tasks).
    Idemraft(Client),
    /// etcd KV client (HTTP/2, shared by several tasks).
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::KvClient>),
    /// One Redis connection per task.
    Redis(redis::aio::MultiplexedConnection),
    /// One PostgreSQL connection per task.
    Postgres(Arc<Pg>),
}

/// A PostgreSQL connection with its prepared statements.
pub struct Pg {
    client: tokio_postgres::Client,
    claim: tokio_postgres::Statement,
    complete: tokio_postgres::Statement,
}

const PG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS idem (
    k text PRIMARY KEY, state smallint NOT NULL, owner text NOT NULL, expires_ms bigint NOT NULL, resp bytea)";
// The CTE's insert is invisible to the outer query (one snapshot), so the joined row is the
// one that existed before: NULL when this statement created it.
const PG_CLAIM: &str = "WITH ins AS (
    INSERT INTO idem (k, state, owner, expires_ms) VALUES ($1, 0, $2, $3) ON CONFLICT (k) DO NOTHING RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM ins), i.state, i.resp FROM (SELECT 1) AS one LEFT JOIN idem i ON i.k = $1";
const PG_COMPLETE: &str = "UPDATE idem SET state = 1, resp = $2 WHERE k = $1 AND state = 0";

fn pg_config(endpoint: &str) -> Result<tokio_postgres::Config, String> {
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(|| format!("'{endpoint}' has no port"))?;
    let port: u16 = port.parse().map_err(|_| format!("'{port}' is not a port"))?;
    let mut c = tokio_postgres::Config::new();
    c.host(host).port(port).user("bench").dbname("postgres").connect_timeout(Duration::from_secs(5));
    Ok(c)
}

async fn pg_connect(endpoint: &str) -> Result<Pg, String> {
    let (client, connection) =
        pg_config(endpoint)?.connect(tokio_postgres::NoTls).await.map_err(|e| format!("postgres {endpoint}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let claim = client.prepare(PG_CLAIM).await.map_err(|e| format!("postgres prepare: {e}"))?;
    let complete = client.prepare(PG_COMPLETE).await.map_err(|e| format!("postgres prepare: {e}"))?;
    Ok(Pg { client, claim, complete })
}

fn redis_client(endpoint: &str) -> Result<redis::Client, String> {
    redis::Client::open(format!("redis://{endpoint}/")).map_err(|e| format!("redis {endpoint}: {e}"))
}

fn idemraft_client(spec: &Spec) -> Result<Client, String> {
    let mut config = ClientConfig::new(spec.endpoints.iter().cloned());
    config.deadline = Duration::from_secs(5);
    Client::new(config).map_err(|e| format!("idemraft client: {e}"))
}

/// The etcd member that leads, so the driver talks to it directly (etcd's own benchmark does
/// the same with --target-leader; a follower would forward every request).
#[cfg(feature = "etcd")]
async fn etcd_leader(endpoints: &[String]) -> Result<String, String> {
    for ep in endpoints {
        let Ok(mut c) = etcd_client::Client::connect([ep.as_str()], None).await else { continue };
        if let Ok(s) = c.status().await {
            if s.header().map(|h| h.member_id()) == Some(s.leader()) {
                return Ok(ep.clone());
            }
        }
    }
    Err(format!("no etcd member among {endpoints:?} says it leads"))
}

/// Drops the keys one run made (`prefix`-*) from a store that holds everything in memory.
/// Redis keeps every record in RAM: at 64 KiB bodies a few runs of it filled this machine's
/// memory and pushed every other target's page cache out. The other stores keep theirs, on
/// disk, as they would in use.
pub async fn forget(spec: &Spec, prefix: &str) -> Result<u64, String> {
    if spec.kind != Kind::Redis {
        return Ok(0);
    }
    let mut c = redis_client(&spec.endpoints[0])?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("redis: {e}"))?;
    let (mut cursor, mut dropped) = (0u64, 0u64);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}-*"))
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut c)
            .await
            .map_err(|e| format!("redis SCAN: {e}"))?;
        if !keys.is_empty() {
            dropped += keys.len() as u64;
            redis::cmd("UNLINK")
                .arg(&keys)
                .query_async::<u64>(&mut c)
                .await
                .map_err(|e| format!("redis UNLINK: {e}"))?;
        }
        if next == 0 {
            return Ok(dropped);
        }
        cursor = next;
    }
}

/// Prepares the target once (schema, leader discovery); safe to repeat.
pub async fn prepare(spec: &Spec) -> Result<(), String> {
    match spec.kind {
        Kind::Postgres => {
            let pg = pg_connect_raw(&spec.endpoints[0]).await?;
            pg.batch_execute(PG_SCHEMA).await.map_err(|e| format!("postgres schema: {e}"))?;
            Ok(())
        }
        Kind::Idemraft => {
            let c = idemraft_client(spec)?;
            c.discover().await.map(|_| ()).ok_or_else(|| format!("{}: no leader found", spec.name))
        }
        Kind::Etcd => etcd_prepare(spec).await,
        Kind::Redis => {
            let mut c = redis_client(&spec.endpoints[0])?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("redis: {e}"))?;
            redis::cmd("PING").query_async::<String>(&mut c).await.map(|_| ()).map_err(|e| format!("redis: {e}"))
        }
    }
}

#[cfg(feature = "etcd")]
async fn etcd_prepare(spec: &Spec) -> Result<(), String> {
    etcd_leader(&spec.endpoints).await.map(|_| ())
}

#[cfg(not(feature = "etcd"))]
async fn etcd_prepare(spec: &Spec) -> Result<(), String> {
    Err(format!("{}: this driver was built without the `etcd` feature", spec.name))
}

async fn pg_connect_raw(endpoint: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) =
        pg_config(endpoint)?.connect(tokio_postgres::NoTls).await.map_err(|e| format!("postgres {endpoint}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Connections for `n` client tasks: gRPC targets share a small pool, Redis and PostgreSQL
/// get one connection per task.
pub async fn connect(spec: &Spec, n: usize) -> Result<Vec<Conn>, String> {
    let mut out = Vec::with_capacity(n);
    match spec.kind {
        Kind::Idemraft => {
            let pool: Vec<Client> =
                (0..n.clamp(1, GRPC_POOL)).map(|_| idemraft_client(spec)).collect::<Result<_, _>>()?;
            for c in &pool {
                c.discover().await;
            }
            out.extend((0..n).map(|i| Conn::Idemraft(pool[i % pool.len()].clone())));
        }
        Kind::Etcd => out = etcd_connect(spec, n).await?,
        Kind::Redis => {
            let client = redis_client(&spec.endpoints[0])?;
            for _ in 0..n {
                let c = client.get_multiplexed_async_connection().await.map_err(|e| format!("redis: {e}"))?;
                out.push(Conn::Redis(c));
            }
        }
        Kind::Postgres => {
            for _ in 0..n {
                out.push(Conn::Postgres(Arc::new(pg_connect(&spec.endpoints[0]).await?)));
            }
        }
    }
    Ok(out)
}

#[cfg(feature = "etcd")]
async fn etcd_connect(spec: &Spec, n: usize) -> Result<Vec<Conn>, String> {
    let leader = etcd_leader(&spec.endpoints).await?;
    let mut pool = Vec::new();
    for _ in 0..n.clamp(1, GRPC_POOL) {
        let opts = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(5));
        let c = etcd_client::Client::connect([leader.as_str()], Some(opts))
            .await
            .map_err(|e| format!("etcd {leader}: {e}"))?;
        pool.push(c.kv_client());
    }
    Ok((0..n).map(|i| Conn::Etcd(Box::new(pool[i % pool.len()].clone()))).collect())
}

#[cfg(not(feature = "etcd"))]
async fn etcd_connect(spec: &Spec, _n: usize) -> Result<Vec<Conn>, String> {
    Err(format!("{}: this driver was built without the `etcd` feature", spec.name))
}

fn marked(state: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + body.len());
    v.push(state);
    v.extend_from_slice(body);
    v
}

/// What a stored marker-prefixed value means to a claim that found it.
fn found(value: &[u8]) -> Claimed {
    match value.split_first() {
        Some((b'c', body)) => Claimed::Replay(body.len()),
        _ => Claimed::InProgress,
    }
}

impl Conn {
    /// Claims `key` for `owner`.
    pub async fn claim(&mut self, key: &str, owner: &str) -> Result<Claimed, String> {
        match self {
            Conn::Idemraft(c) => match c.claim(SCOPE, key, owner, &ClaimOptions::default()).await {
                Ok(Outcome::Acquired(g)) => Ok(Claimed::Acquired(g.token)),
                Ok(Outcome::Replay { response, .. }) => Ok(Claimed::Replay(response.body.len())),
                Ok(Outcome::InProgress { .. }) => Ok(Claimed::InProgress),
                Ok(other) => Err(format!("claim answered {}", other.name())),
                Err(e) => Err(e.to_string()),
            },
            #[cfg(feature = "etcd")]
            Conn::Etcd(kv) => {
                use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
                let k = format!("idem/{key}");
                let txn = Txn::new()
                    .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(k.clone(), marked(b'p', owner.as_bytes()), None)])
                    .or_else([TxnOp::get(k, None)]);
                let r = kv.txn(txn).await.map_err(|e| e.to_string())?;
                if r.succeeded() {
                    return Ok(Claimed::Acquired(r.header().map_or(0, |h| h.revision() as u64)));
                }
                match r.op_responses().first() {
                    Some(TxnOpResponse::Get(g)) => {
                        Ok(g.kvs().first().map_or(Claimed::InProgress, |kv| found(kv.value())))
                    }
                    _ => Err("etcd txn: no Get response in the else branch".into()),
                }
            }
            Conn::Redis(c) => {
                let old: Option<Vec<u8>> = redis::cmd("SET")
                    .arg(key)
                    .arg(marked(b'p', owner.as_bytes()))
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL_MS)
                    .arg("GET")
                    .query_async(c)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(old.map_or(Claimed::Acquired(0), |v| found(&v)))
            }
            Conn::Postgres(pg) => {
                let row = pg
                    .client
                    .query_one(&pg.claim, &[&key, &owner, &(TTL_MS as i64)])
                    .await
                    .map_err(|e| e.to_string())?;
                let created: bool = row.try_get(0).map_err(|e| e.to_string())?;
                let state: Option<i16> = row.try_get(1).map_err(|e| e.to_string())?;
                let resp: Option<Vec<u8>> = row.try_get(2).map_err(|e| e.to_string())?;
                Ok(match (created, state) {
                    (true, _) => Claimed::Acquired(0),
                    (false, Some(1)) => Claimed::Replay(resp.map_or(0, |r| r.len())),
                    (false, _) => Claimed::InProgress,
                })
            }
        }
    }

    /// Completes `key`, owned with `token`, with `body`.
    pub async fn complete(&mut self, key: &str, token: u64, body: &[u8]) -> Result<(), String> {
        match self {
            Conn::Idemraft(c) => match c.complete(SCOPE, key, token, &StoredResponse::new(200, body.to_vec())).await {
                Ok(Outcome::Completed { .. }) => Ok(()),
                Ok(other) => Err(format!("complete answered {}", other.name())),
                Err(e) => Err(e.to_string()),
            },
            #[cfg(feature = "etcd")]
            Conn::Etcd(kv) => {
                kv.put(format!("idem/{key}"), marked(b'c', body), None).await.map(|_| ()).map_err(|e| e.to_string())
            }
            Conn::Redis(c) => redis::cmd("SET")
                .arg(key)
                .arg(marked(b'c', body))
                .arg("PX")
                .arg(TTL_MS)
                .query_async::<()>(c)
                .await
                .map_err(|e| e.to_string()),
            Conn::Postgres(pg) => {
                let n = pg.client.execute(&pg.complete, &[&key, &body]).await.map_err(|e| e.to_string())?;
                if n == 1 {
                    Ok(())
                } else {
                    Err(format!("complete updated {n} rows"))
                }
            }
        }
    }
}
