//! The pools a daemon owns, and where their disks are.
//!
//! The registry is the daemon's one owner of pool membership: every admin
//! change goes through it, one at a time (the admin lock), and the list of
//! pools with their disk paths is saved to `pools.json` in the state folder
//! (written to a temporary file, synced, renamed) so the next start imports
//! them again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use terrace_engine::io::file::{FileDevice, FileOptions};
use terrace_engine::io::model::{DriveModel, ModelDevice};
use terrace_engine::io::{BlockDevice, Env, IoError};
use terrace_engine::{ImportOptions, Pool, Space};

use super::events::{changes, Summary};

/// Where a disk is, and the drive model it is made to behave like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskPath {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A pool and its disks as last known.
#[derive(Clone)]
pub struct PoolEntry {
    pub pool: Arc<Pool>,
    pub disks: Vec<DiskPath>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    pools: Vec<SavedPool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedPool {
    name: String,
    disks: Vec<DiskPath>,
}

pub struct Registry {
    pub env: Arc<dyn Env>,
    state_path: PathBuf,
    /// In the order they were opened, which the state file keeps: the
    /// first of two pools whose spaces have the same export name serves
    /// it (see [`super::names`]), across restarts too.
    pools: RwLock<Vec<PoolEntry>>,
    /// Saved pools that could not be imported at start; kept in the state
    /// file so a later start (with the disks back) tries again.
    unavailable: RwLock<Vec<SavedPool>>,
    /// Serialises admin changes (create, import, export, destroy...).
    pub admin: tokio::sync::Mutex<()>,
    /// Bytes of log records the write-back logs of all pools may keep in
    /// memory, shared equally by the pools (see [`Registry::share_log_memory`]).
    log_memory: u64,
    /// NBD connections open on each space, by the space's address (a
    /// connection holds its space, so the address is that space's while
    /// it is counted).
    connections: std::sync::Mutex<std::collections::HashMap<usize, Counts>>,
}

/// The NBD connections open on one space: all of them, and of those the
/// sole-writer sessions (see [`Registry::connect_sole_writer`]).
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    all: usize,
    sole_writers: usize,
}

/// One NBD connection to a space, counted until dropped.
pub struct Connection {
    registry: Arc<Registry>,
    key: usize,
    sole_writer: bool,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut connections = self.registry.connections();
        if let Some(counts) = connections.get_mut(&self.key) {
            counts.all -= 1;
            if self.sole_writer {
                counts.sole_writers -= 1;
            }
            if counts.all == 0 {
                connections.remove(&self.key);
            }
        }
    }
}

/// Open a device or file for pool use, claimed for this process (another
/// daemon, or a benchmark importing the pool itself, cannot open it
/// meanwhile), behaving like its drive model if it has one.
pub fn open_device(disk: &DiskPath, env: &Arc<dyn Env>) -> Result<Arc<dyn BlockDevice>, String> {
    open_claimed(disk, env).map_err(|failure| failure.message)
}

/// Why a disk did not open: `busy` if another process holds it.
pub struct OpenFailure {
    pub busy: bool,
    pub message: String,
}

fn open_claimed(disk: &DiskPath, env: &Arc<dyn Env>) -> Result<Arc<dyn BlockDevice>, OpenFailure> {
    let options = FileOptions {
        exclusive: true,
        ..FileOptions::default()
    };
    let device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&disk.path, options).map_err(
        |error| OpenFailure {
            busy: matches!(&error, IoError::Os { source, .. }
                if source.kind() == std::io::ErrorKind::ResourceBusy),
            message: error.to_string(),
        },
    )?);
    match &disk.model {
        None => Ok(device),
        Some(spec) => {
            let model = DriveModel::parse(spec).map_err(|e| OpenFailure {
                busy: false,
                message: format!("{}: drive model {spec:?}: {e}", disk.path),
            })?;
            let phase = spindle_phase(&disk.path);
            Ok(Arc::new(
                ModelDevice::new(device, model, env.clone()).with_phase(phase),
            ))
        }
    }
}

/// A disk another process holds, and the pool its label names.
pub struct Busy {
    pub message: String,
    /// (id, name) of the pool on it, read without claiming it.
    pub pool: Option<(String, String)>,
}

