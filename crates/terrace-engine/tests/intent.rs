//! Write intent: a redundant space without a write-back log names the
//! extents it writes in the pool's intent slots before writing them, so
//! that after a crash only those are resynchronised, and clears them once
//! they have been idle and flushed.

mod common;

use common::*;
use terrace_engine::layout::Layout;
use terrace_engine::meta::format::{
    data_offset, INTENT_OFFSET, INTENT_SLOT_BYTES, METADATA_SLOT_MIN_BYTES,
};
use terrace_engine::meta::store::{self, Probe};
use terrace_engine::meta::{DiskState, IntentRecord, PoolMetadata, SpaceId};
use terrace_engine::{verify_space, ImportOptions, Pool, Space, SpaceConfig, SpaceSize};

const DISK_BYTES: u64 = 8 << 20;
/// 16 extents of one 64 KiB slab per copy.
const SPACE_BYTES: u64 = 16 * SLAB;

/// A space of [`SPACE_BYTES`] over `columns` columns, interleaved by 4 KiB.
fn small_space(name: &str, layout: Layout, columns: u32) -> SpaceConfig {
    let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(SPACE_BYTES));
    config.columns = Some(columns);
    config.interleave_bytes = Some(4096);
    config
}

async fn mirror(disks: &Disks) -> (Pool, std::sync::Arc<Space>) {
    let pool = create_pool(disks).await;
    let config = small_space("m", Layout::Mirror { copies: 2 }, 1);
    let space = pool.create_space(config).await.unwrap().space;
    (pool, space)
}

/// Make the copies (or data and parity) of `extent` of space `name`
/// differ, as a write cut by a power loss would leave them: new bytes on
/// the first slab only (durable there, as a power cut leaves them).
async fn tear(disks: &Disks, pool: &Pool, name: &str, extent: usize) {
    let metadata = pool.metadata().await;
    let slabs = metadata.space(name).unwrap().extents[extent]
        .slabs
        .clone()
        .unwrap();
    let first = slabs[0];
    let offset = data_offset(METADATA_SLOT_MIN_BYTES) + u64::from(first.slab.0) * SLAB;
    disks.devices[usize::from(first.disk.0)]
        .write(offset, bytes(vec![0xee; 4096]), true)
        .await
        .unwrap();
}

fn extents_of(rows: &[(u64, u64)]) -> Vec<u64> {
    let mut extents: Vec<u64> = rows.iter().map(|&(extent, _)| extent).collect();
    extents.dedup();
    extents
}

#[test]
fn after_a_crash_a_mirror_resyncs_only_the_extents_it_was_writing() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        // Extent 7, not written since the last clean point, differs too
        // (damage no crash explains).
        let (pool, space) = torn_and_imported(&disks, &[7]).await;
        let id = space.id();
        // The pool serves before extent 3 is resynchronised; a check
        // skips its rows meanwhile.
        assert_eq!(pool.resync_extents_left(id), 1);
        // Idle, but left to resynchronise: it stays named.
        pool.clear_idle_intent().await.unwrap();
        assert_eq!(pool.metadata().await.intent, vec![(id, 3)]);
        let rows = space.geometry().rows_per_extent();
        let report = verify_space(&space).await.unwrap();
        assert_eq!(extents_of(&report.mismatched_rows), vec![7]);
        assert_eq!(report.unsynced_rows, rows);
        assert_eq!(report.skipped_rows, 0);
        pool.resync_after_crash().await.unwrap();
        assert_eq!(pool.resync_extents_left(id), 0);
        let report = verify_space(&space).await.unwrap();
        assert_eq!(
            extents_of(&report.mismatched_rows),
            vec![7],
            "extent 3 was resynchronised, extent 7 left as it was"
        );
        assert_eq!(report.skipped_rows, 0);
        pool.clear_idle_intent().await.unwrap();
        assert!(pool.metadata().await.intent.is_empty());
    });
}

/// The 4 KiB at `offset` as the space was first written whole.
fn original(offset: u64) -> Vec<u8> {
    SplitMix64::new(10).bytes(SPACE_BYTES as usize)[offset as usize..offset as usize + 4096]
        .to_vec()
}

/// Wait (running the jobs) until the write intent names nothing.
async fn intent_clears(pool: &Pool) {
    with_jobs(pool, async {
        for _ in 0..100 {
            if pool.metadata().await.intent.is_empty() {
                return;
            }
            env().sleep(100_000_000).await;
        }
        panic!(
            "write intent never cleared: {:?}",
            pool.metadata().await.intent
        );
    })
    .await;
}

