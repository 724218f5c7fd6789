//! Write-back caches as the pool sees them: where a space's log lives, how
//! big it is, recovering it at import, resizing it live, and destaging.
//!
//! A log is a hidden mirrored space (role `Log`) with as many copies as the
//! space it serves tolerates failures plus one: 2 for simple, 2-way mirror
//! and single parity, 3 for 3-way mirror and dual parity, so losing log
//! disks costs no more than the space itself tolerates. It lives on the
//! pool's journal disks when there are enough of them, else on capacity
//! disks. Being a space, it is repaired by the same jobs as any other when
//! one of its disks fails: the log is re-mirrored onto another journal disk
//! or free space.

use std::sync::Arc;

use futures::future::BoxFuture;
use terrace_io::env::Env;
use terrace_io::BytesMut;
use terrace_layout::{Geometry, Layout};
use terrace_meta::{
    CacheRecord, FaultDomain, PoolMetadata, SpaceId, SpaceRecord, SpaceRole, Usage,
};

use crate::control::PoolShared;
use crate::error::EngineError;
use crate::journal::{
    self, Checkpoints, HomeIo, Journal, CACHE_DEFAULT_BYTES, CACHE_ENGINE_MIN_BYTES,
    CACHE_MAX_BYTES, CACHE_SMALL_BYTES,
};
use crate::payload::Payload;
use crate::placement::{
    allocate_growth, build_volume, journal_disks, plan_space, preallocate_log, shape, targets,
    SpaceConfig, SpaceSize,
};
use crate::pool::Pool;
use crate::space::Space;
use crate::units::format_size;
use crate::volume::Volume;

/// How long the destager sleeps when no cache needs it.
const DESTAGE_IDLE_NS: u64 = 20_000_000;

/// Copies of the log of a space with `layout`: one more than the failures
/// the space survives, so the log survives as many, and never fewer than
/// two (a log of a simple space still outlives one disk).
pub fn log_copies(layout: Layout) -> u32 {
    crate::placement::hidden_copies(layout)
}

/// The cache size a new space gets in a pool with `metadata`: as asked, or
/// the default (`None`: no cache). The first of [`log_choices`].
pub fn cache_size(
    config: &SpaceConfig,
    metadata: &PoolMetadata,
) -> Result<Option<u64>, EngineError> {
    let choices = log_choices(config.cache_bytes, config.layout, metadata)?;
    Ok(choices.first().map(|(bytes, _)| *bytes))
}

/// Where a log is placed: on the journal disks, or on capacity disks
/// (the disks the spaces use) for the reason given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogDisks {
    Journal,
    Capacity { why: String },
}

/// The logs a space with `layout` may get, tried in order: `asked` bytes
/// (`Some(0)`: none), or the default. With journal disks enough for its
/// copies a log goes there; when they have no room left it goes on
/// capacity disks instead. A parity space always gets a log unless asked
/// for none (as Storage Spaces does: without one, a crash mid-write leaves
/// a write hole): 1 GiB on journal disks, else 32 MiB on capacity disks.
/// Other layouts get a default log only on journal disks.
pub fn log_choices(
    asked: Option<u64>,
    layout: Layout,
    metadata: &PoolMetadata,
) -> Result<Vec<(u64, LogDisks)>, EngineError> {
    let copies = log_copies(layout) as usize;
    let journals = journal_disks(metadata);
    let parity = layout.row_wide_redundancy();
    let full = |bytes: u64| LogDisks::Capacity {
        why: format!(
            "the journal disks have no room left for {}",
            format_size(bytes)
        ),
    };
    let few = LogDisks::Capacity {
        why: match journals {
            0 => "the pool has no journal disks".to_string(),
            n => format!("the pool has {n} journal disks, and the log needs {copies}"),
        },
    };
    Ok(match asked {
        Some(0) => Vec::new(),
        Some(bytes) => {
            let bytes = check_size(bytes)?;
            if journals >= copies {
                vec![(bytes, LogDisks::Journal), (bytes, full(bytes))]
            } else {
                vec![(bytes, few)]
            }
        }
        None if journals >= copies && parity => vec![
            (CACHE_DEFAULT_BYTES, LogDisks::Journal),
            (CACHE_SMALL_BYTES, full(CACHE_DEFAULT_BYTES)),
        ],
        None if journals >= copies => vec![(CACHE_DEFAULT_BYTES, LogDisks::Journal)],
        None if parity => vec![(CACHE_SMALL_BYTES, few)],
        None => Vec::new(),
    })
}

