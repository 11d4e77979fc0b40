//! Per-key linearizability checking of an Idemraft history against [`crate::model`].
//!
//! ## Algorithm
//!
//! The history is first split by key (P-compositionality, Horn & Kroening): a history is
//! linearizable iff each per-key sub-history is, because every command addresses one record.
//! Refused operations had no effect and are dropped; reads whose answer was lost say nothing
//! and are dropped too.
//!
//! Each key is then searched as in Wing & Gong with Lowe's memoization. A *configuration* is
//! the set of operations linearized so far (a bitset) and the model state they lead to. From a
//! configuration, an operation may be linearized next iff it is not yet linearized and it was
//! invoked no later than the earliest return among the definite operations not yet linearized
//! (otherwise that one returned before it was invoked and must come first). Stepping the model
//! gives zero or more next states (the model is nondeterministic); each (op, state) pair is a
//! child. The search is depth first and succeeds once every *definite* operation is
//! linearized. Operations with an unknown outcome return at +infinity: they may be linearized
//! anywhere after their call, or never, so they are candidates but not goals, and an unknown
//! effect that leaves the state as it was is skipped (linearizing it would change nothing).
//! A configuration seen before is never expanded again.
//!
//! One reduction keeps the search near linear on Idemraft histories, where most answers
//! change nothing (InProgress, StaleToken, reads, retries): when a definite candidate's answer
//! holds in the current state and leaves it unchanged, it is linearized at once as the only
//! child. Such an answer also leaves the state unchanged at any later point where it holds
//! (tokens only grow, and a known token never becomes unknown again), so moving it earlier
//! loses no linearization; without this, the memo would tell apart every subset of the
//! concurrent read-like operations linearized so far.
//!
//! Each key has a time budget; when it runs out the key is `Unknown`, never a guess. An
//! illegal key reports the longest linearizable prefix found, the model state after it, and
//! the operations that could be placed next but whose answers the model rejects there.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::history::{Input, Op};
use crate::model::{step, KeyState};

/// Outcome of checking one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum KeyVerdict {
    /// Some linearization explains every answer.
    Ok,
    /// No linearization does.
    Illegal(Box<Illegal>),
    /// The budget ran out first.
    Unknown,
}

/// Why a key is not linearizable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Illegal {
    /// The longest prefix (most definite operations) that some linearization explains, in
    /// linearization order.
    pub prefix: Vec<Op>,
    /// The model state after that prefix.
    pub state: KeyState,
    /// Operations that could be linearized next but whose answers the model rejects in that
    /// state (when every candidate was placeable but led nowhere: all candidates).
    pub stuck: Vec<Op>,
}

/// How many prefix operations [`Illegal`]'s Display prints (the tail matters most).
const SHOWN_PREFIX: usize = 25;

impl fmt::Display for Illegal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let skip = self.prefix.len().saturating_sub(SHOWN_PREFIX);
        writeln!(f, "longest linearizable prefix: {} ops{}", self.prefix.len(), if skip > 0 { " (tail)" } else { "" })?;
        for op in &self.prefix[skip..] {
            writeln!(f, "  {op}")?;
        }
        writeln!(f, "model state after it: {}", self.state)?;
        writeln!(f, "cannot be placed next:")?;
        for op in &self.stuck {
            writeln!(f, "  {op}")?;
        }
        Ok(())
    }
}

/// The result for one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyReport {
    /// The key.
    pub key: String,
    /// Operations checked (refused ones and lost reads excluded).
    pub ops: usize,
    /// Of those, operations with unknown outcome.
    pub unknown_ops: usize,
    /// Verdict.
    pub verdict: KeyVerdict,
    /// Distinct configurations visited.
    pub explored: u64,
    /// Time spent, microseconds.
    pub elapsed_us: u64,
}

/// The result for a whole history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// One entry per key, in key order.
    pub keys: Vec<KeyReport>,
    /// Keys found linearizable.
    pub ok: usize,
    /// Keys found not linearizable.
    pub illegal: usize,
    /// Keys whose budget ran out.
    pub unknown: usize,
    /// Operations checked over all keys.
    pub ops: usize,
    /// Total checking time, microseconds.
    pub elapsed_us: u64,
}

