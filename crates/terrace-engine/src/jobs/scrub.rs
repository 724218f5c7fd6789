//! Scrub: a job that reads every row of every space, checks that its
//! copies or parity agree, and rewrites what disagrees.
//!
//! A scrub moves nothing; it walks the pool by a cursor. Its unit is an
//! extent of a space (data spaces and hidden ones: logs, sums), visited in
//! disk order ([`place_key`]), so each disk is read mostly from its start
//! to its end. While no client is busy an extent's rows stream: each
//! slot's part of them is read in long requests, checked as read, and
//! only rows that do not agree are read again and repaired under their
//! locks ([`repair_rows_streaming`]); while clients are busy, in steps,
//! one row at a time, each under its lock as every pass over a space does
//! ([`crate::redundancy`]), by `check_row` with `Pass::Repair`. A fix is
//! durable before its row counts as done, so the cursor never claims a row
//! whose repair a power cut could undo.
//!
//! ```text
//!  start: refused beside another scrub or a repair or catch-up; the job
//!         is recorded with cursor 0 and the bytes it reads from disks;
//!         the pool's last scrub is now (the schedule counts from it)
//!  run:   extents by place key, from the first whose key >= cursor,
//!         those on disjoint disks at once: rows streamed or in steps
//!         (paced, stopping when paused or cancelled) ─
//!         cursor = last key + 1 ─ committed about once a second
//!  end:   done: bytes read, rows repaired and not repaired
//! ```
//!
//! The cursor is a place key, not a count: extents allocated or freed
//! while the scrub runs or waits do not shift what it has done. An extent
//! that a job moves while a scrub is under way gets a new key, and is
//! checked again or not at all, as the key falls; its rows were just
//! copied from a source the copy was checked against.
//!
//! The schedule: the runner starts a scrub when the pool's interval has
//! passed since its last one (`PoolSettings::scrub_last_ns`, set by a
//! pool's creation and import too; where it is still 0 the interval counts
//! from when the runner started), and no scrub,
//! repair or catch-up is active. Time is the pool's `Env` clock.

use std::sync::atomic::Ordering;

use futures::future::join_all;
use terrace_meta::{DiskIndex, JobKind, JobRecord, JobState, PoolMetadata, SpaceId};

use crate::error::EngineError;
use crate::job_runtime::ScrubMark;
use crate::pool::Pool;
use crate::redundancy::{place_key, repair_rows, repair_rows_streaming};
use crate::resync::RedundancyReport;
use crate::verify::Finding;
use crate::PoolEvent;

/// Bytes a scrub reads in one step while clients are busy (see
/// `Pool::scrub_extent`).
const STEP_BYTES: u64 = 16 << 20;
/// Rows such a step checks at most (small interleaves).
const STEP_ROWS_MAX: u64 = 64;
/// How long after a client's last request began or ended the pool counts
/// as busy (as it does while one is under way): the scrub then checks one
/// row at a time, so a client's requests queue behind at most one row's
/// read on each disk (as ZFS slows its scan after client I/O within
/// `zfs_scan_idle`); on an idle pool it streams
/// ([`repair_rows_streaming`]). Longer than the gaps between a busy
/// client's requests, short enough that a scrub of an idle pool runs at
/// full speed a moment after the client stops.
const CLIENT_QUIET_NS: u64 = 250_000_000;
/// How often a running scrub commits its cursor: a crash repeats at most
/// this much work (and the extent it was in), and commits stay rare.
const PERSIST_INTERVAL_NS: u64 = 1_000_000_000;
/// How long the scrub runner waits when no scrub runs or is due.
const IDLE_POLL_NS: u64 = 100_000_000;
const SECOND_NS: u64 = 1_000_000_000;

/// One extent a scrub visits.
struct Unit {
    key: u64,
    space: SpaceId,
    extent: u64,
    rows: u64,
    /// Bytes it reads from disks: every slot's slab.
    disk_bytes: u64,
    /// The disks its slots lie on.
    disks: Vec<DiskIndex>,
}

/// `units` (in disk order) in runs whose extents lie on disjoint disks.
fn disjoint_batches<'a>(units: &[&'a Unit]) -> Vec<Vec<&'a Unit>> {
    let mut batches: Vec<Vec<&Unit>> = Vec::new();
    let mut used: Vec<DiskIndex> = Vec::new();
    for &unit in units {
        let fits = batches.last().is_some() && unit.disks.iter().all(|disk| !used.contains(disk));
        if !fits {
            batches.push(Vec::new());
            used.clear();
        }
        used.extend(&unit.disks);
        batches.last_mut().expect("pushed above").push(unit);
    }
    batches
}

