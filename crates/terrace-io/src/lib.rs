//! Drive backends: the bottom of the terrace data path.
//!
//! Everything above this crate (layout, placement, engine) is sans-IO: it
//! reaches a drive only through the [`BlockDevice`] trait and reaches time and
//! randomness only through the [`Env`] trait. This crate holds the real
//! implementations (files and block devices through io_uring or a portable
//! thread fallback, memory) and the test wrappers (fault, delay, crash, latch)
//! that the simulator and the tests stack on top of them.
//!
//! # Buffers
//!
//! Reads take an owned [`BytesMut`] and give it back filled; writes take a
//! [`Bytes`]. Owned buffers are what makes io_uring safe: the kernel may touch
//! a buffer until the completion arrives, even if the caller stopped waiting,
//! so the backend keeps the buffer alive until then. [`aligned_buffer`] hands
//! out memory aligned for O_DIRECT; splitting it at multiples of
//! [`DIRECT_IO_ALIGNMENT`] keeps every part aligned, and `BytesMut::unsplit`
//! joins the parts again without copying.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

pub use bytes::{Bytes, BytesMut};

pub mod crash;
pub mod delay;
pub mod env;
pub mod fault;
pub mod file;
pub mod latch;
pub mod memory;
pub mod model;
pub mod random;
pub mod size;
mod timer;
pub mod virtual_clock;
pub use timer::use_thread_timers;

pub use env::{Env, SystemEnv};

/// A boxed future, as every [`BlockDevice`] operation returns. One small
/// allocation per operation buys object safety (pools mix backends and
/// wrappers behind `Arc<dyn BlockDevice>`).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Memory alignment, and offset/length granularity, that O_DIRECT needs on
/// every device we support (4 KiB-sector drives included). The engine only
/// ever issues device I/O in multiples of this.
pub const DIRECT_IO_ALIGNMENT: usize = 4096;

/// What a device operation was doing when it failed; carried in errors so a
/// report names the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Open,
    Read,
    Write,
    WriteZeroes,
    Flush,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Open => "open",
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::WriteZeroes => "write-zeroes",
            Operation::Flush => "flush",
        })
    }
}

/// An operation and the bytes it covered, as an error names them: "open"
/// and "flush" cover no range, so none is named.
struct Span(Operation, u64, u64);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Span(operation, offset, length) = *self;
        match operation {
            Operation::Open | Operation::Flush => write!(f, "{operation}"),
            _ => write!(f, "{operation} of {length} bytes at offset {offset}"),
        }
    }
}

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The operating system rejected the operation.
    #[error("{device}: {} failed: {source}", Span(*.operation, *.offset, *.length))]
    Os {
        device: String,
        operation: Operation,
        offset: u64,
        length: u64,
        #[source]
        source: std::io::Error,
    },
    /// The device returned fewer bytes than asked (e.g. a truncated file).
    #[error("{device}: short {operation}: {done} of {length} bytes at offset {offset}")]
    Short {
        device: String,
        operation: Operation,
        offset: u64,
        length: u64,
        done: u64,
    },
    /// The request does not fit the device.
    #[error("{device}: {operation} of {length} bytes at offset {offset} is beyond the device size {size_bytes}")]
    OutOfRange {
        device: String,
        operation: Operation,
        offset: u64,
        length: u64,
        size_bytes: u64,
    },
    /// A fault injected by [`fault::FaultDevice`].
    #[error("{device}: injected {operation} fault at offset {offset}")]
    Injected {
        device: String,
        operation: Operation,
        offset: u64,
    },
    /// The whole device is gone (pulled, or lost by fault injection).
    #[error("{device}: device lost")]
    Lost { device: String },
    /// An earlier error latched this device as failed; it is not touched again.
    #[error("{device}: device failed earlier ({first_error}); not retried")]
    Latched { device: String, first_error: String },
}

impl IoError {
    /// A read the medium could not serve (an unreadable sector, data that
    /// failed the drive's own checks, an injected read fault) while the
    /// device itself still answers: the owner may rebuild the bytes from
    /// redundancy and rewrite them (a drive remaps a sector on its next
    /// write) rather than give the whole device up.
    pub fn is_media_read_error(&self) -> bool {
        const EIO: i32 = 5;
        const ENODATA: i32 = 61;
        const EBADMSG: i32 = 74;
        const EILSEQ: i32 = 84;
        match self {
            IoError::Os {
                operation: Operation::Read,
                source,
                ..
            } => matches!(
                source.raw_os_error(),
                Some(EIO | ENODATA | EBADMSG | EILSEQ)
            ),
            IoError::Injected {
                operation: Operation::Read,
                ..
            } => true,
            _ => false,
        }
    }

