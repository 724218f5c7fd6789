//! Fault injection: make chosen operations of a device fail on demand.
//!
//! Tests and the simulator wrap a device in a [`FaultDevice`] and steer it
//! through a cloneable [`FaultControls`] handle: fail reads or writes that
//! touch given byte ranges (a bad sector, a dying zone), or lose the whole
//! device (a pulled drive). An injected failure returns before the inner
//! device is touched, exactly like a drive that rejects the command, so the
//! inner image shows what a failed write leaves behind: nothing new.
//!
//! Rules are checked in this order: a lost device fails everything with
//! [`IoError::Lost`]; otherwise a read (or write / write-zeroes) fails with
//! [`IoError::Injected`] when any of its bytes falls inside a failing range of
//! its kind. Flushes fail only when the device is lost. Every injected failure
//! is counted.
//!
//! Silent faults return no error at all, as a drive with a firmware bug or
//! a lying controller does: a lost write is acknowledged and never made; a
//! misdirected write lands at another offset of the same device (dropped
//! if that is off the device). Each applies to the next writes, as many as
//! asked, and is counted apart. A window may keep silent faults to part of
//! the device (a simulator's data area, away from labels and metadata):
//! writes outside it pass untouched, and a misdirected write that would
//! land outside it is dropped.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future;
use futures::FutureExt;

use crate::{BlockDevice, BoxFuture, Bytes, BytesMut, IoError, IoResult, Operation};

#[derive(Default)]
struct Rules {
    reads: Vec<Range<u64>>,
    /// Unreadable sectors: reads touching one fail until a write covers
    /// it whole (the drive remaps it), as a real drive's pending sectors.
    bad_sectors: Vec<Range<u64>>,
    writes: Vec<Range<u64>>,
    /// Writes still to lose silently.
    lose_writes: u64,
    /// Writes still to misdirect, and by how many bytes.
    misdirect_writes: u64,
    misdirect_by: i64,
    /// Where silent faults apply (everywhere when `None`).
    silent_window: Option<Range<u64>>,
}

/// What a write that passes the error rules does.
enum Landing {
    Where(u64),
    Nowhere,
}

#[derive(Default)]
struct Shared {
    rules: Mutex<Rules>,
    lost: AtomicBool,
    injected_reads: AtomicU64,
    injected_writes: AtomicU64,
    lost_operations: AtomicU64,
    lost_writes: AtomicU64,
    misdirected_writes: AtomicU64,
    bad_sectors: AtomicU64,
    remapped_sectors: AtomicU64,
}

/// How many operations a [`FaultDevice`] failed on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultCounters {
    /// Reads failed by a read rule.
    pub reads: u64,
    /// Writes and write-zeroes failed by a write rule.
    pub writes: u64,
    /// Operations of any kind failed because the device was lost.
    pub lost: u64,
    /// Writes acknowledged and never made.
    pub lost_writes: u64,
    /// Writes made at another offset than asked.
    pub misdirected_writes: u64,
    /// Sectors made unreadable, and those a write has covered since.
    pub bad_sectors: u64,
    pub remapped_sectors: u64,
}

/// The steering handle of a [`FaultDevice`]; clones steer the same device.
#[derive(Clone, Default)]
pub struct FaultControls {
    shared: Arc<Shared>,
}

impl FaultControls {
    fn rules(&self) -> MutexGuard<'_, Rules> {
        self.shared.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fail every read that touches a byte of `range`.
    pub fn fail_reads(&self, range: Range<u64>) {
        self.rules().reads.push(range);
    }

    /// Make `range` unreadable until a write covers it whole: reads that
    /// touch it fail (a media error, counted as an injected read), and the
    /// first successful write or write-zeroes over all of it clears it.
    pub fn bad_sector(&self, range: Range<u64>) {
        self.rules().bad_sectors.push(range);
        self.shared.bad_sectors.fetch_add(1, Ordering::SeqCst);
    }

