//! `report.html`: one page per run that shows what the run did, beside the files it came
//! from. This module owns that page: its layout, and the thinning that keeps it bounded for
//! any length of run.
//!
//! The page is a single file: inline CSS, inline SVG, no script and nothing fetched, so it opens
//! from a CI artifact or a copied run directory with no network. From the top:
//!
//! - the verdict;
//! - latency over time per operation type, with one band per fault;
//! - throughput per second by outcome;
//! - the availability windows;
//! - the faults as they happened;
//! - every key the checkers flagged, with its operations.
//!
//! Every string taken from the run (keys, owners, fault details, the summary) is HTML-escaped.
//! A browser test finds the faults as `rect.nemesis-band` (with `data-kind`, `data-family`,
//! `data-nodes`, `data-outcome`) and the charts as `svg#latency-chart`, `svg#throughput-chart`
//! and `svg#availability-chart`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use crate::availability::Availability;
use crate::history::{Input, Op, OpId, Output};
use crate::invariants::{Anomaly, Verdict};
use crate::linearizability::KeyVerdict;
use crate::nemesis::{Event, Outcome};
use crate::report::Judgement;
use crate::run::FINAL_CLIENT;

/// The most marks one chart draws, whatever the length of the history.
pub const MAX_POINTS: usize = 5000;
/// The most throughput bins: past this many seconds a bin spans several seconds.
const MAX_BINS: u64 = 1000;
/// Flagged keys drawn in full; the rest are only listed.
const MAX_FLAGGED_KEYS: usize = 12;
/// Operations shown per flagged key.
const MAX_KEY_OPS: usize = 200;
/// Reasons shown per flagged key.
const MAX_REASONS: usize = 10;
/// Characters shown of one reason: anomalies quote body digests.
const MAX_REASON_CHARS: usize = 400;
/// Rows of the fault table.
const MAX_FAULT_ROWS: usize = 500;
/// Label rows above the latency chart; a band whose label fits in none keeps its tooltip.
const LABEL_LANES: usize = 4;

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 16.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const NS_PER_MS: f64 = 1e6;
const NS_PER_S: f64 = 1e9;

/// Operation types in legend order, with their colour.
const KINDS: [(&str, &str); 7] = [
    ("claim", "#1f77b4"),
    ("takeover", "#ff7f0e"),
    ("complete", "#2ca02c"),
    ("fail", "#d62728"),
    ("extend", "#9467bd"),
    ("get", "#17becf"),
    ("wait", "#8c564b"),
];

/// What the page is drawn from.
pub struct Page<'a> {
    /// The run's seed.
    pub seed: u64,
    /// The overall answer.
    pub result: Judgement,
    /// The text summary, shown whole at the top.
    pub summary: &'a str,
    /// Every recorded op, final reads included.
    pub history: &'a [Op],
    /// The faults as they happened.
    pub events: &'a [Event],
    /// The windows without a successful write.
    pub availability: &'a Availability,
    /// Harness anomalies and the reasons the run does not count.
    pub problems: Vec<String>,
    /// Anomalies the checkers found (not-linearizable keys included).
    pub anomalies: usize,
    /// The keys the checkers flagged.
    pub flagged: Vec<FlaggedKey>,
}

/// A key the checkers flagged, with why and the operations they named.
#[derive(Clone, Debug, Default)]
pub struct FlaggedKey {
    /// The key.
    pub key: String,
    /// One line per finding.
    pub reasons: Vec<String>,
    /// Operations the findings name, highlighted in the key's timeline.
    pub ops: BTreeSet<OpId>,
}

/// The keys the verdict names: not linearizable, undecided in the budget, or in an anomaly.
pub fn flagged_keys(verdict: &Verdict, history: &[Op]) -> Vec<FlaggedKey> {
    let mut by_key: BTreeMap<String, FlaggedKey> = BTreeMap::new();
    let mut flag = |key: &str, reason: String, ops: &[OpId]| {
        let k =
            by_key.entry(key.to_string()).or_insert_with(|| FlaggedKey { key: key.to_string(), ..Default::default() });
        k.reasons.push(reason);
        k.ops.extend(ops.iter().copied());
    };
    for k in &verdict.linearizability.keys {
        match &k.verdict {
            KeyVerdict::Ok => {}
            KeyVerdict::Unknown => flag(&k.key, "undecided within the checker's budget".into(), &[]),
            KeyVerdict::Illegal(illegal) => {
                let stuck: Vec<OpId> = illegal.stuck.iter().map(|o| o.id).collect();
                let ids: Vec<String> = stuck.iter().map(|i| format!("#{i}")).collect();
                flag(
                    &k.key,
                    format!(
                        "not linearizable: a linearization explains {} ops, then none of {} fits (model state {})",
                        illegal.prefix.len(),
                        ids.join(" "),
                        illegal.state
                    ),
                    &stuck,
                );
            }
        }
    }
    // Only a duplicate token names ops of several keys; the rest carry their key.
    let key_of: HashMap<OpId, &str> = if verdict.anomalies.iter().any(|a| matches!(a, Anomaly::DuplicateToken { .. })) {
        history.iter().map(|o| (o.id, o.key.as_str())).collect()
    } else {
        HashMap::new()
    };
    for a in &verdict.anomalies {
        let reason = format!("{}: {a}", a.kind());
        let (key, ops): (Option<&str>, Vec<OpId>) = match a {
            Anomaly::DuplicateToken { ops, .. } => (None, ops.clone()),
            Anomaly::TokenWentDown { key, earlier, later, .. } => (Some(key), vec![*earlier, *later]),
            Anomaly::StaleTokenAccepted { key, op, fenced_by, .. } => (Some(key), vec![*op, *fenced_by]),
            Anomaly::LostCompletion { key, op, final_read, .. } => (Some(key), vec![*op, *final_read]),
            Anomaly::FinalReadMissing { key, op } => (Some(key), vec![*op]),
            Anomaly::ReplayMismatch { key, op, .. } => (Some(key), vec![*op]),
            Anomaly::EarlyTakeover { key, op, lease_from, .. } => (Some(key), vec![*op, *lease_from]),
            Anomaly::DoubleCharge { key, completion, .. } => (Some(key), vec![*completion]),
            Anomaly::DoubleCompletion { key, ops, .. } => (Some(key), ops.clone()),
        };
        match key {
            Some(key) => flag(key, reason, &ops),
            None => {
                let keys: BTreeSet<&str> = ops.iter().filter_map(|id| key_of.get(id).copied()).collect();
                for key in keys {
                    let mine: Vec<OpId> = ops.iter().copied().filter(|id| key_of.get(id) == Some(&key)).collect();
                    flag(key, reason.clone(), &mine);
                }
            }
        }
    }
    by_key.into_values().collect()
}

