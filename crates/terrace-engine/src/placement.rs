//! Where a space's slabs go, and the run-time space a record describes.
//!
//! The planning half is pure: a new space's columns are chosen (or
//! checked) against the disks and fault domains that have free slabs, and
//! its extents placed ([`plan_space`]); a growing space's new extents are
//! placed like its first ([`allocate_growth`]). When the chosen width
//! cannot be placed for lack of free slabs on enough disks, an automatic
//! choice narrows until it fits, and the reason says so. The other half
//! builds a [`Space`] from its record ([`build_space`]) and prepares new
//! slabs on disk: zeroed for a space ([`zero_slabs`]), written once for a
//! log on a sparse file ([`preallocate_log`]). Creating, growing and
//! deleting spaces (`admin`) and their logs (`cache`) use it; it knows no
//! pool above the shared state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::join_all;
use terrace_io::BlockDevice;
use terrace_layout::{choose_columns, ColumnChoice, Geometry, Layout, INTERLEAVE_DEFAULT_BYTES};
use terrace_meta::{
    Allocator, DiskRecord, ExtentRecord, FaultDomain, PlacementError, PoolMetadata, Provisioning,
    SlabRef, SpaceId, SpaceRecord, SpaceRole,
};

use crate::control::PoolShared;
use crate::error::EngineError;
use crate::layouts::reason::{columns_reason, count};
use crate::space::Space;
use crate::units::format_size;
use crate::volume::{SpaceMap, Target, Volume};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpaceSize {
    Bytes(u64),
    /// As large as the pool's free slabs allow.
    Max,
}

#[derive(Debug, Clone)]
pub struct SpaceConfig {
    pub name: String,
    pub layout: Layout,
    pub columns: Option<u32>,
    /// `None`: 256 KiB, or the slab size if slabs are smaller.
    pub interleave_bytes: Option<u64>,
    pub size: SpaceSize,
    /// Fault-domain level; `None` picks the coarsest level the disks label.
    pub fault_domain: Option<FaultDomain>,
    /// Write-back cache size: `None` for the default (1 GiB with journal
    /// disks, 32 MiB for parity without), `Some(0)` for none.
    pub cache_bytes: Option<u64>,
    /// The NBD export name, fixed for the space's life; `None`: its name.
    pub export: Option<String>,
    /// A parity space that cannot get its default log is refused rather
    /// than created without one (the daemon's rule: a parity space has no
    /// log only when asked for none). Off, the default log is best effort.
    pub require_default_log: bool,
    /// Keep a sum of every block (the default); off, reads are not checked.
    pub checksums: bool,
    /// Fixed (every extent allocated now, the default) or thin (each
    /// extent on its first write; see `crate::thin`).
    pub provisioning: Provisioning,
}

impl SpaceConfig {
    pub fn new(name: impl Into<String>, layout: Layout, size: SpaceSize) -> SpaceConfig {
        SpaceConfig {
            name: name.into(),
            layout,
            columns: None,
            interleave_bytes: None,
            size,
            fault_domain: None,
            cache_bytes: None,
            export: None,
            require_default_log: false,
            checksums: true,
            provisioning: Provisioning::Fixed,
        }
    }

    /// The export name the space gets.
    pub fn export_name(&self) -> &str {
        self.export.as_deref().unwrap_or(&self.name)
    }
}

/// Give every data space without an export name one, as the import of a
/// pool of a slot format that stored none does: its own name, unless
/// `taken` (other open pools' export names) or one of this pool's has it,
/// else `POOL/SPACE`, which no other name can be (names have no `/`). It
/// is stored with the next commit and never changes again.
pub fn settle_export_names(metadata: &mut PoolMetadata, taken: &[String]) {
    let pool = metadata.name.clone();
    for index in 0..metadata.spaces.len() {
        let space = &metadata.spaces[index];
        if space.export.is_some() || space.role != SpaceRole::Data {
            continue;
        }
        let name = space.name.clone();
        let in_use = taken.contains(&name)
            || metadata
                .spaces
                .iter()
                .any(|other| other.export.as_deref() == Some(name.as_str()));
        metadata.spaces[index].export = Some(if in_use {
            format!("{pool}/{name}")
        } else {
            name
        });
    }
}

