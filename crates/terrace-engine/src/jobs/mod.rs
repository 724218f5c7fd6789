//! Jobs: repair, evacuation, replacement and resync, as one abstraction.
//!
//! A job is a list of moves — one slot of one extent filled onto a target
//! slab — each with a watermark of rows already valid there. The job record
//! (moves, targets, watermarks, state) lives in the pool metadata, so a job
//! survives restarts and crashes and resumes at its last persisted
//! watermark, never from the start. While a move runs, the target is an
//! extra location of the slot (`target.rs`): client writes below the
//! watermark reach it too, so it is never behind.
//!
//! ```text
//!  start: plan moves ─ commit (targets reserved) ─ install locations
//!  run:   per move: fill rows from the watermark (rate-limited) ─ commit
//!         the watermark about once a second ─ at the end commit the extent
//!         pointing at the target ─ drop the old location
//!  end:   repair: the failed disk holds nothing; evacuate/replace: the old
//!         disk is removed and its label erased; resync: the disk is active
//! ```
//!
//! The runner (`Pool::run_jobs`) is a plain future the daemon spawns; it
//! starts repairs by the pool's retire-missing policy, runs the moves of
//! running jobs (several at once under the parallel policy), and stops when
//! the pool closes.

mod crash_pass;
mod plan;
mod run;
mod scrub;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use terrace_meta::{
    DiskIndex, DiskState, JobKind, JobRecord, JobState, MoveRecord, PoolMetadata, SpaceId,
};

use crate::error::EngineError;
use crate::pool::Pool;
use crate::target::Location;

pub use run::JOB_HISTORY_MAX;

/// What a user can ask of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Pause,
    Resume,
    Cancel,
}

/// A job as `job list` shows it.
#[derive(Debug, Clone)]
pub struct JobStatus {
    pub id: u64,
    pub kind: JobKind,
    pub state: JobState,
    pub reason: String,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub moves_total: usize,
    pub moves_done: usize,
    /// Bytes per second since the job (re)started in this process.
    pub rate_bytes_per_second: u64,
    /// Seconds to completion at that rate, when it is known.
    pub eta_seconds: Option<u64>,
    /// A scrub's rows rewritten because their redundancy disagreed, and
    /// rows that still disagreed after (0 for other jobs).
    pub repaired: u64,
    pub unrepaired: u64,
}

/// Why a job of `kind` found nothing to move in `metadata`, for `job
/// list` (a job done at once is not a job that copied everything).
fn nothing_to_do(metadata: &PoolMetadata, kind: JobKind) -> String {
    let holds = |disk: DiskIndex| {
        metadata.spaces.iter().any(|space| {
            terrace_meta::ExtentRecord::slabs_of(&space.extents).any(|slab| slab.disk == disk)
        })
    };
    match kind {
        JobKind::Repair { disk } if holds(disk) => plan::nothing_recoverable(disk),
        JobKind::Repair { disk } => format!("nothing to repair: disk {} holds no data", disk.0),
        JobKind::Resync { disk } => format!(
            "nothing to catch up on: nothing was written while disk {} was out",
            disk.0
        ),
        JobKind::Evacuate { disk } | JobKind::Replace { old: disk, .. } => {
            format!("nothing to move: disk {} holds no data", disk.0)
        }
        JobKind::LogsToJournal => "nothing to move".into(),
        JobKind::Scrub => "nothing to scrub: the pool has no spaces".into(),
    }
}

/// The disks a job of `kind` is about, whatever its moves.
fn kind_disks(kind: JobKind) -> Vec<DiskIndex> {
    match kind {
        JobKind::Repair { disk } | JobKind::Evacuate { disk } | JobKind::Resync { disk } => {
            vec![disk]
        }
        JobKind::Replace { old, new } => vec![old, new],
        JobKind::LogsToJournal | JobKind::Scrub => Vec::new(),
    }
}

