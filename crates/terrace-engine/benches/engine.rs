//! Engine throughput on memory disks, beside the raw memory-disk throughput
//! for the same bytes in the same run.
//!
//! `raw` issues to the memory devices exactly the device operations a
//! request becomes (for 1 MiB on 4 columns of 256 KiB: four 256 KiB
//! operations on four devices), with no engine in between; the engine line
//! for the same request shows what layout, splitting and locking add.
//!
//! Run: `cargo bench -p terrace-engine --bench engine`

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::executor::block_on;
use futures::future::join_all;
use terrace_engine::io::memory::MemoryDevice;
use terrace_engine::io::{aligned_buffer, BlockDevice, Bytes, SystemEnv};
use terrace_engine::layout::Layout;
use terrace_engine::{NewDisk, Pool, PoolConfig, Space, SpaceConfig, SpaceSize};

const DISKS: usize = 4;
const DISK_BYTES: u64 = 256 << 20;
const SPACE_BYTES: u64 = 64 << 20;
const REQUEST_BYTES: u64 = 1 << 20;
const INTERLEAVE: u64 = 256 << 10;

fn pool(disks: &[Arc<MemoryDevice>]) -> Pool {
    let mut config = PoolConfig::new("bench");
    config.slab_bytes = 16 << 20;
    config.metadata_slot_bytes = 256 << 10;
    let new_disks = disks
        .iter()
        .map(|disk| NewDisk::new(disk.clone() as Arc<dyn BlockDevice>))
        .collect();
    block_on(Pool::create(Arc::new(SystemEnv::new()), config, new_disks)).expect("pool")
}

fn space(pool: &Pool, name: &str, layout: Layout, columns: u32) -> Arc<Space> {
    let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(SPACE_BYTES));
    config.columns = Some(columns);
    config.interleave_bytes = Some(INTERLEAVE);
    block_on(pool.create_space(config)).expect("space").space
}

fn memory_disks() -> Vec<Arc<MemoryDevice>> {
    (0..DISKS)
        .map(|i| Arc::new(MemoryDevice::new(format!("memory:{i}"), DISK_BYTES)))
        .collect()
}

fn sequential_reads(c: &mut Criterion) {
    let disks = memory_disks();
    let pool = pool(&disks);
    let simple = space(&pool, "simple", Layout::Simple, DISKS as u32);
    // Touch the raw region first: never-written memory maps the shared zero
    // page, which would make the baseline read from cache.
    for disk in &disks {
        block_on(disk.write(
            8 << 20,
            Bytes::from(vec![1u8; (DISK_BYTES / 2) as usize]),
            false,
        ))
        .unwrap();
    }
    let mut group = c.benchmark_group("read-1MiB");
    group.throughput(Throughput::Bytes(REQUEST_BYTES));
    let pieces = (REQUEST_BYTES / INTERLEAVE) as usize;
    let mut offset = 0u64;
    group.bench_function(BenchmarkId::new("raw-memory", "4x256K"), |b| {
        b.iter(|| {
            offset = (offset + INTERLEAVE) % (DISK_BYTES / 2);
            // One aligned buffer cut into the pieces and joined again, as the engine does.
            let mut buffer = aligned_buffer(REQUEST_BYTES as usize);
            let parts: Vec<_> = (0..pieces)
                .map(|_| buffer.split_to(INTERLEAVE as usize))
                .collect();
            let reads = parts
                .into_iter()
                .enumerate()
                .map(|(i, part)| disks[i % DISKS].read(offset + (8 << 20), part));
            let mut whole = aligned_buffer(0);
            for (index, (part, result)) in block_on(join_all(reads)).into_iter().enumerate() {
                result.unwrap();
                if index == 0 {
                    whole = part;
                } else {
                    whole.unsplit(part);
                }
            }
            whole
        })
    });
    let mut position = 0u64;
    group.bench_function(BenchmarkId::new("engine", "simple-4col"), |b| {
        b.iter(|| {
            position = (position + REQUEST_BYTES) % SPACE_BYTES;
            block_on(simple.read(position, REQUEST_BYTES)).unwrap()
        })
    });
    group.finish();
}

fn writes(c: &mut Criterion) {
    let disks = memory_disks();
    let pool = pool(&disks);
    let simple = space(&pool, "simple", Layout::Simple, DISKS as u32);
    let mirror = space(&pool, "mirror", Layout::Mirror { copies: 2 }, 2);
    let parity = space(
        &pool,
        "parity",
        Layout::Parity { redundancy: 1 },
        DISKS as u32,
    );
    let data = Bytes::from(vec![0xa5u8; REQUEST_BYTES as usize]);
    let mut group = c.benchmark_group("write-1MiB");
    group.throughput(Throughput::Bytes(REQUEST_BYTES));
    let pieces = (REQUEST_BYTES / INTERLEAVE) as usize;
    let mut offset = 0u64;
    group.bench_function(BenchmarkId::new("raw-memory", "4x256K"), |b| {
        b.iter(|| {
            offset = (offset + INTERLEAVE) % (DISK_BYTES / 2);
            let writes = (0..pieces).map(|i| {
                let start = i * INTERLEAVE as usize;
                disks[i % DISKS].write(
                    offset + (8 << 20),
                    data.slice(start..start + INTERLEAVE as usize),
                    false,
                )
            });
            for result in block_on(join_all(writes)) {
                result.unwrap();
            }
        })
    });
    for (name, space, stride) in [
        ("simple-4col", &simple, REQUEST_BYTES),
        ("mirror-2col-x2", &mirror, REQUEST_BYTES),
        // 3+1 parity: a full row is 768 KiB; write full rows only.
        ("parity-3+1-full-rows", &parity, 3 * INTERLEAVE),
    ] {
        let mut position = 0u64;
        let payload = data.slice(..stride as usize);
        group.throughput(Throughput::Bytes(stride));
        group.bench_function(BenchmarkId::new("engine", name), |b| {
            b.iter(|| {
                position = (position + stride) % (SPACE_BYTES / stride * stride);
                block_on(space.write(position, payload.clone(), false)).unwrap()
            })
        });
    }
    group.finish();
}

fn small_parity_writes(c: &mut Criterion) {
    let disks = memory_disks();
    let pool = pool(&disks);
    let parity = space(
        &pool,
        "parity",
        Layout::Parity { redundancy: 2 },
        DISKS as u32,
    );
    let data = Bytes::from(vec![0x3cu8; 4096]);
    let mut group = c.benchmark_group("write-4KiB-random");
    group.throughput(Throughput::Bytes(4096));
    let mut state = 1u64;
    group.bench_function(BenchmarkId::new("engine", "parity-2+2-rmw"), |b| {
        b.iter(|| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let offset = (state >> 20) % (SPACE_BYTES / 4096) * 4096;
            block_on(parity.write(offset, data.clone(), false)).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, sequential_reads, writes, small_parity_writes);
criterion_main!(benches);