/// Escapes text for HTML content and attribute values alike.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Renders the whole page.
pub fn render(page: &Page<'_>) -> String {
    let axis = Axis::of(page.history, page.events);
    let mut out = String::with_capacity(256 * 1024);
    let title = format!("idemraft-jepsen run, seed {}: {:?}", page.seed, page.result);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n",
        esc(&title)
    );
    verdict_section(&mut out, page, &axis);
    latency_section(&mut out, page, &axis);
    throughput_section(&mut out, page, &axis);
    availability_section(&mut out, page, &axis);
    faults_section(&mut out, page);
    flagged_section(&mut out, page);
    out.push_str("</body>\n</html>\n");
    out
}

const CSS: &str = "\
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px 24px;color:#222;background:#fff}\
h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd}\
h3{font-size:15px;margin:18px 0 4px}\
.verdict{padding:10px 14px;border-radius:6px;border-left:8px solid #888;background:#f6f6f6}\
.verdict.valid{border-color:#2ca02c;background:#eef8ee}.verdict.anomalies{border-color:#d62728;background:#fbeeee}\
.verdict.invalid,.verdict.unknown,.verdict.unavailable{border-color:#e6a000;background:#fdf6e6}\
.badge{font-weight:bold}\
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}\
th{background:#f2f2f2}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.facts td:first-child{color:#555}\
tr.flagged td{background:#fff1c9;font-weight:bold}\
tr.breach td{background:#fbeeee}\
pre{background:#f8f8f8;padding:8px;overflow:auto;font-size:12px}\
svg.chart{display:block;width:100%;max-width:1200px;height:auto;background:#fff;border:1px solid #eee}\
svg text{font:11px system-ui,sans-serif;fill:#333}\
svg .grid{stroke:#eee}svg .axis{stroke:#888}\
svg .pts{fill:none;stroke-width:3;stroke-linecap:round}\
svg .line{fill:none;stroke-width:1.5}\
svg .nemesis-band{fill-opacity:.16;stroke-opacity:.5}\
svg .nemesis-shade{fill-opacity:.10}\
svg .availability-window{fill:#4a7bd0}svg .availability-window.judged{fill:#2ca02c}\
svg .availability-window.breach{fill:#d62728}svg .bound{stroke:#d62728;stroke-dasharray:3 2}\
.swatch{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:4px}\
.legend span{margin-right:14px}\
.note{color:#666;font-size:12px}\
code{background:#f2f2f2;padding:0 3px}\
";

/// The run's time line: 0 to the last thing that happened, mapped onto the plot width.
struct Axis {
    end_ns: u64,
}

impl Axis {
    fn of(history: &[Op], events: &[Event]) -> Axis {
        let ops = history.iter().map(|o| o.return_ns.unwrap_or(o.call_ns).max(o.call_ns));
        let faults = events.iter().map(|e| e.end_ns.max(e.start_ns));
        Axis { end_ns: ops.chain(faults).max().unwrap_or(0).max(1) }
    }

    fn x(&self, ns: u64) -> f64 {
        LEFT + (ns.min(self.end_ns) as f64 / self.end_ns as f64) * PLOT_W
    }

    /// Vertical grid and tick labels in seconds, from `top` to `bottom`.
    fn draw(&self, out: &mut String, top: f64, bottom: f64) {
        let end_s = self.end_ns as f64 / NS_PER_S;
        let step = nice_step(end_s / 10.0);
        let mut t = 0.0;
        while t <= end_s + 1e-9 {
            let x = self.x((t * NS_PER_S) as u64);
            let _ = write!(
                out,
                "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{top:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}s</text>",
                bottom + 14.0,
                trim_num(t)
            );
            t += step;
        }
        let _ = write!(
            out,
            "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{bottom:.1}\" x2=\"{:.1}\" y2=\"{bottom:.1}\"/>",
            WIDTH - RIGHT
        );
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let m = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * p
}

fn trim_num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}

fn kind_of(input: &Input) -> usize {
    match input {
        Input::Claim { .. } => 0,
        Input::Takeover { .. } => 1,
        Input::Complete { .. } => 2,
        Input::Fail { .. } => 3,
        Input::Extend { .. } => 4,
        Input::Get => 5,
        Input::Wait => 6,
    }
}

fn family_colour(family: &str) -> &'static str {
    match family {
        "partition" => "#f28e2b",
        "kill" => "#e15759",
        "pause" => "#b07aa1",
        "clock" => "#59a14f",
        "membership" => "#4e79a7",
        _ => "#9c755f",
    }
}

fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Installed => "installed",
        Outcome::Skipped(_) => "skipped",
        Outcome::Indeterminate(_) => "indeterminate",
    }
}

fn nodes_of(e: &Event) -> String {
    e.targets.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")
}

/// The faults that were at least attempted: a skipped one never had an interval.
fn drawn(events: &[Event]) -> impl Iterator<Item = &Event> {
    events.iter().filter(|e| !matches!(e.outcome, Outcome::Skipped(_)))
}

fn band_label(e: &Event) -> String {
    if e.targets.is_empty() {
        e.fault.name().to_string()
    } else {
        let nodes: Vec<String> = e.targets.iter().map(|t| format!("n{t}")).collect();
        format!("{} {}", e.fault.name(), nodes.join(","))
    }
}

fn band_title(e: &Event) -> String {
    let mut t = format!(
        "{} on nodes [{}], {:.1} s to {:.1} s, {}",
        e.fault.name(),
        nodes_of(e),
        e.start_ns as f64 / NS_PER_S,
        e.end_ns as f64 / NS_PER_S,
        outcome_name(&e.outcome)
    );
    if let Outcome::Indeterminate(why) = &e.outcome {
        let _ = write!(t, " ({why})");
    }
    if !e.detail.is_empty() {
        let _ = write!(t, ": {}", e.detail);
    }
    t
}

/// Fault intervals as shaded rectangles. `class` is `nemesis-band` on the latency chart
/// (one element per fault, for tests and readers) and `nemesis-shade` on the others.
fn bands(out: &mut String, axis: &Axis, events: &[Event], class: &str, top: f64, bottom: f64) {
    for e in drawn(events) {
        let x0 = axis.x(e.start_ns);
        let w = (axis.x(e.end_ns.max(e.start_ns)) - x0).max(2.0);
        let _ = writeln!(
            out,
            "<rect class=\"{class}\" data-kind=\"{}\" data-family=\"{}\" data-nodes=\"{}\" data-outcome=\"{}\" \
             x=\"{x0:.1}\" y=\"{top:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{c}\" stroke=\"{c}\">{}</rect>",
            esc(e.fault.name()),
            esc(e.fault.family()),
            nodes_of(e),
            outcome_name(&e.outcome),
            bottom - top,
            // The tooltip once, on the labelled band: the shades repeat it only in position.
            if class == "nemesis-band" { format!("<title>{}</title>", esc(&band_title(e))) } else { String::new() },
            c = family_colour(e.fault.family()),
        );
    }
}

