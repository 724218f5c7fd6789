//! `terrace bench paper`: the white paper's measurement, on drive models.
//!
//! The paper measured 8 × 10K rpm SAS 900 GB drives and 3 × SAS SSDs of
//! 400 GB with Iometer on a 32 GB measurement file. This command builds the
//! same machine from sparse files and drive models:
//!
//! ```text
//!   DIR/hdd-0.img … hdd-7.img   900G sparse, model hdd-10k, media hdd
//!   DIR/ssd-0.img … ssd-2.img   400G sparse, model ssd-sata, usage journal
//!        └─ pool "paper" (daemon in this process, NBD on DIR/nbd.sock)
//!             ├─ simple        8 columns          (cache 0)
//!             ├─ mirror        2-way              (cache 0)
//!             ├─ parity        single parity      (cache 0)
//!             ├─ dual-parity   dual parity        (cache 0)
//!             └─ LAYOUT-wbc    the same with a write-back cache on the
//!                              journal SSDs       (only with --cache SIZE)
//! ```
//!
//! Files as large as the drives keep the geometry right: a drive model maps
//! the whole file onto the whole platter, so spaces of a few GiB occupy the
//! outer edge of each modelled drive as the paper's 32 GB file did (4 GB of
//! each 900 GB drive), and seeks stay short as they were there. Sparse
//! files cost only the bytes written.
//!
//! Every space is measured over NBD by the same generator as any other
//! target, one after another (a space's prefill, then its profiles and
//! depths; each profile starts once the space's log has destaged what the
//! one before left, as the paper's spaces were idle between runs), and the
//! report sets the figures beside the paper's findings
//! (`findings.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use clap::Args;
use terrace_bench::report::Report;
use terrace_bench::{NbdTarget, Target};
use terrace_engine::io::file::create_sparse_file;
use terrace_engine::io::SystemEnv;

use super::findings;
use super::{cli_error, generator_runtime, write_outputs, OutputArgs, PrefillWhen, SweepArgs};
use crate::api::{DiskSpec, Request, SpaceCreate, SpaceDetail, SpaceView};
use crate::cli::call;
use crate::daemon::{self, DaemonConfig};
use crate::units::{format_size, parse_size};
use crate::CliError;

/// The paper's drives: 8 capacity HDDs and 3 SSDs.
const HDD_COUNT: usize = 8;
const SSD_COUNT: usize = 3;
/// The pool the spaces are carved from.
const POOL: &str = "paper";
/// Threads of the in-process daemon: the NBD server and the engine; the
/// generator has a thread of its own.
const DAEMON_THREADS: usize = 2;

#[derive(Args, Debug)]
pub struct PaperArgs {
    /// Folder for the disk files, sockets and daemon state.
    #[arg(long, default_value = "bench-paper")]
    dir: PathBuf,
    /// The markdown report.
    #[arg(long, default_value = "docs/PAPER.md")]
    report: PathBuf,
    /// Size of every space; the paper's measurement file was 32G.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    space_size: u64,
    /// Layouts to measure, comma-separated: simple, mirror, parity, dual-parity.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "simple,mirror,parity,dual-parity"
    )]
    layouts: Vec<String>,
    /// Also measure every layout with a write-back cache of SIZE on the
    /// journal SSDs (32M to 100G; the paper used 1G).
    #[arg(long, value_parser = parse_size)]
    cache: Option<u64>,
    /// Size of each HDD file (the modelled drive's capacity).
    #[arg(long, default_value = "900G", value_parser = parse_size)]
    hdd_size: u64,
    /// Size of each SSD file.
    #[arg(long, default_value = "400G", value_parser = parse_size)]
    ssd_size: u64,
    /// Folder for the SSD files instead of --dir, e.g. /dev/shm: a modelled
    /// SSD acknowledges a FUA write from its protected buffer in 30 µs, and
    /// a backing file whose own flush takes longer (on most disks) shows
    /// through. Only the bytes written take memory.
    #[arg(long)]
    ssd_dir: Option<PathBuf>,
    /// Keep the disk files and the daemon's state afterwards (by default they
    /// are deleted, and the folders too if nothing else is in them).
    #[arg(long)]
    keep: bool,
    /// Write the report again from an earlier run's JSON (the report and
    /// `paper-run.json` in the SVG folder), without measuring.
    #[arg(long)]
    render: bool,
    #[command(flatten)]
    sweep: SweepArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// One space to create: name, layout, copies, redundancy.
