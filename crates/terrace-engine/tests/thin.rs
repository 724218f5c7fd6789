//! Thin spaces: an extent takes its slabs at its first write, a space may
//! be larger than its pool, ranges never written read as zeroes without a
//! disk read, and a write that needs room the pool does not have fails
//! with `PoolFull` (ENOSPC to an NBD client) while everything else goes on.

mod common;

use std::sync::Arc;

use common::*;
use terrace_engine::layout::Layout;
use terrace_engine::meta::Provisioning;
use terrace_engine::{
    repair_space, EngineError, ImportOptions, NewDisk, Pool, Space, SpaceConfig, SpaceSize,
};

const DISK_BYTES: u64 = 16 << 20;

fn thin(name: &str, layout: Layout, size: u64, cache_bytes: u64) -> SpaceConfig {
    let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(size));
    config.provisioning = Provisioning::Thin;
    config.cache_bytes = Some(cache_bytes);
    config
}

/// Flush `space`, cut the power and import the pool again: the pool and
/// the space as the import finds them.
async fn cut_and_import(disks: &Disks, pool: Pool, space: Arc<Space>) -> (Pool, Arc<Space>) {
    let name = space.name().to_string();
    space.flush().await.unwrap();
    drop(space);
    drop(pool);
    disks.power_cut();
    let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
        .await
        .unwrap();
    let space = pool.space(&name).unwrap();
    (pool, space)
}

async fn status_of(pool: &Pool, name: &str) -> terrace_engine::SpaceStatus {
    let status = pool.status().await;
    status
        .spaces
        .into_iter()
        .find(|space| space.name == name)
        .expect("the space is listed")
}

/// Every layout, with and without a log: a space ten times its pool's
/// capacity takes only the extents written, reads the rest as zeroes,
/// holds every byte across a power cut and an import, and its redundancy
/// agrees throughout.
#[test]
fn a_thin_space_of_every_layout_takes_only_the_extents_written() {
    block_on(async {
        let mut cases: Vec<(Layout, &str, u64)> =
            layouts().into_iter().map(|(l, n)| (l, n, 0)).collect();
        cases.push((Layout::Parity { redundancy: 1 }, "parity1-log", 1 << 20));
        cases.push((Layout::Parity { redundancy: 2 }, "parity2-log", 1 << 20));
        for (layout, name, cache_bytes) in cases {
            let disks = Disks::with_power(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let capacity = pool.status().await.capacity_bytes;
            let config = thin(name, layout, 10 * capacity, cache_bytes);
            let space = pool.create_space(config).await.unwrap().space;
            let allocated_at_start = pool.status().await.allocated_bytes;
            let status = status_of(&pool, name).await;
            assert_eq!(status.provisioning, Provisioning::Thin, "{name}");
            assert_eq!((status.allocated_bytes, status.raw_bytes), (0, 0), "{name}");
            let extent = space.geometry().extent_data_bytes();
            // Three extents far apart, one written across its end.
            let mut rng = SplitMix64::new(3);
            let mut written = Vec::new();
            for (at, length) in [
                (extent * 7 + 4096, 3 * 4096),
                (extent * 1000 - 8192, 16384),
                (extent * 20 + 100, 777),
            ] {
                let data = rng.bytes(length);
                space.write(at, bytes(data.clone()), false).await.unwrap();
                written.push((at, data));
            }
            let taken = 4 * extent;
            assert_eq!(space.allocated_bytes(), taken, "{name}");
            let status = status_of(&pool, name).await;
            assert_eq!(status.allocated_bytes, taken, "{name}");
            assert!(
                pool.status().await.allocated_bytes > allocated_at_start,
                "{name}: the pool counts the slabs taken"
            );
            let check = |space: Arc<Space>, written: Vec<(u64, Vec<u8>)>| async move {
                for (at, data) in &written {
                    let read = space.read(*at, data.len() as u64).await.unwrap();
                    assert!(read[..] == data[..], "{name}: data at {at}");
                }
                // The rest of a written extent, and extents never written.
                for at in [extent * 7, extent * 8 - 4096, extent * 3, extent * 500] {
                    let read = space.read(at, 4096).await.unwrap();
                    assert!(read.iter().all(|&b| b == 0), "{name}: zeroes at {at}");
                }
                let report = repair_space(&space).await.unwrap();
                assert!(report.findings.is_empty(), "{name}: {:?}", report.findings);
            };
            check(space.clone(), written.clone()).await;
            let (_pool, space) = cut_and_import(&disks, pool, space).await;
            assert_eq!(space.allocated_bytes(), taken, "{name} after the import");
            check(space, written).await;
        }
    });
}

/// Reads of extents never written touch no disk: they succeed with every
/// data read failing.
#[test]
fn reads_of_extents_never_written_read_no_disk() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let config = thin("t", Layout::Mirror { copies: 2 }, 1 << 30, 0);
        let space = pool.create_space(config).await.unwrap().space;
        let extent = space.geometry().extent_data_bytes();
        space.write(0, bytes(vec![1; 4096]), false).await.unwrap();
        let slabs_start = terrace_engine::meta::format::data_offset(
            terrace_engine::meta::format::METADATA_SLOT_MIN_BYTES,
        );
        for fault in &disks.faults {
            fault.fail_reads(slabs_start..DISK_BYTES);
        }
        let read = space.read(9 * extent, 64 << 10).await.unwrap();
        assert!(read.iter().all(|&b| b == 0));
        // The written extent is read from its disks, which fail it.
        assert!(space.read(0, 4096).await.is_err());
    });
}

