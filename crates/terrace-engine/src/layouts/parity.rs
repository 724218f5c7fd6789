//! Parity rows: `k` data columns plus P (and Q), rotating.
//!
//! # Writes
//!
//! A write touches one contiguous piece of some data columns of a row. Parity
//! is byte-wise, so only the band `[low, high)` of column offsets the pieces
//! cover (their hull) needs new parity. Two ways to get it:
//!
//! ```text
//!            col0   col1   col2   P
//!   band ┌─────────────────────────┐   read-modify-write (RMW):
//!        │ old    NEW    old    old │     read old col1 + old P (+ Q),
//!        └─────────────────────────┘     P ^= old1 ^ new1, Q ^= g¹·(old1 ^ new1)
//!                                        reconstruct-write (RCW):
//!                                        read old col0, col2; encode P from scratch
//! ```
//!
//! The engine picks whichever reads fewer bytes; a full-row write reads
//! nothing. Either way the whole update runs under the row lock, so
//! concurrent writers of a row never mix their halves.
//!
//! # Degraded rows
//!
//! With slots lost, the engine reads every surviving column over the band,
//! rebuilds the lost ones, applies the new data and re-encodes, then writes
//! the survivors only. The lost column's content is thereafter defined by
//! the others, which is exactly what a later degraded read reconstructs.
//!
//! # Failures in the middle
//!
//! A read that fails marks its disk failed and the row is planned again with
//! one more loss (at most `redundancy + 1` rounds). A write that fails marks
//! its disk failed too, and the row stays consistent: every slot that was
//! written agrees with the new data, and the failed slot is from then on
//! rebuilt from them. The write succeeds while the row is within tolerance.
//!
//! Crashes are another matter: a power cut between the data and parity
//! writes leaves them disagreeing (the "write hole"). After an unclean
//! shutdown the pool recomputes parity from data (`resync.rs`), which
//! is correct while no disk is missing; the journal closes the hole fully.
//!
//! May depend on: `row` and what it depends on, `terrace_ec`.

use futures::future::join_all;
use terrace_io::{aligned_buffer, Bytes, BytesMut};
use terrace_layout::{ColumnPiece, Geometry, RowSpan};

use super::simple::piece_range;
use super::{Compared, RowFailure, RowLayout, ZeroMode};
use crate::error::EngineError;
use crate::payload::Payload;
use crate::row::{join_buffer, split_buffer, RowHost, RowIo};
use crate::verify::{self, Problem, Role};

/// The parity layout: data columns and `redundancy` parity columns (P, or
/// P and Q) per row, rotating.
#[derive(Clone, Copy)]
pub(crate) struct Parity {
    pub redundancy: u32,
}

impl RowLayout for Parity {
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
        io: &RowIo<'_, H>,
        slot: u32,
    ) -> Result<BytesMut, RowFailure> {
        rebuild_slot(io, slot).await
    }

    /// Parity encoded from the data columns against the stored parity; a
    /// row with a data column unreadable cannot be checked.
    fn compare<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        slots: &[Option<BytesMut>],
        fixes: &mut Vec<(u32, BytesMut)>,
        problems: &mut Vec<Problem>,
    ) -> Compared {
        let geometry = io.geometry();
        let data: Option<Vec<&[u8]>> = (0..geometry.data_columns())
            .map(|column| slots[geometry.physical_column(io.row, column) as usize].as_deref())
            .collect();
        let Some(data) = data else {
            return Compared::Unreadable;
        };
        let width = geometry.interleave_bytes() as usize;
        let mut parity: Vec<BytesMut> = (0..self.redundancy)
            .map(|_| aligned_buffer(width))
            .collect();
        encode(&data, &mut parity);
        let stored: Vec<Option<&[u8]>> = (0..self.redundancy)
            .map(|index| slots[geometry.parity_column(io.row, index) as usize].as_deref())
            .collect();
        let wrong: Vec<bool> = stored
            .iter()
            .zip(&parity)
            .map(|(stored, expected)| stored.is_some_and(|stored| stored != &expected[..]))
            .collect();
        if wrong.contains(&true) {
            let role = |slot| self.role(geometry, io.row, slot);
            problems.push(verify::parity_problem(io, role, &data, &stored, &wrong));
        }
        for (index, expected) in parity.into_iter().enumerate() {
            if wrong[index] {
                fixes.push((geometry.parity_column(io.row, index as u32), expected));
            }
        }
        Compared::Checked { partly: false }
    }

    /// Zeroes go through the ordinary write path (parity is updated);
    /// a trim of part of a row is left undone (it is advisory).
    async fn zero_span<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        mode: ZeroMode,
    ) -> Result<(), EngineError> {
        let ZeroMode::Zeroes { fua } = mode else {
            return Ok(());
        };
        let zeroes = Payload::from(Bytes::from(vec![0u8; span.length as usize]));
        let span = RowSpan {
            request_offset: 0,
            ..*span
        };
        write(io, &span, &zeroes, fua).await
    }

    fn natural_write_bytes(&self, geometry: &Geometry) -> u64 {
        geometry.row_data_bytes()
    }

    /// Parity and data columns rotate from row to row.
    fn role(&self, geometry: &Geometry, row: u64, slot: u32) -> Role {
        (0..self.redundancy)
            .find(|&index| geometry.parity_column(row, index) == slot)
            .map(|index| Role::Parity { index })
            .unwrap_or_else(|| Role::Data {
                column: (0..geometry.data_columns())
                    .find(|&column| geometry.physical_column(row, column) == slot)
                    .unwrap_or(slot),
            })
    }
}

