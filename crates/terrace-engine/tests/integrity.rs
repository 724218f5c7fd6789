//! Every block has a sum, and reads check it: a copy or column damaged
//! behind the engine's back (on its disk, no error returned) is never
//! returned to a reader. Where the layout has redundancy the block is
//! rebuilt, the damaged copy rewritten in place and the disk's checksum
//! errors counted; where it has none, or more is damaged than the layout
//! survives, the read fails. A scrub (`repair_space`) repairs what reads
//! did not touch, and a second finds nothing. Sums survive a reopen.

mod common;

use std::sync::Arc;

use common::*;
use terrace_engine::layout::Layout;
use terrace_engine::{
    repair_space, ImportOptions, Pool, ProblemKind, Space, SpaceConfig, SpaceSize,
};

const DISK_BYTES: u64 = 16 << 20;
const INTERLEAVE: u64 = 16 << 10;
const EXTENTS: u64 = 4;
const EXTENT: u64 = 1;
const ROW: u64 = 3;

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
        case("mirror2", Layout::Mirror { copies: 2 }, 2, 0),
        case("mirror3", Layout::Mirror { copies: 3 }, 1, 0),
        case("parity1", Layout::Parity { redundancy: 1 }, 4, 0),
        case("parity1-log", Layout::Parity { redundancy: 1 }, 4, 1 << 20),
        case("parity2", Layout::Parity { redundancy: 2 }, 5, 0),
        case("parity2-log", Layout::Parity { redundancy: 2 }, 5, 1 << 20),
    ]
}

/// A space of `case` written whole with random data (home on the disks),
/// and that data.
async fn written(pool: &Pool, case: &Case) -> (Arc<Space>, Vec<u8>) {
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
    let size = space.size_bytes();
    let data = SplitMix64::new(11).bytes(size as usize);
    // Every other piece comes with its blocks' sums, as the NBD server
    // takes them on arrival: the damage below is found either way.
    for (i, offset) in (0..size).step_by(256 << 10).enumerate() {
        let end = (offset + (256 << 10)).min(size);
        let piece = data[offset as usize..end as usize].to_vec();
        if i % 2 == 0 {
            space.write(offset, bytes(piece), false).await.unwrap();
            continue;
        }
        let sums = piece
            .chunks(4096)
            .zip(offset / 4096..)
            .map(|(block, index)| terrace_engine::meta::sums::block_sum(block, index))
            .collect();
        space
            .write_summed(offset, bytes(piece), sums, false)
            .await
            .unwrap();
    }
    if let Some(journal) = space.journal() {
        while journal.destage(&space, true).await.unwrap() {}
    }
    space.flush().await.unwrap();
    (space, data)
}

/// Where `slot` of `ROW` of `EXTENT` lies: its disk and byte offset.
async fn place(pool: &Pool, space: &Space, slot: u32) -> (usize, u64) {
    row_place(pool, space, EXTENT, ROW, slot).await
}

/// Overwrite 8 KiB of `slot`'s part of the row, 4 KiB in, on its disk.
async fn damage(disks: &Disks, pool: &Pool, space: &Space, slot: u32) -> (usize, u64) {
    let (disk, offset) = place(pool, space, slot).await;
    disks.memory[disk].write_sync(offset + 4096, &[0xee; 8192]);
    (disk, offset)
}

/// The slot holding data column `column` of the row (a mirror: `copy`).
fn data_slot(space: &Space, case: &Case, column: u32, copy: u32) -> u32 {
    let geometry = space.geometry();
    match case.layout {
        Layout::Mirror { .. } => geometry.slot(column, copy),
        _ => geometry.slot(geometry.physical_column(ROW, column), 0),
    }
}

fn row_offset(space: &Space) -> u64 {
    let geometry = space.geometry();
    EXTENT * geometry.extent_data_bytes() + ROW * geometry.row_data_bytes()
}

async fn checksum_errors(pool: &Pool, disk: usize) -> u64 {
    pool.status().await.disks[disk].errors.checksum
}