impl Report {
    /// The keys that are not linearizable.
    pub fn illegal_keys(&self) -> impl Iterator<Item = (&str, &Illegal)> {
        self.keys.iter().filter_map(|k| match &k.verdict {
            KeyVerdict::Illegal(i) => Some((k.key.as_str(), i.as_ref())),
            _ => None,
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "linearizability: {} keys ok, {} illegal, {} unknown; {} ops in {:.3} s",
            self.ok,
            self.illegal,
            self.unknown,
            self.ops,
            self.elapsed_us as f64 / 1e6
        )?;
        for (key, illegal) in self.illegal_keys() {
            writeln!(f, "key {key} is not linearizable")?;
            write!(f, "{illegal}")?;
        }
        Ok(())
    }
}

/// Checks every key of `history`, each within `budget_per_key`.
pub fn check(history: &[Op], budget_per_key: Duration) -> Report {
    let start = Instant::now();
    let mut by_key: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
    for op in history {
        by_key.entry(op.key.as_str()).or_default().push(op.clone());
    }
    let keys: Vec<KeyReport> = by_key.into_iter().map(|(key, ops)| check_key(key, &ops, budget_per_key)).collect();
    let count = |f: fn(&KeyVerdict) -> bool| keys.iter().filter(|k| f(&k.verdict)).count();
    Report {
        ok: count(|v| matches!(v, KeyVerdict::Ok)),
        illegal: count(|v| matches!(v, KeyVerdict::Illegal(_))),
        unknown: count(|v| matches!(v, KeyVerdict::Unknown)),
        ops: keys.iter().map(|k| k.ops).sum(),
        elapsed_us: micros(start.elapsed()),
        keys,
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A fixed-width set of operation indexes.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Box<[u64]>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)].into_boxed_slice())
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn flip(&mut self, i: usize) {
        self.0[i / 64] ^= 1 << (i % 64);
    }
}

/// FxHash: the memo hashes millions of small keys, and SipHash's resistance to flooding buys
/// nothing here.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Memo = HashSet<(Bits, KeyState), BuildHasherDefault<FxHasher>>;

/// A configuration being expanded: children not yet tried, popped from the end.
struct Frame {
    /// The op whose linearization entered this frame (`None` at the root).
    entered_by: Option<usize>,
    todo: Vec<(usize, KeyState)>,
    /// All definite ops before this position in return order are linearized.
    ret_lo: usize,
    /// All definite ops before this position in call order are linearized.
    call_lo: usize,
}

/// The search over one key's operations.
struct Search<'a> {
    ops: &'a [Op],
    /// Definite ops by return time and by call time; unknown ops by call time.
    by_ret: Vec<usize>,
    by_call: Vec<usize>,
    unknown: Vec<usize>,
}

impl Search<'_> {
    fn ret(&self, i: usize) -> u64 {
        self.ops[i].return_ns.unwrap_or(u64::MAX)
    }

    /// The children of a configuration, and the definite candidates the model rejects.
    fn expand(&self, bits: &Bits, state: &KeyState, ret_lo: usize, call_lo: usize) -> (Frame, Vec<usize>) {
        let mut ret_lo = ret_lo;
        while ret_lo < self.by_ret.len() && bits.get(self.by_ret[ret_lo]) {
            ret_lo += 1;
        }
        let mut call_lo = call_lo;
        while call_lo < self.by_call.len() && bits.get(self.by_call[call_lo]) {
            call_lo += 1;
        }
        let horizon = self.by_ret.get(ret_lo).map_or(u64::MAX, |&i| self.ret(i));
        let mut rejected = Vec::new();
        let mut definite = Vec::new();
        for &i in &self.by_call[call_lo..] {
            if self.ops[i].call_ns > horizon {
                break;
            }
            if bits.get(i) {
                continue;
            }
            let nexts = step(state, &self.ops[i].input, &self.ops[i].output);
            if let [only] = nexts.as_slice() {
                if only == state {
                    // A definite op whose answer holds here and changes nothing is linearized
                    // now, as the only child. That loses no linearization: each such answer
                    // (InProgress, a read or retry of a known token, a refusal by state) also
                    // changes nothing wherever else it could hold, so moving it earlier keeps
                    // every other op's state and breaks no real-time order. It stops the
                    // search from trying the orders of concurrent read-like ops, which is
                    // where the bitsets multiply.
                    let todo = vec![(i, state.clone())];
                    return (Frame { entered_by: None, todo, ret_lo, call_lo }, Vec::new());
                }
            }
            if nexts.is_empty() {
                rejected.push(i);
            }
            definite.extend(nexts.into_iter().map(|n| (i, n)));
        }
        let mut todo = Vec::new();
        // Unknown ops go in first so that they are tried last: most never took effect.
        for &i in &self.unknown {
            if !bits.get(i) && self.ops[i].call_ns <= horizon {
                for next in step(state, &self.ops[i].input, &self.ops[i].output) {
                    if next != *state {
                        todo.push((i, next));
                    }
                }
            }
        }
        // Earliest invocation tried first: it is the likeliest next in real time.
        todo.extend(definite.into_iter().rev());
        (Frame { entered_by: None, todo, ret_lo, call_lo }, rejected)
    }
}

