use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use futures::executor::block_on;
use futures::future::join_all;
use futures::FutureExt;

use super::*;

const ENGINES: [Engine; 2] = [Engine::IoUring, Engine::Threads];
const MIB: u64 = 1 << 20;

fn options(engine: Engine) -> FileOptions {
    FileOptions {
        engine,
        ..FileOptions::default()
    }
}

fn pattern(seed: u8, length: usize) -> Bytes {
    let mut buffer = aligned_buffer(length);
    for (index, byte) in buffer.iter_mut().enumerate() {
        *byte = seed.wrapping_add((index % 251) as u8);
    }
    buffer.freeze()
}

fn read(device: &FileDevice, offset: u64, length: usize) -> IoResult<BytesMut> {
    let (buf, result) = block_on(device.read(offset, aligned_buffer(length)));
    result.map(|()| buf)
}

fn os_code(error: &IoError) -> Option<i32> {
    match error {
        IoError::Os { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// Write, read back, FUA write, flush and zero through `device`, checking
/// each step through the device and the file through std.
fn exercise(device: &FileDevice, path: &Path) {
    let data = pattern(1, 64 * 1024);
    block_on(device.write(8192, data.clone(), false)).unwrap();
    assert_eq!(&read(device, 8192, data.len()).unwrap()[..], &data[..]);
    let durable = pattern(2, 4096);
    block_on(device.write(MIB, durable.clone(), true)).unwrap();
    block_on(device.flush()).unwrap();
    let on_disk = std::fs::read(path).unwrap();
    assert_eq!(&on_disk[8192..8192 + data.len()], &data[..]);
    assert_eq!(&on_disk[MIB as usize..MIB as usize + 4096], &durable[..]);
    block_on(device.write_zeroes(16384, 8192, false)).unwrap();
    assert!(read(device, 16384, 8192).unwrap().iter().all(|&b| b == 0));
    assert_eq!(&read(device, 8192, 8192).unwrap()[..], &data[..8192]);
    block_on(device.write_zeroes(MIB, 4096, true)).unwrap();
    let on_disk = std::fs::read(path).unwrap();
    assert!(on_disk[MIB as usize..MIB as usize + 4096]
        .iter()
        .all(|&b| b == 0));
}

fn sparse_file(dir: &Path, size: u64) -> PathBuf {
    let path = dir.join("disk.img");
    create_sparse_file(&path, size).unwrap();
    path
}

#[test]
fn round_trips_on_ext4_with_direct_io_on_both_engines() {
    for engine in ENGINES {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let path = sparse_file(dir.path(), 4 * MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        assert!(device.is_direct(), "ext4 accepts O_DIRECT");
        assert_eq!(device.engine(), engine);
        assert!(device.alignment() >= 4096 && device.alignment().is_multiple_of(4096));
        assert_eq!(device.size_bytes(), 4 * MIB);
        assert!(!device.is_block_device());
        exercise(&device, &path);
    }
}

#[test]
fn auto_engine_prefers_io_uring_when_it_works() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_file(dir.path(), MIB);
    let uring_works = FileDevice::open(&path, options(Engine::IoUring)).is_ok();
    let device = FileDevice::open(&path, FileOptions::default()).unwrap();
    let expected = if uring_works {
        Engine::IoUring
    } else {
        Engine::Threads
    };
    assert_eq!(device.engine(), expected);
}

/// Whether this kernel lets `dir`'s filesystem open files with O_DIRECT.
fn accepts_o_direct(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let opened = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(probe);
    opened
}

#[test]
fn tmpfs_round_trips_and_reports_the_mode_in_use() {
    if !Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    for engine in ENGINES {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = sparse_file(dir.path(), 2 * MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        // tmpfs refused O_DIRECT before Linux 6.6 and accepts it since; the
        // device must report whichever mode it really got.
        assert_eq!(device.is_direct(), accepts_o_direct(dir.path()));
        exercise(&device, &path);
    }
}

#[test]
fn files_in_memory_run_inline_and_inline_works_anywhere() {
    if Path::new("/dev/shm").is_dir() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = sparse_file(dir.path(), 2 * MIB);
        let device = FileDevice::open(&path, FileOptions::default()).unwrap();
        assert_eq!(
            device.engine(),
            Engine::Inline,
            "tmpfs gets the inline engine"
        );
        exercise(&device, &path);
    } else {
        eprintln!("skipped the tmpfs half: no /dev/shm");
    }
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let path = sparse_file(dir.path(), 2 * MIB);
    let auto = FileDevice::open(&path, FileOptions::default()).unwrap();
    assert_ne!(
        auto.engine(),
        Engine::Inline,
        "disk-backed files keep an asynchronous engine"
    );
    drop(auto);
    let device = FileDevice::open(&path, options(Engine::Inline)).unwrap();
    assert_eq!(device.engine(), Engine::Inline);
    exercise(&device, &path);
    // Inline operations are done by the time the future is first polled.
    let write = device.write(0, pattern(9, 4096), false);
    assert!(write
        .now_or_never()
        .expect("completes in its first poll")
        .is_ok());
}

/// A ramfs mounted on a temporary directory, unmounted on drop.
struct Ramfs {
    dir: tempfile::TempDir,
}

impl Ramfs {
    fn mount() -> Option<Ramfs> {
        let dir = tempfile::tempdir_in("/tmp").ok()?;
        let target = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: all pointers are valid NUL-terminated strings or null.
        let result = unsafe {
            libc::mount(
                c"ramfs".as_ptr(),
                target.as_ptr(),
                c"ramfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        (result == 0).then_some(Ramfs { dir })
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        if let Ok(target) = std::ffi::CString::new(self.dir.path().as_os_str().as_encoded_bytes()) {
            // SAFETY: valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[test]
fn falls_back_to_buffered_io_where_o_direct_is_refused() {
    let Some(ramfs) = Ramfs::mount() else {
        eprintln!("skipped: cannot mount a ramfs (needs root)");
        return;
    };
    assert!(!accepts_o_direct(ramfs.dir.path()), "ramfs has no O_DIRECT");
    for engine in ENGINES {
        let path = sparse_file(ramfs.dir.path(), 2 * MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        assert!(!device.is_direct());
        assert_eq!(device.alignment(), 1);
        exercise(&device, &path);
        // Buffered I/O takes any offset, length and memory.
        block_on(device.write(3, Bytes::from_static(b"unaligned"), false)).unwrap();
        let (buf, result) = block_on(device.read(3, BytesMut::zeroed(9)));
        result.unwrap();
        assert_eq!(&buf[..], b"unaligned");
        let always = FileOptions {
            direct: DirectIo::Always,
            ..options(engine)
        };
        let error = FileDevice::open(&path, always).err().unwrap();
        assert_eq!(os_code(&error), Some(libc::EINVAL));
        assert!(error.to_string().contains("disk.img"), "{error}");
    }
}

#[test]
fn unaligned_memory_goes_through_a_bounce_buffer() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        assert!(device.is_direct());
        let expected = pattern(9, 8192);
        let mut backing = BytesMut::zeroed(8192 + 1);
        backing[1..].copy_from_slice(&expected);
        let data = backing.freeze().slice(1..);
        assert_ne!(data.as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
        block_on(device.write(4096, data, false)).unwrap();
        let mut target = aligned_buffer(8192 + 1);
        let _ = target.split_to(1);
        assert_ne!(target.as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
        let (buf, result) = block_on(device.read(4096, target));
        result.unwrap();
        assert_eq!(&buf[..], &expected[..]);
        assert_eq!(
            &std::fs::read(&path).unwrap()[4096..4096 + 8192],
            &expected[..]
        );
    }
}

#[test]
fn misaligned_offsets_and_lengths_are_einval_under_direct_io() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_file(dir.path(), MIB);
    let device = FileDevice::open(&path, FileOptions::default()).unwrap();
    assert!(device.is_direct());
    let error = block_on(device.write(512, pattern(1, 4096), false)).unwrap_err();
    assert_eq!(os_code(&error), Some(libc::EINVAL));
    let (_, result) = block_on(device.read(0, BytesMut::zeroed(100)));
    assert_eq!(os_code(&result.unwrap_err()), Some(libc::EINVAL));
    let error = block_on(device.write_zeroes(4096, 1000, false)).unwrap_err();
    assert_eq!(os_code(&error), Some(libc::EINVAL));
    assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn out_of_range_requests_never_reach_the_file() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        let error = block_on(device.write(MIB, pattern(1, 4096), false)).unwrap_err();
        assert!(matches!(error, IoError::OutOfRange { .. }), "{error}");
        let error = block_on(device.write(MIB - 4096, pattern(1, 8192), false)).unwrap_err();
        assert!(matches!(error, IoError::OutOfRange { .. }), "{error}");
        let error = block_on(device.write_zeroes(MIB, 4096, false)).unwrap_err();
        assert!(matches!(error, IoError::OutOfRange { .. }), "{error}");
        let (_, result) = block_on(device.read(u64::MAX - 4095, aligned_buffer(4096)));
        assert!(matches!(result, Err(IoError::OutOfRange { .. })));
        let metadata = std::fs::metadata(&path).unwrap();
        assert_eq!(metadata.len(), MIB, "the file did not grow");
        assert_eq!(metadata.blocks(), 0, "nothing was written");
    }
}

#[test]
fn reading_past_a_truncated_end_is_short() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), 64 * 1024);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        assert_eq!(device.size_bytes(), 64 * 1024);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(32 * 1024)
            .unwrap();
        let (_, result) = block_on(device.read(24 * 1024, aligned_buffer(16 * 1024)));
        match result {
            Err(IoError::Short { done, length, .. }) => {
                assert_eq!((done, length), (8192, 16384));
            }
            other => panic!("expected a short read, got {other:?}"),
        }
    }
}

#[test]
fn write_zeroes_punches_a_hole_in_a_regular_file() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), 4 * MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        block_on(device.write(0, pattern(5, 2 * MIB as usize), false)).unwrap();
        block_on(device.flush()).unwrap();
        let before = std::fs::metadata(&path).unwrap().blocks();
        block_on(device.write_zeroes(0, MIB, false)).unwrap();
        let after = std::fs::metadata(&path).unwrap().blocks();
        assert!(after < before, "st_blocks {before} -> {after}");
        assert!(read(&device, 0, MIB as usize)
            .unwrap()
            .iter()
            .all(|&b| b == 0));
        assert_eq!(
            &read(&device, MIB, 4096).unwrap()[..],
            &pattern(5, 2 * MIB as usize)[MIB as usize..MIB as usize + 4096]
        );
    }
}

