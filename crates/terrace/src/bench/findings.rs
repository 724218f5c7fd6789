//! The report of `terrace bench paper`: the environment, the figures per
//! profile, and the white paper's stated findings beside what this run
//! measured.
//!
//! The paper states its findings in words over diagrams (its numbers are
//! only in the plots), so each finding becomes a relation this run can
//! check within itself: parity restore against simple restore, a mirror's
//! stream against a stripe's, depth 1 against the peak. Every verdict below
//! is computed from the run's own points; a finding whose spaces or
//! profiles were not measured is left out, never guessed.

use std::fmt::Write as _;
use std::path::Path;

use terrace_bench::report::{Point, Report};
use terrace_bench::units::format_block;
use terrace_bench::Access;

use super::paper::PaperRun;
use crate::units::format_size;

/// Sequential outer-zone media rate of the `hdd-10k` model, MB/s
/// (docs/DRIVE_MODELS.md): what one modelled drive streams at best.
const HDD_10K_OUTER_MB_S: f64 = 204.0;
/// The paper's drives.
const HDDS: f64 = 8.0;
/// A stream "closes the gap only at higher outstanding I/Os" when depth 1
/// gives less than half of its peak.
const RAMP_FRACTION: f64 = 0.5;
/// Median whole-machine busy share above which the report says the run
/// was limited by the CPU rather than by the modelled drives.
const CPU_BOUND_SHARE: f64 = 0.8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Agrees,
    Better,
    Worse,
    Differs,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Better => "**better**",
            Verdict::Worse => "worse",
            Verdict::Differs => "differs",
        }
    }
}

struct Finding {
    paper: &'static str,
    measured: String,
    verdict: Verdict,
    why: String,
}

/// Lookups over the run's points.
struct Figures<'a> {
    report: &'a Report,
}

impl<'a> Figures<'a> {
    fn series(&self, target: &str, profile: &str) -> Vec<&'a Point> {
        let mut points: Vec<&Point> = self
            .report
            .points
            .iter()
            .filter(|p| p.target == target && p.profile == profile)
            .collect();
        points.sort_by_key(|p| p.outstanding);
        points
    }

    /// The point of highest throughput.
    fn peak(&self, target: &str, profile: &str) -> Option<&'a Point> {
        self.series(target, profile)
            .into_iter()
            .max_by(|a, b| a.mb_per_s.total_cmp(&b.mb_per_s))
    }

    /// The point of fewest outstanding I/Os.
    fn lowest(&self, target: &str, profile: &str) -> Option<&'a Point> {
        self.series(target, profile).into_iter().next()
    }

    /// Peak throughput of `a` over peak throughput of `b`.
    fn ratio(&self, a: &str, b: &str, profile: &str) -> Option<f64> {
        let (a, b) = (self.peak(a, profile)?, self.peak(b, profile)?);
        (b.mb_per_s > 0.0).then(|| a.mb_per_s / b.mb_per_s)
    }

    /// Throughput of `a` over `b` at every depth both were measured at.
    fn ratios(&self, a: &str, b: &str, profile: &str) -> Vec<(usize, f64)> {
        let theirs = self.series(b, profile);
        self.series(a, profile)
            .into_iter()
            .filter_map(|mine| {
                let other = theirs.iter().find(|p| p.outstanding == mine.outstanding)?;
                (other.mb_per_s > 0.0).then(|| (mine.outstanding, mine.mb_per_s / other.mb_per_s))
            })
            .collect()
    }

    fn has(&self, target: &str) -> bool {
        self.report.targets.iter().any(|t| t.name == target)
    }
}

fn mb(value: f64) -> String {
    if value >= 10.0 {
        format!("{value:.0} MB/s")
    } else {
        format!("{value:.1} MB/s")
    }
}

