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

use crate::layouts::{Compared, LayoutHost, RowLayout};
use crate::row::{RowHost, RowIo};
use crate::verify::{self, Finding, Problem, ProblemKind};

/// What a pass over a space found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedundancyReport {
    pub rows: u64,
    /// Rows whose redundancy disagreed (verify) or was rewritten (resync).
    pub mismatched_rows: Vec<(u64, u64)>,
    /// The first [`FINDINGS_MAX`](crate::verify::FINDINGS_MAX) of those rows, with what disagrees and
    /// where (the rest are counted in `mismatched_rows` only).
    pub findings: Vec<Finding>,
    /// Rows that could not be checked because a needed slot is offline.
    pub skipped_rows: u64,
    /// Mirror rows not checked because a crash left them to resynchronise
    /// and the resync has not reached them yet: their copies may differ.
    pub unsynced_rows: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    Verify,
    Repair,
}

pub(crate) enum RowState {
    Agrees,
    Disagrees(Vec<Problem>),
    Skipped,
}

/// Read the whole row of every online slot (`None` for offline or failed).
async fn read_slots<H: RowHost>(io: &RowIo<'_, H>) -> Vec<Option<BytesMut>> {
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

pub(crate) async fn check_row<H: LayoutHost>(io: &RowIo<'_, H>, pass: Pass) -> RowState {
    let slots = read_slots(io).await;
    let mut fixes: Vec<(u32, BytesMut)> = Vec::new();
    let mut problems = Vec::new();
    let skipped = match io
        .host
        .layout()
        .compare(io, &slots, &mut fixes, &mut problems)
    {
        Compared::NoRedundancy => return RowState::Agrees,
        Compared::Unreadable => return RowState::Skipped,
        Compared::Checked { partly } => partly,
    };
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
