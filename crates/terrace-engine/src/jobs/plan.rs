//! Planning a job: which slots move where.
//!
//! A repair or a move re-creates each affected slot of each extent on a new
//! slab, chosen like placement chooses: on a disk the extent does not use
//! already, outside the fault domains of the slot's redundancy group, hot
//! spares first (that is what they are for), then the capacity disk with the
//! most free slabs. Targets are reserved in the job's metadata record, so
//! nothing else allocates them while the job runs.

use std::collections::{BTreeMap, BTreeSet};

use terrace_layout::Geometry;
use terrace_meta::{
    Allocator, DiskIndex, DiskRecord, DiskState, JobKind, MoveRecord, PoolMetadata, SlabRef,
    SpaceRole, Usage,
};

use crate::error::EngineError;

/// The disks that may receive a slot, by usage: journal disks, hot spares,
/// capacity disks; slabs `reserved` for a change not yet committed left
/// out. Which of them a job may use for a space, and in what order, is
/// [`Pools::for_job`].
struct Pools([Allocator; 3]);

impl Pools {
    fn new(
        metadata: &PoolMetadata,
        level: terrace_meta::FaultDomain,
        only: Option<DiskIndex>,
        reserved: &BTreeSet<SlabRef>,
    ) -> Pools {
        let eligible = |wanted: Usage| {
            move |index: DiskIndex, disk: &DiskRecord| {
                disk.state == DiskState::Active
                    && disk.usage == wanted
                    && only.is_none_or(|only| only == index)
            }
        };
        let pool =
            |usage| Allocator::with_filter(metadata, level, eligible(usage)).exclude(reserved);
        Pools([
            pool(Usage::Journal),
            pool(Usage::HotSpare),
            pool(Usage::Auto),
        ])
    }

    /// Where a job of `kind` may put a slot of a space with `role`, in
    /// order. A space's data goes to hot spares, then capacity disks, never
    /// to journal disks. A write-back log goes to journal disks first, as
    /// it was placed: re-mirrored onto capacity disks while another journal
    /// disk had room, a log of a parity space on SSDs wrote at the speed of
    /// hard disks from then on. A job moving logs onto journal disks uses
    /// them alone.
    fn for_job(&mut self, kind: JobKind, role: SpaceRole) -> impl Iterator<Item = &mut Allocator> {
        let (skip, take) = match (kind, role) {
            (JobKind::LogsToJournal, _) => (0, 1),
            (_, SpaceRole::Log { .. }) => (0, 3),
            (_, SpaceRole::Data | SpaceRole::Sums { .. }) => (1, 2),
        };
        self.0.iter_mut().skip(skip).take(take)
    }
}

/// One [`Pools`] per fault-domain level, shared by every space of a plan
/// at that level, so that no slab is chosen twice.
#[derive(Default)]
struct LevelPools(Vec<(terrace_meta::FaultDomain, Pools)>);

impl LevelPools {
    fn get(
        &mut self,
        metadata: &PoolMetadata,
        level: terrace_meta::FaultDomain,
        only: Option<DiskIndex>,
        reserved: &BTreeSet<SlabRef>,
    ) -> &mut Pools {
        let position = match self.0.iter().position(|(at, _)| *at == level) {
            Some(position) => position,
            None => {
                self.0
                    .push((level, Pools::new(metadata, level, only, reserved)));
                self.0.len() - 1
            }
        };
        &mut self.0[position].1
    }
}

/// Where the other slots of one extent are, or are being moved to.
struct ExtentPlaces<'a> {
    /// The extent's slabs as the metadata has them.
    slabs: &'a [SlabRef],
    /// (slot, target) of every move of this extent still in flight in an
    /// active job or planned in this one: once done, the slot lives there.
    pending: Vec<(usize, SlabRef)>,
}

impl<'a> ExtentPlaces<'a> {
    fn new(
        metadata: &PoolMetadata,
        space: terrace_meta::SpaceId,
        extent: u32,
        slabs: &'a [SlabRef],
        planned: &[MoveRecord],
    ) -> ExtentPlaces<'a> {
        let in_flight = metadata
            .jobs
            .iter()
            .filter(|job| job.is_active())
            .flat_map(|job| job.moves.iter().filter(|step| !step.done));
        let pending = in_flight
            .chain(planned)
            .filter(|step| step.space == space && step.extent == extent)
            .map(|step| (usize::from(step.slot), step.target))
            .collect();
        ExtentPlaces { slabs, pending }
    }

    /// The disks that hold, or will hold, slot `slot`.
    fn disks_of(&self, slot: usize) -> impl Iterator<Item = DiskIndex> + '_ {
        let pending = self.pending.iter().filter(move |(s, _)| *s == slot);
        std::iter::once(self.slabs[slot].disk).chain(pending.map(|(_, target)| target.disk))
    }
}

