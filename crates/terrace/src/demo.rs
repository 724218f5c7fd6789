//! `terrace demo`: the whole system on a pool of sparse files, no setup.
//!
//! Starts a daemon in this process (sockets and state in the demo folder),
//! creates 8 HDD-like and 3 SSD-like sparse files and pools them through the
//! control socket (the SSDs as journal disks), creates a 2-way mirror and a
//! dual-parity space, each with a write-back cache on the SSDs, writes
//! generated data through NBD with many requests in flight, flushes, reads
//! it back and compares; then exports the pool, imports it again with one
//! disk left out, verifies every byte again through NBD from the degraded
//! spaces, prints `pool status` and how to connect, and serves until Ctrl-C
//! (or stops at once with `--exit`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt, TryStreamExt};
use terrace_engine::io::file::create_sparse_file;
use terrace_engine::io::random::{spread, SplitMix64};
use terrace_engine::io::SystemEnv;

use crate::api::{DiskSpec, PoolView, Request, SpaceCreate};
use crate::cli::call;
use crate::daemon::{self, DaemonConfig};
use crate::render;
use crate::units::format_size;
use crate::CliError;
use terrace_export::client::NbdClient;

const HDD_COUNT: usize = 8;
const SSD_COUNT: usize = 3;
/// Sparse files cost nothing until written; these sizes give the default
/// 256 MiB slabs room to spread.
const HDD_BYTES: u64 = 8 << 30;
const SSD_BYTES: u64 = 2 << 30;
/// Each space's write-back cache, on the journal SSDs. Smaller than the
/// 1 GiB default: a new cache on files is written once with zeroes before
/// use, and the demo should start in seconds.
const CACHE_BYTES: u64 = 256 << 20;
/// Requests in flight while writing and verifying.
const QUEUE_DEPTH: usize = 32;
const REQUEST_BYTES: u64 = 1 << 20;

pub struct DemoOptions {
    pub directory: PathBuf,
    pub data_bytes: u64,
    pub listen: SocketAddr,
    pub serve_until_interrupted: bool,
}

fn disk_files(directory: &Path) -> Vec<(PathBuf, &'static str, u64)> {
    let hdds = (0..HDD_COUNT).map(|i| (directory.join(format!("hdd-{i}.img")), "hdd", HDD_BYTES));
    let ssds = (0..SSD_COUNT).map(|i| (directory.join(format!("ssd-{i}.img")), "ssd", SSD_BYTES));
    hdds.chain(ssds).collect()
}

/// Deterministic data for request `index` of a space, so verification needs
/// no copy of what was written.
fn pattern(space: &str, index: u64) -> Vec<u8> {
    let seed = spread(index) ^ space.len() as u64 ^ 0x007e_7ace;
    SplitMix64::new(seed).bytes(REQUEST_BYTES as usize)
}

fn rate(bytes: u64, started: Instant) -> String {
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    format!("{}/s", format_size((bytes as f64 / seconds) as u64))
}

async fn write_all(client: &NbdClient, space: &str, requests: u64) -> Result<(), CliError> {
    stream::iter(0..requests)
        .map(|index| async move {
            client
                .write(index * REQUEST_BYTES, &pattern(space, index), false)
                .await
        })
        .buffer_unordered(QUEUE_DEPTH)
        .try_collect::<Vec<()>>()
        .await?;
    client.flush().await?;
    Ok(())
}