#[test]
fn the_plain_write_fallback_zeroes_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_file(dir.path(), 4 * MIB);
    let device = FileDevice::open(&path, FileOptions::default()).unwrap();
    block_on(device.write(0, pattern(3, 3 * MIB as usize), false)).unwrap();
    // As if fallocate had answered EOPNOTSUPP before.
    device
        .io
        .fallocate_unsupported
        .store(true, Ordering::Relaxed);
    let length = 2 * MIB + 8192; // more than one ZERO_CHUNK, not a multiple of it
    block_on(device.write_zeroes(4096, length, true)).unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk[4096..(4096 + length) as usize]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(&on_disk[..4096], &pattern(3, 4096)[..]);
    let end = (4096 + length) as usize;
    assert_eq!(on_disk[end], pattern(3, 3 * MIB as usize)[end]);
}

#[test]
fn hundreds_of_concurrent_operations_complete_correctly() {
    const OPS: usize = 2 * MAX_IN_FLIGHT;
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), (OPS * 4096) as u64);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        let writes =
            (0..OPS).map(|i| device.write((i * 4096) as u64, pattern(i as u8, 4096), false));
        for result in block_on(join_all(writes)) {
            result.unwrap();
        }
        let reads = (0..OPS).map(|i| device.read((i * 4096) as u64, aligned_buffer(4096)));
        for (i, (buf, result)) in block_on(join_all(reads)).into_iter().enumerate() {
            result.unwrap();
            assert_eq!(&buf[..], &pattern(i as u8, 4096)[..], "block {i}");
        }
    }
}