struct Layout {
    name: &'static str,
    layout: &'static str,
    copies: Option<u32>,
    redundancy: Option<u32>,
}

const LAYOUTS: [Layout; 4] = [
    Layout {
        name: "simple",
        layout: "simple",
        copies: None,
        redundancy: None,
    },
    Layout {
        name: "mirror",
        layout: "mirror",
        copies: Some(2),
        redundancy: None,
    },
    Layout {
        name: "parity",
        layout: "parity",
        copies: None,
        redundancy: Some(1),
    },
    Layout {
        name: "dual-parity",
        layout: "parity",
        copies: None,
        redundancy: Some(2),
    },
];

/// What the report needs to know about the run besides the points; saved
/// as `paper-run.json` beside the report's JSON so that `--render` can write
/// the report again.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PaperRun {
    pub command: String,
    pub spaces: Vec<SpaceView>,
    pub hdd_bytes: u64,
    pub ssd_bytes: u64,
    pub space_bytes: u64,
    pub cache_bytes: Option<u64>,
    /// Where the SSD files were, if not with the HDD files.
    #[serde(default)]
    pub ssd_directory: Option<PathBuf>,
    pub svg_directory: PathBuf,
    /// Where the report goes (its image links are relative to it).
    pub report_directory: PathBuf,
}

fn layouts(names: &[String]) -> Result<Vec<&'static Layout>, CliError> {
    names
        .iter()
        .map(|name| {
            LAYOUTS
                .iter()
                .find(|layout| layout.name == name.trim())
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "layout {name:?}: use simple, mirror, parity or dual-parity"
                    ))
                })
        })
        .collect()
}

fn disk_files(
    directory: &Path,
    ssd_directory: &Path,
    args: &PaperArgs,
) -> Vec<(PathBuf, u64, DiskSpec)> {
    let hdds = (0..HDD_COUNT).map(|index| {
        let path = directory.join(format!("hdd-{index}.img"));
        let spec = DiskSpec {
            path: path.display().to_string(),
            media: Some("hdd".into()),
            model: Some("hdd-10k".into()),
            ..DiskSpec::default()
        };
        (path, args.hdd_size, spec)
    });
    let ssds = (0..SSD_COUNT).map(|index| {
        let path = ssd_directory.join(format!("ssd-{index}.img"));
        let spec = DiskSpec {
            path: path.display().to_string(),
            media: Some("ssd".into()),
            usage: Some("journal".into()),
            model: Some("ssd-sata".into()),
            ..DiskSpec::default()
        };
        (path, args.ssd_size, spec)
    });
    hdds.chain(ssds).collect()
}

/// Where the plots go: `--svg`, or `paper/` beside the report.
fn svg_directory(args: &PaperArgs) -> PathBuf {
    args.output
        .svg
        .clone()
        .unwrap_or_else(|| args.report.parent().unwrap_or(Path::new(".")).join("paper"))
}

/// Where the report's JSON goes: `--json-file`, or `paper.json` with the plots.
fn json_path(args: &PaperArgs) -> PathBuf {
    args.output
        .json_file
        .clone()
        .unwrap_or_else(|| svg_directory(args).join("paper.json"))
}

fn run_path(args: &PaperArgs) -> PathBuf {
    json_path(args).with_file_name("paper-run.json")
}

fn write_report(args: &PaperArgs, report: &Report, run: &PaperRun) -> Result<(), CliError> {
    let markdown = findings::markdown(report, run);
    if let Some(parent) = args.report.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.report, markdown)?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}

/// `--render`: the report from an earlier run's JSON files.
fn render(args: &PaperArgs) -> Result<(), CliError> {
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|error| {
            CliError::Usage(format!(
                "{}: {error}; --render needs the JSON of an earlier `terrace bench paper` run",
                path.display()
            ))
        })
    };
    let report = Report::from_json(&read(json_path(args))?)
        .map_err(|e| CliError::Usage(format!("{}: {e}", json_path(args).display())))?;
    let run: PaperRun = serde_json::from_str(&read(run_path(args))?)
        .map_err(|e| CliError::Usage(format!("{}: {e}", run_path(args).display())))?;
    write_report(args, &report, &run)
}

