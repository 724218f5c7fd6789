//! The control API: requests from the CLI, answered one at a time per
//! connection (admin changes are serialised by the registry's admin lock).

use std::sync::Arc;

use serde::Serialize;
use terrace_engine::count;
use terrace_engine::io::BlockDevice;
use terrace_engine::layout::{Layout, LayoutError};
use terrace_engine::meta::{DiskIndex, FaultDomain, Media, RepairPolicy, RetireMissing, Usage};
use terrace_engine::{
    EngineError, ImportOptions, JobAction, NewDisk, Pool, PoolConfig, Space, SpaceConfig, SpaceSize,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::names;
use super::registry::{expand_disks, open_device, open_for_import, DiskPath, PoolEntry, Registry};
use super::{candidates, intake, views, Daemon};
use crate::api::{
    DaemonView, DiskSpec, ErrorKind, ImportableView, PoolView, Request, Response, SettingsChange,
    SpaceCreate,
};
use crate::units::format_size;

/// Longest request line: 1 MiB is far more than any request needs and
/// bounds what a confused client can make the daemon buffer.
const REQUEST_LINE_MAX_BYTES: usize = 1 << 20;

pub(super) type Answer = Result<serde_json::Value, (ErrorKind, String)>;

pub(super) fn failure(message: impl std::fmt::Display + 'static) -> (ErrorKind, String) {
    (ErrorKind::Failure, super::advice::advised(&message))
}

pub(super) fn usage(message: impl std::fmt::Display + 'static) -> (ErrorKind, String) {
    (ErrorKind::Usage, super::advice::advised(&message))
}

pub(super) fn value(result: impl Serialize) -> Answer {
    serde_json::to_value(result).map_err(failure)
}

/// Serve one control connection until the client hangs up.
pub async fn serve(daemon: Arc<Daemon>, stream: UnixStream) {
    let (reader, mut writer) = stream.into_split();
    let mut lines = BufReader::new(reader);
    let mut line = String::new();
    loop {
        line.clear();
        let read = (&mut lines)
            .take(REQUEST_LINE_MAX_BYTES as u64)
            .read_line(&mut line)
            .await;
        let response = match read {
            Ok(0) | Err(_) => return,
            Ok(_) if !line.ends_with('\n') => {
                Response::failure(ErrorKind::Usage, "request line too long or cut short")
            }
            Ok(_) => match serde_json::from_str::<Request>(&line) {
                Ok(request) => match handle(&daemon, request).await {
                    Ok(result) => Response::success(result),
                    Err((kind, message)) => Response::failure(kind, message),
                },
                Err(error) => {
                    Response::failure(ErrorKind::Usage, format!("malformed request: {error}"))
                }
            },
        };
        let mut text = serde_json::to_string(&response).unwrap_or_else(|_| "{\"ok\":false}".into());
        text.push('\n');
        if writer.write_all(text.as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn handle(daemon: &Arc<Daemon>, request: Request) -> Answer {
    let registry = &daemon.registry;
    match request {
        Request::PoolCreate {
            name,
            disks,
            slab_bytes,
            metadata_slot_bytes,
            force,
        } => {
            let slabs = (slab_bytes, metadata_slot_bytes);
            pool_create(registry, name, disks, slabs, force).await
        }
        Request::PoolList => {
            let mut summaries = Vec::new();
            for entry in registry.all() {
                summaries.push(views::summary(&entry.pool.status().await));
            }
            value(summaries)
        }
        Request::PoolStatus { name } => pool_status(registry, name).await,
        Request::PoolImport {
            disks,
            name,
            force,
            read_only,
        } => pool_import(registry, disks, name, force, read_only).await,
        Request::PoolExport { name, force } => pool_export(registry, &name, false, force).await,
        Request::PoolDestroy { name, force } => pool_export(registry, &name, true, force).await,
        Request::PoolClear { name, disk } => super::clear::pool_clear(registry, &name, disk).await,
        Request::DiskList { paths } => value(candidates::list(registry, &paths).await),
        Request::DiskAdd { pool, disks, force } => disk_add(registry, &pool, disks, force).await,
        Request::DiskSet { pool, disk, usage } => disk_set(registry, &pool, &disk, &usage).await,
        Request::SpaceCreate(create) => space_create(registry, create).await,
        Request::SpaceVerify { pool, name } => {
            let (entry, space) = find_space(registry, pool.as_deref(), &name)?;
            let name = space.name();
            let report = terrace_engine::verify_space(&space)
                .await
                .map_err(failure)?;
            Ok(super::verify::answer(&entry.pool, name, &report).await)
        }
        Request::SpaceCache { pool, name, bytes } => {
            if bytes == 0 {
                return Err(usage(
                    "a live space's write-back cache is resized, not removed: use 32M to 100G \
                     (0, no cache, is a choice at creation; a parity space always keeps a log)",
                ));
            }
            check_whole_blocks("a cache size of", bytes)?;
            check_cache_size(Some(bytes))?;
            let _admin = registry.admin.lock().await;
            let (entry, space) = find_space(registry, pool.as_deref(), &name)?;
            let name = space.name();
            caches_fit_memory(registry, bytes, Some(&space))?;
            entry
                .pool
                .set_cache_size(name, bytes)
                .await
                .map_err(|error| match error {
                    EngineError::InvalidSetting { .. } => usage(error),
                    other => failure(other),
                })?;
            space_view(registry, &entry, name).await
        }
        Request::SpaceList { pool } => space_list(registry, pool).await,
        Request::SpaceShow { pool, name } => space_show(registry, pool, &name).await,
        Request::SpaceResize {
            pool,
            name,
            size_bytes,
        } => {
            check_whole_blocks("a space size of", size_bytes)?;
            let _admin = registry.admin.lock().await;
            let (entry, space) = find_space(registry, pool.as_deref(), &name)?;
            let name = space.name();
            entry
                .pool
                .resize_space(name, size_bytes)
                .await
                .map_err(failure)?;
            space_view(registry, &entry, name).await
        }
        Request::SpaceDelete {
            pool,
            name,
            force,
            check,
        } => {
            let _admin = registry.admin.lock().await;
            let (entry, space) = find_space(registry, pool.as_deref(), &name)?;
            let name = space.name().to_string();
            let pool = entry.pool.name();
            if !force {
                in_use(registry, &[space], &format!("space {name}"), "delete it").await?;
            }
            if let Some(why) = entry.pool.read_only_reason() {
                return Err(failure(format!(
                    "pool {pool} is read-only ({why}); nothing was changed"
                )));
            }
            if check {
                return value(serde_json::json!({ "deletable": name, "pool": pool }));
            }
            entry.pool.delete_space(&name).await.map_err(failure)?;
            value(serde_json::json!({ "deleted": name, "pool": pool }))
        }
        Request::DiskRemove { pool, disk } => {
            let _admin = registry.admin.lock().await;
            let entry = find_pool(registry, &pool)?;
            let index = disk_index(&entry, &pool, &disk).await?;
            let id = entry.pool.start_evacuation(index).await.map_err(failure)?;
            job_answer(&entry, id).await
        }
        Request::DiskReplace {
            pool,
            old,
            new,
            force,
        } => disk_replace(registry, &pool, &old, new, force).await,
        Request::PoolSet { name, change } => pool_set(registry, &name, change).await,
        Request::PoolUpgrade { name } => {
            let _admin = registry.admin.lock().await;
            let entry = find_pool(registry, &name)?;
            entry.pool.upgrade().await.map_err(failure)?;
            value(pool_view(registry, &entry).await)
        }
        Request::PoolScrub { name, rate_bytes } => {
            super::scrub::pool_scrub(registry, &name, rate_bytes).await
        }
        Request::JobList { pool } => {
            let entries = match pool {
                Some(pool) => vec![find_pool(registry, &pool)?],
                None => registry.all(),
            };
            let mut jobs = Vec::new();
            for entry in entries {
                jobs.extend(pool_view(registry, &entry).await.jobs);
            }
            value(jobs)
        }
        Request::JobControl { pool, id, action } => job_control(registry, pool, id, &action).await,
        Request::DaemonStatus => value(daemon_view(daemon)),
        Request::Shutdown => {
            daemon.request_shutdown();
            value(serde_json::json!({ "shutting_down": true }))
        }
    }
}

fn daemon_view(daemon: &Daemon) -> DaemonView {
    DaemonView {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        control_socket: daemon.config.control_socket.display().to_string(),
        nbd_tcp: daemon.nbd_tcp.map(|address| address.to_string()),
        nbd_socket: daemon
            .config
            .nbd_socket
            .as_ref()
            .map(|p| p.display().to_string()),
        state_dir: daemon.config.state_dir.display().to_string(),
        pools: daemon
            .registry
            .all()
            .iter()
            .map(|e| e.pool.name().to_string())
            .collect(),
    }
}

/// A disk's media as declared (`hdd`, `ssd`, `unknown`), or, where none
/// is declared or `auto`, as the device says (`BlockDevice::rotational`:
/// a block device's `queue/rotational`, a drive model's kind; a regular
/// file cannot say).
pub fn parse_media(
    text: Option<&str>,
    device: &dyn BlockDevice,
) -> Result<Media, (ErrorKind, String)> {
    match text {
        None | Some("auto") => Ok(match device.rotational() {
            Some(true) => Media::Hdd,
            Some(false) => Media::Ssd,
            None => Media::Unknown,
        }),
        Some("hdd") => Ok(Media::Hdd),
        Some("ssd") => Ok(Media::Ssd),
        Some("unknown") => Ok(Media::Unknown),
        Some(other) => Err(usage(format!(
            "unknown media {other:?}: use hdd, ssd, unknown or auto"
        ))),
    }
}

pub fn parse_usage(text: &str) -> Result<Usage, (ErrorKind, String)> {
    match text {
        "auto" => Ok(Usage::Auto),
        "manual" => Ok(Usage::Manual),
        "hot-spare" => Ok(Usage::HotSpare),
        "journal" => Ok(Usage::Journal),
        "retired" => Ok(Usage::Retired),
        other => Err(usage(format!(
            "unknown usage {other:?}: use auto, manual, hot-spare, journal or retired"
        ))),
    }
}

/// Open the disks named on the command line, with their attributes, and
/// check them with [`intake`] (unless `force`, none holds anything)
/// before anything is written to any.
async fn new_disks(
    registry: &Registry,
    specs: Vec<DiskSpec>,
    pool: Option<&Pool>,
    force: bool,
) -> Result<(Vec<NewDisk>, Vec<DiskPath>), (ErrorKind, String)> {
    let given: Vec<String> = specs.iter().map(|spec| spec.path.clone()).collect();
    let given: Vec<&str> = given.iter().map(String::as_str).collect();
    intake::check_identities(registry, &given)?;
    let mut disks = Vec::new();
    let mut paths = Vec::new();
    for spec in specs {
        let path = DiskPath {
            path: spec.path.clone(),
            model: spec.model.clone(),
        };
        // The error names the path already.
        let device: Arc<dyn BlockDevice> = open_device(&path, &registry.env).map_err(failure)?;
        let mut disk = NewDisk::new(device);
        disk.media = parse_media(spec.media.as_deref(), disk.device.as_ref())?;
        disk.usage = parse_usage(spec.usage.as_deref().unwrap_or("auto"))?;
        disk.enclosure = spec.enclosure.unwrap_or_default();
        disk.node = spec.node.unwrap_or_default();
        paths.push(path);
        disks.push(disk);
    }
    // Claimed first (opening writes nothing): a disk another process
    // holds is refused as in use, never probed, let alone wiped.
    let own = match pool {
        Some(pool) => Some(pool.metadata().await.pool_id.to_string()),
        None => None,
    };
    intake::check_contents(registry, &given, own.as_deref(), force).await?;
    Ok((disks, paths))
}

pub(super) fn find_pool(registry: &Registry, name: &str) -> Result<PoolEntry, (ErrorKind, String)> {
    registry.get(name).ok_or_else(|| {
        let known: Vec<String> = registry
            .all()
            .iter()
            .map(|e| e.pool.name().to_string())
            .collect();
        failure(format!(
            "no pool named {name} (pools: {}); `terrace pool import` brings one in",
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        ))
    })
}

/// The space `name` (`NAME` or `NAME@POOL`) of `pool` if given, else of
/// whichever pool has one so named.
fn find_space(
    registry: &Registry,
    pool: Option<&str>,
    name: &str,
) -> Result<(PoolEntry, Arc<Space>), (ErrorKind, String)> {
    let (pool, name) = names::parse_space_name(name, pool).map_err(usage)?;
    let entries = match &pool {
        Some(pool) => vec![find_pool(registry, pool)?],
        None => registry.all(),
    };
    let mut found: Vec<(PoolEntry, Arc<Space>)> = entries
        .into_iter()
        .filter_map(|entry| entry.pool.space(&name).map(|space| (entry, space)))
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(failure(match pool {
            Some(pool) => format!(
                "pool {pool} has no space named {name}; `terrace space list {pool}` shows them"
            ),
            None => format!("no space named {name}; `terrace space list` shows them"),
        })),
        _ => {
            let pools: Vec<String> = found
                .iter()
                .map(|(entry, _)| entry.pool.name().to_string())
                .collect();
            Err(usage(names::ambiguous(&name, &pools)))
        }
    }
}

async fn pool_view(registry: &Registry, entry: &PoolEntry) -> PoolView {
    let status = entry.pool.status().await;
    let jobs = entry.pool.job_statuses().await;
    let settings = entry.pool.metadata().await.settings;
    let exports: Vec<names::Export> = names::exports(registry)
        .into_iter()
        .filter(|export| export.pool == entry.pool.name())
        .collect();
    let export_of = |space: &str| exports.iter().find(|export| export.space.name() == space);
    let mut view = views::pool_view(&status, &jobs, &settings, |space| {
        export_of(space).map_or_else(
            || names::alias(entry.pool.name(), space),
            |e| e.name.clone(),
        )
    });
    for space in &mut view.spaces {
        if let Some(open) = entry.pool.space(&space.name) {
            space.nbd_connections = registry.connections_to(&open) as u64;
        }
        space.export_not_served = export_of(&space.name).and_then(names::Export::not_served);
    }
    view
}

async fn space_view(registry: &Registry, entry: &PoolEntry, name: &str) -> Answer {
    let view = pool_view(registry, entry).await;
    let space = view
        .spaces
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| failure("space vanished"))?;
    value(space)
}

async fn pool_create(
    registry: &Registry,
    name: String,
    disks: Vec<DiskSpec>,
    (slab_bytes, metadata_slot_bytes): (Option<u64>, Option<u64>),
    force: bool,
) -> Answer {
    // The name first: a bad one is refused before any disk is looked at.
    terrace_engine::validate_name("pool name", &name).map_err(usage)?;
    let _admin = registry.admin.lock().await;
    if registry.get(&name).is_some() {
        return Err(failure(format!("a pool named {name} is already open here")));
    }
    let (disks, paths) = new_disks(registry, disks, None, force).await?;
    let mut config = PoolConfig::new(name);
    if let Some(slab) = slab_bytes {
        config.slab_bytes = slab;
    }
    // Sized from the disks unless asked (see `metadata_slot_bytes_for`).
    let sizes: Vec<u64> = disks.iter().map(|disk| disk.device.size_bytes()).collect();
    config.metadata_slot_bytes = metadata_slot_bytes
        .unwrap_or_else(|| terrace_engine::metadata_slot_bytes_for(&sizes, config.slab_bytes));
    let pool = Pool::create(registry.env.clone(), config, disks)
        .await
        .map_err(|error| match error {
            EngineError::InvalidName { .. } | EngineError::InvalidSetting { .. } => usage(error),
            other => failure(other),
        })?;
    let entry = PoolEntry {
        pool: Arc::new(pool),
        disks: paths,
    };
    registry.insert(entry.clone()).map_err(failure)?;
    value(pool_view(registry, &entry).await)
}

async fn pool_status(registry: &Registry, name: Option<String>) -> Answer {
    let entries = match name {
        Some(name) => vec![find_pool(registry, &name)?],
        None => registry.all(),
    };
    let mut pools = Vec::new();
    for entry in entries {
        pools.push(pool_view(registry, &entry).await);
    }
    value(pools)
}

/// Group the members found on scanned devices by pool.
fn importable(reports: &[terrace_engine::DeviceReport]) -> Vec<(ImportableView, Vec<usize>)> {
    let mut found: Vec<(ImportableView, Vec<usize>)> = Vec::new();
    for (index, report) in reports.iter().enumerate() {
        let terrace_engine::DeviceKind::Member {
            pool_name,
            pool_id,
            generation,
            ..
        } = &report.kind
        else {
            continue;
        };
        match found.iter_mut().find(|(view, _)| &view.id == pool_id) {
            Some((view, members)) => {
                view.devices.push(report.device.clone());
                view.generation = view.generation.max(*generation);
                members.push(index);
            }
            None => found.push((
                ImportableView {
                    name: pool_name.clone(),
                    id: pool_id.clone(),
                    devices: vec![report.device.clone()],
                    generation: *generation,
                },
                vec![index],
            )),
        }
    }
    found
}

async fn pool_import(
    registry: &Registry,
    specs: Vec<DiskSpec>,
    name: Option<String>,
    force: bool,
    read_only: bool,
) -> Answer {
    let _admin = registry.admin.lock().await;
    if let Some(spec) = specs
        .iter()
        .find(|spec| std::fs::symlink_metadata(&spec.path).is_err())
    {
        return Err(failure(format!(
            "cannot import from {}: no such file, folder or device",
            spec.path
        )));
    }
    // Without paths: the whole block devices in /dev that nothing else
    // uses (those that something does cannot be a pool's to import).
    let searched = specs.is_empty();
    let requested: Vec<DiskPath> = if searched {
        candidates::free_block_devices()
            .into_iter()
            .map(|path| DiskPath { path, model: None })
            .collect()
    } else {
        specs
            .into_iter()
            .map(|spec| DiskPath {
                path: spec.path,
                model: spec.model,
            })
            .collect()
    };
    let claimed = open_for_import(&expand_disks(&requested), &registry.env).await;
    let (opened, mut busy) = (claimed.opened, claimed.busy);
    if searched {
        // A device held by another program is only in the way when it
        // holds a pool.
        busy.retain(|disk| disk.pool.is_some());
    }
    let devices: Vec<Arc<dyn BlockDevice>> =
        opened.iter().map(|(_, device)| device.clone()).collect();
    let mut found = importable(&terrace_engine::scan(&devices).await);
    found.retain(|(view, _)| registry.get(&view.name).is_none());
    // A pool whose disks another process holds is refused, named or not:
    // that process may be serving it.
    let wanted_busy = busy.iter().find(|disk| match (&name, &disk.pool) {
        (Some(wanted), Some((id, pool))) => pool == wanted || id.starts_with(wanted.as_str()),
        (None, _) => found.is_empty(),
        (Some(_), None) => false,
    });
    if let Some(disk) = wanted_busy {
        return Err(failure(disk.refusal()));
    }
    let chosen = match &name {
        Some(wanted) => found
            .iter()
            .find(|(v, _)| &v.name == wanted || v.id.starts_with(wanted.as_str())),
        None if found.len() == 1 => found.first(),
        None if found.is_empty() && searched => return Err(failure(nothing_found(&requested))),
        None => {
            let views: Vec<&ImportableView> = found.iter().map(|(view, _)| view).collect();
            return value(serde_json::json!({ "importable": views }));
        }
    };
    let Some((chosen, members)) = chosen.cloned() else {
        return Err(failure(format!(
            "no pool {} on the given devices that is not already imported",
            name.unwrap_or_default()
        )));
    };
    if let Some(disk) = busy.iter().find(|disk| disk.holds(&chosen.id)) {
        return Err(failure(disk.refusal()));
    }
    let options = ImportOptions {
        pool: Some(chosen.id.clone()),
        force,
        read_only,
        exports_taken: names::export_names(registry),
    };
    let pool = Pool::import(registry.env.clone(), devices, options)
        .await
        .map_err(failure)?;
    let entry = PoolEntry {
        pool: Arc::new(pool),
        disks: members
            .iter()
            .map(|&index| opened[index].0.clone())
            .collect(),
    };
    registry.insert(entry.clone()).map_err(failure)?;
    value(pool_view(registry, &entry).await)
}

/// The answer of an import without paths that found no pool on the
/// `looked` devices: where it looked (all of them when few, else a count
/// and the first few), and how to look elsewhere.
fn nothing_found(looked: &[DiskPath]) -> String {
    const NAMED_MAX: usize = 8;
    let names: Vec<&str> = looked.iter().map(|disk| disk.path.as_str()).collect();
    let devices = match names.len() {
        0 => "none is free".into(),
        n if n <= NAMED_MAX => names.join(", "),
        n => format!("{n} devices: {}, ...", names[..NAMED_MAX].join(", ")),
    };
    format!(
        "no pool to import: looked at the block devices in /dev ({devices}); name disk files, \
         devices or folders of them to look elsewhere"
    )
}

/// How long a refusal for open NBD connections waits for them to close
/// first: a client that has just disconnected may still be counted, its
/// connection ending a moment after its request.
const CLOSING_NS: u64 = 2_000_000_000;

/// Refuse, unless forced, to take away what NBD clients have open: the
/// spaces `spaces` (named together `what`; `undo` says what the force
/// would do anyway). Connections closing now are waited for a moment.
async fn in_use(
    registry: &Registry,
    spaces: &[Arc<Space>],
    what: &str,
    undo: &str,
) -> Result<(), (ErrorKind, String)> {
    let open = || -> usize {
        spaces
            .iter()
            .map(|space| registry.connections_to(space))
            .sum()
    };
    let deadline = registry.env.now_ns() + CLOSING_NS;
    while open() > 0 && registry.env.now_ns() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let connections = open();
    if connections == 0 {
        return Ok(());
    }
    Err(failure(format!(
        "{what} is open by {}; nothing was changed. Close {} first, or {undo} anyway \
         with --force (its clients then get I/O errors)",
        count(connections as u64, "NBD connection"),
        if connections == 1 { "it" } else { "them" },
    )))
}

/// Export or destroy a pool; refused, unless forced, while NBD clients
/// have its spaces open.
async fn pool_export(registry: &Registry, name: &str, destroy: bool, force: bool) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, name)?;
    if !force {
        let undo = if destroy { "destroy it" } else { "export it" };
        in_use(
            registry,
            &entry.pool.spaces(),
            &format!("pool {name}"),
            undo,
        )
        .await?;
    }
    let result = if destroy {
        entry.pool.destroy().await
    } else {
        entry.pool.close().await.map(|()| Vec::new())
    };
    // A close that failed closed the pool all the same (its files are let
    // go of): it leaves the registry either way, or it would stay listed
    // and held, refusing every command as closed, until a restart.
    if entry.pool.is_closed() {
        registry.remove(name).map_err(failure)?;
    }
    let verb = if destroy { "destroyed" } else { "exported" };
    let labels_left = result.map_err(|error| {
        if entry.pool.is_closed() {
            failure(format!(
                "pool {name} is {verb}, but closing it cleanly failed: {error}; its next import \
                 takes it as not cleanly closed"
            ))
        } else {
            failure(error)
        }
    })?;
    let mut answer = serde_json::json!({ verb: name });
    if !labels_left.is_empty() {
        answer["labels_left"] = labels_left
            .iter()
            .map(|left| {
                format!(
                    "disk {} ({}): {}; it still names pool {name}: wipe it before using it again",
                    left.disk.0, left.path, left.reason
                )
            })
            .collect();
    }
    value(answer)
}

