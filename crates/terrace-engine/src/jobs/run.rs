//! The job runner: moves filled row range by row range, progress committed,
//! moves and jobs finished, and repairs started by policy.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::join_all;
use terrace_meta::{
    DiskIndex, DiskState, JobKind, JobRecord, JobState, PoolMetadata, RepairPolicy, RetireMissing,
};

use super::JobAction;
use crate::disk::Condition;
use crate::error::EngineError;
use crate::pool::Pool;
use crate::target::{Location, Target};

/// Finished jobs kept in the metadata for `job list`: enough for a history,
/// small enough not to grow the metadata without bound.
pub const JOB_HISTORY_MAX: usize = 16;
/// Bytes a move fills between checks for pause, cancel and the rate limit:
/// small enough to react within a fraction of a second, large enough that
/// the checks cost nothing.
const FILL_STEP_BYTES: u64 = 4 << 20;
/// Rows a step reads and writes at once, at most (small interleaves).
const FILL_STEP_ROWS_MAX: u64 = 64;
/// How often a running job commits its moves' watermarks: a crash repeats
/// at most this much work, and commits stay rare next to client I/O.
const PERSIST_INTERVAL_NS: u64 = 1_000_000_000;
/// Moves in flight at once under the parallel policy while no client is
/// busy: enough to keep every disk of a large pool reading and writing.
const PARALLEL_MOVES: usize = 16;
/// Moves in flight at once, and the bytes of each step, while a client is
/// busy: a client's request waits behind at most one step on a disk, and
/// most disks serve the clients alone at any moment.
const BUSY_MOVES: usize = 4;
const BUSY_STEP_BYTES: u64 = 1 << 20;
/// How long the runner sleeps when there is nothing to do.
const IDLE_POLL_NS: u64 = 100_000_000;
/// How often idle disks are probed: a dead disk is noticed within a second
/// even when no client touches it, at the cost of one 4 KiB read each.
const PROBE_INTERVAL_NS: u64 = 1_000_000_000;

/// How the moves go at a moment ([`Pool::pace`]).
struct Pace {
    /// Workers that may hold a move.
    moves: usize,
    step_bytes: u64,
    /// Steps written through the drives' caches: a step ends when its
    /// destination holds it, so the pace holds on drives whose caches
    /// would take the writes at once and write them behind the clients'.
    write_through: bool,
}

/// Which moves the workers of [`Pool::run_jobs`] hold, and which rest: a
/// move that stopped without finishing (paused, no destination yet) waits
/// a poll interval before a worker tries it again.
#[derive(Default)]
struct Claims {
    state: std::sync::Mutex<ClaimState>,
}

#[derive(Default)]
struct ClaimState {
    running: HashSet<(u64, usize)>,
    resting: HashMap<(u64, usize), u64>,
}

impl Claims {
    fn claim(&self, pending: Vec<MoveWork>, now_ns: u64) -> Option<MoveWork> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .resting
            .retain(|_, since| now_ns.saturating_sub(*since) < IDLE_POLL_NS);
        let work = pending.into_iter().find(|work| {
            let key = (work.job, work.index);
            !state.running.contains(&key) && !state.resting.contains_key(&key)
        })?;
        state.running.insert((work.job, work.index));
        Some(work)
    }

    fn release(&self, key: (u64, usize), now_ns: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.running.remove(&key);
        state.resting.insert(key, now_ns);
    }
}

/// Where one pending move stands.
struct MoveWork {
    job: u64,
    index: usize,
}

