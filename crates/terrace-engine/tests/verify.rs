//! `verify_space` reads every row from the disks themselves and finds
//! damage done to one slot behind the engine's back: a data column or
//! parity of a single- or dual-parity space (with and without a write-back
//! log, whose newer data for some blocks does not hide the disks' rows),
//! a copy of a mirror. It names the row, the extent and the disk.

mod common;

use std::sync::Arc;

use common::*;
use terrace_engine::layout::Layout;
use terrace_engine::meta::format::{data_offset, METADATA_SLOT_MIN_BYTES};
use terrace_engine::{
    verify_space, Pool, ProblemKind, RedundancyReport, Role, Space, SpaceConfig, SpaceSize,
};

const DISK_BYTES: u64 = 16 << 20;
const INTERLEAVE: u64 = 4096;
/// Eight extents of every layout below: more rows than a verify keeps
/// findings for.
const EXTENTS: u64 = 8;
/// The row damaged: in the middle of the space, away from its edges.
const EXTENT: u64 = 2;
const ROW: u64 = 5;

struct Case {
    name: &'static str,
    layout: Layout,
    columns: u32,
    cache_bytes: u64,
}

fn cases() -> Vec<Case> {
    let case = |name, layout, columns, cache_bytes| Case {
        name,
        layout,
        columns,
        cache_bytes,
    };
    vec![
        case("parity1", Layout::Parity { redundancy: 1 }, 4, 0),
        case("parity1-log", Layout::Parity { redundancy: 1 }, 4, 1 << 20),
        case("parity2", Layout::Parity { redundancy: 2 }, 5, 0),
        case("parity2-log", Layout::Parity { redundancy: 2 }, 5, 1 << 20),
        case("mirror2", Layout::Mirror { copies: 2 }, 2, 0),
    ]
}

/// A space of `case` filled with data, all of it home on the disks, and
/// then (with a log) newer data in the log for some blocks, among them
/// blocks of the row that will be damaged.
async fn written(pool: &Pool, case: &Case) -> Arc<Space> {
    let geometry =
        terrace_engine::layout::Geometry::new(case.layout, case.columns, INTERLEAVE, SLAB)
            .expect("geometry");
    let mut config = SpaceConfig::new(
        case.name,
        case.layout,
        SpaceSize::Bytes(EXTENTS * geometry.extent_data_bytes()),
    );
    config.columns = Some(case.columns);
    config.interleave_bytes = Some(INTERLEAVE);
    config.cache_bytes = Some(case.cache_bytes);
    let space = pool.create_space(config).await.unwrap().space;
    let mut rng = SplitMix64::new(7);
    let size = space.size_bytes();
    let piece = 64 << 10;
    for offset in (0..size).step_by(piece as usize) {
        let data = rng.bytes(piece.min(size - offset) as usize);
        space.write(offset, bytes(data), false).await.unwrap();
    }
    if let Some(journal) = space.journal() {
        for _ in 0..100 {
            if !journal.destage(&space, true).await.unwrap() {
                break;
            }
        }
        assert_eq!(journal.status().dirty_bytes, 0, "{}", case.name);
        // Newer data in the log for a block of the damaged row and others.
        let row = geometry.row_data_bytes();
        let damaged_row = EXTENT * geometry.extent_data_bytes() + ROW * row;
        for offset in [damaged_row + row - 4096, 4096, size - 8192] {
            let data = rng.bytes(4096);
            space.write(offset, bytes(data), false).await.unwrap();
        }
        assert!(journal.status().dirty_bytes > 0, "{}", case.name);
    }
    space.flush().await.unwrap();
    space
}

/// Overwrite `ROW` of `EXTENT` of `slot` on its disk, behind the engine;
/// returns the disk and the byte offset on it.
async fn damage(disks: &Disks, pool: &Pool, space: &Space, slot: u32) -> (u16, u64) {
    let metadata = pool.metadata().await;
    let slabs = metadata.space(space.name()).unwrap().extents[EXTENT as usize]
        .slabs
        .clone()
        .unwrap();
    let slab = slabs[slot as usize];
    let offset = data_offset(METADATA_SLOT_MIN_BYTES)
        + u64::from(slab.slab.0) * SLAB
        + space.geometry().slab_offset(ROW, 0);
    disks.memory[usize::from(slab.disk.0)].write_sync(offset, &[0xee; INTERLEAVE as usize]);
    (slab.disk.0, offset)
}