pub fn run(args: PaperArgs, _control: &Path) -> Result<(), CliError> {
    if args.render {
        return render(&args);
    }
    let chosen = layouts(&args.layouts)?;
    let config = args.sweep.config()?;
    if args.sweep.prefill == PrefillWhen::Only {
        return Err(CliError::Usage(
            "bench paper measures; --prefill only has no meaning here".into(),
        ));
    }
    let directory = std::path::absolute(&args.dir)?;
    std::fs::create_dir_all(&directory)?;
    let ssd_directory = match &args.ssd_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            std::path::absolute(dir)?
        }
        None => directory.clone(),
    };
    let files = disk_files(&directory, &ssd_directory, &args);
    let daemon_runtime = daemon::runtime_builder()
        .worker_threads(DAEMON_THREADS)
        .build()?;
    let daemon_config = DaemonConfig {
        state_dir: directory.join("state"),
        control_socket: directory.join("control.sock"),
        nbd_tcp: None,
        nbd_socket: Some(directory.join("nbd.sock")),
        nbd_threads: daemon::NBD_THREADS_DEFAULT,
        log_memory: None,
    };
    let _ = std::fs::remove_dir_all(&daemon_config.state_dir);
    for (path, size, _) in &files {
        let _ = std::fs::remove_file(path);
        create_sparse_file(path, *size)?;
    }
    eprintln!(
        "{} sparse disk files in {}: {HDD_COUNT} × hdd-10k ({}), {SSD_COUNT} × ssd-sata journal ({})",
        files.len(),
        directory.display(),
        format_size(args.hdd_size),
        format_size(args.ssd_size)
    );
    let running = daemon_runtime
        .block_on(daemon::start(
            daemon_config.clone(),
            Arc::new(SystemEnv::new()),
        ))
        .map_err(CliError::Daemon)?;
    let result = measure(
        &args,
        &chosen,
        &config,
        &daemon_config,
        &daemon_runtime,
        &files,
    );
    running.daemon.request_shutdown();
    let _ = daemon_runtime.block_on(running.finished);
    if !args.keep {
        for (path, _, _) in &files {
            let _ = std::fs::remove_file(path);
        }
        // The daemon's state, then the folders if nothing else is in them
        // (`remove_dir` leaves a folder that holds anything).
        let _ = std::fs::remove_dir_all(&daemon_config.state_dir);
        let _ = std::fs::remove_dir(&ssd_directory);
        let _ = std::fs::remove_dir(&directory);
    }
    let (report, run) = result?;
    let mut output = args.output.clone();
    output.json_file = Some(json_path(&args));
    write_outputs(&report, &output)?;
    let run_json =
        serde_json::to_string_pretty(&run).map_err(|e| CliError::Protocol(e.to_string()))?;
    std::fs::write(run_path(&args), run_json + "\n")?;
    write_report(&args, &report, &run)
}

/// How long a space's log may take to destage before a profile starts
/// anyway (with a warning).
const DESTAGE_WAIT_MAX: Duration = Duration::from_secs(600);
/// How often the log's dirty bytes are asked for meanwhile.
const DESTAGE_POLL: Duration = Duration::from_millis(200);

/// Wait until `space`'s log holds nothing dirty (at once for a space
/// without a cache), so each profile starts from an idle space, as the
/// paper's runs did, not with the last profile's writes still destaging.
async fn destaged(control: PathBuf, space: String) -> Result<(), String> {
    let request = Request::SpaceShow {
        pool: Some(POOL.into()),
        name: space.clone(),
    };
    let started = Instant::now();
    loop {
        let answer = call(&control, &request).await.map_err(|e| e.to_string())?;
        let detail: SpaceDetail = serde_json::from_value(answer).map_err(|e| e.to_string())?;
        let dirty = detail.space.cache.map_or(0, |cache| cache.dirty_bytes);
        if dirty == 0 {
            return Ok(());
        }
        if started.elapsed() >= DESTAGE_WAIT_MAX {
            eprintln!(
                "warning: space {space} still has {} dirty in its log after {} s; measuring anyway",
                format_size(dirty),
                DESTAGE_WAIT_MAX.as_secs()
            );
            return Ok(());
        }
        tokio::time::sleep(DESTAGE_POLL).await;
    }
}

