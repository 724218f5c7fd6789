//! The write-back cache: a log (ring of records in a hidden mirrored space)
//! in front of a space.
//!
//! ```text
//!   write ──▶ small or partial-row? ──yes──▶ append record (log mirror) ──▶ index ──▶ group flush ──▶ ack
//!                 │ no (whole rows, nothing logged under it)          ▲ in sequence order
//!                 ▼                                                   │
//!             straight to the disks ──▶ Invalidate record if needed ──┘
//!
//!   read ──▶ snapshot index entries ──▶ read the disks ──▶ overlay the snapshot
//!
//!   destage (background, or a writer that finds the ring full):
//!     oldest records' live blocks, sorted and coalesced ──▶ disks ──▶ flush
//!     ──▶ drop index entries ──▶ commit the new tail (checkpoint) ──▶ ring space reusable
//! ```
//!
//! # What makes it safe
//!
//! * A write is acknowledged only when its record and every earlier record
//!   are durable in the log: records are written to every copy of the log
//!   mirror, then one writer at a time flushes the log's disks for all
//!   records written so far (group commit) while the others wait. Recovery
//!   scans records in order from the committed tail and stops at the first
//!   that is not valid (checksums, epoch, position, sequence), so nothing
//!   acknowledged lies beyond that point.
//! * The ring is reused only behind the committed tail, and the tail moves
//!   only over records whose blocks were written home and flushed.
//! * A write that goes straight home over blocks some record since the
//!   committed tail still mentions appends an `Invalidate` record for them
//!   before it is acknowledged, so recovery never replays older data over
//!   it. A write over blocks still dirty in the log always goes through the
//!   log, so the log and the disks never race for a block.
//! * Recovery replays every record from the tail into a block map, writes
//!   the map home, flushes, and starts a fresh ring with a new epoch, so
//!   records of an earlier life of the ring can never pass for new ones.
//! * If the log itself fails (no copy of a record could be written), the
//!   dirty data still held in memory is written home and flushed, and the
//!   space continues write-through with the reason in its status. Writes
//!   caught in flight go home too, never failing for the log: a record
//!   whose write failed, and a write still waiting for a record (for a
//!   writer, for room in the ring), is written straight home with FUA
//!   once what the log holds of its blocks is home, so older logged data
//!   never lands over it. There, as in any write-through space, the write
//!   intent names what is being written for the resync after a crash.
//!
//! Dirty data is also kept in memory, so reads from the log and destaging
//! need not read the log back, as long as the pool's log memory has room
//! (see [`LOG_MEMORY_DEFAULT_BYTES`]): a record logged beyond it keeps only
//! where its blocks lie in the log, and what needs them reads them back.
//! Recovery reads the log back too, a bounded amount at a time.
//!
//! # Parts
//!
//! * `home`: [`HomeIo`], all the journal knows of the volume it fronts and
//!   of its log, and [`Checkpoints`], where its tail is committed.
//! * `format`: the records' bytes.
//! * `record`: a record's phases and their legal transitions.
//! * `ring`: where the next record goes (pure).
//! * `invariants`: the state's invariants, checked after every transition.
//! * `pick`: what a destage round takes home (pure).
//! * `batch`, `gather`: small writes sharing records; streams gathered
//!   into whole rows.
//! * `recovery`: the scan at import, replay, read-back from the log.
//! * here: the state and index, appending and group commit, direct writes
//!   and their leases, destage rounds, failover to write-through.
//!
//! Design page: `docs/design/journal.md`. Depends on: `error`, `payload`,
//! `row_lock`, and the io, layout and meta crates; never on the space, the
//! pool or its control.

mod batch;
pub mod format;
mod gather;
mod home;
mod invariants;
mod pick;
mod record;
mod recovery;
mod ring;

pub use home::{Checkpoints, HomeIo};

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::channel::oneshot;
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use terrace_io::{aligned_buffer, aligned_concat, Bytes};
use terrace_layout::{Layout, BLOCK_BYTES};
use terrace_meta::SpaceId;

use crate::error::EngineError;
use crate::payload::Payload;
use format::{Header, Kind, ENTRIES_MAX, HEADER_BYTES};
use record::{Cursor, Record};
use ring::{try_reserve, Reservation};

pub(crate) use recovery::{block_runs, load_read_only, replay, scan};
use recovery::{read_unheld, READ_BACK_ROUND_BYTES};

/// Smallest and largest cache (ring) size an admin may set (the daemon
/// enforces these).
pub const CACHE_MIN_BYTES: u64 = 32 << 20;
/// Smallest ring the engine itself accepts: simulations and tests use tiny
/// rings so that wrapping and a full log happen within a few writes.
pub const CACHE_ENGINE_MIN_BYTES: u64 = 256 << 10;
pub const CACHE_MAX_BYTES: u64 = 100 << 30;
/// Bytes of log records the write-back logs of one pool keep in memory
/// unless the pool is told otherwise ([`crate::Pool::set_log_memory`]; the
/// daemon sets a quarter of the machine's memory). A cache may be larger
/// than the memory of its machine: what does not fit is read back from the
/// log's disks (SSDs, normally) when read or destaged.
pub const LOG_MEMORY_DEFAULT_BYTES: u64 = 4 << 30;
/// Cache size of a space when the pool has journal disks (as Storage Spaces).
pub const CACHE_DEFAULT_BYTES: u64 = 1 << 30;
/// Log of a parity space in a pool without journal disks: enough that no
/// parity space has a write hole.
pub const CACHE_SMALL_BYTES: u64 = 32 << 20;
/// Destaging starts when this share of the ring is dirty (per mille) and
/// runs flat out from [`DESTAGE_URGENT_PER_MILLE`]. Below it, dirty data
/// waits in the log while writes keep arriving: destaging then would take
/// the capacity disks from the client's reads while the log has room, and
/// data that waits is more often overwritten or joined into whole rows.
pub const DESTAGE_START_PER_MILLE: u64 = 250;
/// Below the start threshold, a log destages once no write has been
/// absorbed for this long: a quiet space empties its log soon after its
/// writers stop, and a busy one is not interrupted between two writes.
pub const DESTAGE_QUIET_NS: u64 = 500_000_000;
pub const DESTAGE_URGENT_PER_MILLE: u64 = 750;
/// How far past a direct write of whole rows its dirty-range record
/// reaches. The rows after it are likely the stream's next writes, and
/// they reuse the record while it is in use instead of logging their own,
/// so a stream pays one log commit per this many bytes, not one per row;
/// a crash costs the resync of at most this much more.
const DIRECT_AHEAD_BYTES: u64 = 16 << 20;
/// Recent dirty-range records a direct write looks through for one to reuse.
const LEASES_MAX: usize = 16;
/// How long after it was logged a dirty-range record may be reused. While
/// writes keep one pinned, destaging cannot pass it; without a bound, a
/// region rewritten without pause would hold every later record in the
/// log. A stream crosses 16 MiB in far less.
const LEASE_NS: u64 = 1_000_000_000;
/// Bytes of records one destage round takes.
const DESTAGE_ROUND_BYTES: u64 = 16 << 20;
/// Writes home in flight at once during a destage round that runs flat
/// out: past the urgent threshold, with writers waiting for room, once
/// writers are quiet, and when draining.
const DESTAGE_PARALLEL: usize = 32;
/// A parity row holding this many separate dirty runs or more in a destage
/// round is destaged as one update: the row read from its first run to the
/// end of its last, the runs laid over it, written once. On HDDs that is a
/// read and a write on each column it spans, where a read-modify-write per
/// run costs two reads and two writes each, all of them on the parity
/// column; from four runs on, the merged update does less.
const MERGE_RUNS_MIN: usize = 4;
/// Rows a destage round takes whole once writers are quiet, with every
/// durable dirty block in them, even from records newer than the round's
/// (the first rows its records touch that hold [`MERGE_RUNS_MIN`] runs or
/// more). With random writes a log holds many blocks of each row, and one
/// update takes them all home where a read-modify-write each would not;
/// later rounds then find much of their work done. Bounded, so that a
/// round stays short should writes come back. Not while writes come:
/// then the rows' reads and writes take the disks from the client's reads
/// (measured: cached single parity under the paper's method lost a third
/// to a half of its random-profile IO/s from 128 outstanding I/Os on).
const DENSE_ROWS_ROUND: usize = 256;
/// Writes home in flight at the start threshold while writers are active.
/// Between the thresholds the count rises in proportion to the fill: a log
/// with room takes little of the capacity disks from the client's reads,
/// and one filling up destages harder.
const DESTAGE_PARALLEL_START: usize = 4;

/// Blocks to destage: block → (sequence of the record holding its newest
/// data, that data).
type Work = BTreeMap<u64, (u64, Block)>;

/// The bytes of one block within a larger buffer: a log record's, or a run
/// read back from the log. Blocks next to each other in one buffer go home
/// as one view of it (see [`coalesce`]).
#[derive(Clone)]
struct Block {
    buffer: Bytes,
    from: usize,
}

impl Block {
    fn bytes(&self) -> Bytes {
        self.buffer
            .slice(self.from..self.from + BLOCK_BYTES as usize)
    }

    /// Whether `next` lies right after this block in the same buffer.
    fn followed_by(&self, next: &Block) -> bool {
        // The whole buffers are kept, so one start and length is one
        // allocation: two live allocations cannot start at one address.
        self.buffer.as_ptr() == next.buffer.as_ptr()
            && self.buffer.len() == next.buffer.len()
            && self.from + BLOCK_BYTES as usize == next.from
    }
}

/// Where a block's newest logged data lies (its byte offset in the log
/// space), and the data itself unless its record was logged beyond the
/// pool's log memory.
#[derive(Clone)]
struct Held {
    at: u64,
    data: Option<Block>,
}

/// Blocks a destage round took, before what only the log holds is read back.
type Picked = BTreeMap<u64, (u64, Held)>;

/// The newest logged data of one block.
struct Entry {
    /// Highest sequence reserved for this block (a write in flight).
    reserved: u64,
    /// Sequence of the newest durable data, and where it is.
    committed: Option<(u64, Held)>,
}

struct State {
    /// Ring kept free for row images (parity homes): other records leave
    /// this much room, the larger of its (at most two) pieces at least
    /// half of it, so destaging a degraded row can log first.
    image_reserve_per_mille: u64,
    /// Size of the current lap, and of laps to come (a resize).
    lap_bytes: u64,
    next_lap_bytes: u64,
    head: Cursor,
    next_sequence: u64,
    /// The committed tail: ring space before it is reusable.
    tail: Cursor,
    records: VecDeque<Record>,
    index: BTreeMap<u64, Entry>,
    /// Blocks named by any record in `records`, with counts.
    recent: BTreeMap<u64, u32>,
    /// Every record with a smaller sequence is durable.
    durable_below: u64,
    durable_waiters: Vec<(u64, oneshot::Sender<()>)>,
    /// A group commit (flush of the log's disks) is running; who waits for
    /// it to end.
    syncing: bool,
    sync_waiters: Vec<oneshot::Sender<()>>,
    space_waiters: Vec<oneshot::Sender<()>>,
    /// Recent dirty-range records: range start, end, sequence, when logged.
    leases: VecDeque<Lease>,
    dirty_bytes: u64,
    /// Why the space runs write-through, if it does.
    failed: Option<String>,
    /// Client writes waiting to share a record (see [`batch`]).
    batches: batch::Batches,
    /// A direct write is logging the next lease ahead of its stream.
    renewing: bool,
    /// Invariant checks run so far, and when the next full one runs in a
    /// release build (see [`State::assert_invariants`]).
    checks: u64,
    next_full_check: u64,
}

