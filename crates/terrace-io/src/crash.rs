//! A volatile write cache that can lose power.
//!
//! Real drives acknowledge a write once it sits in their cache; it reaches
//! the media later, in any order, and only a completed flush (or a FUA write)
//! promises it is there. A power cut loses some unflushed writes, keeps
//! others, and can tear a multi-sector write so that some sectors are new and
//! some old. Code that survives crashes must be tested against all of that;
//! [`CrashDevice`] makes those outcomes happen on demand.
//!
//! # Model
//!
//! Writes go through to the inner device at once: the inner device is the
//! live image a running host sees. For every write (and write-zeroes) that is
//! not yet durable the wrapper keeps an undo record: the bytes it overwrote,
//! widened to whole [`SECTOR_SIZE`] sectors. Reading the old bytes and
//! applying the new ones happen under one per-device async mutex, so records
//! are kept in exactly the order writes were applied, each capturing the
//! sectors as the write before it left them.
//!
//! * A FUA write is durable when it completes: it needs no undo, only a
//!   marker saying its sectors are durable as of that point.
//! * A flush snapshots a sequence number when it is issued; when it completes
//!   successfully, every record of a write that completed before that point
//!   is discarded. Writes in flight at the issue, or completed after it, stay
//!   volatile, as the contract allows.
//! * [`CrashDevice::crash`] walks the records newest first and decides for
//!   each write: landed (keep), dropped (restore the old sectors) or torn
//!   (restore a random subset of its sectors). A sector that a newer write
//!   kept (landed, the kept part of a torn write, or any FUA write) is
//!   settled: older records do not touch it again.
//!
//! # Why newest first is sound
//!
//! Take one sector and the writes that touched it since it was last durable,
//! W1 … Wn in the order they were applied. Wi's record holds the sector as it
//! was just before Wi, which is the content Wi-1 left (or the durable content
//! for W1): the records form an undo stack. Walking newest first, the sector
//! sees restores from Wn, Wn-1, … until the first write that keeps it (which
//! settles it), and each restore returns it to the state just before that
//! write. So it ends up either as the durable content (every write restored)
//! or as exactly the content left by the newest write that was kept. Each is
//! a state the sector really went through, and "the newest write that
//! reached the media wins" is what a drive that writes its cache back sector
//! by sector, in any order between sectors, leaves after a power cut (its
//! flushes and FUA writes having made their sectors durable). Undoing in any
//! other order would break the stack: walking oldest first ends a sector on
//! the undo image of the newest restored write, which carries the data of
//! older writes that were themselves dropped, so the report would not
//! describe the media. Records cover whole sectors, so all this holds per
//! sector even for writes that are not sector aligned.
//!
//! # Driving the inner device
//!
//! `crash` is synchronous: it drives the inner device's futures to completion
//! on the calling thread (with its own park/unpark loop, so it also works
//! when called from inside an executor). Two requirements follow, both
//! natural for a power cut: nothing may be in flight through this wrapper
//! (a write in flight makes `crash` fail with `EBUSY` instead of waiting),
//! and the inner device must complete operations by itself, as
//! [`crate::memory::MemoryDevice`] and [`crate::file::FileDevice`] do. Stack
//! delay and fault wrappers above the crash wrapper, not below it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use futures::lock::Mutex as AsyncMutex;

use crate::{
    aligned_buffer, check_range, BlockDevice, BoxFuture, Bytes, BytesMut, IoError, IoResult,
    Operation,
};

/// Granularity of tearing and of undo records: the smallest unit a drive
/// writes atomically. 4 KiB-sector drives are atomic per 4 KiB, so 512 also
/// explores every outcome those can produce (and some finer ones).
pub const SECTOR_SIZE: u64 = 512;

/// What a crash did to the volatile writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CrashReport {
    /// Writes whose new bytes were kept entirely.
    pub landed: usize,
    /// Writes whose old bytes were restored entirely.
    pub dropped: usize,
    /// Writes where a random subset of sectors got the old bytes back.
    pub torn: usize,
}

