//! Creating and deleting spaces.
//!
//! A new space's columns are chosen (or checked) against the disks and fault
//! domains that have free slabs; its extents are placed, zeroed on disk and
//! flushed, and only then committed to the metadata, so a crash never leaves
//! a visible space over stale bytes. When the chosen width cannot be placed
//! for lack of free slabs on enough disks, an automatic choice narrows until
//! it fits, and the reason says so.

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
use crate::pool::{validate_name, Pool};
use crate::space::{Space, SpaceMap, Target};
use crate::units::format_size;

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

/// What `create_space` did, for the user.
#[derive(Clone)]
pub struct SpaceCreated {
    pub space: Arc<Space>,
    pub columns_reason: String,
}

impl Pool {
    pub async fn create_space(&self, config: SpaceConfig) -> Result<SpaceCreated, EngineError> {
        validate_name("space name", &config.name)?;
        validate_name("export name", config.export_name())?;
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let _changes = self.shared.changes.lock().await;
        // Plan under the control lock and set the slabs aside; zero them
        // outside it (on a block device without a zeroing command that
        // runs at the drive's speed, and every commit of the pool would
        // wait meanwhile); commit after.
        let (next, first_new, record, geometry, log) = {
            let control = self.shared.control.lock().await;
            let metadata = &control.metadata;
            if metadata.space(&config.name).is_some() {
                return Err(EngineError::SpaceExists { name: config.name });
            }
            let export = config.export_name();
            if let Some(other) = metadata
                .spaces
                .iter()
                .find(|space| space.export.as_deref() == Some(export))
            {
                return Err(EngineError::ExportExists {
                    export: export.to_string(),
                    space: other.name.clone(),
                });
            }
            let level = config
                .fault_domain
                .unwrap_or_else(|| default_fault_domain(metadata));
            let allocator = self
                .shared
                .allocator(metadata, level, |_, disk| disk.takes_capacity());
            let (record, geometry) = plan_space(
                &config,
                metadata,
                allocator.clone(),
                level,
                self.shared.env.wall_clock_ns(),
            )
            .map_err(|refusal| {
                self.with_largest_fit(refusal, &config, metadata, &allocator, level)
            })?;
            let mut next = metadata.clone();
            next.next_space_id += 1;
            next.spaces.push(record.clone());
            let log = self.plan_new_log(&config, &mut next, record.id)?;
            let record = next.spaces[metadata.spaces.len()].clone();
            (next, metadata.spaces.len(), record, geometry, log)
        };
        crate::room::check_room(&next, self.shared.metadata_slot_bytes)?;
        let planned = &next.spaces[first_new..];
        let slabs =
            || ExtentRecord::slabs_of(planned.iter().flat_map(|space| space.extents.iter()));
        let reservation = self.shared.reserve(slabs());
        let space = build_space(&self.shared, &next, &record)?;
        zero_slabs(&space, &space.map().extents, geometry.slab_bytes()).await?;
        {
            let mut control = self.shared.control.lock().await;
            let mut current = control.metadata.clone();
            disks_still_active(&current, slabs(), &config.name)?;
            // Only one change plans spaces at a time (`changes`), so the
            // names and ids planned are still free; the slabs were
            // reserved.
            current.next_space_id = current.next_space_id.max(next.next_space_id);
            current.spaces.extend(planned.iter().cloned());
            self.shared.commit(&mut control, current).await?;
        }
        drop(reservation);
        let space = Arc::new(space);
        self.spaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(record.name.clone(), space.clone());
        if let Some((log, cache)) = log {
            // Outside the control lock; the space has no journal until its
            // log is prepared, and nothing writes to it before this returns.
            let log = Arc::new(log);
            self.register_log(&log);
            preallocate_log(&log, &record.name, 0, geometry.slab_bytes()).await;
            self.attach_cache(&space, log, &cache);
        }
        Ok(SpaceCreated {
            space,
            columns_reason: record.columns_reason,
        })
    }

    /// A space of a given size that does not fit: its refusal also says the
    /// largest size that would, and over how many columns (what `--max`
    /// gives, its log included), so that the user need not search for it.
    fn with_largest_fit(
        &self,
        refusal: EngineError,
        config: &SpaceConfig,
        metadata: &PoolMetadata,
        allocator: &Allocator,
        level: FaultDomain,
    ) -> EngineError {
        let (SpaceSize::Bytes(bytes), EngineError::NoCapacity { space, detail }) =
            (config.size, &refusal)
        else {
            return refusal;
        };
        let largest = SpaceConfig {
            size: SpaceSize::Max,
            ..config.clone()
        };
        let fit =
            plan_space(&largest, metadata, allocator.clone(), level, 0).and_then(|(record, _)| {
                let mut next = metadata.clone();
                next.next_space_id += 1;
                next.spaces.push(record.clone());
                self.plan_new_log(&largest, &mut next, record.id)?;
                Ok(next.spaces[metadata.spaces.len()].clone())
            });
        let fit = match fit {
            Ok(record) => format!(
                "at most {} with {} (--max)",
                format_size(record.size_bytes),
                count(record.columns, "column")
            ),
            Err(_) => "nothing of this layout fits".to_string(),
        };
        EngineError::NoCapacity {
            space: space.clone(),
            detail: format!("{} does not fit: {fit}; {detail}", format_size(bytes)),
        }
    }