impl State {
    /// The record with `sequence`, if it is still listed. Records are listed
    /// in sequence order without gaps (they are pushed as their sequences
    /// are handed out and leave only from the front), so this is an index,
    /// not a search: a ring holds tens of thousands of records.
    fn record_mut(&mut self, sequence: u64) -> Option<&mut Record> {
        let first = self.records.front()?.sequence;
        let index = usize::try_from(sequence.checked_sub(first)?).ok()?;
        self.records.get_mut(index)
    }

    /// Bytes of the pool's log memory the listed records hold.
    fn charged(&self) -> u64 {
        self.records.iter().map(|record| record.charged).sum()
    }

    /// Records from `sequence` on, in order.
    fn records_from(&mut self, sequence: u64) -> impl Iterator<Item = &mut Record> {
        let first = self.records.front().map_or(sequence, |r| r.sequence);
        let skip = usize::try_from(sequence.saturating_sub(first)).unwrap_or(usize::MAX);
        self.records.iter_mut().skip(skip)
    }
}

/// Counters for status views.
#[derive(Debug, Default)]
pub struct Counters {
    pub absorbed_writes: AtomicU64,
    pub absorbed_bytes: AtomicU64,
    pub bypassed_writes: AtomicU64,
    pub bypassed_bytes: AtomicU64,
    pub destaged_bytes: AtomicU64,
    pub log_bytes_written: AtomicU64,
    /// Direct writes that waited for their dirty-range record to be logged.
    pub dirty_range_waits: AtomicU64,
    /// Rows destaged as one merged update (see [`MERGE_RUNS_MIN`]).
    pub rows_merged: AtomicU64,
    /// Rate of the last destage round (bytes per second) and when it ended.
    pub destage_rate: AtomicU64,
    pub destage_ended_ns: AtomicU64,
    /// When the log last took in a write (see [`DESTAGE_QUIET_NS`]).
    pub absorbed_last_ns: AtomicU64,
}

/// What a status view shows of a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStatus {
    pub bytes: u64,
    pub log_space: SpaceId,
    pub dirty_bytes: u64,
    /// Bytes of log records whose data is held in memory (the rest is read
    /// back from the log when needed).
    pub memory_bytes: u64,
    /// Bytes of ring between the committed tail and the head.
    pub used_bytes: u64,
    pub absorbed_writes: u64,
    pub absorbed_bytes: u64,
    pub bypassed_writes: u64,
    pub bypassed_bytes: u64,
    pub destaged_bytes: u64,
    /// Bytes per second destaging now (0 when idle for 2 s).
    pub destage_rate: u64,
    pub write_through: Option<String>,
}

pub struct Journal<H: HomeIo> {
    home: SpaceId,
    log: Arc<H>,
    /// Where the committed tail goes (the pool's metadata).
    checkpoints: Arc<dyn Checkpoints>,
    epoch: u64,
    state: Mutex<State>,
    /// One destage round at a time.
    destaging: futures::lock::Mutex<()>,
    /// Serialises read-merge-write of partial blocks.
    edges: crate::row_lock::RowLocks,
    /// Partial-row writes of sequential streams waiting for their rows.
    gathers: Mutex<gather::Gathers>,
    /// Whether streams are gathered (see [`gather`]); on unless turned off.
    gathering: std::sync::atomic::AtomicBool,
    pub counters: Counters,
}

impl<H: HomeIo> Journal<H> {
    /// A fresh, empty ring of `bytes` in `log` with `epoch`.
    pub(crate) fn new(
        home: SpaceId,
        log: Arc<H>,
        checkpoints: Arc<dyn Checkpoints>,
        bytes: u64,
        epoch: u64,
        parity: bool,
    ) -> Journal<H> {
        let start = Cursor {
            position: 0,
            offset: 0,
            lap: 0,
        };
        let bytes = bytes.min(log.size_bytes()) / BLOCK_BYTES * BLOCK_BYTES;
        Journal {
            home,
            log,
            checkpoints,
            epoch,
            state: Mutex::new(State {
                image_reserve_per_mille: if parity { 250 } else { 0 },
                lap_bytes: bytes,
                next_lap_bytes: bytes,
                head: start,
                next_sequence: 1,
                tail: start,
                records: VecDeque::new(),
                index: BTreeMap::new(),
                recent: BTreeMap::new(),
                durable_below: 1,
                durable_waiters: Vec::new(),
                syncing: false,
                sync_waiters: Vec::new(),
                space_waiters: Vec::new(),
                leases: VecDeque::new(),
                dirty_bytes: 0,
                failed: None,
                batches: batch::Batches::default(),
                renewing: false,
                checks: 0,
                next_full_check: 0,
            }),
            destaging: futures::lock::Mutex::new(()),
            edges: Default::default(),
            gathers: Mutex::default(),
            gathering: std::sync::atomic::AtomicBool::new(true),
            counters: Counters::default(),
        }
    }

