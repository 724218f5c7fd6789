//! A pool's view of one disk at run time.
//!
//! The data path asks a disk two things: "may I use you?" (one atomic load)
//! and "do this I/O". The first write or flush error of a disk, or a read
//! error that says the device itself is gone, latches it failed (the
//! [`LatchedDevice`] underneath refuses further I/O) and counts the failure
//! in the pool's counter it was given ([`DiskContext`]), which the pool
//! records in a metadata commit before any write that saw it is
//! acknowledged. A change of condition is told as an event
//! ([`crate::events`]).
//!
//! A read the medium could not serve (an unreadable sector) and a block
//! that fails its checksum are survived: the rows above rebuild the bytes
//! from redundancy and rewrite them. Each disk counts its read, write and
//! checksum errors ([`DiskErrors`]); one whose read and checksum errors
//! reach the pool's limit within its window ([`ErrorPolicy`]) is failed
//! as at a write error, and repaired like a missing disk, unless a space
//! would lose data without it (the pool decides, seeing every space).
//!
//! Depends on `terrace_io` and, in the engine, only on
//! [`crate::condition`] and [`crate::events`]: nothing above it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use terrace_io::latch::LatchedDevice;
use terrace_io::{BlockDevice, Bytes, BytesMut, Env, IoError, IoResult};
use terrace_meta::{DiskIndex, Label};

pub use crate::condition::Condition;
use crate::events::{PoolEvent, PoolEvents};

/// Why an I/O on one disk failed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The disk is not in service (missing, failed, standby): nothing was
    /// issued to its device. `reason` is the one recorded when it left.
    #[error("disk {} is {condition:?}", .disk.0)]
    NotInService {
        disk: DiskIndex,
        condition: Condition,
        reason: String,
    },
    /// Its device failed the operation at `offset` (none for a flush; its
    /// kind and errno are in `source`); the disk is latched failed.
    #[error("{source}")]
    Device {
        offset: Option<u64>,
        #[source]
        source: IoError,
    },
}

pub struct Disk {
    pub index: DiskIndex,
    /// Its device and the label found on it: none for a disk missing since
    /// import, until it returns ([`Disk::attach`]).
    attached: RwLock<Option<Attached>>,
    condition: AtomicU8,
    reason: Mutex<String>,
    /// The pool's count of failures observed, bumped when this disk fails,
    /// so requests know a metadata commit must precede their completion.
    failures_observed: Arc<AtomicU64>,
    env: Arc<dyn Env>,
    /// Where its changes of condition are told.
    events: Arc<PoolEvents>,
    /// Moving average of read and write service times, in microseconds
    /// (weight 1/16 per operation): how `pool status` spots a slow disk.
    latency_us: AtomicU64,
    /// Errors counted since the pool opened (or `pool clear`).
    errors: ErrorCounts,
    /// When a disk's survived errors fail it (shared by the pool's disks).
    policy: Arc<ErrorPolicy>,
    /// Its survived errors reached the limit: the pool fails it at its next
    /// look (`PoolShared::persist_failures`) if every space keeps its data
    /// without it.
    over_limit: AtomicBool,
}

/// A disk's error counters, as `zpool status` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskErrors {
    /// Reads the disk failed (the bytes were rebuilt from redundancy where
    /// the layout keeps some).
    pub read: u64,
    /// Writes and flushes the disk failed (the first fails the disk).
    pub write: u64,
    /// Reads of a row from the disk whose blocks failed their checksums.
    pub checksum: u64,
}

#[derive(Default)]
struct ErrorCounts {
    read: AtomicU64,
    write: AtomicU64,
    checksum: AtomicU64,
    /// When each read or checksum error within the policy's window was
    /// counted (nanoseconds of the pool's clock), oldest first.
    recent: Mutex<VecDeque<u64>>,
}

/// How many read and checksum errors a disk survives: `limit` within
/// `window_secs` fail it (a limit of 0 never does). A pool setting, shared
/// by every disk of the pool and changed with it.
#[derive(Debug)]
pub struct ErrorPolicy {
    limit: AtomicU32,
    window_secs: AtomicU32,
}

impl Default for ErrorPolicy {
    fn default() -> ErrorPolicy {
        ErrorPolicy {
            limit: AtomicU32::new(terrace_meta::ERROR_LIMIT_DEFAULT),
            window_secs: AtomicU32::new(terrace_meta::ERROR_WINDOW_SECS_DEFAULT),
        }
    }
}

impl ErrorPolicy {
    pub fn set(&self, limit: u32, window_secs: u32) {
        self.limit.store(limit, Ordering::Relaxed);
        self.window_secs.store(window_secs, Ordering::Relaxed);
    }