/// `0.56 at 1, 0.25 at 8, ...`
fn ratios_text(ratios: &[(usize, f64)]) -> String {
    ratios
        .iter()
        .map(|(depth, ratio)| format!("{ratio:.2} at {depth}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lowest ratio at `min_depth` outstanding I/Os or more.
fn lowest_from(ratios: &[(usize, f64)], min_depth: usize) -> Option<f64> {
    ratios
        .iter()
        .filter(|(depth, _)| *depth >= min_depth)
        .map(|&(_, ratio)| ratio)
        .min_by(f64::total_cmp)
}

fn peak_text(point: &Point) -> String {
    format!("{} at {}", mb(point.mb_per_s), point.outstanding)
}

/// The whole report.
pub fn markdown(report: &Report, run: &PaperRun) -> String {
    let mut out = String::new();
    header(&mut out, report, run);
    results(&mut out, report, run);
    let figures = Figures { report };
    let findings = findings(&figures);
    let _ = writeln!(out, "## Beside the paper's findings\n");
    out.push_str(
        "The paper (Fujitsu, *Windows Server 2012 R2 Storage Spaces Performance*) states its \
         findings in words over its diagrams. Each is checked here as a relation within this \
         run (same machine, same models, same generator); the verdicts are computed from the \
         figures above.\n\n",
    );
    out.push_str("| the paper says | this run measured | verdict | why |\n|---|---|---|---|\n");
    for finding in &findings {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            finding.paper,
            finding.measured,
            finding.verdict.word(),
            finding.why
        );
    }
    out.push('\n');
    cache_section(&mut out, &figures, run);
    caveats(&mut out, report);
    out
}

fn header(out: &mut String, report: &Report, run: &PaperRun) {
    let settings = &report.settings;
    let _ = writeln!(
        out,
        "# The white paper's measurement, reproduced on drive models\n\n\
         Generated by `terrace bench paper` on {} ({}). Regenerate with:\n\n\
         ```sh\n{}\n```\n",
        report.started,
        report.machine.describe(),
        run.command
    );
    let _ = writeln!(
        out,
        "## The environment\n\n\
         | | the paper | this run |\n|---|---|---|\n\
         | capacity drives | 8 × 10K rpm SAS 900 GB | 8 × `hdd-10k` model over {} sparse files |\n\
         | SSDs | 3 × SAS SSD 400 GB | 3 × `ssd-sata` model over {} sparse files{}, usage `journal` |\n\
         | data measured | a 32 GB file (NTFS) | spaces of {} each, the whole space |\n\
         | interleave | 256 KB | 256 KiB (default) |\n\
         | drive write caches | enabled | enabled (models' write caches) |\n\
         | load generator | Iometer | `terrace bench` over NBD (Unix socket) |\n\
         | per point | not stated | {:.1} s warm-up, {:.1} s measured |\n",
        format_size(run.hdd_bytes),
        format_size(run.ssd_bytes),
        run.ssd_directory
            .as_ref()
            .map_or(String::new(), |dir| format!(" in {}", dir.display())),
        format_size(run.space_bytes),
        settings.warmup_seconds,
        settings.duration_seconds
    );
    out.push_str("| space | layout | columns | why those columns | write-back cache |\n");
    out.push_str("|---|---|---|---|---|\n");
    for space in &run.spaces {
        let cache = space
            .cache
            .as_ref()
            .map_or("none".to_string(), |c| format_size(c.bytes));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            space.name, space.layout_description, space.columns, space.columns_reason, cache
        );
    }
    out.push('\n');
}

fn results(out: &mut String, report: &Report, run: &PaperRun) {
    let _ = writeln!(
        out,
        "## Results\n\nThroughput in MB/s (10^6 bytes) for sequential profiles, IO/s for \
         random ones, as the paper reports them; every point's latency and CPU time are in \
         the JSON report. One plot per profile, as in the paper's diagrams.\n"
    );
    for profile in &report.profiles {
        let random = profile.access == Access::Random;
        let _ = writeln!(
            out,
            "### {} ({}, {})\n",
            profile.name,
            profile.describe(),
            if random { "IO/s" } else { "MB/s" }
        );
        let image = run.svg_directory.join(format!(
            "{}.svg",
            terrace_bench::plot::file_stem(&profile.name)
        ));
        let _ = writeln!(
            out,
            "![{}]({})\n",
            profile.name,
            relative(&image, &run.report_directory).display()
        );
        let names: Vec<&str> = report.targets.iter().map(|t| t.name.as_str()).collect();
        let _ = writeln!(out, "| outstanding I/Os | {} |", names.join(" | "));
        let _ = writeln!(out, "|---|{}", "---|".repeat(names.len()));
        for &depth in &report.settings.depths {
            let cells: Vec<String> = names
                .iter()
                .map(|name| {
                    report
                        .series(&profile.name, name)
                        .find(|p| p.outstanding == depth)
                        .map_or("-".to_string(), |p| {
                            if random {
                                format!("{:.0}", p.iops)
                            } else {
                                format!("{:.1}", p.mb_per_s)
                            }
                        })
                })
                .collect();
            let _ = writeln!(out, "| {depth} | {} |", cells.join(" | "));
        }
        out.push('\n');
    }
}

/// `path` relative to `base` where it lies below it.
fn relative(path: &Path, base: &Path) -> std::path::PathBuf {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (path, base) = (absolute(path), absolute(base));
    path.strip_prefix(&base)
        .map(Path::to_path_buf)
        .unwrap_or(path)
}

fn findings(figures: &Figures) -> Vec<Finding> {
    [
        simple_ramp(figures),
        simple_scaling(figures),
        mirror_streams(figures),
        mirror_writes(figures),
        parity_writes(figures),
        parity_streaming(figures),
        dual_parity(figures),
        parity_sequential_writes(figures),
        no_collapse(figures),
        cpu_share(figures),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn simple_ramp(f: &Figures) -> Option<Finding> {
    let mut parts = Vec::new();
    let mut fractions = Vec::new();
    for profile in ["streaming", "restore"] {
        let (low, peak) = (f.lowest("simple", profile)?, f.peak("simple", profile)?);
        fractions.push(low.mb_per_s / peak.mb_per_s.max(f64::MIN_POSITIVE));
        parts.push(format!(
            "{profile}: {} at {}, peak {}",
            mb(low.mb_per_s),
            low.outstanding,
            peak_text(peak)
        ));
    }
    let (reads, writes) = (fractions[0], fractions[1]);
    let ramps = reads.min(writes) < RAMP_FRACTION;
    let ahead = format!(
        "Reads do not: from a stream's third read the daemon reads ahead of it, a row at a time up to 8 MiB ahead (as a RAID controller's read-ahead does), so one read at a time already gets {:.0} % of the streaming peak.",
        reads * 100.0
    );
    Some(Finding {
        paper: "Simple: streaming and restore about equal to SW stripe and HW RAID 0, but Storage Spaces closes the gap only with more outstanding I/Os.",
        measured: parts.join("; "),
        verdict: if ramps { Verdict::Agrees } else { Verdict::Better },
        why: match (reads < RAMP_FRACTION, writes < RAMP_FRACTION) {
            (false, true) => format!(
                "Restores ramp: one 64 KiB write at a time keeps one drive of eight busy, and a write is acknowledged only once on its drive; throughput grows as more writes keep more drives busy. {ahead}"
            ),
            (_, true) | (true, false) => "One 64 KiB request at a time keeps one drive of eight busy; throughput grows as more requests keep more drives busy.".into(),
            (false, false) => format!(
                "Depth 1 already gives {:.0} % of the peak: the modelled drives' write caches take a lone stream of writes at interface speed. {ahead}",
                writes * 100.0
            ),
        },
    })
}

fn simple_scaling(f: &Figures) -> Option<Finding> {
    let peak = f.peak("simple", "streaming")?;
    let limit = HDDS * HDD_10K_OUTER_MB_S;
    let share = peak.mb_per_s / limit;
    Some(Finding {
        paper: "(Our aim for the models.) Eight drives striped as simple stream about 8 × one drive.",
        measured: format!(
            "simple streaming peak {} = {:.2} × (8 × {HDD_10K_OUTER_MB_S:.0} MB/s, the model's outer-zone rate)",
            peak_text(peak),
            share
        ),
        verdict: if share >= 0.8 { Verdict::Agrees } else { Verdict::Worse },
        why: if share >= 0.8 {
            "Each 256 KiB column is one drive's run of sequential blocks; with enough requests in flight all eight stream at once.".into()
        } else {
            format!(
                "Below the drives' sum: a drive's request ends when both its modelled time and the real I/O of its backing file are done, and the whole path (generator, NBD, engine, models) shares {} CPUs; see CPU µs per I/O in the JSON report.",
                f.report.machine.cpus
            )
        },
    })
}

fn mirror_streams(f: &Figures) -> Option<Finding> {
    let ratios = f.ratios("mirror", "simple", "streaming");
    let peak = f.ratio("mirror", "simple", "streaming")?;
    let lowest = lowest_from(&ratios, 8)?;
    let verdict = if lowest >= 0.8 {
        Verdict::Better
    } else if peak >= 0.8 {
        Verdict::Differs
    } else {
        Verdict::Worse
    };
    Some(Finding {
        paper: "Mirror: Storage Spaces about equal to SW mirror; HW RAID 1 up to 40 % faster on streaming and up to 20 % on random profiles at high load.",
        measured: format!(
            "mirror / simple streaming by outstanding I/Os: {}; peaks {peak:.2}",
            ratios_text(&ratios)
        ),
        verdict,
        why: if verdict == Verdict::Better {
            "Each column is read from its copies in turns of 4 MiB regions, and a mirror's streams are read ahead far enough (copies × columns × 4 MiB) to have a region of every copy in flight: the drives of both copies stream their own regions at once, each seeking once over the region between (about 3 ms per 20 ms of reading), as a RAID 1 controller with its read-ahead does. A mirror of eight drives then streams about like a stripe of eight.".into()
        } else {
            "Each column is read from its copies in turns of 4 MiB regions; a stream keeps the drives of both copies busy only while it has a region of every copy in flight, read ahead up to copies × columns × 4 MiB. Where the mirror falls below 0.8 of simple it had not, and the drives of one copy did the reading alone (0.5 of simple at most).".into()
        },
    })
}

fn mirror_writes(f: &Figures) -> Option<Finding> {
    let restore = f.ratio("mirror", "simple", "restore")?;
    Some(Finding {
        paper: "Mirror: no difference between Storage Spaces, SW and HW RAID on restore.",
        measured: format!("mirror / simple restore peak {restore:.2}"),
        verdict: if restore >= 0.4 {
            Verdict::Agrees
        } else {
            Verdict::Worse
        },
        why: if restore <= 0.7 {
            "Every write goes to both copies, which halves the drives' write bandwidth whatever the implementation (expected about 0.5 of simple).".into()
        } else {
            "Every write goes to both copies, but at these depths the stripe itself was not bound by the drives' write bandwidth (their write caches take 64 KiB writes at interface speed), so halving it costs little.".into()
        },
    })
}

fn parity_writes(f: &Figures) -> Option<Finding> {
    let restore = f.ratio("parity", "simple", "restore")?;
    let database = f.ratio("parity", "simple", "database")?;
    let file_copy = f.ratio("parity", "simple", "file-copy");
    let mut measured =
        format!("parity / simple peak: restore {restore:.2}, database {database:.2}");
    if let Some(file_copy) = file_copy {
        let _ = write!(measured, ", file-copy {file_copy:.2}");
    }
    let painful = restore < 1.0 / 3.0 || database < 0.5;
    Some(Finding {
        paper: "Single parity: except for streaming, HW RAID 5 with its controller cache is 3 to 10 times faster; without a write-back cache parity suits read-mostly loads only.",
        measured,
        verdict: if painful { Verdict::Agrees } else { Verdict::Better },
        why: if painful {
            "Each 8 or 64 KiB write changes part of a row: the old data and parity are read and the new written, four drive operations on drives that seek, and nothing absorbs them without a write-back cache.".into()
        } else {
            "Partial-row writes still cost four drive operations, but the engine picks read-modify-write or reconstruct-write by the bytes read, and the drives' own write caches (enabled, as in the paper) absorb the write half.".into()
        },
    })
}

fn parity_streaming(f: &Figures) -> Option<Finding> {
    let single = f.ratio("parity", "simple", "streaming")?;
    Some(Finding {
        paper: "Single parity: streaming comparable with HW RAID 5 (reads are the one thing parity does well).",
        measured: format!("parity / simple streaming peak {single:.2}"),
        verdict: if single >= 0.7 { Verdict::Agrees } else { Verdict::Worse },
        why: if single >= 0.7 {
            "Reads touch data columns only; the parity column of each row is skipped, so a stream loses at most one drive's share.".into()
        } else {
            "Reads skip the parity column, so the layout costs at most one drive's share (1/8); the rest of the gap is not the layout's. Where the machine is CPU-bound (see the CPU row) single points move by tens of percent.".into()
        },
    })
}

fn dual_parity(f: &Figures) -> Option<Finding> {
    let mut parts = Vec::new();
    let mut slower = false;
    for profile in ["streaming", "restore", "database"] {
        if let Some(ratio) = f.ratio("dual-parity", "parity", profile) {
            parts.push(format!("{profile} {ratio:.2}"));
            slower |= profile != "streaming" && ratio < 1.0;
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(Finding {
        paper: "Dual parity: the picture of single parity, and partly clearly worse (against HW RAID 6).",
        measured: format!("dual / single parity peak: {}", parts.join(", ")),
        verdict: if slower { Verdict::Agrees } else { Verdict::Differs },
        why: "A partial-row write reads and writes two parity columns instead of one (six drive operations instead of four); reads lose two drives' share per row instead of one.".into(),
    })
}

fn parity_sequential_writes(f: &Figures) -> Option<Finding> {
    let mut parts = Vec::new();
    let mut shallow_max: f64 = 0.0;
    let mut peak_max: f64 = 0.0;
    for space in ["parity", "dual-parity"] {
        let series = f.series(space, "restore");
        let Some(peak) = f.peak(space, "restore") else {
            continue;
        };
        let shallow = series
            .iter()
            .filter(|p| p.outstanding <= 8)
            .map(|p| p.mb_per_s)
            .fold(0.0, f64::max);
        let lowest = series.first()?;
        shallow_max = shallow_max.max(shallow);
        peak_max = peak_max.max(peak.mb_per_s);
        parts.push(format!(
            "{space}: {} at {}, at most {} up to 8, peak {}",
            mb(lowest.mb_per_s),
            lowest.outstanding,
            mb(shallow),
            peak_text(peak)
        ));
    }
    if parts.is_empty() {
        return None;
    }
    let verdict = if shallow_max > 40.0 {
        Verdict::Better
    } else {
        Verdict::Agrees
    };
    Some(Finding {
        paper: "(SPEC.md, from the field reports.) Parity spaces write 20–40 MB/s on arrays that stream GB/s unless an SSD journal is added.",
        measured: parts.join("; "),
        verdict,
        why: if peak_max > 40.0 && verdict == Verdict::Agrees {
            "Without a log every 64 KiB write is a read-modify-write of its row on spinning drives: at the depths applications use, as slow as the field reports say. Only deep queues, where the drives reorder the reads and writes of many rows, get beyond 40 MB/s; the write-back cache (below) is the remedy, as in the paper.".into()
        } else if verdict == Verdict::Agrees {
            "Without a log every 64 KiB write is a read-modify-write of its row on spinning drives; the write-back cache (below) is the remedy, as in the paper.".into()
        } else {
            "Each 64 KiB write is still a read-modify-write of its row, but the drives reorder the reads and writes of many rows in their queues.".into()
        },
    })
}

fn no_collapse(f: &Figures) -> Option<Finding> {
    let mut collapsed = Vec::new();
    let mut checked = 0;
    for target in &f.report.targets {
        for profile in &f.report.profiles {
            let at = |depth| {
                f.series(&target.name, &profile.name)
                    .into_iter()
                    .find(|p| p.outstanding == depth)
            };
            let (Some(deep), Some(base)) = (at(512), at(64)) else {
                continue;
            };
            checked += 1;
            let ratio = deep.mb_per_s / base.mb_per_s.max(f64::MIN_POSITIVE);
            if ratio < 0.95 {
                collapsed.push(format!("{} {} {ratio:.2}", target.name, profile.name));
            }
        }
    }
    if checked == 0 {
        return None;
    }
    let severe: Vec<&String> = collapsed
        .iter()
        .filter(|c| {
            c.rsplit(' ')
                .next()
                .and_then(|r| r.parse::<f64>().ok())
                .is_some_and(|r| r < 0.5)
        })
        .collect();
    let simple_severe = severe.iter().any(|c| c.starts_with("simple "));
    Some(Finding {
        paper:
            "(Our aim.) No collapse at 512 outstanding I/Os: at least 95 % of the throughput at 64.",
        measured: if collapsed.is_empty() {
            format!("all {checked} space and profile pairs hold")
        } else {
            format!(
                "{} of {checked} pairs below 0.95 (512 / 64): {}",
                collapsed.len(),
                collapsed.join(", ")
            )
        },
        verdict: if collapsed.is_empty() {
            Verdict::Agrees
        } else {
            Verdict::Worse
        },
        why: if collapsed.is_empty() {
            "Every queue from the NBD socket to the drive models is deep enough, and each drive reorders what it holds.".into()
        } else if !severe.is_empty()
            && severe
                .iter()
                .all(|c| c.split(' ').next().is_some_and(|n| n.ends_with("-wbc")))
        {
            format!(
                "Drops below half ({}) are of cached spaces, whose depths of one profile run back to back: by the deepest points the profile has filled the log past what destaging keeps up with, and the point measures destaging (read-modify-write of rows on the HDDs) while writers wait for ring space, not the log. Smaller drops are within what short points on a shared machine move.",
                severe.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
            )
        } else if !severe.is_empty() && !simple_severe && f.has("simple") {
            format!(
                "Drops below half ({}) where simple over the same drives holds its rate are not noise: their cause is in that layout's path (noted for the engine's issue). Smaller drops are within what short points on a shared machine move.",
                severe.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
            )
        } else {
            "Short points on a shared machine move single figures by tens of percent; repeat the run before reading a cause into one point.".into()
        },
    })
}

fn cpu_share(f: &Figures) -> Option<Finding> {
    let cpus = f.report.machine.cpus.max(1) as f64;
    let mut shares: Vec<f64> = f
        .report
        .points
        .iter()
        .filter_map(|p| p.cpu_us_per_io.map(|cpu| cpu * p.iops / 1e6 / cpus))
        .collect();
    if shares.is_empty() {
        return None;
    }
    shares.sort_by(f64::total_cmp);
    let median = shares[shares.len() / 2];
    let max = shares[shares.len() - 1];
    Some(Finding {
        paper: "Storage Spaces and SW RAID use 2 % to 10 % of the CPU (HW RAID up to 3 %).",
        measured: format!(
            "whole machine busy: median {:.0} %, highest {:.0} % of {} CPUs",
            median * 100.0,
            max * 100.0,
            f.report.machine.cpus
        ),
        verdict: if max <= 0.10 { Verdict::Agrees } else { Verdict::Differs },
        why: "Not like for like: the share here is of the whole machine, so it includes the load generator and the NBD protocol (in-kernel and free in the paper's setup), the drive models' timers and anything else running on the machine, on far fewer CPUs than the paper's server.".into(),
    })
}

fn cache_section(out: &mut String, f: &Figures, run: &PaperRun) {
    out.push_str("## With a write-back cache\n\n");
    let measured: Vec<&str> = ["simple", "mirror", "parity", "dual-parity"]
        .into_iter()
        .filter(|name| f.has(name) && f.has(&format!("{name}-wbc")))
        .collect();
    if run.cache_bytes.is_none() || measured.is_empty() {
        out.push_str(
            "**Not measured in this run.** The paper's second half compares every layout \
             with and without a 1 GB write-back cache on two SSDs. Run \
             `terrace bench paper --cache 1G` to add a `LAYOUT-wbc` space per layout (its \
             log on the three journal SSDs) and fill this section; no figure is shown until \
             then.\n\n",
        );
        return;
    }
    let _ = writeln!(
        out,
        "Each `LAYOUT-wbc` space has a {} write-back cache whose log lives on the journal \
         SSDs (the paper: 1 GB on two SSDs). Ratios of peak throughput, cached over \
         uncached:\n",
        format_size(run.cache_bytes.unwrap_or(0))
    );
    out.push_str("| space | file-copy | file-server | database | streaming | restore |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for name in &measured {
        let cached = format!("{name}-wbc");
        let cells: Vec<String> = [
            "file-copy",
            "file-server",
            "database",
            "streaming",
            "restore",
        ]
        .iter()
        .map(|profile| {
            f.ratio(&cached, name, profile)
                .map_or("-".into(), |r| format!("{r:.2}"))
        })
        .collect();
        let _ = writeln!(out, "| {cached} / {name} | {} |", cells.join(" | "));
    }
    out.push_str("\n| the paper says | this run measured | verdict | why |\n|---|---|---|---|\n");
    for finding in [
        cache_random(f),
        cache_restore(f),
        cache_parity_restore(f),
        cache_reads(f),
    ]
    .into_iter()
    .flatten()
    {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            finding.paper,
            finding.measured,
            finding.verdict.word(),
            finding.why
        );
    }
    out.push_str(
        "\nA run shows what the log absorbs plus what destaging manages meanwhile. Each \
         profile starts with the log destaged, but its depths run back to back, so its later \
         points may find the log partly full, as in a long write phase.\n\n",
    );
}

/// Cached over uncached peak ratios of `spaces` for `profiles`.
fn cache_ratios(f: &Figures, spaces: &[&str], profiles: &[&str]) -> Vec<(String, f64)> {
    let mut ratios = Vec::new();
    for space in spaces {
        for profile in profiles {
            if let Some(ratio) = f.ratio(&format!("{space}-wbc"), space, profile) {
                ratios.push((format!("{space} {profile}"), ratio));
            }
        }
    }
    ratios
}

fn range_text(ratios: &[(String, f64)]) -> Option<(f64, f64, String)> {
    let low = ratios.iter().map(|r| r.1).min_by(f64::total_cmp)?;
    let high = ratios.iter().map(|r| r.1).max_by(f64::total_cmp)?;
    Some((low, high, format!("{low:.2}× to {high:.2}×")))
}

fn cache_random(f: &Figures) -> Option<Finding> {
    let ratios = cache_ratios(
        f,
        &["parity", "dual-parity"],
        &["file-copy", "file-server", "database"],
    );
    let (_, _, text) = range_text(&ratios)?;
    let mut sorted: Vec<f64> = ratios.iter().map(|r| r.1).collect();
    sorted.sort_by(f64::total_cmp);
    let median = (sorted[(sorted.len() - 1) / 2] + sorted[sorted.len() / 2]) / 2.0;
    Some(Finding {
        paper: "Parity with WBC: the random profiles improve markedly, about threefold, to about the level of HW RAID 5/6.",
        measured: format!(
            "parity and dual parity, random profiles, with / without: {text}, median {median:.2}×"
        ),
        verdict: if median >= 3.5 {
            Verdict::Better
        } else if median >= 2.0 {
            Verdict::Agrees
        } else {
            Verdict::Worse
        },
        why: "Small writes are acknowledged once in the mirrored log on the SSDs and destaged to the parity rows later, so the writer no longer waits for the read-modify-write on the HDDs; reads still go to the HDDs.".into(),
    })
}

fn cache_restore(f: &Figures) -> Option<Finding> {
    let ratios = cache_ratios(f, &["simple", "mirror"], &["restore"]);
    let (_, high, text) = range_text(&ratios)?;
    Some(Finding {
        paper: "Simple and mirror with WBC: restore altogether significantly lower than without, because writes under 256 KB go through the SSDs, which stream no faster than the HDDs.",
        measured: format!("simple and mirror restore, with / without: {text}"),
        verdict: if high < 0.9 { Verdict::Agrees } else { Verdict::Better },
        why: if high < 0.9 {
            "The same cause: 64 KiB writes are smaller than a row (a row of simple or mirror is one 256 KiB interleave), so they go through the log on three SATA SSDs instead of straight to eight HDDs. Writes of a whole row or more bypass the log, as the paper says of Storage Spaces.".into()
        } else {
            "The log keeps up with the HDDs' sequential rate here.".into()
        },
    })
}

fn cache_parity_restore(f: &Figures) -> Option<Finding> {
    let gains = cache_ratios(f, &["parity", "dual-parity"], &["restore"]);
    let (low, _, text) = range_text(&gains)?;
    let cached = f.peak("parity-wbc", "restore")?;
    let simple = f.peak("simple", "restore")?;
    let share = cached.mb_per_s / simple.mb_per_s.max(f64::MIN_POSITIVE);
    Some(Finding {
        paper: "Parity with WBC: sequential writes improve clearly but stay several times worse than HW RAID 5/6.",
        measured: format!(
            "parity and dual parity restore, with / without: {text}; parity-wbc restore peak {} = {share:.2} of simple",
            peak_text(cached)
        ),
        verdict: if low >= 2.0 && share >= 0.5 {
            Verdict::Better
        } else if low >= 2.0 {
            Verdict::Agrees
        } else {
            Verdict::Worse
        },
        why: "The log turns each 64 KiB write into one SSD write per log copy; destaging then writes whole rows where the log holds them, so parity is computed without reading old data.".into(),
    })
}

fn cache_reads(f: &Figures) -> Option<Finding> {
    let mut lowest: Option<(String, usize, f64)> = None;
    let mut peaks = Vec::new();
    for space in ["simple", "mirror", "parity", "dual-parity"] {
        let cached = format!("{space}-wbc");
        if let Some(peak) = f.ratio(&cached, space, "streaming") {
            peaks.push((space.to_string(), peak));
        }
        for (depth, ratio) in f.ratios(&cached, space, "streaming") {
            if lowest.as_ref().is_none_or(|(_, _, low)| ratio < *low) {
                lowest = Some((space.to_string(), depth, ratio));
            }
        }
    }
    let (_, _, peak_range) = range_text(&peaks)?;
    let (space, depth, low) = lowest?;
    Some(Finding {
        paper: "WBC has no influence on reads (streaming).",
        measured: format!(
            "streaming with / without, peaks: {peak_range}; lowest single point {low:.2} ({space} at {depth})"
        ),
        verdict: if low >= 0.8 { Verdict::Agrees } else { Verdict::Worse },
        why: if low >= 0.8 {
            "Reads go to the HDDs unless the log holds newer data.".into()
        } else {
            format!("Each profile starts once the log has destaged what the one before left, so the stream reads the HDDs exactly as without a cache and does not compete with destaging. The gap ({space} at {depth}) is therefore not the log's: a cached space and its uncached twin sit on different slabs of the drives, and single 1 s points scatter on a shared machine. Not explained further here.")
        },
    })
}

fn caveats(out: &mut String, report: &Report) {
    let cpus = report.machine.cpus.max(1) as f64;
    let mut shares: Vec<f64> = report
        .points
        .iter()
        .filter_map(|p| p.cpu_us_per_io.map(|cpu| cpu * p.iops / 1e6 / cpus))
        .collect();
    shares.sort_by(f64::total_cmp);
    let busy = shares.get(shares.len() / 2).copied().unwrap_or(0.0);
    let blocks: Vec<String> = report
        .profiles
        .iter()
        .map(|p| format_block(u64::from(p.block_bytes)))
        .collect();
    let _ = writeln!(
        out,
        "## What differs from the paper's setup\n\n\
         - The drives are models: their service times follow datasheet figures \
           (docs/DRIVE_MODELS.md); the real I/O of the sparse backing files on this machine's \
           disk runs during the modelled time, and a request ends when both are done. Seeks \
           are short because the spaces sit at the outer edge of 900 GB modelled drives, as \
           the paper's 32 GB file did; spaces smaller than 32 GB make them a little shorter \
           still.\n\
         - The paper measured through NTFS with Iometer; here the generator writes and reads \
           the block device itself over NBD ({} requests), so no filesystem is in between.\n\
         - Each space is prefilled once with random data; each profile starts once the \
           space's log has destaged what the profile before left (the paper's spaces were \
           idle between runs), and the depths of a profile run back to back.\n\
         - The paper compares against a hardware RAID controller with 1 GB cache and Windows \
           software RAID; neither exists here, so its relative findings are checked within \
           this run instead (see the verdicts).\n",
        blocks.join(", ")
    );
    if busy >= CPU_BOUND_SHARE {
        let _ = writeln!(
            out,
            "- **This run was CPU-bound**: the machine's {} CPUs were {:.0} % busy at the \
               median point (generator, NBD, engine, drive-model timers and whatever else ran \
               on the machine). Figures that the drives alone would set are lower here, and \
               single points move by tens of percent; rerun on an idle machine, or with longer \
               points, before reading a cause into one of them.",
            report.machine.cpus,
            busy * 100.0
        );
    }
}
