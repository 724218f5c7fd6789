//! What the journal needs from the volume it fronts (its home) and from
//! the volume its ring lies in (its log): both are a [`HomeIo`].
//!
//! The journal is generic over this trait and imports nothing above it:
//! not the space, the pool or its control. The space implements it (in
//! `cache`, which builds journals); the simulation and tests reach the
//! journal only through a space. Every method is static dispatch: a
//! journaled write costs no virtual call per block.
//!
//! Depends on: `error`, `payload`, and the io and layout crates.

use std::future::Future;

use futures::future::BoxFuture;
use terrace_io::env::Env;
use terrace_io::BytesMut;
use terrace_layout::Geometry;
use terrace_meta::SpaceId;

use crate::error::EngineError;
use crate::payload::Payload;

/// A volume as the journal sees it, whether its home or its log.
pub trait HomeIo: Send + Sync + 'static {
    fn id(&self) -> SpaceId;
    /// For errors and logs.
    fn name(&self) -> &str;
    fn size_bytes(&self) -> u64;
    fn geometry(&self) -> &Geometry;
    /// The write size that needs no read-modify-write: a parity row's data,
    /// else the interleave.
    fn natural_write_bytes(&self) -> u64;
    /// Whether every extent under the range has all its copies: only then
    /// may a write go straight to the disks past the log.
    fn healthy_for(&self, offset: u64, length: u64) -> bool;
    /// Whether FUA costs the volume's disks nothing (no volatile cache, or
    /// a power-loss-protected one).
    fn cheap_fua(&self) -> bool;

    /// Read a range from the volume's disks (what a journal in front holds
    /// is the journal's to lay over it). Boxed: a journal's read may read
    /// its log, a volume too, so the future's type would contain itself. One box per read request
    /// (a log read-back is one request per run of blocks), none per block.
    fn read(&self, offset: u64, length: u64) -> BoxFuture<'_, Result<BytesMut, EngineError>>;
    /// The range as each copy holds it, read on its own (a mirror: one
    /// result per copy); by default one [`HomeIo::read`].
    fn read_copies(
        &self,
        offset: u64,
        length: u64,
    ) -> BoxFuture<'_, Vec<Result<BytesMut, EngineError>>> {
        Box::pin(async move { vec![self.read(offset, length).await] })
    }
    /// Write straight to the disks, past any journal in front.
    fn write_home(
        &self,
        offset: u64,
        data: impl Into<Payload> + Send,
        fua: bool,
    ) -> impl Future<Output = Result<(), EngineError>> + Send;
    /// Write sorted pieces within one row as one update of the row.
    fn write_home_merged(
        &self,
        pieces: &[(u64, Payload)],
    ) -> impl Future<Output = Result<(), EngineError>> + Send;
    /// Flush the volume's own disks (the log's group commit).
    fn flush_own_disks(&self) -> impl Future<Output = Result<(), EngineError>> + Send;
    /// Flush every disk of the pool (after writing dirty data home).
    fn flush_pool_disks(&self) -> impl Future<Output = Result<(), EngineError>> + Send;

    /// The clock and timers.
    fn env(&self) -> &dyn Env;
    /// Take `bytes` of the pool's log memory if it has room for them.
    fn log_memory_take(&self, bytes: u64) -> bool;
    /// Give back what [`HomeIo::log_memory_take`] took.
    fn log_memory_give_back(&self, bytes: u64);
    /// Tell the pool's subscribers of `event` (a log failing over).
    fn emit(&self, event: crate::PoolEvent);
    /// The journal in front turned write-through: no working log accounts
    /// for this volume's writes from now on, which go straight to its
    /// disks. Called before the first of them.
    fn log_failed(&self);
}

/// Where the journal commits its ring's tail: the pool's metadata, reached
/// through the cache subsystem, which provides this. Called once per tail
/// move (a destage round at most), so a virtual call is no cost.
pub trait Checkpoints: Send + Sync {
    /// Commit that the ring of space `home` starts at `position` (bytes
    /// appended since the ring started), log byte `offset`.
    fn commit_tail(
        &self,
        home: SpaceId,
        position: u64,
        offset: u64,
    ) -> BoxFuture<'_, Result<(), EngineError>>;
}
