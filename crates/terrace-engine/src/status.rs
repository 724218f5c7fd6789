//! What `pool status` shows: health derived from the metadata and the
//! run-time condition of each disk, never stored separately.
//!
//! Space health, worst first:
//!
//! | state | meaning |
//! |---|---|
//! | offline | some extents lost more slabs than the layout tolerates; their data is unavailable, the rest still works |
//! | repairing | a job is re-creating lost slabs (with its progress) |
//! | degraded | slabs on failed disks are lost; the space survives `survives` more failures |
//! | incomplete | slabs are on missing disks only: data intact, and the disks may come back |
//! | no-redundancy | a simple space: healthy, but any failure loses data |
//! | healthy | every slab present |

use std::collections::BTreeMap;
use std::sync::Arc;

use terrace_layout::Layout;
use terrace_meta::{DiskState, FaultDomain, JobKind, JobState, Media, PoolMetadata, Usage};

use crate::disk::Condition;
pub use crate::jobs::Unrepaired;
use crate::pool::Pool;
use crate::space::Space;
use crate::volume::Volume;

/// A disk is flagged slow when its average service time is this many times
/// the median of its online peers: far beyond normal spread between drives
/// of one kind, well below the difference a failing drive shows.
const SLOW_FACTOR: u64 = 8;
/// ... and at least this slow (µs), so that tiny absolute differences
/// between memory-speed devices never count.
const SLOW_FLOOR_US: u64 = 2_000;

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
    /// Average service time of its reads and writes, in microseconds.
    pub latency_us: u64,
    /// Far slower than its peers: a drive on its way out, or a bad path.
    pub slow: bool,
    /// Its read, write and checksum errors since the pool opened (or
    /// `pool clear`).
    pub errors: crate::disk::DiskErrors,
    /// Extents written while it was missing: back, it resyncs only these.
    pub missed_extents: u64,
    /// Lost (failed or missing) with slabs that no running job re-creates
    /// and that a repair would find no room for now.
    pub unrepaired: Option<Unrepaired>,
    /// The active job (other than a log move) that involves it, if any.
    pub job: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceHealth {
    Healthy,
    /// A simple space: healthy, but one failure loses data.
    NoRedundancy,
    /// Slabs are on missing disks only; the space survives `survives` more.
    Incomplete {
        survives: u32,
    },
    /// Slabs on failed disks are lost; the space survives `survives` more.
    Degraded {
        survives: u32,
    },
    /// A job re-creates lost slabs.
    Repairing {
        job: u64,
        percent: u32,
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
    /// Raw bytes of the slabs it has (of a thin space, those written).
    pub raw_bytes: u64,
    pub extents: u64,
    /// Fixed or thin.
    pub provisioning: terrace_meta::Provisioning,
    /// Bytes of the space whose extents have their slabs (all of a fixed
    /// space; of a thin one, the extents written).
    pub allocated_bytes: u64,
    pub fault_domain: FaultDomain,
    pub failures_tolerated: u32,
    pub health: SpaceHealth,
    /// The write-back cache, if the space has one.
    pub cache: Option<CacheInfo>,
    /// A mirror's resync after an unclean shutdown, while it runs (see
    /// [`crate::Pool::resync_after_crash`]).
    pub resync: Option<crate::ResyncProgress>,
    pub checksums: Checksums,
}

/// Whether a space's blocks are checked against their sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksums {
    On,
    /// Off, as asked when the space was created.
    Off,
    /// Wanted, but the pool had no room for the sums volume (it is added
    /// at an import that finds room).
    NoRoom,
}

/// A space's write-back cache as status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheInfo {
    pub status: crate::journal::CacheStatus,
    /// Disks holding the log, and its copies.
    pub log_disks: Vec<u16>,
    pub log_copies: u32,
    /// Health of the log's own mirror.
    pub log_health: SpaceHealth,
    /// Where the log was placed and why ("the write-back log of space p: 2
    /// copies on capacity disks, as the journal disks have no room left
    /// for 1G").
    pub placement: String,
}

