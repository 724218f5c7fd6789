//! Simple (striped) rows: one slot per column, no redundancy.
//!
//! May depend on: `row` and what it depends on.

use futures::future::join_all;
use terrace_io::BytesMut;
use terrace_layout::{ColumnPiece, Geometry, RowSpan};

use super::{Compared, RowFailure, RowLayout, ZeroMode};
use crate::error::EngineError;
use crate::payload::Payload;
use crate::row::{all_ok, read_pieces, RowHost, RowIo};
use crate::target::Location;
use crate::verify::{Problem, Role};

/// The simple layout.
#[derive(Clone, Copy)]
pub(crate) struct Simple;

impl RowLayout for Simple {
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

    async fn slot_content<H: RowHost>(
        &self,
        _io: &RowIo<'_, H>,
        _slot: u32,
    ) -> Result<BytesMut, RowFailure> {
        Err(RowFailure::OneCopy)
    }

    fn compare<H: RowHost>(
        &self,
        _io: &RowIo<'_, H>,
        _slots: &[Option<BytesMut>],
        _fixes: &mut Vec<(u32, BytesMut)>,
        _problems: &mut Vec<Problem>,
    ) -> Compared {
        Compared::NoRedundancy
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

    /// Each slot is its data column.
    fn role(&self, _geometry: &Geometry, _row: u64, slot: u32) -> Role {
        Role::Data { column: slot }
    }
}

async fn read<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    buffer: BytesMut,
) -> (BytesMut, Result<(), EngineError>) {
    read_pieces(io, span, buffer, |piece, part| async move {
        let (part, result) = io.read(piece.data_column, piece.column_offset, part).await;
        (part, result.map_err(RowFailure::NoRedundancy))
    })
    .await
}

async fn write<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    data: &Payload,
    fua: bool,
) -> Result<(), EngineError> {
    // A block lives in one place, but a sub-block write or a move may be
    // reading and rewriting it: they hold the row, writers of blocks hold
    // the blocks they write.
    let _guard = io.lock_for_write(span).await;
    let writes = io.geometry().split_columns(*span).map(|piece| {
        let bytes = data.slice(piece_range(&piece));
        io.write(piece.data_column, piece.column_offset, bytes, fua)
    });
    all_ok(writes)
        .await
        .map_err(|error| io.unavailable(span, RowFailure::NoRedundancy(error)))
}

/// The bytes of the request a piece covers.
pub(crate) fn piece_range(piece: &ColumnPiece) -> std::ops::Range<usize> {
    piece.request_offset as usize..(piece.request_offset + piece.length) as usize
}

/// Zero each piece of a simple or mirror row span on every online copy.
pub(crate) async fn zero_pieces<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    mode: ZeroMode,
) -> Result<(), EngineError> {
    let geometry = io.geometry();
    let copies = geometry.layout().copies();
    let _guard = io.lock().await;
    for piece in geometry.split_columns(*span) {
        // The slots' places as they are now, under the lock (see
        // `RowIo::with_targets`).
        let locations: Vec<Location> = io.with_targets(|targets| {
            (0..copies)
                .map(|copy| geometry.slot(piece.data_column, copy))
                .flat_map(|slot| targets[slot as usize].writable(io.row).cloned())
                .collect()
        });
        let zeroes = locations.iter().map(|location| {
            let offset = location.base + geometry.slab_offset(io.row, piece.column_offset);
            location.disk.write_zeroes(offset, piece.length, mode.fua())
        });
        let reached = join_all(zeroes).await.iter().any(Result::is_ok);
        if !reached {
            return Err(io.unavailable(span, RowFailure::NoCopyZeroed));
        }
    }
    Ok(())
}
