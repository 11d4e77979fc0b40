//! Single option values into typed ones: durations, member lists, routes, planted bugs,
//! per-scope retention, byte budgets, the cluster token. Each error names its option.

use std::collections::BTreeMap;
use std::time::Duration;

use idemraft_store::planted::Bug;
use idemraft_store::Limits;

use super::{ConfigError, MAX_REPLICATION_BYTES};

pub(super) fn bad(option: &str, problem: impl Into<String>, fix: impl Into<String>) -> ConfigError {
    ConfigError { option: option.to_string(), problem: problem.into(), fix: fix.into() }
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

/// The entry and AppendEntries byte budgets: the largest command `limits` admit fits one
/// entry, and one entry fits one message, whatever is configured.
pub(super) fn byte_budgets(
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

pub(super) const DURATION_FIX: &str = "write a whole number with a unit: ms, s, m, h or d (e.g. 500ms, 30s, 24h)";

pub(super) fn duration(option: &str, value: Option<&String>, default: &str) -> Result<Duration, ConfigError> {
    let text = value.map(String::as_str).unwrap_or(default);
    parse_duration(text).map_err(|p| bad(option, p, DURATION_FIX))
}

/// Parses `ID=HOST:PORT,...` for `--initial-cluster`.
pub fn parse_initial_cluster(text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    parse_id_addrs("--initial-cluster", text)
}

/// Parses `--unsafe-planted-bugs`.
pub(super) fn parse_planted_bugs(text: &str) -> Result<Vec<Bug>, ConfigError> {
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

pub(super) fn parse_id_addrs(opt: &str, text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
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

pub(super) fn check_host_port(addr: &str) -> Result<(), String> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("'{addr}' has no port"))?;
    if host.is_empty() {
        return Err(format!("'{addr}' has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("'{port}' in '{addr}' is not a port number")),
    }
}

pub(super) fn parse_scope_retention(text: &str, limits: &Limits) -> Result<BTreeMap<String, Duration>, ConfigError> {
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

pub(super) fn ttl_in_bounds(option: &str, d: Duration, limits: &Limits) -> Result<(), ConfigError> {
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

pub(super) fn check_token(token: Option<&str>) -> Result<String, ConfigError> {
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
