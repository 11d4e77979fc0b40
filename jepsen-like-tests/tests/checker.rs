//! The checkers accept legal Idemraft histories and catch each class of bug they exist for.
//!
//! Hand-made histories use timestamps chosen to force or allow orders; the randomized test
//! generates legal histories from an independent concrete simulation of the state machine,
//! then breaks one answer and expects the checkers to notice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use idemraft_jepsen::history::{read_jsonl, write_jsonl, Input, Op, Output, Recorder, State, View};
use idemraft_jepsen::invariants::{
    check_all, stale_token_refusal, takeover_plausibility, token_uniqueness, Anomaly, CheckOptions, Validity, Verdict,
};
use idemraft_jepsen::ledger::{Charge, Ledger, LedgerSnapshot};
use idemraft_jepsen::linearizability::{check, KeyVerdict};

const K: &str = "key-0000000000000001";
const MS: u64 = 1_000_000;

/// A history under construction; ids are positions.
#[derive(Default)]
struct H {
    ops: Vec<Op>,
}

impl H {
    fn add(&mut self, client: u32, call: u64, ret: Option<u64>, input: Input, output: Output) -> u64 {
        self.add_key(K, client, call, ret, input, output)
    }

    fn add_key(&mut self, key: &str, client: u32, call: u64, ret: Option<u64>, input: Input, output: Output) -> u64 {
        let id = self.ops.len() as u64;
        self.ops.push(Op { id, client, node: Some(1), key: key.into(), call_ns: call, return_ns: ret, input, output });
        id
    }

    /// A final read of `K` after everything else, as its own list.
    fn final_read(&self, view: Option<View>) -> Vec<Op> {
        let t = self.ops.iter().filter_map(|o| o.return_ns).max().unwrap_or(0) + 1_000 * MS;
        vec![Op {
            id: 10_000,
            client: 99,
            node: Some(1),
            key: K.into(),
            call_ns: t,
            return_ns: Some(t + 1),
            input: Input::Get,
            output: Output::Record { view },
        }]
    }
}

fn claim(owner: &str) -> Input {
    Input::Claim { owner: owner.into(), fingerprint: 0, allow_takeover: false, lease_ms: 1_000 }
}

fn claim_takeover(owner: &str, lease_ms: u64) -> Input {
    Input::Claim { owner: owner.into(), fingerprint: 0, allow_takeover: true, lease_ms }
}

fn complete(token: u64, value: &str) -> Input {
    Input::Complete { token, value: value.into() }
}

fn acquired(token: u64, attempt: u32) -> Output {
    Output::Acquired { token, attempt, takeover: false }
}

fn view(state: State, token: u64, owner: &str, value: Option<&str>) -> Option<View> {
    Some(View { state, token, owner: owner.into(), value: value.map(str::to_string) })
}

fn record(state: State, token: u64, owner: &str, value: Option<&str>) -> Output {
    Output::Record { view: view(state, token, owner, value) }
}

fn opts() -> CheckOptions {
    CheckOptions { budget_per_key: Duration::from_secs(10), takeover_tolerance_ns: 0 }
}

fn run(h: &H, finals: &[Op], ledger: &LedgerSnapshot) -> Verdict {
    let v = check_all(&h.ops, finals, ledger, &opts());
    println!("{v}");
    v
}

fn assert_valid(h: &H, finals: &[Op]) {
    let v = run(h, finals, &LedgerSnapshot::default());
    assert_eq!(v.validity, Validity::Valid, "{v}");
}

fn assert_illegal(h: &H) -> Verdict {
    let v = run(h, &[], &LedgerSnapshot::default());
    assert_eq!(v.summary.keys_illegal, 1, "expected a linearizability violation:\n{v}");
    assert_eq!(v.validity, Validity::Invalid);
    v
}

fn kinds(v: &Verdict) -> Vec<&'static str> {
    v.anomalies.iter().map(Anomaly::kind).collect()
}

// ---- legal histories ----

#[test]
fn concurrent_claims_one_wins() {
    let mut h = H::default();
    // B's InProgress returns before A's Acquired: legal, A is linearized first.
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(2, 1, Some(9), claim("b"), Output::InProgress);
    h.add(3, 2, Some(8), claim("c"), Output::InProgress);
    assert_valid(&h, &[]);
}