    /// Bad sectors not yet rewritten.
    pub fn bad_sectors(&self) -> Vec<Range<u64>> {
        self.rules().bad_sectors.clone()
    }

    /// A write of `[offset, offset + length)` succeeded: the bad sectors
    /// it covers whole are remapped.
    fn rewritten(&self, offset: u64, length: u64) {
        let end = offset.saturating_add(length);
        let mut rules = self.rules();
        let before = rules.bad_sectors.len();
        rules
            .bad_sectors
            .retain(|range| !(offset <= range.start && range.end <= end));
        let remapped = (before - rules.bad_sectors.len()) as u64;
        self.shared
            .remapped_sectors
            .fetch_add(remapped, Ordering::SeqCst);
    }

    /// Fail every write and write-zeroes that touches a byte of `range`.
    pub fn fail_writes(&self, range: Range<u64>) {
        self.rules().writes.push(range);
    }

    /// Acknowledge the next `count` writes without making them.
    pub fn lose_writes(&self, count: u64) {
        self.rules().lose_writes += count;
    }

    /// Make the next `count` writes `by` bytes away from where they were
    /// asked (dropped where that is off the device).
    pub fn misdirect_writes(&self, count: u64, by: i64) {
        let mut rules = self.rules();
        rules.misdirect_writes += count;
        rules.misdirect_by = by;
    }

    /// Keep silent faults to writes wholly inside `window`, and land
    /// misdirected writes inside it too.
    pub fn silent_faults_within(&self, window: Range<u64>) {
        self.rules().silent_window = Some(window);
    }

    /// Forget the silent faults not yet applied (counters are kept).
    pub fn stop_silent_faults(&self) {
        let mut rules = self.rules();
        rules.lose_writes = 0;
        rules.misdirect_writes = 0;
    }

    /// Where a write of `length` bytes at `offset` that passed the error
    /// rules lands on a device of `size` bytes (and count a silent fault).
    fn landing(&self, offset: u64, length: u64, size: u64) -> Landing {
        let mut rules = self.rules();
        let window = rules.silent_window.clone().unwrap_or(0..size);
        let inside =
            |start: u64| start >= window.start && start.saturating_add(length) <= window.end;
        if !inside(offset) {
            return Landing::Where(offset);
        }
        if rules.lose_writes > 0 {
            rules.lose_writes -= 1;
            self.shared.lost_writes.fetch_add(1, Ordering::SeqCst);
            return Landing::Nowhere;
        }
        if rules.misdirect_writes > 0 {
            rules.misdirect_writes -= 1;
            self.shared
                .misdirected_writes
                .fetch_add(1, Ordering::SeqCst);
            return match offset.checked_add_signed(rules.misdirect_by) {
                Some(moved) if inside(moved) && moved.saturating_add(length) <= size => {
                    Landing::Where(moved)
                }
                _ => Landing::Nowhere,
            };
        }
        Landing::Where(offset)
    }

    /// From now on every operation fails with [`IoError::Lost`].
    pub fn lose(&self) {
        self.shared.lost.store(true, Ordering::SeqCst);
    }

    /// Undo [`FaultControls::lose`]: the drive is back (range rules stay).
    pub fn restore(&self) {
        self.shared.lost.store(false, Ordering::SeqCst);
    }

    /// Remove every rule, the lost state included. Counters are kept.
    pub fn clear(&self) {
        *self.rules() = Rules::default();
        self.restore();
    }

