//! An open pool: its run-time state ([`PoolShared`]) and its spaces, what
//! a caller may ask of it, and closing it cleanly. Also the pieces that
//! creating a pool and adding disks share: the checks of new disks, each
//! new member's label and record ([`Shape`]), and writing labels.
//!
//! Creating and importing (`open`) sit above this module, as do the
//! commands that change a pool (`admin`, `cache`, `jobs`, `membership`,
//! `clear`): they are `impl Pool` blocks of their own modules.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use futures::future::join_all;
use terrace_io::{BlockDevice, Env};
use terrace_meta::format::{data_offset, Label, METADATA_SLOT_DEFAULT_BYTES};
use terrace_meta::store::{self, Probe};
use terrace_meta::{
    DiskId, DiskIndex, DiskRecord, DiskState, Media, PoolId, PoolMetadata, SpaceId, Usage,
};

use crate::control::PoolShared;
use crate::disk::{Disk, DiskContext};
use crate::error::EngineError;
use crate::space::Space;
use crate::volume::Volume;

/// Default slab: 256 MiB, as the allocation unit of Storage Spaces.
pub const SLAB_DEFAULT_BYTES: u64 = 256 << 20;
/// Smallest slab: 64 KiB, for tests (must hold at least one 4 KiB row per
/// column and leave a realistic number of rows per slab).
pub const SLAB_MIN_BYTES: u64 = 64 << 10;
/// Largest slab: 64 GiB; beyond that a single extent pins too much capacity.
pub const SLAB_MAX_BYTES: u64 = 64 << 30;
/// Pool and space names: short enough to print in tables and NBD export names.
pub const NAME_MAX_BYTES: usize = 64;

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub slab_bytes: u64,
    pub metadata_slot_bytes: u64,
}

impl PoolConfig {
    pub fn new(name: impl Into<String>) -> PoolConfig {
        PoolConfig {
            name: name.into(),
            slab_bytes: SLAB_DEFAULT_BYTES,
            metadata_slot_bytes: METADATA_SLOT_DEFAULT_BYTES,
        }
    }
}

/// A disk joining a pool.
pub struct NewDisk {
    pub device: Arc<dyn BlockDevice>,
    pub media: Media,
    pub usage: Usage,
    pub enclosure: String,
    pub node: String,
}