/// The disks an active job involves: those of its kind, and those its
/// moves still take slots off (a job moving logs names no disk of its
/// own, but a repair or evacuation of a disk it is moving a slot off
/// would move the same slot).
pub(crate) fn job_disks(metadata: &PoolMetadata, job: &JobRecord) -> BTreeSet<DiskIndex> {
    let mut disks: BTreeSet<DiskIndex> = kind_disks(job.kind).into_iter().collect();
    disks.extend(move_sources(metadata, job.moves.iter().filter(|m| !m.done)));
    disks
}

/// Slabs of spaces (and logs) on `disk`.
fn held_slabs(metadata: &PoolMetadata, disk: DiskIndex) -> u64 {
    metadata
        .spaces
        .iter()
        .flat_map(|space| space.extents.iter())
        .filter_map(|extent| extent.slabs.as_ref())
        .flatten()
        .filter(|slab| slab.disk == disk)
        .count() as u64
}

/// The disks that hold the slots `moves` fill elsewhere.
fn move_sources<'a>(
    metadata: &'a PoolMetadata,
    moves: impl Iterator<Item = &'a MoveRecord> + 'a,
) -> impl Iterator<Item = DiskIndex> + 'a {
    moves.filter_map(|step| {
        let space = metadata.space_by_id(step.space)?;
        let slabs = space.extents.get(step.extent as usize)?.slabs.as_ref()?;
        Some(slabs.get(usize::from(step.slot))?.disk)
    })
}

/// The slabs of a lost disk that a repair finds no room for, and what
/// would make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrepaired {
    /// The refusal of the repair (or of its first slot left out).
    pub reason: String,
    /// Slabs that find no room.
    pub slabs: u64,
    /// The smallest disk that, added, would take them all.
    pub disk_bytes: u64,
    /// Only slabs of write-back logs find no room (the spaces' data is
    /// repaired): a journal disk would take them too.
    pub logs_only: bool,
}

impl Pool {
    /// Re-create the slabs of a failed or missing disk elsewhere.
    pub async fn start_repair(&self, disk: DiskIndex) -> Result<u64, EngineError> {
        self.start_job(JobKind::Repair { disk }).await
    }

    /// Move every slab off a disk, then release it (`disk remove`).
    pub async fn start_evacuation(&self, disk: DiskIndex) -> Result<u64, EngineError> {
        self.start_job(JobKind::Evacuate { disk }).await
    }

    /// Plan, record and install a job. Fails, changing nothing, when a job
    /// already involves one of its disks or the moves cannot be placed.
    ///
    /// A repair of a lost disk comes before a log move taking a slot off
    /// it: the move is cancelled in the same commit (the repair re-creates
    /// that slot too, on a journal disk where one has room), and the job
    /// runner starts the log move again once no job runs. Its targets stay
    /// out of the repair's plan: writes of the log may still be reaching
    /// them (see [`crate::space::MapEpoch`]).
    pub async fn start_job(&self, kind: JobKind) -> Result<u64, EngineError> {
        if kind == JobKind::Scrub {
            return self.start_scrub(0).await;
        }
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let mut cancelled = Vec::new();
        if let JobKind::Repair { disk } = kind {
            let because = format!(
                "cancelled for the repair of disk {}; the log move starts again after it",
                disk.0
            );
            for position in log_moves_off_lost(&next, disk) {
                let job = &mut next.jobs[position];
                self.cancel_record(job, &because);
                cancelled.push(job.clone());
            }
        }
        let held = self.shared.reserve(cancelled.iter().flat_map(|job| {
            let pending = job.moves.iter().filter(|step| !step.done);
            pending.map(|step| step.target)
        }));
        let job = self.record_job(&mut next, kind)?;
        self.shared.commit(&mut control, next).await?;
        // Under the lock, as their targets are free once committed.
        for job in &cancelled {
            self.uninstall_job(&control, job);
        }
        drop(held);
        drop(control);
        Ok(self.launch_job(&job).await)
    }

