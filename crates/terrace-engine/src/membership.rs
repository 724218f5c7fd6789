//! Changing which disks a pool has and what it may use them for, and
//! destroying a pool.
//!
//! A disk joins like the disks of a new pool: checked blank and big enough
//! before anything is written, named in a metadata commit (written to it as
//! well), and labelled last.

use std::sync::Arc;

use futures::future::join_all;
use terrace_io::BlockDevice;
use terrace_meta::format::data_offset;
use terrace_meta::store;
use terrace_meta::{DiskIndex, DiskState, JobKind, JobRecord, PoolId, PoolSettings, Usage};

use crate::disk::{Condition, Disk};
use crate::error::EngineError;
use crate::jobs::{cancelled_by_return, repair_kept_for};
use crate::pool::{check_new_disks, write_labels, NewDisk, Pool, Shape};

impl Pool {
    /// Add disks to the pool; they take new slabs at once (usage permitting).
    pub async fn add_disks(&self, disks: Vec<NewDisk>) -> Result<Vec<DiskIndex>, EngineError> {
        Ok(self.join_disks(disks, None).await?.0)
    }

    /// Bring `disk` into the pool and start moving every slab of `old` onto
    /// it, in one metadata commit: if the replacement cannot start (a job
    /// holds `old`, the new disk is too small for its slabs), the new disk
    /// is not added either and nothing changes. Gives the new disk's index
    /// and the job's id.
    pub async fn replace_disk(
        &self,
        old: DiskIndex,
        disk: NewDisk,
    ) -> Result<(DiskIndex, u64), EngineError> {
        let (added, job) = self.join_disks(vec![disk], Some(old)).await?;
        let job = job.expect("a replacement records its job");
        Ok((added[0], self.launch_job(&job).await))
    }