/// Label rows for the bands: each label goes in the first row where it does not overlap the
/// one before it; `None` when no row has room.
fn label_lanes(axis: &Axis, events: &[Event]) -> (Vec<(usize, &'static str, f64, String)>, usize) {
    let mut ends = [f64::MIN; LABEL_LANES];
    let mut placed = Vec::new();
    let mut used = 0;
    let mut order: Vec<&Event> = drawn(events).collect();
    order.sort_by_key(|e| e.start_ns);
    for e in order {
        let label = band_label(e);
        let x = axis.x(e.start_ns) + 2.0;
        // An estimate of the text's width at 11 px: no layout engine here.
        let w = label.chars().count() as f64 * 6.2 + 6.0;
        if let Some(lane) = (0..LABEL_LANES).find(|&l| ends[l] <= x) {
            ends[lane] = x + w;
            used = used.max(lane + 1);
            placed.push((lane, family_colour(e.fault.family()), x, label));
        }
    }
    (placed, used)
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{}s", trim_num(ms / 1000.0))
    } else {
        format!("{}ms", trim_num(ms))
    }
}

/// Keeps at most `cap` points by merging points of one kind that fall in the same cell,
/// doubling the cell until few enough remain: dense regions thin out, outliers stay.
fn thin(points: &[(usize, f64, f64)], cap: usize) -> Vec<(usize, f64, f64)> {
    let mut cell = 1.0;
    loop {
        let mut seen = HashSet::new();
        let kept: Vec<(usize, f64, f64)> = points
            .iter()
            .copied()
            .filter(|&(k, x, y)| seen.insert((k, (x / cell) as i64, (y / cell) as i64)))
            .collect();
        if kept.len() <= cap || cell > WIDTH * 4.0 {
            return kept;
        }
        cell *= 2.0;
    }
}

fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted.get(i.min(sorted.len() - 1)).copied()
}

fn verdict_section(out: &mut String, page: &Page<'_>, axis: &Axis) {
    let (class, meaning) = match page.result {
        Judgement::Valid => ("valid", "a valid run, and no anomaly"),
        Judgement::Anomalies => ("anomalies", "anomalies found"),
        Judgement::Invalid => ("invalid", "the run does not count: it proves nothing either way"),
        Judgement::Unknown => ("unknown", "nothing broke, but the checker could not decide some key in its budget"),
        Judgement::Unavailable => {
            ("unavailable", "no anomaly, but writes stopped for too long during a single-node fault")
        }
    };
    let (mut ok, mut refused, mut unknown) = (0usize, 0usize, 0usize);
    for op in page.history {
        if op.is_unknown() || op.return_ns.is_none() {
            unknown += 1;
        } else if op.is_refused() {
            refused += 1;
        } else {
            ok += 1;
        }
    }
    let mut fired: BTreeMap<&str, usize> = BTreeMap::new();
    for e in page.events {
        *fired.entry(outcome_name(&e.outcome)).or_default() += 1;
    }
    let faults = fired.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ");
    let _ = write!(
        out,
        "<header class=\"verdict {class}\" id=\"verdict\" data-result=\"{class}\">\n\
         <h1>idemraft-jepsen run, seed {}</h1>\n<p>Result: <span class=\"badge\">{:?}</span>: {meaning}.</p>\n\
         <table class=\"facts\">\n",
        page.seed, page.result
    );
    let mut row = |name: &str, value: String| {
        let _ = writeln!(out, "<tr><td>{}</td><td>{}</td></tr>", esc(name), esc(&value));
    };
    row("run length", format!("{:.1} s", axis.end_ns as f64 / NS_PER_S));
    row("operations", format!("{} ({ok} answered, {refused} refused, {unknown} indeterminate)", page.history.len()));
    row("faults", if faults.is_empty() { "none".into() } else { faults });
    row(
        "longest window without a successful write",
        format!(
            "{} ms at {:.1} s (single-node faults held to {} ms)",
            page.availability.longest_ms,
            page.availability.longest_at_ms as f64 / 1000.0,
            page.availability.bound_ms
        ),
    );
    row("anomalies", page.anomalies.to_string());
    row("flagged keys", page.flagged.len().to_string());
    out.push_str("</table>\n");
    if !page.problems.is_empty() {
        out.push_str("<ul class=\"problems\">\n");
        for p in &page.problems {
            let _ = writeln!(out, "<li>{}</li>", esc(p));
        }
        out.push_str("</ul>\n");
    }
    let _ = write!(
        out,
        "<details><summary>Full summary (as printed, and in summary.txt)</summary><pre>{}</pre></details>\n</header>\n",
        esc(page.summary)
    );
}