fn check_size(bytes: u64) -> Result<u64, EngineError> {
    if (CACHE_ENGINE_MIN_BYTES..=CACHE_MAX_BYTES).contains(&bytes) {
        Ok(bytes.next_multiple_of(terrace_layout::BLOCK_BYTES))
    } else {
        Err(EngineError::InvalidSetting {
            what: "write-back cache size",
            value: bytes,
            rule: "from 256K to 100G",
        })
    }
}

/// The disks a log lives on, as a refusal names them.
fn log_disks_kind(on_journal: bool) -> &'static str {
    if on_journal {
        "journal disks"
    } else {
        "capacity disks"
    }
}

/// Plan the log of space `owner` into `next` (its record and the owner's
/// cache record) on `disks` and build it; nothing is written.
pub(crate) fn plan_log(
    shared: &Arc<PoolShared>,
    next: &mut PoolMetadata,
    owner: SpaceId,
    bytes: u64,
    disks: &LogDisks,
) -> Result<(Volume, CacheRecord), EngineError> {
    let owner_record = next
        .spaces
        .iter()
        .find(|s| s.id == owner)
        .expect("owner planned");
    let copies = log_copies(owner_record.layout);
    let owner_name = owner_record.name.clone();
    let config = SpaceConfig {
        columns: Some(1),
        ..SpaceConfig::new(
            format!(".log-{}", owner.0),
            Layout::Mirror { copies },
            SpaceSize::Bytes(bytes),
        )
    };
    let on_journal = *disks == LogDisks::Journal;
    let allocator = if on_journal {
        shared.allocator(next, FaultDomain::Disk, |_, disk| disk.serves_logs())
    } else {
        shared.allocator(next, FaultDomain::Disk, |_, disk| disk.takes_capacity())
    };
    let now = shared.env.wall_clock_ns();
    let (mut record, _) = plan_space(&config, next, allocator, FaultDomain::Disk, now).map_err(
        |error| match error {
            // Named after the space whose cache it is, not the hidden log.
            EngineError::NoCapacity { detail, .. } => EngineError::NoCapacity {
                space: owner_name.clone(),
                detail: format!(
                    "its write-back cache on {}: {detail}",
                    log_disks_kind(on_journal)
                ),
            },
            other => other,
        },
    )?;
    record.role = SpaceRole::Log { owner };
    record.export = None;
    record.columns_reason = match disks {
        LogDisks::Journal => {
            format!("the write-back log of space {owner_name}: {copies} copies on journal disks")
        }
        LogDisks::Capacity { why } => format!(
            "the write-back log of space {owner_name}: {copies} copies on capacity disks, as {why}"
        ),
    };
    let cache = CacheRecord {
        bytes,
        log_space: record.id,
        epoch: shared.env.random_u64(),
        checkpoint_hint: 0,
        checkpoint_offset: 0,
    };
    next.next_space_id += 1;
    next.spaces.push(record.clone());
    if let Some(owner) = next.spaces.iter_mut().find(|s| s.id == owner) {
        owner.cache = Some(cache);
    }
    let log = build_volume(shared, next, &record)?;
    Ok((log, cache))
}

/// The first of `choices` (see [`log_choices`]) whose log fits, with
/// room left in the metadata for a repair, planned into a copy of
/// `metadata`; else the refusal of the last.
pub(crate) fn first_log_that_fits(
    shared: &Arc<PoolShared>,
    metadata: &PoolMetadata,
    owner: SpaceId,
    choices: &[(u64, LogDisks)],
) -> Result<(PoolMetadata, (Volume, CacheRecord)), EngineError> {
    let mut refusal = None;
    for (bytes, disks) in choices {
        let mut next = metadata.clone();
        let planned = plan_log(shared, &mut next, owner, *bytes, disks).and_then(|log| {
            crate::room::check_room(&next, shared.metadata_slot_bytes)?;
            Ok(log)
        });
        match planned {
            Ok(log) => return Ok((next, log)),
            Err(error) => refusal = Some(error),
        }
    }
    Err(refusal.unwrap_or(EngineError::InvalidSetting {
        what: "write-back cache size",
        value: 0,
        rule: "from 256K to 100G",
    }))
}

