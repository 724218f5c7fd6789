//! Files and block devices as [`BlockDevice`]s.
//!
//! A [`FileDevice`] is a regular file (a disk image) or a block device node,
//! opened with O_DIRECT where the filesystem allows it so that the page cache
//! neither doubles memory use nor hides write errors until a later flush.
//! Its operations run on one of two engines behind the same type:
//!
//! * **io_uring** (`uring.rs`): callers submit to the device's ring on their
//!   own thread (or hand them off to its reactor, see [`hand_off_submissions`]);
//!   a reactor thread reaps the completions and wakes them. Preferred: up to
//!   [`MAX_IN_FLIGHT`] operations in the kernel at once, one thread per
//!   device.
//! * **threads** (`threads.rs`): a small pool of workers doing blocking
//!   `pread`/`pwrite`/`fdatasync`/`fallocate`. Used when io_uring cannot be
//!   set up (or on request).
//!
//! Both sit behind the same bounded admission queue (`queue.rs`), so the
//! backpressure and the buffer-ownership rules are identical: an operation
//! owns its buffer from hand-over until the engine is done with it, even if
//! the caller's future is dropped, and no more than [`MAX_IN_FLIGHT`]
//! operations per device are ever queued or executing.
//!
//! This module turns the [`BlockDevice`] contract into those operations:
//! range and alignment checks before anything reaches the OS, bounce buffers
//! for unaligned memory under O_DIRECT, loops over short transfers, FUA as
//! `RWF_DSYNC`, zeroing by `fallocate` with a plain-write fallback.

mod claim;
mod queue;
mod sys;
mod threads;
mod uring;

#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use futures::future;

use crate::{
    aligned_buffer, check_range, BlockDevice, BoxFuture, Bytes, BytesMut, IoError, IoResult,
    Operation, DIRECT_IO_ALIGNMENT,
};
use queue::{Completion, Op, Queue};
pub use uring::hand_off_submissions;

/// Operations queued or executing per device, on either engine. 256 keeps an
/// NVMe drive's queue full (it reaches peak throughput at a few dozen 4 KiB
/// requests) and bounds what a stalled drive can pin: 256 requests of the
/// engine's usual ≤ 1 MiB is at most 256 MiB of buffers per drive, and the
/// ring stays small (512 submission entries). Callers beyond it wait.
pub const MAX_IN_FLIGHT: usize = 256;

/// Size of the zero buffer used when the OS cannot zero a range itself:
/// large enough that a multi-GiB range takes few system calls, small enough
/// that the fallback allocates only 1 MiB at a time.
const ZERO_CHUNK: usize = 1 << 20;

/// Retries of an operation that failed with `EINTR`/`EAGAIN`. Those clear at
/// the first retry in practice; the bound turns a condition that does not
/// clear into an error instead of a spin.
const MAX_RETRIES: u32 = 16;

/// Whether to open with O_DIRECT (bypassing the page cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIo {
    /// Try O_DIRECT; if the filesystem refuses it (EINVAL), use buffered I/O.
    #[default]
    Auto,
    /// O_DIRECT or fail to open.
    Always,
    /// Buffered I/O through the page cache.
    Never,
}

/// Which engine executes the system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// io_uring if it can be set up, else threads.
    #[default]
    Auto,
    /// io_uring or fail to open.
    IoUring,
    /// The portable worker-thread pool.
    Threads,
    /// System calls made by the caller itself, inside the future's first
    /// poll. Chosen automatically for files in memory (tmpfs, ramfs): their
    /// reads and writes are copies that never wait for a device, so handing
    /// them to another thread costs more than doing them.
    Inline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileOptions {
    pub direct: DirectIo,
    pub engine: Engine,
    /// Open O_RDONLY; writes fail with EROFS.
    pub read_only: bool,
    /// Claim the device for this process (see `claim.rs`): the open fails
    /// with [`io::ErrorKind::ResourceBusy`] while another process holds
    /// it, and other processes' claims fail while this one is open. For
    /// a pool's disks.
    pub exclusive: bool,
}

