//! A volume: the block layer under a space, and the whole of a log.
//!
//! A volume holds a space's map (its extents and their epochs), its row
//! locks and its layout, and turns a byte range into rows and their I/O:
//! the tolerance, missing-disk and write-intent steps around a write, the
//! split into rows, the partial-block merge, zeroing, and flushing its
//! disks. It knows nothing of clients or of a journal: a data space
//! (`space.rs`) puts validation, its held state and its write-back journal
//! in front of a volume; a log is a volume alone, holding the ring of
//! another space's journal.
//!
//! Depends on: `control` (the pool's shared state: commits, write intent,
//! failures), `layouts`, `row`, `zero`, `resync`, `disk`, `target` and
//! level-0 helpers; never on `space` or `journal`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use bytes::Buf;
use futures::future::join_all;
use terrace_io::{aligned_buffer, BlockDevice, Bytes, BytesMut};
use terrace_layout::{Geometry, RowSpan, BLOCK_BYTES};
use terrace_meta::{DiskIndex, SlabRef, SpaceId};

use crate::disk::{Condition, Disk};

use crate::block_merge::{BlockMerges, Joined};
use crate::control::PoolShared;
use crate::departures::Writing;
use crate::error::EngineError;
use crate::layouts::{LayoutHost, Layouts, RowLayout};
use crate::payload::Payload;
use crate::resync::{check_row, Pass};
use crate::row::{all_ok, join_buffer, split_buffer};
use crate::row::{RowHost, RowIo};
use crate::row_lock::RowLocks;
use crate::sums::SpaceSums;
use crate::target::Location;
pub use crate::target::Target;
use crate::zero;

/// Largest request: 64 MiB bounds the memory one request pins (NBD clients
/// send at most 32 MiB).
pub const REQUEST_MAX_BYTES: u64 = 64 << 20;

/// The mapping of a space: size and the targets of every extent.
pub struct SpaceMap {
    pub size_bytes: u64,
    pub extents: Vec<Arc<[Target]>>,
    /// Lives as long as this map or an older one of the space does.
    epoch: Arc<MapEpoch>,
}

impl SpaceMap {
    pub(crate) fn new(size_bytes: u64, extents: Vec<Arc<[Target]>>) -> SpaceMap {
        SpaceMap {
            size_bytes,
            extents,
            epoch: Arc::default(),
        }
    }
}

/// How long a slab a space's map stops naming may still be in use.
///
/// A request holds the map it took when it began until its I/O is done,
/// and looks at newer maps only while holding it (`RowIo::with_targets`).
/// So a slab the map stopped naming (a move ended or was cancelled, a log
/// shrank, the space was deleted) may still be read or written by requests
/// that hold that map or an older one, after the metadata has freed it: a
/// slab handed to another space then would take a late write of this one,
/// or hand its data to a late read. Each map holds its epoch and each
/// epoch the next map's, so an epoch lives while any map up to its own
/// does; the pool takes no slab retired under an epoch until the epoch is
/// gone ([`PoolShared::retire`]).
#[derive(Default)]
pub(crate) struct MapEpoch {
    next: OnceLock<Arc<MapEpoch>>,
}

impl Drop for MapEpoch {
    /// Iteratively: a request that held an old map while thousands of
    /// moves settled ends a chain as long, too deep to drop recursively.
    fn drop(&mut self) {
        let mut next = self.next.take();
        while let Some(epoch) = next {
            next = Arc::into_inner(epoch).and_then(|mut epoch| epoch.next.take());
        }
    }
}

/// The block layer of a space or a log: its map, row locks and layout.
pub struct Volume {
    pub(crate) pool: Arc<PoolShared>,
    pub(crate) id: SpaceId,
    /// For messages: the space's name, or the log's.
    pub(crate) name: String,
    pub(crate) geometry: Geometry,
    /// Its layout's implementation, chosen once from the geometry's.
    layout: Layouts,
    map: RwLock<Arc<SpaceMap>>,
    pub(crate) locks: RowLocks,
    deleted: AtomicBool,
    /// A working write-back log in front accounts for this volume's
    /// writes: set when a journal is attached, cleared before the journal
    /// sends its first write straight home (write-through).
    logged: AtomicBool,
    /// Writers never overlap (a log): they share row locks.
    disjoint_writes: AtomicBool,
    /// Of a sums volume: pages of journal after the sums pages
    /// (`crate::sums::SumsStore::journal_pages`).
    sums_journal_pages: AtomicU64,
    /// The sums of its blocks, once attached (a data space's; a log and a
    /// sums volume keep none).
    sums: OnceLock<Arc<SpaceSums>>,
    /// Writes into part of a block, merged per block (`block_merge`).
    merges: BlockMerges,
    /// Held while an extent of a thin volume gets its slabs
    /// ([`Volume::provide`]): one allocation at a time per volume.
    provisioning: futures::lock::Mutex<()>,
    /// Thin: extents get their slabs at their first write, and give them
    /// back when trimmed or zeroed whole.
    thin: AtomicBool,
}

/// What a request wants of a volume: to read, or to write (refused on a
/// read-only pool).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

impl Volume {
    pub(crate) fn new(
        pool: Arc<PoolShared>,
        id: SpaceId,
        name: String,
        geometry: Geometry,
        map: SpaceMap,
    ) -> Volume {
        Volume {
            pool,
            id,
            name,
            geometry,
            layout: Layouts::of(geometry.layout()),
            map: RwLock::new(Arc::new(map)),
            locks: RowLocks::default(),
            deleted: AtomicBool::new(false),
            logged: AtomicBool::new(false),
            disjoint_writes: AtomicBool::new(false),
            sums_journal_pages: AtomicU64::new(0),
            sums: OnceLock::new(),
            merges: BlockMerges::default(),
            provisioning: futures::lock::Mutex::new(()),
            thin: AtomicBool::new(false),
        }
    }

    /// Make this volume thin (see [`Volume::is_thin`]).
    pub(crate) fn set_thin(&self) {
        self.thin.store(true, Ordering::Relaxed);
    }

    /// Whether extents get their slabs at their first write and give them
    /// back when trimmed or zeroed whole.
    pub fn is_thin(&self) -> bool {
        self.thin.load(Ordering::Relaxed)
    }

    /// Whether every extent under `[offset, offset + length)` has slabs.
    pub(crate) fn all_allocated(
        map: &SpaceMap,
        offset: u64,
        length: u64,
        extent_bytes: u64,
    ) -> bool {
        length == 0
            || (offset / extent_bytes..=(offset + length - 1) / extent_bytes)
                .all(|extent| Volume::allocated(map, extent))
    }

    /// Give every extent under `[offset, offset + length)` that has no
    /// slabs yet (of a thin space, never written) its slabs, and the pages
    /// of its sums theirs, before a write to the range begins: a write
    /// refused for lack of room is refused before anything is written, and
    /// a write to an extent that has its slabs never waits for room.
    pub(crate) async fn provide(&self, offset: u64, length: u64) -> Result<(), EngineError> {
        if length == 0 {
            return Ok(());
        }
        let extent_bytes = self.geometry.extent_data_bytes();
        let extents = offset / extent_bytes..=(offset + length - 1) / extent_bytes;
        let unallocated = |map: &SpaceMap, extent: u64| {
            map.extents
                .get(extent as usize)
                .is_some_and(|targets| targets.is_empty())
        };
        let map = self.map();
        if !extents.clone().any(|extent| unallocated(&map, extent)) {
            return Ok(());
        }
        drop(map);
        self.pool.check_writable()?;
        let _one = self.provisioning.lock().await;
        for extent in extents {
            if !unallocated(&self.map(), extent) {
                continue;
            }
            if let Some(sums) = self.sums.get() {
                let size = self.size_bytes();
                let start = extent * extent_bytes;
                let end = (start + extent_bytes).min(size);
                sums.provide(start / BLOCK_BYTES..end.div_ceil(BLOCK_BYTES))
                    .await?;
            }
            let targets =
                crate::thin::allocate(&self.pool, self.id, &self.name, extent, &self.geometry)
                    .await?;
            self.update_extent(extent, |slots| *slots = targets.to_vec());
        }
        Ok(())
    }

