//! Latch the first error of a device.
//!
//! A drive that failed once is not trusted again: retrying a failed write can
//! "succeed" onto a sector the drive has remapped, or return stale data from a
//! cache, and the space would silently diverge. So the first error is kept,
//! every later operation fails at once with [`IoError::Latched`] naming it, and
//! the owner (the pool) marks the disk failed and carries on degraded.
//!
//! A read the medium could not serve ([`IoError::is_media_read_error`]) is
//! the exception: it is passed through unlatched, so the owner can count
//! it, rebuild the bytes from redundancy and rewrite them, as a drive
//! remaps an unreadable sector on its next write. Whether the device is
//! still trusted after such errors is the owner's call.

use std::sync::{Arc, Mutex};

use futures::FutureExt;

use crate::{BlockDevice, BoxFuture, Bytes, BytesMut, IoError, IoResult};

pub struct LatchedDevice {
    inner: Arc<dyn BlockDevice>,
    first_error: Arc<Mutex<Option<String>>>,
}

impl LatchedDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> Self {
        LatchedDevice {
            inner,
            first_error: Arc::new(Mutex::new(None)),
        }
    }

    /// The error that failed this device, if any.
    pub fn failure(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Mark the device failed without an I/O error (e.g. the owner decided so).
    pub fn fail(&self, reason: impl Into<String>) {
        latch(&self.first_error, reason.into());
    }

    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    fn refuse(&self) -> Option<IoError> {
        self.failure().map(|first_error| IoError::Latched {
            device: self.inner.name().to_string(),
            first_error,
        })
    }
}

fn latch(slot: &Mutex<Option<String>>, message: String) {
    let mut first = slot.lock().unwrap_or_else(|e| e.into_inner());
    if first.is_none() {
        *first = Some(message);
    }
}

/// Pass `result` through, latching its error if it is one.
fn observe<T>(slot: &Mutex<Option<String>>, result: IoResult<T>) -> IoResult<T> {
    if let Err(error) = &result {
        latch(slot, error.to_string());
    }
    result
}

impl BlockDevice for LatchedDevice {
    crate::forward_device_answers!(inner: name, size_bytes, alignment, cheap_fua, allocates_on_first_write, rotational);

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        if let Some(error) = self.refuse() {
            return Box::pin(futures::future::ready((buf, Err(error))));
        }
        let slot = self.first_error.clone();
        self.inner
            .read(offset, buf)
            .map(move |(buf, result)| match result {
                Err(error) if error.is_media_read_error() => (buf, Err(error)),
                result => (buf, observe(&slot, result)),
            })
            .boxed()
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        if let Some(error) = self.refuse() {
            return Box::pin(futures::future::ready(Err(error)));
        }
        let slot = self.first_error.clone();
        self.inner
            .write(offset, data, fua)
            .map(move |result| observe(&slot, result))
            .boxed()
    }

    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        if let Some(error) = self.refuse() {
            return Box::pin(futures::future::ready(Err(error)));
        }
        let slot = self.first_error.clone();
        self.inner
            .write_zeroes(offset, length, fua)
            .map(move |result| observe(&slot, result))
            .boxed()
    }

    fn flush(&self) -> BoxFuture<IoResult<()>> {
        if let Some(error) = self.refuse() {
            return Box::pin(futures::future::ready(Err(error)));
        }
        let slot = self.first_error.clone();
        self.inner
            .flush()
            .map(move |result| observe(&slot, result))
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryDevice;
    use futures::executor::block_on;

    #[test]
    fn first_error_latches_and_later_ops_never_reach_the_device() {
        let memory = Arc::new(MemoryDevice::new("memory:0", 8192));
        let device = LatchedDevice::new(memory.clone());
        assert!(device.failure().is_none());
        // Out of range: the device reports an error, which latches.
        assert!(block_on(device.write(8192, Bytes::from(vec![1u8; 4096]), false)).is_err());
        let first = device.failure().expect("latched");
        assert!(first.contains("beyond the device size"), "{first}");
        // A valid write is now refused and the memory stays untouched.
        let error = block_on(device.write(0, Bytes::from(vec![1u8; 4096]), false)).unwrap_err();
        assert!(matches!(error, IoError::Latched { .. }));
        assert_eq!(memory.read_sync(0, 4096), vec![0u8; 4096]);
        assert_eq!(device.failure().unwrap(), first);
    }

    /// An unreadable sector is passed through and latches nothing: the
    /// device still reads elsewhere and takes writes (a rewrite remaps it).
    #[test]
    fn a_media_read_error_does_not_latch() {
        let memory = Arc::new(MemoryDevice::new("memory:0", 16384));
        let faults = Arc::new(crate::fault::FaultDevice::new(memory));
        faults.controls().fail_reads(4096..8192);
        let device = LatchedDevice::new(faults.clone());
        let (_, result) = block_on(device.read(4096, BytesMut::zeroed(4096)));
        assert!(result.unwrap_err().is_media_read_error());
        assert!(device.failure().is_none());
        let (_, result) = block_on(device.read(8192, BytesMut::zeroed(4096)));
        assert!(result.is_ok());
        assert!(block_on(device.write(4096, Bytes::from(vec![1u8; 4096]), false)).is_ok());
    }
}
