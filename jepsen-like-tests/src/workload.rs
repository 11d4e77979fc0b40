//! The workload: concurrent SDK clients on a small, contended key space, each running the
//! life of an idempotent request (claim → work → complete or fail) with the ways real workers
//! go wrong mixed in: abandoning a claim (a crash), sleeping past the lease (a GC pause),
//! completing with a token that was already superseded, asking for a key with another
//! payload. Every call is recorded in the [`Recorder`]; an answer that did not come is
//! recorded as unknown, never as a failure.
//!
//! Owners and stored values are unique per call, so an unknown outcome can be resolved later
//! by whatever the history shows. The "work" is a charge on the fenced [`Ledger`]. Stored
//! bodies come from [`crate::payload`]; the history holds their digests.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_client::proto::Record;
use idemraft_client::{ClaimOptions, Client, Error, Fingerprint, Outcome, RecordState, StoredResponse};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::history::{Input, Output, Recorder, State, View};
use crate::ledger::Ledger;
use crate::payload::{self, Payloads};

/// The scope every run uses.
pub const SCOPE: &str = "jepsen.run";

/// Workload settings.
#[derive(Clone, Debug)]
pub struct WorkloadSpec {
    /// Concurrent clients.
    pub clients: u32,
    /// Keys live at once; the window moves every `key_epoch` so no key collects more history
    /// than the checker can afford.
    pub keys: u32,
    /// How long one key window lasts.
    pub key_epoch: Duration,
    /// The lease claims ask for: short, so takeovers happen within a run.
    pub lease: Duration,
    /// Deadline of one SDK call (retries included): the longest an op can stay open.
    pub call_deadline: Duration,
    /// The run's seed; client `i` draws from `seed + i`.
    pub seed: u64,
    /// The bodies completions store.
    pub payloads: Payloads,
}

/// What the clients share.
#[derive(Clone)]
pub struct Shared {
    /// The history.
    pub recorder: Recorder,
    /// The fenced downstream.
    pub ledger: Ledger,
    /// Set to stop every client after its current op.
    pub stop: Arc<AtomicBool>,
    /// Highest token each key has been seen granted with, for deliberate stale completes.
    pub tokens: Arc<Mutex<BTreeMap<String, Vec<u64>>>>,
    /// Ops that returned an answer (not unknown), for the traffic-rate check.
    pub answered: Arc<AtomicU64>,
    /// Every key used.
    pub keys_used: Arc<Mutex<std::collections::BTreeSet<String>>>,
    /// Set by the catch-up fault: completions store 128–256 KiB bodies while it holds.
    pub large_bodies: Arc<AtomicBool>,
}

impl Shared {
    /// Fresh shared state.
    pub fn new(recorder: Recorder) -> Shared {
        Shared {
            recorder: recorder.clone(),
            ledger: Ledger::new(recorder.clock()),
            stop: Arc::new(AtomicBool::new(false)),
            tokens: Arc::default(),
            answered: Arc::default(),
            keys_used: Arc::default(),
            large_bodies: Arc::default(),
        }
    }
}

/// Where one client sends its calls.
pub struct Endpoints {
    /// Failover client over the founding members (writes).
    pub writer: Client,
    /// One client per node, by id (reads aimed at one replica).
    pub readers: Vec<(u64, Client)>,
}

/// The stand-in fingerprint for payload variant `v`.
pub fn fingerprint_of(v: u8) -> Fingerprint {
    let mut fp = [0u8; 32];
    fp[0] = 0x1d;
    fp[31] = v;
    Fingerprint(fp)
}

fn state_of(s: RecordState) -> Option<State> {
    match s {
        RecordState::InProgress => Some(State::InProgress),
        RecordState::Completed => Some(State::Completed),
        RecordState::Failed => Some(State::Failed),
        RecordState::Unknown => None,
    }
}

