//! `idemraft-sim`: runs seeds of the deterministic cluster simulation and reports the ones
//! whose history the checkers reject.
//!
//!   idemraft-sim --seed N [--dump KEY]     one run, with its faults and verdict (and every
//!                                          operation on KEY)
//!   idemraft-sim --seeds A..B              every seed from A to B (exclusive)
//!   idemraft-sim --seeds A..B --planted B  the same with planted bug B switched on; stops at
//!                                          the first seed that catches it (with --count: runs
//!                                          them all and says how many caught it)
//!   --membership                           the nemesis also removes voters and adds them back

use std::process::ExitCode;

use idemraft_sim::{run, Settings};
use idemraft_store::planted::{self, Bug};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds = 1..2u64;
    let mut planted_bug = None;
    let mut verbose = false;
    let mut dump: Option<String> = None;
    let mut count = false;
    let mut membership = false;
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seed" => match value.parse::<u64>() {
                Ok(n) => {
                    seeds = n..n + 1;
                    verbose = true;
                }
                Err(_) => return usage(&format!("--seed takes a number, not '{value}'")),
            },
            "--seeds" => match value.split_once("..").and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?))) {
                Some((a, b)) if a < b => seeds = a..b,
                _ => return usage(&format!("--seeds takes A..B with A < B, not '{value}'")),
            },
            "--planted" => match Bug::from_name(&value) {
                Some(b) => planted_bug = Some(b),
                None => return usage(&format!("no planted bug is called '{value}'")),
            },
            "--dump" => dump = Some(value),
            "--count" => {
                count = true;
                i += 1;
                continue;
            }
            "--membership" => {
                membership = true;
                i += 1;
                continue;
            }
            other => return usage(&format!("unknown argument '{other}'")),
        }
        i += 2;
    }
    if let Some(bug) = planted_bug {
        planted::plant(&[bug]);
    }
    let total = seeds.end - seeds.start;
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for seed in seeds {
        let report = run(&Settings { membership, ..Settings::new(seed) });
        if verbose {
            for f in &report.faults {
                println!("fault {f}");
            }
            println!("{}", report.verdict);
            for e in &report.anomalies {
                println!("anomaly: {e}");
            }
            println!("trace {:016x}", report.trace());
            if let Some(key) = &dump {
                for op in report.history.iter().chain(&report.final_reads).filter(|o| &o.key == key) {
                    println!("{op}");
                }
            }
        }
        if !report.valid() {
            println!("seed {seed}: {:?}; replay with: {}", report.verdict.validity, report.replay_command());
            failed.push(seed);
            if planted_bug.is_some() && !count {
                break;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    match planted_bug {
        Some(bug) if failed.is_empty() => {
            println!("planted {}: not caught in {total} seeds ({secs:.1} s)", bug.name());
            ExitCode::from(1)
        }
        Some(bug) if count => {
            println!(
                "planted {}: caught by {} of {total} seeds, first by seed {}",
                bug.name(),
                failed.len(),
                failed[0]
            );
            ExitCode::SUCCESS
        }
        Some(bug) => {
            println!("planted {}: caught by seed {}", bug.name(), failed[0]);
            ExitCode::SUCCESS
        }
        None => {
            println!("{total} seeds in {secs:.1} s: {} rejected {failed:?}", failed.len());
            if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("idemraft-sim: {problem}\nusage: idemraft-sim [--seed N [--dump KEY] | --seeds A..B] [--planted BUG [--count]] [--membership]");
    ExitCode::from(2)
}
