//! `disk list`: which devices could join a pool, and why others cannot.
//!
//! Without paths, every whole block device the kernel lists in /sys/block
//! is considered (RAM disks and unattached loop devices are skipped). A
//! device is refused when it carries a terrace label (in a pool, or
//! damaged), has partitions, is mounted or held by another driver (device
//! mapper, md), is read-only, or is too small to hold metadata and a slab.

use std::path::Path;
use std::sync::Arc;

use terrace_engine::io::file::{FileDevice, FileOptions};
use terrace_engine::io::BlockDevice;
use terrace_engine::meta::format::{data_offset, METADATA_SLOT_DEFAULT_BYTES};
use terrace_engine::{DeviceKind, SLAB_MIN_BYTES};

use super::registry::{expand_paths, Registry};
use crate::api::CandidateView;
use crate::units::format_size;

/// The smallest device that can hold default metadata and one small slab.
fn minimum_bytes() -> u64 {
    data_offset(METADATA_SLOT_DEFAULT_BYTES) + SLAB_MIN_BYTES
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
fn block_device_problem(path: &str) -> Option<String> {
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
        reason,
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
    if size < minimum_bytes() {
        return view(
            size,
            "unusable",
            format!(
                "too small: {} (needs at least {})",
                format_size(size),
                format_size(minimum_bytes())
            ),
        );
    }
    view(size, "available", String::new())
}
