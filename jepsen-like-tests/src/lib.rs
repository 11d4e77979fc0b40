//! `idemraft-jepsen` owns the proof that Idemraft keeps its promises under faults: a harness
//! that starts real `idemraft` processes behind per-link TCP proxies ([`cluster`], [`proxy`]),
//! a seeded nemesis ([`nemesis`]: partitions, crashes, pauses, clock skew, membership
//! changes), a contended workload that records every call ([`workload`], [`history`]) and
//! completes with key-derived bodies of up to 256 KiB ([`payload`]), a fenced downstream
//! ([`ledger`]), and the checkers that judge the history: per-key linearizability against
//! the sequential [`model`] ([`linearizability`]) and the idempotency invariants
//! ([`invariants`]); [`availability`] measures how long writes stopped under each fault;
//! [`ttl_probe`] checks on the side that no expired record is ever replayed.
//! [`run`] sequences one run and [`report`] turns it into a verdict and a run directory, with
//! a self-contained picture of the run ([`html`]); [`progress`] shows a run as it goes, on a
//! terminal.

pub mod availability;
pub mod cluster;
pub mod history;
pub mod html;
pub mod invariants;
pub mod ledger;
pub mod linearizability;
pub mod model;
pub mod nemesis;
pub mod payload;
pub mod progress;
pub mod proxy;
pub mod report;
pub mod run;
pub mod ttl_probe;
pub mod workload;