/// Choose a target slab for `slot` of an extent: on no disk that holds or
/// will hold another slot of it (two slots on one disk would make one disk
/// failure cost two), outside the domains of its redundancy group; among
/// those, the disk with the least work in `busy`.
#[allow(clippy::too_many_arguments)]
fn choose_target<'a>(
    metadata: &PoolMetadata,
    geometry: &Geometry,
    level: terrace_meta::FaultDomain,
    places: &ExtentPlaces,
    slot: usize,
    pools: impl Iterator<Item = &'a mut Allocator>,
    also_avoid: Option<DiskIndex>,
    busy: &Busy,
) -> Option<SlabRef> {
    let mut avoid_disks: BTreeSet<DiskIndex> = (0..places.slabs.len())
        .flat_map(|other| places.disks_of(other))
        .collect();
    avoid_disks.extend(also_avoid);
    let group = geometry
        .redundancy_groups()
        .into_iter()
        .find(|group| group.contains(&(slot as u32)))
        .unwrap_or_default();
    let avoid_domains: BTreeSet<String> = group
        .iter()
        .filter(|&&other| other as usize != slot)
        .flat_map(|&other| places.disks_of(other as usize))
        .map(|disk| metadata.disks[usize::from(disk.0)].domain_key(disk, level))
        .collect();
    pools
        .into_iter()
        .find_map(|pool| pool.allocate_slab_by(&avoid_disks, &avoid_domains, |disk| busy.of(disk)))
}

/// Slabs each disk will read or write for the moves of one plan: a
/// repair's destinations go to the disks with the least of it, so that
/// every disk copies about as much and the job ends when they all do
/// (choosing by free slabs alone, one disk in three of a twelve-disk
/// mirror got twice the copying of the rest and set the repair's time).
#[derive(Default)]
struct Busy(BTreeMap<DiskIndex, u64>);

impl Busy {
    fn of(&self, disk: DiskIndex) -> u64 {
        self.0.get(&disk).copied().unwrap_or(0)
    }

    fn add(&mut self, disk: DiskIndex) {
        *self.0.entry(disk).or_default() += 1;
    }

    /// The reads that re-create `slot` of an extent: every other slot of
    /// its redundancy group on a disk other than `lost` (a mirror reads
    /// one copy of the group, parity all its other columns).
    fn add_sources(
        &mut self,
        geometry: &Geometry,
        slabs: &[SlabRef],
        slot: usize,
        lost: DiskIndex,
    ) {
        let group = geometry
            .redundancy_groups()
            .into_iter()
            .find(|group| group.contains(&(slot as u32)))
            .unwrap_or_default();
        for other in group {
            let disk = slabs[other as usize].disk;
            if other as usize != slot && disk != lost {
                self.add(disk);
            }
        }
    }
}

/// The moves of a job: every slot that the job's disk holds (or, for a
/// resync, the dirty extents of the returning disk, in place). A repair
/// that finds room for the spaces' data but not for some log slots
/// re-creates the data and leaves those log slots (their logs keep their
/// other copies; [`unplaced_logs`] names them for status); with nothing
/// else to move it is refused.
pub(crate) fn plan(
    metadata: &PoolMetadata,
    kind: JobKind,
    reserved: &BTreeSet<SlabRef>,
) -> Result<Vec<MoveRecord>, EngineError> {
    let (moves, unplaced) = plan_moves(metadata, kind, reserved)?;
    match unplaced.into_iter().next() {
        Some(first) if moves.is_empty() => Err(first.refusal()),
        _ => Ok(moves),
    }
}

/// A slot a repair finds no room for: the space as a refusal names it,
/// and the extent.
#[derive(Debug, Clone)]
pub(crate) struct Unplaced {
    pub(crate) space: String,
    pub(crate) extent: u64,
}

impl Unplaced {
    pub(crate) fn refusal(self) -> EngineError {
        EngineError::NoRoomToRepair {
            space: self.space,
            extent: self.extent,
        }
    }
}

/// The log slots a repair of `disk` would find no room for now, and how
/// many slots of the disk it would re-create.
pub(crate) fn unplaced_logs(
    metadata: &PoolMetadata,
    disk: DiskIndex,
    reserved: &BTreeSet<SlabRef>,
) -> Result<(Vec<Unplaced>, usize), EngineError> {
    let (moves, unplaced) = plan_moves(metadata, JobKind::Repair { disk }, reserved)?;
    Ok((unplaced, moves.len()))
}