/// A record of `key` as the history sees it; `None` inside when the state is one this
/// harness does not know (recorded as unknown rather than guessed).
pub fn view_of(key: &str, r: &Record) -> Option<View> {
    let state = state_of(RecordState::from_proto(r.state))?;
    let value = match state {
        State::Completed => r.response.as_ref().map(|resp| payload::observed(key, r.token, &resp.body)),
        _ => None,
    };
    Some(View { state, token: r.token, owner: r.owner.clone(), value })
}

/// An SDK outcome for `key` in history terms.
pub fn output_of(key: &str, o: &Outcome) -> Output {
    match o {
        Outcome::Acquired(g) => Output::Acquired { token: g.token, attempt: g.attempt, takeover: g.takeover },
        Outcome::Replay { token, response, .. } => {
            Output::Replay { token: *token, value: payload::observed(key, *token, &response.body) }
        }
        Outcome::InProgress { .. } => Output::InProgress,
        Outcome::Mismatch => Output::Mismatch,
        Outcome::StaleToken { current } => Output::StaleToken { current: *current },
        Outcome::NotFound => Output::NotFound,
        Outcome::WrongState(s) => match state_of(*s) {
            Some(state) => Output::WrongState { state },
            None => Output::Unknown,
        },
        Outcome::Completed { token } => Output::Completed { token: *token },
        Outcome::Failed { token, retryable } => Output::Failed { token: *token, retryable: *retryable },
        Outcome::LeaseExtended { token, .. } => Output::LeaseExtended { token: *token },
    }
}

/// Records the end of op `id` on `key` from an SDK result; returns the outcome when there was
/// one.
fn finish(shared: &Shared, id: u64, key: &str, r: Result<Outcome, Error>) -> Option<Outcome> {
    match r {
        Ok(o) => {
            let out = output_of(key, &o);
            if out == Output::Unknown {
                shared.recorder.unknown(id);
                return None;
            }
            shared.recorder.ok(id, out);
            shared.answered.fetch_add(1, Ordering::Relaxed);
            Some(o)
        }
        Err(Error::InvalidArgument(m)) => {
            shared.recorder.ok(id, Output::Refused { reason: m });
            None
        }
        Err(_) => {
            shared.recorder.unknown(id);
            None
        }
    }
}

fn finish_read(shared: &Shared, id: u64, key: &str, r: Result<Option<Record>, Error>) {
    match r {
        Ok(rec) => {
            let view = match rec.as_ref().map(|r| view_of(key, r)) {
                None => None,
                Some(Some(v)) => Some(v),
                Some(None) => {
                    shared.recorder.unknown(id);
                    return;
                }
            };
            shared.recorder.ok(id, Output::Record { view });
            shared.answered.fetch_add(1, Ordering::Relaxed);
        }
        Err(Error::InvalidArgument(m)) => shared.recorder.ok(id, Output::Refused { reason: m }),
        Err(_) => shared.recorder.unknown(id),
    }
}