/// What would happen if one disk, enclosure or node failed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureImpact {
    /// "disk 3", "enclosure e1", "node n2".
    pub what: String,
    /// Spaces that would lose data (go offline).
    pub lose_data: Vec<String>,
    /// Spaces that would keep their data but no further redundancy.
    pub lose_redundancy: Vec<String>,
    /// Spaces whose write-back log would lose every copy: they write
    /// through from then on, and what only the log's disks held is lost.
    pub lose_log: Vec<String>,
    /// Spaces whose write-back log would be left with one copy.
    pub lose_log_redundancy: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct PoolStatus {
    pub name: String,
    pub id: String,
    pub generation: u64,
    pub slab_bytes: u64,
    /// Bytes of a slot the last commit wrote, the slot's size, and what an
    /// allocation must leave free for the repair of the fullest disk (see
    /// `room.rs`).
    pub metadata_bytes: u64,
    pub metadata_slot_bytes: u64,
    pub metadata_reserve_bytes: u64,
    pub health: PoolHealth,
    pub read_only: Option<String>,
    /// Slabs of the disks that take spaces' data, and those of them in
    /// use (slabs on journal disks, the logs', are counted apart).
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    /// Slabs of the journal disks in service, and those in use (logs).
    pub journal_bytes: u64,
    pub journal_allocated_bytes: u64,
    /// Raw bytes every space would take with every extent allocated (more
    /// than the capacity when thin spaces overcommit the pool).
    pub provisioned_bytes: u64,
    /// Free raw bytes thin allocation leaves for the repair of the fullest
    /// disk (0 without thin spaces; see `crate::thin`).
    pub thin_reserve_bytes: u64,
    pub disks: Vec<DiskStatus>,
    pub spaces: Vec<SpaceStatus>,
    pub impact: Vec<FailureImpact>,
    /// Bytes of log records the pool's write-back logs hold in memory, and
    /// the most they may (see [`Pool::set_log_memory`]).
    pub log_memory_bytes: u64,
    pub log_memory_max_bytes: u64,
    /// A write-back log being prepared (its slabs written with zeroes
    /// before its cache takes them), if any.
    pub preparing: Option<Preparation>,
    /// The pool's failure policy (what happens to a lost disk on its own).
    pub settings: terrace_meta::PoolSettings,
}

/// A write-back log being prepared: for a new cache, or the new part of a
/// grown one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preparation {
    /// The space whose cache it is.
    pub space: String,
    /// Bytes to write over all its copies, and written so far.
    pub total_bytes: u64,
    pub done_bytes: u64,
}

impl Volume {
    /// Health of this space (or log) from the current condition of its disks (jobs
    /// aside; see [`Pool::status`]).
    pub fn health(&self) -> SpaceHealth {
        let map = self.map();
        let mut lost_extents = 0;
        let mut failed = false;
        let tolerated = self.geometry.layout().failures_tolerated();
        let mut survives = tolerated;
        // Extents without slabs (a thin space's, never written) hold nothing.
        for targets in map.extents.iter().filter(|targets| !targets.is_empty()) {
            let lost = |slot: u32| !targets[slot as usize].complete();
            failed |= (0..targets.len() as u32).any(|slot| {
                lost(slot) && targets[slot as usize].home().disk.condition() != Condition::Missing
            });
            match self.geometry.remaining_tolerance(lost) {
                None => lost_extents += 1,
                Some(left) => survives = survives.min(left),
            }
        }
        match (lost_extents, tolerated) {
            (0, 0) => SpaceHealth::NoRedundancy,
            (0, _) if survives == tolerated => SpaceHealth::Healthy,
            (0, _) if failed => SpaceHealth::Degraded { survives },
            (0, _) => SpaceHealth::Incomplete { survives },
            _ => SpaceHealth::Offline { lost_extents },
        }
    }

