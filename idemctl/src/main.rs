//! `idemctl`: the operator CLI for an Idemraft cluster, built on the SDK.
//!
//! Exit codes (also in `idemctl --help`):
//! 0 the call succeeded and the outcome is a success (ACQUIRED, REPLAY, COMPLETED, FAILED,
//!   LEASE_EXTENDED, a record found);
//! 1 any other error; 2 bad usage or INVALID_ARGUMENT; 3 a conflict outcome (IN_PROGRESS,
//!   MISMATCH, STALE_TOKEN, WRONG_STATE, or a wait that timed out) or a claim refused by the
//!   tenant's record quota; 4 NOT_FOUND;
//! 5 the cluster was unavailable or the deadline passed (outcome unknown for a write);
//! 6 refused by the node's tokens: no token, an unknown one, or one without the right
//!   (a tenant's token on an admin command). The node was reached; nothing was done.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idemraft_client::proto;
use idemraft_client::{
    fingerprint, ClaimOptions, Client, ClientConfig, Error, Fingerprint, Outcome, RecordState, StoredResponse,
};
use serde_json::{json, Value};

const EXIT_HELP: &str = "Exit codes: 0 success outcome; 1 other error; 2 bad usage or INVALID_ARGUMENT; \
3 conflict outcome (IN_PROGRESS, MISMATCH, STALE_TOKEN, WRONG_STATE, wait timed out) or record quota \
exceeded; 4 NOT_FOUND; \
5 cluster unavailable or deadline exceeded (a write's outcome is then unknown; repeating it is safe); \
6 refused by the node's tokens (UNAUTHENTICATED or PERMISSION_DENIED: send a valid token, or an admin token).";

/// Exit code of a call the node refused for its token: reachable, so not 5, and nothing done.
const EXIT_REFUSED: u8 = 6;

/// Whether the node refused the caller's token (missing, unknown, or without the right).
fn refused(e: &Error) -> bool {
    matches!(e, Error::Rpc { code: tonic::Code::Unauthenticated | tonic::Code::PermissionDenied, .. })
}

#[derive(Parser, Debug)]
#[command(name = "idemctl", version, about = "Operate an Idemraft cluster and its idempotency keys", after_help = EXIT_HELP)]
struct Cli {
    /// Client addresses of the nodes, comma-separated.
    #[arg(
        long,
        global = true,
        env = "IDEMCTL_ENDPOINTS",
        default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
        value_delimiter = ','
    )]
    endpoints: Vec<String>,
    /// Tenant of the records [default: the token's tenant with --token, else `default`].
    #[arg(long, global = true, env = "IDEMCTL_TENANT")]
    tenant: Option<String>,
    /// Output format.
    #[arg(short = 'w', long = "output", global = true, value_enum, default_value = "table")]
    output: Format,
    /// Deadline of each command, e.g. 500ms, 5s.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// CA certificate (PEM) that signed the nodes' certificates. Given, endpoints without a
    /// scheme are dialled with TLS.
    #[arg(long, global = true, env = "IDEMCTL_CA", value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM), for nodes that require one (--tls-client-ca).
    #[arg(long, global = true, env = "IDEMCTL_CERT", value_name = "FILE", requires = "tls_key")]
    cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long = "key", id = "tls_key", global = true, env = "IDEMCTL_KEY", value_name = "FILE", requires = "cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Bearer token, for nodes started with --tokens-file. Prefer IDEMCTL_TOKEN: a flag is
    /// visible to other users in the process list.
    #[arg(
        long = "token",
        id = "bearer_token",
        global = true,
        env = "IDEMCTL_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    bearer_token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
enum Format {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Status of every endpoint: role, term, leader, indexes.
    Status,
    /// Membership: list, add-learner, promote, remove.
    #[command(subcommand)]
    Member(MemberCmd),
    /// Claim a key.
    Claim(ClaimArgs),
    /// Read a record.
    Get(IdArgs),
    /// Complete an owned key with a response.
    Complete(CompleteArgs),
    /// Fail an owned key (retryable by default; --terminal stores the given response).
    Fail(FailArgs),
    /// Take over an IN_PROGRESS key whose lease expired (or any, with --force).
    Takeover(TakeoverArgs),
    /// Extend an owned key's lease.
    Extend(ExtendArgs),
    /// Wait for a key to leave IN_PROGRESS.
    Wait(WaitArgs),
    /// List records.
    List(ListArgs),
    /// Backups: save a snapshot of the whole state to a file.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Record quotas per tenant: set, get (admin token).
    #[command(subcommand)]
    Quota(QuotaCmd),
    /// Write a throwaway CA, node certificates and a client certificate for a local TLS cluster.
    DevCerts(DevCertsArgs),
    /// Bearer tokens for the node's --tokens-file.
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Subcommand, Debug)]
enum SnapshotCmd {
    /// Take a fresh snapshot on the leader and write it to FILE atomically (restore a new
    /// cluster from it with `idemraft --restore-from FILE`).
    Save {
        /// Where to write it; an existing file is replaced only once the new one is complete.
        file: std::path::PathBuf,
        /// Time allowed for the whole transfer (overrides --timeout, which is for single calls).
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        within: Duration,
    },
}

