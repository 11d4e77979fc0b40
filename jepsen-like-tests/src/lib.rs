//! `idemraft-jepsen` will own the proof that Idemraft keeps its promises under faults: a
//! harness that starts real `idemraft` processes behind per-link TCP proxies, a seeded nemesis
//! (partitions, crashes, pauses, clock skew, membership changes), a recorded history, a
//! per-key linearizability checker and invariant checkers, and the benchmark driver.
//!
//! It is empty today on purpose: it needs a running cluster, which arrives with the node.