/// Every row of `space` checked, and its copies agree.
async fn copies_agree(space: &Space) {
    let report = verify_space(space).await.unwrap();
    assert_eq!(report.mismatched_rows, vec![]);
    assert_eq!(report.skipped_rows, 0);
    assert_eq!(report.unsynced_rows, 0);
}

/// A mirror torn by a crash in extent 3 (its first copy new, its second
/// old; also in the extents `damaged`), imported again: the pool serves at
/// once, with extent 3 left to resynchronise.
async fn torn_and_imported(disks: &Disks, damaged: &[usize]) -> (Pool, std::sync::Arc<Space>) {
    let (pool, space) = mirror(disks).await;
    space
        .write(
            0,
            bytes(SplitMix64::new(10).bytes(SPACE_BYTES as usize)),
            false,
        )
        .await
        .unwrap();
    drop(space);
    pool.close().await.unwrap();
    let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
        .await
        .unwrap();
    assert!(
        pool.metadata().await.intent.is_empty(),
        "a clean close leaves no write intent"
    );
    let space = pool.space("m").unwrap();
    // Extent 3 is being written when the power goes.
    space
        .write(
            3 * SLAB + 8192,
            bytes(SplitMix64::new(11).bytes(8192)),
            false,
        )
        .await
        .unwrap();
    assert_eq!(pool.metadata().await.intent, vec![(space.id(), 3)]);
    tear(disks, &pool, "m", 3).await;
    for &extent in damaged {
        tear(disks, &pool, "m", extent).await;
    }
    let (pool, space) = cut_and_import(disks, pool, space).await;
    assert_eq!(pool.resync_extents_left(space.id()), 1);
    (pool, space)
}

/// The power goes (nothing closed), and the pool is imported again.
async fn cut_and_import(
    disks: &Disks,
    pool: Pool,
    space: std::sync::Arc<Space>,
) -> (Pool, std::sync::Arc<Space>) {
    drop(space);
    drop(pool);
    let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
        .await
        .unwrap();
    let space = pool.space("m").unwrap();
    (pool, space)
}

/// A row read before the background pass reaches it is resynchronised
/// first: what a client read is what every copy holds, so losing the copy
/// it happened to be read from changes nothing.
#[test]
fn a_row_read_before_its_resync_reads_the_same_from_every_copy() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = torn_and_imported(&disks, &[]).await;
        let read = space.read(3 * SLAB, 4096).await.unwrap();
        // The torn-in bytes were never written with their sums: the copy
        // whose blocks match theirs is the source.
        assert_eq!(
            &read[..],
            &original(3 * SLAB),
            "the matching copy is the source"
        );
        let second = pool.metadata().await.space("m").unwrap().extents[3]
            .slabs
            .clone()
            .unwrap()[1]
            .disk;
        disks.faults[usize::from(second.0)].lose();
        assert_eq!(space.read(3 * SLAB, 4096).await.unwrap(), read);
        // Only the row read was resynchronised; the rest is left, and the
        // space's status says how much.
        assert_eq!(pool.resync_extents_left(space.id()), 1);
        let status = pool.status().await;
        let progress = status.spaces[0].resync.expect("a resync under way");
        let rows = space.geometry().rows_per_extent();
        let row_bytes = space.geometry().row_data_bytes();
        assert_eq!((progress.extents_total, progress.extents_left), (1, 1));
        assert_eq!(progress.bytes_total, rows * row_bytes);
        assert_eq!(progress.bytes_done, row_bytes);
        pool.resync_after_crash().await.unwrap();
        assert_eq!(pool.status().await.spaces[0].resync, None);
    });
}

/// What a read returned after a crash stays what the row holds through
/// the next crash: the resync the read made is durable before the read
/// returns, so a power cut right after it, and the loss of the copy read
/// from, bring back no older version.
#[test]
fn a_row_read_after_a_crash_reads_the_same_after_the_next_crash() {
    block_on(async {
        let disks = Disks::with_power(3, DISK_BYTES);
        let (pool, space) = torn_and_imported(&disks, &[]).await;
        let read = space.read(3 * SLAB, 4096).await.unwrap();
        // The torn-in bytes were never written with their sums: the copy
        // whose blocks match theirs is the source.
        assert_eq!(
            &read[..],
            &original(3 * SLAB),
            "the matching copy is the source"
        );
        let first = pool.metadata().await.space("m").unwrap().extents[3]
            .slabs
            .clone()
            .unwrap()[0]
            .disk;
        drop(space);
        drop(pool);
        disks.power_cut();
        disks.faults[usize::from(first.0)].lose();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("m").unwrap();
        let again = space.read(3 * SLAB, 4096).await.unwrap();
        assert!(again == read, "the row went back to its other version");
    });
}

