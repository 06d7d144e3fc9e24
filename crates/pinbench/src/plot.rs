//! `--plot FILE.svg`: bandwidth (GB/s) against transfer size (log2 axis), one panel per direction, one line per
//! method, written as SVG by hand. Both panels share the y scale, so they compare at a glance.

use std::fmt::Write;

use crate::results::{Api, Direction, Method, Report};

/// Canvas and layout, in SVG user units (pixels).
const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 540.0;
const PANEL_WIDTH: f64 = 390.0;
const PANEL_HEIGHT: f64 = 320.0;
const PANEL_TOP: f64 = 80.0;
const PANEL_LEFT: [f64; 2] = [80.0, 570.0];

/// One line of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub label: &'static str,
    /// Stroke colour.
    pub color: &'static str,
    /// Dashed (the raw-driver reference) or solid.
    pub dashed: bool,
    /// (bytes, GB/s) per measured size, ascending.
    pub points: Vec<(usize, f64)>,
}

/// The colour of a method's line (the raw reference is grey).
fn color(method: Method) -> &'static str {
    match method {
        Method::Pageable => "#d62728",
        Method::Staged => "#ff7f0e",
        Method::StagedChunked => "#bcbd22",
        Method::Pinned => "#1f77b4",
        Method::PinnedWriteCombined => "#2ca02c",
        Method::Registered => "#9467bd",
    }
}

/// The lines of one direction's panel: each measured safe method, and the raw driver call on pinned memory.
pub fn series(report: &Report, direction: Direction) -> Vec<Series> {
    let mut lines = Vec::new();
    let mut line = |method: Method, api: Api, label, color, dashed| {
        let points: Vec<(usize, f64)> = report
            .bandwidth
            .iter()
            .filter(|b| b.method == method && b.api == api && b.direction == direction)
            .map(|b| (b.bytes, b.gb_per_s()))
            .collect();
        if !points.is_empty() {
            lines.push(Series {
                label,
                color,
                dashed,
                points,
            });
        }
    };
    for method in Method::MEASURED {
        if method == Method::Pinned {
            line(
                method,
                Api::Raw,
                "raw cuMemcpy*Async (pinned)",
                "#7f7f7f",
                true,
            );
        }
        let label = match method {
            Method::Pageable => "pageable (driver-staged)",
            Method::Staged => "pageable, staged through PinnedPool",
            Method::StagedChunked => "pageable, chunked through PinnedPool at every size",
            Method::Pinned => "pinned",
            Method::PinnedWriteCombined => "pinned write-combined",
            Method::Registered => "registered Vec",
        };
        line(method, Api::Safe, label, color(method), false);
    }
    lines
}

/// Ticks from 0 to at least `max` with a step of 1, 2, 2.5 or 5 times a power of ten, about `target` of them.
pub fn nice_ticks(max: f64, target: usize) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / target.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude);
    let count = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// A tick value as text: no trailing zeros (`10`, `2.5`, `0.25`).
