//! Parity throughput against a plain memory copy of the same data.
//!
//! For a 6+2 stripe and a 4+1 stripe with 256 KiB columns: encoding, and
//! rebuilding as many data columns as the parity allows. Every case reports
//! throughput in data bytes (the k data columns), and `memcpy` copies the
//! same number of bytes with `copy_from_slice`, so the figures compare
//! directly: parity work that runs at memcpy speed costs no more than moving
//! the data once.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use terrace_io::random::SplitMix64;

/// 256 KiB: a typical stripe unit, large enough that per-call overhead is
/// noise, small enough that a 6+2 stripe (2 MiB) stays in a core's L2 cache
/// on current server CPUs, as it would while being written out.
const COLUMN_BYTES: usize = 256 * 1024;

/// Fixed seed so every run encodes the same bytes.
const SEED: u64 = 0x7e77_ace0;

fn random_columns(count: usize, seed: u64) -> Vec<Vec<u8>> {
    // Quick, deterministic filler; the values do not affect speed.
    let mut random = SplitMix64::new(seed);
    (0..count).map(|_| random.bytes(COLUMN_BYTES)).collect()
}

fn stripe(criterion: &mut Criterion, data_columns: usize, parity: usize) {
    let data_bytes = data_columns * COLUMN_BYTES;
    let mut group = criterion.benchmark_group(format!("{data_columns}+{parity}"));
    group.throughput(Throughput::Bytes(data_bytes as u64));

    let data = random_columns(data_columns, SEED);
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut p = vec![0u8; COLUMN_BYTES];
    let mut q = vec![0u8; COLUMN_BYTES];

    let source: Vec<u8> = data.concat();
    let mut destination = vec![0u8; data_bytes];
    group.bench_function("memcpy", |bencher| {
        bencher.iter(|| destination.copy_from_slice(black_box(&source)))
    });
    group.bench_function("encode_pq", |bencher| {
        bencher.iter(|| terrace_ec::encode_pq(black_box(&slices), &mut p, &mut q))
    });
    // The fallback other CPUs get, for comparison.
    group.bench_function("encode_pq portable", |bencher| {
        bencher.iter(|| terrace_ec::portable::encode_pq(black_box(&slices), &mut p, &mut q))
    });
    group.bench_function("encode_p", |bencher| {
        bencher.iter(|| terrace_ec::encode_p(black_box(&slices), &mut p))
    });

    // A whole encoded stripe, then the first `parity` data columns rebuilt
    // over and over (the result is the same each time; the erased buffers are
    // overwritten without being read).
    let mut columns = data.clone();
    terrace_ec::encode_pq(&slices, &mut p, &mut q);
    columns.push(p.clone());
    if parity == 2 {
        columns.push(q.clone());
    }
    let erased: Vec<usize> = (0..parity).collect();
    let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
    let name = format!("reconstruct {parity} data");
    group.bench_function(name, |bencher| {
        bencher.iter(|| {
            terrace_ec::reconstruct(black_box(&mut views), parity, &erased).expect("valid request")
        })
    });
    group.finish();
    assert!(
        columns[..data_columns] == data[..],
        "reconstruct rebuilt the data"
    );
}

fn parity(criterion: &mut Criterion) {
    eprintln!("implementation: {}", terrace_ec::implementation());
    stripe(criterion, 6, 2);
    stripe(criterion, 4, 1);
}

criterion_group!(benches, parity);
criterion_main!(benches);
