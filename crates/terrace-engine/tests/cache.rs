//! The write-back cache end to end on memory disks: writes absorbed by the
//! log and read back before and after destaging, full rows bypassing it,
//! power cuts with torn and dropped writes on every disk, journal disks
//! failing, and live resizes under load.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use futures::future::join_all;
use terrace_engine::io::crash::CrashDevice;
use terrace_engine::io::delay::{DelayDevice, DelayPolicy};
use terrace_engine::io::fault::{FaultControls, FaultDevice};
use terrace_engine::io::memory::MemoryDevice;
use terrace_engine::io::{BlockDevice, BoxFuture, Bytes, BytesMut, IoResult};
use terrace_engine::layout::Layout;
use terrace_engine::meta::{ExtentRecord, SlabRef, Usage};
use terrace_engine::{verify_space, ImportOptions, Pool, PoolConfig, SpaceConfig, SpaceSize};

const CAPACITY_BYTES: u64 = 8 << 20;
const JOURNAL_BYTES: u64 = 100 << 20;
const CACHE: u64 = 32 << 20;
const BLOCK: u64 = 4096;

/// The capacity disks come first: six, then three journal disks.
const CAPACITY_DISKS: usize = 6;

/// The pool's disks on memory, names starting with `name`.
fn memory_devices(name: &str) -> Vec<Arc<dyn BlockDevice>> {
    sizes()
        .into_iter()
        .enumerate()
        .map(|(i, size)| {
            Arc::new(MemoryDevice::new(format!("{name}{i}"), size)) as Arc<dyn BlockDevice>
        })
        .collect()
}

/// The pool's disks on memory behind fault wrappers, and the wrappers'
/// controls (to lose a disk).
fn fault_devices(name: &str) -> (Vec<Arc<dyn BlockDevice>>, Vec<FaultControls>) {
    let wrapped: Vec<FaultDevice> = memory_devices(name)
        .into_iter()
        .map(FaultDevice::new)
        .collect();
    let faults = wrapped.iter().map(FaultDevice::controls).collect();
    let devices = wrapped
        .into_iter()
        .map(|w| Arc::new(w) as Arc<dyn BlockDevice>)
        .collect();
    (devices, faults)
}

/// A pool of six capacity and three journal disks on `devices`.
async fn log_pool(devices: &[Arc<dyn BlockDevice>]) -> Pool {
    // Three 32 MiB logs in 64 KiB slabs put 1,536 slabs on a journal disk:
    // the record of its repair needs more than the smallest slot leaves.
    let config = PoolConfig {
        metadata_slot_bytes: 256 << 10,
        ..small_config("tank")
    };
    journal_pool(config, devices, CAPACITY_DISKS).await
}

/// A pool of `devices` as [`log_pool`] makes it, and a space of `config`
/// in it, on `executor`.
fn pool_and_space(
    executor: &mut Executor,
    devices: &[Arc<dyn BlockDevice>],
    config: SpaceConfig,
) -> (Pool, Arc<terrace_engine::Space>) {
    executor.run_until(async {
        let pool = log_pool(devices).await;
        let space = pool.create_space(config).await.unwrap().space;
        (pool, space)
    })
}

/// A 1 MiB space with a cache, of `layout`, in `pool`.
async fn cached_space(pool: &Pool, name: &str, layout: Layout) -> Arc<terrace_engine::Space> {
    pool.create_space(cached(name, layout, 1 << 20))
        .await
        .unwrap()
        .space
}

fn sizes() -> Vec<u64> {
    let mut sizes = vec![CAPACITY_BYTES; 6];
    sizes.extend([JOURNAL_BYTES; 3]);
    sizes
}

fn cached(name: &str, layout: Layout, size: u64) -> SpaceConfig {
    let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(size));
    config.interleave_bytes = Some(16 << 10);
    config.cache_bytes = Some(CACHE);
    config
}

/// Random small writes (aligned and not) and some full rows, recorded in
/// the model; every write completes before the next starts. Full rows go
/// straight to the disks, so they are written with FUA: a power cut may
/// take back a write that was neither logged nor flushed nor FUA.
async fn write_randomly(
    space: &terrace_engine::Space,
    model: &mut Model,
    rng: &mut SplitMix64,
    count: usize,
) {
    let size = space.size_bytes();
    let row = space.natural_write_bytes();
    for _ in 0..count {
        let full_row = rng.below(8) == 0;
        let (offset, length) = if full_row {
            let rows = size / row;
            (rng.below(rows) * row, row)
        } else {
            random_range(rng, size, 24 << 10)
        };
        let data = rng.bytes(length as usize);
        let fua = full_row || rng.below(4) == 0;
        space.write(offset, bytes(data.clone()), fua).await.unwrap();
        model.write(offset, &data);
    }
}

/// The pool's disks on memory behind crash wrappers: the wrappers, and the
/// same as plain devices.
fn crash_devices(name: &str) -> (Vec<Arc<CrashDevice>>, Vec<Arc<dyn BlockDevice>>) {
    let crash: Vec<Arc<CrashDevice>> = sizes()
        .into_iter()
        .enumerate()
        .map(|(i, size)| {
            let memory: Arc<dyn BlockDevice> =
                Arc::new(MemoryDevice::new(format!("{name}-{i}"), size));
            Arc::new(CrashDevice::new(memory))
        })
        .collect();
    let devices = as_devices(&crash);
    (crash, devices)
}

/// The same devices as plain block devices.
fn as_devices<T: BlockDevice + 'static>(devices: &[Arc<T>]) -> Vec<Arc<dyn BlockDevice>> {
    devices
        .iter()
        .map(|device| device.clone() as Arc<dyn BlockDevice>)
        .collect()
}

/// Cut the power (writes not yet flushed dropped or torn, as `seed` says)
/// and import the pool again.
async fn cut_and_import(
    crash: &[Arc<CrashDevice>],
    devices: &[Arc<dyn BlockDevice>],
    seed: u64,
) -> Pool {
    let mut rng = SplitMix64::new(seed);
    for device in crash {
        device.crash(&mut || rng.next_u64()).unwrap();
    }
    Pool::import(env(), devices.to_vec(), ImportOptions::default())
        .await
        .unwrap()
}

/// Cut the power as `seed` says, import the pool again, and check that
/// space `name` reads back as `model` with every copy and parity agreeing
/// (`verify_seed` names the check in its failures); then close the pool.
async fn cut_and_check(
    crash: &[Arc<CrashDevice>],
    devices: &[Arc<dyn BlockDevice>],
    seed: u64,
    name: &str,
    model: &Model,
    verify_seed: u64,
) {
    let pool = cut_and_import(crash, devices, seed).await;
    let space = pool.space(name).unwrap();
    check_all(&space, model).await;
    assert_consistent(&space, verify_seed).await;
    pool.close().await.unwrap();
}

/// Every copy and every parity of the space agrees with its data.
async fn assert_consistent(space: &terrace_engine::Space, seed: u64) {
    let report = verify_space(space).await.unwrap();
    assert!(
        report.mismatched_rows.is_empty(),
        "seed {seed}: {:?}",
        report.mismatched_rows
    );
}

/// Issue every write at once, in the order given (each is polled in turn,
/// so they reach the space in that order); all must succeed, then the model
/// takes them in the same order.
async fn write_together(
    space: &terrace_engine::Space,
    model: &mut Model,
    writes: &[(u64, Vec<u8>)],
) {
    let done = join_all(
        writes
            .iter()
            .map(|(offset, data)| space.write(*offset, bytes(data.clone()), false)),
    )
    .await;
    for ((offset, data), result) in writes.iter().zip(done) {
        result.unwrap();
        model.write(*offset, data);
    }
}

/// Everything reads back as `model` says, from the log and once the log is
/// all home.
async fn check_through_drain(space: &terrace_engine::Space, model: &Model) {
    check_all(space, model).await;
    space.journal().unwrap().drain(space).await.unwrap();
    check_all(space, model).await;
}

async fn check_all(space: &terrace_engine::Space, model: &Model) {
    let size = space.size_bytes();
    let step = 256 << 10;
    for offset in (0..size).step_by(step as usize) {
        let length = step.min(size - offset);
        let read = space.read(offset, length).await.unwrap();
        assert!(
            read[..] == *model.slice(offset, length),
            "{} differs at {offset}",
            space.name()
        );
    }
}

#[test]
fn logged_writes_read_back_before_and_after_destage_and_across_a_restart() {
    block_on(async {
        let memory = memory_devices("cache-a");
        let pool = log_pool(&memory).await;
        let mut rng = SplitMix64::new(1);
        let mut models = Vec::new();
        for (layout, name) in [
            (Layout::Parity { redundancy: 1 }, "p1"),
            (Layout::Parity { redundancy: 2 }, "p2"),
            (Layout::Mirror { copies: 2 }, "m2"),
        ] {
            let space = pool
                .create_space(cached(name, layout, 1 << 20))
                .await
                .unwrap()
                .space;
            let journal = space.journal().expect("a cache");
            let mut model = Model::new(space.size_bytes());
            write_randomly(&space, &mut model, &mut rng, 150).await;
            let status = journal.status();
            assert!(status.absorbed_writes > 0, "{name}: {status:?}");
            assert!(status.bypassed_writes > 0, "{name}: {status:?}");
            assert!(status.dirty_bytes > 0, "{name}: {status:?}");
            check_all(&space, &model).await;
            journal.drain(&space).await.unwrap();
            assert_eq!(journal.status().dirty_bytes, 0);
            check_all(&space, &model).await;
            let report = verify_space(&space).await.unwrap();
            assert!(
                report.mismatched_rows.is_empty(),
                "{name}: {:?}",
                report.mismatched_rows
            );
            // Dirty again; the restart finds it in the log.
            write_randomly(&space, &mut model, &mut rng, 60).await;
            assert!(journal.status().dirty_bytes > 0);
            models.push((name, model));
        }
        pool.close().await.unwrap();
        let reopened = Pool::import(env(), memory.clone(), ImportOptions::default())
            .await
            .unwrap();
        for (name, model) in &models {
            let space = reopened.space(name).unwrap();
            check_all(&space, model).await;
            let report = verify_space(&space).await.unwrap();
            assert!(
                report.mismatched_rows.is_empty(),
                "{name}: {:?}",
                report.mismatched_rows
            );
        }
        reopened.close().await.unwrap();
    });
}

