//! Creating and importing a pool: the top of the engine, where a pool's
//! parts are put together and set going.
//!
//! Creation checks every disk before writing anything, so a refused disk
//! (another pool's, a damaged label, too small) leaves every disk untouched.
//! It then writes the first metadata generation to every disk and the labels
//! last: a crash before the labels leaves disks that still read as blank.
//!
//! Import reads every label and both metadata slots, keeps the disks of the
//! chosen pool, and applies the quorum rule of `terrace_meta::quorum`; then
//! it builds the run-time disks and spaces, recovers write-back logs, marks
//! for resync what an unclean shutdown's write intent names, and welcomes
//! back disks that were missing (starting their catch-up jobs). Nothing
//! below imports this module.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures::future::join_all;
use terrace_io::{BlockDevice, Env};
use terrace_meta::format::{
    data_offset, Label, METADATA_SLOT_DEFAULT_BYTES, METADATA_SLOT_MIN_BYTES,
};
use terrace_meta::quorum::{self, Candidate};
use terrace_meta::store::{self, Probe};
use terrace_meta::{
    DiskId, DiskIndex, DiskRecord, DiskState, IntentRecord, PoolId, PoolMetadata, Usage,
};

use crate::control::PoolShared;
use crate::disk::{Condition, Disk, DiskContext};
use crate::error::EngineError;
use crate::failures::MissedExtent;
use crate::layouts::{LayoutHost, RowLayout};
use crate::pool::{
    check_new_disks, older_copy, random_id, validate_name, write_labels, ImportOptions, NewDisk,
    Pool, PoolConfig, Shape, SLAB_MAX_BYTES, SLAB_MIN_BYTES,
};

/// Default slab: 256 MiB, as the allocation unit of Storage Spaces.
/// What a failed disk's reason says when the disk is present again (the CLI
/// names the command beside it).
pub const CLEARED_BACK: &str = "once it works again, a clear of the pool takes it back";

impl Pool {
    /// Create a pool on blank disks. Nothing is written unless every disk
    /// passes its checks.
    pub async fn create(
        env: Arc<dyn Env>,
        config: PoolConfig,
        disks: Vec<NewDisk>,
    ) -> Result<Pool, EngineError> {
        validate_config(&config)?;
        if disks.is_empty() {
            return Err(EngineError::NoDisks);
        }
        refuse_without_capacity(&disks)?;
        let data_start = data_offset(config.metadata_slot_bytes);
        check_new_disks(&disks, data_start + config.slab_bytes, None).await?;
        let now = env.wall_clock_ns();
        let pool_id = PoolId(random_id(env.as_ref()));
        let mut metadata = PoolMetadata::new(pool_id, config.name.clone(), config.slab_bytes, now);
        // A new pool has nothing to scrub: its schedule counts from now.
        metadata.settings.scrub_last_ns = now;
        let context = DiskContext::new(env.clone(), &config.name);
        let shape = Shape {
            pool_id,
            pool_name: config.name.clone(),
            slab_bytes: config.slab_bytes,
            metadata_slot_bytes: config.metadata_slot_bytes,
            now,
        };
        let mut runtime = Vec::new();
        let mut labels = Vec::new();
        for (position, disk) in disks.into_iter().enumerate() {
            let member = shape.member(&env, DiskIndex(position as u16), disk, &context);
            metadata.disks.push(member.record);
            labels.push(member.label);
            runtime.push(member.disk);
        }
        let shared = Arc::new(PoolShared::new(
            env,
            metadata.clone(),
            config.metadata_slot_bytes,
            None,
            runtime,
            context,
            0,
        ));
        {
            let mut control = shared.control.lock().await;
            shared.commit(&mut control, metadata).await?;
        }
        write_labels(&labels).await?;
        Ok(Pool {
            shared,
            spaces: RwLock::new(BTreeMap::new()),
            logs: RwLock::new(BTreeMap::new()),
            sums: RwLock::new(BTreeMap::new()),
        })
    }

