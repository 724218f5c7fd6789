//! `terrace bench`: the white paper's load profiles, swept over outstanding
//! I/Os, against any block target; `terrace bench paper` rebuilds the
//! paper's machine from drive models and measures every layout it measured;
//! `terrace bench merge` folds alternating runs into one report.
//!
//! ```text
//!   terrace bench [OPTIONS] TARGET...      targets → terrace_bench::sweep
//!     TARGET  [LABEL=]nbd://HOST:PORT/NAME      any NBD server
//!             [LABEL=]nbd+unix:///NAME?socket=P
//!             [LABEL=]PATH                      file or block device
//!             [LABEL=]PATH,PATH,...             files striped (the raw limit)
//!             [LABEL=]space:NAME[@POOL]         a space of the running daemon
//!             [LABEL=]engine:NAME@DISK,...      a space of a pool imported here (local.rs)
//!   terrace bench paper [OPTIONS]          paper.rs
//!   terrace bench merge REPORT.json...     median of repeated points
//! ```
//!
//! The load generator runs on a single-threaded runtime of its own (see the
//! `terrace_bench` crate documentation for why); `paper` runs its daemon on
//! a separate multi-threaded runtime so that the two never share a thread's
//! queue.

mod findings;
mod guard;
mod local;
mod paper;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use terrace_bench::report::Report;
use terrace_bench::targets::Location;
use terrace_bench::units::parse_duration;
use terrace_bench::{
    BenchError, Profile, SequentialMode, SweepConfig, Target, TargetError, TargetSpec,
};

use crate::api::{DaemonView, Request, SpaceDetail, SpaceView};
use crate::cli::call;
use crate::daemon::catalog::SOLE_WRITER_PREFIX;
use crate::units::parse_size;
use crate::CliError;

/// Targets: `[LABEL=]URI|PATH|PATH,PATH...|space:NAME[@POOL]|engine:NAME@DISK,...`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    /// What to measure: nbd://HOST:PORT/NAME, nbd+unix:///NAME?socket=PATH,
    /// a file or block device, PATH,PATH,... (files striped in 256 KiB units:
    /// the raw limit of a set of drives), space:NAME[@POOL] (a space of
    /// the running daemon), or engine:NAME@DISK,DISK,... (a space of the
    /// pool on those disks or folders, imported by this command: the
    /// engine without the NBD transport; the pool must not be open in a
    /// daemon); each optionally labelled LABEL=...
    #[arg(value_name = "TARGET", required = true)]
    targets: Vec<String>,
    #[command(flatten)]
    sweep: SweepArgs,
    #[command(flatten)]
    output: OutputArgs,
    /// NBD connections per NBD target, used in turn.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    connections: u32,
    /// Measure only the profiles that never write, without prefill: safe
    /// on a target in use (reads measure the data that is there).
    #[arg(long)]
    read_only: bool,
    /// Write over targets that hold data: a space NBD clients have open, a
    /// device that is mounted, held, partitioned or not zero at its start,
    /// a file with data. Without it a run that writes refuses them.
    #[arg(long)]
    destroy_data: bool,
}

/// What a run does to its targets, so that one holding data is refused
/// before anything is written (see `bench/guard.rs`).
#[derive(Debug, Clone, Copy)]
struct WritePlan {
    /// The profiles write, or the run is `--prefill only`: whatever the
    /// target holds is overwritten.
    writes: bool,
    /// Only a prefill before the reads would write; a target in use is
    /// then read as it is instead.
    prefills: bool,
    destroy_data: bool,
}

