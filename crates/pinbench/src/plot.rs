//! `--plot FILE.svg`: bandwidth (GB/s) against transfer size (log2 axis), one panel per direction, one line per
//! method, drawn with plotters' SVG backend. Both panels share the y scale, so they compare at a glance.

use std::ops::Range;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::Outcome;
use crate::results::{Api, Direction, Method, Report};

/// Canvas size, in pixels.
const SIZE: (u32, u32) = (1000, 600);
/// Height of the strip under the panels that holds the legend: two columns of four rows.
const LEGEND_HEIGHT: u32 = 110;
const FONT: &str = "sans-serif";
/// Text sizes as plotters takes them (its SVG output writes them smaller by a factor of 1.24): 16, 12 and 14
/// pixels for the title, the subtitle and the panels' captions, 11 for the rest.
const TITLE: f64 = 20.0;
const SUBTITLE: f64 = 15.0;
const CAPTION: f64 = 17.0;
const TEXT: f64 = 14.0;
/// The raw driver call's line: grey and dashed, a reference rather than a method.
const RAW: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);
/// The subtitle's colour.
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// One line of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub label: &'static str,
    /// Stroke colour.
    pub color: RGBColor,
    /// Dashed (the raw-driver reference) or solid.
    pub dashed: bool,
    /// (bytes, GB/s) per measured size, ascending.
    pub points: Vec<(usize, f64)>,
}

/// The colour of a method's line.
fn color(method: Method) -> RGBColor {
    match method {
        Method::Pageable => RGBColor(0xd6, 0x27, 0x28),
        Method::Staged => RGBColor(0xff, 0x7f, 0x0e),
        Method::StagedChunked => RGBColor(0xbc, 0xbd, 0x22),
        Method::Pinned => RGBColor(0x1f, 0x77, 0xb4),
        Method::PinnedWriteCombined => RGBColor(0x2c, 0xa0, 0x2c),
        Method::Registered => RGBColor(0x94, 0x67, 0xbd),
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
            line(method, Api::Raw, "raw cuMemcpy*Async (pinned)", RAW, true);
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

/// `4K`, `256K`, `1M`, `1G`: compact size labels for the x axis.
pub fn short_size(bytes: usize) -> String {
    for (unit, scale) in [("G", 1usize << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    format!("{bytes}")
}

/// A tick value as text: no trailing zeros (`10`, `2.5`).
fn tick_label(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The x coordinate of a size, its log2: the sizes measured are powers of four, so they are spaced evenly and
/// their log2 is whole.
fn log2(bytes: usize) -> i32 {
    bytes.max(1).ilog2() as i32
}

/// The x range over the sizes' log2, ascending (a single size gets a factor of 4 either side).
fn x_range(sizes: &[i32]) -> Range<i32> {
    match (sizes.first(), sizes.last()) {
        (Some(&lo), Some(&hi)) if hi > lo => lo..hi,
        (Some(&x), _) => x - 2..x + 2,
        _ => 12..30,
    }
}

/// The whole chart, as an SVG document.
pub fn render(report: &Report) -> Outcome<String> {
    let panels: Vec<(Direction, Vec<Series>)> = Direction::BOTH
        .into_iter()
        .map(|d| (d, series(report, d)))
        .collect();
    let max = panels
        .iter()
        .flat_map(|(_, lines)| lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    // A little room above the fastest point, so its marker is not cut by the frame.
    let top = if max > 0.0 { max * 1.05 } else { 1.0 };
    let sizes: Vec<i32> = report.sizes().into_iter().map(log2).collect();

    let h = &report.header;
    let link = h.pcie.map_or(String::new(), |l| {
        format!(", PCIe gen {} x{}", l.generation, l.width)
    });
    let driver = h
        .nvidia_driver
        .as_ref()
        .map_or(String::new(), |r| format!(", driver {r}"));
    let title = format!(
        "host-GPU bandwidth: {}{link}, CUDA {}{driver}",
        h.device.name,
        h.cuda_version_text(),
    );
    let subtitle = format!(
        "pinbench {}, median per copy, event-timed ({} run)",
        env!("CARGO_PKG_VERSION"),
        if report.quick { "quick" } else { "full" }
    );

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root
            .titled(&title, (FONT, TITLE).into_font().style(FontStyle::Bold))?
            .titled(&subtitle, (FONT, SUBTITLE).into_font().color(&GREY))?;
        let (charts, legend_area) = root.split_vertically(root.dim_in_pixel().1 - LEGEND_HEIGHT);
        for ((direction, lines), area) in panels.iter().zip(charts.split_evenly((1, 2))) {
            panel(&area, *direction, lines, &sizes, top)?;
        }
        legend(&legend_area, &panels[0].1)?;
        root.present()?;
    }
    Ok(svg)
}

/// One direction's panel: GB/s from 0 to `top` against the sizes' log2, a tick at each measured size.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    direction: Direction,
    lines: &[Series],
    sizes: &[i32],
    top: f64,
) -> Outcome<()> {
    let caption = match direction {
        Direction::Upload => "upload (host to device)",
        Direction::Download => "download (device to host)",
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, CAPTION))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(x_range(sizes).with_key_points(sizes.to_vec()), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(0)
        .bold_line_style(RGBColor(0xe0, 0xe0, 0xe0))
        .x_label_formatter(&|&x| short_size(1 << x))
        .y_label_formatter(&|&y| tick_label(y))
        .x_desc("transfer size (bytes, log2 scale)")
        .y_desc("GB/s")
        .label_style((FONT, TEXT))
        .axis_desc_style((FONT, TEXT))
        .draw()?;
    for line in lines {
        let points: Vec<(i32, f64)> = line
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|&(bytes, gbps)| (log2(bytes), gbps))
            .collect();
        let style = line.color.stroke_width(2);
        if line.dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?;
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))?;
        }
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, line.color.filled())),
        )?;
    }
    Ok(())
}

