//! The pool's control state and its metadata commits.
//!
//! One owner: every change of pool metadata happens under the control lock,
//! one at a time, and goes through [`PoolShared::commit`]. The data path
//! never takes this lock except to wait for a failure to be recorded.
//!
//! # Commit
//!
//! A commit writes the next generation to slot `generation mod 2` of every
//! member disk and flushes it (see `terrace_meta::store`). Disks whose write
//! fails are marked failed, dropped from the member set, and the commit is
//! repeated with a new generation on the survivors, so disk failures never
//! cost the pool its metadata. The commit fails only when no disk at all
//! takes it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use futures::future::join_all;
use terrace_io::Env;
use terrace_meta::store::{encode_intent, encode_slot, write_intent, write_slot};
use terrace_meta::{
    Allocator, DirtyRecord, DiskIndex, DiskRecord, DiskState, ExtentRecord, FaultDomain,
    IntentRecord, PoolMetadata, SlabIndex, SlabRef, SpaceId,
};

use crate::disk::{Condition, Disk, DiskContext};
use crate::error::EngineError;
use crate::events::{PoolEvent, PoolEvents};
use crate::failures::{FailureRecords, MissedExtent};
use crate::intent::{ExtentKey, WriteIntent};
use crate::log_memory::LogMemory;
use crate::slab_holds::{Epoch, Reservation, SlabHolds};

pub(crate) struct Control {
    pub metadata: PoolMetadata,
    /// The sequence of the last write-intent record written (see
    /// [`PoolShared::commit_intent`]).
    pub intent_sequence: u64,
    /// When the last metadata commit ended ([`Env::now_ns`]; 0 before one).
    pub committed_at_ns: u64,
    /// Dirty records added since the last metadata commit: the intent
    /// slots carry them until the next one does.
    pub dirty_noted: Vec<(DiskIndex, SpaceId, u32)>,
}

pub struct PoolShared {
    pub(crate) env: Arc<dyn Env>,
    pub(crate) name: String,
    /// Why the pool refuses writes, if it does.
    pub(crate) read_only: Option<String>,
    /// Size of each metadata slot (the same on every disk of the pool).
    pub(crate) metadata_slot_bytes: u64,
    /// Bytes of a slot the last commit wrote (header, metadata, padding),
    /// for `pool status`.
    pub(crate) metadata_bytes: AtomicU64,
    pub(crate) control: futures::lock::Mutex<Control>,
    pub(crate) disks: RwLock<Vec<Arc<Disk>>>,
    pub(crate) closed: AtomicBool,
    /// When a client's read or write last reached one of the pool's spaces
    /// or ended (`Env::now_ns`; 0: never), and how many are under way: a
    /// scrub slows down while clients are busy.
    pub(crate) client_io_ns: AtomicU64,
    pub(crate) client_io_in_flight: AtomicU64,
    /// Disk failures and the extents disks missed, until commits record
    /// them (see [`FailureRecords`]).
    pub(crate) failures: FailureRecords,
    /// What every disk of the pool is given (a new one too).
    pub(crate) disk_context: DiskContext,
    /// Where what happens in the pool is told (see [`crate::events`]).
    pub(crate) events: Arc<PoolEvents>,
    pub(crate) job_runtime: crate::job_runtime::JobRuntime,
    /// Write intent of spaces without a log (see [`PoolShared::begin_intent`]).
    intent: WriteIntent,
    /// Mirror extents left to resynchronise since an unclean shutdown.
    pub(crate) crash_resync: crate::crash_resync::CrashResync,
    /// Memory the write-back logs of the pool's spaces hold their dirty
    /// data in (see [`LogMemory`]).
    pub(crate) log_memory: LogMemory,
    /// Slabs set aside for a change not yet committed, and slabs a
    /// space's map stopped naming while requests that began earlier may
    /// still use them: no allocation takes them (see [`SlabHolds`]).
    slab_holds: SlabHolds,
    /// Disks being taken out of service while writes run.
    pub(crate) departures: crate::departures::Departures,
    /// Serialises the changes that plan outside the control lock and
    /// commit later (space creation, cache changes, resizes, deletion), so
    /// that names and space ids planned stay theirs until committed.
    pub(crate) changes: futures::lock::Mutex<()>,
    /// The log being prepared now, if any (see `admin::preallocate_log`):
    /// its owner's name, the bytes to write and those written.
    pub(crate) preparing: std::sync::Mutex<Option<(String, u64, Arc<AtomicU64>)>>,
    /// The sums of the pool's spaces: written back before every flush of
    /// the disks, so that whatever a flush makes durable (the write intent
    /// letting go of an extent, a log's tail moving on, a close) covers
    /// the sums of the data too.
    pub(crate) sums: crate::sums::Registry,
}