/// A device on a new sparse file of `blocks` 4 KiB blocks.
fn blocks_device(dir: &Path, blocks: usize, engine: Engine) -> (PathBuf, FileDevice) {
    let path = sparse_file(dir, (blocks * 4096) as u64);
    let device = FileDevice::open(&path, options(engine)).unwrap();
    (path, device)
}

/// Callers on several threads submit to one device's ring at once (the
/// io_uring engine has them push and enter themselves; half the threads
/// hand their writes and small reads to the reactor instead): every block
/// reads back what its thread wrote, in small reads and in one large one.
#[test]
fn callers_on_many_threads_share_a_device() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 256;
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let (_, device) = blocks_device(dir.path(), THREADS * PER_THREAD, engine);
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let device = &device;
                scope.spawn(move || {
                    if thread % 2 == 1 {
                        hand_off_submissions();
                    }
                    let block = |i: usize| ((thread * PER_THREAD + i) * 4096) as u64;
                    let seed = |i: usize| (thread * 31 + i) as u8;
                    let writes = (0..PER_THREAD)
                        .map(|i| device.write(block(i), pattern(seed(i), 4096), i % 8 == 0));
                    for result in block_on(join_all(writes)) {
                        result.unwrap();
                    }
                    let reads =
                        (0..PER_THREAD).map(|i| device.read(block(i), aligned_buffer(4096)));
                    for (i, (buf, result)) in block_on(join_all(reads)).into_iter().enumerate() {
                        result.unwrap();
                        assert_eq!(
                            &buf[..],
                            &pattern(seed(i), 4096)[..],
                            "thread {thread} block {i}"
                        );
                    }
                    let whole = read(device, block(0), PER_THREAD * 4096).unwrap();
                    for (i, chunk) in whole.chunks(4096).enumerate() {
                        assert_eq!(
                            chunk,
                            &pattern(seed(i), 4096)[..],
                            "thread {thread} large read"
                        );
                    }
                });
            }
        });
    }
}