/// A regular file or block device. Dropping it waits for the operations
/// already handed to its engine, then stops and joins the engine's threads.
pub struct FileDevice {
    io: Arc<DeviceIo>,
    engine: Engine,
    logical_block_size: u64,
    threads: Vec<JoinHandle<()>>,
    /// Held while the device is open, if it was opened exclusive.
    _claim: Option<claim::Claim>,
}

/// The part of a device its futures share (they outlive `&self`).
struct DeviceIo {
    name: String,
    size_bytes: u64,
    /// Offset/length granularity: 1 when buffered.
    alignment: u64,
    direct: bool,
    read_only: bool,
    block_device: bool,
    /// Granularity `fallocate` needs: the logical block size of a block
    /// device (it refuses anything finer), 1 for a file.
    fallocate_granularity: u64,
    queue: Arc<Queue>,
    /// With [`Engine::Inline`], the file the caller's thread works on.
    inline: Option<Arc<File>>,
    /// Set once `fallocate` said it cannot zero here; then zeroes are written.
    fallocate_unsupported: AtomicBool,
    /// FUA costs nothing here (see [`BlockDevice::cheap_fua`]): a block
    /// device with a write-through cache, or a file in memory.
    cheap_fua: bool,
    /// See [`BlockDevice::allocates_on_first_write`]: a regular file, or a
    /// loop device (a file behind it).
    allocates: bool,
    /// See [`BlockDevice::rotational`]: a block device's `queue/rotational`.
    rotational: Option<bool>,
}

impl FileDevice {
    /// Open a regular file or block device. Errors name the path.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> IoResult<FileDevice> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let fail = |source: io::Error| IoError::os(&name, Operation::Open, 0, 0, source);
        let (file, direct) = open_file(path, &options).map_err(fail)?;
        let held = options
            .exclusive
            .then(|| claim::claim(path, &file))
            .transpose()
            .map_err(fail)?;
        let metadata = file.metadata().map_err(fail)?;
        let file_type = metadata.file_type();
        let block_device = file_type.is_block_device();
        let (size_bytes, logical_block_size) = if block_device {
            let size = sys::block_device_size(&file).map_err(fail)?;
            (size, sys::logical_block_size(&file).map_err(fail)?)
        } else if file_type.is_file() {
            // Filesystems report the O_DIRECT granularity on Linux ≥ 6.1;
            // otherwise 512, which the 4096 floor below covers.
            let block = sys::direct_io_offset_align(&file).unwrap_or(512);
            (metadata.len(), block)
        } else {
            return Err(fail(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or a block device",
            )));
        };
        let alignment = if direct {
            logical_block_size.max(DIRECT_IO_ALIGNMENT as u64)
        } else {
            1
        };
        let file = Arc::new(file);
        let memory_backed = sys::is_memory_backed(&file);
        let allocates = !block_device || sys::is_loop_over_file(&file);
        let rotational = if block_device {
            sys::rotational(&file)
        } else {
            None
        };
        let cheap_fua = if block_device {
            sys::write_through_cache(&file)
        } else {
            memory_backed
        };
        let wanted = match options.engine {
            Engine::Auto if memory_backed => Engine::Inline,
            other => other,
        };
        let (queue, engine, threads) = start_engine(Arc::clone(&file), wanted).map_err(fail)?;
        let io = Arc::new(DeviceIo {
            name,
            size_bytes,
            alignment,
            direct,
            read_only: options.read_only,
            block_device,
            fallocate_granularity: if block_device { logical_block_size } else { 1 },
            queue,
            inline: (engine == Engine::Inline).then_some(file),
            fallocate_unsupported: AtomicBool::new(false),
            cheap_fua,
            allocates,
            rotational,
        });
        Ok(FileDevice {
            io,
            engine,
            logical_block_size,
            threads,
            _claim: held,
        })
    }

    /// Whether the file was opened with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.io.direct
    }

    /// The engine actually in use ([`Engine::IoUring`], [`Engine::Threads`]
    /// or [`Engine::Inline`]).
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The device's logical block size (for a file, its filesystem's O_DIRECT
    /// granularity, or 512 where the kernel does not say).
    pub fn logical_block_size(&self) -> u64 {
        self.logical_block_size
    }

    pub fn is_block_device(&self) -> bool {
        self.io.block_device
    }

    pub fn is_read_only(&self) -> bool {
        self.io.read_only
    }
}

