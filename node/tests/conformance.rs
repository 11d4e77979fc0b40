//! The Rust runner of the shared SDK conformance scenarios (`sdk/conformance/scenarios.json`;
//! `sdk/conformance/README.md` defines the format). The Python and TypeScript suites run the
//! same file through their SDKs; this one runs it through the Rust SDK (client scenarios) and
//! through `idemraft_client::http::IdempotencyLayer` in an axum app with reqwest as the HTTP
//! client (HTTP scenarios), all on one real 3-node cluster, so the three SDKs cannot drift.
//!
//! It lives in the node package because only this package's tests get the `idemraft`
//! binary's path from cargo. `IDEMRAFT_CONFORMANCE_ONLY=name[,name]` runs a subset.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use base64::Engine as _;
use common::{Cluster, SERIAL};
use idemraft_client::http::{ClaimInfo, FencingToken, IdempotencyLayer, InFlight};
use idemraft_client::proto as pb;
use idemraft_client::{
    fingerprint, ClaimOptions, Client, ClientConfig, Error, ExecuteError, ExecuteOptions, Fingerprint, Outcome, Record,
    RecordState, StoredResponse, WorkError, WorkGrant,
};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const SCENARIOS: &str = include_str!("../../sdk/conformance/scenarios.json");
/// How long blocked work waits for its `release` before it goes on by itself.
const GATE_LIMIT: Duration = Duration::from_secs(60);

type Failure = String;

// --- placeholders ------------------------------------------------------------------------

struct Vars {
    run: String,
    captured: HashMap<String, Value>,
}

impl Vars {
    fn new() -> Vars {
        // std's per-process random hash keys: fresh bits without another dependency.
        use std::hash::{BuildHasher as _, Hasher as _};
        let bits = std::collections::hash_map::RandomState::new().build_hasher().finish();
        Vars { run: format!("{bits:016x}"), captured: HashMap::new() }
    }

    fn value(&self, name: &str) -> Result<Value, Failure> {
        if name == "run" {
            return Ok(Value::String(self.run.clone()));
        }
        if let Some(n) = name.strip_prefix("key:") {
            return Ok(Value::String(format!("cf-{}-{n}", self.run)));
        }
        if let Some(n) = name.strip_prefix("owner:") {
            return Ok(Value::String(format!("owner-{}-{n}", self.run)));
        }
        self.captured.get(name).cloned().ok_or_else(|| format!("placeholder ${{{name}}} was never captured"))
    }

    fn text(&self, name: &str) -> Result<String, Failure> {
        Ok(match self.value(name)? {
            Value::String(s) => s,
            other => other.to_string(),
        })
    }

    fn sub(&self, v: &Value) -> Result<Value, Failure> {
        Ok(match v {
            Value::String(s) => {
                if let Some(name) = whole_placeholder(s) {
                    return self.value(name);
                }
                let mut out = String::new();
                let mut rest = s.as_str();
                while let Some(at) = rest.find("${") {
                    out.push_str(&rest[..at]);
                    let Some(end) = rest[at..].find('}') else {
                        out.push_str(&rest[at..]);
                        rest = "";
                        break;
                    };
                    out.push_str(&self.text(&rest[at + 2..at + end])?);
                    rest = &rest[at + end + 1..];
                }
                out.push_str(rest);
                Value::String(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(|x| self.sub(x)).collect::<Result<_, _>>()?),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, x)| Ok((k.clone(), self.sub(x)?))).collect::<Result<_, Failure>>()?)
            }
            other => other.clone(),
        })
    }
}

fn whole_placeholder(s: &str) -> Option<&str> {
    let inner = s.strip_prefix("${")?.strip_suffix('}')?;
    (!inner.contains('}') && !inner.contains("${")).then_some(inner)
}

// --- bytes and views ---------------------------------------------------------------------

fn to_bytes(v: Option<&Value>) -> Result<Vec<u8>, Failure> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(s.as_bytes().to_vec()),
        Some(Value::Object(o)) => {
            let b64 = o.get("base64").and_then(Value::as_str).ok_or("bytes object without base64")?;
            base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| format!("bad base64 {b64:?}: {e}"))
        }
        Some(other) => Err(format!("not bytes: {other}")),
    }
}

fn render_bytes(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) }),
    }
}

fn stored(spec: &Value) -> Result<StoredResponse, Failure> {
    let status = spec["status"].as_u64().ok_or("a response without a status")?;
    let mut r = StoredResponse::new(u32::try_from(status).map_err(|e| e.to_string())?, to_bytes(spec.get("body"))?);
    for pair in spec.get("headers").and_then(Value::as_array).into_iter().flatten() {
        r = r.with_header(str_at(pair, 0)?, str_at(pair, 1)?);
    }
    Ok(r)
}

fn str_at(pair: &Value, i: usize) -> Result<String, Failure> {
    pair.get(i).and_then(Value::as_str).map(str::to_string).ok_or_else(|| format!("not a [name, value] pair: {pair}"))
}

fn response_view(r: &StoredResponse) -> Value {
    json!({
        "status": r.status,
        "headers": r.headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body": render_bytes(&r.body),
    })
}

