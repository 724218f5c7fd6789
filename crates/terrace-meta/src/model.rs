//! The pool metadata: what every disk of a pool carries a copy of.
//!
//! Free slabs are not stored: they are derived from the extent maps
//! ([`PoolMetadata::used_slabs`]), so the two can never disagree.

use std::collections::BTreeSet;

use terrace_layout::{Geometry, Layout, LayoutError};

use crate::ids::{DiskId, DiskIndex, PoolId, SlabRef, SpaceId};

/// What a disk is made of; decides where journals and hot tiers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Media {
    Hdd,
    Ssd,
    Unknown,
}

/// What the pool may use a disk for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Usage {
    /// Capacity for any space.
    Auto,
    /// Capacity only for spaces that name the disk.
    Manual,
    /// Kept empty, to receive repairs.
    HotSpare,
    /// Holds write-back logs.
    Journal,
    /// Takes no new data; being emptied or kept for the record.
    Retired,
}

impl Usage {
    /// As users write it (`--usage`, `DISK,usage=U`).
    pub fn name(self) -> &'static str {
        match self {
            Usage::Auto => "auto",
            Usage::Manual => "manual",
            Usage::HotSpare => "hot-spare",
            Usage::Journal => "journal",
            Usage::Retired => "retired",
        }
    }
}

/// What the metadata knows of a disk's condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiskState {
    /// Present and trusted; receives metadata commits.
    Active,
    /// Failed an I/O; its contents are not trusted until repaired.
    Failed,
    /// Not found at import, or vanished while running.
    Missing,
    /// No longer part of the pool (its row stays so indices stay stable).
    Removed,
}

/// Which fault domain an extent's redundant slabs must not share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultDomain {
    Disk,
    Enclosure,
    Node,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provisioning {
    /// Every extent allocated at creation.
    Fixed,
    /// Extents allocated on first write.
    Thin,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRecord {
    pub id: DiskId,
    /// Bytes of the device when it joined.
    pub size_bytes: u64,
    /// Slabs the data area holds.
    pub slab_count: u32,
    pub media: Media,
    pub usage: Usage,
    pub state: DiskState,
    /// Fault-domain labels; empty when not given.
    pub enclosure: String,
    pub node: String,
    /// Where the disk was last seen (informational; import scans by label).
    pub path_hint: String,
    /// Why the disk is failed or missing; empty otherwise.
    pub state_reason: String,
    /// The generation of the commit that recorded the disk missing (0 when
    /// it is not missing, or was recorded so by slot format 1). A disk
    /// coming back holds the generations before it: one holding older ones
    /// is an older copy of the disk, and its data older than what the
    /// pool's records of writes made while it was away cover.
    pub missing_since: u64,
}

impl DiskRecord {
    /// The fault-domain key of this disk at `level` (disk index for `Disk`).
    pub fn domain_key(&self, index: DiskIndex, level: FaultDomain) -> String {
        match level {
            FaultDomain::Disk => format!("#{}", index.0),
            FaultDomain::Enclosure => format!("{}/{}", self.node, self.enclosure),
            FaultDomain::Node => self.node.clone(),
        }
    }

    /// Whether this disk may receive new capacity slabs.
    pub fn takes_capacity(&self) -> bool {
        self.state == DiskState::Active && self.usage == Usage::Auto
    }

    /// Whether this disk serves write-back logs (an active journal disk).
    pub fn serves_logs(&self) -> bool {
        self.state == DiskState::Active && self.usage == Usage::Journal
    }
}

/// One extent: a slab per slot, or none yet (thin, unallocated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentRecord {
    pub slabs: Option<Vec<SlabRef>>,
}

