//! Pool metadata: the model, its on-disk format, crash-ordered commits,
//! the import quorum and slab placement.
//!
//! Everything here is pure except [`store`], which reads and writes labels
//! and metadata slots through the [`terrace_io::BlockDevice`] trait.

pub mod codec;
mod codec_state;
pub mod format;
pub mod fuzzing;
pub mod ids;
pub mod model;
pub mod placement;
pub mod quorum;
pub mod store;
pub mod sums;

pub use codec::DecodeError;
pub use codec_state::{DIRTY_EXTENT_BYTES, JOB_MIN_BYTES, MOVE_BYTES};
pub use format::{IntentError, IntentRecord, Label, LabelError, SlotError};
pub use ids::{DiskId, DiskIndex, PoolId, SlabIndex, SlabRef, SpaceId};
pub use model::{
    CacheRecord, DirtyRecord, DiskRecord, DiskState, ExtentRecord, FaultDomain, JobKind, JobRecord,
    JobState, Media, MoveRecord, PoolMetadata, PoolSettings, Provisioning, RepairPolicy,
    RetireMissing, SpaceRecord, SpaceRole, Usage, ALERT_PERCENTS_DEFAULT, ERROR_LIMIT_DEFAULT,
    ERROR_WINDOW_SECS_DEFAULT,
};
pub use placement::{Allocator, PlacementError};

#[cfg(test)]
mod tests;