impl Busy {
    pub fn refusal(&self) -> String {
        format!(
            "{}; another terrace daemon or benchmark is using pool {}: stop it (or export \
             the pool there) and import again",
            self.message,
            self.pool.as_ref().map_or("?", |(_, name)| name.as_str())
        )
    }

    pub fn holds(&self, pool_id: &str) -> bool {
        self.pool.as_ref().is_some_and(|(id, _)| id == pool_id)
    }
}

/// The disks an import looks through, opened and claimed. One that is
/// absent or unreadable is passed over (the import counts it missing); one
/// that another process holds is listed in `busy`, since that process may
/// be serving its pool: importing the pool here too would write over its
/// commits.
pub struct ForImport {
    pub opened: Vec<(DiskPath, Arc<dyn BlockDevice>)>,
    pub busy: Vec<Busy>,
}

pub async fn open_for_import(disks: &[DiskPath], env: &Arc<dyn Env>) -> ForImport {
    let mut found = ForImport {
        opened: Vec::new(),
        busy: Vec::new(),
    };
    // A process that has just died may hold its disks a little longer:
    // its io_uring requests in flight keep the files open until they
    // complete. A daemon restarted at once waits for that.
    let deadline = std::time::Instant::now() + CLAIM_PATIENCE;
    for disk in disks {
        loop {
            match open_claimed(disk, env) {
                Ok(device) => found.opened.push((disk.clone(), device)),
                Err(failure) if failure.busy && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
                Err(failure) if failure.busy => found.busy.push(Busy {
                    message: failure.message,
                    pool: pool_on(&disk.path).await,
                }),
                Err(_) => {}
            }
            break;
        }
    }
    found
}

/// How long an import waits, in all, for disks another process holds to
/// be let go (see [`open_for_import`]).
pub const CLAIM_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// The pool a device's label names, read without claiming the device.
async fn pool_on(path: &str) -> Option<(String, String)> {
    let options = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path, options).ok()?);
    match terrace_engine::scan(&[device]).await.pop()?.kind {
        terrace_engine::DeviceKind::Member {
            pool_id, pool_name, ..
        } => Some((pool_id, pool_name)),
        _ => None,
    }
}

