//! Thin provisioning: the slabs of an extent of a thin space are taken
//! on the first write to it (see `docs/design/thin.md`).
//!
//! An extent's slabs are chosen as a new space's are (most free slabs
//! first, distinct disks and fault domains), set aside, zeroed outside the
//! control lock (parity must match the zero data, and a slab may hold a
//! deleted space's bytes), and committed before the first write to them
//! begins: a crash before the commit leaves the extent unallocated (the
//! write was never acknowledged), after it an extent of zeroes. The
//! volume installs the targets returned in its map; reads of an extent
//! without slabs return zeroes without touching a disk.

use std::sync::Arc;

use terrace_layout::Geometry;
use terrace_meta::{ExtentRecord, PlacementError, PoolMetadata, SlabRef, SpaceId};

use crate::control::PoolShared;
use crate::error::EngineError;
use crate::target::Target;

/// Give `extent` of space `space` (`name` for messages) its slabs, unless
/// the metadata has them already, and return where its slots live.
/// Refused with [`EngineError::PoolFull`] when the pool has no room for
/// them; nothing is then changed.
pub(crate) async fn allocate(
    shared: &PoolShared,
    space: SpaceId,
    name: &str,
    extent: u64,
    geometry: &Geometry,
) -> Result<Arc<[Target]>, EngineError> {
    // A disk lost while its slab was zeroed is failed or missing by the
    // next attempt, which places the extent without it.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match allocate_once(shared, space, name, extent, geometry).await {
            Err(EngineError::ChangedWhilePreparing { .. } | EngineError::Unavailable { .. })
                if attempts < ATTEMPTS =>
            {
                shared.persist_failures().await?;
            }
            result => return result,
        }
    }
}

/// Tries before a write that needs an extent fails for disks lost while
/// their slabs were prepared.
const ATTEMPTS: u32 = 4;

async fn allocate_once(
    shared: &PoolShared,
    space: SpaceId,
    name: &str,
    extent: u64,
    geometry: &Geometry,
) -> Result<Arc<[Target]>, EngineError> {
    let gone = || EngineError::NoSuchSpace {
        name: name.to_string(),
    };
    let (slabs, _reservation) = {
        let control = shared.control.lock().await;
        let metadata = &control.metadata;
        let record = metadata.space_by_id(space).ok_or_else(gone)?;
        let slot = record.extents.get(extent as usize).ok_or_else(gone)?;
        if let Some(slabs) = &slot.slabs {
            return Ok(targets(shared, metadata, slabs));
        }
        let mut allocator = shared.allocator(metadata, record.fault_domain, |_, disk| {
            disk.takes_capacity()
        });
        let slabs = allocator
            .allocate_extent(geometry)
            .map_err(|error| match error {
                PlacementError::OutOfSpace { .. } => EngineError::PoolFull {
                    space: name.to_string(),
                    detail: format!(
                        "its extent {extent} needs {} slabs on distinct disks, and the disks it may use have {} free on {} disks",
                        geometry.slots_per_extent(),
                        allocator.free_slabs(),
                        allocator.usable_disks_and_domains().0,
                    ),
                },
                other => other.into(),
            })?;
        let mut next = metadata.clone();
        set_extent(&mut next, space, extent, &slabs);
        let kept = repair_reserve_slabs(&next, geometry);
        if allocator.free_slabs() < kept {
            return Err(EngineError::PoolFull {
                space: name.to_string(),
                detail: format!(
                    "the last {kept} free slabs are kept for the repair of a failed disk (as many as the fullest disk holds)"
                ),
            });
        }
        crate::room::check_room(&next, shared.metadata_slot_bytes)?;
        let reservation = shared.reserve(slabs.iter().copied());
        (slabs, reservation)
    };
    zero(shared, &slabs, geometry.slab_bytes(), name).await?;
    let mut control = shared.control.lock().await;
    let mut next = control.metadata.clone();
    let record = next.space_by_id(space).ok_or_else(gone)?;
    if let Some(now) = record
        .extents
        .get(extent as usize)
        .ok_or_else(gone)?
        .slabs
        .clone()
    {
        return Ok(targets(shared, &next, &now));
    }
    disks_still_active(&next, slabs.iter().copied(), name)?;
    set_extent(&mut next, space, extent, &slabs);
    shared.commit(&mut control, next).await?;
    Ok(targets(shared, &control.metadata, &slabs))
}

/// Free slabs thin allocation leaves alone: as many as the fullest
/// capacity disk holds, so that a failed disk can always be rebuilt into
/// free space. None where the pool has no disk to spare beyond an
/// extent's width (a repair then needs a new disk anyway).
pub(crate) fn repair_reserve_slabs(metadata: &PoolMetadata, geometry: &Geometry) -> u64 {
    let capacity: Vec<_> = metadata
        .members()
        .filter(|(_, disk)| disk.takes_capacity())
        .map(|(index, _)| index)
        .collect();
    if capacity.len() <= geometry.slots_per_extent() as usize {
        return 0;
    }
    let used = metadata.used_slabs();
    capacity
        .iter()
        .map(|&disk| used.iter().filter(|slab| slab.disk == disk).count() as u64)
        .max()
        .unwrap_or(0)
}