    /// Whether `extent` has slabs (an extent of a thin space has none
    /// until its first write).
    pub(crate) fn allocated(map: &SpaceMap, extent: u64) -> bool {
        map.extents
            .get(extent as usize)
            .is_some_and(|targets| !targets.is_empty())
    }

    /// Bytes of the space whose extents have their slabs.
    pub fn allocated_bytes(&self) -> u64 {
        let map = self.map();
        let extent_bytes = self.geometry.extent_data_bytes();
        (0..map.extents.len() as u64)
            .filter(|&extent| Volume::allocated(&map, extent))
            .map(|extent| extent_bytes.min(map.size_bytes.saturating_sub(extent * extent_bytes)))
            .sum()
    }

    /// Keep `sums` of this volume's blocks from now on: every write sets
    /// them, every read checks them. The pool writes them back before it
    /// lets the write intent go of an extent.
    pub(crate) fn attach_sums(&self, sums: Arc<SpaceSums>) {
        let weak: std::sync::Weak<dyn crate::sums::WriteBack> =
            Arc::downgrade(&(sums.clone() as Arc<dyn crate::sums::WriteBack>));
        if self.sums.set(sums).is_ok() {
            self.pool.sums.add(weak);
        }
    }

    /// The sums of this volume's blocks, if it keeps them.
    pub(crate) fn sums(&self) -> Option<&Arc<SpaceSums>> {
        self.sums.get()
    }

    /// Whether writes record their extents in the pool's write intent: a
    /// redundant volume without a working write-back log in front (a log
    /// accounts for its space's writes itself, and logs recover from their
    /// records). A space whose log failed writes straight to the disks,
    /// and the log names none of those writes: should its disks be back by
    /// the next import, only the write intent says what to resync.
    pub(crate) fn uses_intent(&self) -> bool {
        (self.geometry.layout().failures_tolerated() > 0 || self.sums.get().is_some())
            && !self.logged.load(Ordering::Acquire)
            && !self.disjoint_writes()
    }

    /// Say whether a working write-back log in front accounts for this
    /// volume's writes (see [`Volume::uses_intent`]).
    pub(crate) fn set_logged(&self, logged: bool) {
        self.logged.store(logged, Ordering::Release);
    }

    /// The write intent of `[offset, offset + length)`, if this space keeps
    /// one: held until the write is done.
    async fn intent(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Option<crate::control::IntentGuard<'_>>, EngineError> {
        if length == 0 || !self.uses_intent() {
            return Ok(None);
        }
        let extent_bytes = self.geometry.extent_data_bytes();
        let first = (offset / extent_bytes) as u32;
        let last = ((offset + length - 1) / extent_bytes) as u32;
        self.pool
            .begin_intent(self.id, first..last + 1)
            .await
            .map(Some)
    }

    pub(crate) fn disjoint_writes(&self) -> bool {
        self.disjoint_writes.load(Ordering::Relaxed)
    }

    /// Declare that writers of this space never overlap (a log space).
    pub(crate) fn set_disjoint_writes(&self) {
        self.disjoint_writes.store(true, Ordering::Relaxed);
    }

    /// Of a sums volume: keep `pages` of journal at its end.
    pub(crate) fn set_sums_journal_pages(&self, pages: u64) {
        self.sums_journal_pages.store(pages, Ordering::Release);
    }

    /// Whether every slot of every extent under the range is complete (no
    /// lost column to reconstruct).
    pub(crate) fn healthy_for(&self, offset: u64, length: u64) -> bool {
        if length == 0 {
            return true;
        }
        let map = self.map();
        let extent_bytes = self.geometry.extent_data_bytes();
        (offset / extent_bytes..=(offset + length - 1) / extent_bytes).all(|extent| {
            map.extents
                .get(extent as usize)
                .is_some_and(|targets| targets.iter().all(Target::complete))
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> SpaceId {
        self.id
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn size_bytes(&self) -> u64 {
        self.map().size_bytes
    }

    /// Whether writes are refused (the pool is read-only).
    pub fn is_read_only(&self) -> bool {
        self.pool.read_only.is_some()
    }

    /// The write size that avoids read-modify-write: a full row for parity,
    /// one interleave otherwise.
    pub fn natural_write_bytes(&self) -> u64 {
        self.layout.natural_write_bytes(&self.geometry)
    }

    pub(crate) fn map(&self) -> Arc<SpaceMap> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Append extents and grow (their slabs are zeroed and committed).
    pub(crate) fn grow(&self, size_bytes: u64, extents: Vec<Arc<[Target]>>) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let mut grown: Vec<Arc<[Target]>> = map.extents.clone();
        grown.extend(extents);
        assert!(size_bytes >= map.size_bytes);
        assert_eq!(grown.len() as u64, self.geometry.extents_for(size_bytes));
        self.replace_map(&mut map, size_bytes, grown, Vec::new());
    }

    /// Drop the extents past `size_bytes` (a log giving back slabs its ring
    /// no longer reaches).
    pub(crate) fn shrink(&self, size_bytes: u64) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let keep = self.geometry.extents_for(size_bytes) as usize;
        assert!(size_bytes <= map.size_bytes && keep <= map.extents.len());
        let dropped = locations(&map.extents[keep..]).collect();
        let kept = map.extents[..keep].to_vec();
        self.replace_map(&mut map, size_bytes, kept, dropped);
    }

    /// The slots of `extent` as the map has them now (none if the extent
    /// is gone from it). See `RowIo::with_targets` for why requests look
    /// again under a row lock.
    pub(crate) fn current_extent(&self, extent: u64) -> Option<Arc<[Target]>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.extents.get(extent as usize).cloned()
    }

    /// Change where the slots of one extent live (moves starting or ending).
    pub(crate) fn update_extent(&self, extent: u64, change: impl FnOnce(&mut Vec<Target>)) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if extent >= map.extents.len() as u64 {
            return; // the space was deleted: its map is empty
        }
        let mut extents = map.extents.clone();
        let mut targets: Vec<Target> = extents[extent as usize].to_vec();
        change(&mut targets);
        let now: Vec<&Location> = targets.iter().flat_map(|t| t.locations.iter()).collect();
        let dropped = locations(&extents[extent as usize..=extent as usize])
            .filter(|old| !now.iter().any(|new| new.same_place(old)))
            .collect();
        extents[extent as usize] = targets.into();
        let size_bytes = map.size_bytes;
        self.replace_map(&mut map, size_bytes, extents, dropped);
    }