/// The coarsest fault-domain level that every capacity disk is labelled
/// with and that has at least two domains.
pub fn default_fault_domain(metadata: &PoolMetadata) -> FaultDomain {
    let capacity: Vec<(usize, &DiskRecord)> = metadata
        .disks
        .iter()
        .enumerate()
        .filter(|(_, disk)| disk.takes_capacity())
        .collect();
    for level in [FaultDomain::Node, FaultDomain::Enclosure] {
        let labelled = capacity.iter().all(|(_, disk)| match level {
            FaultDomain::Node => !disk.node.is_empty(),
            _ => !disk.enclosure.is_empty(),
        });
        let domains: std::collections::BTreeSet<String> = capacity
            .iter()
            .map(|(index, disk)| disk.domain_key(terrace_meta::DiskIndex(*index as u16), level))
            .collect();
        if labelled && !capacity.is_empty() && domains.len() >= 2 {
            return level;
        }
    }
    FaultDomain::Disk
}

/// Copies of a space's hidden log or sums: one more than the failures the
/// space survives, so they survive as many, and never fewer than two (a
/// simple space's still outlive one disk).
pub fn hidden_copies(layout: Layout) -> u32 {
    (layout.failures_tolerated() + 1).max(2)
}

/// Bytes of sums pages a space of `size_bytes` needs (0.2 % of it).
pub(crate) fn sums_bytes(size_bytes: u64) -> u64 {
    sums_pages(size_bytes) * terrace_meta::sums::SUMS_PAGE_BYTES as u64
}

pub(crate) fn sums_pages(size_bytes: u64) -> u64 {
    terrace_meta::sums::pages_for(size_bytes.div_ceil(terrace_layout::BLOCK_BYTES))
}

/// Bytes of the sums space of a space of `size_bytes`: its pages, then
/// their journal (`crate::sums`, docs/ON_DISK_FORMAT.md).
pub(crate) fn sums_space_bytes(size_bytes: u64) -> u64 {
    let pages = sums_pages(size_bytes);
    (pages + terrace_meta::sums::journal_pages_for(pages))
        * terrace_meta::sums::SUMS_PAGE_BYTES as u64
}

/// Pages of journal a sums space of `sums_size` bytes keeps for a space of
/// `size_bytes`: what it has beyond the pages (0 for sums spaces made
/// before there were journals, which hold the pages alone).
pub(crate) fn sums_journal_pages(size_bytes: u64, sums_size: u64) -> u64 {
    let pages = sums_pages(size_bytes);
    let have = sums_size / terrace_meta::sums::SUMS_PAGE_BYTES as u64;
    match have.checked_sub(pages) {
        Some(extra) if extra >= terrace_meta::sums::journal_pages_for(0) => extra,
        _ => 0,
    }
}

/// Whether `owner`'s sums space was made with it (the same creation time,
/// which only a space created with its sums gives both): both on zeroed
/// slabs, so a sums page never written covers blocks never written, zero.
/// Sums added later (`pool upgrade`, checksums turned on) cover data
/// already there: such a page's sums are unknown.
pub(crate) fn sums_made_with(metadata: &PoolMetadata, owner: &SpaceRecord) -> bool {
    metadata
        .spaces
        .iter()
        .find(|space| Some(space.id) == owner.sums)
        .is_some_and(|sums| sums.created_ns == owner.created_ns)
}