    /// Whether the log has failed and writes go straight to the disks.
    pub(crate) fn is_write_through(&self) -> bool {
        self.state().failed.is_some()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn log(&self) -> &Arc<H> {
        &self.log
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The largest record payload: a quarter of the ring, at most 8 MiB,
    /// and no more blocks than a header can name.
    fn record_payload_max(&self) -> u64 {
        let state = self.state();
        (state.lap_bytes.min(state.next_lap_bytes) / 4)
            .min(8 << 20)
            .min(ENTRIES_MAX as u64 * BLOCK_BYTES)
            / BLOCK_BYTES
            * BLOCK_BYTES
    }

    pub fn status(&self) -> CacheStatus {
        let state = self.state();
        let used = state.head.position - state.tail.position;
        CacheStatus {
            bytes: state.next_lap_bytes,
            log_space: self.log.id(),
            dirty_bytes: state.dirty_bytes,
            memory_bytes: state.charged(),
            used_bytes: used,
            absorbed_writes: self.counters.absorbed_writes.load(Ordering::Relaxed),
            absorbed_bytes: self.counters.absorbed_bytes.load(Ordering::Relaxed),
            bypassed_writes: self.counters.bypassed_writes.load(Ordering::Relaxed),
            bypassed_bytes: self.counters.bypassed_bytes.load(Ordering::Relaxed),
            destaged_bytes: self.counters.destaged_bytes.load(Ordering::Relaxed),
            destage_rate: {
                let ended = self.counters.destage_ended_ns.load(Ordering::Relaxed);
                let idle = self.log.env().now_ns().saturating_sub(ended) > 2_000_000_000;
                if idle {
                    0
                } else {
                    self.counters.destage_rate.load(Ordering::Relaxed)
                }
            },
            write_through: state.failed.clone(),
        }
    }

    /// Change the ring size; laps that start from now on have the new size.
    pub(crate) fn set_size(&self, bytes: u64) {
        let bytes = bytes.min(self.log.size_bytes()) / BLOCK_BYTES * BLOCK_BYTES;
        self.state().next_lap_bytes = bytes;
    }

    /// Bytes of its log space the ring may still use, when it needs less
    /// than the log holds for good: after a shrink, once the ring has
    /// wrapped into the smaller lap and the committed tail has followed it
    /// there, nothing before a crash or after it reads past this.
    pub(crate) fn log_bytes_in_use(&self) -> Option<u64> {
        let state = self.state();
        (state.tail.lap == state.head.lap).then(|| state.lap_bytes.max(state.next_lap_bytes))
    }

    /// Whether no write has been absorbed for [`DESTAGE_QUIET_NS`].
    fn is_quiet(&self) -> bool {
        self.log
            .env()
            .now_ns()
            .saturating_sub(self.counters.absorbed_last_ns.load(Ordering::Relaxed))
            >= DESTAGE_QUIET_NS
    }

    /// Whether the ring holds any dirty data.
    pub fn is_clean(&self) -> bool {
        self.state().index.is_empty()
    }

    /// How urgently destaging should run: `None` below the start threshold
    /// while writes keep arriving.
    fn destage_pressure(&self) -> Option<Pressure> {
        let quiet = self.is_quiet();
        let state = self.state();
        let size = state.lap_bytes.min(state.next_lap_bytes);
        let fill = (state.head.position - state.tail.position) * 1000 / size.max(1);
        let waiting = !state.space_waiters.is_empty();
        // Not `fill > 0`: a few blocks of a large ring are 0 per mille.
        let leftover = state.dirty_bytes > 0;
        (fill >= DESTAGE_START_PER_MILLE || waiting || (leftover && quiet)).then_some(Pressure {
            fill,
            flat_out: quiet || waiting,
        })
    }

    /// The newest logged data of the blocks of `[offset, offset + length)`
    /// (block-aligned), read back from the log where only the log holds it.
    /// Take it *before* reading home: a block destaged in between is on the
    /// disks by then. Lay it over the home data with [`Journal::apply`].
    pub(crate) async fn snapshot(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<(u64, Bytes)>, EngineError> {
        loop {
            let logged: Vec<(u64, u64, Held)> = {
                let state = self.state();
                if state.index.is_empty() {
                    return Ok(Vec::new());
                }
                let first = offset / BLOCK_BYTES;
                let end = (offset + length).div_ceil(BLOCK_BYTES);
                state
                    .index
                    .range(first..end)
                    .filter_map(|(&block, entry)| {
                        let (sequence, held) = entry.committed.as_ref()?;
                        Some((block, *sequence, held.clone()))
                    })
                    .collect()
            };
            let oldest = logged
                .iter()
                .filter(|(_, _, held)| held.data.is_none())
                .map(|(_, sequence, _)| *sequence)
                .min();
            let held = logged.iter().map(|(block, _, held)| (*block, held));
            let mut read = read_unheld(&*self.log, held).await?;
            // Read back from ring the tail has passed since (the blocks
            // went home), it may hold a newer record: look again.
            if oldest.is_none_or(|sequence| self.still_logged(sequence)) {
                return Ok(logged
                    .into_iter()
                    .filter_map(|(block, _, held)| {
                        let data = held.data.or_else(|| read.remove(&block))?;
                        Some((block, data.bytes()))
                    })
                    .collect());
            }
        }
    }

    /// Whether the ring still holds the record `sequence` as it was logged:
    /// the tail has not passed it (ring behind the tail is reused), or the
    /// log writes no more (write-through), or it is a recovered block of a
    /// read-only pool (sequence 0).
    fn still_logged(&self, sequence: u64) -> bool {
        let state = self.state();
        sequence == 0
            || state.failed.is_some()
            || state
                .records
                .front()
                .is_some_and(|r| r.sequence <= sequence)
    }

    pub(crate) fn apply(snapshot: &[(u64, Bytes)], offset: u64, buffer: &mut [u8]) {
        for (block, data) in snapshot {
            let at = (block * BLOCK_BYTES - offset) as usize;
            buffer[at..at + BLOCK_BYTES as usize].copy_from_slice(data);
        }
    }

    /// Whether any block of the range is dirty in the log or has a write to
    /// the log in flight.
    fn overlaps_index(state: &State, first: u64, end: u64) -> bool {
        state.index.range(first..end).next().is_some()
    }

    /// Write block-aligned `data` at `offset` of `home`.
    pub(crate) async fn write(
        &self,
        home: &H,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), EngineError> {
        debug_assert!(
            offset.is_multiple_of(BLOCK_BYTES) && (data.len() as u64).is_multiple_of(BLOCK_BYTES)
        );
        let length = data.len() as u64;
        if self.state().failed.is_some() {
            let (first, end) = (offset / BLOCK_BYTES, (offset + length) / BLOCK_BYTES);
            self.settle_blocks(home, first, end).await?;
            return home.write_home(offset, data, fua).await;
        }
        let natural = home.natural_write_bytes();
        let end = offset + length;
        let whole_rows = offset.is_multiple_of(natural) && end.is_multiple_of(natural);
        let gathered_under = {
            let mut gathers = self.gathers();
            if !whole_rows {
                gathers.note_end(end);
            }
            gathers.overlaps(offset, end, natural)
        };
        if natural <= BLOCK_BYTES || (!gathered_under && (whole_rows || !self.gathering())) {
            return self.write_rows_or_log(home, offset, data, fua).await;
        }
        let part =
            |from: u64, to: u64| data.slice((from - offset) as usize..(to - offset) as usize);
        if gathered_under {
            // Row by row, so that each row joins or waits for its gather.
            let parts = (offset / natural..end.div_ceil(natural)).map(|row| {
                let from = offset.max(row * natural);
                let to = end.min((row + 1) * natural);
                self.write_part(home, from, part(from, to), fua, from != offset)
            });
            return join_all(parts).await.into_iter().collect();
        }
        // A partial row at either end may be gathered; whole rows in
        // between go straight to the disks.
        let head_end = end.min((offset / natural + 1) * natural);
        let tail_start = (end / natural * natural).max(head_end);
        let head = self.write_part(home, offset, part(offset, head_end), fua, false);
        let middle = async {
            if tail_start > head_end {
                let rows = part(head_end, tail_start);
                self.write_rows_or_log(home, head_end, rows, fua).await
            } else {
                Ok(())
            }
        };
        let tail = async {
            if end > tail_start {
                let piece = part(tail_start, end);
                self.write_part(home, tail_start, piece, fua, true).await
            } else {
                Ok(())
            }
        };
        let (head, middle, tail) = futures::join!(head, middle, tail);
        head.and(middle).and(tail)
    }

    /// Turn gathering of streams into whole rows on or off. Off, every
    /// write that is not whole rows is logged, so it is durable when it is
    /// acknowledged; on, whole rows (sent whole, or gathered from a stream)
    /// go straight to the disks and are durable after a flush or with FUA.
    pub fn set_gathering(&self, on: bool) {
        self.gathering.store(on, Ordering::Relaxed);
    }

    pub fn gathering(&self) -> bool {
        self.gathering.load(Ordering::Relaxed)
    }

    fn gathers(&self) -> MutexGuard<'_, gather::Gathers> {
        self.gathers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write whole rows straight to the disks where nothing logged lies
    /// under them, anything else through the log.
    async fn write_rows_or_log(
        &self,
        home: &H,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), EngineError> {
        let length = data.len() as u64;
        let natural = home.natural_write_bytes();
        let whole_rows = offset.is_multiple_of(natural) && length.is_multiple_of(natural);
        if whole_rows && length > 0 {
            if let Some(invalidate) = self.direct_allowed(home, offset, length) {
                self.write_direct(home, offset, data, fua, invalidate)
                    .await?;
                self.counters
                    .bypassed_writes
                    .fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bypassed_bytes
                    .fetch_add(length, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.write_logged(home, offset, data).await
    }

    /// Whether `[offset, offset + length)` may go straight to the disks:
    /// the log works, holds nothing dirty there, and the rows are healthy.
    /// `Some(true)` if older records mention the range (the direct write
    /// must invalidate them).
    fn direct_allowed(&self, home: &H, offset: u64, length: u64) -> Option<bool> {
        let (first, end) = (offset / BLOCK_BYTES, (offset + length) / BLOCK_BYTES);
        let state = self.state();
        (state.failed.is_none()
            && !Self::overlaps_index(&state, first, end)
            && home.healthy_for(offset, length))
        .then(|| state.recent.range(first..end).next().is_some())
    }

    /// Whole rows straight to the disks, with a dirty-range record around
    /// the write and invalidation of older records after it.
    async fn write_direct(
        &self,
        home: &H,
        offset: u64,
        data: impl Into<Payload>,
        fua: bool,
        invalidate: bool,
    ) -> Result<(), EngineError> {
        let data = data.into();
        let length = data.len() as u64;
        let intent = self
            .begin_direct(home, offset, length, DIRECT_AHEAD_BYTES)
            .await?;
        let (written, ()) = futures::join!(
            home.write_home(offset, data, fua),
            self.renew_lease(home, offset + length)
        );
        self.end_direct(intent);
        written?;
        self.image_rows_gone_degraded(home, offset, length, &BTreeSet::new())
            .await?;
        if invalidate {
            self.invalidate(home, offset / BLOCK_BYTES, (offset + length) / BLOCK_BYTES)
                .await?;
        }
        Ok(())
    }

    /// Append block-aligned `data` to the log, a record at a time.
    async fn write_logged(&self, home: &H, offset: u64, data: Bytes) -> Result<(), EngineError> {
        let length = data.len() as u64;
        self.counters
            .absorbed_last_ns
            .store(home.env().now_ns(), Ordering::Relaxed);
        let chunk = self.record_payload_max().max(BLOCK_BYTES);
        let mut done = 0;
        while done < length {
            let part = (length - done).min(chunk);
            let slice = data.slice(done as usize..(done + part) as usize);
            self.append_writes(home, offset + done, slice).await?;
            done += part;
        }
        self.counters
            .absorbed_writes
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .absorbed_bytes
            .fetch_add(length, Ordering::Relaxed);
        Ok(())
    }

    /// A write within one row: gathered with the rest of its row if a
    /// stream is writing it, joined to the row's gather if one is open,
    /// else written as usual (see [`gather`]). `continued`: the part is the
    /// later part of a write that crosses into this row.
    async fn write_part(
        &self,
        home: &H,
        offset: u64,
        data: Bytes,
        fua: bool,
        continued: bool,
    ) -> Result<(), EngineError> {
        let natural = home.natural_write_bytes();
        let row_offset = offset / natural * natural;
        let length = data.len() as u64;
        let env = home.env();
        self.gathers().enter(length);
        let _in_flight = InFlight(self, length);
        let mut receiver = loop {
            let (done, receiver) = oneshot::channel();
            let piece = gather::Piece {
                offset,
                data: data.clone(),
                fua,
                done,
            };
            let now = env.now_ns();
            let start = offset == row_offset
                && length < natural
                && self.gathering()
                && {
                    let mut gathers = self.gathers();
                    !gathers.is_open(row_offset)
                        && gathers.may_start(now, natural)
                        && (continued || gathers.continues(offset))
                }
                && self.direct_allowed(home, row_offset, natural).is_some();
            let offer = self.gathers().offer(now, row_offset, natural, piece, start);
            match offer {
                gather::Offer::Declined => {
                    return self.write_rows_or_log(home, offset, data, fua).await;
                }
                gather::Offer::Busy(ready) => {
                    let _ = ready.await;
                }
                gather::Offer::Waiting => break receiver,
                gather::Offer::Full(pieces) => {
                    self.write_gathered(home, row_offset, pieces).await;
                    break receiver;
                }
            }
        };
        let watch = |now| self.gathers().timer(now, row_offset, |ns| env.sleep(ns));
        let mut timer = watch(env.now_ns());
        let outcome = loop {
            let Some(current) = timer else {
                // Its row is being told: no window to watch.
                break (&mut receiver).await;
            };
            match futures::future::select(&mut receiver, current).await {
                futures::future::Either::Left((outcome, _)) => break outcome,
                futures::future::Either::Right(((), _)) => {
                    let released = self.gathers().expire(env.now_ns(), row_offset);
                    if let Some(pieces) = released {
                        self.log_gathered(home, row_offset, pieces).await;
                    }
                    timer = watch(env.now_ns());
                }
            }
        };
        let reason = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(reason)) => reason,
            Err(oneshot::Canceled) => "its row's write was abandoned".to_string(),
        };
        Err(EngineError::Unavailable {
            space: home.name().to_string(),
            offset,
            length,
            reason,
        })
    }

    /// Write a row whose pieces a gather collected straight to the disks,
    /// or log them if it may no longer go there (logged data arrived under
    /// it, a disk failed); then tell each piece how it went.
    async fn write_gathered(&self, home: &H, row_offset: u64, pieces: Vec<gather::Piece>) {
        let natural = home.natural_write_bytes();
        let Some(invalidate) = self.direct_allowed(home, row_offset, natural) else {
            return self.log_gathered(home, row_offset, pieces).await;
        };
        let row = gathered_row(row_offset, natural, &pieces);
        let fua = pieces.iter().any(|piece| piece.fua);
        let result = self
            .write_direct(home, row_offset, row, fua, invalidate)
            .await;
        if result.is_ok() {
            self.counters
                .bypassed_writes
                .fetch_add(pieces.len() as u64, Ordering::Relaxed);
            self.counters
                .bypassed_bytes
                .fetch_add(natural, Ordering::Relaxed);
        }
        self.gathers().finish(home.env().now_ns(), row_offset);
        let result = result.map_err(|error| error.to_string());
        for piece in pieces {
            piece.tell(result.clone());
        }
    }

    /// Log a gather's pieces after all (its stream stalled, or the row may
    /// not go straight to the disks): their blocks merged in the order the
    /// pieces came, in runs; then tell each piece how it went.
    async fn log_gathered(&self, home: &H, row_offset: u64, pieces: Vec<gather::Piece>) {
        let mut blocks = BTreeMap::new();
        for piece in &pieces {
            let first = piece.offset / BLOCK_BYTES;
            for (i, chunk) in piece.data.chunks(BLOCK_BYTES as usize).enumerate() {
                let at = i * BLOCK_BYTES as usize;
                blocks.insert(first + i as u64, piece.data.slice(at..at + chunk.len()));
            }
        }
        let mut result = Ok(());
        let numbers: Vec<u64> = blocks.keys().copied().collect();
        for (first, count) in ranges(&numbers) {
            let run = aligned_concat(
                (count * BLOCK_BYTES) as usize,
                (first..first + count).map(|block| &blocks[&block][..]),
            );
            result = self
                .write_logged(home, first * BLOCK_BYTES, run.freeze())
                .await;
            if result.is_err() {
                break;
            }
        }
        self.gathers().finish(home.env().now_ns(), row_offset);
        let result = result.map_err(|error| error.to_string());
        for piece in pieces {
            piece.tell(result.clone());
        }
    }

    /// Lock the partial blocks of a sub-block write while it reads, merges
    /// and logs them.
    pub(crate) async fn lock_edges(&self, block: u64) -> crate::row_lock::RowGuard<'_> {
        self.edges.lock((u64::MAX, block)).await
    }

    /// Make a range go home through the disks' own zeroing or trimming
    /// safely: returns `false` if logged data overlaps it (the caller then
    /// writes zeroes through the log, or skips an advisory trim).
    pub(crate) fn may_bypass(&self, offset: u64, length: u64) -> bool {
        let state = self.state();
        state.failed.is_some()
            || !Self::overlaps_index(
                &state,
                offset / BLOCK_BYTES,
                (offset + length).div_ceil(BLOCK_BYTES),
            )
    }

    /// After a direct write of `[offset, offset + length)`: make sure
    /// recovery never replays older logged data over it.
    pub(crate) async fn after_direct(
        &self,
        home: &H,
        offset: u64,
        length: u64,
    ) -> Result<(), EngineError> {
        let first = offset.div_ceil(BLOCK_BYTES);
        let end = (offset + length) / BLOCK_BYTES;
        let needed = {
            let state = self.state();
            state.failed.is_none() && end > first && state.recent.range(first..end).next().is_some()
        };
        if needed {
            self.invalidate(home, first, end).await?;
        }
        Ok(())
    }

    async fn invalidate(&self, home: &H, first: u64, end: u64) -> Result<(), EngineError> {
        // Only blocks not dirty in the log: a dirty block's newer record
        // stays valid (it is later in the log than this one).
        let blocks: Vec<u64> = {
            let state = self.state();
            state
                .recent
                .range(first..end)
                .map(|(&block, _)| block)
                .filter(|block| !state.index.contains_key(block))
                .collect()
        };
        for group in ranges(&blocks).chunks(ENTRIES_MAX) {
            let entries: Vec<[u64; 3]> = group
                .iter()
                .map(|&(start, count)| [start, count, 0])
                .collect();
            let named: Vec<u64> = group
                .iter()
                .flat_map(|&(start, count)| start..start + count)
                .collect();
            let contents = Contents {
                entries,
                blocks: named,
                pieces: Vec::new(),
            };
            self.append(home, Kind::Invalidate, contents).await?;
        }
        Ok(())
    }

    /// Log one block-aligned write, in a record of its own or (a small one)
    /// shared with writes in flight beside it (see [`batch`]); return once
    /// durable.
    async fn append_writes(&self, home: &H, offset: u64, data: Bytes) -> Result<(), EngineError> {
        let length = data.len() as u64;
        if length > batch::SHARED_MAX_BYTES {
            // Its header is a small share of it: alone, as it came.
            let contents = batch::Batch::alone(offset, data).record();
            return self.append(home, Kind::Writes, contents).await.map(|_| ());
        }
        let limits = batch::Limits {
            payload_bytes: self.record_payload_max().max(BLOCK_BYTES),
            entries: ENTRIES_MAX,
        };
        let arrived = self.state().batches.arrive(offset, data, limits);
        let receiver = match arrived {
            batch::Arrival::Go(batch) => return self.append_batch(home, batch).await,
            batch::Arrival::Wait(receiver) => receiver,
        };
        let mut waiting = Waiting {
            journal: self,
            receiver,
        };
        let reason = match (&mut waiting.receiver).await {
            Ok(batch::Turn::Lead(batch)) => return self.append_batch(home, batch).await,
            Ok(batch::Turn::Done(Ok(()))) => return Ok(()),
            Ok(batch::Turn::Done(Err(reason))) => reason,
            Err(oneshot::Canceled) => "its log record was abandoned".to_string(),
        };
        Err(EngineError::Unavailable {
            space: home.name().to_string(),
            offset,
            length,
            reason,
        })
    }

    /// Write a batch as one record holding one of the log's writers (passed
    /// on once the record is written), wait until it is durable and tell
    /// the batch's other writes.
    async fn append_batch(&self, home: &H, batch: batch::Batch) -> Result<(), EngineError> {
        let writer = Writer(self);
        let written = self.write_record(home, Kind::Writes, batch.record()).await;
        drop(writer);
        let result = match written {
            Ok(Some(sequence)) => self.make_durable(home, sequence).await,
            Ok(None) => Ok(()),
            Err(error) => Err(error),
        };
        batch.tell(result.as_ref().map(|_| ()).map_err(ToString::to_string));
        result
    }

    /// Before writing `[offset, offset + length)` straight to the disks:
    /// log the range as dirty (durably), so that recovery resynchronises
    /// its redundancy if a power cut tears the write. The record names
    /// `ahead` bytes more, so that the writes after it can reuse it while
    /// it is in use; it holds the tail until every write under it has
    /// called [`Journal::end_direct`]. `None` when write-through.
    pub(crate) async fn begin_direct(
        &self,
        home: &H,
        offset: u64,
        length: u64,
        ahead: u64,
    ) -> Result<Option<u64>, EngineError> {
        if length == 0 {
            return Ok(None);
        }
        {
            let mut state = self.state();
            if state.failed.is_some() {
                return Ok(None);
            }
            let now_ns = home.env().now_ns();
            if let Some(sequence) = reuse_lease(&mut state, offset, offset + length, now_ns) {
                return Ok(Some(sequence));
            }
        }
        let end = (offset + length + ahead)
            .min(home.size_bytes())
            .max(offset + length);
        self.counters
            .dirty_range_waits
            .fetch_add(1, Ordering::Relaxed);
        match self.log_lease(home, offset, end).await {
            Ok(sequence) => Ok(sequence),
            Err(_) if self.state().failed.is_some() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Log a dirty-range record for `[start, end)` (pinned once, for its
    /// caller) and offer it to later direct writes as a lease; `None` if
    /// the log has failed (the space is write-through: nothing to log).
    async fn log_lease(&self, home: &H, start: u64, end: u64) -> Result<Option<u64>, EngineError> {
        let contents = Contents {
            entries: vec![[start, end - start, 0]],
            blocks: Vec::new(),
            pieces: Vec::new(),
        };
        let Some(sequence) = self.append(home, Kind::Dirty, contents).await? else {
            return Ok(None);
        };
        let mut state = self.state();
        if state.leases.len() == LEASES_MAX {
            state.leases.pop_front();
        }
        state.leases.push_back(Lease {
            start,
            end,
            sequence,
            logged_ns: home.env().now_ns(),
        });
        Ok(Some(sequence))
    }

    /// While a direct write ending at `end` runs: if no lease will cover
    /// the next [`DIRECT_AHEAD_BYTES`] / 4 after it for long enough, log
    /// the next one now, so that a stream's next writes find a durable
    /// record waiting instead of each [`DIRECT_AHEAD_BYTES`] waiting for a
    /// log commit. At most one renewal at a time; a failed one is left to
    /// the write that needs the range.
    async fn renew_lease(&self, home: &H, end: u64) {
        let size = home.size_bytes();
        {
            let mut state = self.state();
            let now_ns = home.env().now_ns();
            let wanted = (end + DIRECT_AHEAD_BYTES / 4).min(size);
            let covered = state.leases.iter().any(|lease| {
                lease.start <= end
                    && wanted <= lease.end
                    && now_ns.saturating_sub(lease.logged_ns) < LEASE_NS / 2
            });
            if end >= size
                || covered
                || state.renewing
                || state.failed.is_some()
                || !state.space_waiters.is_empty()
            {
                return;
            }
            state.renewing = true;
        }
        let _renewing = Renewing(self);
        let next = (end + DIRECT_AHEAD_BYTES).min(size);
        if let Ok(sequence) = self.log_lease(home, end, next).await {
            self.end_direct(sequence);
        }
    }

    /// The direct write logged by [`Journal::begin_direct`] has finished
    /// (well or not): its record may go once the disks are flushed. Its
    /// last pin gone, writers waiting for ring space try again: one of them
    /// destages, and the tail may now pass the record. (A writer that found
    /// the ring full while the record was pinned destaged nothing and
    /// waits; without this nothing would wake it.)
    pub(crate) fn end_direct(&self, sequence: Option<u64>) {
        let Some(sequence) = sequence else {
            return;
        };
        let mut state = self.state();
        let Some(record) = state.record_mut(sequence) else {
            return;
        };
        assert!(
            record.pins > 0,
            "record {sequence} unpinned more than pinned"
        );
        record.pins -= 1;
        if record.pins == 0 {
            for sender in state.space_waiters.drain(..) {
                let _ = sender.send(());
            }
        }
    }

    /// Append one record and wait until it and all before it are durable;
    /// its sequence, or `None` if the log has failed (its data, if any,
    /// went straight home instead).
    async fn append(
        &self,
        home: &H,
        kind: Kind,
        contents: Contents,
    ) -> Result<Option<u64>, EngineError> {
        let sequence = self.write_record(home, kind, contents).await?;
        if let Some(sequence) = sequence {
            self.make_durable(home, sequence).await?;
        }
        Ok(sequence)
    }

    /// Write one record to the log (not yet flushed) and index its blocks;
    /// its sequence, or `None` if the log has failed (before the record
    /// found its place, or writing it) and its blocks went straight home
    /// instead: a write the disks can take never fails with the log.
    async fn write_record(
        &self,
        home: &H,
        kind: Kind,
        contents: Contents,
    ) -> Result<Option<u64>, EngineError> {
        let Contents {
            entries,
            blocks,
            pieces,
        } = contents;
        let payload_bytes = pieces.len() as u64 * BLOCK_BYTES;
        let record_bytes = HEADER_BYTES + payload_bytes;
        let reserved = self
            .reserve(
                home,
                record_bytes,
                &blocks,
                kind == Kind::Writes,
                kind == Kind::Dirty,
            )
            .await?;
        let Some(((at, sequence, wrap), alone)) = reserved else {
            // Write-through: no record; the data goes home as it would
            // have from the log.
            self.write_through(home, pieces).await?;
            return Ok(None);
        };
        // The header's place first, filled in once the payload's checksum
        // is known.
        let header_place = [0u8; HEADER_BYTES as usize];
        let mut payload = aligned_concat(
            record_bytes as usize,
            std::iter::once(&header_place[..]).chain(pieces.iter().map(|(_, data)| &data[..])),
        );
        debug_assert_eq!(payload.len() as u64, record_bytes);
        let header = Header {
            kind,
            epoch: self.epoch,
            sequence,
            position: at.position,
            record_bytes,
            payload_checksum: crc32c::crc32c(&payload[HEADER_BYTES as usize..]),
            entries,
        };
        payload[..HEADER_BYTES as usize].copy_from_slice(&header.encode());
        // Written with FUA, durable once written, without a flush of the
        // log's disks after it: when alone (see `reserve`), where that saves
        // a round trip per write at one outstanding write; and always where
        // the log's disks say FUA costs them nothing (no volatile cache, or
        // a power-loss-protected one), where a flush behind every group of
        // records would only add its wait. Otherwise the group commit
        // flushes it with the others.
        let fua = alone || self.log.cheap_fua();
        let mut writes = Vec::new();
        if let Some((wrap_at, wrap_sequence)) = wrap {
            writes.push(self.log.write_home(
                wrap_at.offset,
                self.wrap_block(wrap_at, wrap_sequence, at.position),
                fua,
            ));
        }
        let record = payload.freeze();
        writes.push(self.log.write_home(at.offset, record.clone(), fua));
        let results = join_all(writes).await;
        self.counters
            .log_bytes_written
            .fetch_add(record_bytes, Ordering::Relaxed);
        if let Some(error) = results.into_iter().find_map(Result::err) {
            let sequences: Vec<u64> = wrap.map(|(_, s)| s).into_iter().chain([sequence]).collect();
            self.log_failed(home, &sequences, &blocks, error.to_string())
                .await;
            // The write itself still has to happen: straight home.
            self.write_through(home, pieces).await?;
            return Ok(None);
        }
        {
            let mut state = self.state();
            for done in wrap.map(|(_, s)| s).into_iter().chain([sequence]) {
                if let Some(record) = state.record_mut(done) {
                    // With FUA durable, and a wrap record done, as in the
                    // group commit.
                    record.wrote(fua);
                }
            }
            if fua {
                // Durable from here on once every record before it is.
                advance_durable(&mut state);
            }
            // The index holds the record's own buffer (one allocation per
            // record, accounted whole), if the pool's log memory has room.
            let resident = !pieces.is_empty() && self.log.log_memory_take(record_bytes);
            if resident {
                if let Some(logged) = state.record_mut(sequence) {
                    logged.charged = record_bytes;
                }
            }
            // In order: of two pieces of one block in one record (writes
            // sharing it), the later wins, as on replay.
            for (i, (block, _)) in pieces.into_iter().enumerate() {
                let from = (HEADER_BYTES + i as u64 * BLOCK_BYTES) as usize;
                let held = Held {
                    at: at.offset + from as u64,
                    data: resident.then(|| Block {
                        buffer: record.clone(),
                        from,
                    }),
                };
                // Reserved by this record, unless a later write's record
                // over the block failed meanwhile and forgot the
                // reservation (the log failed: its data went home). The
                // two writes were in flight together, so either may land
                // last; this one is taken again here and goes home with
                // the rest of the log.
                let entry = state.index.entry(block).or_insert(Entry {
                    reserved: sequence,
                    committed: None,
                });
                if entry.committed.as_ref().is_none_or(|(s, _)| *s <= sequence) {
                    let fresh = entry.committed.is_none();
                    entry.committed = Some((sequence, held));
                    if fresh {
                        state.dirty_bytes += BLOCK_BYTES;
                    }
                }
            }
            state.assert_invariants();
            // A group commit waiting for this write can go now.
            for sender in state.sync_waiters.drain(..) {
                let _ = sender.send(());
            }
        }
        Ok(Some(sequence))
    }

    /// Wait until record `sequence` (written) and all before it are
    /// durable; if the log fails first, write its data home instead.
    async fn make_durable(&self, home: &H, sequence: u64) -> Result<(), EngineError> {
        if self.sync_through(sequence).await.is_err() {
            // The log failed: this record's data is committed in the
            // index; write it home with the rest.
            let _guard = self.destaging.lock().await;
            self.destage_all_locked(home).await?;
        }
        Ok(())
    }

    /// Group commit: return once record `sequence` and every earlier one
    /// are durable. One writer at a time flushes the log's disks for every
    /// record written so far; the others wait for it and check again.
    async fn sync_through(&self, sequence: u64) -> Result<(), EngineError> {
        enum Role {
            Done,
            Lead(u64),
            Wait(oneshot::Receiver<()>),
        }
        loop {
            let role = {
                let mut state = self.state();
                if let Some(reason) = &state.failed {
                    return Err(EngineError::Unavailable {
                        space: self.log.name().to_string(),
                        offset: 0,
                        length: 0,
                        reason: reason.clone(),
                    });
                }
                let mut end = state.durable_below;
                for record in state.records_from(end) {
                    if record.sequence == end && record.is_written() {
                        end += 1;
                    } else {
                        break;
                    }
                }
                if state.durable_below > sequence {
                    Role::Done
                } else if !state.syncing && end > state.durable_below {
                    state.syncing = true;
                    Role::Lead(end)
                } else {
                    let (sender, receiver) = oneshot::channel();
                    state.sync_waiters.push(sender);
                    Role::Wait(receiver)
                }
            };
            match role {
                Role::Done => return Ok(()),
                Role::Wait(receiver) => {
                    let _ = receiver.await;
                }
                Role::Lead(end) => {
                    let result = self.log.flush_own_disks().await;
                    if let Err(error) = &result {
                        self.log_failed_locked(&[], &[], error.to_string());
                    }
                    let mut state = self.state();
                    state.syncing = false;
                    if result.is_ok() {
                        let from = state.durable_below;
                        for record in state.records_from(from) {
                            if record.sequence >= end {
                                break;
                            }
                            if record.is_written() {
                                // A wrap record holds no data: done once
                                // durable (not before, or the tail could
                                // pass it unwritten).
                                record.flushed();
                            }
                        }
                        advance_durable(&mut state);
                        state.assert_invariants();
                    }
                    for sender in state.sync_waiters.drain(..) {
                        let _ = sender.send(());
                    }
                    result?;
                }
            }
        }
    }

    /// Reserve ring space (waiting for destaging if it is full), a sequence
    /// number, and the blocks' index entries; and whether the record is
    /// alone: every record before it durable, so nothing in flight before it.
    /// `None` once the log has failed, also while waiting for room (when it
    /// fails, the writers waiting are woken): the caller goes
    /// write-through.
    async fn reserve(
        &self,
        home: &H,
        record_bytes: u64,
        blocks: &[u64],
        dirtying: bool,
        pinned: bool,
    ) -> Result<Option<(Reservation, bool)>, EngineError> {
        loop {
            let waiter = {
                let mut state = self.state();
                if state.failed.is_some() {
                    return Ok(None);
                }
                if let Some(reserved) =
                    try_reserve(&mut state, record_bytes, blocks, dirtying, pinned)
                {
                    let (_, sequence, wrap) = reserved;
                    let first = wrap.map_or(sequence, |(_, wrap_sequence)| wrap_sequence);
                    return Ok(Some((reserved, state.durable_below == first)));
                }
                let (sender, receiver) = oneshot::channel();
                state.space_waiters.push(sender);
                receiver
            };
            // Full: destage one round here if nobody else is, else wait
            // for them. One round, not everything: the tail moves on and
            // the writers waiting go on as soon as its records are home;
            // a full log then runs at the rate destaging frees it instead
            // of stalling every writer until the whole log is home.
            if let Some(_guard) = self.destaging.try_lock() {
                let progressed = self
                    .destage_locked(home, DESTAGE_ROUND_BYTES, DESTAGE_PARALLEL)
                    .await?;
                if !progressed {
                    // Nothing to destage: the ring holds records already
                    // home whose tail is not yet committed (after a shrink,
                    // more than the new size may), or records still in
                    // flight. Moving the tail wakes the waiters, this one
                    // too; else wait for the records in flight.
                    self.commit_tail(false).await?;
                    let _ = waiter.await;
                }
            } else {
                let _ = waiter.await;
            }
        }
    }

    /// The log could not take a record: write every dirty block home (from
    /// memory, or read back from what is left of the log), flush, and run
    /// write-through from now on.
    async fn log_failed(&self, home: &H, sequences: &[u64], blocks: &[u64], reason: String) {
        self.log_failed_locked(sequences, blocks, reason);
        let _guard = self.destaging.lock().await;
        let _ = self.destage_all_locked(home).await;
    }

    /// Write-through in place of a record: `pieces` (block, data, in record
    /// order: of two pieces of one block the later wins, as on replay)
    /// straight home, in runs of consecutive blocks, with FUA as the record
    /// would have been durable when acknowledged. The disks' write intent
    /// covers them there (the space uses it once its log has failed).
    async fn write_through(&self, home: &H, pieces: Vec<(u64, Bytes)>) -> Result<(), EngineError> {
        let (Some(first), Some(last)) = (
            pieces.iter().map(|(block, _)| *block).min(),
            pieces.iter().map(|(block, _)| *block).max(),
        ) else {
            return Ok(());
        };
        self.settle_blocks(home, first, last + 1).await?;
        for run in block_runs_in_order(&pieces) {
            let (start, _) = run[0];
            let data = aligned_concat(
                run.len() * BLOCK_BYTES as usize,
                run.iter().map(|(_, data)| &data[..]),
            );
            home.write_home(start * BLOCK_BYTES, data.freeze(), true)
                .await?;
        }
        Ok(())
    }

    /// Write-through: before blocks `[first, end)` are written home, what
    /// the log still holds of any of them goes home, so that older logged
    /// data never lands over the new. (Blocks reserved by a record still
    /// in flight are a concurrent write: either may land last.)
    async fn settle_blocks(&self, home: &H, first: u64, end: u64) -> Result<(), EngineError> {
        if Self::overlaps_index(&self.state(), first, end) {
            let _guard = self.destaging.lock().await;
            self.destage_all_locked(home).await?;
        }
        Ok(())
    }

    /// Destage rounds until one finds nothing to take: a write-through log
    /// reads back a bounded amount per round.
    async fn destage_all_locked(&self, home: &H) -> Result<(), EngineError> {
        while self
            .destage_locked(home, u64::MAX, DESTAGE_PARALLEL)
            .await?
            && !self.is_clean()
        {}
        Ok(())
    }

    /// Mark the log failed (write-through from now on) and release what
    /// waits on it; the caller writes the dirty data home.
    fn log_failed_locked(&self, sequences: &[u64], blocks: &[u64], reason: String) {
        {
            let mut state = self.state();
            if state.failed.is_none() {
                let failed = format!("write-through: the log failed ({reason})");
                let space = self.home;
                let event = crate::PoolEvent::WriteThrough {
                    space,
                    reason: failed.clone(),
                };
                self.log.emit(event);
                state.failed = Some(failed);
            }
            // Forget this record's reservations; its data goes home directly.
            let sequence = sequences.last().copied().unwrap_or(0);
            for block in blocks {
                if let Some(entry) = state.index.get(block) {
                    if entry.reserved == sequence && entry.committed.is_none() {
                        state.index.remove(block);
                    }
                }
            }
            for &sequence in sequences {
                if let Some(record) = state.record_mut(sequence) {
                    record.abandon();
                }
            }
            state.assert_invariants();
            for sender in state.sync_waiters.drain(..) {
                let _ = sender.send(());
            }
            for (_, sender) in state.durable_waiters.drain(..) {
                drop(sender);
            }
            for sender in state.space_waiters.drain(..) {
                let _ = sender.send(());
            }
        }
    }

    /// One destage round, if destaging is wanted (or `force`); returns
    /// whether it made progress.
    pub async fn destage(&self, home: &H, force: bool) -> Result<bool, EngineError> {
        if !force && self.destage_pressure().is_none() {
            return Ok(false);
        }
        let _guard = self.destaging.lock().await;
        let (budget, parallel) = match self.destage_pressure() {
            Some(Pressure { fill, flat_out }) => {
                let urgent = fill >= DESTAGE_URGENT_PER_MILLE;
                let budget = if urgent { 4 } else { 1 } * DESTAGE_ROUND_BYTES;
                (budget, destage_parallel(fill, flat_out))
            }
            None => (DESTAGE_ROUND_BYTES, DESTAGE_PARALLEL),
        };
        self.destage_locked(home, budget, parallel).await
    }

    /// Before a flush completes: in write-through mode, everything still in
    /// the index goes home.
    pub(crate) async fn settle(&self, home: &H) -> Result<(), EngineError> {
        if self.state().failed.is_some() && !self.is_clean() {
            let _guard = self.destaging.lock().await;
            self.destage_all_locked(home).await?;
        }
        Ok(())
    }

    /// A round's blocks with their data, read back from the log where only
    /// the log holds it. The ring cannot move under them: its tail moves
    /// only under the destaging lock the round holds.
    async fn load(&self, picked: Picked) -> Result<Work, EngineError> {
        let held = picked.iter().map(|(&block, (_, held))| (block, held));
        let mut read = read_unheld(&*self.log, held).await?;
        Ok(picked
            .into_iter()
            .map(|(block, (sequence, held))| {
                let data = held.data.or_else(|| read.remove(&block));
                (block, (sequence, data.expect("read back")))
            })
            .collect())
    }

    /// Destage everything (before a resize, export or for tests).
    pub async fn drain(&self, home: &H) -> Result<(), EngineError> {
        let _guard = self.destaging.lock().await;
        while !self.is_clean() || {
            let state = self.state();
            state.tail != state.head
        } {
            if !self
                .destage_locked(home, u64::MAX, DESTAGE_PARALLEL)
                .await?
            {
                if self.is_clean() {
                    self.commit_tail(true).await?;
                    break;
                }
                home.env().sleep(1_000_000).await;
            }
        }
        Ok(())
    }

    async fn destage_locked(
        &self,
        home: &H,
        budget: u64,
        parallel: usize,
    ) -> Result<bool, EngineError> {
        // The oldest durable records within the budget, and their blocks
        // whose newest data they still hold.
        let failed = self.state().failed.is_some();
        let quiet = self.is_quiet();
        // Parity rows: merged updates, whole rows and row images.
        let parity_row_bytes = matches!(home.geometry().layout(), Layout::Parity { .. })
            .then(|| home.natural_write_bytes());
        let started_ns = home.env().now_ns();
        let (picked, work) = {
            let mut state = self.state();
            if failed {
                pick::pick_write_through(&state)
            } else {
                let limits = pick::RoundLimits {
                    budget,
                    parity_row_bytes,
                    quiet,
                    space_blocks: home.size_bytes() / BLOCK_BYTES,
                };
                pick::pick_round(&mut state, &limits)
            }
        };
        if picked.is_empty() && work.is_empty() {
            return Ok(false);
        }
        let work = self.load(work).await?;
        // Rows of a degraded parity extent are written whole, after a row
        // image in the log: a cut in the middle cannot leave the missing
        // column undefined (the write hole), recovery rewrites the row.
        let row_bytes = home.natural_write_bytes();
        let degraded: BTreeSet<u64> = if failed || parity_row_bytes.is_none() {
            BTreeSet::new()
        } else {
            work.keys()
                .map(|block| block * BLOCK_BYTES / row_bytes)
                .collect::<BTreeSet<u64>>()
                .into_iter()
                .filter(|&row| !home.healthy_for(row * row_bytes, row_bytes))
                .collect()
        };
        let (imaged, plain): (Work, Work) = work
            .iter()
            .map(|(&block, entry)| (block, entry.clone()))
            .partition(|(block, _)| degraded.contains(&(block * BLOCK_BYTES / row_bytes)));
        // Rows whose image finds no room wait for a later round (their
        // records stay); if nothing else could be done, the first goes in
        // place so destaging always progresses.
        let mut skipped: BTreeSet<u64> = BTreeSet::new();
        let mut imaged_any = false;
        for &row in &degraded {
            let blocks: Work = imaged
                .range(row * row_bytes / BLOCK_BYTES..(row + 1) * row_bytes / BLOCK_BYTES)
                .map(|(&block, entry)| (block, entry.clone()))
                .collect();
            if self
                .destage_row_image(home, row * row_bytes, row_bytes)
                .await?
            {
                imaged_any = true;
            } else {
                skipped.extend(blocks.keys());
            }
        }
        if !imaged_any && plain.is_empty() {
            if let Some(&first) = skipped.first() {
                let row = first * BLOCK_BYTES / row_bytes;
                let range = row * row_bytes / BLOCK_BYTES..(row + 1) * row_bytes / BLOCK_BYTES;
                let blocks: Work = imaged
                    .range(range.clone())
                    .map(|(&block, entry)| (block, entry.clone()))
                    .collect();
                for (offset, data) in coalesce(&blocks, row_bytes / BLOCK_BYTES) {
                    home.write_home(offset, data, false).await?;
                }
                for block in range {
                    skipped.remove(&block);
                }
            }
        }
        // A round started with little pressure speeds up as the log fills
        // or writers begin to wait for room, instead of holding its first
        // pace to the end.
        let pace = || {
            self.destage_pressure().map_or(parallel, |p| {
                parallel.max(destage_parallel(p.fill, p.flat_out))
            })
        };
        let row_blocks = parity_row_bytes.map_or(1, |bytes| bytes / BLOCK_BYTES);
        let updates = updates(coalesce(&plain, row_blocks), parity_row_bytes);
        let merged = updates.iter().filter(|update| update.len() > 1).count();
        self.counters
            .rows_merged
            .fetch_add(merged as u64, Ordering::Relaxed);
        write_updates_home(home, &updates, &pace).await?;
        if let (Some((first, _)), Some((last, _))) =
            (plain.first_key_value(), plain.last_key_value())
        {
            let (start, end) = (first * BLOCK_BYTES, (last + 1) * BLOCK_BYTES);
            self.image_rows_gone_degraded(home, start, end - start, &degraded)
                .await?;
        }
        home.flush_pool_disks().await?;
        let written: u64 = (work.len() - skipped.len()) as u64 * BLOCK_BYTES;
        self.counters
            .destaged_bytes
            .fetch_add(written, Ordering::Relaxed);
        let ended_ns = home.env().now_ns();
        let elapsed = ended_ns.saturating_sub(started_ns).max(1);
        self.counters.destage_rate.store(
            written.saturating_mul(1_000_000_000) / elapsed,
            Ordering::Relaxed,
        );
        self.counters
            .destage_ended_ns
            .store(ended_ns, Ordering::Relaxed);
        {
            let mut state = self.state();
            for (block, (sequence, _)) in work.iter().filter(|(b, _)| !skipped.contains(b)) {
                let (cleared, remove) = match state.index.get_mut(block) {
                    Some(entry) if entry.committed.as_ref().is_some_and(|(s, _)| s == sequence) => {
                        entry.committed = None;
                        (true, entry.reserved == *sequence)
                    }
                    _ => (false, false),
                };
                if cleared {
                    state.dirty_bytes = state.dirty_bytes.saturating_sub(BLOCK_BYTES);
                }
                if remove {
                    state.index.remove(block);
                }
            }
            // By sequence: a scan of every record listed for each picked
            // one held the lock for milliseconds per round in a large ring.
            for &sequence in &picked {
                if let Some(record) = state.record_mut(sequence) {
                    if failed {
                        // Write-through takes everything home, whatever
                        // became of the records.
                        record.abandon();
                    } else if !record.blocks.iter().any(|b| skipped.contains(b)) {
                        record.went_home();
                    }
                }
            }
            state.assert_invariants();
        }
        if !failed {
            self.commit_tail(false).await?;
        } else {
            let mut state = self.state();
            let head = state.head;
            state.tail = head;
            self.log.log_memory_give_back(state.charged());
            state.records.clear();
            state.recent.clear();
            state.assert_invariants();
        }
        Ok(true)
    }

    /// Destage into one row of a degraded parity extent: log the whole
    /// row's new image (after every earlier record is durable, so the image
    /// holds everything logged before it), then write the row whole. Gives
    /// `false`, having done nothing, if the ring has no room for the image.
    async fn destage_row_image(
        &self,
        home: &H,
        start: u64,
        length: u64,
    ) -> Result<bool, EngineError> {
        // The last row of a space may end early.
        let length = length.min(home.size_bytes().saturating_sub(start));
        if length == 0 {
            return Ok(true);
        }
        let named: Vec<u64> = (start / BLOCK_BYTES..(start + length) / BLOCK_BYTES).collect();
        let reserved = {
            let mut state = self.state();
            let lap = state.lap_bytes.min(state.next_lap_bytes);
            let fits = HEADER_BYTES + length <= lap * state.image_reserve_per_mille / 1000;
            fits.then(|| try_reserve(&mut state, HEADER_BYTES + length, &named, false, false))
                .flatten()
        };
        let Some((at, sequence, wrap)) = reserved else {
            return Ok(false);
        };
        let first_own = wrap.map_or(sequence, |(_, s)| s);
        let waiter = {
            let mut state = self.state();
            if state.durable_below >= first_own {
                None
            } else {
                let (sender, receiver) = oneshot::channel();
                state.durable_waiters.push((first_own - 1, sender));
                Some(receiver)
            }
        };
        if let Some(waiter) = waiter {
            let _ = waiter.await;
        }
        let sequences: Vec<u64> = wrap.map(|(_, s)| s).into_iter().chain([sequence]).collect();
        let image = match home.read(start, length).await {
            Ok(image) => image,
            Err(error) => {
                // The reserved record can never be written: the log cannot
                // go on past it, so the space goes write-through.
                self.log_failed_locked(&sequences, &[], format!("row image unreadable: {error}"));
                return Err(error);
            }
        };
        let mut payload = aligned_buffer((HEADER_BYTES + length) as usize);
        payload[HEADER_BYTES as usize..].copy_from_slice(&image);
        let header = Header {
            kind: Kind::RowImage,
            epoch: self.epoch,
            sequence,
            position: at.position,
            record_bytes: HEADER_BYTES + length,
            payload_checksum: crc32c::crc32c(&payload[HEADER_BYTES as usize..]),
            entries: vec![[start, length, 0]],
        };
        payload[..HEADER_BYTES as usize].copy_from_slice(&header.encode());
        let mut writes = Vec::new();
        if let Some((wrap_at, wrap_sequence)) = wrap {
            writes.push(self.log.write_home(
                wrap_at.offset,
                self.wrap_block(wrap_at, wrap_sequence, at.position),
                true,
            ));
        }
        writes.push(self.log.write_home(at.offset, payload.freeze(), true));
        let results = join_all(writes).await;
        if let Some(error) = results.into_iter().find_map(Result::err) {
            self.log_failed_locked(&sequences, &[], error.to_string());
        } else {
            let mut state = self.state();
            for record in state.records.iter_mut() {
                if sequences.contains(&record.sequence) {
                    record.image_done();
                }
            }
            advance_durable(&mut state);
            state.assert_invariants();
            // Group commits waiting for the records after this one.
            for sender in state.sync_waiters.drain(..) {
                let _ = sender.send(());
            }
        }
        home.write_home(start, image.freeze(), false).await?;
        Ok(true)
    }

    /// A disk lost while rows were being written in place leaves them
    /// degraded with data and parity possibly torn in volatile caches: log
    /// each such row's image (as the disks now read) so a power cut before
    /// the next flush cannot leave its missing column undefined. Rows in
    /// `done` were written whole after an image already.
    async fn image_rows_gone_degraded(
        &self,
        home: &H,
        offset: u64,
        length: u64,
        done: &BTreeSet<u64>,
    ) -> Result<(), EngineError> {
        if length == 0
            || !matches!(home.geometry().layout(), Layout::Parity { .. })
            || self.state().failed.is_some()
        {
            return Ok(());
        }
        let row_bytes = home.natural_write_bytes();
        for row in offset / row_bytes..(offset + length).div_ceil(row_bytes) {
            if !done.contains(&row) && !home.healthy_for(row * row_bytes, row_bytes) {
                // No room for an image: the row stays as written (the
                // window this closes is a power cut before the next flush).
                let _ = self
                    .destage_row_image(home, row * row_bytes, row_bytes)
                    .await?;
            }
        }
        Ok(())
    }

    /// The block of a wrap record at `at` pointing at `next`.
    fn wrap_block(&self, at: Cursor, sequence: u64, next: u64) -> Bytes {
        let header = Header {
            kind: Kind::Wrap,
            epoch: self.epoch,
            sequence,
            position: at.position,
            record_bytes: HEADER_BYTES,
            payload_checksum: crc32c::crc32c(&[]),
            entries: vec![[next, 0, 0]],
        };
        let mut block = aligned_buffer(HEADER_BYTES as usize);
        block.copy_from_slice(&header.encode());
        block.freeze()
    }

    /// Move the committed tail over destaged records (a metadata commit)
    /// when that frees a useful amount of ring, someone waits for space, or
    /// `always`.
    async fn commit_tail(&self, always: bool) -> Result<(), EngineError> {
        let (tail, wanted) = {
            let state = self.state();
            let tail = state
                .records
                .iter()
                .find(|r| !r.is_destaged())
                .map_or(state.head, |r| r.at);
            let freed = tail.position - state.tail.position;
            let wanted = always
                || !state.space_waiters.is_empty()
                || freed >= state.lap_bytes.min(state.next_lap_bytes) / 8
                || (state.index.is_empty() && freed > 0);
            (tail, wanted && freed > 0)
        };
        if !wanted {
            return Ok(());
        }
        self.checkpoints
            .commit_tail(self.home, tail.position, tail.offset)
            .await?;
        let mut state = self.state();
        state.tail = tail;
        while state
            .records
            .front()
            .is_some_and(|r| r.at.position < tail.position)
        {
            let record = state.records.pop_front().expect("front");
            self.log.log_memory_give_back(record.charged);
            for block in record.blocks {
                if let Some(count) = state.recent.get_mut(&block) {
                    *count -= 1;
                    if *count == 0 {
                        state.recent.remove(&block);
                    }
                }
            }
        }
        state.assert_invariants();
        for sender in state.space_waiters.drain(..) {
            let _ = sender.send(());
        }
        Ok(())
    }
}

/// What one record carries: its entries, the blocks it names, and the data
/// of the blocks it makes dirty (Writes records), in entry order.
pub(crate) struct Contents {
    pub entries: Vec<[u64; 3]>,
    pub blocks: Vec<u64>,
    pub pieces: Vec<(u64, Bytes)>,
}

/// One of the log's writers of client records (see [`batch`]), passed on
/// when dropped.
struct Writer<'a, H: HomeIo>(&'a Journal<H>);

impl<H: HomeIo> Drop for Journal<H> {
    fn drop(&mut self) {
        let charged = self.state().charged();
        self.log.log_memory_give_back(charged);
    }
}

impl<H: HomeIo> Drop for Writer<'_, H> {
    fn drop(&mut self) {
        self.0.state().batches.release();
    }
}

/// A partial-row write counted in flight by [`gather::Gathers::enter`];
/// leaves when dropped.
struct InFlight<'a, H: HomeIo>(&'a Journal<H>, u64);

impl<H: HomeIo> Drop for InFlight<'_, H> {
    fn drop(&mut self) {
        self.0.gathers().leave(self.1);
    }
}

/// A lease renewal in progress; ends when dropped.
struct Renewing<'a, H: HomeIo>(&'a Journal<H>);

impl<H: HomeIo> Drop for Renewing<'_, H> {
    fn drop(&mut self) {
        self.0.state().renewing = false;
    }
}