impl WritePlan {
    /// Refused with `reason` (what the target holds) unless the run only
    /// reads or was told to destroy data; `Ok(true)`: read it, don't
    /// prefill it.
    fn held(&self, label: &str, reason: String) -> Result<bool, CliError> {
        if self.destroy_data || !self.writes {
            return Ok(!self.destroy_data);
        }
        Err(CliError::Refused(format!(
            "target {label}: {reason}; the benchmark writes over all of it, so nothing was \
             written. Measure only reads (--read-only), or destroy the data with --destroy-data"
        )))
    }
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Rebuild the white paper's machine from drive models (8 × hdd-10k,
    /// 3 × ssd-sata journal disks), measure simple, mirror, single and dual
    /// parity spaces over the five profiles and write a report beside the
    /// paper's findings.
    Paper(Box<paper::PaperArgs>),
    /// Fold JSON reports of several runs into one (the median run of every
    /// point measured more than once) and write it as JSON, SVG or a table.
    Merge {
        /// Reports written by `terrace bench --json`.
        #[arg(required = true, value_name = "REPORT")]
        reports: Vec<PathBuf>,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// When random data is written over the working set before measuring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrefillWhen {
    /// Before the sweep, if any profile reads.
    Reads,
    /// Never (the target already holds data).
    Never,
    /// Prefill, then stop without measuring.
    Only,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Sequential {
    /// One stream N requests deep, as Iometer and fio issue it.
    Shared,
    /// N independent streams, one per outstanding request.
    PerSlot,
}

/// How the sweep runs; shared by `bench` and `bench paper`.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// A standard profile (file-copy, file-server, database, streaming,
    /// restore) or a custom mix ACCESS:READ%:BLOCK such as random:70:8K;
    /// repeat for several [default: the five standard profiles].
    #[arg(long = "profile", short = 'p', value_name = "PROFILE")]
    profiles: Vec<String>,
    /// Outstanding I/Os to sweep, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,3,8,16,32,64,128,256,512",
        value_name = "N,N,..."
    )]
    depths: Vec<usize>,
    /// Warm-up before each point, e.g. 500ms or 2s.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Measured time of each point, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Working set: the first SIZE bytes of each target [default: all of it].
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Write random data over the working set first.
    #[arg(long, value_enum, default_value_t = PrefillWhen::Reads)]
    prefill: PrefillWhen,
    /// How sequential profiles issue their requests.
    #[arg(long, value_enum, default_value_t = Sequential::Shared)]
    sequential: Sequential,
    /// Seed of the offset and data generator (same seed, same requests).
    #[arg(long)]
    seed: Option<u64>,
    /// No progress bar on standard error.
    #[arg(long)]
    no_progress: bool,
}

/// Where the results go; without any, the table is printed. (`--json`, the
/// CLI's global flag, prints the whole report as JSON on standard output.)
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Write the whole report (every point, machine, settings) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json_file: Option<PathBuf>,
    /// Write one SVG plot per profile into DIR (throughput against
    /// outstanding I/Os, one line per target).
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
    /// Print the table (on standard output; on standard error with --json).
    /// The default on a terminal, and when no other output is asked for.
    #[arg(long)]
    table: bool,
    /// Set from the CLI's global `--json`: the report goes to standard output.
    #[arg(skip)]
    json_stdout: bool,
}

impl SweepArgs {
    fn config(&self) -> Result<SweepConfig, CliError> {
        let profiles = if self.profiles.is_empty() {
            Profile::standard()
        } else {
            self.profiles
                .iter()
                .map(|text| Profile::parse(text))
                .collect::<Result<_, _>>()
                .map_err(|error| CliError::Usage(error.to_string()))?
        };
        let defaults = SweepConfig::default();
        Ok(SweepConfig {
            profiles,
            depths: self.depths.clone(),
            warmup: self.warmup,
            duration: self.duration,
            working_set_bytes: self.size,
            prefill: self.prefill != PrefillWhen::Never,
            seed: self.seed.unwrap_or(defaults.seed),
            sequential: match self.sequential {
                Sequential::Shared => SequentialMode::Shared,
                Sequential::PerSlot => SequentialMode::PerSlot,
            },
            progress: !self.no_progress,
        })
    }
}

/// A benchmark error as the CLI reports it: settings are usage errors.
pub fn cli_error(error: BenchError) -> CliError {
    match error {
        BenchError::Settings(_) | BenchError::Profile(_) => CliError::Usage(error.to_string()),
        other => CliError::Bench(other),
    }
}