/// Every allocated extent of every space, in disk order.
fn units(metadata: &PoolMetadata) -> Vec<Unit> {
    let mut units = Vec::new();
    for space in &metadata.spaces {
        let Ok(geometry) = space.geometry(metadata.slab_bytes) else {
            continue;
        };
        for (extent, record) in space.extents.iter().enumerate() {
            let Some(slabs) = record.slabs.as_ref() else {
                continue;
            };
            // Rows with neither redundancy nor sums have nothing to be
            // checked against: not read, and not counted.
            let redundant = geometry.layout().failures_tolerated() > 0 || space.sums.is_some();
            units.push(Unit {
                key: place_key(slabs.iter().map(|slab| (slab.disk, slab.slab))),
                space: space.id,
                extent: extent as u64,
                rows: if redundant {
                    geometry.rows_per_extent()
                } else {
                    0
                },
                disk_bytes: if redundant {
                    slabs.len() as u64 * metadata.slab_bytes
                } else {
                    0
                },
                disks: slabs.iter().map(|slab| slab.disk).collect(),
            });
        }
    }
    units.sort_unstable_by_key(|unit| unit.key);
    units
}

/// Why a scrub may not start now: one runs already, or a repair or
/// catch-up is re-creating data (ZFS refuses a scrub during a resilver).
fn check_scrub(metadata: &PoolMetadata) -> Result<(), EngineError> {
    let active = metadata.jobs.iter().filter(|job| job.is_active());
    for job in active {
        match job.kind {
            JobKind::Scrub => return Err(EngineError::ScrubRunning { id: job.id }),
            JobKind::Repair { .. } | JobKind::Resync { .. } => {
                return Err(EngineError::ScrubDuringRepair { id: job.id })
            }
            _ => {}
        }
    }
    Ok(())
}

/// What a finished scrub says it did.
fn summary(bytes_total: u64, rows: u64, mark: &ScrubMark) -> String {
    let mut text = format!(
        "checked {rows} rows ({} read from disks); {} rows repaired, {} could not be repaired",
        crate::units::format_size(bytes_total),
        mark.repaired,
        mark.unrepaired
    );
    if mark.skipped > 0 {
        text += &format!(
            "; {} rows not checked: a disk they need was offline",
            mark.skipped
        );
    }
    text
}

/// A finding as the daemon's log tells it: what disagreed, and where.
fn described(finding: &Finding) -> String {
    let problems: Vec<String> = finding
        .problems
        .iter()
        .map(|problem| {
            let places: Vec<String> = problem
                .places
                .iter()
                .map(|place| match (place.disk, place.disk_offset) {
                    (Some(disk), Some(offset)) => {
                        format!("{} on disk {} at byte {offset}", place.role, disk.0)
                    }
                    _ => format!("{} not readable", place.role),
                })
                .collect();
            format!("{} ({})", problem.kind, places.join(", "))
        })
        .collect();
    problems.join("; ")
}

