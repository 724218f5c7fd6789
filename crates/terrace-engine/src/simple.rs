//! Simple (striped) rows: one slot per column, no redundancy.
//!
//! May depend on: `row` and what it depends on.

use terrace_io::BytesMut;
use terrace_layout::{ColumnPiece, RowSpan};

use crate::error::EngineError;
use crate::payload::Payload;
use crate::row::{all_ok, read_pieces, RowHost, RowIo};

pub async fn read<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    buffer: BytesMut,
) -> (BytesMut, Result<(), EngineError>) {
    read_pieces(io, span, buffer, |piece, part| async move {
        let (part, result) = io.read(piece.data_column, piece.column_offset, part).await;
        (
            part,
            result.map_err(|error| format!("simple layout has no redundancy: {error}")),
        )
    })
    .await
}

pub async fn write<H: RowHost>(
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
        .map_err(|error| io.unavailable(span, format!("simple layout has no redundancy: {error}")))
}

/// The bytes of the request a piece covers.
pub fn piece_range(piece: &ColumnPiece) -> std::ops::Range<usize> {
    piece.request_offset as usize..(piece.request_offset + piece.length) as usize
}