/// The background pass keeps to the pool's repair rate (one budget with
/// the jobs' moves); a read that meets an owed row does not wait for it.
#[test]
fn the_resync_after_a_crash_keeps_to_the_repair_rate() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = torn_and_imported(&disks, &[]).await;
        set_repair_rate(&pool, 1).await;
        // A batch of rows passes at once, the next waits for its turn:
        // hours at a byte a second.
        let pass = Box::pin(pool.resync_after_crash());
        let wait = Box::pin(env().sleep(200_000_000));
        match futures::future::select(pass, wait).await {
            futures::future::Either::Left(_) => panic!("the pass ignored the repair rate"),
            futures::future::Either::Right(_) => {}
        }
        assert_eq!(pool.resync_extents_left(space.id()), 1);
        let last = space.geometry().rows_per_extent() - 1;
        let row_bytes = space.geometry().row_data_bytes();
        space.read(3 * SLAB + last * row_bytes, 4096).await.unwrap();
        let progress = pool.status().await.spaces[0].resync.expect("under way");
        assert!(progress.bytes_done < progress.bytes_total);
    });
}

/// A crash before the background pass ends leaves the extent named: the
/// next import finds it still to resynchronise.
#[test]
fn a_crash_during_the_resync_after_a_crash_leaves_it_to_the_next_import() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = torn_and_imported(&disks, &[]).await;
        let id = space.id();
        assert_eq!(pool.metadata().await.intent, vec![(id, 3)]);
        let (pool, space) = cut_and_import(&disks, pool, space).await;
        assert_eq!(pool.resync_extents_left(id), 1);
        pool.resync_after_crash().await.unwrap();
        copies_agree(&space).await;
        intent_clears(&pool).await;
    });
}

/// A pool closed before the background pass ends still owes the resync:
/// it is left unclean with the extent named, and the next import
/// resynchronises what is left.
#[test]
fn a_close_before_the_resync_after_a_crash_ends_leaves_it_owed() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = torn_and_imported(&disks, &[]).await;
        let id = space.id();
        drop(space);
        pool.close().await.unwrap();
        for device in &disks.devices {
            let (record, metadata) = on_disk(device.as_ref()).await;
            assert_eq!(record.extents, vec![(id, 3)]);
            assert!(!metadata.clean, "an older build resyncs it too");
        }
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        assert_eq!(pool.resync_extents_left(id), 1);
        pool.resync_after_crash().await.unwrap();
        let space = pool.space("m").unwrap();
        copies_agree(&space).await;
        drop(space);
        pool.close().await.unwrap();
        for device in &disks.devices {
            assert!(on_disk(device.as_ref()).await.1.clean);
        }
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        assert_eq!(pool.resync_extents_left(id), 0, "nothing owed any more");
        assert!(pool.metadata().await.intent.is_empty());
    });
}

/// Writes made while the extent waits for its resync, and a move of one of
/// its copies meanwhile, leave every copy in agreement and the data as
/// written.
#[test]
fn writes_and_moves_before_the_resync_after_a_crash_leave_the_copies_agreeing() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = torn_and_imported(&disks, &[]).await;
        let written = SplitMix64::new(12).bytes(8192);
        space
            .write(3 * SLAB + 4096, bytes(written.clone()), false)
            .await
            .unwrap();
        // Move the extent's second copy to the third disk (evacuating its
        // disk): its rows are filled from the first copy.
        let second = pool.metadata().await.space("m").unwrap().extents[3]
            .slabs
            .clone()
            .unwrap()[1]
            .disk;
        with_jobs(&pool, async {
            pool.start_evacuation(second).await.unwrap();
            jobs_settle(&pool).await;
        })
        .await;
        pool.resync_after_crash().await.unwrap();
        copies_agree(&space).await;
        // Either version of the torn row, the same on every copy.
        let row = space.read(3 * SLAB, 4096).await.unwrap();
        assert!(row[..] == [0xee; 4096][..] || row[..] == original(3 * SLAB)[..]);
        assert_eq!(
            &space.read(3 * SLAB + 4096, 8192).await.unwrap()[..],
            &written[..]
        );
    });
}

