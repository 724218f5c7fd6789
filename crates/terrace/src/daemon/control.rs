//! The control API: requests from the CLI, answered one at a time per
//! connection (admin changes are serialised by the registry's admin lock).

use std::sync::Arc;

use serde::Serialize;
use terrace_engine::io::BlockDevice;
use terrace_engine::layout::{Layout, LayoutError};
use terrace_engine::meta::{DiskIndex, FaultDomain, Media, Usage};
use terrace_engine::{
    EngineError, ImportOptions, NewDisk, Pool, PoolConfig, Space, SpaceConfig, SpaceSize,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::catalog::export_name_in;
use super::registry::{expand_paths, open_device, PoolEntry, Registry};
use super::{candidates, views, Daemon};
use crate::api::{
    DaemonView, DiskSpec, ErrorKind, ImportableView, PoolView, Request, Response, SpaceCreate,
};

/// Longest request line: 1 MiB is far more than any request needs and
/// bounds what a confused client can make the daemon buffer.
const REQUEST_LINE_MAX_BYTES: usize = 1 << 20;

type Answer = Result<serde_json::Value, (ErrorKind, String)>;

fn failure(message: impl std::fmt::Display) -> (ErrorKind, String) {
    (ErrorKind::Failure, message.to_string())
}

fn usage(message: impl std::fmt::Display) -> (ErrorKind, String) {
    (ErrorKind::Usage, message.to_string())
}

fn value(result: impl Serialize) -> Answer {
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
        } => pool_create(registry, name, disks, slab_bytes, metadata_slot_bytes).await,
        Request::PoolList => {
            let mut summaries = Vec::new();
            for entry in registry.all() {
                summaries.push(views::summary(&entry.pool.status().await));
            }
            value(summaries)
        }
        Request::PoolStatus { name } => pool_status(registry, name).await,
        Request::PoolImport {
            paths,
            name,
            force,
            read_only,
        } => pool_import(registry, paths, name, force, read_only).await,
        Request::PoolExport { name } => pool_export(registry, &name, false).await,
        Request::PoolDestroy { name } => pool_export(registry, &name, true).await,
        Request::DiskList { paths } => value(candidates::list(registry, &paths).await),
        Request::DiskAdd { pool, disks } => disk_add(registry, &pool, disks).await,
        Request::DiskSet { pool, disk, usage } => disk_set(registry, &pool, &disk, &usage).await,
        Request::SpaceCreate(create) => space_create(registry, create).await,
        Request::SpaceList { pool } => space_list(registry, pool).await,
        Request::SpaceShow { pool, name } => space_show(registry, pool, &name).await,
        Request::SpaceResize {
            pool,
            name,
            size_bytes,
        } => {
            let _admin = registry.admin.lock().await;
            let (entry, _) = find_space(registry, pool.as_deref(), &name)?;
            entry
                .pool
                .resize_space(&name, size_bytes)
                .await
                .map_err(failure)?;
            space_view(registry, &entry, &name).await
        }
        Request::SpaceDelete { pool, name } => {
            let _admin = registry.admin.lock().await;
            let (entry, _) = find_space(registry, pool.as_deref(), &name)?;
            entry.pool.delete_space(&name).await.map_err(failure)?;
            value(serde_json::json!({ "deleted": name }))
        }
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

pub fn parse_media(text: &str) -> Result<Media, (ErrorKind, String)> {
    match text {
        "hdd" => Ok(Media::Hdd),
        "ssd" => Ok(Media::Ssd),
        "unknown" | "auto" => Ok(Media::Unknown),
        other => Err(usage(format!("unknown media {other:?}: use hdd or ssd"))),
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

/// Open the disks named on the command line, with their attributes.
fn new_disks(specs: Vec<DiskSpec>) -> Result<(Vec<NewDisk>, Vec<String>), (ErrorKind, String)> {
    let mut disks = Vec::new();
    let mut paths = Vec::new();
    for spec in specs {
        let device: Arc<dyn BlockDevice> = open_device(&spec.path)
            .map_err(|error| failure(format!("cannot open {}: {error}", spec.path)))?;
        let mut disk = NewDisk::new(device);
        disk.media = parse_media(spec.media.as_deref().unwrap_or("unknown"))?;
        disk.usage = parse_usage(spec.usage.as_deref().unwrap_or("auto"))?;
        disk.enclosure = spec.enclosure.unwrap_or_default();
        disk.node = spec.node.unwrap_or_default();
        paths.push(spec.path);
        disks.push(disk);
    }
    Ok((disks, paths))
}

fn find_pool(registry: &Registry, name: &str) -> Result<PoolEntry, (ErrorKind, String)> {
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

fn find_space(
    registry: &Registry,
    pool: Option<&str>,
    name: &str,
) -> Result<(PoolEntry, Arc<Space>), (ErrorKind, String)> {
    let entries = match pool {
        Some(pool) => vec![find_pool(registry, pool)?],
        None => registry.all(),
    };
    let found: Vec<(PoolEntry, Arc<Space>)> = entries
        .into_iter()
        .filter_map(|entry| entry.pool.space(name).map(|space| (entry, space)))
        .collect();
    match found.len() {
        1 => Ok(found.into_iter().next().expect("one")),
        0 => Err(failure(format!(
            "no space named {name}; `terrace space list` shows them"
        ))),
        _ => Err(usage(format!(
            "several pools have a space named {name}; name the pool too"
        ))),
    }
}

async fn pool_view(registry: &Registry, entry: &PoolEntry) -> PoolView {
    let status = entry.pool.status().await;
    views::pool_view(&status, |space| {
        export_name_in(registry, entry.pool.name(), space)
    })
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
    slab_bytes: Option<u64>,
    metadata_slot_bytes: Option<u64>,
) -> Answer {
    let _admin = registry.admin.lock().await;
    if registry.get(&name).is_some() {
        return Err(failure(format!("a pool named {name} is already open here")));
    }
    let (disks, paths) = new_disks(disks)?;
    let mut config = PoolConfig::new(name);
    if let Some(slab) = slab_bytes {
        config.slab_bytes = slab;
    }
    if let Some(slot) = metadata_slot_bytes {
        config.metadata_slot_bytes = slot;
    }
    let pool = Pool::create(registry.env.clone(), config, disks)
        .await
        .map_err(|error| match error {
            EngineError::InvalidName { .. } | EngineError::InvalidSetting { .. } => usage(error),
            other => failure(other),
        })?;
    let entry = PoolEntry {
        pool: Arc::new(pool),
        paths,
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

async fn pool_import(
    registry: &Registry,
    paths: Vec<String>,
    name: Option<String>,
    force: bool,
    read_only: bool,
) -> Answer {
    let _admin = registry.admin.lock().await;
    let paths = expand_paths(&paths);
    let opened: Vec<(String, Arc<dyn BlockDevice>)> = paths
        .iter()
        .filter_map(|path| open_device(path).ok().map(|device| (path.clone(), device)))
        .collect();
    let devices: Vec<Arc<dyn BlockDevice>> =
        opened.iter().map(|(_, device)| device.clone()).collect();
    let reports = terrace_engine::scan(&devices).await;
    let mut found: Vec<ImportableView> = Vec::new();
    for report in &reports {
        if let terrace_engine::DeviceKind::Member {
            pool_name,
            pool_id,
            generation,
            ..
        } = &report.kind
        {
            match found.iter_mut().find(|view| &view.id == pool_id) {
                Some(view) => {
                    view.devices.push(report.device.clone());
                    view.generation = view.generation.max(*generation);
                }
                None => found.push(ImportableView {
                    name: pool_name.clone(),
                    id: pool_id.clone(),
                    devices: vec![report.device.clone()],
                    generation: *generation,
                }),
            }
        }
    }
    found.retain(|view| registry.get(&view.name).is_none());
    let chosen = match &name {
        Some(wanted) => found
            .iter()
            .find(|v| &v.name == wanted || v.id.starts_with(wanted.as_str())),
        None if found.len() == 1 => found.first(),
        None => return value(serde_json::json!({ "importable": found })),
    };
    let Some(chosen) = chosen.cloned() else {
        return Err(failure(format!(
            "no pool {} on the given devices that is not already imported",
            name.unwrap_or_default()
        )));
    };
    let options = ImportOptions {
        pool: Some(chosen.id.clone()),
        force,
        read_only,
    };
    let pool = Pool::import(registry.env.clone(), devices, options)
        .await
        .map_err(failure)?;
    let entry = PoolEntry {
        pool: Arc::new(pool),
        paths: chosen.devices.clone(),
    };
    registry.insert(entry.clone()).map_err(failure)?;
    value(pool_view(registry, &entry).await)
}

async fn pool_export(registry: &Registry, name: &str, destroy: bool) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, name)?;
    let result = if destroy {
        entry.pool.destroy().await
    } else {
        entry.pool.close().await
    };
    result.map_err(failure)?;
    registry.remove(name).map_err(failure)?;
    let verb = if destroy { "destroyed" } else { "exported" };
    value(serde_json::json!({ verb: name }))
}

async fn disk_add(registry: &Registry, pool: &str, disks: Vec<DiskSpec>) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, pool)?;
    let (disks, paths) = new_disks(disks)?;
    entry.pool.add_disks(disks).await.map_err(failure)?;
    let mut all = entry.paths.clone();
    all.extend(paths);
    registry.set_paths(pool, all).map_err(failure)?;
    value(pool_view(registry, &entry).await)
}

async fn disk_set(registry: &Registry, pool: &str, disk: &str, usage_text: &str) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, pool)?;
    let usage_value = parse_usage(usage_text)?;
    let status = entry.pool.status().await;
    let index = match disk.parse::<u16>() {
        Ok(index) => index,
        Err(_) => status
            .disks
            .iter()
            .find(|d| d.device == disk)
            .map(|d| d.index)
            .ok_or_else(|| failure(format!("pool {pool} has no disk {disk}; give its index or path (see `terrace pool status {pool}`)")))?,
    };
    entry
        .pool
        .set_disk_usage(DiskIndex(index), usage_value)
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

async fn space_create(registry: &Registry, create: SpaceCreate) -> Answer {
    let _admin = registry.admin.lock().await;
    let layout = parse_layout(&create)?;
    let entry = find_pool(registry, &create.pool)?;
    let size = create.size_bytes.map_or(SpaceSize::Max, SpaceSize::Bytes);
    let mut config = SpaceConfig::new(create.name.clone(), layout, size);
    config.columns = create.columns;
    config.interleave_bytes = create.interleave_bytes;
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
            other => failure(other),
        })?;
    space_view(registry, &entry, &create.name).await
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
    let (entry, _) = find_space(registry, pool.as_deref(), name)?;
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