pub fn tick_label(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `4K`, `256K`, `1M`, `1G`: compact size labels for the x axis.
pub fn short_size(bytes: usize) -> String {
    for (unit, scale) in [("G", 1usize << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    format!("{bytes}")
}

/// Maps sizes to x on a log2 scale, `lo`..`hi` bytes onto `x0`..`x1` pixels.
#[derive(Debug, Clone, Copy)]
pub struct LogAxis {
    lo: f64,
    hi: f64,
    x0: f64,
    x1: f64,
}

impl LogAxis {
    /// An axis over `sizes` (a single size gets a range of a factor 4 either side).
    pub fn new(sizes: &[usize], x0: f64, x1: f64) -> LogAxis {
        let logs = sizes.iter().map(|&s| (s.max(1) as f64).log2());
        let lo = logs.clone().fold(f64::INFINITY, f64::min);
        let hi = logs.fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > lo {
            (lo, hi)
        } else if lo.is_finite() {
            (lo - 2.0, lo + 2.0)
        } else {
            (12.0, 30.0)
        };
        LogAxis { lo, hi, x0, x1 }
    }

    /// The x of `bytes`.
    pub fn x(&self, bytes: usize) -> f64 {
        let t = ((bytes.max(1) as f64).log2() - self.lo) / (self.hi - self.lo);
        self.x0 + t * (self.x1 - self.x0)
    }
}

/// `&`, `<`, `>`, `"` as XML entities.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// The whole chart.
pub fn render(report: &Report) -> String {
    let sizes = report.sizes();
    let panels: Vec<(Direction, Vec<Series>)> = Direction::BOTH
        .into_iter()
        .map(|d| (d, series(report, d)))
        .collect();
    let max = panels
        .iter()
        .flat_map(|(_, s)| s.iter().flat_map(|s| s.points.iter().map(|p| p.1)))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ticks = nice_ticks(max, 6);
    let top = ticks.last().copied().unwrap_or(1.0);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let h = &report.header;
    let link = h.pcie.map_or(String::new(), |l| {
        format!(", PCIe gen {} x{}", l.generation, l.width)
    });
    let title = format!(
        "host-GPU bandwidth: {}{link}, CUDA {}{}",
        h.device.name,
        h.cuda_version_text(),
        h.nvidia_driver
            .as_ref()
            .map_or(String::new(), |r| format!(", driver {r}"))
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="30" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
        WIDTH / 2.0,
        xml(&title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="50" text-anchor="middle" fill="#555">pinbench {}, median per copy, event-timed ({} run)</text>"##,
        WIDTH / 2.0,
        env!("CARGO_PKG_VERSION"),
        if report.quick { "quick" } else { "full" }
    );
    for ((direction, lines), left) in panels.iter().zip(PANEL_LEFT) {
        panel(&mut svg, *direction, lines, &sizes, &ticks, top, left);
    }
    legend(&mut svg, &panels[0].1);
    svg.push_str("</svg>\n");
    svg
}

fn panel(
    svg: &mut String,
    direction: Direction,
    lines: &[Series],
    sizes: &[usize],
    ticks: &[f64],
    top: f64,
    left: f64,
) {
    let (right, bottom) = (left + PANEL_WIDTH, PANEL_TOP + PANEL_HEIGHT);
    let axis = LogAxis::new(sizes, left, right);
    let y = |gbps: f64| bottom - gbps / top * PANEL_HEIGHT;
    let title = match direction {
        Direction::Upload => "upload (host to device)",
        Direction::Download => "download (device to host)",
    };
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="14">{title}</text>"#,
        left + PANEL_WIDTH / 2.0,
        PANEL_TOP - 10.0
    );
    for &t in ticks {
        let ty = y(t);
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" y1=\"{ty:.1}\" x2=\"{right}\" y2=\"{ty:.1}\" stroke=\"#e0e0e0\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left - 6.0,
            ty + 4.0,
            tick_label(t)
        );
    }
    for &s in sizes {
        let tx = axis.x(s);
        let _ = writeln!(
            svg,
            "<line x1=\"{tx:.1}\" y1=\"{bottom}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>\n\
             <text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            bottom + 5.0,
            bottom + 19.0,
            short_size(s)
        );
    }
    let _ = writeln!(
        svg,
        "<polyline points=\"{left},{PANEL_TOP} {left},{bottom} {right},{bottom}\" fill=\"none\" stroke=\"#333\"/>"
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">transfer size (bytes, log2 scale)</text>"#,
        left + PANEL_WIDTH / 2.0,
        bottom + 40.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">GB/s</text>"#,
        left - 45.0,
        PANEL_TOP + PANEL_HEIGHT / 2.0,
        left - 45.0,
        PANEL_TOP + PANEL_HEIGHT / 2.0
    );
    for line in lines {
        let points: Vec<String> = line
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|&(b, g)| format!("{:.1},{:.1}", axis.x(b), y(g)))
            .collect();
        let dash = if line.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            points.join(" "),
            line.color
        );
        for p in &points {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                svg,
                r#"<circle cx="{px}" cy="{py}" r="3" fill="{}"/>"#,
                line.color
            );
        }
    }
}

/// Estimated width of `text` at the chart's 12-unit font: enough to keep legend entries apart.
fn text_width(text: &str) -> f64 {
    6.6 * text.chars().count() as f64
}

/// Where each legend entry starts: left to right, wrapping onto a new row before the right margin.
pub fn legend_layout(labels: &[&str]) -> Vec<(f64, f64)> {
    const SWATCH: f64 = 34.0;
    const GAP: f64 = 28.0;
    let (left, right) = (60.0, WIDTH - 40.0);
    let (mut x, mut y) = (left, HEIGHT - 60.0);
    let mut at = Vec::with_capacity(labels.len());
    for label in labels {
        let width = SWATCH + text_width(label);
        if x > left && x + width > right {
            x = left;
            y += 22.0;
        }
        at.push((x, y));
        x += width + GAP;
    }
    at
}