/// Dropping a device while other threads are still submitting to it: each
/// operation either completes or fails with ENXIO, none hangs, and every
/// write that completed is in the file.
#[test]
fn a_device_dropped_while_threads_submit_answers_every_operation() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 64;
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let (path, device) = blocks_device(dir.path(), THREADS * PER_THREAD, engine);
        let start = Arc::new(std::sync::Barrier::new(THREADS + 1));
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let writes: Vec<_> = (0..PER_THREAD)
                    .map(|i| {
                        let block = (thread * PER_THREAD + i) as u64;
                        device.write(block * 4096, pattern(block as u8, 4096), false)
                    })
                    .collect();
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    // One at a time, so some start after the device is gone.
                    writes
                        .into_iter()
                        .map(block_on)
                        .collect::<Vec<IoResult<()>>>()
                })
            })
            .collect();
        start.wait();
        drop(device);
        let on_disk = std::fs::read(&path).unwrap();
        for (thread, worker) in workers.into_iter().enumerate() {
            for (i, result) in worker.join().unwrap().into_iter().enumerate() {
                let block = thread * PER_THREAD + i;
                match result {
                    Ok(()) => assert_eq!(
                        &on_disk[block * 4096..][..4096],
                        &pattern(block as u8, 4096)[..],
                        "{engine:?}: block {block} was acknowledged"
                    ),
                    Err(error) => assert_eq!(os_code(&error), Some(libc::ENXIO), "{error}"),
                }
            }
        }
    }
}