fn open_file(path: &Path, options: &FileOptions) -> io::Result<(File, bool)> {
    let attempt = |direct: bool| {
        let mut open = OpenOptions::new();
        open.read(true).write(!options.read_only);
        if direct {
            open.custom_flags(libc::O_DIRECT);
        }
        open.open(path)
    };
    match options.direct {
        DirectIo::Never => attempt(false).map(|file| (file, false)),
        DirectIo::Always => attempt(true).map(|file| (file, true)),
        DirectIo::Auto => match attempt(true) {
            Ok(file) => Ok((file, true)),
            // EINVAL from open with O_DIRECT means this filesystem does not
            // support it (ramfs, some FUSE, older tmpfs).
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                attempt(false).map(|file| (file, false))
            }
            Err(error) => Err(error),
        },
    }
}

type Started = (Arc<Queue>, Engine, Vec<JoinHandle<()>>);

fn start_engine(file: Arc<File>, wanted: Engine) -> io::Result<Started> {
    if wanted == Engine::Inline {
        return Ok((Queue::new(MAX_IN_FLIGHT, None), Engine::Inline, Vec::new()));
    }
    if wanted != Engine::Threads {
        match uring::start(Arc::clone(&file), MAX_IN_FLIGHT) {
            Ok((queue, reactor)) => return Ok((queue, Engine::IoUring, vec![reactor])),
            Err(error) if wanted == Engine::IoUring => return Err(error),
            Err(_) => {}
        }
    }
    let queue = Queue::new(MAX_IN_FLIGHT, None);
    let workers = threads::start(file, Arc::clone(&queue))?;
    Ok((queue, Engine::Threads, workers))
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        self.io.queue.close();
        let current = std::thread::current().id();
        for handle in self.threads.drain(..) {
            // Never join ourselves (a device dropped from its own engine
            // thread); that thread exits on its own once drained.
            if handle.thread().id() != current {
                let _ = handle.join();
            }
        }
    }
}

/// Create `path` if needed and make it exactly `size_bytes` long; growing
/// allocates nothing (the file is sparse).
pub fn create_sparse_file(path: impl AsRef<Path>, size_bytes: u64) -> io::Result<()> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    file.set_len(size_bytes)
}

fn is_transient(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN))
}

fn engine_gone() -> io::Error {
    io::Error::other("the device's I/O engine stopped without answering")
}

impl DeviceIo {
    fn error(&self, operation: Operation, offset: u64, length: u64, source: io::Error) -> IoError {
        IoError::os(&self.name, operation, offset, length, source)
    }

    /// Everything decidable before touching the OS: range, write permission,
    /// and O_DIRECT granularity (a misaligned request is a caller bug).
    fn admissible(&self, operation: Operation, offset: u64, length: u64) -> IoResult<()> {
        check_range(&self.name, operation, offset, length, self.size_bytes)?;
        let writes = matches!(operation, Operation::Write | Operation::WriteZeroes);
        if writes && self.read_only {
            let source = io::Error::from_raw_os_error(libc::EROFS);
            return Err(self.error(operation, offset, length, source));
        }
        if !offset.is_multiple_of(self.alignment) || !length.is_multiple_of(self.alignment) {
            let source = io::Error::from_raw_os_error(libc::EINVAL);
            return Err(self.error(operation, offset, length, source));
        }
        Ok(())
    }

    /// O_DIRECT needs aligned memory; other memory goes through a copy.
    fn needs_bounce(&self, memory: &[u8]) -> bool {
        self.direct && !(memory.as_ptr() as usize).is_multiple_of(DIRECT_IO_ALIGNMENT)
    }

