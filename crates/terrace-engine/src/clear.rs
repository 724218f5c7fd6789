//! Taking back disks whose failure has passed, and setting disks' error
//! counters back to zero (`pool clear`).
//!
//! A disk fails at its first I/O error and is never trusted blindly again;
//! but a failure may be passing (a cable, an enclosure, a controller
//! reset), and two passing failures in a single-parity extent would lose
//! data the disks still hold whole. What a failed disk missed is known
//! exactly, as for a missing disk:
//!
//! ```text
//!   disk fails ──► every write that leaves it out records its extents
//!        │         missed for it first (Volume::track_missing), and a
//!        │         write that failed on it, or looked at it in service
//!        │         and then left it out, records them with the failure,
//!        │         before it completes (Volume::note_failed_during)
//!        ▼
//!   pool clear ──► the disk's label read again (same pool, same disk, not
//!                  an older copy) and written back (it takes writes); it
//!                  is in service again, catching up on the extents
//!                  recorded missed (a resync job), current everywhere else
//! ```
//!
//! A write beyond what an extent's layout tolerates is refused before it is
//! recorded, so an extent is recorded missed by more disks than it
//! tolerates only through writes in flight when the last of them failed,
//! none of which completed. For such an extent the disks that failed last
//! are taken as current (as `mdadm --assemble --force` takes the freshest
//! members): what those unfinished writes left there is uncertain (old data
//! or new; on parity, the rest of their rows too), and said so, while the
//! disks that failed first catch up from them.
//!
//! A space whose write-back log could not go home at import (its disks
//! were out) is held there, serving no client; clearing its disks replays
//! the log as the import would have, and it serves again.

use std::sync::Arc;

use terrace_io::BlockDevice;
use terrace_meta::{store, DiskIndex, DiskState, JobKind, PoolMetadata, SpaceId};

use crate::disk::Condition;
use crate::error::{ClearRefusal, EngineError};
use crate::jobs::{cancelled_by_return, repair_kept_for};
use crate::pool::Pool;

/// What `pool clear` did with one disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCleared {
    pub disk: DiskIndex,
    /// Its device, or where the pool last saw it.
    pub path: String,
    /// What the pool's records said of it before: failed, or missing
    /// (present but stale).
    pub was: DiskState,
    /// Why it stays out of service, if it does (it still fails, it is
    /// not the disk the pool knows...).
    pub refused: Option<String>,
    /// The job that catches it up (done at once when it missed nothing).
    pub job: Option<u64>,
    /// For each space with slots on it: what it missed.
    pub spaces: Vec<SpaceCatchUp>,
}

/// What a disk taken back missed of one space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceCatchUp {
    pub space: String,
    /// Extents written since it failed (or whose write failed on it):
    /// resynchronised from the space's other disks.
    pub missed_extents: u64,
    /// Extents taken as current on it although a write in flight when it
    /// failed did not complete there: what that write left is uncertain.
    pub uncertain_extents: Vec<u32>,
}

/// A disk that `pool clear` may take back: failed, or left out stale,
/// with its device present.
fn clearable(record_state: DiskState, condition: Condition, present: bool) -> bool {
    present
        && matches!(record_state, DiskState::Failed | DiskState::Missing)
        && condition != Condition::Online
}