#[derive(Subcommand, Debug)]
enum QuotaCmd {
    /// Set a tenant's record quota: `quota set TENANT N`, or `quota set TENANT none` to remove
    /// it (the default then applies); `quota set --default N|none` for tenants without their own.
    /// A lowered quota deletes nothing: new keys are refused until records expire.
    Set {
        /// TENANT and N (the most records it may hold), or `none`.
        #[arg(num_args = 0..=2, value_names = ["TENANT", "N"])]
        args: Vec<String>,
        /// Set the default quota instead: N or `none`.
        #[arg(long = "default", value_name = "N", conflicts_with = "args")]
        default: Option<String>,
    },
    /// Show the default quota and, for one tenant or every tenant that holds records or has a
    /// quota, its records and the quota in force.
    Get {
        /// Only this tenant.
        tenant: Option<String>,
    },
}

fn parse_limit(text: &str) -> Result<Option<u64>, String> {
    match text.trim() {
        "none" => Ok(None),
        t => t.parse().map(Some).map_err(|_| format!("'{text}' is not a record count: give a whole number or `none`")),
    }
}

fn limit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "none".to_string(), |n| n.to_string())
}

fn quota_done(q: &idemraft_client::Quotas, show_default: bool) -> Done {
    let json = json!({
        "default_max_records": q.default_max_records,
        "tenants": q.tenants.iter().map(|t| json!({"tenant": t.tenant, "records": t.records,
            "max_records": t.max_records, "own": t.own})).collect::<Vec<_>>(),
    });
    let mut table = String::new();
    if show_default {
        table.push_str(&format!("default quota: {}\n", limit_text(q.default_max_records)));
    }
    if !q.tenants.is_empty() {
        table.push_str(&format!("{:<24} {:<10} {}\n", "TENANT", "RECORDS", "QUOTA"));
        for t in &q.tenants {
            let source = match (t.max_records, t.own) {
                (None, _) => "",
                (Some(_), true) => " (own)",
                (Some(_), false) => " (default)",
            };
            table.push_str(&format!("{:<24} {:<10} {}{source}\n", t.tenant, t.records, limit_text(t.max_records)));
        }
    }
    Done { json, table: table.trim_end().to_string(), code: 0 }
}

#[derive(Args, Debug)]
struct DevCertsArgs {
    /// Directory to write ca.pem, node-<i>.pem/.key and client.pem/.key into.
    dir: std::path::PathBuf,
    /// How many node certificates.
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    /// Another DNS name or IP address every certificate is valid for (repeatable); localhost,
    /// 127.0.0.1 and ::1 are always included.
    #[arg(long = "san", value_name = "NAME")]
    sans: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Print the sha256 (hex) of a token read from standard input, for the tokens file.
    Hash,
    /// Make a fresh random token; prints the token, then its tokens-file entry.
    New {
        /// Tenant the token acts for.
        #[arg(long, required_unless_present = "admin")]
        tenant: Option<String>,
        /// An admin token (membership and status calls).
        #[arg(long)]
        admin: bool,
    },
}

