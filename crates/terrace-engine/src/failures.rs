//! What the pool knows of disk failures and of the extents disks missed,
//! beside what its metadata records.
//!
//! ```text
//!   disk latches failed ──► observed += 1          (shared with every Disk)
//!   write fails on disk ──► failed_writes += (disk, space, extent)
//!   request completes  ◄── commit records both     (persisted := observed)
//! ```
//!
//! A request that saw a disk fail completes only once a metadata commit
//! records the failure (and the extents the disk missed), so the pool never
//! trusts that disk's stale copy again; [`FailureRecords::unpersisted`] is
//! the one atomic load the data path pays when nothing failed.
//!
//! The extents already recorded missed (dirty) by some disk are kept here
//! too, so that a write need not take the control lock to learn that its
//! extent is recorded already.
//!
//! Depends on nothing of the engine, only on `terrace_meta`: the pool's
//! metadata commits, above it, record what it holds.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use terrace_meta::{DiskIndex, PoolMetadata, SpaceId};

/// An extent of a space that a disk missed (a write it did not take).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MissedExtent {
    pub disk: DiskIndex,
    pub space: SpaceId,
    pub extent: u32,
}

impl MissedExtent {
    pub(crate) fn new(disk: DiskIndex, space: SpaceId, extent: u32) -> MissedExtent {
        MissedExtent {
            disk,
            space,
            extent,
        }
    }

    /// As the metadata and the intent records carry it.
    pub(crate) fn as_tuple(self) -> (DiskIndex, SpaceId, u32) {
        (self.disk, self.space, self.extent)
    }

    fn key(self) -> (u16, u64, u32) {
        (self.disk.0, self.space.0, self.extent)
    }
}

pub(crate) struct FailureRecords {
    /// Disk failures observed, bumped by the disks themselves.
    observed: Arc<AtomicU64>,
    /// Failures observed up to this count are recorded in a commit.
    persisted: AtomicU64,
    /// Extents a write failed on, for the commit recording the failure.
    failed_writes: Mutex<Vec<MissedExtent>>,
    /// Extents recorded missed already (in the metadata or an intent
    /// record): the fast path of noting one.
    known_missed: Mutex<HashSet<(u16, u64, u32)>>,
}

impl FailureRecords {
    /// Records for a pool whose metadata is `metadata`, whose disks count
    /// their failures in `observed`.
    pub(crate) fn new(observed: Arc<AtomicU64>, metadata: &PoolMetadata) -> FailureRecords {
        FailureRecords {
            persisted: AtomicU64::new(observed.load(Ordering::Acquire)),
            observed,
            failed_writes: Mutex::new(Vec::new()),
            known_missed: Mutex::new(recorded_in(metadata)),
        }
    }

    /// Know only the missed extents `metadata` (just committed, under the
    /// control lock) records: one dropped without a catch-up (a disk taken
    /// as current by `pool clear`) must be recorded again should the disk
    /// miss that extent again.
    pub(crate) fn know_only(&self, metadata: &PoolMetadata) {
        *self.known() = recorded_in(metadata);
    }

    /// The count of failures observed, if some of them (or of the failed
    /// writes) are not recorded yet.
    pub(crate) fn unpersisted(&self) -> Option<u64> {
        let observed = self.observed.load(Ordering::Acquire);
        let behind = observed > self.persisted.load(Ordering::Acquire);
        (behind || !self.failed_writes().is_empty()).then_some(observed)
    }

    /// Failures up to `observed` are recorded.
    pub(crate) fn persisted_up_to(&self, observed: u64) {
        self.persisted.fetch_max(observed, Ordering::AcqRel);
    }

    fn failed_writes(&self) -> MutexGuard<'_, Vec<MissedExtent>> {
        self.failed_writes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known(&self) -> MutexGuard<'_, HashSet<(u16, u64, u32)>> {
        self.known_missed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write failed on `missed.disk`: note the extent for the commit
    /// recording the failure, unless it is recorded already.
    pub(crate) fn note_failed_write(&self, missed: MissedExtent) {
        if self.known().contains(&missed.key()) {
            return;
        }
        let mut pending = self.failed_writes();
        if !pending.contains(&missed) {
            pending.push(missed);
        }
    }

    /// The failed writes noted, for a commit to record; given back with
    /// [`FailureRecords::restore_failed_writes`] if it fails.
    pub(crate) fn take_failed_writes(&self) -> Vec<MissedExtent> {
        std::mem::take(&mut *self.failed_writes())
    }

    pub(crate) fn restore_failed_writes(&self, missed: Vec<MissedExtent>) {
        self.failed_writes().extend(missed);
    }

    /// Those of `notes` not known to be recorded.
    pub(crate) fn unknown(&self, notes: &[MissedExtent]) -> Vec<MissedExtent> {
        let known = self.known();
        notes
            .iter()
            .copied()
            .filter(|note| !known.contains(&note.key()))
            .collect()
    }

    /// `notes` are recorded.
    pub(crate) fn know(&self, notes: &[MissedExtent]) {
        self.known().extend(notes.iter().map(|note| note.key()));
    }

    /// Forget what `disk` missed (it caught up).
    pub(crate) fn forget_disk(&self, disk: DiskIndex) {
        self.known().retain(|(known, _, _)| *known != disk.0);
    }
}

/// The missed extents `metadata` records, as keys.
fn recorded_in(metadata: &PoolMetadata) -> HashSet<(u16, u64, u32)> {
    metadata
        .dirty
        .iter()
        .flat_map(|record| {
            record
                .extents
                .iter()
                .map(move |(space, extent)| (record.disk.0, space.0, *extent))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(observed: Arc<AtomicU64>) -> FailureRecords {
        let metadata = PoolMetadata::new(terrace_meta::PoolId([1; 16]), "p".into(), 1 << 16, 0);
        FailureRecords::new(observed, &metadata)
    }

    #[test]
    fn a_failure_is_unpersisted_until_recorded() {
        let observed = Arc::new(AtomicU64::new(0));
        let records = records(observed.clone());
        assert_eq!(records.unpersisted(), None);
        observed.fetch_add(1, Ordering::AcqRel);
        assert_eq!(records.unpersisted(), Some(1));
        records.persisted_up_to(1);
        assert_eq!(records.unpersisted(), None);
    }

    #[test]
    fn a_failed_write_is_pending_unless_known() {
        let records = records(Arc::new(AtomicU64::new(0)));
        let missed = MissedExtent::new(DiskIndex(1), SpaceId(2), 3);
        records.note_failed_write(missed);
        records.note_failed_write(missed);
        assert_eq!(records.unpersisted(), Some(0));
        assert_eq!(records.take_failed_writes(), vec![missed]);
        records.know(&[missed]);
        records.note_failed_write(missed);
        assert_eq!(records.unpersisted(), None, "recorded already");
        assert!(records.unknown(&[missed]).is_empty());
        records.forget_disk(DiskIndex(1));
        assert_eq!(records.unknown(&[missed]), vec![missed]);
    }
}