/// A modelled drive's spindle phase, from its path: fixed across restarts
/// and different between the drives of a pool, which a real JBOD's
/// unsynchronised spindles are too (FNV-1a, top 53 bits as a fraction).
fn spindle_phase(path: &str) -> f64 {
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// Expand folders into the regular files and block devices inside them;
/// each keeps the folder's model.
pub fn expand_disks(disks: &[DiskPath]) -> Vec<DiskPath> {
    disks
        .iter()
        .flat_map(|disk| {
            expand_paths(std::slice::from_ref(&disk.path))
                .into_iter()
                .map(move |path| DiskPath {
                    path,
                    model: disk.model.clone(),
                })
        })
        .collect()
}

/// Expand folders into the regular files and block devices inside them.
pub fn expand_paths(paths: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for path in paths {
        let entries = Path::new(path)
            .is_dir()
            .then(|| std::fs::read_dir(path).ok())
            .flatten();
        match entries {
            Some(entries) => {
                let mut inside: Vec<String> = entries
                    .flatten()
                    .filter(|entry| entry.file_type().is_ok_and(|t| !t.is_dir()))
                    .map(|entry| entry.path().to_string_lossy().into_owned())
                    .collect();
                inside.sort();
                found.extend(inside);
            }
            None => found.push(path.clone()),
        }
    }
    found
}

impl Registry {
    pub fn new(env: Arc<dyn Env>, state_dir: &Path, log_memory: u64) -> Registry {
        Registry {
            env,
            state_path: state_dir.join("pools.json"),
            pools: RwLock::new(Vec::new()),
            unavailable: RwLock::new(Vec::new()),
            admin: tokio::sync::Mutex::new(()),
            log_memory,
            connections: Default::default(),
        }
    }

    fn connections(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<usize, Counts>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count a connection to `space` until the answer is dropped.
    pub fn connect(self: &Arc<Self>, space: &Arc<Space>) -> Connection {
        let key = Arc::as_ptr(space) as usize;
        self.connections().entry(key).or_default().all += 1;
        Connection {
            registry: self.clone(),
            key,
            sole_writer: false,
        }
    }

    /// Count a sole-writer session's connection to `space` (a benchmark
    /// about to write over the whole space), or `None` while any other
    /// client has the space open: its data would be overwritten under it.
    /// The sessions' own connections do not count against each other, so
    /// one session may open several. Checked and counted under one lock,
    /// so no client slips in between.
    pub fn connect_sole_writer(self: &Arc<Self>, space: &Arc<Space>) -> Option<Connection> {
        let key = Arc::as_ptr(space) as usize;
        let mut connections = self.connections();
        let counts = connections.entry(key).or_default();
        if counts.all > counts.sole_writers {
            return None;
        }
        counts.all += 1;
        counts.sole_writers += 1;
        Some(Connection {
            registry: self.clone(),
            key,
            sole_writer: true,
        })
    }

    /// The NBD connections open on `space` now.
    pub fn connections_to(&self, space: &Arc<Space>) -> usize {
        let key = Arc::as_ptr(space) as usize;
        self.connections().get(&key).map_or(0, |counts| counts.all)
    }

    pub fn get(&self, name: &str) -> Option<PoolEntry> {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|entry| entry.pool.name() == name)
            .cloned()
    }

    pub fn all(&self) -> Vec<PoolEntry> {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .to_vec()
    }

    pub fn insert(&self, entry: PoolEntry) -> Result<(), String> {
        let pool = entry.pool.clone();
        let name = entry.pool.name().to_string();
        self.unavailable
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|saved| saved.name != name);
        self.add(entry);
        self.share_log_memory();
        start_pool_tasks(&pool);
        self.save()
    }

    /// Give each open pool an equal share of the daemon's log memory. A
    /// pool whose share shrank below what it holds keeps its records and
    /// takes in no more until its logs have given back the difference.
    fn share_log_memory(&self) {
        let pools = self.pools.read().unwrap_or_else(|e| e.into_inner());
        let share = self.log_memory / pools.len().max(1) as u64;
        for entry in pools.iter() {
            entry.pool.set_log_memory(share);
        }
    }

    /// Add `entry` last, or in its place if its pool's name is there.
    fn add(&self, entry: PoolEntry) {
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        match pools
            .iter_mut()
            .find(|known| known.pool.name() == entry.pool.name())
        {
            Some(known) => *known = entry,
            None => pools.push(entry),
        }
    }

    pub fn remove(&self, name: &str) -> Result<Option<PoolEntry>, String> {
        let removed = {
            let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
            let position = pools.iter().position(|entry| entry.pool.name() == name);
            position.map(|position| pools.remove(position))
        };
        self.share_log_memory();
        self.save()?;
        Ok(removed)
    }

    /// Record the current disks of a pool (after disks were added).
    pub fn set_disks(&self, name: &str, disks: Vec<DiskPath>) -> Result<(), String> {
        if let Some(entry) = self
            .pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
            .find(|entry| entry.pool.name() == name)
        {
            entry.disks = disks;
        }
        self.save()
    }

    fn save(&self) -> Result<(), String> {
        let mut pools: Vec<SavedPool> = self
            .all()
            .into_iter()
            .map(|entry| SavedPool {
                name: entry.pool.name().to_string(),
                disks: entry.disks,
            })
            .collect();
        pools.extend(
            self.unavailable
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        );
        let text = serde_json::to_string_pretty(&StateFile { pools }).map_err(|e| e.to_string())?;
        let temporary = self.state_path.with_extension("json.new");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temporary, &self.state_path)?;
            if let Some(parent) = self.state_path.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|error| format!("cannot save {}: {error}", self.state_path.display()))
    }

    /// Import every pool named in the state file. Returns one message per
    /// pool that could not be imported (it stays in the state file, so the
    /// next start tries again).
    pub async fn import_saved(&self) -> Vec<String> {
        let Ok(text) = std::fs::read_to_string(&self.state_path) else {
            return Vec::new();
        };
        let state: StateFile = match serde_json::from_str(&text) {
            Ok(state) => state,
            Err(error) => return vec![format!("{}: {error}", self.state_path.display())],
        };
        let mut problems = Vec::new();
        for saved in state.pools {
            let found = open_for_import(&saved.disks, &self.env).await;
            let devices: Vec<Arc<dyn BlockDevice>> = match found.busy.first() {
                None => found.opened.into_iter().map(|(_, device)| device).collect(),
                Some(busy) => {
                    problems.push(self.keep_unavailable(saved, busy.refusal()));
                    continue;
                }
            };
            let options = ImportOptions {
                pool: Some(saved.name.clone()),
                exports_taken: super::names::export_names(self),
                ..ImportOptions::default()
            };
            // Nothing is served until every saved pool is in: after an
            // unclean shutdown an import replays write-back logs and
            // resyncs parity first, which may take a while.
            super::log(format!(
                "pool {}: importing ({})",
                saved.name,
                terrace_engine::count(devices.len() as u64, "disk")
            ));
            let started_ns = self.env.now_ns();
            match Pool::import(self.env.clone(), devices, options).await {
                Ok(pool) => {
                    let pool = Arc::new(pool);
                    let name = pool.name().to_string();
                    let seconds = self.env.now_ns().saturating_sub(started_ns) as f64 / 1e9;
                    super::log(format!("pool {name}: imported in {seconds:.1} s"));
                    self.add(PoolEntry {
                        pool: pool.clone(),
                        disks: saved.disks,
                    });
                    self.share_log_memory();
                    start_pool_tasks(&pool);
                    for export in super::names::exports(self) {
                        if let Some(note) = export.not_served().filter(|_| export.pool == name) {
                            super::log(format!(
                                "pool {name}: space {}: {note}",
                                export.space.name()
                            ));
                        }
                    }
                }
                Err(error) => problems.push(self.keep_unavailable(saved, error.to_string())),
            }
        }
        problems
    }

    /// Keep a saved pool that could not be imported for the next start;
    /// the problem, for the log.
    fn keep_unavailable(&self, saved: SavedPool, why: String) -> String {
        let problem = format!("pool {}: {why}", saved.name);
        self.unavailable
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(saved);
        problem
    }
}

