//! How long a 3-node and a 5-node cluster take to elect a new leader after the old one
//! crashes, over many seeds: every failover must fit the availability bound the fault
//! harness holds a real cluster to (twice the largest election timeout plus 1 s), which a
//! split vote followed by a full election timeout does not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use idemraft_sim::failovers;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn a_crashed_leader_is_replaced_within_the_bound() {
    let bound = Duration::from_millis(2 * 800 + 1000);
    let seeds = env("IDEMRAFT_FAILOVER_SEEDS", 40);
    let mut over = Vec::new();
    for nodes in [3u64, 5] {
        let mut all = Vec::new();
        for seed in 1..=seeds {
            for f in failovers(seed, nodes, 8) {
                if f.took > bound {
                    over.push(format!(
                        "seed {seed}, {nodes} nodes: node {} crashed, a new leader took {:?} ({} terms)",
                        f.crashed, f.took, f.terms
                    ));
                }
                all.push(f);
            }
        }
        all.sort_by_key(|f| f.took);
        let pct = |p: usize| all[(all.len() - 1) * p / 100].took.as_millis();
        let split = all.iter().filter(|f| f.terms > 1).count();
        eprintln!(
            "{nodes} nodes, {} failovers: p50 {} ms, p99 {} ms, max {} ms, {split} took more than one term",
            all.len(),
            pct(50),
            pct(99),
            pct(100)
        );
    }
    assert!(over.is_empty(), "failovers over the bound of {bound:?}:\n{}", over.join("\n"));
}
