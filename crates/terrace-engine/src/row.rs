//! I/O on one row of one extent: the only thing layout handlers see.
//!
//! A [`RowIo`] is built from the row's place (extent, row), the extent's
//! slots ([`Target`]s) and a [`RowHost`]: the little a row needs from the
//! space above it (its geometry and name, its row locks, the slots as they
//! are now, and where a write that missed a disk is reported). Nothing
//! here names the space or the pool; the host is a type parameter, so each
//! call is static. A slot's I/O fails with a [`RowError`]: the slot has no
//! valid copy of the row, or its disk failed ([`DiskError`]).
//!
//! May depend on: `target`, `disk` (through it), `row_lock`, `error`,
//! `terrace_layout`, `terrace_io`.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::join_all;
use terrace_io::{Bytes, BytesMut};
use terrace_layout::{ColumnPiece, Geometry, RowSpan};
use terrace_meta::DiskIndex;

use crate::disk::DiskError;
use crate::error::EngineError;
use crate::row_lock::{RowGuard, RowLocks};
use crate::target::{Location, Target};

/// What the rows of a space need from the space: implemented by the space
/// above, called by the row-level code below it.
pub(crate) trait RowHost {
    fn geometry(&self) -> &Geometry;

    /// The space's name, for errors.
    fn name(&self) -> &str;

    fn locks(&self) -> &RowLocks;

    /// Writers never overlap (a log space): they share row locks.
    fn disjoint_writes(&self) -> bool;

    /// The slots of `extent` as they are now (none if the extent is gone).
    fn current_extent(&self, extent: u64) -> Option<Arc<[Target]>>;

    /// A write of `extent` failed on `disk`: the disk missed the extent.
    fn missed(&self, disk: DiskIndex, extent: u64);

    /// A read of row `row` of `extent` failed on `disk`, which stays in
    /// service; `rewritten`: its slot's row was rebuilt from redundancy
    /// and written back.
    fn read_failed(&self, _disk: DiskIndex, _extent: u64, _row: u64, _rewritten: bool) {}

    /// Whether rows may be rewritten where they read wrong (not on a
    /// read-only pool).
    fn may_rewrite(&self) -> bool {
        true
    }
}

/// Why I/O on one slot of a row failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RowError {
    /// No location of the slot holds this row (its disks are out of
    /// service, or a move has not reached the row).
    #[error("slot {slot} holds no valid copy of row {row}")]
    NoValidCopy { slot: u32, row: u64 },
    #[error(transparent)]
    Disk(#[from] DiskError),
}

pub(crate) struct RowIo<'a, H: RowHost> {
    pub host: &'a H,
    pub extent: u64,
    pub row: u64,
    pub targets: &'a [Target],
    /// The caller already holds this row's lock (a sub-block write reading
    /// its edges and writing them back in one critical section).
    pub lock_held: bool,
    /// Slots whose read failed on a disk that stays in service (an
    /// unreadable sector), with that disk: for the rest of this I/O they
    /// are not read again (the layout rebuilds them as if lost), and they
    /// are rewritten from redundancy before it ends
    /// (`layouts::rewrite_unreadable`).
    pub(crate) unreadable: Unreadable,
    /// Parts of slots this I/O read and checked against their sums (a
    /// parity update's old data): read again in the same I/O, they are
    /// served from here, not from the disk, where a repair's rewrite the
    /// disk lost (acknowledged, never made) would leave the old damage
    /// to be folded into parity.
    pub(crate) known: Known,
}

/// The remembered piece holding `length` bytes of `slot` from
/// `column_offset`: where it starts, and its bytes.
fn known_piece(
    pieces: &[(u32, u64, Bytes)],
    slot: u32,
    column_offset: u64,
    length: u64,
) -> Option<(u64, &Bytes)> {
    let end = column_offset + length;
    pieces
        .iter()
        .find(|(s, at, bytes)| *s == slot && *at <= column_offset && end <= at + bytes.len() as u64)
        .map(|(_, at, bytes)| (*at, bytes))
}

