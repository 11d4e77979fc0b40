//! Proves that the state machine holds its core promises under any sequence of commands:
//! random batches of claims, completes, fails, lease extensions, checkpoints, takeovers, sweeps
//! and resumes, over a few colliding keys and owners and a clock that jumps, stalls and runs
//! backwards, applied to a fresh `MemState` through `machine::apply_batch` as the log does.
//!
//! After every command it checks:
//! - nothing panics, and exactly the commands built to break a rule are answered `Invalid`;
//! - the machine's clock never goes backwards, and an `Invalid` command leaves it alone;
//! - once a Complete (or a terminal Fail) is accepted, every claim of the key until the record
//!   expires is answered `Replay` of that response and token (or `Mismatch` for another
//!   fingerprint), and nobody is granted the key meanwhile;
//! - a new grant's fencing token is strictly larger than every earlier grant's on the key, and
//!   a repeated grant (a retried claim) is the current one.
//!
//! The expected expiry comes from a small model of each key (its fingerprint and retention);
//! after each batch the model is checked against the stored record, so a wrong model fails
//! loudly instead of hiding a bug.
//!
//! To show that these checks bite, `IDEMRAFT_FUZZ_PLANT=skip-token-check` (or `local-clock`,
//! any name of `idemraft_store::planted::Bug`) switches that planted bug on before the first
//! input; the target must then report a violated invariant within seconds.

#![no_main]

use std::convert::Infallible;

use arbitrary::Arbitrary;
use idemraft_store::machine::{self, StateStore, MAX_PLAUSIBLE_NOW_MS};
use idemraft_store::planted;
use idemraft_store::{Command, Fingerprint, MemState, Op, Outcome, RecordKey, RecordState, Response, Token};
use libfuzzer_sys::fuzz_target;

/// Record identities: three keys of one tenant, and the first key's name under a second tenant
/// (the tenant is part of the identity). Few, so that commands collide.
const IDS: [(&str, &str); 4] = [
    ("tenant-a", "order-0000000000000001"),
    ("tenant-a", "order-0000000000000002"),
    ("tenant-a", "order-0000000000000003"),
    ("tenant-b", "order-0000000000000001"),
];
const SCOPE: &str = "payments.create";
const OWNERS: [&str; 3] = ["worker-a", "worker-b", "worker-c"];
/// The proposer's first stamp: a realistic wall clock, far from both 0 and the year 3000.
const START_MS: u64 = 1_700_000_000_000;
/// Bounds on one input, so each run stays fast.
const MAX_COMMANDS: usize = 256;
const MAX_BATCH: usize = 8;

#[derive(Arbitrary, Debug)]
struct Input {
    batches: Vec<Vec<Step>>,
}

#[derive(Arbitrary, Debug)]
struct Step {
    time: Time,
    op: FuzzOp,
}

/// How the proposer's stamp moves before this command.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Time {
    Same,
    Millis(u16),
    /// Up to about 18 hours at once: beyond the machine's largest clock step.
    Seconds(u16),
    /// A stamp behind the proposer's clock (a stale leader); the proposer's clock stays.
    Behind(u16),
    /// After the year 3000: refused as `Invalid`.
    Implausible,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Lease {
    Ms1,
    Ms100,
    S1,
    S30,
    H1,
    Day,
}

