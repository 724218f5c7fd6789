//! `terrace demo`: the whole engine on a pool of sparse files, no setup.
//!
//! Builds 8 HDD-like and 3 SSD-like sparse files, pools them, carves a
//! 2-way mirror and a dual-parity space, writes generated data with many
//! requests in flight, reads it back and compares, restarts the pool with
//! one disk left out to show degraded reads, and prints `pool status`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt, TryStreamExt};
use terrace_engine::io::file::{create_sparse_file, FileDevice, FileOptions};
use terrace_engine::io::{BlockDevice, Bytes, Env, SystemEnv};
use terrace_engine::layout::Layout;
use terrace_engine::meta::{Media, Usage};
use terrace_engine::{ImportOptions, NewDisk, Pool, PoolConfig, Space, SpaceConfig, SpaceSize};

use crate::render;
use crate::units::format_size;
use crate::CliError;

const HDD_COUNT: usize = 8;
const SSD_COUNT: usize = 3;
/// Sparse files cost nothing until written; these sizes give the default
/// 256 MiB slabs room to spread.
const HDD_BYTES: u64 = 8 << 30;
const SSD_BYTES: u64 = 2 << 30;
/// Requests in flight while writing and verifying.
const QUEUE_DEPTH: usize = 32;
const REQUEST_BYTES: u64 = 1 << 20;

pub struct DemoOptions {
    pub directory: PathBuf,
    pub data_bytes: u64,
}

fn disk_files(directory: &Path) -> Vec<(PathBuf, Media, u64)> {
    let hdds = (0..HDD_COUNT).map(|i| {
        (
            directory.join(format!("hdd-{i}.img")),
            Media::Hdd,
            HDD_BYTES,
        )
    });
    let ssds = (0..SSD_COUNT).map(|i| {
        (
            directory.join(format!("ssd-{i}.img")),
            Media::Ssd,
            SSD_BYTES,
        )
    });
    hdds.chain(ssds).collect()
}

fn open(path: &Path) -> Result<Arc<dyn BlockDevice>, CliError> {
    Ok(Arc::new(FileDevice::open(path, FileOptions::default())?))
}

/// Deterministic data for request `index` of a space, so verification needs
/// no copy of what was written.
fn pattern(space: &str, index: u64) -> Bytes {
    let mut state = index.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ space.len() as u64 ^ 0x007e_7ace;
    let mut data = Vec::with_capacity(REQUEST_BYTES as usize);
    while data.len() < REQUEST_BYTES as usize {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    Bytes::from(data)
}

async fn write_all(space: &Space, requests: u64) -> Result<(), CliError> {
    stream::iter(0..requests)
        .map(|index| space.write(index * REQUEST_BYTES, pattern(space.name(), index), false))
        .buffer_unordered(QUEUE_DEPTH)
        .try_collect::<Vec<()>>()
        .await?;
    space.flush().await?;
    Ok(())
}

async fn verify_all(space: &Space, requests: u64) -> Result<(), CliError> {
    stream::iter(0..requests)
        .map(|index| async move {
            let read = space.read(index * REQUEST_BYTES, REQUEST_BYTES).await?;
            if read[..] != pattern(space.name(), index)[..] {
                return Err(CliError::Verify {
                    space: space.name().to_string(),
                    offset: index * REQUEST_BYTES,
                });
            }
            Ok(())
        })
        .buffer_unordered(QUEUE_DEPTH)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn rate(bytes: u64, started: Instant) -> String {
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    format!("{}/s", format_size((bytes as f64 / seconds) as u64))
}

pub async fn run(options: DemoOptions) -> Result<(), CliError> {
    let env: Arc<dyn Env> = Arc::new(SystemEnv::new());
    std::fs::create_dir_all(&options.directory)?;
    let files = disk_files(&options.directory);
    println!(
        "creating {} sparse disk files in {}",
        files.len(),
        options.directory.display()
    );
    let mut disks = Vec::new();
    for (path, media, size) in &files {
        let _ = std::fs::remove_file(path);
        create_sparse_file(path, *size)?;
        let mut disk = NewDisk::new(open(path)?);
        disk.media = *media;
        disk.usage = Usage::Auto;
        disks.push(disk);
    }
    let pool = Pool::create(env.clone(), PoolConfig::new("demo"), disks).await?;
    let requests = options.data_bytes.div_ceil(REQUEST_BYTES);
    let size = SpaceSize::Bytes(requests * REQUEST_BYTES);
    for (name, layout) in [
        ("mirror", Layout::Mirror { copies: 2 }),
        ("parity", Layout::Parity { redundancy: 2 }),
    ] {
        let created = pool
            .create_space(SpaceConfig::new(name, layout, size))
            .await?;
        println!("space {name}: {layout}, {}", created.columns_reason);
        let started = Instant::now();
        write_all(&created.space, requests).await?;
        println!(
            "  wrote {} ({} requests of 1M, {QUEUE_DEPTH} in flight): {}",
            format_size(requests * REQUEST_BYTES),
            requests,
            rate(requests * REQUEST_BYTES, started)
        );
        let started = Instant::now();
        verify_all(&created.space, requests).await?;
        println!(
            "  read back and verified: {}",
            rate(requests * REQUEST_BYTES, started)
        );
    }
    pool.close().await?;
    let left_out = &files[2].0;
    println!(
        "\nrestarting the pool without {} (as if that drive had died)",
        left_out.display()
    );
    let devices = files
        .iter()
        .filter(|(path, _, _)| path != left_out)
        .map(|(path, _, _)| open(path))
        .collect::<Result<Vec<_>, _>>()?;
    let pool = Pool::import(env, devices, ImportOptions::default()).await?;
    for space in pool.spaces() {
        let started = Instant::now();
        verify_all(&space, requests).await?;
        println!(
            "  {}: every byte verified while degraded: {}",
            space.name(),
            rate(requests * REQUEST_BYTES, started)
        );
    }
    println!("\n{}", render::pool_status(&pool.status().await));
    pool.close().await?;
    println!(
        "the disk files stay in {} (sparse: `du -sh` shows what they really use).",
        options.directory.display()
    );
    Ok(())
}