/// A list one row's I/O almost never fills (slots it could not read,
/// bytes it checked): every planning step and every read asks it, so an
/// empty one answers with one atomic load and no lock.
pub(crate) struct Rare<T> {
    any: AtomicBool,
    items: Mutex<Vec<T>>,
}

impl<T> Default for Rare<T> {
    fn default() -> Self {
        Rare {
            any: AtomicBool::new(false),
            items: Mutex::new(Vec::new()),
        }
    }
}

impl<T> Rare<T> {
    /// `f` of the items, unless there are none (without a lock).
    fn with<R>(&self, f: impl FnOnce(&[T]) -> R) -> Option<R> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        Some(f(&self.items.lock().unwrap_or_else(|e| e.into_inner())))
    }

    fn push(&self, item: T) {
        self.items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(item);
        self.any.store(true, Ordering::Release);
    }

    fn retain(&self, keep: impl FnMut(&T) -> bool) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        items.retain(keep);
        self.any.store(!items.is_empty(), Ordering::Release);
    }
}

/// Slots whose read failed on a disk still in service, with that disk.
pub(crate) type Unreadable = Rare<(u32, DiskIndex)>;

/// Checked bytes of slots: (slot, column offset, bytes).
pub(crate) type Known = Rare<(u32, u64, Bytes)>;

