//! A space: the virtual disk clients read and write.
//!
//! # Ordering and durability contract
//!
//! * Offsets and lengths are multiples of [`BLOCK_BYTES`] (4 KiB); a request
//!   is at most [`REQUEST_MAX_BYTES`].
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::future::join_all;
use terrace_io::{aligned_buffer, Bytes, BytesMut};
use terrace_layout::{Geometry, Layout, RowSpan, BLOCK_BYTES};
use terrace_meta::SpaceId;

use crate::control::PoolShared;
use crate::disk::Disk;
use crate::error::EngineError;
use crate::row::RowIo;
use crate::row_lock::RowLocks;
use crate::{mirror, parity, simple, zero};

/// Largest request: 64 MiB bounds the memory one request pins (NBD clients
/// send at most 32 MiB).
pub const REQUEST_MAX_BYTES: u64 = 64 << 20;

/// One slot of an extent: its disk and where its slab starts.
#[derive(Clone)]
pub struct Target {
    pub disk: Arc<Disk>,
    pub base: u64,
}

/// The mapping of a space: size and the targets of every extent.
pub struct SpaceMap {
    pub size_bytes: u64,
    pub extents: Vec<Arc<[Target]>>,
}

pub struct Space {
    pub(crate) pool: Arc<PoolShared>,
    pub(crate) id: SpaceId,
    pub(crate) name: String,
    pub(crate) geometry: Geometry,
    map: RwLock<Arc<SpaceMap>>,
    pub(crate) locks: RowLocks,
    deleted: AtomicBool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

impl Space {
    pub(crate) fn new(
        pool: Arc<PoolShared>,
        id: SpaceId,
        name: String,
        geometry: Geometry,
        map: SpaceMap,
    ) -> Space {
        Space {
            pool,
            id,
            name,
            geometry,
            map: RwLock::new(Arc::new(map)),
            locks: RowLocks::default(),
            deleted: AtomicBool::new(false),
        }
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
        match self.geometry.layout() {
            Layout::Parity { .. } => self.geometry.row_data_bytes(),
            Layout::Simple | Layout::Mirror { .. } => self.geometry.interleave_bytes(),
        }
    }

    pub(crate) fn map(&self) -> Arc<SpaceMap> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
    }

    fn check(
        &self,
        offset: u64,
        length: u64,
        access: Access,
    ) -> Result<Arc<SpaceMap>, EngineError> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(EngineError::NoSuchSpace {
                name: self.name.clone(),
            });
        }
        self.pool.check_open()?;
        if access == Access::Write {
            self.pool.check_writable()?;
        }
        let map = self.map();
        if !offset.is_multiple_of(BLOCK_BYTES) || !length.is_multiple_of(BLOCK_BYTES) {
            return Err(EngineError::Misaligned {
                space: self.name.clone(),
                offset,
                length,
                alignment: BLOCK_BYTES,
            });
        }
        if length > REQUEST_MAX_BYTES {
            return Err(EngineError::TooLarge {
                space: self.name.clone(),
                length,
                limit: REQUEST_MAX_BYTES,
            });
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

    pub(crate) fn row_io<'a>(&'a self, map: &'a SpaceMap, span: &RowSpan) -> RowIo<'a> {
        RowIo {
            space: self,
            extent: span.extent,
            row: span.row,
            targets: &map.extents[span.extent as usize],
        }
    }

    /// Read `length` bytes at `offset`. The buffer is aligned for direct I/O.
    pub async fn read(&self, offset: u64, length: u64) -> Result<BytesMut, EngineError> {
        let map = self.check(offset, length, Access::Read)?;
        let spans: Vec<RowSpan> = self.geometry.split_rows(offset, length).collect();
        let parts = split_buffer(
            aligned_buffer(length as usize),
            spans.iter().map(|s| s.length),
        );
        let layout = self.geometry.layout();
        let reads = spans.iter().zip(parts).map(|(span, part)| {
            let io = self.row_io(&map, span);
            async move {
                match layout {
                    Layout::Simple => simple::read(&io, span, part).await,
                    Layout::Mirror { .. } => mirror::read(&io, span, part).await,
                    Layout::Parity { .. } => parity::read(&io, span, part).await,
                }
            }
        });
        let results = join_all(reads).await;
        self.pool.persist_failures().await?;
        let mut parts = Vec::with_capacity(results.len());
        for (part, result) in results {
            result?;
            parts.push(part);
        }
        Ok(join_buffer(parts))
    }

    /// Write `data` at `offset`; with `fua` it is durable on return.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), EngineError> {
        let map = self.check(offset, data.len() as u64, Access::Write)?;
        let layout = self.geometry.layout();
        let writes = self
            .geometry
            .split_rows(offset, data.len() as u64)
            .map(|span| {
                let io = self.row_io(&map, &span);
                let data = &data;
                async move {
                    match layout {
                        Layout::Simple => simple::write(&io, &span, data, fua).await,
                        Layout::Mirror { .. } => mirror::write(&io, &span, data, fua).await,
                        Layout::Parity { .. } => parity::write(&io, &span, data, fua).await,
                    }
                }
            });
        let results = join_all(writes).await;
        self.pool.persist_failures().await?;
        results.into_iter().collect()
    }

    /// Make `[offset, offset + length)` read as zeroes.
    pub async fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        let map = self.check(offset, length, Access::Write)?;
        let result = zero::zero_range(self, &map, offset, length, zero::Mode::Zeroes { fua }).await;
        self.pool.persist_failures().await?;
        result
    }

    /// Advise that `[offset, offset + length)` is no longer needed.
    pub async fn trim(&self, offset: u64, length: u64) -> Result<(), EngineError> {
        let map = self.check(offset, length, Access::Write)?;
        let result = zero::zero_range(self, &map, offset, length, zero::Mode::Trim).await;
        self.pool.persist_failures().await?;
        result
    }

    /// Make every completed write durable.
    pub async fn flush(&self) -> Result<(), EngineError> {
        self.check(0, 0, Access::Read)?;
        self.pool.flush_disks().await?;
        self.readable_everywhere()
    }

    /// Fail unless every extent still has its data (tolerance not exceeded).
    pub(crate) fn readable_everywhere(&self) -> Result<(), EngineError> {
        let map = self.map();
        for (index, targets) in map.extents.iter().enumerate() {
            if self
                .geometry
                .remaining_tolerance(|slot| !targets[slot as usize].disk.is_online())
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