#[test]
fn dropping_a_read_in_flight_is_harmless() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), 8 * MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        block_on(device.write(0, pattern(7, 8 * MIB as usize), false)).unwrap();
        for round in 0..4 {
            // Poll each read once, so it is handed to the engine (and, with
            // io_uring, to the kernel), then drop it before it completes.
            for i in 0..64u64 {
                let mut read = device.read(i * 128 * 1024, aligned_buffer(128 * 1024));
                let _ = (&mut read).now_or_never();
            }
            // Other I/O still works and sees the right bytes.
            let offset = round * MIB;
            let expected = &pattern(7, 8 * MIB as usize)[offset as usize..][..4096];
            assert_eq!(&read(&device, offset, 4096).unwrap()[..], expected);
        }
        drop(device);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            &pattern(7, 8 * MIB as usize)[..]
        );
    }
}

#[test]
fn an_operation_started_after_the_device_is_dropped_fails_cleanly() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), MIB);
        let device = FileDevice::open(&path, options(engine)).unwrap();
        let pending = device.read(0, aligned_buffer(4096));
        drop(device);
        let (buf, result) = block_on(pending);
        assert_eq!(buf.len(), 4096);
        assert_eq!(os_code(&result.unwrap_err()), Some(libc::ENXIO));
    }
}

#[test]
fn read_only_devices_refuse_writes() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_file(dir.path(), MIB);
        std::fs::write(&path, vec![4u8; MIB as usize]).unwrap();
        let read_only = FileOptions {
            read_only: true,
            ..options(engine)
        };
        let device = FileDevice::open(&path, read_only).unwrap();
        assert!(device.is_read_only());
        let error = block_on(device.write(0, pattern(1, 4096), false)).unwrap_err();
        assert_eq!(os_code(&error), Some(libc::EROFS));
        let error = block_on(device.write_zeroes(0, 4096, false)).unwrap_err();
        assert_eq!(os_code(&error), Some(libc::EROFS));
        assert!(read(&device, 0, 4096).unwrap().iter().all(|&b| b == 4));
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 4));
    }
}

#[test]
fn open_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let error = FileDevice::open(&missing, FileOptions::default())
        .err()
        .unwrap();
    assert_eq!(os_code(&error), Some(libc::ENOENT));
    assert!(error.to_string().contains("missing.img"), "{error}");
    let read_only = FileOptions {
        read_only: true,
        direct: DirectIo::Never,
        ..FileOptions::default()
    };
    let error = FileDevice::open(dir.path(), read_only).err().unwrap();
    assert!(error.to_string().contains("not a regular file"), "{error}");
}

#[test]
fn create_sparse_file_sets_the_size_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.img");
    create_sparse_file(&path, 64 * MIB).unwrap();
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!((metadata.len(), metadata.blocks()), (64 * MIB, 0));
    create_sparse_file(&path, MIB).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), MIB);
}

/// A loop device over a file, detached on drop.
struct LoopDevice {
    path: PathBuf,
}

impl LoopDevice {
    fn attach(backing: &Path) -> Option<LoopDevice> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let output = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .ok()?;
        let path = String::from_utf8(output.stdout).ok()?.trim().to_string();
        (output.status.success() && !path.is_empty()).then(|| LoopDevice { path: path.into() })
    }
}

