//! A sweep: every target × every profile × every number of outstanding
//! I/Os, one [`Point`] each, in that nesting order (a target's points run
//! back to back, after its prefill; [`sweep_settled`] waits before each
//! profile until the target is idle again).
//!
//! Progress goes to stderr through `indicatif` on a terminal; elsewhere each
//! point measured is a plain line, so logs and pipes get no escape
//! sequences or carriage returns.

use std::io::IsTerminal;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::machine::Machine;
use crate::prefill::prefill;
use crate::profile::Profile;
use crate::report::{rfc3339, Point, Report, Settings, TargetInfo};
use crate::runner::{run_point, working_set, RunOptions, SequentialMode, DEFAULT_SEED};
use crate::target::{Target, TargetError};
use crate::BenchError;

/// The white paper's outstanding I/Os.
pub const DEFAULT_DEPTHS: [usize; 9] = [1, 3, 8, 16, 32, 64, 128, 256, 512];
/// Progress redraw period while a point runs: often enough to see time
/// pass, rare enough (one wake-up of the drawing thread) not to disturb.
const TICK: Duration = Duration::from_secs(1);
/// Most outstanding I/Os a point may ask for: beyond this a target measures
/// its queueing, not its speed, and the client pins too much memory.
pub const DEPTH_MAX: usize = 65_536;

#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub profiles: Vec<Profile>,
    pub depths: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    /// `None`: each target whole.
    pub working_set_bytes: Option<u64>,
    /// Write random data over the working set before read-bearing profiles.
    pub prefill: bool,
    pub seed: u64,
    pub sequential: SequentialMode,
    /// Draw progress bars on stderr (when it is a terminal).
    pub progress: bool,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            profiles: Profile::standard(),
            depths: DEFAULT_DEPTHS.to_vec(),
            warmup: Duration::from_secs(2),
            duration: Duration::from_secs(5),
            working_set_bytes: None,
            prefill: true,
            seed: DEFAULT_SEED,
            sequential: SequentialMode::Shared,
            progress: true,
        }
    }
}

impl SweepConfig {
    fn check(&self, targets: &[Box<dyn Target>]) -> Result<(), BenchError> {
        let fail = |text: &str| Err(BenchError::Settings(text.to_string()));
        if targets.is_empty() {
            return fail("no target to measure");
        }
        if self.profiles.is_empty() {
            return fail("no profile to run");
        }
        if self.depths.is_empty() || self.depths.iter().any(|&d| d == 0 || d > DEPTH_MAX) {
            return fail("outstanding I/Os must be whole numbers from 1 to 65536");
        }
        let mut names: Vec<&str> = targets.iter().map(|t| t.name()).collect();
        names.sort_unstable();
        if names.windows(2).any(|pair| pair[0] == pair[1]) {
            return fail("two targets have the same name; label them NAME=URI");
        }
        Ok(())
    }

    fn run_options(&self, outstanding: usize) -> RunOptions {
        RunOptions {
            outstanding,
            warmup: self.warmup,
            duration: self.duration,
            working_set_bytes: self.working_set_bytes,
            seed: self.seed,
            sequential: self.sequential,
        }
    }
}

fn draw_target(wanted: bool) -> ProgressDrawTarget {
    if wanted && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

fn points_bar(bars: &MultiProgress, total: u64) -> ProgressBar {
    let bar = bars.add(ProgressBar::new(total));
    let style = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} points, about {eta} left  {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("=> "));
    if !bars.is_hidden() {
        bar.enable_steady_tick(TICK);
    }
    bar
}

/// Prefill one target with a bytes progress bar of its own.
async fn prefill_target(
    target: &dyn Target,
    working_set_bytes: u64,
    bars: &MultiProgress,
) -> Result<(), BenchError> {
    let bar = bars.insert(0, ProgressBar::new(working_set_bytes));
    let style = ProgressStyle::with_template(
        "prefill {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("=> "));
    bar.set_message(target.name().to_string());
    let result = prefill(target, working_set_bytes, &mut |done| {
        bar.set_position(done)
    })
    .await;
    bar.finish_and_clear();
    result
}

/// Run the sweep and gather the report.
pub async fn sweep(
    targets: &[Box<dyn Target>],
    config: &SweepConfig,
) -> Result<Report, BenchError> {
    sweep_settled(targets, config, &mut |_| Box::pin(async { Ok(()) })).await
}

/// Waits until a target (by name) is idle again, e.g. until a write-back
/// cache has destaged what the last profile left; an error ends the sweep.
pub type Settle<'a> = dyn FnMut(&str) -> BoxFuture<'static, Result<(), String>> + 'a;

/// [`sweep`], calling `settle` before each profile of a target (after its
/// prefill), so that every profile starts from an idle target as separate
/// measurements would; the depths of one profile still run back to back.
pub async fn sweep_settled(
    targets: &[Box<dyn Target>],
    config: &SweepConfig,
    settle: &mut Settle<'_>,
) -> Result<Report, BenchError> {
    config.check(targets)?;
    let started = rfc3339(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    );
    let total = (targets.len() * config.profiles.len() * config.depths.len()) as u64;
    let bars = MultiProgress::with_draw_target(draw_target(config.progress));
    let bar = points_bar(&bars, total);
    let mut points = Vec::new();
    let mut infos = Vec::new();
    for target in targets {
        let target = target.as_ref();
        let alignment = target.alignment().max(1);
        let working_set_bytes = working_set(target, config.working_set_bytes, alignment)?;
        let prefilled = config.prefill && config.profiles.iter().any(Profile::reads);
        if prefilled {
            prefill_target(target, working_set_bytes, &bars).await?;
        }
        infos.push(TargetInfo {
            name: target.name().to_string(),
            size_bytes: target.size_bytes(),
            working_set_bytes,
            prefilled,
        });
        for profile in &config.profiles {
            bar.set_message(format!(
                "{} settling before {}",
                target.name(),
                profile.name
            ));
            settle(target.name())
                .await
                .map_err(|reason| BenchError::target(target, TargetError::Other(reason)))?;
            for &outstanding in &config.depths {
                bar.set_message(format!("{} {} ×{outstanding}", target.name(), profile.name));
                let point = run_point(target, profile, &config.run_options(outstanding)).await?;
                bar.inc(1);
                if config.progress && bars.is_hidden() {
                    eprintln!("{}", plain_line(&point, bar.position(), total));
                }
                points.push(point);
            }
        }
    }
    bar.finish_and_clear();
    Ok(report(started, config, infos, points))
}

/// A point measured, as a line off a terminal:
/// `point 3 of 45: vm database ×8: 1234 IO/s, 10.1 MB/s`.
fn plain_line(point: &Point, done: u64, total: u64) -> String {
    format!(
        "point {done} of {total}: {} {} ×{}: {:.0} IO/s, {:.1} MB/s",
        point.target, point.profile, point.outstanding, point.iops, point.mb_per_s
    )
}

fn report(
    started: String,
    config: &SweepConfig,
    targets: Vec<TargetInfo>,
    points: Vec<Point>,
) -> Report {
    Report {
        started,
        machine: Machine::this(),
        settings: Settings {
            depths: config.depths.clone(),
            warmup_seconds: config.warmup.as_secs_f64(),
            duration_seconds: config.duration.as_secs_f64(),
            seed: config.seed,
            sequential: config.sequential,
        },
        profiles: config.profiles.clone(),
        targets,
        points,
    }
}
