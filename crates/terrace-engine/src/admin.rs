//! Creating, growing and deleting spaces.
//!
//! Where a new space's or a growing space's extents go is planned by
//! `placement`; here the plan is zeroed on disk and flushed, and only then
//! committed to the metadata, so a crash never leaves a visible space over
//! stale bytes.

use std::sync::Arc;

use terrace_meta::{
    Allocator, ExtentRecord, FaultDomain, PoolMetadata, Provisioning, SlabRef, SpaceId,
};

use crate::error::EngineError;
use crate::layouts::reason::count;
use crate::placement::{
    allocate_growth, build_space, build_volume, default_fault_domain, plan_space, preallocate_log,
    shape, targets, zero_slabs, SpaceConfig, SpaceSize,
};
use crate::pool::{validate_name, Pool};
use crate::space::Space;
use crate::units::format_size;

/// What a refusal calls the largest space that fits (the CLI names the
/// option that asks for it beside it).
pub const LARGEST_FIT: &str = "the largest that fits";

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
        let (next, first_new, record, geometry, log, sums) = {
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
            let sums = if config.checksums {
                self.plan_new_sums(&config, &mut next, record.id)?
            } else {
                None
            };
            let record = next.spaces[metadata.spaces.len()].clone();
            (next, metadata.spaces.len(), record, geometry, log, sums)
        };
        crate::room::check_room(&next, self.shared.metadata_slot_bytes)?;
        let planned = &next.spaces[first_new..];
        let slabs =
            || ExtentRecord::slabs_of(planned.iter().flat_map(|space| space.extents.iter()));
        let reservation = self.shared.reserve(slabs());
        let space = build_space(&self.shared, &next, &record)?;
        zero_slabs(&space, &space.map().extents, geometry.slab_bytes()).await?;
        let sums = match sums {
            Some(sums) => {
                let sums = Arc::new(build_volume(&self.shared, &next, &sums)?);
                if let Err(error) =
                    zero_slabs(&sums, &sums.map().extents, geometry.slab_bytes()).await
                {
                    // A disk lost meanwhile is the reason to give.
                    let current = self.shared.control.lock().await.metadata.clone();
                    crate::thin::disks_still_active(&current, slabs(), &config.name)?;
                    return Err(error);
                }
                Some(sums)
            }
            None => None,
        };
        {
            let mut control = self.shared.control.lock().await;
            let mut current = control.metadata.clone();
            crate::thin::disks_still_active(&current, slabs(), &config.name)?;
            // Only one change plans spaces at a time (`changes`), so the
            // names and ids planned are still free; the slabs were
            // reserved.
            current.next_space_id = current.next_space_id.max(next.next_space_id);
            current.spaces.extend(planned.iter().cloned());
            self.shared.commit(&mut control, current).await?;
        }
        drop(reservation);
        let space = Arc::new(space);
        if let Some(sums) = sums {
            crate::placement::attach_sums(&space, &sums, true, true);
            self.register_sums(&sums);
        }
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
    /// largest size that would, and over how many columns (what a space of
    /// [`SpaceSize::Max`] gets, its log included), so that the user need
    /// not search for it.
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
                "at most {} with {} ({LARGEST_FIT})",
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
    ) -> Result<Option<(crate::volume::Volume, terrace_meta::CacheRecord)>, EngineError> {
        let choices = crate::cache::log_choices(config.cache_bytes, config.layout, next)?;
        if choices.is_empty() {
            return Ok(None);
        }
        let required = config.cache_bytes.is_some()
            || (config.require_default_log && config.layout.row_wide_redundancy());
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

    /// Plan the sums space of new space `owner` (the last data space of
    /// `next`) into `next`, best effort: a space of the largest size gives
    /// back extents from its end until its sums fit; any other space that
    /// leaves no room for them is created without (`space show` says so).
    fn plan_new_sums(
        &self,
        config: &SpaceConfig,
        next: &mut PoolMetadata,
        owner: SpaceId,
    ) -> Result<Option<terrace_meta::SpaceRecord>, EngineError> {
        let position = next
            .spaces
            .iter()
            .position(|space| space.id == owner)
            .expect("the new space is planned");
        loop {
            let mut attempt = next.clone();
            let planned =
                crate::placement::plan_sums(&self.shared, &mut attempt, owner).and_then(|record| {
                    crate::room::check_room(&attempt, self.shared.metadata_slot_bytes)?;
                    Ok(record)
                });
            match planned {
                Ok(mut record) => {
                    // Made with its owner, on slabs zeroed with the
                    // owner's: the same creation time says so at every
                    // import (a sums page never written then covers zero
                    // blocks; docs/ON_DISK_FORMAT.md).
                    record.created_ns = attempt.spaces[position].created_ns;
                    if let Some(sums) = attempt.spaces.iter_mut().find(|s| s.id == record.id) {
                        sums.created_ns = record.created_ns;
                    }
                    *next = attempt;
                    return Ok(Some(record));
                }
                Err(_)
                    if config.size == SpaceSize::Max && next.spaces[position].extents.len() > 1 =>
                {
                    let geometry = next.spaces[position].geometry(next.slab_bytes)?;
                    let record = &mut next.spaces[position];
                    record.extents.pop();
                    record.size_bytes = record.extents.len() as u64 * geometry.extent_data_bytes();
                }
                Err(_) => return Ok(None),
            }
        }
    }

    /// Give every space without sums (a pool of slot format 4 or older,
    /// or a space created when the pool had no room for them) its sums
    /// space, where the pool has room, best effort: from then on its
    /// writes set sums and its reads check the blocks written since (the
    /// blocks written before have no known sum until rewritten).
    pub(crate) async fn add_missing_sums(&self) -> Result<(), EngineError> {
        let _changes = self.shared.changes.lock().await;
        for space in self.spaces() {
            if space.volume().sums().is_some() {
                continue;
            }
            let planned = {
                let control = self.shared.control.lock().await;
                let chosen = control
                    .metadata
                    .space_by_id(space.id())
                    .is_some_and(|record| record.checksums);
                if !chosen {
                    continue;
                }
                let mut next = control.metadata.clone();
                match crate::placement::plan_sums(&self.shared, &mut next, space.id()) {
                    Ok(record)
                        if crate::room::check_room(&next, self.shared.metadata_slot_bytes)
                            .is_ok() =>
                    {
                        Some((next, record))
                    }
                    _ => None,
                }
            };
            let Some((next, record)) = planned else {
                continue;
            };
            let reservation = self.shared.reserve(ExtentRecord::slabs_of(&record.extents));
            let sums = Arc::new(build_volume(&self.shared, &next, &record)?);
            zero_slabs(&sums, &sums.map().extents, next.slab_bytes).await?;
            {
                let mut control = self.shared.control.lock().await;
                let mut current = control.metadata.clone();
                crate::thin::disks_still_active(
                    &current,
                    ExtentRecord::slabs_of(&record.extents),
                    space.name(),
                )?;
                current.next_space_id = current.next_space_id.max(next.next_space_id);
                let Some(owner) = current.spaces.iter_mut().find(|s| s.id == space.id()) else {
                    continue;
                };
                owner.sums = Some(record.id);
                current.spaces.push(record.clone());
                self.shared.commit(&mut control, current).await?;
            }
            drop(reservation);
            crate::placement::attach_sums(space.volume(), &sums, true, false);
            self.register_sums(&sums);
        }
        Ok(())
    }

    /// Make a sums space known to the pool (jobs find it to repair or move
    /// it).
    pub(crate) fn register_sums(&self, sums: &Arc<crate::volume::Volume>) {
        self.sums
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sums.id(), sums.clone());
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
        let sums_space = next.space(name).and_then(|space| space.sums);
        let kept = |space: &terrace_meta::SpaceRecord| {
            space.name != name && (space.role.owner().is_none() || space.role.owner() != id)
        };
        let freed: Vec<SlabRef> = ExtentRecord::slabs_of(
            next.spaces
                .iter()
                .filter(|space| !kept(space))
                .flat_map(|space| space.extents.iter()),
        )
        .collect();
        next.spaces.retain(kept);
        if next.spaces.len() == before {
            return Err(EngineError::NoSuchSpace {
                name: name.to_string(),
            });
        }
        let slab_bytes = next.slab_bytes;
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
        let removed = sums_space.and_then(|sums| {
            self.sums
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&sums)
        });
        if let Some(sums) = removed {
            sums.mark_deleted();
        }
        // Set aside until punched: no allocation may take one meanwhile.
        let _punching = self.shared.reserve(freed.iter().copied());
        drop(control);
        crate::thin::discard(&self.shared, &freed, slab_bytes).await;
        Ok(())
    }
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
        let (added, added_targets, sums_growth) = {
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
            let thin = record.provisioning == Provisioning::Thin;
            let added = if thin {
                // Growth takes no room until written.
                let more = geometry.extents_for(requested) - have;
                vec![ExtentRecord { slabs: None }; more as usize]
            } else {
                allocate_growth(&mut allocator, &geometry, have, requested, name, || {
                    format!(
                        "growing from {} to {} as {}",
                        format_size(current),
                        format_size(requested),
                        shape(&geometry)
                    )
                })?
            };
            let added_targets = targets(&self.shared, next, &added)?;
            let sums_growth = match record.sums.and_then(|id| next.space_by_id(id)) {
                Some(sums) => {
                    let sums_geometry = sums.geometry(next.slab_bytes)?;
                    // A journal moves to the new end.
                    let journal = crate::placement::sums_journal_pages(current, sums.size_bytes);
                    let bytes = if journal > 0 {
                        crate::placement::sums_space_bytes(requested)
                    } else {
                        crate::placement::sums_bytes(requested)
                    };
                    let have = sums.extents.len() as u64;
                    let taken: std::collections::BTreeSet<SlabRef> =
                        ExtentRecord::slabs_of(&added).collect();
                    let mut allocator = self
                        .shared
                        .allocator(next, sums.fault_domain, |_, disk| disk.takes_capacity())
                        .exclude(&taken);
                    let more = if thin {
                        // Thin pages; the journal (at the new end) has its room.
                        let journal_start = crate::placement::sums_pages(requested)
                            * terrace_meta::sums::SUMS_PAGE_BYTES as u64
                            / sums_geometry.extent_data_bytes();
                        (have..sums_geometry.extents_for(bytes))
                            .map(|extent| {
                                let slabs = (extent >= journal_start)
                                    .then(|| allocator.allocate_extent(&sums_geometry))
                                    .transpose()?;
                                Ok(ExtentRecord { slabs })
                            })
                            .collect::<Result<Vec<_>, terrace_meta::PlacementError>>()?
                    } else {
                        allocate_growth(&mut allocator, &sums_geometry, have, bytes, name, || {
                            format!("its block sums growing to {}", format_size(bytes))
                        })?
                    };
                    let more_targets = targets(&self.shared, next, &more)?;
                    Some((sums.id, bytes.max(sums.size_bytes), more, more_targets))
                }
                None => None,
            };
            let mut grown = next.clone();
            let at = position(&grown)?;
            grown.spaces[at].extents.extend(added.iter().cloned());
            if let Some((id, _, more, _)) = &sums_growth {
                if let Some(sums) = grown.spaces.iter_mut().find(|s| s.id == *id) {
                    sums.extents.extend(more.iter().cloned());
                }
            }
            crate::room::check_room(&grown, self.shared.metadata_slot_bytes)?;
            (added, added_targets, sums_growth)
        };
        let sums_volume = sums_growth.as_ref().and_then(|(id, ..)| {
            self.sums
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(id)
                .cloned()
        });
        let more_slabs = sums_growth
            .iter()
            .flat_map(|(_, _, more, _)| ExtentRecord::slabs_of(more))
            .collect::<Vec<_>>();
        let reservation = self
            .shared
            .reserve(ExtentRecord::slabs_of(&added).chain(more_slabs.iter().copied()));
        zero_slabs(&space, &added_targets, geometry.slab_bytes()).await?;
        if let (Some((_, _, _, more_targets)), Some(sums)) = (&sums_growth, &sums_volume) {
            zero_slabs(sums, more_targets, geometry.slab_bytes()).await?;
        }
        // The sums' journal is at the end of their space, which moves: the
        // pages take everything until the new journal begins.
        let _paused = match (&sums_volume, space.volume().sums()) {
            (Some(_), Some(sums)) => {
                let paused = crate::sums::Paused(sums);
                sums.pause().await?;
                Some(paused)
            }
            _ => None,
        };
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        crate::thin::disks_still_active(&next, ExtentRecord::slabs_of(&added), name)?;
        crate::thin::disks_still_active(&next, more_slabs.iter().copied(), name)?;
        let position = position(&next)?;
        let record = &mut next.spaces[position];
        record.size_bytes = requested;
        record.extents.extend(added);
        let sums_grown = match sums_growth {
            Some((id, bytes, more, more_targets)) => {
                if let Some(sums) = next.spaces.iter_mut().find(|s| s.id == id) {
                    sums.size_bytes = bytes;
                    sums.extents.extend(more);
                }
                Some((bytes, more_targets))
            }
            None => None,
        };
        self.shared.commit(&mut control, next).await?;
        if let (Some((bytes, more_targets)), Some(sums)) = (sums_grown, sums_volume) {
            sums.grow(bytes, more_targets);
            sums.set_sums_journal_pages(crate::placement::sums_journal_pages(requested, bytes));
        }
        space.grow(requested, added_targets);
        drop(reservation);
        Ok(requested)
    }
}