async fn disk_add(registry: &Registry, pool: &str, disks: Vec<DiskSpec>, force: bool) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, pool)?;
    let attributes = disks.iter().any(|disk| {
        disk.media.is_some()
            || disk.usage.is_some()
            || disk.enclosure.is_some()
            || disk.node.is_some()
    });
    let (disks, paths) = new_disks(registry, disks, Some(&entry.pool), force).await?;
    let mut returning = 0;
    for disk in &disks {
        if entry
            .pool
            .returning_disk(disk.device.as_ref())
            .await
            .is_some()
        {
            returning += 1;
        }
    }
    if returning == 0 {
        entry.pool.add_disks(disks).await.map_err(failure)?;
    } else if returning < disks.len() {
        return Err(usage(format!(
            "{returning} of the {} disks given are this pool's own, missing disks coming back; \
             add them and the new ones in two commands",
            disks.len()
        )));
    } else if attributes {
        return Err(usage(
            "a disk coming back keeps the media, usage and place the pool has for it: add it \
             without them, and change its usage afterwards with `terrace disk set`",
        ));
    } else {
        for disk in disks {
            entry.pool.bring_back(disk.device).await.map_err(failure)?;
        }
    }
    let mut all = entry.disks.clone();
    for path in paths {
        if !all.iter().any(|known| known.path == path.path) {
            all.push(path);
        }
    }
    registry.set_disks(pool, all).map_err(failure)?;
    value(pool_view(registry, &entry).await)
}