    /// Plan a job on `next` and add its record there (already complete if
    /// it has nothing to move). Fails, leaving `next` as it was, when a job
    /// already involves one of its disks or the moves cannot be placed.
    pub(crate) fn record_job(
        &self,
        next: &mut PoolMetadata,
        kind: JobKind,
    ) -> Result<JobRecord, EngineError> {
        check_job_disks(next, kind)?;
        let moves = plan::plan(next, kind, &self.shared.reserved_slabs())?;
        if kind == JobKind::LogsToJournal {
            // Its disks are known only now, from its moves.
            let sources: BTreeSet<DiskIndex> = move_sources(next, moves.iter()).collect();
            let busy = next.jobs.iter().filter(|job| job.is_active()).find(|job| {
                job.kind == kind || job_disks(next, job).iter().any(|d| sources.contains(d))
            });
            if let Some(job) = busy {
                return Err(EngineError::JobConflict { id: job.id });
            }
        }
        let id = next.next_job_id;
        next.next_job_id += 1;
        let nothing_to_move = moves.is_empty();
        let job = JobRecord::new(
            id,
            kind,
            JobState::Running,
            self.shared.env.wall_clock_ns(),
            moves.len() as u64 * next.slab_bytes,
            moves,
        );
        next.jobs.push(job.clone());
        if nothing_to_move {
            let position = next.jobs.len() - 1;
            self.complete_job(next, position);
            next.jobs[position].reason = nothing_to_do(next, kind);
        }
        Ok(job)
    }

    /// Run a job recorded by [`Pool::record_job`] once its commit is done;
    /// gives its id.
    pub(crate) async fn launch_job(&self, job: &JobRecord) -> u64 {
        if job.moves.is_empty() {
            self.after_job(job.kind).await;
        } else {
            self.install_job(job);
        }
        job.id
    }

    /// Pause, resume or cancel a job.
    pub async fn job_action(&self, id: u64, action: JobAction) -> Result<(), EngineError> {
        self.change_job(id, action, "cancelled").await
    }

