//! A space: the virtual disk clients read and write.
//!
//! A space is a [`Volume`] (`volume.rs`: the map, row locks, layout and the
//! split into rows) with what is a client's in front of it: the checks of
//! a request, the held state, and the write-back journal (`journal`) that
//! routes a write to the log or straight to the volume. Depends on
//! `volume`, `journal`, `zero` and `error`.
//!
//! # Ordering and durability contract
//!
//! * Offsets and lengths have byte granularity; a read or write is at most
//!   [`REQUEST_MAX_BYTES`]; `write_zeroes` and `trim` take any length within
//!   the space, done in pieces of at most that (see [`zero_pieces`]).
//!   Requests aligned to [`BLOCK_BYTES`] (4 KiB) are the efficient ones: a
//!   write that starts or ends inside a block reads and rewrites that block
//!   under the row lock.
//! * Requests may be issued concurrently, any number at once. Requests that
//!   overlap and are in flight together complete in an unspecified order, but
//!   every copy and every parity of a block ends up agreeing with one of them:
//!   a later read never flips between values.
//! * A completed `write` is visible to every later `read`. It is **durable**
//!   (survives a crash or power cut) once a `flush` issued after it completed
//!   has itself completed, or at once if it was written with `fua`.
//! * `flush` makes durable every write, zero and trim that completed before
//!   the flush was issued, on this space (and, as it flushes whole disks, on
//!   the pool's other spaces too).
//! * A write that is not yet durable may, after a crash, read back as old
//!   data, new data, or — per 4 KiB block — a mix of old and new sectors. It
//!   never reads back as anything else once the pool has recovered.
//! * `write_zeroes` behaves as a write of zeroes; `trim` is advisory: trimmed
//!   whole rows read back as zeroes, partial parity rows keep their data.
//! * With disks failed or missing up to the layout's tolerance, every
//!   operation still succeeds and returns correct data. Beyond it, requests
//!   touching an affected extent fail with [`EngineError::Unavailable`];
//!   nothing ever returns wrong data. A write that saw a disk fail completes
//!   only after the failure is recorded in a metadata commit, so a disk that
//!   missed a write is never trusted again after a restart.
//!
//! The volume's own methods are reached through `Deref`.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Buf;
use terrace_io::{aligned_buffer, Bytes, BytesMut};
use terrace_layout::BLOCK_BYTES;
use terrace_meta::sums::ZEROES;

use crate::error::EngineError;
use crate::journal::Journal as JournalOf;
use crate::payload::Payload;
pub use crate::volume::REQUEST_MAX_BYTES;

/// Most bytes one [`Space::block_status`] answers for (the sums of
/// 65,536 blocks).
pub const STATUS_MAX_BYTES: u64 = 256 << 20;
use crate::volume::{zero_pieces, Access, Volume};
use crate::zero;

/// The journal in front of a space's volume, its ring in a log volume.
type Journal = JournalOf<Volume>;

/// How often, and how long apart, a trim or write-zeroes of whole
/// extents of a thin space looks for a moment with no write in flight to
/// give them back ([`Space::give_back`]).
const GIVE_BACK_TRIES: u32 = 20;
const GIVE_BACK_WAIT_NS: u64 = 5_000_000;

/// A space as its clients see it: a [`Volume`] with, in front, request
/// validation, its held state and its write-back journal.
pub struct Space {
    /// The block layer: the map, row locks, layout; shared with the jobs
    /// that repair and move it.
    pub(crate) volume: Arc<Volume>,
    /// The NBD export name; fixed.
    pub(crate) export: Option<String>,
    /// The write-back cache in front of this space, if it has one.
    journal: RwLock<Option<Arc<Journal>>>,
    /// Why clients are refused: its write-back log holds writes that could
    /// not go home at import (more of its disks were out than it
    /// tolerates). They go home when `pool clear` takes the disks back.
    held: std::sync::Mutex<Option<String>>,
    /// Whether `held` says something: every request reads this, not the
    /// mutex, which only a held space's refusals take.
    is_held: AtomicBool,
    /// Held shared by every write, zeroing and trim of a thin space from before it looks
    /// for room until it is done (or logged); held alone while extents of
    /// a thin space are given back ([`Space::give_back`]), so that no write
    /// lands in a slab just freed.
    gate: async_lock::RwLock<()>,
}