    /// Refuse requests from now on. The map loses its extents (its size
    /// stays, for the sums of work already under way), so that the slabs,
    /// free in the metadata once the deletion is committed, wait only for
    /// the requests under way, not for the last holder of this space (a
    /// client connection that stays open). A request that finds the map
    /// without extents finds the space deleted (see [`Volume::check`]).
    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let dropped = locations(&map.extents).collect();
        let size_bytes = map.size_bytes;
        self.replace_map(&mut map, size_bytes, Vec::new(), dropped);
    }

    /// Install a new map in place of `map`, the slabs of `dropped` (which
    /// the new map no longer names) retired until every request that may
    /// hold `map` or an older one is done (see [`MapEpoch`]).
    fn replace_map(
        &self,
        map: &mut Arc<SpaceMap>,
        size_bytes: u64,
        extents: Vec<Arc<[Target]>>,
        dropped: Vec<Location>,
    ) {
        let epoch = Arc::new(MapEpoch::default());
        let _ = map.epoch.next.set(epoch.clone());
        let slabs = dropped.iter().map(|location| self.slab_of(location));
        self.pool.retire(
            slabs,
            Arc::downgrade(&map.epoch) as crate::slab_holds::Epoch,
        );
        *map = Arc::new(SpaceMap {
            size_bytes,
            extents,
            epoch,
        });
    }

    /// The slab a location of this space lies in.
    fn slab_of(&self, location: &Location) -> SlabRef {
        SlabRef {
            disk: location.disk.index,
            slab: self.pool.slab_at(location.base, self.geometry.slab_bytes()),
        }
    }

    pub(crate) fn check(
        &self,
        offset: u64,
        length: u64,
        access: Access,
    ) -> Result<Arc<SpaceMap>, EngineError> {
        if length > REQUEST_MAX_BYTES {
            return Err(EngineError::TooLarge {
                space: self.name.clone(),
                length,
                limit: REQUEST_MAX_BYTES,
            });
        }
        self.check_range(offset, length, access)
    }

    /// [`Volume::check`] without the size limit: open, writable for a
    /// write, and within the space.
    pub(crate) fn check_range(
        &self,
        offset: u64,
        length: u64,
        access: Access,
    ) -> Result<Arc<SpaceMap>, EngineError> {
        // The map before the flag: a deletion sets the flag before it
        // takes the extents out of the map, so a request either holds the
        // map with them (and their slabs wait for it) or is refused here.
        let map = self.map();
        if self.deleted.load(Ordering::Acquire) {
            return Err(EngineError::NoSuchSpace {
                name: self.name.clone(),
            });
        }
        self.pool.check_open()?;
        if access == Access::Write {
            self.pool.check_writable()?;
        }
        if offset
            .checked_add(length)
            .is_none_or(|end| end > map.size_bytes)
        {
            return Err(EngineError::OutOfRange {
                space: self.name.clone(),
                offset,
                length,
                size_bytes: map.size_bytes,
            });
        }
        Ok(map)
    }

    pub(crate) fn row_io<'a>(&'a self, map: &'a SpaceMap, span: &RowSpan) -> RowIo<'a, Volume> {
        RowIo::new(self, &map.extents[span.extent as usize], span)
    }

    /// Read `length` bytes at `offset` (any byte granularity) from the
    /// disks: what a journal in front holds is not looked at.
    pub(crate) async fn read(&self, offset: u64, length: u64) -> Result<BytesMut, EngineError> {
        let map = self.check(offset, length, Access::Read)?;
        let start = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + length).next_multiple_of(BLOCK_BYTES);
        let mut buffer = self.read_blocks(&map, start, end - start).await?;
        buffer.advance((offset - start) as usize);
        buffer.truncate(length as usize);
        Ok(buffer)
    }

    /// Read whole blocks into one aligned buffer, each row span into its part.
    pub(crate) async fn read_blocks(
        &self,
        map: &SpaceMap,
        offset: u64,
        length: u64,
    ) -> Result<BytesMut, EngineError> {
        let buffer = aligned_buffer(length as usize);
        let mut spans = self.geometry.split_rows(offset, length);
        let buffer = if let Some(span) = spans.next().filter(|span| span.length == length) {
            // One row: no parts to cut and join.
            let result = read_span(&self.row_io(map, &span), &span, buffer).await;
            self.pool.persist_failures().await?;
            result?
        } else {
            let spans: Vec<RowSpan> = self.geometry.split_rows(offset, length).collect();
            let parts = split_buffer(buffer, spans.iter().map(|s| s.length));
            let reads = spans.iter().zip(parts).map(|(span, part)| async move {
                read_span(&self.row_io(map, span), span, part).await
            });
            let results = join_all(reads).await;
            self.pool.persist_failures().await?;
            let parts = results.into_iter().collect::<Result<Vec<_>, _>>()?;
            join_buffer(parts)
        };
        let extent_bytes = self.geometry.extent_data_bytes();
        match self.sums.get() {
            Some(sums) if Volume::all_allocated(map, offset, length, extent_bytes) => {
                self.verified(map, sums, offset, buffer, false).await
            }
            // An extent without slabs reads as zeroes whatever its sums say
            // (they are forgotten before an extent is given back, but a
            // crash may leave the older ones).
            Some(sums) => {
                let end = offset + length;
                let pieces: Vec<(u64, u64)> = (offset / extent_bytes..end.div_ceil(extent_bytes))
                    .map(|extent| {
                        let start = offset.max(extent * extent_bytes);
                        (start, end.min((extent + 1) * extent_bytes) - start)
                    })
                    .collect();
                let parts = split_buffer(buffer, pieces.iter().map(|piece| piece.1));
                let mut checked = Vec::with_capacity(pieces.len());
                for ((start, _), part) in pieces.into_iter().zip(parts) {
                    checked.push(match Volume::allocated(map, start / extent_bytes) {
                        true => Box::pin(self.verified(map, sums, start, part, false)).await?,
                        false => part,
                    });
                }
                Ok(join_buffer(checked))
            }
            None => Ok(buffer),
        }
    }

    /// Read the whole blocks of `span` (within one row) through `io`, whose
    /// caller holds the row lock, and check them against their sums as a
    /// read does (healing the row under that same lock): what a write is
    /// about to fold into parity or write back must be the truth, not a
    /// silently damaged copy.
    async fn read_verified(
        &self,
        map: &SpaceMap,
        io: &RowIo<'_, Volume>,
        span: &RowSpan,
    ) -> Result<BytesMut, EngineError> {
        debug_assert!(io.lock_held);
        let buffer = read_span(io, span, aligned_buffer(span.length as usize)).await?;
        match self.sums.get() {
            Some(sums) => {
                let offset = self.block_of(span) * BLOCK_BYTES;
                Box::pin(self.verified(map, sums, offset, buffer, true)).await
            }
            None => Ok(buffer),
        }
    }

    /// `[offset, offset + length)` as each copy of a mirror holds it, read
    /// on its own (one result per copy: copy `c` of every column); one
    /// read as [`Volume::read`] gives it for other layouts. A log reads
    /// its records so when the copy a read chose fails the record's
    /// checksums: a silently damaged copy must not cut recovery short or
    /// be taken for the data.
    pub(crate) async fn read_copies(
        &self,
        offset: u64,
        length: u64,
    ) -> Vec<Result<BytesMut, EngineError>> {
        let copies = self.geometry.layout().copies();
        if copies < 2 {
            return vec![self.read(offset, length).await];
        }
        let map = match self.check(offset, length, Access::Read) {
            Ok(map) => map,
            Err(error) => return vec![Err(error)],
        };
        let reads = (0..copies).map(|copy| {
            let map = &map;
            async move {
                let mut whole = aligned_buffer(length as usize);
                for span in self.geometry.split_rows(offset, length) {
                    let io = self.row_io(map, &span);
                    if io.targets.is_empty() {
                        continue; // never written: zeroes
                    }
                    for piece in self.geometry.split_columns(span) {
                        let column = self.geometry.physical_column(span.row, piece.data_column);
                        let slot = self.geometry.slot(column, copy);
                        let (buffer, result) = io
                            .read(
                                slot,
                                piece.column_offset,
                                aligned_buffer(piece.length as usize),
                            )
                            .await;
                        result.map_err(|error| EngineError::Unavailable {
                            space: self.name.clone(),
                            offset,
                            length,
                            reason: error.to_string(),
                        })?;
                        let at = piece.request_offset as usize;
                        whole[at..at + buffer.len()].copy_from_slice(&buffer);
                    }
                }
                Ok(whole)
            }
        });
        join_all(reads).await
    }

    /// The space block index of the first block of `span`.
    pub(crate) fn block_of(&self, span: &RowSpan) -> u64 {
        crate::heal::first_block(&self.geometry, span.extent, span.row)
            + span.row_offset / BLOCK_BYTES
    }

    /// `buffer`, read from whole blocks at `offset`, once every block in it
    /// matches its sum: a block that does not is rebuilt from the rest of
    /// its row (see [`crate::heal`]), the damaged copy rewritten in place,
    /// and the good bytes put in its stead. A block nothing rebuilds fails
    /// the read: wrong data is never returned. `lock_held`: the caller
    /// holds the lock of the (one) row the buffer lies in.
    async fn verified(
        &self,
        map: &SpaceMap,
        sums: &SpaceSums,
        offset: u64,
        mut buffer: BytesMut,
        lock_held: bool,
    ) -> Result<BytesMut, EngineError> {
        let first = offset / BLOCK_BYTES;
        let count = buffer.len() as u64 / BLOCK_BYTES;
        let expected = sums.get(first..first + count).await;
        let block = BLOCK_BYTES as usize;
        let mut rows: Vec<(u64, u64)> = Vec::new();
        for (i, &sum) in expected.iter().enumerate() {
            let index = first + i as u64;
            let bytes = &buffer[i * block..(i + 1) * block];
            if terrace_meta::sums::block_matches(bytes, index, sum) {
                continue;
            }
            let actual = terrace_meta::sums::block_sum(bytes, index);
            if !sums.in_flight(index, actual) {
                let row = self.geometry.locate(index * BLOCK_BYTES);
                let key = (row.extent, row.row);
                if rows.last() != Some(&key) {
                    rows.push(key);
                }
            }
        }
        let end = offset + buffer.len() as u64;
        for (extent, row) in rows {
            let healed = Box::pin(self.heal_row(map, sums, extent, row, lock_held)).await?;
            if let Some(&bad) = healed
                .unrecoverable
                .iter()
                .find(|&&bad| (first..first + count).contains(&bad))
            {
                return Err(EngineError::Unavailable {
                    space: self.name.clone(),
                    offset: bad * BLOCK_BYTES,
                    length: BLOCK_BYTES,
                    reason: "the block fails its checksum on every copy, and no reconstruction \
                             matches it"
                        .into(),
                });
            }
            // The row's blocks within the request, from the healed columns.
            let row_start =
                extent * self.geometry.extent_data_bytes() + row * self.geometry.row_data_bytes();
            let interleave = self.geometry.interleave_bytes();
            let to = end.min(row_start + self.geometry.row_data_bytes());
            let mut at = offset.max(row_start);
            while at < to {
                let within = at - row_start;
                let column = (within / interleave) as usize;
                let in_column = (within % interleave) as usize;
                let take = (interleave as usize - in_column).min((to - at) as usize);
                let Some(Some(content)) = healed.columns.get(column) else {
                    return Err(EngineError::Unavailable {
                        space: self.name.clone(),
                        offset: at,
                        length: take as u64,
                        reason: "no copy of the column could be read".into(),
                    });
                };
                let into = (at - offset) as usize;
                buffer[into..into + take].copy_from_slice(&content[in_column..in_column + take]);
                at += take as u64;
            }
        }
        Ok(buffer)
    }

    /// Check, under the row lock `io` holds, the old data a parity update
    /// of `span` (part of a row) is about to read, so that a block damaged
    /// in silence is healed before it is folded into new parity (where
    /// parity would then hold the damage, and rebuild it as the truth).
    /// Which data that is follows the layout's choice (`layouts/parity.rs`):
    /// with every slot online and the span's own bytes plus parity the
    /// cheaper read, a read-modify-write reads the span's old bytes; else a
    /// reconstruct-write reads the band the span covers of every data
    /// column it does not cover whole.
    async fn check_parity_reads(&self, map: &SpaceMap, io: &RowIo<'_, Volume>, span: &RowSpan) {
        let geometry = &self.geometry;
        let pieces: Vec<terrace_layout::ColumnPiece> = geometry.split_columns(*span).collect();
        let low = pieces.iter().map(|p| p.column_offset).min().unwrap_or(0);
        let high = pieces
            .iter()
            .map(|p| p.column_offset + p.length)
            .max()
            .unwrap_or(0);
        let width = high - low;
        let covers = |column: u32| {
            pieces
                .iter()
                .any(|p| p.data_column == column && p.column_offset == low && p.length == width)
        };
        let untouched: Vec<u32> = (0..geometry.data_columns())
            .filter(|&column| !covers(column))
            .collect();
        let redundancy = u64::from(geometry.layout().failures_tolerated());
        let modify_bytes = span.length + redundancy * width;
        let reconstruct_bytes = untouched.len() as u64 * width;
        let all_online = (0..geometry.slots_per_extent()).all(|slot| io.online(slot));
        let reads: Vec<RowSpan> = if all_online && modify_bytes < reconstruct_bytes {
            vec![*span]
        } else {
            let interleave = geometry.interleave_bytes();
            untouched
                .iter()
                .map(|&column| RowSpan {
                    row_offset: u64::from(column) * interleave + low,
                    length: width,
                    request_offset: 0,
                    ..*span
                })
                .collect()
        };
        // A block nothing rebuilds is left as it is: parity encoded from
        // it, or updated over it, still rebuilds nothing that passes its
        // sum, and its reads still fail. The update itself goes on (and
        // fails where its own reads do). What passed is what the update
        // reads: a repair's rewrite the disk acknowledged and lost leaves
        // the damage on the disk, and reading it again would fold it in.
        for read in &reads {
            // Checked already by this I/O (a merged update read the span).
            let known = self
                .slot_pieces(read)
                .all(|(slot, piece)| io.knows(slot, piece.column_offset, piece.length));
            if known {
                continue;
            }
            let Ok(checked) = self.read_verified(map, io, read).await else {
                continue;
            };
            self.remember_read(io, read, checked.freeze());
        }
    }

    /// Serve later reads of this I/O within `read` from `bytes`, what it
    /// read there (see [`RowIo::remember`]).
    fn remember_read(&self, io: &RowIo<'_, Volume>, read: &RowSpan, bytes: Bytes) {
        for (slot, piece) in self.slot_pieces(read) {
            let at = (piece.request_offset - read.request_offset) as usize;
            io.remember(
                slot,
                piece.column_offset,
                bytes.slice(at..at + piece.length as usize),
            );
        }
    }

    /// Each column piece of a parity row span, with the slot holding it.
    fn slot_pieces(
        &self,
        read: &RowSpan,
    ) -> impl Iterator<Item = (u32, terrace_layout::ColumnPiece)> + '_ {
        let (geometry, row) = (&self.geometry, read.row);
        geometry.split_columns(*read).map(move |piece| {
            let column = geometry.physical_column(row, piece.data_column);
            (geometry.slot(column, 0), piece)
        })
    }

    /// Rebuild the blocks of one row that fail their sums, under the row's
    /// lock (taken here unless the caller holds it: `lock_held`): rewrite
    /// each damaged copy in place (unless the pool is read-only), tell each
    /// repair, and give what the row holds.
    async fn heal_row(
        &self,
        map: &SpaceMap,
        sums: &SpaceSums,
        extent: u64,
        row: u64,
        lock_held: bool,
    ) -> Result<crate::heal::RowHeal, EngineError> {
        let span = self.geometry.whole_row(extent, row);
        let _guard = match lock_held {
            true => None,
            false => Some(self.locks.lock((extent, row)).await),
        };
        let io = RowIo {
            lock_held: true,
            ..self.row_io(map, &span)
        };
        let slots = crate::resync::read_slots(&io).await;
        let healed = crate::heal::heal_row(&io, sums, &slots, false).await;
        let row_offset =
            extent * self.geometry.extent_data_bytes() + row * self.geometry.row_data_bytes();
        for (slot, content, blocks) in &healed.fixes {
            let disk = io.with_targets(|targets| {
                targets[*slot as usize]
                    .readable(row)
                    .map(|location| location.disk.clone())
            });
            if let Some(disk) = &disk {
                disk.count_checksum_error();
            }
            let rewritten = !self.is_read_only()
                && io
                    .write(*slot, 0, content.clone().freeze(), true)
                    .await
                    .is_ok();
            self.pool.events.emit(crate::events::PoolEvent::Healed {
                space: self.name.clone(),
                offset: row_offset,
                length: self.geometry.row_data_bytes(),
                disk: disk.map(|disk| disk.index),
                blocks: *blocks,
                rewritten,
            });
        }
        if let Some(&bad) = healed.unrecoverable.first() {
            self.pool
                .events
                .emit(crate::events::PoolEvent::Unrecoverable {
                    space: self.name.clone(),
                    offset: bad * BLOCK_BYTES,
                    blocks: healed.unrecoverable.len() as u64,
                });
        }
        self.pool.persist_failures().await?;
        Ok(healed)
    }

    /// Write straight to the disks, past any write-back cache (the cache's
    /// own destaging and bypass, and spaces without one).
    pub(crate) async fn write_home(
        &self,
        offset: u64,
        data: impl Into<Payload>,
        fua: bool,
    ) -> Result<(), EngineError> {
        let data = data.into();
        // Room first; a range outside the space is refused just below.
        self.provide(offset, data.len() as u64).await?;
        let map = self.check(offset, data.len() as u64, Access::Write)?;
        let result = self.write_checked(&map, offset, &data, fua).await;
        self.pool.persist_failures().await?;
        result
    }

    /// Write block-aligned `pieces` (sorted, apart, all within one row)
    /// straight to the disks as one update of the row: under the row lock,
    /// read the row from the first piece to the end of the last, lay the
    /// pieces over it and write that range once. Destaging uses it where a
    /// row holds many dirty pieces: on parity, one update instead of a
    /// read-modify-write of data and parity for each piece.
    pub(crate) async fn write_home_merged(
        &self,
        pieces: &[(u64, Payload)],
    ) -> Result<(), EngineError> {
        let (Some((start, _)), Some((last, data))) = (pieces.first(), pieces.last()) else {
            return Ok(());
        };
        let (start, end) = (*start, last + data.len() as u64);
        self.provide(start, end - start).await?;
        let map = self.check(start, end - start, Access::Write)?;
        let result = self.merge_checked(&map, start, end, pieces).await;
        self.pool.persist_failures().await?;
        result
    }

    async fn merge_checked(
        &self,
        map: &SpaceMap,
        start: u64,
        end: u64,
        pieces: &[(u64, Payload)],
    ) -> Result<(), EngineError> {
        let mut spans = self.geometry.split_rows(start, end - start);
        let (Some(span), None) = (spans.next(), spans.next()) else {
            // Not within one row: piece by piece.
            for (offset, data) in pieces {
                self.write_checked(map, *offset, data, false).await?;
            }
            return Ok(());
        };
        let _writing = self.track_missing(map, start, end - start).await?;
        let _intent = self.intent(start, end - start).await?;
        let _guard = self.locks.lock((span.extent, span.row)).await;
        let io = RowIo {
            lock_held: true,
            ..self.row_io(map, &span)
        };
        // Checked: the gaps between the pieces are written back as read.
        // A parity update reads the same old data again (to check it, and
        // to fold it out of parity): it is served from what was read here.
        let read = self.read_verified(map, &io, &span).await?;
        let mut merged = if matches!(self.layout, Layouts::Parity(_)) {
            // Kept as read; the merge goes into a copy.
            let old = read.freeze();
            let merged = BytesMut::from(&old[..]);
            self.remember_read(&io, &span, old);
            merged
        } else {
            read
        };
        for (offset, data) in pieces {
            let at = (offset - start) as usize;
            data.copy_to(&mut merged[at..at + data.len()]);
        }
        let result = write_span(map, &io, &span, &Payload::from(merged.freeze()), false).await;
        self.note_failed_during(map, start, end - start);
        result
    }

    /// Before writing extents with a missing disk, record them dirty for
    /// it; a disk leaving, or present but out of service, counts as
    /// missing. The guard returned is held
    /// until the write is done: a disk is marked missing only once every
    /// write that looked at it before it was leaving has finished (see
    /// [`crate::departures`]).
    pub(crate) async fn track_missing(
        &self,
        map: &SpaceMap,
        offset: u64,
        length: u64,
    ) -> Result<Writing<'_>, EngineError> {
        let (writing, leaving) = self.pool.departures.enter();
        if length == 0 {
            return Ok(writing);
        }
        let extent_bytes = self.geometry.extent_data_bytes();
        for extent in offset / extent_bytes..=(offset + length - 1) / extent_bytes {
            let missing = out_of_service(&map.extents[extent as usize], &leaving);
            if !missing.is_empty() {
                // Boxed: a commit's state would otherwise enlarge every write.
                Box::pin(self.pool.note_dirty(self.id, extent as u32, &missing)).await?;
            }
        }
        Ok(writing)
    }

    /// Refuse a write to an extent with more of its disks out of service
    /// (missing, standby, failed) than its layout tolerates, before
    /// anything is recorded or written. The write could not complete; and
    /// had its extent been recorded missed for the disks away, there would
    /// be nothing to catch them up from when they return, so the extent
    /// would stay lost although they hold it whole (two of three disks of a
    /// single-parity pool unplugged for a moment, one write meanwhile).
    fn refuse_beyond_tolerance(
        &self,
        map: &SpaceMap,
        offset: u64,
        length: u64,
    ) -> Result<(), EngineError> {
        if length == 0 {
            return Ok(());
        }
        let extent_bytes = self.geometry.extent_data_bytes();
        for extent in offset / extent_bytes..=(offset + length - 1) / extent_bytes {
            let targets = &map.extents[extent as usize];
            if let Some(why) = beyond_tolerance(&self.geometry, targets) {
                return Err(EngineError::Unavailable {
                    space: self.name.clone(),
                    offset,
                    length,
                    reason: format!("extent {extent}: {why}; nothing was written"),
                });
            }
        }
        Ok(())
    }

    async fn write_checked(
        &self,
        map: &SpaceMap,
        offset: u64,
        data: &Payload,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.refuse_beyond_tolerance(map, offset, data.len() as u64)?;
        let _writing = self.track_missing(map, offset, data.len() as u64).await?;
        let _intent = self.intent(offset, data.len() as u64).await?;
        let rows = self.geometry.split_rows(offset, data.len() as u64);
        let result = all_ok(rows.map(|span| self.write_row(map, span, data, fua))).await;
        self.note_failed_during(map, offset, data.len() as u64);
        result
    }

    /// After a write: the disks of its extents that are failed now may
    /// have failed after it looked at them (it recorded nothing missed for
    /// them then) and before it reached them (it left them out, or its
    /// write failed there). Noted missed, to be recorded with the failure
    /// before the write completes (see `PoolShared::note_failed_write`);
    /// those failed before it looked are known already and cost nothing.
    fn note_failed_during(&self, map: &SpaceMap, offset: u64, length: u64) {
        if length == 0 {
            return;
        }
        let extent_bytes = self.geometry.extent_data_bytes();
        for extent in offset / extent_bytes..=(offset + length - 1) / extent_bytes {
            for target in map.extents[extent as usize].iter() {
                let disk = &target.home().disk;
                if disk.condition() == Condition::Failed {
                    self.pool
                        .note_failed_write(disk.index, self.id, extent as u32);
                }
            }
        }
    }

    /// Write one row span. A span that starts or ends inside a block reads
    /// the edge blocks and writes them back whole, holding the row lock
    /// across both so no other writer of the row slips in between.
    async fn write_row(
        &self,
        map: &SpaceMap,
        span: RowSpan,
        data: &Payload,
        fua: bool,
    ) -> Result<(), EngineError> {
        let (start, end) = (span.row_offset, span.row_offset + span.length);
        if start.is_multiple_of(BLOCK_BYTES) && end.is_multiple_of(BLOCK_BYTES) {
            return write_span(map, &self.row_io(map, &span), &span, data, fua).await;
        }
        if start / BLOCK_BYTES == (end - 1) / BLOCK_BYTES {
            let piece = data
                .slice(span.request_offset as usize..(span.request_offset + span.length) as usize);
            return self.write_within_block(map, span, piece, fua).await;
        }
        let _guard = self.locks.lock((span.extent, span.row)).await;
        let io = RowIo {
            lock_held: true,
            ..self.row_io(map, &span)
        };
        let aligned_start = start / BLOCK_BYTES * BLOCK_BYTES;
        let aligned_end = end.next_multiple_of(BLOCK_BYTES);
        let mut merged = aligned_buffer((aligned_end - aligned_start) as usize);
        let block = |row_offset| RowSpan {
            row_offset,
            length: BLOCK_BYTES,
            request_offset: 0,
            ..span
        };
        // The edges are checked: their bytes outside the write are
        // written back with a new sum.
        if start != aligned_start {
            let head = self.read_verified(map, &io, &block(aligned_start)).await?;
            merged[..BLOCK_BYTES as usize].copy_from_slice(&head);
        }
        let tail_start = aligned_end - BLOCK_BYTES;
        if end != aligned_end && (tail_start != aligned_start || start == aligned_start) {
            let tail = self.read_verified(map, &io, &block(tail_start)).await?;
            merged[(tail_start - aligned_start) as usize..].copy_from_slice(&tail);
        }
        let source =
            data.slice(span.request_offset as usize..(span.request_offset + span.length) as usize);
        merged[(start - aligned_start) as usize..(end - aligned_start) as usize]
            .copy_from_slice(&source);
        let expanded = RowSpan {
            row_offset: aligned_start,
            length: aligned_end - aligned_start,
            request_offset: 0,
            ..span
        };
        write_span(map, &io, &expanded, &Payload::from(merged.freeze()), fua).await
    }

    /// Write `piece` into part of one block (`span`), merged with the
    /// other such writes into its row that arrive while this one waits
    /// (see [`crate::block_merge`]): under one hold of the row lock, each
    /// run of neighbouring blocks they touch is read once and written
    /// once for all of them.
    async fn write_within_block(
        &self,
        map: &SpaceMap,
        span: RowSpan,
        piece: Bytes,
        fua: bool,
    ) -> Result<(), EngineError> {
        let row = (span.extent, span.row);
        let leading = loop {
            match self.merges.join(row, span.row_offset, piece.clone(), fua) {
                Joined::Lead(leading) => break leading,
                Joined::Follow(answer) => match answer.await {
                    Ok(outcome) => {
                        return outcome.map_err(|reason| EngineError::Unavailable {
                            space: self.name.clone(),
                            offset: self.block_of(&span) * BLOCK_BYTES
                                + span.row_offset % BLOCK_BYTES,
                            length: span.length,
                            reason,
                        })
                    }
                    // The leader was dropped: start over.
                    Err(_) => continue,
                },
            }
        };
        let _guard = self.locks.lock(row).await;
        let group = leading.take();
        let io = RowIo {
            lock_held: true,
            ..self.row_io(map, &span)
        };
        let mut blocks: Vec<u64> = group
            .pieces
            .iter()
            .map(|(at, _)| at / BLOCK_BYTES)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut runs: Vec<RowSpan> = Vec::new();
        for block in blocks {
            match runs.last_mut() {
                Some(run) if run.row_offset + run.length == block * BLOCK_BYTES => {
                    run.length += BLOCK_BYTES;
                }
                _ => runs.push(RowSpan {
                    row_offset: block * BLOCK_BYTES,
                    length: BLOCK_BYTES,
                    request_offset: 0,
                    ..span
                }),
            }
        }
        let result = self.merge_runs(map, &io, &runs, &group).await;
        group.finish(&result.as_ref().map(|_| ()).map_err(ToString::to_string));
        result
    }

    /// Read `runs` (whole blocks of one row, whose lock `io` holds; the
    /// bytes outside the writes are written back with new sums, so they
    /// are checked first), lay `group`'s writes over them and write them.
    /// Parity runs go one after the other: each updates the row's parity,
    /// and a read that finds damage heals the whole row.
    async fn merge_runs(
        &self,
        map: &SpaceMap,
        io: &RowIo<'_, Volume>,
        runs: &[RowSpan],
        group: &crate::block_merge::Group,
    ) -> Result<(), EngineError> {
        let parity = matches!(self.layout, Layouts::Parity(_));
        let mut reads = Vec::with_capacity(runs.len());
        for run in runs {
            reads.push(self.read_verified(map, io, run));
        }
        let read = match parity {
            // A read that finds damage heals the whole row: one at a time.
            true => {
                let mut read = Vec::with_capacity(runs.len());
                for one in reads {
                    read.push(one.await);
                }
                read
            }
            false => join_all(reads).await,
        };
        let mut merged = Vec::with_capacity(runs.len());
        for (run, read) in runs.iter().zip(read) {
            let mut bytes = read?;
            let covered = run.row_offset..run.row_offset + run.length;
            for (at, piece) in group.pieces.iter().filter(|(at, _)| covered.contains(at)) {
                let from = (at - run.row_offset) as usize;
                bytes[from..from + piece.len()].copy_from_slice(piece);
            }
            merged.push(Payload::from(bytes.freeze()));
        }
        let mut writes = Vec::with_capacity(runs.len());
        for (run, data) in runs.iter().zip(&merged) {
            writes.push(write_span(map, io, run, data, group.fua));
        }
        if parity {
            for write in writes {
                write.await?;
            }
            Ok(())
        } else {
            all_ok(writes).await
        }
    }

    /// Whole blocks go to the zeroing path; partial edge blocks are written
    /// with zeroes (write-zeroes) or left alone (trim).
    pub(crate) async fn zero_checked(
        &self,
        map: &SpaceMap,
        offset: u64,
        length: u64,
        mode: zero::Mode,
    ) -> Result<(), EngineError> {
        let extent_bytes = self.geometry.extent_data_bytes();
        let extents = offset / extent_bytes..(offset + length).div_ceil(extent_bytes);
        if extents
            .clone()
            .any(|extent| !Volume::allocated(map, extent))
        {
            // An extent without slabs (a thin space's, never written)
            // reads as zeroes already: only the others are zeroed.
            for extent in extents.filter(|&extent| Volume::allocated(map, extent)) {
                let start = offset.max(extent * extent_bytes);
                let end = (offset + length).min((extent + 1) * extent_bytes);
                Box::pin(self.zero_checked(map, start, end - start, mode)).await?;
            }
            return Ok(());
        }
        if let Err(error) = self.refuse_beyond_tolerance(map, offset, length) {
            // A trim is advisory: left undone.
            return match mode {
                zero::Mode::Trim => Ok(()),
                _ => Err(error),
            };
        }
        let _writing = self.track_missing(map, offset, length).await?;
        let _intent = self.intent(offset, length).await?;
        let end = offset + length;
        let body_start = offset.next_multiple_of(BLOCK_BYTES).min(end);
        let body_end = (end / BLOCK_BYTES * BLOCK_BYTES).max(body_start);
        let mut edges = Vec::new();
        if let zero::Mode::Zeroes { fua } = mode {
            for (start, stop) in [(offset, body_start), (body_end, end)] {
                if stop > start {
                    let zeroes = Payload::from(Bytes::from(vec![0u8; (stop - start) as usize]));
                    edges.push(async move { self.write_checked(map, start, &zeroes, fua).await });
                }
            }
        }
        let body = async {
            if body_end <= body_start {
                return Ok(());
            }
            let Some(sums) = self.sums.get() else {
                return zero::zero_range(
                    self,
                    &map.extents,
                    body_start,
                    body_end - body_start,
                    mode,
                )
                .await;
            };
            if let (Layouts::Parity(_), zero::Mode::Zeroes { fua }) = (&self.layout, mode) {
                // Parity zeroes through its write path (as its layout
                // does): a part of a row updates parity from old data,
                // which that path checks first; the blocks get their sums.
                let length = body_end - body_start;
                let zeroes = Payload::from(Bytes::from(vec![0u8; length as usize]));
                let rows = self.geometry.split_rows(body_start, length);
                return all_ok(rows.map(|span| self.write_row(map, span, &zeroes, fua))).await;
            }
            // Zeroed blocks read as zeroes, and are known so; trimmed
            // blocks as zeroes or (a trim left undone) as they were, and a
            // failed zeroing may have left either: their sums are forgotten.
            let blocks = body_start / BLOCK_BYTES..body_end / BLOCK_BYTES;
            let _inflight = sums.begin(blocks.start, blocks.end - blocks.start, None);
            let result =
                zero::zero_range(self, &map.extents, body_start, body_end - body_start, mode).await;
            match (&result, mode) {
                (Ok(()), zero::Mode::Zeroes { .. }) => sums.zeroed(blocks).await,
                _ => sums.forget(blocks).await,
            }
            result
        };
        let (edges, body) = futures::join!(join_all(edges), body);
        self.note_failed_during(map, offset, length);
        edges.into_iter().chain(std::iter::once(body)).collect()
    }

    /// The disks the space's extents lie on, each once.
    fn own_disks(&self) -> Vec<Arc<Disk>> {
        let map = self.map();
        let mut seen = std::collections::BTreeSet::new();
        let mut disks = Vec::new();
        for targets in &map.extents {
            for location in targets.iter().flat_map(|t| t.locations.iter()) {
                if seen.insert(location.disk.index) {
                    disks.push(location.disk.clone());
                }
            }
        }
        disks
    }

    /// Whether every online disk of the space says FUA costs it nothing
    /// (see `BlockDevice::cheap_fua`). Asked per log record: it walks the
    /// map in place (a disk met twice answers twice) and allocates nothing.
    pub(crate) fn cheap_fua(&self) -> bool {
        self.map()
            .extents
            .iter()
            .flat_map(|targets| targets.iter().flat_map(|t| t.locations.iter()))
            .map(|location| &location.disk)
            .filter(|disk| disk.is_online())
            .all(|disk| disk.device().is_some_and(|device| device.cheap_fua()))
    }

    /// Whether the space's data sits on spinning drives: some disk holding
    /// its slabs says it spins (see `BlockDevice::rotational`). Its NBD
    /// export tells clients so, which pick their I/O scheduling and file
    /// system layout by it.
    pub fn rotational(&self) -> bool {
        self.map()
            .extents
            .iter()
            .flat_map(|targets| targets.iter().flat_map(|t| t.locations.iter()))
            .filter_map(|location| location.disk.device())
            .any(|device| device.rotational() == Some(true))
    }

    /// Flush only the disks this space's slabs are on (a log's group
    /// commit: the pool's other disks have nothing of it to flush).
    pub(crate) async fn flush_own_disks(&self) -> Result<(), EngineError> {
        let disks = self.own_disks();
        join_all(disks.iter().filter(|d| d.is_online()).map(|d| d.flush())).await;
        self.pool.persist_failures().await?;
        self.readable_everywhere()
    }

    /// Fail unless every extent still has its data (tolerance not exceeded).
    pub(crate) fn readable_everywhere(&self) -> Result<(), EngineError> {
        let map = self.map();
        for (index, targets) in map.extents.iter().enumerate() {
            if !targets.is_empty()
                && self
                    .geometry
                    .remaining_tolerance(|slot| !targets[slot as usize].complete())
                    .is_none()
            {
                return Err(EngineError::Unavailable {
                    space: self.name.clone(),
                    offset: index as u64 * self.geometry.extent_data_bytes(),
                    length: self.geometry.extent_data_bytes(),
                    reason: "more disks of this extent are lost than the layout tolerates".into(),
                });
            }
        }
        Ok(())
    }
}