impl Pool {
    /// Start a scrub of the whole pool, paced at `rate_bytes_per_second`
    /// read from disks (0: at the pool's repair rate); its job id.
    pub async fn start_scrub(&self, rate_bytes_per_second: u64) -> Result<u64, EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        check_scrub(&next)?;
        let units = units(&next);
        let id = next.next_job_id;
        next.next_job_id += 1;
        let now = self.shared.env.wall_clock_ns();
        next.settings.scrub_last_ns = now;
        next.jobs.push(JobRecord::new(
            id,
            JobKind::Scrub,
            JobState::Running,
            now,
            units.iter().map(|unit| unit.disk_bytes).sum(),
            Vec::new(),
        ));
        if units.is_empty() {
            let position = next.jobs.len() - 1;
            self.complete_job(&mut next, position);
            next.jobs[position].reason = super::nothing_to_do(&next, JobKind::Scrub);
        }
        let mark = ScrubMark {
            rate: rate_bytes_per_second,
            ..ScrubMark::default()
        };
        self.shared.job_runtime.note_scrub(id, mark);
        self.shared.commit(&mut control, next).await?;
        Ok(id)
    }

    /// Run scrubs, and start them on schedule, until the pool closes.
    pub(super) async fn run_scrubs(&self) {
        let since = self.shared.env.wall_clock_ns();
        while self.running_jobs() {
            match self.scrub_to_run(since).await {
                Some(job) => self.run_scrub(job).await,
                None => self.shared.env.sleep(IDLE_POLL_NS).await,
            }
        }
    }

    /// The running scrub, if any; else one started because it is due.
    async fn scrub_to_run(&self, since_ns: u64) -> Option<JobRecord> {
        let due = {
            // Read in place: asked ten times a second.
            let control = self.shared.control.lock().await;
            let metadata = &control.metadata;
            let running = metadata
                .jobs
                .iter()
                .find(|job| job.kind == JobKind::Scrub && job.state == JobState::Running);
            if let Some(job) = running {
                return Some(job.clone());
            }
            let settings = &metadata.settings;
            let last = match settings.scrub_last_ns {
                0 => since_ns,
                last => last,
            };
            let interval = settings.scrub_interval_secs.saturating_mul(SECOND_NS);
            let now = self.shared.env.wall_clock_ns();
            interval > 0 && now.saturating_sub(last) >= interval && check_scrub(metadata).is_ok()
        };
        if due {
            // Refused (closing, a job started meanwhile): looked at again
            // on the next tick.
            let _ = self.start_scrub(0).await;
        }
        None
    }

    /// Walk the pool from `job`'s cursor to its end, or until it stops
    /// running.
    async fn run_scrub(&self, job: JobRecord) {
        let runtime = &self.shared.job_runtime;
        let kept = runtime.scrub(job.id).unwrap_or_default();
        let mut mark = ScrubMark {
            cursor: job.cursor,
            bytes_done: job.bytes_done,
            repaired: job.repaired,
            unrepaired: job.unrepaired,
            ..kept
        };
        let metadata = self.metadata().await;
        let units = units(&metadata);
        let left: Vec<&Unit> = units.iter().filter(|unit| unit.key >= job.cursor).collect();
        for batch in disjoint_batches(&left) {
            // Extents on disjoint disks at once (a log's and a sums
            // volume's slabs lie on a few disks each): each disk reads one
            // extent at a time, and none waits for another's.
            let results = join_all(batch.iter().map(|unit| async move {
                let mut found = ScrubMark {
                    rate: mark.rate,
                    ..ScrubMark::default()
                };
                let result = self.scrub_extent(job.id, unit, &mut found).await;
                (result, found)
            }))
            .await;
            let mut stopped = false;
            for (result, found) in results {
                mark.repaired += found.repaired;
                mark.unrepaired += found.unrepaired;
                mark.skipped += found.skipped;
                match result {
                    Ok(true) => {}
                    Ok(false) => stopped = true,
                    Err(error) => {
                        if self.shared.check_open().is_ok() {
                            self.fail_job(job.id, error.to_string()).await;
                        }
                        return;
                    }
                }
            }
            if stopped {
                runtime.note_scrub(job.id, mark);
                return;
            }
            let last = batch.last().expect("a batch holds a unit");
            mark.cursor = last.key + 1;
            mark.bytes_done += batch.iter().map(|unit| unit.disk_bytes).sum::<u64>();
            runtime.note_scrub(job.id, mark);
            let now = self.shared.env.now_ns();
            runtime.note_bytes(job.id, now, mark.bytes_done);
            if runtime.persist_due(job.id, now, PERSIST_INTERVAL_NS) {
                self.persist_scrub(job.id).await;
            }
        }
        let rows = units.iter().map(|unit| unit.rows).sum();
        self.finish_scrub(job.id, rows, &mark).await;
    }

    /// Check one extent's rows; false if the job stopped running
    /// (paused, cancelled, the pool closing) before the end. While no
    /// client is busy the rows stream ([`repair_rows_streaming`], paced
    /// and looked at before each read); while one is, or where a slot of
    /// the extent is moving, in steps of about 16 MiB read (small enough
    /// to pause within a fraction of a second, a tenth of one on a single
    /// hard disk), one row at a time.
    async fn scrub_extent(
        &self,
        job: u64,
        unit: &Unit,
        mark: &mut ScrubMark,
    ) -> Result<bool, EngineError> {
        let Some(space) = self.space_by_id(unit.space) else {
            return Ok(true); // deleted since: nothing to check
        };
        let geometry = *space.geometry();
        let row_disk_bytes = geometry.interleave_bytes() * u64::from(geometry.slots_per_extent());
        let step = (STEP_BYTES / row_disk_bytes).clamp(1, STEP_ROWS_MAX);
        let own_rate = mark.rate;
        let mut streams = true;
        let mut from = 0;
        while from < unit.rows {
            if streams && self.clients_idle() {
                let stopped = std::sync::atomic::AtomicBool::new(false);
                let go_on = |bytes| {
                    let stopped = &stopped;
                    async move {
                        if !self.scrub_turn(job, own_rate, bytes).await {
                            stopped.store(true, Ordering::Relaxed);
                            return false;
                        }
                        self.clients_idle()
                    }
                };
                match repair_rows_streaming(&space, unit.extent, from..unit.rows, go_on).await? {
                    Some((report, done)) => {
                        self.tell_scrub_found(job, &space, &report, mark);
                        from = done;
                        if stopped.load(Ordering::Relaxed) {
                            return Ok(false);
                        }
                    }
                    None => streams = false,
                }
                continue;
            }
            let to = (from + step).min(unit.rows);
            if !self
                .scrub_turn(job, own_rate, (to - from) * row_disk_bytes)
                .await
            {
                return Ok(false);
            }
            let report = repair_rows(&space, unit.extent, from..to).await?;
            self.tell_scrub_found(job, &space, &report, mark);
            from = to;
        }
        Ok(true)
    }

    /// No client's read or write is under way or reached the pool within
    /// [`CLIENT_QUIET_NS`]. Scrubs and moves both go all out only then.
    pub(super) fn clients_idle(&self) -> bool {
        self.shared.clients_idle(CLIENT_QUIET_NS)
    }

    /// Wait for the scrub's turn to read `bytes` at its pace; false if it
    /// is no longer running (before or after the wait).
    async fn scrub_turn(&self, job: u64, own_rate: u64, bytes: u64) -> bool {
        let Some(rate) = self.scrub_pace(job, own_rate).await else {
            return false;
        };
        !(self.wait_turn(rate, bytes).await && self.scrub_pace(job, own_rate).await.is_none())
    }

    /// The pace of a scrub that is still running (`None` otherwise): its
    /// own, or the pool's repair rate.
    async fn scrub_pace(&self, job: u64, own: u64) -> Option<u64> {
        if self.shared.check_open().is_err() {
            return None;
        }
        let control = self.shared.control.lock().await;
        let metadata = &control.metadata;
        metadata
            .jobs
            .iter()
            .any(|record| record.id == job && record.state == JobState::Running)
            .then_some(match own {
                0 => metadata.settings.repair_rate_bytes_per_second,
                rate => rate,
            })
    }

    /// Count and tell what a scrub's pass over some rows found.
    fn tell_scrub_found(
        &self,
        job: u64,
        space: &crate::volume::Volume,
        report: &RedundancyReport,
        mark: &mut ScrubMark,
    ) {
        mark.skipped += report.skipped_rows;
        mark.unrepaired += report.unrepaired_rows.len() as u64;
        mark.repaired += (report.mismatched_rows.len() - report.unrepaired_rows.len()) as u64;
        for finding in &report.findings {
            let repaired = !report
                .unrepaired_rows
                .contains(&(finding.extent, finding.row));
            self.shared.events.emit(PoolEvent::ScrubFound {
                job,
                space: space.name().to_string(),
                offset: finding.offset,
                what: described(finding),
                repaired,
            });
        }
    }

    /// Commit a scrub's cursor and counts. Its repairs are durable already
    /// (written FUA before their rows counted).
    async fn persist_scrub(&self, job: u64) {
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let Some(record) = next.jobs.iter_mut().find(|record| record.id == job) else {
            return;
        };
        self.save_watermarks(record);
        let _ = self.shared.commit(&mut control, next).await;
    }

    /// The walk reached its end: the job is done, with what it found.
    async fn finish_scrub(&self, job: u64, rows: u64, mark: &ScrubMark) {
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let Some(position) = next
            .jobs
            .iter()
            .position(|record| record.id == job && record.state == JobState::Running)
        else {
            return;
        };
        self.save_watermarks(&mut next.jobs[position]);
        let bytes_total = next.jobs[position].bytes_total;
        let rows = rows.saturating_sub(mark.skipped);
        let reason = summary(bytes_total, rows, mark);
        self.complete_job(&mut next, position);
        if let Some(record) = next.jobs.iter_mut().find(|record| record.id == job) {
            record.reason = reason;
        }
        if self.shared.commit(&mut control, next).await.is_ok() {
            self.shared.job_runtime.forget_scrub(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(key: u64, disks: &[u16]) -> Unit {
        Unit {
            key,
            space: SpaceId(1),
            extent: key,
            rows: 1,
            disk_bytes: 1,
            disks: disks.iter().map(|&disk| DiskIndex(disk)).collect(),
        }
    }

    /// Extents go together while their disks do not meet, in order.
    #[test]
    fn extents_on_disjoint_disks_are_batched_in_order() {
        let units = [
            unit(1, &[0, 1, 2, 3]),
            unit(2, &[0, 1]),
            unit(3, &[2, 3]),
            unit(4, &[1]),
            unit(5, &[3]),
        ];
        let refs: Vec<&Unit> = units.iter().collect();
        let keys: Vec<Vec<u64>> = disjoint_batches(&refs)
            .iter()
            .map(|batch| batch.iter().map(|unit| unit.key).collect())
            .collect();
        assert_eq!(keys, vec![vec![1], vec![2, 3], vec![4, 5]]);
    }
}