/// How often the daemon checks that every disk's file or device is still
/// there: a pulled disk with no I/O is noticed within this.
const WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A pool's background work: its job runner, its write-back caches'
/// destaging, and a watcher that marks disks whose file or device vanished
/// missing and logs what changed in the pool when the pool tells of a
/// change (see [`super::events`]; and the end of a resync after an unclean
/// shutdown). All end with the pool.
pub fn start_pool_tasks(pool: &Arc<Pool>) {
    let runner = pool.clone();
    tokio::spawn(async move { runner.run_jobs().await });
    let destager = pool.clone();
    tokio::spawn(async move { destager.run_cache().await });
    let left = pool.resync_extents_pending();
    if left > 0 {
        super::log(format!(
            "pool {}: serving; {left} mirror extent(s) left by an unclean shutdown are resynchronised in the background (a row read first is resynchronised on the spot)",
            pool.name()
        ));
    }
    let watched = pool.clone();
    // Before the first look, so that no change after it goes untold.
    let mut events = pool.subscribe();
    tokio::spawn(async move {
        let mut resyncing = left > 0;
        let mut seen = log_changes(&watched, None).await;
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        // A full status costs a pass over every extent: looked at when the
        // pool tells of a change, at most once a tick (a job's commits come
        // in bursts); a change told meanwhile waits for the next tick.
        let (mut told, mut looked_this_tick) = (false, true);
        while watched.is_open() {
            tokio::select! {
                event = events.next() => {
                    let Some(event) = event else {
                        break;
                    };
                    log_finding(watched.name(), &event);
                    while let Ok(event) = events.try_recv() {
                        log_finding(watched.name(), &event);
                    }
                    told = true;
                }
                _ = tick.tick() => {
                    looked_this_tick = false;
                    if resyncing && watched.resync_extents_pending() == 0 && watched.is_open() {
                        resyncing = false;
                        super::log(format!(
                            "pool {}: resync after the unclean shutdown done",
                            watched.name()
                        ));
                    }
                    for (index, device) in watched.online_devices() {
                        if device.starts_with('/') && !std::path::Path::new(&device).exists() {
                            let _ = watched
                                .disk_gone(index, "its file or device disappeared")
                                .await;
                        }
                    }
                }
            }
            if told && !looked_this_tick && watched.is_open() {
                seen = log_changes(&watched, Some(&seen)).await;
                (told, looked_this_tick) = (false, true);
            }
        }
    });
}

