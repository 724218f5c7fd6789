//! The control API between the CLI and the daemon: one JSON request per
//! line on a Unix socket, one JSON response per line back.
//!
//! ```text
//! → {"command":"space-create","pool":"tank","name":"vm","layout":"mirror",...}
//! ← {"ok":true,"result":{...}}            or   {"ok":false,"error":"...","kind":"failure"}
//! ```
//!
//! The views here are what every listing prints with `--json`, so their
//! field names are part of the interface.

use serde::{Deserialize, Serialize};

/// A disk named on the command line, with optional attributes
/// (`path[,media=ssd][,usage=journal][,enclosure=E][,node=N][,model=M[,override...]]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct DiskSpec {
    pub path: String,
    #[serde(default)]
    pub media: Option<String>,
    #[serde(default)]
    pub usage: Option<String>,
    #[serde(default)]
    pub enclosure: Option<String>,
    #[serde(default)]
    pub node: Option<String>,
    /// A drive model the disk (a file, usually) is made to behave like:
    /// hdd-10k, hdd-7k, ssd-sata, nvme, or a custom spec.
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Request {
    PoolCreate {
        name: String,
        disks: Vec<DiskSpec>,
        slab_bytes: Option<u64>,
        metadata_slot_bytes: Option<u64>,
        /// Even over disks that hold something (a file system...).
        #[serde(default)]
        force: bool,
    },
    PoolList,
    PoolStatus {
        name: Option<String>,
    },
    /// Import from devices and folders; with no name and several pools
    /// found, the answer lists them.
    PoolImport {
        /// Devices or folders (a folder's model applies to every file in it).
        disks: Vec<DiskSpec>,
        name: Option<String>,
        force: bool,
        read_only: bool,
    },
    PoolExport {
        name: String,
        /// Even while NBD clients have its spaces open.
        #[serde(default)]
        force: bool,
    },
    PoolDestroy {
        name: String,
        /// Even while NBD clients have its spaces open.
        #[serde(default)]
        force: bool,
    },
    /// Take back failed or stale disks that work again (all present, or
    /// `disk`: an index or path).
    PoolClear {
        name: String,
        disk: Option<String>,
    },
    DiskList {
        paths: Vec<String>,
    },
    DiskAdd {
        pool: String,
        disks: Vec<DiskSpec>,
        /// Even over disks that hold something (a file system...).
        #[serde(default)]
        force: bool,
    },
    DiskSet {
        pool: String,
        disk: String,
        usage: String,
    },
    SpaceCreate(SpaceCreate),
    SpaceList {
        pool: Option<String>,
    },
    SpaceShow {
        pool: Option<String>,
        name: String,
    },
    SpaceResize {
        pool: Option<String>,
        name: String,
        size_bytes: u64,
    },
    SpaceDelete {
        pool: Option<String>,
        name: String,
        /// Even while NBD clients have it open.
        #[serde(default)]
        force: bool,
        /// Only say whether it would be deleted (the refusals come before
        /// the question whether to).
        #[serde(default)]
        check: bool,
    },
    /// Read every row and check that copies and parity agree with the data.
    SpaceVerify {
        pool: Option<String>,
        name: String,
    },
    /// Set a live space's write-back cache size (adds one if it has none).
    SpaceCache {
        pool: Option<String>,
        name: String,
        bytes: u64,
    },
    /// Move everything off a disk, then release it.
    DiskRemove {
        pool: String,
        disk: String,
    },
    /// Add `new` and move everything of `old` onto it.
    DiskReplace {
        pool: String,
        old: String,
        new: DiskSpec,
        /// Even over a disk that holds something (a file system...).
        #[serde(default)]
        force: bool,
    },
    PoolSet {
        name: String,
        #[serde(flatten)]
        change: SettingsChange,
    },
    /// Bring the pool up to this version's format: checksums for the
    /// spaces that have none yet.
    PoolUpgrade {
        name: String,
    },
    /// Start a scrub of the pool: read every row, repair what disagrees.
    PoolScrub {
        name: String,
        /// Bytes read from disks a second; `None`: the pool's repair rate.
        #[serde(default)]
        rate_bytes: Option<u64>,
    },
    JobList {
        pool: Option<String>,
    },
    JobControl {
        pool: Option<String>,
        id: u64,
        /// pause, resume or cancel.
        action: String,
    },
    DaemonStatus,
    Shutdown,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpaceCreate {
    pub pool: String,
    pub name: String,
    pub layout: String,
    pub copies: Option<u32>,
    pub redundancy: Option<u32>,
    pub columns: Option<u32>,
    pub interleave_bytes: Option<u64>,
    /// `None` means as large as possible.
    pub size_bytes: Option<u64>,
    pub fault_domain: Option<String>,
    /// Write-back cache size; `None` for the default, 0 for none.
    #[serde(default)]
    pub cache_bytes: Option<u64>,
    /// NBD export name; `None`: the space's name.
    #[serde(default)]
    pub export: Option<String>,
    /// Keep a checksum of every block (the default).
    #[serde(default = "checksums_default")]
    pub checksums: bool,
    /// "thin": extents allocated on first write; "fixed" or none: all now.
    #[serde(default)]
    pub provisioning: Option<String>,
}

fn checksums_default() -> bool {
    true
}

/// What went wrong, by who can fix it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The request itself is malformed (exit code 2).
    Usage,
    /// The request was understood and refused or failed (exit code 1).
    Failure,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub result: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

impl Response {
    pub fn success(result: serde_json::Value) -> Response {
        Response {
            ok: true,
            result,
            error: None,
            kind: None,
        }
    }

    pub fn failure(kind: ErrorKind, error: impl Into<String>) -> Response {
        Response {
            ok: false,
            result: serde_json::Value::Null,
            error: Some(error.into()),
            kind: Some(kind),
        }
    }
}

/// `text`, or `None` if it is empty: JSON says null, never "", for what
/// is absent.
pub fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolSummary {
    pub name: String,
    pub id: String,
    /// ONLINE, DEGRADED, READ-ONLY or DATA-LOSS.
    pub state: String,
    /// Why the state is what it is.
    pub reason: String,
    /// Disks in the pool; those emptied and released are not counted.
    pub disk_count: usize,
    pub space_count: usize,
    /// Slabs of the disks that take spaces' data, and those in use.
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    /// Slabs of the journal disks in service, and those the logs use.
    pub journal_bytes: u64,
    pub journal_allocated_bytes: u64,
    /// Raw bytes every space would take fully allocated (thin spaces
    /// included at their size), and its ratio to the capacity.
    #[serde(default)]
    pub provisioned_bytes: u64,
    #[serde(default)]
    pub overcommit_ratio: f64,
    /// Free raw bytes thin allocation leaves for a repair.
    #[serde(default)]
    pub thin_reserve_bytes: u64,
    /// What the admin should do first (`pool status` lists every action);
    /// null when nothing needs them.
    #[serde(default)]
    pub action: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiskView {
    pub index: u16,
    pub id: String,
    pub device: String,
    /// ONLINE, FAILED, MISSING, STANDBY, or REMOVED (emptied and released
    /// by `disk remove` or `disk replace`).
    pub state: String,
    /// Why the state is what it is (null when nothing needs saying).
    pub reason: Option<String>,
    pub media: String,
    pub usage: String,
    pub size_bytes: u64,
    pub slabs_total: u32,
    pub slabs_used: u32,
    /// The fault domains it was declared in (null when undeclared).
    pub enclosure: Option<String>,
    pub node: Option<String>,
    /// Average service time of its I/O, in microseconds.
    pub latency_us: u64,
    /// Far slower than its peers.
    pub slow: bool,
    /// Reads it failed since the pool was opened or cleared (each rebuilt
    /// from redundancy and rewritten where the layout keeps some).
    #[serde(default)]
    pub read_errors: u64,
    /// Writes and flushes it failed (the first fails the disk).
    #[serde(default)]
    pub write_errors: u64,
    /// Reads of a row from it whose blocks failed their checksums (each
    /// rebuilt from redundancy and rewritten).
    #[serde(default)]
    pub checksum_errors: u64,
    /// Extents written while it was missing: back, it resyncs only these.
    #[serde(default)]
    pub missed_extents: u64,
    /// Lost, and why its repair does not run: no room for what it held.
    #[serde(default)]
    pub unrepaired: Option<String>,
    /// What the admin should do about it; null when nothing.
    #[serde(default)]
    pub action: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobView {
    pub pool: String,
    pub id: u64,
    /// repair, evacuate, replace or resync.
    pub kind: String,
    /// e.g. "repair disk 3 (/dev/sdd)".
    pub description: String,
    /// running, paused, done, cancelled or failed.
    pub state: String,
    /// Why it failed, was cancelled or waits (null otherwise).
    pub reason: Option<String>,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub percent: u32,
    pub rate_bytes_per_second: u64,
    pub eta_seconds: Option<u64>,
    pub moves_total: usize,
    pub moves_done: usize,
    /// Done at once with nothing to move (`reason` says why: nothing to
    /// repair, nothing missed): its 100 % is of nothing.
    #[serde(default)]
    pub nothing_to_do: bool,
    /// A scrub's rows repaired and rows it could not repair (null for
    /// other jobs).
    #[serde(default)]
    pub repaired: Option<u64>,
    #[serde(default)]
    pub unrepaired: Option<u64>,
}

/// What one disk, enclosure or node failing now would cost.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImpactView {
    pub what: String,
    pub lose_data: Vec<String>,
    pub lose_redundancy: Vec<String>,
    /// Spaces whose write-back log would lose every copy (they write
    /// through from then on).
    pub lose_log: Vec<String>,
    /// Spaces whose write-back log would be left with one copy.
    pub lose_log_redundancy: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SettingsView {
    pub retire_missing: String,
    pub repair_policy: String,
    pub repair_rate_bytes_per_second: u64,
    /// How often a scrub starts by itself, in words (`off`, `daily`,
    /// `every 36 hours`), and in seconds (0: off).
    #[serde(default)]
    pub scrub: String,
    #[serde(default)]
    pub scrub_interval_seconds: u64,
    /// When the last scrub started and the next is due, in seconds since
    /// the Unix epoch (null: the pool never scrubbed / no schedule).
    #[serde(default)]
    pub scrub_last_unix_seconds: Option<u64>,
    #[serde(default)]
    pub scrub_next_unix_seconds: Option<u64>,
    /// Read and checksum errors within `error_window_seconds` that fail a
    /// disk (0: never).
    #[serde(default)]
    pub error_limit: u32,
    #[serde(default)]
    pub error_window_seconds: u32,
    /// What a space created without `--provisioning` gets: fixed or thin.
    #[serde(default)]
    pub provisioning: String,
    /// Percentages of the capacity whose crossing by the allocated slabs
    /// is logged (empty: none).
    #[serde(default)]
    pub alert_percents: Vec<u8>,
}

/// The settings `pool set` changes (none named: none changed).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SettingsChange {
    #[serde(default)]
    pub retire_missing: Option<String>,
    #[serde(default)]
    pub repair_policy: Option<String>,
    #[serde(default)]
    pub repair_rate_bytes: Option<u64>,
    /// How often a scrub starts by itself: daily, weekly, monthly, off or
    /// a duration (36h, 10d).
    #[serde(default)]
    pub scrub: Option<String>,
    /// Read and checksum errors within the window that fail a disk (0:
    /// never).
    #[serde(default)]
    pub error_limit: Option<u32>,
    /// That window: seconds, or a duration (90s, 10m, 1h, 1d).
    #[serde(default)]
    pub error_window: Option<String>,
    /// The provisioning of spaces created without saying: fixed or thin.
    #[serde(default)]
    pub provisioning: Option<String>,
    /// Allocation alerts: up to three percentages, or "off".
    #[serde(default)]
    pub alert: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpaceView {
    pub pool: String,
    pub name: String,
    /// simple, mirror or parity.
    pub layout: String,
    /// e.g. "2-way mirror", "dual parity".
    pub layout_description: String,
    pub copies: u32,
    /// Disk failures the layout tolerates: a parity space's redundancy, a
    /// mirror's copies but one.
    pub redundancy: u32,
    pub columns: u32,
    pub data_columns: u32,
    pub columns_reason: String,
    pub interleave_bytes: u64,
    pub size_bytes: u64,
    /// Raw bytes of the slabs it has (of a thin space, those written).
    pub raw_bytes: u64,
    pub extents: u64,
    /// "fixed" (every extent allocated at creation) or "thin" (each extent
    /// on its first write).
    #[serde(default)]
    pub provisioning: String,
    /// Bytes of the space whose extents have their slabs.
    #[serde(default)]
    pub allocated_bytes: u64,
    pub fault_domain: String,
    pub failures_tolerated: u32,
    /// healthy, no-redundancy, incomplete, degraded, repairing or offline.
    pub health: String,
    /// The repair job and its progress while repairing.
    pub repair_job: Option<u64>,
    pub repair_percent: Option<u32>,
    /// Further disk failures it survives now (absent when offline).
    pub survives: Option<u32>,
    pub read_only: bool,
    /// NBD export name, fixed at creation.
    pub export: String,
    /// Why the export name is not served for this space (another open
    /// pool's space has it), and the name clients reach it by instead;
    /// null when served.
    #[serde(default)]
    pub export_not_served: Option<String>,
    /// NBD connections open on it now (a client may open several).
    #[serde(default)]
    pub nbd_connections: u64,
    /// The write-back cache, if the space has one.
    #[serde(default)]
    pub cache: Option<CacheView>,
    /// Mirror extents left to resynchronise since an unclean shutdown (of
    /// those owed at the import), and how far that resync has gone (bytes
    /// of the rows owed at the import, bytes done, bytes per second since,
    /// seconds left).
    #[serde(default)]
    pub resync_extents_left: u64,
    #[serde(default)]
    pub resync_extents_total: u64,
    #[serde(default)]
    pub resync_bytes_total: u64,
    #[serde(default)]
    pub resync_bytes_done: u64,
    #[serde(default)]
    pub resync_rate_bytes_per_second: u64,
    #[serde(default)]
    pub resync_eta_seconds: Option<u64>,
    /// What the admin should do about it; null when nothing.
    #[serde(default)]
    pub action: Option<String>,
    /// Whether reads check every block against its checksum: "on", "off"
    /// (as asked at creation) or "no-room" (the pool had no room for the
    /// sums; an import that finds room adds them).
    #[serde(default)]
    pub checksums: String,
}

/// A space's write-back cache: where its log lives and how full it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CacheView {
    pub bytes: u64,
    pub dirty_bytes: u64,
    /// Bytes of log records whose data is held in memory; the rest of the
    /// dirty data is read back from the log's disks when needed.
    #[serde(default)]
    pub memory_bytes: u64,
    /// Ring in use (dirty records and records not yet released).
    pub used_bytes: u64,
    pub fill_percent: u32,
    /// Disks holding the log, as pool disk indexes.
    pub log_disks: Vec<u16>,
    pub log_copies: u32,
    pub log_health: String,
    /// Where the log was placed and why.
    #[serde(default)]
    pub placement: String,
    /// What losing log disks costs.
    pub protects: String,
    pub absorbed_writes: u64,
    pub absorbed_bytes: u64,
    pub bypassed_writes: u64,
    pub bypassed_bytes: u64,
    pub destaged_bytes: u64,
    /// Bytes per second being destaged now.
    #[serde(default)]
    pub destage_rate_bytes_per_second: u64,
    /// Why the space runs write-through, if it does.
    pub write_through: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolView {
    #[serde(flatten)]
    pub summary: PoolSummary,
    pub generation: u64,
    pub slab_bytes: u64,
    /// The metadata as last committed, the slot every disk keeps it in
    /// (two of them), and the room kept free in it for the repair of the
    /// fullest disk: allocations that would cut into that are refused.
    #[serde(default)]
    pub metadata_bytes: u64,
    #[serde(default)]
    pub metadata_slot_bytes: u64,
    #[serde(default)]
    pub metadata_reserve_bytes: u64,
    pub read_only: Option<String>,
    pub settings: SettingsView,
    pub disks: Vec<DiskView>,
    pub spaces: Vec<SpaceView>,
    pub jobs: Vec<JobView>,
    /// What each disk, enclosure or node failing now would cost.
    pub impact: Vec<ImpactView>,
    /// Bytes of log records the pool's write-back logs hold in memory, and
    /// the pool's share of the daemon's log memory.
    #[serde(default)]
    pub log_memory_bytes: u64,
    #[serde(default)]
    pub log_memory_max_bytes: u64,
    /// A write-back log being prepared (written with zeroes before its
    /// cache takes it), if any.
    #[serde(default)]
    pub preparing: Option<PreparationView>,
}

/// A write-back log being prepared, in `pool status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PreparationView {
    /// The space whose cache it is.
    pub space: String,
    /// Bytes to write over all the log's copies, and written so far.
    pub total_bytes: u64,
    pub done_bytes: u64,
}

/// One slot of one extent in `space show`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SlotView {
    pub slot: u32,
    /// e.g. "column 2", "column 0 copy 1".
    pub role: String,
    pub disk: u16,
    pub device: String,
    pub slab: u32,
    pub state: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExtentView {
    pub index: u64,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    pub slots: Vec<SlotView>,
    /// Named in the pool's write intent: it may have writes in flight, and
    /// a crash now resynchronises it (only such extents of a space without
    /// a working log are).
    #[serde(default)]
    pub write_intent: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpaceDetail {
    pub space: SpaceView,
    /// Plain-language lines explaining the layout.
    pub explanation: Vec<String>,
    pub extent_map: Vec<ExtentView>,
}

/// A device seen by `disk list`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CandidateView {
    pub device: String,
    /// file or block.
    pub kind: String,
    pub size_bytes: u64,
    /// available, in-pool, damaged, occupied, unusable.
    pub status: String,
    /// Why it cannot be pooled (null when available).
    pub reason: Option<String>,
    /// What it holds that pooling it would overwrite (status `occupied`).
    #[serde(default)]
    pub holds: Option<HoldsView>,
}

/// A format found on a candidate disk (see `daemon/probe.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HoldsView {
    /// "ext4 file system", "LVM2 physical volume", "GPT partition table"...
    pub kind: String,
    pub label: Option<String>,
    pub uuid: Option<String>,
    /// Where its signature is on the disk.
    pub offset_bytes: u64,
}

/// A pool found on devices by `pool import` without a name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImportableView {
    pub name: String,
    pub id: String,
    pub devices: Vec<String>,
    pub generation: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DaemonView {
    pub version: String,
    pub pid: u32,
    pub control_socket: String,
    pub nbd_tcp: Option<String>,
    pub nbd_socket: Option<String>,
    pub state_dir: String,
    pub pools: Vec<String>,
}
