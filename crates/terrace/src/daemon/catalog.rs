//! Spaces as NBD exports.
//!
//! Each space is served under its export name, fixed at its creation, and
//! its alias `POOL/SPACE` (see `names.rs`); a client that names no export
//! gets the one space when there is one.
//! Either may be prefixed with [`SOLE_WRITER_PREFIX`] by a client that
//! must be the space's only one.

use std::sync::{Arc, Mutex, Weak};

use futures::future::BoxFuture;
use futures::FutureExt;
use terrace_engine::count;
use terrace_engine::layout::{Geometry, Layout};
use terrace_engine::{mirror_stream_reach_bytes, EngineError, Space};
use terrace_export::protocol::{NBD_STATE_HOLE, NBD_STATE_ZERO};
use terrace_export::{Backend, BlockSizes, BlockSum, Catalog, Errno, Extent};

use super::names::{alias, exports};
use super::readahead::{Fetch, ReadAhead, WINDOW_MAX_BYTES};
use super::registry::{Connection, Registry};

/// Largest request a client may send: 32 MiB, the protocol's portable limit
/// (and half the engine's request limit).
const PAYLOAD_MAX_BYTES: u32 = 32 << 20;

/// An export name `sole-writer:NAME` opens space NAME for a client that
/// will write over it all (`terrace bench`): refused, as an unknown export,
/// while any other client has the space open. (Space names cannot hold a
/// colon, so no space is shadowed.)
pub const SOLE_WRITER_PREFIX: &str = "sole-writer:";

pub struct SpaceBackend {
    /// Counted as a connection to the space while it lasts (none outside
    /// the catalog). First, so it goes before the space does.
    _connection: Option<Connection>,
    space: Arc<Space>,
    description: String,
    /// Shared by every connection to the space (see `readahead.rs`).
    readahead: Arc<ReadAhead>,
}

/// The one mapping of engine errors to NBD error values (NBD `proto.md`,
/// "Error values"): a write past the end, or to a thin space's unallocated
/// extent when the pool is full, is `ENOSPC`, a write to a
/// read-only pool `EPERM` (what the protocol defines for a write or trim
/// on a read-only export), a request over the limit `EINVAL`, a closing
/// pool `ESHUTDOWN`; anything else is an I/O error.
fn errno(error: &EngineError) -> Errno {
    match error {
        EngineError::OutOfRange { .. } | EngineError::PoolFull { .. } => Errno::NoSpace,
        EngineError::TooLarge { .. } => Errno::Invalid,
        EngineError::ReadOnly { .. } => Errno::Perm,
        EngineError::Closed { .. } => Errno::Shutdown,
        _ => Errno::Io,
    }
}

/// Requests the engine refused as invalid though the export let them
/// through: a limit the export does not advertise (a defect) or one a
/// client broke. The first few are logged; no more, so that a client
/// repeating one cannot fill the log.
const REFUSALS_LOGGED_MAX: u64 = 16;

static REFUSALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn map<T>(result: Result<T, EngineError>) -> Result<T, Errno> {
    result.map_err(|error| {
        let errno = errno(&error);
        if errno == Errno::Invalid {
            let seen = REFUSALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if seen < REFUSALS_LOGGED_MAX {
                super::log(format!("request refused as invalid: {error}"));
            } else if seen == REFUSALS_LOGGED_MAX {
                super::log("further requests refused as invalid are not logged");
            }
        }
        errno
    })
}

/// "2-way mirror, 4 columns, 256K interleave".
fn describe(space: &Space) -> String {
    let geometry = space.geometry();
    format!(
        "{}, {}, {} interleave",
        geometry.layout(),
        count(geometry.columns(), "column"),
        crate::units::format_size(geometry.interleave_bytes())
    )
}

/// A read-ahead for `space`, reading through a weak reference (the catalog
/// keeps read-aheads beyond a space's life until it next looks).
fn readahead_for(space: &Arc<Space>) -> Arc<ReadAhead> {
    let weak = Arc::downgrade(space);
    let fetch: Fetch = Arc::new(move |offset, length| {
        let space = weak.upgrade();
        async move {
            let space = space?;
            space
                .read(offset, length)
                .await
                .ok()
                .map(|data| data.freeze())
        }
        .boxed()
    });
    let geometry = space.geometry();
    Arc::new(ReadAhead::new(
        geometry.row_data_bytes(),
        window_bytes(geometry),
        fetch,
    ))
}

/// How far a space's streams are read ahead at most: the usual window, or
/// for a mirror as far as its copies need to stream their own regions at
/// once.
fn window_bytes(geometry: &Geometry) -> u64 {
    match geometry.layout() {
        Layout::Mirror { .. } => mirror_stream_reach_bytes(geometry),
        _ => WINDOW_MAX_BYTES,
    }
}