/// The columns of one row in logical order: data 0..k, then P, then Q.
struct Columns {
    data: usize,
    redundancy: usize,
}

impl Columns {
    fn of<H: RowHost>(io: &RowIo<'_, H>) -> Columns {
        let geometry = io.geometry();
        Columns {
            data: geometry.data_columns() as usize,
            redundancy: geometry.layout().parity_columns() as usize,
        }
    }

    fn count(&self) -> usize {
        self.data + self.redundancy
    }

    /// Slot of logical column `index` in this row.
    fn slot<H: RowHost>(&self, io: &RowIo<'_, H>, index: usize) -> u32 {
        let geometry = io.geometry();
        if index < self.data {
            geometry.physical_column(io.row, index as u32)
        } else {
            geometry.parity_column(io.row, (index - self.data) as u32)
        }
    }

    /// Logical columns whose slot is not online.
    fn lost<H: RowHost>(&self, io: &RowIo<'_, H>) -> Vec<usize> {
        (0..self.count())
            .filter(|&index| !io.online(self.slot(io, index)))
            .collect()
    }
}

async fn read<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    buffer: BytesMut,
) -> (BytesMut, Result<(), EngineError>) {
    let columns = Columns::of(io);
    let pieces: Vec<ColumnPiece> = io.geometry().split_columns(*span).collect();
    let parts = split_buffer(buffer, pieces.iter().map(|piece| piece.length));
    let reads = pieces.iter().zip(parts).map(|(piece, part)| {
        let slot = columns.slot(io, piece.data_column as usize);
        async move {
            if io.online(slot) {
                let (part, result) = io.read(slot, piece.column_offset, part).await;
                (part, result.is_ok())
            } else {
                (part, false)
            }
        }
    });
    let results = join_all(reads).await;
    let failed: Vec<usize> = (0..results.len()).filter(|&i| !results[i].1).collect();
    let mut parts: Vec<BytesMut> = results.into_iter().map(|(part, _)| part).collect();
    let result = if failed.is_empty() {
        Ok(())
    } else {
        let _guard = io.lock().await;
        let lost_pieces: Vec<(&ColumnPiece, &mut BytesMut)> = pieces
            .iter()
            .zip(parts.iter_mut())
            .enumerate()
            .filter(|(index, _)| failed.contains(index))
            .map(|(_, pair)| pair)
            .collect();
        rebuild_pieces(io, span, &columns, lost_pieces).await
    };
    (join_buffer(parts), result)
}

/// Rebuild the given pieces from the surviving columns of the row.
async fn rebuild_pieces<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    columns: &Columns,
    mut pieces: Vec<(&ColumnPiece, &mut BytesMut)>,
) -> Result<(), EngineError> {
    let low = pieces
        .iter()
        .map(|(p, _)| p.column_offset)
        .min()
        .unwrap_or(0);
    let high = pieces
        .iter()
        .map(|(p, _)| p.column_offset + p.length)
        .max()
        .unwrap_or(0);
    let band = read_band_rebuilt(io, span, columns, low, high).await?;
    for (piece, part) in pieces.iter_mut() {
        let start = (piece.column_offset - low) as usize;
        part.copy_from_slice(
            &band[piece.data_column as usize][start..start + piece.length as usize],
        );
    }
    Ok(())
}