    /// Whether losing the disks `gone` as well would cost this space data
    /// (`Some(true)`), all redundancy (`Some(false)`), or neither (`None`).
    /// Only extents with a slab on a gone disk count: a space already
    /// degraded elsewhere loses nothing more to a disk it has nothing on.
    fn impact_of(&self, gone: &dyn Fn(u16) -> bool) -> Option<bool> {
        let map = self.map();
        let mut worst = None;
        for targets in &map.extents {
            if !targets
                .iter()
                .any(|target| gone(target.home().disk.index.0))
            {
                continue;
            }
            let lost = |slot: u32| {
                let target = &targets[slot as usize];
                !target.complete() || gone(target.home().disk.index.0)
            };
            match self.geometry.remaining_tolerance(lost) {
                None => return Some(true),
                Some(0) if self.geometry.layout().failures_tolerated() > 0 => worst = Some(false),
                _ => {}
            }
        }
        worst
    }
}

impl Pool {
    pub async fn status(&self) -> PoolStatus {
        let metadata = self.metadata().await;
        let disks = self.disk_statuses(&metadata);
        let jobs = self.job_statuses().await;
        let spaces: Vec<SpaceStatus> = self
            .spaces()
            .iter()
            .filter_map(|space| space_status(space, &metadata, &jobs))
            .collect();
        let health = if spaces
            .iter()
            .any(|s| matches!(s.health, SpaceHealth::Offline { .. }))
        {
            PoolHealth::DataLoss
        } else if disks.iter().any(|d| {
            d.state != DiskState::Removed && d.condition != Condition::Online && d.slabs_used > 0
        }) {
            PoolHealth::Degraded
        } else {
            PoolHealth::Ok
        };
        let used = metadata.used_slabs();
        let on_journal = |disk: terrace_meta::DiskIndex| {
            metadata
                .disk(disk)
                .is_some_and(|record| record.usage == Usage::Journal)
        };
        let used_on_journal = used.iter().filter(|slab| on_journal(slab.disk)).count() as u64;
        let slabs_bytes = |wanted: &dyn Fn(&terrace_meta::DiskRecord) -> bool| -> u64 {
            metadata
                .disks
                .iter()
                .filter(|disk| wanted(disk))
                .map(|disk| u64::from(disk.slab_count) * metadata.slab_bytes)
                .sum()
        };
        PoolStatus {
            name: metadata.name.clone(),
            id: metadata.pool_id.to_string(),
            generation: metadata.generation,
            slab_bytes: metadata.slab_bytes,
            metadata_bytes: self
                .shared
                .metadata_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            metadata_slot_bytes: self.shared.metadata_slot_bytes,
            metadata_reserve_bytes: crate::room::repair_reserve_bytes(&metadata),
            health,
            read_only: self.read_only_reason().map(str::to_string),
            capacity_bytes: slabs_bytes(&|disk| disk.takes_capacity()),
            allocated_bytes: (used.len() as u64 - used_on_journal) * metadata.slab_bytes,
            journal_bytes: slabs_bytes(&|disk| disk.serves_logs()),
            journal_allocated_bytes: used_on_journal * metadata.slab_bytes,
            provisioned_bytes: metadata
                .spaces
                .iter()
                .filter_map(|space| {
                    let geometry = space.geometry(metadata.slab_bytes).ok()?;
                    Some(
                        space.extents.len() as u64
                            * u64::from(geometry.slots_per_extent())
                            * metadata.slab_bytes,
                    )
                })
                .sum(),
            thin_reserve_bytes: metadata
                .spaces
                .iter()
                .filter(|space| space.provisioning == terrace_meta::Provisioning::Thin)
                .filter_map(|space| space.geometry(metadata.slab_bytes).ok())
                .map(|geometry| crate::thin::repair_reserve_slabs(&metadata, &geometry))
                .max()
                .unwrap_or(0)
                * metadata.slab_bytes,
            impact: self.impacts(&metadata),
            disks,
            spaces,
            settings: metadata.settings,
            log_memory_bytes: self.log_memory().0,
            log_memory_max_bytes: self.log_memory().1,
            preparing: self
                .shared
                .preparing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|(space, total, done)| Preparation {
                    space: space.clone(),
                    total_bytes: *total,
                    done_bytes: done.load(std::sync::atomic::Ordering::Relaxed),
                }),
        }
    }

    /// The devices of the disks in service, by index: what a watcher
    /// checks is still there, without building a whole status (which walks
    /// every slab of the pool).
    pub fn online_devices(&self) -> Vec<(terrace_meta::DiskIndex, String)> {
        self.shared
            .disks()
            .iter()
            .filter(|disk| disk.is_online())
            .filter_map(|disk| Some((disk.index, disk.device_name()?)))
            .collect()
    }

    fn disk_statuses(&self, metadata: &PoolMetadata) -> Vec<DiskStatus> {
        let mut unrepaired = self.unrepaired(metadata);
        let used = metadata.used_slabs();
        let runtime = self.shared.disks();
        let mut online: Vec<u64> = runtime
            .iter()
            .filter(|d| d.is_online() && d.latency_us() > 0)
            .map(|d| d.latency_us())
            .collect();
        online.sort_unstable();
        let median = online.get(online.len() / 2).copied().unwrap_or(0);
        runtime
            .iter()
            .zip(&metadata.disks)
            .map(|(disk, record)| {
                let latency_us = disk.latency_us();
                DiskStatus {
                    index: disk.index.0,
                    id: record.id.to_string(),
                    device: disk.device_name().unwrap_or(record.path_hint.clone()),
                    condition: disk.condition(),
                    state: record.state,
                    // A released disk's last run-time reason (it went
                    // missing, say) is history; its state is what counts.
                    reason: if record.state == DiskState::Removed {
                        "removed from the pool".into()
                    } else if disk.is_online() {
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
                    latency_us,
                    errors: disk.errors(),
                    // Only a disk in service is slow; one that failed or
                    // went missing says so instead.
                    slow: disk.is_online()
                        && online.len() >= 3
                        && latency_us >= SLOW_FLOOR_US
                        && latency_us > median * SLOW_FACTOR,
                    missed_extents: metadata.dirty_of(disk.index).count() as u64,
                    unrepaired: unrepaired.remove(&disk.index),
                    job: metadata
                        .jobs
                        .iter()
                        .filter(|job| job.is_active() && job.kind != JobKind::LogsToJournal)
                        .find(|job| crate::jobs::job_disks(metadata, job).contains(&disk.index))
                        .map(|job| job.id),
                }
            })
            .collect()
    }

    /// What each online disk — and each labelled enclosure and node — would
    /// cost if it failed now.
    fn impacts(&self, metadata: &PoolMetadata) -> Vec<FailureImpact> {
        let mut groups: BTreeMap<Group, Vec<u16>> = BTreeMap::new();
        for (index, record) in metadata.disks.iter().enumerate() {
            if record.state != DiskState::Active {
                continue;
            }
            let disk = index as u16;
            groups.entry(Group::Disk(disk)).or_default().push(disk);
            if !record.enclosure.is_empty() {
                let key = record.domain_key(terrace_meta::DiskIndex(disk), FaultDomain::Enclosure);
                groups.entry(Group::Enclosure(key)).or_default().push(disk);
            }
            if !record.node.is_empty() {
                let node = Group::Node(record.node.clone());
                groups.entry(node).or_default().push(disk);
            }
        }
        let spaces = self.spaces();
        // Each log under the name of the space it serves.
        let logs: Vec<(String, Arc<Volume>)> = self
            .logs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(id, log)| {
                let owner = match metadata.space_by_id(*id)?.role {
                    terrace_meta::SpaceRole::Log { owner } => metadata.space_by_id(owner)?,
                    terrace_meta::SpaceRole::Data | terrace_meta::SpaceRole::Sums { .. } => {
                        return None
                    }
                };
                Some((owner.name.clone(), log.clone()))
            })
            .collect();
        groups
            .into_iter()
            .map(|(group, members)| {
                let gone = |disk: u16| members.contains(&disk);
                let mut impact = FailureImpact {
                    what: group.to_string(),
                    lose_data: Vec::new(),
                    lose_redundancy: Vec::new(),
                    lose_log: Vec::new(),
                    lose_log_redundancy: Vec::new(),
                };
                for space in &spaces {
                    let (lost, bare) = (&mut impact.lose_data, &mut impact.lose_redundancy);
                    file_impact(space.impact_of(&gone), space.name(), lost, bare);
                }
                for (owner, log) in &logs {
                    let (lost, bare) = (&mut impact.lose_log, &mut impact.lose_log_redundancy);
                    file_impact(log.impact_of(&gone), owner, lost, bare);
                }
                impact
            })
            .collect()
    }
}