impl Pool {
    pub(crate) fn attach_cache(&self, space: &Arc<Space>, log: Arc<Volume>, cache: &CacheRecord) {
        log.set_disjoint_writes();
        let parity = space.geometry().layout().row_wide_redundancy();
        let journal = Journal::new(
            space.id(),
            log.clone(),
            self.shared.clone(),
            cache.bytes,
            cache.epoch,
            parity,
        );
        self.register_log(&log);
        space.set_journal(Some(Arc::new(journal)));
    }

    /// Make a log space known to the pool (jobs find it to repair or move
    /// it) before it serves a cache.
    pub(crate) fn register_log(&self, log: &Arc<Volume>) {
        self.logs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(log.id(), log.clone());
    }

    /// At import: replay a space's log into it, resynchronise the ranges
    /// it names as written straight to the disks, and start a fresh ring
    /// (or, read-only, serve what the log holds from memory). Gives whether
    /// the log accounts for every write the space may have had in flight,
    /// so that the space needs no full resync after a crash. `crashed`:
    /// the pool was not closed cleanly, so the sums of the rows the log
    /// names may lag their data and are learned again; after a clean
    /// close they are right, and a block failing them is rebuilt or stays
    /// failed.
    pub(crate) async fn recover_cache(
        &self,
        record: &SpaceRecord,
        crashed: bool,
    ) -> Result<bool, EngineError> {
        let Some(cache) = record.cache else {
            return Ok(false);
        };
        let (Some(space), Some(log)) = (
            self.space(&record.name),
            self.logs
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&cache.log_space)
                .cloned(),
        ) else {
            return Ok(false);
        };
        let whole = log.readable_everywhere().is_ok();
        let recovered = journal::scan(&*log, &cache).await?;
        if self.shared.read_only.is_some() {
            let journal = Journal::new(
                space.id(),
                log.clone(),
                self.shared.clone(),
                cache.bytes,
                cache.epoch,
                false,
            );
            journal::load_read_only(&journal, recovered.blocks);
            self.logs
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(log.id(), log);
            space.set_journal(Some(Arc::new(journal)));
            return Ok(false);
        }
        if space.readable_everywhere().is_err() {
            // The writes the log holds cannot go home: hold the space (its
            // clients refused) with the log as it is, until `pool clear`
            // takes its disks back and recovers it again.
            if !recovered.blocks.is_empty() || !recovered.dirty.is_empty() {
                space.set_held(Some(format!(
                    "its write-back log holds writes that cannot go home while more of its \
                     disks are out than it tolerates; once they work again, \
                     clearing pool {}'s disks takes them back",
                    self.shared.name
                )));
                return Ok(false);
            }
        }
        // Rows the log touched may have been cut mid-update (a destage or a
        // direct write): make their redundancy agree with their data (each
        // block first rebuilt where its stored sum says so) before the
        // replay updates them: a parity update reads old data and parity,
        // checked against the sums, and torn parity would go into it.
        let mut ranges = recovered.dirty.clone();
        ranges.extend(journal::block_runs(&recovered.blocks));
        let pass = match crashed {
            true => crate::resync::Pass::Resync,
            false => crate::resync::Pass::Repair,
        };
        let home = async {
            for (offset, length) in ranges {
                crate::redundancy::check_range(&space, offset, length, pass).await?;
            }
            journal::replay(space.volume().as_ref(), &*log, &recovered.blocks).await
        };
        match home.await {
            // A row past its tolerance (its disks out, or a block no
            // redundancy rebuilds): hold the space as above, its log as it
            // is (a replay writes the same again), rather than fail the
            // pool's import.
            Err(error @ EngineError::Unavailable { .. }) => {
                space.set_held(Some(format!(
                    "its write-back log holds writes that cannot go home ({error}); \
                     they stay in the log, and once the disks out work again, \
                     clearing pool {}'s disks takes them back",
                    self.shared.name
                )));
                return Ok(false);
            }
            result => result?,
        }
        self.shared.flush_disks().await?;
        let epoch = self.shared.env.random_u64();
        self.shared
            .update_cache_record(space.id(), |cache| {
                cache.epoch = epoch;
                cache.checkpoint_hint = 0;
                cache.checkpoint_offset = 0;
            })
            .await?;
        self.attach_cache(
            &space,
            log,
            &CacheRecord {
                epoch,
                checkpoint_hint: 0,
                checkpoint_offset: 0,
                ..cache
            },
        );
        // Held until now if its disks were out: it serves again.
        space.set_held(None);
        Ok(whole)
    }

    /// Change the write-back cache size of a live space (32M to 100G);
    /// gives the size set. A space without a cache gets one.
    pub async fn set_cache_size(&self, name: &str, bytes: u64) -> Result<u64, EngineError> {
        self.shared.check_open()?;
        self.shared.check_writable()?;
        let _changes = self.shared.changes.lock().await;
        let bytes = check_size(bytes)?;
        let space = self.space(name).ok_or_else(|| EngineError::NoSuchSpace {
            name: name.to_string(),
        })?;
        let Some(journal) = space.journal() else {
            return self.add_cache(&space, bytes).await;
        };
        let log = journal.log().clone();
        if bytes > log.size_bytes() {
            self.grow_log(&log, name, bytes).await?;
        }
        self.shared
            .update_cache_record(space.id(), |cache| cache.bytes = bytes)
            .await?;
        if bytes > log.size_bytes() {
            // Log slabs were released after an earlier shrink meanwhile.
            self.grow_log(&log, name, bytes).await?;
        }
        journal.set_size(bytes);
        Ok(bytes)
    }

    /// Give back the log extents a shrunk cache no longer uses, once its
    /// ring has moved into the smaller lap (see
    /// [`Journal::log_bytes_in_use`]); extents a job is moving wait for it.
    /// Returns whether slabs were released.
    pub async fn release_log_slabs(&self, space: &Space) -> Result<bool, EngineError> {
        let Some(journal) = space.journal() else {
            return Ok(false);
        };
        let log = journal.log().clone();
        let geometry = *log.geometry();
        let fewer = |in_use: u64| geometry.extents_for(in_use) < log.map().extents.len() as u64;
        if !journal.log_bytes_in_use().is_some_and(fewer) {
            return Ok(false);
        }
        let mut control = self.shared.control.lock().await;
        let Some(in_use) = journal.log_bytes_in_use() else {
            return Ok(false);
        };
        let cache_bytes = control
            .metadata
            .spaces
            .iter()
            .find(|s| s.id == space.id())
            .and_then(|s| s.cache.as_ref())
            .map_or(0, |cache| cache.bytes);
        let keep = geometry.extents_for(in_use.max(cache_bytes));
        let mut next = control.metadata.clone();
        let Some(position) = next.spaces.iter().position(|s| s.id == log.id()) else {
            return Ok(false);
        };
        let have = next.spaces[position].extents.len() as u64;
        let moving = next.jobs.iter().filter(|job| job.is_active()).any(|job| {
            job.moves
                .iter()
                .any(|m| m.space == log.id() && u64::from(m.extent) >= keep)
        });
        if keep >= have || keep == 0 || moving {
            return Ok(false);
        }
        let record = &mut next.spaces[position];
        record.extents.truncate(keep as usize);
        record.size_bytes = keep * geometry.extent_data_bytes();
        let size_bytes = record.size_bytes;
        let gone = |id: SpaceId, extent: u32| id == log.id() && u64::from(extent) >= keep;
        for dirty in &mut next.dirty {
            dirty.extents.retain(|&(id, extent)| !gone(id, extent));
        }
        next.dirty.retain(|dirty| !dirty.extents.is_empty());
        next.intent.retain(|&(id, extent)| !gone(id, extent));
        self.shared.commit(&mut control, next).await?;
        log.shrink(size_bytes);
        Ok(true)
    }

    /// Give `space` a cache. The log is committed first and prepared
    /// outside the control lock (see [`preallocate_log`]); the space's
    /// writes go straight to its disks until the cache is attached. Should
    /// the pool stop in between, its next import attaches the log as any
    /// other (its old bytes never pass for records).
    async fn add_cache(&self, space: &Arc<Space>, bytes: u64) -> Result<u64, EngineError> {
        let (log, cache, slab_bytes) = {
            let mut control = self.shared.control.lock().await;
            let layout = space.geometry().layout();
            let choices = log_choices(Some(bytes), layout, &control.metadata)?;
            let (next, (log, cache)) =
                first_log_that_fits(&self.shared, &control.metadata, space.id(), &choices)?;
            let slab_bytes = next.slab_bytes;
            self.shared.commit(&mut control, next).await?;
            (Arc::new(log), cache, slab_bytes)
        };
        self.register_log(&log);
        preallocate_log(&log, space.name(), 0, slab_bytes).await;
        self.attach_cache(space, log, &cache);
        Ok(bytes)
    }

    /// Add extents to a log space (on the same class of disks).
    async fn grow_log(
        &self,
        log: &Arc<Volume>,
        owner: &str,
        bytes: u64,
    ) -> Result<(), EngineError> {
        let mut control = self.shared.control.lock().await;
        let mut next = control.metadata.clone();
        let position = next
            .spaces
            .iter()
            .position(|s| s.id == log.id())
            .ok_or_else(|| EngineError::NoSuchSpace {
                name: log.name().to_string(),
            })?;
        let geometry = *log.geometry();
        let on_journal = next.spaces[position].extents.iter().any(|extent| {
            extent.slabs.iter().flatten().any(|slab| {
                next.disks
                    .get(usize::from(slab.disk.0))
                    .is_some_and(|d| d.usage == Usage::Journal)
            })
        });
        let mut allocator = if on_journal {
            self.shared
                .allocator(&next, FaultDomain::Disk, |_, disk| disk.serves_logs())
        } else {
            self.shared
                .allocator(&next, FaultDomain::Disk, |_, disk| disk.takes_capacity())
        };
        let requested = bytes.next_multiple_of(geometry.extent_data_bytes());
        let have = next.spaces[position].extents.len() as u64;
        // The size set, as the user knows it (after a shrink the log may
        // still hold more, until the ring has wrapped).
        let set_bytes = match next.spaces[position].role {
            SpaceRole::Log { owner } => next
                .spaces
                .iter()
                .find(|s| s.id == owner)
                .and_then(|s| s.cache.as_ref())
                .map(|cache| cache.bytes),
            SpaceRole::Data | SpaceRole::Sums { .. } => None,
        };
        let from_bytes = set_bytes.unwrap_or(have * geometry.extent_data_bytes());
        let added = allocate_growth(&mut allocator, &geometry, have, requested, owner, || {
            format!(
                "its write-back cache growing from {} to {} as {} on {}",
                format_size(from_bytes),
                format_size(requested),
                shape(&geometry),
                log_disks_kind(on_journal),
            )
        })?;
        let added_targets = targets(&self.shared, &next, &added)?;
        let record = &mut next.spaces[position];
        record.size_bytes = requested;
        record.extents.extend(added);
        // The cache's size goes into the same commit, so that releasing
        // unused log slabs keeps these while they are prepared.
        if let SpaceRole::Log { owner } = record.role {
            if let Some(cache) = next
                .spaces
                .iter_mut()
                .find(|s| s.id == owner)
                .and_then(|s| s.cache.as_mut())
            {
                cache.bytes = cache.bytes.max(bytes);
            }
        }
        crate::room::check_room(&next, self.shared.metadata_slot_bytes)?;
        self.shared.commit(&mut control, next).await?;
        drop(control);
        let first = log.map().extents.len();
        log.grow(requested, added_targets);
        // The ring takes the new extents only when the caller sets the
        // journal's size, after this.
        preallocate_log(log, owner, first, geometry.slab_bytes()).await;
        Ok(())
    }

    /// Destage write-back caches until the pool closes: each round, every
    /// cache above its fill threshold destages a batch, the fuller the
    /// bigger. The daemon spawns this once per pool; writers that find a
    /// log full destage themselves, so nothing hangs without it.
    pub async fn run_cache(&self) {
        while self.shared.check_open().is_ok() && self.shared.read_only.is_none() {
            let mut progressed = false;
            for space in self.spaces() {
                if let Some(journal) = space.journal() {
                    if let Ok(true) = journal.destage(&space, false).await {
                        progressed = true;
                    }
                    // A failed release is tried again next round.
                    let _ = self.release_log_slabs(&space).await;
                }
            }
            if !progressed {
                self.shared.env.sleep(DESTAGE_IDLE_NS).await;
            }
        }
    }

    /// Destage every cache completely (tests, and before an export).
    pub async fn drain_caches(&self) -> Result<(), EngineError> {
        for space in self.spaces() {
            if let Some(journal) = space.journal() {
                journal.drain(&space).await?;
            }
        }
        Ok(())
    }
}