fn pb_response_view(r: &pb::StoredResponse) -> Value {
    json!({
        "status": r.status,
        "headers": r.headers.iter().map(|h| json!([h.name, h.value])).collect::<Vec<_>>(),
        "body": render_bytes(&r.body),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn record_view(r: Option<&Record>) -> Value {
    let Some(r) = r else { return Value::Null };
    let id = r.id.clone().unwrap_or_default();
    json!({
        "tenant": id.tenant, "scope": id.scope, "key": id.key,
        "state": RecordState::from_proto(r.state).as_str(),
        "token": r.token, "owner": r.owner, "attempt": r.attempt, "taken_over": r.taken_over,
        "lease_expires_ms": r.lease_expires_ms, "created_ms": r.created_ms, "updated_ms": r.updated_ms,
        "completed_ms": r.completed_ms, "expires_ms": r.expires_ms, "retention_ms": r.retention_ms,
        "recovery_point": r.recovery_point, "checkpoint": render_bytes(&r.checkpoint),
        "response": r.response.as_ref().map_or(Value::Null, pb_response_view),
        "fingerprint": hex(&r.fingerprint),
    })
}

fn outcome_view(o: &Outcome) -> Value {
    let mut v = Map::new();
    v.insert("outcome".into(), o.name().into());
    let fields = match o {
        Outcome::Acquired(g) => json!({
            "token": g.token, "attempt": g.attempt, "takeover": g.takeover,
            "lease_expires_ms": g.lease_expires_ms, "expires_ms": g.expires_ms,
            "recovery_point": g.recovery_point, "checkpoint": render_bytes(&g.checkpoint),
        }),
        Outcome::Replay { token, completed_ms, response } => {
            json!({ "token": token, "completed_ms": completed_ms, "response": response_view(response) })
        }
        Outcome::InProgress { lease_expires_ms, retry_after_ms } => {
            json!({ "lease_expires_ms": lease_expires_ms, "retry_after_ms": retry_after_ms })
        }
        Outcome::StaleToken { current } => json!({ "current": current }),
        Outcome::WrongState(s) => json!({ "state": s.as_str() }),
        Outcome::Completed { token } => json!({ "token": token }),
        Outcome::Failed { token, retryable } => json!({ "token": token, "retryable": retryable }),
        Outcome::LeaseExtended { token, lease_expires_ms } => {
            json!({ "token": token, "lease_expires_ms": lease_expires_ms })
        }
        Outcome::Mismatch | Outcome::NotFound => json!({}),
    };
    if let Value::Object(f) = fields {
        v.extend(f);
    }
    Value::Object(v)
}

/// The README's error table: a kind, the message as the SDK holds it (the server's text
/// unchanged where there is one) and whether the outcome is unknown.
fn error_view(e: &Error) -> Value {
    let (kind, message) = match e {
        Error::InvalidArgument(m) => ("invalid_argument", m.clone()),
        Error::Unavailable(m) => ("unavailable", m.clone()),
        Error::DeadlineExceeded(m) => ("deadline_exceeded", m.clone()),
        Error::Indeterminate(m) => ("indeterminate", m.clone()),
        Error::FailedPrecondition(m) => ("failed_precondition", m.clone()),
        Error::Config(m) => ("config", m.clone()),
        Error::Protocol(m) => ("protocol", m.clone()),
        Error::Rpc { message, .. } => ("rpc", message.clone()),
        Error::Io(m) => ("io", m.clone()),
        Error::QuotaExceeded { tenant, limit, records, message } => {
            return json!({
                "error": "quota_exceeded", "message": message, "indeterminate": e.is_indeterminate(),
                "tenant": tenant, "limit": limit, "records": records,
            })
        }
    };
    json!({ "error": kind, "message": message, "indeterminate": e.is_indeterminate() })
}

fn execute_error_view(e: &ExecuteError) -> Value {
    let plain = |kind: &str, message: String| json!({ "error": kind, "message": message, "indeterminate": false });
    match e {
        ExecuteError::Client(c) => error_view(c),
        ExecuteError::Mismatch => plain("mismatch", e.to_string()),
        ExecuteError::InProgress { lease_expires_ms } => {
            let mut v = plain("in_progress", e.to_string());
            v["lease_expires_ms"] = json!(lease_expires_ms);
            v
        }
        ExecuteError::WorkFailed(reason) => plain("work_failed", reason.clone()),
        ExecuteError::LostOwnership { token, current } => {
            let mut v = plain("lost_ownership", e.to_string());
            v["token"] = json!(token);
            v["current"] = json!(current);
            v
        }
        ExecuteError::Unexpected(name) => plain("unexpected", (*name).to_string()),
    }
}

async fn http_view(r: reqwest::Response) -> Result<Value, Failure> {
    let status = r.status().as_u16();
    let mut headers = Map::new();
    for (name, value) in r.headers() {
        let value = Value::String(value.to_str().map_err(|e| format!("header {name}: {e}"))?.to_string());
        match headers.get_mut(name.as_str()) {
            None => {
                headers.insert(name.as_str().to_string(), value);
            }
            Some(Value::Array(list)) => list.push(value),
            Some(first) => *first = Value::Array(vec![first.clone(), value]),
        }
    }
    let body = r.bytes().await.map_err(|e| format!("reading the body: {e}"))?;
    let parsed = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    Ok(json!({ "status": status, "headers": headers, "body": render_bytes(&body), "json": parsed }))
}

// --- matching ----------------------------------------------------------------------------

/// Equal values of the same JSON type; integers compare exactly whatever their width.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_u64(), y.as_u64(), x.as_i64(), y.as_i64()) {
            (Some(p), Some(q), _, _) => p == q,
            (_, _, Some(p), Some(q)) => p == q,
            _ => x.as_f64() == y.as_f64() && x.is_f64() == y.is_f64(),
        },
        _ => a == b,
    }
}