/// Read every column of the band `[low, high)`, rebuilding lost ones.
async fn read_band_rebuilt<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    columns: &Columns,
    low: u64,
    high: u64,
) -> Result<Vec<BytesMut>, EngineError> {
    for _round in 0..=columns.redundancy + 1 {
        let lost = columns.lost(io);
        if lost.len() > columns.redundancy {
            return Err(io.unavailable(span, too_many_lost(columns, &lost)));
        }
        let wanted: Vec<bool> = (0..columns.count()).map(|i| !lost.contains(&i)).collect();
        let Some(mut band) = read_band(io, columns, low, high, &wanted).await else {
            continue; // a read failed: its disk is now offline, plan again
        };
        let mut views: Vec<&mut [u8]> = band.iter_mut().map(|b| &mut b[..]).collect();
        terrace_ec::reconstruct(&mut views, columns.redundancy, &lost)
            .map_err(|error| io.unavailable(span, RowFailure::Reconstruct(error)))?;
        return Ok(band);
    }
    Err(io.unavailable(span, RowFailure::KeptFailingRebuilding))
}

fn too_many_lost(columns: &Columns, lost: &[usize]) -> RowFailure {
    RowFailure::TooManyLost {
        lost: lost.len(),
        redundancy: columns.redundancy,
    }
}

/// Read the band of each wanted logical column; `None` if any read failed.
/// Unwanted columns get a zeroed buffer of the band's size.
async fn read_band<H: RowHost>(
    io: &RowIo<'_, H>,
    columns: &Columns,
    low: u64,
    high: u64,
    wanted: &[bool],
) -> Option<Vec<BytesMut>> {
    let width = (high - low) as usize;
    let reads = (0..columns.count()).map(|index| async move {
        let buffer = aligned_buffer(width);
        if wanted[index] {
            io.read(columns.slot(io, index), low, buffer).await
        } else {
            (buffer, Ok(()))
        }
    });
    let mut band = Vec::with_capacity(columns.count());
    let mut failed = false;
    for (buffer, result) in join_all(reads).await {
        failed |= result.is_err();
        band.push(buffer);
    }
    (!failed).then_some(band)
}

/// How a write covers each data column of its row.
struct WritePlan {
    pieces: Vec<Option<ColumnPiece>>,
    low: u64,
    high: u64,
    /// Each covered data column's new bytes, cut from the write once (a
    /// cut across a gathered row's buffers is a copy).
    new: Vec<Option<Bytes>>,
}

impl WritePlan {
    fn width(&self) -> u64 {
        self.high - self.low
    }

    fn fully_covers(&self, column: usize) -> bool {
        self.pieces[column].is_some_and(|p| p.column_offset == self.low && p.length == self.width())
    }

    /// Bytes each strategy reads: (read-modify-write, reconstruct-write).
    fn read_costs(&self, columns: &Columns) -> (u64, u64) {
        let touched: u64 = self.pieces.iter().flatten().map(|p| p.length).sum();
        let rmw = touched + columns.redundancy as u64 * self.width();
        let untouched = (0..columns.data).filter(|&c| !self.fully_covers(c)).count() as u64;
        (rmw, untouched * self.width())
    }

    fn new_bytes(&self, column: usize) -> Option<Bytes> {
        self.new[column].clone()
    }
}

enum Attempt {
    Done,
    /// A read failed; the disk is offline now and the row must be planned again.
    Replan,
}

