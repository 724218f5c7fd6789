//! Drive models: a file or memory disk that takes the time a real drive
//! would take.
//!
//! A [`ModelDevice`] wraps any [`BlockDevice`] and runs each operation on
//! the inner device while the modelled drive serves it: the operation
//! completes when both have finished, so a fast backing file takes the
//! modelled drive's time, not that time plus its own.
//! The timing is computed by a pure state machine ([`Drive`]) that is told
//! the time, so it is exact under the simulator's virtual clock and testable
//! without sleeping; the wrapper only waits on [`Env::sleep`].
//!
//! # Hard disks ([`HddParams`])
//!
//! The whole backing device stands for the whole platter surface: offset 0
//! is the outer edge, the last byte the inner edge (a small sparse file
//! behaves like a full drive, not like a short-stroked one).
//!
//! * **Seek** between positions `d` (fraction of the full stroke) apart
//!   takes `track_to_track + k·√d`, with `k` chosen so that the mean over
//!   random pairs (E[√d] = 8/15) equals the datasheet's average seek; writes
//!   add a settle time.
//! * **Rotation**: the platter turns at `rpm`; each offset has an angle on its
//!   track, so after a seek the drive waits for its sector to come round.
//!   Each drive's spindle has its own phase ([`ModelDevice::with_phase`]):
//!   the drives of a real JBOD are not spindle-synchronised, so the same
//!   offset on two drives does not come round at the same instant.
//! * **Transfer** runs at the zone's media rate, falling linearly from the
//!   outer rate to the inner rate.
//! * **Sequential** requests that start where the head stopped need no
//!   positioning (track buffer and read-ahead). A request a little further
//!   on (within a track's length, such as the next data unit of a parity
//!   stream, past the parity unit between) needs no seek either: the head
//!   stays on its track, or steps to the next one within the track skew,
//!   and the skipped sectors pass under it at the media rate.
//! * **Command queueing**: queued requests are served shortest positioning
//!   time first among the oldest `queue_depth`, so random IO/s grow with
//!   outstanding I/Os as on a real drive; a request older than
//!   [`STARVATION_NS`] is served first (the nearest of several).
//! * **Write cache**: a write (not FUA) that fits the cache completes after
//!   the interface transfer and is destaged to the media later, in queue
//!   order with everything else; a flush waits until every cached write that
//!   came before it is on the media.
//!
//! # Solid-state drives ([`SsdParams`])
//!
//! `units` flash units work in parallel, each busy for a per-operation
//! occupancy (read or write); every transfer also crosses the host link
//! at its bandwidth. IO/s therefore grow with outstanding I/Os until all
//! units are busy (the queue-depth knee) and large transfers are capped by
//! the link. Data-centre SSDs keep writes in a power-loss-protected buffer:
//! a write that fits it completes once it has crossed the link plus a
//! short latency (FUA or not, as it is already safe), and its program runs
//! behind; once the buffer is full, writes complete as units program them,
//! so sustained writes still run at the units' rate.
//!
//! The parameters of each named model, and the datasheet figures they come
//! from, are in `docs/DRIVE_MODELS.md`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::{BlockDevice, BoxFuture, Bytes, BytesMut, Env, IoResult};

const NS_PER_MS: f64 = 1e6;
const NS_PER_US: f64 = 1e3;

/// A queued request older than this is served next, whatever its position
/// (real drives bound queueing delay the same way).
pub const STARVATION_NS: u64 = 250_000_000;

/// Parameters of a hard disk model.
#[derive(Debug, Clone, PartialEq)]
pub struct HddParams {
    pub rpm: f64,
    /// Average seek over random positions (reads), milliseconds.
    pub avg_seek_ms: f64,
    pub track_to_track_ms: f64,
    /// Extra settle time for writes, milliseconds.
    pub write_settle_ms: f64,
    /// Media rate at the outer and inner edge, MB/s (10^6 bytes).
    pub outer_mb_s: f64,
    pub inner_mb_s: f64,
    /// Host interface rate (cached writes, track-buffer hits), MB/s.
    pub interface_mb_s: f64,
    /// Controller overhead per command, microseconds.
    pub overhead_us: f64,
    /// Tagged command queue depth the drive reorders over (1 = FIFO).
    pub queue_depth: usize,
    /// Volatile write cache in bytes (0 = write-through).
    pub write_cache_bytes: u64,
    /// Time a flush takes once the cache is empty, microseconds.
    pub flush_us: f64,
}

/// Parameters of a solid-state drive model.
#[derive(Debug, Clone, PartialEq)]
pub struct SsdParams {
    /// Flash units working in parallel.
    pub units: usize,
    /// Unit occupancy of one read and one write, microseconds.
    pub read_us: f64,
    pub write_us: f64,
    /// Host link bandwidth, MB/s (10^6 bytes), reads and writes.
    pub read_mb_s: f64,
    pub write_mb_s: f64,
    /// Time from a write's arrival (after the link) to its acknowledgement
    /// while it fits the power-loss-protected write buffer, microseconds.
    pub write_latency_us: f64,
    /// Power-loss-protected write buffer in bytes (0 = a write completes
    /// when its unit has programmed it).
    pub write_buffer_bytes: u64,
    pub flush_us: f64,
}

/// A drive model: a named preset, possibly with parameters overridden.
#[derive(Debug, Clone, PartialEq)]
pub struct DriveModel {
    /// The spec it was parsed from, e.g. `hdd-10k` or `hdd-7k,wcache=0`.
    pub spec: String,
    pub kind: ModelKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ModelKind {
    Hdd(HddParams),
    Ssd(SsdParams),
}

/// The named models, for help texts and errors.
pub const MODEL_NAMES: [&str; 4] = ["hdd-10k", "hdd-7k", "ssd-sata", "nvme"];

impl HddParams {
    /// A 2.5-inch 10,000 rpm 900 GB SAS drive, as in the white paper.
    pub fn hdd_10k() -> Self {
        HddParams {
            rpm: 10_000.0,
            avg_seek_ms: 3.8,
            track_to_track_ms: 0.2,
            write_settle_ms: 0.4,
            outer_mb_s: 204.0,
            inner_mb_s: 125.0,
            interface_mb_s: 550.0,
            overhead_us: 50.0,
            queue_depth: 32,
            write_cache_bytes: 64 << 20,
            flush_us: 100.0,
        }
    }