    /// Hand an op to the engine, or run it here and now when inline.
    async fn submit(&self, mut op: Op) -> Result<Completion, futures::channel::oneshot::Canceled> {
        match &self.inline {
            Some(file) => {
                let result = threads::execute(file, &mut op);
                Ok(Completion { op, result })
            }
            None => self.queue.run(op).await,
        }
    }

    /// Run an op without a data transfer (sync, fallocate), retrying
    /// transient failures.
    async fn run_simple(&self, make: impl Fn() -> Op) -> io::Result<()> {
        let mut retries = 0;
        loop {
            let completion = self.submit(make()).await.map_err(|_| engine_gone())?;
            match completion.result {
                Ok(_) => return Ok(()),
                Err(error) if is_transient(&error) && retries < MAX_RETRIES => retries += 1,
                Err(error) => return Err(error),
            }
        }
    }
}

impl DeviceIo {
    async fn read(&self, offset: u64, mut buf: BytesMut) -> (BytesMut, IoResult<()>) {
        if buf.is_empty() {
            return (buf, Ok(()));
        }
        if !self.needs_bounce(&buf) {
            return self.read_exact(offset, buf).await;
        }
        let (bounce, result) = self.read_exact(offset, aligned_buffer(buf.len())).await;
        if result.is_ok() {
            buf.copy_from_slice(&bounce);
        }
        (buf, result)
    }

    /// Fill `buf` from `offset`, resubmitting the rest after a short read.
    /// End of file before the buffer is full is [`IoError::Short`].
    async fn read_exact(&self, offset: u64, buf: BytesMut) -> (BytesMut, IoResult<()>) {
        let length = buf.len();
        let mut retries = 0;
        let mut op = Op::Read {
            buf,
            start: 0,
            offset,
        };
        loop {
            let Ok(completion) = self.submit(op).await else {
                let error = self.error(Operation::Read, offset, length as u64, engine_gone());
                return (BytesMut::zeroed(length), Err(error));
            };
            let (buf, start) = match completion.op {
                Op::Read { buf, start, .. } => (buf, start),
                // Only an engine that failed for good answers without the
                // buffer (it may still be in the kernel); its result is an
                // error, reported below with a fresh buffer.
                _ => (BytesMut::zeroed(length), 0),
            };
            let start = match completion.result {
                Ok(0) => {
                    let error = IoError::Short {
                        device: self.name.clone(),
                        operation: Operation::Read,
                        offset,
                        length: length as u64,
                        done: start as u64,
                    };
                    return (buf, Err(error));
                }
                Ok(count) => start + count,
                Err(error) if is_transient(&error) && retries < MAX_RETRIES => {
                    retries += 1;
                    start
                }
                Err(error) => {
                    let error = self.error(Operation::Read, offset, length as u64, error);
                    return (buf, Err(error));
                }
            };
            if start >= length {
                return (buf, Ok(()));
            }
            op = Op::Read {
                buf,
                start,
                offset: offset + start as u64,
            };
        }
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> IoResult<()> {
        let data = if self.needs_bounce(&data) {
            crate::aligned_copy(&data).freeze()
        } else {
            data
        };
        self.write_all(Operation::Write, offset, data, fua).await
    }

    /// Store all of `data`, resubmitting the rest after a short write.
    async fn write_all(
        &self,
        operation: Operation,
        offset: u64,
        data: Bytes,
        dsync: bool,
    ) -> IoResult<()> {
        let length = data.len();
        let mut done = 0;
        let mut retries = 0;
        while done < length {
            let op = Op::Write {
                data: data.slice(done..),
                offset: offset + done as u64,
                dsync,
            };
            let completion = self
                .submit(op)
                .await
                .map_err(|_| self.error(operation, offset, length as u64, engine_gone()))?;
            match completion.result {
                Ok(0) => {
                    return Err(IoError::Short {
                        device: self.name.clone(),
                        operation,
                        offset,
                        length: length as u64,
                        done: done as u64,
                    })
                }
                Ok(count) => done += count,
                Err(error) if is_transient(&error) && retries < MAX_RETRIES => retries += 1,
                Err(error) => return Err(self.error(operation, offset, length as u64, error)),
            }
        }
        Ok(())
    }

    /// Zero by `fallocate` (a hole in a file, a zero-out on a block device);
    /// where that is unsupported (or, buffered, the range is finer than a
    /// block device's sectors), write zeroes in bounded chunks.
    async fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> IoResult<()> {
        if length == 0 {
            return Ok(());
        }
        let operation = Operation::WriteZeroes;
        let mut zeroed = false;
        let granule = self.fallocate_granularity;
        let fits = offset.is_multiple_of(granule) && length.is_multiple_of(granule);
        if fits && !self.fallocate_unsupported.load(Ordering::Relaxed) {
            let mode = if self.block_device {
                libc::FALLOC_FL_ZERO_RANGE
            } else {
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
            };
            let make = || Op::Fallocate {
                mode,
                offset,
                length,
            };
            match self.run_simple(make).await {
                Ok(()) => zeroed = true,
                Err(error) if unsupported(&error) => {
                    self.fallocate_unsupported.store(true, Ordering::Relaxed)
                }
                Err(error) => return Err(self.error(operation, offset, length, error)),
            }
        }
        if !zeroed {
            self.write_zero_chunks(offset, length).await?;
        }
        if fua {
            self.run_simple(|| Op::SyncData)
                .await
                .map_err(|error| self.error(operation, offset, length, error))?;
        }
        Ok(())
    }

    async fn write_zero_chunks(&self, offset: u64, length: u64) -> IoResult<()> {
        let chunk = usize::try_from(length).map_or(ZERO_CHUNK, |length| length.min(ZERO_CHUNK));
        let zeroes = aligned_buffer(chunk).freeze();
        let mut done = 0;
        while done < length {
            let count = (length - done).min(chunk as u64) as usize;
            let at = offset + done;
            self.write_all(Operation::WriteZeroes, at, zeroes.slice(..count), false)
                .await?;
            done += count as u64;
        }
        Ok(())
    }

    async fn flush(&self) -> IoResult<()> {
        self.run_simple(|| Op::SyncData)
            .await
            .map_err(|error| self.error(Operation::Flush, 0, 0, error))
    }
}

fn unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    )
}