async fn disk_set(registry: &Registry, pool: &str, disk: &str, usage_text: &str) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, pool)?;
    let usage_value = parse_usage(usage_text)?;
    let index = disk_index(&entry, pool, disk).await?;
    entry
        .pool
        .set_disk_usage(index, usage_value)
        .await
        .map_err(failure)?;
    value(pool_view(registry, &entry).await)
}

fn parse_layout(create: &SpaceCreate) -> Result<Layout, (ErrorKind, String)> {
    match create.layout.as_str() {
        "simple" if create.copies.is_none() && create.redundancy.is_none() => Ok(Layout::Simple),
        "mirror" if create.redundancy.is_none() => Ok(Layout::Mirror {
            copies: create.copies.unwrap_or(2),
        }),
        "parity" if create.copies.is_none() => Ok(Layout::Parity {
            redundancy: create.redundancy.unwrap_or(1),
        }),
        "simple" | "mirror" | "parity" => Err(usage(
            "--copies goes with --layout mirror, --redundancy with --layout parity",
        )),
        other => Err(usage(format!(
            "unknown layout {other:?}: use simple, mirror or parity"
        ))),
    }
}

fn parse_domain(text: &str) -> Result<FaultDomain, (ErrorKind, String)> {
    match text {
        "disk" => Ok(FaultDomain::Disk),
        "enclosure" => Ok(FaultDomain::Enclosure),
        "node" => Ok(FaultDomain::Node),
        other => Err(usage(format!(
            "unknown fault domain {other:?}: use disk, enclosure or node"
        ))),
    }
}