impl ExtentRecord {
    /// The slabs of `extents` (none for an unallocated one).
    pub fn slabs_of<'a, I>(extents: I) -> impl Iterator<Item = SlabRef> + 'a
    where
        I: IntoIterator<Item = &'a ExtentRecord>,
        I::IntoIter: 'a,
    {
        extents
            .into_iter()
            .filter_map(|extent| extent.slabs.as_ref())
            .flatten()
            .copied()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceRecord {
    pub id: SpaceId,
    pub name: String,
    /// The name NBD clients open it by, fixed at creation so that it never
    /// changes under them. `None` for a log space, and for a space of slot
    /// format 3 or older until the import that reads it decides one.
    pub export: Option<String>,
    pub layout: Layout,
    pub columns: u32,
    pub interleave_bytes: u64,
    pub size_bytes: u64,
    pub provisioning: Provisioning,
    pub fault_domain: FaultDomain,
    pub created_ns: u64,
    /// Why the column count is what it is (shown by `space show`).
    pub columns_reason: String,
    /// A space clients use, or the hidden log of one.
    pub role: SpaceRole,
    /// The write-back cache: its log space and its state.
    pub cache: Option<CacheRecord>,
    /// The hidden space that holds this space's block sums (`None`: the
    /// space has none yet, as in pools of slot format 4 or older).
    pub sums: Option<SpaceId>,
    /// Whether the space keeps block sums at all (off only when asked at
    /// creation: a space for scratch data, or to measure their cost).
    pub checksums: bool,
    pub extents: Vec<ExtentRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpaceRole {
    Data,
    /// The write-back log of space `owner`: a hidden mirrored space.
    Log {
        owner: SpaceId,
    },
    /// The block sums of space `owner`: a hidden mirrored space of sums
    /// pages (`terrace_meta::sums`).
    Sums {
        owner: SpaceId,
    },
}

impl SpaceRole {
    /// The space a hidden space serves (`None` for a data space).
    pub fn owner(self) -> Option<SpaceId> {
        match self {
            SpaceRole::Data => None,
            SpaceRole::Log { owner } | SpaceRole::Sums { owner } => Some(owner),
        }
    }
}

/// A space's write-back cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRecord {
    /// Bytes of log the cache may fill (the ring's size).
    pub bytes: u64,
    /// The hidden space that holds the log.
    pub log_space: SpaceId,
    /// Random per log: records of an earlier log on the same slabs never
    /// pass for this one's.
    pub epoch: u64,
    /// Ring position (absolute, ever increasing) of a recent checkpoint
    /// record: where recovery starts scanning.
    pub checkpoint_hint: u64,
    /// Byte offset in the log space of that position (the ring's laps may
    /// differ in size after a live resize, so it is not derived).
    pub checkpoint_offset: u64,
}

impl SpaceRecord {
    pub fn geometry(&self, slab_bytes: u64) -> Result<Geometry, LayoutError> {
        Geometry::new(self.layout, self.columns, self.interleave_bytes, slab_bytes)
    }
}

/// What the pool does when a disk goes missing or fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetireMissing {
    /// Wait for the disk or the admin.
    Never,
    /// Retire it and repair at once.
    Always,
    /// Repair at once when a hot spare or enough free slabs exist.
    Auto,
}

/// How many extents a repair works on at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RepairPolicy {
    /// Many extents, on many disks, at once.
    Parallel,
    /// One extent at a time (gentlest on client I/O).
    Sequential,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    pub retire_missing: RetireMissing,
    pub repair_policy: RepairPolicy,
    /// Repair and move bandwidth limit; 0 = unlimited.
    pub repair_rate_bytes_per_second: u64,
    /// A disk whose read and checksum errors reach this count within
    /// `error_window_secs` is failed (0: never for errors counted).
    pub error_limit: u32,
    pub error_window_secs: u32,
    /// How often a scrub starts by itself (0: never).
    pub scrub_interval_secs: u64,
    /// Not a setting: when the last scrub started (wall clock), from which
    /// the next is scheduled.
    pub scrub_last_ns: u64,
    /// What a space created without saying gets: fixed or thin.
    pub provisioning: Provisioning,
    /// Percentages of the capacity whose crossing by the slabs allocated,
    /// up or down, is an event (ascending; 0: none).
    pub alert_percents: [u8; 3],
}

/// Allocation alerts at 70, 85 and 95 % of the capacity: Storage Spaces'
/// thin-provisioning alert fires at 70 %.
pub const ALERT_PERCENTS_DEFAULT: [u8; 3] = [70, 85, 95];

/// Errors a disk may return in the window before it is failed: ZFS's
/// event daemon degrades a vdev after 10 checksum errors in 10 minutes.
pub const ERROR_LIMIT_DEFAULT: u32 = 10;
pub const ERROR_WINDOW_SECS_DEFAULT: u32 = 600;
/// A scrub every four weeks, as distributions schedule ZFS's monthly.
pub const SCRUB_INTERVAL_SECS_DEFAULT: u64 = 28 * 24 * 3600;