#[test]
fn same_owner_reclaim_returns_same_token() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(1, 20, Some(30), claim("a"), acquired(100, 1));
    h.add(2, 25, Some(35), claim("b"), Output::InProgress);
    assert_valid(&h, &[]);
}

#[test]
fn unknown_claim_revealed_by_get() {
    let mut h = H::default();
    h.add(1, 0, None, claim("a"), Output::Unknown);
    h.add(2, 5, Some(8), Input::Get, Output::Record { view: None });
    h.add(2, 50, Some(60), Input::Get, record(State::InProgress, 4242, "a", None));
    h.add(1, 70, Some(80), complete(4242, "body"), Output::Completed { token: 4242 });
    h.add(2, 90, Some(95), claim("b"), Output::Replay { token: 4242, value: "body".into() });
    let finals = h.final_read(view(State::Completed, 4242, "a", Some("body")));
    assert_valid(&h, &finals);
}

#[test]
fn unknown_claim_never_applied() {
    let mut h = H::default();
    h.add(1, 0, None, claim("a"), Output::Unknown);
    h.add(2, 50, Some(60), claim("b"), acquired(7, 1));
    h.add(3, 70, Some(80), Input::Get, record(State::InProgress, 7, "b", None));
    assert_valid(&h, &[]);
}

#[test]
fn takeover_after_expiry() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim_takeover("a", 1), acquired(100, 1));
    h.add(
        2,
        2 * MS,
        Some(2 * MS + 10),
        claim_takeover("b", 1),
        Output::Acquired { token: 200, attempt: 2, takeover: true },
    );
    // The old owner is fenced off.
    h.add(1, 3 * MS, Some(3 * MS + 10), complete(100, "x"), Output::StaleToken { current: 200 });
    // The retried takeover claim answers exactly as the first time.
    h.add(
        2,
        4 * MS,
        Some(4 * MS + 10),
        claim_takeover("b", 1),
        Output::Acquired { token: 200, attempt: 2, takeover: true },
    );
    assert_valid(&h, &[]);
}

#[test]
fn explicit_takeover_after_extend_expired() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim_takeover("a", 1), acquired(100, 1));
    h.add(1, MS, Some(MS + 10), Input::Extend { token: 100, lease_ms: 2 }, Output::LeaseExtended { token: 100 });
    h.add(
        2,
        4 * MS,
        Some(4 * MS + 10),
        Input::Takeover { owner: "b".into(), force: false },
        Output::Acquired { token: 300, attempt: 2, takeover: true },
    );
    assert_valid(&h, &[]);
}

#[test]
fn replay_after_completion() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(1, 20, Some(30), complete(100, "ok"), Output::Completed { token: 100 });
    h.add(2, 40, Some(50), claim("b"), Output::Replay { token: 100, value: "ok".into() });
    h.add(3, 41, Some(51), Input::Get, record(State::Completed, 100, "a", Some("ok")));
    let finals = h.final_read(view(State::Completed, 100, "a", Some("ok")));
    assert_valid(&h, &finals);
}

#[test]
fn retried_complete() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(1, 20, None, complete(100, "ok"), Output::Unknown);
    h.add(1, 40, Some(50), complete(100, "ok"), Output::Completed { token: 100 });
    h.add(1, 60, Some(70), complete(100, "ok"), Output::Completed { token: 100 });
    // Another body under the same token is the wrong state, not a retry.
    h.add(1, 80, Some(90), complete(100, "other"), Output::WrongState { state: State::Completed });
    let finals = h.final_read(view(State::Completed, 100, "a", Some("ok")));
    assert_valid(&h, &finals);
}

#[test]
fn wait_that_times_out() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    // The Wait overlaps the Complete and saw IN_PROGRESS: it linearizes before it.
    h.add(2, 20, Some(1_000), Input::Wait, record(State::InProgress, 100, "a", None));
    h.add(1, 500, Some(600), complete(100, "ok"), Output::Completed { token: 100 });
    let finals = h.final_read(view(State::Completed, 100, "a", Some("ok")));
    assert_valid(&h, &finals);
}