impl LoopDevice {
    /// Set the loop device's sysfs `queue/SETTING` (root may) to each of
    /// `values` in turn and run `check` with it; a value the kernel
    /// refuses is skipped. The setting is put back afterwards.
    fn with_queue_setting(&self, setting: &str, values: &[&str], check: impl Fn(&str)) {
        let name = self.path.file_name().unwrap().to_string_lossy();
        let knob = PathBuf::from(format!("/sys/block/{name}/queue/{setting}"));
        let before = std::fs::read_to_string(&knob).unwrap();
        for value in values {
            if std::fs::write(&knob, value).is_err() {
                eprintln!("skipped {setting}={value:?}: the kernel refused it");
                continue;
            }
            check(value);
        }
        let _ = std::fs::write(&knob, before.trim());
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// FUA is cheap where the block device's cache is write-through (sysfs
/// `queue/write_cache`, which root may set on a loop device) and on files
/// in memory; not where the cache is write-back.
#[test]
fn devices_say_fua_is_cheap_only_without_a_volatile_cache() {
    if Path::new("/dev/shm").is_dir() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = sparse_file(dir.path(), 2 * MIB);
        assert!(FileDevice::open(&path, FileOptions::default())
            .unwrap()
            .cheap_fua());
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, vec![0u8; MIB as usize]).unwrap();
    let Some(loop_device) = LoopDevice::attach(&backing) else {
        eprintln!("skipped the block device half: needs root and losetup with a free loop device");
        return;
    };
    loop_device.with_queue_setting("write_cache", &["write through", "write back"], |mode| {
        let device = FileDevice::open(&loop_device.path, FileOptions::default()).unwrap();
        assert_eq!(device.cheap_fua(), mode == "write through", "{mode}");
    });
}

/// A block device says whether it spins (sysfs `queue/rotational`, which
/// root may set on a loop device); a regular file cannot say.
#[test]
fn block_devices_say_whether_they_spin_and_files_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let backing = sparse_file(dir.path(), MIB);
    let file = FileDevice::open(&backing, FileOptions::default()).unwrap();
    assert_eq!(file.rotational(), None);
    let Some(loop_device) = LoopDevice::attach(&backing) else {
        eprintln!("skipped the block device half: needs root and losetup with a free loop device");
        return;
    };
    loop_device.with_queue_setting("rotational", &["1", "0"], |value| {
        let device = FileDevice::open(&loop_device.path, FileOptions::default()).unwrap();
        assert_eq!(
            device.rotational(),
            Some(value == "1"),
            "rotational={value}"
        );
    });
}

/// A regular file's first writes allocate its blocks (on disk or, in
/// memory, its pages), and so do a loop device's over it. (A block
/// device's blocks are all there; this machine has none to spare.)
#[test]
fn files_and_loop_devices_allocate_on_first_write() {
    let dir = tempfile::tempdir().unwrap();
    let backing = sparse_file(dir.path(), MIB);
    let file = FileDevice::open(&backing, FileOptions::default()).unwrap();
    assert!(file.allocates_on_first_write());
    let Some(loop_device) = LoopDevice::attach(&backing) else {
        eprintln!("skipped the block device half: needs root and losetup with a free loop device");
        return;
    };
    let device = FileDevice::open(&loop_device.path, FileOptions::default()).unwrap();
    assert!(device.is_block_device());
    assert!(device.allocates_on_first_write());
}

#[test]
fn block_devices_report_ioctl_sizes_and_zero_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, vec![0xAAu8; 8 * MIB as usize]).unwrap();
    let Some(loop_device) = LoopDevice::attach(&backing) else {
        eprintln!("skipped: needs root and losetup with a free loop device");
        return;
    };
    for engine in ENGINES {
        let device = FileDevice::open(&loop_device.path, options(engine)).unwrap();
        assert!(device.is_block_device());
        assert!(device.is_direct());
        assert_eq!(device.size_bytes(), 8 * MIB);
        assert!(matches!(device.logical_block_size(), 512 | 4096));
        assert_eq!(device.alignment(), 4096);
        let data = pattern(11, 64 * 1024);
        block_on(device.write(MIB, data.clone(), true)).unwrap();
        assert_eq!(&read(&device, MIB, data.len()).unwrap()[..], &data[..]);
        block_on(device.write_zeroes(MIB + 4096, 8192, true)).unwrap();
        let back = read(&device, MIB, data.len()).unwrap();
        assert!(back[4096..12288].iter().all(|&b| b == 0));
        assert_eq!(&back[..4096], &data[..4096]);
        assert_eq!(&back[12288..], &data[12288..]);
        assert!(read(&device, 0, 4096).unwrap().iter().all(|&b| b == 0xAA));
        block_on(device.flush()).unwrap();
        let error = block_on(device.write(8 * MIB, pattern(1, 4096), false)).unwrap_err();
        assert!(matches!(error, IoError::OutOfRange { .. }));
    }
    // Buffered, a zero range finer than the sectors is written as zeroes.
    let buffered = FileOptions {
        direct: DirectIo::Never,
        ..FileOptions::default()
    };
    let device = FileDevice::open(&loop_device.path, buffered).unwrap();
    assert_eq!(device.alignment(), 1);
    block_on(device.write_zeroes(100, 1000, true)).unwrap();
    let (back, result) = block_on(device.read(0, BytesMut::zeroed(2048)));
    result.unwrap();
    assert!(back[..100].iter().all(|&b| b == 0xAA));
    assert!(back[100..1100].iter().all(|&b| b == 0));
    assert!(back[1100..].iter().all(|&b| b == 0xAA));
}