/// When the pool runs out, a write that needs a new extent fails with
/// `PoolFull` and changes nothing; writes and reads of extents that have
/// their slabs go on; the room a repair needs is kept; and a disk added
/// lets the refused write succeed, without a restart.
#[test]
fn a_full_pool_refuses_only_the_writes_that_need_room() {
    block_on(async {
        let disks = Disks::new(6, DISK_BYTES);
        let pool = pool_on(small_config("tank"), &disks.devices[..5]).await;
        let layout = Layout::Mirror { copies: 2 };
        let space = pool
            .create_space(thin("t", layout, 1 << 30, 0))
            .await
            .unwrap()
            .space;
        let extent = space.geometry().extent_data_bytes();
        let mut model = Model::new(space.size_bytes());
        let mut refused = None;
        for index in 0..space.size_bytes() / extent {
            let data = vec![index as u8 | 1; 4096];
            match space
                .write(index * extent, bytes(data.clone()), false)
                .await
            {
                Ok(()) => model.write(index * extent, &data),
                Err(error) => {
                    refused = Some((index, error));
                    break;
                }
            }
        }
        let (full_at, error) = refused.expect("the pool fills");
        assert!(
            matches!(error, EngineError::PoolFull { .. }),
            "refused with {error}"
        );
        assert_eq!(space.allocated_bytes(), full_at * extent);
        // The room a repair of the fullest disk needs is left free.
        let status = pool.status().await;
        let fullest = status.disks.iter().map(|d| d.slabs_used).max().unwrap();
        let free: u32 = status
            .disks
            .iter()
            .map(|d| d.slabs_total - d.slabs_used)
            .sum();
        assert!(
            free >= fullest,
            "{free} free slabs < the fullest disk's {fullest}"
        );
        assert!(free < fullest + 2, "{free} free slabs: more than kept");
        // Extents that have their slabs take writes; everything reads.
        let data = vec![0xee; 8192];
        space
            .write(extent + 4096, bytes(data.clone()), false)
            .await
            .unwrap();
        model.write(extent + 4096, &data);
        let at = full_at * extent;
        let read = space.read(0, at + extent).await.unwrap();
        assert!(read[..] == model.slice(0, at + extent)[..]);
        // More room: the same write succeeds.
        pool.add_disks(vec![NewDisk::new(disks.devices[5].clone())])
            .await
            .unwrap();
        space.write(at, bytes(vec![9; 4096]), false).await.unwrap();
        model.write(at, &[9; 4096]);
        let read = space.read(0, at + extent).await.unwrap();
        assert!(read[..] == model.slice(0, at + extent)[..]);
    });
}

