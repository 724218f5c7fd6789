//! Simple (striped) rows: one slot per column, no redundancy, no locks —
//! a block lives in exactly one place, so concurrent writers cannot make
//! copies disagree.

use futures::future::join_all;
use terrace_io::{Bytes, BytesMut};
use terrace_layout::{ColumnPiece, RowSpan};

use crate::error::EngineError;
use crate::row::RowIo;
use crate::space::{join_buffer, split_buffer};

pub async fn read(
    io: &RowIo<'_>,
    span: &RowSpan,
    buffer: BytesMut,
) -> (BytesMut, Result<(), EngineError>) {
    let pieces: Vec<ColumnPiece> = io.geometry().split_columns(*span).collect();
    let parts = split_buffer(buffer, pieces.iter().map(|piece| piece.length));
    let reads = pieces
        .iter()
        .zip(parts)
        .map(|(piece, part)| io.read(piece.data_column, piece.column_offset, part));
    let mut first_error = None;
    let mut parts = Vec::with_capacity(pieces.len());
    for (part, result) in join_all(reads).await {
        if let Err(error) = result {
            first_error.get_or_insert(error);
        }
        parts.push(part);
    }
    let result = match first_error {
        None => Ok(()),
        Some(error) => {
            Err(io.unavailable(span, format!("simple layout has no redundancy: {error}")))
        }
    };
    (join_buffer(parts), result)
}

pub async fn write(
    io: &RowIo<'_>,
    span: &RowSpan,
    data: &Bytes,
    fua: bool,
) -> Result<(), EngineError> {
    let writes = io.geometry().split_columns(*span).map(|piece| {
        let bytes = data.slice(piece_range(&piece));
        io.write(piece.data_column, piece.column_offset, bytes, fua)
    });
    for result in join_all(writes).await {
        result.map_err(|error| {
            io.unavailable(span, format!("simple layout has no redundancy: {error}"))
        })?;
    }
    Ok(())
}

/// The bytes of the request a piece covers.
pub fn piece_range(piece: &ColumnPiece) -> std::ops::Range<usize> {
    piece.request_offset as usize..(piece.request_offset + piece.length) as usize
}
