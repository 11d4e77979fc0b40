//! The fenced downstream "bank" the workload charges between acquiring a key and completing
//! it, and the check that no work ran twice for a key whose completion was acknowledged.
//!
//! The ledger does what contract §3.5 asks of a downstream system: it keeps the highest token
//! seen per key and refuses lower ones. So it is safe on its own terms even when Idemraft is
//! not; what it records lets the checker see whether Idemraft handed a completed key out again
//! (a second charge under a new token after the first token's completion was acknowledged) or
//! acknowledged completions by two tokens.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::history::{Clock, Input, Op, OpId, Output};
use crate::invariants::Anomaly;

/// An accepted charge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// Record key the work was for.
    pub key: String,
    /// Fencing token presented.
    pub token: u64,
    /// Caller's id for the charge.
    pub charge_id: u64,
    /// When it was accepted, on the shared harness clock.
    pub at_ns: u64,
}

/// A charge refused because a higher token had been seen for the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedCharge {
    /// The charge as presented.
    pub charge: Charge,
    /// The highest token the ledger had seen for the key.
    pub highest: u64,
}

/// The ledger's refusal: a higher token was seen for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// The highest token seen for the key.
    pub highest: u64,
}

/// Everything the ledger recorded, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LedgerSnapshot {
    /// Accepted charges in acceptance order.
    pub accepted: Vec<Charge>,
    /// Refused charges in refusal order.
    pub refused: Vec<RefusedCharge>,
}

#[derive(Debug, Default)]
struct Inner {
    highest: HashMap<String, u64>,
    log: LedgerSnapshot,
}

/// A fenced ledger shared by the workload's clients. Cheap to clone; clones share the books.
#[derive(Clone, Debug)]
pub struct Ledger {
    clock: Clock,
    inner: Arc<Mutex<Inner>>,
}

impl Ledger {
    /// An empty ledger stamping with `clock` (the recorder's, so times compare with the history).
    pub fn new(clock: Clock) -> Ledger {
        Ledger { clock, inner: Arc::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update is complete before the guard drops, so a poisoned lock holds whole data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accepts the charge if `token` is at least the highest token seen for `key`.
    pub fn charge(&self, key: &str, token: u64, charge_id: u64) -> Result<(), Refused> {
        let mut inner = self.lock();
        // Stamp under the lock so acceptance order and timestamps agree.
        let at_ns = self.clock.now_ns();
        let charge = Charge { key: key.to_string(), token, charge_id, at_ns };
        let highest = inner.highest.get(key).copied();
        match highest {
            Some(highest) if token < highest => {
                inner.log.refused.push(RefusedCharge { charge, highest });
                Err(Refused { highest })
            }
            _ => {
                inner.highest.insert(key.to_string(), token);
                inner.log.accepted.push(charge);
                Ok(())
            }
        }
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> LedgerSnapshot {
        self.lock().log.clone()
    }
}

/// The ledger check's findings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LedgerReport {
    /// Charges accepted.
    pub accepted: usize,
    /// Charges refused as stale.
    pub refused_stale: usize,
    /// Double charges and double completions.
    pub anomalies: Vec<Anomaly>,
}

/// An acknowledged completion: Completed{token}, or a terminal Failed{token}.
pub(crate) fn acked_completion(op: &Op) -> Option<(u64, u64)> {
    let return_ns = op.return_ns?;
    match (&op.input, &op.output) {
        (Input::Complete { .. }, Output::Completed { token }) => Some((*token, return_ns)),
        (Input::Fail { retryable: false, .. }, Output::Failed { token, retryable: false }) => Some((*token, return_ns)),
        _ => None,
    }
}

/// Finds double charges and keys acknowledged Completed by two tokens.
pub fn check_ledger(history: &[Op], ledger: &LedgerSnapshot) -> LedgerReport {
    let mut report =
        LedgerReport { accepted: ledger.accepted.len(), refused_stale: ledger.refused.len(), anomalies: Vec::new() };

    // Per key: every acknowledged completion as (token, return_ns, op).
    let mut completions: BTreeMap<&str, Vec<(u64, u64, OpId)>> = BTreeMap::new();
    for op in history {
        if let Some((token, ret)) = acked_completion(op) {
            completions.entry(op.key.as_str()).or_default().push((token, ret, op.id));
        }
    }
    for (key, done) in &completions {
        let tokens: BTreeSet<u64> = done.iter().map(|c| c.0).collect();
        if tokens.len() > 1 {
            report.anomalies.push(Anomaly::DoubleCompletion {
                key: key.to_string(),
                tokens: tokens.into_iter().collect(),
                ops: done.iter().map(|c| c.2).collect(),
            });
        }
    }

    let mut charges: BTreeMap<&str, Vec<&Charge>> = BTreeMap::new();
    for c in &ledger.accepted {
        charges.entry(c.key.as_str()).or_default().push(c);
    }
    for (key, list) in charges {
        let Some(done) = completions.get(key) else { continue };
        for later in &list {
            let witness = list.iter().find_map(|earlier| {
                if earlier.at_ns >= later.at_ns || earlier.token == later.token {
                    return None;
                }
                let completion = done.iter().find(|(t, ret, _)| *t == earlier.token && *ret < later.at_ns)?;
                Some((earlier.charge_id, completion.2))
            });
            if let Some((first_charge, completion)) = witness {
                report.anomalies.push(Anomaly::DoubleCharge {
                    key: key.to_string(),
                    first_charge,
                    second_charge: later.charge_id,
                    second_token: later.token,
                    completion,
                });
            }
        }
    }
    report
}