/// A space or cache size is whole blocks of 4 KiB: refused otherwise,
/// with the two nearest, rather than rounded behind the user's back (a
/// virtual disk's size is what its clients see).
fn check_whole_blocks(what: &str, bytes: u64) -> Result<(), (ErrorKind, String)> {
    let block = terrace_engine::layout::BLOCK_BYTES;
    if bytes.is_multiple_of(block) {
        return Ok(());
    }
    let below = bytes / block * block;
    let above = below.saturating_add(block);
    Err(usage(format!(
        "{what} {bytes} bytes ({}) is not a multiple of 4K: give {below} or {above} bytes \
         ({} or {})",
        format_size(bytes),
        format_size(below),
        format_size(above)
    )))
}

/// Cache sizes an admin may ask for: 0 (none) or 32M to 100G.
fn check_cache_size(bytes: Option<u64>) -> Result<(), (ErrorKind, String)> {
    use terrace_engine::journal::{CACHE_MAX_BYTES, CACHE_MIN_BYTES};
    match bytes {
        None | Some(0) => Ok(()),
        Some(bytes) if (CACHE_MIN_BYTES..=CACHE_MAX_BYTES).contains(&bytes) => Ok(()),
        Some(bytes) => Err(usage(format!(
            "write-back cache size {}: use 32M to 100G (or 0 for none at creation)",
            format_size(bytes)
        ))),
    }
}

