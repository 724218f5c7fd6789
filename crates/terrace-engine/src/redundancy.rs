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

use terrace_io::{aligned_buffer, BytesMut};

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
/// (after a crash, the ranges a write-back log says were being written),
/// learning their blocks' sums from the data.
pub(crate) async fn resync_range(
    space: &Volume,
    offset: u64,
    length: u64,
) -> Result<RedundancyReport, EngineError> {
    walk_rows(space, Pass::Resync, rows_under(space, offset, length)).await
}

/// Rebuild what fails its sums in the rows under `[offset, offset +
/// length)` and make their redundancy agree, as a scrub does: the sums
/// are right (no crash cut a write), so a block that fails them on every
/// copy stays failed rather than teaching them its bytes.
pub(crate) async fn repair_range(
    space: &Volume,
    offset: u64,
    length: u64,
) -> Result<RedundancyReport, EngineError> {
    walk_rows(space, Pass::Repair, rows_under(space, offset, length)).await
}

/// The rows (extent, row) under `[offset, offset + length)`.
fn rows_under(space: &Volume, offset: u64, length: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let row_bytes = space.geometry.row_data_bytes();
    let end = (offset + length).min(space.size_bytes());
    (offset / row_bytes..end.div_ceil(row_bytes)).map(move |row| {
        let per_extent = space.geometry.rows_per_extent();
        (row / per_extent, row % per_extent)
    })
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

/// A scrub's step over rows `rows` of `extent` on an idle pool: each
/// slot's part of them is read in a few long requests (so each disk
/// streams, as row-sized reads with gaps between them do not), each read
/// while the rows of the one before are checked, without their locks and
/// without writing; only the rows that do not plainly agree are checked
/// again, read anew under their locks, and repaired as [`repair_rows`]
/// does. A row checked unlocked while a client wrote it may look torn,
/// and is then checked again; one that agrees had no fault to find.
/// Where a slot is moving, every row takes the locked way, as do the rows
/// of a read that failed.
pub(crate) async fn repair_rows_streaming(
    space: &Volume,
    extent: u64,
    rows: Range<u64>,
) -> Result<RedundancyReport, EngineError> {
    if space.geometry.layout().failures_tolerated() == 0 && space.sums().is_none() {
        return Ok(RedundancyReport::default()); // nothing to check against
    }
    let map = space.map();
    let geometry = &space.geometry;
    let plain = extent < map.extents.len() as u64
        && !rows.is_empty()
        && map.extents[extent as usize]
            .iter()
            .all(|target| target.locations.len() == 1);
    if !plain {
        return repair_rows(space, extent, rows).await;
    }
    let targets = &map.extents[extent as usize];
    let per_read = (rows.end - rows.start).div_ceil(READS_PER_STEP).max(1);
    let chunks: Vec<Range<u64>> = rows
        .clone()
        .step_by(per_read as usize)
        .map(|first| first..(first + per_read).min(rows.end))
        .collect();
    let mut again = Vec::new();
    let mut slots = read_rows(targets, geometry, chunks[0].clone()).await;
    for (index, chunk) in chunks.iter().enumerate() {
        let following = chunks.get(index + 1).cloned();
        let read_next = async {
            match following {
                Some(next) => read_rows(targets, geometry, next).await,
                None => None,
            }
        };
        let check = rows_to_check_again(space, &map, extent, chunk.clone(), slots);
        let (next_slots, rows_again) = futures::join!(read_next, check);
        again.extend(rows_again);
        slots = next_slots;
    }
    let agreed = (rows.end - rows.start) - again.len() as u64;
    let mut report = walk_rows(
        space,
        Pass::Repair,
        again.into_iter().map(|row| (extent, row)),
    )
    .await?;
    report.rows += agreed;
    Ok(report)
}

/// Long reads a streaming scrub step makes of each slot, one checked
/// while the next is read.
const READS_PER_STEP: u64 = 4;

/// Bytes a streaming step reads from disks, at most: 4 MiB reads of each
/// of four disks.
pub(crate) const STREAMING_STEP_BYTES: u64 = 16 << 20;

/// Rows of a streaming step of `geometry` (at least one, at most 4,096
/// for the smallest interleaves).
pub(crate) fn streaming_step_rows(geometry: &terrace_layout::Geometry) -> u64 {
    let row_disk_bytes = geometry.interleave_bytes() * u64::from(geometry.slots_per_extent());
    (STREAMING_STEP_BYTES / row_disk_bytes).clamp(1, 4096)
}

/// Of `rows`, read as `slots` (each slot's part of them; `None`: a read
/// failed), those that do not plainly agree as read, or that a crash left
/// to resynchronise.
async fn rows_to_check_again(
    space: &Volume,
    map: &crate::volume::SpaceMap,
    extent: u64,
    rows: Range<u64>,
    slots: Option<Vec<Option<BytesMut>>>,
) -> Vec<u64> {
    let Some(mut slots) = slots else {
        return rows.collect();
    };
    let width = space.geometry.interleave_bytes() as usize;
    let mut again = Vec::new();
    for row in rows {
        let row_slots: Vec<Option<BytesMut>> = slots
            .iter_mut()
            .map(|slot| slot.as_mut().map(|bytes| bytes.split_to(width)))
            .collect();
        let io = space.row_io(map, &space.geometry.whole_row(extent, row));
        if space.pool.crash_resync.wanted(space.id, extent, row)
            || !crate::resync::row_agrees_as_read(&io, row_slots).await
        {
            again.push(row);
        }
    }
    again
}

/// Each slot's part of `rows`, read in one request per slot (`None` for
/// a slot no disk holds now); `None` if a read failed.
async fn read_rows(
    targets: &[crate::target::Target],
    geometry: &terrace_layout::Geometry,
    rows: Range<u64>,
) -> Option<Vec<Option<BytesMut>>> {
    let length = (rows.end - rows.start) * geometry.interleave_bytes();
    let reads = targets.iter().map(|target| async move {
        let Some(location) = target.readable(rows.start) else {
            return Some(None);
        };
        let offset = location.base + geometry.slab_offset(rows.start, 0);
        let (bytes, result) = location
            .disk
            .read(offset, aligned_buffer(length as usize))
            .await;
        result.ok().map(|()| Some(bytes))
    });
    futures::future::join_all(reads).await.into_iter().collect()
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
    let mut report = if pass == Pass::Repair {
        // As a scrub of an idle pool reads: long reads, rows that do not
        // agree checked again under their locks.
        let step = streaming_step_rows(&space.geometry);
        let mut report = RedundancyReport::default();
        for (_, extent) in extents {
            for first in (0..per_extent).step_by(step as usize) {
                let rows = first..(first + step).min(per_extent);
                report.add(repair_rows_streaming(space, extent, rows).await?);
            }
        }
        report
    } else {
        let rows = extents
            .into_iter()
            .flat_map(|(_, extent)| (0..per_extent).map(move |row| (extent, row)));
        walk_rows(space, pass, rows).await?
    };
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