    /// A 3.5-inch 7,200 rpm nearline SATA/SAS drive.
    pub fn hdd_7k() -> Self {
        HddParams {
            rpm: 7_200.0,
            avg_seek_ms: 8.5,
            track_to_track_ms: 0.5,
            write_settle_ms: 1.0,
            outer_mb_s: 215.0,
            inner_mb_s: 100.0,
            interface_mb_s: 550.0,
            overhead_us: 50.0,
            queue_depth: 32,
            write_cache_bytes: 128 << 20,
            flush_us: 100.0,
        }
    }

    fn rotation_ns(&self) -> f64 {
        60e9 / self.rpm
    }

    /// Seek time in nanoseconds over `distance` (fraction of the stroke).
    fn seek_ns(&self, distance: f64, write: bool) -> f64 {
        if distance <= 0.0 {
            return 0.0;
        }
        let slope = (self.avg_seek_ms - self.track_to_track_ms).max(0.0) / (8.0 / 15.0);
        let settle = if write { self.write_settle_ms } else { 0.0 };
        (self.track_to_track_ms + slope * distance.sqrt() + settle) * NS_PER_MS
    }

    /// Media rate in bytes per nanosecond at `position` (0 outer, 1 inner).
    fn media_rate(&self, position: f64) -> f64 {
        (self.outer_mb_s - (self.outer_mb_s - self.inner_mb_s) * position) * 1e6 / 1e9
    }
}

impl SsdParams {
    /// A 2.5-inch SATA data-centre SSD.
    pub fn ssd_sata() -> Self {
        SsdParams {
            units: 8,
            read_us: 85.0,
            write_us: 250.0,
            read_mb_s: 550.0,
            write_mb_s: 520.0,
            write_latency_us: 30.0,
            write_buffer_bytes: 4 << 20,
            flush_us: 50.0,
        }
    }

    /// A PCIe 3.0 x4 NVMe data-centre SSD.
    pub fn nvme() -> Self {
        SsdParams {
            units: 64,
            read_us: 90.0,
            write_us: 60.0,
            read_mb_s: 3_200.0,
            write_mb_s: 2_000.0,
            write_latency_us: 16.0,
            write_buffer_bytes: 16 << 20,
            flush_us: 20.0,
        }
    }
}

/// Why a model spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("unknown drive model {0:?}; models are {names}, optionally followed by ,key=value overrides", names = MODEL_NAMES.join(", "))]
    Unknown(String),
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    #[error("unknown parameter {key:?} for a {kind} model; parameters are {known}")]
    UnknownKey {
        key: String,
        kind: &'static str,
        known: &'static str,
    },
    #[error("parameter {key}={value:?}: {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: &'static str,
    },
}

const HDD_KEYS: &str = "rpm, seek_ms, t2t_ms, settle_ms, outer_mbs, inner_mbs, iface_mbs, overhead_us, qd, wcache, flush_us";
const SSD_KEYS: &str = "units, read_us, write_us, read_mbs, write_mbs, wlat_us, wbuf, flush_us";

impl DriveModel {
    /// Parse `NAME[,key=value...]`, e.g. `hdd-10k`, `ssd-sata,units=4` or
    /// `hdd-7k,wcache=0` (sizes take K/M/G suffixes).
    pub fn parse(spec: &str) -> Result<Self, ModelError> {
        let mut parts = spec.split(',').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let mut kind = match name {
            "hdd-10k" => ModelKind::Hdd(HddParams::hdd_10k()),
            "hdd-7k" => ModelKind::Hdd(HddParams::hdd_7k()),
            "ssd-sata" | "ssd" => ModelKind::Ssd(SsdParams::ssd_sata()),
            "nvme" => ModelKind::Ssd(SsdParams::nvme()),
            other => return Err(ModelError::Unknown(other.to_string())),
        };
        for part in parts.filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| ModelError::NotKeyValue(part.to_string()))?;
            let bad = |reason| ModelError::BadValue {
                key: key.to_string(),
                value: value.to_string(),
                reason,
            };
            let number = || -> Result<f64, ModelError> {
                match value.parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                    _ => Err(bad("not a non-negative number")),
                }
            };
            let positive = || -> Result<f64, ModelError> {
                number().and_then(|v| {
                    if v > 0.0 {
                        Ok(v)
                    } else {
                        Err(bad("must be above zero"))
                    }
                })
            };
            let count = || -> Result<usize, ModelError> {
                match value.parse::<usize>() {
                    Ok(v) if (1..=1024).contains(&v) => Ok(v),
                    _ => Err(bad("not a whole number from 1 to 1024")),
                }
            };
            match &mut kind {
                ModelKind::Hdd(p) => match key {
                    "rpm" => p.rpm = positive()?,
                    "seek_ms" => p.avg_seek_ms = number()?,
                    "t2t_ms" => p.track_to_track_ms = number()?,
                    "settle_ms" => p.write_settle_ms = number()?,
                    "outer_mbs" => p.outer_mb_s = positive()?,
                    "inner_mbs" => p.inner_mb_s = positive()?,
                    "iface_mbs" => p.interface_mb_s = positive()?,
                    "overhead_us" => p.overhead_us = number()?,
                    "qd" => p.queue_depth = count()?,
                    "wcache" => {
                        p.write_cache_bytes =
                            parse_bytes(value).ok_or_else(|| bad("not a size like 0, 16M or 1G"))?
                    }
                    "flush_us" => p.flush_us = number()?,
                    _ => {
                        return Err(ModelError::UnknownKey {
                            key: key.to_string(),
                            kind: "hard disk",
                            known: HDD_KEYS,
                        })
                    }
                },
                ModelKind::Ssd(p) => match key {
                    "units" => p.units = count()?,
                    "read_us" => p.read_us = number()?,
                    "write_us" => p.write_us = number()?,
                    "read_mbs" => p.read_mb_s = positive()?,
                    "write_mbs" => p.write_mb_s = positive()?,
                    "wlat_us" => p.write_latency_us = number()?,
                    "wbuf" => {
                        p.write_buffer_bytes =
                            parse_bytes(value).ok_or_else(|| bad("not a size like 0, 4M or 1G"))?
                    }
                    "flush_us" => p.flush_us = number()?,
                    _ => {
                        return Err(ModelError::UnknownKey {
                            key: key.to_string(),
                            kind: "solid-state",
                            known: SSD_KEYS,
                        })
                    }
                },
            }
        }
        Ok(DriveModel {
            spec: spec.to_string(),
            kind,
        })
    }

    /// Whether the model is a rotating disk.
    pub fn is_hdd(&self) -> bool {
        matches!(self.kind, ModelKind::Hdd(_))
    }
}

