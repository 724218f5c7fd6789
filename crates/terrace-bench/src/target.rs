//! What the benchmark drives: anything that reads and writes blocks.
//!
//! The trait is object safe (targets of different kinds sit side by side in
//! one sweep) and its futures are boxed and borrow the target, so an
//! implementation can hold plain references to its connection or device.
//! Futures are `Send` so a target also works on a multi-threaded runtime,
//! although the runner uses one thread (see the crate documentation).

use futures::future::BoxFuture;
use terrace_io::Bytes;

/// Why a request to a target failed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("NBD: {0}")]
    Nbd(#[from] terrace_export::client::NbdError),
    #[error("{0}")]
    Io(#[from] terrace_io::IoError),
    #[error("{0}")]
    Other(String),
}

pub type TargetResult<T> = Result<T, TargetError>;

pub trait Target: Send + Sync {
    /// The label in tables, plots and JSON.
    fn name(&self) -> &str;
    fn size_bytes(&self) -> u64;
    /// Granularity that offsets and lengths must respect (O_DIRECT files
    /// need their sector size); 1 when anything goes.
    fn alignment(&self) -> u64 {
        1
    }
    /// Largest request the target accepts (NBD servers advertise one).
    fn request_max_bytes(&self) -> u64 {
        u64::MAX
    }
    /// Read `length` bytes at `offset`.
    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>>;
    /// Write `data` at `offset`.
    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>>;
    /// Make completed writes durable.
    fn flush(&self) -> BoxFuture<'_, TargetResult<()>>;
}

/// A shared target is the target (so a caller can keep a handle on one it
/// gave to a sweep).
impl<T: Target + ?Sized> Target for std::sync::Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn alignment(&self) -> u64 {
        (**self).alignment()
    }
    fn request_max_bytes(&self) -> u64 {
        (**self).request_max_bytes()
    }
    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>> {
        (**self).read(offset, length)
    }
    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>> {
        (**self).write(offset, data)
    }
    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        (**self).flush()
    }
}