impl<'a, H: RowHost> RowIo<'a, H> {
    /// I/O on the row of `span`, whose extent has the slots `targets`.
    pub fn new(host: &'a H, targets: &'a [Target], span: &RowSpan) -> RowIo<'a, H> {
        RowIo {
            host,
            extent: span.extent,
            row: span.row,
            targets,
            lock_held: false,
            unreadable: Unreadable::default(),
            known: Known::default(),
        }
    }

    /// I/O on the same row for a caller that holds its lock.
    pub fn with_lock_held(&self) -> RowIo<'a, H> {
        RowIo {
            host: self.host,
            extent: self.extent,
            row: self.row,
            targets: self.targets,
            lock_held: true,
            unreadable: Unreadable::default(),
            known: Known::default(),
        }
    }

    /// The slots whose reads failed on disks still in service, and those
    /// disks.
    pub fn unreadable_slots(&self) -> Vec<(u32, DiskIndex)> {
        self.unreadable.with(<[_]>::to_vec).unwrap_or_default()
    }

    /// Let `slot` be read again (it was rewritten, or given up on).
    pub fn forget_unreadable(&self, slot: u32) {
        self.unreadable.retain(|&(s, _)| s != slot);
    }

    /// Take the row lock unless the caller holds it already.
    pub async fn lock(&self) -> Option<RowGuard<'_>> {
        if self.lock_held {
            None
        } else {
            Some(self.host.locks().lock((self.extent, self.row)).await)
        }
    }

    /// The lock a whole-block write of `span` takes: the span's bytes of
    /// the row, so writers of other blocks of the row proceed at the same
    /// time; shared on a space whose writers never overlap (a log), so
    /// appends to one row do not queue behind each other. Moves, rebuilds,
    /// parity updates and sub-block writes still take the row exclusively.
    pub async fn lock_for_write(&self, span: &RowSpan) -> Option<RowGuard<'_>> {
        let key = (self.extent, self.row);
        if self.lock_held {
            None
        } else if self.host.disjoint_writes() {
            Some(self.host.locks().lock_shared(key).await)
        } else {
            let range = (span.row_offset, span.row_offset + span.length);
            Some(self.host.locks().lock_range(key, range).await)
        }
    }

    pub fn geometry(&self) -> &Geometry {
        self.host.geometry()
    }

    /// Run `f` on the extent's slots as the space has them now, not as
    /// they were when the request began (`self.targets`). A move that
    /// started meanwhile adds its target to a slot, and one that ended
    /// takes the slot off its old slab: a write that went by the older
    /// view left the target without the row when the move had filled it
    /// before the row lock came to the write, and reads of the moved slot
    /// returned the old data (found by the simulation once it ran the job
    /// runner). Callers hold the row's lock, as moves do while they fill.
    pub(crate) fn with_targets<R>(&self, f: impl FnOnce(&[Target]) -> R) -> R {
        match self.host.current_extent(self.extent) {
            Some(targets) => f(&targets),
            None => f(self.targets),
        }
    }

    /// Whether this row of `slot` can be read (some location holds it, and
    /// a read of it has not failed in this I/O).
    pub fn online(&self, slot: u32) -> bool {
        self.with_targets(|targets| targets[slot as usize].readable(self.row).is_some())
            && !self
                .unreadable
                .with(|slots| slots.iter().any(|&(s, _)| s == slot))
                .unwrap_or(false)
    }

    fn disk_offset(&self, location: &Location, column_offset: u64) -> u64 {
        location.base + self.geometry().slab_offset(self.row, column_offset)
    }

    /// Serve later reads of `bytes` of `slot` at `column_offset` from
    /// them, not from the disk, until the slot is written (see
    /// [`RowIo::known`]).
    pub(crate) fn remember(&self, slot: u32, column_offset: u64, bytes: Bytes) {
        self.known.push((slot, column_offset, bytes));
    }

    /// Forget what was remembered of `slot`: it changed without a write
    /// to it (a lost column, changed in parity only).
    pub(crate) fn forget(&self, slot: u32) {
        self.known.retain(|(s, _, _)| *s != slot);
    }

    /// Whether `length` bytes of `slot` at `column_offset` are remembered
    /// (see [`RowIo::remember`]).
    pub(crate) fn knows(&self, slot: u32, column_offset: u64, length: u64) -> bool {
        self.known
            .with(|pieces| known_piece(pieces, slot, column_offset, length).is_some())
            == Some(true)
    }

    pub async fn read(
        &self,
        slot: u32,
        column_offset: u64,
        mut buf: BytesMut,
    ) -> (BytesMut, Result<(), RowError>) {
        let known = self.known.with(|pieces| {
            let (at, bytes) = known_piece(pieces, slot, column_offset, buf.len() as u64)?;
            let from = (column_offset - at) as usize;
            let length = buf.len();
            buf.copy_from_slice(&bytes[from..from + length]);
            Some(())
        });
        if known.flatten().is_some() {
            return (buf, Ok(()));
        }
        let location =
            self.with_targets(|targets| targets[slot as usize].readable(self.row).cloned());
        let Some(location) = location else {
            let row = self.row;
            return (buf, Err(RowError::NoValidCopy { slot, row }));
        };
        let offset = self.disk_offset(&location, column_offset);
        let (buf, result) = location.disk.read(offset, buf).await;
        if result.is_err() && location.disk.is_online() {
            // The disk survived the error: the slot is lost to this I/O
            // only, and rewritten once the layout has rebuilt it.
            let index = location.disk.index;
            let listed = self
                .unreadable
                .with(|slots| slots.iter().any(|&(s, _)| s == slot));
            if listed != Some(true) {
                self.unreadable.push((slot, index));
            }
        }
        (buf, result.map_err(RowError::Disk))
    }

    /// Write to every valid location of the slot (as the space has them
    /// now, see [`RowIo::with_targets`]); succeeds if one took it (a
    /// location that fails has latched its disk failed).
    pub async fn write(
        &self,
        slot: u32,
        column_offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), RowError> {
        self.forget(slot);
        let (first, more) = self.with_targets(|targets| {
            let mut locations = targets[slot as usize].writable(self.row);
            let first = locations.next().cloned();
            // Empty, and so not allocated, unless the slot is moving.
            let more: Vec<Location> = locations.cloned().collect();
            (first, more)
        });
        if let (Some(only), true) = (&first, more.is_empty()) {
            // The usual case, a slot that is not moving: one location.
            let offset = self.disk_offset(only, column_offset);
            let result = only.disk.write(offset, data, fua).await;
            if result.is_err() {
                self.missed(only);
            }
            return result.map_err(RowError::Disk);
        }
        let locations: Vec<&Location> = first.iter().chain(&more).collect();
        let writes: Vec<_> = locations
            .iter()
            .map(|location| {
                let offset = self.disk_offset(location, column_offset);
                location.disk.write(offset, data.clone(), fua)
            })
            .collect();
        let results = join_all(writes).await;
        for (location, result) in locations.iter().zip(&results) {
            if result.is_err() {
                self.missed(location);
            }
        }
        if results.iter().any(Result::is_ok) {
            return Ok(());
        }
        let row = self.row;
        Err(results
            .into_iter()
            .find_map(Result::err)
            .map_or(RowError::NoValidCopy { slot, row }, RowError::Disk))
    }

    /// A write to `location` failed: its disk missed this extent.
    fn missed(&self, location: &Location) {
        self.host.missed(location.disk.index, self.extent);
    }

    /// The error for a span whose data cannot be served, for `reason`: the
    /// user-facing text is made here, once.
    pub fn unavailable(&self, span: &RowSpan, reason: impl fmt::Display) -> EngineError {
        let geometry = self.geometry();
        EngineError::Unavailable {
            space: self.host.name().to_owned(),
            offset: span.extent * geometry.extent_data_bytes()
                + span.row * geometry.row_data_bytes()
                + span.row_offset,
            length: span.length,
            reason: reason.to_string(),
        }
    }
}