fn set_extent(metadata: &mut PoolMetadata, space: SpaceId, extent: u64, slabs: &[SlabRef]) {
    if let Some(record) = metadata.spaces.iter_mut().find(|s| s.id == space) {
        record.extents[extent as usize] = ExtentRecord {
            slabs: Some(slabs.to_vec()),
        };
    }
}

/// Slabs planned for `space` before a wait may be committed only if
/// their disks are still active: one may have failed or changed its use
/// meanwhile, and a job planned since does not know these slabs.
pub(crate) fn disks_still_active(
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

/// Where the slots of an extent on `slabs` live.
pub(crate) fn targets(
    shared: &PoolShared,
    metadata: &PoolMetadata,
    slabs: &[SlabRef],
) -> Arc<[Target]> {
    let disks = shared.disks();
    slabs
        .iter()
        .map(|slab| {
            let base = shared.slab_base(slab.slab, metadata.slab_bytes);
            Target::single(disks[usize::from(slab.disk.0)].clone(), base)
        })
        .collect()
}

/// Zero `slabs` by the devices' own zeroing and make it durable.
async fn zero(
    shared: &PoolShared,
    slabs: &[SlabRef],
    slab_bytes: u64,
    name: &str,
) -> Result<(), EngineError> {
    let disks = shared.disks();
    let writes = slabs.iter().map(|slab| {
        let disk = disks[usize::from(slab.disk.0)].clone();
        let base = shared.slab_base(slab.slab, slab_bytes);
        async move { disk.write_zeroes(base, slab_bytes, false).await }
    });
    let failed = |reason| EngineError::Unavailable {
        space: name.to_string(),
        offset: 0,
        length: 0,
        reason: format!("could not zero a new slab: {reason}"),
    };
    for result in futures::future::join_all(writes).await {
        result.map_err(failed)?;
    }
    // Only these slabs' disks: a flush of the pool writes sums back, whose
    // own space may be thin and be allocating.
    let mut flushed = std::collections::BTreeSet::new();
    let flushes = slabs
        .iter()
        .filter(|slab| flushed.insert(slab.disk))
        .map(|slab| disks[usize::from(slab.disk.0)].flush());
    for result in futures::future::join_all(flushes).await {
        result.map_err(failed)?;
    }
    shared.persist_failures().await
}

/// Give back the slabs of `extents` of space `space` (`name` for
/// messages), those that have slabs and that no job is moving, in one
/// commit; `freed` is told which went, under the control lock (it retires
/// their slabs from the space's map there, before any allocation can see
/// them free). Returns them.
pub(crate) async fn release(
    shared: &PoolShared,
    space: SpaceId,
    name: &str,
    extents: &[u64],
    freed: impl FnOnce(&[u64]),
) -> Result<Vec<u64>, EngineError> {
    let mut control = shared.control.lock().await;
    let mut next = control.metadata.clone();
    let moving: std::collections::BTreeSet<u32> = next
        .jobs
        .iter()
        .filter(|job| job.is_active())
        .flat_map(|job| job.moves.iter())
        .filter(|step| step.space == space && !step.done)
        .map(|step| step.extent)
        .collect();
    let record = next
        .spaces
        .iter_mut()
        .find(|s| s.id == space)
        .ok_or_else(|| EngineError::NoSuchSpace {
            name: name.to_string(),
        })?;
    let mut given = Vec::new();
    let mut slabs = Vec::new();
    for &extent in extents {
        if moving.contains(&(extent as u32)) {
            continue;
        }
        if let Some(slot) = record.extents.get_mut(extent as usize) {
            if let Some(taken) = slot.slabs.take() {
                given.push(extent);
                slabs.extend(taken);
            }
        }
    }
    if given.is_empty() {
        return Ok(given);
    }
    shared.commit(&mut control, next).await?;
    freed(&given);
    let slab_bytes = control.metadata.slab_bytes;
    // Set aside until punched: no allocation may take one meanwhile.
    let _punching = shared.reserve(slabs.iter().copied());
    drop(control);
    discard(shared, &slabs, slab_bytes).await;
    Ok(given)
}

/// Punch out the data of slabs just freed (and reserved by the caller
/// until this returns: a slab allocated meanwhile would lose its new
/// owner's writes), best effort: the allocation
/// that takes one zeroes it again (a request holding an older map may
/// still write to it meanwhile), but zeroing a slab that holds data costs
/// a file system far more (its extents freed, a journal commit) than one
/// already empty, and under the clients of a thin space's first writes.
pub(crate) async fn discard(shared: &PoolShared, slabs: &[SlabRef], slab_bytes: u64) {
    let disks = shared.disks();
    let punches = slabs.iter().filter_map(|slab| {
        let disk = disks.get(usize::from(slab.disk.0))?.clone();
        let base = shared.slab_base(slab.slab, slab_bytes);
        Some(async move { disk.write_zeroes(base, slab_bytes, false).await })
    });
    // A disk that fails here fails as it would at any write; nothing
    // depends on these.
    let _ = futures::future::join_all(punches).await;
}