#[test]
fn fail_retryable_then_reacquire_and_terminal_fail() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(
        1,
        20,
        Some(30),
        Input::Fail { token: 100, retryable: true, value: None },
        Output::Failed { token: 100, retryable: true },
    );
    h.add(2, 40, Some(50), claim("b"), acquired(200, 2));
    h.add(
        2,
        60,
        Some(70),
        Input::Fail { token: 200, retryable: false, value: Some("E".into()) },
        Output::Failed { token: 200, retryable: false },
    );
    h.add(3, 80, Some(90), claim("c"), Output::Replay { token: 200, value: "E".into() });
    h.add(
        4,
        80,
        Some(90),
        Input::Claim { owner: "d".into(), fingerprint: 9, allow_takeover: true, lease_ms: 1 },
        Output::Mismatch,
    );
    h.add(
        4,
        95,
        Some(99),
        Input::Fail { token: 200, retryable: false, value: None },
        Output::Refused { reason: "terminal fail needs a response".into() },
    );
    let finals = h.final_read(view(State::Completed, 200, "b", Some("E")));
    assert_valid(&h, &finals);
}

// ---- illegal histories ----

#[test]
fn two_owners_acquired_without_takeover() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(2, 20, Some(30), claim("b"), acquired(200, 2));
    let v = assert_illegal(&h);
    let (_, illegal) = v.linearizability.illegal_keys().next().unwrap();
    assert_eq!(illegal.prefix.len(), 1);
    assert_eq!(illegal.stuck.iter().map(|o| o.id).collect::<Vec<_>>(), vec![1]);
    assert!(format!("{v}").contains("cannot be placed next"));
}

#[test]
fn two_owners_acquired_concurrently_as_first_grant() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(2, 1, Some(11), claim("b"), acquired(101, 1));
    assert_illegal(&h);
}

#[test]
fn stale_read_after_acknowledged_complete() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(1, 20, Some(30), complete(100, "ok"), Output::Completed { token: 100 });
    h.add(2, 40, Some(50), Input::Get, record(State::InProgress, 100, "a", None));
    assert_illegal(&h);
}

#[test]
fn token_going_down() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(200, 1));
    h.add(
        1,
        20,
        Some(30),
        Input::Fail { token: 200, retryable: true, value: None },
        Output::Failed { token: 200, retryable: true },
    );
    h.add(2, 40, Some(50), claim("b"), acquired(100, 2));
    let v = assert_illegal(&h);
    assert!(kinds(&v).contains(&"token_went_down"), "{v}");
}

#[test]
fn token_reused_across_keys() {
    let mut h = H::default();
    h.add_key("key-a", 1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add_key("key-b", 2, 0, Some(10), claim("b"), acquired(100, 1));
    let a = token_uniqueness(&h.ops);
    assert!(matches!(a.as_slice(), [Anomaly::DuplicateToken { token: 100, .. }]), "{a:?}");
}

#[test]
fn replay_with_different_value() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(1, 20, Some(30), complete(100, "ok"), Output::Completed { token: 100 });
    h.add(2, 40, Some(50), claim("b"), Output::Replay { token: 100, value: "not ok".into() });
    let v = assert_illegal(&h);
    assert!(kinds(&v).contains(&"replay_mismatch"), "{v}");
}

#[test]
fn stale_token_complete_acknowledged() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim_takeover("a", 1), acquired(100, 1));
    h.add(
        2,
        5 * MS,
        Some(5 * MS + 10),
        claim_takeover("b", 1),
        Output::Acquired { token: 200, attempt: 2, takeover: true },
    );
    h.add(1, 6 * MS, Some(6 * MS + 10), complete(100, "late"), Output::Completed { token: 100 });
    let v = assert_illegal(&h);
    assert!(kinds(&v).contains(&"stale_token_accepted"), "{v}");
    let a = stale_token_refusal(&h.ops);
    assert!(matches!(a.as_slice(), [Anomaly::StaleTokenAccepted { op: 2, token: 100, fenced_by: 1, .. }]), "{a:?}");
}

#[test]
fn lost_acknowledged_completion() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(1, 20, Some(30), complete(100, "ok"), Output::Completed { token: 100 });
    let finals = h.final_read(None);
    let v = run(&h, &finals, &LedgerSnapshot::default());
    assert_eq!(v.validity, Validity::Invalid);
    assert_eq!(kinds(&v), vec!["lost_completion"]);
    // Without any final read the run is unproven, not broken.
    let v = run(&h, &[], &LedgerSnapshot::default());
    assert_eq!(v.validity, Validity::Unknown);
}