    /// [`Pool::job_action`], with the reason a cancelled job keeps.
    pub(crate) async fn change_job(
        &self,
        id: u64,
        action: JobAction,
        cancelled_because: &str,
    ) -> Result<(), EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let job = next
            .jobs
            .iter_mut()
            .find(|job| job.id == id)
            .ok_or(EngineError::NoSuchJob { id })?;
        let state = match (job.state, action) {
            (JobState::Running, JobAction::Pause) => JobState::Paused,
            (JobState::Paused, JobAction::Resume) => JobState::Running,
            (JobState::Running | JobState::Paused, JobAction::Cancel) => JobState::Cancelled,
            (state, _) => {
                return Err(EngineError::JobNotActive {
                    id,
                    state: format!("{state:?}"),
                })
            }
        };
        if state == JobState::Cancelled {
            self.cancel_record(job, cancelled_because);
        } else {
            job.state = state;
            if state == JobState::Paused {
                // A paused job resumes, after a restart too, where it stopped.
                self.save_watermarks(job);
            }
        }
        let cancelled = (state == JobState::Cancelled).then(|| job.clone());
        self.shared.commit(&mut control, next).await?;
        if let Some(job) = cancelled {
            // Under the lock, as its targets are free once committed.
            self.uninstall_job(&control, &job);
        }
        drop(control);
        if state == JobState::Running {
            let now = self.shared.env.now_ns();
            self.shared.job_runtime.resumed(id, now);
        }
        Ok(())
    }

    /// Every job the metadata remembers, with progress.
    pub async fn job_statuses(&self) -> Vec<JobStatus> {
        let metadata = self.metadata().await;
        let now = self.shared.env.now_ns();
        metadata
            .jobs
            .iter()
            .map(|job| {
                let bytes_done = self.live_bytes_done(&metadata, job);
                let running = job.state == JobState::Running;
                let rate = self.shared.job_runtime.rate(job.id, now, running);
                let left = job.bytes_total.saturating_sub(bytes_done);
                let scrubbed = self.scrubbed(job);
                JobStatus {
                    id: job.id,
                    kind: job.kind,
                    state: job.state,
                    reason: job.reason.clone(),
                    bytes_total: job.bytes_total,
                    bytes_done,
                    moves_total: job.moves_total(),
                    moves_done: job.moves_done(),
                    rate_bytes_per_second: rate,
                    eta_seconds: (running && rate > 0).then(|| left / rate),
                    repaired: scrubbed.repaired,
                    unrepaired: scrubbed.unrepaired,
                }
            })
            .collect()
    }

    /// Bytes done, counting rows filled since the last persisted progress.
    fn live_bytes_done(&self, metadata: &PoolMetadata, job: &JobRecord) -> u64 {
        if !job.is_active() {
            return job.bytes_done;
        }
        if job.kind == JobKind::Scrub {
            return self.scrubbed(job).bytes_done;
        }
        moves_bytes(metadata, job, |step| {
            self.shared
                .job_runtime
                .watermark(&(step.space, step.extent, step.slot))
                .unwrap_or(step.watermark_rows)
        })
    }

    /// Mark a job record cancelled with `reason`, its progress kept (what
    /// it moved stays moved); the caller commits it, then uninstalls it.
    pub(crate) fn cancel_record(&self, job: &mut JobRecord, reason: &str) {
        self.save_watermarks(job);
        job.state = JobState::Cancelled;
        job.reason = reason.into();
        job.finished_ns = self.shared.env.wall_clock_ns();
    }

    /// A scrub's progress: its record's, or the runner's where ahead.
    fn scrubbed(&self, job: &JobRecord) -> JobRecord {
        let mut job = job.clone();
        if job.kind != JobKind::Scrub || !job.is_active() {
            return job;
        }
        if let Some(mark) = self.shared.job_runtime.scrub(job.id) {
            job.cursor = job.cursor.max(mark.cursor);
            job.bytes_done = job.bytes_done.max(mark.bytes_done);
            job.repaired = job.repaired.max(mark.repaired);
            job.unrepaired = job.unrepaired.max(mark.unrepaired);
        }
        job
    }

    /// Copy the run-time watermarks (a scrub's cursor and counts) into a
    /// job record before it is committed.
    pub(crate) fn save_watermarks(&self, job: &mut JobRecord) {
        if job.kind == JobKind::Scrub {
            *job = self.scrubbed(job);
            return;
        }
        for step in job.moves.iter_mut().filter(|step| !step.done) {
            if let Some(rows) =
                self.shared
                    .job_runtime
                    .watermark(&(step.space, step.extent, step.slot))
            {
                step.watermark_rows = step.watermark_rows.max(rows);
            }
        }
    }

    /// Make the targets of a job's pending moves locations of their slots.
    pub(crate) fn install_job(&self, job: &JobRecord) {
        let disks = self.shared.disks();
        for step in job.moves.iter().filter(|step| !step.done) {
            let Some(space) = self.space_by_id(step.space) else {
                continue;
            };
            let key = (step.space, step.extent, step.slot);
            let mark = self.shared.job_runtime.mark(key, step.watermark_rows);
            let slab_bytes = space.geometry().slab_bytes();
            let location = Location {
                disk: disks[usize::from(step.target.disk.0)].clone(),
                base: self.shared.slab_base(step.target.slab, slab_bytes),
                valid_below: Some(mark),
            };
            let in_place = matches!(job.kind, JobKind::Resync { .. });
            space.update_extent(u64::from(step.extent), |targets| {
                let target = &mut targets[usize::from(step.slot)];
                if in_place {
                    target.locations[0].valid_below = location.valid_below.clone();
                } else {
                    target.locations.push(location);
                }
            });
        }
    }

    /// Drop the extra locations of a cancelled or failed job's moves.
    /// Only under the control lock (`_held`), after the commit that frees
    /// their targets and before the lock goes: the map epochs retire the
    /// targets as the map stops naming them, and an allocation planned in
    /// between would see them free while requests still write them.
    pub(crate) fn uninstall_job(&self, _held: &crate::control::Control, job: &JobRecord) {
        for step in job.moves.iter().filter(|step| !step.done) {
            let key = (step.space, step.extent, step.slot);
            self.shared.job_runtime.forget(&key);
            let Some(space) = self.space_by_id(step.space) else {
                continue;
            };
            let in_place = matches!(job.kind, JobKind::Resync { .. });
            space.update_extent(u64::from(step.extent), |targets| {
                let target = &mut targets[usize::from(step.slot)];
                if !in_place {
                    target.locations.truncate(1);
                }
            });
        }
    }

    /// The lost disks whose slabs no active job re-creates and a repair
    /// would find no room for (all of them, or some log slots), by disk.
    pub(crate) fn unrepaired(&self, metadata: &PoolMetadata) -> BTreeMap<DiskIndex, Unrepaired> {
        let reserved = self.shared.reserved_slabs();
        let mut found = BTreeMap::new();
        for (index, record) in metadata.disks.iter().enumerate() {
            let disk = DiskIndex(index as u16);
            let held = held_slabs(metadata, disk);
            let repairing = metadata.jobs.iter().any(|job| {
                job.is_active()
                    && job.kind != JobKind::LogsToJournal
                    && job_disks(metadata, job).contains(&disk)
            });
            if !matches!(record.state, DiskState::Failed | DiskState::Missing)
                || held == 0
                || repairing
            {
                continue;
            }
            let (reason, slabs, logs_only) = match plan::unplaced_logs(metadata, disk, &reserved) {
                Ok((unplaced, _)) if unplaced.is_empty() => continue,
                Ok((unplaced, _)) => {
                    let slabs = unplaced.len() as u64;
                    let first = unplaced.into_iter().next().map(plan::Unplaced::refusal);
                    (
                        first.map(|e| e.to_string()).unwrap_or_default(),
                        slabs,
                        true,
                    )
                }
                Err(error) => (error.to_string(), held, false),
            };
            let disk_bytes = terrace_meta::format::data_offset(self.shared.metadata_slot_bytes)
                + slabs * metadata.slab_bytes;
            found.insert(
                disk,
                Unrepaired {
                    reason,
                    slabs,
                    disk_bytes,
                    logs_only,
                },
            );
        }
        found
    }

    fn space_by_id(&self, id: SpaceId) -> Option<Arc<crate::volume::Volume>> {
        self.all_spaces().into_iter().find(|space| space.id() == id)
    }
}