fn int(v: &Value) -> Option<i128> {
    v.as_u64().map(i128::from).or_else(|| v.as_i64().map(i128::from))
}

fn matcher(exp: &Value) -> Option<(&str, &Value)> {
    let o = exp.as_object()?;
    let (k, v) = o.iter().next()?;
    (o.len() == 1 && k.starts_with('$')).then_some((k.as_str(), v))
}

fn matches(exp: &Value, act: &Value, path: &str, out: &mut Vec<String>) {
    if let Some((op, arg)) = matcher(exp) {
        let num = int(act);
        let cmp = |f: fn(i128, i128) -> bool| matches!((num, int(arg)), (Some(a), Some(b)) if f(a, b));
        let ok = match op {
            "$gt" => cmp(|a, b| a > b),
            "$gte" => cmp(|a, b| a >= b),
            "$lt" => cmp(|a, b| a < b),
            "$lte" => cmp(|a, b| a <= b),
            "$between" => match (num, arg.get(0).and_then(int), arg.get(1).and_then(int)) {
                (Some(a), Some(lo), Some(hi)) => lo <= a && a <= hi,
                _ => false,
            },
            "$ne" => !same(arg, act),
            "$in" => arg.as_array().is_some_and(|xs| xs.iter().any(|x| same(x, act))),
            "$contains" => matches!((act.as_str(), arg.as_str()), (Some(a), Some(s)) if a.contains(s)),
            "$any_of" => arg.as_array().is_some_and(|xs| {
                xs.iter().any(|x| {
                    let mut inner = Vec::new();
                    matches(x, act, path, &mut inner);
                    inner.is_empty()
                })
            }),
            other => {
                out.push(format!("{path}: unknown matcher {other}"));
                return;
            }
        };
        if !ok {
            out.push(format!("{path}: {act} does not match {op} {arg}"));
        }
        return;
    }
    match (exp, act) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                let here = format!("{path}.{k}");
                match (v, a.get(k)) {
                    (Value::Null, None | Some(Value::Null)) => {}
                    (Value::Null, Some(got)) => out.push(format!("{here}: expected null/absent, got {got}")),
                    (_, None) => out.push(format!("{here}: missing (have {:?})", a.keys().collect::<Vec<_>>())),
                    (_, Some(got)) => matches(v, got, &here, out),
                }
            }
        }
        (Value::Object(_), _) => out.push(format!("{path}: expected an object, got {act}")),
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (x, y)) in e.iter().zip(a).enumerate() {
                matches(x, y, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Array(e), _) => out.push(format!("{path}: expected {} items {exp}, got {act}", e.len())),
        _ if same(exp, act) => {}
        _ => out.push(format!("{path}: expected {exp}, got {act}")),
    }
}

fn match_view(exp: &Value, view: &Value, http: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut exp = exp.clone();
    let problem = if http { exp.as_object_mut().and_then(|o| o.remove("problem")) } else { None };
    matches(&exp, view, "$", &mut out);
    if let Some(p) = problem {
        let ct = view["headers"].get("content-type");
        if ct != Some(&json!("application/problem+json")) {
            out.push(format!("problem: content-type is {ct:?}"));
        }
        match view["json"].as_object() {
            None => out.push(format!("problem: body is not a JSON object: {}", view["body"])),
            Some(j) => {
                if j.get("type") != p.get("type") {
                    out.push(format!("problem: type {:?} != {:?}", j.get("type"), p.get("type")));
                }
                if j.get("status") != view.get("status") {
                    out.push(format!("problem: status {:?} != {}", j.get("status"), view["status"]));
                }
                if j.get("title").and_then(Value::as_str).is_none_or(str::is_empty) {
                    out.push(format!("problem: title {:?}", j.get("title")));
                }
                let want = p.get("detail_contains").and_then(Value::as_str).unwrap_or("");
                if !j.get("detail").and_then(Value::as_str).is_some_and(|d| d.contains(want)) {
                    out.push(format!("problem: detail {:?} lacks {want:?}", j.get("detail")));
                }
            }
        }
    }
    out
}

fn path_get(view: &Value, path: &str) -> Result<Value, Failure> {
    let mut cur = view;
    for part in path.split('.') {
        cur = match cur {
            Value::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
            Value::Object(o) => o.get(part),
            _ => None,
        }
        .ok_or_else(|| format!("capture path {path:?} not in {view}"))?;
    }
    Ok(cur.clone())
}

// --- gates and counters ------------------------------------------------------------------