/// Whether the daemon's write-back caches, with one of `bytes` added (or
/// `resized` set to it), leave their indexes within half of the machine's
/// memory once full. Every open pool's caches count: their indexes share
/// the daemon's memory. Run under the admin lock, so that two changes
/// cannot each pass against the same total.
fn caches_fit_memory(
    registry: &Registry,
    bytes: u64,
    resized: Option<&Arc<Space>>,
) -> Result<(), (ErrorKind, String)> {
    if bytes == 0 {
        return Ok(());
    }
    let others: u64 = registry
        .all()
        .iter()
        .flat_map(|entry| entry.pool.spaces())
        .filter(|space| !resized.is_some_and(|resized| Arc::ptr_eq(space, resized)))
        .filter_map(|space| space.journal())
        .map(|journal| journal.status().bytes)
        .sum();
    let memory = terrace_bench::machine::Machine::memory();
    cache_fits_memory(bytes, others, memory).map_err(usage)
}

/// Share of a full cache's size its index and ring bookkeeping take in
/// memory, at most (measured about a tenth with 4 KiB writes; see
/// docs/design/journal.md, "Log memory").
const CACHE_INDEX_SHARE: u64 = 10;

/// Whether a cache of `bytes` beside caches of `others` bytes in all,
/// once all are full, leaves their indexes within half of a machine's
/// `memory` (0: unknown, not checked). Their records need not fit (what
/// does not is read back from the log), but the indexes must.
fn cache_fits_memory(bytes: u64, others: u64, memory: u64) -> Result<(), String> {
    let block = terrace_engine::layout::BLOCK_BYTES;
    let most = memory / 2 * CACHE_INDEX_SHARE / block * block;
    if memory == 0 || bytes.saturating_add(others) <= most {
        return Ok(());
    }
    let room = most.saturating_sub(others);
    let others_text = if others == 0 {
        String::new()
    } else {
        format!(
            " with the daemon's other caches ({} in all)",
            format_size(others)
        )
    };
    Err(format!(
        "a write-back cache of {}{others_text} would need about {} of memory for the \
         indexes once full, more than half of this machine's {}: {}",
        format_size(bytes),
        format_size((bytes + others) / CACHE_INDEX_SHARE),
        format_size(memory),
        if room < terrace_engine::journal::CACHE_MIN_BYTES {
            "there is no room for it; shrink or drop another cache first".to_string()
        } else {
            format!("use at most {}", format_size(room))
        }
    ))
}