/// A write waiting in a batch. If it goes away after being told to lead,
/// the lead passes to the batch's next write.
struct Waiting<'a, H: HomeIo> {
    journal: &'a Journal<H>,
    receiver: oneshot::Receiver<batch::Turn>,
}

impl<H: HomeIo> Drop for Waiting<'_, H> {
    fn drop(&mut self) {
        self.receiver.close();
        if let Ok(Some(batch::Turn::Lead(batch))) = self.receiver.try_recv() {
            self.journal.state().batches.abandon(batch);
        }
    }
}

/// Why destaging should run now.
struct Pressure {
    /// Share of the ring in use, per mille.
    fill: u64,
    /// Writers wait for ring space or have gone quiet: no reason to hold
    /// back (see [`destage_parallel`]).
    flat_out: bool,
}

/// A dirty-range record that later direct writes may reuse.
struct Lease {
    start: u64,
    end: u64,
    sequence: u64,
    logged_ns: u64,
}

/// Pin a dirty-range record that covers `[start, end)` and may still be
/// pinned: durable with everything before it (a recovery scan reaches it),
/// and not yet taken by a destage round (which would let the tail pass it
/// while the new write is in flight). Not while writers wait for ring
/// space, nor past [`LEASE_NS`]: then the record is let go, so destaging
/// can pass it. Its sequence, if one was found.
fn reuse_lease(state: &mut State, start: u64, end: u64, now_ns: u64) -> Option<u64> {
    if !state.space_waiters.is_empty() {
        return None;
    }
    let durable_below = state.durable_below;
    let sequence = state
        .leases
        .iter()
        .rev()
        .find(|lease| {
            lease.start <= start
                && end <= lease.end
                && lease.sequence < durable_below
                && now_ns.saturating_sub(lease.logged_ns) < LEASE_NS
        })
        .map(|lease| lease.sequence)?;
    let record = state.record_mut(sequence)?;
    if record.is_picked() {
        return None;
    }
    record.pin();
    Some(sequence)
}