async fn write<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    data: &Payload,
    fua: bool,
) -> Result<(), EngineError> {
    let columns = Columns::of(io);
    let mut pieces = vec![None; columns.data];
    for piece in io.geometry().split_columns(*span) {
        pieces[piece.data_column as usize] = Some(piece);
    }
    let low = pieces
        .iter()
        .flatten()
        .map(|p| p.column_offset)
        .min()
        .unwrap_or(0);
    let high = pieces
        .iter()
        .flatten()
        .map(|p| p.column_offset + p.length)
        .max()
        .unwrap_or(0);
    let new = pieces
        .iter()
        .map(|piece| piece.map(|piece| data.slice(piece_range(&piece))))
        .collect();
    let plan = WritePlan {
        pieces,
        low,
        high,
        new,
    };
    let _guard = io.lock().await;
    for _round in 0..=columns.redundancy + 1 {
        let lost = columns.lost(io);
        if lost.len() > columns.redundancy {
            return Err(io.unavailable(span, too_many_lost(&columns, &lost)));
        }
        let (rmw, rcw) = plan.read_costs(&columns);
        let attempt = if lost.is_empty() && rmw < rcw {
            read_modify_write(io, &columns, &plan, fua).await
        } else {
            reconstruct_write(io, span, &columns, &plan, &lost, fua).await?
        };
        if let Attempt::Done = attempt {
            // Under the row's lock still: a data column whose old bytes
            // could not be read was left out of the write.
            let layout = Parity {
                redundancy: columns.redundancy as u32,
            };
            super::rewrite_unreadable_locked(&layout, io).await;
            let lost = columns.lost(io);
            if lost.len() > columns.redundancy {
                return Err(io.unavailable(span, too_many_lost(&columns, &lost)));
            }
            return Ok(());
        }
    }
    Err(io.unavailable(span, RowFailure::KeptFailingWriting))
}

async fn read_modify_write<H: RowHost>(
    io: &RowIo<'_, H>,
    columns: &Columns,
    plan: &WritePlan,
    fua: bool,
) -> Attempt {
    let old_data = plan
        .pieces
        .iter()
        .enumerate()
        .map(|(column, piece)| async move {
            match piece {
                Some(piece) => {
                    let buffer = aligned_buffer(piece.length as usize);
                    let (buffer, result) = io
                        .read(columns.slot(io, column), piece.column_offset, buffer)
                        .await;
                    (Some(buffer), result)
                }
                None => (None, Ok(())),
            }
        });
    let parity_wanted: Vec<bool> = (0..columns.count()).map(|i| i >= columns.data).collect();
    let (old_data, old_parity) = futures::join!(
        join_all(old_data),
        read_band(io, columns, plan.low, plan.high, &parity_wanted)
    );
    let Some(mut band) = old_parity else {
        return Attempt::Replan;
    };
    if old_data.iter().any(|(_, result)| result.is_err()) {
        return Attempt::Replan;
    }
    let mut parity = band.split_off(columns.data);
    for (column, (old, _)) in old_data.into_iter().enumerate() {
        let (Some(mut delta), Some(piece), Some(new)) =
            (old, plan.pieces[column], plan.new[column].as_ref())
        else {
            continue;
        };
        terrace_ec::xor_into(&mut delta, new);
        let start = (piece.column_offset - plan.low) as usize;
        let end = start + piece.length as usize;
        terrace_ec::xor_into(&mut parity[0][start..end], &delta);
        if columns.redundancy == 2 {
            let coefficient = terrace_ec::q_coefficient(column);
            terrace_ec::mul_xor_into(&mut parity[1][start..end], &delta, coefficient);
        }
    }
    write_row(io, columns, plan, parity, &[], fua).await;
    Attempt::Done
}

