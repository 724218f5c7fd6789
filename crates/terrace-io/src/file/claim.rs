//! Claims: a disk held by one process at a time.
//!
//! Two processes writing one pool's disks (two daemons importing the same
//! pool, or a benchmark opening a pool a daemon serves) would each commit
//! metadata over the other's and scramble the data. A device opened with
//! [`FileOptions::exclusive`](super::FileOptions::exclusive) is claimed for
//! this process:
//!
//! * a **block device** by a second open with `O_EXCL`, the kernel's own
//!   claim: it fails while another process holds the device that way or a
//!   filesystem on it is mounted, and mounting fails while we hold it;
//! * a **regular file** by `flock(LOCK_EX)` on its inode, which every
//!   process that claims the file takes, whatever path it came by.
//!
//! Within the process a claim is counted, not repeated: a pool's own code
//! may open a disk it already holds (a returning disk opened again before
//! the old handle is dropped) without tripping over itself. The lock is
//! let go when the last handle of the device in this process is dropped.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// What is claimed: a block device by its device number (every node of it
/// is the same device), a file by its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Block(u64),
    File { device: u64, inode: u64 },
}

struct Held {
    handles: usize,
    /// The descriptor that holds the kernel's claim or the lock; closing it
    /// lets go.
    _lock: File,
}

fn held() -> MutexGuard<'static, HashMap<Key, Held>> {
    static HELD: OnceLock<Mutex<HashMap<Key, Held>>> = OnceLock::new();
    HELD.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One handle's share of a claim; dropping the last share lets go.
#[derive(Debug)]
pub(crate) struct Claim {
    key: Key,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = held();
        if let Some(entry) = held.get_mut(&self.key) {
            entry.handles -= 1;
            if entry.handles == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// Claim the device `file` (opened from `path`) for this process. Fails with
/// [`io::ErrorKind::ResourceBusy`] if another process holds it.
pub(crate) fn claim(path: &Path, file: &File) -> io::Result<Claim> {
    let metadata = file.metadata()?;
    let block_device = std::os::unix::fs::FileTypeExt::is_block_device(&metadata.file_type());
    let key = if block_device {
        Key::Block(metadata.rdev())
    } else {
        Key::File {
            device: metadata.dev(),
            inode: metadata.ino(),
        }
    };
    let mut held = held();
    if let Some(entry) = held.get_mut(&key) {
        entry.handles += 1;
        return Ok(Claim { key });
    }
    let lock = if block_device {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
            .map_err(|error| match error.raw_os_error() {
                Some(libc::EBUSY) => busy("mounted, or held by another process"),
                _ => error,
            })?
    } else {
        let lock = file.try_clone()?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(match error.raw_os_error() {
                Some(libc::EWOULDBLOCK) => busy("locked by another process"),
                _ => error,
            });
        }
        lock
    };
    held.insert(
        key,
        Held {
            handles: 1,
            _lock: lock,
        },
    );
    Ok(Claim { key })
}

fn busy(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, format!("in use: {why}"))
}