fn advance_durable(state: &mut State) {
    let mut below = state.durable_below;
    // Records leave `records` only once destaged, which needs durability,
    // so every sequence from `durable_below` on is still listed.
    for record in state.records_from(below) {
        if record.sequence == below && record.is_durable() {
            below += 1;
        } else {
            break;
        }
    }
    state.durable_below = below;
    let waiters = std::mem::take(&mut state.durable_waiters);
    for (sequence, sender) in waiters {
        if sequence < below {
            let _ = sender.send(());
        } else {
            state.durable_waiters.push((sequence, sender));
        }
    }
}

/// Sorted blocks to (first, count) runs.
fn ranges(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &block in blocks {
        match out.last_mut() {
            Some((start, count)) if *start + *count == block => *count += 1,
            _ => out.push((block, 1)),
        }
    }
    out
}

/// A record's pieces in runs of consecutive blocks, in their order (a run
/// ends where the next piece is not the next block).
fn block_runs_in_order(pieces: &[(u64, Bytes)]) -> Vec<&[(u64, Bytes)]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=pieces.len() {
        if i == pieces.len() || pieces[i].0 != pieces[i - 1].0 + 1 {
            runs.push(&pieces[start..i]);
            start = i;
        }
    }
    runs
}

/// Contiguous blocks joined into one write each: at most 4 MiB, and cut
/// only where a row of `row_blocks` blocks begins (so a run may be one row
/// where a row is larger); 1 where rows do not matter.
fn coalesce(work: &Work, row_blocks: u64) -> Vec<(u64, Payload)> {
    const RUN_MAX_BLOCKS: u64 = (4 << 20) / BLOCK_BYTES;
    // Cuts fall on row boundaries: a run cut inside a row would leave that
    // row to two partial-row updates (each reading what it lacks) that
    // could have been one full-row write.
    let cut_blocks = (RUN_MAX_BLOCKS / row_blocks).max(1) * row_blocks;
    let mut runs: Vec<(u64, Vec<&Block>)> = Vec::new();
    let mut last = None;
    for (&block, (_, data)) in work {
        match runs.last_mut() {
            Some((_, parts)) if last == Some(block - 1) && !block.is_multiple_of(cut_blocks) => {
                parts.push(data);
            }
            _ => runs.push((block, vec![data])),
        }
        last = Some(block);
    }
    runs.into_iter()
        .map(|(start, blocks)| (start * BLOCK_BYTES, Payload::parts(views(&blocks))))
        .collect()
}