/// The active jobs a missing disk coming back cancels, by position in
/// `metadata.jobs`, each with the reason it keeps: the policy's repair of
/// the disk (what it still holds needs only the extents written while it
/// was away; see [`repair_kept_for`] for when it goes on instead), and
/// log moves taking a slot off it (its catch-up and such
/// a move would share the slot's watermark; the runner starts the move
/// again once the pool's disks have changed).
pub(crate) fn cancelled_by_return(
    metadata: &PoolMetadata,
    disk: DiskIndex,
) -> Vec<(usize, String)> {
    metadata
        .jobs
        .iter()
        .enumerate()
        .filter(|(_, job)| job.is_active())
        .filter_map(|(position, job)| match job.kind {
            JobKind::Repair { disk: repaired } if repaired == disk => Some((
                position,
                format!("disk {} returned and catches up in place", disk.0),
            )),
            JobKind::LogsToJournal if job_disks(metadata, job).contains(&disk) => Some((
                position,
                format!(
                    "disk {} returned and catches up first; the log move starts again after",
                    disk.0
                ),
            )),
            _ => None,
        })
        .collect()
}

/// The policy's repair of `disk` that goes on although the disk came back
/// (`retire-missing always`): the disk waits, unused, to be released.
pub(crate) fn repair_kept_for(metadata: &PoolMetadata, disk: DiskIndex) -> Option<u64> {
    if metadata.settings.retire_missing != terrace_meta::RetireMissing::Always {
        return None;
    }
    metadata
        .jobs
        .iter()
        .find(|job| job.is_active() && job.kind == JobKind::Repair { disk })
        .map(|job| job.id)
}