/// The report names exactly the damaged row, and `slot` on `disk` at
/// `offset` among the places of its one problem (alone, where `alone`).
fn names_the_place(report: &RedundancyReport, case: &str, slot: u32, disk: u16, offset: u64) {
    assert_eq!(report.mismatched_rows, vec![(EXTENT, ROW)], "{case}");
    assert_eq!(report.findings.len(), 1, "{case}");
    let finding = &report.findings[0];
    assert_eq!((finding.extent, finding.row), (EXTENT, ROW), "{case}");
    assert_eq!(finding.problems.len(), 1, "{case}: {finding:?}");
    let place = finding.problems[0]
        .places
        .iter()
        .find(|place| place.slot == slot)
        .unwrap_or_else(|| panic!("{case}: slot {slot} not named: {finding:?}"));
    assert_eq!(place.disk.map(|disk| disk.0), Some(disk), "{case}");
    assert_eq!(place.disk_offset, Some(offset), "{case}");
}

#[test]
fn a_damaged_data_column_is_found_in_every_layout_with_and_without_a_log() {
    block_on(async {
        for case in cases() {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let space = written(&pool, &case).await;
            let clean = verify_space(&space).await.unwrap();
            assert_eq!(clean.mismatched_rows, vec![], "{}", case.name);
            assert!(clean.findings.is_empty(), "{}", case.name);
            assert_eq!(clean.skipped_rows, 0, "{}", case.name);
            let geometry = space.geometry();
            // Data column 0 of the row (for a mirror, its second copy).
            let slot = match case.layout {
                Layout::Mirror { .. } => geometry.slot(0, 1),
                _ => geometry.physical_column(ROW, 0),
            };
            let (disk, offset) = damage(&disks, &pool, &space, slot).await;
            let report = verify_space(&space).await.unwrap();
            names_the_place(&report, case.name, slot, disk, offset);
            // The block's sum tells which slot is wrong, in every layout:
            // that slot alone is named.
            let problem = &report.findings[0].problems[0];
            assert_eq!(
                problem.kind,
                ProblemKind::Checksum { blocks: 1 },
                "{}",
                case.name
            );
            assert_eq!(problem.places.len(), 1, "{}: {problem:?}", case.name);
            let role = match case.layout {
                Layout::Mirror { .. } => Role::Copy { column: 0, copy: 1 },
                _ => Role::Data { column: 0 },
            };
            assert_eq!(problem.places[0].role, role, "{}", case.name);
            pool.close().await.unwrap();
        }
    });
}

#[test]
fn damaged_parity_is_found_and_dual_parity_names_which() {
    block_on(async {
        for case in cases()
            .into_iter()
            .filter(|case| case.layout.parity_columns() > 0)
        {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let space = written(&pool, &case).await;
            let redundancy = case.layout.parity_columns();
            // The last parity column: Q for dual parity.
            let slot = space.geometry().parity_column(ROW, redundancy - 1);
            let (disk, offset) = damage(&disks, &pool, &space, slot).await;
            let report = verify_space(&space).await.unwrap();
            names_the_place(&report, case.name, slot, disk, offset);
            let problem = &report.findings[0].problems[0];
            let wanted = ProblemKind::Parity {
                p: redundancy == 1,
                q: redundancy == 2,
                damaged: redundancy == 2,
            };
            assert_eq!(problem.kind, wanted, "{}", case.name);
            pool.close().await.unwrap();
        }
    });
}

/// Past the most findings kept, rows are still counted.
#[test]
fn findings_are_bounded_and_the_rest_counted() {
    block_on(async {
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let case = &cases()[0];
        let space = written(&pool, case).await;
        let metadata = pool.metadata().await;
        let extents = &metadata.space(space.name()).unwrap().extents;
        // Damage P of every row of every extent.
        let geometry = space.geometry();
        for (extent, record) in extents.iter().enumerate() {
            let slabs = record.slabs.clone().unwrap();
            for row in 0..geometry.rows_per_extent() {
                let slab = slabs[geometry.parity_column(row, 0) as usize];
                let offset = data_offset(METADATA_SLOT_MIN_BYTES)
                    + u64::from(slab.slab.0) * SLAB
                    + geometry.slab_offset(row, 0);
                disks.memory[usize::from(slab.disk.0)]
                    .write_sync(offset, &[0xee; INTERLEAVE as usize]);
            }
            assert!(extent < EXTENTS as usize);
        }
        let report = verify_space(&space).await.unwrap();
        let rows = EXTENTS * geometry.rows_per_extent();
        assert!(rows as usize > terrace_engine::FINDINGS_MAX);
        assert_eq!(report.mismatched_rows.len() as u64, rows);
        assert_eq!(report.findings.len(), terrace_engine::FINDINGS_MAX);
        pool.close().await.unwrap();
    });
}