    /// Build an [`IoError::Os`] from the last OS error or a given one.
    pub fn os(
        device: &str,
        operation: Operation,
        offset: u64,
        length: u64,
        source: std::io::Error,
    ) -> Self {
        IoError::Os {
            device: device.to_string(),
            operation,
            offset,
            length,
            source,
        }
    }
}

pub type IoResult<T> = Result<T, IoError>;

/// A drive, or something standing in for one.
///
/// # Contract
///
/// * `read` fills the whole buffer (`buf.len()` bytes) from `offset`, or fails.
/// * `write` stores all of `data` at `offset`, or fails. When it completes the
///   data may still sit in a volatile cache: it survives a power cut only
///   after a later `flush` completes, or at once when `fua` is set.
/// * `write_zeroes` makes the range read back as zeroes (a hole in a file, a
///   zero-out on a block device) with the same durability rules as `write`.
/// * `flush` makes every write that completed before the flush was issued
///   durable.
/// * Operations that are in flight together may complete in any order; the
///   caller orders what needs ordering by waiting.
/// * Offsets and lengths are multiples of [`DIRECT_IO_ALIGNMENT`] for devices
///   whose [`BlockDevice::alignment`] says so; the backend copies through an
///   aligned bounce buffer if the memory itself is not aligned.
///
/// Returned futures own everything they need (they never borrow the device)
/// and may outlive it; an operation polled after its device is gone fails.
pub trait BlockDevice: Send + Sync + 'static {
    /// A human-readable name: a path, or `memory:3`.
    fn name(&self) -> &str;
    /// Usable size in bytes.
    fn size_bytes(&self) -> u64;
    /// Granularity that offsets and lengths must respect (1 for memory).
    fn alignment(&self) -> u64;
    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)>;
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>>;
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>>;
    fn flush(&self) -> BoxFuture<IoResult<()>>;
    /// Whether a write with FUA costs about what one without does: the
    /// device has no volatile write cache, or one that power loss cannot
    /// empty (a data-centre SSD's). Writers that would otherwise write and
    /// then flush (a log's records) write with FUA instead. Wrappers
    /// forward their inner device's answer.
    fn cheap_fua(&self) -> bool {
        false
    }
    /// Whether the first write to a range costs more than the writes after
    /// it, because that is when the storage behind it is allocated: a
    /// regular file (sparse, or with unwritten extents), not a block device
    /// or memory. A writer that will rewrite a range many times (a log's
    /// ring) writes it once ahead where this holds, and skips that where it
    /// does not. Wrappers forward their inner device's answer.
    fn allocates_on_first_write(&self) -> bool {
        false
    }
    /// Whether the device is a spinning drive, where it can say: a block
    /// device's `queue/rotational`, a drive model's kind. `None` for a
    /// regular file or memory. Pools record it as the disk's media where
    /// none is declared, and a space on spinning drives tells its NBD
    /// clients so. Wrappers forward their inner device's answer.
    fn rotational(&self) -> Option<bool> {
        None
    }
}

/// Answers a wrapper device gives as the device it wraps: expands, inside an
/// `impl BlockDevice`, to each named method forwarded to `self.$field`.
/// A wrapper names every answer it does not change, so one that changes
/// an answer (a drive model's `cheap_fua`) writes only that one.
///
/// ```ignore
/// impl BlockDevice for Wrapper {
///     terrace_io::forward_device_answers!(inner: name, size_bytes, alignment);
///     // read, write, write_zeroes, flush ...
/// }
/// ```
#[macro_export]
macro_rules! forward_device_answers {
    (@one $field:ident name) => {
        fn name(&self) -> &str {
            self.$field.name()
        }
    };
    (@one $field:ident size_bytes) => {
        fn size_bytes(&self) -> u64 {
            self.$field.size_bytes()
        }
    };
    (@one $field:ident alignment) => {
        fn alignment(&self) -> u64 {
            self.$field.alignment()
        }
    };
    (@one $field:ident cheap_fua) => {
        fn cheap_fua(&self) -> bool {
            self.$field.cheap_fua()
        }
    };
    (@one $field:ident allocates_on_first_write) => {
        fn allocates_on_first_write(&self) -> bool {
            self.$field.allocates_on_first_write()
        }
    };
    (@one $field:ident rotational) => {
        fn rotational(&self) -> Option<bool> {
            self.$field.rotational()
        }
    };
    ($field:ident: $($method:ident),+ $(,)?) => {
        $($crate::forward_device_answers!(@one $field $method);)+
    };
}