impl fmt::Display for DriveModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec)
    }
}

fn parse_bytes(text: &str) -> Option<u64> {
    crate::size::parse_size(text).ok()
}

/// What an operation asks of the drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read { offset: u64, length: u64 },
    Write { offset: u64, length: u64, fua: bool },
    Flush,
}

/// The answer to a submission or a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The operation completes at this time (ns of the clock given).
    DoneAt(u64),
    /// Not yet scheduled: ask again (with [`Drive::poll`]) at this time.
    AskAt(u64),
}

/// A request token from [`Drive::submit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// The timing state machine of one modelled drive. Sans-IO: every call is
/// given the current time, and answers with times.
#[derive(Debug)]
pub struct Drive {
    size_bytes: u64,
    state: DriveState,
}

#[derive(Debug)]
enum DriveState {
    Hdd(HddState),
    Ssd(SsdState),
}

#[derive(Debug)]
struct HddState {
    params: HddParams,
    /// Byte offset just after the last media access.
    head: u64,
    /// When the media is free for the next request.
    free_at: u64,
    queue: VecDeque<Queued>,
    done: HashMap<u64, u64>,
    next_ticket: u64,
    /// Cached write bytes not yet on the media.
    cache_dirty: u64,
    /// When the last cached write dispatched so far reaches the media.
    destaged_at: u64,
    /// The spindle's angle at time 0, as a fraction of a turn.
    phase: f64,
}

#[derive(Debug, Clone, Copy)]
struct Queued {
    ticket: u64,
    offset: u64,
    length: u64,
    write: bool,
    /// A cached write being destaged: nobody waits for it.
    background: bool,
    submitted: u64,
}

#[derive(Debug)]
struct SsdState {
    params: SsdParams,
    units: Vec<u64>,
    link_free: u64,
    /// When the last write completes (a flush waits for it).
    last_write: u64,
    /// Acknowledged writes in the write buffer not yet programmed: when
    /// each program ends, and its bytes.
    programs: BinaryHeap<Reverse<(u64, u64)>>,
    /// Bytes in `programs`.
    buffered: u64,
}

impl Drive {
    pub fn new(model: &DriveModel, size_bytes: u64) -> Self {
        let state = match &model.kind {
            ModelKind::Hdd(params) => DriveState::Hdd(HddState {
                params: params.clone(),
                head: 0,
                free_at: 0,
                queue: VecDeque::new(),
                done: HashMap::new(),
                next_ticket: 0,
                cache_dirty: 0,
                destaged_at: 0,
                phase: 0.0,
            }),
            ModelKind::Ssd(params) => DriveState::Ssd(SsdState {
                params: params.clone(),
                units: vec![0; params.units.max(1)],
                link_free: 0,
                last_write: 0,
                programs: BinaryHeap::new(),
                buffered: 0,
            }),
        };
        Drive {
            size_bytes: size_bytes.max(1),
            state,
        }
    }

    /// Set the spindle's angle at time 0 (a fraction of a turn; only the
    /// fractional part counts). Drives start in phase otherwise; SSDs have
    /// no spindle and ignore it.
    pub fn set_phase(&mut self, phase: f64) {
        if let DriveState::Hdd(hdd) = &mut self.state {
            hdd.phase = phase.rem_euclid(1.0);
        }
    }

    /// Submit an operation at time `now`.
    pub fn submit(&mut self, now: u64, op: Op) -> (Ticket, Progress) {
        let size = self.size_bytes;
        match &mut self.state {
            DriveState::Ssd(ssd) => (Ticket(0), Progress::DoneAt(ssd.submit(now, op))),
            DriveState::Hdd(hdd) => hdd.submit(now, op, size),
        }
    }

    /// Ask again about a ticket whose answer was [`Progress::AskAt`].
    pub fn poll(&mut self, now: u64, ticket: Ticket, op: Op) -> Progress {
        let size = self.size_bytes;
        match &mut self.state {
            DriveState::Ssd(_) => Progress::DoneAt(now),
            DriveState::Hdd(hdd) => hdd.poll(now, ticket, op, size),
        }
    }

    /// Forget a ticket whose waiter went away; a queued request is dropped,
    /// one already on the media finishes anyway.
    pub fn cancel(&mut self, ticket: Ticket) {
        if let DriveState::Hdd(hdd) = &mut self.state {
            hdd.queue.retain(|q| q.ticket != ticket.0 || q.background);
            hdd.done.remove(&ticket.0);
        }
    }
}

