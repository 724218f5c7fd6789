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
//! mirror's while it serves (see `crash_resync.rs`).
//!
//! A parity row with a data column missing cannot be checked: its parity is
//! the only record of the missing data. Such rows are left alone (and
//! counted); the journal removes the window in which they could disagree.
//!
//! This module checks or mends one row; the passes over a space, and the
//! bookkeeping of a crash, are in `redundancy.rs`.
//!
//! May depend on: `layouts` and what it depends on.

use futures::future::join_all;
use terrace_io::{aligned_buffer, BytesMut};

use crate::heal::heal_row;
use crate::layouts::{Compared, LayoutHost, RowLayout};
use crate::row::{RowHost, RowIo};
use crate::verify::{self, Finding, Problem, ProblemKind};

/// What a pass over a space found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedundancyReport {
    pub rows: u64,
    /// Rows whose redundancy disagreed (verify) or was rewritten (resync).
    pub mismatched_rows: Vec<(u64, u64)>,
    /// Of the rows a repair pass rewrote, those that still disagree when
    /// read again (a fix that did not reach its disk, blocks no copy or
    /// reconstruction matches).
    pub unrepaired_rows: Vec<(u64, u64)>,
    /// The first [`FINDINGS_MAX`](crate::verify::FINDINGS_MAX) of those rows, with what disagrees and
    /// where (the rest are counted in `mismatched_rows` only).
    pub findings: Vec<Finding>,
    /// Rows that could not be checked because a needed slot is offline.
    pub skipped_rows: u64,
    /// Mirror rows not checked because a crash left them to resynchronise
    /// and the resync has not reached them yet: their copies may differ.
    pub unsynced_rows: u64,
}

