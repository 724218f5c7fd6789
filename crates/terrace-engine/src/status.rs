//! What `pool status` shows: health derived from the metadata and the
//! run-time condition of each disk, never stored separately.

use terrace_layout::Layout;
use terrace_meta::{DiskState, FaultDomain, Media, Usage};

use crate::disk::Condition;
use crate::pool::Pool;
use crate::space::Space;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolHealth {
    Ok,
    /// Some disks are failed or missing; every space still has its data.
    Degraded,
    /// Some extents lost more slabs than their layout tolerates.
    DataLoss,
}

#[derive(Debug, Clone)]
pub struct DiskStatus {
    pub index: u16,
    pub id: String,
    /// The device path, or where it was last seen if absent.
    pub device: String,
    pub condition: Condition,
    pub state: DiskState,
    pub reason: String,
    pub media: Media,
    pub usage: Usage,
    pub size_bytes: u64,
    pub slabs_total: u32,
    pub slabs_used: u32,
    pub enclosure: String,
    pub node: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceHealth {
    Healthy,
    /// A simple space: healthy, but one failure loses data.
    NoRedundancy,
    /// Disks lost; the space survives `survives` more failures.
    Degraded {
        survives: u32,
    },
    /// Some extents lost their data; the others still work.
    Offline {
        lost_extents: u64,
    },
}

#[derive(Debug, Clone)]
pub struct SpaceStatus {
    pub name: String,
    pub layout: Layout,
    pub columns: u32,
    pub data_columns: u32,
    pub columns_reason: String,
    pub interleave_bytes: u64,
    pub size_bytes: u64,
    pub raw_bytes: u64,
    pub extents: u64,
    pub fault_domain: FaultDomain,
    pub failures_tolerated: u32,
    pub health: SpaceHealth,
}

#[derive(Debug, Clone)]
pub struct PoolStatus {
    pub name: String,
    pub id: String,
    pub generation: u64,
    pub slab_bytes: u64,
    pub health: PoolHealth,
    pub read_only: Option<String>,
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    pub disks: Vec<DiskStatus>,
    pub spaces: Vec<SpaceStatus>,
}

impl Space {
    /// Health of this space from the current condition of its disks.
    pub fn health(&self) -> SpaceHealth {
        let map = self.map();
        let mut lost_extents = 0;
        let mut survives = self.geometry.layout().failures_tolerated();
        for targets in &map.extents {
            match self
                .geometry
                .remaining_tolerance(|slot| !targets[slot as usize].complete())
            {
                None => lost_extents += 1,
                Some(left) => survives = survives.min(left),
            }
        }
        let tolerated = self.geometry.layout().failures_tolerated();
        match (lost_extents, tolerated) {
            (0, 0) => SpaceHealth::NoRedundancy,
            (0, _) if survives == tolerated => SpaceHealth::Healthy,
            (0, _) => SpaceHealth::Degraded { survives },
            _ => SpaceHealth::Offline { lost_extents },
        }
    }
}

impl Pool {
    pub async fn status(&self) -> PoolStatus {
        let metadata = self.metadata().await;
        let used = metadata.used_slabs();
        let disks: Vec<DiskStatus> = self
            .shared
            .disks()
            .iter()
            .zip(&metadata.disks)
            .map(|(disk, record)| DiskStatus {
                index: disk.index.0,
                id: record.id.to_string(),
                device: disk.device_name().unwrap_or(&record.path_hint).to_string(),
                condition: disk.condition(),
                state: record.state,
                reason: if disk.is_online() {
                    String::new()
                } else {
                    disk.reason()
                },
                media: record.media,
                usage: record.usage,
                size_bytes: record.size_bytes,
                slabs_total: record.slab_count,
                slabs_used: used.iter().filter(|slab| slab.disk == disk.index).count() as u32,
                enclosure: record.enclosure.clone(),
                node: record.node.clone(),
            })
            .collect();
        let spaces: Vec<SpaceStatus> = self
            .spaces()
            .iter()
            .filter_map(|space| {
                let record = metadata.space(space.name())?;
                let geometry = space.geometry();
                Some(SpaceStatus {
                    name: record.name.clone(),
                    layout: record.layout,
                    columns: record.columns,
                    data_columns: geometry.data_columns(),
                    columns_reason: record.columns_reason.clone(),
                    interleave_bytes: record.interleave_bytes,
                    size_bytes: record.size_bytes,
                    raw_bytes: record.extents.len() as u64
                        * u64::from(geometry.slots_per_extent())
                        * metadata.slab_bytes,
                    extents: record.extents.len() as u64,
                    fault_domain: record.fault_domain,
                    failures_tolerated: record.layout.failures_tolerated(),
                    health: space.health(),
                })
            })
            .collect();
        let health = if spaces
            .iter()
            .any(|s| matches!(s.health, SpaceHealth::Offline { .. }))
        {
            PoolHealth::DataLoss
        } else if disks
            .iter()
            .any(|d| d.state != DiskState::Removed && d.condition != Condition::Online)
        {
            PoolHealth::Degraded
        } else {
            PoolHealth::Ok
        };
        PoolStatus {
            name: metadata.name.clone(),
            id: metadata.pool_id.to_string(),
            generation: metadata.generation,
            slab_bytes: metadata.slab_bytes,
            health,
            read_only: self.read_only_reason().map(str::to_string),
            capacity_bytes: metadata
                .disks
                .iter()
                .filter(|d| d.takes_capacity())
                .map(|d| u64::from(d.slab_count) * metadata.slab_bytes)
                .sum(),
            allocated_bytes: used.len() as u64 * metadata.slab_bytes,
            disks,
            spaces,
        }
    }
}