async fn space_create(registry: &Registry, create: SpaceCreate) -> Answer {
    if let Some(bytes) = create.size_bytes {
        check_whole_blocks("a space size of", bytes)?;
    }
    if let Some(bytes) = create.cache_bytes {
        check_whole_blocks("a cache size of", bytes)?;
    }
    check_cache_size(create.cache_bytes)?;
    let _admin = registry.admin.lock().await;
    let layout = parse_layout(&create)?;
    let entry = find_pool(registry, &create.pool)?;
    let size = create.size_bytes.map_or(SpaceSize::Max, SpaceSize::Bytes);
    let mut config = SpaceConfig::new(create.name.clone(), layout, size);
    config.columns = create.columns;
    config.interleave_bytes = create.interleave_bytes;
    config.cache_bytes = create.cache_bytes;
    config.export = create.export.clone();
    config.require_default_log = true;
    config.checksums = create.checksums;
    config.provisioning = match create.provisioning.as_deref() {
        Some(text) => parse_provisioning(text)?,
        None => entry.pool.metadata().await.settings.provisioning,
    };
    export_free(registry, &create.pool, &config)?;
    // The cache the space will get, asked for or the pool's default for
    // its layout, counts against the daemon's memory either way.
    let metadata = entry.pool.metadata().await;
    if let Ok(Some(bytes)) = terrace_engine::cache::cache_size(&config, &metadata) {
        caches_fit_memory(registry, bytes, None).map_err(|(kind, message)| {
            if create.cache_bytes.is_none() {
                (
                    kind,
                    format!("{message} (the default for this space; give --cache 0 for none)"),
                )
            } else {
                (kind, message)
            }
        })?;
    }
    config.fault_domain = create
        .fault_domain
        .as_deref()
        .map(parse_domain)
        .transpose()?;
    entry
        .pool
        .create_space(config)
        .await
        .map_err(|error| match error {
            EngineError::InvalidName { .. }
            | EngineError::InvalidSetting { .. }
            | EngineError::Layout(
                LayoutError::BadCopies { .. } | LayoutError::BadRedundancy { .. },
            )
            | EngineError::Layout(
                LayoutError::BadInterleave { .. } | LayoutError::BadColumns { .. },
            ) => usage(error),
            EngineError::NoCapacity { ref detail, .. }
                if create.cache_bytes.is_none()
                    && matches!(layout, Layout::Parity { .. })
                    && detail.starts_with("its write-back cache") =>
            {
                failure(format!(
                    "{error}; a parity space gets a write-back log (without one a crash \
                     mid-write can leave a write hole): add a disk or a journal disk, or \
                     give --cache 0 to create it without a log"
                ))
            }
            other => failure(other),
        })?;
    space_view(registry, &entry, &create.name).await
}

