//! The sequential model of one Idemraft record, as the linearizability checker replays it.
//!
//! It mirrors `raft-store/src/machine.rs` (`apply` and `get`) for the subset of commands the
//! workload issues, with two things the checker cannot see made nondeterministic:
//!
//! - **Tokens.** A token is the log position of the granting entry, so its value cannot be
//!   predicted. A grant takes *some* token at least [`KeyState::next_min`] (strictly above
//!   every earlier grant of the key); an answer that shows the token fixes it. A grant whose
//!   answer was lost leaves the token as [`Tok::AtLeast`] until a later answer reveals it.
//! - **Lease expiry.** It is decided by the leader's log clock. Wherever `machine.rs` asks
//!   `lease_alive`, the model allows both answers. Whether a takeover was plausible in real
//!   time is checked separately (`invariants::takeover_plausibility`).
//!
//! Records never expire during a run (TTLs are hours), so `is_expired` is always false here.
//!
//! ## Rules and where they come from (`machine.rs`)
//!
//! Claim (`Op::Claim` arm of `apply`):
//! - absent → Acquired, attempt 1, new token, the claim's fingerprint bound to the record;
//! - fingerprints differ (checked before the state) → Mismatch, no change;
//! - IN_PROGRESS, same owner → Acquired with the record's token, attempt and `taken_over`
//!   flag (`grant_of`); nothing changes, the lease is not refreshed;
//! - IN_PROGRESS, other owner → InProgress; or, when `allow_takeover` and the lease may have
//!   expired, `regrant`: new token, attempt + 1, `takeover = true`, new owner;
//! - COMPLETED → Replay with the record's token and stored body (`replay`);
//! - FAILED → `regrant`: new token, attempt + 1, `takeover = false`.
//!
//! Complete (`Op::Complete` arm, `owned`, `settle`):
//! - absent → NotFound; token not current → StaleToken{current} (checked before the state);
//! - IN_PROGRESS → COMPLETED with the body, answer Completed{token};
//! - COMPLETED with the same stored body → Completed{token} again (a retried Complete; note this
//!   also answers a Complete after a terminal Fail that stored the same body);
//! - otherwise (FAILED, or COMPLETED with another body) → WrongState{state}.
//!
//! Fail (`Op::Fail` arm):
//! - terminal without a body is refused by validation (`Limits::check_op`) before apply, so
//!   only Refused (or Unknown, without effect) is legal for it;
//! - absent → NotFound; token not current → StaleToken{current};
//! - IN_PROGRESS, retryable → FAILED, answer Failed{token, true};
//! - IN_PROGRESS, terminal → COMPLETED with the error body, answer Failed{token, false};
//! - FAILED, retryable → Failed{token, true} again (retry);
//! - COMPLETED, terminal, same stored body → Failed{token, false} again (retry; also answers
//!   a terminal Fail after a Complete that stored the same body);
//! - otherwise → WrongState{state}.
//!
//! Extend (`extend`): absent → NotFound; token not current → StaleToken{current}; not
//! IN_PROGRESS → WrongState{state}; else LeaseExtended{token}. An owner whose lease lapsed but
//! who still holds the current token revives it, so the answer does not depend on expiry.
//!
//! Takeover (`Op::Takeover` arm): absent → NotFound; IN_PROGRESS, same owner → Acquired with
//! the current grant (a retried takeover); IN_PROGRESS, other owner, `force` → `regrant` with
//! `takeover = true`; without `force` → InProgress or, if the lease may have expired, the same
//! regrant; COMPLETED or FAILED → WrongState{state}. Takeover does not check fingerprints.
//!
//! Get and Wait (`get`): the view of the record (state, token, owner, stored body) or `None`
//! when absent, at the read's linearization point. A Wait that timed out reads IN_PROGRESS.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::history::{Input, Output, State};

/// The current token of a record as far as the answers seen so far reveal it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Tok {
    /// Shown by an answer.
    Known {
        /// The token.
        token: u64,
    },
    /// Granted by an operation whose answer was lost: some value at least `min`.
    AtLeast {
        /// Inclusive lower bound.
        min: u64,
    },
}

/// A live record.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rec {
    /// Fingerprint bound by the first claim.
    pub fingerprint: u8,
    /// Current state.
    pub state: State,
    /// Token of the latest grant.
    pub token: Tok,
    /// Owner of the latest grant.
    pub owner: String,
    /// 1 for the first grant, +1 for each re-acquire or takeover.
    pub attempt: u32,
    /// The latest grant was a takeover.
    pub taken_over: bool,
    /// Stored body once COMPLETED.
    pub value: Option<String>,
}

/// The model state of one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct KeyState {
    /// The record, `None` while absent.
    pub rec: Option<Rec>,
    /// Smallest token the next grant may carry: one above every token granted so far.
    pub next_min: u64,
}