impl CrashReport {
    pub fn total(&self) -> usize {
        self.landed + self.dropped + self.torn
    }
}

/// One write, as far as a crash is concerned.
struct Record {
    /// Completion order; flushes compare against it.
    sequence: u64,
    /// Sector-aligned (and clipped to the device) range the write touched.
    offset: u64,
    length: u64,
    /// The bytes of that range before the write; `None` for a FUA write,
    /// which is durable and never undone.
    old: Option<Bytes>,
}

impl Record {
    fn sectors(&self) -> u64 {
        self.length.div_ceil(SECTOR_SIZE)
    }
}

#[derive(Default)]
struct State {
    next_sequence: u64,
    /// Oldest first, in the order the writes were applied.
    records: Vec<Record>,
}

pub struct CrashDevice {
    inner: Arc<dyn BlockDevice>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Serialises read-old + write-new pairs (and crashes).
    order: AsyncMutex<()>,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone, Copy)]
enum Fate {
    Landed,
    Dropped,
    Torn,
}

impl CrashDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> Self {
        CrashDevice {
            inner,
            shared: Arc::new(Shared::default()),
        }
    }

    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Writes that a crash could still lose (FUA writes are not counted).
    pub fn volatile_writes(&self) -> usize {
        let state = self.shared.state();
        state.records.iter().filter(|r| r.old.is_some()).count()
    }

    /// Cut the power. Walking the volatile writes newest first, `choose`
    /// decides each one's fate (`choose() % 3`: 0 landed, 1 dropped, 2 torn)
    /// and, for a torn write, each sector's (`choose() & 1`: 1 keeps the new
    /// bytes, 0 restores the old). The restored bytes are written to the inner
    /// device, which is flushed; it then holds the image a drive would show
    /// after power returns, and the wrapper is ready for use with no volatile
    /// writes. See the module comment for the requirements on the caller.
    ///
    /// On an inner I/O error the volatile set is still cleared and the image
    /// is whatever the restores left, like a drive that failed on power-up.
    pub fn crash(&self, choose: &mut dyn FnMut() -> u64) -> IoResult<CrashReport> {
        let Some(_order) = self.shared.order.try_lock() else {
            let source = std::io::Error::new(
                std::io::ErrorKind::ResourceBusy,
                "crash while a write is in flight (EBUSY)",
            );
            return Err(IoError::os(
                self.inner.name(),
                Operation::Write,
                0,
                0,
                source,
            ));
        };
        let records = std::mem::take(&mut self.shared.state().records);
        let mut settled = HashSet::new();
        let mut report = CrashReport::default();
        for record in records.iter().rev() {
            let first = record.offset / SECTOR_SIZE;
            let Some(old) = &record.old else {
                settled.extend(first..first + record.sectors());
                continue;
            };
            let fate = match choose() % 3 {
                0 => Fate::Landed,
                1 => Fate::Dropped,
                _ => Fate::Torn,
            };
            match fate {
                Fate::Landed => report.landed += 1,
                Fate::Dropped => report.dropped += 1,
                Fate::Torn => report.torn += 1,
            }
            let mut restore = Vec::new();
            for index in 0..record.sectors() {
                let keep = match fate {
                    Fate::Landed => true,
                    Fate::Dropped => false,
                    Fate::Torn => choose() & 1 == 1,
                };
                if !settled.contains(&(first + index)) {
                    if keep {
                        settled.insert(first + index);
                    } else {
                        restore.push(index);
                    }
                }
            }
            self.restore(record, old, &restore)?;
        }
        wait(self.inner.flush())?;
        Ok(report)
    }

    /// Put back the old bytes of the sectors (indices within the record)
    /// listed in `sectors`, leaving the record's other sectors as they are.
    fn restore(&self, record: &Record, old: &Bytes, sectors: &[u64]) -> IoResult<()> {
        if sectors.is_empty() {
            return Ok(());
        }
        let image = if sectors.len() as u64 == record.sectors() {
            old.clone()
        } else {
            let buf = aligned_buffer(record.length as usize);
            let (mut current, result) = wait(self.inner.read(record.offset, buf));
            result?;
            for &index in sectors {
                let start = (index * SECTOR_SIZE) as usize;
                let end = (start + SECTOR_SIZE as usize).min(current.len());
                current[start..end].copy_from_slice(&old[start..end]);
            }
            current.freeze()
        };
        wait(self.inner.write(record.offset, image, false))
    }
}