/// Plan the hidden sums space of space `owner` into `next` (see
/// docs/design/integrity.md): a mirror of [`hidden_copies`] copies on the
/// capacity disks, on distinct fault domains of the owner's level where
/// there are enough (else distinct disks), as many copies as there are
/// disks where fewer (one disk: one copy). Names it in the owner's
/// record. Refused when it does not fit.
pub(crate) fn plan_sums(
    shared: &Arc<PoolShared>,
    next: &mut PoolMetadata,
    owner: SpaceId,
) -> Result<SpaceRecord, EngineError> {
    let owner_record = next
        .space_by_id(owner)
        .ok_or(EngineError::NoSuchSpace {
            name: format!("#{}", owner.0),
        })?
        .clone();
    let bytes = sums_space_bytes(owner_record.size_bytes);
    let now = shared.env.wall_clock_ns();
    let mut refusal = None;
    for level in [owner_record.fault_domain, FaultDomain::Disk] {
        let allocator = shared.allocator(next, level, |_, disk| disk.takes_capacity());
        let (disks, domains) = allocator.usable_disks_and_domains();
        let room = if level == FaultDomain::Disk {
            disks
        } else {
            domains as u32
        };
        let copies = hidden_copies(owner_record.layout).min(room);
        let layout = match copies {
            0 | 1 => Layout::Simple,
            copies => Layout::Mirror { copies },
        };
        let config = SpaceConfig {
            columns: Some(1),
            // A thin space's sums are thin too: their pages take room as
            // the space's extents do (`Volume::provide`).
            provisioning: owner_record.provisioning,
            ..SpaceConfig::new(
                format!(".sums-{}", owner.0),
                layout,
                SpaceSize::Bytes(bytes),
            )
        };
        let planned = plan_space(&config, next, allocator.clone(), level, now).and_then(
            |(mut record, geometry)| {
                // Their journal is written at any time: it has its room.
                let journal_start = sums_pages(owner_record.size_bytes)
                    * terrace_meta::sums::SUMS_PAGE_BYTES as u64
                    / geometry.extent_data_bytes();
                let mut allocator = allocator;
                for extent in record.extents.iter_mut().skip(journal_start as usize) {
                    if extent.slabs.is_none() {
                        extent.slabs = Some(allocator.allocate_extent(&geometry)?);
                    }
                }
                Ok((record, geometry))
            },
        );
        match planned {
            Ok((mut record, _)) => {
                record.role = SpaceRole::Sums { owner };
                record.export = None;
                record.columns_reason = format!(
                    "the block sums of space {}: {}",
                    owner_record.name,
                    match copies {
                        0 | 1 => "1 copy".to_string(),
                        n => format!("{n} copies"),
                    }
                );
                next.next_space_id += 1;
                next.spaces.push(record.clone());
                if let Some(owner) = next.spaces.iter_mut().find(|s| s.id == owner) {
                    owner.sums = Some(record.id);
                }
                return Ok(record);
            }
            Err(EngineError::NoCapacity { detail, .. }) => {
                refusal = Some(EngineError::NoCapacity {
                    space: owner_record.name.clone(),
                    detail: format!("its block sums: {detail}"),
                });
            }
            Err(other) => refusal = Some(other),
        }
        if level == FaultDomain::Disk {
            break;
        }
    }
    Err(refusal.expect("tried at least one level"))
}

/// Make `sums` (a sums space's volume, built from its record) keep the
/// sums of `space`'s blocks.
/// `fresh`: its slabs were zeroed just now; `zeroes`: the space was made
/// with its sums, both on zeroed slabs (a block whose sums page was never
/// written is zero; see [`sums_made_with`]).
pub(crate) fn attach_sums(space: &Volume, sums: &Arc<Volume>, fresh: bool, zeroes: bool) {
    // One writer per page at a time (the page cache's write-back): no
    // write intent; a page's copies are settled by its generation.
    sums.set_disjoint_writes();
    sums.set_sums_journal_pages(sums_journal_pages(space.size_bytes(), sums.size_bytes()));
    let space_sums = crate::sums::SpaceSums::new(
        space.id(),
        sums.clone() as Arc<dyn crate::sums::SumsStore>,
        fresh,
    );
    space_sums.set_blank_zeroes(zeroes);
    space.attach_sums(Arc::new(space_sums));
}

/// How many disks serve logs.
pub(crate) fn journal_disks(metadata: &PoolMetadata) -> usize {
    metadata.disks.iter().filter(|d| d.serves_logs()).count()
}