/// One client's loop, until `stop` or `until`.
pub async fn client_loop(n: u32, spec: WorkloadSpec, shared: Shared, ep: Endpoints, origin: Instant, until: Instant) {
    let client_seed = spec.seed.wrapping_add(u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut rng = StdRng::seed_from_u64(client_seed);
    // Sizes draw from their own stream, so the tiny and the mixed run of one seed make the
    // same choices of op, key and timing.
    let mut bodies = Bodies {
        payloads: spec.payloads,
        sizes: StdRng::seed_from_u64(client_seed ^ 0x00b0_d1e5),
        large: shared.large_bodies.clone(),
    };
    let mut seq = 0u64;
    let lease_ms = spec.lease.as_millis() as u64;
    while !shared.stop.load(Ordering::Relaxed) && Instant::now() < until {
        let epoch = origin.elapsed().as_millis() as u64 / spec.key_epoch.as_millis().max(1) as u64;
        let key = format!("jk-e{epoch:04}-k{:03}-padding", rng.random_range(0..spec.keys));
        if let Ok(mut k) = shared.keys_used.lock() {
            k.insert(key.clone());
        }
        seq += 1;
        let owner = format!("c{n}-{seq}");
        let roll: f64 = rng.random();
        if roll < 0.12 {
            read(&shared, &ep, &key, &mut rng, n).await;
            continue;
        }
        if roll < 0.18 {
            stale_complete(&shared, &ep, &key, &mut rng, &mut bodies, n, &owner).await;
            continue;
        }
        if roll < 0.21 {
            let id = shared.recorder.invoke(n, None, &key, Input::Takeover { owner: owner.clone(), force: false });
            let r = ep.writer.takeover(SCOPE, &key, &owner, false, Some(spec.lease)).await;
            if let Some(Outcome::Acquired(g)) = finish(&shared, id, &key, r) {
                note_token(&shared, &key, g.token);
                work(&shared, &ep, &spec, &key, &owner, g.token, &mut rng, &mut bodies, n).await;
            }
            continue;
        }
        let fingerprint = if rng.random_bool(0.03) { 1 } else { 0 };
        let allow_takeover = rng.random_bool(0.8);
        let opts = ClaimOptions {
            fingerprint: Some(fingerprint_of(fingerprint)),
            lease: Some(spec.lease),
            ttl: Some(Duration::from_secs(3600)),
            allow_takeover,
        };
        // An unknown claim is retried with the same owner, as a real client resolves it: the
        // same owner gets the same grant back if the first try went through.
        let mut outcome = None;
        for _ in 0..3 {
            let input = Input::Claim { owner: owner.clone(), fingerprint, allow_takeover, lease_ms };
            let id = shared.recorder.invoke(n, None, &key, input);
            let r = ep.writer.claim(SCOPE, &key, &owner, &opts).await;
            let unknown = matches!(&r, Err(e) if !matches!(e, Error::InvalidArgument(_)));
            outcome = finish(&shared, id, &key, r);
            if !unknown || shared.stop.load(Ordering::Relaxed) {
                break;
            }
        }
        match outcome {
            Some(Outcome::Acquired(g)) => {
                note_token(&shared, &key, g.token);
                if rng.random_bool(0.1) {
                    // A worker that timed out on an answer that did arrive asks again: the
                    // same owner must get the same grant back (contract §4.2 row 4).
                    let input = Input::Claim { owner: owner.clone(), fingerprint, allow_takeover, lease_ms };
                    let id = shared.recorder.invoke(n, None, &key, input);
                    let r = ep.writer.claim(SCOPE, &key, &owner, &opts).await;
                    finish(&shared, id, &key, r);
                }
                work(&shared, &ep, &spec, &key, &owner, g.token, &mut rng, &mut bodies, n).await;
            }
            Some(Outcome::InProgress { .. }) if rng.random_bool(0.4) => {
                let id = shared.recorder.invoke(n, None, &key, Input::Wait);
                let r = ep.writer.wait(SCOPE, &key, Duration::from_millis(800)).await.map(|w| w.record);
                finish_read(&shared, id, &key, r);
            }
            _ => {}
        }
    }
}

/// One client's body maker.
struct Bodies {
    payloads: Payloads,
    sizes: StdRng,
    large: Arc<AtomicBool>,
}

impl Bodies {
    fn make(&mut self, kind: &str, key: &str, token: u64, owner: &str) -> Vec<u8> {
        match self.payloads {
            Payloads::Tiny => format!("{kind}-{owner}").into_bytes(),
            Payloads::Mix => {
                let len = payload::draw_size(&mut self.sizes, self.large.load(Ordering::Relaxed));
                payload::body(kind, key, token, owner, len)
            }
        }
    }
}

fn note_token(shared: &Shared, key: &str, token: u64) {
    if let Ok(mut t) = shared.tokens.lock() {
        t.entry(key.to_string()).or_default().push(token);
    }
}

/// The work between a grant and its settlement.
#[allow(clippy::too_many_arguments)]
async fn work(
    shared: &Shared,
    ep: &Endpoints,
    spec: &WorkloadSpec,
    key: &str,
    owner: &str,
    token: u64,
    rng: &mut StdRng,
    bodies: &mut Bodies,
    n: u32,
) {
    let roll: f64 = rng.random();
    if roll < 0.08 {
        // A worker that crashed after claiming: the key waits for its lease to run out.
        return;
    }
    if roll < 0.16 {
        // A worker paused past its lease (GC, swap): whatever it does next may be stale.
        tokio::time::sleep(spec.lease + Duration::from_millis(rng.random_range(100..600))).await;
    }
    if rng.random_bool(0.25) {
        let lease_ms = spec.lease.as_millis() as u64;
        let id = shared.recorder.invoke(n, None, key, Input::Extend { token, lease_ms });
        let r = ep.writer.extend_lease(SCOPE, key, token, Some(spec.lease)).await;
        if !matches!(finish(shared, id, key, r), Some(Outcome::LeaseExtended { .. })) {
            return;
        }
    }
    // One charge id per grant: the token is unique cluster-wide.
    if shared.ledger.charge(key, token, token).is_err() {
        // The bank refused a stale token: this worker lost the key and stops here.
        return;
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    let roll: f64 = rng.random();
    if roll < 0.72 {
        let body = bodies.make("v", key, token, owner);
        let id = shared.recorder.invoke(n, None, key, Input::Complete { token, value: payload::digest(&body) });
        let r = ep.writer.complete(SCOPE, key, token, &StoredResponse::new(200, body)).await;
        finish(shared, id, key, r);
    } else if roll < 0.88 {
        let id = shared.recorder.invoke(n, None, key, Input::Fail { token, retryable: true, value: None });
        let r = ep.writer.fail(SCOPE, key, token, true, None).await;
        finish(shared, id, key, r);
    } else {
        let body = bodies.make("e", key, token, owner);
        let input = Input::Fail { token, retryable: false, value: Some(payload::digest(&body)) };
        let id = shared.recorder.invoke(n, None, key, input);
        let resp = StoredResponse::new(402, body);
        let r = ep.writer.fail(SCOPE, key, token, false, Some(&resp)).await;
        finish(shared, id, key, r);
    }
}

/// A Get or a Wait on a random replica (reads through followers must be linearizable too).
async fn read(shared: &Shared, ep: &Endpoints, key: &str, rng: &mut StdRng, n: u32) {
    if ep.readers.is_empty() {
        return;
    }
    let (node, client) = &ep.readers[rng.random_range(0..ep.readers.len())];
    if rng.random_bool(0.7) {
        let id = shared.recorder.invoke(n, Some(*node), key, Input::Get);
        let r = client.get(SCOPE, key).await;
        finish_read(shared, id, key, r);
    } else {
        let id = shared.recorder.invoke(n, Some(*node), key, Input::Wait);
        let r = client.wait(SCOPE, key, Duration::from_millis(300)).await.map(|w| w.record);
        finish_read(shared, id, key, r);
    }
}

/// A Complete carrying a token this key is known to have moved past: it must be refused.
async fn stale_complete(
    shared: &Shared,
    ep: &Endpoints,
    key: &str,
    rng: &mut StdRng,
    bodies: &mut Bodies,
    n: u32,
    owner: &str,
) {
    let stale = shared.tokens.lock().ok().and_then(|t| {
        let seen = t.get(key)?;
        let max = *seen.iter().max()?;
        let older: Vec<u64> = seen.iter().copied().filter(|&x| x < max).collect();
        (!older.is_empty()).then(|| older[rng.random_range(0..older.len())])
    });
    let Some(token) = stale else { return };
    let body = bodies.make("stale", key, token, owner);
    let id = shared.recorder.invoke(n, None, key, Input::Complete { token, value: payload::digest(&body) });
    let r = ep.writer.complete(SCOPE, key, token, &StoredResponse::new(200, body)).await;
    finish(shared, id, key, r);
}