impl Pool {
    /// Take back the failed or stale disks that are present (`only`: just
    /// that one), each that works again and is the disk the pool knows: it
    /// catches up on the extents written since it left, in a resync job,
    /// and everything else it holds is current (see the module's notes).
    /// A disk that still fails a read and a write of its label stays out,
    /// and its entry says why.
    ///
    /// The read, write and checksum error counters of the disks looked at
    /// (every disk, or `only`) start again from zero.
    pub async fn clear(&self, only: Option<DiskIndex>) -> Result<Vec<DiskCleared>, EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        if let Some(index) = only {
            if usize::from(index.0) >= self.shared.disks().len() {
                return Err(EngineError::NoSuchDisk { disk: index.0 });
            }
        }
        for disk in self.shared.disks().iter() {
            if only.is_none_or(|index| index == disk.index) {
                disk.clear_errors();
            }
        }
        let chosen = self.clear_candidates(only).await?;
        if chosen.is_empty() {
            return Ok(Vec::new());
        }
        // Writes that looked at the disks before now have noted what a
        // disk failing under them missed; recorded before planning.
        self.shared.departures.settle().await;
        self.shared.persist_failures().await?;
        let mut probed: Vec<(DiskIndex, Arc<dyn BlockDevice>, _)> = Vec::new();
        for index in chosen {
            let disk = self.shared.disks()[usize::from(index.0)].clone();
            let Some(device) = disk.device() else {
                continue;
            };
            let device = device.inner().clone();
            let probe = probe_disk(device.as_ref()).await;
            probed.push((index, device, probe));
        }
        let mut control = self.shared.control.lock().await;
        let metadata = control.metadata.clone();
        let mut next = metadata.clone();
        let mut report = Vec::new();
        let mut taken = Vec::new();
        for (index, device, probe) in probed {
            let path = device.name().to_string();
            let refused = match probe {
                Err(why) => Some(why),
                Ok((label, newest)) => refuse_clear(&metadata, index, &label, newest).err(),
            };
            report.push(DiskCleared {
                disk: index,
                path,
                was: metadata.disks[usize::from(index.0)].state,
                refused: refused.clone(),
                job: None,
                spaces: Vec::new(),
            });
            if refused.is_none() {
                taken.push((index, device));
            }
        }
        let indices: Vec<DiskIndex> = taken.iter().map(|(index, _)| *index).collect();
        let uncertain = take_last_failed_as_current(&mut next, &indices);
        for &index in &indices {
            // Recorded as a returning disk is while it catches up: present,
            // in service through its resync (an import after a crash
            // meanwhile puts it back in service under the same resync),
            // and active once the resync ends.
            let record = &mut next.disks[usize::from(index.0)];
            record.state = DiskState::Missing;
            record.state_reason = "taken back by pool clear; catching up".into();
        }
        for entry in report.iter_mut().filter(|entry| entry.refused.is_none()) {
            entry.spaces = catch_up_of(&next, entry.disk, &uncertain);
        }
        let mut cancelled = Vec::new();
        let mut jobs = Vec::new();
        for &index in &indices {
            for (position, because) in cancelled_by_return(&next, index) {
                let job = &mut next.jobs[position];
                self.save_watermarks(job);
                cancelled.push(job.clone());
                self.cancel_record(job, &because);
            }
            jobs.push(self.record_job(&mut next, JobKind::Resync { disk: index })?);
        }
        for job in &cancelled {
            self.uninstall_job(&control, job);
        }
        let disks = self.shared.disks();
        let mut before = Vec::new();
        for ((index, device), job) in taken.iter().zip(&jobs) {
            let disk = &disks[usize::from(index.0)];
            before.push((disk.condition(), disk.reason()));
            let label = disk.label();
            if let Some(label) = label {
                // A fresh latch: the first error of its past is forgotten.
                disk.attach(device.clone(), label);
            }
            self.install_job(job);
            disk.set_condition(Condition::Online, "");
        }
        if let Err(error) = self.shared.commit(&mut control, next).await {
            for (((index, _), job), (condition, reason)) in taken.iter().zip(&jobs).zip(before) {
                self.uninstall_job(&control, job);
                disks[usize::from(index.0)].set_condition(condition, reason);
            }
            for job in &cancelled {
                self.install_job(job);
            }
            return Err(error);
        }
        self.shared.known_dirty_as_in(&control.metadata);
        for (entry, job) in report
            .iter_mut()
            .filter(|entry| entry.refused.is_none())
            .zip(&jobs)
        {
            entry.job = Some(job.id);
        }
        for job in jobs.iter().filter(|job| job.moves.is_empty()) {
            self.launch_job(job).await;
        }
        drop(control);
        self.recover_held().await?;
        Ok(report)
    }

    /// Replay the logs of spaces held at import (their disks were out):
    /// with the disks back, what the logs hold goes home and the spaces
    /// serve again. A space whose disks are still out stays held.
    async fn recover_held(&self) -> Result<(), EngineError> {
        let metadata = self.metadata().await;
        for space in self
            .spaces()
            .into_iter()
            .filter(|space| space.held().is_some())
        {
            let Some(record) = metadata
                .spaces
                .iter()
                .find(|record| record.id == space.id())
            else {
                continue;
            };
            // Nothing serves it meanwhile: recovery writes home under the
            // hold, attaches a fresh log, then lifts the hold. Whether the
            // pool's last close was clean is not kept: its sums are
            // learned again as after a crash.
            self.recover_cache(record, true).await?;
        }
        Ok(())
    }

    /// The disks `clear` looks at: `only`, which must be one it may take
    /// back, or every such disk.
    async fn clear_candidates(
        &self,
        only: Option<DiskIndex>,
    ) -> Result<Vec<DiskIndex>, EngineError> {
        let metadata = self.metadata().await;
        let disks = self.shared.disks();
        let candidate = |index: DiskIndex| {
            let record = metadata.disk(index)?;
            let disk = disks.get(usize::from(index.0))?;
            clearable(record.state, disk.condition(), disk.device().is_some()).then_some(index)
        };
        match only {
            None => Ok((0..metadata.disks.len() as u16)
                .filter_map(|index| candidate(DiskIndex(index)))
                .collect()),
            Some(index) => {
                let record = metadata
                    .disk(index)
                    .filter(|record| record.state != DiskState::Removed)
                    .ok_or(EngineError::NoSuchDisk { disk: index.0 })?;
                let disk = &disks[usize::from(index.0)];
                if candidate(index).is_some() {
                    return Ok(vec![index]);
                }
                if disk.condition() == Condition::Online {
                    // In service: nothing to take back; its counters are
                    // all a clear changes.
                    return Ok(Vec::new());
                }
                let why = if disk.device().is_none() {
                    ClearRefusal::NotPresent {
                        reason: disk.reason(),
                    }
                } else {
                    ClearRefusal::State {
                        state: record.state,
                    }
                };
                Err(EngineError::NotCleared {
                    disk: index.0,
                    pool: self.shared.name.clone(),
                    why,
                })
            }
        }
    }
}