fn legend(svg: &mut String, lines: &[Series]) {
    let labels: Vec<&str> = lines.iter().map(|l| l.label).collect();
    for (line, (x, y)) in lines.iter().zip(legend_layout(&labels)) {
        let dash = if line.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{y}" x2="{:.1}" y2="{y}" stroke="{}" stroke-width="2"{dash}/>"#,
            x + 28.0,
            line.color
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 34.0,
            y + 4.0,
            xml(line.label)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::sample_report;

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(
            nice_ticks(57.3, 6),
            vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
        );
        assert_eq!(
            nice_ticks(12.0, 6),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
        );
        let t = nice_ticks(14.0, 6);
        assert_eq!(t[1], 2.5);
        assert!(*t.last().unwrap() >= 14.0);
        for max in [0.003, 0.9, 7.0, 55.0, 99.9, 100.0, 1234.0] {
            let t = nice_ticks(max, 6);
            assert_eq!(t[0], 0.0);
            assert!(*t.last().unwrap() >= max * (1.0 - 1e-9), "{max}: {t:?}");
            assert!((3..=12).contains(&t.len()), "{max}: {t:?}");
        }
        assert_eq!(nice_ticks(0.0, 6), nice_ticks(1.0, 6));
        assert_eq!(nice_ticks(f64::NAN, 6), nice_ticks(1.0, 6));
    }

    #[test]
    fn tick_labels_drop_trailing_zeros() {
        assert_eq!(tick_label(10.0), "10");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(3.0 * 0.1), "0.3");
    }

    #[test]
    fn sizes_are_spaced_by_their_log() {
        let sizes = [4096, 16384, 65536, 1 << 30];
        let axis = LogAxis::new(&sizes, 100.0, 500.0);
        assert!((axis.x(4096) - 100.0).abs() < 1e-9);
        assert!((axis.x(1 << 30) - 500.0).abs() < 1e-9);
        // Each factor of 4 is the same distance: 2 of the 18 doublings from 4 KiB to 1 GiB.
        let step = axis.x(16384) - axis.x(4096);
        assert!((step - 400.0 * 2.0 / 18.0).abs() < 1e-9);
        assert!((axis.x(65536) - axis.x(16384) - step).abs() < 1e-9);
        let single = LogAxis::new(&[1 << 20], 0.0, 100.0);
        assert!((single.x(1 << 20) - 50.0).abs() < 1e-9);
        assert_eq!(short_size(4096), "4K");
        assert_eq!(short_size(256 << 20), "256M");
        assert_eq!(short_size(1 << 30), "1G");
        assert_eq!(short_size(100), "100");
    }

    #[test]
    fn legend_entries_never_overlap_and_stay_on_the_canvas() {
        let labels = [
            "pageable (driver-staged)",
            "raw cuMemcpy*Async (pinned)",
            "pinned",
            "pinned write-combined",
            "registered Vec",
            "a much longer label for a method added later, such as staged",
        ];
        let at = legend_layout(&labels);
        assert_eq!(at.len(), labels.len());
        for (i, (&(x, y), label)) in at.iter().zip(labels).enumerate() {
            assert!(x >= 0.0 && y < HEIGHT, "{label}");
            let end = x + 34.0 + text_width(label);
            assert!(end <= WIDTH || x == 60.0, "{label} runs off the canvas");
            if let Some(&(nx, ny)) = at.get(i + 1) {
                assert!(ny > y || nx >= end, "{label} overlaps the next entry");
            }
        }
        assert!(at.iter().any(|&(_, y)| y > at[0].1), "the long label wraps");
    }

    #[test]
    fn the_chart_has_axes_ticks_labels_and_a_legend() {
        let report = sample_report();
        let svg = render(&report);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(
            svg.contains("Test GPU &lt;&amp;&gt;"),
            "device name escaped"
        );
        assert!(!svg.contains("<&>"));
        for needle in [
            "upload (host to device)",
            "download (device to host)",
            "transfer size (bytes, log2 scale)",
            "GB/s",
            ">4K<",
            ">1M<",
            ">64M<",
            "pageable (driver-staged)",
            "raw cuMemcpy*Async (pinned)",
            "registered Vec",
            "pageable, staged through PinnedPool",
            "#ff7f0e",
            "stroke-dasharray",
        ] {
            assert!(svg.contains(needle), "missing {needle:?}");
        }
        // Methods without figures get no line and no legend entry.
        assert!(!svg.contains("write-combined"));
        // One line per measured series (pageable, staged, raw pinned, pinned, registered) and a marker per point.
        let lines = series(&report, Direction::Upload).len();
        assert_eq!(lines, 5);
        assert_eq!(svg.matches("<circle").count(), 2 * lines * 3);
        // Every element opened is closed: each tag is self-closing or has its end tag.
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }
}
