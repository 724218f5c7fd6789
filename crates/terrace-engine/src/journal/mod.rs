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
//! * `append`: reserving, writing and indexing records; group commit.
//! * `batch`, `gather`: small writes sharing records; streams gathered
//!   into whole rows.
//! * `direct`: writes straight to the disks, their dirty-range records
//!   and leases.
//! * `pick`: what a destage round takes home (pure).
//! * `destage`: destage rounds, and moving the tail.
//! * `failover`: turning write-through when the log fails.
//! * `recovery`: the scan at import, replay, read-back from the log.
//! * here: the state and its index, the journal's handle, reads'
//!   snapshots, and routing a write (direct, gathered or logged).
//!
//! Design page: `docs/design/journal.md`. Depends on: `error`, `payload`,
//! `row_lock`, and the io, layout and meta crates; never on the space, the
//! pool or its control.

mod append;
mod batch;
mod destage;
mod direct;
mod failover;
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
use terrace_io::{aligned_buffer, aligned_concat, Bytes, BytesMut};
use terrace_layout::BLOCK_BYTES;
use terrace_meta::SpaceId;

use crate::error::EngineError;
use crate::payload::Payload;
use format::{Header, Kind, ENTRIES_MAX, HEADER_BYTES};
use record::{Cursor, Record};
use ring::{try_reserve, Reservation};

use append::advance_durable;
use destage::{coalesce, updates, write_updates_home};
use direct::Lease;

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
/// space), its sum (`terrace_meta::sums::block_sum`: a block read back
/// from the log is checked against it, every copy tried), and the data
/// itself unless its record was logged beyond the pool's log memory.
#[derive(Clone)]
struct Held {
    at: u64,
    sum: u64,
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
    /// Client records waiting for ring room, by ticket, in arrival order
    /// (see [`Journal::reserve`]), and the next ticket.
    room_queue: VecDeque<u64>,
    next_room_ticket: u64,
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
    /// An empty ring of `lap_bytes` from `head` to `tail`, keeping
    /// `image_reserve_per_mille` of each lap for row images.
    fn new(lap_bytes: u64, head: Cursor, tail: Cursor, image_reserve_per_mille: u64) -> State {
        State {
            image_reserve_per_mille,
            lap_bytes,
            next_lap_bytes: lap_bytes,
            head,
            next_sequence: 1,
            tail,
            records: VecDeque::new(),
            index: BTreeMap::new(),
            recent: BTreeMap::new(),
            durable_below: 1,
            durable_waiters: Vec::new(),
            syncing: false,
            sync_waiters: Vec::new(),
            space_waiters: Vec::new(),
            room_queue: VecDeque::new(),
            next_room_ticket: 0,
            leases: VecDeque::new(),
            dirty_bytes: 0,
            failed: None,
            batches: batch::Batches::default(),
            renewing: false,
            checks: 0,
            next_full_check: 0,
        }
    }

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

    /// Whether a record an import would replay names any block of
    /// `[first, end)`.
    fn names(&self, first: u64, end: u64) -> bool {
        self.recent.range(first..end).next().is_some()
    }

    /// Wake every writer waiting for ring room (or for its turn at it).
    fn wake_space_waiters(&mut self) {
        for sender in self.space_waiters.drain(..) {
            let _ = sender.send(());
        }
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
            state: Mutex::new(State::new(
                bytes,
                start,
                start,
                if parity { 250 } else { 0 },
            )),
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
            let read = read_unheld(&*self.log, held).await;
            // Read back from ring the tail has passed since (the blocks
            // went home), it may hold a newer record (whose bytes then
            // fail the blocks' sums): look again.
            if oldest.is_none_or(|sequence| self.still_logged(sequence)) {
                let mut read = read?;
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

    /// Read block-aligned `[offset, offset + length)` of `home` as a client
    /// would: its disks with what the log holds laid over them (snapshotted
    /// first: a block destaged in between is on the disks by then).
    async fn read_through(
        &self,
        home: &H,
        offset: u64,
        length: u64,
    ) -> Result<BytesMut, EngineError> {
        let logged = self.snapshot(offset, length).await?;
        let mut buffer = home.read(offset, length).await?;
        Self::apply(&logged, offset, &mut buffer);
        Ok(buffer)
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
        let (first, end) = (
            offset / BLOCK_BYTES,
            (offset + length).div_ceil(BLOCK_BYTES),
        );
        match state.failed {
            // Write-through: nothing after the direct write invalidates
            // the records that name the range (see `settle_blocks`).
            Some(_) => !Self::logged(&state, first, end),
            None => !Self::overlaps_index(&state, first, end),
        }
    }

    /// The blocks of `[first, end)` the log holds data of (newer than
    /// what is home, or about to be).
    pub(crate) fn logged_blocks(&self, first: u64, end: u64) -> Vec<u64> {
        self.state()
            .index
            .range(first..end)
            .map(|(&block, _)| block)
            .collect()
    }

    /// Whether the log holds data of blocks `[first, end)`, or a record
    /// an import would replay names any of them.
    fn logged(state: &State, first: u64, end: u64) -> bool {
        Self::overlaps_index(state, first, end) || state.names(first, end)
    }
}

/// What one record carries: its entries, the blocks it names, and the data
/// of the blocks it makes dirty (Writes records), in entry order.
pub(crate) struct Contents {
    pub entries: Vec<[u64; 3]>,
    pub blocks: Vec<u64>,
    pub pieces: Vec<(u64, Bytes)>,
}

impl<H: HomeIo> Drop for Journal<H> {
    fn drop(&mut self) {
        let charged = self.state().charged();
        self.log.log_memory_give_back(charged);
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

#[cfg(test)]
mod tests {
    use super::destage::destage_parallel;
    use super::failover::block_runs_in_order;
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
            Payload::One(_) | Payload::Summed(..) => panic!("two buffers as one"),
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