impl Default for PoolSettings {
    fn default() -> PoolSettings {
        PoolSettings {
            retire_missing: RetireMissing::Auto,
            repair_policy: RepairPolicy::Parallel,
            repair_rate_bytes_per_second: 0,
            error_limit: ERROR_LIMIT_DEFAULT,
            error_window_secs: ERROR_WINDOW_SECS_DEFAULT,
            scrub_interval_secs: SCRUB_INTERVAL_SECS_DEFAULT,
            scrub_last_ns: 0,
            provisioning: Provisioning::Fixed,
            alert_percents: ALERT_PERCENTS_DEFAULT,
        }
    }
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// Re-create the lost slabs of a failed or missing disk elsewhere.
    Repair { disk: DiskIndex },
    /// Move every slab off a disk, then release it.
    Evacuate { disk: DiskIndex },
    /// Move every slab of `old` onto `new`.
    Replace { old: DiskIndex, new: DiskIndex },
    /// Bring a returning disk up to date (regions written while it was away).
    Resync { disk: DiskIndex },
    /// Move write-back logs off capacity disks onto journal disks (a log
    /// placed or re-mirrored there before the pool had journal disks
    /// enough).
    LogsToJournal,
    /// Read every allocated block of every space, check sums and
    /// redundancy, repair what disagrees.
    Scrub,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    Running,
    Paused,
    Done,
    Cancelled,
    Failed,
}

/// One slot of one extent being re-created (or moved) into `target`.
/// Rows below `watermark_rows` are already valid on the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveRecord {
    pub space: SpaceId,
    pub extent: u32,
    pub slot: u16,
    pub target: SlabRef,
    pub watermark_rows: u64,
    pub done: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub id: u64,
    pub kind: JobKind,
    pub state: JobState,
    /// Why it failed or was cancelled; empty otherwise.
    pub reason: String,
    pub created_ns: u64,
    pub finished_ns: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// An active job's moves. A finished job keeps only their counts
    /// (`folded_*`): its list would make the metadata grow with the pool's
    /// history, a whole disk's slabs per job.
    pub moves: Vec<MoveRecord>,
    pub folded_moves: u32,
    pub folded_moves_done: u32,
    /// Where a job that walks the pool (a scrub) has got to: its own
    /// position, resumed from after a crash.
    pub cursor: u64,
    /// What a scrub found: blocks repaired, and blocks it could not repair.
    pub repaired: u64,
    pub unrepaired: u64,
}

impl JobRecord {
    /// A job of `kind` in `state`, created at `created_ns`, to move
    /// `bytes_total` by `moves`: nothing done, no reason, no cursor.
    pub fn new(
        id: u64,
        kind: JobKind,
        state: JobState,
        created_ns: u64,
        bytes_total: u64,
        moves: Vec<MoveRecord>,
    ) -> JobRecord {
        JobRecord {
            id,
            kind,
            state,
            reason: String::new(),
            created_ns,
            finished_ns: 0,
            bytes_total,
            bytes_done: 0,
            moves,
            folded_moves: 0,
            folded_moves_done: 0,
            cursor: 0,
            repaired: 0,
            unrepaired: 0,
        }
    }

    pub fn is_active(&self) -> bool {
        matches!(self.state, JobState::Running | JobState::Paused)
    }

    pub fn moves_total(&self) -> usize {
        self.moves.len() + self.folded_moves as usize
    }

    pub fn moves_done(&self) -> usize {
        self.moves.iter().filter(|step| step.done).count() + self.folded_moves_done as usize
    }

    /// A finished job's moves become counts (see [`JobRecord::moves`]).
    pub fn fold_moves(&mut self) {
        if self.is_active() || self.moves.is_empty() {
            return;
        }
        let done = self.moves.iter().filter(|step| step.done).count();
        self.folded_moves = self.folded_moves.saturating_add(self.moves.len() as u32);
        self.folded_moves_done = self.folded_moves_done.saturating_add(done as u32);
        self.moves.clear();
    }
}

