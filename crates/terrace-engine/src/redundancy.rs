//! Passes over a volume (a space's or a log) that check or rewrite its
//! redundancy: verify, and the resync of a whole volume or of a range.
//! (The resync of one mirror row a crash left owed is the volume's own,
//! [`Volume::resync_crashed_row`]: its reads need it.)
//!
//! Each row is checked or mended by [`crate::resync`]; this module does
//! what needs the volume around it: the map, the row locks,
//! the record of disks a repair leaves out, the crash-resync bookkeeping
//! and the commit of failures.

use std::ops::Range;

use terrace_meta::{DiskIndex, SlabIndex};

use crate::error::EngineError;
use crate::resync::{check_row, Pass, RedundancyReport, RowState};
use crate::verify::{Finding, Problem, FINDINGS_MAX};
use crate::volume::Volume;

/// Where an extent's slots lie, as the passes over many extents order
/// them: its lowest slab (then that slab's disk). Extents visited by this
/// key are read from each disk mostly from its start to its end, as
/// placement hands out each disk's slabs from the lowest; a walk in space
/// order would seek back and forth between the extents of one disk that
/// different spaces or resizes interleave. The key names one extent (a
/// slab holds one slot of one extent), so it also says where a walk
/// stands: `(slab << 16) | disk`.
pub(crate) fn place_key(slabs: impl Iterator<Item = (DiskIndex, SlabIndex)>) -> u64 {
    slabs
        .map(|(disk, slab)| (u64::from(slab.0) << 16) | u64::from(disk.0))
        .min()
        .unwrap_or(u64::MAX)
}

/// Rewrite redundancy from its source of truth on every row, and learn
/// the blocks' sums from the data (after an unclean shutdown).
pub async fn resync_space(space: &Volume) -> Result<RedundancyReport, EngineError> {
    walk(space, Pass::Resync).await
}

/// Check every block against its sum and rebuild what fails from the
/// other copies or parity, then make redundancy agree (a scrub of one
/// space, in one pass).
pub async fn repair_space(space: &Volume) -> Result<RedundancyReport, EngineError> {
    walk(space, Pass::Repair).await
}

/// Check, without writing, that every mirror copy and parity agrees.
pub async fn verify_space(space: &Volume) -> Result<RedundancyReport, EngineError> {
    walk(space, Pass::Verify).await
}

/// Rewrite redundancy of the rows under `[offset, offset + length)` only
/// (after a crash, the ranges a write-back log says were being written).
pub(crate) async fn resync_range(
    space: &Volume,
    offset: u64,
    length: u64,
) -> Result<RedundancyReport, EngineError> {
    let row_bytes = space.geometry.row_data_bytes();
    let end = (offset + length).min(space.size_bytes());
    let rows = (offset / row_bytes..end.div_ceil(row_bytes)).map(|row| {
        let per_extent = space.geometry.rows_per_extent();
        (row / per_extent, row % per_extent)
    });
    walk_rows(space, Pass::Resync, rows).await
}

/// Check and rewrite the redundancy of rows `rows` of `extent` (a
/// scrub's step).
pub(crate) async fn repair_rows(
    space: &Volume,
    extent: u64,
    rows: Range<u64>,
) -> Result<RedundancyReport, EngineError> {
    walk_rows(space, Pass::Repair, rows.map(|row| (extent, row))).await
}

/// Every row of the volume, its extents in disk order ([`place_key`]);
/// what it finds is told in space order.
async fn walk(space: &Volume, pass: Pass) -> Result<RedundancyReport, EngineError> {
    let slab_bytes = space.geometry.slab_bytes();
    let mut extents: Vec<(u64, u64)> = space
        .map()
        .extents
        .iter()
        .enumerate()
        .map(|(extent, targets)| {
            let slabs = targets.iter().filter_map(|target| {
                let location = target.locations.first()?;
                let slab = space.pool.slab_at(location.base, slab_bytes);
                Some((location.disk.index, slab))
            });
            (place_key(slabs), extent as u64)
        })
        .collect();
    extents.sort_unstable();
    let per_extent = space.geometry.rows_per_extent();
    let rows = extents
        .into_iter()
        .flat_map(|(_, extent)| (0..per_extent).map(move |row| (extent, row)));
    let mut report = walk_rows(space, pass, rows).await?;
    report.mismatched_rows.sort_unstable();
    report.findings.sort_by_key(|finding| finding.offset);
    Ok(report)
}

async fn walk_rows(
    space: &Volume,
    pass: Pass,
    rows: impl Iterator<Item = (u64, u64)>,
) -> Result<RedundancyReport, EngineError> {
    let mut report = RedundancyReport::default();
    if space.geometry.layout().failures_tolerated() == 0 && space.sums().is_none() {
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
            Pass::Repair | Pass::Resync => {
                let row_bytes = space.geometry.row_data_bytes();
                let offset = extent * space.geometry.extent_data_bytes() + row * row_bytes;
                Some(space.track_missing(&map, offset, row_bytes).await?)
            }
            _ => None,
        };
        let _guard = space.locks.lock((extent, row)).await;
        if pass == Pass::Repair {
            // A row a crash left to resynchronise has sums not yet
            // learned from its data: resynchronise it first, as a read
            // would, or its blocks would fail sums that were never theirs.
            space.resync_crashed_row(extent, row, true).await?;
        }
        report.rows += 1;
        match check_row(&io, pass).await {
            RowState::Agrees => {}
            RowState::Disagrees(problems) => {
                report.mismatched_rows.push((extent, row));
                // Read again what was rewritten: a fix lost on its way to
                // the disk leaves the row as it was.
                if pass == Pass::Repair
                    && matches!(check_row(&io, Pass::Verify).await, RowState::Disagrees(_))
                {
                    report.unrepaired_rows.push((extent, row));
                }
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

fn finding(space: &Volume, extent: u64, row: u64, problems: Vec<Problem>) -> Finding {
    let length = space.geometry.row_data_bytes();
    Finding {
        offset: extent * space.geometry.extent_data_bytes() + row * length,
        length,
        extent,
        row,
        problems,
    }
}
