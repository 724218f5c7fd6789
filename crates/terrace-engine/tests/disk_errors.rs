//! A disk that cannot read a sector is not failed for it: the row's bytes
//! are rebuilt from redundancy, returned, and written back over the
//! unreadable sector (a drive remaps it as it takes the write), and the
//! disk's read errors are counted. Writes that must read the old bytes
//! first do the same. Only a disk whose read and checksum errors reach the
//! pool's limit within its window is failed, and repaired like a missing
//! disk; `pool clear` sets the counters back to zero.

mod common;

use std::sync::Arc;

use common::*;
use terrace_engine::layout::Layout;
use terrace_engine::{repair_space, Condition, Pool, ProblemKind, Space, SpaceConfig, SpaceSize};

const DISK_BYTES: u64 = 16 << 20;
const INTERLEAVE: u64 = 16 << 10;
const EXTENTS: u64 = 4;
const EXTENT: u64 = 1;

/// A space of `layout` over `columns`, written whole with random data.
async fn written(pool: &Pool, layout: Layout, columns: u32) -> (Arc<Space>, Vec<u8>) {
    let geometry =
        terrace_engine::layout::Geometry::new(layout, columns, INTERLEAVE, SLAB).expect("geometry");
    let mut config = SpaceConfig::new(
        "s",
        layout,
        SpaceSize::Bytes(EXTENTS * geometry.extent_data_bytes()),
    );
    config.columns = Some(columns);
    config.interleave_bytes = Some(INTERLEAVE);
    // No write-back log: writes go home at once.
    config.cache_bytes = Some(0);
    let space = pool.create_space(config).await.unwrap().space;
    let data = SplitMix64::new(5).bytes(space.size_bytes() as usize);
    for offset in (0..space.size_bytes()).step_by(256 << 10) {
        let end = (offset + (256 << 10)).min(space.size_bytes());
        let piece = data[offset as usize..end as usize].to_vec();
        space.write(offset, bytes(piece), false).await.unwrap();
    }
    space.flush().await.unwrap();
    (space, data)
}

/// The slot that holds data column 0 of `row` and is read first: for a
/// mirror, the copy its region starts on (`(extent + column) % copies`
/// with slabs below a read region).
fn read_slot(space: &Space, row: u64) -> u32 {
    let geometry = space.geometry();
    match geometry.layout() {
        Layout::Mirror { copies } => geometry.slot(0, (EXTENT as u32) % copies),
        _ => geometry.slot(geometry.physical_column(row, 0), 0),
    }
}

/// Make 4 KiB of `slot`'s part of `row` unreadable on its disk; the disk.
async fn bad_sector(disks: &Disks, pool: &Pool, space: &Space, slot: u32, row: u64) -> usize {
    let (disk, offset) = row_place(pool, space, EXTENT, row, slot).await;
    disks.faults[disk].bad_sector(offset..offset + 4096);
    disk
}

fn row_offset(space: &Space, row: u64) -> u64 {
    let geometry = space.geometry();
    EXTENT * geometry.extent_data_bytes() + row * geometry.row_data_bytes()
}

async fn read_row(space: &Space, row: u64) -> Result<Vec<u8>, terrace_engine::EngineError> {
    let length = space.geometry().row_data_bytes();
    let bytes = space.read(row_offset(space, row), length).await?;
    Ok(bytes.to_vec())
}

fn expected(space: &Space, data: &[u8], row: u64) -> Vec<u8> {
    let start = row_offset(space, row) as usize;
    data[start..start + space.geometry().row_data_bytes() as usize].to_vec()
}

fn redundant() -> Vec<(&'static str, Layout, u32)> {
    vec![
        ("mirror2", Layout::Mirror { copies: 2 }, 2),
        ("parity1", Layout::Parity { redundancy: 1 }, 4),
        ("parity2", Layout::Parity { redundancy: 2 }, 5),
    ]
}

#[test]
fn an_unreadable_sector_is_rebuilt_rewritten_and_counted() {
    block_on(async {
        for (name, layout, columns) in redundant() {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let (space, data) = written(&pool, layout, columns).await;
            let disk = bad_sector(&disks, &pool, &space, read_slot(&space, 2), 2).await;
            let read = read_row(&space, 2).await.unwrap();
            assert!(read == expected(&space, &data, 2), "{name}: wrong data");
            let status = pool.status().await;
            assert_eq!(status.disks[disk].errors.read, 1, "{name}");
            assert_eq!(status.disks[disk].condition, Condition::Online, "{name}");
            assert!(
                disks.faults[disk].bad_sectors().is_empty(),
                "{name}: the sector was not rewritten"
            );
            // Rewritten: the next read finds the bytes there.
            assert!(read_row(&space, 2).await.unwrap() == expected(&space, &data, 2));
            assert_eq!(pool.status().await.disks[disk].errors.read, 1, "{name}");
        }
    });
}