impl SsdState {
    fn submit(&mut self, now: u64, op: Op) -> u64 {
        let p = &self.params;
        let write = matches!(op, Op::Write { .. });
        let (occupancy_us, length, rate) = match op {
            Op::Read { length, .. } => (p.read_us, length, p.read_mb_s),
            Op::Write { length, .. } => (p.write_us, length, p.write_mb_s),
            Op::Flush => {
                let done = now.max(self.last_write) + (p.flush_us * NS_PER_US) as u64;
                return done;
            }
        };
        // A write that fits the power-loss-protected buffer is as safe as
        // programmed once it is there (FUA or not): it crosses the link
        // without waiting for a unit, completes after the buffer's latency,
        // and its program goes on behind.
        while let Some(&Reverse((programmed, bytes))) = self.programs.peek() {
            if programmed > now {
                break;
            }
            self.programs.pop();
            self.buffered -= bytes;
        }
        let buffered = write && self.buffered + length <= self.params.write_buffer_bytes;
        let (unit, &unit_free) = self
            .units
            .iter()
            .enumerate()
            .min_by_key(|(_, &free)| free)
            .expect("at least one unit");
        let start = now.max(unit_free);
        let transfer = (length as f64 / (rate * 1e6 / 1e9)) as u64;
        let link_start = if buffered { now } else { start }.max(self.link_free);
        self.link_free = link_start + transfer;
        let done = (start + (occupancy_us * NS_PER_US) as u64).max(self.link_free);
        self.units[unit] = done;
        if !write {
            return done;
        }
        let acknowledged = if buffered {
            self.programs.push(Reverse((done, length)));
            self.buffered += length;
            (self.link_free + (self.params.write_latency_us * NS_PER_US) as u64).min(done)
        } else {
            done
        };
        self.last_write = self.last_write.max(acknowledged);
        acknowledged
    }
}

impl HddState {
    fn submit(&mut self, now: u64, op: Op, size: u64) -> (Ticket, Progress) {
        self.advance(now, size);
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let (offset, length, write, fua) = match op {
            Op::Read { offset, length } => (offset, length, false, false),
            Op::Write {
                offset,
                length,
                fua,
            } => (offset, length, true, fua),
            Op::Flush => return (Ticket(ticket), self.flush_progress(now)),
        };
        let cached = write
            && !fua
            && self.params.write_cache_bytes > 0
            && self.cache_dirty + length <= self.params.write_cache_bytes;
        self.queue.push_back(Queued {
            ticket,
            offset,
            length,
            write,
            background: cached,
            submitted: now,
        });
        if cached {
            self.cache_dirty += length;
            let transfer = length as f64 / (self.params.interface_mb_s * 1e6 / 1e9);
            let done = now + (self.params.overhead_us * NS_PER_US + transfer) as u64;
            self.advance(now, size);
            return (Ticket(ticket), Progress::DoneAt(done));
        }
        self.advance(now, size);
        (Ticket(ticket), self.progress(now, ticket))
    }

    fn poll(&mut self, now: u64, ticket: Ticket, op: Op, size: u64) -> Progress {
        self.advance(now, size);
        match op {
            Op::Flush => self.flush_progress(now),
            _ => self.progress(now, ticket.0),
        }
    }

    fn progress(&mut self, now: u64, ticket: u64) -> Progress {
        match self.done.remove(&ticket) {
            Some(done) => Progress::DoneAt(done),
            None => Progress::AskAt(self.free_at.max(now + 1)),
        }
    }

    /// A flush is done when every cached write submitted so far is on the
    /// media.
    fn flush_progress(&self, now: u64) -> Progress {
        if self.queue.iter().any(|q| q.background) {
            return Progress::AskAt(self.free_at.max(now + 1));
        }
        let flush = (self.params.flush_us * NS_PER_US) as u64;
        Progress::DoneAt(now.max(self.destaged_at) + flush)
    }

    /// Dispatch queued requests whose start time has come, in the order the
    /// drive would pick them.
    fn advance(&mut self, now: u64, size: u64) {
        while let Some(first) = self.queue.iter().map(|q| q.submitted).min() {
            let start = self.free_at.max(first);
            if start > now {
                return;
            }
            let index = self.pick(start, size);
            let request = self.queue.remove(index).expect("picked from the queue");
            let service = self.service_ns(start, &request, size);
            let done = start + service;
            self.free_at = done;
            self.head = request.offset + request.length;
            if request.background {
                self.cache_dirty = self.cache_dirty.saturating_sub(request.length);
                self.destaged_at = self.destaged_at.max(done);
            } else {
                self.done.insert(request.ticket, done);
            }
        }
    }

    /// The request that continues the head's stream if there is one, else
    /// shortest positioning time first among the oldest `queue_depth`
    /// requests that had arrived by `start`; starved ones go first (the
    /// nearest of them: a full write cache holds a backlog older than the
    /// starvation limit, and destaging it in arrival order would turn a
    /// stream that arrived slightly out of order into one rotation per
    /// request).
    fn pick(&self, start: u64, size: u64) -> usize {
        // A request that continues where the head stopped needs no
        // positioning at all: the drive sees every write in its cache and
        // the oldest `queue_depth` commands.
        let mut commands = 0;
        for (index, request) in self.queue.iter().enumerate() {
            if request.submitted > start {
                continue;
            }
            if !request.background {
                commands += 1;
                if commands > self.params.queue_depth.max(1) {
                    continue;
                }
            }
            if request.offset == self.head {
                return index;
            }
        }
        let mut best: Option<(usize, bool, u64)> = None;
        for (index, request) in self
            .queue
            .iter()
            .enumerate()
            .filter(|(_, q)| q.submitted <= start)
            .take(self.params.queue_depth.max(1))
        {
            let starved = start - request.submitted >= STARVATION_NS;
            let positioning = self.positioning_ns(start, request, size);
            let better = match best {
                None => true,
                Some((_, best_starved, time)) => {
                    (starved && !best_starved) || (starved == best_starved && positioning < time)
                }
            };
            if better {
                best = Some((index, starved, positioning));
            }
        }
        best.map_or(0, |(index, _, _)| index)
    }

