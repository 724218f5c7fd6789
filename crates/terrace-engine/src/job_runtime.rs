//! Run-time state of the jobs that the pool's shared state holds: the
//! watermarks the data path reads while a move runs, the pool-wide rate
//! limit, when each job last committed its watermarks, and progress for
//! rates. Kept apart from the job runner (`jobs`) so that the shared state
//! below it imports nothing above.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use terrace_meta::SpaceId;

/// Run-time state of the jobs: the watermarks the data path reads, and the
/// progress figures for rates.
#[derive(Default)]
pub(crate) struct JobRuntime {
    marks: Mutex<HashMap<MoveKey, Arc<AtomicU64>>>,
    progress: Mutex<HashMap<u64, Progress>>,
    /// When the next byte may be moved under the pool's rate limit: shared
    /// by every move, so the limit holds however many run at once.
    next_allowed_ns: Mutex<u64>,
    /// When each job last committed its watermarks: one commit per job and
    /// interval, however many of its moves run (each commit flushes every
    /// disk, and a flush waits for the drives' write caches).
    persisted_ns: Mutex<HashMap<u64, u64>>,
    /// Moves whose rows are all copied, waiting to be named in the next
    /// commit (see `Pool::finish_move`), each with who waits for it.
    pub(crate) finishing: Mutex<Vec<(u64, usize, futures::channel::oneshot::Sender<()>)>>,
    /// Held by the move that commits the waiting ones (one commit at a time
    /// takes every move that finished meanwhile).
    pub(crate) finisher: futures::lock::Mutex<()>,
    /// Where each running scrub stands, ahead of its record: copied into
    /// the record when it is paused, cancelled or commits its progress.
    scrubs: Mutex<HashMap<u64, ScrubMark>>,
}

/// A scrub's progress: its cursor (the walk's position, see
/// `jobs/scrub.rs`), the bytes read from disks below it, and the rows it
/// repaired, could not repair, and could not check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ScrubMark {
    pub(crate) cursor: u64,
    pub(crate) bytes_done: u64,
    pub(crate) repaired: u64,
    pub(crate) unrepaired: u64,
    /// Rows that could not be checked (a needed disk offline), in this
    /// process only: the record keeps no count of them.
    pub(crate) skipped: u64,
    /// The scrub's own pace in bytes read a second (0: the pool's repair
    /// rate), as `pool scrub --rate` asked.
    pub(crate) rate: u64,
}

/// One move: (space, extent, slot).
pub(crate) type MoveKey = (SpaceId, u32, u16);

#[derive(Clone, Copy)]
struct Progress {
    started_ns: u64,
    bytes_at_start: u64,
    bytes_now: u64,
    /// When `bytes_now` was last noted: a job that stopped running is
    /// timed to here, not to the moment it is asked about.
    noted_ns: u64,
}

impl JobRuntime {
    pub(crate) fn mark(&self, key: MoveKey, initial: u64) -> Arc<AtomicU64> {
        self.marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert_with(|| Arc::new(AtomicU64::new(initial)))
            .clone()
    }

    pub(crate) fn forget(&self, key: &MoveKey) {
        self.marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    pub(crate) fn watermark(&self, key: &MoveKey) -> Option<u64> {
        self.marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|mark| mark.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Reserve `bytes` under `rate` (bytes/s) starting no earlier than
    /// `now_ns`; returns when the reservation starts.
    pub(crate) fn reserve(&self, bytes: u64, rate: u64, now_ns: u64) -> u64 {
        let mut next = self
            .next_allowed_ns
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let start = (*next).max(now_ns);
        *next = start + bytes.saturating_mul(1_000_000_000) / rate.max(1);
        start
    }

    /// Whether `job`'s watermarks are due for a commit (at most one per
    /// `interval_ns`); if so, the caller commits them and the clock
    /// restarts.
    pub(crate) fn persist_due(&self, job: u64, now_ns: u64, interval_ns: u64) -> bool {
        let mut persisted = self.persisted_ns.lock().unwrap_or_else(|e| e.into_inner());
        let last = persisted.entry(job).or_insert(now_ns);
        if now_ns.saturating_sub(*last) < interval_ns {
            return false;
        }
        *last = now_ns;
        true
    }

    pub(crate) fn note_bytes(&self, job: u64, now_ns: u64, bytes_now: u64) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let entry = progress.entry(job).or_insert(Progress {
            started_ns: now_ns,
            bytes_at_start: bytes_now,
            bytes_now,
            noted_ns: now_ns,
        });
        entry.bytes_now = bytes_now;
        entry.noted_ns = now_ns;
    }

    /// A paused job runs again: the time it stood still is not its
    /// running time, so its rate's start moves forward by as much (a 2M/s
    /// repair paused for as long as it had run showed 1M/s on resuming).
    pub(crate) fn resumed(&self, job: u64, now_ns: u64) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = progress.get_mut(&job) {
            p.started_ns += now_ns.saturating_sub(p.noted_ns);
            p.noted_ns = now_ns;
        }
    }

    /// Bytes per second while the job ran in this process (paused spans
    /// left out, see [`JobRuntime::resumed`]): until now while it runs,
    /// until its last progress once it stopped (a finished repair kept its
    /// rate instead of decaying as time passed).
    pub(crate) fn rate(&self, job: u64, now_ns: u64, running: bool) -> u64 {
        let progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.get(&job).map_or(0, |p| {
            let end = if running { now_ns } else { p.noted_ns };
            let seconds = (end.saturating_sub(p.started_ns) as f64 / 1e9).max(1e-3);
            (p.bytes_now.saturating_sub(p.bytes_at_start) as f64 / seconds) as u64
        })
    }

    /// A scrub's progress as its runner last told it.
    pub(crate) fn scrub(&self, job: u64) -> Option<ScrubMark> {
        let scrubs = self.scrubs.lock().unwrap_or_else(|e| e.into_inner());
        scrubs.get(&job).copied()
    }

    /// Tell a scrub's progress (its first telling may come from the start
    /// of the job, with its rate only).
    pub(crate) fn note_scrub(&self, job: u64, mark: ScrubMark) {
        let mut scrubs = self.scrubs.lock().unwrap_or_else(|e| e.into_inner());
        scrubs.insert(job, mark);
    }

    pub(crate) fn forget_scrub(&self, job: u64) {
        let mut scrubs = self.scrubs.lock().unwrap_or_else(|e| e.into_inner());
        scrubs.remove(&job);
    }
}