#[test]
fn takeover_too_early() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim_takeover("a", 1_000), acquired(100, 1));
    h.add(
        2,
        20 * MS,
        Some(20 * MS + 10),
        claim_takeover("b", 1_000),
        Output::Acquired { token: 200, attempt: 2, takeover: true },
    );
    let v = run(&h, &[], &LedgerSnapshot::default());
    assert_eq!(v.summary.keys_ok, 1, "the model allows it; real time does not");
    assert_eq!(kinds(&v), vec!["early_takeover"]);
    // An injected skew larger than the lease makes it plausible.
    assert!(takeover_plausibility(&h.ops, 2_000 * MS).is_empty());
}

#[test]
fn takeover_too_early_after_extend() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim_takeover("a", 1), acquired(100, 1));
    h.add(
        1,
        10 * MS,
        Some(11 * MS),
        Input::Extend { token: 100, lease_ms: 1_000 },
        Output::LeaseExtended { token: 100 },
    );
    h.add(
        2,
        20 * MS,
        Some(21 * MS),
        claim_takeover("b", 1),
        Output::Acquired { token: 200, attempt: 2, takeover: true },
    );
    let a = takeover_plausibility(&h.ops, 0);
    assert!(matches!(a.as_slice(), [Anomaly::EarlyTakeover { op: 2, lease_from: 1, .. }]), "{a:?}");
}