    fn get(&self) -> (u32, u64) {
        (
            self.limit.load(Ordering::Relaxed),
            u64::from(self.window_secs.load(Ordering::Relaxed)),
        )
    }
}

struct Attached {
    device: Arc<LatchedDevice>,
    label: Label,
}

/// What every disk of a pool shares.
#[derive(Clone)]
pub struct DiskContext {
    pub failures_observed: Arc<AtomicU64>,
    pub env: Arc<dyn Env>,
    pub events: Arc<PoolEvents>,
    pub errors: Arc<ErrorPolicy>,
}

impl DiskContext {
    /// The context of a new pool's disks: no failure observed yet.
    pub(crate) fn new(env: Arc<dyn Env>, pool_name: &str) -> DiskContext {
        DiskContext {
            failures_observed: Arc::new(AtomicU64::new(0)),
            env,
            events: Arc::new(PoolEvents::new(pool_name)),
            errors: Arc::new(ErrorPolicy::default()),
        }
    }
}

impl Disk {
    pub fn present(
        index: DiskIndex,
        device: Arc<dyn BlockDevice>,
        label: Label,
        context: DiskContext,
    ) -> Disk {
        Disk {
            failures_observed: context.failures_observed,
            env: context.env,
            events: context.events,
            latency_us: AtomicU64::new(0),
            errors: ErrorCounts::default(),
            policy: context.errors,
            over_limit: AtomicBool::new(false),
            index,
            attached: RwLock::new(Some(Attached {
                device: Arc::new(LatchedDevice::new(device)),
                label,
            })),
            condition: AtomicU8::new(Condition::Online as u8),
            reason: Mutex::new(String::new()),
        }
    }

    pub fn absent(index: DiskIndex, reason: impl Into<String>, context: DiskContext) -> Disk {
        Disk {
            failures_observed: context.failures_observed,
            env: context.env,
            events: context.events,
            latency_us: AtomicU64::new(0),
            errors: ErrorCounts::default(),
            policy: context.errors,
            over_limit: AtomicBool::new(false),
            index,
            attached: RwLock::new(None),
            condition: AtomicU8::new(Condition::Missing as u8),
            reason: Mutex::new(reason.into()),
        }
    }

    pub fn condition(&self) -> Condition {
        Condition::from_u8(self.condition.load(Ordering::Acquire))
    }

    pub fn is_online(&self) -> bool {
        self.condition() == Condition::Online
    }

    pub fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn attached(&self) -> std::sync::RwLockReadGuard<'_, Option<Attached>> {
        self.attached.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn label(&self) -> Option<Label> {
        self.attached().as_ref().map(|a| a.label.clone())
    }

    pub fn device_name(&self) -> Option<String> {
        self.attached()
            .as_ref()
            .map(|a| a.device.name().to_string())
    }

    pub fn device(&self) -> Option<Arc<LatchedDevice>> {
        self.attached().as_ref().map(|a| a.device.clone())
    }

    /// Give a disk that was missing its device again (it returned while
    /// the pool runs). Its condition is left as it is: the caller puts it
    /// in service once what it missed is accounted for.
    pub(crate) fn attach(&self, device: Arc<dyn BlockDevice>, label: Label) {
        *self.attached.write().unwrap_or_else(|e| e.into_inner()) = Some(Attached {
            device: Arc::new(LatchedDevice::new(device)),
            label,
        });
    }