impl KeyState {
    /// An absent record; tokens start anywhere.
    pub fn new() -> KeyState {
        KeyState::default()
    }
}

impl fmt::Display for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rec {
            None => write!(f, "absent")?,
            Some(r) => {
                let token = match r.token {
                    Tok::Known { token } => token.to_string(),
                    Tok::AtLeast { min } => format!(">={min} (unrevealed)"),
                };
                write!(
                    f,
                    "{:?} token={token} owner={:?} attempt={} taken_over={} fingerprint={} value={:?}",
                    r.state, r.owner, r.attempt, r.taken_over, r.fingerprint, r.value
                )?;
            }
        }
        write!(f, "; next grant >= {}", self.next_min)
    }
}

/// What the state machine answers, before the unpredictable token is matched against the output.
#[derive(Clone, Debug)]
enum Res {
    /// The current grant of `next` (new or retried); its token is `next`'s current token.
    Acquired {
        attempt: u32,
        takeover: bool,
    },
    /// The stored body; the token is the current one.
    Replay {
        value: String,
    },
    InProgress,
    Mismatch,
    /// The current token, which is known to differ from `not` when that is given.
    StaleToken {
        not: Option<u64>,
    },
    NotFound,
    WrongState(State),
    Completed(u64),
    Failed(u64, bool),
    LeaseExtended(u64),
    /// The view of `next` (which equals the state before).
    Read,
}

/// One possible effect of an operation: its answer and the state after it.
struct Transition {
    res: Res,
    next: KeyState,
}

fn same(s: &KeyState, res: Res) -> Transition {
    Transition { res, next: s.clone() }
}

/// Fixes the current token to `t` if that agrees with what is known. False when it cannot be.
fn reveal(s: &mut KeyState, t: u64) -> bool {
    let Some(rec) = s.rec.as_mut() else { return false };
    match rec.token {
        Tok::Known { token } => token == t,
        Tok::AtLeast { min } if t >= min => {
            rec.token = Tok::Known { token: t };
            s.next_min = s.next_min.max(t.saturating_add(1));
            true
        }
        Tok::AtLeast { .. } => false,
    }
}

/// `regrant` of machine.rs: a new token for `owner`, attempt + 1. Also the fresh grant when
/// `s` is absent (attempt 1, fingerprint bound).
fn grant(s: &KeyState, owner: &str, fingerprint: u8, takeover: bool) -> Transition {
    let token = Tok::AtLeast { min: s.next_min };
    let rec = match &s.rec {
        None => Rec {
            fingerprint,
            state: State::InProgress,
            token,
            owner: owner.to_string(),
            attempt: 1,
            taken_over: false,
            value: None,
        },
        Some(r) => Rec {
            state: State::InProgress,
            token,
            owner: owner.to_string(),
            attempt: r.attempt.saturating_add(1),
            taken_over: takeover,
            ..r.clone()
        },
    };
    let res = Res::Acquired { attempt: rec.attempt, takeover: rec.taken_over };
    Transition { res, next: KeyState { rec: Some(rec), next_min: s.next_min.saturating_add(1) } }
}

fn settle(s: &KeyState, value: &str, res: Res) -> Transition {
    let mut next = s.clone();
    if let Some(r) = next.rec.as_mut() {
        r.state = State::Completed;
        r.value = Some(value.to_string());
    }
    Transition { res, next }
}

/// `owned` of machine.rs: NotFound, StaleToken, or `f` on a state whose current token is `t`.
/// With an unrevealed current token both "it is `t`" and "it is not" are possible.
fn owned(s: &KeyState, t: u64, f: impl Fn(&KeyState, &Rec) -> Transition) -> Vec<Transition> {
    let Some(rec) = &s.rec else { return vec![same(s, Res::NotFound)] };
    match rec.token {
        Tok::Known { token } if token == t => vec![f(s, rec)],
        Tok::Known { .. } => vec![same(s, Res::StaleToken { not: None })],
        Tok::AtLeast { min } => {
            let mut out = vec![same(s, Res::StaleToken { not: Some(t) })];
            let mut assumed = s.clone();
            if t >= min && reveal(&mut assumed, t) {
                if let Some(r) = assumed.rec.clone() {
                    out.push(f(&assumed, &r));
                }
            }
            out
        }
    }
}