pub(crate) use crate::intent::{INTENT_IDLE_NS, INTENT_WHOLE_SPACE};
/// Extents the write intent names at most; beyond, a space is named whole
/// ([`INTENT_WHOLE_SPACE`]), so the list stays small (and its record
/// within an intent slot, beside the dirty records noted since the last
/// commit).
const INTENT_EXTENTS_MAX: usize = 1024;

/// Writes in flight to some extents; dropping it ends them.
pub(crate) struct IntentGuard<'a> {
    shared: &'a PoolShared,
    space: SpaceId,
    extents: std::ops::Range<u32>,
}

impl Drop for IntentGuard<'_> {
    fn drop(&mut self) {
        let now = self.shared.env.now_ns();
        self.shared
            .intent
            .end(self.space, self.extents.clone(), now);
    }
}

/// A client's request under way (see [`PoolShared::client_io`]).
pub(crate) struct ClientIo<'a>(&'a PoolShared);

impl Drop for ClientIo<'_> {
    fn drop(&mut self) {
        self.0
            .client_io_ns
            .store(self.0.env.now_ns(), Ordering::Relaxed);
        self.0.client_io_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl PoolShared {
    /// A client's request reached a space now; it is under way until the
    /// guard drops.
    pub(crate) fn client_io(&self) -> ClientIo<'_> {
        self.client_io_in_flight.fetch_add(1, Ordering::Relaxed);
        self.client_io_ns
            .store(self.env.now_ns(), Ordering::Relaxed);
        ClientIo(self)
    }

    /// No client's request is under way, and none reached a space or
    /// ended within `quiet_ns`.
    pub(crate) fn clients_idle(&self, quiet_ns: u64) -> bool {
        if self.client_io_in_flight.load(Ordering::Relaxed) > 0 {
            return false;
        }
        let last = self.client_io_ns.load(Ordering::Relaxed);
        last == 0 || self.env.now_ns().saturating_sub(last) >= quiet_ns
    }

    /// Set `slabs` aside until the reservation drops: allocations made
    /// meanwhile (through [`PoolShared::allocator`]) leave them alone.
    pub(crate) fn reserve(&self, slabs: impl IntoIterator<Item = SlabRef>) -> Reservation<'_> {
        self.slab_holds.reserve(slabs)
    }

    /// The slabs reserved now, and those retired whose epoch lives.
    pub(crate) fn reserved_slabs(&self) -> BTreeSet<SlabRef> {
        self.slab_holds.held()
    }

    /// Keep `slabs` from allocations while `epoch` lives. Called under the
    /// control lock by whoever commits the slabs free, before it lets the
    /// lock go: an allocation planned in between would see them free.
    pub(crate) fn retire(&self, slabs: impl IntoIterator<Item = SlabRef>, epoch: Epoch) {
        self.slab_holds.retire(slabs, epoch);
    }

    /// Where slab `slab` of a disk of this pool begins on it.
    pub(crate) fn slab_base(&self, slab: SlabIndex, slab_bytes: u64) -> u64 {
        terrace_meta::format::data_offset(self.metadata_slot_bytes) + u64::from(slab.0) * slab_bytes
    }

    /// The slab a location beginning at `base` on a disk of this pool lies in.
    pub(crate) fn slab_at(&self, base: u64, slab_bytes: u64) -> SlabIndex {
        let data_start = terrace_meta::format::data_offset(self.metadata_slot_bytes);
        SlabIndex(((base - data_start) / slab_bytes) as u32)
    }

    /// An allocator over `metadata`'s free slabs of the disks `eligible`
    /// takes, reserved slabs left out. Every allocation goes through here
    /// (or, for jobs, leaves [`PoolShared::reserved_slabs`] out itself).
    pub(crate) fn allocator(
        &self,
        metadata: &PoolMetadata,
        level: FaultDomain,
        eligible: impl Fn(DiskIndex, &DiskRecord) -> bool,
    ) -> Allocator {
        Allocator::with_filter(metadata, level, eligible).exclude(&self.reserved_slabs())
    }

    pub(crate) fn new(
        env: Arc<dyn Env>,
        metadata: PoolMetadata,
        metadata_slot_bytes: u64,
        read_only: Option<String>,
        disks: Vec<Arc<Disk>>,
        disk_context: DiskContext,
        intent_sequence: u64,
    ) -> PoolShared {
        PoolShared {
            env,
            name: metadata.name.clone(),
            read_only,
            metadata_slot_bytes,
            metadata_bytes: AtomicU64::new(
                encode_slot(&metadata, metadata_slot_bytes).map_or(0, |slot| slot.len() as u64),
            ),
            failures: FailureRecords::new(disk_context.failures_observed.clone(), &metadata),
            events: disk_context.events.clone(),
            disk_context,
            intent: WriteIntent::new(
                metadata
                    .intent
                    .iter()
                    .map(|&(space, extent)| ExtentKey::new(space, extent)),
            ),
            crash_resync: Default::default(),
            control: futures::lock::Mutex::new(Control {
                intent_sequence,
                committed_at_ns: 0,
                dirty_noted: Vec::new(),
                metadata,
            }),
            disks: RwLock::new(disks),
            closed: AtomicBool::new(false),
            client_io_ns: AtomicU64::new(0),
            client_io_in_flight: AtomicU64::new(0),
            job_runtime: crate::job_runtime::JobRuntime::default(),
            slab_holds: Default::default(),
            departures: Default::default(),
            changes: Default::default(),
            preparing: Default::default(),
            log_memory: LogMemory::new(crate::journal::LOG_MEMORY_DEFAULT_BYTES),
            sums: Default::default(),
        }
    }

    /// Record, durably, that `extent` of `space` was written while `disks`
    /// were missing: if they come back, only such extents are resynced. The
    /// record is written (to the intent slots, and by the next metadata
    /// commit to the metadata) before the write is issued, so a crash
    /// cannot leave a write the returning disk missed unrecorded.
    pub(crate) async fn note_dirty(
        &self,
        space: SpaceId,
        extent: u32,
        disks: &[DiskIndex],
    ) -> Result<(), EngineError> {
        let notes: Vec<_> = disks
            .iter()
            .map(|disk| MissedExtent::new(*disk, space, extent))
            .collect();
        self.note_dirty_all(&notes).await
    }

    /// [`PoolShared::note_dirty`] for many (disk, space, extent) at once:
    /// one record for all of them.
    pub(crate) async fn note_dirty_all(&self, notes: &[MissedExtent]) -> Result<(), EngineError> {
        let unknown = self.failures.unknown(notes);
        if unknown.is_empty() || self.read_only.is_some() {
            return Ok(());
        }
        let mut control = self.control.lock().await;
        let added: Vec<(DiskIndex, SpaceId, u32)> = unknown
            .iter()
            .map(|note| note.as_tuple())
            .filter(|&(disk, space, extent)| !control.metadata.is_dirty(disk, space, extent))
            .collect();
        if !added.is_empty() {
            let list = control.metadata.intent.clone();
            self.commit_intent(&mut control, list, &added).await?;
        }
        self.failures.know(&unknown);
        Ok(())
    }

    /// Before writing `extents` of `space` (a redundant space without a
    /// write-back log): make sure the write intent names them durably,
    /// writing the intent slots if it does not yet, and count the write in
    /// flight until the guard drops. After a crash only extents so named
    /// are resynchronised; an extent stays named while it is written and
    /// is cleared by [`PoolShared::clear_idle_intent`] once idle and
    /// flushed, so a steady stream of writes costs no commits.
    pub(crate) async fn begin_intent(
        &self,
        space: SpaceId,
        extents: std::ops::Range<u32>,
    ) -> Result<IntentGuard<'_>, EngineError> {
        let now = self.env.now_ns();
        let missing = self.intent.begin(space, extents.clone(), now);
        let guard = IntentGuard {
            shared: self,
            space,
            extents,
        };
        if missing.is_empty() || self.read_only.is_some() {
            return Ok(guard);
        }
        let mut control = self.control.lock().await;
        let mut list = control.metadata.intent.clone();
        let mut named = missing.clone();
        if list.len() + missing.len() > INTENT_EXTENTS_MAX {
            list.retain(|(id, _)| *id != space);
            named = vec![INTENT_WHOLE_SPACE];
        }
        let whole = list.contains(&(space, INTENT_WHOLE_SPACE));
        for extent in &named {
            if !whole && !list.contains(&(space, *extent)) {
                list.push((space, *extent));
            }
        }
        if list != control.metadata.intent {
            self.commit_intent(&mut control, list, &[]).await?;
        }
        self.intent.named(space, &named);
        Ok(guard)
    }

    /// Clear the write intent of extents idle for [`INTENT_IDLE_NS`]: taken
    /// off the fast path first (a new write names them again), then every
    /// disk flushed, then dropped from the list unless written since.
    pub(crate) async fn clear_idle_intent(&self) -> Result<(), EngineError> {
        if self.read_only.is_some() {
            return Ok(());
        }
        let now = self.env.now_ns();
        // Named until resynchronised after a crash.
        let idle = self
            .intent
            .take_idle(now, |key| self.crash_resync.holds((key.space, key.extent)));
        if idle.is_empty() {
            return Ok(());
        }
        self.flush_disks().await?;
        let mut control = self.control.lock().await;
        let mut list = control.metadata.intent.clone();
        list.retain(|&(space, extent)| self.intent.keeps(ExtentKey::new(space, extent), &idle));
        if list != control.metadata.intent {
            self.commit_intent(&mut control, list, &[]).await?;
        }
        // Naming and clearing write the intent slots, not the metadata;
        // a commit at least this often while extents are cleared keeps the
        // generation moving, so that a copy of a disk taken more than a
        // few seconds before it left is still found older (see
        // `pool::older_copy`).
        if self.env.now_ns().saturating_sub(control.committed_at_ns) >= INTENT_IDLE_NS {
            let next = control.metadata.clone();
            self.commit(&mut control, next).await?;
        }
        Ok(())
    }

    /// After the write intent has been acted on (import): drop it all but
    /// `keep` (what is left to resynchronise in the background), from the
    /// intent slots and from the metadata.
    pub(crate) async fn forget_intent(&self, keep: Vec<(SpaceId, u32)>) -> Result<(), EngineError> {
        let mut control = self.control.lock().await;
        self.intent.reset(
            keep.iter()
                .map(|&(space, extent)| ExtentKey::new(space, extent)),
        );
        // The import's own commit named in the metadata what it read.
        let named = !control.metadata.intent.is_empty();
        self.commit_intent(&mut control, keep, &[]).await?;
        if named {
            let next = control.metadata.clone();
            self.commit(&mut control, next).await?;
        }
        Ok(())
    }

    /// Make `list` the write intent, and add `added` to the dirty records,
    /// durably: a record of a few KiB in the intent slots of every member
    /// disk, flushed (see [`terrace_meta::IntentRecord`]), where a metadata
    /// commit would write all the metadata (megabytes in a large pool). The
    /// record carries the dirty records noted since the last metadata
    /// commit, which the next one carries instead. A record too long for a
    /// slot, a disk failure not yet recorded, or a disk that fails this
    /// write, goes through a full commit instead, which names all of it in
    /// the metadata (and the disk failed); import reads both.
    pub(crate) async fn commit_intent(
        &self,
        control: &mut Control,
        list: Vec<(SpaceId, u32)>,
        added: &[(DiskIndex, SpaceId, u32)],
    ) -> Result<(), EngineError> {
        self.check_open()?;
        self.check_writable()?;
        let mut dirty = control.metadata.dirty.clone();
        let mut noted = control.dirty_noted.clone();
        for &(disk, space, extent) in added {
            if add_dirty(&mut dirty, disk, space, extent) {
                noted.push((disk, space, extent));
            }
        }
        let record = IntentRecord {
            pool_id: control.metadata.pool_id,
            sequence: control.intent_sequence + 1,
            generation: control.metadata.generation,
            extents: list,
            dirty: noted,
        };
        let no_members = control.metadata.members().next().is_none();
        let encoded = match encode_intent(&record) {
            // (With no member disk, the commit fails with the reason.)
            Ok(encoded) if !no_members && !self.conditions_unrecorded(&control.metadata) => encoded,
            _ => {
                let mut next = control.metadata.clone();
                next.intent = record.extents;
                next.dirty = dirty;
                return self.commit(control, next).await;
            }
        };
        let sequence = record.sequence;
        let (written, _) = self
            .write_members(&control.metadata, "write-intent", |device, _| {
                let encoded = encoded.clone();
                async move { write_intent(device.as_ref(), sequence, encoded).await }
            })
            .await;
        control.intent_sequence = sequence;
        if written < control.metadata.members().count() {
            // The survivors learn of the failure and get the lists with it.
            let mut next = control.metadata.clone();
            next.intent = record.extents;
            next.dirty = dirty;
            return self.commit(control, next).await;
        }
        control.metadata.intent = record.extents;
        control.metadata.dirty = dirty;
        control.dirty_noted = record.dirty;
        Ok(())
    }

    /// Write to every member disk of `metadata` at once. A disk whose write
    /// fails is marked failed (`what` says which write). Gives the number
    /// written and the first error.
    async fn write_members<F>(
        &self,
        metadata: &PoolMetadata,
        what: &str,
        write: impl Fn(Arc<dyn terrace_io::BlockDevice>, terrace_meta::Label) -> F,
    ) -> (usize, Option<String>)
    where
        F: std::future::Future<Output = Result<(), terrace_io::IoError>>,
    {
        let disks = self.disks();
        let members: Vec<&Arc<Disk>> = metadata
            .members()
            .map(|(index, _)| &disks[usize::from(index.0)])
            .collect();
        let writes = members.iter().map(|disk| {
            let write = &write;
            async move {
                let (Some(device), Some(label)) = (disk.device(), disk.label()) else {
                    return Err(String::from("no device"));
                };
                write(device, label)
                    .await
                    .map_err(|error| error.to_string())
            }
        });
        let results = join_all(writes).await;
        let mut written = 0;
        let mut first_error = None;
        for (disk, result) in members.iter().zip(results) {
            match result {
                Ok(()) => written += 1,
                Err(error) => {
                    disk.set_condition(Condition::Failed, format!("{what} write failed: {error}"));
                    first_error.get_or_insert(error);
                }
            }
        }
        (written, first_error)
    }

    /// Whether a disk failed or went missing since the metadata said so:
    /// the next commit must record it.
    fn conditions_unrecorded(&self, metadata: &PoolMetadata) -> bool {
        self.disks()
            .iter()
            .any(|disk| unrecorded_state(disk, metadata).is_some())
    }

    /// Know only the dirty records `metadata` (just committed) holds (see
    /// [`FailureRecords::know_only`]).
    pub(crate) fn known_dirty_as_in(&self, metadata: &PoolMetadata) {
        self.failures.know_only(metadata);
    }

    /// Forget the dirty records of a disk that caught up.
    pub(crate) fn forget_dirty(&self, disk: DiskIndex) {
        self.failures.forget_disk(disk);
    }

    pub(crate) fn disks(&self) -> Vec<Arc<Disk>> {
        self.disks.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// After close: every disk lets go of its device, so another process
    /// (or a later import) may claim it at once, whoever still holds the
    /// pool.
    pub(crate) fn release_devices(&self) {
        for disk in self.disks() {
            disk.detach();
        }
    }

    pub(crate) fn check_open(&self) -> Result<(), EngineError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(EngineError::Closed {
                pool: self.name.clone(),
            });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), EngineError> {
        match &self.read_only {
            Some(reason) => Err(EngineError::ReadOnly {
                pool: self.name.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Copy run-time disk conditions (failed, missing) into the metadata.
    /// Fail each disk whose read and checksum errors reached the pool's
    /// limit, if it is the only disk in service with such errors counted
    /// and every extent of every space (logs and sums included) keeps its
    /// data without it and the disks already out. Otherwise it stays in
    /// service, its errors repaired as they come: a disk that returns some
    /// bad blocks is better than none, and where two disks return bad
    /// blocks, the good copy of one's may be on the other.
    fn fail_disks_over_error_limit(&self, metadata: &PoolMetadata) {
        let disks = self.disks();
        let erring = |disk: &Disk| {
            let errors = disk.errors();
            disk.is_online() && errors.read + errors.checksum > 0
        };
        if disks.iter().filter(|disk| erring(disk)).count() != 1 {
            return;
        }
        for disk in disks.iter().filter(|disk| disk.over_error_limit()) {
            let out = |index: DiskIndex| {
                index == disk.index
                    || disks
                        .get(usize::from(index.0))
                        .is_none_or(|other| !other.is_online())
            };
            let keeps_data = metadata.spaces.iter().all(|space| {
                let Ok(geometry) = space.geometry(metadata.slab_bytes) else {
                    return true;
                };
                space
                    .extents
                    .iter()
                    .filter_map(|e| e.slabs.as_ref())
                    .all(|slabs| {
                        !slabs.iter().any(|slab| slab.disk == disk.index)
                            || geometry
                                .remaining_tolerance(|slot| {
                                    slabs.get(slot as usize).is_none_or(|slab| out(slab.disk))
                                })
                                .is_some()
                    })
            });
            if keeps_data {
                disk.fail_for_errors();
            }
        }
    }

    fn absorb_conditions(&self, metadata: &mut PoolMetadata) {
        for disk in self.disks() {
            if let Some(state) = unrecorded_state(&disk, metadata) {
                let record = &mut metadata.disks[usize::from(disk.index.0)];
                record.state = state;
                record.state_reason = disk.reason();
            }
        }
    }

    /// Make `next` the pool's metadata, durably. On error nothing changes
    /// in memory except disks found failed on the way.
    pub(crate) async fn commit(
        &self,
        control: &mut Control,
        mut next: PoolMetadata,
    ) -> Result<(), EngineError> {
        // A request that began before the pool closed must not record what
        // it saw after (its disks let go of their devices at close).
        self.check_open()?;
        self.check_writable()?;
        // No finished job's list of moves is kept (see `JobRecord::moves`);
        // callers that still need one took it before committing.
        for job in &mut next.jobs {
            job.fold_moves();
        }
        // Always on: a slab named by two extents would give one space's
        // writes to another (allocations plan outside the control lock and
        // reserve what they planned; this holds them to it).
        let named = || {
            next.spaces
                .iter()
                .flat_map(|space| ExtentRecord::slabs_of(&space.extents))
        };
        assert_eq!(
            named().count(),
            named().collect::<BTreeSet<SlabRef>>().len(),
            "pool {}: a slab is named by two extents",
            self.name
        );
        // The generation of this commit's first try: a disk whose write of
        // a try failed holds none from it on, however many tries later it
        // is recorded out (two disks lost in successive tries).
        let mut first_try = None;
        loop {
            self.absorb_conditions(&mut next);
            next.generation = control.metadata.generation.max(next.generation) + 1;
            let left = *first_try.get_or_insert(next.generation);
            note_departures(&control.metadata, &mut next, left);
            next.committed_ns = self.env.wall_clock_ns();
            let encoded = encode_slot(&next, self.metadata_slot_bytes)
                .map_err(|source| EngineError::MetadataFull { source })?;
            self.metadata_bytes
                .store(encoded.len() as u64, Ordering::Relaxed);
            let generation = next.generation;
            let (written, error) = self
                .write_members(&next, "metadata", |device, label| {
                    let encoded = encoded.clone();
                    async move { write_slot(device.as_ref(), &label, generation, encoded).await }
                })
                .await;
            if written == 0 {
                control.metadata.generation = next.generation;
                return Err(EngineError::CommitFailed {
                    pool: self.name.clone(),
                    detail: error.unwrap_or_else(|| "no member disks".into()),
                });
            }
            if written == next.members().count() {
                control.dirty_noted.clear();
                control.committed_at_ns = self.env.now_ns();
                let jobs = job_changes(&control.metadata, &next);
                let alerts = capacity_alerts(&control.metadata, &next);
                control.metadata = next;
                self.events.emit(PoolEvent::Committed { generation });
                jobs.into_iter().for_each(|event| self.events.emit(event));
                alerts.into_iter().for_each(|event| self.events.emit(event));
                return Ok(());
            }
            // Some members failed: record that on the survivors.
            control.metadata.generation = next.generation;
        }
    }

    /// Wait until every disk failure seen so far is recorded in a commit.
    /// Requests call this before completing, so a write that saw a disk
    /// fail is acknowledged only once the pool will never trust that disk's
    /// stale copy again.
    pub(crate) async fn persist_failures(&self) -> Result<(), EngineError> {
        let Some(observed) = self.failures.unpersisted() else {
            return Ok(());
        };
        // Boxed: every request's future embeds this one, and a commit's
        // state is large; only requests that saw a failure pay for it.
        Box::pin(self.persist_observed(observed)).await
    }

    async fn persist_observed(&self, observed: u64) -> Result<(), EngineError> {
        let mut control = self.control.lock().await;
        self.fail_disks_over_error_limit(&control.metadata);
        if self.read_only.is_none() {
            let mut next = control.metadata.clone();
            self.absorb_conditions(&mut next);
            let missed = self.failures.take_failed_writes();
            for note in &missed {
                add_dirty(&mut next.dirty, note.disk, note.space, note.extent);
            }
            if next != control.metadata {
                if let Err(error) = self.commit(&mut control, next).await {
                    self.failures.restore_failed_writes(missed);
                    return Err(error);
                }
            }
            self.failures.know(&missed);
        }
        self.failures.persisted_up_to(observed);
        Ok(())
    }

    /// A write to `extent` of `space` failed on `disk` (which is failed by
    /// it): what the disk holds of the extent may be old or torn. Recorded
    /// missed for it with the failure, before the request completes (see
    /// [`PoolShared::persist_failures`]), so that a disk taken back after
    /// its failure (`Pool::clear`) catches up on it as on the extents
    /// written after.
    pub(crate) fn note_failed_write(&self, disk: DiskIndex, space: SpaceId, extent: u32) {
        self.failures
            .note_failed_write(MissedExtent::new(disk, space, extent));
    }

    /// Flush every online disk. Failures mark disks failed and are recorded.
    pub(crate) async fn flush_disks(&self) -> Result<(), EngineError> {
        if self.read_only.is_none() {
            self.sums.write_back_all().await?;
        }
        let disks = self.disks();
        let flushes = disks
            .iter()
            .filter(|disk| disk.is_online())
            .map(|disk| disk.flush());
        join_all(flushes).await;
        self.persist_failures().await
    }
}

/// The state a disk's run-time condition calls for, where its record
/// still says active: failed or missing.
fn unrecorded_state(disk: &Disk, metadata: &PoolMetadata) -> Option<DiskState> {
    if metadata.disk(disk.index)?.state != DiskState::Active {
        return None;
    }
    match disk.condition() {
        Condition::Failed => Some(DiskState::Failed),
        Condition::Missing => Some(DiskState::Missing),
        Condition::Online | Condition::Standby => None,
    }
}

/// Add `extent` of `space` to `disk`'s dirty record; false if it is there.
pub(crate) fn add_dirty(
    dirty: &mut Vec<DirtyRecord>,
    disk: DiskIndex,
    space: SpaceId,
    extent: u32,
) -> bool {
    let position = match dirty.iter().position(|record| record.disk == disk) {
        Some(position) => position,
        None => {
            dirty.push(DirtyRecord {
                disk,
                extents: Vec::new(),
            });
            dirty.len() - 1
        }
    };
    let extents = &mut dirty[position].extents;
    if extents.contains(&(space, extent)) {
        return false;
    }
    extents.push((space, extent));
    true
}

/// The jobs that `next` has running where `current` had not (started),
/// and those `current` had running where `next` has them no more (ended).
fn job_changes(current: &PoolMetadata, next: &PoolMetadata) -> Vec<PoolEvent> {
    let active = |metadata: &PoolMetadata, id: u64| {
        metadata
            .jobs
            .iter()
            .any(|job| job.id == id && job.is_active())
    };
    let started = next
        .jobs
        .iter()
        .filter(|job| job.is_active() && !active(current, job.id))
        .map(|job| PoolEvent::JobStarted { job: job.id });
    let ended = current
        .jobs
        .iter()
        .filter(|job| job.is_active() && !active(next, job.id))
        .map(|job| PoolEvent::JobEnded { job: job.id });
    started.chain(ended).collect()
}

/// Per cent of the capacity disks' slabs that are allocated (rounded down).
pub(crate) fn allocated_percent(metadata: &PoolMetadata) -> u64 {
    let capacity = |index: DiskIndex| metadata.disk(index).is_some_and(DiskRecord::takes_capacity);
    let total: u64 = metadata
        .members()
        .filter(|(_, disk)| disk.takes_capacity())
        .map(|(_, disk)| u64::from(disk.slab_count))
        .sum();
    let used = metadata
        .used_slabs()
        .iter()
        .filter(|slab| capacity(slab.disk))
        .count() as u64;
    (used * 100).checked_div(total).unwrap_or(0)
}

/// The allocation alerts a commit from `before` to `after` sets off: one
/// for each threshold of `after`'s settings the allocated share crossed,
/// up or down.
fn capacity_alerts(before: &PoolMetadata, after: &PoolMetadata) -> Vec<PoolEvent> {
    let thresholds = after.settings.alert_percents;
    if thresholds.iter().all(|&t| t == 0) {
        return Vec::new();
    }
    let (was, now) = (allocated_percent(before), allocated_percent(after));
    let mut thresholds = thresholds;
    if now < was {
        // Falling: the highest threshold is passed first.
        thresholds.reverse();
    }
    thresholds
        .into_iter()
        .filter(|&threshold| threshold > 0)
        .filter_map(|threshold| {
            let threshold_at = u64::from(threshold);
            let rising = was < threshold_at && now >= threshold_at;
            let falling = was >= threshold_at && now < threshold_at;
            (rising || falling).then_some(PoolEvent::Capacity {
                threshold,
                percent: now,
                rising,
            })
        })
        .collect()
}

/// Record in `next` the generation at which each disk it newly calls
/// missing or failed left (`DiskRecord::missing_since`): `generation`, the
/// first try of the commit recording it (a try that failed on the disk is
/// why it is out; it holds none from there); keep it for disks that were
/// out already, and clear it for the others.
fn note_departures(current: &PoolMetadata, next: &mut PoolMetadata, generation: u64) {
    let out = |state: DiskState| matches!(state, DiskState::Missing | DiskState::Failed);
    for (index, disk) in next.disks.iter_mut().enumerate() {
        disk.missing_since = match (disk.state, current.disks.get(index)) {
            (state, Some(before)) if out(state) && out(before.state) => before.missing_since,
            (state, _) if out(state) => generation,
            _ => 0,
        };
    }
}