/// Active log moves taking a slot off `disk`, if it is lost (by position
/// in `metadata.jobs`).
fn log_moves_off_lost(metadata: &PoolMetadata, disk: DiskIndex) -> Vec<usize> {
    let lost = metadata
        .disk(disk)
        .is_some_and(|record| matches!(record.state, DiskState::Failed | DiskState::Missing));
    if !lost {
        return Vec::new();
    }
    (0..metadata.jobs.len())
        .filter(|&position| {
            let job = &metadata.jobs[position];
            job.is_active()
                && job.kind == JobKind::LogsToJournal
                && move_sources(metadata, job.moves.iter().filter(|m| !m.done))
                    .any(|source| source == disk)
        })
        .collect()
}

/// One active job per disk: two jobs moving the same slabs would race. And
/// a disk that an active job is filling cannot be emptied and released: the
/// job would go on writing to a disk that left the pool.
fn check_job_disks(metadata: &PoolMetadata, kind: JobKind) -> Result<(), EngineError> {
    let disks = kind_disks(kind);
    for disk in &disks {
        let record = metadata
            .disk(*disk)
            .ok_or(EngineError::NoSuchDisk { disk: disk.0 })?;
        if record.state == DiskState::Removed {
            return Err(EngineError::NoSuchDisk { disk: disk.0 });
        }
    }
    let emptied = match kind {
        JobKind::Evacuate { disk } | JobKind::Replace { old: disk, .. } => Some(disk),
        JobKind::Repair { .. }
        | JobKind::Resync { .. }
        | JobKind::LogsToJournal
        | JobKind::Scrub => None,
    };
    let busy = metadata
        .jobs
        .iter()
        .filter(|job| job.is_active())
        .find(|job| {
            let filling = job
                .moves
                .iter()
                .filter(|step| !step.done)
                .any(|step| emptied == Some(step.target.disk));
            filling || job_disks(metadata, job).iter().any(|d| disks.contains(d))
        });
    match busy {
        Some(job) => Err(EngineError::JobConflict { id: job.id }),
        None => Ok(()),
    }
}

/// Bytes a job's moves account for: whole slabs of the done ones, and the
/// rows below `rows(step)` of the others.
pub(crate) fn moves_bytes(
    metadata: &PoolMetadata,
    job: &JobRecord,
    rows: impl Fn(&terrace_meta::MoveRecord) -> u64,
) -> u64 {
    job.moves
        .iter()
        .map(|step| {
            if step.done {
                return metadata.slab_bytes;
            }
            let interleave = metadata
                .space_by_id(step.space)
                .map_or(0, |space| space.interleave_bytes);
            rows(step) * interleave
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use crate::job_runtime::JobRuntime;

    const SECOND: u64 = 1_000_000_000;

    /// 10 MB in the first second, a pause of 9 s, 10 MB more in the second
    /// after resuming: 10 MB/s, not 20 MB over 11 s.
    #[test]
    fn a_paused_span_is_not_running_time() {
        let runtime = JobRuntime::default();
        runtime.note_bytes(7, 0, 0);
        runtime.note_bytes(7, SECOND, 10_000_000);
        assert_eq!(runtime.rate(7, SECOND, true), 10_000_000);
        // Paused: timed to its last progress, however long it stands.
        assert_eq!(runtime.rate(7, 10 * SECOND, false), 10_000_000);
        runtime.resumed(7, 10 * SECOND);
        assert_eq!(runtime.rate(7, 10 * SECOND, true), 10_000_000);
        runtime.note_bytes(7, 11 * SECOND, 20_000_000);
        assert_eq!(runtime.rate(7, 11 * SECOND, true), 10_000_000);
        // A job this process never saw progress of has no rate to move.
        runtime.resumed(8, 11 * SECOND);
        assert_eq!(runtime.rate(8, 12 * SECOND, true), 0);
    }
}