/// A parity write of part of a row reads the old bytes of the columns it
/// does not change, to compute parity; one it cannot read is rebuilt from
/// the others, the write lands, and that column's sector is rewritten
/// before the row is let go.
#[test]
fn a_partial_parity_write_over_an_unreadable_sector_lands_and_rewrites_it() {
    block_on(async {
        for (name, layout, columns) in redundant().into_iter().skip(1) {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let (space, mut data) = written(&pool, layout, columns).await;
            let geometry = space.geometry();
            let beside = geometry.slot(geometry.physical_column(1, 1), 0);
            let disk = bad_sector(&disks, &pool, &space, beside, 1).await;
            let offset = row_offset(&space, 1);
            let new = vec![0x5a; 4096];
            space
                .write(offset, bytes(new.clone()), false)
                .await
                .unwrap();
            data[offset as usize..offset as usize + 4096].copy_from_slice(&new);
            assert!(
                disks.faults[disk].bad_sectors().is_empty(),
                "{name}: {:?} {:?}",
                disks.faults[disk].bad_sectors(),
                pool.status().await.disks[disk].errors
            );
            assert!(read_row(&space, 1).await.unwrap() == expected(&space, &data, 1));
            let report = repair_space(&space).await.unwrap();
            assert!(report.mismatched_rows.is_empty(), "{name}: {report:?}");
            assert_eq!(pool.status().await.disks[disk].errors.read, 1, "{name}");
        }
    });
}

/// Without redundancy the read fails, but the disk stays in service.
#[test]
fn a_simple_space_fails_the_read_and_keeps_the_disk() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, data) = written(&pool, Layout::Simple, 2).await;
        let disk = bad_sector(&disks, &pool, &space, read_slot(&space, 0), 0).await;
        assert!(read_row(&space, 0).await.is_err());
        let status = pool.status().await;
        assert_eq!(status.disks[disk].errors.read, 1);
        assert_eq!(status.disks[disk].condition, Condition::Online);
        assert!(read_row(&space, 1).await.unwrap() == expected(&space, &data, 1));
    });
}

/// A scrub finds an unreadable sector no read touched, rebuilds it and
/// rewrites it; a second scrub finds nothing.
#[test]
fn a_scrub_rewrites_an_unreadable_sector() {
    block_on(async {
        for (name, layout, columns) in redundant() {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let (space, data) = written(&pool, layout, columns).await;
            let disk = bad_sector(&disks, &pool, &space, read_slot(&space, 3), 3).await;
            let report = repair_space(&space).await.unwrap();
            assert_eq!(report.mismatched_rows, vec![(EXTENT, 3)], "{name}");
            assert!(report.unrepaired_rows.is_empty(), "{name}: {report:?}");
            let kinds: Vec<&ProblemKind> = report.findings[0]
                .problems
                .iter()
                .map(|problem| &problem.kind)
                .collect();
            assert!(
                kinds.contains(&&ProblemKind::Unreadable),
                "{name}: {kinds:?}"
            );
            assert!(disks.faults[disk].bad_sectors().is_empty(), "{name}");
            let again = repair_space(&space).await.unwrap();
            assert!(again.mismatched_rows.is_empty(), "{name}: {again:?}");
            assert!(read_row(&space, 3).await.unwrap() == expected(&space, &data, 3));
        }
    });
}

/// Errors up to the limit are survived; the one that reaches it fails the
/// disk, and the space reads on from the other copy. `pool clear` takes
/// the disk back and its counters start again from zero.
#[test]
fn a_disk_that_reaches_the_error_limit_is_failed_and_clear_resets_its_counters() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let mut settings = pool.metadata().await.settings;
        settings.error_limit = 3;
        pool.set_settings(settings).await.unwrap();
        let (space, data) = written(&pool, Layout::Mirror { copies: 2 }, 2).await;
        let slot = read_slot(&space, 0);
        let mut disk = 0;
        for row in 0..3 {
            disk = bad_sector(&disks, &pool, &space, slot, row).await;
            assert!(read_row(&space, row).await.unwrap() == expected(&space, &data, row));
            let status = pool.status().await;
            let condition = status.disks[disk].condition;
            if row < 2 {
                assert_eq!(condition, Condition::Online, "row {row}");
            } else {
                assert_eq!(condition, Condition::Failed, "the third error fails it");
                assert!(status.disks[disk]
                    .reason
                    .contains("3 read and checksum errors"));
            }
        }
        assert_eq!(pool.status().await.disks[disk].errors.read, 3);
        for row in 0..4 {
            assert!(read_row(&space, row).await.unwrap() == expected(&space, &data, row));
        }
        let cleared = pool
            .clear(Some(terrace_engine::meta::DiskIndex(disk as u16)))
            .await;
        assert_eq!(cleared.unwrap()[0].refused, None);
        assert_eq!(pool.status().await.disks[disk].errors, Default::default());
        with_jobs(&pool, jobs_settle(&pool)).await;
        for row in 0..4 {
            assert!(read_row(&space, row).await.unwrap() == expected(&space, &data, row));
        }
    });
}