/// A space as a refusal names it: a log after the space it serves.
fn shown_name(metadata: &PoolMetadata, space: &terrace_meta::SpaceRecord) -> String {
    match space.role {
        SpaceRole::Log { owner } => match metadata.space_by_id(owner) {
            Some(owner) => format!("{} (its write-back log)", owner.name),
            None => space.name.clone(),
        },
        SpaceRole::Sums { owner } => match metadata.space_by_id(owner) {
            Some(owner) => format!("{} (its block sums)", owner.name),
            None => space.name.clone(),
        },
        SpaceRole::Data => space.name.clone(),
    }
}

/// [`plan`]'s moves, and (repairs only) the refusals of the log slots
/// left where they are for lack of room.
fn plan_moves(
    metadata: &PoolMetadata,
    kind: JobKind,
    reserved: &BTreeSet<SlabRef>,
) -> Result<(Vec<MoveRecord>, Vec<Unplaced>), EngineError> {
    let (source, only) = match kind {
        JobKind::Repair { disk } | JobKind::Evacuate { disk } => (disk, None),
        JobKind::Replace { old, new } => (old, Some(new)),
        JobKind::Resync { disk } => return Ok((resync_moves(metadata, disk), Vec::new())),
        JobKind::LogsToJournal => return Ok((log_moves(metadata, reserved), Vec::new())),
        // A scrub moves nothing: it walks the pool by its cursor.
        JobKind::Scrub => return Ok((Vec::new(), Vec::new())),
    };
    // Every slot of `source` to re-create: (space, its geometry, extent,
    // the extent's slabs, slot).
    let mut slots = Vec::new();
    for space in &metadata.spaces {
        let geometry = space.geometry(metadata.slab_bytes)?;
        for (extent, record) in space.extents.iter().enumerate() {
            let Some(slabs) = record.slabs.as_ref() else {
                continue;
            };
            if matches!(kind, JobKind::Repair { .. })
                && !recoverable(metadata, &geometry, slabs, source)
            {
                // Its data is gone with the disk (no redundancy left to
                // rebuild from): nothing to re-create; it stays lost.
                continue;
            }
            for (slot, slab) in slabs.iter().enumerate() {
                if slab.disk == source {
                    slots.push((space, geometry, extent, slabs, slot));
                }
            }
        }
    }
    // A repair reads the lost slots' content from the rest of each
    // redundancy group; a move or a replacement from `source` itself.
    let mut busy = Busy::default();
    if matches!(kind, JobKind::Repair { .. }) {
        for (_, geometry, _, slabs, slot) in &slots {
            busy.add_sources(geometry, slabs, *slot, source);
        }
    }
    let mut unplaced = Vec::new();
    let mut moves = Vec::new();
    let mut level_pools = LevelPools::default();
    for (space, geometry, extent, slabs, slot) in slots {
        let pools = level_pools
            .get(metadata, space.fault_domain, only, reserved)
            .for_job(kind, space.role);
        let places = ExtentPlaces::new(metadata, space.id, extent as u32, slabs, &moves);
        let target = choose_target(
            metadata,
            &geometry,
            space.fault_domain,
            &places,
            slot,
            pools,
            None,
            &busy,
        );
        let no_room = Unplaced {
            space: shown_name(metadata, space),
            extent: extent as u64,
        };
        let target = match target {
            Some(target) => target,
            None if matches!(kind, JobKind::Repair { .. })
                && matches!(space.role, SpaceRole::Log { .. }) =>
            {
                unplaced.push(no_room);
                continue;
            }
            None => return Err(no_room.refusal()),
        };
        busy.add(target.disk);
        moves.push(MoveRecord {
            space: space.id,
            extent: extent as u32,
            slot: slot as u16,
            target,
            watermark_rows: 0,
            done: false,
        });
    }
    Ok((moves, unplaced))
}

/// Whether an extent's data survives losing `source` on top of the disks
/// the metadata already counts lost.
fn recoverable(
    metadata: &PoolMetadata,
    geometry: &Geometry,
    slabs: &[SlabRef],
    source: DiskIndex,
) -> bool {
    geometry
        .remaining_tolerance(|slot| {
            let disk = slabs[slot as usize].disk;
            disk == source || metadata.disks[usize::from(disk.0)].state != DiskState::Active
        })
        .is_some()
}