/// Refuse a new space of `pool` an export name that a space of an open
/// pool has (served or not): names never change meaning under a client.
/// (A space of the same name in the same pool is refused as such.)
fn export_free(
    registry: &Registry,
    pool: &str,
    config: &SpaceConfig,
) -> Result<(), (ErrorKind, String)> {
    let export = config.export_name();
    let Some((holder_pool, space)) = names::holder_of(registry, export) else {
        return Ok(());
    };
    if holder_pool == pool && space == config.name {
        return Ok(());
    }
    let pool = holder_pool;
    let hint = match &config.export {
        None => format!(
            "give this one another with --export NAME (e.g. --export {}-{export})",
            config.name
        ),
        Some(_) => "choose another --export NAME".to_string(),
    };
    Err(failure(format!(
        "export name {export} is taken by space {space} of pool {pool}; {hint}; nothing was          changed"
    )))
}

async fn space_list(registry: &Registry, pool: Option<String>) -> Answer {
    let entries = match pool {
        Some(pool) => vec![find_pool(registry, &pool)?],
        None => registry.all(),
    };
    let mut spaces = Vec::new();
    for entry in entries {
        spaces.extend(pool_view(registry, &entry).await.spaces);
    }
    value(spaces)
}

async fn space_show(registry: &Registry, pool: Option<String>, name: &str) -> Answer {
    let (entry, space) = find_space(registry, pool.as_deref(), name)?;
    let name = space.name();
    let view = pool_view(registry, &entry).await;
    let space = view
        .spaces
        .iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| failure("space vanished"))?;
    let metadata = entry.pool.metadata().await;
    value(views::space_detail(space, &metadata, &view.disks))
}

/// A disk named by index or path.
pub(super) async fn disk_index(
    entry: &PoolEntry,
    pool: &str,
    disk: &str,
) -> Result<DiskIndex, (ErrorKind, String)> {
    if let Ok(index) = disk.parse::<u16>() {
        return Ok(DiskIndex(index));
    }
    let status = entry.pool.status().await;
    status
        .disks
        .iter()
        .find(|d| d.device == disk)
        .map(|d| DiskIndex(d.index))
        .ok_or_else(|| {
            failure(format!(
                "pool {pool} has no disk {disk}; give its index or path (see `terrace pool status {pool}`)"
            ))
        })
}

pub(super) async fn job_answer(entry: &PoolEntry, id: u64) -> Answer {
    let status = entry.pool.status().await;
    let settings = entry.pool.metadata().await.settings;
    let disks = views::pool_view(&status, &[], &settings, |s| s.to_string()).disks;
    let job = entry
        .pool
        .job_statuses()
        .await
        .into_iter()
        .find(|job| job.id == id)
        .ok_or_else(|| failure(format!("job {id} vanished")))?;
    value(views::job_view(entry.pool.name(), &job, &disks))
}

async fn disk_replace(
    registry: &Registry,
    pool: &str,
    old: &str,
    new: DiskSpec,
    force: bool,
) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, pool)?;
    let old_index = disk_index(&entry, pool, old).await?;
    let (disks, paths) = new_disks(registry, vec![new], Some(&entry.pool), force).await?;
    let disk = disks.into_iter().next().ok_or_else(|| failure("no disk"))?;
    let (_, id) = entry
        .pool
        .replace_disk(old_index, disk)
        .await
        .map_err(failure)?;
    let mut all = entry.disks.clone();
    all.extend(paths);
    registry.set_disks(pool, all).map_err(failure)?;
    job_answer(&entry, id).await
}

async fn pool_set(registry: &Registry, name: &str, change: SettingsChange) -> Answer {
    let SettingsChange {
        retire_missing,
        repair_policy,
        repair_rate_bytes,
        scrub,
        error_limit,
        error_window,
        provisioning,
        alert,
    } = change;
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, name)?;
    let mut settings = entry.pool.metadata().await.settings;
    if let Some(text) = retire_missing {
        settings.retire_missing = match text.as_str() {
            "never" => RetireMissing::Never,
            "always" => RetireMissing::Always,
            "auto" => RetireMissing::Auto,
            other => {
                return Err(usage(format!(
                    "retire-missing is never, always or auto, not {other:?}"
                )))
            }
        };
    }
    if let Some(text) = repair_policy {
        settings.repair_policy = match text.as_str() {
            "parallel" => RepairPolicy::Parallel,
            "sequential" => RepairPolicy::Sequential,
            other => {
                return Err(usage(format!(
                    "repair is parallel or sequential, not {other:?}"
                )))
            }
        };
    }
    if let Some(rate) = repair_rate_bytes {
        // Below a megabyte a second a repair of one disk takes weeks: a
        // slip of the unit (5 for 5M), not a choice.
        const RATE_MIN_BYTES: u64 = 1 << 20;
        if rate != 0 && rate < RATE_MIN_BYTES {
            return Err(usage(format!(
                "a repair rate of {rate} bytes a second would take weeks for one disk: \
                 use at least 1M (e.g. 200M), or 0 or unlimited for no limit"
            )));
        }
        settings.repair_rate_bytes_per_second = rate;
    }
    if let Some(text) = scrub {
        settings.scrub_interval_secs = super::scrub::interval_secs(&text).map_err(usage)?;
    }
    if let Some(limit) = error_limit {
        settings.error_limit = limit;
    }
    if let Some(text) = error_window {
        settings.error_window_secs = error_window_secs(&text).map_err(usage)?;
    }
    if let Some(text) = provisioning {
        settings.provisioning = parse_provisioning(&text)?;
    }
    if let Some(text) = alert {
        settings.alert_percents = alert_percents(&text).map_err(usage)?;
    }
    entry.pool.set_settings(settings).await.map_err(failure)?;
    value(pool_view(registry, &entry).await)
}