/// What a recorded write stores.
enum Payload {
    Data(Bytes),
    Zeroes(u64),
}

impl Payload {
    fn length(&self) -> u64 {
        match self {
            Payload::Data(data) => data.len() as u64,
            Payload::Zeroes(length) => *length,
        }
    }
}

/// Read the old sectors, apply the write and record it, all under the order
/// lock so records follow the order writes were applied in.
async fn recorded_write(
    shared: Arc<Shared>,
    inner: Arc<dyn BlockDevice>,
    offset: u64,
    payload: Payload,
    fua: bool,
) -> IoResult<()> {
    let _order = shared.order.lock().await;
    let start = offset / SECTOR_SIZE * SECTOR_SIZE;
    let end = (offset + payload.length())
        .div_ceil(SECTOR_SIZE)
        .saturating_mul(SECTOR_SIZE)
        .min(inner.size_bytes());
    let length = end - start;
    let old = if fua {
        None
    } else {
        let (old, result) = inner.read(start, aligned_buffer(length as usize)).await;
        result?;
        Some(old.freeze())
    };
    let result = match payload {
        Payload::Data(data) => inner.write(offset, data, fua).await,
        Payload::Zeroes(length) => inner.write_zeroes(offset, length, fua).await,
    };
    let mut state = shared.state();
    // A FUA write matters to a crash only while older volatile writes exist
    // (it settles its sectors against them); a failed one is not durable and
    // its partial effect is a legitimate crash outcome, so it gets no record.
    let needed = if fua {
        result.is_ok() && !state.records.is_empty()
    } else {
        true
    };
    if needed {
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        state.records.push(Record {
            sequence,
            offset: start,
            length,
            old,
        });
    }
    result
}

impl BlockDevice for CrashDevice {
    crate::forward_device_answers!(inner: name, size_bytes, alignment, cheap_fua, allocates_on_first_write, rotational);

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        self.inner.read(offset, buf)
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        let length = data.len() as u64;
        self.checked(Operation::Write, offset, length, Payload::Data(data), fua)
    }

    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        let payload = Payload::Zeroes(length);
        self.checked(Operation::WriteZeroes, offset, length, payload, fua)
    }

    fn flush(&self) -> BoxFuture<IoResult<()>> {
        // Everything completed before this instant is covered.
        let issued_at = self.shared.state().next_sequence;
        let inner = self.inner.flush();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            inner.await?;
            shared
                .state()
                .records
                .retain(|record| record.sequence >= issued_at);
            Ok(())
        })
    }
}

impl CrashDevice {
    fn checked(
        &self,
        operation: Operation,
        offset: u64,
        length: u64,
        payload: Payload,
        fua: bool,
    ) -> BoxFuture<IoResult<()>> {
        let size = self.inner.size_bytes();
        if let Err(error) = check_range(self.inner.name(), operation, offset, length, size) {
            return Box::pin(futures::future::ready(Err(error)));
        }
        if length == 0 {
            return match payload {
                Payload::Data(data) => self.inner.write(offset, data, fua),
                Payload::Zeroes(length) => self.inner.write_zeroes(offset, length, fua),
            };
        }
        let shared = Arc::clone(&self.shared);
        let inner = Arc::clone(&self.inner);
        Box::pin(recorded_write(shared, inner, offset, payload, fua))
    }
}

/// Wakes the thread blocked in [`wait`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Drive `future` to completion on this thread. Unlike
/// `futures::executor::block_on` it does not refuse to run inside another
/// executor; it relies on the future being completed by someone else's
/// thread or at once (see the module comment).
fn wait<T>(mut future: BoxFuture<T>) -> T {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests;