/// Extents written while a disk was away: what it must catch up on if it
/// returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyRecord {
    pub disk: DiskIndex,
    pub extents: Vec<(SpaceId, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolMetadata {
    pub pool_id: PoolId,
    pub name: String,
    /// Incremented by every commit; the newest complete one wins at import.
    pub generation: u64,
    pub created_ns: u64,
    pub committed_ns: u64,
    pub slab_bytes: u64,
    /// False while the pool is open read-write: an import that finds it false
    /// knows the pool was not closed cleanly and resynchronises redundancy.
    pub clean: bool,
    pub next_space_id: u64,
    pub disks: Vec<DiskRecord>,
    pub spaces: Vec<SpaceRecord>,
    pub settings: PoolSettings,
    pub next_job_id: u64,
    /// Active jobs, and finished ones kept for `job list` (bounded).
    pub jobs: Vec<JobRecord>,
    pub dirty: Vec<DirtyRecord>,
    /// Write intent: extents of redundant spaces without a write-back log
    /// that may have had writes in flight since they were last flushed.
    /// Recorded before such a write is issued and cleared once the extent
    /// has been idle and flushed; after a crash, only these extents are
    /// resynchronised (a clean shutdown leaves the list empty).
    pub intent: Vec<(SpaceId, u32)>,
}

impl PoolMetadata {
    /// A pool without disks or spaces, before its first commit.
    pub fn new(pool_id: PoolId, name: String, slab_bytes: u64, created_ns: u64) -> PoolMetadata {
        PoolMetadata {
            pool_id,
            name,
            generation: 0,
            created_ns,
            committed_ns: created_ns,
            slab_bytes,
            clean: false,
            next_space_id: 1,
            disks: Vec::new(),
            spaces: Vec::new(),
            settings: PoolSettings::default(),
            next_job_id: 1,
            jobs: Vec::new(),
            dirty: Vec::new(),
            intent: Vec::new(),
        }
    }

    pub fn disk(&self, index: DiskIndex) -> Option<&DiskRecord> {
        self.disks.get(usize::from(index.0))
    }

    /// Disks that hold metadata: the member set a commit writes to and the
    /// import quorum counts.
    pub fn members(&self) -> impl Iterator<Item = (DiskIndex, &DiskRecord)> {
        self.disks
            .iter()
            .enumerate()
            .filter(|(_, disk)| disk.state == DiskState::Active)
            .map(|(index, disk)| (DiskIndex(index as u16), disk))
    }

    /// The extents of `space` its write intent names (with
    /// [`crate::format::INTENT_WHOLE_SPACE`] for all of them).
    pub fn intent_of(&self, space: SpaceId) -> Vec<u32> {
        self.intent
            .iter()
            .filter(|(id, _)| *id == space)
            .map(|&(_, extent)| extent)
            .collect()
    }

    /// The extents written while `disk` was missing.
    pub fn dirty_of(&self, disk: DiskIndex) -> impl Iterator<Item = (SpaceId, u32)> + '_ {
        self.dirty
            .iter()
            .filter(move |record| record.disk == disk)
            .flat_map(|record| record.extents.iter().copied())
    }

    /// Whether `extent` of `space` is recorded written while `disk` was
    /// missing.
    pub fn is_dirty(&self, disk: DiskIndex, space: SpaceId, extent: u32) -> bool {
        self.dirty_of(disk).any(|dirty| dirty == (space, extent))
    }

    pub fn space(&self, name: &str) -> Option<&SpaceRecord> {
        self.spaces.iter().find(|space| space.name == name)
    }

    /// Every slab referenced by any extent, or reserved as the target of an
    /// active job's move.
    pub fn used_slabs(&self) -> BTreeSet<SlabRef> {
        let in_extents =
            ExtentRecord::slabs_of(self.spaces.iter().flat_map(|space| space.extents.iter()));
        let reserved = self
            .jobs
            .iter()
            .filter(|job| job.is_active())
            .flat_map(|job| job.moves.iter())
            .filter(|m| !m.done)
            .map(|m| m.target);
        in_extents.chain(reserved).collect()
    }

    pub fn space_by_id(&self, id: SpaceId) -> Option<&SpaceRecord> {
        self.spaces.iter().find(|space| space.id == id)
    }

    /// Find the disk index of `id`.
    pub fn index_of(&self, id: DiskId) -> Option<DiskIndex> {
        self.disks
            .iter()
            .position(|disk| disk.id == id)
            .map(|index| DiskIndex(index as u16))
    }
}