#[test]
fn double_charge() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim("a"), acquired(100, 1));
    h.add(1, 30, Some(40), complete(100, "ok"), Output::Completed { token: 100 });
    // A buggy service hands the completed key out again.
    h.add(2, 50, Some(60), claim("b"), acquired(200, 2));
    let ledger = LedgerSnapshot {
        accepted: vec![
            Charge { key: K.into(), token: 100, charge_id: 1, at_ns: 20 },
            Charge { key: K.into(), token: 200, charge_id: 2, at_ns: 70 },
        ],
        refused: vec![],
    };
    let finals = h.final_read(view(State::Completed, 100, "a", Some("ok")));
    let v = run(&h, &finals, &ledger);
    assert_eq!(v.validity, Validity::Invalid);
    assert!(kinds(&v).contains(&"double_charge"), "{v}");

    // The verdict travels as JSON.
    let json = serde_json::to_string(&v).unwrap();
    assert!(json.contains(r#""validity":"invalid""#), "{json}");
    assert!(json.contains(r#""kind":"double_charge""#), "{json}");
    assert!(json.contains(r#""verdict":"illegal""#), "{json}");
    let back: Verdict = serde_json::from_str(&json).unwrap();
    assert_eq!(back, v);
}

#[test]
fn double_completion() {
    let mut h = H::default();
    h.add(1, 0, Some(10), claim_takeover("a", 1), acquired(100, 1));
    h.add(2, 0, Some(10), claim_takeover("b", 1), acquired(200, 2));
    h.add(1, 20, Some(30), complete(100, "x"), Output::Completed { token: 100 });
    h.add(2, 20, Some(30), complete(200, "y"), Output::Completed { token: 200 });
    let v = run(&h, &[], &LedgerSnapshot::default());
    assert_eq!(v.validity, Validity::Invalid);
    assert!(kinds(&v).contains(&"double_completion"), "{v}");
}

#[test]
fn ledger_fences_and_counts() {
    let rec = Recorder::new();
    let ledger = Ledger::new(rec.clock());
    assert!(ledger.charge(K, 5, 1).is_ok());
    assert!(ledger.charge(K, 7, 2).is_ok());
    assert_eq!(ledger.charge(K, 6, 3).unwrap_err().highest, 7);
    assert!(ledger.charge(K, 7, 4).is_ok());
    assert!(ledger.charge("other-key", 1, 5).is_ok());
    let snap = ledger.snapshot();
    assert_eq!(snap.accepted.len(), 4);
    assert_eq!(snap.refused.len(), 1);
    assert!(snap.accepted.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
    let v = check_all(&[], &[], &snap, &opts());
    assert_eq!((v.summary.charges_accepted, v.summary.charges_refused_stale), (4, 1));
    assert_eq!(v.validity, Validity::Valid);
}

// ---- format ----

#[test]
fn jsonl_round_trip() {
    let rec = Recorder::new();
    let a = rec.invoke(1, Some(2), K, claim_takeover("a", 5));
    let b = rec.invoke(2, None, K, Input::Fail { token: 3, retryable: false, value: Some("E".into()) });
    let c = rec.invoke(3, Some(1), K, Input::Wait);
    let d = rec.invoke(4, Some(1), K, Input::Takeover { owner: "z".into(), force: true });
    rec.ok(a, Output::Acquired { token: 3, attempt: 1, takeover: false });
    rec.unknown(b);
    rec.ok(c, record(State::InProgress, 3, "a", None));
    rec.ok_from(d, Some(3), Output::WrongState { state: State::Failed });
    let ops = rec.finish();
    assert!(ops[0].return_ns.unwrap() >= ops[0].call_ns);
    assert_eq!(ops[1].return_ns, None);
    assert_eq!(ops[3].node, Some(3));

    let mut buf = Vec::new();
    write_jsonl(&ops, &mut buf).unwrap();
    let text = String::from_utf8(buf.clone()).unwrap();
    assert_eq!(text.lines().count(), 4);
    assert!(text.contains(r#""type":"claim""#), "{text}");
    assert!(text.contains(r#""state":"in_progress""#), "{text}");
    assert_eq!(read_jsonl(&buf[..]).unwrap(), ops);

    let broken = format!("{}\n\n{{not json}}\n", text.lines().next().unwrap());
    let err = read_jsonl(broken.as_bytes()).unwrap_err();
    assert!(err.starts_with("line 3:"), "{err}");
}

#[test]
fn stored_histories_check_as_labelled() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/histories");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".jsonl") {
            continue;
        }
        let ops = read_jsonl(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
        let report = check(&ops, Duration::from_secs(10));
        let expect_ok = name.starts_with("ok-");
        assert_eq!(report.illegal == 0, expect_ok, "{name}: {report}");
        seen += 1;
    }
    assert!(seen >= 2);
}

// ---- randomized: an independent concrete simulation ----

/// SplitMix64: small, seedable, good enough to shuffle a workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A concrete record, with real tokens and a coin for lease expiry.
#[derive(Clone)]
struct CRec {
    fingerprint: u8,
    state: State,
    token: u64,
    owner: String,
    attempt: u32,
    taken_over: bool,
    value: Option<String>,
}

/// The state machine's rules again, written independently of the model, with concrete choices.
#[derive(Default)]
struct Sim {
    recs: HashMap<String, CRec>,
    last_token: u64,
}

impl Sim {
    fn new_token(&mut self, rng: &mut Rng) -> u64 {
        self.last_token += 1 + rng.below(3);
        self.last_token
    }

    fn regrant(&mut self, rng: &mut Rng, key: &str, owner: &str, takeover: bool) -> Output {
        let token = self.new_token(rng);
        let r = self.recs.get_mut(key).unwrap();
        r.state = State::InProgress;
        r.token = token;
        r.owner = owner.into();
        r.attempt += 1;
        r.taken_over = takeover;
        Output::Acquired { token, attempt: r.attempt, takeover }
    }

    fn apply(&mut self, rng: &mut Rng, key: &str, input: &Input) -> Output {
        let expired = rng.chance(0.5);
        let Some(r) = self.recs.get(key).cloned() else {
            return match input {
                Input::Claim { owner, fingerprint, .. } => {
                    let token = self.new_token(rng);
                    self.recs.insert(
                        key.into(),
                        CRec {
                            fingerprint: *fingerprint,
                            state: State::InProgress,
                            token,
                            owner: owner.clone(),
                            attempt: 1,
                            taken_over: false,
                            value: None,
                        },
                    );
                    Output::Acquired { token, attempt: 1, takeover: false }
                }
                Input::Get | Input::Wait => Output::Record { view: None },
                Input::Fail { retryable: false, value: None, .. } => Output::Refused { reason: "invalid".into() },
                _ => Output::NotFound,
            };
        };
        let settle = |sim: &mut Sim, value: &str| {
            let r = sim.recs.get_mut(key).unwrap();
            r.state = State::Completed;
            r.value = Some(value.into());
        };
        match input {
            Input::Claim { owner, fingerprint, allow_takeover, .. } => {
                if r.fingerprint != *fingerprint {
                    return Output::Mismatch;
                }
                match r.state {
                    State::InProgress if r.owner == *owner => {
                        Output::Acquired { token: r.token, attempt: r.attempt, takeover: r.taken_over }
                    }
                    State::InProgress if *allow_takeover && expired => self.regrant(rng, key, owner, true),
                    State::InProgress => Output::InProgress,
                    State::Completed => Output::Replay { token: r.token, value: r.value.clone().unwrap() },
                    State::Failed => self.regrant(rng, key, owner, false),
                }
            }
            Input::Fail { retryable: false, value: None, .. } => Output::Refused { reason: "invalid".into() },
            Input::Complete { token, .. } | Input::Fail { token, .. } | Input::Extend { token, .. }
                if *token != r.token =>
            {
                Output::StaleToken { current: r.token }
            }
            Input::Complete { token, value } => match r.state {
                State::InProgress => {
                    settle(self, value);
                    Output::Completed { token: *token }
                }
                State::Completed if r.value.as_ref() == Some(value) => Output::Completed { token: *token },
                s => Output::WrongState { state: s },
            },
            Input::Fail { token, retryable, value } => match (r.state, retryable) {
                (State::InProgress, true) => {
                    self.recs.get_mut(key).unwrap().state = State::Failed;
                    Output::Failed { token: *token, retryable: true }
                }
                (State::InProgress, false) => {
                    settle(self, value.as_ref().unwrap());
                    Output::Failed { token: *token, retryable: false }
                }
                (State::Failed, true) => Output::Failed { token: *token, retryable: true },
                (State::Completed, false) if r.value == *value => Output::Failed { token: *token, retryable: false },
                (s, _) => Output::WrongState { state: s },
            },
            Input::Extend { token, .. } => match r.state {
                State::InProgress => Output::LeaseExtended { token: *token },
                s => Output::WrongState { state: s },
            },
            Input::Takeover { owner, force } => match r.state {
                State::InProgress if r.owner == *owner => {
                    Output::Acquired { token: r.token, attempt: r.attempt, takeover: r.taken_over }
                }
                State::InProgress if *force || expired => self.regrant(rng, key, owner, true),
                State::InProgress => Output::InProgress,
                s => Output::WrongState { state: s },
            },
            Input::Get | Input::Wait => Output::Record {
                view: Some(View { state: r.state, token: r.token, owner: r.owner.clone(), value: r.value.clone() }),
            },
        }
    }
}

/// Workload shape: relative weights of claim, complete, fail, extend, takeover, get, wait.
#[derive(Clone, Copy)]
struct Shape {
    keys: u32,
    clients: u32,
    ops: usize,
    unknown: f64,
    weights: [u64; 7],
    /// Chance that a Fail is retryable.
    retryable: f64,
}

enum Stage {
    Idle,
    Called { op: usize, applies: bool },
    Applied { op: usize, output: Output },
}

/// Generates a legal history: clients call, the simulation applies each op at a random point
/// inside its interval, and some answers are lost (applied or not).
fn generate(seed: u64, shape: Shape) -> (Vec<Op>, Vec<Op>) {
    let mut rng = Rng(seed);
    let mut sim = Sim::default();
    let mut ops: Vec<Op> = Vec::new();
    let mut stages: Vec<Stage> = (0..shape.clients).map(|_| Stage::Idle).collect();
    // Per (client, key): last owner, last token acquired, last value sent.
    let mut owners: HashMap<(u32, String), String> = HashMap::new();
    let mut tokens: HashMap<(u32, String), u64> = HashMap::new();
    let mut values: HashMap<(u32, String), String> = HashMap::new();
    let mut now = 0u64;
    let total: u64 = shape.weights.iter().sum();
    loop {
        let busy = stages.iter().any(|s| !matches!(s, Stage::Idle));
        if ops.len() >= shape.ops && !busy {
            break;
        }
        now += 1 + rng.below(1_000);
        let c = rng.below(u64::from(shape.clients)) as u32;
        let stage = std::mem::replace(&mut stages[c as usize], Stage::Idle);
        stages[c as usize] = match stage {
            Stage::Idle if ops.len() >= shape.ops => Stage::Idle,
            Stage::Idle => {
                let key = format!("key-{:016}", rng.below(u64::from(shape.keys)));
                let ck = (c, key.clone());
                let id = ops.len();
                let token = match tokens.get(&ck) {
                    Some(t) if rng.chance(0.85) => *t,
                    _ => sim.last_token.saturating_sub(rng.below(4)),
                };
                let value = match values.get(&ck) {
                    Some(v) if rng.chance(0.3) => v.clone(),
                    _ => format!("v{id}"),
                };
                let owner = match owners.get(&ck) {
                    Some(o) if rng.chance(0.3) => o.clone(),
                    _ => format!("o{c}-{id}"),
                };
                let mut pick = rng.below(total);
                let mut kind = 0;
                while pick >= shape.weights[kind] {
                    pick -= shape.weights[kind];
                    kind += 1;
                }
                let input = match kind {
                    0 => Input::Claim {
                        owner: owner.clone(),
                        fingerprint: u8::from(rng.chance(0.05)),
                        allow_takeover: rng.chance(0.5),
                        lease_ms: 0,
                    },
                    1 => Input::Complete { token, value: value.clone() },
                    2 => {
                        let retryable = rng.chance(shape.retryable);
                        Input::Fail { token, retryable, value: (!retryable).then(|| value.clone()) }
                    }
                    3 => Input::Extend { token, lease_ms: 0 },
                    4 => Input::Takeover { owner: owner.clone(), force: rng.chance(0.3) },
                    5 => Input::Get,
                    _ => Input::Wait,
                };
                if matches!(input, Input::Claim { .. } | Input::Takeover { .. }) {
                    owners.insert(ck.clone(), owner);
                }
                if matches!(input, Input::Complete { .. } | Input::Fail { retryable: false, .. }) {
                    values.insert(ck, value);
                }
                ops.push(Op {
                    id: id as u64,
                    client: c,
                    node: None,
                    key,
                    call_ns: now,
                    return_ns: None,
                    input,
                    output: Output::Unknown,
                });
                let lost = rng.chance(shape.unknown);
                Stage::Called { op: id, applies: !lost || rng.chance(0.5) }
            }
            Stage::Called { op, applies: false } => {
                // Lost before it reached the cluster.
                let _ = op;
                Stage::Idle
            }
            Stage::Called { op, applies: true } => {
                let output = sim.apply(&mut rng, &ops[op].key.clone(), &ops[op].input.clone());
                Stage::Applied { op, output }
            }
            Stage::Applied { op, output } => {
                if rng.chance(shape.unknown) {
                    // Applied, but the answer was lost.
                } else {
                    if let Output::Acquired { token, .. } = output {
                        tokens.insert((c, ops[op].key.clone()), token);
                    }
                    ops[op].return_ns = Some(now);
                    ops[op].output = output;
                }
                Stage::Idle
            }
        };
    }
    let mut finals = Vec::new();
    for k in 0..shape.keys {
        let key = format!("key-{k:016}");
        now += 10;
        let output = sim.apply(&mut rng, &key, &Input::Get);
        finals.push(Op {
            id: (ops.len() + finals.len()) as u64,
            client: 0,
            node: None,
            key,
            call_ns: now,
            return_ns: Some(now + 1),
            input: Input::Get,
            output,
        });
    }
    (ops, finals)
}

/// Breaks one definite answer so that no linearization can explain it. `None` when the
/// history has no answer of a breakable kind.
fn mutate(rng: &mut Rng, ops: &mut [Op]) -> Option<u64> {
    let breakable: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            matches!(o.output, Output::Acquired { .. } | Output::Replay { .. } | Output::Record { view: Some(_) })
        })
        .map(|(i, _)| i)
        .collect();
    if breakable.is_empty() {
        return None;
    }
    let i = breakable[rng.below(breakable.len() as u64) as usize];
    match &mut ops[i].output {
        // Attempts are determined by the grants before; no few lost ops explain +1000.
        Output::Acquired { attempt, .. } => *attempt += 1_000,
        // Nobody ever sent this body, or claimed as this owner.
        Output::Replay { value, .. } => *value = "bogus".into(),
        Output::Record { view: Some(v) } => v.owner = "nobody".into(),
        _ => return None,
    }
    Some(ops[i].id)
}

const SMALL: Shape =
    Shape { keys: 3, clients: 6, ops: 80, unknown: 0.06, weights: [35, 15, 10, 7, 5, 18, 10], retryable: 0.7 };

#[test]
fn randomized_legal_histories_pass_and_mutants_fail() {
    let base: u64 = std::env::var("CHECKER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_240_601);
    let cases: u64 = std::env::var("CHECKER_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    let mut mutated = 0;
    for n in 0..cases {
        let seed = base.wrapping_add(n);
        let (ops, finals) = generate(seed, SMALL);
        let v = check_all(&ops, &finals, &LedgerSnapshot::default(), &opts());
        assert_eq!(v.validity, Validity::Valid, "seed {seed}: legal history rejected\n{v}");

        let mut rng = Rng(seed ^ 0xDEAD_BEEF);
        let mut broken = ops.clone();
        let Some(id) = mutate(&mut rng, &mut broken) else { continue };
        let v = check_all(&broken, &finals, &LedgerSnapshot::default(), &opts());
        assert_eq!(v.validity, Validity::Invalid, "seed {seed}: mutating op #{id} went unnoticed\n{v}");
        mutated += 1;
    }
    assert!(mutated * 3 > cases * 2, "only {mutated} of {cases} histories were mutated");
}

#[test]
fn checker_speed_on_long_contended_keys() {
    // One hot key per history, many clients, a few percent lost answers, and a workload
    // that never settles the key, so it keeps cycling through grants, takeovers and
    // retryable failures: the hardest shape for the search.
    let hot =
        Shape { keys: 1, clients: 16, ops: 1_000, unknown: 0.03, weights: [40, 0, 14, 10, 6, 20, 8], retryable: 1.0 };
    let runs = [(hot, 1u64), (hot, 2), (hot, 3), (Shape { clients: 20, ops: 600, unknown: 0.05, ..hot }, 4)];
    for (shape, seed) in runs {
        let (ops, finals) = generate(seed, shape);
        let unknown = ops.iter().filter(|o| o.is_unknown()).count();
        let mut outputs: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        for o in &ops {
            let name = format!("{:?}", o.output);
            let name = name.split([' ', '{']).next().unwrap_or_default().to_string();
            *outputs.entry(name).or_default() += 1;
        }
        println!("seed {seed}: answers {outputs:?}");
        let start = Instant::now();
        let v = check_all(
            &ops,
            &finals,
            &LedgerSnapshot::default(),
            &CheckOptions { budget_per_key: Duration::from_secs(60), takeover_tolerance_ns: 0 },
        );
        let key = &v.linearizability.keys[0];
        println!(
            "seed {seed}: {} ops on one key, {} clients, {unknown} unknown; verdict {:?}; {} configurations; \
             linearizability {:.3} s, all checks {:.3} s",
            key.ops,
            shape.clients,
            v.validity,
            key.explored,
            key.elapsed_us as f64 / 1e6,
            start.elapsed().as_secs_f64()
        );
        assert!(!matches!(key.verdict, KeyVerdict::Illegal(_)), "seed {seed}: legal history rejected\n{v}");
        assert_ne!(v.validity, Validity::Invalid, "seed {seed}\n{v}");

        // An illegal history must be searched exhaustively before it is called illegal.
        let mut broken = ops.clone();
        let mut rng = Rng(seed);
        let id = mutate(&mut rng, &mut broken).unwrap();
        let report = check(&broken, Duration::from_secs(60));
        let key = &report.keys[0];
        let verdict = match key.verdict {
            KeyVerdict::Ok => "ok",
            KeyVerdict::Illegal(_) => "illegal",
            KeyVerdict::Unknown => "unknown (budget)",
        };
        println!(
            "seed {seed}: mutated op #{id}: linearizability {verdict}; {} configurations; {:.3} s",
            key.explored,
            key.elapsed_us as f64 / 1e6
        );
        assert!(!matches!(key.verdict, KeyVerdict::Ok), "seed {seed}: mutating op #{id} went unnoticed");
    }
}