#[test]
fn a_damaged_copy_is_rebuilt_rewritten_and_counted_in_every_redundant_layout() {
    block_on(async {
        for case in cases() {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let (space, data) = written(&pool, &case).await;
            let slot = data_slot(&space, &case, 0, 1);
            let (disk, at) = damage(&disks, &pool, &space, slot).await;
            let before = disks.memory[disk].read_sync(at, INTERLEAVE as usize);
            // Read the whole row, and the damaged blocks alone, many times:
            // never the damaged bytes.
            let offset = row_offset(&space);
            let length = space.geometry().row_data_bytes();
            for _ in 0..3 {
                let got = space.read(offset, length).await.unwrap();
                let want = &data[offset as usize..(offset + length) as usize];
                assert!(
                    got[..] == want[..],
                    "{}: the row reads as written",
                    case.name
                );
                let got = space.read(offset + 4096, 8192).await.unwrap();
                assert!(got[..] == data[offset as usize + 4096..offset as usize + 12288]);
            }
            assert_eq!(
                checksum_errors(&pool, disk).await,
                1,
                "{}: counted once",
                case.name
            );
            let after = disks.memory[disk].read_sync(at, INTERLEAVE as usize);
            assert_ne!(before, after, "{}: rewritten in place", case.name);
            assert!(after[4096..12288].iter().any(|&byte| byte != 0xee));
            let report = repair_space(&space).await.unwrap();
            assert!(
                report.mismatched_rows.is_empty(),
                "{}: {report:?}",
                case.name
            );
            pool.close().await.unwrap();
        }
    });
}

#[test]
fn a_scrub_repairs_what_no_read_touched_and_a_second_finds_nothing() {
    block_on(async {
        for case in cases() {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let (space, data) = written(&pool, &case).await;
            let slot = data_slot(&space, &case, 0, 0);
            let (disk, at) = damage(&disks, &pool, &space, slot).await;
            let report = repair_space(&space).await.unwrap();
            assert_eq!(report.mismatched_rows, vec![(EXTENT, ROW)], "{}", case.name);
            let repaired = disks.memory[disk].read_sync(at + 4096, 8192);
            assert!(repaired.iter().any(|&byte| byte != 0xee), "{}", case.name);
            let again = repair_space(&space).await.unwrap();
            assert!(again.mismatched_rows.is_empty(), "{}: {again:?}", case.name);
            let offset = row_offset(&space);
            let length = space.geometry().row_data_bytes();
            let got = space.read(offset, length).await.unwrap();
            assert!(got[..] == data[offset as usize..(offset + length) as usize]);
            pool.close().await.unwrap();
        }
    });
}

/// Dual parity survives two damaged columns of one row; single parity
/// and a 2-way mirror, damaged beyond what they survive, fail the read
/// rather than return wrong bytes.
#[test]
fn damage_within_tolerance_heals_and_beyond_it_fails_the_read() {
    block_on(async {
        for case in cases() {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let (space, data) = written(&pool, &case).await;
            let tolerated = case.layout.failures_tolerated();
            let slots: Vec<u32> = match case.layout {
                Layout::Mirror { copies } => (0..copies)
                    .map(|c| data_slot(&space, &case, 0, c))
                    .collect(),
                _ => (0..=tolerated)
                    .map(|c| data_slot(&space, &case, c, 0))
                    .collect(),
            };
            let offset = row_offset(&space);
            let length = space.geometry().row_data_bytes();
            // As many damaged as the layout survives: the row reads right.
            for &slot in &slots[..tolerated as usize] {
                damage(&disks, &pool, &space, slot).await;
            }
            let got = space.read(offset, length).await.unwrap();
            assert!(
                got[..] == data[offset as usize..(offset + length) as usize],
                "{}",
                case.name
            );
            // One more (damaged again where the read rewrote): the damaged
            // blocks fail to read; the rest of the row still reads.
            for &slot in &slots {
                damage(&disks, &pool, &space, slot).await;
            }
            let refused = space.read(offset, length).await;
            assert!(refused.is_err(), "{}: wrong data returned", case.name);
            let untouched = space.read(offset, 4096).await.unwrap();
            assert!(untouched[..] == data[offset as usize..offset as usize + 4096]);
            pool.close().await.unwrap();
        }
    });
}