    /// Plan the log of new space `owner` (the last of `next.spaces`) into
    /// `next` by [`crate::cache::log_choices`]. A space of the largest
    /// size gives back extents from its end until the log fits on capacity
    /// disks. A default log is best effort unless the config requires it:
    /// a pool too small for even the smallest default log then still gets
    /// its space (without a log, which status shows); a log asked for is
    /// not.
    fn plan_new_log(
        &self,
        config: &SpaceConfig,
        next: &mut PoolMetadata,
        owner: SpaceId,
    ) -> Result<Option<(Space, terrace_meta::CacheRecord)>, EngineError> {
        let choices = crate::cache::log_choices(config.cache_bytes, config.layout, next)?;
        if choices.is_empty() {
            return Ok(None);
        }
        let required = config.cache_bytes.is_some()
            || (config.require_default_log && matches!(config.layout, Layout::Parity { .. }));
        let position = next.spaces.len() - 1;
        assert_eq!(
            next.spaces[position].id, owner,
            "the new space is planned last"
        );
        let whole = next.spaces[position].clone();
        loop {
            match crate::cache::first_log_that_fits(&self.shared, next, owner, &choices) {
                Ok((with_log, log)) => {
                    *next = with_log;
                    return Ok(Some(log));
                }
                Err(refusal) => {
                    let shrinkable = config.size == SpaceSize::Max
                        && next.spaces[position].extents.len() > 1
                        && choices
                            .iter()
                            .any(|(_, disks)| *disks != crate::cache::LogDisks::Journal);
                    if !shrinkable {
                        // Given up: the space keeps the size it was planned with.
                        next.spaces[position] = whole;
                        return if required { Err(refusal) } else { Ok(None) };
                    }
                    let geometry = next.spaces[position].geometry(next.slab_bytes)?;
                    let record = &mut next.spaces[position];
                    record.extents.pop();
                    record.size_bytes = record.extents.len() as u64 * geometry.extent_data_bytes();
                }
            }
        }
    }

    /// Delete a space and free its slabs. Its data is gone.
    pub async fn delete_space(&self, name: &str) -> Result<(), EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let _changes = self.shared.changes.lock().await;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let before = next.spaces.len();
        let id = next.space(name).map(|space| space.id);
        next.spaces.retain(|space| {
            space.name != name
                && !matches!(space.role, SpaceRole::Log { owner } if Some(owner) == id)
        });
        if next.spaces.len() == before {
            return Err(EngineError::NoSuchSpace {
                name: name.to_string(),
            });
        }
        self.shared.commit(&mut control, next).await?;
        if let Some(space) = self
            .spaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
        {
            space.mark_deleted();
            self.shared.crash_resync.forget(space.id());
            if let Some(journal) = space.journal() {
                journal.log().mark_deleted();
                self.logs
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&journal.log().id());
            }
            space.set_journal(None);
        }
        Ok(())
    }
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

/// Slabs planned for `space` before a wait may be committed only if
/// their disks are still active: one may have failed or changed its use
/// meanwhile, and a job planned since does not know these slabs.
fn disks_still_active(
    metadata: &PoolMetadata,
    mut slabs: impl Iterator<Item = SlabRef>,
    space: &str,
) -> Result<(), EngineError> {
    let active = |slab: &SlabRef| {
        metadata
            .disks
            .get(usize::from(slab.disk.0))
            .is_some_and(|disk| disk.state == terrace_meta::DiskState::Active)
    };
    match slabs.find(|slab| !active(slab)) {
        Some(slab) => Err(EngineError::ChangedWhilePreparing {
            space: space.to_string(),
            disk: slab.disk.0,
        }),
        None => Ok(()),
    }
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
    let usable = match layout {
        Layout::Parity { .. } => disks.min(domains as u32),
        Layout::Simple | Layout::Mirror { .. } => disks,
    };
    let group = match layout {
        Layout::Parity { .. } => layout.min_columns(),
        Layout::Simple | Layout::Mirror { .. } => layout.copies(),
    };
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
        match place(config.size, &geometry, allocator.clone()) {
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
    extents: Vec<Vec<SlabRef>>,
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
        provisioning: Provisioning::Fixed,
        fault_domain: planned.level,
        created_ns: planned.created_ns,
        columns_reason: planned.reason,
        role: SpaceRole::Data,
        cache: None,
        extents: planned
            .extents
            .into_iter()
            .map(|slabs| ExtentRecord { slabs: Some(slabs) })
            .collect(),
    }
}