#[derive(Subcommand, Debug)]
enum MemberCmd {
    /// Show the membership.
    List,
    /// Add a node as a learner.
    AddLearner {
        /// New node's id.
        id: u64,
        /// New node's peer address, host:port.
        peer_addr: String,
        /// Return at once instead of waiting for the learner to catch up.
        #[arg(long)]
        no_wait: bool,
    },
    /// Make learners voters.
    Promote {
        /// Learner ids.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Remove voters or learners.
    Remove {
        /// Member ids.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
}

#[derive(Args, Debug)]
struct IdArgs {
    /// Scope, e.g. payments.create.
    scope: String,
    /// Idempotency key.
    key: String,
}

#[derive(Args, Debug)]
struct ClaimArgs {
    #[command(flatten)]
    id: IdArgs,
    /// Owner id; repeat it to retry the same claim. Default: a fresh random id (printed).
    #[arg(long)]
    owner: Option<String>,
    /// Lease, e.g. 30s (server default when not given).
    #[arg(long, value_parser = parse_duration)]
    lease: Option<Duration>,
    /// TTL/retention, e.g. 24h (scope default when not given).
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// Fingerprint as 64 hex digits.
    #[arg(long, conflicts_with = "request")]
    fingerprint: Option<String>,
    /// Compute the fingerprint of a request: METHOD PATH [BODY].
    #[arg(long, num_args = 2..=3, value_names = ["METHOD", "PATH", "BODY"])]
    request: Option<Vec<String>>,
    /// Take over an expired lease.
    #[arg(long)]
    allow_takeover: bool,
}

#[derive(Args, Debug)]
struct ResponseArgs {
    /// Response status.
    #[arg(long, default_value_t = 200)]
    status: u32,
    /// Response body text.
    #[arg(long, default_value = "")]
    body: String,
    /// Response header NAME:VALUE (repeatable).
    #[arg(long = "header", value_name = "NAME:VALUE")]
    headers: Vec<String>,
}

#[derive(Args, Debug)]
struct CompleteArgs {
    #[command(flatten)]
    id: IdArgs,
    /// The fencing token from the claim.
    token: u64,
    #[command(flatten)]
    response: ResponseArgs,
}

#[derive(Args, Debug)]
struct FailArgs {
    #[command(flatten)]
    id: IdArgs,
    /// The fencing token from the claim.
    token: u64,
    /// Terminal failure: store the response given with --status/--body and replay it.
    #[arg(long)]
    terminal: bool,
    #[command(flatten)]
    response: ResponseArgs,
}

#[derive(Args, Debug)]
struct TakeoverArgs {
    #[command(flatten)]
    id: IdArgs,
    /// New owner id. Default: a fresh random id (printed).
    #[arg(long)]
    owner: Option<String>,
    /// Take over even while the lease is alive (operator override).
    #[arg(long)]
    force: bool,
    /// Lease for the new owner.
    #[arg(long, value_parser = parse_duration)]
    lease: Option<Duration>,
}

#[derive(Args, Debug)]
struct ExtendArgs {
    #[command(flatten)]
    id: IdArgs,
    /// The fencing token from the claim.
    token: u64,
    /// New lease length.
    #[arg(long, value_parser = parse_duration)]
    lease: Option<Duration>,
}

#[derive(Args, Debug)]
struct WaitArgs {
    #[command(flatten)]
    id: IdArgs,
    /// Longest wait.
    #[arg(long = "for", default_value = "10s", value_parser = parse_duration)]
    wait_for: Duration,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Only this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only this state: in-progress, completed, failed.
    #[arg(long, value_enum)]
    state: Option<StateArg>,
    /// Only abandoned work: IN_PROGRESS with an expired lease.
    #[arg(long)]
    abandoned: bool,
    /// Records per page (at most 1000); a page also ends before 4 MiB of records, so it may
    /// hold fewer while more follow.
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Start after this record: SCOPE/KEY (as a page's "more records follow" line names it),
    /// or KEY alone with --scope.
    #[arg(long, value_name = "SCOPE/KEY")]
    start_after: Option<String>,
    /// Page through every matching record, printing each page as it arrives.
    #[arg(long)]
    all: bool,
}

/// The record to start a listing after, from `--start-after`: `SCOPE/KEY`, or `KEY` with
/// `--scope`. Keys have no `/`, scopes may: the last `/` divides them.
fn start_after(given: &str, scope: Option<&str>) -> Result<proto::RecordId, Error> {
    let (from, key) = match (given.rsplit_once('/'), scope) {
        (Some((from, key)), _) => (from, key),
        (None, Some(scope)) => (scope, given),
        (None, None) => {
            return Err(Error::InvalidArgument(format!(
                "--start-after {given} names no scope: write SCOPE/{given}, or add --scope SCOPE"
            )))
        }
    };
    if let Some(scope) = scope.filter(|s| *s != from) {
        return Err(Error::InvalidArgument(format!(
            "--start-after {given} is in scope '{from}' but --scope is '{scope}': give a record of the listed scope"
        )));
    }
    Ok(proto::RecordId { tenant: String::new(), scope: from.to_string(), key: key.to_string() })
}

/// How the next page is asked for, as `--start-after` takes it.
fn resume_arg(id: &proto::RecordId) -> String {
    format!("{}/{}", id.scope, id.key)
}

/// One page as idemctl prints it: JSON (the records, whether more follow and from where) and
/// table lines.
fn page_out(resp: &proto::ListResponse) -> (Value, Vec<String>) {
    let json = json!({
        "records": resp.records.iter().map(record_json).collect::<Vec<_>>(),
        "more": resp.next_after.is_some(),
        "next_after": resp.next_after.as_ref().map(resume_arg),
    });
    (json, resp.records.iter().map(record_line).collect())
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum StateArg {
    InProgress,
    Completed,
    Failed,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{text}' is not a duration like 500ms, 5s, 10m"))?;
    let ms = match unit {
        "ms" => n,
        "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        "d" => n.saturating_mul(86_400_000),
        _ => return Err(format!("'{text}' needs a unit: ms, s, m, h or d")),
    };
    Ok(Duration::from_millis(ms))
}

/// A command's result: what to print and how to exit.
struct Done {
    json: Value,
    table: String,
    code: u8,
}

fn response_json(r: &StoredResponse) -> Value {
    json!({
        "status": r.status,
        "headers": r.headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body": String::from_utf8_lossy(&r.body),
    })
}

fn outcome_done(o: &Outcome, extra: Option<(&str, &str)>) -> Done {
    let (mut json, table, code) = match o {
        Outcome::Acquired(g) => (
            json!({"outcome": "ACQUIRED", "token": g.token, "attempt": g.attempt, "takeover": g.takeover,
                   "lease_expires_ms": g.lease_expires_ms, "expires_ms": g.expires_ms,
                   "recovery_point": g.recovery_point}),
            format!(
                "ACQUIRED  token={}  attempt={}  takeover={}  lease_expires_ms={}{}",
                g.token,
                g.attempt,
                g.takeover,
                g.lease_expires_ms,
                if g.recovery_point.is_empty() {
                    String::new()
                } else {
                    format!("  recovery_point={}", g.recovery_point)
                }
            ),
            0,
        ),
        Outcome::Replay { token, completed_ms, response } => (
            json!({"outcome": "REPLAY", "token": token, "completed_ms": completed_ms, "response": response_json(response)}),
            format!(
                "REPLAY  token={token}  status={}  body={}{}",
                response.status,
                String::from_utf8_lossy(&response.body),
                response.headers.iter().map(|(n, v)| format!("  {n}: {v}")).collect::<String>()
            ),
            0,
        ),
        Outcome::InProgress { lease_expires_ms, retry_after_ms } => (
            json!({"outcome": "IN_PROGRESS", "lease_expires_ms": lease_expires_ms, "retry_after_ms": retry_after_ms}),
            format!("IN_PROGRESS  lease_expires_ms={lease_expires_ms}  retry_after_ms={retry_after_ms}"),
            3,
        ),
        Outcome::Mismatch => {
            (json!({"outcome": "MISMATCH"}), "MISMATCH  the key is bound to a different request fingerprint".into(), 3)
        }
        Outcome::StaleToken { current } => {
            (json!({"outcome": "STALE_TOKEN", "current": current}), format!("STALE_TOKEN  current={current}"), 3)
        }
        Outcome::NotFound => (json!({"outcome": "NOT_FOUND"}), "NOT_FOUND".into(), 4),
        Outcome::WrongState(s) => {
            (json!({"outcome": "WRONG_STATE", "state": s.as_str()}), format!("WRONG_STATE  state={}", s.as_str()), 3)
        }
        Outcome::Completed { token } => {
            (json!({"outcome": "COMPLETED", "token": token}), format!("COMPLETED  token={token}"), 0)
        }
        Outcome::Failed { token, retryable } => (
            json!({"outcome": "FAILED", "token": token, "retryable": retryable}),
            format!("FAILED  token={token}  retryable={retryable}"),
            0,
        ),
        Outcome::LeaseExtended { token, lease_expires_ms } => (
            json!({"outcome": "LEASE_EXTENDED", "token": token, "lease_expires_ms": lease_expires_ms}),
            format!("LEASE_EXTENDED  token={token}  lease_expires_ms={lease_expires_ms}"),
            0,
        ),
    };
    let mut table = table;
    if let Some((k, v)) = extra {
        json[k] = json!(v);
        table = format!("{table}  {k}={v}");
    }
    Done { json, table, code }
}

fn record_json(r: &proto::Record) -> Value {
    let id = r.id.clone().unwrap_or_default();
    json!({
        "tenant": id.tenant, "scope": id.scope, "key": id.key,
        "state": RecordState::from_proto(r.state).as_str(), "token": r.token, "owner": r.owner, "attempt": r.attempt,
        "taken_over": r.taken_over, "lease_expires_ms": r.lease_expires_ms, "created_ms": r.created_ms,
        "updated_ms": r.updated_ms, "completed_ms": r.completed_ms, "expires_ms": r.expires_ms,
        "recovery_point": r.recovery_point,
        "fingerprint": r.fingerprint.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "response": r.response.clone().map(|p| json!({
            "status": p.status,
            "headers": p.headers.iter().map(|h| json!([h.name, h.value])).collect::<Vec<_>>(),
            "body": String::from_utf8_lossy(&p.body),
        })),
    })
}

fn record_line(r: &proto::Record) -> String {
    let id = r.id.clone().unwrap_or_default();
    let resp = r
        .response
        .as_ref()
        .map(|p| format!("  status={} body={}", p.status, String::from_utf8_lossy(&p.body)))
        .unwrap_or_default();
    format!(
        "{}/{}  {}  token={}  owner={}  attempt={}  lease_expires_ms={}  expires_ms={}{}",
        id.scope,
        id.key,
        RecordState::from_proto(r.state).as_str(),
        r.token,
        r.owner,
        r.attempt,
        r.lease_expires_ms,
        r.expires_ms,
        resp
    )
}

fn members_done(m: &idemraft_client::Members) -> Done {
    let json = json!({
        "log_index": m.log_index,
        "members": m.members.iter().map(|x| json!({"id": x.id, "peer_addr": x.peer_addr, "voter": x.voter})).collect::<Vec<_>>(),
    });
    let mut table = format!("{:<6} {:<24} {}\n", "ID", "PEER ADDRESS", "ROLE");
    for x in &m.members {
        table.push_str(&format!("{:<6} {:<24} {}\n", x.id, x.peer_addr, if x.voter { "voter" } else { "learner" }));
    }
    Done { json, table: table.trim_end().to_string(), code: 0 }
}

fn response_of(args: &ResponseArgs) -> Result<StoredResponse, String> {
    let mut r = StoredResponse::new(args.status, args.body.clone().into_bytes());
    for h in &args.headers {
        let (n, v) = h.split_once(':').ok_or_else(|| format!("header '{h}' is not NAME:VALUE"))?;
        r = r.with_header(n.trim(), v.trim());
    }
    Ok(r)
}

fn parse_fingerprint(hex: &str) -> Result<Fingerprint, String> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("--fingerprint must be 64 hex digits (a SHA-256 digest)".into());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(Fingerprint(out))
}

async fn status(client: &Client) -> Done {
    let endpoints = client.endpoints();
    let mut rows = Vec::new();
    let mut table = format!(
        "{:<24} {:<4} {:<10} {:<6} {:<7} {:<10} {:<10} {}\n",
        "ENDPOINT", "ID", "ROLE", "TERM", "LEADER", "LAST LOG", "APPLIED", "RECORDS"
    );
    let (mut any, mut any_refused) = (false, false);
    for (i, ep) in endpoints.iter().enumerate() {
        let ep = ep.trim_start_matches("http://").trim_start_matches("https://");
        match client.node_status(i).await {
            Ok(s) => {
                any = true;
                let role = s.role.name();
                table.push_str(&format!(
                    "{:<24} {:<4} {:<10} {:<6} {:<7} {:<10} {:<10} {}\n",
                    ep, s.id, role, s.term, s.leader_id, s.last_log_index, s.applied_index, s.records
                ));
                rows.push(json!({"endpoint": ep, "id": s.id, "role": role, "term": s.term, "leader_id": s.leader_id,
                    "last_log_index": s.last_log_index, "commit_index": s.commit_index, "applied_index": s.applied_index,
                    "records": s.records, "clock_ms": s.clock_ms, "version": s.version,
                    "members": s.members.iter().map(|m| json!({"id": m.id, "peer_addr": m.peer_addr, "voter": m.voter})).collect::<Vec<_>>()}));
            }
            Err(e) if refused(&e) => {
                any_refused = true;
                table.push_str(&format!("{ep:<24} refused: {e}\n"));
                rows.push(json!({"endpoint": ep, "error": e.to_string(), "refused": true}));
            }
            Err(e) => {
                table.push_str(&format!("{ep:<24} unreachable: {e}\n"));
                rows.push(json!({"endpoint": ep, "error": e.to_string()}));
            }
        }
    }
    // A node that answered "not with this token" is up: saying "unavailable" would send the
    // operator looking at the network instead of at the token.
    let code = if any {
        0
    } else if any_refused {
        EXIT_REFUSED
    } else {
        5
    };
    Done { json: Value::Array(rows), table: table.trim_end().to_string(), code }
}

fn owner_or_random(owner: &Option<String>) -> String {
    owner.clone().unwrap_or_else(|| idemraft_client::keys::random("idemctl-"))
}

async fn run(cli: &Cli, client: &Client) -> Result<Done, Error> {
    let ok = |json: Value, table: String| Done { json, table, code: 0 };
    Ok(match &cli.command {
        Command::Status => status(client).await,
        Command::Member(MemberCmd::List) => members_done(&client.members().await?),
        Command::Member(MemberCmd::AddLearner { id, peer_addr, no_wait }) => {
            members_done(&client.add_learner(*id, peer_addr, !no_wait).await?)
        }
        Command::Member(MemberCmd::Promote { ids }) => members_done(&client.promote(ids).await?),
        Command::Member(MemberCmd::Remove { ids }) => members_done(&client.remove(ids).await?),
        Command::Claim(a) => {
            let fingerprint = match (&a.fingerprint, &a.request) {
                (Some(hex), _) => Some(parse_fingerprint(hex).map_err(Error::InvalidArgument)?),
                (None, Some(parts)) => {
                    let body = parts.get(2).map(|b| b.as_bytes());
                    Some(fingerprint(&parts[0], &parts[1], body))
                }
                (None, None) => None,
            };
            let owner = owner_or_random(&a.owner);
            let opts = ClaimOptions { fingerprint, lease: a.lease, ttl: a.ttl, allow_takeover: a.allow_takeover };
            let o = client.claim(&a.id.scope, &a.id.key, &owner, &opts).await?;
            outcome_done(&o, Some(("owner", &owner)))
        }
        Command::Get(a) => match client.get(&a.scope, &a.key).await? {
            Some(r) => ok(record_json(&r), record_line(&r)),
            None => Done { json: json!({"outcome": "NOT_FOUND"}), table: "NOT_FOUND".into(), code: 4 },
        },
        Command::Complete(a) => {
            let r = response_of(&a.response).map_err(Error::InvalidArgument)?;
            outcome_done(&client.complete(&a.id.scope, &a.id.key, a.token, &r).await?, None)
        }
        Command::Fail(a) => {
            let r = if a.terminal { Some(response_of(&a.response).map_err(Error::InvalidArgument)?) } else { None };
            outcome_done(&client.fail(&a.id.scope, &a.id.key, a.token, !a.terminal, r.as_ref()).await?, None)
        }
        Command::Takeover(a) => {
            let owner = owner_or_random(&a.owner);
            let o = client.takeover(&a.id.scope, &a.id.key, &owner, a.force, a.lease).await?;
            outcome_done(&o, Some(("owner", &owner)))
        }
        Command::Extend(a) => outcome_done(&client.extend_lease(&a.id.scope, &a.id.key, a.token, a.lease).await?, None),
        Command::Wait(a) => {
            let w = client.wait(&a.id.scope, &a.id.key, a.wait_for).await?;
            match w.record {
                None => Done { json: json!({"outcome": "NOT_FOUND"}), table: "NOT_FOUND".into(), code: 4 },
                Some(r) => {
                    let mut json = record_json(&r);
                    json["timed_out"] = json!(w.timed_out);
                    let table = format!("{}{}", record_line(&r), if w.timed_out { "  (wait timed out)" } else { "" });
                    Done { json, table, code: if w.timed_out { 3 } else { 0 } }
                }
            }
        }
        Command::Snapshot(SnapshotCmd::Save { file, within }) => {
            let mut shown = SnapshotProgress::new();
            let s = client.save_snapshot_with_progress(file, *within, |done, total| shown.update(done, total)).await;
            shown.finish();
            let s = s?;
            let sha: String = s.sha256.iter().map(|b| format!("{b:02x}")).collect();
            let json = json!({"file": s.path.display().to_string(), "snapshot_id": s.snapshot_id,
                "index": s.last_index, "term": s.last_term, "records": s.records, "size_bytes": s.size_bytes,
                "sha256": sha, "node_id": s.node_id, "elapsed_ms": s.elapsed.as_millis() as u64});
            let table = format!(
                "saved {}  index={}  term={}  records={}  size={} bytes  sha256={}  from node {} in {} ms",
                s.path.display(),
                s.last_index,
                s.last_term,
                s.records,
                s.size_bytes,
                sha,
                s.node_id,
                s.elapsed.as_millis()
            );
            ok(json, table)
        }
        Command::Quota(QuotaCmd::Set { args, default }) => {
            let (tenant, limit) = match (default, args.as_slice()) {
                (Some(n), []) => (None, n),
                (None, [tenant, n]) => (Some(tenant.as_str()), n),
                _ => {
                    return Err(Error::InvalidArgument(
                        "quota set needs TENANT N (or none), or --default N (or none)".into(),
                    ))
                }
            };
            let limit = parse_limit(limit).map_err(Error::InvalidArgument)?;
            quota_done(&client.set_quota(tenant, limit).await?, tenant.is_none())
        }
        Command::Quota(QuotaCmd::Get { tenant }) => quota_done(&client.get_quota(tenant.as_deref()).await?, true),
        Command::DevCerts(_) | Command::Token(_) => {
            return Err(Error::Config("this command runs without a cluster".into()));
        }
        Command::List(a) => {
            let state = match a.state {
                None => proto::RecordState::Unspecified,
                Some(StateArg::InProgress) => proto::RecordState::InProgress,
                Some(StateArg::Completed) => proto::RecordState::Completed,
                Some(StateArg::Failed) => proto::RecordState::Failed,
            };
            let mut req = proto::ListRequest {
                tenant: String::new(),
                scope: a.scope.clone().unwrap_or_default(),
                state: state as i32,
                abandoned_only: a.abandoned,
                start_after: a.start_after.as_deref().map(|k| start_after(k, a.scope.as_deref())).transpose()?,
                limit: a.limit,
            };
            let mut listed = 0;
            loop {
                let resp = client.list(req.clone()).await?;
                listed += resp.records.len();
                let (json, mut table) = page_out(&resp);
                match (&resp.next_after, a.all) {
                    (Some(next), true) => {
                        // Printed now: a listing of every record may be long, and the pages
                        // after this one can fail (a leader change) without losing this one.
                        match cli.output {
                            Format::Json => println!("{json}"),
                            Format::Table if !table.is_empty() => println!("{}", table.join("\n")),
                            Format::Table => {}
                        }
                        req.start_after = Some(next.clone());
                    }
                    (next, _) => {
                        if listed == 0 {
                            table.push("(no records)".into());
                        } else if a.all {
                            table.push(format!("({listed} records)"));
                        }
                        if let Some(next) = next {
                            table.push(format!(
                                "(more records follow: add --start-after {}, or --all for every page)",
                                resume_arg(next)
                            ));
                        }
                        break ok(json, table.join("\n"));
                    }
                }
            }
        }
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(token.trim().as_bytes()))
}

/// Commands that need no cluster. `None`: not one of them.
fn local(cli: &Cli) -> Option<Result<Done, String>> {
    let ok = |table: String, json: Value| Ok(Done { json, table, code: 0 });
    Some(match &cli.command {
        Command::DevCerts(a) => idemctl::certs::generate(&a.dir, a.nodes, &a.sans).and_then(|c| {
            let table = format!(
                "wrote {} (CA), {} node certificate(s) node-<i>.pem/.key and client.pem/.key in {}\n\
                 node i: --tls-cert node-i.pem --tls-key node-i.key --peer-tls-cert node-i.pem \
                 --peer-tls-key node-i.key --peer-tls-ca ca.pem\nidemctl: --ca {}",
                c.ca.display(),
                c.nodes.len(),
                a.dir.display(),
                c.ca.display()
            );
            ok(table, json!({"ca": c.ca, "nodes": c.nodes, "client": c.client}))
        }),
        Command::Token(TokenCmd::Hash) => {
            let mut token = String::new();
            match std::io::Read::read_to_string(&mut std::io::stdin(), &mut token) {
                Err(e) => Err(format!("cannot read the token from standard input: {e}")),
                Ok(_) if token.trim().is_empty() => {
                    Err("no token on standard input: pipe it in, e.g. `printf %s \"$TOKEN\" | idemctl token hash`"
                        .into())
                }
                Ok(_) => {
                    let h = token_hash(&token);
                    ok(h.clone(), json!({"sha256": h}))
                }
            }
        }
        Command::Token(TokenCmd::New { tenant, admin }) => {
            let token = format!("idr_{}", hex(&rand::random::<[u8; 32]>()));
            let h = token_hash(&token);
            let mut entry = String::from("[[token]]\n");
            if let Some(t) = tenant {
                entry.push_str(&format!("tenant = \"{t}\"\n"));
            }
            if *admin {
                entry.push_str("admin = true\n");
            }
            entry.push_str(&format!("sha256 = \"{h}\"\n"));
            ok(
                format!("{token}\n\n# add to the tokens file, then send SIGHUP to every node:\n{entry}"),
                json!({"token": token, "sha256": h, "entry": entry}),
            )
        }
        _ => return None,
    })
}

/// A hint for errors whose cause the message alone does not make plain.
/// One updating line on standard error while a snapshot streams in, with the bytes, the
/// share, the elapsed and the estimated remaining time; nothing when standard error is not a
/// terminal, so scripts and logs see only the result.
struct SnapshotProgress {
    on: bool,
    started: std::time::Instant,
    last: Option<std::time::Instant>,
}

impl SnapshotProgress {
    fn new() -> SnapshotProgress {
        use std::io::IsTerminal;
        let on = std::io::stderr().is_terminal();
        if on {
            eprint!("snapshot: the leader is building a fresh snapshot...");
        }
        SnapshotProgress { on, started: std::time::Instant::now(), last: None }
    }

    fn update(&mut self, done: u64, total: u64) {
        let now = std::time::Instant::now();
        // A redraw per chunk would flood a slow terminal: ten a second is enough to read.
        if !self.on || self.last.is_some_and(|l| now - l < Duration::from_millis(100)) {
            return;
        }
        self.last = Some(now);
        let elapsed = self.started.elapsed().as_secs_f64();
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let (share, left) = if total > 0 && done > 0 {
            let share = done as f64 / total as f64;
            (format!("{:3.0}%", share * 100.0), format!("~{:.0} s left", elapsed * (1.0 - share) / share))
        } else {
            ("   ?".to_string(), "time left unknown".to_string())
        };
        eprint!("\r\x1b[Ksnapshot: {:.1} of {:.1} MiB  {share}  {elapsed:.1} s elapsed, {left}", mib(done), mib(total));
    }

    fn finish(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

fn hint(cli: &Cli, e: &Error) -> &'static str {
    let text = e.to_string();
    if cli.ca.is_none() && (text.contains("h2 protocol error") || text.contains("http2 error")) {
        "\n  (a plaintext call to a TLS port fails this way: give the cluster's CA with --ca FILE or IDEMCTL_CA)"
    } else {
        ""
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(r) = local(&cli) {
        return match r {
            Ok(done) => {
                match cli.output {
                    Format::Json => println!("{}", done.json),
                    Format::Table => println!("{}", done.table.trim_end()),
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("idemctl: {e}");
                ExitCode::from(1)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idemctl: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut config = ClientConfig::new(cli.endpoints.clone());
    config.tenant = cli.tenant.clone().unwrap_or_default();
    config.deadline = cli.timeout;
    config.attempt_timeout = cli.timeout.min(Duration::from_secs(2));
    config.bearer_token = cli.bearer_token.clone().map(idemraft_client::BearerToken::new);
    let result = runtime.block_on(async {
        if let Some(ca) = &cli.ca {
            let identity = cli.cert.as_deref().zip(cli.tls_key.as_deref());
            config = config.with_tls_files(ca, identity)?;
        }
        let client = Client::new(config)?;
        run(&cli, &client).await
    });
    match result {
        Ok(done) => {
            match cli.output {
                Format::Json => println!("{}", done.json),
                Format::Table => println!("{}", done.table),
            }
            ExitCode::from(done.code)
        }
        Err(e) => {
            let code = match &e {
                Error::InvalidArgument(_) | Error::Config(_) => 2,
                // A refusal that stands, like a conflict: the caller must change something first.
                Error::QuotaExceeded { .. } => 3,
                Error::Unavailable(_) | Error::DeadlineExceeded(_) | Error::Indeterminate(_) => 5,
                e if refused(e) => EXIT_REFUSED,
                _ => 1,
            };
            match cli.output {
                Format::Json => println!("{}", json!({"error": e.to_string(), "exit_code": code})),
                Format::Table => eprintln!("idemctl: {e}{}", hint(&cli, &e)),
            }
            ExitCode::from(code)
        }
    }
}
