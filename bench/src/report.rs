//! The tables: one row per (workload, body size, target, clients) with every figure, then
//! ops/s side by side with the ratio to the baseline (etcd) per workload and size, then the
//! performance targets of docs/benchmarks.md, each judged from figures of this same run; and
//! the charts of the same figures.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::chart::{self, Series};
use crate::floor::Floor;
use crate::workload::{RunResult, Workload};

/// Results by (workload, body bytes, target order, clients).
pub type Results = BTreeMap<(Workload, usize, usize, usize), RunResult>;

/// Which targets the ratios and verdicts are about.
pub struct Roles<'a> {
    /// What the ratios divide by (etcd-3).
    pub baseline: &'a str,
    /// What the targets are judged on (idemraft-3).
    pub subject: &'a str,
    /// A second store the subject must beat at every concurrency (postgres-ha).
    pub anchor: &'a str,
}

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

fn size_name(b: usize) -> String {
    if b >= 1024 && b.is_multiple_of(1024) {
        format!("{} KiB", b / 1024)
    } else {
        format!("{b} B")
    }
}

fn sorted<T: Ord + Copy>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = it.collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

/// Renders the whole report as Markdown.
pub fn render(results: &Results, names: &[String], floor: Option<Floor>, roles: &Roles<'_>) -> String {
    let mut s = String::new();
    if let Some(f) = floor {
        let _ = writeln!(s, "{} (the lower of the two measurements, used below)\n", f.line());
    }
    let _ = writeln!(
        s,
        "| workload | body | target | clients | ops/s | p50 ms | p99 ms | p999 ms | claim p50 ms | claim p99 ms | server CPU s/1k ops | driver CPU s/1k ops | server peak RSS MiB | errors |"
    );
    let _ = writeln!(s, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ((w, b, t, c), r) in results {
        let (c50, c99) =
            if *w == Workload::Replay { ("-".into(), "-".into()) } else { (ms(&r.claim, 0.5), ms(&r.claim, 0.99)) };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            w.name(),
            size_name(*b),
            names.get(*t).map_or("?", String::as_str),
            c,
            r.rate(),
            ms(&r.op, 0.5),
            ms(&r.op, 0.99),
            ms(&r.op, 0.999),
            c50,
            c99,
            per_1k(r.server_cpu, r.ops),
            per_1k(r.driver_cpu, r.ops),
            r.peak_rss as f64 / (1024.0 * 1024.0),
            r.errors
        );
    }

    let base = names.iter().position(|n| n == roles.baseline);
    let clients = sorted(results.keys().map(|k| k.3));
    let cells = sorted(results.keys().map(|k| (k.0, k.1)));
    let rate = |w: Workload, b: usize, t: usize, c: usize| rate_of(results, w, b, t, c);
    for &(w, b) in &cells {
        let _ = writeln!(
            s,
            "\n**{}, {} bodies: ops/s{}**\n",
            w.name(),
            size_name(b),
            if base.is_some() { format!(" (× {})", roles.baseline) } else { String::new() }
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
            if !clients.iter().any(|c| rate(w, b, t, *c).is_some()) {
                continue;
            }
            let _ = write!(s, "| {name} |");
            for c in &clients {
                let cell = match (rate(w, b, t, *c), base.and_then(|x| rate(w, b, x, *c))) {
                    (Some(r), Some(x)) if x > 0.0 => format!("{r:.0} ({:.2}×)", r / x),
                    (Some(r), _) => format!("{r:.0}"),
                    (None, _) => "-".into(),
                };
                let _ = write!(s, " {cell} |");
            }
            let _ = writeln!(s);
        }
    }
    if let Some(subj) = names.iter().position(|n| n == roles.subject) {
        targets(&mut s, results, names, subj, roles);
    }
    s
}

/// The ops/s of one cell of the run, if it ran.
fn rate_of(results: &Results, w: Workload, b: usize, t: usize, c: usize) -> Option<f64> {
    results.get(&(w, b, t, c)).map(RunResult::rate)
}

