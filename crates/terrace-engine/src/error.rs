//! Errors of the engine, by cause. Every variant carries what a user needs
//! to act: which disk, which space, which range, and the underlying source.

use crate::units::format_size;
use terrace_io::IoError;
use terrace_layout::LayoutError;
use terrace_meta::{DecodeError, DiskState, LabelError, PlacementError, SlotError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Layout(#[from] LayoutError),
    #[error("{0}")]
    Placement(#[from] PlacementError),
    #[error("invalid {what}: {value:?} ({rule})")]
    InvalidName {
        what: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("invalid {what}: {value} ({rule})")]
    InvalidSetting {
        what: &'static str,
        value: u64,
        rule: &'static str,
    },
    #[error("no disks given")]
    NoDisks,
    #[error(
        "none of the disks given holds capacity: every one has usage {usages}; a pool needs \
         at least one disk of usage auto (the default) or manual"
    )]
    NoCapacityDisks { usages: String },
    #[error("{device} is given twice")]
    DuplicateDisk { device: String },
    #[error("{device} is already a disk of pool {pool_name}; nothing was changed")]
    AlreadyMember { device: String, pool_name: String },
    #[error("{device} already belongs to pool {pool_name} ({pool_id}); import that pool or destroy it first")]
    DiskInOtherPool {
        device: String,
        pool_name: String,
        pool_id: String,
    },
    #[error("{device} carries a damaged terrace label ({source}); it was left untouched")]
    DamagedLabel {
        device: String,
        #[source]
        source: LabelError,
    },
    #[error("{device} cannot be read: {source}")]
    Unreadable {
        device: String,
        #[source]
        source: IoError,
    },
    #[error("{device} is {}; a pool disk needs at least {} (metadata plus one slab)", format_size(*.size_bytes), format_size(*.minimum_bytes))]
    DiskTooSmall {
        device: String,
        size_bytes: u64,
        minimum_bytes: u64,
    },
    #[error("no terrace pool found on the given disks")]
    NoPoolFound,
    #[error("several pools found ({found}); name the one to import")]
    AmbiguousPool { found: String },
    #[error("pool {wanted} not found on the given disks (found: {found})")]
    PoolNotFound { wanted: String, found: String },
    #[error("pool {pool}: no disk holds readable metadata ({detail})")]
    NoMetadata { pool: String, detail: String },
    #[error(
        "metadata does not fit its slot: {source}; create the pool with a larger metadata slot"
    )]
    MetadataFull {
        #[source]
        source: SlotError,
    },
    #[error(
        "no room in the pool's metadata: it would take {metadata_bytes} bytes and \
         recording the repair of its fullest disk {reserve_bytes} more, beyond its metadata \
         slot of {slot_bytes}"
    )]
    MetadataRoom {
        metadata_bytes: u64,
        reserve_bytes: u64,
        slot_bytes: u64,
    },
    #[error("metadata is malformed: {source}")]
    Malformed {
        #[source]
        source: DecodeError,
    },
    #[error("pool {pool}: metadata could not be written to any disk ({detail})")]
    CommitFailed { pool: String, detail: String },
    #[error("pool {pool} is read-only: {reason}")]
    ReadOnly { pool: String, reason: String },
    #[error("pool {pool} is closed")]
    Closed { pool: String },
    #[error("no disk {disk} in this pool")]
    NoSuchDisk { disk: u16 },
    #[error("disk {disk} holds {slabs} slabs of data; move them off first")]
    DiskInUse { disk: u16, slabs: u64 },
    #[error("space {space} is {}; shrinking to {} would destroy the data at its end, which terrace does not do (create a smaller space and copy)", format_size(*.current), format_size(*.requested))]
    ShrinkRefused {
        space: String,
        current: u64,
        requested: u64,
    },
    #[error("no room to re-create extent {extent} of space {space}: no disk outside its other slabs and fault domains has a free slab; add a disk or a hot spare")]
    NoRoomToRepair { space: String, extent: u64 },
    #[error("no job {id}")]
    NoSuchJob { id: u64 },
    #[error("job {id} is {state}; only running or paused jobs can change")]
    JobNotActive { id: u64, state: String },
    #[error("job {id} already works on that disk; wait for it, or cancel it")]
    JobConflict { id: u64 },
    #[error("a scrub of this pool is already under way (job {id}); one runs at a time")]
    ScrubRunning { id: u64 },
    #[error(
        "job {id} is re-creating or catching up data; a scrub waits until it is done \
         (it would find the copies it is still writing)"
    )]
    ScrubDuringRepair { id: u64 },
    #[error("a space named {name} already exists")]
    SpaceExists { name: String },
    #[error("export name {export} is space {space}'s already")]
    ExportExists { export: String, space: String },
    #[error("no space named {name}")]
    NoSuchSpace { name: String },
    #[error(
        "space {space}: request of {length} bytes at {offset} is outside its {size_bytes} bytes"
    )]
    OutOfRange {
        space: String,
        offset: u64,
        length: u64,
        size_bytes: u64,
    },
    #[error(
        "space {space}: request of {length} bytes at {offset} is not aligned to {alignment} bytes"
    )]
    Misaligned {
        space: String,
        offset: u64,
        length: u64,
        alignment: u64,
    },
    #[error("space {space}: request of {length} bytes exceeds the limit of {limit}")]
    TooLarge {
        space: String,
        length: u64,
        limit: u64,
    },
    #[error("space {space}: data at {offset}+{length} is unavailable: {reason}")]
    Unavailable {
        space: String,
        offset: u64,
        length: u64,
        reason: String,
    },
    #[error("not enough free capacity for space {space}: {detail}")]
    NoCapacity { space: String, detail: String },
    /// A write to a thin space's unallocated extent found no room.
    #[error("pool is full: thin space {space} cannot allocate: {detail}")]
    PoolFull { space: String, detail: String },
    #[error("disk {disk} changed state while space {space} was prepared; nothing was created, create it again")]
    ChangedWhilePreparing { space: String, disk: u16 },
    #[error("{device} cannot rejoin pool {pool}: {why}")]
    NotReturning {
        device: String,
        pool: String,
        why: String,
    },
    #[error("disk {disk} of pool {pool} is not one to clear: {why}")]
    NotCleared {
        disk: u16,
        pool: String,
        why: ClearRefusal,
    },
    #[error("{0}")]
    Io(#[from] IoError),
}

/// Why a disk named to be cleared is not one to clear.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClearRefusal {
    /// Its device is absent; `reason`, why it left.
    #[error("it is not present ({reason}): plug it back in")]
    NotPresent { reason: String },
    /// Its record is in `state`, which clearing does not take back.
    #[error("it is {}", format!("{state:?}").to_lowercase())]
    State { state: DiskState },
}
