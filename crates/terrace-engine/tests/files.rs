//! A pool on sparse files through the real file backend: write, close,
//! import from the files again, read back byte-identical.

mod common;

use std::sync::Arc;

use common::*;
use futures::future::join_all;
use terrace_engine::io::file::{create_sparse_file, FileDevice, FileOptions};
use terrace_engine::io::BlockDevice;
use terrace_engine::layout::Layout;
use terrace_engine::{ImportOptions, NewDisk, Pool, PoolConfig, SpaceConfig, SpaceSize};

fn open_all(paths: &[std::path::PathBuf]) -> Vec<Arc<dyn BlockDevice>> {
    paths
        .iter()
        .map(|path| {
            Arc::new(FileDevice::open(path, FileOptions::default()).unwrap())
                as Arc<dyn BlockDevice>
        })
        .collect()
}

#[test]
fn a_pool_of_sparse_files_survives_close_and_import_byte_for_byte() {
    let directory = tempfile::tempdir().unwrap();
    let paths: Vec<_> = (0..5)
        .map(|i| directory.path().join(format!("disk-{i}.img")))
        .collect();
    for path in &paths {
        create_sparse_file(path, 64 << 20).unwrap();
    }
    let mut config = PoolConfig::new("files");
    config.slab_bytes = 4 << 20;
    let mut written = Vec::new();
    let mut log_bytes = 0;
    block_on(async {
        let disks = open_all(&paths).into_iter().map(NewDisk::new).collect();
        let pool = Pool::create(env(), config, disks).await.unwrap();
        for (layout, name) in layouts() {
            let space = pool
                .create_space(SpaceConfig::new(name, layout, SpaceSize::Bytes(8 << 20)))
                .await
                .unwrap()
                .space;
            let data = SplitMix64::new(name.len() as u64).bytes(8 << 20);
            // 1 MiB requests, all in flight at once.
            let writes = (0..8u64).map(|i| {
                let chunk = bytes(data[(i << 20) as usize..((i + 1) << 20) as usize].to_vec());
                let space = space.clone();
                async move { space.write(i << 20, chunk, false).await }
            });
            for result in join_all(writes).await {
                result.unwrap();
            }
            written.push((name, data));
        }
        pool.close().await.unwrap();
    });
    block_on(async {
        let pool = Pool::import(env(), open_all(&paths), ImportOptions::default())
            .await
            .unwrap();
        for (name, data) in &written {
            let space = pool.space(name).unwrap();
            let read = space.read(0, 8 << 20).await.unwrap();
            assert!(read[..] == data[..], "{name} differs after import");
        }
        let status = pool.status().await;
        assert_eq!(status.spaces.len(), 5);
        // Logs are written whole when they are made (see `Zeroing::Allocate`).
        for (_, name) in layouts() {
            if let Some(journal) = pool.space(name).unwrap().journal() {
                let log = journal.log();
                log_bytes += log.size_bytes() * u64::from(log.geometry().layout().copies());
            }
        }
        pool.close().await.unwrap();
    });
    // Otherwise files stay sparse: 5 spaces of 8 MiB with redundancy use far
    // less than 5 × 64 MiB.
    let used: u64 = paths
        .iter()
        .map(|path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(path).unwrap()) * 512)
        .sum();
    assert!(log_bytes > 0, "the parity spaces have logs");
    assert!(
        used >= log_bytes && used < log_bytes + 5 * (64 << 20) / 2,
        "files are not sparse: {used} bytes allocated, {log_bytes} of them logs"
    );
    let _ = Layout::Simple;
}