impl NewDisk {
    pub fn new(device: Arc<dyn BlockDevice>) -> NewDisk {
        NewDisk {
            device,
            media: Media::Unknown,
            usage: Usage::Auto,
            enclosure: String::new(),
            node: String::new(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Name or id (prefix) of the pool to import; needed when the devices
    /// hold more than one.
    pub pool: Option<String>,
    /// Open read-write even without a metadata majority.
    pub force: bool,
    /// Open read-only whatever the quorum.
    pub read_only: bool,
    /// Export names other open pools' spaces have: a space read from a
    /// slot format that stored none is given its own name as export name
    /// unless one of these is it, else `POOL/SPACE`
    /// ([`crate::placement::settle_export_names`]).
    pub exports_taken: Vec<String>,
}

/// An open pool.
pub struct Pool {
    pub(crate) shared: Arc<PoolShared>,
    pub(crate) spaces: RwLock<BTreeMap<String, Arc<Space>>>,
    /// The hidden logs of write-back caches (volumes), by id.
    pub(crate) logs: RwLock<BTreeMap<terrace_meta::SpaceId, Arc<Volume>>>,
    /// The hidden volumes of spaces' block sums, by id.
    pub(crate) sums: RwLock<BTreeMap<terrace_meta::SpaceId, Arc<Volume>>>,
}

/// The one rule for the names of pools and spaces (and so of NBD exports):
/// a plain word, safe in a path, a shell and an export name. It opens with
/// a letter or digit, so `.`, `..`, hidden names (a space's log is named
/// `.log-N`) and names read as options (`-x`) are refused.
pub fn validate_name(what: &'static str, name: &str) -> Result<(), EngineError> {
    let valid = name.len() <= NAME_MAX_BYTES
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err(EngineError::InvalidName {
            what,
            value: name.to_string(),
            rule: "1 to 64 characters from A-Z a-z 0-9 - _ . starting with a letter or digit",
        })
    }
}

/// Refuse any disk that is not blank, readable and big enough. Joining
/// `pool`, a disk labelled for it under an id its metadata does not know
/// counts as blank: an add cut short (by a crash) labels its disks before
/// the commit that would have named them.
pub(crate) async fn check_new_disks(
    disks: &[NewDisk],
    minimum_bytes: u64,
    pool: Option<&PoolMetadata>,
) -> Result<(), EngineError> {
    let mut names = BTreeSet::new();
    for disk in disks {
        let device = disk.device.name().to_string();
        if !names.insert(device.clone()) {
            return Err(EngineError::DuplicateDisk { device });
        }
        match store::probe(disk.device.as_ref()).await {
            Probe::Blank => {}
            Probe::Member { label, .. }
                if pool.is_some_and(|pool| {
                    label.pool_id == pool.pool_id
                        && pool.disks.iter().all(|disk| disk.id != label.disk_id)
                }) => {}
            // One of the pool's own disks, under another name (a link,
            // another path to the device), or added again after a crash
            // that left the earlier add committed.
            Probe::Member { label, .. }
                if pool.is_some_and(|pool| label.pool_id == pool.pool_id) =>
            {
                return Err(EngineError::AlreadyMember {
                    device,
                    pool_name: label.pool_name,
                })
            }
            Probe::Member { label, .. } => {
                return Err(EngineError::DiskInOtherPool {
                    device,
                    pool_name: label.pool_name,
                    pool_id: label.pool_id.to_string(),
                })
            }
            Probe::Damaged(source) => return Err(EngineError::DamagedLabel { device, source }),
            Probe::Unreadable(source) => return Err(EngineError::Unreadable { device, source }),
        }
        if disk.device.size_bytes() < minimum_bytes {
            return Err(EngineError::DiskTooSmall {
                device,
                size_bytes: disk.device.size_bytes(),
                minimum_bytes,
            });
        }
    }
    Ok(())
}

/// What every disk of one pool shares, for making new members.
pub(crate) struct Shape {
    pub pool_id: PoolId,
    pub pool_name: String,
    pub slab_bytes: u64,
    pub metadata_slot_bytes: u64,
    pub now: u64,
}

/// A disk about to join: its record, its label, its run-time handle.
pub(crate) struct Member {
    pub record: DiskRecord,
    pub label: (Arc<dyn BlockDevice>, Label),
    pub disk: Arc<Disk>,
}

impl Shape {
    pub(crate) fn member(
        &self,
        env: &Arc<dyn Env>,
        index: DiskIndex,
        disk: NewDisk,
        context: &DiskContext,
    ) -> Member {
        let env = env.as_ref();
        let size_bytes = disk.device.size_bytes();
        let data_start = data_offset(self.metadata_slot_bytes);
        let label = Label {
            pool_id: self.pool_id,
            disk_id: DiskId(random_id(env)),
            created_ns: self.now,
            device_bytes: size_bytes,
            metadata_slot_bytes: self.metadata_slot_bytes,
            data_offset: data_start,
            slab_bytes: self.slab_bytes,
            pool_name: self.pool_name.clone(),
        };
        let record = DiskRecord {
            id: label.disk_id,
            size_bytes,
            slab_count: ((size_bytes - data_start) / self.slab_bytes) as u32,
            media: disk.media,
            usage: disk.usage,
            state: DiskState::Active,
            enclosure: disk.enclosure,
            node: disk.node,
            path_hint: disk.device.name().to_string(),
            state_reason: String::new(),
            missing_since: 0,
        };
        let runtime = Disk::present(index, disk.device.clone(), label.clone(), context.clone());
        Member {
            record,
            label: (disk.device, label),
            disk: Arc::new(runtime),
        }
    }
}

/// Write labels (last, after the metadata that names the disks).
pub(crate) async fn write_labels(
    labels: &[(Arc<dyn BlockDevice>, Label)],
) -> Result<(), EngineError> {
    let writes = labels
        .iter()
        .map(|(device, label)| store::write_label(device.as_ref(), label));
    for result in join_all(writes).await {
        result?;
    }
    Ok(())
}

pub(crate) fn random_id(env: &dyn Env) -> [u8; 16] {
    PoolId::from_random(env.random_u64(), env.random_u64()).0
}

impl Pool {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Whether the pool is still open (not closed, exported or destroyed).
    pub fn is_open(&self) -> bool {
        self.shared.check_open().is_ok()
    }

    /// The events of this pool from now on (see [`crate::events`]): at
    /// most [`crate::EVENTS_QUEUED_MAX`] wait; the receiver looks at the
    /// pool for what it may have been told in fewer steps.
    pub fn subscribe(&self) -> futures::channel::mpsc::Receiver<crate::PoolEvent> {
        self.shared.events.subscribe()
    }

    /// Set how many bytes of log records the write-back logs of the pool's
    /// spaces may keep in memory (see [`crate::journal`]); records logged
    /// beyond it are read back from the log's disks when needed.
    pub fn set_log_memory(&self, bytes: u64) {
        self.shared.log_memory.set_max(bytes);
    }

    /// Bytes of log records held in memory now, and the most allowed.
    pub fn log_memory(&self) -> (u64, u64) {
        self.shared.log_memory.usage()
    }

    /// Why the pool refuses writes, if it does.
    pub fn read_only_reason(&self) -> Option<&str> {
        self.shared.read_only.as_deref()
    }

    pub fn space(&self, name: &str) -> Option<Arc<Space>> {
        self.spaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// The volume of every space, hidden logs included (jobs repair them
    /// too).
    pub(crate) fn all_spaces(&self) -> Vec<Arc<Volume>> {
        let mut all: Vec<Arc<Volume>> = self
            .spaces()
            .iter()
            .map(|space| space.volume().clone())
            .collect();
        for hidden in [&self.logs, &self.sums] {
            all.extend(
                hidden
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .cloned(),
            );
        }
        all
    }

    pub fn spaces(&self) -> Vec<Arc<Space>> {
        self.spaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// A copy of the current metadata.
    pub async fn metadata(&self) -> PoolMetadata {
        self.shared.control.lock().await.metadata.clone()
    }

    /// The generation of the last metadata commit: it changes whenever the
    /// pool's records do, and reading it copies nothing (where
    /// [`Pool::metadata`] copies every extent map).
    pub async fn generation(&self) -> u64 {
        self.shared.control.lock().await.metadata.generation
    }

    /// Flush everything and mark the pool cleanly closed. Afterwards every
    /// operation on the pool or its spaces fails with `Closed`.
    /// Closed even when that fails: the error says what was not recorded
    /// (a pool whose clean commit failed is resynchronised at its next
    /// import), and the pool is let go of all the same.
    pub async fn close(&self) -> Result<(), EngineError> {
        self.shared.check_open()?;
        let result = self.close_inner().await;
        self.let_go();
        result
    }

    /// Whether the pool was closed (exported or destroyed), even by a close
    /// or destroy that then reported an error.
    pub fn is_closed(&self) -> bool {
        self.shared.check_open().is_err()
    }

    /// The end of a close or a destroy: the pool is closed, its spaces and
    /// logs are forgotten, and its disks let go of their devices.
    pub(crate) fn let_go(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.forget_spaces();
        self.shared.release_devices();
    }

    /// Spaces point back at the pool (through their journals); dropping
    /// the maps breaks the cycle.
    fn forget_spaces(&self) {
        for space in self.spaces() {
            space.set_journal(None);
        }
        self.spaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.logs.write().unwrap_or_else(|e| e.into_inner()).clear();
        self.sums.write().unwrap_or_else(|e| e.into_inner()).clear();
    }

    async fn close_inner(&self) -> Result<(), EngineError> {
        // What a crash left a mirror to resynchronise, taken before the
        // flush: a row the background pass finishes after it may not be
        // durable.
        let owed_before = self.shared.crash_resync.owed();
        self.shared.flush_disks().await?;
        if self.shared.read_only.is_some() {
            return Ok(());
        }
        let mut control = self.shared.control.lock().await;
        // Flushed above, and no write runs after close: nothing in flight.
        // What is still owed stays named (in the slots and, by this
        // commit, the metadata), and the pool is left unclean, so that the
        // next import (of any build) resynchronises it.
        let owed: Vec<(SpaceId, u32)> = control
            .metadata
            .intent
            .iter()
            .copied()
            .filter(|(space, extent)| {
                crate::crash_resync::covers(owed_before.iter(), (space.0, *extent))
            })
            .collect();
        let clean = owed.is_empty();
        self.shared.commit_intent(&mut control, owed, &[]).await?;
        let mut next = control.metadata.clone();
        next.clean = clean;
        let committed = self.shared.commit(&mut control, next).await;
        // Closed before the lock is let go: a write waiting for it to name
        // its extent must not write after the clean commit.
        self.shared.closed.store(true, Ordering::Release);
        committed
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.forget_spaces();
    }
}

/// Why a disk found holding metadata generation `newest` (0: none
/// readable) is an older copy of the missing disk `record` describes, if it
/// is, or cannot be dated (a failed disk likewise): the disk held every
/// generation up to the commit that recorded it missing (less one, for a
/// commit a power cut tore on it), and the pool's records of writes made
/// while it was away start there. Data older than that would be taken for
/// current.
pub(crate) fn older_copy(record: &DiskRecord, newest: u64) -> Option<String> {
    let left = record.missing_since;
    let out = matches!(record.state, DiskState::Missing | DiskState::Failed);
    if !out || left == 0 || newest + 2 >= left {
        return None;
    }
    Some(if newest == 0 {
        format!(
            "its metadata could not be read (it left at generation {left}): not taken back, \
             since what it holds cannot be dated; check the disk, then wipe it and add it as a \
             new disk, or replace it"
        )
    } else {
        format!(
            "an older copy of this disk was found (its metadata is of generation {newest}; the \
             disk left at {left}): not taken back, since writes made before it left would \
             read as they were; wipe it and add it as a new disk, or replace it"
        )
    })
}

impl Pool {
    /// Extents of `space` left to resynchronise since an unclean shutdown.
    pub fn resync_extents_left(&self, space: SpaceId) -> u64 {
        self.shared.crash_resync.extents_left(space)
    }

    /// Extents of every space left to resynchronise since an unclean
    /// shutdown.
    pub fn resync_extents_pending(&self) -> u64 {
        self.shared.crash_resync.extents_pending()
    }

    /// Clear the write intent of extents idle for long enough, now, as the
    /// job runner does every so often.
    pub async fn clear_idle_intent(&self) -> Result<(), EngineError> {
        self.shared.clear_idle_intent().await
    }
}