fn latency_section(out: &mut String, page: &Page<'_>, axis: &Axis) {
    let (labels, lanes) = label_lanes(axis, page.events);
    let lane_h = 14.0;
    let top = 6.0 + lanes as f64 * lane_h;
    let strip = (top + 2.0, top + 16.0);
    let plot_top = top + 24.0;
    let plot_h = 300.0;
    let bottom = plot_top + plot_h;
    let height = bottom + 34.0;

    let mut lat_by_kind: Vec<Vec<u64>> = vec![Vec::new(); KINDS.len()];
    let mut no_answer = [0usize; KINDS.len()];
    for op in page.history {
        let k = kind_of(&op.input);
        match op.return_ns {
            Some(r) if !op.is_unknown() => lat_by_kind[k].push(r.saturating_sub(op.call_ns)),
            _ => no_answer[k] += 1,
        }
    }
    let min = lat_by_kind.iter().flatten().copied().filter(|l| *l > 0).min();
    let max = lat_by_kind.iter().flatten().copied().max();
    let (lo, hi) = match (min, max) {
        (Some(a), Some(b)) => {
            let lo = (a as f64 / NS_PER_MS).log10().floor().max(-2.0);
            let hi = (b as f64 / NS_PER_MS).log10().ceil();
            (lo, if hi > lo { hi } else { lo + 1.0 })
        }
        _ => (0.0, 3.0),
    };
    let y_of = |ns: u64| {
        let ms = (ns as f64 / NS_PER_MS).max(10f64.powf(lo));
        bottom - (ms.log10() - lo) / (hi - lo) * plot_h
    };
    let mut points = Vec::with_capacity(page.history.len());
    for op in page.history {
        let k = kind_of(&op.input);
        let x = axis.x(op.call_ns);
        let y = match op.return_ns {
            Some(r) if !op.is_unknown() => y_of(r.saturating_sub(op.call_ns)),
            _ => (strip.0 + strip.1) / 2.0,
        };
        points.push((k, x, y));
    }
    let kept = thin(&points, MAX_POINTS);

    out.push_str("<section id=\"latency\">\n<h2>Latency over time</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">Each dot is an operation at its call time; its height is its latency, on a log scale. \
         Operations with no answer (indeterminate) sit in the strip at the top. Shaded bands are faults, from \
         install to heal. {} of {} operations are drawn: operations of one type that land on the same spot are \
         drawn once.</p>",
        kept.len(),
        points.len()
    );
    let _ = writeln!(
        out,
        "<svg class=\"chart\" id=\"latency-chart\" data-points=\"{}\" viewBox=\"0 0 {WIDTH} {height:.0}\" \
         width=\"{WIDTH}\" height=\"{height:.0}\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" \
         aria-label=\"latency over time per operation type, with faults\">",
        kept.len()
    );
    bands(out, axis, page.events, "nemesis-band", top, bottom);
    for (lane, colour, x, label) in &labels {
        let _ = writeln!(
            out,
            "<text class=\"band-label\" x=\"{x:.1}\" y=\"{:.1}\" style=\"fill:{colour}\">{}</text>",
            4.0 + *lane as f64 * lane_h + 10.0,
            esc(label)
        );
    }
    axis.draw(out, plot_top, bottom);
    let mut e = lo;
    while e <= hi + 1e-9 {
        let y = bottom - (e - lo) / (hi - lo) * plot_h;
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            fmt_ms(10f64.powf(e))
        );
        e += 1.0;
    }
    let _ = writeln!(
        out,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{plot_top:.1}\" x2=\"{LEFT}\" y2=\"{bottom:.1}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">no answer</text>\
         <line class=\"grid\" x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>",
        LEFT - 6.0,
        strip.1 - 3.0,
        strip.1 + 3.0,
        WIDTH - RIGHT,
        strip.1 + 3.0
    );
    for (k, (name, colour)) in KINDS.iter().enumerate() {
        let mut d = String::new();
        for &(_, x, y) in kept.iter().filter(|p| p.0 == k) {
            let _ = write!(d, "M{x:.0} {y:.0}h0");
        }
        if !d.is_empty() {
            let _ = writeln!(out, "<path class=\"pts\" data-kind=\"{name}\" stroke=\"{colour}\" d=\"{d}\"/>");
        }
    }
    out.push_str("</svg>\n");

    out.push_str(
        "<table class=\"latency-stats\"><tr><th>operation</th><th>answered</th><th>no answer</th>\
         <th>p50</th><th>p99</th><th>max</th></tr>\n",
    );
    for (k, (name, colour)) in KINDS.iter().enumerate() {
        let lat = &mut lat_by_kind[k];
        if lat.is_empty() && no_answer[k] == 0 {
            continue;
        }
        lat.sort_unstable();
        let show =
            |v: Option<u64>| v.map(|ns| format!("{:.1} ms", ns as f64 / NS_PER_MS)).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "<tr><td><span class=\"swatch\" style=\"background:{colour}\"></span>{name}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            lat.len(),
            no_answer[k],
            show(percentile(lat, 0.5)),
            show(percentile(lat, 0.99)),
            show(lat.last().copied())
        );
    }
    out.push_str("</table>\n</section>\n");
}

fn throughput_section(out: &mut String, page: &Page<'_>, axis: &Axis) {
    let end_s = axis.end_ns.div_ceil(1_000_000_000).max(1);
    let bin_s = end_s.div_ceil(MAX_BINS).max(1);
    let bin_ns = bin_s * 1_000_000_000;
    let n = (axis.end_ns / bin_ns + 1) as usize;
    // ok and failed by the time the answer came; indeterminate by when it was asked, as it
    // has no answer.
    let mut counts = vec![[0u64; 3]; n];
    for op in page.history {
        let (slot, at) = match op.return_ns {
            Some(r) if !op.is_unknown() => (if op.is_refused() { 1 } else { 0 }, r),
            _ => (2, op.call_ns),
        };
        if let Some(c) = counts.get_mut((at / bin_ns) as usize) {
            c[slot] += 1;
        }
    }
    let max_rate = counts.iter().flat_map(|c| c.iter()).copied().max().unwrap_or(0) as f64 / bin_s as f64;
    let step = nice_step((max_rate / 4.0).max(1.0));
    let ymax = ((max_rate / step).ceil() * step).max(step);
    let (top, plot_h) = (10.0, 200.0);
    let bottom = top + plot_h;
    let height = bottom + 34.0;
    let series = [("ok", "#2ca02c"), ("failed", "#d62728"), ("indeterminate", "#ff7f0e")];

    out.push_str("<section id=\"throughput\">\n<h2>Throughput</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">Operations per second, in {bin_s} s bins: <b>ok</b> got an answer from the cluster \
         (whatever it said), <b>failed</b> was refused and surely not applied, <b>indeterminate</b> got no \
         answer (counted when it was called).</p>"
    );
    let _ = writeln!(
        out,
        "<svg class=\"chart\" id=\"throughput-chart\" viewBox=\"0 0 {WIDTH} {height:.0}\" width=\"{WIDTH}\" \
         height=\"{height:.0}\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"throughput per second by outcome\">"
    );
    bands(out, axis, page.events, "nemesis-shade", top, bottom);
    axis.draw(out, top, bottom);
    let mut v = 0.0;
    while v <= ymax + 1e-9 {
        let y = bottom - v / ymax * plot_h;
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}/s</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            trim_num(v)
        );
        v += step;
    }
    let _ = writeln!(out, "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{top:.1}\" x2=\"{LEFT}\" y2=\"{bottom:.1}\"/>");
    for (s, (name, colour)) in series.iter().enumerate() {
        let mut pts = String::new();
        for (i, c) in counts.iter().enumerate() {
            let x = axis.x(i as u64 * bin_ns + bin_ns / 2);
            let y = bottom - (c[s] as f64 / bin_s as f64) / ymax * plot_h;
            let _ = write!(pts, "{x:.1},{y:.1} ");
        }
        let _ = writeln!(
            out,
            "<polyline class=\"line\" data-series=\"{name}\" stroke=\"{colour}\" points=\"{}\"/>",
            pts.trim_end()
        );
    }
    out.push_str("</svg>\n<p class=\"legend\">");
    for (s, (name, colour)) in series.iter().enumerate() {
        let total: u64 = counts.iter().map(|c| c[s]).sum();
        let _ =
            write!(out, "<span><span class=\"swatch\" style=\"background:{colour}\"></span>{name} ({total})</span>");
    }
    out.push_str("</p>\n</section>\n");
}

