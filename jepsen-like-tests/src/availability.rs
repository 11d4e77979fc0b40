//! Availability from the history: the longest stretch in which no write succeeded, overall
//! and per fault kind, and whether a fault that takes out a single node kept writes away
//! for longer than an election should take.
//!
//! A write succeeded when a Claim, Takeover, Complete, Fail or ExtendLease got an answer from
//! the state machine: Acquired, Replay, InProgress, Completed, StaleToken and the rest. Only a
//! leader that holds a majority (or its lease) answers those, whatever the answer says. Only
//! Acquired or Completed would not do: once a key window's twelve keys are settled the
//! workload's claims all replay, and a run then shows 1.7 s gaps with no fault at all. A
//! refusal (validation, any node) or an unknown outcome does not count. The windows are the
//! gaps between consecutive successes (by return time), from the first op of the workload to
//! its last.
//!
//! A window is attributed to every fault whose interval (install to heal) it overlaps, or to
//! `none`. For a fault, the window is counted from the fault's start: what came before it is
//! not its doing (the quiet after the previous round, or a slow write). A window fails the run
//! only when every fault it overlaps is a single-node kind ([`Fault::single_node`]) and they
//! all hit the same node: two single-node faults on two nodes of three take the majority, and
//! partitions of several nodes, kill-all and membership changes are allowed to stop writes
//! (they are reported, never judged).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::history::{Input, Op};
use crate::nemesis::{Event, Outcome};

/// The longest window attributed to one fault kind.
#[derive(Clone, Debug, Serialize)]
pub struct KindWindow {
    /// Fault name, or `none`.
    pub kind: String,
    /// The window, ms (for a fault: from the later of the window's and the fault's start).
    pub longest_ms: u64,
    /// Where it starts on the harness clock, ms.
    pub at_ms: u64,
    /// Faults of this kind seen.
    pub faults: usize,
    /// Whether this kind is held to the bound.
    pub judged: bool,
}

/// A window over the bound during a single-node fault.
#[derive(Clone, Debug, Serialize)]
pub struct Breach {
    /// The faults it overlapped, by name, with their target.
    pub during: String,
    /// Its length from the fault's start, ms.
    pub window_ms: u64,
    /// Where it starts on the harness clock, ms.
    pub at_ms: u64,
}

/// What the history shows of availability.
#[derive(Clone, Debug, Serialize)]
pub struct Availability {
    /// Successful writes counted.
    pub writes: usize,
    /// The longest window of the whole run, ms.
    pub longest_ms: u64,
    /// Where it starts, ms.
    pub longest_at_ms: u64,
    /// The longest window per fault kind (and `none`), by kind.
    pub per_kind: Vec<KindWindow>,
    /// The bound single-node faults are held to, ms.
    pub bound_ms: u64,
    /// Windows over the bound during single-node faults: each fails the run.
    pub breaches: Vec<Breach>,
}

fn is_write(op: &Op) -> bool {
    let write = matches!(
        op.input,
        Input::Claim { .. }
            | Input::Takeover { .. }
            | Input::Complete { .. }
            | Input::Fail { .. }
            | Input::Extend { .. }
    );
    write && !op.is_unknown() && !op.is_refused()
}

const MS: u64 = 1_000_000;

/// Judges `history` (the workload's ops, final reads left out) against `events`; `bound` is
/// the election timeout plus the slack a client needs to find the new leader.
pub fn availability(history: &[Op], events: &[Event], bound: Duration) -> Availability {
    let from = history.iter().map(|o| o.call_ns).min().unwrap_or(0);
    let to = history.iter().map(|o| o.return_ns.unwrap_or(o.call_ns)).max().unwrap_or(from);
    let mut points: Vec<u64> = history.iter().filter(|o| is_write(o)).filter_map(|o| o.return_ns).collect();
    let writes = points.len();
    points.push(from);
    points.push(to);
    points.sort_unstable();
    let fired: Vec<&Event> = events.iter().filter(|e| !matches!(e.outcome, Outcome::Skipped(_))).collect();
    let bound_ns = bound.as_nanos() as u64;

    let mut per: BTreeMap<String, KindWindow> = BTreeMap::new();
    for e in &fired {
        per.entry(e.fault.name().to_string())
            .or_insert_with(|| KindWindow {
                kind: e.fault.name().to_string(),
                longest_ms: 0,
                at_ms: 0,
                faults: 0,
                judged: e.fault.single_node(),
            })
            .faults += 1;
    }
    let mut note = |kind: &str, start: u64, len: u64, judged: bool| {
        let w = per.entry(kind.to_string()).or_insert_with(|| KindWindow {
            kind: kind.to_string(),
            longest_ms: 0,
            at_ms: 0,
            faults: 0,
            judged,
        });
        if len / MS > w.longest_ms {
            w.longest_ms = len / MS;
            w.at_ms = start / MS;
        }
    };
    let (mut longest, mut longest_at) = (0, from);
    let mut breaches = Vec::new();
    for w in points.windows(2) {
        let (start, end) = (w[0], w[1]);
        if end - start > longest {
            (longest, longest_at) = (end - start, start);
        }
        let over: Vec<&&Event> = fired.iter().filter(|e| e.start_ns < end && e.end_ns > start).collect();
        if over.is_empty() {
            note("none", start, end - start, false);
            continue;
        }
        for e in &over {
            let s = start.max(e.start_ns);
            note(e.fault.name(), s, end - s, e.fault.single_node());
        }
        let targets: BTreeSet<u64> = over.iter().flat_map(|e| e.targets.iter().copied()).collect();
        if over.iter().all(|e| e.fault.single_node()) && targets.len() <= 1 {
            let s = start.max(over.iter().map(|e| e.start_ns).min().unwrap_or(start));
            if end - s > bound_ns {
                let during: Vec<String> =
                    over.iter().map(|e| format!("{} on node {:?}", e.fault.name(), e.targets)).collect();
                breaches.push(Breach { during: during.join(" + "), window_ms: (end - s) / MS, at_ms: s / MS });
            }
        }
    }
    Availability {
        writes,
        longest_ms: longest / MS,
        longest_at_ms: longest_at / MS,
        per_kind: per.into_values().collect(),
        bound_ms: bound.as_millis() as u64,
        breaches,
    }
}

impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "availability: longest window without a successful write {} ms (at {:.1} s), {} writes; single-node faults held to {} ms",
            self.longest_ms,
            self.longest_at_ms as f64 / 1000.0,
            self.writes,
            self.bound_ms
        )?;
        for k in &self.per_kind {
            let judged = if k.judged { format!("bound {} ms", self.bound_ms) } else { "reported only".into() };
            writeln!(
                f,
                "  {:<20} {:>6} ms (at {:.1} s, {} faults, {judged})",
                k.kind,
                k.longest_ms,
                k.at_ms as f64 / 1000.0,
                k.faults
            )?;
        }
        for b in &self.breaches {
            writeln!(
                f,
                "availability failure: no write for {} ms from {:.1} s during {} (bound {} ms)",
                b.window_ms,
                b.at_ms as f64 / 1000.0,
                b.during,
                self.bound_ms
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Output;
    use crate::nemesis::Fault;

    fn write(id: u64, ret_ms: u64) -> Op {
        Op {
            id,
            client: 0,
            node: None,
            key: "k".into(),
            call_ns: ret_ms * MS - MS,
            return_ns: Some(ret_ms * MS),
            input: Input::Complete { token: id, value: String::new() },
            output: Output::Completed { token: id },
        }
    }

    fn fault(fault: Fault, targets: &[u64], from_ms: u64, to_ms: u64) -> Event {
        Event {
            fault,
            targets: targets.to_vec(),
            detail: String::new(),
            start_ns: from_ms * MS,
            end_ns: to_ms * MS,
            outcome: Outcome::Installed,
        }
    }

    fn kind<'a>(a: &'a Availability, name: &str) -> &'a KindWindow {
        a.per_kind.iter().find(|k| k.kind == name).unwrap_or_else(|| panic!("no {name} in {a}"))
    }

    #[test]
    fn windows_are_counted_from_the_fault_and_only_single_node_faults_fail() {
        // Writes every 10 ms, except 1000..4000 (a leader kill at 1500) and 6000..9000 (a
        // majority partition at 6000).
        let mut h = Vec::new();
        let mut t = 10;
        while t <= 12_000 {
            if !((1001..4000).contains(&t) || (6001..9000).contains(&t)) {
                h.push(write(h.len() as u64, t));
            }
            t += 10;
        }
        // Neither a read nor a refused or unknown write shows the leader at work.
        let read = Op { input: Input::Get, output: Output::Record { view: None }, ..write(99_997, 2000) };
        let refused = Op { output: Output::Refused { reason: "too big".into() }, ..write(99_998, 2000) };
        let unknown = Op { output: Output::Unknown, return_ns: None, ..write(99_999, 2000) };
        h.extend([read, refused, unknown]);
        let events = [
            fault(Fault::KillLeader, &[1], 1500, 3500),
            fault(Fault::PartitionMajority, &[2], 6000, 8000),
            fault(Fault::KillOne, &[3], 10_000, 11_000),
        ];
        let a = availability(&h, &events, Duration::from_millis(1800));
        assert_eq!(a.longest_ms, 3000, "{a}");
        assert_eq!(kind(&a, "kill-leader").longest_ms, 2500, "{a}");
        assert_eq!(kind(&a, "partition-majority").longest_ms, 3000, "{a}");
        assert_eq!(kind(&a, "kill-one").longest_ms, 10, "{a}");
        assert_eq!(kind(&a, "none").longest_ms, 10, "{a}");
        assert_eq!(a.breaches.len(), 1, "{a}");
        assert!(a.breaches[0].during.starts_with("kill-leader"), "{a}");
        assert_eq!(a.breaches[0].window_ms, 2500);
        // Within the bound, nothing fails.
        assert!(availability(&h, &events, Duration::from_millis(2600)).breaches.is_empty());
    }

    #[test]
    fn single_node_faults_on_two_nodes_are_reported_not_judged() {
        let h = vec![write(0, 1000), write(1, 5000)];
        let events = [fault(Fault::KillOne, &[1], 1200, 3000), fault(Fault::PauseOne, &[2], 1200, 3000)];
        let a = availability(&h, &events, Duration::from_millis(1800));
        assert!(a.breaches.is_empty(), "{a}");
        assert_eq!(kind(&a, "kill-one").longest_ms, 3800);
        // The same node twice is still one node down.
        let events = [fault(Fault::KillOne, &[1], 1200, 3000), fault(Fault::Clock, &[1], 1200, 3000)];
        assert_eq!(availability(&h, &events, Duration::from_millis(1800)).breaches.len(), 1);
    }
}
