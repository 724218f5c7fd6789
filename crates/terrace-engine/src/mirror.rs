//! Mirror rows: every column kept on `copies` slots.
//!
//! Reads pick one copy, rotating the first choice by row and column so that
//! streams spread over all copies, and fall back to the others when a copy
//! fails. Writes go to every online copy holding the lock on the bytes they
//! write, so concurrent writers of a block leave all copies equal; a write
//! succeeds while each of its pieces reached at least one copy.

use futures::future::join_all;
use terrace_io::BytesMut;
use terrace_layout::{ColumnPiece, RowSpan};

use crate::error::EngineError;
use crate::payload::Payload;
use crate::row::{read_pieces, RowIo};
use crate::simple::piece_range;

pub async fn read(
    io: &RowIo<'_>,
    span: &RowSpan,
    buffer: BytesMut,
) -> (BytesMut, Result<(), EngineError>) {
    read_pieces(io, span, buffer, |piece, part| read_piece(io, piece, part)).await
}

async fn read_piece(
    io: &RowIo<'_>,
    piece: ColumnPiece,
    mut buffer: BytesMut,
) -> (BytesMut, Result<(), String>) {
    let geometry = io.geometry();
    let copies = geometry.layout().copies();
    let first = ((io.extent + io.row + u64::from(piece.data_column)) % u64::from(copies)) as u32;
    let mut last_error = String::from("no copy is online");
    for attempt in 0..copies {
        let slot = geometry.slot(piece.data_column, (first + attempt) % copies);
        if !io.online(slot) {
            continue;
        }
        let (returned, result) = io.read(slot, piece.column_offset, buffer).await;
        buffer = returned;
        match result {
            Ok(()) => return (buffer, Ok(())),
            Err(error) => last_error = error,
        }
    }
    (buffer, Err(format!("every copy is lost ({last_error})")))
}

pub async fn write(
    io: &RowIo<'_>,
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
            return Err(io.unavailable(span, "no copy of this column could be written"));
        }
    }
    Ok(())
}