/// Read every column piece of a span into its part of `buffer` with
/// `read_piece`, all at once; the first error names the span.
pub(crate) async fn read_pieces<'a, H: RowHost, F, R, E: fmt::Display>(
    io: &'a RowIo<'_, H>,
    span: &RowSpan,
    buffer: BytesMut,
    read_piece: F,
) -> (BytesMut, Result<(), EngineError>)
where
    F: Fn(ColumnPiece, BytesMut) -> R,
    R: Future<Output = (BytesMut, Result<(), E>)> + 'a,
{
    let mut split = io.geometry().split_columns(*span);
    if let Some(piece) = split.next().filter(|piece| piece.length == span.length) {
        // One column: no parts to cut and join.
        let (buffer, result) = read_piece(piece, buffer).await;
        return (buffer, result.map_err(|error| io.unavailable(span, error)));
    }
    let pieces: Vec<ColumnPiece> = io.geometry().split_columns(*span).collect();
    let parts = split_buffer(buffer, pieces.iter().map(|piece| piece.length));
    let reads = pieces
        .into_iter()
        .zip(parts)
        .map(|(piece, part)| read_piece(piece, part));
    let mut first_error = None;
    let mut parts = Vec::new();
    for (part, result) in join_all(reads).await {
        if let Err(error) = result {
            first_error.get_or_insert(error);
        }
        parts.push(part);
    }
    let result = match first_error {
        None => Ok(()),
        Some(error) => Err(io.unavailable(span, error)),
    };
    (join_buffer(parts), result)
}

/// Cut an aligned buffer into consecutive parts of the given lengths.
pub(crate) fn split_buffer(
    mut buffer: BytesMut,
    lengths: impl Iterator<Item = u64>,
) -> Vec<BytesMut> {
    let mut parts: Vec<BytesMut> = lengths
        .map(|length| buffer.split_to(length as usize))
        .collect();
    debug_assert!(buffer.is_empty());
    if parts.is_empty() {
        parts.push(buffer);
    }
    parts
}

/// Join consecutive parts cut by [`split_buffer`]; O(1) per part when they
/// are still adjacent.
pub(crate) fn join_buffer(parts: Vec<BytesMut>) -> BytesMut {
    let mut parts = parts.into_iter();
    let mut whole = parts.next().unwrap_or_default();
    for part in parts {
        whole.unsplit(part);
    }
    whole
}

/// Await every future and return the first error in their order. One
/// future is awaited in place; more are collected first, so that
/// `join_all` knows their count and uses its single-allocation form (an
/// iterator of unknown length makes it build a `FuturesOrdered`, with an
/// allocation per future).
pub(crate) async fn all_ok<F, E>(futures: impl IntoIterator<Item = F>) -> Result<(), E>
where
    F: Future<Output = Result<(), E>>,
{
    let mut futures = futures.into_iter();
    let Some(first) = futures.next() else {
        return Ok(());
    };
    let Some(second) = futures.next() else {
        return first.await;
    };
    let all: Vec<F> = [first, second].into_iter().chain(futures).collect();
    join_all(all).await.into_iter().collect()
}