/// The legend under the panels (which show the same lines): two columns, filled row by row, each entry a stroke
/// of its line and its label.
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, lines: &[Series]) -> Outcome<()> {
    const LEFT: i32 = 70;
    const ROW: i32 = 22;
    let column = (area.dim_in_pixel().0 as i32 - 2 * LEFT) / 2;
    let text = TextStyle::from((FONT, TEXT).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, line) in lines.iter().enumerate() {
        let (x, y) = (LEFT + (i % 2) as i32 * column, ROW + (i / 2) as i32 * ROW);
        let stroke = [(x, y), (x + 28, y)];
        let style = line.color.stroke_width(2);
        if line.dashed {
            area.draw(&DashedPathElement::new(stroke, 6, 4, style))?;
        } else {
            area.draw(&PathElement::new(stroke, style))?;
        }
        area.draw(&Text::new(line.label, (x + 36, y), text.clone()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::sample_report;

    /// The text of every `<text>` element of `svg`.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("</text>")
            .filter_map(|piece| piece.rsplit_once('>'))
            .map(|(_, text)| text.trim())
            .collect()
    }

    #[test]
    fn ticks_drop_trailing_zeros() {
        assert_eq!(tick_label(10.0), "10");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(3.0 * 0.1), "0.3");
    }

    #[test]
    fn sizes_are_labelled_compactly_and_spaced_by_their_log() {
        assert_eq!(short_size(4096), "4K");
        assert_eq!(short_size(256 << 20), "256M");
        assert_eq!(short_size(1 << 30), "1G");
        assert_eq!(short_size(100), "100");
        assert_eq!(log2(4096), 12);
        assert_eq!(log2(1 << 30), 30);
        assert_eq!(x_range(&[12, 14, 30]), 12..30);
        assert_eq!(x_range(&[20]), 18..22);
        assert_eq!(x_range(&[]), 12..30);
    }

    #[test]
    fn each_panel_has_a_line_per_measured_method_and_the_raw_reference() {
        let report = sample_report();
        let lines = series(&report, Direction::Upload);
        let labels: Vec<&str> = lines.iter().map(|l| l.label).collect();
        assert_eq!(
            labels,
            [
                "pageable (driver-staged)",
                "pageable, staged through PinnedPool",
                "raw cuMemcpy*Async (pinned)",
                "pinned",
                "registered Vec",
            ]
        );
        let raw = &lines[2];
        assert!(raw.dashed && lines.iter().filter(|l| l.dashed).count() == 1);
        assert_eq!(raw.points.len(), 3);
        assert!((raw.points[0].1 - 10.0).abs() < 1e-9);
        assert_eq!(series(&report, Direction::Download).len(), 5);
    }

    #[test]
    fn the_chart_has_axes_ticks_labels_and_a_legend() {
        let report = sample_report();
        let svg = render(&report).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        let texts = texts(&svg);
        let title =
            "host-GPU bandwidth: Test GPU &lt;&amp;&gt;, PCIe gen 5 x16, CUDA 13.0, driver 580.1";
        assert!(texts.contains(&title), "the device name escaped: {texts:?}");
        assert!(!svg.contains("<&>"));
        for needle in [
            "upload (host to device)",
            "download (device to host)",
            "transfer size (bytes, log2 scale)",
            "GB/s",
            "4K",
            "1M",
            "64M",
            "10",
            "pageable (driver-staged)",
            "raw cuMemcpy*Async (pinned)",
            "registered Vec",
            "pageable, staged through PinnedPool",
        ] {
            assert!(texts.contains(&needle), "missing {needle:?} in {texts:?}");
        }
        assert!(
            texts.iter().any(|t| t.ends_with("(quick run)")),
            "{texts:?}"
        );
        let staged = color(Method::Staged);
        let orange = format!("#{:02X}{:02X}{:02X}", staged.0, staged.1, staged.2);
        assert!(svg.contains(&orange), "no line in {orange}");
        // Methods without figures get no line and no legend entry.
        assert!(!svg.contains("write-combined"));
        // A marker per point: 5 lines of 3 sizes in each of the two panels.
        assert_eq!(svg.matches("<circle").count(), 2 * 5 * 3);
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }
}
