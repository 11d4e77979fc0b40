//! `idemraft-jepsen` will own the proof that Idemraft keeps its promises under faults: a
//! harness that starts real `idemraft` processes behind per-link TCP proxies, a seeded nemesis
//! (partitions, crashes, pauses, clock skew, membership changes), a recorded history, a
//! per-key linearizability checker and invariant checkers, and the benchmark driver.
//!
//! It is empty today on purpose: the cluster it will test (`idemraft-node`, `idemraft-client`)
//! has just been built, and the harness is the next piece of work. Until then the crash and
//! failover tests with real processes live in `node/tests/`.

pub mod history;
pub mod invariants;
pub mod ledger;
pub mod linearizability;
pub mod model;