impl RowHost for Volume {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn locks(&self) -> &RowLocks {
        &self.locks
    }

    fn disjoint_writes(&self) -> bool {
        Volume::disjoint_writes(self)
    }

    fn current_extent(&self, extent: u64) -> Option<Arc<[Target]>> {
        Volume::current_extent(self, extent)
    }

    fn missed(&self, disk: DiskIndex, extent: u64) {
        self.pool.note_failed_write(disk, self.id, extent as u32);
    }

    fn read_failed(&self, disk: DiskIndex, extent: u64, row: u64, rewritten: bool) {
        let row_bytes = self.geometry.row_data_bytes();
        self.pool.events.emit(crate::events::PoolEvent::ReadError {
            space: self.name.clone(),
            offset: extent * self.geometry.extent_data_bytes() + row * row_bytes,
            length: row_bytes,
            disk,
            rewritten,
        });
    }

    fn may_rewrite(&self) -> bool {
        !self.is_read_only()
    }
}

impl LayoutHost for Volume {
    fn layout(&self) -> &Layouts {
        &self.layout
    }

    fn sums(&self) -> Option<&SpaceSums> {
        self.sums.get().map(|sums| &**sums)
    }
}

/// `[offset, offset + length)` cut into the pieces a trim or write-zeroes
/// is done in: at most [`REQUEST_MAX_BYTES`] each (a piece that falls back
/// to writing zeroes, through a log or on a degraded row, holds that much
/// in memory), cut at multiples of a whole number of rows, so that a
/// request of whole rows stays whole rows in every piece (parity zeroes
/// whole rows without reading them).
pub(crate) fn zero_pieces(
    geometry: &Geometry,
    offset: u64,
    length: u64,
) -> impl Iterator<Item = (u64, u64)> {
    let row_bytes = geometry.row_data_bytes();
    let piece_bytes = match REQUEST_MAX_BYTES / row_bytes {
        0 => REQUEST_MAX_BYTES,
        rows => rows * row_bytes,
    };
    let end = offset + length;
    let mut start = offset;
    std::iter::from_fn(move || {
        if start >= end {
            return None;
        }
        let stop = ((start / piece_bytes + 1) * piece_bytes).min(end);
        let piece = (start, stop - start);
        start = stop;
        Some(piece)
    })
}