    /// Add disks and, with `replace`, record the job that replaces that
    /// disk by the first of them, in the same commit.
    async fn join_disks(
        &self,
        disks: Vec<NewDisk>,
        replace: Option<DiskIndex>,
    ) -> Result<(Vec<DiskIndex>, Option<JobRecord>), EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        if disks.is_empty() {
            return Err(EngineError::NoDisks);
        }
        let mut control = self.shared.control.lock().await;
        let metadata = &control.metadata;
        for disk in &disks {
            let device = disk.device.name();
            let known = self
                .shared
                .disks()
                .iter()
                .any(|d| d.device_name().as_deref() == Some(device));
            if known {
                return Err(EngineError::AlreadyMember {
                    device: device.to_string(),
                    pool_name: metadata.name.clone(),
                });
            }
        }
        let slot_bytes = self.shared.metadata_slot_bytes;
        check_new_disks(
            &disks,
            data_offset(slot_bytes) + metadata.slab_bytes,
            Some(metadata),
        )
        .await?;
        let shape = Shape {
            pool_id: metadata.pool_id,
            pool_name: metadata.name.clone(),
            slab_bytes: metadata.slab_bytes,
            metadata_slot_bytes: slot_bytes,
            now: self.shared.env.wall_clock_ns(),
        };
        let mut next = metadata.clone();
        let mut labels = Vec::new();
        let mut added = Vec::new();
        let first = next.disks.len();
        if first + disks.len() > terrace_meta::codec::DISKS_MAX {
            return Err(EngineError::InvalidSetting {
                what: "disk count",
                value: (first + disks.len()) as u64,
                rule: "at most 65535 disks per pool",
            });
        }
        for (offset, disk) in disks.into_iter().enumerate() {
            let index = DiskIndex((first + offset) as u16);
            let member = shape.member(&self.shared.env, index, disk, &self.shared.disk_context);
            next.disks.push(member.record);
            labels.push(member.label);
            self.shared
                .disks
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .push(member.disk);
            added.push(index);
        }
        let job = match replace {
            Some(old) => self
                .record_job(&mut next, JobKind::Replace { old, new: added[0] })
                .map(Some),
            None => Ok(None),
        };
        // Labelled before the commit names them: a crash in between leaves
        // labels that no metadata knows (such a disk may be added again;
        // see `check_new_disks`), never metadata naming unlabelled disks,
        // which an import could not find.
        let committed = match job {
            Ok(job) => match write_labels(&labels).await {
                Ok(()) => self.shared.commit(&mut control, next).await.map(|()| job),
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        let job = match committed {
            Ok(job) => job,
            Err(error) => {
                // Nothing names the new disks: forget them again.
                self.shared
                    .disks
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .truncate(first);
                return Err(error);
            }
        };
        Ok((added, job))
    }

    /// The disk of this pool that `device` is, if its label says it is one
    /// the pool has as missing (see [`Pool::bring_back`]).
    pub async fn returning_disk(&self, device: &dyn BlockDevice) -> Option<DiskIndex> {
        let store::Probe::Member { label, .. } = store::probe(device).await else {
            return None;
        };
        let metadata = self.metadata().await;
        let position = metadata
            .disks
            .iter()
            .position(|disk| disk.id == label.disk_id)?;
        (label.pool_id == metadata.pool_id && metadata.disks[position].state == DiskState::Missing)
            .then_some(DiskIndex(position as u16))
    }

    /// Take a missing disk back into service while the pool runs (its
    /// device is found again: plugged back in, or left out of an import).
    /// It catches up on the extents written while it was away (a resync
    /// job, as at import), and a repair the policy started for it is
    /// cancelled unless the policy is `always`. Gives its index and the
    /// resync's job id.
    ///
    /// Every write that left the disk out while it was missing recorded its
    /// extent first, durably and under the control lock (a dirty record). That lock is held
    /// here from planning the resync until the disk is in service, so a
    /// write either recorded its extent before (the resync covers it) or
    /// finds the disk in service and writes to it.
    pub async fn bring_back(
        &self,
        device: Arc<dyn BlockDevice>,
    ) -> Result<(DiskIndex, u64), EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let refuse = |why: String| EngineError::NotReturning {
            device: device.name().to_string(),
            pool: self.shared.name.clone(),
            why,
        };
        let label = match store::probe(device.as_ref()).await {
            store::Probe::Member { label, .. } => label,
            _ => return Err(refuse("it carries no terrace label".into())),
        };
        let mut control = self.shared.control.lock().await;
        // The metadata the disk holds, read again under the control lock so
        // that it and the disk's record are of the same commit: read before,
        // a disk still in service then would look older than when it left.
        let newest = store::probe(device.as_ref())
            .await
            .generations()
            .first()
            .map_or(0, |m| m.generation);
        let metadata = &control.metadata;
        if label.pool_id != metadata.pool_id {
            return Err(refuse(format!("it belongs to pool {}", label.pool_name)));
        }
        let Some(position) = metadata.disks.iter().position(|d| d.id == label.disk_id) else {
            return Err(refuse("its label names no disk of this pool".into()));
        };
        let index = DiskIndex(position as u16);
        let disk = self.shared.disks()[position].clone();
        let record = &metadata.disks[position];
        if record.state != DiskState::Missing || disk.condition() != Condition::Missing {
            let why = match (record.state, disk.condition()) {
                (DiskState::Failed, _) | (_, Condition::Failed) => format!(
                    "disk {} failed ({}); a failed disk is not taken back (replace it)",
                    index.0,
                    disk.reason()
                ),
                (DiskState::Removed, _) => format!("disk {} was removed from the pool", index.0),
                (_, Condition::Online) => format!("disk {} is in service", index.0),
                _ => format!(
                    "disk {} is present but waits to be released ({})",
                    index.0,
                    disk.reason()
                ),
            };
            return Err(refuse(why));
        }
        if let Some(why) = crate::pool::older_copy(record, newest) {
            return Err(refuse(why));
        }
        if self
            .shared
            .disks()
            .iter()
            .any(|d| d.index != index && d.device_name().as_deref() == Some(device.name()))
        {
            return Err(EngineError::AlreadyMember {
                device: device.name().to_string(),
                pool_name: metadata.name.clone(),
            });
        }
        if let Some(repair) = repair_kept_for(metadata, index) {
            return Err(refuse(format!(
                "its repair (job {repair}) goes on under retire-missing always, and the disk is \
                 released when it ends"
            )));
        }
        let mut next = metadata.clone();
        let mut cancelled = Vec::new();
        for (position, because) in cancelled_by_return(&next, index) {
            let job = &mut next.jobs[position];
            // Reinstalled as it ran if the commit fails.
            self.save_watermarks(job);
            cancelled.push(job.clone());
            self.cancel_record(job, &because);
        }
        let job = self.record_job(&mut next, JobKind::Resync { disk: index })?;
        // The cancelled jobs' targets dropped first (their moves and the
        // resync's share their slots' watermarks), then the resync's slots
        // valid below their watermarks only, then the disk in service,
        // before the commit: it records the disk's state from its
        // condition, which must not say missing any more.
        for job in &cancelled {
            self.uninstall_job(&control, job);
        }
        disk.attach(device, label);
        self.install_job(&job);
        disk.set_condition(Condition::Online, "");
        if let Err(error) = self.shared.commit(&mut control, next).await {
            disk.set_condition(
                Condition::Missing,
                "taken back, but the pool's metadata could not record it",
            );
            self.uninstall_job(&control, &job);
            for job in &cancelled {
                self.install_job(job);
            }
            return Err(error);
        }
        if job.moves.is_empty() {
            // Nothing was written while it was away: in service as it is.
            self.launch_job(&job).await;
        }
        drop(control);
        Ok((index, job.id))
    }

