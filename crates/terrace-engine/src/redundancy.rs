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

use futures::stream::{FuturesOrdered, StreamExt};
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

/// Check the rows under `[offset, offset + length)` only with `pass`:
/// after a crash (`Pass::Resync`), the ranges a write-back log says were
/// being written, learning their blocks' sums from the data; after a
/// clean close (`Pass::Repair`, as a scrub), where the sums are right and
/// a block failing them on every copy stays failed rather than teaching
/// them its bytes.
pub(crate) async fn check_range(
    space: &Volume,
    offset: u64,
    length: u64,
    pass: Pass,
) -> Result<RedundancyReport, EngineError> {
    walk_rows(space, pass, rows_under(space, offset, length)).await
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

/// A scrub's pass over rows `rows` of `extent` on an idle pool: each
/// slot's part of them is read in long requests (so each disk streams,
/// as row-sized reads with gaps between them do not), each read while
/// the rows of the one before are checked, without their locks and
/// without writing; only the rows that do not plainly agree are checked
/// again, read anew under their locks, and repaired as [`repair_rows`]
/// does. A row checked unlocked while a client wrote it may look torn,
/// and is then checked again; one that agrees had no fault to find; the
/// rows of a read that failed take the locked way too.
///
/// Before each read `go_on` is asked, with the bytes it reads from disks,
/// whether to go on (a scrub paces itself there, and stops when paused
/// or when clients come back). Gives what was found and the row it
/// stopped at (`rows.end` when done); `None` where a slot is moving
/// (two places to read): the caller checks row by row.
pub(crate) async fn repair_rows_streaming<F, Go>(
    space: &Volume,
    extent: u64,
    rows: Range<u64>,
    mut go_on: F,
) -> Result<Option<(RedundancyReport, u64)>, EngineError>
where
    F: FnMut(u64) -> Go,
    Go: std::future::Future<Output = bool>,
{
    if space.geometry.layout().failures_tolerated() == 0 && space.sums().is_none() {
        // Nothing to check against.
        return Ok(Some((RedundancyReport::default(), rows.end)));
    }
    let map = space.map();
    let geometry = &space.geometry;
    if !Volume::allocated(&map, extent) || rows.is_empty() {
        // Past the end, or never written (a thin space's): nothing to check.
        return Ok(Some((RedundancyReport::default(), rows.end)));
    }
    let targets = &map.extents[extent as usize];
    if targets.iter().any(|target| target.locations.len() != 1) {
        return Ok(None);
    }
    let per_read = (STREAMING_READ_BYTES / geometry.interleave_bytes()).max(1);
    let read_bytes = |chunk: &Range<u64>| {
        (chunk.end - chunk.start) * geometry.interleave_bytes() * targets.len() as u64
    };
    let chunk_at = |first: u64| first..(first + per_read).min(rows.end);
    let mut again = Vec::new();
    let mut done = rows.start;
    let mut reads = FuturesOrdered::new();
    let mut next = rows.start;
    let mut stopped = false;
    loop {
        while reads.len() < STREAMING_READS && !stopped && next < rows.end {
            let chunk = chunk_at(next);
            if !go_on(read_bytes(&chunk)).await {
                stopped = true;
                break;
            }
            next = chunk.end;
            reads.push_back(async move {
                let slots = read_rows(targets, geometry, chunk.clone()).await;
                (chunk, slots)
            });
        }
        // The reads behind this one go on while it is checked.
        let Some((chunk, slots)) = reads.next().await else {
            break;
        };
        again.extend(rows_to_check_again(space, &map, extent, chunk.clone(), slots).await);
        done = chunk.end;
    }
    let agreed = (done - rows.start) - again.len() as u64;
    let mut report = walk_rows(
        space,
        Pass::Repair,
        again.into_iter().map(|row| (extent, row)),
    )
    .await?;
    report.rows += agreed;
    Ok(Some((report, done)))
}

/// Bytes of a slot a streaming pass reads in one request (more for an
/// interleave larger than this): long enough that a hard disk streams,
/// short enough that pacing and pausing between reads stay fine-grained.
const STREAMING_READ_BYTES: u64 = 1 << 20;
/// Reads a streaming pass keeps in flight on each disk: two stay queued
/// while the rows of a third are checked, so a disk has its next read
/// when one ends (with one, a hard disk idled between them and read at
/// about 0.8 of its media rate).
const STREAMING_READS: usize = 3;

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
        let mut report = RedundancyReport::default();
        for (_, extent) in extents {
            let rows = 0..per_extent;
            match repair_rows_streaming(space, extent, rows.clone(), |_| async { true }).await? {
                Some((found, _)) => report.add(found),
                None => report.add(repair_rows(space, extent, rows).await?),
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
        if !Volume::allocated(&map, extent) {
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