/// Read `device`'s label and newest metadata generation, and write the
/// label back: a disk that fails either is still failing.
async fn probe_disk(device: &dyn BlockDevice) -> Result<(terrace_meta::Label, u64), String> {
    let still = |what: &str, error: &dyn std::fmt::Display| {
        format!("it still fails: {what} of its label: {error}")
    };
    let label = match store::read_label(device).await {
        Err(error) => return Err(still("a read", &error)),
        Ok(Err(error)) => return Err(format!("its label cannot be read: {error}")),
        Ok(Ok(label)) => label,
    };
    let newest = store::probe(device)
        .await
        .generations()
        .first()
        .map_or(0, |metadata| metadata.generation);
    store::write_label(device, &label)
        .await
        .map_err(|error| still("a write", &error))?;
    device
        .flush()
        .await
        .map_err(|error| still("a flush after a write", &error))?;
    Ok((label, newest))
}

/// Why disk `index`, whose device carries `label` and metadata up to
/// generation `newest`, is not taken back, if it is not.
fn refuse_clear(
    metadata: &PoolMetadata,
    index: DiskIndex,
    label: &terrace_meta::Label,
    newest: u64,
) -> Result<(), String> {
    let record = &metadata.disks[usize::from(index.0)];
    if label.pool_id != metadata.pool_id || label.disk_id != record.id {
        return Err(format!(
            "its device now carries another disk's label (pool {}): not the disk this pool knows",
            label.pool_name
        ));
    }
    if record.state == DiskState::Failed && record.missing_since == 0 {
        return Err(
            "its failure was recorded without its generation, so what it missed is not known: \
             replace it"
                .into(),
        );
    }
    if let Some(why) = crate::pool::older_copy(record, newest) {
        return Err(why);
    }
    if let Some(repair) = repair_kept_for(metadata, index) {
        return Err(format!(
            "its repair (job {repair}) goes on under retire-missing always, and the disk is \
             released when it ends"
        ));
    }
    let busy = metadata.jobs.iter().find(|job| {
        job.is_active()
            && matches!(job.kind,
                JobKind::Evacuate { disk } | JobKind::Resync { disk } if disk == index)
            || matches!(job.kind, JobKind::Replace { old, .. } if old == index && job.is_active())
    });
    if let Some(job) = busy {
        return Err(format!("job {} works on it", job.id));
    }
    Ok(())
}