impl Lease {
    fn ms(self) -> u64 {
        match self {
            Lease::Ms1 => 1,
            Lease::Ms100 => 100,
            Lease::S1 => 1_000,
            Lease::S30 => 30_000,
            Lease::H1 => 3_600_000,
            Lease::Day => 86_400_000,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ttl {
    S1,
    S5,
    M1,
    H2,
    Year,
}

impl Ttl {
    fn ms(self) -> u64 {
        match self {
            Ttl::S1 => 1_000,
            Ttl::S5 => 5_000,
            Ttl::M1 => 60_000,
            Ttl::H2 => 7_200_000,
            Ttl::Year => 365 * 86_400_000,
        }
    }
}

/// Which token an owner presents: mostly real ones, so that commands get past the fence.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum TokenPick {
    Latest,
    Earlier(u8),
    Raw(u32),
}

#[derive(Arbitrary, Debug, Clone)]
enum FuzzOp {
    Claim {
        key: u8,
        fingerprint: Option<bool>,
        owner: u8,
        lease: Lease,
        ttl: Ttl,
        allow_takeover: bool,
    },
    Complete {
        key: u8,
        token: TokenPick,
        response: u8,
    },
    Fail {
        key: u8,
        token: TokenPick,
        retryable: bool,
        response: Option<u8>,
    },
    ExtendLease {
        key: u8,
        token: TokenPick,
        lease: Lease,
    },
    Checkpoint {
        key: u8,
        token: TokenPick,
        point: u8,
        lease: Lease,
    },
    Takeover {
        key: u8,
        owner: u8,
        force: bool,
        lease: Lease,
    },
    Sweep {
        limit: u8,
    },
    Resume {
        sweep_interval: Lease,
        max_stretch: Lease,
    },
    /// A claim whose key breaks the key rule.
    BadKey {
        owner: u8,
    },
}

/// A settled (COMPLETED) record as the model expects it.
#[derive(Debug, Clone)]
struct Settled {
    token: Token,
    response: Response,
    expires_ms: u64,
}

/// What the model knows of one identity.
#[derive(Debug, Default)]
struct KeyModel {
    /// Every new grant's token, in order.
    grants: Vec<Token>,
    /// The record's fingerprint, set by the claim that created it.
    fingerprint: Option<Fingerprint>,
    /// Retention set by the latest claim that granted the record.
    retention_ms: u64,
    settled: Option<Settled>,
}

fn id(key: u8) -> (usize, RecordKey) {
    let k = key as usize % IDS.len();
    let (tenant, name) = IDS[k];
    match RecordKey::new(tenant, SCOPE, name) {
        Ok(id) => (k, id),
        Err(e) => panic!("fuzz setup: identity {tenant}/{name} is invalid: {e}"),
    }
}

fn owner(o: u8) -> String {
    OWNERS[o as usize % OWNERS.len()].to_string()
}

fn fingerprint(f: bool) -> Fingerprint {
    [if f { 0xAA } else { 0x55 }; 32]
}

/// A small space of responses, so that retried completes carry the same one.
fn response(r: u8) -> Response {
    let r = r % 3;
    Response { status: 200 + u32::from(r), headers: vec![("x-n".into(), r.to_string())], body: vec![r; 3] }
}

fn pick(model: &KeyModel, t: TokenPick) -> Token {
    match t {
        TokenPick::Latest => model.grants.last().copied().unwrap_or_default(),
        TokenPick::Earlier(n) if !model.grants.is_empty() => model.grants[n as usize % model.grants.len()],
        TokenPick::Earlier(_) => Token::default(),
        TokenPick::Raw(n) => Token(u64::from(n)),
    }
}

/// Builds the command; also returns the key index it addresses and whether it breaks a rule.
fn build(models: &[KeyModel], op: &FuzzOp, now_ms: u64) -> (Command, Option<usize>, bool) {
    let (k, op, invalid) = match op.clone() {
        FuzzOp::Claim { key, fingerprint: fp, owner: o, lease, ttl, allow_takeover } => {
            let (k, id) = id(key);
            let op = Op::Claim {
                id,
                fingerprint: fp.map(fingerprint),
                owner: owner(o),
                lease_ms: lease.ms(),
                ttl_ms: ttl.ms(),
                allow_takeover,
            };
            (Some(k), op, false)
        }
        FuzzOp::Complete { key, token, response: r } => {
            let (k, id) = id(key);
            (Some(k), Op::Complete { id, token: pick(&models[k], token), response: response(r) }, false)
        }
        FuzzOp::Fail { key, token, retryable, response: r } => {
            let (k, id) = id(key);
            let op = Op::Fail { id, token: pick(&models[k], token), retryable, response: r.map(response) };
            // A terminal failure must carry the error response to store.
            (Some(k), op, !retryable && r.is_none())
        }
        FuzzOp::ExtendLease { key, token, lease } => {
            let (k, id) = id(key);
            (Some(k), Op::ExtendLease { id, token: pick(&models[k], token), lease_ms: lease.ms() }, false)
        }
        FuzzOp::Checkpoint { key, token, point, lease } => {
            let (k, id) = id(key);
            let op = Op::Checkpoint {
                id,
                token: pick(&models[k], token),
                recovery_point: format!("step-{point}"),
                data: vec![point; usize::from(point % 5)],
                lease_ms: lease.ms(),
            };
            (Some(k), op, false)
        }
        FuzzOp::Takeover { key, owner: o, force, lease } => {
            let (k, id) = id(key);
            (Some(k), Op::Takeover { id, owner: owner(o), force, lease_ms: lease.ms() }, false)
        }
        FuzzOp::Sweep { limit } => (None, Op::Sweep { limit: u32::from(limit) }, false),
        FuzzOp::Resume { sweep_interval, max_stretch } => {
            (None, Op::Resume { sweep_interval_ms: sweep_interval.ms(), max_stretch_ms: max_stretch.ms() }, false)
        }
        FuzzOp::BadKey { owner: o } => {
            // Deserialization skips the constructor's validation, as bytes from the log do; a
            // serde round trip of a valid identity with its key swapped builds one.
            let op = Op::Claim {
                id: forged_key(),
                fingerprint: None,
                owner: owner(o),
                lease_ms: 1_000,
                ttl_ms: 60_000,
                allow_takeover: false,
            };
            (None, op, true)
        }
    };
    (Command { now_ms, op }, k, invalid || now_ms > MAX_PLAUSIBLE_NOW_MS)
}

/// An identity with a too-short key, as a replica could receive it from the log.
fn forged_key() -> RecordKey {
    #[derive(serde::Serialize)]
    struct Raw<'a> {
        tenant: &'a str,
        scope: &'a str,
        key: &'a str,
    }
    let bytes = match idemraft_store::codec::encode(&Raw { tenant: "tenant-a", scope: SCOPE, key: "short" }) {
        Ok(b) => b,
        Err(e) => panic!("fuzz setup: cannot encode a forged key: {e}"),
    };
    match idemraft_store::codec::decode("forged key", &bytes) {
        Ok(id) => id,
        Err(e) => panic!("fuzz setup: cannot decode a forged key: {e}"),
    }
}

/// Two fingerprints conflict only when both are given and differ.
fn conflicts(have: Option<Fingerprint>, want: Option<Fingerprint>) -> bool {
    matches!((have, want), (Some(h), Some(w)) if h != w)
}

fn unwrap<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

/// Checks one command's outcome against the model of its key and updates the model.
fn check_key(model: &mut KeyModel, cmd: &Command, outcome: &Outcome, token: Token, now: u64) {
    if model.settled.as_ref().is_some_and(|s| s.expires_ms <= now) {
        // Expired: from now on the record is treated as absent.
        model.settled = None;
    }
    if let Some(s) = &model.settled {
        match (&cmd.op, outcome) {
            (Op::Claim { fingerprint, .. }, _) if conflicts(model.fingerprint, *fingerprint) => {
                assert_eq!(*outcome, Outcome::Mismatch, "a claim with another fingerprint: {cmd:?}");
            }
            (Op::Claim { .. }, Outcome::Replay { token: t, response: r, .. }) => {
                assert_eq!(*t, s.token, "a replay carries the completing token, at clock {now}");
                assert_eq!(*r, s.response, "a replay carries the stored response, at clock {now}");
            }
            (Op::Claim { .. }, other) => {
                panic!("a claim of a completed, unexpired record was answered {other:?} instead of Replay: {cmd:?}")
            }
            (_, Outcome::Acquired(_) | Outcome::LeaseExtended { .. }) => {
                panic!("a completed, unexpired record was handed out again: {cmd:?} -> {outcome:?}")
            }
            _ => {}
        }
    }
    match outcome {
        Outcome::Acquired(grant) if grant.token == token => {
            // A new grant, carrying this command's token.
            if let Some(last) = model.grants.last() {
                assert!(grant.token > *last, "fencing token went from {last} to {} on a new grant", grant.token);
            }
            model.grants.push(grant.token);
            if let Op::Claim { fingerprint, ttl_ms, .. } = &cmd.op {
                if grant.attempt == 1 {
                    model.fingerprint = *fingerprint;
                }
                model.retention_ms = *ttl_ms;
            }
        }
        Outcome::Acquired(grant) => {
            // The answer to a retried claim or takeover: the grant already in force.
            assert_eq!(
                Some(&grant.token),
                model.grants.last(),
                "a repeated grant must be the current one, not an older or unknown token"
            );
        }
        Outcome::Completed { token: by } | Outcome::Failed { token: by, retryable: false } => {
            let stored = match &cmd.op {
                Op::Complete { response, .. } => response.clone(),
                Op::Fail { response: Some(response), .. } => response.clone(),
                _ => panic!("{outcome:?} answers {cmd:?}"),
            };
            match &model.settled {
                Some(s) => {
                    assert_eq!(s.token, *by, "a retried settle names the settling token");
                    assert_eq!(s.response, stored, "a retried settle carries the stored response");
                }
                None => {
                    assert_eq!(model.grants.last(), Some(by), "only the current token settles a record");
                    model.settled = Some(Settled {
                        token: *by,
                        response: stored,
                        expires_ms: now.saturating_add(model.retention_ms),
                    });
                }
            }
        }
        _ => {}
    }
}

/// Plants the bug named by `IDEMRAFT_FUZZ_PLANT`, if any: a check of the checks, never set in
/// a normal run.
fn plant_from_env() {
    let Ok(name) = std::env::var("IDEMRAFT_FUZZ_PLANT") else { return };
    match planted::Bug::from_name(&name) {
        Some(bug) => {
            eprintln!("apply_sequence: planted bug {name} is ON; expect a reported invariant violation");
            planted::plant(&[bug]);
        }
        None => panic!("IDEMRAFT_FUZZ_PLANT={name} names no planted bug"),
    }
}

fuzz_target!(init: plant_from_env(), |input: Input| {
    let mut state = MemState::new();
    let mut models: Vec<KeyModel> = (0..IDS.len()).map(|_| KeyModel::default()).collect();
    // The proposer's clock, and the machine's clock as the model expects it.
    let mut stamp = START_MS;
    let mut clock = 0u64;
    let mut budget = MAX_COMMANDS;
    for (n, batch) in input.batches.iter().enumerate() {
        if budget == 0 {
            break;
        }
        let log_index = n as u64 + 1;
        let steps = &batch[..batch.len().min(MAX_BATCH).min(budget)];
        budget -= steps.len();

        let mut commands = Vec::with_capacity(steps.len());
        let mut meta = Vec::with_capacity(steps.len());
        for step in steps {
            let now_ms = match step.time {
                Time::Same => stamp,
                Time::Millis(ms) => {
                    stamp += u64::from(ms);
                    stamp
                }
                Time::Seconds(s) => {
                    stamp += u64::from(s) * 1_000;
                    stamp
                }
                Time::Behind(s) => stamp.saturating_sub(u64::from(s) * 1_000),
                Time::Implausible => MAX_PLAUSIBLE_NOW_MS + 1,
            };
            // Tokens are picked from the model as it stood before the batch, like a client that
            // sends commands before it hears the answers of the ones in flight.
            let (cmd, key, invalid) = build(&models, &step.op, now_ms);
            commands.push(cmd);
            meta.push((key, invalid));
        }

        let before = state.clock();
        let outcomes = unwrap(machine::apply_batch(&mut state, log_index, &commands));
        assert_eq!(outcomes.len(), commands.len(), "one outcome per command");

        for (slot, ((cmd, outcome), (key, invalid))) in commands.iter().zip(&outcomes).zip(&meta).enumerate() {
            let refused = matches!(outcome, Outcome::Invalid(_));
            assert_eq!(refused, *invalid, "validity of {cmd:?}: answered {outcome:?}");
            if refused {
                // An invalid command changes nothing, the clock included.
                continue;
            }
            let next = machine::next_clock(clock, cmd.now_ms);
            assert!(next >= clock, "clock went back from {clock} to {next}");
            clock = next;
            if let Some(k) = key {
                check_key(&mut models[*k], cmd, outcome, Token::new(log_index, slot), clock);
            }
        }

        let after = state.clock();
        assert!(after >= before, "the machine's clock went back from {before} to {after}");
        assert_eq!(after, clock, "the machine's clock is not the largest valid stamp, stepped as the rules say");

        // The model's view of every settled record must match what is stored.
        for (k, model) in models.iter().enumerate() {
            let Some(s) = &model.settled else { continue };
            if s.expires_ms <= clock {
                continue;
            }
            let (_, id) = id(k as u8);
            let rec = unwrap(state.get(&id));
            let Some(rec) = rec else { panic!("completed record {id} vanished before it expired at {}", s.expires_ms) };
            assert_eq!(rec.state, RecordState::Completed, "completed record {id} changed state before it expired");
            assert_eq!(rec.token, s.token, "completed record {id} changed token before it expired");
            assert_eq!(rec.response.as_ref(), Some(&s.response), "completed record {id} changed its response");
            assert_eq!(rec.expires_ms, s.expires_ms, "completed record {id} expires at an unexpected time");
            assert_eq!(rec.fingerprint, model.fingerprint, "completed record {id} has an unexpected fingerprint");
        }
    }
});
