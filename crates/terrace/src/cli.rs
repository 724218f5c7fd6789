//! The command line: every command but `daemon` and `demo` is a request to
//! the daemon over its control socket; answers print as text or, with
//! `--json`, as the API's JSON.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::api::{
    CandidateView, DiskSpec, ErrorKind, ImportableView, JobView, PoolSummary, PoolView, Request,
    Response, SettingsChange, SpaceCreate, SpaceDetail, SpaceView,
};
use crate::units::parse_size;
use crate::{render, CliError};

/// A bandwidth per second as `pool set` takes it: a size, or `0`,
/// `unlimited` or `none` for no limit (what `pool status` shows).
fn parse_rate(text: &str) -> Result<u64, String> {
    match text.trim() {
        "unlimited" | "none" => Ok(0),
        other => parse_size(other).map_err(|error| error.to_string()),
    }
}

/// Attributes applied to every disk of the command (a disk's own
/// `path,media=...` attributes win).
#[derive(Args, Debug, Clone, Default)]
pub struct DiskDefaults {
    /// Media of every disk given (one disk's own: DISK,media=M): hdd, ssd,
    /// unknown, or auto (the default: what the device says, a block
    /// device's queue/rotational or a drive model's kind; a plain file is
    /// unknown).
    #[arg(long)]
    media: Option<String>,
    /// What the pool may use every disk given for (one disk's own:
    /// DISK,usage=U): auto, manual, hot-spare, journal, retired.
    #[arg(long)]
    usage: Option<String>,
    /// Enclosure (fault domain) label.
    #[arg(long)]
    enclosure: Option<String>,
    /// Node (fault domain) label.
    #[arg(long)]
    node: Option<String>,
    /// Make the disks behave like this drive: hdd-10k, hdd-7k, ssd-sata,
    /// nvme, or a custom spec (see docs/DRIVE_MODELS.md).
    #[arg(long)]
    model: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Create a pool from blank disks or files: DISK is a path, optionally
    /// followed by ,media=hdd|ssd ,usage=U ,enclosure=E ,node=N ,model=M
    /// (a model's overrides follow it: a.img,model=hdd-7k,wcache=0).
    Create {
        name: String,
        #[arg(required = true)]
        disks: Vec<String>,
        /// Slab size (allocation unit), a power of two from 64K to 64G.
        #[arg(long, value_parser = parse_size)]
        slab: Option<u64>,
        /// Size of each of the two metadata slots on every disk (a multiple
        /// of 4K from 64K to 1G). Default: 256 bytes per slab of the disks
        /// given, at least 4M, which leaves room for disks added later and
        /// for repairs; `pool status` shows how much is used.
        #[arg(long, value_parser = parse_size)]
        metadata_slot: Option<u64>,
        #[command(flatten)]
        defaults: DiskDefaults,
        /// Overwrite disks that hold something (a file system, swap, a
        /// partition table, another RAID's member...); refused otherwise.
        #[arg(long)]
        force: bool,
    },
    /// List open pools.
    List,
    /// Health, disks and spaces of one pool or all.
    Status { name: Option<String> },
    /// Import a pool from devices or folders of disk files (without --name
    /// and with several pools found, list them). A path may carry
    /// `,model=M` as in `pool create`.
    Import {
        paths: Vec<String>,
        /// Drive model for every imported disk without its own.
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        name: Option<String>,
        /// Open read-write even without a metadata majority.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        read_only: bool,
    },
    /// Flush, close and forget a pool (its disks keep it; import brings it back).
    Export {
        name: String,
        /// Export it even while NBD clients have its spaces open (they
        /// then get I/O errors); refused otherwise.
        #[arg(long)]
        force: bool,
    },
    /// Erase a pool: every disk becomes blank. Asks first unless --yes.
    Destroy {
        name: String,
        #[arg(long)]
        yes: bool,
        /// Destroy it even while NBD clients have its spaces open (they
        /// then get I/O errors); refused otherwise.
        #[arg(long)]
        force: bool,
    },
    /// Take back failed or stale disks whose fault has passed (all that
    /// are present, or DISK: an index or path): each catches up on what
    /// was written since it left; says per space what it missed and what,
    /// if anything, is uncertain. Exits 1 if a disk still fails.
    Clear { name: String, disk: Option<String> },
    /// Change how the pool handles failures.
    Set {
        name: String,
        /// When a disk fails or goes missing: never (wait), always (repair
        /// at once), auto (repair at once if there is room; a missing disk
        /// that returns before its repair is done catches up in place).
        #[arg(long, value_parser = ["never", "always", "auto"])]
        retire_missing: Option<String>,
        /// Repair many extents at once (parallel) or one at a time.
        #[arg(long, value_parser = ["parallel", "sequential"])]
        repair: Option<String>,
        /// Repair, move and crash-resync bandwidth limit per second, e.g.
        /// 200M (at least 1M); 0 or unlimited = none.
        #[arg(long, value_parser = parse_rate)]
        repair_rate: Option<u64>,
        /// How often the pool scrubs by itself: daily, weekly, monthly
        /// (the default, every 28 days), off, or a duration (36h, 10d, 2w).
        #[arg(long)]
        scrub: Option<String>,
        /// Read and checksum errors a disk survives: this many within the
        /// window fail it, and it is repaired like a missing disk (default
        /// 10; 0 = never fail a disk for them).
        #[arg(long)]
        error_limit: Option<u32>,
        /// The window of --error-limit: seconds or a duration (90s, 10m,
        /// 1h, 1d; default 10m).
        #[arg(long)]
        error_window: Option<String>,
        /// What a space created without --provisioning gets: fixed (the
        /// default) or thin.
        #[arg(long, value_parser = ["fixed", "thin"])]
        provisioning: Option<String>,
        /// Log an alert when the slabs allocated cross these percentages
        /// of the capacity, up or down: up to three, e.g. 70,85,95 (the
        /// default), or off.
        #[arg(long)]
        alert: Option<String>,
    },
    /// Bring the pool up to this version's format: spaces from before
    /// block checksums get them (where the pool has room), and the
    /// metadata is written in the current format. An import does the
    /// same; this says per space what it has.
    Upgrade { name: String },
    /// Read every block of every space, check that copies and parity
    /// agree, and repair what does not (a job: `job list` shows its
    /// progress and, at its end, what it repaired).
    Scrub {
        name: String,
        /// Bytes read from disks per second, e.g. 200M (at least 1M);
        /// default: the pool's repair rate.
        #[arg(long, value_parser = parse_rate)]
        rate: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Jobs (repairs, moves, resyncs) with progress, rate and ETA.
    List { pool: Option<String> },
    /// Follow a job with a progress bar until it ends.
    Wait {
        id: u64,
        #[arg(long)]
        pool: Option<String>,
    },
    /// Stop a running job where it is; it stays paused across restarts.
    Pause {
        id: u64,
        #[arg(long)]
        pool: Option<String>,
    },
    /// Go on with a paused job from where it stopped.
    Resume {
        id: u64,
        #[arg(long)]
        pool: Option<String>,
    },
    /// End a job for good; what it moved stays moved. A cancelled repair
    /// is done again by `terrace disk remove POOL DISK` (re-create the
    /// disk's slabs elsewhere, then release it); a cancelled move of logs
    /// onto journal disks starts again at the next change of the pool's
    /// disks or slabs, or when the daemon restarts.
    Cancel {
        id: u64,
        #[arg(long)]
        pool: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum DiskCommand {
    /// Candidate disks (block devices, or the given paths) and why one cannot be pooled.
    List { paths: Vec<String> },
    /// Add disks to a pool. A disk of the pool that went missing (pulled
    /// and plugged back, or left out of an import) is taken back instead:
    /// it catches up on what was written while it was away, and keeps its
    /// usage and place.
    Add {
        pool: String,
        #[arg(required = true)]
        disks: Vec<String>,
        #[command(flatten)]
        defaults: DiskDefaults,
        /// Overwrite disks that hold something (a file system, swap, a
        /// partition table, another RAID's member...); refused otherwise.
        #[arg(long)]
        force: bool,
    },
    /// Change a disk's usage (DISK: index or path).
    Set {
        pool: String,
        disk: String,
        /// auto, manual, hot-spare, journal or retired.
        #[arg(long)]
        usage: String,
    },
    /// Move everything off a disk, then release it (a job).
    Remove { pool: String, disk: String },
    /// Add NEW to the pool and move everything of OLD onto it (a job).
    Replace {
        pool: String,
        old: String,
        new: String,
        #[command(flatten)]
        defaults: DiskDefaults,
        /// Overwrite NEW if it holds something (a file system, swap, a
        /// partition table, another RAID's member...); refused otherwise.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum SpaceCommand {
    /// Create a space (a virtual disk) in a pool.
    Create {
        pool: String,
        name: String,
        /// simple, mirror or parity.
        #[arg(long, value_parser = ["simple", "mirror", "parity"])]
        layout: String,
        /// Mirror copies: 2 or 3 (default 2).
        #[arg(long, value_parser = clap::value_parser!(u32).range(2..=3))]
        copies: Option<u32>,
        /// Parity redundancy: 1 (single) or 2 (dual) (default 1).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=2))]
        redundancy: Option<u32>,
        /// Columns; chosen automatically (up to 8) if not given.
        #[arg(long)]
        columns: Option<u32>,
        /// Interleave: a power of two from 4K to 16M (default 256K).
        #[arg(long, value_parser = parse_size)]
        interleave: Option<u64>,
        /// Size, e.g. 10G.
        #[arg(long, value_parser = parse_size, conflicts_with = "max", required_unless_present = "max")]
        size: Option<u64>,
        /// As large as the pool allows.
        #[arg(long)]
        max: bool,
        /// Keep redundant slabs on distinct: disk, enclosure or node.
        #[arg(long)]
        fault_domain: Option<String>,
        /// Write-back cache size, 32M to 100G; 0 for none. Default: 1G when
        /// the pool has journal disks, 32M for parity without.
        #[arg(long, value_parser = parse_size)]
        cache: Option<u64>,
        /// NBD export name, fixed for the space's life (default: its name;
        /// refused if a space of an open pool has it).
        #[arg(long)]
        export: Option<String>,
        /// Keep a checksum of every 4 KiB block, checked on every read, so
        /// a damaged copy is found and rebuilt (on, the default), or not.
        #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
        checksums: bool,
        /// fixed: every extent allocated now (the default); thin: each
        /// extent on its first write, so the space may be larger than the
        /// pool (writes to new extents then fail with ENOSPC when it is full).
        #[arg(long, value_parser = ["fixed", "thin"])]
        provisioning: Option<String>,
    },
    /// Check that every row's copies or parity agree with its data.
    Verify {
        name: String,
        #[arg(long)]
        pool: Option<String>,
    },
    /// Change a live space's write-back cache size (32M to 100G).
    Cache {
        name: String,
        /// New size, e.g. 4G.
        #[arg(value_parser = parse_size, allow_hyphen_values = true)]
        size: u64,
        #[arg(long)]
        pool: Option<String>,
    },
    /// List spaces.
    List { pool: Option<String> },
    /// Explain a space: layout, columns and why, where each extent lives.
    Show {
        name: String,
        #[arg(long)]
        pool: Option<String>,
    },
    /// Grow a space.
    Resize {
        name: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
        #[arg(long)]
        pool: Option<String>,
    },
    /// Delete a space and free its slabs. Asks first unless --yes (after
    /// checking that it may).
    Delete {
        name: String,
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        yes: bool,
        /// Delete it even while NBD clients have it open (they then get
        /// I/O errors); refused otherwise.
        #[arg(long)]
        force: bool,
    },
}

/// Parse `path[,key=value...]` into a disk spec, with defaults. A model's
/// overrides follow it in the same list (`a.img,model=hdd-7k,wcache=0`):
/// after `model=`, a key that is not a disk attribute belongs to the model
/// (the daemon checks it against the model's parameters).
pub fn disk_spec(text: &str, defaults: &DiskDefaults) -> Result<DiskSpec, CliError> {
    let mut parts = text.split(',');
    let path = parts.next().unwrap_or_default();
    let absolute = std::path::absolute(path).unwrap_or_else(|_| PathBuf::from(path));
    let mut spec = DiskSpec {
        path: absolute.to_string_lossy().into_owned(),
        media: defaults.media.clone(),
        usage: defaults.usage.clone(),
        enclosure: defaults.enclosure.clone(),
        node: defaults.node.clone(),
        model: defaults.model.clone(),
    };
    let mut model_given = false;
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("{part:?} in {text:?}: expected key=value")))?;
        let slot = match key {
            "media" => &mut spec.media,
            "usage" => &mut spec.usage,
            "enclosure" => &mut spec.enclosure,
            "node" => &mut spec.node,
            "model" => {
                model_given = true;
                &mut spec.model
            }
            _ if model_given => {
                let model = spec.model.get_or_insert_with(String::new);
                model.push(',');
                model.push_str(part);
                continue;
            }
            other => {
                return Err(CliError::Usage(format!(
                    "unknown disk attribute {other:?}: use media, usage, enclosure, node or \
                     model (a model's overrides follow it: a.img,model=hdd-7k,wcache=0)"
                )))
            }
        };
        *slot = Some(value.to_string());
    }
    Ok(spec)
}

fn absolute_paths(paths: Vec<String>) -> Vec<String> {
    paths
        .into_iter()
        .map(|p| std::path::absolute(&p).map_or(p, |a| a.to_string_lossy().into_owned()))
        .collect()
}

/// Send one request to the daemon and wait for its answer.
pub async fn call(control: &PathBuf, request: &Request) -> Result<serde_json::Value, CliError> {
    let stream = tokio::net::UnixStream::connect(control)
        .await
        .map_err(|error| CliError::NoDaemon {
            socket: control.display().to_string(),
            error,
        })?;
    let (reader, mut writer) = stream.into_split();
    let mut line = serde_json::to_string(request).map_err(|e| CliError::Protocol(e.to_string()))?;
    line.push('\n');
    writer.write_all(line.as_bytes()).await?;
    let mut answer = String::new();
    BufReader::new(reader).read_line(&mut answer).await?;
    let response: Response = serde_json::from_str(&answer)
        .map_err(|e| CliError::Protocol(format!("{e}: {answer:?}")))?;
    if response.ok {
        return Ok(response.result);
    }
    let message = response
        .error
        .unwrap_or_else(|| "the daemon refused the request".into());
    match response.kind {
        Some(ErrorKind::Usage) => Err(CliError::Usage(message)),
        _ => Err(CliError::Refused(message)),
    }
}

fn confirm(question: &str, expected: &str) -> Result<(), CliError> {
    print!("{question} Type {expected:?} to confirm: ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if answer.trim() == expected {
        Ok(())
    } else {
        Err(CliError::Refused(
            "not confirmed; nothing was changed".into(),
        ))
    }
}

fn parse<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, CliError> {
    serde_json::from_value(value).map_err(|e| CliError::Protocol(e.to_string()))
}

pub fn pool_request(command: PoolCommand) -> Result<Request, CliError> {
    Ok(match command {
        PoolCommand::Create {
            name,
            disks,
            slab,
            metadata_slot,
            defaults,
            force,
        } => Request::PoolCreate {
            name,
            disks: disks
                .iter()
                .map(|d| disk_spec(d, &defaults))
                .collect::<Result<_, _>>()?,
            slab_bytes: slab,
            metadata_slot_bytes: metadata_slot,
            force,
        },
        PoolCommand::List => Request::PoolList,
        PoolCommand::Status { name } => Request::PoolStatus { name },
        PoolCommand::Import {
            paths,
            model,
            name,
            force,
            read_only,
        } => {
            let defaults = DiskDefaults {
                model,
                ..DiskDefaults::default()
            };
            Request::PoolImport {
                disks: paths
                    .iter()
                    .map(|p| disk_spec(p, &defaults))
                    .collect::<Result<_, _>>()?,
                name,
                force,
                read_only,
            }
        }
        PoolCommand::Export { name, force } => Request::PoolExport { name, force },
        PoolCommand::Clear { name, disk } => Request::PoolClear { name, disk },
        PoolCommand::Set {
            name,
            retire_missing,
            repair,
            repair_rate,
            scrub,
            error_limit,
            error_window,
            provisioning,
            alert,
        } => Request::PoolSet {
            name,
            change: SettingsChange {
                retire_missing,
                repair_policy: repair,
                repair_rate_bytes: repair_rate,
                scrub,
                error_limit,
                error_window,
                provisioning,
                alert,
            },
        },
        PoolCommand::Upgrade { name } => Request::PoolUpgrade { name },
        PoolCommand::Scrub { name, rate } => Request::PoolScrub {
            name,
            rate_bytes: rate.filter(|&rate| rate > 0),
        },
        PoolCommand::Destroy { name, yes, force } => {
            if !yes {
                confirm(
                    &format!(
                        "Destroy pool {name}? Every space in it and all their data will be gone."
                    ),
                    &name,
                )?;
            }
            Request::PoolDestroy { name, force }
        }
    })
}

pub fn disk_request(command: DiskCommand) -> Result<Request, CliError> {
    Ok(match command {
        DiskCommand::List { paths } => Request::DiskList {
            paths: absolute_paths(paths),
        },
        DiskCommand::Add {
            pool,
            disks,
            defaults,
            force,
        } => Request::DiskAdd {
            pool,
            disks: disks
                .iter()
                .map(|d| disk_spec(d, &defaults))
                .collect::<Result<_, _>>()?,
            force,
        },
        DiskCommand::Set { pool, disk, usage } => Request::DiskSet {
            pool,
            disk: if disk.parse::<u16>().is_ok() {
                disk
            } else {
                absolute_paths(vec![disk]).remove(0)
            },
            usage,
        },
        DiskCommand::Remove { pool, disk } => Request::DiskRemove {
            disk: disk_argument(disk),
            pool,
        },
        DiskCommand::Replace {
            pool,
            old,
            new,
            defaults,
            force,
        } => Request::DiskReplace {
            old: disk_argument(old),
            new: disk_spec(&new, &defaults)?,
            pool,
            force,
        },
    })
}

/// A disk named by index stays an index; a path becomes absolute.
fn disk_argument(disk: String) -> String {
    if disk.parse::<u16>().is_ok() {
        disk
    } else {
        absolute_paths(vec![disk]).remove(0)
    }
}

/// The request of a job command (`wait` is a loop of `JobList`).
pub fn job_request(command: &JobCommand) -> Request {
    let control = |pool: &Option<String>, id: u64, action: &str| Request::JobControl {
        pool: pool.clone(),
        id,
        action: action.into(),
    };
    match command {
        JobCommand::List { pool } | JobCommand::Wait { pool, .. } => {
            Request::JobList { pool: pool.clone() }
        }
        JobCommand::Pause { id, pool } => control(pool, *id, "pause"),
        JobCommand::Resume { id, pool } => control(pool, *id, "resume"),
        JobCommand::Cancel { id, pool } => control(pool, *id, "cancel"),
    }
}

/// [`call`]; while it creates or grows a space's write-back cache, the
/// log's preparation (written with zeroes, as long as the cache is large)
/// is drawn on standard error when that is a terminal.
pub async fn call_showing_preparation(
    control: &PathBuf,
    request: &Request,
) -> Result<serde_json::Value, CliError> {
    let pool = match request {
        Request::SpaceCreate(create) if create.cache_bytes != Some(0) => {
            Some(Some(create.pool.clone()))
        }
        Request::SpaceCache { pool, .. } => Some(pool.clone()),
        _ => None,
    };
    let Some(pool) = pool else {
        return call(control, request).await;
    };
    let status = Request::PoolStatus { name: pool };
    let answer = call(control, request);
    tokio::pin!(answer);
    let mut progress = crate::progress::Progress::new();
    loop {
        tokio::select! {
            result = &mut answer => {
                progress.finish();
                return result;
            }
            () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {
                let pools = call(control, &status).await.and_then(parse::<Vec<PoolView>>);
                let preparing = pools.ok().and_then(|pools| {
                    pools.into_iter().find_map(|pool| pool.preparing)
                });
                if let Some(preparing) = preparing {
                    let (what, percent, steady) = render::preparation_progress(&preparing);
                    progress.show(&what, percent, &steady, "");
                }
            }
        }
    }
}

/// Poll a job until it ends, drawing its progress on standard error.
pub async fn wait_for_job(
    control: &PathBuf,
    id: u64,
    pool: Option<String>,
) -> Result<JobView, CliError> {
    let request = Request::JobList { pool };
    let mut progress = crate::progress::Progress::new();
    loop {
        let jobs: Vec<JobView> = parse(call(control, &request).await?)?;
        let job = jobs.into_iter().find(|job| job.id == id).ok_or_else(|| {
            CliError::Refused(format!("no job {id}; `terrace job list` shows them"))
        })?;
        let (what, percent, steady, detail) = render::job_progress(&job);
        progress.show(&what, percent, &steady, &detail);
        if !matches!(job.state.as_str(), "running" | "paused") {
            progress.finish();
            return Ok(job);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// `on` or `off`.
fn parse_on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("'{other}' is neither on nor off")),
    }
}

/// The request of a space command; `space delete` asks the daemon at
/// `control` whether it may first, then the user.
pub fn space_request(command: SpaceCommand, control: &PathBuf) -> Result<Request, CliError> {
    Ok(match command {
        SpaceCommand::Create {
            pool,
            name,
            layout,
            copies,
            redundancy,
            columns,
            interleave,
            size,
            max: _,
            fault_domain,
            cache,
            export,
            checksums,
            provisioning,
        } => Request::SpaceCreate(SpaceCreate {
            pool,
            name,
            layout,
            copies,
            redundancy,
            columns,
            interleave_bytes: interleave,
            size_bytes: size,
            fault_domain,
            cache_bytes: cache,
            export,
            checksums,
            provisioning,
        }),
        SpaceCommand::Verify { name, pool } => Request::SpaceVerify { pool, name },
        SpaceCommand::Cache { name, size, pool } => Request::SpaceCache {
            pool,
            name,
            bytes: size,
        },
        SpaceCommand::List { pool } => Request::SpaceList { pool },
        SpaceCommand::Show { name, pool } => Request::SpaceShow { pool, name },
        SpaceCommand::Resize { name, size, pool } => Request::SpaceResize {
            pool,
            name,
            size_bytes: size,
        },
        SpaceCommand::Delete {
            name,
            pool,
            yes,
            force,
        } => {
            let request = |check| Request::SpaceDelete {
                pool: pool.clone(),
                name: name.clone(),
                force,
                check,
            };
            if !yes {
                let check = request(true);
                let answer = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(call(control, &check))?;
                let pool = answer["pool"].as_str().unwrap_or_default();
                let space = answer["deletable"].as_str().unwrap_or(&name);
                confirm(
                    &format!("Delete space {space} of pool {pool}? Its data will be gone."),
                    space,
                )?;
            }
            request(false)
        }
    })
}

/// What makes an answer a failure (exit 1) though the daemon answered:
/// a verify that found rows whose redundancy disagrees, or a `pool clear`
/// that left a disk out because it still fails.
pub fn failure_in(request: &Request, result: &serde_json::Value) -> Option<String> {
    match request {
        Request::SpaceVerify { name, .. } => {
            let mismatched = result["mismatched_rows"].as_u64().unwrap_or(0);
            (mismatched > 0)
                .then(|| format!("space {name}: {mismatched} rows whose blocks fail their checksums or whose copies or parity disagree"))
        }
        Request::PoolClear { name, .. } => match result["still_failing"].as_u64() {
            Some(count) if count > 0 => Some(format!(
                "{count} disk(s) of pool {name} not taken back (see above)"
            )),
            _ => None,
        },
        _ => None,
    }
}

/// Turn an answer into text, by the request that asked for it.
pub fn render(request: &Request, result: serde_json::Value) -> Result<String, CliError> {
    Ok(match request {
        Request::PoolList => render::pool_list(&parse::<Vec<PoolSummary>>(result)?),
        Request::PoolStatus { .. } => parse::<Vec<PoolView>>(result)?
            .iter()
            .map(render::pool_status)
            .collect::<Vec<_>>()
            .join("\n"),
        Request::PoolImport { .. } if result.get("importable").is_some() => {
            render::importable(&parse::<Vec<ImportableView>>(result["importable"].clone())?)
        }
        Request::PoolCreate { .. }
        | Request::PoolImport { .. }
        | Request::DiskAdd { .. }
        | Request::DiskSet { .. } => render::pool_status(&parse::<PoolView>(result)?),
        Request::DiskList { .. } => render::candidates(&parse::<Vec<CandidateView>>(result)?),
        Request::JobList { .. } => render::jobs(&parse::<Vec<JobView>>(result)?),
        Request::JobControl { .. }
        | Request::DiskRemove { .. }
        | Request::DiskReplace { .. }
        | Request::PoolScrub { .. } => render::jobs(&[parse::<JobView>(result)?]),
        Request::PoolSet { .. } => render::pool_status(&parse::<PoolView>(result)?),
        Request::PoolUpgrade { .. } => render::upgraded(&parse::<PoolView>(result)?),
        Request::PoolClear { .. } => render::cleared(&result),
        Request::SpaceVerify { .. } => render::verify(&result),
        Request::SpaceCreate(_) | Request::SpaceResize { .. } | Request::SpaceCache { .. } => {
            let space: SpaceView = parse(result)?;
            // The cache is what `space cache` changed, and a creation may
            // have given one by default: say where it is either way.
            let cache = space.cache.as_ref().map_or(String::new(), |cache| {
                format!(
                    "; write-back cache {}, log on disks {}{}",
                    crate::units::format_size(cache.bytes),
                    render::log_disks(cache),
                    render::log_placement(cache)
                )
            });
            let size = match space.provisioning.as_str() {
                "thin" => format!(
                    "{} thin ({} allocated: extents take room at their first write)",
                    crate::units::format_size(space.size_bytes),
                    crate::units::format_size(space.allocated_bytes)
                ),
                _ => crate::units::format_size(space.size_bytes),
            };
            format!(
                "space {} in pool {}: {}, {size} ({}), export {}{cache}\n",
                space.name,
                space.pool,
                space.layout_description,
                space.columns_reason,
                space.export
            )
        }
        Request::PoolDestroy { name, .. } => {
            let mut text = format!("destroyed: {name}\n");
            for left in result["labels_left"].as_array().into_iter().flatten() {
                text += &format!("label left on {}\n", left.as_str().unwrap_or_default());
            }
            text
        }
        Request::SpaceList { .. } => render::space_list(&parse::<Vec<SpaceView>>(result)?),
        Request::SpaceShow { .. } => render::space_detail(&parse::<SpaceDetail>(result)?),
        Request::Shutdown => {
            "the daemon is shutting down: it stops serving, closes its pools cleanly and exits\n"
                .into()
        }
        _ => match result.as_object() {
            Some(object) => object
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{k}: {}\n",
                        v.as_str().map_or(v.to_string(), str::to_string)
                    )
                })
                .collect(),
            None => format!("{result}\n"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_spec_carries_its_models_overrides() {
        let defaults = DiskDefaults::default();
        let spec = disk_spec(
            "/d/a.img,model=ssd-sata,units=4,wbuf=0,usage=journal",
            &defaults,
        )
        .unwrap();
        assert_eq!(spec.path, "/d/a.img");
        assert_eq!(spec.model.as_deref(), Some("ssd-sata,units=4,wbuf=0"));
        assert_eq!(spec.usage.as_deref(), Some("journal"));
        let plain = disk_spec("/d/b.img,media=hdd,model=hdd-7k", &defaults).unwrap();
        assert_eq!(plain.model.as_deref(), Some("hdd-7k"));
        assert_eq!(plain.media.as_deref(), Some("hdd"));
    }

    #[test]
    fn a_disk_spec_refuses_unknown_attributes_before_a_model() {
        let defaults = DiskDefaults::default();
        for text in [
            "/d/a.img,wcache=0,model=hdd-7k",
            "/d/a.img,colour=red",
            "/d/a.img,usage",
        ] {
            let error = disk_spec(text, &defaults).unwrap_err();
            assert!(matches!(error, CliError::Usage(_)), "{text}: {error}");
        }
    }

    #[test]
    fn checksums_take_on_or_off_and_default_to_on() {
        #[derive(clap::Parser)]
        struct Line {
            #[command(subcommand)]
            command: SpaceCommand,
        }
        let checksums = |extra: &[&str]| {
            let line = [
                "terrace", "create", "p", "s", "--layout", "simple", "--size", "1G",
            ];
            let parsed = <Line as clap::Parser>::try_parse_from(line.iter().chain(extra));
            match parsed.map(|line| line.command) {
                Ok(SpaceCommand::Create { checksums, .. }) => Ok(checksums),
                Ok(_) => unreachable!(),
                Err(error) => Err(error.to_string()),
            }
        };
        assert_eq!(checksums(&[]), Ok(true));
        assert_eq!(checksums(&["--checksums", "on"]), Ok(true));
        assert_eq!(checksums(&["--checksums", "off"]), Ok(false));
        assert!(checksums(&["--checksums", "maybe"]).is_err());
    }
}