impl Pool {
    /// Run jobs until the pool closes. The daemon spawns this once per pool.
    ///
    /// Moves run on a set of workers, up to the policy's limit at once;
    /// each worker takes the next pending move as soon as its last one
    /// ends (a batch that waited for its slowest move would leave disks
    /// idle). Beside them, disks are probed and the repair policy runs
    /// every poll interval. Each runs as its own loop, so none waits on
    /// another (a move holds the metadata lock while it commits).
    pub async fn run_jobs(&self) {
        let claims = Claims::default();
        let policy = async {
            let mut attempted: BTreeSet<(DiskIndex, u64)> = BTreeSet::new();
            let mut logs_attempted = None;
            let mut last_probe: Option<u64> = None;
            // What the policy decides follows from the metadata alone: it
            // looks again only after a commit, where every look copied
            // the whole metadata ten times a second (an idle daemon with a
            // 16 TiB pool of 64 MiB slabs spent a seventh of a core so).
            let mut planned_at = None;
            while self.running_jobs() {
                let now = self.shared.env.now_ns();
                if last_probe.is_none_or(|last| now.saturating_sub(last) >= PROBE_INTERVAL_NS) {
                    last_probe = Some(now);
                    self.probe_disks().await;
                }
                let generation = self.generation().await;
                if planned_at != Some(generation) {
                    planned_at = Some(generation);
                    self.start_policy_repairs(&mut attempted).await;
                    self.start_log_moves(&mut logs_attempted).await;
                }
                let _ = self.shared.clear_idle_intent().await;
                self.shared.env.sleep(IDLE_POLL_NS).await;
            }
        };
        let workers = (0..PARALLEL_MOVES).map(|worker| {
            let claims = &claims;
            async move {
                while self.running_jobs() {
                    let (pending, limit) = self.pending_moves().await;
                    // Under the policy's limit, and the clients'.
                    let claimed = if worker < limit.min(self.pace().moves) {
                        claims.claim(pending, self.shared.env.now_ns())
                    } else {
                        None
                    };
                    let Some(work) = claimed else {
                        self.shared.env.sleep(IDLE_POLL_NS).await;
                        continue;
                    };
                    let key = (work.job, work.index);
                    self.run_move(work, worker).await;
                    claims.release(key, self.shared.env.now_ns());
                }
            }
        });
        // Mirror rows left since an unclean shutdown, beside the moves.
        let resync = async {
            while self.running_jobs() {
                match self.resync_after_crash().await {
                    Ok(()) => break,
                    Err(_) => self.shared.env.sleep(IDLE_POLL_NS).await,
                }
            }
        };
        futures::future::join4(policy, join_all(workers), resync, self.run_scrubs()).await;
    }

    pub(super) fn running_jobs(&self) -> bool {
        self.shared.check_open().is_ok() && self.shared.read_only.is_none()
    }

    /// Start a repair for each failed or missing disk that still holds
    /// slabs of a space and has no job yet, as the retire-missing policy
    /// says. A disk is tried once per placement state ([`placement_key`]):
    /// a repair that found no room is tried again when a disk or a slab
    /// changes hands, not on every commit (its own failure record is one).
    async fn start_policy_repairs(&self, attempted: &mut BTreeSet<(DiskIndex, u64)>) {
        let metadata = self.metadata().await;
        if metadata.settings.retire_missing == RetireMissing::Never {
            return;
        }
        // Only slabs of spaces count: a lost disk that was merely the
        // target of a move is handled by that move's retargeting.
        let holding: BTreeSet<DiskIndex> = metadata
            .spaces
            .iter()
            .flat_map(|space| space.extents.iter())
            .filter_map(|extent| extent.slabs.as_ref())
            .flatten()
            .map(|slab| slab.disk)
            .collect();
        for (index, disk) in metadata.disks.iter().enumerate() {
            let index = DiskIndex(index as u16);
            let lost = matches!(disk.state, DiskState::Failed | DiskState::Missing);
            // A disk whose repair is still running holds slabs until its
            // last move is done; starting another would only conflict. A
            // log move off it gives way to its repair (see `start_job`).
            let has_job = metadata.jobs.iter().any(|job| {
                job.is_active()
                    && job.kind != JobKind::LogsToJournal
                    && super::job_disks(&metadata, job).contains(&index)
            });
            if !lost
                || has_job
                || !holding.contains(&index)
                || !attempted.insert((index, placement_key(&metadata)))
            {
                continue;
            }
            // Not started (no room, most often): recorded failed with why,
            // so that `job list` says it, under either policy; tried again
            // when the placement changes.
            if let Err(error) = self.start_repair(index).await {
                let bytes = super::held_slabs(&metadata, index) * metadata.slab_bytes;
                let reason = format!("no repair started: {error}");
                self.record_failed_job(JobKind::Repair { disk: index }, reason, bytes)
                    .await;
            }
        }
    }