    fn position(&self, offset: u64, size: u64) -> f64 {
        (offset as f64 / size as f64).clamp(0.0, 1.0)
    }

    /// Seek plus rotational wait before `request` can transfer, if the
    /// drive starts positioning for it at `start`.
    fn positioning_ns(&self, start: u64, request: &Queued, size: u64) -> u64 {
        if request.offset == self.head {
            return 0;
        }
        let p = &self.params;
        let to = self.position(request.offset, size);
        let rate = p.media_rate(to);
        let rotation = p.rotation_ns();
        let track_bytes = (rate * rotation).max(1.0);
        if request.offset > self.head {
            // Within a track's length ahead: no seek, the gap passes under
            // the head.
            let gap = (request.offset - self.head) as f64;
            if gap <= track_bytes {
                return (gap / rate) as u64;
            }
        }
        let from = self.position(self.head, size);
        let seek = p.seek_ns((from - to).abs(), request.write);
        let target_angle = (request.offset as f64 % track_bytes) / track_bytes;
        let arrive = start as f64 + seek;
        let angle_now = (arrive / rotation + self.phase).fract();
        let wait = (target_angle - angle_now).rem_euclid(1.0) * rotation;
        (seek + wait) as u64
    }

    fn service_ns(&self, start: u64, request: &Queued, size: u64) -> u64 {
        let p = &self.params;
        let to = self.position(request.offset, size);
        let transfer = request.length as f64 / p.media_rate(to);
        let overhead = if request.background {
            0.0
        } else {
            p.overhead_us * NS_PER_US
        };
        self.positioning_ns(start, request, size) + (transfer + overhead) as u64
    }
}

/// A device that behaves like its [`DriveModel`]: each operation waits for
/// the modelled drive's service time, then runs on the inner device.
pub struct ModelDevice {
    inner: Arc<dyn BlockDevice>,
    env: Arc<dyn Env>,
    model: DriveModel,
    drive: Arc<Mutex<Drive>>,
}

impl ModelDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, model: DriveModel, env: Arc<dyn Env>) -> Self {
        let drive = Drive::new(&model, inner.size_bytes());
        ModelDevice {
            inner,
            env,
            model,
            drive: Arc::new(Mutex::new(drive)),
        }
    }

    /// The same device with its spindle at `phase` (a fraction of a turn)
    /// at time 0; see [`Drive::set_phase`].
    pub fn with_phase(self, phase: f64) -> Self {
        self.drive
            .lock()
            .expect("drive model lock")
            .set_phase(phase);
        self
    }

    pub fn model(&self) -> &DriveModel {
        &self.model
    }

    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Submit now (the drive's clock starts at the call) and complete when
    /// both the modelled drive and the inner device are done.
    fn timed<T: Send + 'static>(
        &self,
        op: Op,
        run: impl FnOnce() -> BoxFuture<T> + Send + 'static,
    ) -> BoxFuture<T> {
        let env = Arc::clone(&self.env);
        let drive = Arc::clone(&self.drive);
        let (ticket, first) = drive
            .lock()
            .expect("drive model lock")
            .submit(env.now_ns(), op);
        // The inner device works while the model's clock runs: the request
        // completes when both are done, so modelled time is not added on top
        // of the backing device's own time (which a real drive would not
        // have) unless the backing device is the slower of the two.
        let real = run();
        let modelled = async move {
            let mut guard = CancelGuard {
                drive: &drive,
                ticket: Some(ticket),
            };
            let mut progress = first;
            loop {
                match progress {
                    Progress::DoneAt(done) => {
                        guard.ticket = None;
                        let now = env.now_ns();
                        if done > now {
                            env.sleep(done - now).await;
                        }
                        break;
                    }
                    Progress::AskAt(at) => {
                        let now = env.now_ns();
                        if at > now {
                            env.sleep(at - now).await;
                        }
                        let now = env.now_ns();
                        progress = drive
                            .lock()
                            .expect("drive model lock")
                            .poll(now, ticket, op);
                    }
                }
            }
        };
        Box::pin(async move { futures::join!(modelled, real).1 })
    }
}

/// Drops a queued request if its waiter goes away.
struct CancelGuard<'a> {
    drive: &'a Mutex<Drive>,
    ticket: Option<Ticket>,
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            if let Ok(mut drive) = self.drive.lock() {
                drive.cancel(ticket);
            }
        }
    }
}

impl BlockDevice for ModelDevice {
    // `allocates_on_first_write` is the backing file's answer: allocating
    // it is a cost the model does not hide.
    crate::forward_device_answers!(inner: name, size_bytes, alignment, allocates_on_first_write);

    /// The modelled drive's answer, not the backing file's: an SSD with a
    /// protected write buffer, or a drive without a write cache.
    fn cheap_fua(&self) -> bool {
        match &self.model.kind {
            ModelKind::Ssd(p) => p.write_buffer_bytes > 0,
            ModelKind::Hdd(p) => p.write_cache_bytes == 0,
        }
    }