/// `blocks` (consecutive on the space) as views of their buffers: one view
/// for each stretch that lies end to end in one buffer (a log record's
/// blocks, logged in order), so destaging copies no bytes.
fn views(blocks: &[&Block]) -> Vec<Bytes> {
    let view = |first: &Block, last: &Block| {
        first
            .buffer
            .slice(first.from..last.from + BLOCK_BYTES as usize)
    };
    let mut views = Vec::new();
    let mut stretch: Option<(&Block, &Block)> = None;
    for &block in blocks {
        stretch = match stretch {
            Some((first, last)) if last.followed_by(block) => Some((first, block)),
            Some((first, last)) => {
                views.push(view(first, last));
                Some((block, block))
            }
            None => Some((block, block)),
        };
    }
    views.extend(stretch.map(|(first, last)| view(first, last)));
    views
}

/// Writes home in flight for a destage round at `fill` (per mille):
/// [`DESTAGE_PARALLEL_START`] at the start threshold, rising linearly to
/// [`DESTAGE_PARALLEL`] at the urgent one; `flat_out` (writers wait for room
/// or have gone quiet) means [`DESTAGE_PARALLEL`] at any fill.
fn destage_parallel(fill: u64, flat_out: bool) -> usize {
    if flat_out {
        return DESTAGE_PARALLEL;
    }
    let above = fill.saturating_sub(DESTAGE_START_PER_MILLE);
    let span = DESTAGE_URGENT_PER_MILLE - DESTAGE_START_PER_MILLE;
    let extra = (DESTAGE_PARALLEL - DESTAGE_PARALLEL_START) as u64 * above.min(span) / span;
    DESTAGE_PARALLEL_START + extra as usize
}