    /// Import a pool from the given devices (any order; other pools' disks
    /// and blank disks among them are ignored).
    pub async fn import(
        env: Arc<dyn Env>,
        devices: Vec<Arc<dyn BlockDevice>>,
        options: ImportOptions,
    ) -> Result<Pool, EngineError> {
        let probes = join_all(devices.iter().map(|device| store::probe(device.as_ref()))).await;
        let members: Vec<(Arc<dyn BlockDevice>, Label, &Probe)> = devices
            .iter()
            .zip(&probes)
            .filter_map(|(device, probe)| match probe {
                Probe::Member { label, .. } => Some((device.clone(), label.clone(), probe)),
                _ => None,
            })
            .collect();
        let pool_id = choose_pool(&members, options.pool.as_deref())?;
        let members: Vec<_> = members
            .into_iter()
            .filter(|(_, label, _)| label.pool_id == pool_id)
            .collect();
        let candidates: Vec<Candidate> = members
            .iter()
            .map(|(_, label, probe)| Candidate {
                disk_id: label.disk_id,
                copies: probe.generations(),
            })
            .collect();
        let Some(selection) = quorum::select(&candidates) else {
            return Err(no_metadata(&members));
        };
        let mut read_only = if options.force {
            None
        } else {
            selection.shortfall()
        };
        if options.read_only {
            read_only = Some("imported read-only on request".into());
        }
        // A disk that left holding older metadata than it had when it left
        // is an older copy of it: left out, it stays missing.
        let mut older_copies = BTreeMap::new();
        let present: Vec<(Arc<dyn BlockDevice>, Label)> = members
            .into_iter()
            .filter(|(_, label, probe)| {
                let newest = probe.generations().first().map_or(0, |m| m.generation);
                let record = selection
                    .metadata
                    .disks
                    .iter()
                    .find(|d| d.id == label.disk_id);
                match record.and_then(|record| older_copy(record, newest)) {
                    Some(why) => {
                        older_copies.insert(label.disk_id, why);
                        false
                    }
                    None => true,
                }
            })
            .map(|(device, label, _)| (device, label))
            .collect();
        let mut metadata = selection.metadata;
        crate::placement::settle_export_names(&mut metadata, &options.exports_taken);
        open(env, metadata, present, older_copies, read_only).await
    }
}

fn validate_config(config: &PoolConfig) -> Result<(), EngineError> {
    validate_name("pool name", &config.name)?;
    let slab = config.slab_bytes;
    if !slab.is_power_of_two() || !(SLAB_MIN_BYTES..=SLAB_MAX_BYTES).contains(&slab) {
        return Err(EngineError::InvalidSetting {
            what: "slab size",
            value: slab,
            rule: "a power of two from 64K to 64G",
        });
    }
    let slot = config.metadata_slot_bytes;
    if slot < METADATA_SLOT_MIN_BYTES || !slot.is_multiple_of(4096) || slot > 1 << 30 {
        return Err(EngineError::InvalidSetting {
            what: "metadata slot size",
            value: slot,
            rule: "a multiple of 4K from 64K to 1G",
        });
    }
    Ok(())
}