/// The generator's runtime: one thread, timers and sockets.
fn generator_runtime() -> Result<tokio::runtime::Runtime, CliError> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `json_stdout`: the CLI's global `--json` was given.
pub fn run(mut args: BenchArgs, control: &Path, json_stdout: bool) -> Result<(), CliError> {
    match args.command {
        Some(BenchCommand::Paper(mut paper)) => {
            paper.output.json_stdout = json_stdout;
            return paper::run(*paper, control);
        }
        Some(BenchCommand::Merge {
            reports,
            mut output,
        }) => {
            output.json_stdout = json_stdout;
            return merge(&reports, &output);
        }
        None => args.output.json_stdout = json_stdout,
    }
    let mut config = args.sweep.config()?;
    if args.read_only {
        read_only(&mut config, args.sweep.prefill)?;
    }
    let plan = WritePlan {
        writes: config.profiles.iter().any(Profile::writes)
            || args.sweep.prefill == PrefillWhen::Only,
        prefills: config.prefill && config.profiles.iter().any(Profile::reads),
        destroy_data: args.destroy_data,
    };
    let specs = args
        .targets
        .iter()
        .map(|text| TargetSpec::parse(text).map_err(CliError::Usage))
        .collect::<Result<Vec<_>, _>>()?;
    let runtime = generator_runtime()?;
    runtime.block_on(async {
        let mut local = local::LocalPools::default();
        let result = async {
            let mut checked = Vec::new();
            let mut in_use = Vec::new();
            for spec in &specs {
                let (spec, held) = check_target(spec, control, &plan).await?;
                if held {
                    in_use.push(spec.label.clone());
                }
                checked.push(spec);
            }
            let mut targets = Vec::new();
            for spec in &checked {
                targets.push(open_target(spec, args.connections as usize, &mut local).await?);
            }
            if plan.prefills && !in_use.is_empty() {
                eprintln!(
                    "{} in use: no prefill, the reads measure the data there",
                    in_use.join(", ")
                );
                config.prefill = false;
            }
            if args.sweep.prefill == PrefillWhen::Only {
                return prefill_only(&targets, &config).await;
            }
            let report = terrace_bench::sweep(&targets, &config)
                .await
                .map_err(cli_error)?;
            write_outputs(&report, &args.output)
        }
        .await;
        let closed = local.close().await;
        result.and(closed)
    })
}

/// `--read-only`: keep the profiles that never write, and prefill nothing.
fn read_only(config: &mut SweepConfig, prefill: PrefillWhen) -> Result<(), CliError> {
    if prefill == PrefillWhen::Only {
        return Err(CliError::Usage(
            "--read-only and --prefill only contradict each other".into(),
        ));
    }
    config.profiles.retain(|profile| !profile.writes());
    if config.profiles.is_empty() {
        return Err(CliError::Usage(
            "--read-only leaves no profile: give one that only reads, such as streaming or \
             random:100:8K"
                .into(),
        ));
    }
    config.prefill = false;
    Ok(())
}

/// Look at one target before anything is opened (so that the benchmark's
/// own connections to one space never count against another target on
/// it): a `space:` target is looked up in the daemon and becomes its NBD
/// URI. A target that holds data is refused if `plan` writes over it; the
/// answer says whether it holds data (it is then only read).
async fn check_target(
    spec: &TargetSpec,
    control: &Path,
    plan: &WritePlan,
) -> Result<(TargetSpec, bool), CliError> {
    Ok(match &spec.location {
        Location::Path(path) => {
            let text = path.to_str().unwrap_or_default();
            if text.starts_with(local::PREFIX) {
                return Ok((spec.clone(), false));
            }
            match text.strip_prefix("space:") {
                Some(space) => {
                    let (uri, held) = space_target(&spec.label, space, control, plan).await?;
                    let location = Location::Nbd(uri);
                    (
                        TargetSpec {
                            location,
                            ..spec.clone()
                        },
                        held,
                    )
                }
                None => (
                    spec.clone(),
                    file_held(&spec.label, std::slice::from_ref(path), plan)?,
                ),
            }
        }
        Location::Stripe(paths) => (spec.clone(), file_held(&spec.label, paths, plan)?),
        Location::Nbd(_) => (spec.clone(), false),
    })
}

