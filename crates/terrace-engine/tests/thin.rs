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
            space.flush().await.unwrap();
            drop(space);
            drop(pool);
            disks.power_cut();
            let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
                .await
                .unwrap();
            let space = pool.space(name).unwrap();
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