impl RedundancyReport {
    /// Count what `other`, a pass over more rows, found too (findings
    /// kept to [`FINDINGS_MAX`](crate::verify::FINDINGS_MAX)).
    pub(crate) fn add(&mut self, other: RedundancyReport) {
        self.rows += other.rows;
        self.mismatched_rows.extend(other.mismatched_rows);
        self.unrepaired_rows.extend(other.unrepaired_rows);
        let room = crate::verify::FINDINGS_MAX.saturating_sub(self.findings.len());
        self.findings.extend(other.findings.into_iter().take(room));
        self.skipped_rows += other.skipped_rows;
        self.unsynced_rows += other.unsynced_rows;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Check, write nothing.
    Verify,
    /// Rebuild what fails its sums, then make redundancy agree (a scrub).
    Repair,
    /// After an unclean shutdown: blocks may hold the old or the new
    /// content of writes in flight, and their sums either. Rebuild what
    /// some copy or combination says its sum is, make redundancy agree,
    /// then learn every block's sum from the data as it now is.
    Resync,
}

pub(crate) enum RowState {
    Agrees,
    Disagrees(Vec<Problem>),
    Skipped,
}

/// Read the whole row of every online slot (`None` for offline or failed).
pub(crate) async fn read_slots<H: RowHost>(io: &RowIo<'_, H>) -> Vec<Option<BytesMut>> {
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

/// Check (and, but for `Pass::Verify`, repair) the row of `io`, whose lock
/// the caller holds.
pub(crate) async fn check_row<H: LayoutHost>(io: &RowIo<'_, H>, pass: Pass) -> RowState {
    let io = &io.with_lock_held();
    let (state, row) = compare_row(io, pass).await;
    // Also where the row could not be checked (a column missing): its
    // data as it reads now is what its sums must say.
    if pass == Pass::Resync {
        relearn_sums(io, &row).await;
    }
    state
}

/// Also returns every slot's content as the row now holds it (`None`:
/// unreadable), fixes included.
async fn compare_row<H: LayoutHost>(
    io: &RowIo<'_, H>,
    pass: Pass,
) -> (RowState, Vec<Option<BytesMut>>) {
    let slots = read_slots(io).await;
    compare_slots(io, pass, slots).await
}

/// Check the row of `io` as `slots` hold it, read without its lock and
/// in one request per slot with the rows around it (a scrub of an idle
/// pool): nothing is written, and a row that does not plainly agree —
/// a slot unread, a copy or sum that fails, a slot moving — is for the
/// caller to check again under its lock.
pub(crate) async fn row_agrees_as_read<H: LayoutHost>(
    io: &RowIo<'_, H>,
    slots: Vec<Option<BytesMut>>,
) -> bool {
    if slots.iter().any(Option::is_none) {
        return false;
    }
    matches!(
        compare_slots(io, Pass::Verify, slots).await.0,
        RowState::Agrees
    )
}

async fn compare_slots<H: LayoutHost>(
    io: &RowIo<'_, H>,
    pass: Pass,
    mut slots: Vec<Option<BytesMut>>,
) -> (RowState, Vec<Option<BytesMut>>) {
    let mut fixes: Vec<(u32, BytesMut)> = Vec::new();
    let mut problems = Vec::new();
    let unreadable = io.unreadable_slots();
    if !unreadable.is_empty() {
        for &(slot, _) in &unreadable {
            let role = io.host.layout().role(io.geometry(), io.row, slot);
            problems.push(Problem {
                kind: ProblemKind::Unreadable,
                places: vec![verify::place(io, slot, role)],
            });
        }
        if pass != Pass::Verify {
            crate::layouts::rewrite_unreadable(io.host.layout(), io).await;
            slots = read_slots(io).await;
        }
    }
    if let Some(sums) = io.host.sums() {
        let healed = heal_row(io, sums, &slots, pass == Pass::Resync).await;
        for (slot, content, blocks) in healed.fixes {
            let role = io.host.layout().role(io.geometry(), io.row, slot);
            problems.push(Problem {
                kind: ProblemKind::Checksum { blocks },
                places: vec![verify::place(io, slot, role)],
            });
            slots[slot as usize] = Some(content.clone());
            fixes.push((slot, content));
        }
        if !healed.unrecoverable.is_empty() && pass != Pass::Resync {
            problems.push(Problem {
                kind: ProblemKind::Unrecoverable {
                    blocks: healed.unrecoverable.len() as u64,
                },
                places: (0..io.geometry().slots_per_extent())
                    .map(|slot| {
                        let role = io.host.layout().role(io.geometry(), io.row, slot);
                        verify::place(io, slot, role)
                    })
                    .collect(),
            });
        }
    }
    let healed = fixes.len();
    let sums_failed = !problems.is_empty();
    let skipped = match io
        .host
        .layout()
        .compare(io, &slots, &mut fixes, &mut problems)
    {
        Compared::NoRedundancy => false,
        Compared::Unreadable => {
            if problems.is_empty() {
                return (RowState::Skipped, slots);
            }
            true
        }
        Compared::Checked { partly } => partly,
    };
    // A slot both rebuilt and then given other content by the compare
    // (parity recomputed over rebuilt data) is written once, as compared.
    let compared: Vec<u32> = fixes[healed..].iter().map(|(slot, _)| *slot).collect();
    let mut position = 0;
    fixes.retain(|(slot, _)| {
        position += 1;
        position > healed || !compared.contains(slot)
    });
    let moving = second_copies(io, &slots).await;
    problems.extend(moving.iter().map(|(slot, _)| Problem {
        kind: ProblemKind::Moving { slot: *slot },
        places: vec![verify::place(
            io,
            *slot,
            io.host.layout().role(io.geometry(), io.row, *slot),
        )],
    }));
    fixes.extend(moving);
    let state = match (fixes.is_empty() && !sums_failed, skipped) {
        (false, _) => RowState::Disagrees(problems),
        (true, true) => RowState::Skipped,
        (true, false) => RowState::Agrees,
    };
    for (slot, bytes) in &fixes {
        slots[*slot as usize] = Some(bytes.clone());
    }
    if pass != Pass::Verify {
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
    (state, slots)
}

/// Learn the sums of the row's data blocks from the data as it is (after
/// a crash, once the row's redundancy agrees): from `row`, the slots as
/// the check left them, not from a new read, so that a disk that damaged
/// a block since the check has that damage found by the next read rather
/// than taken for the data. A row missing a data column is read through
/// its layout (rebuilt); a block that cannot be read gets no sum
/// (unknown). The caller holds the row's lock (a degraded parity read
/// would take it).
async fn relearn_sums<H: LayoutHost>(io: &RowIo<'_, H>, row: &[Option<BytesMut>]) {
    let Some(sums) = io.host.sums() else { return };
    let geometry = io.geometry();
    let bytes = geometry.row_data_bytes();
    let width = geometry.interleave_bytes() as usize;
    let copies = geometry.layout().copies();
    let columns: Option<Vec<&BytesMut>> = (0..geometry.data_columns())
        .map(|column| {
            let physical = geometry.physical_column(io.row, column);
            (0..copies).find_map(|copy| row[geometry.slot(physical, copy) as usize].as_ref())
        })
        .collect();
    let data = match columns {
        Some(columns) => Ok(columns.iter().fold(
            BytesMut::with_capacity(bytes as usize),
            |mut data, column| {
                data.extend_from_slice(&column[..width]);
                data
            },
        )),
        None => {
            let span = geometry.whole_row(io.extent, io.row);
            let (data, result) = io
                .host
                .layout()
                .read(io, &span, aligned_buffer(bytes as usize))
                .await;
            result.map(|()| data)
        }
    };
    let first = crate::heal::first_block(geometry, io.extent, io.row);
    let learned: Vec<u64> = match data {
        Ok(data) => data
            .chunks(terrace_layout::BLOCK_BYTES as usize)
            .zip(first..)
            .map(|(block, index)| terrace_meta::sums::block_sum(block, index))
            .collect(),
        Err(_) => vec![terrace_meta::sums::UNKNOWN; (bytes / terrace_layout::BLOCK_BYTES) as usize],
    };
    sums.set(first, &learned).await;
}

/// A slot being moved has two valid places for this row; they must agree.
/// The one reads come from is the reference.
async fn second_copies<H: RowHost>(
    io: &RowIo<'_, H>,
    slots: &[Option<BytesMut>],
) -> Vec<(u32, BytesMut)> {
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