/// Connect to or open one target checked by [`check_target`]; an
/// `engine:` target's pool is imported into `local`. Errors name the
/// target and say what to do.
async fn open_target(
    spec: &TargetSpec,
    connections: usize,
    local: &mut local::LocalPools,
) -> Result<Box<dyn Target>, CliError> {
    if let Location::Path(path) = &spec.location {
        if let Some(text) = path.to_str().and_then(|p| p.strip_prefix(local::PREFIX)) {
            let (space, disks) = local::parse(text).map_err(CliError::Usage)?;
            return local.open(&spec.label, &space, &disks).await;
        }
    }
    let target = open_spec(spec, connections).await;
    if let (Err(_), Some(export)) = (&target, sole_writer_export(spec)) {
        // The daemon refused the sole writer: a client came meanwhile.
        return Err(CliError::Refused(format!(
            "target {}: space {} was opened by an NBD client meanwhile; nothing was written. \
             Measure only reads (--read-only), or destroy the data with --destroy-data",
            spec.label,
            export.trim_start_matches(SOLE_WRITER_PREFIX)
        )));
    }
    target
}

/// Whether the files or devices at `paths` hold data (refused if `plan`
/// writes over them).
fn file_held(label: &str, paths: &[PathBuf], plan: &WritePlan) -> Result<bool, CliError> {
    if plan.destroy_data {
        return Ok(false);
    }
    let mut held = false;
    for path in paths {
        if let Some(reason) = guard::data_held(path) {
            // A target of one path is named by it already; a stripe's
            // member is named with the reason.
            let shown = path.display().to_string();
            let reason = if shown == label {
                reason
            } else {
                format!("{shown}: {reason}")
            };
            held = plan.held(label, reason)?;
        }
    }
    Ok(held)
}

/// The export of a sole-writer connection in `spec`'s URI, if it is one.
fn sole_writer_export(spec: &TargetSpec) -> Option<&str> {
    match &spec.location {
        Location::Nbd(uri) => uri
            .strip_prefix("nbd+unix:///")
            .filter(|export| export.starts_with(SOLE_WRITER_PREFIX))
            .and_then(|export| export.split('?').next()),
        _ => None,
    }
}

async fn open_spec(spec: &TargetSpec, connections: usize) -> Result<Box<dyn Target>, CliError> {
    spec.open(connections).await.map_err(|source| {
        let hint = match &spec.location {
            Location::Nbd(_) => "is the NBD server running, and is the export name right?",
            Location::Path(_) | Location::Stripe(_) => {
                "does the path exist, and may this user read and write it?"
            }
        };
        CliError::Bench(BenchError::Target {
            target: spec.label.clone(),
            source: TargetError::Other(format!("{source}; {hint}")),
        })
    })
}

/// A `space:NAME[@POOL]` target labelled `label`: its URI, and whether
/// NBD clients have it open (refused if `plan` writes over it). A run that
/// writes connects as the space's sole writer, which the daemon refuses
/// while another client is connected.
async fn space_target(
    label: &str,
    text: &str,
    control: &Path,
    plan: &WritePlan,
) -> Result<(String, bool), CliError> {
    let (socket, space) = space_export(text, control)
        .await
        .map_err(|error| CliError::Refused(format!("target {label}: {error}")))?;
    let export = &space.export;
    if plan.destroy_data {
        return Ok((format!("nbd+unix:///{export}?socket={socket}"), false));
    }
    if space.nbd_connections > 0 {
        let clients = space.nbd_connections;
        let reason = format!(
            "space {} is open by {clients} NBD connection{}",
            space.name,
            if clients == 1 { "" } else { "s" }
        );
        plan.held(label, reason)?;
        return Ok((format!("nbd+unix:///{export}?socket={socket}"), true));
    }
    let prefix = if plan.writes || plan.prefills {
        SOLE_WRITER_PREFIX
    } else {
        ""
    };
    Ok((
        format!("nbd+unix:///{prefix}{export}?socket={socket}"),
        false,
    ))
}