/// Every slot of a write-back log that lives on an active capacity disk,
/// onto a journal disk: for each log whose copies the pool's journal disks
/// can hold on distinct disks, and only if all of that log's such slots
/// find room (a log with one copy on SSDs and one on hard disks still
/// writes at the hard disks' speed). Slots on failed or missing disks are a
/// repair's.
fn log_moves(metadata: &PoolMetadata, reserved: &BTreeSet<SlabRef>) -> Vec<MoveRecord> {
    let journal_disks = crate::placement::journal_disks(metadata);
    let mut level_pools = LevelPools::default();
    let mut moves = Vec::new();
    for space in &metadata.spaces {
        if !matches!(space.role, SpaceRole::Log { .. }) {
            continue;
        }
        let Ok(geometry) = space.geometry(metadata.slab_bytes) else {
            continue;
        };
        if journal_disks < geometry.slots_per_extent() as usize {
            continue;
        }
        let pools = level_pools.get(metadata, space.fault_domain, None, reserved);
        let mut planned = Vec::new();
        let placed = space.extents.iter().enumerate().all(|(extent, record)| {
            let Some(slabs) = record.slabs.as_ref() else {
                return true;
            };
            slabs.iter().enumerate().all(|(slot, slab)| {
                let disk = &metadata.disks[usize::from(slab.disk.0)];
                if disk.state != DiskState::Active || disk.serves_logs() {
                    return true;
                }
                let places = ExtentPlaces::new(metadata, space.id, extent as u32, slabs, &planned);
                let target = choose_target(
                    metadata,
                    &geometry,
                    space.fault_domain,
                    &places,
                    slot,
                    pools.for_job(JobKind::LogsToJournal, space.role),
                    None,
                    &Busy::default(),
                );
                target.is_some_and(|target| {
                    planned.push(MoveRecord {
                        space: space.id,
                        extent: extent as u32,
                        slot: slot as u16,
                        target,
                        watermark_rows: 0,
                        done: false,
                    });
                    true
                })
            })
        });
        if placed {
            moves.extend(planned);
        }
    }
    moves
}

/// A returning disk catches up in place on the extents written while it
/// was away.
fn resync_moves(metadata: &PoolMetadata, disk: DiskIndex) -> Vec<MoveRecord> {
    let dirty: BTreeSet<(terrace_meta::SpaceId, u32)> = metadata.dirty_of(disk).collect();
    let mut moves = Vec::new();
    for space in &metadata.spaces {
        for (extent, record) in space.extents.iter().enumerate() {
            if !dirty.contains(&(space.id, extent as u32)) {
                continue;
            }
            for (slot, slab) in record.slabs.iter().flatten().enumerate() {
                if slab.disk == disk {
                    moves.push(MoveRecord {
                        space: space.id,
                        extent: extent as u32,
                        slot: slot as u16,
                        target: *slab,
                        watermark_rows: 0,
                        done: false,
                    });
                }
            }
        }
    }
    moves
}

/// A new target for move `index` of `job`, whose destination failed.
pub(crate) fn retarget(
    metadata: &PoolMetadata,
    job: &terrace_meta::JobRecord,
    index: usize,
    reserved: &BTreeSet<SlabRef>,
) -> Result<SlabRef, EngineError> {
    let step = &job.moves[index];
    let only = match job.kind {
        JobKind::Replace { new, .. } => Some(new),
        _ => None,
    };
    let space = metadata
        .space_by_id(step.space)
        .ok_or(EngineError::NoSuchSpace {
            name: format!("#{}", step.space.0),
        })?;
    let geometry = space.geometry(metadata.slab_bytes)?;
    let slabs = space.extents[step.extent as usize]
        .slabs
        .clone()
        .unwrap_or_default();
    let mut pools = Pools::new(metadata, space.fault_domain, only, reserved);
    let places = ExtentPlaces::new(metadata, step.space, step.extent, &slabs, &[]);
    choose_target(
        metadata,
        &geometry,
        space.fault_domain,
        &places,
        usize::from(step.slot),
        pools.for_job(job.kind, space.role),
        Some(step.target.disk),
        &Busy::default(),
    )
    .ok_or(EngineError::NoRoomToRepair {
        space: space.name.clone(),
        extent: u64::from(step.extent),
    })
}

/// Why a repair of `disk`, which holds data, plans no move: every extent
/// with a slab on it has lost more disks than its layout tolerates.
pub(super) fn nothing_recoverable(disk: DiskIndex) -> String {
    format!(
        "nothing to repair: every extent with a slab on disk {} has lost more disks than its \
         layout tolerates, so none can be re-created; they read again once the disks are back",
        disk.0
    )
}

impl super::JobStatus {
    /// Whether this is a repair that re-created nothing because every
    /// extent it was for had lost more disks than its layout tolerates:
    /// they read again once those disks are taken back
    /// ([`Pool::clear`](crate::Pool::clear)).
    pub fn waits_for_lost_disks(&self) -> bool {
        matches!(self.kind, JobKind::Repair { disk } if self.reason == nothing_recoverable(disk))
    }
}
