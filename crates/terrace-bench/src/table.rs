//! The terminal table: one per profile, a row per outstanding I/Os, and per
//! target the throughput (MB/s, 10^6 bytes), IO/s, mean and 99th-percentile
//! latency and CPU µs per I/O.

use crate::report::{Point, Report};

/// Columns per target.
const TARGET_COLUMNS: [&str; 5] = ["MB/s", "IO/s", "lat mean µs", "lat p99 µs", "CPU µs/IO"];

/// Every profile's table, each under a title line.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for profile in &report.profiles {
        let table = profile_table(report, &profile.name);
        out.push_str(&format!(
            "{} ({})\n{table}\n",
            profile.name,
            profile.describe()
        ));
    }
    out
}

/// One profile: two header lines (target, then measure) and a row per
/// outstanding-I/O value, every cell right-aligned in its column.
fn profile_table(report: &Report, profile: &str) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut targets = vec![String::new()];
    let mut measures = vec!["outstanding".to_string()];
    for target in &report.targets {
        for column in TARGET_COLUMNS {
            targets.push(target.name.clone());
            measures.push(column.to_string());
        }
    }
    rows.push(targets);
    rows.push(measures);
    for &outstanding in &report.settings.depths {
        let mut row = vec![outstanding.to_string()];
        for target in &report.targets {
            let point = report
                .series(profile, &target.name)
                .find(|p| p.outstanding == outstanding);
            row.extend(cells(point));
        }
        rows.push(row);
    }
    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (index, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &width)| format!("{cell:>width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
        if index == 1 {
            let total = widths.iter().sum::<usize>() + 2 * (columns - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

fn cells(point: Option<&Point>) -> Vec<String> {
    let Some(point) = point else {
        return vec!["-".to_string(); TARGET_COLUMNS.len()];
    };
    vec![
        format!("{:.1}", point.mb_per_s),
        format!("{:.0}", point.iops),
        format!("{:.1}", point.latency_mean_us),
        format!("{:.1}", point.latency_p99_us),
        point
            .cpu_us_per_io
            .map_or_else(|| "-".to_string(), |cpu| format!("{cpu:.1}")),
    ]
}
