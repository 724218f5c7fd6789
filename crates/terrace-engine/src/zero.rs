//! Write-zeroes and trim.
//!
//! Whole rows are zeroed on every slot at the device level (a hole punched
//! in a file, a zero-out on a block device): all-zero data has all-zero P and
//! Q, so parity stays consistent without computing anything, and consecutive
//! rows of an extent are contiguous on each slab, so a long range becomes one
//! device call per slot per chunk. Partial rows of simple and mirror spaces
//! are zeroed the same way, piece by piece; partial parity rows are written
//! with zeroes through the ordinary write path (write-zeroes) or left alone
//! (trim, which is advisory).
//!
//! May depend on: `layouts` and what it depends on.

use std::sync::Arc;

use futures::future::join_all;

use crate::error::EngineError;
use crate::layouts::{LayoutHost, RowLayout};
use crate::row::RowIo;
use crate::target::Target;

pub use crate::layouts::ZeroMode as Mode;

/// Rows locked and zeroed together: bounds the locks one request holds and
/// the size of one device call (256 rows of 256 KiB = 64 MiB per slot).
const CHUNK_ROWS: u64 = 256;

/// Zero `[offset, offset + length)` of the space `space`, whose extents'
/// slots were `extents` when the request began.
pub(crate) async fn zero_range<H: LayoutHost>(
    space: &H,
    extents: &[Arc<[Target]>],
    offset: u64,
    length: u64,
    mode: Mode,
) -> Result<(), EngineError> {
    let geometry = space.geometry();
    let row_bytes = geometry.row_data_bytes();
    let end = offset + length;
    let body_start = offset.next_multiple_of(row_bytes).min(end);
    let body_end = (end / row_bytes * row_bytes).max(body_start);
    let mut partials = Vec::new();
    for (start, stop) in [(offset, body_start), (body_end, end)] {
        if stop > start {
            partials.push(zero_partial(space, extents, start, stop - start, mode));
        }
    }
    let mut chunks = Vec::new();
    let mut row_start = body_start;
    while row_start < body_end {
        let location = geometry.locate(row_start);
        let rows_left_in_extent = geometry.rows_per_extent() - location.row;
        let rows = ((body_end - row_start) / row_bytes)
            .min(rows_left_in_extent)
            .min(CHUNK_ROWS);
        chunks.push(zero_rows(
            space,
            extents,
            location.extent,
            location.row,
            rows,
            mode,
        ));
        row_start += rows * row_bytes;
    }
    let (partials, chunks) = futures::join!(join_all(partials), join_all(chunks));
    partials.into_iter().chain(chunks).collect()
}

/// Zero `rows` whole rows from `first_row` of `extent` on every slot.
async fn zero_rows<H: LayoutHost>(
    space: &H,
    extents: &[Arc<[Target]>],
    extent: u64,
    first_row: u64,
    rows: u64,
    mode: Mode,
) -> Result<(), EngineError> {
    let geometry = space.geometry();
    // Rows in ascending order: two requests locking several rows never
    // wait on each other in a cycle.
    let mut guards = Vec::new();
    for row in first_row..first_row + rows {
        guards.push(space.locks().lock((extent, row)).await);
    }
    // The slots' places as they are under the locks (a move installed
    // since the request began has a target here that must be zeroed too;
    // see `RowIo::with_targets`).
    let current = space.current_extent(extent);
    let targets = current.as_deref().unwrap_or(&extents[extent as usize]);
    let offset_in_slab = geometry.slab_offset(first_row, 0);
    let length = rows * geometry.interleave_bytes();
    let zeroes = targets
        .iter()
        .flat_map(|target| target.locations.iter())
        .filter(|location| location.disk.is_online())
        .map(|location| {
            location
                .disk
                .write_zeroes(location.base + offset_in_slab, length, mode.fua())
        });
    join_all(zeroes).await;
    if geometry
        .remaining_tolerance(|slot| !targets[slot as usize].complete())
        .is_none()
    {
        return Err(EngineError::Unavailable {
            space: space.name().to_owned(),
            offset: extent * geometry.extent_data_bytes() + first_row * geometry.row_data_bytes(),
            length: rows * geometry.row_data_bytes(),
            reason: "more disks of this extent are lost than the layout tolerates".into(),
        });
    }
    Ok(())
}

/// Zero a range that lies within single rows (at most two of them).
async fn zero_partial<H: LayoutHost>(
    space: &H,
    extents: &[Arc<[Target]>],
    offset: u64,
    length: u64,
    mode: Mode,
) -> Result<(), EngineError> {
    let layout = space.layout();
    for span in space.geometry().split_rows(offset, length) {
        let io = RowIo::new(space, &extents[span.extent as usize], &span);
        layout.zero_span(&io, &span, mode).await?;
    }
    Ok(())
}