/// The disks holding slots of an extent (`targets`) that a write to it
/// misses and must record dirty for: missing, failed (a failure may be
/// passing, and `Pool::clear` takes the disk back), present but out of
/// service (Standby: a disk returning at an import is welcomed back only
/// after recovery wrote), or `leaving`.
pub(crate) fn out_of_service(targets: &[Target], leaving: &[DiskIndex]) -> Vec<DiskIndex> {
    targets
        .iter()
        .map(|target| &target.home().disk)
        .filter(|disk| match disk.condition() {
            Condition::Missing | Condition::Standby | Condition::Failed => true,
            Condition::Online => leaving.contains(&disk.index),
        })
        .map(|disk| disk.index)
        .collect()
}

/// Why an extent whose slots are `targets` cannot take writes, if it
/// cannot: more of its slots' disks out of service than its layout
/// tolerates (a mirror column with no copy, more parity columns than its
/// redundancy, any column of a simple extent).
fn beyond_tolerance(geometry: &Geometry, targets: &[Target]) -> Option<String> {
    let away = |slot: u32| targets[slot as usize].home().disk.condition() != Condition::Online;
    if targets.is_empty() || geometry.remaining_tolerance(away).is_some() {
        return None;
    }
    let gone = (0..geometry.slots_per_extent())
        .filter(|&slot| away(slot))
        .count();
    Some(format!(
        "{gone} of its {} slots' disks are out of service, more than its layout tolerates",
        geometry.slots_per_extent()
    ))
}