/// A simple space cannot rebuild: a damaged block fails the read, and the
/// blocks around it read as written.
#[test]
fn a_simple_space_refuses_a_damaged_block() {
    block_on(async {
        let case = Case {
            name: "simple",
            layout: Layout::Simple,
            columns: 2,
            cache_bytes: 0,
        };
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, data) = written(&pool, &case).await;
        let slot = data_slot(&space, &case, 0, 0);
        damage(&disks, &pool, &space, slot).await;
        let offset = row_offset(&space);
        assert!(space.read(offset + 4096, 4096).await.is_err());
        let clean = space.read(offset, 4096).await.unwrap();
        assert!(clean[..] == data[offset as usize..offset as usize + 4096]);
        pool.close().await.unwrap();
    });
}

/// Sums are durable: a pool closed and imported again still tells which
/// copy was damaged while it was closed (without sums, a scrub could only
/// say that the copies differ).
#[test]
fn sums_outlive_a_reopen() {
    block_on(async {
        let case = &cases()[0];
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, data) = written(&pool, case).await;
        let slot = data_slot(&space, case, 0, 0);
        let name = space.name().to_string();
        drop(space);
        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space(&name).unwrap();
        damage(&disks, &pool, &space, slot).await;
        let report = repair_space(&space).await.unwrap();
        assert_eq!(report.mismatched_rows, vec![(EXTENT, ROW)]);
        let problems = &report.findings[0].problems;
        assert_eq!(problems[0].kind, ProblemKind::Checksum { blocks: 2 });
        assert_eq!(problems[0].places.len(), 1);
        assert_eq!(problems[0].places[0].slot, slot);
        let offset = row_offset(&space);
        let length = space.geometry().row_data_bytes();
        let got = space.read(offset, length).await.unwrap();
        assert!(got[..] == data[offset as usize..(offset + length) as usize]);
        pool.close().await.unwrap();
    });
}

/// A dual-parity space without a log, degraded (a disk lost), written,
/// and cut off before its sums reached the disks: the import resyncs the
/// extents the write intent names, and learns their blocks' sums from the
/// data there although a column is missing, so the row reads as written.
#[test]
fn a_degraded_row_written_before_a_crash_reads_back_after_it() {
    block_on(async {
        let case = &cases()[4];
        assert_eq!(case.name, "parity2");
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, _) = written(&pool, case).await;
        let (disk, _) = place(&pool, &space, 0).await;
        disks.faults[disk].lose();
        let offset = row_offset(&space);
        let length = space.geometry().row_data_bytes();
        let newer = SplitMix64::new(99).bytes(length as usize);
        space
            .write(offset + 4096, bytes(newer[..8192].to_vec()), true)
            .await
            .unwrap();
        let name = space.name().to_string();
        drop(space);
        drop(pool);
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space(&name).unwrap();
        let got = space.read(offset + 4096, 8192).await.unwrap();
        assert!(got[..] == newer[..8192], "the row reads as written");
        assert!(space.read(offset, length).await.is_ok());
    });
}