fn availability_section(out: &mut String, page: &Page<'_>, axis: &Axis) {
    let a = page.availability;
    struct Row {
        label: String,
        kind: String,
        at_ms: u64,
        len_ms: u64,
        class: &'static str,
    }
    let mut rows = vec![Row {
        label: format!("whole run: {} ms", a.longest_ms),
        kind: "all".into(),
        at_ms: a.longest_at_ms,
        len_ms: a.longest_ms,
        class: "availability-window",
    }];
    for k in &a.per_kind {
        rows.push(Row {
            label: format!(
                "{}: {} ms{}",
                k.kind,
                k.longest_ms,
                if k.judged { format!(" (bound {} ms)", a.bound_ms) } else { String::new() }
            ),
            kind: k.kind.clone(),
            at_ms: k.at_ms,
            len_ms: k.longest_ms,
            class: if k.judged { "availability-window judged" } else { "availability-window" },
        });
    }
    for b in &a.breaches {
        rows.push(Row {
            label: format!("over the bound: {} ms during {}", b.window_ms, b.during),
            kind: "breach".into(),
            at_ms: b.at_ms,
            len_ms: b.window_ms,
            class: "availability-window breach",
        });
    }
    let row_h = 20.0;
    let top = 8.0;
    let bottom = top + rows.len() as f64 * row_h + 4.0;
    let height = bottom + 34.0;

    out.push_str("<section id=\"availability\">\n<h2>Availability windows</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">The longest stretch without a successful write, for the whole run and for each fault \
         kind it overlapped (counted from the fault's start), over the faults' shading. Green kinds take out a \
         single node and are held to {} ms (dashed red mark) while they are the only fault on that node; a \
         green window past the mark overlapped another fault and is reported only. Red rows went over the \
         bound and fail the run.</p>",
        a.bound_ms
    );
    let _ = writeln!(
        out,
        "<svg class=\"chart\" id=\"availability-chart\" viewBox=\"0 0 {WIDTH} {height:.0}\" width=\"{WIDTH}\" \
         height=\"{height:.0}\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"availability windows\">"
    );
    bands(out, axis, page.events, "nemesis-shade", top, bottom);
    axis.draw(out, top, bottom);
    for (i, r) in rows.iter().enumerate() {
        let y = top + i as f64 * row_h + 3.0;
        let from = r.at_ms.saturating_mul(1_000_000);
        let x0 = axis.x(from);
        let x1 = axis.x(from.saturating_add(r.len_ms.saturating_mul(1_000_000)));
        let w = (x1 - x0).max(2.0);
        let _ = write!(
            out,
            "<rect class=\"{}\" data-kind=\"{}\" data-ms=\"{}\" x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{:.1}\">\
             <title>{}</title></rect>",
            r.class,
            esc(&r.kind),
            r.len_ms,
            row_h - 6.0,
            esc(&format!("{} from {:.1} s", r.label, r.at_ms as f64 / 1000.0))
        );
        if r.class.contains("judged") {
            let xb = axis.x(from.saturating_add(a.bound_ms.saturating_mul(1_000_000)));
            let _ = write!(
                out,
                "<line class=\"bound\" x1=\"{xb:.1}\" y1=\"{:.1}\" x2=\"{xb:.1}\" y2=\"{:.1}\"/>",
                y - 2.0,
                y + row_h - 4.0
            );
        }
        // Labels go right of the bar, or left of it near the right edge.
        let (tx, anchor) = if x0 + w + 8.0 > WIDTH - 300.0 { (x0 - 4.0, "end") } else { (x0 + w + 4.0, "start") };
        let _ = writeln!(
            out,
            "<text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>",
            y + row_h - 9.0,
            esc(&r.label)
        );
    }
    out.push_str("</svg>\n");
    let _ = writeln!(
        out,
        "<table class=\"availability-table\"><tr><th>window during</th><th>longest, ms</th><th>from, s</th>\
         <th>faults</th><th>held to the bound</th></tr>\n\
         <tr><td>whole run</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td><td>-</td></tr>",
        a.longest_ms,
        a.longest_at_ms as f64 / 1000.0,
        page.events.len()
    );
    for k in &a.per_kind {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&k.kind),
            k.longest_ms,
            k.at_ms as f64 / 1000.0,
            k.faults,
            if k.judged { format!("yes, {} ms", a.bound_ms) } else { "no, reported only".into() }
        );
    }
    for b in &a.breaches {
        let _ = writeln!(
            out,
            "<tr class=\"breach\"><td>over the bound: {}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td></td>\
             <td>fails the run</td></tr>",
            esc(&b.during),
            b.window_ms,
            b.at_ms as f64 / 1000.0
        );
    }
    let _ = writeln!(out, "</table>\n<p class=\"note\">{} successful writes counted.</p>\n</section>", a.writes);
}

fn faults_section(out: &mut String, page: &Page<'_>) {
    out.push_str("<section id=\"faults\">\n<h2>Faults</h2>\n");
    if page.events.is_empty() {
        out.push_str("<p>No fault was injected.</p>\n</section>\n");
        return;
    }
    out.push_str(
        "<table class=\"fault-table\"><tr><th>#</th><th>fault</th><th>nodes</th><th>from, s</th><th>to, s</th>\
         <th>outcome</th><th>detail</th></tr>\n",
    );
    for (i, e) in page.events.iter().take(MAX_FAULT_ROWS).enumerate() {
        let why = match &e.outcome {
            Outcome::Installed => String::new(),
            Outcome::Skipped(w) | Outcome::Indeterminate(w) => format!(" ({w})"),
        };
        let _ = writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td><td>{}</td>\
             <td class=\"n\">{:.2}</td><td class=\"n\">{:.2}</td><td>{}{}</td><td>{}</td></tr>",
            i + 1,
            family_colour(e.fault.family()),
            esc(e.fault.name()),
            nodes_of(e),
            e.start_ns as f64 / NS_PER_S,
            e.end_ns as f64 / NS_PER_S,
            outcome_name(&e.outcome),
            esc(&why),
            esc(&e.detail)
        );
    }
    out.push_str("</table>\n");
    if page.events.len() > MAX_FAULT_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"note\">... and {} more faults: see nemesis.json.</p>",
            page.events.len() - MAX_FAULT_ROWS
        );
    }
    out.push_str("</section>\n");
}

fn short(s: &str) -> String {
    if s.chars().count() > 48 {
        let head: String = s.chars().take(45).collect();
        format!("{head}...")
    } else {
        s.to_string()
    }
}