    /// Move write-back logs off capacity disks onto journal disks once the
    /// pool has journal disks enough for them (added, or back in service
    /// after the logs were re-mirrored away): a log on hard disks writes
    /// at their speed. Only while no other job runs, so repairs come
    /// first; tried once per placement state, and no job is recorded when
    /// there is nothing to move.
    async fn start_log_moves(&self, attempted: &mut Option<u64>) {
        let metadata = self.metadata().await;
        let key = placement_key(&metadata);
        if *attempted == Some(key) || metadata.jobs.iter().any(|job| job.is_active()) {
            return;
        }
        *attempted = Some(key);
        let kind = JobKind::LogsToJournal;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        // Nothing to move: the job recorded in `next` is dropped with it.
        let Ok(job) = self.record_job(&mut next, kind) else {
            return;
        };
        if job.moves.is_empty() {
            return;
        }
        match self.shared.commit(&mut control, next).await {
            Ok(()) => {
                drop(control);
                self.launch_job(&job).await;
            }
            // Shown in `job list`, not dropped (its record may not fit the
            // metadata slot): tried again when the placement changes.
            Err(error) => {
                drop(control);
                self.record_failed_job(kind, error.to_string(), 0).await;
            }
        }
    }

    /// Record a job that could not start, with why and the bytes it would
    /// have moved (none of them done).
    async fn record_failed_job(&self, kind: JobKind, reason: String, bytes_total: u64) {
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let now = self.shared.env.wall_clock_ns();
        next.jobs.push(JobRecord {
            reason,
            finished_ns: now,
            ..JobRecord::new(
                next.next_job_id,
                kind,
                JobState::Failed,
                now,
                bytes_total,
                Vec::new(),
            )
        });
        next.next_job_id += 1;
        trim_history(&mut next);
        let _ = self.shared.commit(&mut control, next).await;
    }

    /// The moves to run now, by the repair policy.
    /// Every pending move of the running jobs, in order, and how many the
    /// repair policy lets run at once.
    async fn pending_moves(&self) -> (Vec<MoveWork>, usize) {
        // Read in place: the workers ask ten times a second each.
        let control = self.shared.control.lock().await;
        let metadata = &control.metadata;
        let limit = match metadata.settings.repair_policy {
            RepairPolicy::Parallel => PARALLEL_MOVES,
            RepairPolicy::Sequential => 1,
        };
        let work = metadata
            .jobs
            .iter()
            .filter(|job| job.state == JobState::Running)
            .flat_map(|job| {
                job.moves
                    .iter()
                    .enumerate()
                    .filter(|(_, step)| !step.done)
                    .map(move |(index, _)| MoveWork { job: job.id, index })
            })
            .collect();
        (work, limit)
    }

    /// Fill one move to its end, or until its job stops running or its
    /// worker is past the moves the clients leave room for now.
    async fn run_move(&self, work: MoveWork, worker: usize) {
        loop {
            let metadata = self.metadata().await;
            let Some(job) = metadata.jobs.iter().find(|job| job.id == work.job) else {
                return;
            };
            if job.state != JobState::Running || self.shared.check_open().is_err() {
                return;
            }
            let step = &job.moves[work.index];
            let Some(space) = self.space_by_id(step.space) else {
                self.finish_move(work.job, work.index).await;
                return;
            };
            let geometry = *space.geometry();
            let key = (step.space, step.extent, step.slot);
            let mark = self.shared.job_runtime.mark(key, step.watermark_rows);
            let from = mark.load(Ordering::Acquire);
            if from >= geometry.rows_per_extent() {
                self.finish_move(work.job, work.index).await;
                return;
            }
            let Some(destination) = find_destination(&space, step.extent, step.slot, &mark) else {
                return;
            };
            let filled = self
                .fill_steps(&metadata, job, work.index, &space, &destination, worker)
                .await;
            match filled {
                Ok(true) => {}
                Ok(false) => return,
                Err(error) => {
                    self.move_failed(work.job, work.index, &destination, error)
                        .await;
                    return;
                }
            }
        }
    }

