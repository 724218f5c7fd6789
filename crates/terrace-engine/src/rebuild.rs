//! Filling a slab row by row: the one mechanism behind repair, moves and
//! the catch-up of a returning disk.
//!
//! For each step of rows, under their locks: find each row's content for
//! the slot — from another valid location of the slot (a move off an
//! online disk), from another mirror copy, or rebuilt from the other parity
//! columns — write it to the destination, and raise the destination's
//! watermark past the step.
//! From then on client writes of that row also go to the destination (see
//! `target.rs`), so the destination stays current behind the watermark.
//!
//! May depend on: `layouts` and what it depends on.

use std::sync::atomic::Ordering;

use terrace_io::{aligned_buffer, BytesMut};

use crate::disk::DiskError;
use crate::error::EngineError;
use crate::layouts::{LayoutHost, RowFailure, RowLayout};
use crate::row::RowIo;
use crate::target::Location;

/// Why one row of a slab could not be filled.
#[derive(Debug, thiserror::Error)]
enum FillError {
    /// Another valid location of the slot could not be read.
    #[error(transparent)]
    Source(DiskError),
    /// The slot's content could not be had from the row's other slots.
    #[error(transparent)]
    Content(RowFailure),
    #[error("the destination failed: {0}")]
    Destination(#[source] DiskError),
}

/// The content of one row of `slot`, from anywhere but `destination`.
async fn row_content<H: LayoutHost>(
    io: &RowIo<'_, H>,
    slot: u32,
    destination: &Location,
) -> Result<BytesMut, FillError> {
    let geometry = io.geometry();
    let width = geometry.interleave_bytes() as usize;
    let offset = geometry.slab_offset(io.row, 0);
    let target = &io.targets[slot as usize];
    let elsewhere = target
        .locations
        .iter()
        .find(|location| !location.same_place(destination) && location.valid_for(io.row));
    if let Some(source) = elsewhere {
        let (buffer, result) = source
            .disk
            .read(source.base + offset, aligned_buffer(width))
            .await;
        match result {
            Ok(()) => return Ok(buffer),
            // An unreadable sector of a disk still in service: the row
            // is rebuilt from the others instead, as for a lost source.
            Err(_) if source.disk.is_online() => {}
            Err(error) => return Err(FillError::Source(error)),
        }
    }
    io.host
        .layout()
        .slot_content(io, slot)
        .await
        .map_err(FillError::Content)
}

/// Bring `rows` of `slot` of `extent` into `destination` and raise its
/// watermark past them. Returns the bytes written.
///
/// The rows are locked together (in ascending order, as every holder of
/// several row locks takes them), read and written all at once, and the
/// watermark is raised before the locks go: a client write of one of them
/// waits, then sees the destination current and writes it too. Issuing a
/// step's rows together keeps the source and the destination streaming
/// (a drive sees the whole step queued) instead of one row's read and
/// write at a time. `write_through` writes past the destination drive's
/// cache, so that the step ends only once the drive holds it (a mover
/// pacing itself by the clients counts on that).
pub(crate) async fn fill_rows<H: LayoutHost>(
    space: &H,
    extent: u64,
    slot: u32,
    destination: &Location,
    rows: std::ops::Range<u64>,
    write_through: bool,
) -> Result<u64, EngineError> {
    let geometry = *space.geometry();
    let mark = destination
        .valid_below
        .as_ref()
        .expect("a destination being filled has a watermark");
    let mut guards = Vec::new();
    for row in rows.clone() {
        guards.push(space.locks().lock((extent, row)).await);
    }
    // The slots' places as they are under the locks, not before them.
    let Some(targets) = space.current_extent(extent) else {
        // The space was deleted: the move ends as its space is gone.
        return Ok(0);
    };
    let fills = rows.clone().map(|row| {
        let targets = &targets;
        async move {
            let span = geometry.whole_row(extent, row);
            let io = RowIo {
                lock_held: true,
                ..RowIo::new(space, targets, &span)
            };
            let content = row_content(&io, slot, destination)
                .await
                .map_err(|reason| io.unavailable(&span, reason))?;
            let offset = destination.base + geometry.slab_offset(row, 0);
            let length = content.len() as u64;
            destination
                .disk
                .write(offset, content.freeze(), write_through)
                .await
                .map_err(|error| io.unavailable(&span, FillError::Destination(error)))?;
            Ok::<u64, EngineError>(length)
        }
    });
    let mut written = 0;
    for filled in futures::future::join_all(fills).await {
        written += filled?;
    }
    mark.fetch_max(rows.end, Ordering::AcqRel);
    drop(guards);
    Ok(written)
}