#[test]
fn write_intent_is_cleared_once_extents_are_idle_and_flushed() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = mirror(&disks).await;
        space
            .write(0, bytes(SplitMix64::new(3).bytes(2 * SLAB as usize)), false)
            .await
            .unwrap();
        let id = space.id();
        assert_eq!(pool.metadata().await.intent, vec![(id, 0), (id, 1)]);
        // A second write to a named extent costs no commit.
        let generation = pool.metadata().await.generation;
        space
            .write(4096, bytes(SplitMix64::new(4).bytes(4096)), false)
            .await
            .unwrap();
        assert_eq!(pool.metadata().await.generation, generation);
        // Idle for longer than the intent lasts: the job runner clears it.
        intent_clears(&pool).await;
        // Written again: named again.
        space
            .write(5 * SLAB, bytes(SplitMix64::new(5).bytes(4096)), false)
            .await
            .unwrap();
        assert_eq!(pool.metadata().await.intent, vec![(id, 5)]);
        let report = verify_space(&space).await.unwrap();
        assert!(report.mismatched_rows.is_empty());
    });
}

/// A parity space whose log failed writes straight to the disks; its log
/// names none of those writes, so the write intent does. Here the log's
/// disks are recorded failed, so the log cannot account for the space at
/// the next import and the whole space is resynced; where a log does
/// recover whole, the named extents are resynced beside what it names.
#[test]
fn writes_made_while_a_log_had_failed_are_resynced_after_a_crash() {
    block_on(async {
        // Six capacity disks and three journal disks for the log.
        let disks = Disks::new(9, 64 << 20);
        let pool = journal_pool(small_config("tank"), &disks.devices, 6).await;
        let mut config = small_space("p", Layout::Parity { redundancy: 1 }, 3);
        config.cache_bytes = Some(32 << 20);
        let space = pool.create_space(config).await.unwrap().space;
        let journal = space.journal().expect("a log");
        let extent_bytes = space.geometry().extent_data_bytes();
        space
            .write(
                0,
                bytes(SplitMix64::new(6).bytes(SPACE_BYTES as usize)),
                true,
            )
            .await
            .unwrap();
        space.flush().await.unwrap();
        assert!(pool.metadata().await.intent.is_empty(), "the log accounts");

        for fault in &disks.faults[6..] {
            fault.lose();
        }
        // Half a row: it goes to the log, which finds its disks gone. (A
        // whole row would go straight to the disks under the dirty-range
        // record the first write logged.)
        space
            .write(
                3 * extent_bytes + 8192,
                bytes(SplitMix64::new(7).bytes(4096)),
                false,
            )
            .await
            .unwrap();
        assert!(journal.status().write_through.is_some());
        let id = space.id();
        assert_eq!(pool.metadata().await.intent, vec![(id, 3)]);
        // The power goes: extent 3 torn mid-write.
        tear(&disks, &pool, "p", 3).await;
        drop((journal, space));
        drop(pool);
        for fault in &disks.faults[6..] {
            fault.restore();
        }

        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("p").unwrap();
        let report = verify_space(&space).await.unwrap();
        assert!(
            report.mismatched_rows.is_empty(),
            "extent 3 was resynchronised: {:?}",
            report.mismatched_rows
        );
        assert!(pool.metadata().await.intent.is_empty());
    });
}

/// The newest whole intent record of a disk, and its newest metadata.
async fn on_disk(device: &dyn terrace_engine::io::BlockDevice) -> (IntentRecord, PoolMetadata) {
    let probe = store::probe(device).await;
    let Probe::Member { label, .. } = &probe else {
        panic!("not a member: {probe:?}")
    };
    let record = store::read_intent(device, label)
        .await
        .expect("an intent record");
    (record, probe.generations()[0].clone())
}

/// Naming an extent writes a record of a few KiB to the intent slots of
/// every disk, not the whole metadata (megabytes in a large pool), and
/// clearing it writes an empty one.
#[test]
fn naming_an_extent_writes_the_intent_slots_not_the_metadata() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = mirror(&disks).await;
        let id = space.id();
        let generation = pool.metadata().await.generation;
        space
            .write(
                2 * SLAB + 4096,
                bytes(SplitMix64::new(8).bytes(4096)),
                false,
            )
            .await
            .unwrap();
        assert_eq!(pool.metadata().await.intent, vec![(id, 2)]);
        assert_eq!(pool.metadata().await.generation, generation);
        for device in &disks.devices {
            let (record, metadata) = on_disk(device.as_ref()).await;
            assert_eq!(record.extents, vec![(id, 2)]);
            assert_eq!(metadata.generation, generation, "no metadata commit");
        }
        with_jobs(&pool, async {
            for _ in 0..100 {
                if on_disk(disks.devices[0].as_ref())
                    .await
                    .0
                    .extents
                    .is_empty()
                {
                    return;
                }
                env().sleep(100_000_000).await;
            }
            panic!("the intent slots still name extent 2");
        })
        .await;
        for device in &disks.devices {
            let (record, metadata) = on_disk(device.as_ref()).await;
            assert!(record.extents.is_empty());
            // Clearing, 5 s after the last commit, also commits the
            // metadata: its generation moves while the pool is written.
            assert!(metadata.generation > generation);
        }
        assert!(pool.metadata().await.intent.is_empty());
    });
}