fn input_text(input: &Input) -> String {
    match input {
        Input::Claim { owner, fingerprint, allow_takeover, lease_ms } => format!(
            "claim owner {owner} fp {fingerprint} lease {lease_ms} ms{}",
            if *allow_takeover { ", takeover allowed" } else { "" }
        ),
        Input::Complete { token, value } => format!("complete token {token} {}", short(value)),
        Input::Fail { token, retryable: true, .. } => format!("fail token {token}, retryable"),
        Input::Fail { token, retryable: false, value } => {
            format!("fail token {token}, terminal {}", short(value.as_deref().unwrap_or("")))
        }
        Input::Extend { token, lease_ms } => format!("extend token {token} lease {lease_ms} ms"),
        Input::Takeover { owner, force } => format!("takeover owner {owner}{}", if *force { ", forced" } else { "" }),
        Input::Get => "get".into(),
        Input::Wait => "wait".into(),
    }
}

fn output_text(output: &Output) -> String {
    match output {
        Output::Unknown => "indeterminate".into(),
        Output::Refused { reason } => format!("refused: {reason}"),
        Output::Acquired { token, attempt, takeover } => {
            format!("acquired token {token} attempt {attempt}{}", if *takeover { " (takeover)" } else { "" })
        }
        Output::Replay { token, value } => format!("replay token {token} {}", short(value)),
        Output::InProgress => "in progress".into(),
        Output::Mismatch => "fingerprint mismatch".into(),
        Output::StaleToken { current } => format!("stale token (current {current})"),
        Output::NotFound => "not found".into(),
        Output::WrongState { state } => format!("wrong state {state:?}"),
        Output::Completed { token } => format!("completed token {token}"),
        Output::Failed { token, retryable } => {
            format!("failed token {token}, {}", if *retryable { "retryable" } else { "terminal" })
        }
        Output::LeaseExtended { token } => format!("lease extended, token {token}"),
        Output::Record { view: None } => "no record".into(),
        Output::Record { view: Some(v) } => format!(
            "record {:?} token {} owner {}{}",
            v.state,
            v.token,
            v.owner,
            v.value.as_deref().map(|x| format!(" {}", short(x))).unwrap_or_default()
        ),
    }
}

fn process_name(client: u32) -> String {
    match client {
        FINAL_CLIENT => "final read".into(),
        c if c == FINAL_CLIENT + 1 => "final replay".into(),
        c => format!("c{c}"),
    }
}

/// The ops of a key to show: all of them, or, past the cap, the neighbourhood of every
/// flagged op first and then the earliest.
fn shown_ops<'a>(ops: &[&'a Op], flagged: &BTreeSet<OpId>) -> Vec<&'a Op> {
    if ops.len() <= MAX_KEY_OPS {
        return ops.to_vec();
    }
    let mut keep = BTreeSet::new();
    let near = ops.iter().enumerate().filter(|(_, op)| flagged.contains(&op.id)).map(|(i, _)| i);
    let earliest = 0..ops.len();
    for i in near.flat_map(|i| i.saturating_sub(10)..(i + 11).min(ops.len())).chain(earliest) {
        if keep.len() >= MAX_KEY_OPS {
            break;
        }
        keep.insert(i);
    }
    keep.into_iter().filter_map(|i| ops.get(i).copied()).collect()
}

