//! Results: one [`Point`] per target, profile and outstanding I/Os, and the
//! [`Report`] that holds them with what they were measured on and how. Both
//! serialise to JSON with every field (`serde`).

use serde::{Deserialize, Serialize};

use crate::machine::Machine;
use crate::profile::Profile;
use crate::runner::SequentialMode;

/// One measurement. MB/s counts MB as 10^6 bytes, as the white paper does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub profile: String,
    pub target: String,
    pub outstanding: usize,
    /// Requests completed in the measured interval.
    pub ios: u64,
    pub read_ios: u64,
    pub write_ios: u64,
    pub bytes: u64,
    /// Length of the measured interval.
    pub seconds: f64,
    /// 10^6 bytes per second.
    pub mb_per_s: f64,
    pub iops: f64,
    pub latency_mean_us: f64,
    pub latency_p99_us: f64,
    /// Busy CPU time of the whole machine per I/O (see `cpu`); `None` where
    /// `/proc/stat` cannot be read.
    pub cpu_us_per_io: Option<f64>,
    /// The spread of the runs a merged point is the median of (`None`
    /// for a point measured once).
    #[serde(default)]
    pub spread: Option<Spread>,
}

/// The least and most of the runs behind a merged point, for each figure
/// plotted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub runs: usize,
    pub mb_per_s_min: f64,
    pub mb_per_s_max: f64,
    pub iops_min: f64,
    pub iops_max: f64,
    pub latency_p99_us_min: f64,
    pub latency_p99_us_max: f64,
}

impl Spread {
    fn of(samples: &[Point]) -> Spread {
        let range = |figure: fn(&Point) -> f64| {
            samples
                .iter()
                .map(figure)
                .fold((f64::INFINITY, 0.0_f64), |(low, high), x| {
                    (low.min(x), high.max(x))
                })
        };
        let (mb_per_s_min, mb_per_s_max) = range(|p| p.mb_per_s);
        let (iops_min, iops_max) = range(|p| p.iops);
        let (latency_p99_us_min, latency_p99_us_max) = range(|p| p.latency_p99_us);
        Spread {
            runs: samples.len(),
            mb_per_s_min,
            mb_per_s_max,
            iops_min,
            iops_max,
            latency_p99_us_min,
            latency_p99_us_max,
        }
    }
}

/// A target as measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub name: String,
    pub size_bytes: u64,
    /// Bytes of the target the profiles touched (from offset 0).
    pub working_set_bytes: u64,
    /// Whether random data was written over the working set first.
    pub prefilled: bool,
}

/// How the sweep ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub depths: Vec<usize>,
    pub warmup_seconds: f64,
    pub duration_seconds: f64,
    pub seed: u64,
    pub sequential: SequentialMode,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Start of the sweep, UTC, RFC 3339.
    pub started: String,
    pub machine: Machine,
    pub settings: Settings,
    pub profiles: Vec<Profile>,
    pub targets: Vec<TargetInfo>,
    pub points: Vec<Point>,
}

impl Report {
    /// The points of one profile and target, in sweep order.
    pub fn series<'a>(
        &'a self,
        profile: &'a str,
        target: &'a str,
    ) -> impl Iterator<Item = &'a Point> + 'a {
        self.points
            .iter()
            .filter(move |p| p.profile == profile && p.target == target)
    }

    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    pub fn from_json(text: &str) -> Result<Report, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// One report from several runs (alternating runs of one comparison,
    /// each a target or a profile): profiles, targets and depths in the
    /// order first seen (depths sorted), and for every target, profile and
    /// depth measured more than once, the median run by throughput (the
    /// upper median of an even count), so one disturbed run does not move
    /// the figure, with the least and most of its runs as its
    /// [`Spread`]. Machine and settings are the first report's, with the
    /// union of depths; `None` when there is no report.
    pub fn merge(reports: Vec<Report>) -> Option<Report> {
        let mut reports = reports.into_iter();
        let mut merged = reports.next()?;
        let mut runs: Vec<Vec<Point>> = Vec::new();
        let mut add = |merged: &mut Report, report_points: Vec<Point>| {
            for point in report_points {
                let same = merged.points.iter().position(|p| {
                    (&p.target, &p.profile, p.outstanding)
                        == (&point.target, &point.profile, point.outstanding)
                });
                match same {
                    Some(index) => runs[index].push(point),
                    None => {
                        merged.points.push(point.clone());
                        runs.push(vec![point]);
                    }
                }
            }
        };
        let first_points = std::mem::take(&mut merged.points);
        add(&mut merged, first_points);
        for report in reports {
            merged.started = merged.started.min(report.started);
            for profile in report.profiles {
                if !merged.profiles.iter().any(|p| p.name == profile.name) {
                    merged.profiles.push(profile);
                }
            }
            for target in report.targets {
                if !merged.targets.iter().any(|t| t.name == target.name) {
                    merged.targets.push(target);
                }
            }
            merged.settings.depths.extend(report.settings.depths);
            add(&mut merged, report.points);
        }
        merged.settings.depths.sort_unstable();
        merged.settings.depths.dedup();
        for (slot, mut samples) in merged.points.iter_mut().zip(runs) {
            let spread = Spread::of(&samples);
            samples.sort_by(|a, b| a.mb_per_s.total_cmp(&b.mb_per_s));
            *slot = samples.swap_remove(samples.len() / 2);
            slot.spread = Some(spread);
        }
        Some(merged)
    }
}

/// `2025-01-31T12:34:56Z` for a time since the Unix epoch.
pub fn rfc3339(since_epoch: std::time::Duration) -> String {
    let seconds = since_epoch.as_secs();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_times() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(Duration::from_secs(951_782_400 + 3723)),
            "2000-02-29T01:02:03Z"
        );
        assert_eq!(
            rfc3339(Duration::from_secs(1_735_689_599)),
            "2024-12-31T23:59:59Z"
        );
    }
}