fn choose_pool(
    members: &[(Arc<dyn BlockDevice>, Label, &Probe)],
    wanted: Option<&str>,
) -> Result<PoolId, EngineError> {
    let mut pools: BTreeMap<PoolId, String> = BTreeMap::new();
    for (_, label, _) in members {
        pools.insert(label.pool_id, label.pool_name.clone());
    }
    let listing = || {
        pools
            .iter()
            .map(|(id, name)| format!("{name} ({})", id.short()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let matching: Vec<PoolId> = pools
        .iter()
        .filter(|(id, name)| wanted.is_none_or(|w| *name == w || id.to_string().starts_with(w)))
        .map(|(id, _)| *id)
        .collect();
    match (matching.as_slice(), wanted) {
        ([id], _) => Ok(*id),
        ([], None) => Err(EngineError::NoPoolFound),
        ([], Some(wanted)) => Err(EngineError::PoolNotFound {
            wanted: wanted.to_string(),
            found: listing(),
        }),
        (_, _) => Err(EngineError::AmbiguousPool { found: listing() }),
    }
}

fn no_metadata(members: &[(Arc<dyn BlockDevice>, Label, &Probe)]) -> EngineError {
    let detail = members
        .iter()
        .map(|(device, _, probe)| match probe {
            Probe::Member { slots, .. } => format!(
                "{}: {}; {}",
                device.name(),
                slots[0]
                    .as_ref()
                    .err()
                    .map_or("ok".into(), ToString::to_string),
                slots[1]
                    .as_ref()
                    .err()
                    .map_or("ok".into(), ToString::to_string)
            ),
            _ => device.name().to_string(),
        })
        .collect::<Vec<_>>()
        .join("; ");
    EngineError::NoMetadata {
        pool: members
            .first()
            .map(|m| m.1.pool_name.clone())
            .unwrap_or_default(),
        detail,
    }
}

/// A pool whose disks all have a usage that takes no spaces' data
/// (journal, hot spare, retired) could hold nothing: most likely `--usage`
/// meant for one disk was given for all.
fn refuse_without_capacity(disks: &[NewDisk]) -> Result<(), EngineError> {
    if disks
        .iter()
        .any(|disk| matches!(disk.usage, Usage::Auto | Usage::Manual))
    {
        return Ok(());
    }
    let usages: BTreeSet<String> = disks
        .iter()
        .map(|disk| disk.usage.name().to_string())
        .collect();
    Err(EngineError::NoCapacityDisks {
        usages: usages.into_iter().collect::<Vec<_>>().join(" or "),
    })
}

/// Build the run-time pool from chosen metadata and the devices present.
async fn open(
    env: Arc<dyn Env>,
    metadata: PoolMetadata,
    present: Vec<(Arc<dyn BlockDevice>, Label)>,
    older_copies: BTreeMap<DiskId, String>,
    read_only: Option<String>,
) -> Result<Pool, EngineError> {
    let context = DiskContext::new(env.clone(), &metadata.name);
    let settings = &metadata.settings;
    context
        .errors
        .set(settings.error_limit, settings.error_window_secs);
    let slot_bytes = present
        .first()
        .map(|(_, label)| label.metadata_slot_bytes)
        .unwrap_or(METADATA_SLOT_DEFAULT_BYTES);
    let mut by_id: BTreeMap<DiskId, (Arc<dyn BlockDevice>, Label)> = present
        .into_iter()
        .map(|(device, label)| (label.disk_id, (device, label)))
        .collect();
    // The write intent of extents first written since the last metadata
    // commit is in the intent slots: each disk's newest record, any of
    // them, names extents to resync beside the metadata's list. Kept in
    // the list until import has resynced them, so that a commit of the
    // list meanwhile carries them on.
    let records =
        join_all(by_id.values().map(|(device, label)| async move {
            store::read_intent(device.as_ref(), label).await
        }))
        .await;
    let records: Vec<IntentRecord> = records.into_iter().flatten().collect();
    // Disks catching up (a resync was recorded for them) were in service,
    // their stale slots masked by the resync: so they are again, before
    // recovery writes anything.
    let catching_up: BTreeSet<DiskIndex> = metadata
        .jobs
        .iter()
        .filter(|job| job.is_active())
        .filter_map(|job| match job.kind {
            terrace_meta::JobKind::Resync { disk } => Some(disk),
            _ => None,
        })
        .collect();
    let disks: Vec<Arc<Disk>> = metadata
        .disks
        .iter()
        .enumerate()
        .map(|(position, record)| {
            let index = DiskIndex(position as u16);
            let found = by_id.remove(&record.id);
            let context = context.clone();
            if let Some(why) = older_copies.get(&record.id) {
                return Arc::new(Disk::absent(index, why.clone(), context));
            }
            let catching_up = catching_up.contains(&index);
            Arc::new(runtime_disk(index, record, found, catching_up, context))
        })
        .collect();
    let was_clean = metadata.clean;
    let intent_sequence = records
        .iter()
        .map(|record| record.sequence)
        .max()
        .unwrap_or(0);
    let mut metadata = metadata;
    // Dirty records noted since the metadata imported was committed; those
    // of records written before it, it carries (or dropped since).
    for record in records
        .iter()
        .filter(|r| r.generation >= metadata.generation)
    {
        for &(disk, space, extent) in &record.dirty {
            crate::control::add_dirty(&mut metadata.dirty, disk, space, extent);
        }
    }
    if !was_clean {
        for named in records.iter().flat_map(|record| &record.extents) {
            if !metadata.intent.contains(named) {
                metadata.intent.push(*named);
            }
        }
    }
    let shared = Arc::new(PoolShared::new(
        env,
        metadata.clone(),
        slot_bytes,
        read_only,
        disks,
        context,
        intent_sequence,
    ));
    let pool = Pool {
        shared,
        spaces: RwLock::new(BTreeMap::new()),
        logs: RwLock::new(BTreeMap::new()),
        sums: RwLock::new(BTreeMap::new()),
    };
    if pool.shared.read_only.is_none() {
        let mut control = pool.shared.control.lock().await;
        let mut next = metadata.clone();
        next.clean = false;
        if next.settings.scrub_last_ns == 0 {
            // Written by a build without a scrub schedule: it counts from
            // now, not from long ago (a scrub at once on every upgrade).
            next.settings.scrub_last_ns = pool.shared.env.wall_clock_ns();
        }
        pool.shared.commit(&mut control, next).await?;
    }
    for record in &metadata.spaces {
        let volume = Arc::new(crate::placement::build_volume(
            &pool.shared,
            &metadata,
            record,
        )?);
        match record.role {
            terrace_meta::SpaceRole::Data => {
                let mut space = crate::space::Space::around(volume);
                space.export = record.export.clone();
                pool.spaces
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(record.name.clone(), Arc::new(space));
            }
            // Attached to its space below, once every space is built.
            terrace_meta::SpaceRole::Sums { .. } => {
                pool.sums
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(record.id, volume);
            }
            terrace_meta::SpaceRole::Log { .. } => {
                pool.logs
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(record.id, volume);
            }
        };
    }
    // Sums before anything reads or writes a space.
    for record in &metadata.spaces {
        let (Some(space), Some(sums)) = (pool.space(&record.name), record.sums) else {
            continue;
        };
        let sums = pool
            .sums
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&sums)
            .cloned();
        if let Some(sums) = sums {
            let zeroes = crate::placement::sums_made_with(&metadata, record);
            crate::placement::attach_sums(space.volume(), &sums, false, zeroes);
            // Before the logs replay over them.
            if let Some(sums) = space.volume().sums() {
                sums.recover().await;
            }
        }
    }
    // Jobs' moves before anything reads or writes the disks: a slot that
    // a resync catches up is read only below its watermark, and a move's
    // target is written below its watermark too (a log replaying there
    // must reach it).
    for job in metadata.jobs.iter().filter(|job| job.is_active()) {
        pool.install_job(job);
    }
    // Write-back logs first: what they hold is newer than the disks. A
    // space whose log accounts for everything it had in flight needs no
    // full resync after a crash.
    let mut accounted = std::collections::BTreeSet::new();
    for record in &metadata.spaces {
        if pool.recover_cache(record, !was_clean).await? {
            accounted.insert(record.name.clone());
        }
    }
    if !was_clean && pool.shared.read_only.is_none() {
        // What stays named in the write intent: mirror extents left to
        // resynchronise while the pool serves.
        let mut keep = Vec::new();
        for space in pool.spaces() {
            let id = space.id();
            let named = metadata.intent_of(id);
            let whole = named.contains(&crate::control::INTENT_WHOLE_SPACE);
            let extent_bytes = space.geometry().extent_data_bytes();
            let extents = space.map().extents.len() as u32;
            // A log accounts for what was written through it; what was
            // written while it had failed (write-through) is named in the
            // write intent, so those extents are resynced too. Only the
            // extents named can have been cut mid-write.
            let by_intent = !whole && (accounted.contains(space.name()) || space.uses_intent());
            let cut: Vec<u32> = if by_intent {
                named
                    .into_iter()
                    .filter(|extent| *extent < extents)
                    .collect()
            } else {
                (0..extents).collect()
            };
            if space.layout().resyncs_while_serving() {
                // Rows past the end of the space (in its last extent) are
                // never read or written.
                let row_bytes = space.geometry().row_data_bytes();
                let rows = |extent: u32| {
                    let start = u64::from(extent) * extent_bytes;
                    let within = space.size_bytes().saturating_sub(start).div_ceil(row_bytes);
                    (extent, within.min(space.geometry().rows_per_extent()))
                };
                pool.shared.crash_resync.note(
                    id,
                    cut.iter().map(|extent| rows(*extent)),
                    row_bytes,
                    pool.shared.env.now_ns(),
                );
                // A disk out of service now (a disk returning here is
                // welcomed back below) may have lost, to the power cut,
                // writes it took before it left: unflushed, unrecorded.
                // Its copies of these extents catch up when it returns, as
                // a resynchronisation before serving would have recorded.
                let map = space.map();
                let notes: Vec<MissedExtent> = cut
                    .iter()
                    .flat_map(|&extent| {
                        crate::volume::out_of_service(&map.extents[extent as usize], &[])
                            .into_iter()
                            .map(move |disk| MissedExtent::new(disk, id, extent))
                    })
                    .collect();
                pool.shared.note_dirty_all(&notes).await?;
                if by_intent {
                    keep.extend(cut.iter().map(|extent| (id, *extent)));
                } else if !cut.is_empty() {
                    keep.push((id, crate::control::INTENT_WHOLE_SPACE));
                }
            } else if by_intent {
                for extent in cut {
                    let offset = u64::from(extent) * extent_bytes;
                    crate::redundancy::check_range(
                        &space,
                        offset,
                        extent_bytes,
                        crate::resync::Pass::Resync,
                    )
                    .await?;
                }
            } else {
                crate::redundancy::resync_space(&space).await?;
            }
        }
        pool.shared.flush_disks().await?;
        pool.shared.forget_intent(keep).await?;
    }
    if pool.shared.read_only.is_none() {
        pool.welcome_back(&metadata).await?;
        pool.add_missing_sums().await?;
    }
    Ok(pool)
}

impl Pool {
    /// Disks that were missing and are present again catch up on what was
    /// written while they were away (a resync job). A repair that the
    /// policy started when the disk went missing is cancelled for it: what
    /// the disk still holds needs only the extents written meanwhile, where
    /// the repair would copy all of it elsewhere and retire a good disk (a
    /// disk left out of an import by mistake, or slow to appear at boot).
    /// Under `retire-missing always` the repair goes on and the disk waits,
    /// unused, to be released. A log move taking a slot off the disk is
    /// cancelled too, and starts again after. A disk that another job still
    /// works on (a replacement or evacuation of it) stays out of service:
    /// the import goes on without it.
    async fn welcome_back(&self, metadata: &PoolMetadata) -> Result<(), EngineError> {
        for disk in self.shared.disks() {
            let record = &metadata.disks[usize::from(disk.index.0)];
            let returning = record.state == DiskState::Missing && disk.device().is_some();
            if !returning {
                continue;
            }
            // As it is now: a disk welcomed before may have cancelled a
            // job that this one would cancel too.
            let now = self.metadata().await;
            if crate::jobs::repair_kept_for(&now, disk.index).is_some() {
                continue;
            }
            for (position, because) in &crate::jobs::cancelled_by_return(&now, disk.index) {
                let id = now.jobs[*position].id;
                self.change_job(id, crate::jobs::JobAction::Cancel, because)
                    .await?;
            }
            let kind = terrace_meta::JobKind::Resync { disk: disk.index };
            let resyncing = now
                .jobs
                .iter()
                .any(|job| job.is_active() && job.kind == kind);
            if !resyncing {
                match self.start_job(kind).await {
                    Ok(_) => {}
                    // Left as imported: present but stale, out of service.
                    Err(EngineError::JobConflict { .. }) => continue,
                    Err(error) => return Err(error),
                }
            }
            disk.set_condition(Condition::Online, "");
        }
        Ok(())
    }
}

fn runtime_disk(
    index: DiskIndex,
    record: &DiskRecord,
    found: Option<(Arc<dyn BlockDevice>, Label)>,
    catching_up: bool,
    failures: DiskContext,
) -> Disk {
    match (record.state, found) {
        (DiskState::Active, Some((device, label))) => Disk::present(index, device, label, failures),
        (DiskState::Missing, Some((device, label))) if catching_up => {
            Disk::present(index, device, label, failures)
        }
        (DiskState::Active, None) => Disk::absent(index, "not found at import", failures),
        (DiskState::Removed, _) => Disk::absent(index, "removed from the pool", failures),
        (state, Some((device, label))) => {
            let disk = Disk::present(index, device, label, failures);
            let (condition, reason) = if state == DiskState::Failed {
                (
                    Condition::Failed,
                    format!("{}; present: {CLEARED_BACK}", record.state_reason),
                )
            } else {
                (
                    Condition::Standby,
                    format!("{}; present but stale", record.state_reason),
                )
            };
            disk.set_condition(condition, reason);
            disk
        }
        (_, None) => Disk::absent(index, record.state_reason.clone(), failures),
    }
}