    pub fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::SeqCst)
    }

    pub fn counters(&self) -> FaultCounters {
        FaultCounters {
            reads: self.shared.injected_reads.load(Ordering::SeqCst),
            writes: self.shared.injected_writes.load(Ordering::SeqCst),
            lost: self.shared.lost_operations.load(Ordering::SeqCst),
            lost_writes: self.shared.lost_writes.load(Ordering::SeqCst),
            misdirected_writes: self.shared.misdirected_writes.load(Ordering::SeqCst),
            bad_sectors: self.shared.bad_sectors.load(Ordering::SeqCst),
            remapped_sectors: self.shared.remapped_sectors.load(Ordering::SeqCst),
        }
    }

    /// The error to inject for this operation, if any (and count it).
    fn verdict(
        &self,
        device: &str,
        operation: Operation,
        offset: u64,
        length: u64,
    ) -> Option<IoError> {
        if self.is_lost() {
            self.shared.lost_operations.fetch_add(1, Ordering::SeqCst);
            return Some(IoError::Lost {
                device: device.to_string(),
            });
        }
        let (counter, hit) = {
            let rules = self.rules();
            match operation {
                Operation::Read => (
                    &self.shared.injected_reads,
                    overlaps(&rules.reads, offset, length)
                        || overlaps(&rules.bad_sectors, offset, length),
                ),
                Operation::Write | Operation::WriteZeroes => (
                    &self.shared.injected_writes,
                    overlaps(&rules.writes, offset, length),
                ),
                Operation::Flush | Operation::Open => return None,
            }
        };
        hit.then(|| {
            counter.fetch_add(1, Ordering::SeqCst);
            IoError::Injected {
                device: device.to_string(),
                operation,
                offset,
            }
        })
    }
}

/// Whether `[offset, offset + length)` shares a byte with any of `ranges`.
fn overlaps(ranges: &[Range<u64>], offset: u64, length: u64) -> bool {
    let end = offset.saturating_add(length);
    length > 0
        && ranges
            .iter()
            .any(|range| offset < range.end && range.start < end)
}

/// A device whose operations fail when its [`FaultControls`] say so.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    controls: FaultControls,
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> Self {
        FaultDevice {
            inner,
            controls: FaultControls::default(),
        }
    }

    /// A handle that steers this device; keep it after handing the device on.
    pub fn controls(&self) -> FaultControls {
        self.controls.clone()
    }

    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    fn verdict(&self, operation: Operation, offset: u64, length: u64) -> Option<IoError> {
        self.controls
            .verdict(self.inner.name(), operation, offset, length)
    }

    /// `write` of `[at, at + length)`, which remaps the bad sectors it
    /// covers once it succeeds.
    fn remapping(
        &self,
        at: u64,
        length: u64,
        write: BoxFuture<IoResult<()>>,
    ) -> BoxFuture<IoResult<()>> {
        let controls = self.controls.clone();
        write
            .map(move |result| {
                if result.is_ok() {
                    controls.rewritten(at, length);
                }
                result
            })
            .boxed()
    }
}