/// A trim or write-zeroes that covers whole extents of a thin space gives
/// their slabs back to the pool (a log's data under one keeps it until it
/// has gone home); the extents read as zeroes, show as holes, take new
/// slabs at their next write, and all of it holds across an import. A
/// range that covers part of an extent frees nothing.
#[test]
fn whole_extents_trimmed_or_zeroed_go_back_to_the_pool() {
    block_on(async {
        for (layout, name, cache_bytes) in [
            (Layout::Mirror { copies: 2 }, "mirror2", 0),
            (Layout::Parity { redundancy: 1 }, "parity1-log", 1 << 20),
            (Layout::Simple, "simple", 0),
        ] {
            let disks = Disks::with_power(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let space = pool
                .create_space(thin(name, layout, 1 << 30, cache_bytes))
                .await
                .unwrap()
                .space;
            let extent = space.geometry().extent_data_bytes();
            let data = SplitMix64::new(5).bytes(6 * extent as usize);
            space.write(0, bytes(data.clone()), false).await.unwrap();
            if let Some(journal) = space.journal() {
                while journal.destage(&space, true).await.unwrap() {}
            }
            let pool_before = pool.status().await.allocated_bytes;
            assert_eq!(space.allocated_bytes(), 6 * extent, "{name}");
            // Part of extent 0 and all of extents 1 and 2, trimmed; all of
            // extent 4 and part of 5, zeroed.
            space.trim(4096, 3 * extent - 4096).await.unwrap();
            space
                .write_zeroes(4 * extent, extent + 8192, false)
                .await
                .unwrap();
            assert_eq!(space.allocated_bytes(), 3 * extent, "{name}");
            let slots = u64::from(space.geometry().slots_per_extent());
            let per_extent = slots * SLAB;
            assert_eq!(
                pool.status().await.allocated_bytes,
                pool_before - 3 * per_extent,
                "{name}: the pool has the slabs back"
            );
            let holes = space.block_status(extent, 2 * extent).await.unwrap();
            assert_eq!(holes, vec![(2 * extent, true)], "{name}");
            let mut model = data.clone();
            model[4 * extent as usize..(5 * extent + 8192) as usize].fill(0);
            model[extent as usize..3 * extent as usize].fill(0);
            // Trimmed blocks of extent 0 may read as they were or as zeroes.
            let read = space.read(extent, 5 * extent).await.unwrap();
            assert!(read[..] == model[extent as usize..], "{name}");
            // Written again: new slabs, zeroed but for what is written.
            space
                .write(extent + 8192, bytes(vec![3; 4096]), false)
                .await
                .unwrap();
            model[(extent + 8192) as usize..(extent + 12288) as usize].fill(3);
            assert_eq!(space.allocated_bytes(), 4 * extent, "{name}");
            let check = |space: Arc<Space>, model: Vec<u8>| async move {
                let read = space.read(extent, 5 * extent).await.unwrap();
                assert!(read[..] == model[extent as usize..], "{name}");
                let report = repair_space(&space).await.unwrap();
                assert!(report.findings.is_empty(), "{name}: {:?}", report.findings);
            };
            check(space.clone(), model.clone()).await;
            let (_pool, space) = cut_and_import(&disks, pool, space).await;
            assert_eq!(
                space.allocated_bytes(),
                4 * extent,
                "{name} after the import"
            );
            check(space, model).await;
        }
    });
}

/// The log's data under an extent keeps its slabs: a trim leaves it (it
/// is advisory), a write-zeroes zeroes it through the log; once the data
/// has gone home, the same trim gives the extent back.
#[test]
fn an_extent_the_log_holds_data_of_keeps_its_slabs() {
    block_on(async {
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let layout = Layout::Parity { redundancy: 1 };
        let space = pool
            .create_space(thin("p", layout, 1 << 30, 1 << 20))
            .await
            .unwrap()
            .space;
        let journal = space.journal().expect("a log");
        let extent = space.geometry().extent_data_bytes();
        // A small write: logged, not yet home.
        space
            .write(extent + 4096, bytes(vec![8; 4096]), false)
            .await
            .unwrap();
        let holes = space.block_status(extent, extent).await.unwrap();
        assert_eq!(holes[0], (4096, true), "logged blocks are data: {holes:?}");
        assert_eq!(holes[1], (4096, false), "logged blocks are data: {holes:?}");
        space.trim(extent, extent).await.unwrap();
        assert_eq!(space.allocated_bytes(), extent, "kept while logged");
        while journal.destage(&space, true).await.unwrap() {}
        space.trim(extent, extent).await.unwrap();
        assert_eq!(space.allocated_bytes(), 0, "given back once home");
        let read = space.read(extent, extent).await.unwrap();
        assert!(read.iter().all(|&b| b == 0));
    });
}

/// Allocation crossing a threshold of `alert_percents`, up or down, is an
/// event: thin extents taken past 10 % and 20 % of the capacity, then given
/// back under both.
#[test]
fn allocation_crossing_an_alert_threshold_is_an_event() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let mut settings = pool.metadata().await.settings;
        settings.alert_percents = [10, 20, 0];
        pool.set_settings(settings).await.unwrap();
        let space = pool
            .create_space(thin("t", Layout::Mirror { copies: 2 }, 1 << 30, 0))
            .await
            .unwrap()
            .space;
        let mut events = pool.subscribe();
        let extent = space.geometry().extent_data_bytes();
        let capacity = pool.status().await.capacity_bytes;
        let slots = u64::from(space.geometry().slots_per_extent());
        let extents = capacity / 4 / (slots * SLAB) + 1;
        // Drained as it goes: the queue of events is bounded.
        let mut alerts: Vec<(u8, bool)> = Vec::new();
        let mut drain = |events: &mut futures::channel::mpsc::Receiver<_>| {
            alerts.extend(
                std::iter::from_fn(|| events.try_recv().ok()).filter_map(|event| match event {
                    terrace_engine::PoolEvent::Capacity {
                        threshold, rising, ..
                    } => Some((threshold, rising)),
                    _ => None,
                }),
            )
        };
        for index in 0..extents {
            let data = bytes(vec![1; 4096]);
            space.write(index * extent, data, false).await.unwrap();
            drain(&mut events);
        }
        space.trim(0, extents * extent).await.unwrap();
        assert_eq!(space.allocated_bytes(), 0);
        drain(&mut events);
        assert_eq!(
            alerts,
            vec![(10, true), (20, true), (20, false), (10, false)]
        );
    });
}
