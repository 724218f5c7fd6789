//! The pool's control state and its metadata commits.
//!
//! One owner: every change of pool metadata happens under the control lock,
//! one at a time, and goes through [`PoolShared::commit`]. The data path
//! never takes this lock except to wait for a failure to be recorded.
//!
//! # Commit
//!
//! A commit writes the next generation to slot `generation mod 2` of every
//! member disk and flushes it (see `terrace_meta::store`). Disks whose write
//! fails are marked failed, dropped from the member set, and the commit is
//! repeated with a new generation on the survivors, so disk failures never
//! cost the pool its metadata. The commit fails only when no disk at all
//! takes it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use futures::future::join_all;
use terrace_io::Env;
use terrace_meta::store::{encode_slot, write_slot};
use terrace_meta::{DirtyRecord, DiskIndex, DiskState, PoolMetadata, SpaceId};

use crate::disk::{Condition, Disk};
use crate::error::EngineError;

pub(crate) struct Control {
    pub metadata: PoolMetadata,
}

pub struct PoolShared {
    pub(crate) env: Arc<dyn Env>,
    pub(crate) name: String,
    /// Why the pool refuses writes, if it does.
    pub(crate) read_only: Option<String>,
    /// Size of each metadata slot (the same on every disk of the pool).
    pub(crate) metadata_slot_bytes: u64,
    pub(crate) control: futures::lock::Mutex<Control>,
    pub(crate) disks: RwLock<Vec<Arc<Disk>>>,
    pub(crate) closed: AtomicBool,
    pub(crate) failures_observed: Arc<AtomicU64>,
    failures_persisted: AtomicU64,
    pub(crate) job_runtime: crate::jobs::JobRuntime,
    /// (disk, space, extent) already recorded dirty: the fast path of
    /// [`PoolShared::note_dirty`].
    dirty_known: std::sync::Mutex<std::collections::HashSet<(u16, u64, u32)>>,
}

impl PoolShared {
    pub(crate) fn new(
        env: Arc<dyn Env>,
        metadata: PoolMetadata,
        metadata_slot_bytes: u64,
        read_only: Option<String>,
        disks: Vec<Arc<Disk>>,
        failures_observed: Arc<AtomicU64>,
    ) -> PoolShared {
        PoolShared {
            env,
            name: metadata.name.clone(),
            read_only,
            metadata_slot_bytes,
            dirty_known: std::sync::Mutex::new(known_dirty(&metadata)),
            control: futures::lock::Mutex::new(Control { metadata }),
            disks: RwLock::new(disks),
            closed: AtomicBool::new(false),
            failures_persisted: AtomicU64::new(failures_observed.load(Ordering::Acquire)),
            job_runtime: crate::jobs::JobRuntime::default(),
            failures_observed,
        }
    }

    /// Record, durably, that `extent` of `space` was written while `disks`
    /// were missing: if they come back, only such extents are resynced. The
    /// record is committed before the write is issued, so a crash cannot
    /// leave a write the returning disk missed unrecorded.
    pub(crate) async fn note_dirty(
        &self,
        space: SpaceId,
        extent: u32,
        disks: &[DiskIndex],
    ) -> Result<(), EngineError> {
        let unknown: Vec<DiskIndex> = {
            let known = self.dirty_known.lock().unwrap_or_else(|e| e.into_inner());
            disks
                .iter()
                .copied()
                .filter(|disk| !known.contains(&(disk.0, space.0, extent)))
                .collect()
        };
        if unknown.is_empty() || self.read_only.is_some() {
            return Ok(());
        }
        let mut control = self.control.lock().await;
        let mut next = control.metadata.clone();
        for disk in &unknown {
            let position = match next.dirty.iter().position(|record| record.disk == *disk) {
                Some(position) => position,
                None => {
                    next.dirty.push(DirtyRecord {
                        disk: *disk,
                        extents: Vec::new(),
                    });
                    next.dirty.len() - 1
                }
            };
            let extents = &mut next.dirty[position].extents;
            if !extents.contains(&(space, extent)) {
                extents.push((space, extent));
            }
        }
        self.commit(&mut control, next).await?;
        let mut known = self.dirty_known.lock().unwrap_or_else(|e| e.into_inner());
        known.extend(unknown.iter().map(|disk| (disk.0, space.0, extent)));
        Ok(())
    }

