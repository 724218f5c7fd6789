//! Which copy a mirror reads: a stream reads each copy in whole regions,
//! however many of its reads are in flight, and random reads land on every
//! copy alike.

mod common;

use std::sync::Arc;

use common::*;
use futures::future::join_all;
use terrace_engine::io::delay::{DelayDevice, DelayPolicy};
use terrace_engine::io::BlockDevice;
use terrace_engine::layout::Layout;
use terrace_engine::{Pool, PoolConfig, SpaceConfig, SpaceSize, MIRROR_READ_REGION_BYTES};

const REGION: u64 = MIRROR_READ_REGION_BYTES;
/// Slabs of four regions, so that one extent's column holds several.
const SLAB_BYTES: u64 = 4 * REGION;

/// A pool of four recorded memory disks (reads taking `read_ns` each) with
/// a 2-way mirror of 2 columns filling two slabs of every disk, written
/// with random data.
async fn mirror(read_ns: u64) -> (Vec<Arc<Recorded>>, Pool, Model) {
    let disks = Disks::new(4, 3 * SLAB_BYTES);
    let recorded: Vec<Arc<Recorded>> = disks
        .devices
        .iter()
        .map(|device| {
            let policy = DelayPolicy {
                read_ns,
                ..DelayPolicy::default()
            };
            Arc::new(Recorded {
                inner: Arc::new(DelayDevice::new(device.clone(), env(), policy)),
                reads: Default::default(),
            })
        })
        .collect();
    let config = PoolConfig {
        slab_bytes: SLAB_BYTES,
        ..small_config("tank")
    };
    let devices = recorded
        .iter()
        .map(|device| terrace_engine::NewDisk::new(device.clone() as Arc<dyn BlockDevice>))
        .collect();
    let pool = Pool::create(env(), config, devices).await.unwrap();
    let mut config = SpaceConfig::new(
        "m",
        Layout::Mirror { copies: 2 },
        SpaceSize::Bytes(4 * SLAB_BYTES),
    );
    config.columns = Some(2);
    config.cache_bytes = Some(0);
    let space = pool.create_space(config).await.unwrap().space;
    let mut model = Model::new(space.size_bytes());
    let mut rng = SplitMix64::new(7);
    let chunk = 1 << 20;
    for offset in (0..space.size_bytes()).step_by(chunk) {
        let data = rng.bytes(chunk);
        space
            .write(offset, bytes(data.clone()), false)
            .await
            .unwrap();
        model.write(offset, &data);
    }
    for disk in &recorded {
        disk.take();
    }
    (recorded, pool, model)
}

#[test]
fn a_mirror_stream_reads_each_copy_in_whole_regions() {
    block_on(async {
        let (disks, pool, model) = mirror(0).await;
        let space = pool.space("m").unwrap();
        let size = space.size_bytes();
        let piece = 64 << 10;
        for offset in (0..size).step_by(piece as usize) {
            let data = space.read(offset, piece).await.unwrap();
            assert_eq!(&data[..], model.slice(offset, piece), "at {offset}");
        }
        // Each disk holds one slab of each of the two extents: one copy of
        // one column, four regions. It read every other region of them
        // whole (two in one run where the next extent's first region
        // follows on the disk), half of each slab, and nothing else.
        for disk in &disks {
            // Contiguous runs of its reads, in the order they came.
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for (offset, length) in disk.take() {
                match runs.last_mut() {
                    Some((_, end)) if *end == offset => *end += length,
                    _ => runs.push((offset, offset + length)),
                }
            }
            let total: u64 = runs.iter().map(|(start, end)| end - start).sum();
            assert_eq!(total, SLAB_BYTES, "{}: {runs:?}", disk.name());
            for (start, end) in &runs {
                assert_eq!((end - start) % REGION, 0, "{}: {runs:?}", disk.name());
            }
            for pair in runs.windows(2) {
                assert!(pair[1].0 >= pair[0].1 + REGION, "{}: {runs:?}", disk.name());
            }
        }
    });
}

#[test]
fn random_reads_land_on_every_copy_alike() {
    block_on(async {
        let (disks, pool, model) = mirror(0).await;
        let space = pool.space("m").unwrap();
        let mut rng = SplitMix64::new(3);
        let blocks = space.size_bytes() / 4096;
        for _ in 0..4096 {
            let offset = rng.below(blocks) * 4096;
            let data = space.read(offset, 4096).await.unwrap();
            assert_eq!(&data[..], model.slice(offset, 4096), "at {offset}");
        }
        // Four disks, each holding one copy of a column in each extent: a
        // quarter of the reads each, give or take.
        let counts: Vec<usize> = disks.iter().map(|disk| disk.take().len()).collect();
        for &count in &counts {
            assert!((768..=1280).contains(&count), "{counts:?}");
        }
    });
}

#[test]
fn a_deep_stream_stays_on_one_copy_of_each_column() {
    block_on(async {
        let (disks, pool, model) = mirror(20_000_000).await;
        let space = pool.space("m").unwrap();
        // 32 reads of 64 KiB in flight at once, in order: 2 MiB of one
        // region, 16 sequential reads on each column's preferred disk,
        // every one continuing the one before, however many are queued.
        let piece = 64 << 10;
        let reads = (0..32).map(|i| space.read(i * piece, piece));
        for (i, data) in join_all(reads).await.into_iter().enumerate() {
            let offset = i as u64 * piece;
            assert_eq!(&data.unwrap()[..], model.slice(offset, piece));
        }
        let counts: Vec<usize> = disks.iter().map(|disk| disk.take().len()).collect();
        let mut busy: Vec<usize> = counts.iter().copied().filter(|&n| n > 0).collect();
        busy.sort();
        assert_eq!(busy, vec![16, 16], "{counts:?}");
    });
}