impl PoolShared {
    /// Change the cache record of space `home` in a metadata commit.
    pub(crate) async fn update_cache_record(
        &self,
        home: SpaceId,
        change: impl FnOnce(&mut CacheRecord),
    ) -> Result<(), EngineError> {
        let mut control = self.control.lock().await;
        let mut next = control.metadata.clone();
        let Some(cache) = next
            .spaces
            .iter_mut()
            .find(|space| space.id == home)
            .and_then(|space| space.cache.as_mut())
        else {
            return Ok(());
        };
        change(cache);
        self.commit(&mut control, next).await
    }
}

/// The journal commits its tail in the pool's metadata.
impl Checkpoints for PoolShared {
    fn commit_tail(
        &self,
        home: SpaceId,
        position: u64,
        offset: u64,
    ) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(self.update_cache_record(home, move |cache| {
            cache.checkpoint_hint = position;
            cache.checkpoint_offset = offset;
        }))
    }
}

/// A volume is what a journal fronts (a space's), and what holds a
/// journal's ring (a log).
impl HomeIo for Volume {
    fn emit(&self, event: crate::PoolEvent) {
        self.pool.events.emit(event);
    }

    fn log_failed(&self) {
        self.set_logged(false);
    }

    fn id(&self) -> SpaceId {
        Volume::id(self)
    }

