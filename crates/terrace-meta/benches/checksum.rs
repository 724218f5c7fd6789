//! Block checksum candidates on 4 KiB blocks, against a memory copy of the
//! same block.
//!
//! The block checksum is computed for every block written and verified for
//! every block read, so its cost per 4 KiB is what matters: CRC32C (with
//! the CPU's instruction where it has one, as the `crc32c` crate picks at
//! run time) against xxh3 (64 and 128 bits), as `xxhash-rust` compiles it
//! for the baseline CPU (SSE2) and as `twox-hash` picks the CPU's widest
//! vectors at run time (the one block sums use). Every case reports throughput
//! in the block's bytes, and `memcpy` copies the same 4 KiB, so a checksum
//! at memcpy speed costs no more than moving the block once.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use terrace_io::random::SplitMix64;

const BLOCK_BYTES: usize = 4096;

fn checksums(criterion: &mut Criterion) {
    let block = SplitMix64::new(0x5eed).bytes(BLOCK_BYTES);
    let mut copy = vec![0u8; BLOCK_BYTES];
    let mut group = criterion.benchmark_group("4KiB");
    group.throughput(Throughput::Bytes(BLOCK_BYTES as u64));
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            copy.copy_from_slice(black_box(&block));
            black_box(&copy);
        })
    });
    group.bench_function("crc32c", |b| b.iter(|| crc32c::crc32c(black_box(&block))));
    group.bench_function("xxh3-64", |b| {
        b.iter(|| xxhash_rust::xxh3::xxh3_64(black_box(&block)))
    });
    group.bench_function("xxh3-64-runtime-simd", |b| {
        b.iter(|| twox_hash::XxHash3_64::oneshot(black_box(&block)))
    });
    group.bench_function("xxh3-128", |b| {
        b.iter(|| xxhash_rust::xxh3::xxh3_128(black_box(&block)))
    });
    group.finish();
}

criterion_group!(benches, checksums);
criterion_main!(benches);