#[derive(Default)]
struct Gates(Mutex<HashMap<String, Gate>>);

/// A gate's "entered" and "opened" flags.
type Gate = (watch::Sender<bool>, watch::Sender<bool>);

impl Gates {
    /// The gate's "entered" and "opened" flags, made on first use by either side.
    fn get(&self, name: &str) -> Gate {
        let mut m = self.0.lock().unwrap();
        m.entry(name.to_string()).or_insert_with(|| (watch::channel(false).0, watch::channel(false).0)).clone()
    }

    async fn block(&self, name: &str) {
        let (entered, opened) = self.get(name);
        entered.send_replace(true);
        let mut rx = opened.subscribe();
        let _ = tokio::time::timeout(GATE_LIMIT, rx.wait_for(|o| *o)).await;
    }

    async fn await_entered(&self, name: &str, timeout: Duration) -> Result<(), Failure> {
        let mut rx = self.get(name).0.subscribe();
        let entered = matches!(tokio::time::timeout(timeout, rx.wait_for(|e| *e)).await, Ok(Ok(_)));
        if entered {
            Ok(())
        } else {
            Err(format!("nothing entered gate {name} within {timeout:?}"))
        }
    }

    fn release(&self, name: &str) {
        self.get(name).1.send_replace(true);
    }

    fn release_all(&self) {
        for (_, opened) in self.0.lock().unwrap().values() {
            opened.send_replace(true);
        }
    }
}

#[derive(Default)]
struct Counters(Mutex<HashMap<String, u64>>);

