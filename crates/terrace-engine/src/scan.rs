//! What a set of devices holds, for `disk list` and `pool import`.

use std::sync::Arc;

use futures::future::join_all;
use terrace_io::BlockDevice;
use terrace_meta::store::{self, Probe};

/// What one device is, as far as pools are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// No terrace label: can join a pool.
    Blank,
    /// A disk of a pool.
    Member {
        pool_name: String,
        pool_id: String,
        disk_id: String,
        /// Newest readable metadata generation on it (0 if none).
        generation: u64,
    },
    /// Carries a damaged terrace label: refused and left alone.
    Damaged { reason: String },
    /// Could not be read.
    Unreadable { reason: String },
}

#[derive(Debug, Clone)]
pub struct DeviceReport {
    pub device: String,
    pub size_bytes: u64,
    pub kind: DeviceKind,
}

/// Read the label and metadata slots of every device (concurrently).
pub async fn scan(devices: &[Arc<dyn BlockDevice>]) -> Vec<DeviceReport> {
    let probes = join_all(devices.iter().map(|device| store::probe(device.as_ref()))).await;
    devices
        .iter()
        .zip(probes)
        .map(|(device, probe)| DeviceReport {
            device: device.name().to_string(),
            size_bytes: device.size_bytes(),
            kind: kind(&probe),
        })
        .collect()
}

fn kind(probe: &Probe) -> DeviceKind {
    match probe {
        Probe::Blank => DeviceKind::Blank,
        Probe::Member { label, .. } => DeviceKind::Member {
            pool_name: label.pool_name.clone(),
            pool_id: label.pool_id.to_string(),
            disk_id: label.disk_id.to_string(),
            generation: probe.generations().first().map_or(0, |m| m.generation),
        },
        Probe::Damaged(error) => DeviceKind::Damaged {
            reason: error.to_string(),
        },
        Probe::Unreadable(error) => DeviceKind::Unreadable {
            reason: error.to_string(),
        },
    }
}
