//! Making redundancy agree again after an unclean shutdown, and checking it.
//!
//! A power cut can land between the writes of one row: one mirror copy new,
//! the other old; data new, parity old. Any such row is repaired by
//! rewriting redundancy from one source of truth — the first online copy of
//! a mirror column, the data columns of a parity row. Both are valid
//! outcomes for writes that were never flushed, and flushed rows already
//! agree, so nothing acknowledged changes.
//!
//! After an unclean shutdown only the extents the write intent names are
//! resynchronised (or the whole space, where it was named whole); a
//! mirror's while it serves (see [`crate::crash_resync`]).
//!
//! A parity row with a data column missing cannot be checked: its parity is
//! the only record of the missing data. Such rows are left alone (and
//! counted); the journal removes the window in which they could disagree.

use futures::future::join_all;
use terrace_io::{aligned_buffer, BytesMut};
use terrace_layout::Layout;

use crate::error::EngineError;
use crate::row::RowIo;
use crate::space::Space;
use crate::verify::{self, Finding, Problem, ProblemKind, FINDINGS_MAX};

/// What a pass over a space found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedundancyReport {
    pub rows: u64,
    /// Rows whose redundancy disagreed (verify) or was rewritten (resync).
    pub mismatched_rows: Vec<(u64, u64)>,
    /// The first [`FINDINGS_MAX`] of those rows, with what disagrees and
    /// where (the rest are counted in `mismatched_rows` only).
    pub findings: Vec<Finding>,
    /// Rows that could not be checked because a needed slot is offline.
    pub skipped_rows: u64,
    /// Mirror rows not checked because a crash left them to resynchronise
    /// and the resync has not reached them yet: their copies may differ.
    pub unsynced_rows: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Verify,
    Repair,
}

/// Rewrite redundancy from its source of truth on every row.
pub async fn resync_space(space: &Space) -> Result<RedundancyReport, EngineError> {
    walk(space, Pass::Repair).await
}

/// Check, without writing, that every mirror copy and parity agrees.
pub async fn verify_space(space: &Space) -> Result<RedundancyReport, EngineError> {
    walk(space, Pass::Verify).await
}

/// Rewrite redundancy of the rows under `[offset, offset + length)` only
/// (after a crash, the ranges a write-back log says were being written).
pub(crate) async fn resync_range(
    space: &Space,
    offset: u64,
    length: u64,
) -> Result<RedundancyReport, EngineError> {
    let row_bytes = space.geometry.row_data_bytes();
    let end = (offset + length).min(space.size_bytes());
    let rows = (offset / row_bytes..end.div_ceil(row_bytes)).map(|row| {
        let per_extent = space.geometry.rows_per_extent();
        (row / per_extent, row % per_extent)
    });
    walk_rows(space, Pass::Repair, rows).await
}

async fn walk(space: &Space, pass: Pass) -> Result<RedundancyReport, EngineError> {
    let extents = space.map().extents.len() as u64;
    let per_extent = space.geometry.rows_per_extent();
    let rows = (0..extents).flat_map(|extent| (0..per_extent).map(move |row| (extent, row)));
    walk_rows(space, pass, rows).await
}

async fn walk_rows(
    space: &Space,
    pass: Pass,
    rows: impl Iterator<Item = (u64, u64)>,
) -> Result<RedundancyReport, EngineError> {
    let mut report = RedundancyReport::default();
    if space.geometry.layout() == Layout::Simple {
        return Ok(report);
    }
    let map = space.map();
    for (extent, row) in rows {
        if extent >= map.extents.len() as u64 {
            continue;
        }
        let span = space.geometry.whole_row(extent, row);
        if pass == Pass::Verify && space.pool.crash_resync.wanted(space.id, extent, row) {
            // Not yet resynchronised since a crash: its copies may differ.
            report.unsynced_rows += 1;
            continue;
        }
        let io = space.row_io(&map, &span);
        // A repair leaves out disks not in service; one that comes back
        // (a disk returning at an import is welcomed only after recovery
        // repaired) must catch up on the row too.
        let _writing = match pass {
            Pass::Repair => {
                let row_bytes = space.geometry.row_data_bytes();
                let offset = extent * space.geometry.extent_data_bytes() + row * row_bytes;
                Some(space.track_missing(&map, offset, row_bytes).await?)
            }
            _ => None,
        };
        let _guard = space.locks.lock((extent, row)).await;
        report.rows += 1;
        match check_row(&io, pass).await {
            RowState::Agrees => {}
            RowState::Disagrees(problems) => {
                report.mismatched_rows.push((extent, row));
                if report.findings.len() < FINDINGS_MAX {
                    report.findings.push(finding(space, extent, row, problems));
                }
            }
            RowState::Skipped => report.skipped_rows += 1,
        }
    }
    space.pool.persist_failures().await?;
    Ok(report)
}

/// Resynchronise `row` of `extent` of a mirror after an unclean shutdown
/// if it still wants it (see [`crate::crash_resync`]): under the row's
/// lock, which the caller may hold already (`lock_held`: a sub-block
/// write reading its edges, whose own record of missing disks covers the
/// extent).
pub(crate) async fn resync_crashed_row(
    space: &Space,
    extent: u64,
    row: u64,
    lock_held: bool,
) -> Result<(), EngineError> {
    if !space.pool.crash_resync.wanted(space.id, extent, row) {
        return Ok(());
    }
    let row_bytes = space.geometry.row_data_bytes();
    let (_writing, _guard) = if lock_held {
        (None, None)
    } else {
        let offset = extent * space.geometry.extent_data_bytes() + row * row_bytes;
        let writing = space.track_missing(&space.map(), offset, row_bytes).await?;
        (Some(writing), Some(space.locks.lock((extent, row)).await))
    };
    // Another reader, the background pass or a move may have done it
    // while this one waited for the lock.
    if !space.pool.crash_resync.wanted(space.id, extent, row) {
        return Ok(());
    }
    // The slots' places as they are under the lock.
    let map = space.map();
    if extent < map.extents.len() as u64 {
        let span = space.geometry.whole_row(extent, row);
        check_row(&space.row_io(&map, &span), Pass::Repair).await;
    }
    space.pool.crash_resync.done(space.id, extent, row);
    Ok(())
}