/// Power cuts at random points: every write acknowledged (the log writes
/// with FUA, so no flush is needed) reads back after recovery, and parity
/// matches data everywhere.
#[test]
fn power_cuts_lose_no_acknowledged_write_and_leave_parity_consistent() {
    for seed in 0..12u64 {
        block_on(async {
            let (crash, devices) = crash_devices(&format!("cut{seed}"));
            let layout = if seed % 2 == 0 {
                Layout::Parity { redundancy: 2 }
            } else {
                Layout::Parity { redundancy: 1 }
            };
            let mut model;
            {
                let pool = log_pool(&devices).await;
                let space = pool
                    .create_space(cached("s", layout, 2 << 20))
                    .await
                    .unwrap()
                    .space;
                model = Model::new(space.size_bytes());
                let mut rng = SplitMix64::new(seed);
                write_randomly(&space, &mut model, &mut rng, 80 + (seed as usize * 7) % 60).await;
                // Some destaging, some not: the cut finds both.
                if seed % 3 == 0 {
                    space
                        .journal()
                        .unwrap()
                        .destage(&space, true)
                        .await
                        .unwrap();
                    write_randomly(&space, &mut model, &mut rng, 20).await;
                }
            }
            cut_and_check(&crash, &devices, seed ^ 0xdead, "s", &model, seed).await;
        });
    }
}

/// Small writes in flight together share log records (one header for many),
/// of two writes to one block in a shared record the later wins, larger
/// writes keep records of their own, and after a power cut every
/// acknowledged write reads back from the records.
#[test]
fn concurrent_small_writes_share_records_and_survive_a_cut() {
    block_on(async {
        let (crash, devices) = crash_devices("share");
        // Slow enough that writes arrive while the log's writers are busy.
        let policy = DelayPolicy {
            write_ns: 300_000,
            flush_ns: 100_000,
            ..DelayPolicy::default()
        };
        let delayed: Vec<Arc<dyn BlockDevice>> = devices
            .iter()
            .map(|device| {
                Arc::new(DelayDevice::new(device.clone(), env(), policy)) as Arc<dyn BlockDevice>
            })
            .collect();
        let mut model;
        {
            let pool = log_pool(&delayed).await;
            let space = cached_space(&pool, "s", Layout::Parity { redundancy: 1 }).await;
            let journal = space.journal().unwrap();
            // Every write is logged (none gathered into rows).
            journal.set_gathering(false);
            model = Model::new(space.size_bytes());
            let mut rng = SplitMix64::new(7);
            let blocks = space.size_bytes() / BLOCK;
            for _ in 0..6 {
                let mut picks: Vec<u64> = Vec::new();
                while picks.len() < 24 {
                    let block = rng.below(blocks);
                    if !picks.contains(&block) {
                        picks.push(block);
                    }
                }
                // The first four take the log's writers; the rest wait as
                // one batch, and one of its blocks comes again, last.
                picks.push(picks[10]);
                let writes: Vec<(u64, Vec<u8>)> = picks
                    .iter()
                    .map(|&block| (block * BLOCK, rng.bytes(BLOCK as usize)))
                    .collect();
                write_together(&space, &mut model, &writes).await;
            }
            let status = journal.status();
            assert_eq!(status.absorbed_bytes, 6 * 25 * BLOCK, "{status:?}");
            // A record per write would take twice the data (a header each).
            let logged = journal.counters.log_bytes_written.load(Ordering::Relaxed);
            assert!(
                logged < status.absorbed_bytes * 3 / 2,
                "{logged} log bytes for {} bytes of writes",
                status.absorbed_bytes
            );
            // Larger writes (less than a row) go alone: a header each.
            let large = 64 << 10;
            let writes: Vec<(u64, Vec<u8>)> = (0..8)
                .map(|i| (i * 2 * large, rng.bytes(large as usize)))
                .collect();
            write_together(&space, &mut model, &writes).await;
            let added = journal.counters.log_bytes_written.load(Ordering::Relaxed) - logged;
            assert_eq!(added, 8 * (large + BLOCK));
            check_all(&space, &model).await;
        }
        cut_and_check(&crash, &devices, 11, "s", &model, 11).await;
    });
}

/// A pool on `devices` (journal disks 6 to 8) with a 2 MiB single-parity
/// space `s` with a cache, written at random `writes` times from `seed`:
/// the pool, the space, the model and the random source to go on with.
async fn parity_written(
    devices: &[Arc<dyn BlockDevice>],
    seed: u64,
    writes: usize,
) -> (Pool, Arc<terrace_engine::Space>, Model, SplitMix64) {
    let pool = journal_pool(small_config("tank"), devices, CAPACITY_DISKS).await;
    let space = pool
        .create_space(cached("s", Layout::Parity { redundancy: 1 }, 2 << 20))
        .await
        .unwrap()
        .space;
    let mut model = Model::new(space.size_bytes());
    let mut rng = SplitMix64::new(seed);
    write_randomly(&space, &mut model, &mut rng, writes).await;
    (pool, space, model, rng)
}

/// One journal disk lost: the log continues on its mirror. Every journal
/// disk lost: the space runs write-through, says why, and loses nothing.
#[test]
fn journal_disks_failing_cost_no_data() {
    block_on(async {
        let (devices, faults) = fault_devices("jfail-");
        let (pool, space, mut model, mut rng) = parity_written(&devices, 7, 40).await;
        let journal = space.journal().unwrap();
        // Which journal disks hold the log (2 copies for single parity).
        let metadata = pool.metadata().await;
        let log = metadata
            .spaces
            .iter()
            .find(|s| s.id == journal.log().id())
            .unwrap();
        let mut log_disks: Vec<usize> = log
            .extents
            .iter()
            .flat_map(|e| e.slabs.iter().flatten().map(|s| usize::from(s.disk.0)))
            .collect();
        log_disks.sort();
        log_disks.dedup();
        assert!(log_disks.len() >= 2, "log on {log_disks:?}");
        assert!(
            log_disks.iter().all(|&d| d >= 6),
            "log on journal disks: {log_disks:?}"
        );
        faults[log_disks[0]].lose();
        write_randomly(&space, &mut model, &mut rng, 40).await;
        check_all(&space, &model).await;
        assert_eq!(journal.status().write_through, None);
        faults[log_disks[1]].lose();
        write_randomly(&space, &mut model, &mut rng, 40).await;
        let status = journal.status();
        assert!(status.write_through.is_some(), "{status:?}");
        check_all(&space, &model).await;
        space.flush().await.unwrap();
        assert_eq!(journal.status().dirty_bytes, 0);
        let report = verify_space(&space).await.unwrap();
        assert!(report.mismatched_rows.is_empty());
    });
}

/// A pool whose journal disks failed (every write refused, as by a full
/// backing filesystem) is destroyed all the same: every label that can be
/// written is erased, the failed disks are named with their labels left,
/// and the pool is closed and lets go of every device. A capacity disk
/// whose failure nothing had seen yet is named too, when its erasure fails.
/// The labels left name a pool their metadata says they are a minority of:
/// imported alone, they offer it read-only at most.
#[test]
fn destroying_a_pool_with_failed_journal_disks_erases_the_rest() {
    block_on(async {
        let (devices, faults) = fault_devices("jdestroy-");
        let (pool, space, mut model, mut rng) = parity_written(&devices, 11, 20).await;
        for journal_disk in &faults[6..9] {
            journal_disk.fail_writes(0..u64::MAX);
        }
        write_randomly(&space, &mut model, &mut rng, 40).await;
        assert!(space.journal().unwrap().status().write_through.is_some());
        let failed: BTreeSet<usize> = pool
            .status()
            .await
            .disks
            .iter()
            .filter(|disk| disk.condition == terrace_engine::Condition::Failed)
            .map(|disk| usize::from(disk.index))
            .collect();
        assert!(
            failed.len() >= 2 && failed.iter().all(|&disk| disk >= 6),
            "failed: {failed:?}"
        );
        // Disk 0 fails too, unseen until the destroy writes to it.
        faults[0].fail_writes(0..u64::MAX);
        drop(space);

        let left = pool.destroy().await.expect("destroyed");
        let named: BTreeSet<usize> = left.iter().map(|l| usize::from(l.disk.0)).collect();
        let mut expected: BTreeSet<usize> = (6..9).collect();
        expected.insert(0);
        assert_eq!(named, expected, "{left:?}");
        for label in &left {
            let erasing = label.reason.contains("erasing it failed");
            let failed_before = label.reason.starts_with("failed");
            assert!(
                if label.disk.0 == 0 {
                    erasing
                } else {
                    failed_before || erasing
                },
                "{label:?}"
            );
            assert_eq!(label.path, devices[usize::from(label.disk.0)].name());
        }
        assert!(pool.is_closed());
        assert!(pool.spaces().is_empty());
        assert!(matches!(
            pool.destroy().await,
            Err(terrace_engine::EngineError::Closed { .. })
        ));
        for (index, device) in devices.iter().enumerate() {
            assert_eq!(
                Arc::strong_count(device),
                1,
                "disk {index} is still held by the destroyed pool"
            );
        }
        for fault in &faults {
            fault.clear();
        }
        let report = terrace_engine::scan(&devices).await;
        for (index, found) in report.iter().enumerate() {
            let blank = found.kind == terrace_engine::DeviceKind::Blank;
            assert_eq!(blank, !expected.contains(&index), "disk {index}: {found:?}");
        }
        // What the labels left find: a minority, never a pool read-write.
        let ghosts: Vec<Arc<dyn BlockDevice>> =
            expected.iter().map(|&i| devices[i].clone()).collect();
        if let Ok(ghost) = Pool::import(env(), ghosts, ImportOptions::default()).await {
            assert!(ghost.read_only_reason().is_some());
        }
    });
}