/// Checks one key's operations (all of which must carry that key) within `budget`.
pub fn check_key(key: &str, ops: &[Op], budget: Duration) -> KeyReport {
    let start = Instant::now();
    let ops: Vec<Op> = ops
        .iter()
        .filter(|op| {
            let lost_read = op.is_unknown() && matches!(op.input, Input::Get | Input::Wait);
            !op.is_refused() && !lost_read
        })
        .cloned()
        .collect();
    let mut report = KeyReport {
        key: key.to_string(),
        ops: ops.len(),
        unknown_ops: ops.iter().filter(|o| o.is_unknown()).count(),
        verdict: KeyVerdict::Ok,
        explored: 0,
        elapsed_us: 0,
    };
    let (verdict, explored) = search(&ops, budget, start);
    report.verdict = verdict;
    report.explored = explored;
    report.elapsed_us = micros(start.elapsed());
    report
}

fn search(ops: &[Op], budget: Duration, start: Instant) -> (KeyVerdict, u64) {
    let mut s = Search { ops, by_ret: Vec::new(), by_call: Vec::new(), unknown: Vec::new() };
    for (i, op) in ops.iter().enumerate() {
        if op.is_unknown() {
            s.unknown.push(i);
        } else {
            s.by_ret.push(i);
            s.by_call.push(i);
        }
    }
    let ret = |i: usize| ops[i].return_ns.unwrap_or(u64::MAX);
    s.by_ret.sort_by_key(|&i| (ret(i), ops[i].call_ns));
    s.by_call.sort_by_key(|&i| (ops[i].call_ns, ret(i)));
    s.unknown.sort_by_key(|&i| ops[i].call_ns);
    let goal = s.by_ret.len();
    if goal == 0 {
        return (KeyVerdict::Ok, 0);
    }

    let mut bits = Bits::new(ops.len());
    let mut memo = Memo::default();
    // Current path: (op, state after it); `done` counts definite ops on it.
    let mut path: Vec<(usize, KeyState)> = Vec::new();
    let mut done = 0usize;
    let root_state = KeyState::new();
    let (root, rejected) = s.expand(&bits, &root_state, 0, 0);
    let mut best = (0usize, Vec::<usize>::new(), root_state.clone(), stuck_ops(&root, &rejected));
    let mut stack = vec![root];
    let mut steps = 0u64;

    while let Some(top) = stack.last_mut() {
        steps += 1;
        if steps % 256 == 0 && start.elapsed() > budget {
            return (KeyVerdict::Unknown, memo.len() as u64);
        }
        let Some((i, next)) = top.todo.pop() else {
            // Exhausted: undo the op that entered this frame.
            if let Some(frame) = stack.pop() {
                if let Some(i) = frame.entered_by {
                    bits.flip(i);
                    path.pop();
                    if !ops[i].is_unknown() {
                        done -= 1;
                    }
                }
            }
            continue;
        };
        let (ret_lo, call_lo) = (top.ret_lo, top.call_lo);
        bits.flip(i);
        if !memo.insert((bits.clone(), next.clone())) {
            bits.flip(i);
            continue;
        }
        if !ops[i].is_unknown() {
            done += 1;
        }
        if done == goal {
            return (KeyVerdict::Ok, memo.len() as u64);
        }
        let (mut frame, rejected) = s.expand(&bits, &next, ret_lo, call_lo);
        frame.entered_by = Some(i);
        path.push((i, next.clone()));
        if done > best.0 {
            best = (done, path.iter().map(|(i, _)| *i).collect(), next, stuck_ops(&frame, &rejected));
        }
        stack.push(frame);
    }

    let (_, prefix, state, stuck) = best;
    let illegal = Illegal {
        prefix: prefix.into_iter().map(|i| ops[i].clone()).collect(),
        state,
        stuck: stuck.into_iter().filter(|&i| !ops[i].is_unknown()).map(|i| ops[i].clone()).collect(),
    };
    (KeyVerdict::Illegal(Box::new(illegal)), memo.len() as u64)
}

/// The ops to blame at a frontier: those the model rejects, else every candidate.
fn stuck_ops(frame: &Frame, rejected: &[usize]) -> Vec<usize> {
    if !rejected.is_empty() {
        return rejected.to_vec();
    }
    let mut all: Vec<usize> = frame.todo.iter().map(|(i, _)| *i).collect();
    all.sort_unstable();
    all.dedup();
    all
}