/// Choose columns and place every extent; nothing is written.
pub(crate) fn plan_space(
    config: &SpaceConfig,
    metadata: &PoolMetadata,
    allocator: Allocator,
    level: FaultDomain,
    now: u64,
) -> Result<(SpaceRecord, Geometry), EngineError> {
    let layout = config.layout;
    let (disks, domains) = allocator.usable_disks_and_domains();
    // Columns in one redundancy group each need a domain of their own.
    let usable = if layout.row_wide_redundancy() {
        disks.min(domains as u32)
    } else {
        disks
    };
    let group = layout.fault_domain_group();
    if level != FaultDomain::Disk && (domains as u32) < group {
        return Err(PlacementError::FaultDomains {
            level,
            needed: group as usize,
            available: domains,
        }
        .into());
    }
    let mut choice = choose_columns(layout, config.columns, usable)?;
    let mut reason = columns_reason(layout, &choice);
    if level != FaultDomain::Disk {
        reason.push_str(&format!("; {domains} {level:?} fault domains"));
    }
    let first_columns = choice.columns;
    let interleave_bytes = config
        .interleave_bytes
        .unwrap_or(INTERLEAVE_DEFAULT_BYTES.min(metadata.slab_bytes));
    loop {
        let geometry = Geometry::new(
            layout,
            choice.columns,
            interleave_bytes,
            metadata.slab_bytes,
        )?;
        match place(
            config.size,
            config.provisioning,
            &geometry,
            allocator.clone(),
        ) {
            Ok((size_bytes, extents)) => {
                if choice.columns < first_columns {
                    reason = format!(
                        "{} columns: reduced from {first_columns} because free slabs remain on too few disks for wider extents",
                        choice.columns
                    );
                }
                let planned = Planned {
                    choice,
                    reason,
                    level,
                    created_ns: now,
                    geometry,
                    size_bytes,
                    extents,
                };
                return Ok((record(config, metadata, planned), geometry));
            }
            Err(error) => {
                let out_of_space = matches!(
                    error,
                    EngineError::Placement(PlacementError::OutOfSpace { .. })
                );
                let can_narrow = config.columns.is_none() && choice.columns > layout.min_columns();
                if out_of_space && !can_narrow {
                    let (wanted, extents) =
                        match config.size {
                            SpaceSize::Bytes(bytes) => (
                                format!("{} as {}", format_size(bytes), shape(&geometry)),
                                Some(geometry.extents_for(
                                    bytes.next_multiple_of(terrace_layout::BLOCK_BYTES),
                                )),
                            ),
                            SpaceSize::Max => (shape(&geometry), None),
                        };
                    let free = Room::of(&allocator);
                    return Err(no_capacity(&config.name, wanted, extents, &geometry, free));
                }
                if !can_narrow || !out_of_space {
                    return Err(error);
                }
                choice = ColumnChoice {
                    columns: choice.columns - 1,
                    ..choice
                };
            }
        }
    }
}

/// The refusal of a space, a growth or a cache that does not fit: what it
/// asks for (`wanted`, placed as `extents` of `geometry`, or at least one
/// when `None`) and what the disks it may use have (`free`, before any of
/// it was placed). "Not enough free capacity" alone left the user to work
/// out whether the size, the layout or the disks were at fault.
fn no_capacity(
    space: &str,
    wanted: String,
    extents: Option<u64>,
    geometry: &Geometry,
    free: Room,
) -> EngineError {
    let per_extent = u64::from(geometry.slots_per_extent());
    let slab = format_size(geometry.slab_bytes());
    let needs = match extents {
        Some(extents) => format!(
            "needs {} slabs of {slab} ({} raw), {per_extent} per {} of data on distinct disks",
            extents * per_extent,
            format_size(extents * per_extent * geometry.slab_bytes()),
            format_size(geometry.extent_data_bytes()),
        ),
        None => format!("needs at least {per_extent} slabs of {slab} on distinct disks"),
    };
    EngineError::NoCapacity {
        space: space.to_string(),
        detail: format!(
            "{wanted} {needs}; the disks it may use have {} free slabs ({}) on {} disks",
            free.slabs,
            format_size(free.slabs * geometry.slab_bytes()),
            free.disks,
        ),
    }
}