/// Pool, spaces, sweep; the daemon is running.
fn measure(
    args: &PaperArgs,
    chosen: &[&Layout],
    config: &terrace_bench::SweepConfig,
    daemon_config: &DaemonConfig,
    daemon_runtime: &tokio::runtime::Runtime,
    files: &[(PathBuf, u64, DiskSpec)],
) -> Result<(Report, PaperRun), CliError> {
    let control = daemon_config.control_socket.clone();
    let spaces = daemon_runtime.block_on(create_spaces(args, chosen, &control, files))?;
    let socket = daemon_config
        .nbd_socket
        .clone()
        .ok_or_else(|| CliError::Daemon("no NBD socket".into()))?;
    let report = generator_runtime()?.block_on(async {
        let mut targets: Vec<Box<dyn Target>> = Vec::new();
        for space in &spaces {
            let uri = format!("nbd+unix:///{}?socket={}", space.export, socket.display());
            targets.push(Box::new(
                NbdTarget::connect(&space.name, &uri, 1)
                    .await
                    .map_err(|error| CliError::Daemon(format!("space {}: {error}", space.name)))?,
            ));
        }
        let mut settle = |space: &str| -> BoxFuture<'static, Result<(), String>> {
            Box::pin(destaged(control.clone(), space.to_string()))
        };
        terrace_bench::sweep_settled(&targets, config, &mut settle)
            .await
            .map_err(cli_error)
    })?;
    let svg_directory = svg_directory(args);
    let run = PaperRun {
        command: std::iter::once("terrace".to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        spaces,
        hdd_bytes: args.hdd_size,
        ssd_bytes: args.ssd_size,
        space_bytes: args.space_size,
        cache_bytes: args.cache,
        ssd_directory: args.ssd_dir.clone(),
        svg_directory: svg_directory.clone(),
        report_directory: args.report.parent().unwrap_or(Path::new(".")).to_path_buf(),
    };
    if args.output.svg.is_none() {
        for path in terrace_bench::plot::write_svgs(&report, &svg_directory).map_err(cli_error)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok((report, run))
}

async fn create_spaces(
    args: &PaperArgs,
    chosen: &[&Layout],
    control: &PathBuf,
    files: &[(PathBuf, u64, DiskSpec)],
) -> Result<Vec<SpaceView>, CliError> {
    let request = Request::PoolCreate {
        name: POOL.into(),
        disks: files.iter().map(|(_, _, spec)| spec.clone()).collect(),
        slab_bytes: None,
        metadata_slot_bytes: None,
        force: false,
    };
    call(control, &request).await?;
    let mut variants: Vec<(&Layout, String, u64)> = chosen
        .iter()
        .map(|layout| (*layout, layout.name.to_string(), 0))
        .collect();
    if let Some(cache) = args.cache {
        variants.extend(
            chosen
                .iter()
                .map(|layout| (*layout, format!("{}-wbc", layout.name), cache)),
        );
    }
    let mut spaces = Vec::new();
    for (layout, name, cache_bytes) in variants {
        let create = SpaceCreate {
            pool: POOL.into(),
            name: name.clone(),
            layout: layout.layout.into(),
            copies: layout.copies,
            redundancy: layout.redundancy,
            // As wide as the paper's spaces: every HDD (mirror: half of
            // them per copy), not one short as the automatic choice would
            // leave them to keep room for rebuilds.
            columns: Some(HDD_COUNT as u32 / layout.copies.unwrap_or(1)),
            interleave_bytes: None,
            size_bytes: Some(args.space_size),
            fault_domain: None,
            cache_bytes: Some(cache_bytes),
            export: None,
            checksums: true,
            provisioning: None,
        };
        let answer = call(control, &Request::SpaceCreate(create)).await?;
        let space: SpaceView =
            serde_json::from_value(answer).map_err(|e| CliError::Protocol(e.to_string()))?;
        eprintln!(
            "space {name}: {}, {} columns ({})",
            space.layout_description, space.columns, space.columns_reason
        );
        spaces.push(space);
    }
    Ok(spaces)
}
