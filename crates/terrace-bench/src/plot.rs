//! SVG plots in the manner of the white paper's diagrams: one per profile,
//! against outstanding I/Os on a logarithmic axis labelled with the
//! measured depths (1, 3, 8, ..., 512), one line with markers per target,
//! and a legend. A sequential profile plots throughput (MB/s, 10^6 bytes);
//! a random one IO/s, with its p99 latency in a panel beside it. A merged
//! report's points carry error bars from the least to the most of their
//! runs.
//!
//! Each target's line is a single `<polyline>`; markers are circles and the
//! legend's swatches rectangles, so a reader (or a test) can find the lines.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::profile::{Access, Profile};
use crate::report::{Point, Report, Spread};
use crate::BenchError;

/// Plot size in pixels: the proportions of the white paper's diagrams.
const WIDTH: u32 = 900;
const HEIGHT: u32 = 560;
/// Room left and right of the first and last depth on the log axis (a
/// factor), so that end markers are not cut by the frame.
const X_PADDING: f64 = 1.25;
/// Headroom above the highest point, so that it does not touch the title.
const Y_HEADROOM: f64 = 1.1;
/// Width of an error bar's whiskers, in pixels: as wide as a marker.
const ERROR_BAR_WIDTH: u32 = 8;
/// Line colours in target order: distinct in print and for common colour
/// blindness (Okabe–Ito).
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// A profile name as a file name: `random:70:8K` → `random-70-8K`.
pub fn file_stem(profile: &str) -> String {
    profile
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Write one `PROFILE.svg` per profile into `directory` (created if
/// needed); returns the paths written.
pub fn write_svgs(report: &Report, directory: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let output = |path: &Path, source| BenchError::Output {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(directory).map_err(|e| output(directory, e))?;
    let mut written = Vec::new();
    for profile in &report.profiles {
        let svg = render_svg(report, profile)?;
        let path = directory.join(format!("{}.svg", file_stem(&profile.name)));
        std::fs::write(&path, svg).map_err(|e| output(&path, e))?;
        written.push(path);
    }
    Ok(written)
}

/// The SVG text of one profile's plot.
pub fn render_svg(report: &Report, profile: &Profile) -> Result<String, BenchError> {
    let mut svg = String::new();
    draw(report, profile, &mut svg).map_err(|error| BenchError::Plot {
        profile: profile.name.clone(),
        reason: error.to_string(),
    })?;
    Ok(svg)
}

type DrawResult =
    Result<(), DrawingAreaErrorKind<<SVGBackend<'static> as DrawingBackend>::ErrorType>>;

/// One figure of a point, as a panel plots it.
struct Figure {
    axis: &'static str,
    /// The figure of a point, in the axis' unit.
    value: fn(&Point) -> f64,
    /// The least and most of the runs behind a merged point.
    range: fn(&Spread) -> (f64, f64),
}

const THROUGHPUT: Figure = Figure {
    axis: "throughput [MB/s]",
    value: |p| p.mb_per_s,
    range: |s| (s.mb_per_s_min, s.mb_per_s_max),
};
const IOPS: Figure = Figure {
    axis: "IO/s",
    value: |p| p.iops,
    range: |s| (s.iops_min, s.iops_max),
};
const LATENCY_P99: Figure = Figure {
    axis: "p99 latency [ms]",
    value: |p| p.latency_p99_us / 1e3,
    range: |s| (s.latency_p99_us_min / 1e3, s.latency_p99_us_max / 1e3),
};

/// Random profiles are small requests: IO/s beside the p99 latency they
/// cost; sequential ones are streams: MB/s.
fn figures(profile: &Profile) -> &'static [Figure] {
    match profile.access {
        Access::Random => &[IOPS, LATENCY_P99],
        Access::Sequential => &[THROUGHPUT],
    }
}

fn draw(report: &Report, profile: &Profile, svg: &mut String) -> DrawResult {
    let figures = figures(profile);
    let width = WIDTH * figures.len() as u32;
    let root = SVGBackend::with_string(svg, (width, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!("{}: {}", profile.name, profile.describe()),
        ("sans-serif", 22),
    )?;
    let panels = root.split_evenly((1, figures.len()));
    for (panel, figure) in panels.iter().zip(figures) {
        draw_panel(report, profile, figure, panel)?;
    }
    root.present()
}

/// One figure against outstanding I/Os, a line per target, with the spread
/// of merged runs as error bars.
fn draw_panel(
    report: &Report,
    profile: &Profile,
    figure: &Figure,
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
) -> DrawResult {
    let depths: Vec<f64> = report.settings.depths.iter().map(|&d| d as f64).collect();
    let low = depths
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1.0)
        / X_PADDING;
    let high = depths.iter().copied().fold(1.0, f64::max) * X_PADDING;
    let top = report
        .points
        .iter()
        .filter(|p| p.profile == profile.name)
        .map(|p| p.spread.map_or((figure.value)(p), |s| (figure.range)(&s).1))
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * Y_HEADROOM } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((low..high).log_scale().with_key_points(depths), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("outstanding I/Os")
        .y_desc(figure.axis)
        .x_label_formatter(&|depth| format!("{depth:.0}"))
        .y_label_formatter(&|value| format_axis(*value))
        .draw()?;
    for (index, target) in report.targets.iter().enumerate() {
        let color = PALETTE[index % PALETTE.len()];
        let mut points: Vec<&Point> = report.series(&profile.name, &target.name).collect();
        points.sort_by_key(|p| p.outstanding);
        let line: Vec<(f64, f64)> = points
            .iter()
            .map(|p| (p.outstanding as f64, (figure.value)(p)))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(target.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], color.filled()));
        chart.draw_series(
            line.into_iter()
                .map(|at| Circle::new(at, 4, color.filled())),
        )?;
        chart.draw_series(points.iter().filter_map(|p| {
            let spread = p.spread.filter(|s| s.runs > 1)?;
            let (least, most) = (figure.range)(&spread);
            let x = p.outstanding as f64;
            Some(ErrorBar::new_vertical(
                x,
                least,
                (figure.value)(p),
                most,
                color.stroke_width(1),
                ERROR_BAR_WIDTH,
            ))
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// An axis value: whole numbers from 10 up, one decimal below.
fn format_axis(value: f64) -> String {
    if value >= 10.0 || value == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}
