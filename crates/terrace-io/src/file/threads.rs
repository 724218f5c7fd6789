//! The portable engine: a few worker threads doing blocking system calls.
//!
//! Used where io_uring is unavailable (old kernels, seccomp profiles, the
//! `kernel.io_uring_disabled` sysctl) or when asked for. Each worker takes the
//! next request from the [`Queue`], runs `pread`/`pwrite`/`fdatasync`/
//! `fallocate` to completion, and answers through the request's oneshot. The
//! buffer lives in the request, which a worker owns while the call runs.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::queue::{Op, Queue};
use super::sys;

/// Worker threads per device. Blocking I/O has one request per thread in the
/// kernel, so this is the queue depth the drive sees: 4 lets a drive reorder
/// and overlap a little (and covers one slow flush alongside reads), while a
/// pool of dozens of drives still costs only a few threads each.
pub(crate) const WORKERS: usize = 4;

/// Start the workers. On failure the ones already started are stopped.
pub(crate) fn start(file: Arc<File>, queue: Arc<Queue>) -> io::Result<Vec<JoinHandle<()>>> {
    let mut workers = Vec::with_capacity(WORKERS);
    for index in 0..WORKERS {
        let file = Arc::clone(&file);
        let work = Arc::clone(&queue);
        let spawned = std::thread::Builder::new()
            .name(format!("terrace-io-{index}"))
            .spawn(move || serve(&file, &work));
        match spawned {
            Ok(handle) => workers.push(handle),
            Err(error) => {
                queue.close();
                for handle in workers {
                    let _ = handle.join();
                }
                return Err(error);
            }
        }
    }
    Ok(workers)
}

fn serve(file: &File, queue: &Queue) {
    while let Some(mut request) = queue.next_blocking() {
        let result = execute(file, &mut request.op);
        request.complete(result);
    }
}

pub(crate) fn execute(file: &File, op: &mut Op) -> io::Result<usize> {
    match op {
        Op::Read { buf, start, offset } => sys::pread_full(file, &mut buf[*start..], *offset),
        Op::Write {
            data,
            offset,
            dsync,
        } => write(file, data, *offset, *dsync),
        Op::SyncData => sys::fdatasync(file).map(|()| 0),
        Op::Fallocate {
            mode,
            offset,
            length,
        } => sys::fallocate(file, *mode, *offset, *length).map(|()| 0),
    }
}

/// A durable write uses `RWF_DSYNC`; where the filesystem or kernel lacks
/// it, a plain write followed by `fdatasync` gives the same guarantee.
fn write(file: &File, data: &[u8], offset: u64, dsync: bool) -> io::Result<usize> {
    match sys::pwrite_full(file, data, offset, dsync) {
        Err(error) if dsync && unsupported(&error) => {
            let written = sys::pwrite_full(file, data, offset, false)?;
            sys::fdatasync(file)?;
            Ok(written)
        }
        result => result,
    }
}

fn unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    )
}