/// A write over part of a row reads old data: the edges of a block it
/// covers only in part, the old data a parity update folds into parity
/// (every data column but the first written whole: parity is encoded
/// from the first column's old bytes), a destage's merged row. Damaged on
/// its disk, that data is healed before it is used: written back as read,
/// or folded into parity, it would become the truth (a mirror's copies
/// all holding the damage, parity agreeing with a damaged column).
#[test]
fn a_write_over_part_of_a_row_heals_the_old_data_it_reads_first() {
    block_on(async {
        for case in cases() {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let (space, mut data) = written(&pool, &case).await;
            let slot = data_slot(&space, &case, 0, 0);
            damage(&disks, &pool, &space, slot).await;
            let offset = row_offset(&space);
            let length = space.geometry().row_data_bytes();
            let mut writes = vec![(offset + 4096 + 1000, 100)];
            if length > INTERLEAVE {
                writes.push((offset + INTERLEAVE, length - INTERLEAVE));
            }
            for (at, count) in writes {
                let new = SplitMix64::new(at).bytes(count as usize);
                data[at as usize..(at + count) as usize].copy_from_slice(&new);
                space.write(at, bytes(new), false).await.unwrap();
            }
            if let Some(journal) = space.journal() {
                while journal.destage(&space, true).await.unwrap() {}
            }
            let got = space.read(offset, length).await;
            let got = got.unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert!(
                got[..] == data[offset as usize..(offset + length) as usize],
                "{}: the row reads as written",
                case.name
            );
            // What the write did not read (a mirror read the other copy)
            // is the scrub's to repair, and all of it is repairable.
            let report = repair_space(&space).await.unwrap();
            assert!(
                report.unrepaired_rows.is_empty()
                    && report
                        .findings
                        .iter()
                        .flat_map(|finding| &finding.problems)
                        .all(|problem| matches!(problem.kind, ProblemKind::Checksum { .. })),
                "{}: {report:?}",
                case.name
            );
            let again = repair_space(&space).await.unwrap();
            assert!(again.mismatched_rows.is_empty(), "{}: {again:?}", case.name);
            pool.close().await.unwrap();
        }
    });
}

/// A parity update of part of a row checks the other columns it encodes
/// parity from, and rebuilds the damaged one; when the disk acknowledges
/// that repair and never makes it (a lost write), the update still
/// encodes parity from the rebuilt bytes, not from the damage it would
/// read again: the row still rebuilds the column and reads as written.
#[test]
fn a_parity_update_encodes_what_it_checked_when_the_repair_is_lost() {
    block_on(async {
        let case = Case {
            name: "parity1",
            layout: Layout::Parity { redundancy: 1 },
            columns: 4,
            cache_bytes: 0,
        };
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, mut data) = written(&pool, &case).await;
        let (disk, at) = damage(&disks, &pool, &space, data_slot(&space, &case, 0, 0)).await;
        disks.faults[disk].silent_faults_within(at..at + INTERLEAVE);
        disks.faults[disk].lose_writes(1);
        // Columns 1 and 2: reading the two others (reconstruct-write)
        // reads less than their old bytes and parity.
        let offset = row_offset(&space);
        let new = SplitMix64::new(3).bytes(2 * INTERLEAVE as usize);
        let start = (offset + INTERLEAVE) as usize;
        data[start..start + new.len()].copy_from_slice(&new);
        space
            .write(offset + INTERLEAVE, bytes(new), false)
            .await
            .unwrap();
        assert_eq!(
            disks.faults[disk].counters().lost_writes,
            1,
            "the repair of column 0 was lost"
        );
        let length = space.geometry().row_data_bytes();
        let got = space.read(offset, length).await.unwrap();
        assert!(
            got[..] == data[offset as usize..(offset + length) as usize],
            "the row reads as written"
        );
        let report = repair_space(&space).await.unwrap();
        assert!(report.unrepaired_rows.is_empty(), "{report:?}");
        pool.close().await.unwrap();
    });
}

/// Dual parity with a disk lost: a partial update rebuilds the lost
/// column's old bytes once, checked against their sums, and encodes parity
/// from those, not from a second rebuild out of survivors it does not
/// check. Here the column the update covers holds stale bytes (its disk
/// lost the previous write to it, and then the repair): rebuilt from them,
/// the lost column would go into parity wrong, and no longer read back.
#[test]
fn a_degraded_parity_update_encodes_the_lost_column_as_it_checked_it() {
    block_on(async {
        let case = &cases()[4];
        assert_eq!(case.name, "parity2");
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, mut data) = written(&pool, case).await;
        let lost = place(&pool, &space, data_slot(&space, case, 0, 0)).await.0;
        disks.faults[lost].lose();
        let (stale, at) = place(&pool, &space, data_slot(&space, case, 1, 0)).await;
        disks.faults[stale].silent_faults_within(at..at + INTERLEAVE);
        disks.faults[stale].lose_writes(2);
        // Column 1's first block, twice: the first write is lost, then the
        // second's check rebuilds it, and that repair is lost too.
        let offset = row_offset(&space) + INTERLEAVE;
        let mut rng = SplitMix64::new(7);
        for _ in 0..2 {
            let new = rng.bytes(4096);
            data[offset as usize..offset as usize + 4096].copy_from_slice(&new);
            space.write(offset, bytes(new), false).await.unwrap();
        }
        assert_eq!(
            disks.faults[stale].counters().lost_writes,
            2,
            "the first write and its repair were lost"
        );
        let start = row_offset(&space);
        let length = space.geometry().row_data_bytes();
        let got = space.read(start, length).await.unwrap();
        assert!(
            got[..] == data[start as usize..(start + length) as usize],
            "the row reads as written, the lost disk's column included"
        );
        pool.close().await.unwrap();
    });
}