    /// Change what the pool may use a disk for. A disk that holds slabs
    /// cannot become a hot spare or a journal (its data would have nowhere
    /// to go); `retired` keeps its data but gives it no new slabs.
    pub async fn set_disk_usage(&self, disk: DiskIndex, usage: Usage) -> Result<(), EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let Some(record) = next.disks.get(usize::from(disk.0)) else {
            return Err(EngineError::NoSuchDisk { disk: disk.0 });
        };
        if record.state == DiskState::Removed {
            return Err(EngineError::NoSuchDisk { disk: disk.0 });
        }
        let used = next
            .used_slabs()
            .iter()
            .filter(|slab| slab.disk == disk)
            .count();
        if used > 0 && matches!(usage, Usage::HotSpare | Usage::Journal) {
            return Err(EngineError::DiskInUse {
                disk: disk.0,
                slabs: used as u64,
            });
        }
        next.disks[usize::from(disk.0)].usage = usage;
        self.shared.commit(&mut control, next).await
    }

    /// A disk's file or device is gone (the daemon noticed): it is missing,
    /// recorded so before this returns, and repaired as the policy says.
    pub async fn disk_gone(&self, disk: DiskIndex, reason: &str) -> Result<(), EngineError> {
        let disks = self.shared.disks();
        let runtime = disks
            .get(usize::from(disk.0))
            .ok_or(EngineError::NoSuchDisk { disk: disk.0 })?;
        if runtime.is_online() {
            let mark = || {
                if runtime.is_online() {
                    runtime.set_condition(crate::disk::Condition::Missing, reason);
                }
            };
            self.shared.departures.take_out(disk, mark).await;
        }
        self.shared.persist_failures().await
    }

    /// Change the pool's repair settings.
    pub async fn set_settings(&self, settings: PoolSettings) -> Result<(), EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        next.settings = settings;
        self.shared.commit(&mut control, next).await?;
        self.shared
            .disk_context
            .errors
            .set(settings.error_limit, settings.error_window_secs);
        Ok(())
    }

    /// Bring the pool up to this version's format (`pool upgrade`): every
    /// space that keeps checksums but has none yet (a pool from before
    /// them, or one that had no room when the space was made) gets its
    /// sums volume where the pool has room, as an import does, and the
    /// metadata is written in the current slot format at once. A space
    /// that still has none says so in its status (`Checksums::NoRoom`).
    pub async fn upgrade(&self) -> Result<(), EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        self.add_missing_sums().await?;
        let mut control = self.shared.control.lock().await;
        let next = control.metadata.clone();
        self.shared.commit(&mut control, next).await
    }

    /// Destroy the pool: erase the label of each of its disks that can be
    /// written, so each reads as blank again, and close it. All data in
    /// the pool is gone. Refused, changing nothing, while the pool is
    /// closed or read-only; past that it completes whatever its disks do,
    /// and names the disks whose label it left (see [`LabelLeft`]).
    ///
    /// A failed disk is not written: its first error is final (a dead
    /// disk's write may hang, fail or be lost), and whether its label went
    /// could not be known. A missing disk is not here to write. Their
    /// labels still name the pool; the metadata beside them names member
    /// sets of which they are a minority, so an import of them alone
    /// offers the pool read-only at most, and a new pool refuses them as
    /// another pool's until they are wiped.
    pub async fn destroy(&self) -> Result<Vec<LabelLeft>, EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let metadata = {
            // Closed under the control lock, as by close: a commit under
            // way ends first, and none starts after to write to a disk
            // whose label is going.
            let control = self.shared.control.lock().await;
            self.shared
                .closed
                .store(true, std::sync::atomic::Ordering::Release);
            control.metadata.clone()
        };
        let disks = self.shared.disks();
        let ours = disks.iter().filter(|disk| {
            metadata
                .disk(disk.index)
                .is_some_and(|record| record.state != DiskState::Removed)
        });
        let pool_id = metadata.pool_id;
        let erasures = ours.map(|disk| async move {
            let result = erase_own_label(disk, pool_id).await;
            (disk, result)
        });
        let mut left = Vec::new();
        for (disk, result) in join_all(erasures).await {
            if let Err(reason) = result {
                let path_hint = metadata.disks[usize::from(disk.index.0)].path_hint.clone();
                left.push(LabelLeft {
                    disk: disk.index,
                    path: disk.device_name().unwrap_or(path_hint),
                    reason,
                });
            }
        }
        self.let_go();
        Ok(left)
    }
}

/// A disk of a destroyed pool whose label was left in place: it still
/// names the pool, and should be wiped before it is used again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelLeft {
    pub disk: DiskIndex,
    /// Its device, or where the pool last saw it.
    pub path: String,
    pub reason: String,
}

/// Erase `disk`'s label if it is this pool's (a disk let go of and since
/// given to another pool is not this pool's to erase); why not otherwise.
async fn erase_own_label(disk: &Disk, pool: PoolId) -> Result<(), String> {
    let device = match (disk.condition(), disk.device()) {
        (Condition::Online | Condition::Standby, Some(device)) => device,
        (Condition::Failed, _) => return Err(format!("failed, not written: {}", disk.reason())),
        _ => return Err(format!("not present: {}", disk.reason())),
    };
    let found = store::read_label(device.as_ref())
        .await
        .map_err(|error| format!("erasing it failed: {error}"))?;
    let own = found.is_ok_and(|label| {
        label.pool_id == pool && disk.label().is_some_and(|own| own.disk_id == label.disk_id)
    });
    if own {
        store::erase_label(device.as_ref())
            .await
            .map_err(|error| format!("erasing it failed: {error}"))?;
    }
    Ok(())
}
