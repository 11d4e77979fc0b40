//! SVG line charts of a run's own figures: one value per (target, concurrency), both axes
//! logarithmic, one line per target. Plain SVG text (no crate, no script), so a chart is
//! reproducible from the run that made it and reviewable as a diff.

use std::fmt::Write;

/// One line of a chart: its name and its points (x, y), x ascending.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Distinguishable on white and for the common colour-vision deficiencies (Okabe–Ito, plus
/// grey shades for the rest).
const COLOURS: [&str; 10] =
    ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442", "#777777", "#aaaaaa"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Powers of ten (and 2× and 5× steps when the range is narrow) covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (mut out, narrow) = (Vec::new(), hi / lo < 100.0);
    let mut p = 10f64.powf(lo.log10().floor());
    while p <= hi * 1.0001 {
        for m in if narrow { &[1.0, 2.0, 5.0][..] } else { &[1.0][..] } {
            let v = p * m;
            if v >= lo * 0.9999 && v <= hi * 1.0001 {
                out.push(v);
            }
        }
        p *= 10.0;
    }
    out
}

fn label(v: f64) -> String {
    if v >= 1000.0 {
        let k = v / 1000.0;
        if (k - k.round()).abs() < 1e-9 {
            format!("{k:.0}k")
        } else {
            format!("{k:.1}k")
        }
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// Renders a chart with both axes logarithmic. Points with a value of zero or less (a run
/// that failed, a missing cell) are left out, so a line stops rather than dives.
pub fn render(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let pts = || series.iter().flat_map(|s| s.points.iter()).filter(|(x, y)| *x > 0.0 && *y > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#, W / 2.0, esc(title));
    if x0 > x1 {
        let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">no figures</text>"#, W / 2.0, H / 2.0);
        s.push_str("</svg>\n");
        return s;
    }
    // Round the value range out to whole powers of ten, so the gridlines frame it.
    let (y0, y1) = (10f64.powf(y0.log10().floor()), 10f64.powf(y1.log10().ceil().max(y0.log10().floor() + 1.0)));
    let (x0, x1) = if x1 > x0 { (x0, x1) } else { (x0 / 2.0, x1 * 2.0) };
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |x: f64| LEFT + (x.log10() - x0.log10()) / (x1.log10() - x0.log10()) * pw;
    let py = |y: f64| TOP + ph - (y.log10() - y0.log10()) / (y1.log10() - y0.log10()) * ph;
    for t in ticks(y0, y1) {
        let y = py(t);
        let _ = writeln!(s, r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#dddddd"/>"##, LEFT + pw);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, y + 4.0, label(t));
    }
    let mut xs: Vec<f64> = pts().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for t in xs {
        let x = px(t);
        let _ = writeln!(s, r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#dddddd"/>"##, TOP + ph);
        let _ = writeln!(s, r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, TOP + ph + 16.0, label(t));
    }
    let _ =
        writeln!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#444444"/>"##);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 12.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (i, se) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<(f64, f64)> =
            se.points.iter().filter(|(x, y)| *x > 0.0 && *y > 0.0).map(|&(x, y)| (px(x), py(y))).collect();
        if path.is_empty() {
            continue;
        }
        let points: Vec<String> = path.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ =
            writeln!(s, r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#, points.join(" "));
        for (cx, cy) in &path {
            let _ = writeln!(s, r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="3" fill="{colour}"/>"#);
        }
        let ly = TOP + 10.0 + i as f64 * 18.0;
        let lx = LEFT + pw + 14.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="2"/>"#,
            lx + 18.0
        );
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 24.0, ly + 4.0, esc(&se.name));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_and_a_legend_entry_per_series_and_skips_empty_points() {
        let series = vec![
            Series { name: "a<b".into(), points: vec![(1.0, 300.0), (16.0, 2000.0), (64.0, 0.0)] },
            Series { name: "c".into(), points: vec![(1.0, 500.0), (16.0, 1900.0), (64.0, 3300.0)] },
        ];
        let svg = render("cycle", "clients", "ops/s", &series);
        assert_eq!(svg.matches("<polyline").count(), 2);
        // The zero point is left out: 2 + 3 markers.
        assert_eq!(svg.matches("<circle").count(), 5);
        assert!(svg.contains("a&lt;b"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }

    #[test]
    fn no_figures_is_said_not_drawn() {
        let svg = render("t", "x", "y", &[Series { name: "a".into(), points: vec![(1.0, 0.0)] }]);
        assert!(svg.contains("no figures"));
        assert!(!svg.contains("<polyline"));
    }

    #[test]
    fn ticks_cover_the_range() {
        assert_eq!(ticks(100.0, 10000.0), vec![100.0, 1000.0, 10000.0]);
        assert_eq!(ticks(1.0, 10.0), vec![1.0, 2.0, 5.0, 10.0]);
    }
}