/// `--alert`: up to three percentages from 1 to 100, or off.
fn alert_percents(text: &str) -> Result<[u8; 3], String> {
    let mut percents = [0u8; 3];
    if text.trim() == "off" {
        return Ok(percents);
    }
    let parsed: Vec<u8> = text
        .split(',')
        .map(|part| {
            part.trim()
                .trim_end_matches('%')
                .parse::<u8>()
                .ok()
                .filter(|percent| (1..=100).contains(percent))
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| {
            format!("--alert {text}: up to three percentages from 1 to 100 (e.g. 70,85,95), or off")
        })?;
    if parsed.is_empty() || parsed.len() > 3 {
        return Err(format!("--alert {text}: one to three percentages, or off"));
    }
    let mut sorted = parsed;
    sorted.sort_unstable();
    sorted.dedup();
    percents[..sorted.len()].copy_from_slice(&sorted);
    Ok(percents)
}

/// `--provisioning`: fixed or thin.
fn parse_provisioning(
    text: &str,
) -> Result<terrace_engine::meta::Provisioning, (ErrorKind, String)> {
    match text {
        "fixed" => Ok(terrace_engine::meta::Provisioning::Fixed),
        "thin" => Ok(terrace_engine::meta::Provisioning::Thin),
        other => Err(usage(format!(
            "--provisioning {other}: expected fixed or thin"
        ))),
    }
}

/// The window of the error limit: seconds, or a number with s, m, h or d;
/// from a second to a week.
fn error_window_secs(text: &str) -> Result<u32, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_secs: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => 0,
    };
    let secs = number.parse::<u64>().unwrap_or(0).saturating_mul(unit_secs);
    if secs == 0 || secs > 7 * 86400 {
        return Err(format!(
            "an error window is a duration from 1s to 7d, such as 600, 90s, 10m or 1h; not {text:?}"
        ));
    }
    Ok(secs as u32)
}

async fn job_control(registry: &Registry, pool: Option<String>, id: u64, action: &str) -> Answer {
    let action = match action {
        "pause" => JobAction::Pause,
        "resume" => JobAction::Resume,
        "cancel" => JobAction::Cancel,
        other => {
            return Err(usage(format!(
                "a job can be paused, resumed or cancelled, not {other:?}"
            )))
        }
    };
    let entries = match pool {
        Some(pool) => vec![find_pool(registry, &pool)?],
        None => registry.all(),
    };
    for entry in entries {
        let known = entry
            .pool
            .job_statuses()
            .await
            .iter()
            .any(|job| job.id == id);
        if known {
            entry.pool.job_action(id, action).await.map_err(failure)?;
            return job_answer(&entry, id).await;
        }
    }
    Err(failure(format!(
        "no job {id}; `terrace job list` shows them"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_that_found_nothing_says_where_it_looked() {
        let disks = |count: usize| -> Vec<DiskPath> {
            (0..count)
                .map(|i| DiskPath {
                    path: format!("/dev/vd{i}"),
                    model: None,
                })
                .collect()
        };
        let none = nothing_found(&[]);
        assert!(none.contains("in /dev (none is free)"), "{none}");
        let few = nothing_found(&disks(2));
        assert!(few.contains("(/dev/vd0, /dev/vd1)"), "{few}");
        let many = nothing_found(&disks(20));
        assert!(
            many.contains("20 devices: /dev/vd0,") && !many.contains("/dev/vd8"),
            "{many}"
        );
    }

    #[test]
    fn a_cache_whose_full_index_outgrows_memory_is_refused() {
        let gib = 1u64 << 30;
        // Up to five times the memory: its index, a tenth, fits in half.
        assert!(cache_fits_memory(100 * gib, 0, 24 * gib).is_ok());
        assert!(cache_fits_memory(40 * gib, 0, 8 * gib).is_ok());
        let refused = cache_fits_memory(100 * gib, 0, 8 * gib).unwrap_err();
        assert!(
            refused.contains("about 10G") && refused.contains("at most 40G"),
            "{refused}"
        );
        // Memory unknown: not checked.
        assert!(cache_fits_memory(100 * gib, 0, 0).is_ok());
    }

    #[test]
    fn caches_are_refused_by_their_total_not_one_by_one() {
        let gib = 1u64 << 30;
        // 8G of memory allows 40G of caches in all.
        assert!(cache_fits_memory(10 * gib, 30 * gib, 8 * gib).is_ok());
        let refused = cache_fits_memory(20 * gib, 30 * gib, 8 * gib).unwrap_err();
        assert!(
            refused.contains("other caches (30G in all)")
                && refused.contains("about 5G")
                && refused.contains("at most 10G"),
            "{refused}"
        );
        let full = cache_fits_memory(gib, 40 * gib, 8 * gib).unwrap_err();
        assert!(full.contains("no room for it"), "{full}");
    }
}