/// The cache grows and shrinks while writers keep going; nothing fails and
/// everything reads back.
#[test]
fn live_resize_up_and_down_under_load() {
    block_on(async {
        let memory = memory_devices("resize-");
        let pool = Arc::new(log_pool(&memory).await);
        let space = pool
            .create_space(cached("s", Layout::Parity { redundancy: 2 }, 2 << 20))
            .await
            .unwrap()
            .space;
        let size = space.size_bytes();
        let stop = AtomicBool::new(false);
        // Writers own disjoint quarters, so the model is exact.
        let quarter = size / 4 / 4096 * 4096;
        let mut models: Vec<Model> = (0..4).map(|_| Model::new(size)).collect();
        let writers = models.iter_mut().enumerate().map(|(w, model)| {
            let space = space.clone();
            let stop = &stop;
            async move {
                let mut rng = SplitMix64::new(100 + w as u64);
                let mut rounds = 0;
                while !stop.load(Ordering::Relaxed) || rounds < 50 {
                    let offset = w as u64 * quarter + rng.below(quarter / 4096 - 4) * 4096;
                    let blocks = 1 + rng.below(3);
                    let data = rng.bytes(4096 * blocks as usize);
                    space
                        .write(offset, bytes(data.clone()), false)
                        .await
                        .unwrap();
                    model.write(offset, &data);
                    rounds += 1;
                    if rounds % 8 == 0 {
                        futures::future::ready(()).await;
                    }
                    if rounds > 400 {
                        break;
                    }
                }
            }
        });
        let resizer = async {
            for bytes in [64 << 20, 40 << 20, 32 << 20, 48 << 20] {
                assert_eq!(pool.set_cache_size("s", bytes).await.unwrap(), bytes);
                assert_eq!(space.journal().unwrap().status().bytes, bytes);
            }
            stop.store(true, Ordering::Relaxed);
        };
        let (_, ()) = futures::join!(join_all(writers), resizer);
        // Merge the writers' models (disjoint quarters).
        let mut model = Model::new(size);
        for (w, part) in models.iter().enumerate() {
            let start = w as u64 * quarter;
            model.write(start, part.slice(start, quarter));
        }
        check_all(&space, &model).await;
        assert!(pool.set_cache_size("s", 64 << 10).await.is_err());
        let metadata = pool.metadata().await;
        assert_eq!(metadata.space("s").unwrap().cache.unwrap().bytes, 48 << 20);
    });
}