/// Every location of every slot of `extents`.
fn locations(extents: &[Arc<[Target]>]) -> impl Iterator<Item = Location> + '_ {
    extents
        .iter()
        .flat_map(|targets| targets.iter())
        .flat_map(|target| target.locations.iter().cloned())
}

impl Volume {
    /// Resynchronise `row` of `extent` of a mirror after an unclean shutdown
    /// if it still wants it (see [`crate::crash_resync`]): under the row's
    /// lock, which the caller may hold already (`lock_held`: a sub-block
    /// write reading its edges, whose own record of missing disks covers the
    /// extent).
    pub(crate) async fn resync_crashed_row(
        &self,
        extent: u64,
        row: u64,
        lock_held: bool,
    ) -> Result<(), EngineError> {
        if !self.pool.crash_resync.wanted(self.id, extent, row) {
            return Ok(());
        }
        let row_bytes = self.geometry.row_data_bytes();
        let (_writing, _guard) = if lock_held {
            (None, None)
        } else {
            let offset = extent * self.geometry.extent_data_bytes() + row * row_bytes;
            let writing = self.track_missing(&self.map(), offset, row_bytes).await?;
            (Some(writing), Some(self.locks.lock((extent, row)).await))
        };
        // Another reader, the background pass or a move may have done it
        // while this one waited for the lock.
        if !self.pool.crash_resync.wanted(self.id, extent, row) {
            return Ok(());
        }
        // The slots' places as they are under the lock.
        let map = self.map();
        if Volume::allocated(&map, extent) {
            let span = self.geometry.whole_row(extent, row);
            check_row(&self.row_io(&map, &span), Pass::Resync).await;
        }
        self.pool.crash_resync.done(self.id, extent, row);
        Ok(())
    }
}