/// Extents that the disks being taken back (`taking`) are recorded to have
/// missed more of than their layout tolerates: the disks that failed last
/// (latest `missing_since`) are taken as current there, their records of
/// the extent dropped from `next`, until the others can catch up from
/// them. Gives the (disk, space, extent) so taken as current.
fn take_last_failed_as_current(
    next: &mut PoolMetadata,
    taking: &[DiskIndex],
) -> Vec<(DiskIndex, SpaceId, u32)> {
    let mut uncertain = Vec::new();
    let spaces = next.spaces.clone();
    for space in &spaces {
        let Ok(geometry) = space.geometry(next.slab_bytes) else {
            continue;
        };
        for (extent, record) in space.extents.iter().enumerate() {
            let Some(slabs) = &record.slabs else {
                continue;
            };
            let extent = extent as u32;
            let stale = |next: &PoolMetadata, slot: u32| {
                let disk = slabs[slot as usize].disk;
                let away = next
                    .disk(disk)
                    .is_none_or(|record| record.state != DiskState::Active)
                    && !taking.contains(&disk);
                away || next.is_dirty(disk, space.id, extent)
            };
            if geometry
                .remaining_tolerance(|slot| stale(next, slot))
                .is_some()
            {
                continue;
            }
            let mut latest_first: Vec<DiskIndex> = slabs
                .iter()
                .map(|slab| slab.disk)
                .filter(|disk| taking.contains(disk) && next.is_dirty(*disk, space.id, extent))
                .collect();
            latest_first.sort_by_key(|disk| {
                std::cmp::Reverse(next.disks[usize::from(disk.0)].missing_since)
            });
            let mut trial = next.clone();
            let mut dropped = Vec::new();
            for disk in latest_first {
                forget_missed(&mut trial, disk, space.id, extent);
                dropped.push((disk, space.id, extent));
                if geometry
                    .remaining_tolerance(|slot| stale(&trial, slot))
                    .is_some()
                {
                    // Only where that makes the extent whole again: an
                    // extent with disks still out beyond its tolerance
                    // stays as recorded.
                    for &(disk, space, extent) in &dropped {
                        forget_missed(next, disk, space, extent);
                    }
                    uncertain.extend(dropped);
                    break;
                }
            }
        }
    }
    uncertain
}

fn forget_missed(metadata: &mut PoolMetadata, disk: DiskIndex, space: SpaceId, extent: u32) {
    for record in metadata
        .dirty
        .iter_mut()
        .filter(|record| record.disk == disk)
    {
        record.extents.retain(|&missed| missed != (space, extent));
    }
    metadata.dirty.retain(|record| !record.extents.is_empty());
}

/// Per space with slots on `disk`: the extents it catches up on, and those
/// taken as current although uncertain.
fn catch_up_of(
    metadata: &PoolMetadata,
    disk: DiskIndex,
    uncertain: &[(DiskIndex, SpaceId, u32)],
) -> Vec<SpaceCatchUp> {
    metadata
        .spaces
        .iter()
        .filter(|space| space.role == terrace_meta::SpaceRole::Data)
        .filter(|space| {
            terrace_meta::ExtentRecord::slabs_of(&space.extents).any(|slab| slab.disk == disk)
        })
        .map(|space| SpaceCatchUp {
            space: space.name.clone(),
            missed_extents: metadata
                .dirty_of(disk)
                .filter(|(id, _)| *id == space.id)
                .count() as u64,
            uncertain_extents: uncertain
                .iter()
                .filter(|(d, id, _)| *d == disk && *id == space.id)
                .map(|(_, _, extent)| *extent)
                .collect(),
        })
        .collect()
}