    /// Let go of the device (the pool is closed): the last handle dropped
    /// releases the process's claim on it, so another process may open it.
    pub(crate) fn detach(&self) {
        self.attached
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// A read of a row from this disk returned blocks that failed their
    /// checksums (rebuilt from redundancy, or not): one error however
    /// many blocks, as a read error is one however many sectors.
    pub(crate) fn count_checksum_error(&self) {
        self.errors.checksum.fetch_add(1, Ordering::Relaxed);
        self.survived("checksum");
    }

    /// The disk's error counters.
    pub fn errors(&self) -> DiskErrors {
        DiskErrors {
            read: self.errors.read.load(Ordering::Relaxed),
            write: self.errors.write.load(Ordering::Relaxed),
            checksum: self.errors.checksum.load(Ordering::Relaxed),
        }
    }

    /// Set the counters back to zero (`pool clear`).
    pub fn clear_errors(&self) {
        self.over_limit.store(false, Ordering::Release);
        self.errors.read.store(0, Ordering::Relaxed);
        self.errors.write.store(0, Ordering::Relaxed);
        self.errors.checksum.store(0, Ordering::Relaxed);
        self.errors
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Count a read or checksum error the data path survived; once those
    /// within the pool's window reach its limit, flag the disk for the
    /// pool to fail (`PoolShared::fail_disks_over_error_limit`).
    fn survived(&self, what: &str) {
        let (limit, window_secs) = self.policy.get();
        let now = self.env.now_ns();
        let within = {
            let mut recent = self.errors.recent.lock().unwrap_or_else(|e| e.into_inner());
            let since = now.saturating_sub(window_secs.saturating_mul(1_000_000_000));
            while recent.front().is_some_and(|&at| at < since) {
                recent.pop_front();
            }
            recent.push_back(now);
            // Only the count within the window up to the limit matters.
            while recent.len() > (limit as usize).max(1) {
                recent.pop_front();
            }
            recent.len() as u64
        };
        if limit > 0 && within >= u64::from(limit) && self.is_online() {
            *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = format!(
                "{within} read and checksum errors within {window_secs} s \
                 (the pool fails a disk at {limit}; the last was a {what} error)"
            );
            self.over_limit.store(true, Ordering::Release);
            // The pool looks at failures before the request completes.
            self.failures_observed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Its read and checksum errors reached the pool's limit (and it is
    /// still in service).
    pub(crate) fn over_error_limit(&self) -> bool {
        self.over_limit.load(Ordering::Acquire) && self.is_online()
    }

    /// Fail it for the errors that reached the limit.
    pub(crate) fn fail_for_errors(&self) {
        self.over_limit.store(false, Ordering::Release);
        let reason = self.reason();
        self.set_condition(Condition::Failed, reason);
    }

    /// Take the disk out of service with a reason (first reason wins).
    pub fn set_condition(&self, condition: Condition, reason: impl Into<String>) {
        let previous = self.condition.swap(condition as u8, Ordering::AcqRel);
        if previous == Condition::Online as u8 || condition == Condition::Online {
            *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason.into();
        }
        if condition == Condition::Failed {
            if let Some(device) = self.device() {
                device.fail(self.reason());
            }
        }
        if previous != condition as u8 {
            self.failures_observed.fetch_add(1, Ordering::AcqRel);
            self.events.emit(PoolEvent::DiskCondition {
                disk: self.index,
                condition,
                reason: self.reason(),
            });
        }
    }

    /// An I/O error fails the disk. So does one that ends after the disk
    /// was marked missing (its device vanished while the I/O ran): such a
    /// write was started before the disk was missing, so nothing recorded
    /// it as missed, and a disk that may lack it must never be taken back
    /// as merely missing and caught up on the recorded extents only.
    ///
    /// The error is counted in `counter` (the disk's read or write errors)
    /// unless it is the refusal of a device failed earlier.
    fn on_error<T>(
        &self,
        counter: &AtomicU64,
        offset: Option<u64>,
        result: IoResult<T>,
    ) -> Result<T, DiskError> {
        result.map_err(|source| {
            if !matches!(source, IoError::Latched { .. }) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            if matches!(self.condition(), Condition::Online | Condition::Missing) {
                self.set_condition(Condition::Failed, source.to_string());
            }
            DiskError::Device { offset, source }
        })
    }

    fn online_device(&self) -> Result<Arc<LatchedDevice>, DiskError> {
        match (self.device(), self.condition()) {
            (Some(device), Condition::Online) => Ok(device),
            (_, condition) => Err(DiskError::NotInService {
                disk: self.index,
                condition,
                reason: self.reason(),
            }),
        }
    }

    pub async fn read(&self, offset: u64, buf: BytesMut) -> (BytesMut, Result<(), DiskError>) {
        let device = match self.online_device() {
            Ok(device) => device,
            Err(error) => return (buf, Err(error)),
        };
        let started = self.env.now_ns();
        let (buf, result) = device.read(offset, buf).await;
        self.note_latency(started);
        match result {
            Err(source) if source.is_media_read_error() => {
                // The disk stays in service (unless this error reaches the
                // limit): the caller rebuilds the bytes and rewrites them.
                self.errors.read.fetch_add(1, Ordering::Relaxed);
                self.survived("read");
                let offset = Some(offset);
                (buf, Err(DiskError::Device { offset, source }))
            }
            // Any other read error (the device is gone) fails the disk.
            result => (buf, self.on_error(&self.errors.read, Some(offset), result)),
        }
    }

    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), DiskError> {
        let device = self.online_device()?;
        let started = self.env.now_ns();
        let result = device.write(offset, data, fua).await;
        self.note_latency(started);
        self.on_error(&self.errors.write, Some(offset), result)
    }

    fn note_latency(&self, started_ns: u64) {
        let sample = self.env.now_ns().saturating_sub(started_ns) / 1000;
        let _ = self
            .latency_us
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |average| {
                Some(if average == 0 {
                    sample
                } else {
                    average - average / 16 + sample / 16
                })
            });
    }

    /// Moving average of service times, in microseconds.
    pub fn latency_us(&self) -> u64 {
        self.latency_us.load(Ordering::Acquire)
    }

    pub async fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> Result<(), DiskError> {
        let device = self.online_device()?;
        self.on_error(
            &self.errors.write,
            Some(offset),
            device.write_zeroes(offset, length, fua).await,
        )
    }

    pub async fn flush(&self) -> Result<(), DiskError> {
        let device = self.online_device()?;
        self.on_error(&self.errors.write, None, device.flush().await)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::channel::oneshot;
    use futures::FutureExt;
    use terrace_io::memory::MemoryDevice;
    use terrace_io::BoxFuture;

    use super::*;

    /// Holds every write until the test lets it end, in error.
    struct HeldWrites {
        inner: Arc<dyn BlockDevice>,
        release: Mutex<Option<oneshot::Receiver<()>>>,
    }

    impl BlockDevice for HeldWrites {
        terrace_io::forward_device_answers!(inner: name, size_bytes, alignment);

        fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
            self.inner.read(offset, buf)
        }

        fn write(&self, _offset: u64, _data: Bytes, _fua: bool) -> BoxFuture<IoResult<()>> {
            let release = self.release.lock().unwrap().take().unwrap();
            let device = self.inner.name().to_string();
            Box::pin(async move {
                let _ = release.await;
                Err(IoError::Lost { device })
            })
        }

        fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
            self.inner.write_zeroes(offset, length, fua)
        }

        fn flush(&self) -> BoxFuture<IoResult<()>> {
            self.inner.flush()
        }
    }

    /// A disk over a [`HeldWrites`] device, and the sender that lets its
    /// held write fail.
    fn held_disk() -> (Disk, oneshot::Sender<()>) {
        let (send, receive) = oneshot::channel();
        let device = Arc::new(HeldWrites {
            inner: Arc::new(MemoryDevice::new("held", 1 << 20)),
            release: Mutex::new(Some(receive)),
        });
        let label = Label {
            pool_id: terrace_meta::PoolId([1; 16]),
            disk_id: terrace_meta::DiskId([2; 16]),
            created_ns: 0,
            device_bytes: 1 << 20,
            metadata_slot_bytes: 0,
            data_offset: 0,
            slab_bytes: 0,
            pool_name: "p".into(),
        };
        let context = DiskContext::new(Arc::new(terrace_io::env::SystemEnv::new()), "p");
        (Disk::present(DiskIndex(0), device, label, context), send)
    }

    /// A write started while the disk was online fails after the disk was
    /// marked missing: the disk is failed, not missing.
    #[test]
    fn a_write_failing_after_the_disk_went_missing_fails_it() {
        let (disk, send) = held_disk();
        let mut write = disk.write(0, Bytes::from(vec![1u8; 4096]), false).boxed();
        assert!((&mut write).now_or_never().is_none(), "the write is held");
        disk.set_condition(Condition::Missing, "its file or device disappeared");
        send.send(()).unwrap();
        assert!(futures::executor::block_on(write).is_err());
        assert_eq!(disk.condition(), Condition::Failed);
    }

    /// A device's error comes back with the offset it struck and the
    /// device's own error, worded as the device words it; the disk is then
    /// out of service, and says so with the reason it recorded.
    #[test]
    fn disk_errors_keep_the_device_error_and_the_recorded_reason() {
        let (disk, send) = held_disk();
        send.send(()).unwrap();
        let data = Bytes::from(vec![1u8; 4096]);
        let error = futures::executor::block_on(disk.write(8192, data.clone(), false));
        let Err(DiskError::Device { offset, source }) = &error else {
            panic!("expected a device error, got {error:?}");
        };
        assert_eq!(*offset, Some(8192));
        assert!(matches!(source, IoError::Lost { .. }));
        let text = error.as_ref().unwrap_err().to_string();
        assert_eq!(text, "held: device lost");
        let error = futures::executor::block_on(disk.write(0, data, false));
        let Err(DiskError::NotInService {
            disk: index,
            condition,
            reason,
        }) = &error
        else {
            panic!("expected the disk out of service, got {error:?}");
        };
        assert_eq!((*index, *condition), (DiskIndex(0), Condition::Failed));
        assert_eq!(reason, "held: device lost");
        assert_eq!(error.unwrap_err().to_string(), "disk 0 is Failed");
    }
}
