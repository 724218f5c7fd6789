//! Mirror rows: every column kept on `copies` slots.
//!
//! Reads pick one copy and fall back to the others when a copy fails. The
//! copy a read tries first is chosen by region: each column is read from
//! one copy for [`READ_REGION_BYTES`] of its slab, then from the next, the
//! columns out of step. A stream read far enough ahead (see the daemon's
//! read-ahead) keeps every copy of a column busy, each reading its own
//! regions from end to end and seeking once over the region between,
//! where choosing by row sent each drive every other interleave unit and
//! let the units between pass under its head: half its media rate. Random
//! reads land on all copies alike. No read moves to a less busy copy: a
//! stream's copies take turns being idle while it runs, and reads moved
//! there broke both drives' sequential runs (a mirror of 8 modelled drives
//! fell from about 1,350 to 640–760 MB/s at 32 and 64 outstanding reads).
//! The price: a range within one region, read often, is read from one
//! copy.
//!
//! After an unclean shutdown, a row not yet resynchronised is
//! resynchronised by the space before it is read here (see
//! `crash_resync.rs`).
//!
//! Writes go to every online copy holding the lock on the bytes they
//! write, so concurrent writers of a block leave all copies equal; a write
//! succeeds while each of its pieces reached at least one copy.
//!
//! May depend on: `row` and what it depends on.

use futures::future::join_all;
use terrace_io::{aligned_buffer, BytesMut};
use terrace_layout::{ColumnPiece, Geometry, RowSpan};

use super::simple::{piece_range, zero_pieces};
use super::{Compared, RowFailure, RowLayout, ZeroMode};
use crate::error::EngineError;
use crate::payload::Payload;
use crate::row::{read_pieces, RowError, RowHost, RowIo};
use crate::verify::{self, Problem, ProblemKind, Role};

/// The mirror layout: every column on `copies` slots.
#[derive(Clone, Copy)]
pub(crate) struct Mirror {
    pub copies: u32,
}

impl RowLayout for Mirror {
    async fn read<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        buffer: BytesMut,
    ) -> (BytesMut, Result<(), EngineError>) {
        read(io, span, buffer).await
    }

    async fn write<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        data: &Payload,
        fua: bool,
    ) -> Result<(), EngineError> {
        write(io, span, data, fua).await
    }

    /// Another copy of the slot's column.
    async fn slot_content<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        slot: u32,
    ) -> Result<BytesMut, RowFailure> {
        let geometry = io.geometry();
        let width = geometry.interleave_bytes() as usize;
        let column = slot / self.copies;
        for copy in 0..self.copies {
            let other = geometry.slot(column, copy);
            if other != slot && io.online(other) {
                let (buffer, result) = io.read(other, 0, aligned_buffer(width)).await;
                if result.is_ok() {
                    return Ok(buffer);
                }
            }
        }
        Err(RowFailure::NoOtherCopy)
    }

    /// Every copy of a column against the first readable one.
    fn compare<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        slots: &[Option<BytesMut>],
        fixes: &mut Vec<(u32, BytesMut)>,
        problems: &mut Vec<Problem>,
    ) -> Compared {
        let geometry = io.geometry();
        let mut partly = false;
        for column in 0..geometry.columns() {
            let copy_slots: Vec<u32> = (0..self.copies)
                .map(|copy| geometry.slot(column, copy))
                .collect();
            let Some(source) = copy_slots.iter().find_map(|&s| slots[s as usize].as_ref()) else {
                partly = true;
                continue;
            };
            let before = fixes.len();
            for &slot in &copy_slots {
                if slots[slot as usize]
                    .as_ref()
                    .is_some_and(|copy| copy != source)
                {
                    fixes.push((slot, source.clone()));
                }
            }
            if fixes.len() > before {
                problems.push(Problem {
                    kind: ProblemKind::Copies { column },
                    places: copy_slots
                        .iter()
                        .map(|&s| verify::place(io, s, self.role(geometry, io.row, s)))
                        .collect(),
                });
            }
        }
        Compared::Checked { partly }
    }

    async fn zero_span<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        mode: ZeroMode,
    ) -> Result<(), EngineError> {
        zero_pieces(io, span, mode).await
    }

    fn natural_write_bytes(&self, geometry: &Geometry) -> u64 {
        geometry.interleave_bytes()
    }

    /// The copies of a column are consecutive slots.
    fn role(&self, _geometry: &Geometry, _row: u64, slot: u32) -> Role {
        Role::Copy {
            column: slot / self.copies,
            copy: slot % self.copies,
        }
    }

    fn resyncs_while_serving(&self) -> bool {
        true
    }
}