async fn reconstruct_write<H: RowHost>(
    io: &RowIo<'_, H>,
    span: &RowSpan,
    columns: &Columns,
    plan: &WritePlan,
    lost: &[usize],
    fua: bool,
) -> Result<Attempt, EngineError> {
    // Old contents are needed for data columns the write does not fully
    // cover; if one of those is lost, rebuild it from all the survivors —
    // unless this I/O already knows its band (checked against its sums
    // before the update, see `RowIo::remember`): survivors the write
    // covers are not checked, and one a disk silently failed to update
    // would rebuild the lost column wrong, and parity with it.
    let known = |c: usize| io.knows(columns.slot(io, c), plan.low, plan.width());
    let needed = |c: usize| c < columns.data && !plan.fully_covers(c);
    let erased: Vec<usize> = lost
        .iter()
        .copied()
        .filter(|&c| !(needed(c) && known(c)))
        .collect();
    let rebuild = erased.iter().any(|&c| needed(c));
    let wanted: Vec<bool> = (0..columns.count())
        .map(|c| !erased.contains(&c) && (rebuild || needed(c)))
        .collect();
    if !wanted.contains(&true) {
        // The write covers the band of every data column: parity straight
        // from its bytes, nothing read or copied.
        let data: Vec<&[u8]> = plan
            .new
            .iter()
            .map(|new| &new.as_ref().expect("every data column is covered")[..])
            .collect();
        let mut parity: Vec<BytesMut> = (0..columns.redundancy)
            .map(|_| aligned_buffer(plan.width() as usize))
            .collect();
        encode(&data, &mut parity);
        write_row(io, columns, plan, parity, lost, fua).await;
        return Ok(Attempt::Done);
    }
    let Some(mut band) = read_band(io, columns, plan.low, plan.high, &wanted).await else {
        return Ok(Attempt::Replan);
    };
    if rebuild {
        let mut views: Vec<&mut [u8]> = band.iter_mut().map(|b| &mut b[..]).collect();
        terrace_ec::reconstruct(&mut views, columns.redundancy, &erased)
            .map_err(|error| io.unavailable(span, RowFailure::Reconstruct(error)))?;
    }
    let mut parity = band.split_off(columns.data);
    for (column, old) in band.iter_mut().enumerate() {
        if let (Some(piece), Some(new)) = (plan.pieces[column], plan.new_bytes(column)) {
            let start = (piece.column_offset - plan.low) as usize;
            old[start..start + new.len()].copy_from_slice(&new);
        }
    }
    let data: Vec<&[u8]> = band.iter().map(|b| &b[..]).collect();
    encode(&data, &mut parity);
    write_row(io, columns, plan, parity, lost, fua).await;
    Ok(Attempt::Done)
}

/// Parity of `data` into `parity` (one or two columns).
fn encode(data: &[&[u8]], parity: &mut [BytesMut]) {
    match parity {
        [p] => terrace_ec::encode_p(data, p),
        [p, q] => terrace_ec::encode_pq(data, p, q),
        _ => unreachable!("parity layouts have one or two parity columns"),
    }
}

/// Write the new data pieces and the parity band to every surviving slot.
/// Failures mark disks failed; the caller re-checks the row's tolerance.
async fn write_row<H: RowHost>(
    io: &RowIo<'_, H>,
    columns: &Columns,
    plan: &WritePlan,
    parity: Vec<BytesMut>,
    lost: &[usize],
    fua: bool,
) {
    let data_writes = (0..columns.data).filter_map(|column| {
        let piece = plan.pieces[column]?;
        let bytes = plan.new_bytes(column)?;
        (!lost.contains(&column))
            .then(|| io.write(columns.slot(io, column), piece.column_offset, bytes, fua))
    });
    let parity_writes = parity.into_iter().enumerate().filter_map(|(index, band)| {
        let column = columns.data + index;
        (!lost.contains(&column))
            .then(|| io.write(columns.slot(io, column), plan.low, band.freeze(), fua))
    });
    let writes: Vec<_> = data_writes.chain(parity_writes).collect();
    join_all(writes).await;
    // A lost column changed too, in parity only: what this I/O remembered
    // of it is old now (a write forgets what it overwrites, and a lost
    // column is not written).
    for &column in lost {
        io.forget(columns.slot(io, column));
    }
}

/// The whole row (one interleave) of `slot` as the other columns define it:
/// rebuilt from every other readable column. Used to re-create a lost slab
/// and to catch up a disk that missed writes; the caller holds the row lock.
async fn rebuild_slot<H: RowHost>(io: &RowIo<'_, H>, slot: u32) -> Result<BytesMut, RowFailure> {
    let columns = Columns::of(io);
    let width = io.geometry().interleave_bytes();
    let this = (0..columns.count())
        .find(|&index| columns.slot(io, index) == slot)
        .ok_or(RowFailure::NotInRow { slot })?;
    let mut lost = columns.lost(io);
    if !lost.contains(&this) {
        lost.push(this);
        lost.sort_unstable();
    }
    if lost.len() > columns.redundancy {
        return Err(too_many_lost(&columns, &lost));
    }
    let wanted: Vec<bool> = (0..columns.count())
        .map(|index| !lost.contains(&index))
        .collect();
    let mut band = read_band(io, &columns, 0, width, &wanted)
        .await
        .ok_or(RowFailure::SurvivorFailed)?;
    let mut views: Vec<&mut [u8]> = band.iter_mut().map(|b| &mut b[..]).collect();
    terrace_ec::reconstruct(&mut views, columns.redundancy, &lost)?;
    Ok(band.swap_remove(this))
}