/// A stream of partial-row writes in flight together is gathered into
/// whole rows that go straight to the disks; a piece whose stream stops is
/// logged after a short wait; a whole-row write over a gathering row
/// completes it and lands last. Everything reads back, before and after
/// destaging, and parity matches.
#[test]
fn streams_of_partial_rows_go_to_the_disks_as_whole_rows() {
    block_on(async {
        let memory = memory_devices("gather");
        let pool = log_pool(&memory).await;
        let layout = Layout::Parity { redundancy: 2 };
        let space = cached_space(&pool, "stream", layout).await;
        let journal = space.journal().expect("a cache");
        assert!(journal.gathering());
        let row = space.natural_write_bytes();
        let piece = row / 4;
        let mut model = Model::new(space.size_bytes());
        let mut rng = SplitMix64::new(7);

        // Rows 0..8 as a stream of quarter rows, all in flight at once. Row
        // 0's first piece continues nothing, so row 0 is logged; the later
        // rows are gathered.
        let pieces: Vec<(u64, Vec<u8>)> = (0..32)
            .map(|i| (i * piece, rng.bytes(piece as usize)))
            .collect();
        join_all(
            pieces
                .iter()
                .map(|(offset, data)| space.write(*offset, bytes(data.clone()), false)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .unwrap();
        for (offset, data) in &pieces {
            model.write(*offset, data);
        }
        let status = journal.status();
        assert!(status.bypassed_bytes >= 7 * row, "{status:?}");
        assert_eq!(status.bypassed_writes, 28, "{status:?}");
        check_all(&space, &model).await;

        // The stream stops after one piece of row 8: it waits, then goes to
        // the log.
        let absorbed = status.absorbed_writes;
        let data = rng.bytes(piece as usize);
        space
            .write(8 * row, bytes(data.clone()), false)
            .await
            .unwrap();
        model.write(8 * row, &data);
        assert_eq!(journal.status().absorbed_writes, absorbed + 1);
        check_all(&space, &model).await;

        // A piece opening row 10 (it continues a write ending there), and a
        // whole-row write over row 10 sent after it: the row is written
        // once, the later write's bytes over the earlier's.
        let lead = rng.bytes(piece as usize);
        let nine = rng.bytes(row as usize);
        space
            .write(9 * row, bytes(nine.clone()), false)
            .await
            .unwrap();
        model.write(9 * row, &nine);
        let whole = rng.bytes(row as usize);
        let (first, second) = futures::join!(
            space.write(10 * row, bytes(lead.clone()), false),
            space.write(10 * row, bytes(whole.clone()), false)
        );
        first.unwrap();
        second.unwrap();
        let read = space.read(10 * row, row).await.unwrap();
        assert!(read[..] == whole[..], "the later write did not land last");
        model.write(10 * row, &whole);

        journal.drain(&space).await.unwrap();
        check_all(&space, &model).await;
        let report = verify_space(&space).await.unwrap();
        assert!(
            report.mismatched_rows.is_empty(),
            "{:?}",
            report.mismatched_rows
        );
        pool.close().await.unwrap();
    });
}

/// The pool's size figures count the logs' slabs on journal disks apart
/// from the capacity the spaces' data takes.
#[test]
fn journal_disks_and_their_logs_are_counted_apart_from_capacity() {
    block_on(async {
        let memory = memory_devices("counted");
        let pool = log_pool(&memory).await;
        let space = pool
            .create_space(cached("p", Layout::Parity { redundancy: 1 }, 1 << 20))
            .await
            .unwrap()
            .space;
        let metadata = pool.metadata().await;
        let slabs = |name: &str| {
            let record = metadata.space(name).unwrap();
            ExtentRecord::slabs_of(&record.extents).count() as u64 * SLAB
        };
        let log = space.journal().unwrap().log().name().to_string();
        let status = pool.status().await;
        let sums = format!(".sums-{}", space.id().0);
        assert_eq!(status.allocated_bytes, slabs("p") + slabs(&sums));
        assert_eq!(status.journal_allocated_bytes, slabs(&log));
        let journal_disks: u64 = metadata
            .disks
            .iter()
            .filter(|disk| disk.usage == Usage::Journal)
            .map(|disk| u64::from(disk.slab_count) * SLAB)
            .sum();
        assert_eq!(status.journal_bytes, journal_disks);
        assert!(status.allocated_bytes <= status.capacity_bytes);
        pool.close().await.unwrap();
    });
}

/// Shrinking a live cache gives its log slabs back once the ring has moved
/// into the smaller lap; data written before and after reads back, across a
/// restart too.
#[test]
fn a_shrunk_cache_gives_back_its_log_slabs() {
    block_on(async {
        let memory = memory_devices("shrink");
        let pool = log_pool(&memory).await;
        let mut config = cached("p1", Layout::Parity { redundancy: 1 }, 1 << 20);
        config.cache_bytes = Some(64 << 20);
        let space = pool.create_space(config).await.unwrap().space;
        let journal = space.journal().expect("a cache");
        let log_bytes = |journal: &terrace_engine::journal::Journal<terrace_engine::Volume>| {
            journal.log().size_bytes()
        };
        assert!(log_bytes(&journal) >= 64 << 20);
        let row = space.natural_write_bytes();
        let mut model = Model::new(space.size_bytes());
        let mut rng = SplitMix64::new(11);
        // What the ring may hold: its size, even while the lap under way
        // after a shrink is still of the old size.
        let size = std::cell::Cell::new(64 << 20);
        // Partial rows, so everything is logged.
        let mut write_logged = async |model: &mut Model, bytes_total: u64| {
            let piece = row - (4 << 10);
            for _ in 0..bytes_total / piece {
                let offset = rng.below(space.size_bytes() / row) * row + (4 << 10);
                model.write_random(&space, &mut rng, offset, piece).await;
                let used = journal.status().used_bytes;
                assert!(
                    used <= size.get(),
                    "{used} held by a ring of {}",
                    size.get()
                );
            }
        };
        write_logged(&mut model, 30 << 20).await;
        assert!(
            !pool.release_log_slabs(&space).await.unwrap(),
            "nothing to give back yet"
        );
        pool.set_cache_size("p1", 32 << 20).await.unwrap();
        size.set(32 << 20);
        // A refusal speaks of the size set, not of the slabs still held.
        let refused = pool.set_cache_size("p1", 100 << 30).await.unwrap_err();
        let refused = refused.to_string();
        assert!(refused.contains("growing from 32M to 100G"), "{refused}");
        // Still in the first, larger lap: the slabs stay.
        assert!(!pool.release_log_slabs(&space).await.unwrap());
        // Enough to finish the larger lap, held to the new size meanwhile.
        write_logged(&mut model, 40 << 20).await;
        journal.drain(&space).await.unwrap();
        assert!(pool.release_log_slabs(&space).await.unwrap());
        assert_eq!(log_bytes(&journal), 32 << 20);
        check_all(&space, &model).await;
        // The smaller ring keeps working and wrapping.
        write_logged(&mut model, 40 << 20).await;
        check_all(&space, &model).await;
        pool.close().await.unwrap();
        let reopened = Pool::import(env(), memory.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = reopened.space("p1").unwrap();
        assert_eq!(log_bytes(&space.journal().unwrap()), 32 << 20);
        check_all(&space, &model).await;
        let report = verify_space(&space).await.unwrap();
        assert!(
            report.mismatched_rows.is_empty(),
            "{:?}",
            report.mismatched_rows
        );
        reopened.close().await.unwrap();
    });
}

/// Whole rows written one after another straight to the disks share one
/// dirty-range record: the first names the rows after it too, and the rest
/// log nothing. A power cut that tears any of them still leaves parity
/// consistent after recovery: the shared record names them all.
#[test]
fn a_stream_of_whole_rows_shares_one_dirty_range_and_survives_a_cut() {
    for seed in 0..6u64 {
        block_on(async {
            let (crash, devices) = crash_devices(&format!("lease{seed}"));
            {
                let pool = log_pool(&devices).await;
                let layout = Layout::Parity {
                    redundancy: 1 + (seed % 2) as u32,
                };
                let space = cached_space(&pool, "s", layout).await;
                let journal = space.journal().unwrap();
                let row = space.natural_write_bytes();
                let logged = || journal.counters.log_bytes_written.load(Ordering::Relaxed);
                let mut rng = SplitMix64::new(seed);
                let before = logged();
                space
                    .write(0, bytes(rng.bytes(row as usize)), false)
                    .await
                    .unwrap();
                let first = logged();
                assert!(first > before, "the first row logs its dirty range");
                for index in 1..8 {
                    space
                        .write(index * row, bytes(rng.bytes(row as usize)), false)
                        .await
                        .unwrap();
                }
                assert_eq!(logged(), first, "the rows after it log nothing");
                assert_eq!(journal.status().bypassed_writes, 8);
            }
            // Nothing was flushed: the cut drops or tears the rows' writes.
            let pool = cut_and_import(&crash, &devices, seed ^ 0xbeef).await;
            assert_consistent(&pool.space("s").unwrap(), seed).await;
            pool.close().await.unwrap();
        });
    }
}

/// A clock that stands still (sleeps still end, on the test's clock): the
/// test sees no time pass between its writes, however they interleave.
struct StillClock(Arc<dyn terrace_engine::io::env::Env>);

impl terrace_engine::io::env::Env for StillClock {
    fn now_ns(&self) -> u64 {
        1
    }
    fn wall_clock_ns(&self) -> u64 {
        self.0.wall_clock_ns()
    }
    fn sleep(&self, duration_ns: u64) -> terrace_engine::io::BoxFuture<()> {
        self.0.sleep(duration_ns)
    }
    fn random_u64(&self) -> u64 {
        self.0.random_u64()
    }
}

/// A stream of whole rows never waits for a dirty-range record after its
/// first row: while a direct write runs near the end of the record it
/// uses, the next record is logged beside it. A lone whole-row write
/// elsewhere logs one record, and nothing ahead of it.
#[test]
fn a_stream_of_whole_rows_finds_its_next_dirty_range_logged() {
    block_on(async {
        let crash: Vec<Arc<CrashDevice>> = (0..9)
            .map(|i| {
                let size = if i < 6 { 32 << 20 } else { JOURNAL_BYTES };
                let memory = Arc::new(MemoryDevice::new(format!("renew{i}"), size));
                Arc::new(CrashDevice::new(memory))
            })
            .collect();
        let devices = as_devices(&crash);
        let env = Arc::new(StillClock(env()));
        let pool = Pool::create(
            env,
            small_config("tank"),
            journal_disks_after(&devices, CAPACITY_DISKS),
        )
        .await
        .unwrap();
        let layout = Layout::Parity { redundancy: 1 };
        let space = pool
            .create_space(cached("rows", layout, 100 << 20))
            .await
            .unwrap()
            .space;
        let journal = space.journal().unwrap();
        let waits = || journal.counters.dirty_range_waits.load(Ordering::Relaxed);
        let logged = || journal.counters.log_bytes_written.load(Ordering::Relaxed);
        let row = space.natural_write_bytes();
        let mut rng = SplitMix64::new(17);
        // Four rows a write, over three records' reach (16 MiB each).
        let rows = (48 << 20) / row / 4 * 4;
        for index in (0..rows).step_by(4) {
            let data = bytes(rng.bytes(4 * row as usize));
            space.write(index * row, data, false).await.unwrap();
        }
        assert_eq!(waits(), 1, "only the stream's first write waits");
        let before = logged();
        let lone = (space.size_bytes() / row - 1) * row;
        let data = rng.bytes(row as usize);
        space.write(lone, bytes(data.clone()), false).await.unwrap();
        assert_eq!(waits(), 2, "a lone row logs its own record");
        assert_eq!(logged() - before, 4096, "one record, none ahead");
        assert!(space.read(lone, row).await.unwrap()[..] == data[..]);
        assert_eq!(journal.status().bypassed_bytes, (rows + 1) * row);
        // Nothing was flushed: a power cut tears the rows' writes, and the
        // records logged ahead name every one of them for resync.
        drop(pool);
        let pool = cut_and_import(&crash, &devices, 17).await;
        assert_consistent(&pool.space("rows").unwrap(), 17).await;
        pool.close().await.unwrap();
    });
}

/// The background destage task empties a log soon after its writers stop,
/// however little the log holds (a few blocks of a large ring).
#[test]
fn a_quiet_log_is_emptied_by_the_destage_task() {
    block_on(async {
        let memory = memory_devices("quiet");
        let pool = log_pool(&memory).await;
        let layout = Layout::Parity { redundancy: 1 };
        let space = cached_space(&pool, "quiet", layout).await;
        let journal = space.journal().unwrap();
        let data = SplitMix64::new(11).bytes(4096);
        space
            .write(3 * 4096, bytes(data.clone()), false)
            .await
            .unwrap();
        assert_eq!(journal.status().dirty_bytes, 4096, "the write was logged");
        let emptied = async {
            for _ in 0..100 {
                if journal.status().dirty_bytes == 0 {
                    return true;
                }
                env().sleep(100_000_000).await;
            }
            false
        };
        let emptied =
            match futures::future::select(Box::pin(pool.run_cache()), Box::pin(emptied)).await {
                futures::future::Either::Left(_) => panic!("the destage task stopped on its own"),
                futures::future::Either::Right((emptied, _)) => emptied,
            };
        assert!(emptied, "still dirty: {:?}", journal.status());
        assert!(journal.status().destaged_bytes >= 4096);
        assert!(space.read(3 * 4096, 4096).await.unwrap()[..] == data[..]);
        pool.close().await.unwrap();
    });
}

/// A dirty-range record is shared only for a while after it was logged:
/// a whole row written later logs its own, so a region rewritten without
/// pause cannot hold the record (and every later one) in the log.
#[test]
fn a_dirty_range_is_shared_only_for_a_while() {
    block_on(async {
        let memory = memory_devices("lease-time");
        let pool = log_pool(&memory).await;
        let layout = Layout::Parity { redundancy: 1 };
        let space = cached_space(&pool, "rows", layout).await;
        let journal = space.journal().unwrap();
        let row = space.natural_write_bytes();
        let logged = || journal.counters.log_bytes_written.load(Ordering::Relaxed);
        let mut rng = SplitMix64::new(5);
        let mut write_row = |index: u64| {
            let data = rng.bytes(row as usize);
            space.write(index * row, bytes(data), false)
        };
        write_row(0).await.unwrap();
        let first = logged();
        write_row(1).await.unwrap();
        assert_eq!(logged(), first, "row 1 shares row 0's record");
        env().sleep(1_100_000_000).await;
        write_row(2).await.unwrap();
        assert!(logged() > first, "row 2, a second later, logs its own");
        pool.close().await.unwrap();
    });
}

/// A writer that finds the log full destages one round and goes on: the
/// log frees a round at a time as destaging writes it home, where it once
/// stalled every writer until the whole log was home. Writes then keep
/// going through further laps of the ring, and all of them read back.
#[test]
fn a_full_log_frees_a_round_at_a_time() {
    block_on(async {
        let memory = memory_devices("full");
        let pool = log_pool(&memory).await;
        let layout = Layout::Parity { redundancy: 1 };
        let space = pool
            .create_space(cached("full", layout, 16 << 20))
            .await
            .unwrap()
            .space;
        let journal = space.journal().unwrap();
        let mut model = Model::new(space.size_bytes());
        let mut rng = SplitMix64::new(23);
        let blocks = space.size_bytes() / BLOCK;
        let mut first_wait = None;
        let mut waits = 0;
        // No destage task runs: only writers that find the log full destage.
        for _ in 0..12_000 {
            let offset = rng.below(blocks) * BLOCK;
            let before = journal.status();
            model.write_random(&space, &mut rng, offset, BLOCK).await;
            let after = journal.status();
            if after.destaged_bytes > before.destaged_bytes {
                waits += 1;
                first_wait.get_or_insert((before, after));
            }
        }
        let (before, after) = first_wait.expect("the log filled up");
        assert!(before.used_bytes * 4 >= CACHE * 2, "it filled: {before:?}");
        assert!(
            after.dirty_bytes > 0 && after.dirty_bytes >= before.dirty_bytes / 4,
            "the waiting writer destaged one round, not the log: {before:?} then {after:?}"
        );
        assert!(waits >= 4, "{waits} rounds: {:?}", journal.status());
        check_through_drain(&space, &model).await;
        pool.close().await.unwrap();
    });
}

/// A parity row with many separate dirty runs goes home as one update (the
/// row read, the runs laid over it, written once), with the rows' other
/// blocks as they were; rows with few runs go run by run. After either, and
/// after a power cut once the log is home, everything reads back and the
/// parity matches.
#[test]
fn rows_with_many_dirty_runs_destage_as_one_update() {
    for redundancy in [1, 2] {
        block_on(async {
            let (crash, devices) = crash_devices(&format!("merge{redundancy}"));
            let mut model;
            {
                let pool = log_pool(&devices).await;
                let layout = Layout::Parity { redundancy };
                let space = pool
                    .create_space(cached("m", layout, 2 << 20))
                    .await
                    .unwrap()
                    .space;
                let journal = space.journal().unwrap();
                model = Model::new(space.size_bytes());
                let mut rng = SplitMix64::new(31 + redundancy as u64);
                // Home data first, straight to the disks by whole rows.
                let row = space.natural_write_bytes();
                let whole = rng.bytes(row as usize);
                space.write(0, bytes(whole.clone()), true).await.unwrap();
                model.write(0, &whole);
                journal.drain(&space).await.unwrap();
                // Row 0: every other block; row 2: two blocks.
                let mut writes: Vec<(u64, Vec<u8>)> = (0..row / BLOCK)
                    .step_by(2)
                    .map(|block| (block * BLOCK, rng.bytes(BLOCK as usize)))
                    .collect();
                writes.push((2 * row, rng.bytes(BLOCK as usize)));
                writes.push((2 * row + 3 * BLOCK, rng.bytes(BLOCK as usize)));
                for (offset, data) in &writes {
                    space
                        .write(*offset, bytes(data.clone()), false)
                        .await
                        .unwrap();
                    model.write(*offset, data);
                }
                let merged = || journal.counters.rows_merged.load(Ordering::Relaxed);
                assert_eq!(merged(), 0);
                journal.drain(&space).await.unwrap();
                assert_eq!(merged(), 1, "row 0 went as one update, row 2 run by run");
                check_all(&space, &model).await;
                assert_consistent(&space, redundancy as u64).await;
            }
            cut_and_check(&crash, &devices, 7, "m", &model, redundancy as u64).await;
        });
    }
}

/// A destage round of a stream of partial-row writes writes whole rows and
/// reads nothing: its runs are cut where rows begin, and the row its budget
/// cuts is completed from the newer records that hold the rest of it.
#[test]
fn a_destage_round_of_a_stream_writes_whole_rows() {
    block_on(async {
        let (counting, devices) = counted(memory_devices("round"), false, None);
        let pool = log_pool(&devices).await;
        let layout = Layout::Parity { redundancy: 1 };
        let size = 20 << 20;
        let mut config = cached("round", layout, size);
        // Rows of 80 KiB: neither 64 KiB writes nor 4 or 16 MiB fit whole
        // rows.
        config.columns = Some(6);
        let space = pool.create_space(config).await.unwrap().space;
        let journal = space.journal().unwrap();
        let row = space.natural_write_bytes();
        let piece = 64 << 10;
        assert!(row % piece != 0 && (4 << 20) % row != 0 && (16 << 20) % row != 0);
        let mut model = Model::new(size);
        let mut rng = SplitMix64::new(41);
        // Pieces in falling order: none continues the one before, so all
        // are logged (not gathered), and the oldest records are the
        // highest offsets.
        for index in (0..size / piece).rev() {
            model
                .write_random(&space, &mut rng, index * piece, piece)
                .await;
        }
        assert_eq!(journal.status().absorbed_bytes, size);
        let reads = || {
            counting[..6]
                .iter()
                .map(|c| c.reads.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let before = reads();
        assert!(journal.destage(&space, true).await.unwrap());
        let status = journal.status();
        assert!(
            status.destaged_bytes >= 8 << 20 && status.dirty_bytes > 0,
            "one round, not the log: {status:?}"
        );
        assert_eq!(reads(), before, "the round read from the capacity disks");
        check_through_drain(&space, &model).await;
        assert_consistent(&space, 41).await;
        pool.close().await.unwrap();
    });
}

/// A log whose pool may keep little of it in memory keeps the rest only on
/// the log's disks: reads and destaging read it back from there (from the
/// surviving copy once a journal disk is lost), everything reads back
/// before and after a drain and across a restart, and the memory held never
/// exceeds the pool's budget.
#[test]
fn a_log_beyond_its_memory_is_read_back_from_its_disks() {
    block_on(async {
        let (devices, faults) = fault_devices("beyond");
        let (counting, devices) = counted(devices, false, None);
        let pool = log_pool(&devices).await;
        let budget = 256 << 10;
        pool.set_log_memory(budget);
        let space = cached_space(&pool, "s", Layout::Parity { redundancy: 1 }).await;
        let journal = space.journal().unwrap();
        journal.set_gathering(false);
        let mut model = Model::new(space.size_bytes());
        let mut rng = SplitMix64::new(43);
        write_randomly(&space, &mut model, &mut rng, 150).await;
        let status = journal.status();
        assert!(
            status.memory_bytes <= budget && status.dirty_bytes > budget,
            "{status:?}"
        );
        assert_eq!(pool.log_memory(), (status.memory_bytes, budget));
        let log_reads = || {
            counting[6..]
                .iter()
                .map(|c| c.reads.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let before = log_reads();
        check_all(&space, &model).await;
        assert!(log_reads() > before, "nothing was read back from the log");
        // One copy of the log lost: the other holds every record.
        let log_disk = (6..9)
            .find(|&d| counting[d].reads.load(Ordering::Relaxed) > 0)
            .unwrap();
        faults[log_disk].lose();
        check_all(&space, &model).await;
        write_randomly(&space, &mut model, &mut rng, 60).await;
        assert!(pool.log_memory().0 <= budget);
        check_all(&space, &model).await;
        journal.drain(&space).await.unwrap();
        assert_eq!(pool.log_memory().0, 0, "a drained log holds no memory");
        check_all(&space, &model).await;
        assert_consistent(&space, 43).await;
        // Dirty again, beyond the budget; a restart replays it from the log.
        write_randomly(&space, &mut model, &mut rng, 60).await;
        assert!(journal.status().dirty_bytes > journal.status().memory_bytes);
        pool.close().await.unwrap();
        let reopened = Pool::import(env(), devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = reopened.space("s").unwrap();
        check_all(&space, &model).await;
        assert_consistent(&space, 43).await;
        reopened.close().await.unwrap();
    });
}

/// A read of blocks held only in the log, held up at the log's disks while
/// writes elsewhere fill the ring and destaging frees it, finds the tail
/// past the record it read back (its ring holds newer records by then),
/// reads again, and returns the blocks' data, not the newer records'.
#[test]
fn a_read_back_that_the_ring_overtakes_reads_again() {
    block_on(async {
        let gate = Arc::new(Gate::default());
        let (_, devices) = counted(memory_devices("overtaken"), false, Some(gate.clone()));
        let pool = log_pool(&devices).await;
        pool.set_log_memory(0);
        let mut config = cached("s", Layout::Parity { redundancy: 1 }, 4 << 20);
        config.cache_bytes = Some(1 << 20);
        let space = pool.create_space(config).await.unwrap().space;
        let journal = space.journal().unwrap();
        journal.set_gathering(false);
        let size = space.size_bytes();
        let mut model = Model::new(size);
        let mut rng = SplitMix64::new(47);
        // Less than a row, logged.
        let region = 32 << 10;
        assert!(region < space.natural_write_bytes());
        model.write_random(&space, &mut rng, 0, region).await;
        assert_eq!(journal.status().dirty_bytes, region);
        let fixed = model.slice(0, region).to_vec();
        gate.arm();
        let reader = async {
            let read = space.read(0, region).await.unwrap();
            assert!(read[..] == *fixed, "the read returned other data");
        };
        let writer = async {
            assert!(
                gate.reached().await,
                "the read did not reach the log's disks"
            );
            let destaged = journal.status().destaged_bytes;
            // Three rings' worth of writes elsewhere: the region's record
            // goes home and its ring is written over.
            for round in 0..48u64 {
                let offset = region + (round * (64 << 10)) % (size - region);
                model.write_random(&space, &mut rng, offset, 64 << 10).await;
            }
            assert!(journal.status().destaged_bytes > destaged + (2 << 20));
            gate.release();
        };
        futures::join!(reader, writer);
        check_all(&space, &model).await;
        journal.drain(&space).await.unwrap();
        assert_consistent(&space, 47).await;
        pool.close().await.unwrap();
    });
}

/// Zeroing a new space's slabs or preparing a new log (writing its slabs
/// with zeroes, which takes as long as the cache is large) holds up no
/// other space of the pool: with the zeroing held, a mirror space's first
/// write to an extent (which commits its write intent to the pool's
/// metadata) completes when a space gets a cache, when its cache grows and
/// when a space is created with one (its own zeroing held; the space is
/// not there until it is zeroed) and when a space grows (not grown until
/// zeroed); the caches and the grown space work after.
#[test]
fn zeroing_new_slabs_holds_up_no_other_space() {
    block_on(async {
        let gate = Arc::new(Gate::default());
        let (_, devices) =
            counted_gates(memory_devices("prepared"), false, None, Some(gate.clone()));
        let pool = log_pool(&devices).await;
        let uncached = |name: &str, layout| {
            let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(1 << 20));
            config.cache_bytes = Some(0);
            config
        };
        let mut mirror = uncached("m", Layout::Mirror { copies: 2 });
        mirror.size = SpaceSize::Bytes(4 << 20);
        let mirror = pool.create_space(mirror).await.unwrap().space;
        pool.create_space(uncached("s", Layout::Simple))
            .await
            .unwrap();
        pool.create_space(uncached("g", Layout::Simple))
            .await
            .unwrap();
        let mut model = Model::new(mirror.size_bytes());
        let mut rng = SplitMix64::new(53);
        for round in 0..4u64 {
            gate.arm();
            let preparing = async {
                if round < 2 {
                    let bytes = (round + 1) * CACHE;
                    assert_eq!(pool.set_cache_size("s", bytes).await.unwrap(), bytes);
                } else if round == 2 {
                    let config = cached("c", Layout::Simple, 1 << 20);
                    pool.create_space(config).await.unwrap();
                } else {
                    assert_eq!(pool.resize_space("g", 2 << 20).await.unwrap(), 2 << 20);
                }
            };
            let writing = async {
                assert!(gate.reached().await, "nothing was zeroed");
                if round < 2 {
                    // The log's preparation shows in the pool's status.
                    let preparing = pool.status().await.preparing.expect("preparing");
                    assert_eq!(preparing.space, "s");
                    assert!(preparing.total_bytes >= CACHE, "{preparing:?}");
                    assert!(
                        preparing.done_bytes < preparing.total_bytes,
                        "{preparing:?}"
                    );
                }
                if round == 2 {
                    assert!(
                        pool.space("c").is_none(),
                        "space c is there before it is zeroed"
                    );
                }
                if round == 3 {
                    let grown = pool.space("g").unwrap().size_bytes();
                    assert_eq!(grown, 1 << 20, "space g grew before it was zeroed");
                }
                // A mirror extent not written before: its write commits.
                let offset = round * (512 << 10);
                let write = model.write_random(&mirror, &mut rng, offset, 64 << 10);
                let waited = env().sleep(10_000_000_000);
                futures::pin_mut!(write, waited);
                if let futures::future::Either::Right(_) =
                    futures::future::select(write, waited).await
                {
                    gate.release();
                    panic!("the write waited for the zeroing");
                }
                gate.release();
            };
            futures::join!(preparing, writing);
        }
        assert_eq!(pool.status().await.preparing, None);
        for (name, bytes) in [("s", 2 * CACHE), ("c", CACHE)] {
            let space = pool.space(name).unwrap();
            let journal = space.journal().expect("the cache is attached");
            assert_eq!(journal.status().bytes, bytes);
            let mut cached = Model::new(space.size_bytes());
            cached.write_random(&space, &mut rng, 4096, 8192).await;
            assert!(journal.status().dirty_bytes > 0, "the write was not logged");
            check_all(&space, &cached).await;
        }
        check_all(&mirror, &model).await;
        let grown = pool.space("g").unwrap();
        assert_eq!(grown.size_bytes(), 2 << 20);
        let mut model = Model::new(grown.size_bytes());
        model
            .write_random(&grown, &mut rng, (2 << 20) - 8192, 8192)
            .await;
        check_all(&grown, &model).await;
        pool.close().await.unwrap();
    });
}

/// A disk lost while a new space's slabs are zeroed (outside the control
/// lock) fails the creation and leaves nothing behind: no space, nothing
/// allocated, and the pool takes a space after it. Whether the disk still
/// had slabs to zero (the zeroing fails) or not (the commit finds the disk
/// gone).
/// A new log's slabs are written ahead with zeroes, every copy of every
/// slab, only where the disks' first writes allocate (files); elsewhere
/// (block devices) the ring starts at once on whatever the slabs held,
/// here an earlier log's records. Either way the new log's writes, and
/// nothing of the earlier log's, read back before and after a power cut.
#[test]
fn a_log_is_written_ahead_only_where_first_writes_allocate() {
    for allocates in [true, false] {
        block_on(async {
            let (crash, plain) = crash_devices(&format!("ahead-{allocates}"));
            let (counting, devices) = counted_allocating(plain, allocates);
            let zeroed = || {
                counting
                    .iter()
                    .map(|c| c.zeroed_slabs.swap(0, Ordering::Relaxed))
                    .sum::<u64>()
            };
            // Single parity: two copies of each log.
            let expected = if allocates { 2 * CACHE / SLAB } else { 0 };
            let layout = Layout::Parity { redundancy: 1 };
            let mut rng = SplitMix64::new(71);
            let mut model;
            {
                let pool = log_pool(&devices).await;
                // An earlier log, full of records, then dropped with its
                // space.
                let earlier = cached_space(&pool, "earlier", layout).await;
                assert_eq!(zeroed(), expected, "the earlier log written ahead");
                let mut ignored = Model::new(earlier.size_bytes());
                write_randomly(&earlier, &mut ignored, &mut rng, 120).await;
                let earlier_slabs = log_slabs(&pool).await;
                drop(earlier);
                pool.delete_space("earlier").await.unwrap();
                let space = cached_space(&pool, "later", layout).await;
                assert_eq!(zeroed(), expected, "the later log written ahead");
                assert!(
                    !earlier_slabs.is_disjoint(&log_slabs(&pool).await),
                    "the later log does not reuse the earlier one's slabs"
                );
                model = Model::new(space.size_bytes());
                write_randomly(&space, &mut model, &mut rng, 60).await;
                assert!(space.journal().unwrap().status().dirty_bytes > 0);
                check_all(&space, &model).await;
            }
            cut_and_check(&crash, &devices, 72, "later", &model, 72).await;
        });
    }
}

/// The slabs of the pool's logs.
async fn log_slabs(pool: &Pool) -> BTreeSet<SlabRef> {
    let metadata = pool.metadata().await;
    let logs = metadata
        .spaces
        .iter()
        .filter(|space| space.name.starts_with(".log-"));
    ExtentRecord::slabs_of(logs.flat_map(|space| space.extents.iter())).collect()
}

#[test]
fn a_disk_lost_while_a_space_is_zeroed_creates_nothing() {
    a_disk_lost_while_zeroing(true);
    a_disk_lost_while_zeroing(false);
}

fn a_disk_lost_while_zeroing(the_held_disk: bool) {
    block_on(async {
        let gate = Arc::new(Gate::default());
        let (_, devices) = counted_gates(memory_devices("lost"), false, None, Some(gate.clone()));
        let pool = log_pool(&devices).await;
        // Two copies over three columns: every capacity disk holds a slot
        // of its one extent.
        let mut config = SpaceConfig::new(
            "x",
            Layout::Mirror { copies: 2 },
            SpaceSize::Bytes(3 * SLAB),
        );
        config.columns = Some(3);
        config.cache_bytes = Some(0);
        let allocated = pool.status().await.allocated_bytes;
        gate.arm();
        let creating = pool.create_space(config.clone());
        let losing = async {
            assert!(gate.reached().await, "nothing was zeroed");
            let held = gate.held_at.lock().unwrap().clone().unwrap();
            let lost = (0..6)
                .find(|&i| (devices[i].name() == held) == the_held_disk)
                .unwrap();
            pool.disk_gone(terrace_engine::meta::DiskIndex(lost as u16), "pulled")
                .await
                .unwrap();
            gate.release();
        };
        let (created, ()) = futures::join!(creating, losing);
        let error = created.err().expect("the creation failed");
        if !the_held_disk {
            assert!(
                error
                    .to_string()
                    .contains("changed state while space x was prepared"),
                "{error}"
            );
        }
        assert!(pool.space("x").is_none(), "space x exists after {error}");
        assert_eq!(pool.status().await.allocated_bytes, allocated);
        // The five disks left take a space as large again.
        config.layout = Layout::Simple;
        config.columns = None;
        pool.create_space(config).await.unwrap();
        pool.close().await.unwrap();
    });
}

/// A direct write in flight pins its dirty-range record, first in the ring,
/// so the tail cannot pass it. A writer that finds the log full meanwhile
/// has nothing to destage and waits. The direct write ending must wake it:
/// here no destage task runs, so nothing else would, and the writer would
/// wait for ever.
#[test]
fn a_writer_waiting_behind_a_direct_write_goes_on_when_it_ends() {
    use futures::task::LocalSpawnExt;
    use std::cell::RefCell;
    use std::rc::Rc;

    let gate = Arc::new(Gate::default());
    let devices = marked_held(&memory_devices("pinned"), |_| gate.clone());
    let mut executor = Executor::new();
    let spawner = executor.spawner();
    let (pool, space) = executor.run_until(async {
        let pool = log_pool(&devices).await;
        let layout = Layout::Mirror { copies: 2 };
        let space = pool
            .create_space(cached("pinned", layout, 4 << 20))
            .await
            .unwrap()
            .space;
        (pool, space)
    });
    let journal = space.journal().unwrap();
    journal.set_gathering(false);
    let row = space.natural_write_bytes();
    let model = Rc::new(RefCell::new(Model::new(space.size_bytes())));
    let mut direct = MARK.to_vec();
    direct.resize(row as usize, 0x5a);
    model.borrow_mut().write(0, &direct);

    gate.arm();
    let direct_done = Rc::new(RefCell::new(false));
    let (done, writing) = (direct_done.clone(), space.clone());
    spawner
        .spawn_local(async move {
            writing.write(0, bytes(direct), false).await.unwrap();
            *done.borrow_mut() = true;
        })
        .unwrap();
    executor.run_until_stalled();
    assert!(
        gate.holding() && !*direct_done.borrow(),
        "the direct write is held"
    );

    // Small writes beside it, more than the ring holds.
    let written = Rc::new(RefCell::new(0u64));
    let (count, writing, writes) = (written.clone(), space.clone(), model.clone());
    spawner
        .spawn_local(async move {
            let mut rng = SplitMix64::new(41);
            let blocks = writing.size_bytes() / BLOCK;
            for _ in 0..CACHE / BLOCK {
                let offset = (row / BLOCK + rng.below(blocks - row / BLOCK)) * BLOCK;
                let data = rng.bytes(BLOCK as usize);
                writing
                    .write(offset, bytes(data.clone()), false)
                    .await
                    .unwrap();
                writes.borrow_mut().write(offset, &data);
                *count.borrow_mut() += 1;
            }
        })
        .unwrap();
    executor.run_until_stalled();
    let full = journal.status();
    assert!(
        *written.borrow() < CACHE / BLOCK && full.used_bytes * 10 >= full.bytes * 9,
        "the writer waits for room: {} writes, {full:?}",
        written.borrow()
    );

    gate.release();
    executor.run_until_stalled();
    assert!(*direct_done.borrow(), "the direct write ended");
    assert_eq!(journal.status().bypassed_bytes, row, "it bypassed the log");
    assert_eq!(
        *written.borrow(),
        CACHE / BLOCK,
        "the waiting writer went on: {:?}",
        journal.status()
    );
    let model = Rc::try_unwrap(model)
        .ok()
        .expect("writers done")
        .into_inner();
    executor.run_until(async {
        check_through_drain(&space, &model).await;
        pool.close().await.unwrap();
    });
}

/// A disk taken out of service while a write that already looked at the
/// disks (it was in service then: nothing to record for it) waits for its
/// row: the disk is marked missing only once that write has finished, so
/// the write reaches it. Marked at once, the write left it out unrecorded,
/// and the disk, taken back, caught up on nothing and kept the old row.
#[test]
fn a_disk_goes_missing_only_after_the_writes_that_looked_at_it() {
    use futures::task::LocalSpawnExt;
    use std::cell::Cell;
    use std::rc::Rc;

    let gate = Arc::new(Gate::default());
    let disks = Disks::new(4, 16 << 20);
    let devices = marked_held(&disks.devices, |_| gate.clone());
    let mut executor = Executor::new();
    let spawner = executor.spawner();
    let (pool, space) = executor.run_until(async {
        let pool = pool_on(small_config("tank"), &devices).await;
        let mut config =
            SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(1 << 20));
        config.columns = Some(1);
        config.interleave_bytes = Some(64 << 10);
        let space = pool.create_space(config).await.unwrap().space;
        space
            .write(0, bytes(vec![1; 64 << 10]), true)
            .await
            .unwrap();
        (Rc::new(pool), space)
    });
    let away = pool_disk_of_row_zero(&executor.run_until(pool.metadata()));

    // A partial-block write holds the row's lock while its write is held.
    gate.arm();
    let mut partial = MARK.to_vec();
    partial.resize(100, 2);
    let done = Rc::new(Cell::new(0));
    let (writing, finished) = (space.clone(), done.clone());
    spawner
        .spawn_local(async move {
            writing.write(0, bytes(partial), false).await.unwrap();
            finished.set(finished.get() + 1);
        })
        .unwrap();
    executor.run_until_stalled();
    assert!(gate.holding(), "the partial write holds the row");
    // A whole-block write of the row looks at the disks, then waits.
    let (writing, finished) = (space.clone(), done.clone());
    spawner
        .spawn_local(async move {
            writing
                .write(8192, bytes(vec![3; 4096]), false)
                .await
                .unwrap();
            finished.set(finished.get() + 1);
        })
        .unwrap();
    executor.run_until_stalled();
    let (leaving, gone) = (pool.clone(), Rc::new(Cell::new(false)));
    let marked = gone.clone();
    spawner
        .spawn_local(async move {
            leaving.disk_gone(away, "pulled").await.unwrap();
            marked.set(true);
        })
        .unwrap();
    executor.run_until_stalled();
    assert!(!gone.get(), "marked missing only after the waiting write");
    gate.release();
    executor.run_until_stalled();
    assert!(gone.get() && done.get() == 2);

    executor.run_until(async {
        pool.bring_back(disks.devices[usize::from(away.0)].clone())
            .await
            .unwrap();
        with_jobs(&pool, jobs_settle(&pool)).await;
        let report = verify_space(&space).await.unwrap();
        assert_eq!(report.mismatched_rows, vec![], "the disk kept the old row");
        let read = space.read(8192, 4096).await.unwrap();
        assert!(read.iter().all(|&byte| byte == 3));
    });
}

/// A write still under way when its space is deleted never lands in a
/// space created after: the deleted space's slabs stay out of allocations
/// until the requests that may still use them are done, and are taken
/// again after.
#[test]
fn a_deleted_space_s_slabs_wait_for_its_requests_under_way() {
    use futures::task::LocalSpawnExt;
    use std::cell::Cell;
    use std::rc::Rc;

    let gate = Arc::new(Gate::default());
    let disks = Disks::new(4, 16 << 20);
    let devices = marked_held(&disks.devices, |_| gate.clone());
    let config = |name: &str, size| {
        let mut config = SpaceConfig::new(name, Layout::Mirror { copies: 2 }, size);
        config.columns = Some(1);
        config
    };
    let mut executor = Executor::new();
    let spawner = executor.spawner();
    let (pool, space) = executor.run_until(async {
        let pool = pool_on(small_config("tank"), &devices).await;
        let space = pool
            .create_space(config("a", SpaceSize::Bytes(1 << 20)))
            .await
            .unwrap()
            .space;
        (Rc::new(pool), space)
    });
    let deleted = space_slabs(&executor.run_until(pool.metadata()), "a");

    gate.arm();
    let mut data = MARK.to_vec();
    data.resize(64 << 10, 7);
    let done = Rc::new(Cell::new(false));
    let finished = done.clone();
    spawner
        .spawn_local(async move {
            // Refused or not, once it is under way when the space goes.
            let _ = space.write(0, bytes(data), false).await;
            finished.set(true);
        })
        .unwrap();
    executor.run_until_stalled();
    assert!(gate.holding(), "the write is under way");

    let after = executor.run_until(async {
        pool.delete_space("a").await.unwrap();
        let after = pool
            .create_space(config("b", SpaceSize::Bytes(1 << 20)))
            .await
            .unwrap()
            .space;
        let taken = space_slabs(&pool.metadata().await, "b");
        assert!(
            taken.is_disjoint(&deleted),
            "a slab the write may still reach was handed out: {taken:?} and {deleted:?}"
        );
        after
    });
    gate.release();
    executor.run_until_stalled();
    assert!(done.get());

    executor.run_until(async {
        let read = after.read(0, 1 << 20).await.unwrap();
        assert!(read.iter().all(|&byte| byte == 0), "b took a's late write");
        // Nothing holds the slabs any more: the rest of the pool, theirs
        // included, goes to the next space.
        pool.create_space(config("c", SpaceSize::Max))
            .await
            .unwrap();
        let taken = space_slabs(&pool.metadata().await, "c");
        assert!(taken.is_superset(&deleted), "{taken:?} and {deleted:?}");
    });
}

/// The disk holding the first copy of row 0 of space "m".
fn pool_disk_of_row_zero(
    metadata: &terrace_engine::meta::PoolMetadata,
) -> terrace_engine::meta::DiskIndex {
    metadata.space("m").unwrap().extents[0]
        .slabs
        .as_ref()
        .unwrap()[0]
        .disk
}

/// Counts the reads, flushes and FUA writes that reach a device.
struct Counting {
    inner: Arc<dyn BlockDevice>,
    reads: AtomicU64,
    flushes: AtomicU64,
    fua_writes: AtomicU64,
    /// What it answers to `cheap_fua`.
    cheap: bool,
    /// Reads pass this gate, if any.
    gate: Option<Arc<Gate>>,
    /// Zeroing passes this gate, if any: a new log's writes of zeroes (a
    /// slab's worth at a time, on journal disks) and write-zeroes.
    zero_gate: Option<Arc<Gate>>,
    /// A journal disk (the 7th and later).
    journal: bool,
    /// What it answers to `allocates_on_first_write`.
    allocates: bool,
    /// Slabs written whole with zeroes on a journal disk: a new log's
    /// slabs written ahead.
    zeroed_slabs: AtomicU64,
}

/// `devices` behind counting wrappers that answer `cheap` to `cheap_fua`
/// (the journal disks' reads passing `gate`, if given), and the same as
/// plain devices.
fn counted(
    devices: Vec<Arc<dyn BlockDevice>>,
    cheap: bool,
    gate: Option<Arc<Gate>>,
) -> (Vec<Arc<Counting>>, Vec<Arc<dyn BlockDevice>>) {
    counted_gates(devices, cheap, gate, None)
}

/// As [`counted`], zeroing passing `zero_gate`, if given.
fn counted_gates(
    devices: Vec<Arc<dyn BlockDevice>>,
    cheap: bool,
    gate: Option<Arc<Gate>>,
    zero_gate: Option<Arc<Gate>>,
) -> (Vec<Arc<Counting>>, Vec<Arc<dyn BlockDevice>>) {
    counting(devices, cheap, gate, zero_gate, true)
}

/// As [`counted`], answering `allocates` to `allocates_on_first_write`
/// (the others answer yes, as files do).
fn counted_allocating(
    devices: Vec<Arc<dyn BlockDevice>>,
    allocates: bool,
) -> (Vec<Arc<Counting>>, Vec<Arc<dyn BlockDevice>>) {
    counting(devices, false, None, None, allocates)
}

fn counting(
    devices: Vec<Arc<dyn BlockDevice>>,
    cheap: bool,
    gate: Option<Arc<Gate>>,
    zero_gate: Option<Arc<Gate>>,
    allocates: bool,
) -> (Vec<Arc<Counting>>, Vec<Arc<dyn BlockDevice>>) {
    let counting: Vec<Arc<Counting>> = devices
        .into_iter()
        .enumerate()
        .map(|(i, inner)| {
            Arc::new(Counting {
                inner,
                reads: Default::default(),
                flushes: Default::default(),
                fua_writes: Default::default(),
                cheap,
                gate: gate.clone().filter(|_| i >= 6),
                zero_gate: zero_gate.clone(),
                journal: i >= 6,
                allocates,
                zeroed_slabs: Default::default(),
            })
        })
        .collect();
    let plain = as_devices(&counting);
    (counting, plain)
}

impl BlockDevice for Counting {
    terrace_io::forward_device_answers!(inner: name, size_bytes, alignment);

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let Some(wait) = self.gate.as_ref().and_then(|gate| gate.pass()) else {
            return self.inner.read(offset, buf);
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            let _ = wait.await;
            inner.read(offset, buf).await
        })
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        let zeroes =
            self.journal && data.len() as u64 == SLAB && data.iter().all(|&byte| byte == 0);
        if zeroes {
            self.zeroed_slabs.fetch_add(1, Ordering::Relaxed);
        }
        let wait = self
            .zero_gate
            .as_ref()
            .filter(|_| zeroes)
            .and_then(|gate| gate.pass());
        write_after(wait, &self.inner, offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        let Some(wait) = self.zero_gate.as_ref().and_then(|gate| gate.pass()) else {
            return self.inner.write_zeroes(offset, length, fua);
        };
        if let Some(gate) = &self.zero_gate {
            *gate.held_at.lock().unwrap() = Some(self.name().to_string());
        }
        let inner = self.inner.clone();
        Box::pin(async move {
            let _ = wait.await;
            inner.write_zeroes(offset, length, fua).await
        })
    }
    fn flush(&self) -> BoxFuture<IoResult<()>> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
    fn cheap_fua(&self) -> bool {
        self.cheap
    }
    fn allocates_on_first_write(&self) -> bool {
        self.allocates
    }
}

/// A logged write alone (nothing before it still waiting to be durable)
/// goes to the log with FUA and needs no flush of the log's disks after it;
/// writes in flight together still share one flush. Either way, after a
/// power cut every acknowledged write reads back.
#[test]
fn a_lone_logged_write_is_written_with_fua_instead_of_flushed() {
    fua_records(false);
}

/// Where the log's disks say FUA costs them nothing, every record is
/// written with FUA, writes in flight together included, and the log's
/// disks are never flushed behind them; after a power cut every
/// acknowledged write reads back.
#[test]
fn every_record_is_written_with_fua_where_the_disks_say_it_is_cheap() {
    fua_records(true);
}

fn fua_records(cheap: bool) {
    block_on(async {
        let (crash, plain) = crash_devices(if cheap { "fua-cheap" } else { "fua" });
        // Slow enough that writes issued together are in flight together.
        let policy = DelayPolicy {
            write_ns: 300_000,
            flush_ns: 100_000,
            ..DelayPolicy::default()
        };
        let delayed = plain
            .iter()
            .map(|inner| {
                Arc::new(DelayDevice::new(inner.clone(), env(), policy)) as Arc<dyn BlockDevice>
            })
            .collect();
        let (counting, devices) = counted(delayed, cheap, None);
        let journal_disks = &counting[6..];
        let count = |pick: fn(&Counting) -> u64| journal_disks.iter().map(|c| pick(c)).sum::<u64>();
        let flushes = |c: &Counting| c.flushes.load(Ordering::Relaxed);
        let fua_writes = |c: &Counting| c.fua_writes.load(Ordering::Relaxed);
        let mut model;
        {
            let pool = log_pool(&devices).await;
            let space = cached_space(&pool, "fua", Layout::Parity { redundancy: 1 }).await;
            model = Model::new(space.size_bytes());
            let mut rng = SplitMix64::new(41);
            let (flushed, fua) = (count(flushes), count(fua_writes));
            for i in 0..20u64 {
                let data = rng.bytes(BLOCK as usize);
                space
                    .write(i * 3 * BLOCK, bytes(data.clone()), false)
                    .await
                    .unwrap();
                model.write(i * 3 * BLOCK, &data);
            }
            assert_eq!(count(flushes), flushed, "no flush of the log's disks");
            // Each record on both log copies, with FUA.
            assert_eq!(count(fua_writes) - fua, 40);
            // Sixteen at once: most wait for one another's group commit,
            // unless every record goes with FUA.
            let (flushed, fua) = (count(flushes), count(fua_writes));
            let writes: Vec<(u64, Vec<u8>)> = (0..16u64)
                .map(|i| (i * 5 * BLOCK + 4096 * 64, rng.bytes(BLOCK as usize)))
                .collect();
            write_together(&space, &mut model, &writes).await;
            if cheap {
                // Writes in flight together share records: each on both
                // copies, with FUA.
                assert_eq!(count(flushes), flushed, "no flush of the log's disks");
                let records = count(fua_writes) - fua;
                assert!(records >= 2 && records % 2 == 0, "{records} FUA writes");
            } else {
                assert!(count(flushes) > flushed, "the group commit flushed");
            }
        }
        cut_and_check(&crash, &plain, 5, "fua", &model, 5).await;
    });
}

/// Holds every write and flush of the devices sharing it while on, until
/// released: the requests in flight on a disk at the moment it is lost.
#[derive(Default)]
struct Hold {
    on: AtomicBool,
    waiting: std::sync::Mutex<Vec<futures::channel::oneshot::Sender<()>>>,
}

impl Hold {
    /// For a request arriving: what to wait for, if requests are held.
    fn pass(&self) -> Option<futures::channel::oneshot::Receiver<()>> {
        if !self.on.load(Ordering::SeqCst) {
            return None;
        }
        let (open, wait) = futures::channel::oneshot::channel();
        self.waiting.lock().unwrap().push(open);
        Some(wait)
    }

    fn held(&self) -> usize {
        self.waiting.lock().unwrap().len()
    }

    /// Let every held request go on, and hold no more.
    fn release(&self) {
        self.on.store(false, Ordering::SeqCst);
        for open in self.waiting.lock().unwrap().drain(..) {
            let _ = open.send(());
        }
    }
}

/// A device whose writes and flushes wait at a [`Hold`].
struct HeldDevice {
    inner: Arc<dyn BlockDevice>,
    hold: Arc<Hold>,
    cheap_fua: bool,
}

impl BlockDevice for HeldDevice {
    terrace_engine::io::forward_device_answers!(inner: name, size_bytes, alignment);

    fn cheap_fua(&self) -> bool {
        self.cheap_fua
    }
    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        write_after(self.hold.pass(), &self.inner, offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        self.inner.write_zeroes(offset, length, fua)
    }
    fn flush(&self) -> BoxFuture<IoResult<()>> {
        let Some(wait) = self.hold.pass() else {
            return self.inner.flush();
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            let _ = wait.await;
            inner.flush().await
        })
    }
}

/// The last copy of a log lost with writes in flight (records written to
/// it, group commits, writes still to be logged; partial rows, whole
/// interleaves and whole rows) and nowhere to re-mirror it: every write
/// completes write-through and reads back, and parity agrees.
#[test]
fn writes_in_flight_when_the_last_log_copy_fails_complete_write_through() {
    for cheap_fua in [false, true] {
        writes_in_flight_when_the_log_fails(cheap_fua);
    }
}

fn writes_in_flight_when_the_log_fails(cheap_fua: bool) {
    use futures::task::LocalSpawnExt;
    use std::cell::RefCell;
    use std::rc::Rc;

    // Six capacity disks and two journal disks: the log's two copies fill
    // the journal disks, and no job runs to re-mirror it elsewhere.
    let mut sizes = vec![CAPACITY_BYTES; 6];
    sizes.extend([JOURNAL_BYTES; 2]);
    let wrapped: Vec<FaultDevice> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let name = format!("inflight-{cheap_fua}-{i}");
            FaultDevice::new(Arc::new(MemoryDevice::new(name, size)))
        })
        .collect();
    let faults: Vec<FaultControls> = wrapped.iter().map(FaultDevice::controls).collect();
    let hold = Arc::new(Hold::default());
    let devices: Vec<Arc<dyn BlockDevice>> = wrapped
        .into_iter()
        .enumerate()
        .map(|(i, device)| {
            // Only the log's last disk holds its requests.
            let hold = if i == 7 { hold.clone() } else { Arc::default() };
            Arc::new(HeldDevice {
                inner: Arc::new(device),
                hold,
                cheap_fua,
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let mut executor = Executor::new();
    let spawner = executor.spawner();
    let layout = Layout::Parity { redundancy: 1 };
    let mut config = cached("s", layout, 16 << 20);
    config.interleave_bytes = Some(64 << 10);
    // A ring that the writes in flight fill: later ones wait for room.
    config.cache_bytes = Some(1 << 20);
    let (pool, space) = pool_and_space(&mut executor, &devices, config);
    let journal = space.journal().unwrap();
    journal.set_gathering(false);
    let metadata = executor.run_until(pool.metadata());
    let log = metadata.space(journal.log().name()).unwrap();
    let log_disks: BTreeSet<usize> = ExtentRecord::slabs_of(&log.extents)
        .map(|slab| usize::from(slab.disk.0))
        .collect();
    assert_eq!(log_disks, BTreeSet::from([6, 7]), "the log's copies");
    let interleave = 64 << 10;
    let row = space.natural_write_bytes();
    assert!(row > interleave, "rows of several interleaves: {row}");
    let model = Rc::new(RefCell::new(Model::new(space.size_bytes())));
    let mut rng = SplitMix64::new(43);
    // Partial-row writes of a block to a whole interleave, and whole rows;
    // the writes of a wave are apart, so any order of them is the same.
    let mut disjoint = move |count: usize, space_bytes: u64| {
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        while writes.len() < count {
            let (offset, length) = match rng.below(5) {
                0 => (rng.below(space_bytes / interleave) * interleave, interleave),
                1 => (rng.below(space_bytes / row) * row, row),
                2 => (rng.below(space_bytes / BLOCK) * BLOCK, BLOCK),
                _ => {
                    let length = (1 + rng.below(interleave / BLOCK)) * BLOCK;
                    (rng.below((space_bytes - length) / BLOCK) * BLOCK, length)
                }
            };
            let apart = writes
                .iter()
                .all(|(o, d)| offset + length <= *o || o + d.len() as u64 <= offset);
            if apart {
                writes.push((offset, rng.bytes(length as usize)));
            }
        }
        writes
    };
    let size = space.size_bytes();
    let wave = |spawner: &futures::executor::LocalSpawner,
                writes: Vec<(u64, Vec<u8>)>,
                failures: Rc<RefCell<Vec<String>>>| {
        for (offset, data) in writes {
            let (space, model, failures) = (space.clone(), model.clone(), failures.clone());
            spawner
                .spawn_local(async move {
                    let length = data.len();
                    match space.write(offset, bytes(data.clone()), false).await {
                        Ok(()) => model.borrow_mut().write(offset, &data),
                        Err(error) => failures
                            .borrow_mut()
                            .push(format!("{length} bytes at {offset}: {error}")),
                    }
                })
                .unwrap();
        }
    };
    let failures = Rc::new(RefCell::new(Vec::new()));
    // Every write has finished: none holds the model any more.
    let all_done = |model: &Rc<RefCell<Model>>| Rc::strong_count(model) == 1;

    // Logged writes, then the first journal disk lost: the log goes on.
    wave(&spawner, disjoint(64, size), failures.clone());
    executor.run_until_stalled();
    faults[6].lose();
    wave(&spawner, disjoint(16, size), failures.clone());
    executor.run_until_stalled();
    assert!(all_done(&model));
    assert_eq!(*failures.borrow(), Vec::<String>::new());
    assert_eq!(journal.status().write_through, None);

    // Writes in flight, held at the log's last disk; it is lost.
    let mut in_flight = disjoint(48, size);
    let arriving = in_flight.split_off(32);
    hold.on.store(true, Ordering::SeqCst);
    wave(&spawner, in_flight, failures.clone());
    executor.run_until_stalled();
    assert!(hold.held() > 0, "writes are held at the log");
    // The records held fill the ring (a quarter is kept for row images):
    // the writes after them wait for room.
    let full = journal.status();
    assert!(full.used_bytes * 10 >= full.bytes * 7, "{full:?}");
    faults[7].lose();
    // More arrive while the held ones fail.
    wave(&spawner, arriving, failures.clone());
    hold.release();
    executor.run_until_stalled();
    assert!(all_done(&model));
    assert_eq!(
        *failures.borrow(),
        Vec::<String>::new(),
        "cheap_fua {cheap_fua}"
    );
    let status = journal.status();
    assert!(status.write_through.is_some(), "{status:?}");

    // Write-through from now on.
    wave(&spawner, disjoint(16, size), failures.clone());
    executor.run_until_stalled();
    assert!(all_done(&model));
    assert_eq!(*failures.borrow(), Vec::<String>::new());
    let model = Rc::try_unwrap(model)
        .ok()
        .expect("writers done")
        .into_inner();
    executor.run_until(async {
        check_all(&space, &model).await;
        space.flush().await.unwrap();
        assert_eq!(journal.status().dirty_bytes, 0);
        assert_consistent(&space, 43).await;
        pool.close().await.unwrap();
    });
}

/// A writer that finds no room in the ring for its record waits its turn:
/// a smaller record arriving after it, for which there is room, waits
/// behind it instead of passing it, and both go on once destaging frees
/// the ring.
#[test]
fn writers_waiting_for_ring_room_go_in_arrival_order() {
    use futures::task::LocalSpawnExt;
    use std::cell::RefCell;
    use std::rc::Rc;

    let hold = Arc::new(Hold::default());
    let devices: Vec<Arc<dyn BlockDevice>> = memory_devices("turns")
        .into_iter()
        .enumerate()
        .map(|(i, inner)| {
            // The capacity disks hold their writes while on: destaging
            // cannot free the ring.
            let hold = if i < CAPACITY_DISKS {
                hold.clone()
            } else {
                Arc::default()
            };
            Arc::new(HeldDevice {
                inner,
                hold,
                cheap_fua: false,
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let mut executor = Executor::new();
    let spawner = executor.spawner();
    // Rows of 64 KiB: every write below is part of a row, logged.
    let mut config = cached("turns", Layout::Mirror { copies: 2 }, 16 << 20);
    config.columns = Some(1);
    config.interleave_bytes = Some(64 << 10);
    config.cache_bytes = Some(1 << 20);
    let (pool, space) = pool_and_space(&mut executor, &devices, config);
    let journal = space.journal().unwrap();
    journal.set_gathering(false);
    hold.on.store(true, Ordering::SeqCst);
    // Block writes (a record of two blocks each) until the ring has room
    // for less than the large record below, and for more than a small one.
    let large: u64 = 48 << 10;
    let mut offset = 0;
    executor.run_until(async {
        loop {
            let status = journal.status();
            if status.bytes - status.used_bytes < large + 2 * BLOCK {
                break;
            }
            space
                .write(offset, bytes(vec![1; 4096]), false)
                .await
                .unwrap();
            offset += BLOCK;
        }
    });
    let done = Rc::new(RefCell::new(Vec::new()));
    for (name, at, length) in [("large", offset, large), ("small", offset + large, BLOCK)] {
        let (space, done) = (space.clone(), done.clone());
        spawner
            .spawn_local(async move {
                space
                    .write(at, bytes(vec![2; length as usize]), false)
                    .await
                    .unwrap();
                done.borrow_mut().push(name);
            })
            .unwrap();
        executor.run_until_stalled();
    }
    assert!(
        hold.held() > 0,
        "the large write destages, held at the disks"
    );
    assert_eq!(*done.borrow(), Vec::<&str>::new(), "the small write passed");
    hold.release();
    executor.run_until_stalled();
    let mut finished = done.borrow().clone();
    finished.sort_unstable();
    assert_eq!(finished, vec!["large", "small"]);
    executor.run_until(async {
        space.flush().await.unwrap();
        let read = space.read(offset, large + BLOCK).await.unwrap();
        assert!(read.iter().all(|&byte| byte == 2));
        pool.close().await.unwrap();
    });
}