impl Space {
    /// The space serving `volume`.
    pub(crate) fn around(volume: Arc<Volume>) -> Space {
        Space {
            volume,
            export: None,
            journal: RwLock::new(None),
            held: std::sync::Mutex::new(None),
            is_held: AtomicBool::new(false),
            gate: async_lock::RwLock::new(()),
        }
    }

    /// The block layer under the space.
    pub(crate) fn volume(&self) -> &Arc<Volume> {
        &self.volume
    }
    /// Why the space refuses clients, if it does (see [`Space::held`]'s
    /// field): its log could not be replayed at import.
    pub fn held(&self) -> Option<String> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set_held(&self, why: Option<String>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        self.is_held.store(why.is_some(), Ordering::Release);
        *held = why;
    }

    /// Refuse a client's request while the space is held.
    fn check_held(&self, offset: u64, length: u64) -> Result<(), EngineError> {
        if !self.is_held.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.held() {
            None => Ok(()),
            Some(reason) => Err(EngineError::Unavailable {
                space: self.name.clone(),
                offset,
                length,
                reason,
            }),
        }
    }

    /// The write-back cache, if the space has one.
    pub fn journal(&self) -> Option<Arc<Journal>> {
        self.journal
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Put `journal` in front of the space (or none); the volume learns
    /// whether a working log accounts for its writes.
    pub(crate) fn set_journal(&self, journal: Option<Arc<Journal>>) {
        let mut slot = self.journal.write().unwrap_or_else(|e| e.into_inner());
        let logged = journal.as_ref().is_some_and(|j| !j.is_write_through());
        self.volume.set_logged(logged);
        *slot = journal;
    }

    /// The name NBD clients open it by, fixed at its creation (or, for a
    /// space of an older format, at the import that first read it).
    pub fn export_name(&self) -> Option<&str> {
        self.export.as_deref()
    }

    /// Read `length` bytes at `offset` (any byte granularity).
    pub async fn read(&self, offset: u64, length: u64) -> Result<BytesMut, EngineError> {
        let map = self.check(offset, length, Access::Read)?;
        self.check_held(offset, length)?;
        let _client = self.volume.pool.client_io();
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + length).next_multiple_of(BLOCK_BYTES);
        // Logged data is snapshotted before the disks are read: a block
        // destaged in between is on the disks by then.
        let logged = match self.journal() {
            Some(journal) => journal.snapshot(start, end - start).await?,
            None => Vec::new(),
        };
        let mut buffer = self.read_blocks(&map, start, end - start).await?;
        Journal::apply(&logged, start, &mut buffer);
        buffer.advance((offset - start) as usize);
        buffer.truncate(length as usize);
        Ok(buffer)
    }

