//! Writes smaller than a block (512-byte sectors): many in flight into the
//! same blocks land whole in every layout, and those that arrive while
//! their row is busy share one read-modify-write of each block.

mod common;

use std::sync::Arc;

use common::*;
use futures::future::join_all;
use terrace_engine::io::memory::MemoryDevice;
use terrace_engine::io::BlockDevice;
use terrace_engine::layout::Layout;
use terrace_engine::{SpaceConfig, SpaceSize};

const BLOCK: u64 = 4096;
const SECTOR: u64 = 512;

fn config(name: &str, layout: Layout) -> SpaceConfig {
    let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(1 << 20));
    config.interleave_bytes = Some(16 << 10);
    config
}

#[test]
fn sub_block_writes_in_flight_together_land_whole_in_every_layout() {
    let disks = Disks::new(5, 16 << 20);
    block_on(async {
        let pool = create_pool(&disks).await;
        for (layout, name) in layouts() {
            let space = pool.create_space(config(name, layout)).await.unwrap().space;
            let mut model = Model::new(space.size_bytes());
            let mut rng = SplitMix64::new(3);
            model.write_random(&space, &mut rng, 0, 64 << 10).await;
            // Every sector of 16 blocks (two rows' worth of columns), in a
            // shuffled order, all in flight at once.
            let mut sectors: Vec<u64> = (0..16 * BLOCK / SECTOR).collect();
            for i in (1..sectors.len()).rev() {
                sectors.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let writes: Vec<(u64, Vec<u8>)> = sectors
                .iter()
                .map(|sector| (sector * SECTOR, rng.bytes(SECTOR as usize)))
                .collect();
            for (offset, data) in &writes {
                model.write(*offset, data);
            }
            let results = join_all(
                writes
                    .iter()
                    .map(|(offset, data)| space.write(*offset, bytes(data.clone()), false)),
            )
            .await;
            assert!(results.iter().all(Result::is_ok), "{name}: {results:?}");
            let read = space.read(0, 64 << 10).await.unwrap();
            assert!(read[..] == *model.slice(0, 64 << 10), "{name}: read back");
        }
        pool.close().await.unwrap();
    });
}

#[test]
fn sub_block_writes_arriving_while_their_row_is_busy_share_one_read() {
    held_block(false);
}

#[test]
fn when_the_shared_read_fails_every_write_that_shared_it_fails() {
    held_block(true);
}

/// Block 0's first sector is written and its write held (the row
/// locked); the seven other sectors and one of block 2 arrive meanwhile,
/// then it goes on. With `fail`, reads fail from then on: the reads the
/// eight share.
fn held_block(fail: bool) {
    use futures::task::LocalSpawnExt;
    use std::cell::Cell;
    use std::rc::Rc;
    use terrace_engine::io::fault::FaultDevice;

    let mut faults = Vec::new();
    let recorded: Vec<Arc<Recorded>> = (0..2)
        .map(|i| {
            let memory = Arc::new(MemoryDevice::new(format!("small{i}"), 16 << 20));
            let faulty = FaultDevice::new(memory);
            faults.push(faulty.controls());
            Arc::new(Recorded {
                inner: Arc::new(faulty),
                reads: Default::default(),
            })
        })
        .collect();
    let counted: Vec<Arc<dyn BlockDevice>> = recorded
        .iter()
        .map(|device| device.clone() as Arc<dyn BlockDevice>)
        .collect();
    let reads = || -> usize { recorded.iter().map(|device| device.take().len()).sum() };
    let gate = Arc::new(Gate::default());
    let devices = marked_held(&counted, |_| gate.clone());
    let mut executor = Executor::new();
    let spawner = executor.spawner();
    let (pool, space) = executor.run_until(async {
        let pool = pool_on(small_config("tank"), &devices).await;
        let space = pool
            .create_space(config("s", Layout::Simple))
            .await
            .unwrap()
            .space;
        space
            .write(0, bytes(vec![7; BLOCK as usize]), false)
            .await
            .unwrap();
        (pool, space)
    });

    gate.arm();
    let mut first = MARK.to_vec();
    first.resize(SECTOR as usize, 1);
    let (done, failed) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
    let (finished, writing) = (done.clone(), space.clone());
    spawner
        .spawn_local(async move {
            writing.write(0, bytes(first), false).await.unwrap();
            finished.set(finished.get() + 1);
        })
        .unwrap();
    executor.run_until_stalled();
    assert!(gate.holding(), "the first write is held");
    if fail {
        for controls in &faults {
            controls.fail_reads(0..u64::MAX);
        }
    }

    // The other seven sectors of block 0 arrive meanwhile, and one into
    // block 2 of the same row.
    reads();
    let others = (1..BLOCK / SECTOR).chain([2 * BLOCK / SECTOR]);
    for sector in others {
        let (finished, failures, writing) = (done.clone(), failed.clone(), space.clone());
        spawner
            .spawn_local(async move {
                let data = vec![sector as u8 + 1; SECTOR as usize];
                if writing
                    .write(sector * SECTOR, bytes(data), false)
                    .await
                    .is_err()
                {
                    failures.set(failures.get() + 1);
                }
                finished.set(finished.get() + 1);
            })
            .unwrap();
    }
    executor.run_until_stalled();
    assert_eq!(done.get(), 0, "all wait for the held write");
    gate.release();
    executor.run_until_stalled();
    assert_eq!(done.get(), BLOCK / SECTOR + 1, "every write completed");
    assert_eq!(
        reads(),
        2,
        "eight writes into two blocks of a row, one read of each"
    );
    if fail {
        assert_eq!(failed.get(), BLOCK / SECTOR, "the eight failed with them");
        for controls in &faults {
            controls.clear();
        }
    } else {
        assert_eq!(failed.get(), 0);
    }
    executor.run_until(async {
        let read = space.read(0, 3 * BLOCK).await.unwrap();
        assert_eq!(&read[..MARK.len()], &MARK);
        for sector in (1..BLOCK / SECTOR).chain([2 * BLOCK / SECTOR]) {
            let at = (sector * SECTOR) as usize;
            let expected = match (fail, sector < BLOCK / SECTOR) {
                (false, _) => sector as u8 + 1,
                (true, true) => 7,
                (true, false) => 0,
            };
            assert!(
                read[at..at + SECTOR as usize]
                    .iter()
                    .all(|&b| b == expected),
                "sector {sector}"
            );
        }
        pool.close().await.unwrap();
    });
}