    fn name(&self) -> &str {
        Volume::name(self)
    }

    fn size_bytes(&self) -> u64 {
        Volume::size_bytes(self)
    }

    fn geometry(&self) -> &Geometry {
        Volume::geometry(self)
    }

    fn natural_write_bytes(&self) -> u64 {
        Volume::natural_write_bytes(self)
    }

    fn healthy_for(&self, offset: u64, length: u64) -> bool {
        Volume::healthy_for(self, offset, length)
    }

    fn cheap_fua(&self) -> bool {
        Volume::cheap_fua(self)
    }

    fn read(&self, offset: u64, length: u64) -> BoxFuture<'_, Result<BytesMut, EngineError>> {
        Box::pin(Volume::read(self, offset, length))
    }

    fn read_copies(
        &self,
        offset: u64,
        length: u64,
    ) -> BoxFuture<'_, Vec<Result<BytesMut, EngineError>>> {
        Box::pin(Volume::read_copies(self, offset, length))
    }

    async fn write_home(
        &self,
        offset: u64,
        data: impl Into<Payload> + Send,
        fua: bool,
    ) -> Result<(), EngineError> {
        Volume::write_home(self, offset, data, fua).await
    }

    async fn write_home_merged(&self, pieces: &[(u64, Payload)]) -> Result<(), EngineError> {
        Volume::write_home_merged(self, pieces).await
    }

    async fn flush_own_disks(&self) -> Result<(), EngineError> {
        Volume::flush_own_disks(self).await
    }

    async fn flush_pool_disks(&self) -> Result<(), EngineError> {
        self.pool.flush_disks().await
    }

    fn env(&self) -> &dyn Env {
        &*self.pool.env
    }

    fn log_memory_take(&self, bytes: u64) -> bool {
        self.pool.log_memory.take(bytes)
    }

    fn log_memory_give_back(&self, bytes: u64) {
        self.pool.log_memory.give_back(bytes)
    }
}