/// A gather's row. Every block is covered. Pieces that follow each other
/// without overlap (a stream's) go as they are, back to back; else they
/// are laid in one buffer, later pieces over earlier ones, in the order
/// they came.
fn gathered_row(row_offset: u64, natural: u64, pieces: &[gather::Piece]) -> Payload {
    let mut end = row_offset;
    let in_order = pieces.iter().all(|piece| {
        let follows = piece.offset == end;
        end = piece.offset + piece.data.len() as u64;
        follows
    });
    if in_order && end == row_offset + natural {
        return Payload::parts(pieces.iter().map(|piece| piece.data.clone()).collect());
    }
    let mut row = aligned_buffer(natural as usize);
    for piece in pieces {
        let at = (piece.offset - row_offset) as usize;
        row[at..at + piece.data.len()].copy_from_slice(&piece.data);
    }
    Payload::from(row.freeze())
}

/// Coalesced runs (sorted) as updates home, each run alone; but where
/// `row_bytes` is given (parity), the runs within one row go together as
/// one merged update if there are [`MERGE_RUNS_MIN`] of them or more.
fn updates(runs: Vec<(u64, Payload)>, row_bytes: Option<u64>) -> Vec<Vec<(u64, Payload)>> {
    let Some(row_bytes) = row_bytes else {
        return runs.into_iter().map(|run| vec![run]).collect();
    };
    let row_of = |(offset, data): &(u64, Payload)| {
        let (first, last) = (
            offset / row_bytes,
            (offset + data.len() as u64 - 1) / row_bytes,
        );
        (first == last).then_some(first)
    };
    let mut out = Vec::new();
    let mut group: Vec<(u64, Payload)> = Vec::new();
    let mut group_row = None;
    let close = |group: &mut Vec<(u64, Payload)>, out: &mut Vec<Vec<(u64, Payload)>>| {
        if group.len() >= MERGE_RUNS_MIN {
            out.push(std::mem::take(group));
        } else {
            out.extend(group.drain(..).map(|run| vec![run]));
        }
    };
    for run in runs {
        let row = row_of(&run);
        if row.is_none() || row != group_row {
            close(&mut group, &mut out);
            group_row = row;
        }
        match row {
            Some(_) => group.push(run),
            None => out.push(vec![run]),
        }
    }
    close(&mut group, &mut out);
    out
}