async fn verify_all(client: &NbdClient, space: &str, requests: u64) -> Result<(), CliError> {
    stream::iter(0..requests)
        .map(|index| async move {
            let read = client
                .read(index * REQUEST_BYTES, REQUEST_BYTES as u32)
                .await?;
            if read != pattern(space, index) {
                return Err(CliError::Verify {
                    space: space.to_string(),
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

fn connect_uri(address: SocketAddr, space: &str) -> String {
    format!("nbd://{address}/{space}")
}

/// Write, flush and verify every space through NBD.
async fn exercise(
    address: SocketAddr,
    spaces: &[&str],
    requests: u64,
    write: bool,
) -> Result<(), CliError> {
    let bytes = requests * REQUEST_BYTES;
    for space in spaces {
        let client = NbdClient::connect(&connect_uri(address, space)).await?;
        if write {
            let started = Instant::now();
            write_all(&client, space, requests).await?;
            println!("  {space}: wrote {} through NBD ({QUEUE_DEPTH} requests of 1M in flight), flushed: {}", format_size(bytes), rate(bytes, started));
        }
        let started = Instant::now();
        verify_all(&client, space, requests).await?;
        println!(
            "  {space}: read back and verified every byte: {}",
            rate(bytes, started)
        );
        client.disconnect().await?;
    }
    Ok(())
}

fn print_connect_help(address: SocketAddr, directory: &Path) {
    let uri = connect_uri(address, "mirror");
    println!("connect with any NBD client, for example:");
    println!("  nbdinfo {uri}");
    println!("  qemu-img info {uri}");
    println!("  mkdir -p /tmp/terrace-fuse && nbdfuse /tmp/terrace-fuse/disk {uri} &");
    println!("  loop=$(losetup --direct-io=on -f --show /tmp/terrace-fuse/disk) && mkfs.ext4 $loop && mount $loop /mnt");
    println!(
        "the CLI talks to this demo with: terrace --control {}/control.sock pool status",
        directory.display()
    );
}

pub async fn run(options: DemoOptions) -> Result<(), CliError> {
    let directory = std::path::absolute(&options.directory)?;
    std::fs::create_dir_all(&directory)?;
    let files = disk_files(&directory);
    let _ = std::fs::remove_file(directory.join("state/pools.json"));
    println!(
        "creating {} sparse disk files in {}",
        files.len(),
        directory.display()
    );
    for (path, _, size) in &files {
        let _ = std::fs::remove_file(path);
        create_sparse_file(path, *size)?;
    }
    let mut config = DaemonConfig {
        state_dir: directory.join("state"),
        control_socket: directory.join("control.sock"),
        nbd_tcp: Some(options.listen),
        nbd_socket: Some(directory.join("nbd.sock")),
        nbd_threads: daemon::NBD_THREADS_DEFAULT,
        log_memory: None,
    };
    let running = match daemon::start(config.clone(), Arc::new(SystemEnv::new())).await {
        Ok(running) => running,
        Err(error) if error.contains("cannot listen for NBD") => {
            println!("{error}; using a free port instead");
            config.nbd_tcp = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
            daemon::start(config.clone(), Arc::new(SystemEnv::new()))
                .await
                .map_err(CliError::Daemon)?
        }
        Err(error) => return Err(CliError::Daemon(error)),
    };
    let result = demo_steps(&options, &config, &running.daemon, &files).await;
    if result.is_ok() && options.serve_until_interrupted {
        println!("serving until Ctrl-C ...");
        tokio::signal::ctrl_c().await?;
    }
    running.daemon.request_shutdown();
    running
        .finished
        .await
        .map_err(|e| CliError::Daemon(e.to_string()))?;
    result
}

async fn demo_steps(
    options: &DemoOptions,
    config: &DaemonConfig,
    daemon: &daemon::Daemon,
    files: &[(PathBuf, &'static str, u64)],
) -> Result<(), CliError> {
    let control = &config.control_socket;
    let address = daemon
        .nbd_tcp
        .ok_or_else(|| CliError::Daemon("no NBD address".into()))?;
    let disks = files
        .iter()
        .map(|(path, media, _)| DiskSpec {
            path: path.display().to_string(),
            media: Some((*media).into()),
            // The SSDs hold the spaces' write-back logs, as journal disks.
            usage: (*media == "ssd").then(|| "journal".into()),
            ..DiskSpec::default()
        })
        .collect();
    call(
        control,
        &Request::PoolCreate {
            name: "demo".into(),
            disks,
            slab_bytes: None,
            metadata_slot_bytes: None,
            force: false,
        },
    )
    .await?;
    let requests = options.data_bytes.div_ceil(REQUEST_BYTES).max(1);
    for (name, layout, copies, redundancy) in [
        ("mirror", "mirror", Some(2), None),
        ("parity", "parity", None, Some(2)),
    ] {
        let create = SpaceCreate {
            pool: "demo".into(),
            name: name.into(),
            layout: layout.into(),
            copies,
            redundancy,
            columns: None,
            interleave_bytes: None,
            size_bytes: Some(requests * REQUEST_BYTES),
            fault_domain: None,
            cache_bytes: Some(CACHE_BYTES),
            export: None,
            checksums: true,
            provisioning: None,
        };
        let answer = call(control, &Request::SpaceCreate(create)).await?;
        println!(
            "space {name}: {}, {}",
            answer["layout_description"].as_str().unwrap_or(""),
            answer["columns_reason"].as_str().unwrap_or("")
        );
    }
    exercise(address, &["mirror", "parity"], requests, true).await?;
    let left_out = files[2].0.display().to_string();
    println!("\nexporting the pool and importing it again without {left_out} (as if that drive had died)");
    call(
        control,
        &Request::PoolExport {
            name: "demo".into(),
            force: false,
        },
    )
    .await?;
    let disks = files
        .iter()
        .map(|(p, _, _)| p.display().to_string())
        .filter(|p| *p != left_out)
        .map(|path| DiskSpec {
            path,
            ..DiskSpec::default()
        })
        .collect();
    call(
        control,
        &Request::PoolImport {
            disks,
            name: Some("demo".into()),
            force: false,
            read_only: false,
        },
    )
    .await?;
    exercise(address, &["mirror", "parity"], requests, false).await?;
    let status: Vec<PoolView> = serde_json::from_value(
        call(
            control,
            &Request::PoolStatus {
                name: Some("demo".into()),
            },
        )
        .await?,
    )
    .map_err(|e| CliError::Protocol(e.to_string()))?;
    println!();
    for pool in &status {
        println!("{}", render::pool_status(pool));
    }
    print_connect_help(address, &options.directory);
    Ok(())
}