impl Counters {
    fn bump(&self, name: &str) -> u64 {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(name.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    fn get(&self, name: &str) -> u64 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

// --- HTTP apps ---------------------------------------------------------------------------

fn ms(v: &Value, field: &str) -> Option<Duration> {
    v.get(field).and_then(Value::as_u64).map(Duration::from_millis)
}

fn layer_for(mw: &Value, client: Client) -> Result<IdempotencyLayer, Failure> {
    let scope = mw["scope"].as_str().ok_or("middleware without a scope")?;
    let mut layer = IdempotencyLayer::new(client, scope);
    if let Some(d) = ms(mw, "lease_ms") {
        layer = layer.lease(d);
    }
    match mw.get("in_flight") {
        None => {}
        Some(v) if v == "conflict" => layer = layer.in_flight(InFlight::Conflict),
        Some(v) => layer = layer.in_flight(InFlight::Wait(ms(v, "wait_ms").ok_or("in_flight without wait_ms")?)),
    }
    if let Some(open) = mw.get("fail_open").and_then(Value::as_bool) {
        layer = layer.fail_open(open);
    }
    if let Some(required) = mw.get("key_required").and_then(Value::as_bool) {
        layer = layer.key_required(required);
    }
    if let Some(n) = mw.get("max_body_bytes").and_then(Value::as_u64) {
        layer = layer.max_body_bytes(usize::try_from(n).map_err(|e| e.to_string())?);
    }
    for name in mw.get("replay_headers_add").and_then(Value::as_array).into_iter().flatten() {
        let name = name.as_str().ok_or("a replay header that is not a string")?;
        layer = layer.replay_header(name.parse().map_err(|e| format!("header name {name:?}: {e}"))?);
    }
    if let Some(d) = ms(mw, "cluster_timeout_ms") {
        layer = layer.cluster_timeout(d);
    }
    layer.validate().map_err(|e| e.to_string())?;
    Ok(layer)
}

fn handler(spec: Value, counters: Arc<Counters>, gates: Arc<Gates>) -> impl Fn(Request) -> HandlerFuture + Clone {
    move |req: Request| {
        let (spec, counters, gates) = (spec.clone(), counters.clone(), gates.clone());
        Box::pin(async move {
            let mut n = 0;
            if let Some(c) = spec.get("count").and_then(Value::as_str) {
                n = counters.bump(c);
            }
            if let Some(g) = spec.get("block").and_then(Value::as_str) {
                gates.block(g).await;
            }
            if let Some(d) = ms(&spec, "sleep_ms") {
                tokio::time::sleep(d).await;
            }
            let raise = spec.get("raise_on_runs").and_then(Value::as_array);
            if raise.is_some_and(|runs| runs.iter().any(|r| r.as_u64() == Some(n))) {
                panic!("planned handler failure on run {n}");
            }
            let token = req.extensions().get::<FencingToken>().map_or("null".to_string(), |t| t.0.to_string());
            let attempt = req.extensions().get::<ClaimInfo>().map_or("null".to_string(), |c| c.attempt.to_string());
            let body = String::from_utf8(to_bytes(spec.get("body")).unwrap()).unwrap();
            let body = body.replace("{{token}}", &token).replace("{{attempt}}", &attempt);
            let mut resp = axum::http::Response::builder().status(spec["status"].as_u64().unwrap() as u16);
            for pair in spec.get("headers").and_then(Value::as_array).into_iter().flatten() {
                resp = resp.header(str_at(pair, 0).unwrap(), str_at(pair, 1).unwrap());
            }
            resp.body(axum::body::Body::from(body)).unwrap()
        })
    }
}

type HandlerFuture = std::pin::Pin<Box<dyn std::future::Future<Output = axum::response::Response> + Send>>;

fn build_app(
    app: &Value,
    layer: IdempotencyLayer,
    counters: &Arc<Counters>,
    gates: &Arc<Gates>,
) -> Result<Router, Failure> {
    // Routes on one path share a method router: axum keeps one per path.
    let mut paths: BTreeMap<String, MethodRouter> = BTreeMap::new();
    for r in app["routes"].as_array().ok_or("an app without routes")? {
        let method: axum::http::Method =
            r["method"].as_str().ok_or("a route without a method")?.parse().map_err(|e| format!("{e}"))?;
        let filter = MethodFilter::try_from(method).map_err(|e| e.to_string())?;
        let path = r["path"].as_str().ok_or("a route without a path")?.to_string();
        let h = handler(r["handler"].clone(), counters.clone(), gates.clone());
        let mr = match paths.remove(&path) {
            Some(mr) => mr.on(filter, h),
            None => on(filter, h),
        };
        paths.insert(path, mr);
    }
    let router = paths.into_iter().fold(Router::new(), |router, (path, mr)| router.route(&path, mr));
    Ok(router.layer(layer))
}

async fn free_port_addrs(n: usize) -> Vec<String> {
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    held.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

// --- the runner --------------------------------------------------------------------------

/// What a step needs, cheap to clone into a background task.
#[derive(Clone)]
struct Ctx {
    client: Client,
    counters: Arc<Counters>,
    gates: Arc<Gates>,
    http: reqwest::Client,
    base: Option<String>,
}

struct Runner<'a> {
    scenario: &'a Value,
    cluster: &'a mut Cluster,
    deadline: Duration,
    vars: Vars,
    ctx: Ctx,
    handles: HashMap<String, JoinHandle<Result<Value, Failure>>>,
    killed: Vec<u64>,
}

impl Runner<'_> {
    fn client(&self, endpoints: Vec<String>, tenant: &str) -> Client {
        let mut config = ClientConfig::new(endpoints);
        config.deadline = self.deadline;
        config.tenant = tenant.to_string();
        Client::new(config).unwrap()
    }

    async fn run(&mut self) -> Result<(), Failure> {
        let result = self.run_steps().await;
        self.ctx.gates.release_all();
        for (_, h) in self.handles.drain() {
            let _ = tokio::time::timeout(Duration::from_secs(30), h).await;
        }
        result
    }

    async fn run_steps(&mut self) -> Result<(), Failure> {
        let tenant = self.vars.sub(self.scenario.get("tenant").unwrap_or(&json!("")))?;
        let endpoints: Vec<String> = (1..=3).map(|i| self.cluster.client_addr(i)).collect();
        self.ctx.client = self.client(endpoints.clone(), tenant.as_str().unwrap_or_default());
        if self.scenario["kind"] == "http" {
            let app = self.vars.sub(&self.scenario["app"])?;
            let mw = &app["middleware"];
            let mw_endpoints = if mw.get("endpoints").is_some_and(|e| e == "unreachable") {
                free_port_addrs(2).await
            } else {
                endpoints
            };
            let layer = layer_for(mw, self.client(mw_endpoints, ""))?;
            let router = build_app(&app, layer, &self.ctx.counters, &self.ctx.gates)?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            self.ctx.base = Some(format!("http://{}", listener.local_addr().unwrap()));
            let server = tokio::spawn(axum::serve(listener, router).into_future());
            let r = self.steps().await;
            server.abort();
            return r;
        }
        self.steps().await
    }

    async fn steps(&mut self) -> Result<(), Failure> {
        let steps = self.scenario["steps"].as_array().ok_or("a scenario without steps")?;
        for (i, raw) in steps.iter().enumerate() {
            self.step(raw).await.map_err(|e| format!("step {i} ({}): {e}", raw["op"]))?;
        }
        Ok(())
    }

    async fn step(&mut self, raw: &Value) -> Result<(), Failure> {
        let op = raw["op"].as_str().ok_or("a step without op")?;
        match op {
            "sleep" => tokio::time::sleep(ms(raw, "ms").ok_or("sleep without ms")?).await,
            "kill_leader" => self.kill_leader().await?,
            "await_blocked" => {
                let gate = raw["gate"].as_str().ok_or("await_blocked without gate")?;
                let timeout = ms(raw, "timeout_ms").unwrap_or(Duration::from_secs(10));
                self.ctx.gates.await_entered(gate, timeout).await?;
            }
            "release" => self.ctx.gates.release(raw["gate"].as_str().ok_or("release without gate")?),
            "counter" => {
                let name = raw["name"].as_str().ok_or("counter without name")?;
                let mut bad = Vec::new();
                matches(&raw["expect"], &json!(self.ctx.counters.get(name)), &format!("counter {name}"), &mut bad);
                if !bad.is_empty() {
                    return Err(bad.join("; "));
                }
            }
            "join" => {
                let handle = raw["handle"].as_str().ok_or("join without handle")?;
                let h = self.handles.remove(handle).ok_or_else(|| format!("no background call {handle}"))?;
                let timeout = ms(raw, "timeout_ms").unwrap_or(Duration::from_secs(60));
                let view = match tokio::time::timeout(timeout, h).await {
                    Ok(Ok(view)) => view?,
                    Ok(Err(e)) => return Err(format!("background {handle} panicked: {e}")),
                    Err(_) => return Err(format!("background {handle} did not finish within {timeout:?}")),
                };
                let http = view.get("status").is_some() && view.get("json").is_some();
                self.check(raw, &view, http)?;
            }
            _ => {
                let mut step = raw.clone();
                if let Some(o) = step.as_object_mut() {
                    o.remove("expect");
                    o.remove("capture");
                }
                let step = self.vars.sub(&step)?;
                if let Some(handle) = step.get("background").and_then(Value::as_str) {
                    let ctx = self.ctx.clone();
                    let s = step.clone();
                    self.handles.insert(handle.to_string(), tokio::spawn(async move { perform(ctx, s).await }));
                    return Ok(());
                }
                let view = perform(self.ctx.clone(), step).await?;
                self.check(raw, &view, op == "request")?;
            }
        }
        Ok(())
    }

    fn check(&mut self, raw: &Value, view: &Value, http: bool) -> Result<(), Failure> {
        if let Some(exp) = raw.get("expect") {
            let bad = match_view(&self.vars.sub(exp)?, view, http);
            if !bad.is_empty() {
                let shown: String = view.to_string().chars().take(2000).collect();
                return Err(format!("{}\n  view: {shown}", bad.join("; ")));
            }
        } else if view.get("error").is_some() {
            return Err(format!("unexpected error {view}"));
        }
        for (var, path) in raw.get("capture").and_then(Value::as_object).into_iter().flatten() {
            let value = path_get(view, path.as_str().ok_or("a capture path that is not a string")?)?;
            self.vars.captured.insert(var.clone(), value);
        }
        Ok(())
    }

    async fn kill_leader(&mut self) -> Result<(), Failure> {
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            for id in self.cluster.running() {
                let status = self.cluster.client_for(&[id]).node_status(0).await;
                if status.is_ok_and(|s| s.leader_id == id && s.id == id) {
                    self.cluster.kill(id);
                    self.killed.push(id);
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > end {
                return Err("no node reported itself leader within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn claim_fingerprint(s: &Value) -> Result<Option<Fingerprint>, Failure> {
    match s.get("fingerprint") {
        None | Some(Value::Null) => Ok(None),
        Some(fp) => {
            let method = fp["method"].as_str().ok_or("fingerprint without method")?;
            let path = fp["path"].as_str().ok_or("fingerprint without path")?;
            Ok(Some(fingerprint(method, path, Some(&to_bytes(fp.get("body"))?))))
        }
    }
}

fn field<'v>(s: &'v Value, name: &str) -> Result<&'v str, Failure> {
    s.get(name).and_then(Value::as_str).ok_or_else(|| format!("missing string field {name}"))
}

fn u64_field(s: &Value, name: &str) -> Result<u64, Failure> {
    s.get(name).and_then(Value::as_u64).ok_or_else(|| format!("missing integer field {name}"))
}

/// Absent or 0: the node's default, as the proto's zero value says.
fn opt_ms(s: &Value, name: &str) -> Option<Duration> {
    ms(s, name).filter(|d| !d.is_zero())
}

fn flag(s: &Value, name: &str, default: bool) -> bool {
    s.get(name).and_then(Value::as_bool).unwrap_or(default)
}

async fn perform(ctx: Ctx, s: Value) -> Result<Value, Failure> {
    let op = field(&s, "op")?;
    if op == "request" {
        let base = ctx.base.as_deref().ok_or("a request step in a client scenario")?;
        let method: reqwest::Method = field(&s, "method")?.parse().map_err(|e| format!("{e}"))?;
        let mut req = ctx.http.request(method, format!("{base}{}", field(&s, "path")?));
        for pair in s.get("headers").and_then(Value::as_array).into_iter().flatten() {
            req = req.header(str_at(pair, 0)?, str_at(pair, 1)?);
        }
        let r = req.body(to_bytes(s.get("body"))?).send().await.map_err(|e| format!("HTTP request failed: {e}"))?;
        return http_view(r).await;
    }
    if op == "execute" {
        return execute(&ctx, &s).await;
    }
    let c = &ctx.client;
    let (scope, key) = (s.get("scope").and_then(Value::as_str).unwrap_or(""), s.get("key").and_then(Value::as_str));
    let key = || key.ok_or_else(|| "missing string field key".to_string());
    let result: Result<Value, Error> = match op {
        "claim" => {
            let opts = ClaimOptions {
                fingerprint: claim_fingerprint(&s)?,
                lease: opt_ms(&s, "lease_ms"),
                ttl: opt_ms(&s, "ttl_ms"),
                allow_takeover: flag(&s, "allow_takeover", false),
            };
            c.claim(scope, key()?, field(&s, "owner")?, &opts).await.map(|o| outcome_view(&o))
        }
        "complete" => {
            let resp = stored(&s["response"])?;
            c.complete(scope, key()?, u64_field(&s, "token")?, &resp).await.map(|o| outcome_view(&o))
        }
        "fail" => {
            let resp = match s.get("response") {
                None | Some(Value::Null) => None,
                Some(r) => Some(stored(r)?),
            };
            let retryable = flag(&s, "retryable", false);
            c.fail(scope, key()?, u64_field(&s, "token")?, retryable, resp.as_ref()).await.map(|o| outcome_view(&o))
        }
        "extend_lease" => c
            .extend_lease(scope, key()?, u64_field(&s, "token")?, opt_ms(&s, "lease_ms"))
            .await
            .map(|o| outcome_view(&o)),
        "checkpoint" => {
            let data = to_bytes(s.get("data"))?;
            let point = s.get("recovery_point").and_then(Value::as_str).unwrap_or("");
            c.checkpoint(scope, key()?, u64_field(&s, "token")?, point, &data, opt_ms(&s, "lease_ms"))
                .await
                .map(|o| outcome_view(&o))
        }
        "takeover" => c
            .takeover(scope, key()?, field(&s, "owner")?, flag(&s, "force", false), opt_ms(&s, "lease_ms"))
            .await
            .map(|o| outcome_view(&o)),
        "get" => c.get(scope, key()?).await.map(|r| json!({ "record": record_view(r.as_ref()) })),
        "wait" => {
            let timeout = ms(&s, "timeout_ms").ok_or("wait without timeout_ms")?;
            c.wait(scope, key()?, timeout)
                .await
                .map(|w| json!({ "record": record_view(w.record.as_ref()), "timed_out": w.timed_out }))
        }
        "list" => {
            let state = match s.get("state").and_then(Value::as_str) {
                None => pb::RecordState::Unspecified,
                Some("IN_PROGRESS") => pb::RecordState::InProgress,
                Some("COMPLETED") => pb::RecordState::Completed,
                Some("FAILED") => pb::RecordState::Failed,
                Some(other) => return Err(format!("unknown state {other}")),
            };
            let req = pb::ListRequest {
                scope: scope.to_string(),
                state: state as i32,
                abandoned_only: flag(&s, "abandoned_only", false),
                limit: u32::try_from(s.get("limit").and_then(Value::as_u64).unwrap_or(0)).map_err(|e| e.to_string())?,
                ..Default::default()
            };
            c.list(req).await.map(|page| {
                json!({
                    "records": page.records.iter().map(|r| record_view(Some(r))).collect::<Vec<_>>(),
                    "next_after": page.next_after.map_or(Value::Null, |n| {
                        json!({ "tenant": n.tenant, "scope": n.scope, "key": n.key })
                    }),
                })
            })
        }
        "set_quota" => {
            let max = s.get("max_records").and_then(Value::as_u64);
            c.set_quota(Some(field(&s, "tenant")?), max).await.map(|_| json!({}))
        }
        other => return Err(format!("unknown op {other}")),
    };
    Ok(result.unwrap_or_else(|e| error_view(&e)))
}

async fn execute(ctx: &Ctx, s: &Value) -> Result<Value, Failure> {
    let spec = s["work"].clone();
    let opts = ExecuteOptions {
        lease: ms(s, "lease_ms").ok_or("execute without lease_ms")?,
        ttl: None,
        deadline: ms(s, "deadline_ms").ok_or("execute without deadline_ms")?,
        owner: s.get("owner").and_then(Value::as_str).map(str::to_string),
        allow_takeover: flag(s, "allow_takeover", true),
    };
    let result = spec.get("result").cloned().ok_or("work without result")?;
    let (counters, gates) = (ctx.counters.clone(), ctx.gates.clone());
    let work = move |_grant: WorkGrant| async move {
        if let Some(c) = spec.get("count").and_then(Value::as_str) {
            counters.bump(c);
        }
        if let Some(g) = spec.get("block").and_then(Value::as_str) {
            gates.block(g).await;
        }
        if let Some(d) = ms(&spec, "sleep_ms") {
            tokio::time::sleep(d).await;
        }
        if let Some(r) = result.get("respond") {
            return stored(r).map_err(WorkError::Retryable);
        }
        if let Some(reason) = result.get("fail_retryable") {
            return Err(WorkError::Retryable(reason.as_str().unwrap_or_default().to_string()));
        }
        match result.get("fail_terminal").map(stored) {
            Some(Ok(r)) => Err(WorkError::Terminal(r)),
            _ => Err(WorkError::Retryable(format!("the scenario's work result {result} is not understood"))),
        }
    };
    let fp = claim_fingerprint(s)?;
    let key = field(s, "key")?;
    Ok(match ctx.client.execute(field(s, "scope")?, key, fp, &opts, work).await {
        Ok(e) => json!({
            "outcome": "EXECUTED", "token": e.token, "replayed": e.replayed, "response": response_view(&e.response),
        }),
        Err(e) => execute_error_view(&e),
    })
}

/// Restarts the nodes a scenario killed and waits for the whole cluster to agree on a leader.
async fn heal(cluster: &mut Cluster, killed: &[u64]) {
    for id in killed {
        cluster.restart(*id);
    }
    if !killed.is_empty() {
        cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(60)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shared_conformance_scenarios() {
    let _serial = SERIAL.lock().await;
    let file: Value = serde_json::from_str(SCENARIOS).expect("scenarios.json parses");
    assert_eq!(file["version"], 1, "this runner reads version 1 of the scenario format");
    let deadline = Duration::from_millis(file["defaults"]["client"]["deadline_ms"].as_u64().unwrap_or(10_000));
    let only: Option<Vec<String>> = std::env::var("IDEMRAFT_CONFORMANCE_ONLY")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect());
    let scenarios = file["scenarios"].as_array().expect("a scenarios list");
    let mut cluster = Cluster::start(3, &[]).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();

    let (mut ran, mut failures) = (0, Vec::new());
    for scenario in scenarios {
        let name = scenario["name"].as_str().unwrap_or("?");
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
            continue;
        }
        let started = std::time::Instant::now();
        let mut runner = Runner {
            scenario,
            deadline,
            vars: Vars::new(),
            ctx: Ctx {
                client: cluster.client(),
                counters: Arc::default(),
                gates: Arc::default(),
                http: http.clone(),
                base: None,
            },
            handles: HashMap::new(),
            killed: Vec::new(),
            cluster: &mut cluster,
        };
        let result = runner.run().await;
        let (killed, run) = (std::mem::take(&mut runner.killed), runner.vars.run.clone());
        ran += 1;
        match result {
            Ok(()) => eprintln!("conformance: {name} ok ({:.1} s)", started.elapsed().as_secs_f64()),
            Err(e) => {
                eprintln!("conformance: {name} FAILED (run {run}): {e}");
                failures.push(format!("{name} (run {run}): {e}"));
            }
        }
        heal(&mut cluster, &killed).await;
    }
    assert!(ran > 0, "no scenario matched IDEMRAFT_CONFORMANCE_ONLY={only:?}");
    assert!(failures.is_empty(), "{} of {ran} conformance scenarios failed:\n{}", failures.len(), failures.join("\n"));
    eprintln!("conformance: {ran} scenarios passed");
}

/// The matcher must refuse what the README says it refuses, or every scenario would pass.
#[test]
fn matching_refuses_what_it_should() {
    let ok = |exp: Value, act: Value| match_view(&exp, &act, false).is_empty();
    assert!(ok(json!({"a": 1}), json!({"a": 1, "b": 2})));
    assert!(!ok(json!({"a": 1}), json!({"a": 2})));
    assert!(!ok(json!({"a": 1}), json!({"a": "1"})));
    assert!(!ok(json!({"a": 1}), json!({})));
    assert!(ok(json!({"a": null}), json!({})));
    assert!(!ok(json!({"a": null}), json!({"a": 0})));
    assert!(!ok(json!([1, 2]), json!([1, 2, 3])));
    assert!(ok(json!({"t": u64::MAX}), json!({"t": u64::MAX})));
    assert!(!ok(json!({"t": u64::MAX}), json!({"t": u64::MAX - 1})));
    assert!(ok(json!({"t": {"$gt": 0}}), json!({"t": 1})));
    assert!(!ok(json!({"t": {"$gt": 0}}), json!({"t": 0})));
    assert!(!ok(json!({"t": {"$gt": 0}}), json!({"t": "5"})));
    assert!(ok(json!({"t": {"$between": [1, 3]}}), json!({"t": 3})));
    assert!(!ok(json!({"t": {"$between": [1, 3]}}), json!({"t": 4})));
    assert!(!ok(json!({"m": {"$contains": "quota"}}), json!({"m": "no"})));
    assert!(ok(json!({"$any_of": [{"a": 1}, {"b": 2}]}), json!({"b": 2})));
    assert!(!ok(json!({"$any_of": [{"a": 1}, {"b": 2}]}), json!({"c": 3})));
    assert!(!ok(json!({"x": {"$nope": 1}}), json!({"x": 1})));
    let problem = json!({"status": 400, "problem": {"type": "urn:idemraft:problem:x", "detail_contains": "key"}});
    let view =
        |ct: &str, body: Value| json!({"status": 400, "headers": {"content-type": ct}, "json": body, "body": ""});
    let good = json!({"type": "urn:idemraft:problem:x", "status": 400, "title": "T", "detail": "the key"});
    assert!(match_view(&problem, &view("application/problem+json", good.clone()), true).is_empty());
    assert!(!match_view(&problem, &view("application/json", good), true).is_empty());
    let no_title = json!({"type": "urn:idemraft:problem:x", "status": 400, "detail": "the key"});
    assert!(!match_view(&problem, &view("application/problem+json", no_title), true).is_empty());
}

#[test]
fn placeholders_substitute_and_keep_types() {
    let mut vars = Vars::new();
    vars.captured.insert("tok".into(), json!(42u64));
    let run = vars.run.clone();
    assert_eq!(vars.sub(&json!("${tok}")).unwrap(), json!(42));
    assert_eq!(vars.sub(&json!("t=${tok}")).unwrap(), json!("t=42"));
    assert_eq!(vars.sub(&json!("${key:a}")).unwrap(), json!(format!("cf-{run}-a")));
    assert_eq!(vars.sub(&json!({"o": ["${owner:x}"]})).unwrap(), json!({"o": [format!("owner-{run}-x")]}));
    assert!(vars.sub(&json!("${never}")).is_err());
}
