//! What a benchmark that writes must not write over unasked.
//!
//! A benchmark writes random data over its whole working set (its write
//! profiles, and the prefill before reads), so a target that holds someone's
//! data is refused unless `--destroy-data` says to go ahead:
//!
//! * a space of the daemon that NBD clients have open (a mounted file
//!   system, a VM's disk): the daemon counts them, and serves the benchmark's
//!   own connections as a sole writer, refused while any other client is
//!   connected (`daemon/catalog.rs`), so none slips in before the first write;
//! * a block device that is mounted, held (device mapper, md), partitioned,
//!   or not zero at its start (a file system, RAID or partition signature);
//! * a regular file with data in it (a file only given a size, sparse, holds
//!   none).
//!
//! A run that only reads (read-only profiles, no prefill) is allowed on any
//! of them.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Bytes at the start of a device that must be zero for a benchmark to
/// write over it: 128 KiB hold the signatures of partition tables (MBR at 0,
/// GPT at 512), md RAID (superblocks 1.1 and 1.2 at 0 and 4 KiB), LVM (512),
/// and the file systems (ext2/3/4 at 1 KiB, XFS at 0, btrfs at 64 KiB).
pub const SIGNATURE_BYTES: usize = 128 << 10;

/// Why `path` holds data that a benchmark writing over it would destroy,
/// if it does. A path that cannot be looked at is left for the open to
/// report. A device is probed as `pool create` probes it (see
/// `daemon/probe.rs`), so a signature at its end counts too.
pub fn data_held(path: &Path) -> Option<String> {
    let metadata = std::fs::metadata(path).ok()?;
    if metadata.file_type().is_block_device() {
        let device = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some(problem) =
            crate::daemon::candidates::block_device_problem(&device.to_string_lossy())
        {
            return Some(format!("the device is {problem}"));
        }
        // What the pool commands refuse, named; then anything else at its start.
        if let Ok(Some(signature)) = crate::daemon::probe::probe_path(&path.to_string_lossy()) {
            return Some(format!("the device holds {signature}"));
        }
        return match start_is_zero(path) {
            Ok(true) => None,
            Ok(false) => Some(format!(
                "the device holds data in its first {} KiB (a file system, RAID or partition \
                 table?)",
                SIGNATURE_BYTES >> 10
            )),
            Err(error) => Some(format!("its start could not be read to look: {error}")),
        };
    }
    if metadata.is_file() && metadata.len() > 0 {
        return match file_has_data(path) {
            Ok(false) => None,
            Ok(true) => Some(format!(
                "the file holds data ({} bytes long, not only holes)",
                metadata.len()
            )),
            Err(error) => Some(format!("the file could not be read to look: {error}")),
        };
    }
    None
}

/// Whether the first [`SIGNATURE_BYTES`] of `path` (or all of it, if
/// shorter) are zero.
fn start_is_zero(path: &Path) -> std::io::Result<bool> {
    let file = std::fs::File::open(path)?;
    let mut start = Vec::with_capacity(SIGNATURE_BYTES);
    file.take(SIGNATURE_BYTES as u64).read_to_end(&mut start)?;
    Ok(start.iter().all(|&byte| byte == 0))
}

/// Whether a regular file has any data block (`SEEK_DATA` finds one); where
/// the file system cannot say, whether its start is anything but zero.
fn file_has_data(path: &Path) -> std::io::Result<bool> {
    let file = std::fs::File::open(path)?;
    // SAFETY: lseek on a descriptor this function owns; no memory involved.
    let found = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_DATA) };
    if found >= 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENXIO) => Ok(false),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(!start_is_zero(path)?),
        _ => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_with_a_size_but_no_data_may_be_written_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("a.img");
        let file = std::fs::File::create(&path).expect("create");
        assert_eq!(data_held(&path), None, "an empty file holds nothing");
        file.set_len(8 << 20).expect("size");
        assert_eq!(data_held(&path), None, "a sparse file holds nothing");
        assert_eq!(data_held(&dir.path().join("missing.img")), None);
    }

    #[test]
    fn a_file_with_data_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("a.img");
        let file = std::fs::File::create(&path).expect("create");
        file.set_len(8 << 20).expect("size");
        std::os::unix::fs::FileExt::write_all_at(&file, b"ext4", 4 << 20).expect("write");
        let reason = data_held(&path).expect("data found");
        assert!(reason.contains("holds data"), "{reason}");
    }
}