fn transitions(s: &KeyState, input: &Input) -> Vec<Transition> {
    match input {
        Input::Claim { owner, fingerprint, allow_takeover, .. } => match &s.rec {
            None => vec![grant(s, owner, *fingerprint, false)],
            Some(r) if r.fingerprint != *fingerprint => vec![same(s, Res::Mismatch)],
            Some(r) => match r.state {
                State::InProgress if r.owner == *owner => {
                    vec![same(s, Res::Acquired { attempt: r.attempt, takeover: r.taken_over })]
                }
                State::InProgress if *allow_takeover => {
                    vec![same(s, Res::InProgress), grant(s, owner, *fingerprint, true)]
                }
                State::InProgress => vec![same(s, Res::InProgress)],
                State::Completed => vec![same(s, Res::Replay { value: r.value.clone().unwrap_or_default() })],
                State::Failed => vec![grant(s, owner, *fingerprint, false)],
            },
        },
        Input::Complete { token, value } => owned(s, *token, |a, r| match r.state {
            State::InProgress => settle(a, value, Res::Completed(*token)),
            State::Completed if r.value.as_deref() == Some(value.as_str()) => same(a, Res::Completed(*token)),
            other => same(a, Res::WrongState(other)),
        }),
        Input::Fail { retryable: false, value: None, .. } => Vec::new(),
        Input::Fail { token, retryable, value } => owned(s, *token, |a, r| match (r.state, *retryable) {
            (State::InProgress, true) => {
                let mut next = a.clone();
                if let Some(n) = next.rec.as_mut() {
                    n.state = State::Failed;
                }
                Transition { res: Res::Failed(*token, true), next }
            }
            (State::InProgress, false) => settle(a, value.as_deref().unwrap_or_default(), Res::Failed(*token, false)),
            (State::Failed, true) => same(a, Res::Failed(*token, true)),
            (State::Completed, false) if r.value == *value => same(a, Res::Failed(*token, false)),
            (other, _) => same(a, Res::WrongState(other)),
        }),
        Input::Extend { token, .. } => owned(s, *token, |a, r| match r.state {
            State::InProgress => same(a, Res::LeaseExtended(*token)),
            other => same(a, Res::WrongState(other)),
        }),
        Input::Takeover { owner, force } => match &s.rec {
            None => vec![same(s, Res::NotFound)],
            Some(r) => match r.state {
                State::InProgress if r.owner == *owner => {
                    vec![same(s, Res::Acquired { attempt: r.attempt, takeover: r.taken_over })]
                }
                State::InProgress if *force => vec![grant(s, owner, r.fingerprint, true)],
                State::InProgress => vec![same(s, Res::InProgress), grant(s, owner, r.fingerprint, true)],
                other => vec![same(s, Res::WrongState(other))],
            },
        },
        Input::Get | Input::Wait => vec![same(s, Res::Read)],
    }
}

/// Matches a possible effect against the observed answer; the state after it if they agree.
fn accept(t: Transition, out: &Output) -> Option<KeyState> {
    let Transition { res, mut next } = t;
    let ok = match (&res, out) {
        (Res::Acquired { attempt, takeover }, Output::Acquired { token, attempt: a, takeover: tk }) => {
            a == attempt && tk == takeover && reveal(&mut next, *token)
        }
        (Res::Replay { value }, Output::Replay { token, value: v }) => v == value && reveal(&mut next, *token),
        (Res::InProgress, Output::InProgress) | (Res::Mismatch, Output::Mismatch) => true,
        (Res::NotFound, Output::NotFound) => true,
        (Res::StaleToken { not }, Output::StaleToken { current }) => {
            Some(*current) != *not && reveal(&mut next, *current)
        }
        (Res::WrongState(s), Output::WrongState { state }) => s == state,
        (Res::Completed(t), Output::Completed { token }) => t == token,
        (Res::Failed(t, r), Output::Failed { token, retryable }) => t == token && r == retryable,
        (Res::LeaseExtended(t), Output::LeaseExtended { token }) => t == token,
        (Res::Read, Output::Record { view }) => match (next.rec.clone(), view) {
            (None, None) => true,
            (Some(r), Some(v)) => {
                r.state == v.state && r.owner == v.owner && r.value == v.value && reveal(&mut next, v.token)
            }
            _ => false,
        },
        _ => false,
    };
    ok.then_some(next)
}

/// Every state the record may be in after `input` answered `output` from state `s`; empty
/// when the answer is impossible. `Output::Unknown` allows every effect the state machine could
/// have had (including none, when its answer changes nothing); `Output::Refused`
/// changes nothing.
pub fn step(s: &KeyState, input: &Input, output: &Output) -> Vec<KeyState> {
    let mut out: Vec<KeyState> = Vec::new();
    if matches!(output, Output::Refused { .. }) {
        out.push(s.clone());
        return out;
    }
    let possible = transitions(s, input);
    if possible.is_empty() && matches!(output, Output::Unknown) {
        // Only validation could answer it, and a refused command has no effect.
        out.push(s.clone());
    }
    for t in possible {
        let next = match output {
            Output::Unknown => Some(t.next),
            o => accept(t, o),
        };
        if let Some(n) = next {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}