/// Past what single parity survives (a disk lost, a column of one row
/// damaged on another), a destage images the row before it and writes it
/// home, then finds the damaged row unreadable and turns the log
/// write-through. A write that then goes straight home into the first
/// row must not be undone at the next import by replaying that image
/// (older data with its own sum, which every read would take): across a
/// power cut it reads as written.
#[test]
fn a_write_through_write_outlives_the_row_image_logged_before_it() {
    block_on(async {
        let case = &cases()[3];
        assert_eq!(case.name, "parity1-log");
        let disks = Disks::with_power(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, mut data) = written(&pool, case).await;
        let journal = space.journal().unwrap();
        journal.set_gathering(false);
        let row_bytes = space.geometry().row_data_bytes();
        let damaged_row = row_offset(&space);
        let imaged_row = damaged_row - row_bytes;
        let lost = place(&pool, &space, data_slot(&space, case, 0, 0)).await.0;
        disks.faults[lost].lose();
        // A logged write into each row, then the damage.
        let mut rng = SplitMix64::new(5);
        for at in [imaged_row + 4096, damaged_row + 4096] {
            let new = rng.bytes(4096);
            data[at as usize..at as usize + 4096].copy_from_slice(&new);
            space.write(at, bytes(new), true).await.unwrap();
        }
        let slot = data_slot(&space, case, 1, 0);
        let (disk, at) = place(&pool, &space, slot).await;
        let intact = disks.memory[disk].read_sync(at, INTERLEAVE as usize);
        damage(&disks, &pool, &space, slot).await;
        assert!(journal.destage(&space, true).await.is_err());
        assert!(journal.status().write_through.is_some());
        // The damage mended behind the engine's back: the write below is
        // one the disks can take.
        disks.memory[disk].write_sync(at, &intact);
        let written_through = imaged_row + 3 * 4096;
        let new = rng.bytes(4096);
        data[written_through as usize..written_through as usize + 4096].copy_from_slice(&new);
        space
            .write(written_through, bytes(new.clone()), true)
            .await
            .unwrap();
        let name = space.name().to_string();
        drop(journal);
        drop(space);
        drop(pool);
        disks.power_cut();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space(&name).unwrap();
        let got = space.read(written_through, 4096).await.unwrap();
        assert!(
            got[..] == new[..],
            "an older record replayed over the write"
        );
        let got = space.read(imaged_row, 2 * row_bytes).await.unwrap();
        let want = &data[imaged_row as usize..(imaged_row + 2 * row_bytes) as usize];
        assert!(got[..] == want[..], "both rows read as written");
    });
}