    /// Forget the dirty records of a disk that caught up.
    pub(crate) fn forget_dirty(&self, disk: DiskIndex) {
        self.dirty_known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(known, _, _)| *known != disk.0);
    }

    pub(crate) fn disks(&self) -> Vec<Arc<Disk>> {
        self.disks.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn check_open(&self) -> Result<(), EngineError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(EngineError::Closed {
                pool: self.name.clone(),
            });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), EngineError> {
        match &self.read_only {
            Some(reason) => Err(EngineError::ReadOnly {
                pool: self.name.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Copy run-time disk conditions (failed, missing) into the metadata.
    fn absorb_conditions(&self, metadata: &mut PoolMetadata) {
        for disk in self.disks() {
            let record = &mut metadata.disks[usize::from(disk.index.0)];
            if record.state != DiskState::Active {
                continue;
            }
            let state = match disk.condition() {
                Condition::Failed => DiskState::Failed,
                Condition::Missing => DiskState::Missing,
                Condition::Online | Condition::Standby => continue,
            };
            record.state = state;
            record.state_reason = disk.reason();
        }
    }

    /// Make `next` the pool's metadata, durably. On error nothing changes
    /// in memory except disks found failed on the way.
    pub(crate) async fn commit(
        &self,
        control: &mut Control,
        mut next: PoolMetadata,
    ) -> Result<(), EngineError> {
        self.check_writable()?;
        loop {
            self.absorb_conditions(&mut next);
            next.generation = control.metadata.generation.max(next.generation) + 1;
            next.committed_ns = self.env.wall_clock_ns();
            let encoded = encode_slot(&next, self.metadata_slot_bytes)
                .map_err(|source| EngineError::MetadataFull { source })?;
            let disks = self.disks();
            let members: Vec<&Arc<Disk>> = next
                .members()
                .map(|(index, _)| &disks[usize::from(index.0)])
                .collect();
            let writes = members.iter().map(|disk| {
                let encoded = encoded.clone();
                async move {
                    let (Some(device), Some(label)) = (disk.device(), disk.label()) else {
                        return Err(String::from("no device"));
                    };
                    write_slot(device.as_ref(), label, next.generation, encoded)
                        .await
                        .map_err(|error| error.to_string())
                }
            });
            let results = join_all(writes).await;
            let mut written = 0;
            for (disk, result) in members.iter().zip(&results) {
                match result {
                    Ok(()) => written += 1,
                    Err(error) => disk.set_condition(
                        Condition::Failed,
                        format!("metadata write failed: {error}"),
                    ),
                }
            }
            if written == 0 {
                control.metadata.generation = next.generation;
                return Err(EngineError::CommitFailed {
                    pool: self.name.clone(),
                    detail: results
                        .into_iter()
                        .filter_map(Result::err)
                        .next()
                        .unwrap_or_else(|| "no member disks".into()),
                });
            }
            if written == members.len() {
                control.metadata = next;
                return Ok(());
            }
            // Some members failed: record that on the survivors.
            control.metadata.generation = next.generation;
        }
    }

    /// Wait until every disk failure seen so far is recorded in a commit.
    /// Requests call this before completing, so a write that saw a disk
    /// fail is acknowledged only once the pool will never trust that disk's
    /// stale copy again.
    pub(crate) async fn persist_failures(&self) -> Result<(), EngineError> {
        let observed = self.failures_observed.load(Ordering::Acquire);
        if observed <= self.failures_persisted.load(Ordering::Acquire) {
            return Ok(());
        }
        // Boxed: every request's future embeds this one, and a commit's
        // state is large; only requests that saw a failure pay for it.
        Box::pin(self.persist_observed(observed)).await
    }

    async fn persist_observed(&self, observed: u64) -> Result<(), EngineError> {
        let mut control = self.control.lock().await;
        if self.read_only.is_none() {
            let mut next = control.metadata.clone();
            self.absorb_conditions(&mut next);
            if next != control.metadata {
                self.commit(&mut control, next).await?;
            }
        }
        self.failures_persisted
            .fetch_max(observed, Ordering::AcqRel);
        Ok(())
    }

    /// Flush every online disk. Failures mark disks failed and are recorded.
    pub(crate) async fn flush_disks(&self) -> Result<(), EngineError> {
        let disks = self.disks();
        let flushes = disks
            .iter()
            .filter(|disk| disk.is_online())
            .map(|disk| disk.flush());
        join_all(flushes).await;
        self.persist_failures().await
    }
}

fn known_dirty(metadata: &PoolMetadata) -> std::collections::HashSet<(u16, u64, u32)> {
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