impl BlockDevice for FileDevice {
    fn name(&self) -> &str {
        &self.io.name
    }

    fn size_bytes(&self) -> u64 {
        self.io.size_bytes
    }

    fn alignment(&self) -> u64 {
        self.io.alignment
    }

    fn cheap_fua(&self) -> bool {
        self.io.cheap_fua
    }

    /// A regular file: its blocks (or its pages, in memory) are allocated
    /// by the first write to them; so are those of a loop device's file. A
    /// block device's are all there.
    fn allocates_on_first_write(&self) -> bool {
        self.io.allocates
    }

    fn rotational(&self) -> Option<bool> {
        self.io.rotational
    }

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        if let Err(error) = self
            .io
            .admissible(Operation::Read, offset, buf.len() as u64)
        {
            return Box::pin(future::ready((buf, Err(error))));
        }
        let io = Arc::clone(&self.io);
        Box::pin(async move { io.read(offset, buf).await })
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        if let Err(error) = self
            .io
            .admissible(Operation::Write, offset, data.len() as u64)
        {
            return Box::pin(future::ready(Err(error)));
        }
        let io = Arc::clone(&self.io);
        Box::pin(async move { io.write(offset, data, fua).await })
    }

    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        if let Err(error) = self.io.admissible(Operation::WriteZeroes, offset, length) {
            return Box::pin(future::ready(Err(error)));
        }
        let io = Arc::clone(&self.io);
        Box::pin(async move { io.write_zeroes(offset, length, fua).await })
    }

    fn flush(&self) -> BoxFuture<IoResult<()>> {
        let io = Arc::clone(&self.io);
        Box::pin(async move { io.flush().await })
    }
}