fn flagged_section(out: &mut String, page: &Page<'_>) {
    let _ = writeln!(out, "<section id=\"flagged-keys\">\n<h2>Flagged keys ({})</h2>", page.flagged.len());
    if page.flagged.is_empty() {
        out.push_str("<p>No key was flagged by the checkers.</p>\n</section>\n");
        return;
    }
    let wanted: HashSet<&str> = page.flagged.iter().take(MAX_FLAGGED_KEYS).map(|f| f.key.as_str()).collect();
    let mut by_key: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in page.history {
        if wanted.contains(op.key.as_str()) {
            by_key.entry(op.key.as_str()).or_default().push(op);
        }
    }
    for f in page.flagged.iter().take(MAX_FLAGGED_KEYS) {
        let ops = by_key.get(f.key.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        key_timeline(out, f, ops);
    }
    if page.flagged.len() > MAX_FLAGGED_KEYS {
        out.push_str("<p>Also flagged (not drawn):</p>\n<ul>\n");
        for f in page.flagged.iter().skip(MAX_FLAGGED_KEYS) {
            let _ =
                writeln!(out, "<li><code>{}</code>: {}</li>", esc(&f.key), esc(f.reasons.first().map_or("", |r| r)));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</section>\n");
}

fn key_timeline(out: &mut String, f: &FlaggedKey, ops: &[&Op]) {
    let _ = writeln!(
        out,
        "<div class=\"key-timeline\" data-key=\"{}\">\n<h3>key <code>{}</code></h3>\n<ul>",
        esc(&f.key),
        esc(&f.key)
    );
    for r in f.reasons.iter().take(MAX_REASONS) {
        let r = if r.chars().count() > MAX_REASON_CHARS {
            r.chars().take(MAX_REASON_CHARS - 3).collect::<String>() + "..."
        } else {
            r.clone()
        };
        let _ = writeln!(out, "<li>{}</li>", esc(&r));
    }
    if f.reasons.len() > MAX_REASONS {
        let _ = writeln!(out, "<li>... and {} more</li>", f.reasons.len() - MAX_REASONS);
    }
    out.push_str("</ul>\n");
    let shown = shown_ops(ops, &f.ops);
    if shown.is_empty() {
        out.push_str("<p>The history has no operation on this key.</p>\n</div>\n");
        return;
    }
    // The final reads come after the workload drained, often many seconds later: scaled in,
    // they would squeeze the key's real history into a corner, so they sit at the right edge.
    let workload: Vec<&Op> = shown.iter().copied().filter(|o| o.client < FINAL_CLIENT).collect();
    let pinned = !workload.is_empty() && workload.len() < shown.len();
    let scaled = if workload.is_empty() { &shown } else { &workload };
    let from = scaled.iter().map(|o| o.call_ns).min().unwrap_or(0);
    let last = scaled.iter().map(|o| o.return_ns.unwrap_or(o.call_ns).max(o.call_ns)).max().unwrap_or(from);
    let span = (last - from).max(1_000_000);
    let to = last + span / 20;
    let x = |ns: u64| LEFT + ((ns.clamp(from, to) - from) as f64 / (to - from) as f64) * PLOT_W;
    let clients: BTreeSet<u32> = shown.iter().map(|o| o.client).collect();
    let row: HashMap<u32, usize> = clients.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let row_h = 16.0;
    let top = 4.0;
    let bottom = top + clients.len() as f64 * row_h + 2.0;
    let height = bottom + 34.0;
    let _ = writeln!(
        out,
        "<svg class=\"chart key-lane\" viewBox=\"0 0 {WIDTH} {height:.0}\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"operations on one key, one row per process\">"
    );
    let step = nice_step((to - from) as f64 / NS_PER_S / 8.0);
    let mut t = (from as f64 / NS_PER_S / step).ceil() * step;
    while t * NS_PER_S <= to as f64 {
        let xt = x((t * NS_PER_S) as u64);
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{xt:.1}\" y1=\"{top}\" x2=\"{xt:.1}\" y2=\"{bottom:.1}\"/>\
             <text x=\"{xt:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}s</text>",
            bottom + 14.0,
            trim_num(t)
        );
        t += step;
    }
    for c in &clients {
        let y = top + row.get(c).copied().unwrap_or(0) as f64 * row_h;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            y + 11.0,
            esc(&process_name(*c))
        );
    }
    for op in &shown {
        let y = top + row.get(&op.client).copied().unwrap_or(0) as f64 * row_h + 2.0;
        let (x1, colour, dash) = match op.return_ns {
            Some(r) if !op.is_unknown() => (x(r), if op.is_refused() { "#999" } else { "#2ca02c" }, ""),
            _ => (x(to), "#ff7f0e", " stroke-dasharray=\"4 2\""),
        };
        let (x0, x1) = if pinned && op.client >= FINAL_CLIENT {
            (LEFT + PLOT_W - 8.0, LEFT + PLOT_W - 2.0)
        } else {
            (x(op.call_ns), x1)
        };
        let flagged = f.ops.contains(&op.id);
        let stroke =
            if flagged { "stroke=\"#000\" stroke-width=\"2\"".to_string() } else { format!("stroke=\"{colour}\"") };
        let _ = writeln!(
            out,
            "<rect class=\"op{}\" data-op=\"{}\" x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" \
             fill=\"{colour}\" fill-opacity=\"0.55\" {stroke}{dash}><title>{}</title></rect>",
            if flagged { " flagged" } else { "" },
            op.id,
            (x1 - x0).max(2.0),
            row_h - 4.0,
            esc(&format!(
                "#{} {} {}: {}",
                op.id,
                process_name(op.client),
                KINDS[kind_of(&op.input)].0,
                short(&output_text(&op.output))
            ))
        );
    }
    out.push_str("</svg>\n");
    if pinned {
        out.push_str(
            "<p class=\"note\">Final reads and replays, made after the workload stopped, are drawn at the right \
             edge; the table has their times.</p>\n",
        );
    }
    if shown.len() < ops.len() {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} of {} operations on this key shown (those around the flagged ones first): \
             history.jsonl has them all.</p>",
            shown.len(),
            ops.len()
        );
    }
    out.push_str(
        "<table class=\"key-ops\"><tr><th>op</th><th>process</th><th>node</th><th>request</th><th>start, s</th>\
         <th>end, s</th><th>latency, ms</th><th>outcome</th></tr>\n",
    );
    for op in &shown {
        let end = op.return_ns.filter(|_| !op.is_unknown());
        let _ = writeln!(
            out,
            "<tr{}><td class=\"n\">#{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{:.3}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            if f.ops.contains(&op.id) { " class=\"flagged\"" } else { "" },
            op.id,
            esc(&process_name(op.client)),
            op.node.map(|n| format!("n{n}")).unwrap_or_default(),
            esc(&input_text(&op.input)),
            op.call_ns as f64 / NS_PER_S,
            end.map(|r| format!("{:.3}", r as f64 / NS_PER_S)).unwrap_or_else(|| "never".into()),
            end.map(|r| format!("{:.1}", r.saturating_sub(op.call_ns) as f64 / NS_PER_MS)).unwrap_or_default(),
            esc(&output_text(&op.output))
        );
    }
    out.push_str("</table>\n</div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::availability::availability;
    use crate::invariants::{check_all, CheckOptions};
    use crate::ledger::LedgerSnapshot;
    use crate::nemesis::Fault;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    /// `n` ops over `secs` seconds, cycling through every operation type and outcome.
    fn synthetic(n: u64, secs: u64, key: impl Fn(u64) -> String) -> Vec<Op> {
        let step = secs * 1000 * MS / n.max(1);
        (0..n)
            .map(|i| {
                let call_ns = i * step;
                let (input, output) = match i % 7 {
                    0 => (
                        Input::Claim { owner: format!("o{i}"), fingerprint: 0, allow_takeover: true, lease_ms: 1500 },
                        Output::Acquired { token: i + 1, attempt: 1, takeover: false },
                    ),
                    1 => (Input::Complete { token: i, value: "12B sha256:ab".into() }, Output::Completed { token: i }),
                    2 => (Input::Get, Output::Record { view: None }),
                    3 => (Input::Wait, Output::Unknown),
                    4 => (Input::Extend { token: i, lease_ms: 1500 }, Output::StaleToken { current: i + 9 }),
                    5 => (Input::Takeover { owner: format!("t{i}"), force: false }, Output::InProgress),
                    _ => (
                        Input::Fail { token: i, retryable: true, value: None },
                        Output::Refused { reason: "too big".into() },
                    ),
                };
                let return_ns = (!matches!(output, Output::Unknown)).then_some(call_ns + (1 + i % 997) * MS / 3);
                Op {
                    id: i,
                    client: (i % 10) as u32,
                    node: Some(1 + i % 3),
                    key: key(i),
                    call_ns,
                    return_ns,
                    input,
                    output,
                }
            })
            .collect()
    }

    fn event(fault: Fault, targets: &[u64], from_ms: u64, to_ms: u64) -> Event {
        Event {
            fault,
            targets: targets.to_vec(),
            detail: "cut <links> & \"more\"".into(),
            start_ns: from_ms * MS,
            end_ns: to_ms * MS,
            outcome: Outcome::Installed,
        }
    }

    fn page<'a>(history: &'a [Op], events: &'a [Event], a: &'a Availability, flagged: Vec<FlaggedKey>) -> Page<'a> {
        Page {
            seed: 7,
            result: Judgement::Valid,
            summary: "result: Valid <ok>",
            history,
            events,
            availability: a,
            problems: Vec::new(),
            anomalies: 0,
            flagged,
        }
    }

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    #[test]
    fn one_band_per_fault_with_its_kind_and_node() {
        let history = synthetic(2000, 20, |i| format!("k{}", i % 12));
        let events = [event(Fault::PartitionLeader, &[2], 4000, 7000), event(Fault::KillOne, &[3], 11_000, 14_000)];
        let a = availability(&history, &events, Duration::from_millis(2600));
        let html = render(&page(&history, &events, &a, Vec::new()));
        assert_eq!(count(&html, "<rect class=\"nemesis-band\""), 2, "{html}");
        assert_eq!(
            count(
                &html,
                "class=\"nemesis-band\" data-kind=\"partition-leader\" data-family=\"partition\" data-nodes=\"2\""
            ),
            1
        );
        assert_eq!(
            count(&html, "class=\"nemesis-band\" data-kind=\"kill-one\" data-family=\"kill\" data-nodes=\"3\""),
            1
        );
        assert!(html.contains(">partition-leader n2</text>"), "the band is labelled with its kind and node");
        assert!(html.contains(">kill-one n3</text>"));
        for id in ["latency-chart", "throughput-chart", "availability-chart"] {
            assert_eq!(count(&html, &format!("<svg class=\"chart\" id=\"{id}\"")), 1, "{id}");
        }
        // Event details are escaped, and no script of any kind is shipped.
        assert!(html.contains("cut &lt;links&gt; &amp; &quot;more&quot;"));
        assert!(!html.contains("<script"));
        for fetch in ["src=", "href=", "url(", "@import"] {
            assert!(!html.contains(fetch), "the page fetches nothing: {fetch}");
        }
    }

    #[test]
    fn a_skipped_fault_draws_no_band() {
        let history = synthetic(100, 5, |_| "k".into());
        let mut skipped = event(Fault::Membership, &[], 1000, 1000);
        skipped.outcome = Outcome::Skipped("no spare slot".into());
        let events = [skipped];
        let a = availability(&history, &events, Duration::from_millis(2600));
        let html = render(&page(&history, &events, &a, Vec::new()));
        assert_eq!(count(&html, "<rect class=\"nemesis-band\""), 0);
        assert!(html.contains("skipped (no spare slot)"), "it is still listed");
    }

    #[test]
    fn key_names_are_escaped_everywhere() {
        let evil = "<script>alert('x')</script>";
        let history = synthetic(300, 5, |i| if i % 2 == 0 { evil.to_string() } else { "plain".into() });
        let events = [event(Fault::PauseOne, &[1], 1000, 2000)];
        let a = availability(&history, &events, Duration::from_millis(2600));
        let flagged = vec![FlaggedKey {
            key: evil.into(),
            reasons: vec![format!("lost_completion: key {evil}: gone")],
            ops: [0, 2].into_iter().collect(),
        }];
        let html = render(&page(&history, &events, &a, flagged));
        assert!(!html.contains("<script"), "a key must never become markup");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
        assert!(html.contains("<div class=\"key-timeline\" data-key=\"&lt;script&gt;"));
        assert!(html.contains("<tr class=\"flagged\"><td class=\"n\">#2</td>"), "flagged ops are marked");
        assert!(html.contains("result: Valid &lt;ok&gt;"), "the summary is escaped too");
    }

    #[test]
    fn a_long_history_stays_bounded() {
        let history = synthetic(200_000, 1800, |i| format!("k{}", i / 50));
        let mut events = Vec::new();
        for r in 0..300u64 {
            let f = [Fault::PartitionMajority, Fault::KillLeader, Fault::PauseOne, Fault::Clock][(r % 4) as usize];
            events.push(event(f, &[1 + r % 3], r * 6000, r * 6000 + 3000));
        }
        let a = availability(&history, &events, Duration::from_millis(2600));
        let flagged: Vec<FlaggedKey> = (0..40)
            .map(|k| FlaggedKey {
                key: format!("k{k}"),
                reasons: vec!["x".into()],
                ops: [k * 50].into_iter().collect(),
            })
            .collect();
        let html = render(&page(&history, &events, &a, flagged));
        let points: usize = html
            .split("data-points=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(usize::MAX);
        assert!(points <= MAX_POINTS, "{points} points");
        assert!(points > 500, "thinning kept the picture ({points} points)");
        assert_eq!(count(&html, "<rect class=\"nemesis-band\""), 300);
        println!("{} bytes for 200k ops", html.len());
        assert!(html.len() < 1_500_000, "{} bytes for 200k ops", html.len());
    }

    #[test]
    fn many_flagged_keys_with_long_histories_stay_bounded() {
        // 30 keys of 2000 ops each, every op flagged, with long reasons: the worst the
        // flagged-keys section can be asked to draw.
        let history = synthetic(60_000, 600, |i| format!("key-{}", i % 30));
        let events = [event(Fault::KillOne, &[1], 1000, 4000)];
        let a = availability(&history, &events, Duration::from_millis(2600));
        let flagged: Vec<FlaggedKey> = (0..30)
            .map(|k| FlaggedKey {
                key: format!("key-{k}"),
                reasons: vec!["r".repeat(5000); 50],
                ops: history.iter().filter(|o| o.key == format!("key-{k}")).map(|o| o.id).collect(),
            })
            .collect();
        let html = render(&page(&history, &events, &a, flagged));
        assert_eq!(count(&html, "<div class=\"key-timeline\""), MAX_FLAGGED_KEYS);
        assert_eq!(count(&html, "<tr class=\"flagged\">"), MAX_FLAGGED_KEYS * MAX_KEY_OPS);
        assert!(html.contains("Also flagged (not drawn)"));
        assert!(html.len() < 1_500_000, "{} bytes", html.len());
    }

    #[test]
    fn flagged_keys_come_from_the_verdict() {
        // One token granted on two keys: both keys are flagged, each with its own op.
        let grant = |id: u64, key: &str| Op {
            id,
            client: id as u32,
            node: None,
            key: key.into(),
            call_ns: id * 10 * MS,
            return_ns: Some(id * 10 * MS + MS),
            input: Input::Claim { owner: format!("o{id}"), fingerprint: 0, allow_takeover: false, lease_ms: 1500 },
            output: Output::Acquired { token: 5, attempt: 1, takeover: false },
        };
        let history = vec![grant(0, "a"), grant(1, "b")];
        let verdict = check_all(&history, &[], &LedgerSnapshot::default(), &CheckOptions::default());
        let flagged = flagged_keys(&verdict, &history);
        let a = flagged.iter().find(|f| f.key == "a").expect("key a flagged");
        let b = flagged.iter().find(|f| f.key == "b").expect("key b flagged");
        assert!(a.reasons.iter().any(|r| r.starts_with("duplicate_token")), "{:?}", a.reasons);
        assert!(a.ops.contains(&0) && !a.ops.contains(&1));
        assert!(b.ops.contains(&1));
    }

    #[test]
    fn thinning_keeps_outliers_and_respects_the_cap() {
        let mut pts: Vec<(usize, f64, f64)> = (0..100_000).map(|i| (0, (i % 1000) as f64, 100.0)).collect();
        pts.push((0, 500.0, 5.0));
        let kept = thin(&pts, 800);
        assert!(kept.len() <= 800);
        assert!(kept.iter().any(|p| p.2 == 5.0), "the lone slow op survives");
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(trim_num(2.50), "2.5");
    }
}