/// A sums volume keeps a space's sums pages: page `index` at byte
/// `index × 4096`, then its journal's pages, each copy of the mirror
/// read on its own (a page whose copies differ is settled by the page's
/// generation, not by the mirror).
impl crate::sums::SumsStore for Volume {
    fn read_page(
        &self,
        index: u64,
    ) -> futures::future::BoxFuture<'_, Vec<Result<BytesMut, EngineError>>> {
        Box::pin(async move {
            let offset = index * PAGE_BYTES;
            let Ok(map) = self.check_range(offset, PAGE_BYTES, Access::Read) else {
                return Vec::new();
            };
            let Some(span) = self.geometry.split_rows(offset, PAGE_BYTES).next() else {
                return Vec::new();
            };
            if !Volume::allocated(&map, span.extent) {
                // Never written (a thin sums space): a blank page.
                return vec![Ok(aligned_buffer(PAGE_BYTES as usize))];
            }
            let io = self.row_io(&map, &span);
            let piece = self.geometry.locate(offset);
            let slot_copies = (0..self.geometry.slots_per_extent())
                .filter(|&slot| {
                    slot / self.geometry.layout().copies()
                        == self.geometry.physical_column(span.row, piece.data_column)
                })
                .collect::<Vec<u32>>();
            let reads = slot_copies
                .into_iter()
                .filter(|&slot| io.online(slot))
                .map(|slot| {
                    let io = &io;
                    async move {
                        let (buffer, result) = io
                            .read(
                                slot,
                                piece.column_offset,
                                aligned_buffer(PAGE_BYTES as usize),
                            )
                            .await;
                        result
                            .map(|()| buffer)
                            .map_err(|error| EngineError::Unavailable {
                                space: self.name.clone(),
                                offset,
                                length: PAGE_BYTES,
                                reason: error.to_string(),
                            })
                    }
                });
            join_all(reads).await
        })
    }

    fn write_pages(
        &self,
        first: u64,
        bytes: Bytes,
    ) -> futures::future::BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(self.write_home(first * PAGE_BYTES, bytes, false))
    }

    fn pages(&self) -> u64 {
        (self.size_bytes() / PAGE_BYTES).saturating_sub(self.journal_pages())
    }

    fn journal_pages(&self) -> u64 {
        self.sums_journal_pages.load(Ordering::Acquire)
    }

    fn provide(
        &self,
        pages: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(self.provide(
            pages.start * PAGE_BYTES,
            (pages.end - pages.start) * PAGE_BYTES,
        ))
    }

    /// Its disks flushed; a write that failed said so itself (an extent
    /// beyond its tolerance elsewhere is no reason to refuse a checkpoint).
    fn flush(&self) -> futures::future::BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let disks = self.own_disks();
            join_all(disks.iter().filter(|d| d.is_online()).map(|d| d.flush())).await;
            self.pool.persist_failures().await
        })
    }
}

