//! SVG plots in the manner of the white paper's diagrams: one per profile,
//! throughput (MB/s, 10^6 bytes) against outstanding I/Os on a logarithmic
//! axis labelled with the measured depths (1, 3, 8, ..., 512), one line
//! with markers per target, and a legend.
//!
//! Each target's line is a single `<polyline>`; markers are circles and the
//! legend's swatches rectangles, so a reader (or a test) can find the lines.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::profile::Profile;
use crate::report::Report;
use crate::BenchError;

/// Plot size in pixels: the proportions of the white paper's diagrams.
const WIDTH: u32 = 900;
const HEIGHT: u32 = 560;
/// Room left and right of the first and last depth on the log axis (a
/// factor), so that end markers are not cut by the frame.
const X_PADDING: f64 = 1.25;
/// Headroom above the highest point, so that it does not touch the title.
const Y_HEADROOM: f64 = 1.1;
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

fn draw(report: &Report, profile: &Profile, svg: &mut String) -> DrawResult {
    let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
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
        .map(|p| p.mb_per_s)
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * Y_HEADROOM } else { 1.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: {}", profile.name, profile.describe()),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((low..high).log_scale().with_key_points(depths), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("outstanding I/Os")
        .y_desc("throughput [MB/s]")
        .x_label_formatter(&|depth| format!("{depth:.0}"))
        .y_label_formatter(&|mb| format!("{mb:.0}"))
        .draw()?;
    for (index, target) in report.targets.iter().enumerate() {
        let color = PALETTE[index % PALETTE.len()];
        let mut line: Vec<(f64, f64)> = report
            .series(&profile.name, &target.name)
            .map(|p| (p.outstanding as f64, p.mb_per_s))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(target.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], color.filled()));
        chart.draw_series(
            line.into_iter()
                .map(|at| Circle::new(at, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()
}