/// Put `name` on the list [`Volume::impact_of`]'s answer says: it would
/// lose data (`lost`), or keep it with no redundancy left (`bare`).
fn file_impact(impact: Option<bool>, name: &str, lost: &mut Vec<String>, bare: &mut Vec<String>) {
    match impact {
        Some(true) => lost.push(name.to_string()),
        Some(false) => bare.push(name.to_string()),
        None => {}
    }
}

/// What may fail at once, in the order status lists them: disks by index
/// (disk 2 before disk 10), then enclosures, then nodes (the variants'
/// order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    Disk(u16),
    Enclosure(String),
    Node(String),
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Group::Disk(index) => write!(f, "disk {index}"),
            Group::Enclosure(key) => write!(f, "enclosure {key}"),
            Group::Node(node) => write!(f, "node {node}"),
        }
    }
}

fn space_status(
    space: &Space,
    metadata: &PoolMetadata,
    jobs: &[crate::JobStatus],
) -> Option<SpaceStatus> {
    let record = metadata.space(space.name())?;
    let geometry = space.geometry();
    let mut health = space.health();
    let repairing = metadata.jobs.iter().find(|job| {
        job.state == JobState::Running
            && matches!(job.kind, JobKind::Repair { .. } | JobKind::Resync { .. })
            && job.moves.iter().any(|m| m.space == record.id && !m.done)
    });
    if let (Some(job), SpaceHealth::Degraded { survives } | SpaceHealth::Incomplete { survives }) =
        (repairing, &health)
    {
        let status = jobs.iter().find(|status| status.id == job.id);
        let percent = status.map_or(0, |s| (s.bytes_done * 100 / s.bytes_total.max(1)) as u32);
        health = SpaceHealth::Repairing {
            job: job.id,
            percent,
            survives: *survives,
        };
    }
    Some(SpaceStatus {
        name: record.name.clone(),
        layout: record.layout,
        columns: record.columns,
        data_columns: geometry.data_columns(),
        columns_reason: record.columns_reason.clone(),
        interleave_bytes: record.interleave_bytes,
        size_bytes: record.size_bytes,
        raw_bytes: record
            .extents
            .iter()
            .filter(|extent| extent.slabs.is_some())
            .count() as u64
            * u64::from(geometry.slots_per_extent())
            * metadata.slab_bytes,
        extents: record.extents.len() as u64,
        provisioning: record.provisioning,
        allocated_bytes: space.allocated_bytes(),
        fault_domain: record.fault_domain,
        failures_tolerated: record.layout.failures_tolerated(),
        health,
        checksums: match (record.checksums, space.sums().is_some()) {
            (false, _) => Checksums::Off,
            (true, true) => Checksums::On,
            (true, false) => Checksums::NoRoom,
        },
        resync: space
            .pool
            .crash_resync
            .progress(space.id, space.pool.env.now_ns()),
        cache: space.journal().map(|journal| {
            let log = journal.log();
            let log_record = metadata.spaces.iter().find(|s| s.id == log.id());
            let mut log_disks: Vec<u16> = log_record
                .map(|s| {
                    s.extents
                        .iter()
                        .flat_map(|e| e.slabs.iter().flatten().map(|slab| slab.disk.0))
                        .collect()
                })
                .unwrap_or_default();
            log_disks.sort_unstable();
            log_disks.dedup();
            CacheInfo {
                status: journal.status(),
                log_disks,
                log_copies: log.geometry().layout().copies(),
                log_health: log.health(),
                placement: log_record.map_or(String::new(), |s| s.columns_reason.clone()),
            }
        }),
    })
}