/// Check that `[offset, offset + length)` fits a device of `size_bytes`.
/// Backends call this first so an out-of-range request never reaches the OS.
pub fn check_range(
    device: &str,
    operation: Operation,
    offset: u64,
    length: u64,
    size_bytes: u64,
) -> IoResult<()> {
    match offset.checked_add(length) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(IoError::OutOfRange {
            device: device.to_string(),
            operation,
            offset,
            length,
            size_bytes,
        }),
    }
}

/// A zero-filled buffer of `length` bytes whose start is aligned to
/// [`DIRECT_IO_ALIGNMENT`].
pub fn aligned_buffer(length: usize) -> BytesMut {
    let mut buffer = BytesMut::zeroed(length + DIRECT_IO_ALIGNMENT);
    let misalignment = buffer.as_ptr() as usize % DIRECT_IO_ALIGNMENT;
    let padding = (DIRECT_IO_ALIGNMENT - misalignment) % DIRECT_IO_ALIGNMENT;
    let _ = buffer.split_to(padding);
    buffer.truncate(length);
    debug_assert_eq!(buffer.as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
    buffer
}

/// A copy of `data` in memory aligned to [`DIRECT_IO_ALIGNMENT`] (one
/// pass over the bytes: nothing is zeroed first).
pub fn aligned_copy(data: &[u8]) -> BytesMut {
    aligned_concat(data.len(), [data])
}

/// `parts` one after another in memory aligned to [`DIRECT_IO_ALIGNMENT`],
/// `length` bytes in all (room is made for that much; more is allowed).
/// One pass over the bytes: nothing is zeroed first.
pub fn aligned_concat<'a>(length: usize, parts: impl IntoIterator<Item = &'a [u8]>) -> BytesMut {
    let mut buffer = BytesMut::with_capacity(length + DIRECT_IO_ALIGNMENT);
    let misalignment = buffer.as_ptr() as usize % DIRECT_IO_ALIGNMENT;
    let padding = (DIRECT_IO_ALIGNMENT - misalignment) % DIRECT_IO_ALIGNMENT;
    buffer.extend_from_slice(&[0u8; DIRECT_IO_ALIGNMENT][..padding]);
    let _ = buffer.split_to(padding);
    for part in parts {
        buffer.extend_from_slice(part);
    }
    debug_assert_eq!(buffer.as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
    buffer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_aligned_zeroed_and_splits_aligned() {
        for length in [0usize, 1, 4096, 3 * 4096, 1 << 20] {
            let mut buffer = aligned_buffer(length);
            assert_eq!(buffer.len(), length);
            assert_eq!(buffer.as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
            assert!(buffer.iter().all(|&byte| byte == 0));
            if length >= 2 * 4096 {
                let head = buffer.split_to(4096);
                assert_eq!(buffer.as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
                let mut head = head;
                head.unsplit(buffer);
                assert_eq!(head.len(), length);
            }
        }
    }

    #[test]
    fn aligned_copy_is_aligned_and_equal() {
        for length in [0usize, 1, 4097, 1 << 20] {
            let data: Vec<u8> = (0..length).map(|i| i as u8).collect();
            let copy = aligned_copy(&data);
            assert_eq!(copy.as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
            assert_eq!(&copy[..], &data[..]);
        }
    }

    #[test]
    fn os_errors_name_a_range_only_where_the_operation_has_one() {
        let error = |operation, offset, length| IoError::Os {
            device: "/dev/sdz".into(),
            operation,
            offset,
            length,
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
        let open = error(Operation::Open, 0, 0).to_string();
        assert!(open.starts_with("/dev/sdz: open failed: "), "{open}");
        let flush = error(Operation::Flush, 0, 0).to_string();
        assert!(flush.starts_with("/dev/sdz: flush failed: "), "{flush}");
        let write = error(Operation::Write, 8192, 4096).to_string();
        assert!(
            write.starts_with("/dev/sdz: write of 4096 bytes at offset 8192 failed: "),
            "{write}"
        );
    }

    #[test]
    fn check_range_rejects_overflow_and_overrun() {
        assert!(check_range("d", Operation::Read, 0, 10, 10).is_ok());
        assert!(check_range("d", Operation::Read, 1, 10, 10).is_err());
        assert!(check_range("d", Operation::Read, u64::MAX, 2, u64::MAX).is_err());
    }
}
