//! Thin, checked wrappers around the system calls the file backend needs.
//!
//! Every function here turns a C return value into an `io::Result` and
//! retries `EINTR` itself, so the engines above never see a signal
//! interruption. The `unsafe` blocks are confined to this file and the
//! io_uring reactor.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `BLKGETSIZE64` from `<linux/fs.h>`: `_IOR(0x12, 114, size_t)`. The libc
/// crate does not export it.
const BLKGETSIZE64: libc::Ioctl = libc::_IOR::<u64>(0x12, 114);

/// Run `call` until it stops failing with `EINTR`.
fn retry_eintr(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let result = call();
        if result >= 0 {
            return Ok(result as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Offsets past `i64::MAX` cannot be expressed to the kernel.
fn to_off(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

/// Read into `buf` from `offset` until it is full, the file ends, or an error
/// occurs. Returns how many bytes were read (fewer than `buf.len()` only at
/// end of file).
pub fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let position = to_off(offset + done as u64)?;
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`, which we borrow
        // mutably for the duration of the call; the fd is open.
        let count = retry_eintr(|| unsafe {
            libc::pread(
                file.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                position,
            )
        })?;
        if count == 0 {
            break;
        }
        done += count;
    }
    Ok(done)
}

/// Write all of `data` at `offset`, with `RWF_DSYNC` per call when `dsync` is
/// set. Returns the bytes written (fewer only if the kernel wrote zero bytes,
/// which the caller reports as a short write).
pub fn pwrite_full(file: &File, data: &[u8], offset: u64, dsync: bool) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        let position = to_off(offset + done as u64)?;
        let rest = &data[done..];
        let count = if dsync {
            let iov = libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            };
            // SAFETY: `iov` describes `rest`, which outlives the call; the
            // kernel only reads from it for a write.
            retry_eintr(|| unsafe {
                libc::pwritev2(file.as_raw_fd(), &iov, 1, position, libc::RWF_DSYNC)
            })?
        } else {
            // SAFETY: the pointer and length describe `rest`; the fd is open.
            retry_eintr(|| unsafe {
                libc::pwrite(file.as_raw_fd(), rest.as_ptr().cast(), rest.len(), position)
            })?
        };
        if count == 0 {
            break;
        }
        done += count;
    }
    Ok(done)
}

pub fn fdatasync(file: &File) -> io::Result<()> {
    // SAFETY: plain syscall on an open fd.
    retry_eintr(|| unsafe { libc::fdatasync(file.as_raw_fd()) as isize }).map(drop)
}

pub fn fallocate(file: &File, mode: i32, offset: u64, length: u64) -> io::Result<()> {
    let position = to_off(offset)?;
    let length = to_off(length)?;
    // SAFETY: plain syscall on an open fd with integer arguments.
    retry_eintr(|| unsafe { libc::fallocate(file.as_raw_fd(), mode, position, length) as isize })
        .map(drop)
}

/// Size in bytes of the block device behind `file`.
pub fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at a live local.
    retry_eintr(|| unsafe {
        libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) as isize
    })?;
    Ok(size)
}

/// Logical block size of the block device behind `file`.
pub fn logical_block_size(file: &File) -> io::Result<u64> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points at a
    // live local.
    retry_eintr(|| unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET,
            &mut size as *mut libc::c_int,
        ) as isize
    })?;
    u64::try_from(size)
        .ok()
        .filter(|&size| size > 0)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A non-blocking eventfd, used to wake the io_uring reactor.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success we own the returned descriptor.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Add one to the eventfd counter. Cannot block: the fd is non-blocking and
/// the counter would need 2^64 - 1 unread signals to saturate.
pub fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes the 8 bytes of a live local to an eventfd. A failure
    // (EAGAIN on a saturated counter) still leaves the fd readable, which is
    // all the reader needs, so the result is ignored.
    let _ = retry_eintr(|| unsafe { libc::write(fd, (&one as *const u64).cast(), 8) });
}

/// Reset the eventfd counter to zero (EAGAIN when it already is).
pub fn eventfd_drain(fd: RawFd) {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live local from an eventfd.
    let _ = retry_eintr(|| unsafe { libc::read(fd, (&mut value as *mut u64).cast(), 8) });
}

/// The file offset alignment O_DIRECT needs on this file's filesystem, where
/// the kernel reports it (`statx` with `STATX_DIOALIGN`, Linux 6.1+).
pub fn direct_io_offset_align(file: &File) -> Option<u64> {
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut info: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path with AT_EMPTY_PATH makes statx describe the open
    // fd; the kernel writes into `info`, a live local of the right type.
    let result = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut info,
        )
    };
    let reported = result == 0 && info.stx_mask & libc::STATX_DIOALIGN != 0;
    (reported && info.stx_dio_offset_align > 0).then_some(u64::from(info.stx_dio_offset_align))
}

/// Whether the block device `file` says its write cache is write-through
/// (`queue/write_cache` in sysfs; a partition asks its disk): then FUA and
/// flushes cost it nothing. `false` where it says write-back or cannot say.
pub fn write_through_cache(file: &File) -> bool {
    ["queue/write_cache", "../queue/write_cache"]
        .iter()
        .find_map(|tail| block_sysfs(file, tail))
        .is_some_and(|text| text.trim() == "write through")
}

/// Whether the block device `file` says it spins (`queue/rotational` in
/// sysfs; a partition asks its disk); `None` where it cannot say.
pub fn rotational(file: &File) -> Option<bool> {
    ["queue/rotational", "../queue/rotational"]
        .iter()
        .find_map(|tail| block_sysfs(file, tail))
        .and_then(|text| match text.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        })
}

/// Whether a block device is a loop device with a file behind it.
pub fn is_loop_over_file(file: &File) -> bool {
    block_sysfs(file, "loop/backing_file").is_some_and(|path| !path.trim().is_empty())
}

/// A block device's sysfs attribute `tail` (under `/sys/dev/block/M:m`).
fn block_sysfs(file: &File, tail: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let rdev = file.metadata().ok()?.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/{tail}")).ok()
}

/// Whether the file lives in memory (tmpfs or ramfs), where I/O is a copy
/// that never waits for a device.
pub fn is_memory_backed(file: &File) -> bool {
    /// `TMPFS_MAGIC` and `RAMFS_MAGIC` from linux/magic.h.
    const MEMORY_FILESYSTEMS: [i64; 2] = [0x0102_1994, 0x8584_58f6];
    let mut stats = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: the descriptor is open for the life of `file`, and `stats`
    // has room for one statfs structure.
    let result = unsafe { libc::fstatfs(file.as_raw_fd(), stats.as_mut_ptr()) };
    if result != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded, so it filled the structure.
    // `f_type`'s integer type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    let kind = unsafe { stats.assume_init() }.f_type as i64;
    MEMORY_FILESYSTEMS.contains(&kind)
}