impl BlockDevice for FaultDevice {
    crate::forward_device_answers!(inner: name, size_bytes, alignment, cheap_fua, allocates_on_first_write, rotational);

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        match self.verdict(Operation::Read, offset, buf.len() as u64) {
            Some(error) => Box::pin(future::ready((buf, Err(error)))),
            None => self.inner.read(offset, buf),
        }
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        match self.verdict(Operation::Write, offset, data.len() as u64) {
            Some(error) => Box::pin(future::ready(Err(error))),
            None => match self
                .controls
                .landing(offset, data.len() as u64, self.inner.size_bytes())
            {
                Landing::Where(at) => {
                    let length = data.len() as u64;
                    self.remapping(at, length, self.inner.write(at, data, fua))
                }
                Landing::Nowhere => Box::pin(future::ready(Ok(()))),
            },
        }
    }

    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        match self.verdict(Operation::WriteZeroes, offset, length) {
            Some(error) => Box::pin(future::ready(Err(error))),
            None => match self
                .controls
                .landing(offset, length, self.inner.size_bytes())
            {
                Landing::Where(at) => {
                    self.remapping(at, length, self.inner.write_zeroes(at, length, fua))
                }
                Landing::Nowhere => Box::pin(future::ready(Ok(()))),
            },
        }
    }

    fn flush(&self) -> BoxFuture<IoResult<()>> {
        match self.verdict(Operation::Flush, 0, 0) {
            Some(error) => Box::pin(future::ready(Err(error))),
            None => self.inner.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;
    use crate::memory::MemoryDevice;

    fn setup() -> (Arc<MemoryDevice>, FaultDevice, FaultControls) {
        let memory = Arc::new(MemoryDevice::new("memory:0", 64 * 1024));
        let device = FaultDevice::new(memory.clone());
        let controls = device.controls();
        (memory, device, controls)
    }

    fn write(device: &FaultDevice, offset: u64, byte: u8) -> IoResult<()> {
        block_on(device.write(offset, Bytes::from(vec![byte; 4096]), false))
    }

    fn read(device: &FaultDevice, offset: u64) -> IoResult<BytesMut> {
        let (buf, result) = block_on(device.read(offset, BytesMut::zeroed(4096)));
        result.map(|()| buf)
    }

    #[test]
    fn read_rules_fail_overlapping_reads_only() {
        let (_, device, controls) = setup();
        write(&device, 8192, 3).unwrap();
        controls.fail_reads(10_000..10_001);
        let error = read(&device, 8192).unwrap_err();
        assert!(
            matches!(error, IoError::Injected { operation: Operation::Read, offset: 8192, ref device } if device == "memory:0"),
            "{error}"
        );
        // Adjacent ranges do not overlap; writes are not affected.
        assert!(read(&device, 4096).is_ok());
        assert!(read(&device, 12288).is_ok());
        write(&device, 8192, 4).unwrap();
        assert_eq!(
            controls.counters(),
            FaultCounters {
                reads: 1,
                ..FaultCounters::default()
            }
        );
    }

    #[test]
    fn write_rules_fail_writes_and_zeroes_without_touching_the_inner_device() {
        let (memory, device, controls) = setup();
        write(&device, 0, 1).unwrap();
        controls.fail_writes(0..1);
        assert!(matches!(
            write(&device, 0, 2),
            Err(IoError::Injected { .. })
        ));
        let error = block_on(device.write_zeroes(0, 4096, false)).unwrap_err();
        assert!(matches!(
            error,
            IoError::Injected {
                operation: Operation::WriteZeroes,
                ..
            }
        ));
        assert_eq!(memory.read_sync(0, 4096), vec![1u8; 4096]);
        assert!(read(&device, 0).is_ok(), "reads are not affected");
        block_on(device.flush()).unwrap();
        assert_eq!(controls.counters().writes, 2);
    }

    #[test]
    fn a_lost_device_fails_everything_until_restored() {
        let (memory, device, controls) = setup();
        controls.lose();
        assert!(controls.is_lost());
        assert!(matches!(write(&device, 0, 9), Err(IoError::Lost { .. })));
        assert!(matches!(read(&device, 0), Err(IoError::Lost { .. })));
        assert!(matches!(
            block_on(device.flush()),
            Err(IoError::Lost { .. })
        ));
        assert!(matches!(
            block_on(device.write_zeroes(0, 1, true)),
            Err(IoError::Lost { .. })
        ));
        assert_eq!(memory.read_sync(0, 4096), vec![0u8; 4096]);
        assert_eq!(controls.counters().lost, 4);
        controls.restore();
        write(&device, 0, 9).unwrap();
        assert_eq!(memory.read_sync(0, 4096), vec![9u8; 4096]);
    }

    /// A bad sector fails reads until a write covers it whole; a write of
    /// part of it leaves it bad.
    #[test]
    fn a_bad_sector_reads_again_once_rewritten_whole() {
        let (_, device, controls) = setup();
        controls.bad_sector(4096..8192);
        assert!(read(&device, 4096).is_err());
        assert!(read(&device, 0).is_ok());
        write(&device, 0, 1).unwrap();
        assert!(
            read(&device, 4096).is_err(),
            "a write beside it remaps nothing"
        );
        write(&device, 4096, 2).unwrap();
        assert!(read(&device, 4096).is_ok());
        assert!(controls.bad_sectors().is_empty());
    }

    #[test]
    fn restore_keeps_range_rules_and_clear_removes_everything() {
        let (_, device, controls) = setup();
        controls.fail_reads(0..4096);
        controls.fail_writes(4096..8192);
        controls.lose();
        controls.restore();
        assert!(read(&device, 0).is_err());
        assert!(write(&device, 4096, 1).is_err());
        controls.lose();
        controls.clear();
        assert!(!controls.is_lost());
        assert!(read(&device, 0).is_ok());
        write(&device, 4096, 1).unwrap();
        assert_eq!(
            controls.counters(),
            FaultCounters {
                reads: 1,
                writes: 1,
                ..FaultCounters::default()
            }
        );
    }

    #[test]
    fn lost_and_misdirected_writes_are_acknowledged_and_counted() {
        let (memory, device, controls) = setup();
        controls.lose_writes(1);
        write(&device, 0, 1).unwrap();
        assert_eq!(memory.read_sync(0, 4096), vec![0u8; 4096], "lost");
        write(&device, 0, 2).unwrap();
        assert_eq!(memory.read_sync(0, 4096), vec![2u8; 4096], "only one");
        controls.misdirect_writes(2, 8192);
        write(&device, 4096, 3).unwrap();
        assert_eq!(memory.read_sync(4096, 4096), vec![0u8; 4096]);
        assert_eq!(memory.read_sync(12288, 4096), vec![3u8; 4096], "8 KiB on");
        // Off the device: dropped, still acknowledged.
        write(&device, 60 * 1024, 4).unwrap();
        assert_eq!(memory.read_sync(60 * 1024, 4096), vec![0u8; 4096]);
        write(&device, 4096, 5).unwrap();
        assert_eq!(memory.read_sync(4096, 4096), vec![5u8; 4096], "two only");
        assert_eq!(
            controls.counters(),
            FaultCounters {
                lost_writes: 1,
                misdirected_writes: 2,
                ..FaultCounters::default()
            }
        );
    }

    #[test]
    fn silent_faults_keep_to_their_window_until_stopped() {
        let (memory, device, controls) = setup();
        controls.silent_faults_within(8192..32768);
        controls.lose_writes(1);
        write(&device, 0, 1).unwrap();
        assert_eq!(memory.read_sync(0, 4096), vec![1u8; 4096], "outside");
        write(&device, 8192, 2).unwrap();
        assert_eq!(memory.read_sync(8192, 4096), vec![0u8; 4096], "lost");
        // Misdirected out of the window: dropped, never written there.
        controls.misdirect_writes(2, -8192);
        write(&device, 12288, 3).unwrap();
        assert_eq!(memory.read_sync(4096, 4096), vec![0u8; 4096]);
        assert_eq!(memory.read_sync(12288, 4096), vec![0u8; 4096]);
        controls.stop_silent_faults();
        write(&device, 16384, 4).unwrap();
        assert_eq!(memory.read_sync(16384, 4096), vec![4u8; 4096], "stopped");
        assert_eq!(
            controls.counters(),
            FaultCounters {
                lost_writes: 1,
                misdirected_writes: 1,
                ..FaultCounters::default()
            }
        );
    }

    #[test]
    fn overlap_is_any_shared_byte() {
        let ranges = [100..200, 500..600];
        assert!(overlaps(&ranges, 199, 1));
        assert!(overlaps(&ranges, 0, 101));
        assert!(overlaps(&ranges, 150, 1000));
        assert!(!overlaps(&ranges, 200, 10));
        assert!(!overlaps(&ranges, 0, 100));
        assert!(!overlaps(&ranges, 150, 0), "an empty op touches no byte");
        assert!(overlaps(&ranges, 550, 1), "any of the ranges counts");
        let everything = 0..u64::MAX;
        assert!(overlaps(
            std::slice::from_ref(&everything),
            u64::MAX - 1,
            10
        ));
    }
}
