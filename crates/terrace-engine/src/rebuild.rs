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
use crate::row_lock::RowGuard;
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

/// Rows of a slab copied into their destination, their locks still held:
/// the watermark may pass them only once every row below them is copied
/// too, so the mover raises it step by step in order ([`Copied::settle`]).
pub(crate) struct Copied<'a> {
    rows_end: u64,
    /// Bytes written to the destination.
    pub(crate) bytes: u64,
    _guards: Vec<RowGuard<'a>>,
}

impl Copied<'_> {
    /// Raise `destination`'s watermark past these rows, then let their
    /// locks go: a client write of one of them waited, and now sees the
    /// destination current and writes it too.
    pub(crate) fn settle(self, destination: &Location) -> u64 {
        destination
            .valid_below
            .as_ref()
            .expect("a destination being filled has a watermark")
            .fetch_max(self.rows_end, Ordering::AcqRel);
        self.bytes
    }
}

/// Copy `rows` of `slot` of `extent` into `destination`, holding their
/// locks until the [`Copied`] settles (or drops, leaving the watermark).
///
/// The rows are locked together (in ascending order, as every holder of
/// several row locks takes them), read and written all at once: a drive
/// sees the whole step queued and streams it, instead of one row's read
/// and write at a time. A mover keeps a few steps of one slab in flight,
/// so that the source reads the next step while the destination writes
/// this one.
pub(crate) async fn copy_rows<'a, H: LayoutHost>(
    space: &'a H,
    extent: u64,
    slot: u32,
    destination: &Location,
    rows: std::ops::Range<u64>,
    write_through: bool,
) -> Result<Copied<'a>, EngineError> {
    let geometry = *space.geometry();
    let mut guards = Vec::new();
    for row in rows.clone() {
        guards.push(space.locks().lock((extent, row)).await);
    }
    // The slots' places as they are under the locks, not before them.
    let Some(targets) = space.current_extent(extent) else {
        // The space was deleted: the move ends as its space is gone.
        return Ok(Copied {
            rows_end: rows.start,
            bytes: 0,
            _guards: guards,
        });
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
    let mut bytes = 0;
    for filled in futures::future::join_all(fills).await {
        bytes += filled?;
    }
    Ok(Copied {
        rows_end: rows.end,
        bytes,
        _guards: guards,
    })
}