const PAGE_BYTES: u64 = terrace_meta::sums::SUMS_PAGE_BYTES as u64;

/// Read one row span with its layout's handler.
async fn read_span(
    io: &RowIo<'_, Volume>,
    span: &RowSpan,
    part: BytesMut,
) -> Result<BytesMut, EngineError> {
    // Since a crash, a (mirror) row is read only once its copies agree.
    let space = io.host;
    if space.pool.crash_resync.wanted(space.id, io.extent, io.row) {
        // Boxed: rare, and every read's future would carry its state.
        Box::pin(space.resync_crashed_row(io.extent, io.row, io.lock_held)).await?;
    }
    if io.targets.is_empty() {
        // An extent without slabs (a thin space's): zeroes, no I/O.
        let mut part = part;
        part.fill(0);
        return Ok(part);
    }
    let (part, result) = space.layout.read(io, span, part).await;
    result.map(|()| part)
}

/// Write one block-aligned row span with its layout's handler, and set
/// its blocks' sums (named in flight until the write is done, see
/// [`SpaceSums`]; unknown if it failed, when copies may hold either).
async fn write_span(
    map: &SpaceMap,
    io: &RowIo<'_, Volume>,
    span: &RowSpan,
    data: &Payload,
    fua: bool,
) -> Result<(), EngineError> {
    let Some(sums) = io.host.sums.get() else {
        return io.host.layout.write(io, span, data, fua).await;
    };
    // A parity update of part of a row reads old data; it is checked first,
    // under the row lock the update then runs under.
    let partial = matches!(io.host.layout, Layouts::Parity(_))
        && span.length < io.geometry().row_data_bytes();
    let _guard = match partial && !io.lock_held {
        true => Some(io.host.locks.lock((io.extent, io.row)).await),
        false => None,
    };
    // A caller that holds the lock keeps what its I/O remembered.
    let held;
    let io = if partial && !io.lock_held {
        held = io.with_lock_held();
        &held
    } else {
        io
    };
    if partial {
        io.host.check_parity_reads(map, io, span).await;
    }
    let first = io.host.block_of(span);
    let block = BLOCK_BYTES as usize;
    let start = span.request_offset as usize;
    // Block by block: a view of the payload, copied only for a block that
    // spans two of its buffers (a whole-span slice of a gathered payload
    // would copy every byte).
    let sum = |k: usize, index: u64| {
        let at = start + k * block;
        terrace_meta::sums::block_sum(&data.slice(at..at + block), index)
    };
    let new: Vec<u64> = match data.sums(start..start + span.length as usize) {
        Some(known) => {
            debug_assert!(
                known
                    .iter()
                    .zip(first..)
                    .enumerate()
                    .all(|(k, (&known, index))| known == sum(k, index)),
                "sums taken on arrival are the blocks' own"
            );
            known.to_vec()
        }
        None => (0..span.length as usize / block)
            .zip(first..)
            .map(|(k, index)| sum(k, index))
            .collect(),
    };
    let inflight = sums.begin(first, new.len() as u64, Some(new.clone()));
    let result = io.host.layout.write(io, span, data, fua).await;
    match &result {
        Ok(()) => sums.set(first, &new).await,
        Err(_) => {
            sums.set(first, &vec![terrace_meta::sums::UNKNOWN; new.len()])
                .await
        }
    }
    drop(inflight);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use terrace_layout::Layout;

    /// Trims and zeroing of any length go in pieces within the request
    /// limit, cut on whole rows, that cover the range exactly once.
    #[test]
    fn zeroing_pieces_are_bounded_row_aligned_and_cover_the_range() {
        let parity = Geometry::new(Layout::Parity { redundancy: 1 }, 8, 256 << 10, 256 << 20)
            .expect("geometry");
        let row = parity.row_data_bytes();
        let wide = Geometry::new(Layout::Simple, 8, 16 << 20, 256 << 20).expect("geometry");
        for (geometry, offset, length) in [
            (&parity, 0, 512 << 20),
            (&parity, 3 * row, 1000 * row),
            (&parity, 4095, (3 << 30) + 17),
            (&parity, 0, 0),
            (&wide, 5, 1 << 30),
        ] {
            let pieces: Vec<(u64, u64)> = zero_pieces(geometry, offset, length).collect();
            let mut next = offset;
            for &(start, piece) in &pieces {
                assert_eq!(start, next, "pieces follow each other");
                assert!(piece > 0 && piece <= REQUEST_MAX_BYTES, "{piece}");
                next = start + piece;
            }
            assert_eq!(next, offset + length, "pieces cover the range");
            let row = geometry.row_data_bytes();
            if row <= REQUEST_MAX_BYTES && offset % row == 0 && length % row == 0 {
                assert!(pieces
                    .iter()
                    .all(|&(start, piece)| start % row == 0 && piece % row == 0));
            }
        }
        assert!(zero_pieces(&parity, 0, 512 << 20).count() > 1 && row < REQUEST_MAX_BYTES);
    }

    /// An epoch lives while any epoch before it does, and a chain far
    /// longer than a thread's stack could drop recursively goes in a loop.
    #[test]
    fn an_epoch_outlives_the_older_ones_and_a_long_chain_drops() {
        let first = Arc::new(MapEpoch::default());
        let mut last = first.clone();
        let mut second = None;
        for _ in 0..1_000_000 {
            let next = Arc::new(MapEpoch::default());
            let _ = last.next.set(next.clone());
            second.get_or_insert_with(|| Arc::downgrade(&next));
            last = next;
        }
        let (second, newest) = (second.unwrap(), Arc::downgrade(&last));
        drop(last);
        assert!(second.strong_count() > 0 && newest.strong_count() > 0);
        drop(first);
        assert_eq!((second.strong_count(), newest.strong_count()), (0, 0));
    }
}