/// The limit never takes the last copy: once one disk of a mirror failed
/// for its errors, the other, reaching the limit too, stays in service
/// (a disk with some unreadable sectors serves the rest of its data).
#[test]
fn the_error_limit_never_fails_the_last_copy() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let mut settings = pool.metadata().await.settings;
        settings.error_limit = 1;
        pool.set_settings(settings).await.unwrap();
        let (space, data) = written(&pool, Layout::Mirror { copies: 2 }, 1).await;
        let geometry = space.geometry();
        let first = read_slot(&space, 0);
        let disk = bad_sector(&disks, &pool, &space, first, 0).await;
        assert!(read_row(&space, 0).await.unwrap() == expected(&space, &data, 0));
        assert_eq!(pool.status().await.disks[disk].condition, Condition::Failed);
        let other = geometry.slot(0, 1 - first % 2);
        let last = bad_sector(&disks, &pool, &space, other, 1).await;
        assert_ne!(last, disk);
        assert!(
            read_row(&space, 1).await.is_err(),
            "no copy left to rebuild from"
        );
        let status = pool.status().await;
        assert_eq!(status.disks[last].condition, Condition::Online);
        assert_eq!(status.disks[last].errors.read, 1);
        assert!(read_row(&space, 2).await.unwrap() == expected(&space, &data, 2));
    });
}

/// Wait, with the job runner (which probes idle disks), until disk `disk`
/// leaves service or a few probe intervals have passed; its condition.
async fn probed(pool: &Pool, disk: usize) -> Condition {
    with_jobs(pool, async {
        for _ in 0..600 {
            if pool.status().await.disks[disk].condition != Condition::Online {
                break;
            }
            sleep(5).await;
        }
        pool.status().await.disks[disk].condition
    })
    .await
}

/// A disk whose every read and write fails is dead, even where it holds
/// the last copy: the idle probe cannot read its label, writes it again,
/// and the failed write fails the disk, with nothing read from it. A
/// read error alone would have kept it in service.
#[test]
fn an_idle_disk_that_fails_reads_and_writes_is_failed_even_with_the_last_copy() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (_space, _data) = written(&pool, Layout::Simple, 2).await;
        disks.faults[1].bad_sector(0..DISK_BYTES);
        disks.faults[1].fail_writes(0..DISK_BYTES);
        assert_eq!(probed(&pool, 1).await, Condition::Failed);
        let status = pool.status().await;
        assert!(
            status.disks[1].reason.contains("write"),
            "{}",
            status.disks[1].reason
        );
        assert_eq!(status.disks[0].condition, Condition::Online);
    });
}

/// A disk whose label alone became unreadable gets it written again by
/// the idle probe (the drive remaps the block) and stays in service.
#[test]
fn an_unreadable_label_is_written_again_and_the_disk_stays() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, data) = written(&pool, Layout::Simple, 2).await;
        disks.faults[1].bad_sector(0..terrace_engine::meta::format::LABEL_BYTES as u64);
        with_jobs(&pool, async {
            for _ in 0..600 {
                if disks.faults[1].bad_sectors().is_empty() {
                    break;
                }
                sleep(5).await;
            }
        })
        .await;
        assert!(disks.faults[1].bad_sectors().is_empty(), "label rewritten");
        let status = pool.status().await;
        assert_eq!(status.disks[1].condition, Condition::Online);
        assert!(read_row(&space, 0).await.unwrap() == expected(&space, &data, 0));
        // The pool still imports from the rewritten label.
        drop(space);
        pool.close().await.expect("close");
        let again = Pool::import(env(), disks.devices.clone(), Default::default())
            .await
            .expect("import");
        assert_eq!(again.status().await.disks[1].condition, Condition::Online);
        again.close().await.expect("close");
    });
}