    /// The modelled drive's kind, not the backing file's.
    fn rotational(&self) -> Option<bool> {
        Some(self.model.is_hdd())
    }

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        let inner = Arc::clone(&self.inner);
        let length = buf.len() as u64;
        self.timed(Op::Read { offset, length }, move || inner.read(offset, buf))
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        let inner = Arc::clone(&self.inner);
        let length = data.len() as u64;
        self.timed(
            Op::Write {
                offset,
                length,
                fua,
            },
            move || inner.write(offset, data, fua),
        )
    }

    /// Costs a write of the range, capped at 1 MiB: drives that zero a
    /// range do it without a host transfer.
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        let inner = Arc::clone(&self.inner);
        self.timed(
            Op::Write {
                offset,
                length: length.min(1 << 20),
                fua,
            },
            move || inner.write_zeroes(offset, length, fua),
        )
    }

    fn flush(&self) -> BoxFuture<IoResult<()>> {
        let inner = Arc::clone(&self.inner);
        self.timed(Op::Flush, move || inner.flush())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// Run `ops` one at a time (queue depth 1) and return each service time.
    fn serial(drive: &mut Drive, ops: &[Op]) -> Vec<u64> {
        let mut now = 1;
        let mut times = Vec::new();
        for &op in ops {
            let (ticket, mut progress) = drive.submit(now, op);
            let done = loop {
                match progress {
                    Progress::DoneAt(done) => break done,
                    Progress::AskAt(at) => progress = drive.poll(at, ticket, op),
                }
            };
            times.push(done - now);
            now = done;
        }
        times
    }

    fn random_reads(count: usize, length: u64, size: u64) -> Vec<Op> {
        let mut random = crate::random::SplitMix64::new(1);
        (0..count)
            .map(|_| Op::Read {
                offset: random.below(size / length) * length,
                length,
            })
            .collect()
    }

    fn mean_ms(times: &[u64]) -> f64 {
        times.iter().sum::<u64>() as f64 / times.len() as f64 / 1e6
    }

    #[test]
    fn hdd_10k_random_8k_reads_take_4_to_12_ms() {
        let model = DriveModel::parse("hdd-10k").unwrap();
        let mut drive = Drive::new(&model, 100 * GIB);
        let times = serial(&mut drive, &random_reads(500, 8192, 100 * GIB));
        let mean = mean_ms(&times);
        assert!((4.0..=12.0).contains(&mean), "mean {mean} ms");
        assert!(
            times.iter().all(|&t| t < 14_000_000),
            "a read took over 14 ms"
        );
    }

    #[test]
    fn hdd_7k_is_slower_than_hdd_10k_on_random_reads() {
        let ops = random_reads(300, 8192, 100 * GIB);
        let fast = mean_ms(&serial(
            &mut Drive::new(&DriveModel::parse("hdd-10k").unwrap(), 100 * GIB),
            &ops,
        ));
        let slow = mean_ms(&serial(
            &mut Drive::new(&DriveModel::parse("hdd-7k").unwrap(), 100 * GIB),
            &ops,
        ));
        assert!((8.0..=20.0).contains(&slow), "hdd-7k mean {slow} ms");
        assert!(slow > fast * 1.4, "hdd-7k {slow} ms vs hdd-10k {fast} ms");
    }

    #[test]
    fn hdd_sequential_streams_at_the_media_rate() {
        let model = DriveModel::parse("hdd-10k").unwrap();
        let mut drive = Drive::new(&model, 100 * GIB);
        let ops: Vec<Op> = (0..256)
            .map(|i| Op::Read {
                offset: i << 20,
                length: 1 << 20,
            })
            .collect();
        let times = serial(&mut drive, &ops);
        let seconds = times.iter().sum::<u64>() as f64 / 1e9;
        let mb_s = 256.0 * (1 << 20) as f64 / 1e6 / seconds;
        // Outer zone: near 204 MB/s, less the per-command overhead.
        assert!((170.0..=205.0).contains(&mb_s), "{mb_s} MB/s");
        let random = serial(&mut drive, &random_reads(64, 1 << 20, 100 * GIB));
        assert!(random.iter().sum::<u64>() > times.iter().sum::<u64>() / 4);
        assert!(mean_ms(&random) > mean_ms(&times[1..]));
    }

    #[test]
    fn hdd_skips_a_unit_ahead_without_a_seek_or_a_lost_turn() {
        // One column of a single-parity stream over 7 disks: six 64 KiB data
        // units read in order, then the parity unit skipped.
        const UNIT: u64 = 64 << 10;
        let model = DriveModel::parse("hdd-10k").unwrap();
        let mut drive = Drive::new(&model, 100 * GIB);
        let ops: Vec<Op> = (0..700u64)
            .filter(|unit| unit % 7 != 6)
            .map(|unit| Op::Read {
                offset: unit * UNIT,
                length: UNIT,
            })
            .collect();
        let times = serial(&mut drive, &ops);
        let seconds = times.iter().sum::<u64>() as f64 / 1e9;
        let mb_s = (ops.len() as u64 * UNIT) as f64 / 1e6 / seconds;
        // The skipped unit costs its pass under the head (1/7 of the media
        // rate, about 204 MB/s outside), not a seek and most of a turn
        // (which gave about 50 MB/s).
        assert!((140.0..=180.0).contains(&mb_s), "{mb_s} MB/s");
        // A unit further than a track ahead is a seek and a rotational wait.
        let far = serial(
            &mut drive,
            &[Op::Read {
                offset: 700 * UNIT + (8 << 20),
                length: UNIT,
            }],
        );
        assert!(far[0] > 1_000_000, "{} ns", far[0]);
    }

    #[test]
    fn hdd_spindles_turn_out_of_phase() {
        // The same request on two idle drives: the sector comes round at a
        // different instant unless their phases match.
        let model = DriveModel::parse("hdd-10k").unwrap();
        let read = Op::Read {
            offset: 40 * GIB,
            length: 8192,
        };
        let wait = |phase: f64| {
            let mut drive = Drive::new(&model, 100 * GIB);
            drive.set_phase(phase);
            serial(&mut drive, &[read])[0]
        };
        let turn = 6_000_000; // 10,000 rpm
        assert_eq!(wait(0.25), wait(1.25), "only the fraction counts");
        let apart = wait(0.0).abs_diff(wait(0.5));
        assert!(apart.abs_diff(turn / 2) < turn / 50, "{apart} ns apart");
    }

    #[test]
    fn hdd_inner_zone_is_slower_than_outer() {
        let model = DriveModel::parse("hdd-10k").unwrap();
        let mut drive = Drive::new(&model, 100 * GIB);
        let stream = |base: u64| -> Vec<Op> {
            (0..64)
                .map(|i| Op::Read {
                    offset: base + (i << 20),
                    length: 1 << 20,
                })
                .collect()
        };
        let outer: u64 = serial(&mut drive, &stream(0))[1..].iter().sum();
        let inner: u64 = serial(&mut drive, &stream(99 * GIB))[1..].iter().sum();
        assert!(
            inner as f64 > outer as f64 * 1.4,
            "inner {inner} outer {outer}"
        );
    }

    /// With many requests queued the drive reorders them: the same random
    /// reads finish sooner in total than one at a time.
    #[test]
    fn hdd_queueing_raises_random_throughput() {
        let model = DriveModel::parse("hdd-10k").unwrap();
        let ops = random_reads(512, 8192, 100 * GIB);
        let serial_ns: u64 = serial(&mut Drive::new(&model, 100 * GIB), &ops)
            .iter()
            .sum();
        let mut drive = Drive::new(&model, 100 * GIB);
        let depth = 32;
        let mut now = 0u64;
        let mut in_flight: Vec<(Ticket, Op, Progress)> = Vec::new();
        let mut issued = 0;
        let mut finished = 0;
        while finished < ops.len() {
            while in_flight.len() < depth && issued < ops.len() {
                let (ticket, progress) = drive.submit(now, ops[issued]);
                in_flight.push((ticket, ops[issued], progress));
                issued += 1;
            }
            // Advance to the earliest event.
            let next_event = in_flight
                .iter()
                .map(|(_, _, p)| match p {
                    Progress::DoneAt(t) | Progress::AskAt(t) => *t,
                })
                .min()
                .unwrap();
            now = now.max(next_event);
            let mut still = Vec::new();
            for (ticket, op, progress) in in_flight.drain(..) {
                match progress {
                    Progress::DoneAt(t) if t <= now => finished += 1,
                    Progress::AskAt(t) if t <= now => {
                        still.push((ticket, op, drive.poll(now, ticket, op)))
                    }
                    other => still.push((ticket, op, other)),
                }
            }
            in_flight = still;
        }
        let speedup = serial_ns as f64 / now as f64;
        assert!(speedup > 1.8, "queue depth {depth} speedup {speedup}");
    }

    #[test]
    fn hdd_write_cache_absorbs_writes_until_flush() {
        let model = DriveModel::parse("hdd-10k").unwrap();
        let mut drive = Drive::new(&model, 100 * GIB);
        let (_, progress) = drive.submit(
            0,
            Op::Write {
                offset: 50 * GIB,
                length: 4096,
                fua: false,
            },
        );
        // Cached: done after the interface transfer, well under a millisecond.
        assert!(
            matches!(progress, Progress::DoneAt(t) if t < 200_000),
            "{progress:?}"
        );
        // The flush waits for the media.
        let op = Op::Flush;
        let (ticket, mut progress) = drive.submit(100_000, op);
        let done = loop {
            match progress {
                Progress::DoneAt(t) => break t,
                Progress::AskAt(t) => progress = drive.poll(t, ticket, op),
            }
        };
        assert!(done > 1_000_000, "flush done at {done} ns");
        // Without the cache, every write pays the media.
        let mut uncached = Drive::new(&DriveModel::parse("hdd-10k,wcache=0").unwrap(), 100 * GIB);
        let times = serial(
            &mut uncached,
            &[Op::Write {
                offset: 50 * GIB,
                length: 4096,
                fua: false,
            }],
        );
        assert!(times[0] > 1_000_000);
    }

    #[test]
    fn ssd_parallelism_has_a_queue_depth_knee_and_a_link_limit() {
        let model = DriveModel::parse("ssd-sata").unwrap();
        let iops = |depth: u64| {
            let mut drive = Drive::new(&model, 100 * GIB);
            let mut last = 0;
            // `depth` submissions at each instant, for 100 rounds.
            let mut now = 0;
            for _ in 0..100 {
                let mut round_end = now;
                for i in 0..depth {
                    let (_, progress) = drive.submit(
                        now,
                        Op::Read {
                            offset: i * 4096,
                            length: 4096,
                        },
                    );
                    let Progress::DoneAt(done) = progress else {
                        panic!()
                    };
                    round_end = round_end.max(done);
                }
                now = round_end;
                last = now;
            }
            (100 * depth) as f64 / (last as f64 / 1e9)
        };
        let qd1 = iops(1);
        let qd8 = iops(8);
        let qd32 = iops(32);
        assert!((8_000.0..=15_000.0).contains(&qd1), "QD1 {qd1} IO/s");
        assert!(qd8 > qd1 * 6.0, "QD8 {qd8} vs QD1 {qd1}");
        assert!(
            qd32 < qd8 * 1.2,
            "no gain past the knee: QD32 {qd32} vs QD8 {qd8}"
        );
        // Large reads are capped by the link.
        let mut drive = Drive::new(&model, 100 * GIB);
        let mut done = 0;
        for i in 0..100u64 {
            let (_, progress) = drive.submit(
                0,
                Op::Read {
                    offset: i << 20,
                    length: 1 << 20,
                },
            );
            if let Progress::DoneAt(t) = progress {
                done = done.max(t);
            }
        }
        let mb_s = 100.0 * (1 << 20) as f64 / 1e6 / (done as f64 / 1e9);
        assert!((500.0..=560.0).contains(&mb_s), "{mb_s} MB/s");
    }

    #[test]
    fn ssd_writes_complete_from_the_protected_buffer_until_it_fills() {
        let model = DriveModel::parse("ssd-sata").unwrap();
        let write = |i: u64| Op::Write {
            offset: i * 4096,
            length: 4096,
            fua: true,
        };
        // One at a time: the datasheet's QD1 write latency, not a program.
        let mut drive = Drive::new(&model, 100 * GIB);
        let ops: Vec<Op> = (0..1000).map(write).collect();
        let times = serial(&mut drive, &ops);
        let mean_us = mean_ms(&times) * 1e3;
        assert!((30.0..=50.0).contains(&mean_us), "QD1 write {mean_us} µs");
        // And a flush after them waits for nothing but itself.
        let now = times.iter().sum::<u64>() + 1;
        let (_, Progress::DoneAt(flushed)) = drive.submit(now, Op::Flush) else {
            panic!()
        };
        assert!(flushed - now <= 60_000, "flush took {} ns", flushed - now);

        // 32 at a time for long enough to fill the buffer: the units' rate.
        let mut drive = Drive::new(&model, 100 * GIB);
        let (mut now, mut i) = (0, 0);
        let mut first_round = 0;
        for round in 0..2_000 {
            let mut round_end = now;
            for _ in 0..32 {
                let (_, Progress::DoneAt(done)) = drive.submit(now, write(i)) else {
                    panic!()
                };
                i += 1;
                round_end = round_end.max(done);
            }
            if round == 0 {
                first_round = round_end - now;
            }
            now = round_end;
        }
        let iops = i as f64 / (now as f64 / 1e9);
        assert!(
            (28_000.0..=34_000.0).contains(&iops),
            "sustained {iops} IO/s"
        );
        assert!(
            first_round < 400_000,
            "first 32 writes took {first_round} ns"
        );

        // Without a buffer a write waits for its program.
        let model = DriveModel::parse("ssd-sata,wbuf=0").unwrap();
        let mut drive = Drive::new(&model, 100 * GIB);
        let times = serial(&mut drive, &ops[..100]);
        assert!(mean_ms(&times) * 1e3 >= 250.0);
    }

    #[test]
    fn specs_parse_override_and_refuse_clearly() {
        let model = DriveModel::parse("hdd-7k,wcache=0,qd=1").unwrap();
        let ModelKind::Hdd(params) = &model.kind else {
            panic!()
        };
        assert_eq!((params.write_cache_bytes, params.queue_depth), (0, 1));
        assert!(DriveModel::parse("nvme,units=4").is_ok());
        let unknown = DriveModel::parse("floppy").unwrap_err().to_string();
        assert!(unknown.contains("hdd-10k"), "{unknown}");
        let key = DriveModel::parse("ssd-sata,rpm=5400")
            .unwrap_err()
            .to_string();
        assert!(key.contains("units"), "{key}");
        assert!(DriveModel::parse("hdd-10k,rpm=0").is_err());
        assert!(DriveModel::parse("hdd-10k,qd").is_err());
    }

    #[test]
    fn model_device_delays_and_passes_data_through() {
        use crate::memory::MemoryDevice;
        let inner: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new("m", 64 << 20));
        let env: Arc<dyn Env> = Arc::new(crate::SystemEnv::new());
        let device = ModelDevice::new(
            inner,
            DriveModel::parse("hdd-10k,wcache=0").unwrap(),
            Arc::clone(&env),
        );
        futures::executor::block_on(async {
            let data = Bytes::from(vec![7u8; 8192]);
            let start = env.now_ns();
            device.write(32 << 20, data.clone(), false).await.unwrap();
            let (buf, result) = device.read(4 << 20, BytesMut::zeroed(8192)).await;
            result.unwrap();
            assert!(buf.iter().all(|&b| b == 0));
            let (buf, result) = device.read(32 << 20, BytesMut::zeroed(8192)).await;
            result.unwrap();
            assert_eq!(&buf[..], &data[..]);
            device.flush().await.unwrap();
            // Three media accesses with seeks: several milliseconds.
            assert!(env.now_ns() - start > 3_000_000);
        });
    }

    /// `depth` requests in flight, each completion issuing the next, over a
    /// stream that arrives out of order (as concurrent submission paths
    /// deliver one); gives MB/s.
    fn scrambled_stream(drive: &mut Drive, write: bool, depth: usize, count: u64) -> f64 {
        const LENGTH: u64 = 64 << 10;
        let op = |index: u64| {
            // Every group of eight arrives reversed.
            let offset = (index ^ 7) * LENGTH;
            if write {
                Op::Write {
                    offset,
                    length: LENGTH,
                    fua: false,
                }
            } else {
                Op::Read {
                    offset,
                    length: LENGTH,
                }
            }
        };
        let mut now = 1;
        let mut issued = 0;
        let mut flight: Vec<(Ticket, Op, Progress)> = Vec::new();
        while issued < depth as u64 {
            let (ticket, progress) = drive.submit(now, op(issued));
            flight.push((ticket, op(issued), progress));
            issued += 1;
        }
        let mut done = 0;
        while done < count {
            let (slot, at) = flight
                .iter()
                .enumerate()
                .map(|(slot, (_, _, progress))| match progress {
                    Progress::DoneAt(at) | Progress::AskAt(at) => (slot, *at),
                })
                .min_by_key(|&(_, at)| at)
                .expect("requests in flight");
            now = now.max(at);
            let (ticket, request, progress) = flight[slot];
            flight[slot] = match progress {
                Progress::DoneAt(_) => {
                    done += 1;
                    issued += 1;
                    let (ticket, progress) = drive.submit(now, op(issued));
                    (ticket, op(issued), progress)
                }
                Progress::AskAt(_) => (ticket, request, drive.poll(now, ticket, request)),
            };
        }
        (done * LENGTH) as f64 / (now as f64 / 1e9) / 1e6
    }

    #[test]
    fn hdd_streams_that_arrive_slightly_out_of_order_keep_the_media_rate() {
        let model = DriveModel::parse("hdd-10k").unwrap();
        // Reads need the next request queued when the head gets there, so
        // only deeper queues than the scramble keep reads streaming; the
        // write cache holds the whole backlog, so writes do at any depth.
        for (write, depth) in [
            (false, 32),
            (false, 128),
            (true, 8),
            (true, 32),
            (true, 128),
        ] {
            // 4,000 × 64 KiB: four times the write cache, so the backlog
            // outlives the starvation limit.
            let mut drive = Drive::new(&model, 16 * GIB);
            let mb_s = scrambled_stream(&mut drive, write, depth, 4000);
            assert!(mb_s >= 150.0, "write {write} depth {depth}: {mb_s} MB/s");
        }
    }
}