    /// Write `data` at `offset` (any byte granularity); with `fua` it is
    /// durable on return.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), EngineError> {
        self.write_summed(offset, data, Vec::new(), fua).await
    }

    /// [`Space::write`] of `data` with the sums of its whole blocks taken
    /// as it arrived (`sums[k]` of bytes `k * BLOCK_BYTES ..`, by
    /// `terrace_meta::sums::block_sum`; none, or `offset` not on a block
    /// boundary: not used): they spare a pass over the bytes on the way to
    /// the disks. A log copies the bytes into its records and sums them
    /// there, so its space does not use them (see
    /// [`Space::uses_write_sums`]).
    pub async fn write_summed(
        &self,
        offset: u64,
        data: Bytes,
        sums: Vec<u64>,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.check_held(offset, data.len() as u64)?;
        let _client = self.volume.pool.client_io();
        let _gate = self.gate().await;
        match self.journal() {
            None => {
                let fits = !sums.is_empty()
                    && offset.is_multiple_of(BLOCK_BYTES)
                    && sums.len() as u64 <= data.len() as u64 / BLOCK_BYTES;
                let data = match fits {
                    true => Payload::Summed(data, sums.into()),
                    false => Payload::One(data),
                };
                self.write_home(offset, data, fua).await
            }
            // Boxed: the logged path's state would otherwise enlarge the
            // future of every write, cached or not.
            Some(journal) => Box::pin(self.write_logged(journal, offset, data, fua)).await,
        }
    }

    /// Whether writes handed on with their blocks' sums use them
    /// ([`Space::write_summed`]): the space keeps sums and has no log in
    /// front (a log sums the copy in its records itself).
    pub fn uses_write_sums(&self) -> bool {
        self.volume.sums().is_some() && self.journal().is_none()
    }

    async fn write_logged(
        &self,
        journal: Arc<Journal>,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.check(offset, data.len() as u64, Access::Write)?;
        let length = data.len() as u64;
        // Room first (a thin space's new extent): a write the pool has no
        // room for is refused before the log takes it.
        self.provide(offset, length).await?;
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + length).next_multiple_of(BLOCK_BYTES);
        if start == offset && end == offset + length {
            return journal.write(&self.volume, offset, data, fua).await;
        }
        // A partial block: read (through the log), merge and log whole
        // blocks, with the edge blocks locked against each other.
        let _head = journal.lock_edges(start / BLOCK_BYTES).await;
        let last = end / BLOCK_BYTES - 1;
        let _tail = if last != start / BLOCK_BYTES {
            Some(journal.lock_edges(last).await)
        } else {
            None
        };
        let mut merged = aligned_buffer((end - start) as usize);
        if start != offset {
            let head = self.read(start, BLOCK_BYTES).await?;
            merged[..BLOCK_BYTES as usize].copy_from_slice(&head);
        }
        let tail_start = end - BLOCK_BYTES;
        if end != offset + length && (tail_start != start || start == offset) {
            let tail = self.read(tail_start, BLOCK_BYTES).await?;
            merged[(tail_start - start) as usize..].copy_from_slice(&tail);
        }
        merged[(offset - start) as usize..(offset - start + length) as usize]
            .copy_from_slice(&data);
        journal
            .write(&self.volume, start, merged.freeze(), fua)
            .await
    }

    /// Make `[offset, offset + length)` read as zeroes.
    pub async fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.check_range(offset, length, Access::Write)?;
        self.check_held(offset, length)?;
        for (offset, length) in self.give_back(offset, length).await? {
            for (offset, length) in zero_pieces(&self.geometry, offset, length) {
                self.write_zeroes_piece(offset, length, fua).await?;
            }
        }
        Ok(())
    }

    /// [`Space::write_zeroes`] of at most [`REQUEST_MAX_BYTES`].
    async fn write_zeroes_piece(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        let map = self.check(offset, length, Access::Write)?;
        let journal = self.journal();
        if let Some(journal) = &journal {
            if !journal.may_bypass(offset, length) || !self.healthy_for(offset, length) {
                // Logged data under the range, or a degraded row that only
                // the log may update: zeroes go through the log too.
                let zeroes = Bytes::from(vec![0u8; length as usize]);
                return self.write(offset, zeroes, fua).await;
            }
        }
        let _gate = self.gate().await;
        let intent = match &journal {
            Some(journal) => {
                journal
                    .begin_direct(&self.volume, offset, length, 0)
                    .await?
            }
            None => None,
        };
        let result = self
            .zero_checked(&map, offset, length, zero::Mode::Zeroes { fua })
            .await;
        if let Some(journal) = &journal {
            journal.end_direct(intent);
        }
        self.pool.persist_failures().await?;
        result?;
        match journal {
            Some(journal) => journal.after_direct(&self.volume, offset, length).await,
            None => Ok(()),
        }
    }

    /// Which of `[offset, offset + length)` reads as zeroes, known without
    /// reading it: runs from `offset`, each `(length, zero)`, covering a
    /// prefix of at most [`STATUS_MAX_BYTES`] (and at least one byte). A
    /// block is known zero when its sum says so ([`ZEROES`]: never written
    /// since a space made with its sums was created, or written with
    /// `write_zeroes` on a simple or mirror space) and the log holds nothing
    /// newer of it. Without sums, everything is data.
    pub async fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<(u64, bool)>, EngineError> {
        self.check_range(offset, length, Access::Read)?;
        self.check_held(offset, length)?;
        let end = offset + length.min(STATUS_MAX_BYTES);
        let Some(sums) = self.volume.sums() else {
            return Ok(vec![(end - offset, false)]);
        };
        let (first, last) = (offset / BLOCK_BYTES, end.div_ceil(BLOCK_BYTES));
        // The log's blocks before the sums (as a read takes the log's data
        // before reading home): a block destaged in between has its sum
        // set by then.
        let logged = match self.journal() {
            Some(journal) => journal.logged_blocks(first, last),
            None => Vec::new(),
        };
        let mut zero: Vec<bool> = sums
            .get(first..last)
            .await
            .into_iter()
            .map(|sum| sum == ZEROES)
            .collect();
        for block in logged {
            zero[(block - first) as usize] = false;
        }
        // Extents without slabs (a thin space's, never written or given
        // back) read as zeroes, whatever their sums say.
        let map = self.map();
        let blocks_per_extent = self.geometry.extent_data_bytes() / BLOCK_BYTES;
        for (block, zero) in (first..).zip(zero.iter_mut()) {
            if !Volume::allocated(&map, block / blocks_per_extent) {
                *zero = true;
            }
        }
        let mut runs: Vec<(u64, bool)> = Vec::new();
        for (block, zero) in (first..).zip(zero) {
            let bytes = ((block + 1) * BLOCK_BYTES).min(end) - (block * BLOCK_BYTES).max(offset);
            match runs.last_mut() {
                Some((length, same)) if *same == zero => *length += bytes,
                _ => runs.push((bytes, zero)),
            }
        }
        Ok(runs)
    }

    /// Advise that `[offset, offset + length)` is no longer needed. Whole
    /// blocks of it may read back as zeroes afterwards.
    pub async fn trim(&self, offset: u64, length: u64) -> Result<(), EngineError> {
        self.check_range(offset, length, Access::Write)?;
        self.check_held(offset, length)?;
        for (offset, length) in self.give_back(offset, length).await? {
            for (offset, length) in zero_pieces(&self.geometry, offset, length) {
                self.trim_piece(offset, length).await?;
            }
        }
        Ok(())
    }

    /// The gate, shared, for a write, zeroing or trim of a thin space (a
    /// fixed space gives nothing back: its writes take no lock for it).
    async fn gate(&self) -> Option<async_lock::RwLockReadGuard<'_, ()>> {
        match self.volume.is_thin() {
            true => Some(self.gate.read().await),
            false => None,
        }
    }

    /// Of a thin space: give back the slabs of the extents that
    /// `[offset, offset + length)` covers whole (a trim or write-zeroes of
    /// them: they read as zeroes without slabs), except those the log
    /// holds data of or a job is moving. Returns the ranges still to zero
    /// or trim: the request but for the extents without slabs now.
    ///
    /// Under the gate alone (see [`GIVE_BACK_TRIES`]), so no write is under way in the space; their
    /// sums are forgotten and made durable first (an extent given slabs
    /// again later is zeroed, which a forgotten sum accepts), then one
    /// commit frees them, and the map lets go of their slabs under the
    /// control lock, as a move's end does (`MapEpoch`).
    async fn give_back(&self, offset: u64, length: u64) -> Result<Vec<(u64, u64)>, EngineError> {
        let extent_bytes = self.geometry.extent_data_bytes();
        let end = offset + length;
        let size = self.size_bytes();
        let extent_end = |extent: u64| ((extent + 1) * extent_bytes).min(size);
        let whole = |extent: u64| extent * extent_bytes >= offset && extent_end(extent) <= end;
        let extents = offset / extent_bytes..end.div_ceil(extent_bytes);
        if !self.volume.is_thin() || !extents.clone().any(whole) {
            return Ok(vec![(offset, length)]);
        }
        // Only in a moment with no write in flight: a write that waited
        // for the gate could hold up writes it waits for itself (sector
        // writes of one block merged together), and a trim is advisory.
        // A write-zeroes that finds no such moment zeroes the extents.
        let mut gate = self.gate.try_write();
        for _ in 0..GIVE_BACK_TRIES {
            if gate.is_some() {
                break;
            }
            self.pool.env.sleep(GIVE_BACK_WAIT_NS).await;
            gate = self.gate.try_write();
        }
        if let Some(_gate) = gate {
            let map = self.map();
            let journal = self.journal();
            let blocks = |extent: u64| {
                extent * extent_bytes / BLOCK_BYTES..extent_end(extent).div_ceil(BLOCK_BYTES)
            };
            let chosen: Vec<u64> = extents
                .clone()
                .filter(|&extent| whole(extent) && Volume::allocated(&map, extent))
                .filter(|&extent| {
                    journal.as_ref().is_none_or(|journal| {
                        let blocks = blocks(extent);
                        journal.logged_blocks(blocks.start, blocks.end).is_empty()
                    })
                })
                .collect();
            if !chosen.is_empty() {
                if let Some(sums) = self.volume.sums() {
                    for &extent in &chosen {
                        sums.forget(blocks(extent)).await;
                    }
                    self.pool.flush_disks().await?;
                }
                crate::thin::release(&self.pool, self.id(), self.name(), &chosen, |given| {
                    for &extent in given {
                        self.volume.update_extent(extent, |targets| targets.clear());
                    }
                })
                .await?;
            }
        }
        let map = self.map();
        let mut left: Vec<(u64, u64)> = Vec::new();
        for extent in extents {
            if whole(extent) && !Volume::allocated(&map, extent) {
                continue;
            }
            let start = offset.max(extent * extent_bytes);
            let stop = end.min(extent_end(extent));
            match left.last_mut() {
                Some((at, length)) if *at + *length == start => *length += stop - start,
                _ => left.push((start, stop - start)),
            }
        }
        Ok(left)
    }

    /// [`Space::trim`] of at most [`REQUEST_MAX_BYTES`].
    async fn trim_piece(&self, offset: u64, length: u64) -> Result<(), EngineError> {
        let map = self.check(offset, length, Access::Write)?;
        let journal = self.journal();
        if let Some(journal) = &journal {
            if !journal.may_bypass(offset, length) || !self.healthy_for(offset, length) {
                // Advisory: logged data under the range stays, and degraded
                // rows are not touched behind the log's back.
                return Ok(());
            }
        }
        let _gate = self.gate().await;
        let intent = match &journal {
            Some(journal) => {
                journal
                    .begin_direct(&self.volume, offset, length, 0)
                    .await?
            }
            None => None,
        };
        let result = self
            .zero_checked(&map, offset, length, zero::Mode::Trim)
            .await;
        if let Some(journal) = &journal {
            journal.end_direct(intent);
        }
        self.pool.persist_failures().await?;
        result?;
        match journal {
            Some(journal) => journal.after_direct(&self.volume, offset, length).await,
            None => Ok(()),
        }
    }

    /// Make every completed write durable.
    pub async fn flush(&self) -> Result<(), EngineError> {
        self.check(0, 0, Access::Read)?;
        self.check_held(0, 0)?;
        if let Some(journal) = self.journal() {
            // Logged writes are durable already, unless the log failed and
            // they wait in memory to go home.
            journal.settle(&self.volume).await?;
        }
        self.pool.flush_disks().await?;
        self.readable_everywhere()
    }
}

/// Everything block-level of a space is its volume's.
impl Deref for Space {
    type Target = Volume;

    fn deref(&self) -> &Volume {
        &self.volume
    }
}
