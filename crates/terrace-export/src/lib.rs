//! The NBD server: spaces served to unmodified clients.
//!
//! The server speaks the protocol of `NetworkBlockDevice/nbd` `doc/proto.md`
//! (fixed newstyle handshake only) and knows nothing of pools or layouts: it
//! serves whatever [`Catalog`] names, through the [`Backend`] trait. The
//! daemon implements both over the engine's spaces.
//!
//! ```text
//!   NBD client ──TCP / Unix──▶ Server ──▶ Catalog::open(name) ──▶ Backend
//!                               │ handshake.rs     option haggling → Session
//!                               │ transmission.rs  requests in flight → replies
//!                               │ protocol.rs      wire constants and encoding
//!                               └ server.rs        accept loop, connections, shutdown
//! ```
//!
//! What is offered: fixed newstyle negotiation (no oldstyle, no TLS),
//! `NBD_OPT_GO`/`INFO` with export, block size, name and description,
//! `NBD_OPT_LIST`, structured replies, the `base:allocation` metadata
//! context with `NBD_CMD_BLOCK_STATUS`, and every command of the baseline
//! and the common extensions (FLUSH, FUA, TRIM, WRITE_ZEROES with NO_HOLE
//! and FAST_ZERO, CACHE), with up to
//! [`ServerOptions::max_in_flight_per_connection`] requests in progress per
//! connection and replies in completion order. `NBD_FLAG_CAN_MULTI_CONN` is
//! advertised: a write is answered only once [`Backend::write`] completed,
//! and [`Backend::flush`] covers every connection.
//!
//! Clients can neither crash the server nor make it hold unbounded memory:
//! every request is checked at the edge and answered with the spec's error,
//! option data, payloads and in-flight requests all have limits, and a
//! client vanishing mid-request costs only the connection's own tasks.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

pub mod client;
mod error;
mod handshake;
pub mod protocol;
mod requests;
mod server;
mod threaded;
mod transmission;
mod workers;

pub use error::ConnectionError;
pub use server::{Server, ServerOptions, Socket};

/// NBD error values (proto.md "Error values"); only these go on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errno {
    Perm = 1,
    Io = 5,
    NoMemory = 12,
    Invalid = 22,
    NoSpace = 28,
    Overflow = 75,
    NotSupported = 95,
    Shutdown = 108,
}

/// Block size constraints advertised with NBD_INFO_BLOCK_SIZE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum: u32,
    pub preferred: u32,
    pub maximum: u32,
}

/// A backend's sum of one block of a write (see [`Backend::block_sum`]):
/// the block's bytes and its index in the export.
pub type BlockSum = fn(&[u8], u64) -> u64;

/// The blocks [`Backend::block_sum`] sums.
pub const SUMMED_BLOCK_BYTES: usize = 4096;

/// One extent of a block status reply (`base:allocation`): `flags` bit 0 =
/// hole (NBD_STATE_HOLE), bit 1 = reads as zeroes (NBD_STATE_ZERO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    pub flags: u32,
}

/// What the server needs of an export. Every operation is already within
/// the export, non-empty, and allowed (the server validates ranges and
/// read-only before calling); offsets and lengths need not be aligned to
/// [`BlockSizes`], since clients that never asked for block sizes may send
/// any byte range. Errors come back as NBD error values.
pub trait Backend: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    fn read_only(&self) -> bool;
    fn block_sizes(&self) -> BlockSizes;
    /// A description for NBD_INFO_DESCRIPTION (e.g. "2-way mirror, 4 columns").
    fn description(&self) -> String;
    /// Whether the export is on spinning media (NBD_FLAG_ROTATIONAL): a
    /// client may then schedule its I/O as for a hard disk.
    fn rotational(&self) -> bool {
        false
    }
    /// Exactly `length` bytes (anything else ends the connection's reply
    /// with an I/O error); shared bytes, so that a backend may answer from
    /// memory it keeps without copying.
    fn read(&self, offset: u64, length: u32) -> BoxFuture<'static, Result<Bytes, Errno>>;
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'static, Result<(), Errno>>;
    /// A sum the server takes of each whole [`SUMMED_BLOCK_BYTES`] block of
    /// a write's payload as the block arrives, while its bytes are still
    /// in the cache of the core that received them: `sum(block, index)`
    /// for the block at byte `index * SUMMED_BLOCK_BYTES` of the export.
    /// A backend that sums every block it stores (checksums) saves a pass
    /// over the data later, often on another core, where the bytes must
    /// come from memory again. `None` (the default): no sums are taken.
    fn block_sum(&self) -> Option<BlockSum> {
        None
    }
    /// [`Backend::write`] with the sums of the payload's whole blocks taken
    /// on arrival: `sums[k]` is `block_sum` of bytes
    /// `k * SUMMED_BLOCK_BYTES ..` of `data`. Empty where none were taken
    /// (no `block_sum`, or `offset` not on a block boundary). Every write
    /// comes this way; the default ignores the sums.
    fn write_summed(
        &self,
        offset: u64,
        data: Bytes,
        sums: Vec<u64>,
        fua: bool,
    ) -> BoxFuture<'static, Result<(), Errno>> {
        let _ = sums;
        self.write(offset, data, fua)
    }
    /// Zero a range. With `fast`, fail at once with `NotSupported` unless the
    /// zeroing is cheap (NBD_CMD_FLAG_FAST_ZERO). `may_trim` is false when the
    /// client set NBD_CMD_FLAG_NO_HOLE.
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        may_trim: bool,
        fast: bool,
    ) -> BoxFuture<'static, Result<(), Errno>>;
    fn trim(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<'static, Result<(), Errno>>;
    /// Make every write completed before this call durable — across every
    /// connection to this export (the multi-conn promise).
    fn flush(&self) -> BoxFuture<'static, Result<(), Errno>>;
    /// Prefetch hint (NBD_CMD_CACHE); may do nothing.
    fn cache(&self, offset: u64, length: u64) -> BoxFuture<'static, Result<(), Errno>>;
    /// `base:allocation` status of `[offset, offset + length)`; at least one
    /// extent, covering a prefix of the range.
    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> BoxFuture<'static, Result<Vec<Extent>, Errno>>;
}

/// The exports a server offers, looked up by name at connection time.
pub trait Catalog: Send + Sync + 'static {
    /// Names and descriptions, for NBD_OPT_LIST.
    fn list(&self) -> Vec<(String, String)>;
    /// The export called `name`; the empty name means the default export
    /// (the only one, if there is exactly one).
    fn open(&self, name: &str) -> Option<Arc<dyn Backend>>;
}