/// The extents a space (or a log) of `have` extents needs more to hold
/// `requested` bytes, taken from `allocator`. Refused, when they do not
/// fit, with what the growth (`growth()` says which) needs and what the
/// disks have.
pub(crate) fn allocate_growth(
    allocator: &mut Allocator,
    geometry: &Geometry,
    have: u64,
    requested: u64,
    space: &str,
    growth: impl FnOnce() -> String,
) -> Result<Vec<ExtentRecord>, EngineError> {
    let wanted = geometry.extents_for(requested) - have;
    let free = Room::of(allocator);
    (0..wanted)
        .map(|_| {
            allocator
                .allocate_extent(geometry)
                .map(|slabs| ExtentRecord { slabs: Some(slabs) })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| match error {
            PlacementError::OutOfSpace { .. } => {
                no_capacity(space, growth(), Some(wanted), geometry, free)
            }
            other => other.into(),
        })
}

/// Free slabs, and the disks holding them, that an allocation may use.
#[derive(Debug, Clone, Copy)]
struct Room {
    slabs: u64,
    disks: u32,
}

impl Room {
    fn of(allocator: &Allocator) -> Room {
        Room {
            slabs: allocator.free_slabs(),
            disks: allocator.usable_disks_and_domains().0,
        }
    }
}

/// "a 2-way mirror space over 1 column"
pub(crate) fn shape(geometry: &Geometry) -> String {
    let columns = count(geometry.columns(), "column");
    format!("a {} space over {columns}", geometry.layout())
}

/// A space fully planned: its shape and where every extent goes.
struct Planned {
    choice: ColumnChoice,
    /// Why, in words (stored with the space).
    reason: String,
    level: FaultDomain,
    created_ns: u64,
    geometry: Geometry,
    size_bytes: u64,
    extents: Vec<ExtentRecord>,
}

fn record(config: &SpaceConfig, metadata: &PoolMetadata, planned: Planned) -> SpaceRecord {
    SpaceRecord {
        id: SpaceId(metadata.next_space_id),
        name: config.name.clone(),
        export: Some(config.export_name().to_string()),
        layout: config.layout,
        columns: planned.choice.columns,
        interleave_bytes: planned.geometry.interleave_bytes(),
        size_bytes: planned.size_bytes,
        provisioning: config.provisioning,
        fault_domain: planned.level,
        created_ns: planned.created_ns,
        columns_reason: planned.reason,
        role: SpaceRole::Data,
        cache: None,
        sums: None,
        checksums: config.checksums,
        extents: planned.extents,
    }
}

/// Allocate the extents of a fixed space of `size`; of a thin one, none
/// (but one must fit: a space none of whose extents could ever be placed
/// is refused now rather than at its first write).
fn place(
    size: SpaceSize,
    provisioning: Provisioning,
    geometry: &Geometry,
    mut allocator: Allocator,
) -> Result<(u64, Vec<ExtentRecord>), EngineError> {
    let block = terrace_layout::BLOCK_BYTES;
    let allocated = |extents: Vec<Vec<SlabRef>>| {
        extents
            .into_iter()
            .map(|slabs| ExtentRecord { slabs: Some(slabs) })
            .collect()
    };
    if provisioning == Provisioning::Thin {
        let SpaceSize::Bytes(bytes @ 1..) = size else {
            return Err(EngineError::InvalidSetting {
                what: "thin space size",
                value: 0,
                rule: "a thin space needs a size, which may exceed the pool's capacity",
            });
        };
        allocator.allocate_extent(geometry)?;
        let size_bytes = bytes.next_multiple_of(block);
        let extents = vec![ExtentRecord { slabs: None }; geometry.extents_for(size_bytes) as usize];
        return Ok((size_bytes, extents));
    }
    match size {
        SpaceSize::Bytes(0) => Err(EngineError::InvalidSetting {
            what: "space size",
            value: 0,
            rule: "at least 4K",
        }),
        SpaceSize::Bytes(bytes) => {
            let size_bytes = bytes.next_multiple_of(block);
            let extents = (0..geometry.extents_for(size_bytes))
                .map(|_| allocator.allocate_extent(geometry))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((size_bytes, allocated(extents)))
        }
        SpaceSize::Max => {
            let mut extents = Vec::new();
            let first_error = loop {
                match allocator.allocate_extent(geometry) {
                    Ok(slabs) => extents.push(slabs),
                    Err(error) => break error,
                }
            };
            if extents.is_empty() {
                return Err(first_error.into());
            }
            Ok((
                extents.len() as u64 * geometry.extent_data_bytes(),
                allocated(extents),
            ))
        }
    }
}

/// The run-time space for a data space's metadata record: its volume
/// with the client's side in front.
pub(crate) fn build_space(
    shared: &Arc<PoolShared>,
    metadata: &PoolMetadata,
    record: &SpaceRecord,
) -> Result<Space, EngineError> {
    let volume = build_volume(shared, metadata, record)?;
    if record.provisioning == Provisioning::Thin {
        volume.set_thin();
    }
    let mut space = Space::around(Arc::new(volume));
    space.export = record.export.clone();
    Ok(space)
}

/// The run-time volume for a metadata record: all of a log, the block
/// layer of a data space.
pub(crate) fn build_volume(
    shared: &Arc<PoolShared>,
    metadata: &PoolMetadata,
    record: &SpaceRecord,
) -> Result<Volume, EngineError> {
    let geometry = record.geometry(metadata.slab_bytes)?;
    let map = SpaceMap::new(
        record.size_bytes,
        targets(shared, metadata, &record.extents)?,
    );
    Ok(Volume::new(
        shared.clone(),
        record.id,
        record.name.clone(),
        geometry,
        map,
    ))
}

/// Where each slot of each extent lives (none for an extent of a thin
/// space not yet written).
pub(crate) fn targets(
    shared: &Arc<PoolShared>,
    metadata: &PoolMetadata,
    extents: &[ExtentRecord],
) -> Result<Vec<Arc<[Target]>>, EngineError> {
    Ok(extents
        .iter()
        .map(|extent| match &extent.slabs {
            Some(slabs) => crate::thin::targets(shared, metadata, slabs),
            None => Arc::from(Vec::new()),
        })
        .collect())
}

/// The log preparation `pool status` shows, until dropped.
struct Preparing<'a> {
    shared: &'a PoolShared,
}

