//! The terrace engine: pools of disks and the spaces carved from them.
//!
//! ```text
//! Space::read/write/flush/write_zeroes/trim      (space.rs: validation, the split into rows)
//!   └─ layouts/ (simple, mirror, parity)         (one row at a time; row locks)
//!        └─ terrace_ec                            (P/Q encode, update, rebuild)
//!        └─ row.rs → target.rs → disk.rs          (slot → disk offset; error latch)
//!             └─ terrace_io::BlockDevice          (files, block devices, memory, wrappers)
//! Pool::create/import/close, create_space         (pool.rs, admin.rs)
//!   └─ control.rs                                 (the one owner of metadata; commits)
//!        └─ terrace_meta                          (format, quorum, placement)
//! ```
//!
//! The engine is sans-IO: it reaches drives only through `BlockDevice`,
//! and time and randomness only through `Env`, and it spawns no tasks. The
//! same code runs on real disks, on memory disks and in the deterministic
//! simulator (`terrace-sim`), which drives its futures itself.

mod admin;
mod block_merge;
pub mod cache;
mod clear;
mod condition;
mod control;
mod crash_resync;
mod departures;
mod disk;
mod error;
mod events;
mod failures;
mod heal;
mod intent;
mod job_runtime;
mod jobs;
pub mod journal;
mod layouts;
mod log_memory;
mod membership;
mod open;
mod payload;
mod placement;
mod pool;
mod rebuild;
mod redundancy;
mod resync;
mod room;
mod row;
mod row_lock;
mod scan;
mod slab_holds;
mod space;
mod status;
mod sums;
mod target;
mod thin;
mod units;
mod verify;
mod volume;
mod zero;

pub use admin::{SpaceCreated, LARGEST_FIT};
pub use clear::{DiskCleared, SpaceCatchUp};
pub use crash_resync::ResyncProgress;
pub use disk::{Condition, DiskErrors};
pub use error::{ClearRefusal, EngineError};
pub use events::{PoolEvent, EVENTS_QUEUED_MAX};
pub use jobs::{JobAction, JobStatus, JOB_HISTORY_MAX};
pub use layouts::mirror::{
    stream_reach_bytes as mirror_stream_reach_bytes, READ_REGION_BYTES as MIRROR_READ_REGION_BYTES,
};
pub use layouts::reason::count;
pub use membership::LabelLeft;
pub use open::CLEARED_BACK;
pub use placement::{default_fault_domain, SpaceConfig, SpaceSize};
pub use pool::{
    validate_name, ImportOptions, NewDisk, Pool, PoolConfig, NAME_MAX_BYTES, SLAB_DEFAULT_BYTES,
    SLAB_MAX_BYTES, SLAB_MIN_BYTES,
};
pub use redundancy::{repair_space, resync_space, verify_space};
pub use resync::RedundancyReport;
pub use room::{metadata_slot_bytes_for, METADATA_SLOT_MAX_BYTES, SLOT_BYTES_PER_SLAB};
pub use scan::{scan, DeviceKind, DeviceReport};
pub use space::{Space, REQUEST_MAX_BYTES};
pub use status::{
    CacheInfo, Checksums, DiskStatus, FailureImpact, PoolHealth, PoolStatus, SpaceHealth,
    SpaceStatus, Unrepaired,
};
pub use units::format_size;
pub use verify::{Finding, Place, Problem, ProblemKind, Role, FINDINGS_MAX};
pub use volume::Volume;

pub use terrace_io as io;
pub use terrace_layout as layout;
pub use terrace_meta as meta;