const EXCLUSIVE: FileOptions = FileOptions {
    direct: DirectIo::Auto,
    engine: Engine::Auto,
    read_only: false,
    exclusive: true,
};

fn busy(result: IoResult<FileDevice>) -> bool {
    matches!(result, Err(IoError::Os { source, .. }) if source.kind() == io::ErrorKind::ResourceBusy)
}

/// Whether another holder (an open file description of its own, as
/// another process has) can lock the file now; the lock is let go at once.
fn lockable_by_another(path: &Path) -> bool {
    let other = File::open(path).unwrap();
    // SAFETY: flock on a descriptor owned here.
    unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// An exclusive open claims a file for this process: another holder's lock
/// is refused while any handle of this process is open, a second open in
/// this process shares the claim, the last handle dropped lets go, and a
/// file another holder has locked is refused by whatever path it is named.
#[test]
fn exclusive_opens_claim_a_file_for_this_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_file(dir.path(), MIB);
    let first = FileDevice::open(&path, EXCLUSIVE).unwrap();
    let second = FileDevice::open(&path, EXCLUSIVE).unwrap();
    assert!(!lockable_by_another(&path));
    drop(first);
    assert!(
        !lockable_by_another(&path),
        "the second handle still holds it"
    );
    drop(second);
    assert!(lockable_by_another(&path), "the last handle let go");

    let other = File::open(&path).unwrap();
    // SAFETY: flock on a descriptor owned here.
    assert_eq!(
        unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    assert!(busy(FileDevice::open(&path, EXCLUSIVE)));
    let link = dir.path().join("same-inode.img");
    std::fs::hard_link(&path, &link).unwrap();
    assert!(busy(FileDevice::open(&link, EXCLUSIVE)));
    FileDevice::open(&path, FileOptions::default()).expect("a plain open is not refused");
    drop(other);
    FileDevice::open(&link, EXCLUSIVE).expect("free again once the other let go");
}

/// A block device is claimed with the kernel's own exclusive open: another
/// exclusive opener is refused while the device is held, and the device is
/// refused while another holds it.
#[test]
fn exclusive_opens_claim_a_block_device() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let backing = sparse_file(dir.path(), MIB);
    let Some(loop_device) = LoopDevice::attach(&backing) else {
        eprintln!("skipped: needs root and losetup with a free loop device");
        return;
    };
    let open_excl = || {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(&loop_device.path)
    };
    let device = FileDevice::open(&loop_device.path, EXCLUSIVE).unwrap();
    let again = FileDevice::open(&loop_device.path, EXCLUSIVE).expect("shared in this process");
    assert_eq!(open_excl().unwrap_err().raw_os_error(), Some(libc::EBUSY));
    drop((device, again));
    let other = open_excl().expect("let go with the last handle");
    assert!(busy(FileDevice::open(&loop_device.path, EXCLUSIVE)));
    drop(other);
    FileDevice::open(&loop_device.path, EXCLUSIVE).expect("free again");
}