impl<'a> Preparing<'a> {
    fn show(
        shared: &'a PoolShared,
        owner: &str,
        total: u64,
        written: &Arc<AtomicU64>,
    ) -> Preparing<'a> {
        *shared.preparing.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((owner.to_string(), total, written.clone()));
        Preparing { shared }
    }
}

impl Drop for Preparing<'_> {
    fn drop(&mut self) {
        *self
            .shared
            .preparing
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Zero every slab of new extents by the device's own zeroing (a hole
/// punched in a file, a zero-out on a block device: cheap, and a file
/// stays sparse) and make it durable: slabs may hold a deleted space's
/// bytes, and parity must match the (zero) data from the first read.
pub(crate) async fn zero_slabs(
    space: &Volume,
    extents: &[Arc<[Target]>],
    slab_bytes: u64,
) -> Result<(), EngineError> {
    for targets in extents {
        let writes = targets.iter().map(|target| async {
            let home = target.home();
            home.disk.write_zeroes(home.base, slab_bytes, false).await
        });
        for result in join_all(writes).await {
            result.map_err(|reason| EngineError::Unavailable {
                space: space.name.clone(),
                offset: 0,
                length: 0,
                reason: format!("could not zero a new slab: {reason}"),
            })?;
        }
    }
    space.pool.flush_disks().await
}

/// Write the slabs of a log's extents from `first` on with zeroes, outside
/// the pool's control lock. A log on a sparse file would otherwise
/// allocate blocks on its first lap, making every group commit's flush
/// write file-system metadata too; written once, its blocks are plain
/// overwrites from then on. That takes as long as the cache is large
/// (minutes for 100 GiB), and under the control lock it held up every
/// commit of the pool meanwhile: the first write of another space to an
/// extent (its write intent), jobs' watermarks, other logs' checkpoints.
/// Only slabs on disks whose first writes allocate are written (see
/// `BlockDevice::allocates_on_first_write`): on a block device the ring's
/// first lap costs what every later one does, so its log is ready at once.
///
/// A log is correct without it: a record counts only with the log's epoch,
/// the ring position it is found at, the sequence after the record before
/// and its checksums, so a slab's old bytes never pass for records. So nothing here
/// fails: a slab that cannot be written is left as it is (the disk's error
/// counts as usual), and an extent whose targets change meanwhile (a job
/// moving it) is left to the job, which is checked before every write.
/// The ring must not use these extents until this returns.
///
/// `pool status` shows its progress, named after the space `owner`.
pub(crate) async fn preallocate_log(log: &Volume, owner: &str, first: usize, slab_bytes: u64) {
    /// One buffer of zeroes shared by every write: large enough that a
    /// slab takes few writes, small enough to hold once.
    const CHUNK_BYTES: u64 = 1 << 20;
    let chunk = terrace_io::aligned_buffer(CHUNK_BYTES.min(slab_bytes) as usize).freeze();
    // Held while it writes: a slab a job moves off meanwhile stays out of
    // allocations until its last write here is done (see `MapEpoch`).
    let map = log.map();
    let extents = &map.extents;
    let allocating = |target: &&Target| {
        target
            .home()
            .disk
            .device()
            .is_some_and(|device| device.allocates_on_first_write())
    };
    let slabs: usize = extents
        .iter()
        .skip(first)
        .map(|targets| targets.iter().filter(allocating).count())
        .sum();
    if slabs == 0 {
        return;
    }
    let written = Arc::new(AtomicU64::new(0));
    let _shown = Preparing::show(&log.pool, owner, slabs as u64 * slab_bytes, &written);
    for (index, targets) in extents.iter().enumerate().skip(first) {
        let unchanged = || {
            log.map()
                .extents
                .get(index)
                .is_some_and(|now| Arc::ptr_eq(now, targets))
        };
        let writes = targets.iter().filter(allocating).map(|target| async {
            let home = target.home();
            let mut done = 0;
            while done < slab_bytes && unchanged() {
                let length = (chunk.len() as u64).min(slab_bytes - done);
                let data = chunk.slice(..length as usize);
                if home
                    .disk
                    .write(home.base + done, data, false)
                    .await
                    .is_err()
                {
                    return;
                }
                done += length;
                written.fetch_add(length, Ordering::Relaxed);
            }
        });
        join_all(writes).await;
    }
    // Failures seen are recorded as usual; neither they nor a failed flush
    // make the log unusable (see above).
    let _ = log.pool.persist_failures().await;
    let _ = log.pool.flush_disks().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, name: &str, export: Option<&str>, role: SpaceRole) -> SpaceRecord {
        SpaceRecord {
            id: SpaceId(id),
            name: name.into(),
            export: export.map(str::to_string),
            layout: Layout::Simple,
            columns: 1,
            interleave_bytes: 4096,
            size_bytes: 0,
            provisioning: Provisioning::Fixed,
            fault_domain: FaultDomain::Disk,
            created_ns: 0,
            columns_reason: String::new(),
            role,
            cache: None,
            sums: None,
            checksums: true,
            extents: Vec::new(),
        }
    }

    #[test]
    fn spaces_without_an_export_name_get_theirs_unless_taken_and_keep_it() {
        let mut metadata = PoolMetadata::new(terrace_meta::PoolId([1; 16]), "b".into(), 1 << 20, 0);
        metadata.spaces = vec![
            record(1, "m2", None, SpaceRole::Data),
            record(2, "vm", None, SpaceRole::Data),
            record(3, ".log-1", None, SpaceRole::Log { owner: SpaceId(1) }),
            record(4, "db", Some("db-b"), SpaceRole::Data),
        ];
        settle_export_names(&mut metadata, &["m2".to_string()]);
        let exports: Vec<Option<&str>> = metadata
            .spaces
            .iter()
            .map(|space| space.export.as_deref())
            .collect();
        assert_eq!(exports, [Some("b/m2"), Some("vm"), None, Some("db-b")]);
        // Decided once: a later import with other names taken keeps them.
        let mut again = metadata.clone();
        settle_export_names(&mut again, &["vm".to_string()]);
        assert_eq!(again, metadata);
    }
}