/// The performance targets, judged from this run: against the baseline at every size, the
/// replay multiple, and against the anchor at every size and concurrency.
fn targets(s: &mut String, results: &Results, names: &[String], subj: usize, roles: &Roles<'_>) {
    let base = names.iter().position(|n| n == roles.baseline);
    let anchor = names.iter().position(|n| n == roles.anchor);
    let rate = |w: Workload, b: usize, t: usize, c: usize| rate_of(results, w, b, t, c);
    let sizes = sorted(results.keys().filter(|k| k.0 == Workload::Cycle).map(|k| k.1));
    let clients = sorted(results.keys().map(|k| k.3));
    let (baseline, subject) = (roles.baseline, roles.subject);
    let _ = writeln!(s, "\n**Targets ({subject})**\n");
    let _ = writeln!(s, "| target | figure | verdict |");
    let _ = writeln!(s, "|---|---|---|");
    let (mut met, mut all) = (0, 0);
    let mut row = |s: &mut String, what: String, figure: String, ok: bool| {
        all += 1;
        met += usize::from(ok);
        let _ = writeln!(s, "| {what} | {figure} | {} |", verdict(ok));
    };
    for &b in &sizes {
        let size = size_name(b);
        if let Some(bx) = base {
            for (c, want) in [(1, 1.3), (16, 2.0), (64, 3.0), (256, 3.0)] {
                if let (Some(r), Some(x)) = (rate(Workload::Cycle, b, subj, c), rate(Workload::Cycle, b, bx, c)) {
                    let k = if x > 0.0 { r / x } else { 0.0 };
                    row(
                        s,
                        format!("cycle ops/s at {c} clients, {size} ≥ {want}× {baseline}"),
                        format!("{r:.0} vs {x:.0} = {k:.2}×"),
                        k >= want,
                    );
                }
            }
            if let (Some(r), Some(x)) =
                (results.get(&(Workload::Cycle, b, subj, 1)), results.get(&(Workload::Cycle, b, bx, 1)))
            {
                for (q, want, what) in [(0.5, 0.7, "p50"), (0.99, 0.5, "p99")] {
                    if r.claim.is_empty() || x.claim.is_empty() {
                        continue;
                    }
                    let (a, y) = (r.claim.value_at_quantile(q) as f64, x.claim.value_at_quantile(q) as f64);
                    let k = if y > 0.0 { a / y } else { f64::INFINITY };
                    row(
                        s,
                        format!("1-client claim {what}, {size} ≤ {want}× {baseline}'s"),
                        format!("{:.2} ms vs {:.2} ms = {k:.2}×", a / 1000.0, y / 1000.0),
                        k <= want,
                    );
                }
            }
        }
        if let Some(ax) = anchor {
            for &c in &clients {
                if let (Some(r), Some(x)) = (rate(Workload::Cycle, b, subj, c), rate(Workload::Cycle, b, ax, c)) {
                    let k = if x > 0.0 { r / x } else { 0.0 };
                    row(
                        s,
                        format!("cycle ops/s at {c} clients, {size} > {}", roles.anchor),
                        format!("{r:.0} vs {x:.0} = {k:.2}×"),
                        k > 1.0,
                    );
                }
            }
        }
    }
    if let Some(&b) = sizes.first() {
        for &c in &clients {
            if let (Some(rp), Some(cy)) = (rate(Workload::Replay, b, subj, c), rate(Workload::Cycle, b, subj, c)) {
                let k = if cy > 0.0 { rp / cy } else { 0.0 };
                row(
                    s,
                    format!("replay ops/s ≥ 10× cycle ops/s at {c} clients"),
                    format!("{rp:.0} vs {cy:.0} = {k:.1}×"),
                    k >= 10.0,
                );
            }
        }
    }
    let _ = writeln!(s, "\n{met} of {all} targets met.");
}

/// One chart: its file name, its title (the image's alt text) and its SVG.
pub struct Chart {
    pub file: String,
    pub title: String,
    pub svg: String,
}

/// Throughput against clients for every (workload, size), and claim (cycle) or op (replay)
/// latency percentiles against clients, one line per target.
pub fn charts(results: &Results, names: &[String]) -> Vec<Chart> {
    let cells = sorted(results.keys().map(|k| (k.0, k.1)));
    let mut out = Vec::new();
    let series = |w: Workload, b: usize, f: &dyn Fn(&RunResult) -> f64| -> Vec<Series> {
        names
            .iter()
            .enumerate()
            .map(|(t, name)| Series {
                name: name.clone(),
                points: results
                    .iter()
                    .filter(|(k, _)| k.0 == w && k.1 == b && k.2 == t)
                    .map(|(k, r)| (k.3 as f64, f(r)))
                    .collect(),
            })
            .filter(|se| !se.points.is_empty())
            .collect()
    };
    for (w, b) in cells {
        let tag = format!("{}-{b}", w.name());
        let size = size_name(b);
        let title = format!("{}, {size} bodies: ops/s against clients", w.name());
        out.push(Chart {
            file: format!("{tag}-ops.svg"),
            svg: chart::render(&title, "client tasks", "ops/s", &series(w, b, &|r| r.rate())),
            title,
        });
        // The claim alone where a cycle has one; a replay's op is its claim.
        let (what, hist): (&str, fn(&RunResult) -> &hdrhistogram::Histogram<u64>) =
            if w == Workload::Replay { ("op", |r| &r.op) } else { ("claim", |r| &r.claim) };
        for (q, qn) in [(0.5, "p50"), (0.99, "p99")] {
            let title = format!("{}, {size} bodies: {what} latency {qn} (ms) against clients", w.name());
            let f = |r: &RunResult| {
                let h = hist(r);
                if h.is_empty() {
                    0.0
                } else {
                    h.value_at_quantile(q) as f64 / 1000.0
                }
            };
            out.push(Chart {
                file: format!("{tag}-{what}-{qn}.svg"),
                svg: chart::render(&title, "client tasks", &format!("{what} {qn}, ms"), &series(w, b, &f)),
                title,
            });
        }
    }
    out
}
