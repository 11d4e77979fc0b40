//! Each planted bug the simulator can reach is caught within a bounded number of seeds. A bug
//! is switched on for a whole process, so each runs in its own `idemraft-sim` process.
//! `docs/fault-testing.md` gives how many seeds each needs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// Runs `idemraft-sim --planted bug` over seeds 1..=max; the seed that caught it.
fn caught_by(bug: &str, max: u64) -> Option<u64> {
    let out = Command::new(env!("CARGO_BIN_EXE_idemraft-sim"))
        .args(["--seeds", &format!("1..{}", max + 1), "--planted", bug])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| l.strip_prefix(&format!("planted {bug}: caught by seed "))?.trim().parse().ok())
}

#[test]
fn the_planted_bugs_are_caught() {
    // Bounds well above the seeds each needed when measured (docs/fault-testing.md).
    let bugs = [
        ("skip-token-check", 50),
        ("ignore-leases", 50),
        ("stale-local-reads", 100),
        ("retry-new-token", 50),
        ("early-lease-expiry", 200),
    ];
    let mut missed = Vec::new();
    for (bug, max) in bugs {
        match caught_by(bug, max) {
            Some(seed) => eprintln!("planted {bug}: caught by seed {seed}"),
            None => missed.push(format!("{bug} (not within {max} seeds)")),
        }
    }
    assert!(missed.is_empty(), "planted bugs the simulator missed: {missed:?}");
}