impl SpaceBackend {
    /// A backend with a read-ahead of its own (outside the catalog).
    pub fn for_space(space: Arc<Space>) -> SpaceBackend {
        let readahead = readahead_for(&space);
        SpaceBackend::new(space, readahead)
    }

    pub fn new(space: Arc<Space>, readahead: Arc<ReadAhead>) -> SpaceBackend {
        SpaceBackend {
            _connection: None,
            description: describe(&space),
            space,
            readahead,
        }
    }

    /// Whether zeroing `[offset, offset + length)` is cheap: whole rows
    /// become device-level zeroing; partial parity rows would need a
    /// read-modify-write.
    fn zeroing_is_fast(&self, offset: u64, length: u64) -> bool {
        let geometry = self.space.geometry();
        match geometry.layout() {
            Layout::Simple | Layout::Mirror { .. } => true,
            Layout::Parity { .. } => {
                let row = geometry.row_data_bytes();
                offset.is_multiple_of(row) && length.is_multiple_of(row)
            }
        }
    }
}

impl Backend for SpaceBackend {
    fn size_bytes(&self) -> u64 {
        self.space.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.space.is_read_only()
    }

    fn rotational(&self) -> bool {
        self.space.rotational()
    }

    fn block_sizes(&self) -> BlockSizes {
        // Any byte granularity works; 512 keeps clients from sending less.
        // The preferred size is the write that needs no read-modify-write
        // when that is a power of two (the protocol requires one), else the
        // interleave.
        let natural = self.space.natural_write_bytes();
        let preferred = if natural.is_power_of_two() {
            natural
        } else {
            self.space.geometry().interleave_bytes()
        };
        BlockSizes {
            minimum: 512,
            preferred: preferred.min(u64::from(PAYLOAD_MAX_BYTES)) as u32,
            maximum: PAYLOAD_MAX_BYTES,
        }
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'static, Result<bytes::Bytes, Errno>> {
        let space = self.space.clone();
        let length = u64::from(length);
        let mut lookup = self.readahead.read(offset, length, space.size_bytes());
        async move {
            let result = match lookup.gather(length).await {
                Some(data) => Ok(data),
                None => map(space.read(offset, length).await).map(|data| data.freeze()),
            };
            // The read is in flight for its stream until here.
            drop(lookup);
            result
        }
        .boxed()
    }

    fn write(
        &self,
        offset: u64,
        data: bytes::Bytes,
        fua: bool,
    ) -> BoxFuture<'static, Result<(), Errno>> {
        self.write_summed(offset, data, Vec::new(), fua)
    }

    fn block_sum(&self) -> Option<BlockSum> {
        let sum: BlockSum = terrace_engine::meta::sums::block_sum;
        self.space.uses_write_sums().then_some(sum)
    }

    fn write_summed(
        &self,
        offset: u64,
        data: bytes::Bytes,
        sums: Vec<u64>,
        fua: bool,
    ) -> BoxFuture<'static, Result<(), Errno>> {
        let space = self.space.clone();
        let readahead = self.readahead.clone();
        let length = data.len() as u64;
        async move {
            let result = space.write_summed(offset, data, sums, fua).await;
            readahead.changed(offset, length);
            map(result)
        }
        .boxed()
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        _may_trim: bool,
        fast: bool,
    ) -> BoxFuture<'static, Result<(), Errno>> {
        if fast && !self.zeroing_is_fast(offset, length) {
            return futures::future::ready(Err(Errno::NotSupported)).boxed();
        }
        let space = self.space.clone();
        let readahead = self.readahead.clone();
        async move {
            let result = space.write_zeroes(offset, length, fua).await;
            readahead.changed(offset, length);
            map(result)
        }
        .boxed()
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<'static, Result<(), Errno>> {
        let space = self.space.clone();
        let readahead = self.readahead.clone();
        async move {
            let result = space.trim(offset, length).await;
            readahead.changed(offset, length);
            map(result)?;
            if fua {
                map(space.flush().await)?;
            }
            Ok(())
        }
        .boxed()
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), Errno>> {
        let space = self.space.clone();
        async move { map(space.flush().await) }.boxed()
    }

    fn cache(&self, offset: u64, length: u64) -> BoxFuture<'static, Result<(), Errno>> {
        // Read into the space's read-ahead; the reply does not wait.
        self.readahead
            .prefetch(offset, length, self.space.size_bytes());
        futures::future::ready(Ok(())).boxed()
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> BoxFuture<'static, Result<Vec<Extent>, Errno>> {
        // Blocks known to read as zeroes are holes clients may skip (a
        // fixed space keeps them allocated); everything else is data.
        let space = self.space.clone();
        async move {
            let runs = map(space.block_status(offset, length).await)?;
            Ok(runs
                .into_iter()
                .map(|(length, zero)| Extent {
                    length: length as u32,
                    flags: if zero {
                        NBD_STATE_HOLE | NBD_STATE_ZERO
                    } else {
                        0
                    },
                })
                .collect())
        }
        .boxed()
    }
}