/// Allocate the extents of a fixed space of `size`.
fn place(
    size: SpaceSize,
    geometry: &Geometry,
    mut allocator: Allocator,
) -> Result<(u64, Vec<Vec<SlabRef>>), EngineError> {
    let block = terrace_layout::BLOCK_BYTES;
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
            Ok((size_bytes, extents))
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
            Ok((extents.len() as u64 * geometry.extent_data_bytes(), extents))
        }
    }
}

/// The run-time space for a metadata record.
pub(crate) fn build_space(
    shared: &Arc<PoolShared>,
    metadata: &PoolMetadata,
    record: &SpaceRecord,
) -> Result<Space, EngineError> {
    let geometry = record.geometry(metadata.slab_bytes)?;
    let map = SpaceMap::new(
        record.size_bytes,
        targets(shared, metadata, &record.extents)?,
    );
    let mut space = Space::new(
        shared.clone(),
        record.id,
        record.name.clone(),
        geometry,
        map,
    );
    space.export = record.export.clone();
    Ok(space)
}

/// Where each slot of each extent lives.
pub(crate) fn targets(
    shared: &Arc<PoolShared>,
    metadata: &PoolMetadata,
    extents: &[ExtentRecord],
) -> Result<Vec<Arc<[Target]>>, EngineError> {
    let disks = shared.disks();
    extents
        .iter()
        .map(|extent| {
            let slabs = extent.slabs.as_ref().ok_or(EngineError::InvalidSetting {
                what: "space provisioning",
                value: 1,
                rule: "thin provisioning is not supported by this version",
            })?;
            Ok(slabs
                .iter()
                .map(|slab| {
                    let base = shared.slab_base(slab.slab, metadata.slab_bytes);
                    Target::single(disks[usize::from(slab.disk.0)].clone(), base)
                })
                .collect::<Arc<[Target]>>())
        })
        .collect()
}

impl Pool {
    /// Grow a space to `size_bytes` (rounded up to 4 KiB). New extents are
    /// placed like the first ones (same columns, same fault-domain level),
    /// zeroed, and committed before the space grows. Returns the new size.
    pub async fn resize_space(&self, name: &str, size_bytes: u64) -> Result<u64, EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let _changes = self.shared.changes.lock().await;
        let space = self.space(name).ok_or_else(|| EngineError::NoSuchSpace {
            name: name.to_string(),
        })?;
        let geometry = *space.geometry();
        let position = |metadata: &PoolMetadata| {
            metadata
                .spaces
                .iter()
                .position(|s| s.name == name)
                .ok_or_else(|| EngineError::NoSuchSpace {
                    name: name.to_string(),
                })
        };
        // Planned under the control lock, the new slabs reserved and zeroed
        // outside it, committed under it (as a new space's; see
        // `create_space`).
        let requested = size_bytes.next_multiple_of(terrace_layout::BLOCK_BYTES);
        let (added, added_targets) = {
            let control = self.shared.control.lock().await;
            let next = &control.metadata;
            let record = &next.spaces[position(next)?];
            let current = record.size_bytes;
            if requested < current {
                return Err(EngineError::ShrinkRefused {
                    space: name.to_string(),
                    current,
                    requested,
                });
            }
            if requested == current {
                return Ok(current);
            }
            let mut allocator = self
                .shared
                .allocator(next, record.fault_domain, |_, disk| disk.takes_capacity());
            let have = record.extents.len() as u64;
            let added = allocate_growth(&mut allocator, &geometry, have, requested, name, || {
                format!(
                    "growing from {} to {} as {}",
                    format_size(current),
                    format_size(requested),
                    shape(&geometry)
                )
            })?;
            let added_targets = targets(&self.shared, next, &added)?;
            let mut grown = next.clone();
            let at = position(&grown)?;
            grown.spaces[at].extents.extend(added.iter().cloned());
            crate::room::check_room(&grown, self.shared.metadata_slot_bytes)?;
            (added, added_targets)
        };
        let reservation = self.shared.reserve(ExtentRecord::slabs_of(&added));
        zero_slabs(&space, &added_targets, geometry.slab_bytes()).await?;
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        disks_still_active(&next, ExtentRecord::slabs_of(&added), name)?;
        let position = position(&next)?;
        let record = &mut next.spaces[position];
        record.size_bytes = requested;
        record.extents.extend(added);
        self.shared.commit(&mut control, next).await?;
        space.grow(requested, added_targets);
        drop(reservation);
        Ok(requested)
    }
}

/// Zero every slab of new extents by the device's own zeroing (a hole
/// punched in a file, a zero-out on a block device: cheap, and a file
/// stays sparse) and make it durable: slabs may hold a deleted space's
/// bytes, and parity must match the (zero) data from the first read.
pub(crate) async fn zero_slabs(
    space: &Space,
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
pub(crate) async fn preallocate_log(log: &Space, owner: &str, first: usize, slab_bytes: u64) {
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