/// Scattered rewrites of a logged space, destaged, make their sums
/// durable through the sums journal (a flush, then a power cut): the
/// import lays the journal over the pages, and a scrub finds every block
/// matching its sum. Growing the
/// space moves the journal to the sums space's new end; rewrites after the
/// growth, in the old room and the new, outlive a second power cut too.
#[test]
fn journaled_sums_outlive_power_cuts_and_a_growth() {
    block_on(async {
        // Logged: no write intent whose resync would learn the sums from
        // the data; what the log destaged before the cut is not replayed.
        let case = &cases()[3];
        assert_eq!(case.name, "parity1-log");
        let disks = Disks::with_power(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, mut data) = written(&pool, case).await;
        let name = space.name().to_string();
        let mut rng = SplitMix64::new(21);
        let mut rewrite = |space: &Space, data: &mut Vec<u8>, count: usize| {
            let blocks = space.size_bytes() / 4096;
            (0..count)
                .map(|_| {
                    let at = rng.below(blocks) * 4096;
                    let new = rng.bytes(4096);
                    data[at as usize..at as usize + 4096].copy_from_slice(&new);
                    (at, new)
                })
                .collect::<Vec<_>>()
        };
        for (at, new) in rewrite(&space, &mut data, 40) {
            space.write(at, bytes(new), false).await.unwrap();
        }
        let (pool, space) = cut_and_import(&disks, pool, space, &data).await;

        let grown = space.size_bytes() + (256 << 10);
        pool.resize_space(&name, grown).await.unwrap();
        data.resize(grown as usize, 0);
        for (at, new) in rewrite(&space, &mut data, 60) {
            space.write(at, bytes(new), false).await.unwrap();
        }
        let (pool, _) = cut_and_import(&disks, pool, space, &data).await;
        pool.close().await.unwrap();
    });
}

/// What the log holds destaged, the disks flushed, the power cut and the
/// pool imported again: `space` as the import found it, which a repair
/// finds nothing wrong with and which reads as `data`.
async fn cut_and_import(
    disks: &Disks,
    pool: Pool,
    space: Arc<Space>,
    data: &[u8],
) -> (Pool, Arc<Space>) {
    let name = space.name().to_string();
    let journal = space.journal().unwrap();
    while journal.destage(&space, true).await.unwrap() {}
    drop(journal);
    space.flush().await.unwrap();
    drop(space);
    drop(pool);
    disks.power_cut();
    let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
        .await
        .unwrap();
    let space = pool.space(&name).unwrap();
    let report = repair_space(&space).await.unwrap();
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    assert!(space.read(0, space.size_bytes()).await.unwrap()[..] == data[..]);
    (pool, space)
}

/// A space made with its sums knows which blocks read as zeroes without
/// reading them (`Space::block_status`): never written, or zeroed with
/// `write_zeroes` where that zeroes on the disks (simple and mirror),
/// and it still knows after an import. A block the log holds newer data
/// of is data before it goes home.
#[test]
fn block_status_tells_the_blocks_known_zero() {
    block_on(async {
        for case in [&cases()[0], &cases()[3]] {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let mut config = SpaceConfig::new(case.name, case.layout, SpaceSize::Bytes(4 << 20));
            config.columns = Some(case.columns);
            config.interleave_bytes = Some(INTERLEAVE);
            config.cache_bytes = Some(case.cache_bytes);
            let space = pool.create_space(config).await.unwrap().space;
            let size = space.size_bytes();
            assert_eq!(
                space.block_status(0, size).await.unwrap(),
                vec![(size, true)],
                "{}: new",
                case.name
            );
            // Starting inside a block: the first run starts there.
            assert_eq!(
                space.block_status(100, 4096).await.unwrap(),
                vec![(4096, true)]
            );
            space
                .write(1 << 20, bytes(vec![7; 8192]), false)
                .await
                .unwrap();
            let expected = vec![
                (1 << 20, true),
                (8192, false),
                (size - (1 << 20) - 8192, true),
            ];
            assert_eq!(
                space.block_status(0, size).await.unwrap(),
                expected,
                "{}: written (logged, where there is a log)",
                case.name
            );
            if let Some(journal) = space.journal() {
                while journal.destage(&space, true).await.unwrap() {}
            }
            if case.cache_bytes == 0 {
                // Data, then zeroes over it: known zero again.
                space
                    .write(2 << 20, bytes(vec![9; 1 << 20]), false)
                    .await
                    .unwrap();
                space.write_zeroes(2 << 20, 1 << 20, false).await.unwrap();
            }
            space.flush().await.unwrap();
            assert_eq!(space.block_status(0, size).await.unwrap(), expected);
            drop(space);
            pool.close().await.unwrap();
            let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
                .await
                .unwrap();
            let space = pool.space(case.name).unwrap();
            assert_eq!(
                space.block_status(0, size).await.unwrap(),
                expected,
                "{}: after an import",
                case.name
            );
            pool.close().await.unwrap();
        }
    });
}