/// Every space of every pool of the registry.
pub struct SpaceCatalog {
    registry: Arc<Registry>,
    /// One read-ahead per space, shared by its connections.
    readaheads: Mutex<Vec<(Weak<Space>, Arc<ReadAhead>)>>,
}

impl SpaceCatalog {
    pub fn new(registry: Arc<Registry>) -> SpaceCatalog {
        SpaceCatalog {
            registry,
            readaheads: Mutex::new(Vec::new()),
        }
    }

    /// The read-ahead of `space`, made on its first connection; those of
    /// spaces gone are dropped.
    fn readahead(&self, space: &Arc<Space>) -> Arc<ReadAhead> {
        let mut readaheads = self.readaheads.lock().unwrap_or_else(|e| e.into_inner());
        readaheads.retain(|(weak, _)| weak.strong_count() > 0);
        if let Some((_, readahead)) = readaheads
            .iter()
            .find(|(weak, _)| std::ptr::eq(weak.as_ptr(), Arc::as_ptr(space)))
        {
            return readahead.clone();
        }
        let readahead = readahead_for(space);
        readaheads.push((Arc::downgrade(space), readahead.clone()));
        readahead
    }
}

impl Catalog for SpaceCatalog {
    /// Each space once, under the name it is served by.
    fn list(&self) -> Vec<(String, String)> {
        exports(&self.registry)
            .iter()
            .map(|export| (export.served_name(), describe(&export.space)))
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Backend>> {
        let (name, sole_writer) = match name.strip_prefix(SOLE_WRITER_PREFIX) {
            Some(name) => (name, true),
            None => (name, false),
        };
        let all = exports(&self.registry);
        let found = if name.is_empty() {
            (all.len() == 1).then(|| all[0].space.clone())
        } else {
            all.iter()
                .find(|export| export.served_by.is_none() && export.name == name)
                .or_else(|| {
                    all.iter()
                        .find(|export| alias(&export.pool, export.space.name()) == name)
                })
                .map(|export| export.space.clone())
        };
        found.and_then(|space| {
            let connection = if sole_writer {
                self.registry.connect_sole_writer(&space)?
            } else {
                self.registry.connect(&space)
            };
            let readahead = self.readahead(&space);
            let backend = SpaceBackend {
                _connection: Some(connection),
                ..SpaceBackend::new(space, readahead)
            };
            Some(Arc::new(backend) as Arc<dyn Backend>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_the_nbd_error_values_the_protocol_defines() {
        let space = || "vm".to_string();
        let read_only = EngineError::ReadOnly {
            pool: "tank".into(),
            reason: "imported read-only on request".into(),
        };
        assert_eq!(errno(&read_only), Errno::Perm);
        let outside = EngineError::OutOfRange {
            space: space(),
            offset: 1 << 20,
            length: 4096,
            size_bytes: 1 << 20,
        };
        assert_eq!(errno(&outside), Errno::NoSpace);
        let large = EngineError::TooLarge {
            space: space(),
            length: 1 << 30,
            limit: 64 << 20,
        };
        assert_eq!(errno(&large), Errno::Invalid);
        let closed = EngineError::Closed {
            pool: "tank".into(),
        };
        assert_eq!(errno(&closed), Errno::Shutdown);
        let unavailable = EngineError::Unavailable {
            space: space(),
            offset: 0,
            length: 4096,
            reason: "2 of its disks are failed".into(),
        };
        assert_eq!(errno(&unavailable), Errno::Io);
    }

    #[test]
    fn a_mirror_is_read_ahead_a_region_of_every_copy_of_every_column() {
        let window = |layout, columns| {
            window_bytes(&Geometry::new(layout, columns, 256 << 10, 1 << 30).unwrap())
        };
        let mib = 1 << 20;
        assert_eq!(window(Layout::Simple, 8), WINDOW_MAX_BYTES);
        assert_eq!(
            window(Layout::Parity { redundancy: 2 }, 8),
            WINDOW_MAX_BYTES
        );
        assert_eq!(window(Layout::Mirror { copies: 2 }, 4), 32 * mib);
        assert_eq!(window(Layout::Mirror { copies: 3 }, 2), 24 * mib);
    }
}