/// `NAME[@POOL]` of the daemon at `control`: the daemon's NBD socket and
/// the space.
async fn space_export(text: &str, control: &Path) -> Result<(String, SpaceView), CliError> {
    let (name, pool) = match text.split_once('@') {
        Some((name, pool)) => (name, Some(pool.to_string())),
        None => (text, None),
    };
    if name.is_empty() {
        return Err(CliError::Usage(
            "space: needs a space name, as in space:vm or space:vm@tank".into(),
        ));
    }
    let control = control.to_path_buf();
    let daemon: DaemonView = serde_json::from_value(call(&control, &Request::DaemonStatus).await?)
        .map_err(|e| CliError::Protocol(e.to_string()))?;
    let socket = daemon.nbd_socket.ok_or_else(|| {
        CliError::Refused(format!(
            "the daemon serves NBD on no Unix socket; name the space by its TCP URI instead, \
             e.g. nbd://{}/{name}",
            daemon.nbd_tcp.as_deref().unwrap_or("127.0.0.1:10809")
        ))
    })?;
    let request = Request::SpaceShow {
        pool,
        name: name.to_string(),
    };
    let detail: SpaceDetail = serde_json::from_value(call(&control, &request).await?)
        .map_err(|e| CliError::Protocol(e.to_string()))?;
    // A space whose export name another pool's space serves is reached
    // by its alias.
    let mut space = detail.space;
    if space.export_not_served.is_some() {
        space.export = format!("{}/{}", space.pool, space.name);
    }
    Ok((socket, space))
}

async fn prefill_only(targets: &[Box<dyn Target>], config: &SweepConfig) -> Result<(), CliError> {
    for target in targets {
        let target = target.as_ref();
        let alignment = target.alignment().max(1);
        let bytes = terrace_bench::runner::working_set(target, config.working_set_bytes, alignment)
            .map_err(cli_error)?;
        terrace_bench::prefill::prefill(target, bytes, &mut |_| {})
            .await
            .map_err(cli_error)?;
        eprintln!("prefilled {}: {bytes} bytes", target.name());
    }
    Ok(())
}

fn output_error(path: &Path, source: std::io::Error) -> CliError {
    CliError::Bench(BenchError::Output {
        path: path.display().to_string(),
        source,
    })
}

/// JSON, SVGs and the table, as asked.
pub fn write_outputs(report: &Report, output: &OutputArgs) -> Result<(), CliError> {
    let text = report
        .to_json()
        .map_err(BenchError::Json)
        .map_err(cli_error)?;
    if let Some(path) = &output.json_file {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| output_error(parent, e))?;
        }
        std::fs::write(path, format!("{text}\n")).map_err(|e| output_error(path, e))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(directory) = &output.svg {
        for path in terrace_bench::plot::write_svgs(report, directory).map_err(cli_error)? {
            eprintln!("wrote {}", path.display());
        }
    }
    let table = format!(
        "{}\n{}",
        report.machine.describe(),
        terrace_bench::table::render(report)
    );
    if output.json_stdout {
        println!("{text}");
        if output.table {
            eprint!("{table}");
        }
    } else if output.table
        || std::io::stdout().is_terminal()
        || (output.json_file.is_none() && output.svg.is_none())
    {
        print!("{table}");
    }
    Ok(())
}

fn merge(paths: &[PathBuf], output: &OutputArgs) -> Result<(), CliError> {
    let mut reports = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|e| output_error(path, e))?;
        let report = Report::from_json(&text).map_err(|error| {
            CliError::Usage(format!(
                "{}: not a report of `terrace bench --json`: {error}",
                path.display()
            ))
        })?;
        reports.push(report);
    }
    let report =
        Report::merge(reports).ok_or_else(|| CliError::Usage("no report to merge".into()))?;
    write_outputs(&report, output)
}