/// A disk that fails the intent record's write is recorded failed, and the
/// survivors' metadata names the extent instead; the write goes on.
#[test]
fn a_disk_that_fails_the_intent_write_is_recorded_failed_beside_the_list() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let (pool, space) = mirror(&disks).await;
        let id = space.id();
        disks.faults[2].fail_writes(INTENT_OFFSET..INTENT_OFFSET + 2 * INTENT_SLOT_BYTES);
        let data = SplitMix64::new(9).bytes(8192);
        space
            .write(3 * SLAB, bytes(data.clone()), false)
            .await
            .unwrap();
        let metadata = pool.metadata().await;
        assert_eq!(metadata.disks[2].state, DiskState::Failed);
        assert!(
            metadata.disks[2].state_reason.contains("write-intent"),
            "{}",
            metadata.disks[2].state_reason
        );
        for device in &disks.devices[..2] {
            let (_, committed) = on_disk(device.as_ref()).await;
            assert_eq!(committed.intent, vec![(id, 3)]);
            assert_eq!(committed.disks[2].state, DiskState::Failed);
        }
        assert_eq!(&space.read(3 * SLAB, 8192).await.unwrap()[..], &data[..]);
    });
}

/// With a disk missing, every first write into an extent notes it dirty in
/// the intent slots until a metadata commit carries the notes. Thousands
/// of them fill a slot; the note that would not fit goes to a metadata
/// commit with all the others, and the slots start again from there. A
/// power cut at the end loses none.
#[test]
fn dirty_records_too_many_for_a_slot_go_to_a_metadata_commit() {
    block_on(async {
        // 7,500 extents of a 2-way mirror over three disks: about 5,000
        // of them have a copy on the disk that goes missing.
        const EXTENTS: u64 = 7_500;
        let disks = Disks::new(3, (4 << 20) + 5_200 * SLAB);
        let mut config = small_config("tank");
        config.metadata_slot_bytes = 1 << 20;
        let pool = pool_on(config, &disks.devices).await;
        let mut space = SpaceConfig::new(
            "m",
            Layout::Mirror { copies: 2 },
            SpaceSize::Bytes(EXTENTS * SLAB),
        );
        space.columns = Some(1);
        pool.create_space(space).await.unwrap();
        pool.close().await.unwrap();

        let pool = Pool::import(env(), disks.devices[..2].to_vec(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("m").unwrap();
        let first = pool.metadata().await.generation;
        let mut commits = Vec::new();
        for extent in 0..EXTENTS {
            let generation = pool.metadata().await.generation;
            space
                .write(extent * SLAB, bytes(vec![extent as u8; 4096]), false)
                .await
                .unwrap();
            if pool.metadata().await.generation != generation {
                commits.push(extent);
            }
        }
        let metadata = pool.metadata().await;
        let noted = metadata.dirty.clone();
        // Exactly the extents with a copy on the missing disk.
        let id = space.id();
        let mut expected: Vec<(SpaceId, u32)> = metadata
            .space("m")
            .unwrap()
            .extents
            .iter()
            .enumerate()
            .filter(|(_, extent)| extent.slabs.iter().flatten().any(|slab| slab.disk.0 == 2))
            .map(|(index, _)| (id, index as u32))
            .collect();
        assert_eq!(noted.len(), 1, "{noted:?}");
        assert_eq!(noted[0].disk.0, 2);
        let mut found = noted[0].extents.clone();
        found.sort();
        expected.sort();
        assert_eq!(found, expected);
        let count = found.len();
        assert!((4_800..5_200).contains(&count), "{count} extents noted");
        // A slot holds 4,675 notes beside the intent's one entry naming the
        // whole space: no note needed a commit until the slot was full, and
        // then one commit took them all.
        assert_eq!(commits.len(), 1, "commits after writes into {commits:?}");
        assert_eq!(pool.metadata().await.generation, first + 1);
        drop(space);
        drop(pool);

        // Still away.
        assert_eq!(dirty_found(&disks.devices[..2]).await, noted);
    });
}