/// Bytes of a column read from one copy before the next takes over: at a
/// hard disk's media rate (125–204 MB/s on `hdd-10k`) 20–35 ms of reading
/// for one seek and rotation (about 3–4 ms) over the next region.
pub const READ_REGION_BYTES: u64 = 4 << 20;

/// Bytes of a mirror a stream must have in flight, or read ahead, for the
/// drives of every copy to read their own regions at once: a region of
/// every copy of every column.
pub fn stream_reach_bytes(geometry: &Geometry) -> u64 {
    u64::from(geometry.layout().copies()) * u64::from(geometry.data_columns()) * READ_REGION_BYTES
}

async fn read<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    buffer: BytesMut,
) -> (BytesMut, Result<(), EngineError>) {
    read_pieces(io, span, buffer, |piece, part| read_piece(io, piece, part)).await
}

async fn read_piece<H: RowHost>(
    io: &RowIo<'_, H>,
    piece: ColumnPiece,
    mut buffer: BytesMut,
) -> (BytesMut, Result<(), RowFailure>) {
    let geometry = io.geometry();
    let copies = geometry.layout().copies();
    let first = first_copy(io, &piece, copies);
    let mut last: Option<RowError> = None;
    for attempt in 0..copies {
        let slot = geometry.slot(piece.data_column, (first + attempt) % copies);
        if !io.online(slot) {
            continue;
        }
        let (returned, result) = io.read(slot, piece.column_offset, buffer).await;
        buffer = returned;
        match result {
            Ok(()) => return (buffer, Ok(())),
            Err(error) => last = Some(error),
        }
    }
    (buffer, Err(RowFailure::EveryCopyLost { last }))
}

/// The copy a piece is read from first: its region's.
fn first_copy<H: RowHost>(io: &RowIo<'_, H>, piece: &ColumnPiece, copies: u32) -> u32 {
    let region = io.geometry().slab_offset(io.row, piece.column_offset) / READ_REGION_BYTES;
    ((io.extent + region + u64::from(piece.data_column)) % u64::from(copies)) as u32
}

async fn write<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    data: &Payload,
    fua: bool,
) -> Result<(), EngineError> {
    let _guard = io.lock_for_write(span).await;
    let geometry = io.geometry();
    let pieces: Vec<ColumnPiece> = geometry.split_columns(*span).collect();
    let copies = geometry.layout().copies();
    let writes: Vec<_> = pieces
        .iter()
        .flat_map(|piece| {
            let bytes = data.slice(piece_range(piece));
            (0..copies)
                .map(move |copy| geometry.slot(piece.data_column, copy))
                .filter(|&slot| io.online(slot))
                .map(move |slot| {
                    let bytes = bytes.clone();
                    async move {
                        (
                            piece.data_column,
                            io.write(slot, piece.column_offset, bytes, fua).await,
                        )
                    }
                })
        })
        .collect();
    // Collected first: join_all of a known count allocates once.
    let results = join_all(writes).await;
    for piece in &pieces {
        let reached = results
            .iter()
            .any(|(column, result)| *column == piece.data_column && result.is_ok());
        if !reached {
            return Err(io.unavailable(span, RowFailure::NoCopyWritten));
        }
    }
    Ok(())
}
