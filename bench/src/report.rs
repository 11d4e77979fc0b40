//! The tables: one row per (workload, target, clients) with every figure, then ops/s side by
//! side with the ratio to the baseline (etcd), then the targets the issue set, each judged
//! from figures of this same run.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::floor::Floor;
use crate::workload::{RunResult, Workload};

/// Results by (workload, target order, clients).
pub type Results = BTreeMap<(Workload, usize, usize), RunResult>;

fn ms(h: &hdrhistogram::Histogram<u64>, q: f64) -> String {
    if h.is_empty() {
        "-".into()
    } else {
        format!("{:.2}", h.value_at_quantile(q) as f64 / 1000.0)
    }
}

fn per_1k(cpu: f64, ops: u64) -> String {
    if ops == 0 {
        "-".into()
    } else {
        format!("{:.3}", cpu * 1000.0 / ops as f64)
    }
}

/// Renders the whole report as Markdown.
pub fn render(results: &Results, names: &[String], floor: Option<Floor>, baseline: &str, subject: &str) -> String {
    let mut s = String::new();
    if let Some(f) = floor {
        let _ = writeln!(s, "{} (the lower of the two measurements, used below)\n", f.line());
    }
    let _ = writeln!(
        s,
        "| workload | target | clients | ops/s | p50 ms | p99 ms | p999 ms | claim p50 ms | server CPU s/1k ops | driver CPU s/1k ops | server peak RSS MiB | errors |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ((w, t, c), r) in results {
        let claim = if *w == Workload::Replay { "-".into() } else { ms(&r.claim, 0.5) };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            w.name(),
            names.get(*t).map_or("?", String::as_str),
            c,
            r.rate(),
            ms(&r.op, 0.5),
            ms(&r.op, 0.99),
            ms(&r.op, 0.999),
            claim,
            per_1k(r.server_cpu, r.ops),
            per_1k(r.driver_cpu, r.ops),
            r.peak_rss as f64 / (1024.0 * 1024.0),
            r.errors
        );
    }

    let base = names.iter().position(|n| n == baseline);
    let clients: Vec<usize> = {
        let mut c: Vec<usize> = results.keys().map(|k| k.2).collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let workloads: Vec<Workload> = {
        let mut w: Vec<Workload> = results.keys().map(|k| k.0).collect();
        w.dedup();
        w
    };
    let rate = |w: Workload, t: usize, c: usize| results.get(&(w, t, c)).map(RunResult::rate);
    for w in &workloads {
        let _ = writeln!(
            s,
            "\n**{}: ops/s{}**\n",
            w.name(),
            if base.is_some() { format!(" (× {baseline})") } else { String::new() }
        );
        let _ = write!(s, "| target |");
        for c in &clients {
            let _ = write!(s, " {c} clients |");
        }
        let _ = write!(s, "\n|---|");
        for _ in &clients {
            let _ = write!(s, "---:|");
        }
        let _ = writeln!(s);
        for (t, name) in names.iter().enumerate() {
            if !clients.iter().any(|c| rate(*w, t, *c).is_some()) {
                continue;
            }
            let _ = write!(s, "| {name} |");
            for c in &clients {
                let cell = match (rate(*w, t, *c), base.and_then(|b| rate(*w, b, *c))) {
                    (Some(r), Some(b)) if b > 0.0 => format!("{r:.0} ({:.2}×)", r / b),
                    (Some(r), _) => format!("{r:.0}"),
                    (None, _) => "-".into(),
                };
                let _ = write!(s, " {cell} |");
            }
            let _ = writeln!(s);
        }
    }

    // The targets, judged from this run.
    let Some(subj) = names.iter().position(|n| n == subject) else { return s };
    let _ = writeln!(s, "\n**Targets ({subject})**\n");
    let _ = writeln!(s, "| target | figure | verdict |");
    let _ = writeln!(s, "|---|---|---|");
    for c in [64, 256] {
        if let (Some(r), Some(b)) = (rate(Workload::Cycle, subj, c), base.and_then(|b| rate(Workload::Cycle, b, c))) {
            let x = if b > 0.0 { r / b } else { 0.0 };
            let _ = writeln!(
                s,
                "| cycle ops/s at {c} clients ≥ 2× {baseline} | {r:.0} vs {b:.0} = {x:.2}× | {} |",
                if x >= 2.0 { "met" } else { "missed" }
            );
        }
    }
    if let (Some(r), Some(f)) = (results.get(&(Workload::Cycle, subj, 1)), floor) {
        if !r.claim.is_empty() {
            let p50 = r.claim.value_at_quantile(0.5) as f64;
            let x = p50 / f.total_us();
            let _ = writeln!(
                s,
                "| 1-client claim p50 ≤ 1.5× floor | {:.0} us vs {:.0} us = {x:.2}× | {} |",
                p50,
                f.total_us(),
                if x <= 1.5 { "met" } else { "missed" }
            );
        }
    }
    for c in &clients {
        if let (Some(rp), Some(cy)) = (rate(Workload::Replay, subj, *c), rate(Workload::Cycle, subj, *c)) {
            let x = if cy > 0.0 { rp / cy } else { 0.0 };
            let _ = writeln!(
                s,
                "| replay ops/s ≥ 10× cycle ops/s at {c} clients | {rp:.0} vs {cy:.0} = {x:.1}× | {} |",
                if x >= 10.0 { "met" } else { "missed" }
            );
        }
    }
    s
}
