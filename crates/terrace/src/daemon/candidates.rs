//! `disk list`: which devices could join a pool, and why others cannot.
//!
//! Without paths, every whole block device the kernel lists in /sys/block
//! is considered (RAM disks and unattached loop devices are skipped). A
//! device is refused when it carries a terrace label (in a pool, or
//! damaged), has partitions, is mounted or held by another driver (device
//! mapper, md), is read-only, or is too small to hold metadata and a slab;
//! one that holds something (a file system, swap, a partition table...;
//! see [`super::probe`]) is `occupied`: pooled only with `--force`.

use std::path::Path;
use std::sync::Arc;

use terrace_engine::io::file::{FileDevice, FileOptions};
use terrace_engine::io::BlockDevice;
use terrace_engine::meta::format::data_offset;
use terrace_engine::{metadata_slot_bytes_for, DeviceKind, SLAB_DEFAULT_BYTES, SLAB_MIN_BYTES};

use super::probe::probe_path;
use super::registry::{expand_paths, Registry};
use crate::api::{CandidateView, HoldsView};
use crate::units::format_size;

/// The smallest device that holds the metadata of a one-disk pool of
/// `slab_bytes` slabs and one slab, as `pool create` sizes them.
fn minimum_bytes(slab_bytes: u64) -> u64 {
    data_offset(metadata_slot_bytes_for(&[0], slab_bytes)) + slab_bytes
}

/// Why a device of `size` bytes cannot hold a pool's metadata and a slab:
/// any slab (`unusable`), or the default one (then which `--slab` fits).
fn size_problem(size: u64) -> Option<(&'static str, String)> {
    let smallest = minimum_bytes(SLAB_MIN_BYTES);
    if size < smallest {
        return Some((
            "unusable",
            format!(
                "too small: {} (needs at least {}, with the smallest slabs of {})",
                format_size(size),
                format_size(smallest),
                format_size(SLAB_MIN_BYTES)
            ),
        ));
    }
    let default = minimum_bytes(SLAB_DEFAULT_BYTES);
    if size >= default {
        return None;
    }
    let fits = (0..)
        .map(|shift| SLAB_DEFAULT_BYTES >> shift)
        .take_while(|&slab| slab >= SLAB_MIN_BYTES)
        .find(|&slab| minimum_bytes(slab) <= size)
        .unwrap_or(SLAB_MIN_BYTES);
    Some((
        "available",
        format!(
            "too small for the default {} slabs: {} (needs {}); pool create --slab {} or less \
             fits it",
            format_size(SLAB_DEFAULT_BYTES),
            format_size(size),
            format_size(default),
            format_size(fits)
        ),
    ))
}

fn block_devices() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("ram") && !name.starts_with("zram"))
        .filter(|name| {
            !name.starts_with("loop") || Path::new(&format!("/sys/block/{name}/loop")).exists()
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| format!("/dev/{name}"))
        .collect()
}

/// The whole block devices that nothing else uses: not mounted, not
/// partitioned, not held by another driver, writable.
pub fn free_block_devices() -> Vec<String> {
    block_devices()
        .into_iter()
        .filter(|path| block_device_problem(path).is_none())
        .collect()
}

/// A block device's size as the kernel gives it (`/sys/block/NAME/size`,
/// in 512-byte sectors whatever the device's own sector size).
fn sysfs_size_bytes(path: &str) -> Option<u64> {
    let name = Path::new(path).file_name()?.to_string_lossy().into_owned();
    let sectors = std::fs::read_to_string(format!("/sys/block/{name}/size")).ok()?;
    sectors
        .trim()
        .parse::<u64>()
        .ok()
        .map(|sectors| sectors * 512)
}

/// Why the kernel's view of a block device rules it out, if it does.
pub(crate) fn block_device_problem(path: &str) -> Option<String> {
    let name = Path::new(path).file_name()?.to_string_lossy().into_owned();
    let sys = format!("/sys/block/{name}");
    if !Path::new(&sys).exists() {
        return None;
    }
    let read = |file: &str| std::fs::read_to_string(format!("{sys}/{file}")).unwrap_or_default();
    if read("ro").trim() == "1" {
        return Some("read-only".into());
    }
    let partitions: Vec<String> = std::fs::read_dir(&sys)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !partitions.is_empty() {
        return Some(format!("has partitions ({})", partitions.join(", ")));
    }
    let holders = std::fs::read_dir(format!("{sys}/holders"))
        .map(|d| d.count())
        .unwrap_or(0);
    if holders > 0 {
        return Some("held by another driver (device mapper or md)".into());
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|line| line.split_whitespace().next() == Some(path))
    {
        return Some("mounted".into());
    }
    None
}

pub async fn list(registry: &Registry, paths: &[String]) -> Vec<CandidateView> {
    let paths = if paths.is_empty() {
        block_devices()
    } else {
        expand_paths(paths)
    };
    let mut views = Vec::new();
    for path in paths {
        views.push(candidate(registry, &path).await);
    }
    views
}

async fn candidate(registry: &Registry, path: &str) -> CandidateView {
    let kind = if std::fs::metadata(path)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false)
    {
        "block"
    } else {
        "file"
    };
    let view = |size_bytes, status: &str, reason: String| CandidateView {
        device: path.to_string(),
        kind: kind.into(),
        size_bytes,
        status: status.into(),
        reason: crate::api::non_empty(&reason),
        holds: None,
    };
    let options = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let device: Arc<dyn BlockDevice> = match FileDevice::open(path, options) {
        Ok(device) => Arc::new(device),
        // What the kernel says about a block device (mounted, partitioned,
        // held) explains a refused open better than the errno does, and
        // its size is known without opening it.
        Err(error) => {
            let reason = block_device_problem(path).unwrap_or(format!("cannot open: {error}"));
            return view(sysfs_size_bytes(path).unwrap_or(0), "unusable", reason);
        }
    };
    let size = device.size_bytes();
    let report = terrace_engine::scan(&[device]).await.remove(0);
    match report.kind {
        DeviceKind::Member { pool_name, .. } => {
            let open = registry.get(&pool_name).is_some();
            let note = if open {
                ""
            } else {
                " (not imported: `terrace pool import`)"
            };
            return view(
                size,
                "in-pool",
                format!("belongs to pool {pool_name}{note}"),
            );
        }
        DeviceKind::Damaged { reason } => {
            return view(size, "damaged", format!("damaged terrace label: {reason}"))
        }
        DeviceKind::Unreadable { reason } => {
            return view(size, "unusable", format!("unreadable: {reason}"))
        }
        DeviceKind::Blank => {}
    }
    if let Some(problem) = block_device_problem(path) {
        return view(size, "unusable", problem);
    }
    if let Ok(Some(found)) = probe_path(path) {
        let mut occupied = view(
            size,
            "occupied",
            format!("holds {found}: pooled only with --force, which overwrites it"),
        );
        occupied.holds = Some(HoldsView {
            kind: found.kind,
            label: found.label,
            uuid: found.uuid,
            offset_bytes: found.offset_bytes,
        });
        return occupied;
    }
    match size_problem(size) {
        Some((status, reason)) => view(size, status, reason),
        None => view(size, "available", String::new()),
    }
}