    /// Copy move `index` of `job` into `destination` step by step from its
    /// watermark, at the pace the clients leave ([`Pool::pace`]). Ok(true)
    /// once the slab is copied (the caller looks again and finishes the
    /// move); Ok(false) if it stopped first: the job stopped running, its
    /// space was deleted, or clients became busy and this worker is past
    /// the moves they leave room for.
    async fn fill_steps(
        &self,
        metadata: &PoolMetadata,
        job: &JobRecord,
        index: usize,
        space: &crate::volume::Volume,
        destination: &Location,
        worker: usize,
    ) -> Result<bool, EngineError> {
        let step = &job.moves[index];
        let geometry = *space.geometry();
        let rows = geometry.rows_per_extent();
        let rate = metadata.settings.repair_rate_bytes_per_second;
        let mut from = destination
            .valid_below
            .as_ref()
            .map_or(rows, |mark| mark.load(Ordering::Acquire));
        while from < rows {
            let pace = self.pace();
            if worker >= pace.moves {
                return Ok(false);
            }
            let rows_per_step =
                (pace.step_bytes / geometry.interleave_bytes()).clamp(1, FILL_STEP_ROWS_MAX);
            let to = (from + rows_per_step).min(rows);
            if self
                .wait_turn(rate, (to - from) * geometry.interleave_bytes())
                .await
                && !self.job_running(job.id).await
            {
                return Ok(false);
            }
            let written = crate::rebuild::fill_rows(
                space,
                u64::from(step.extent),
                u32::from(step.slot),
                destination,
                from..to,
                pace.write_through,
            )
            .await?;
            if written == 0 {
                return Ok(false); // its space was deleted
            }
            from = to;
            let now = self.shared.env.now_ns();
            self.shared
                .job_runtime
                .note_bytes(job.id, now, self.live_bytes_done(metadata, job));
            if self
                .shared
                .job_runtime
                .persist_due(job.id, now, PERSIST_INTERVAL_NS)
            {
                self.persist_progress(job.id).await;
            }
            if !self.job_running(job.id).await {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// How moves go now: all out while no client is busy, and while one
    /// is, few moves of one small step each, written through the drives'
    /// caches, so that a client's request queues behind at most one step's
    /// read or write on a disk.
    fn pace(&self) -> Pace {
        let idle = self.clients_idle();
        Pace {
            moves: if idle { PARALLEL_MOVES } else { BUSY_MOVES },
            step_bytes: if idle {
                FILL_STEP_BYTES
            } else {
                BUSY_STEP_BYTES
            },
            write_through: !idle,
        }
    }

    /// Wait until the pool's rate limit lets `bytes` more be moved: every
    /// move (and each batch of the resync after a crash) books its step
    /// before it copies, so however many run at once, no more than one
    /// step passes the limit. True if it waited.
    pub(crate) async fn wait_turn(&self, rate: u64, bytes: u64) -> bool {
        if rate == 0 {
            return false;
        }
        let now = self.shared.env.now_ns();
        let start = self.shared.job_runtime.reserve(bytes, rate, now);
        if start <= now {
            return false;
        }
        self.shared.env.sleep(start - now).await;
        true
    }

    /// Whether a job is still running (not paused, cancelled or gone).
    async fn job_running(&self, job_id: u64) -> bool {
        self.metadata()
            .await
            .jobs
            .iter()
            .any(|job| job.id == job_id && job.state == JobState::Running)
    }

    /// Read the label block of every online disk, so that a disk that died
    /// while nothing touched it is noticed (and repaired by policy). A disk
    /// whose label is no longer its own was overwritten (wiped, zeroed,
    /// swapped under us): nothing on it can be trusted, so it is failed. A
    /// disk whose label cannot be read gets it written again: a bad block
    /// is rewritten (and remapped by the drive) as any unreadable block is,
    /// and a disk whose writes fail too is dead and failed. Without that
    /// write a dead disk holding the last copy of some data would stay in
    /// service while the pool is idle (a read error alone keeps a disk
    /// that no redundancy can replace), the space reported degraded
    /// instead of offline.
    async fn probe_disks(&self) {
        let probes = self
            .shared
            .disks()
            .into_iter()
            .filter(|disk| disk.is_online())
            .map(|disk| async move {
                let (block, result) = read_label_block(&disk).await;
                // An error other than a media read error latched the disk
                // failed already.
                let suspect =
                    result.is_err() || label_problem(disk.label().as_ref(), &block).is_some();
                suspect.then_some(disk)
            });
        let suspects: Vec<_> = join_all(probes).await.into_iter().flatten().collect();
        if !suspects.is_empty() {
            self.look_again(suspects).await;
        }
        let _ = self.shared.persist_failures().await;
    }

    /// Look again, under the control lock, at disks whose label looked
    /// wrong or could not be read: a disk joining the pool is labelled
    /// under that lock, so only a label that is still wrong there was
    /// really overwritten, and only there may a label be written again.
    async fn look_again(&self, suspects: Vec<Arc<crate::disk::Disk>>) {
        let _control = self.shared.control.lock().await;
        for disk in suspects {
            if self.shared.check_open().is_err() || !disk.is_online() {
                continue;
            }
            let (block, result) = read_label_block(&disk).await;
            if result.is_err() {
                // A failed write fails the disk, with the write's error.
                if let Some(label) = disk.label() {
                    let mut block = terrace_io::aligned_buffer(terrace_meta::format::LABEL_BYTES);
                    block.copy_from_slice(&label.encode());
                    let _ = disk.write(0, block.freeze(), true).await;
                }
                continue;
            }
            if let Some(problem) = label_problem(disk.label().as_ref(), &block) {
                disk.set_condition(Condition::Failed, problem);
            }
        }
    }

    /// Commit a job's watermarks. The rows below them are made durable
    /// first (marks read, then the destinations flushed, then the marks
    /// read before the flush committed): a watermark on disk never claims
    /// rows a power cut could still take from the destination.
    async fn persist_progress(&self, job_id: u64) {
        let Some(mut job) = self
            .metadata()
            .await
            .jobs
            .into_iter()
            .find(|job| job.id == job_id)
        else {
            return;
        };
        self.save_watermarks(&mut job);
        if !self.flush_destinations(&job).await {
            return;
        }
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let Some(position) = next.jobs.iter().position(|job| job.id == job_id) else {
            return;
        };
        let current = &mut next.jobs[position];
        for (step, saved) in current.moves.iter_mut().zip(&job.moves) {
            if !step.done {
                step.watermark_rows = step.watermark_rows.max(saved.watermark_rows);
            }
        }
        let job = current.clone();
        next.jobs[position].bytes_done = recorded_bytes_done(&next, &job);
        let _ = self.shared.commit(&mut control, next).await;
    }

    /// Flush the disks the unfinished moves of `job` write to. Only they
    /// hold what a watermark claims; the sums are left alone (they are of
    /// the space's blocks, which a copy does not change), and so are the
    /// clients' writes (the write intent's to make durable): flushing
    /// every disk and sums page once a second wrote back each sums page
    /// the clients had dirtied as often, one more random write each on a
    /// hard disk, and clients kept a tenth of their throughput.
    /// False if one failed (the disk is failed with it) or the failures
    /// could not be recorded.
    async fn flush_destinations(&self, job: &JobRecord) -> bool {
        let targets: BTreeSet<DiskIndex> = job
            .moves
            .iter()
            .filter(|step| !step.done)
            .map(|step| step.target.disk)
            .collect();
        let flushes = self
            .shared
            .disks()
            .into_iter()
            .filter(|disk| disk.is_online() && targets.contains(&disk.index))
            .map(|disk| async move { disk.flush().await });
        let flushed = join_all(flushes).await.into_iter().all(|f| f.is_ok());
        self.shared.persist_failures().await.is_ok() && flushed
    }

    /// The destination failed: choose another target and start that move
    /// over. Anything else (the data itself is unavailable) fails the job.
    async fn move_failed(
        &self,
        job_id: u64,
        index: usize,
        destination: &Location,
        error: EngineError,
    ) {
        let retarget = !destination.disk.is_online();
        let outcome = if retarget {
            self.retarget(job_id, index).await
        } else {
            Err(error)
        };
        if let Err(error) = outcome {
            self.fail_job(job_id, error.to_string()).await;
        }
    }
}

/// The block a disk's label is in, as the disk reads it now.
async fn read_label_block(
    disk: &crate::disk::Disk,
) -> (terrace_io::BytesMut, Result<(), crate::disk::DiskError>) {
    disk.read(
        0,
        terrace_io::aligned_buffer(terrace_meta::format::LABEL_BYTES),
    )
    .await
}

/// Why the label block read from a disk shows it is no longer the member
/// it was imported as, if it does.
fn label_problem(expected: Option<&terrace_meta::Label>, block: &[u8]) -> Option<String> {
    let expected = expected?;
    match terrace_meta::Label::decode(block) {
        Ok(found) if found.pool_id == expected.pool_id && found.disk_id == expected.disk_id => None,
        Ok(_) => Some("its label names another pool or disk: it was overwritten".into()),
        Err(error) => Some(format!("its label is gone ({error}): it was overwritten")),
    }
}

/// The location a move is filling: the one whose watermark is `mark`.
fn find_destination(
    space: &crate::volume::Volume,
    extent: u32,
    slot: u16,
    mark: &Arc<std::sync::atomic::AtomicU64>,
) -> Option<Location> {
    // None once the space is deleted (its map is empty then).
    space.current_extent(u64::from(extent))?[usize::from(slot)]
        .locations
        .iter()
        .find(|location| {
            location
                .valid_below
                .as_ref()
                .is_some_and(|m| Arc::ptr_eq(m, mark))
        })
        .cloned()
}

/// Keep at most [`JOB_HISTORY_MAX`] finished jobs, oldest dropped first.
pub(super) fn trim_history(metadata: &mut PoolMetadata) {
    let finished = metadata.jobs.iter().filter(|job| !job.is_active()).count();
    let mut excess = finished.saturating_sub(JOB_HISTORY_MAX);
    metadata.jobs.retain(|job| {
        if excess > 0 && !job.is_active() {
            excess -= 1;
            false
        } else {
            true
        }
    });
}

impl Pool {
    /// A move's rows are all copied: commit the extent pointing at its
    /// target (a resync's target is the slab itself) and drop the old
    /// location, the disks flushed first. Moves that finish while a commit
    /// is under way are named together in the next one: every commit
    /// writes the whole metadata to every disk and flushes them, and in a
    /// large pool (megabytes of metadata) a commit per move would take the
    /// disks' time from the moves themselves while they queue for the
    /// lock.
    async fn finish_move(&self, job_id: u64, index: usize) {
        let runtime = &self.shared.job_runtime;
        let (sender, named) = futures::channel::oneshot::channel();
        runtime
            .finishing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((job_id, index, sender));
        // Told once a commit that took it ends (or gave up on it: the move
        // is then tried again, as it is still not done), without waiting
        // for the lock, which the move that commits may take again and
        // again. A commit tells its moves before it lets the lock go, so
        // whoever gets the lock has its own move still waiting.
        let finisher = std::pin::pin!(runtime.finisher.lock());
        let _finisher = match futures::future::select(named, finisher).await {
            futures::future::Either::Left(_) => return,
            futures::future::Either::Right((guard, _)) => guard,
        };
        let batch =
            std::mem::take(&mut *runtime.finishing.lock().unwrap_or_else(|e| e.into_inner()));
        let moves: Vec<(u64, usize)> = batch.iter().map(|(job, index, _)| (*job, *index)).collect();
        self.finish_moves(&moves).await;
        // The others are told once their moves are committed (or the commit
        // gave up), not before: told earlier, a worker would take its move
        // up again as still pending.
        drop(batch);
    }

    /// Name the targets of `moves` (job, move) in one commit, after their
    /// rows reach the media.
    async fn finish_moves(&self, moves: &[(u64, usize)]) {
        // The targets' rows reach the media before the metadata names them.
        if self.shared.flush_disks().await.is_err() {
            return;
        }
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let mut settled = Vec::new();
        let mut completed = Vec::new();
        for &(job_id, index) in moves {
            // Looked at under the lock: a job cancelled (or paused) since
            // its last row was copied has had its targets dropped, and
            // writes since then left the target out.
            let Some(position) = next
                .jobs
                .iter()
                .position(|job| job.id == job_id && job.state == JobState::Running)
            else {
                continue;
            };
            let step = next.jobs[position].moves[index].clone();
            if step.done {
                continue;
            }
            let kind = next.jobs[position].kind;
            if let Some(space) = next.spaces.iter_mut().find(|space| space.id == step.space) {
                if let Some(slabs) = space.extents[step.extent as usize].slabs.as_mut() {
                    slabs[usize::from(step.slot)] = step.target;
                }
            }
            {
                // Bytes done counted afresh from the record, not added to: a
                // progress commit may already have counted this move's rows.
                let mut job = next.jobs[position].clone();
                job.moves[index].done = true;
                job.bytes_done = recorded_bytes_done(&next, &job);
                next.jobs[position] = job;
            }
            if next.jobs[position].moves.iter().all(|m| m.done) {
                self.complete_job(&mut next, position);
                completed.push(kind);
            }
            settled.push((kind, step));
        }
        if settled.is_empty() || self.shared.commit(&mut control, next).await.is_err() {
            return;
        }
        // Under the lock: the old slabs are free in the metadata now, and
        // are retired from allocations as the map stops naming them.
        for (kind, step) in &settled {
            self.settle_move(&control, *kind, step);
        }
        drop(control);
        for kind in completed {
            self.after_job(kind).await;
        }
    }

    /// Point the run-time slot at its new home alone. Only under the
    /// control lock (`_held`), after the commit that frees the old slab
    /// (see [`Pool::uninstall_job`]).
    fn settle_move(
        &self,
        _held: &crate::control::Control,
        kind: JobKind,
        step: &terrace_meta::MoveRecord,
    ) {
        let key = (step.space, step.extent, step.slot);
        self.shared.job_runtime.forget(&key);
        let Some(space) = self.space_by_id(step.space) else {
            return;
        };
        space.update_extent(u64::from(step.extent), |targets| {
            let target = &mut targets[usize::from(step.slot)];
            let keep = match kind {
                JobKind::Resync { .. } => target.locations[0].clone(),
                _ => target
                    .locations
                    .last()
                    .cloned()
                    .unwrap_or_else(|| target.locations[0].clone()),
            };
            *target = Target {
                locations: vec![Location {
                    valid_below: None,
                    ..keep
                }],
            };
        });
    }

    /// Metadata changes when a job's last move is done.
    pub(super) fn complete_job(&self, next: &mut PoolMetadata, position: usize) {
        let kind = next.jobs[position].kind;
        {
            let job = &mut next.jobs[position];
            job.state = JobState::Done;
            job.finished_ns = self.shared.env.wall_clock_ns();
            job.bytes_done = job.bytes_total;
        }
        match kind {
            JobKind::LogsToJournal | JobKind::Scrub => {}
            // Its slots are elsewhere now: what it missed is nobody's to
            // catch up on.
            JobKind::Repair { disk } => forget_missed_off(next, disk),
            JobKind::Evacuate { disk } | JobKind::Replace { old: disk, .. } => {
                let record = &mut next.disks[usize::from(disk.0)];
                record.state = DiskState::Removed;
                record.state_reason = "emptied and released".into();
                next.dirty.retain(|dirty| dirty.disk != disk);
            }
            JobKind::Resync { disk } => {
                let record = &mut next.disks[usize::from(disk.0)];
                record.state = DiskState::Active;
                record.state_reason.clear();
                next.dirty.retain(|dirty| dirty.disk != disk);
            }
        }
        trim_history(next);
    }

    /// Run-time changes when a job finished.
    pub(super) async fn after_job(&self, kind: JobKind) {
        match kind {
            JobKind::Evacuate { disk } | JobKind::Replace { old: disk, .. } => {
                let disks = self.shared.disks();
                let released = &disks[usize::from(disk.0)];
                // Out of service before its label goes, so the probe never
                // takes the erased label for an overwritten disk.
                released.set_condition(Condition::Standby, "removed from the pool");
                if let Some(device) = released.device() {
                    let _ = terrace_meta::store::erase_label(device.inner().as_ref()).await;
                }
                // Released: the device is closed (a block device's claim
                // goes with it), so it may be pulled, or given to a pool
                // again, this one too, as a new disk.
                released.detach();
            }
            JobKind::Resync { disk } => {
                self.shared.forget_dirty(disk);
                let disks = self.shared.disks();
                disks[usize::from(disk.0)].set_condition(Condition::Online, "");
            }
            JobKind::Repair { .. } | JobKind::LogsToJournal | JobKind::Scrub => {}
        }
    }

    pub(super) async fn fail_job(&self, job_id: u64, reason: String) {
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let Some(job) = next.jobs.iter_mut().find(|job| job.id == job_id) else {
            return;
        };
        if matches!(
            job.state,
            JobState::Done | JobState::Cancelled | JobState::Failed
        ) {
            // It ended while the work that failed was under way (a move
            // whose destination failed after the job was cancelled or
            // done): its end stands.
            return;
        }
        // Its progress as it was when it failed, not as last persisted.
        self.save_watermarks(job);
        job.state = JobState::Failed;
        job.reason = reason;
        job.finished_ns = self.shared.env.wall_clock_ns();
        let failed = job.clone();
        let position = next.jobs.iter().position(|job| job.id == job_id);
        // A scrub's bytes are its own; a move job's are its moves'.
        if let Some(position) = position.filter(|_| failed.kind != JobKind::Scrub) {
            next.jobs[position].bytes_done = recorded_bytes_done(&next, &failed);
        }
        trim_history(&mut next);
        if self.shared.commit(&mut control, next).await.is_ok() {
            // Under the lock, as its targets are free once committed.
            self.uninstall_job(&control, &failed);
        }
    }

    /// Give a move a new target after its destination failed.
    async fn retarget(&self, job_id: u64, index: usize) -> Result<(), EngineError> {
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let position = next
            .jobs
            .iter()
            .position(|job| job.id == job_id)
            .ok_or(EngineError::NoSuchJob { id: job_id })?;
        let old = next.jobs[position].clone();
        if matches!(old.kind, JobKind::Resync { .. }) {
            return Err(EngineError::JobNotActive {
                id: job_id,
                state: "the returning disk failed again".into(),
            });
        }
        if index >= old.moves.len() {
            // Its moves were let go meanwhile (the job ended).
            return Err(EngineError::JobNotActive {
                id: job_id,
                state: format!("{:?}", old.state).to_lowercase(),
            });
        }
        let target = super::plan::retarget(&next, &old, index, &self.shared.reserved_slabs())?;
        let step = &mut next.jobs[position].moves[index];
        step.target = target;
        step.watermark_rows = 0;
        let fresh = next.jobs[position].clone();
        self.shared.commit(&mut control, next).await?;
        // Under the lock, as the old target is free once committed.
        let mut only = old.clone();
        only.moves = vec![old.moves[index].clone()];
        self.uninstall_job(&control, &only);
        let mut install = fresh;
        install.moves = vec![install.moves[index].clone()];
        self.install_job(&install);
        Ok(())
    }

    /// Resume a job paused by `job_action` (kept here beside the runner that
    /// picks it up again).
    pub async fn resume_job(&self, id: u64) -> Result<(), EngineError> {
        self.job_action(id, JobAction::Resume).await
    }
}

/// What decides whether a repair can be placed: which disks may take slabs
/// (their states, usages, sizes and fault domains), how many slabs are
/// taken, and which jobs are active.
fn placement_key(metadata: &PoolMetadata) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for disk in &metadata.disks {
        format!("{:?}/{:?}", disk.state, disk.usage).hash(&mut hasher);
        (disk.slab_count, &disk.enclosure, &disk.node).hash(&mut hasher);
    }
    metadata.used_slabs().len().hash(&mut hasher);
    for job in metadata.jobs.iter().filter(|job| job.is_active()) {
        job.id.hash(&mut hasher);
    }
    hasher.finish()
}

/// Bytes a job record accounts for: whole slabs of its done moves, and the
/// rows below the recorded watermark of the others.
fn recorded_bytes_done(metadata: &PoolMetadata, job: &JobRecord) -> u64 {
    super::moves_bytes(metadata, job, |step| step.watermark_rows).min(job.bytes_total)
}

/// Drop what `disk` is recorded to have missed where it holds nothing any
/// more (its slots re-created elsewhere); an extent a repair could not
/// re-create (lost beyond its tolerance) keeps its slot there, and its
/// record, for the disk's return.
fn forget_missed_off(metadata: &mut PoolMetadata, disk: DiskIndex) {
    let holds = |space: terrace_meta::SpaceId, extent: u32| {
        metadata
            .space_by_id(space)
            .and_then(|space| space.extents.get(extent as usize))
            .and_then(|record| record.slabs.as_ref())
            .is_some_and(|slabs| slabs.iter().any(|slab| slab.disk == disk))
    };
    let mut dirty = metadata.dirty.clone();
    for record in dirty.iter_mut().filter(|record| record.disk == disk) {
        record
            .extents
            .retain(|&(space, extent)| holds(space, extent));
    }
    dirty.retain(|record| !record.extents.is_empty());
    metadata.dirty = dirty;
}