/// Write updates home (see [`updates`]), at most `parallel()` at a time,
/// asked again as each one ends (the next starts as soon as one ends).
/// After an error none starts, and every write running ends before the
/// first error is returned: none is left unawaited beside later writes to
/// its rows.
async fn write_updates_home<H: HomeIo>(
    home: &H,
    updates: &[Vec<(u64, Payload)>],
    parallel: &(dyn Fn() -> usize + Sync),
) -> Result<(), EngineError> {
    let mut pending = updates.iter();
    let mut running = FuturesUnordered::new();
    let mut outcome = Ok(());
    loop {
        let allowed = parallel().max(1);
        while outcome.is_ok() && running.len() < allowed {
            let Some(update) = pending.next() else {
                break;
            };
            running.push(write_update(home, update));
        }
        match running.next().await {
            Some(Err(error)) if outcome.is_ok() => outcome = Err(error),
            Some(_) => {}
            None => return outcome,
        }
    }
}

async fn write_update<H: HomeIo>(home: &H, update: &[(u64, Payload)]) -> Result<(), EngineError> {
    match update {
        [(offset, data)] => home.write_home(*offset, data.clone(), false).await,
        pieces => home.write_home_merged(pieces).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_goes_home_in_runs_in_its_own_order() {
        let piece = |block: u64| (block, Bytes::from(vec![block as u8; BLOCK_BYTES as usize]));
        // Two writes of one batch over block 5: the later stays after the
        // earlier, as on replay.
        let pieces: Vec<(u64, Bytes)> = [4, 5, 6, 9, 5, 6, 7].map(piece).to_vec();
        let runs: Vec<Vec<u64>> = block_runs_in_order(&pieces)
            .iter()
            .map(|run| run.iter().map(|(block, _)| *block).collect())
            .collect();
        assert_eq!(runs, vec![vec![4, 5, 6], vec![9], vec![5, 6, 7]]);
        assert!(block_runs_in_order(&[]).is_empty());
    }

    #[test]
    fn ranges_and_coalesce_join_neighbours() {
        assert_eq!(ranges(&[1, 2, 3, 7, 9, 10]), vec![(1, 3), (7, 1), (9, 2)]);
        let k = BLOCK_BYTES as usize;
        let block = |b: u8| Block {
            buffer: Bytes::from(vec![b; k]),
            from: 0,
        };
        let work: Work = [(4, (1, block(4))), (5, (1, block(5))), (9, (2, block(9)))]
            .into_iter()
            .collect();
        let runs = coalesce(&work, 1);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].0, 4 * BLOCK_BYTES);
        assert_eq!(runs[0].1.len(), 2 * k);
        assert_eq!(runs[0].1.slice(k..k + 1)[0], 5);
        assert_eq!(runs[1].0, 9 * BLOCK_BYTES);
        // Blocks end to end in one buffer (a record's) go as one view of
        // it; the block after them, from another buffer, as another.
        let record = Bytes::from((0..4 * k).map(|i| (i / k) as u8).collect::<Vec<u8>>());
        let mut work: Work = (0..4)
            .map(|i| {
                let buffer = record.clone();
                (
                    20 + i as u64,
                    (
                        3,
                        Block {
                            buffer,
                            from: i * k,
                        },
                    ),
                )
            })
            .collect();
        work.insert(24, (4, block(9)));
        let runs = coalesce(&work, 1);
        assert_eq!(runs.len(), 1);
        match &runs[0].1 {
            Payload::Parts(parts) => {
                assert_eq!(parts.len(), 2);
                assert_eq!(parts[0].as_ptr(), record.as_ptr(), "a copy, not a view");
                assert_eq!(parts[0].len(), 4 * k);
            }
            Payload::One(_) => panic!("two buffers as one"),
        }
        assert_eq!(
            runs[0].1.slice(3 * k..4 * k + 1)[..],
            [&[3u8; 4096][..], &[9]].concat()
        );
        // A long run is cut at 4 MiB, or where rows begin.
        let long: Work = (3..1100).map(|b| (b, (1, block(b as u8)))).collect();
        let starts = |row_blocks| -> Vec<u64> {
            coalesce(&long, row_blocks)
                .iter()
                .map(|(offset, _)| offset / BLOCK_BYTES)
                .collect()
        };
        assert_eq!(starts(1), vec![3, 1024]);
        assert_eq!(starts(7), vec![3, 1022]);
        assert_eq!(starts(2000), vec![3]);
    }

    #[test]
    fn a_gathered_row_is_its_pieces_in_order_and_later_over_earlier() {
        let piece = |offset: u64, byte: u8, length: u64| gather::Piece {
            offset,
            data: Bytes::from(vec![byte; length as usize]),
            fua: false,
            done: oneshot::channel().0,
        };
        let k = BLOCK_BYTES;
        // A stream's pieces, end to end.
        let row = gathered_row(
            8 * k,
            4 * k,
            &[piece(8 * k, 1, 2 * k), piece(10 * k, 2, 2 * k)],
        );
        assert!(matches!(row, Payload::Parts(ref parts) if parts.len() == 2));
        let row = row.slice(0..4 * k as usize);
        assert!(row[..2 * k as usize].iter().all(|&b| b == 1));
        assert!(row[2 * k as usize..].iter().all(|&b| b == 2));
        // Out of order and overlapping: the later piece wins.
        let row = gathered_row(
            8 * k,
            4 * k,
            &[piece(9 * k, 3, 3 * k), piece(8 * k, 4, 2 * k)],
        );
        assert!(matches!(row, Payload::One(_)));
        let row = row.slice(0..4 * k as usize);
        assert!(row[..2 * k as usize].iter().all(|&b| b == 4));
        assert!(row[2 * k as usize..].iter().all(|&b| b == 3));
        assert_eq!(row.as_ptr() as usize % terrace_io::DIRECT_IO_ALIGNMENT, 0);
    }

    #[test]
    fn rows_with_many_runs_are_destaged_as_one_update() {
        let k = BLOCK_BYTES;
        let run = |block: u64, blocks: u64| {
            let data = Bytes::from(vec![0; (blocks * k) as usize]);
            (block * k, Payload::from(data))
        };
        // Rows of 8 blocks: row 0 holds four runs, row 1 two, and one run
        // crosses from row 2 into row 3, where three more runs lie.
        let runs = vec![
            run(0, 1),
            run(2, 1),
            run(4, 1),
            run(6, 2),
            run(9, 1),
            run(12, 1),
            run(23, 2),
            run(26, 1),
            run(28, 1),
            run(30, 1),
        ];
        let shape = |updates: Vec<Vec<(u64, Payload)>>| -> Vec<Vec<u64>> {
            updates
                .iter()
                .map(|update| update.iter().map(|(offset, _)| offset / k).collect())
                .collect()
        };
        assert_eq!(
            shape(updates(runs.clone(), Some(8 * k))),
            vec![
                vec![0, 2, 4, 6],
                vec![9],
                vec![12],
                vec![23],
                vec![26],
                vec![28],
                vec![30],
            ]
        );
        // Four runs in row 3 once the crossing run is not among them.
        let mut more = runs.clone();
        more.push(run(31, 1));
        more.sort_by_key(|(offset, _)| *offset);
        let shaped = shape(updates(more, Some(8 * k)));
        assert_eq!(shaped.last(), Some(&vec![26, 28, 30, 31]));
        // Without rows (not parity), every run alone.
        assert!(shape(updates(runs, None)).iter().all(|u| u.len() == 1));
    }

    #[test]
    fn destaging_runs_harder_as_the_log_fills() {
        let start = DESTAGE_START_PER_MILLE;
        let urgent = DESTAGE_URGENT_PER_MILLE;
        assert_eq!(destage_parallel(start, false), DESTAGE_PARALLEL_START);
        assert_eq!(destage_parallel(urgent, false), DESTAGE_PARALLEL);
        assert_eq!(destage_parallel(1000, false), DESTAGE_PARALLEL);
        let middle = destage_parallel((start + urgent) / 2, false);
        assert!(DESTAGE_PARALLEL_START < middle && middle < DESTAGE_PARALLEL);
        let ramp: Vec<usize> = (start..=urgent)
            .map(|fill| destage_parallel(fill, false))
            .collect();
        assert!(ramp.windows(2).all(|pair| pair[0] <= pair[1]), "{ramp:?}");
        // Waiting writers or a quiet log: flat out whatever the fill.
        for fill in [0, start, middle as u64, urgent] {
            assert_eq!(destage_parallel(fill, true), DESTAGE_PARALLEL);
        }
    }
}