/// Log what changed in `pool` since `before` (see [`super::events`]);
/// the pool as it is now.
async fn log_changes(pool: &Pool, before: Option<&Summary>) -> Summary {
    let status = pool.status().await;
    let jobs = pool.job_statuses().await;
    let settings = pool.metadata().await.settings;
    let view = super::views::pool_view(&status, &jobs, &settings, |_| String::new());
    let now = Summary::of(&view);
    for line in changes(before, &now) {
        super::log(line);
    }
    now
}

/// Log a block that failed its checksum or could not be read, and a scrub's finding,
/// repaired or not, as it happens (the status compared for the rest of the
/// log only counts them).
fn log_finding(pool: &str, event: &terrace_engine::PoolEvent) {
    match event {
        terrace_engine::PoolEvent::ScrubFound {
            job,
            space,
            offset,
            what,
            repaired,
        } => super::log(format!(
            "pool {pool}: scrub (job {job}) found space {space} at offset {offset}: {what}: {}",
            if *repaired { "repaired" } else { "NOT repaired" }
        )),
        terrace_engine::PoolEvent::Healed {
            space,
            offset,
            length,
            disk,
            blocks,
            rewritten,
        } => super::log(format!(
            "pool {pool}: space {space}: checksum error repaired: {blocks} block(s) of the row at {offset}+{length} on {} failed their checksums, rebuilt from redundancy{}",
            disk.map_or("a disk".to_string(), |disk| format!("disk {}", disk.0)),
            if *rewritten { " and rewritten there" } else { " (not rewritten: the pool is read-only or the write failed)" }
        )),
        terrace_engine::PoolEvent::ReadError {
            space,
            offset,
            length,
            disk,
            rewritten,
        } => super::log(format!(
            "pool {pool}: space {space}: read error on disk {} in the row at {offset}+{length}: {}",
            disk.0,
            if *rewritten { "rebuilt from redundancy and rewritten there" } else { "not repaired (no redundancy rebuilt it, the pool is read-only, or the rewrite failed)" }
        )),
        terrace_engine::PoolEvent::Capacity {
            threshold,
            percent,
            rising: true,
        } => super::log(format!(
            "pool {pool}: {percent}% of the capacity is allocated, past the {threshold}% alert: add disks or free space (once it is full, writes to new extents of thin spaces get ENOSPC)"
        )),
        terrace_engine::PoolEvent::Capacity {
            threshold,
            percent,
            rising: false,
        } => super::log(format!(
            "pool {pool}: {percent}% of the capacity is allocated, back under the {threshold}% alert"
        )),
        terrace_engine::PoolEvent::Unrecoverable { space, offset, blocks } => super::log(format!(
            "pool {pool}: space {space}: {blocks} block(s) from {offset} fail their checksums on every copy and no reconstruction matches: reads of them fail"
        )),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modelled_drives_of_a_pool_get_their_own_spindle_phases() {
        let phases: Vec<f64> = (0..8)
            .map(|i| spindle_phase(&format!("/var/tmp/pool/disks/hdd{i}.img")))
            .collect();
        assert!(phases.iter().all(|p| (0.0..1.0).contains(p)), "{phases:?}");
        let (low, high) = phases
            .iter()
            .fold((1.0f64, 0.0f64), |(l, h), &p| (l.min(p), h.max(p)));
        assert!(high - low > 0.5, "bunched together: {phases:?}");
        let mut sorted = phases.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(sorted.windows(2).all(|w| w[1] - w[0] > 1e-6), "{phases:?}");
        let again = spindle_phase("/var/tmp/pool/disks/hdd3.img");
        assert_eq!(again, phases[3], "a restart keeps a drive's phase");
    }
}