enum RowState {
    Agrees,
    Disagrees(Vec<Problem>),
    Skipped,
}

fn finding(space: &Space, extent: u64, row: u64, problems: Vec<Problem>) -> Finding {
    let length = space.geometry.row_data_bytes();
    Finding {
        offset: extent * space.geometry.extent_data_bytes() + row * length,
        length,
        extent,
        row,
        problems,
    }
}

/// Read the whole row of every online slot (`None` for offline or failed).
async fn read_slots(io: &RowIo<'_>) -> Vec<Option<BytesMut>> {
    let width = io.geometry().interleave_bytes() as usize;
    let reads = (0..io.geometry().slots_per_extent()).map(|slot| async move {
        if !io.online(slot) {
            return None;
        }
        let (buffer, result) = io.read(slot, 0, aligned_buffer(width)).await;
        result.ok().map(|()| buffer)
    });
    join_all(reads).await
}

async fn check_row(io: &RowIo<'_>, pass: Pass) -> RowState {
    let slots = read_slots(io).await;
    let geometry = io.geometry();
    let mut fixes: Vec<(u32, BytesMut)> = Vec::new();
    let mut problems = Vec::new();
    let mut skipped = false;
    match geometry.layout() {
        Layout::Simple => return RowState::Agrees,
        Layout::Mirror { copies } => {
            for column in 0..geometry.columns() {
                let copy_slots: Vec<u32> = (0..copies)
                    .map(|copy| geometry.slot(column, copy))
                    .collect();
                let Some(source) = copy_slots.iter().find_map(|&s| slots[s as usize].as_ref())
                else {
                    skipped = true;
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
                        places: copy_slots.iter().map(|&s| verify::place(io, s)).collect(),
                    });
                }
            }
        }
        Layout::Parity { redundancy } => {
            let data_columns = geometry.data_columns();
            let data: Option<Vec<&[u8]>> = (0..data_columns)
                .map(|column| slots[geometry.physical_column(io.row, column) as usize].as_deref())
                .collect();
            let Some(data) = data else {
                return RowState::Skipped;
            };
            let width = geometry.interleave_bytes() as usize;
            let mut parity: Vec<BytesMut> =
                (0..redundancy).map(|_| aligned_buffer(width)).collect();
            match parity.as_mut_slice() {
                [p] => terrace_ec::encode_p(&data, p),
                [p, q] => terrace_ec::encode_pq(&data, p, q),
                _ => unreachable!("parity layouts have one or two parity columns"),
            }
            let stored: Vec<Option<&[u8]>> = (0..redundancy)
                .map(|index| slots[geometry.parity_column(io.row, index) as usize].as_deref())
                .collect();
            let wrong: Vec<bool> = stored
                .iter()
                .zip(&parity)
                .map(|(stored, expected)| stored.is_some_and(|stored| stored != &expected[..]))
                .collect();
            if wrong.contains(&true) {
                problems.push(verify::parity_problem(io, &data, &stored, &wrong));
            }
            for (index, expected) in parity.into_iter().enumerate() {
                if wrong[index] {
                    fixes.push((geometry.parity_column(io.row, index as u32), expected));
                }
            }
        }
    }
    let moving = second_copies(io, &slots).await;
    problems.extend(moving.iter().map(|(slot, _)| Problem {
        kind: ProblemKind::Moving { slot: *slot },
        places: vec![verify::place(io, *slot)],
    }));
    fixes.extend(moving);
    let state = match (fixes.is_empty(), skipped) {
        (false, _) => RowState::Disagrees(problems),
        (true, true) => RowState::Skipped,
        (true, false) => RowState::Agrees,
    };
    if pass == Pass::Repair {
        // Durable before the row counts as done: a read may return the
        // source's version at once, and a power cut that dropped the fix
        // from a disk's cache would bring the other version back, to be
        // read if the source's disk is lost (a mirror row resynchronised
        // on read after a crash is not resynchronised before serving).
        join_all(
            fixes
                .into_iter()
                .map(|(slot, bytes)| io.write(slot, 0, bytes.freeze(), true)),
        )
        .await;
    }
    state
}

/// A slot being moved has two valid places for this row; they must agree.
/// The one reads come from is the reference.
async fn second_copies(io: &RowIo<'_>, slots: &[Option<BytesMut>]) -> Vec<(u32, BytesMut)> {
    let width = io.geometry().interleave_bytes() as usize;
    let offset = io.geometry().slab_offset(io.row, 0);
    let mut fixes = Vec::new();
    for (slot, content) in slots.iter().enumerate() {
        let Some(content) = content else { continue };
        let extras: Vec<crate::target::Location> =
            io.with_targets(|targets| targets[slot].writable(io.row).skip(1).cloned().collect());
        for extra in &extras {
            let (copy, result) = extra
                .disk
                .read(extra.base + offset, aligned_buffer(width))
                .await;
            if result.is_ok() && copy != *content {
                fixes.push((slot as u32, content.clone()));
                break;
            }
        }
    }
    fixes
}
