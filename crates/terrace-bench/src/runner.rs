//! One point of a sweep: one target, one profile, one number of
//! outstanding I/Os.
//!
//! # Requests in flight
//!
//! All requests of a point are futures in one `FuturesUnordered`, polled by
//! the caller's task. The run starts `outstanding` of them; each time one
//! completes, the next is issued in the same poll, so exactly `outstanding`
//! are in flight from the first issue until the measured interval ends
//! (then the last ones drain without being counted). There is no per-slot
//! task and no channel: on a single-threaded runtime a completion costs one
//! wake-up of this task.
//!
//! # Offsets
//!
//! The working set is the first `working_set_bytes` of the target (all of
//! it by default), cut into whole blocks. Random access draws a block
//! uniformly from a generator seeded with [`RunOptions::seed`].
//! Sequential access is [`SequentialMode::Shared`] by default: one cursor,
//! each new request takes the next block, wrapping at the end, so the
//! target sees one stream `outstanding` requests deep, as Iometer's and
//! fio's sequential jobs issue it. [`SequentialMode::PerSlot`] gives each
//! in-flight slot its own equal region and cursor instead: `outstanding`
//! independent streams, a harder case for read-ahead.
//!
//! # The measured interval
//!
//! Warm-up ends at the first completion after `warmup` has passed; the
//! measured interval runs from there until the first completion after
//! `duration` more. Only completions inside it count towards I/Os, bytes,
//! latency and the interval's length; the CPU time of the whole machine is
//! sampled at both ends.

use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use terrace_io::{aligned_buffer, Bytes};

use crate::cpu::{self, CpuSample};
use crate::histogram::Histogram;
use crate::profile::{Access, Profile};
use crate::report::Point;
use crate::target::{Target, TargetError};
use crate::BenchError;
use terrace_io::random::SplitMix64;

/// Random data that writes take their payloads from: 8 MiB, so that
/// consecutive writes carry different bytes (no deduplication or
/// compression can help) without generating data per request.
pub const WRITE_POOL_BYTES: usize = 8 << 20;
/// Write payloads start at multiples of 4 KiB of the pool, so that they
/// suit O_DIRECT without a bounce copy.
const WRITE_POOL_ALIGNMENT: u64 = terrace_io::DIRECT_IO_ALIGNMENT as u64;
/// A point fails when no request completes for this long: far beyond any
/// healthy device's latency, short enough that a dead server is reported.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default generator seed (any fixed value makes runs repeatable).
pub const DEFAULT_SEED: u64 = 0x7e77_ace0_bec4_0001;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SequentialMode {
    /// One cursor shared by all requests: one stream, N deep.
    #[default]
    Shared,
    /// One region and cursor per in-flight slot: N streams.
    PerSlot,
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub outstanding: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// `None`: the whole target.
    pub working_set_bytes: Option<u64>,
    pub seed: u64,
    pub sequential: SequentialMode,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            outstanding: 1,
            warmup: Duration::from_secs(2),
            duration: Duration::from_secs(5),
            working_set_bytes: None,
            seed: DEFAULT_SEED,
            sequential: SequentialMode::Shared,
        }
    }
}

/// The working set of `target` for blocks of `granule` bytes: the wanted
/// size (or the whole target) rounded down to whole granules.
pub fn working_set(
    target: &dyn Target,
    wanted: Option<u64>,
    granule: u64,
) -> Result<u64, BenchError> {
    let size = target.size_bytes();
    let fail = |reason: String| BenchError::WorkingSet {
        target: target.name().to_string(),
        reason,
    };
    let wanted = wanted.unwrap_or(size);
    if wanted > size {
        return Err(fail(format!(
            "the working set of {wanted} bytes is larger than the target ({size} bytes)"
        )));
    }
    let alignment = target.alignment().max(1);
    if !granule.is_multiple_of(alignment) {
        return Err(fail(format!(
            "blocks of {granule} bytes are not a multiple of the target's alignment ({alignment} bytes)"
        )));
    }
    let rounded = wanted / granule * granule;
    if rounded == 0 {
        return Err(fail(format!(
            "the working set of {wanted} bytes holds no whole block of {granule} bytes"
        )));
    }
    Ok(rounded)
}

/// Where the next request goes.
struct Offsets {
    access: Access,
    mode: SequentialMode,
    block: u64,
    blocks: u64,
    /// Shared mode: the next block. Per-slot mode: each slot's next block.
    cursors: Vec<u64>,
    /// Per-slot mode: each slot's region, as (first block, blocks).
    regions: Vec<(u64, u64)>,
}

impl Offsets {
    fn new(access: Access, mode: SequentialMode, block: u64, blocks: u64, slots: usize) -> Self {
        let slots = slots as u64;
        // Equal regions; when there are more slots than blocks, regions of
        // one block overlap (every slot still streams).
        let regions: Vec<(u64, u64)> = (0..slots)
            .map(|slot| {
                let first = slot * blocks / slots;
                let end = (slot + 1) * blocks / slots;
                (first.min(blocks - 1), (end - first).max(1))
            })
            .collect();
        Offsets {
            access,
            mode,
            block,
            blocks,
            cursors: regions.iter().map(|&(first, _)| first).collect(),
            regions,
        }
    }

    fn next(&mut self, slot: usize, rng: &mut SplitMix64) -> u64 {
        let block = match (self.access, self.mode) {
            (Access::Random, _) => rng.below(self.blocks),
            (Access::Sequential, SequentialMode::Shared) => {
                let block = self.cursors[0];
                self.cursors[0] = (block + 1) % self.blocks;
                block
            }
            (Access::Sequential, SequentialMode::PerSlot) => {
                let (first, length) = self.regions[slot];
                let block = self.cursors[slot];
                self.cursors[slot] = first + (block + 1 - first) % length;
                block
            }
        };
        block * self.block
    }
}

/// Random write payloads, sliced without copying.
pub(crate) struct WritePool {
    data: Bytes,
    slots: u64,
}

impl WritePool {
    pub(crate) fn new(block: u64, rng: &mut SplitMix64) -> WritePool {
        let length = WRITE_POOL_BYTES + block as usize;
        let mut data = aligned_buffer(length);
        rng.fill(&mut data);
        WritePool {
            data: data.freeze(),
            slots: WRITE_POOL_BYTES as u64 / WRITE_POOL_ALIGNMENT,
        }
    }

    pub(crate) fn payload(&self, length: u64, rng: &mut SplitMix64) -> Bytes {
        let start = (rng.below(self.slots) * WRITE_POOL_ALIGNMENT) as usize;
        self.data.slice(start..start + length as usize)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// What completed requests add up to.
#[derive(Default)]
struct Tally {
    reads: u64,
    writes: u64,
    bytes: u64,
    latency: Histogram,
}

impl Tally {
    fn add(&mut self, kind: Kind, bytes: u64, latency: Duration) {
        match kind {
            Kind::Read => self.reads += 1,
            Kind::Write => self.writes += 1,
        }
        self.bytes += bytes;
        self.latency.record(latency.as_nanos() as u64);
    }
}

/// Everything needed to issue the next request.
struct Generator<'a> {
    target: &'a dyn Target,
    read_percent: u64,
    block: u64,
    offsets: Offsets,
    pool: WritePool,
    rng: SplitMix64,
}

type Completed = (usize, Kind, Instant, Result<(), TargetError>);

impl<'a> Generator<'a> {
    fn issue(&mut self, slot: usize) -> impl std::future::Future<Output = Completed> + Send + 'a {
        let offset = self.offsets.next(slot, &mut self.rng);
        let kind = if self.rng.below(100) < self.read_percent {
            Kind::Read
        } else {
            Kind::Write
        };
        let target = self.target;
        let block = self.block;
        let payload = (kind == Kind::Write).then(|| self.pool.payload(block, &mut self.rng));
        async move {
            let started = Instant::now();
            let result = match payload {
                None => target.read(offset, block as u32).await.map(drop),
                Some(data) => target.write(offset, data).await,
            };
            (slot, kind, started, result)
        }
    }
}

/// Measure one point. Errors from the target end the run.
pub async fn run_point(
    target: &dyn Target,
    profile: &Profile,
    options: &RunOptions,
) -> Result<Point, BenchError> {
    if options.outstanding == 0 {
        return Err(BenchError::Settings(
            "outstanding I/Os must be at least 1".into(),
        ));
    }
    let block = u64::from(profile.block_bytes);
    let working_set = working_set(target, options.working_set_bytes, block)?;
    let mut rng = SplitMix64::new(options.seed);
    let pool = WritePool::new(block, &mut rng);
    let offsets = Offsets::new(
        profile.access,
        options.sequential,
        block,
        working_set / block,
        options.outstanding,
    );
    let mut generator = Generator {
        target,
        read_percent: u64::from(profile.read_percent),
        block,
        offsets,
        pool,
        rng,
    };
    let measured = drive(&mut generator, options).await?;
    Ok(measured.point(profile, target, options.outstanding))
}

/// The measured interval's totals.
struct Measured {
    tally: Tally,
    seconds: f64,
    cpu_seconds: Option<f64>,
}

/// Fails a run that makes no progress for [`STALL_TIMEOUT`]. One timer for
/// the whole run, re-armed only when it fires, costs nothing per request.
struct Watchdog {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    completions: u64,
    armed_at: u64,
}

impl Watchdog {
    fn new() -> Watchdog {
        Watchdog {
            sleep: Box::pin(tokio::time::sleep(STALL_TIMEOUT)),
            completions: 0,
            armed_at: 0,
        }
    }

    /// The next completion; `None` when nothing completed in a whole
    /// period (so after between one and two [`STALL_TIMEOUT`]s of silence).
    async fn next<S: futures::Stream + Unpin>(&mut self, stream: &mut S) -> Option<S::Item> {
        loop {
            tokio::select! {
                biased;
                item = stream.next() => {
                    self.completions += 1;
                    return item;
                }
                () = &mut self.sleep => {
                    if self.completions == self.armed_at {
                        return None;
                    }
                    self.armed_at = self.completions;
                    let deadline = tokio::time::Instant::now() + STALL_TIMEOUT;
                    self.sleep.as_mut().reset(deadline);
                }
            }
        }
    }
}

/// Keep `outstanding` requests in flight through warm-up and the measured
/// interval, then drain.
async fn drive(
    generator: &mut Generator<'_>,
    options: &RunOptions,
) -> Result<Measured, BenchError> {
    let target = generator.target;
    let stalled = || BenchError::Stalled {
        target: target.name().to_string(),
        seconds: STALL_TIMEOUT.as_secs(),
    };
    let mut in_flight = FuturesUnordered::new();
    for slot in 0..options.outstanding {
        in_flight.push(generator.issue(slot));
    }
    let mut watchdog = Watchdog::new();
    let warmup_end = Instant::now() + options.warmup;
    let mut window: Option<(Instant, Option<CpuSample>)> = None;
    let mut tally = Tally::default();
    let mut failure = None;
    let ended = loop {
        let (slot, kind, started, result) =
            watchdog.next(&mut in_flight).await.ok_or_else(stalled)?;
        let now = Instant::now();
        if let Err(error) = result {
            failure = Some(error);
            break now;
        }
        match window {
            None if now >= warmup_end => window = Some((now, cpu::sample())),
            None => {}
            Some((start, _)) if now >= start + options.duration => break now,
            Some(_) => tally.add(kind, generator.block, now - started),
        }
        in_flight.push(generator.issue(slot));
    };
    let end_cpu = cpu::sample();
    // Let what is still in flight finish (uncounted): a request abandoned
    // half-sent would leave a connection in an unknown state.
    while !in_flight.is_empty() {
        let (_, _, _, result) = watchdog.next(&mut in_flight).await.ok_or_else(stalled)?;
        if let (None, Err(error)) = (&failure, result) {
            failure = Some(error);
        }
    }
    if let Some(error) = failure {
        return Err(BenchError::target(target, error));
    }
    let (start, start_cpu) = window.unwrap_or((ended, None));
    Ok(Measured {
        tally,
        seconds: (ended - start).as_secs_f64(),
        cpu_seconds: start_cpu.zip(end_cpu).map(|(a, b)| b.busy_since(&a)),
    })
}

impl Measured {
    fn point(&self, profile: &Profile, target: &dyn Target, outstanding: usize) -> Point {
        let ios = self.tally.reads + self.tally.writes;
        let seconds = self.seconds.max(f64::MIN_POSITIVE);
        let per_second = |count: u64| {
            if ios == 0 {
                0.0
            } else {
                count as f64 / seconds
            }
        };
        Point {
            profile: profile.name.clone(),
            target: target.name().to_string(),
            outstanding,
            ios,
            read_ios: self.tally.reads,
            write_ios: self.tally.writes,
            bytes: self.tally.bytes,
            seconds: self.seconds,
            mb_per_s: per_second(self.tally.bytes) / 1e6,
            iops: per_second(ios),
            latency_mean_us: self.tally.latency.mean() / 1e3,
            latency_p99_us: self.tally.latency.quantile(0.99) as f64 / 1e3,
            cpu_us_per_io: self
                .cpu_seconds
                .filter(|_| ios > 0)
                .map(|cpu| cpu * 1e6 / ios as f64),
            spread: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_sequential_offsets_follow_one_cursor_and_wrap() {
        let mut rng = SplitMix64::new(1);
        let mut offsets = Offsets::new(Access::Sequential, SequentialMode::Shared, 512, 4, 3);
        let seen: Vec<u64> = (0..6).map(|i| offsets.next(i % 3, &mut rng)).collect();
        assert_eq!(seen, [0, 512, 1024, 1536, 0, 512]);
    }

    #[test]
    fn per_slot_offsets_stay_in_their_regions() {
        let mut rng = SplitMix64::new(1);
        let mut offsets = Offsets::new(Access::Sequential, SequentialMode::PerSlot, 1, 10, 3);
        let slot1: Vec<u64> = (0..5).map(|_| offsets.next(1, &mut rng)).collect();
        assert_eq!(slot1, [3, 4, 5, 3, 4]);
        let slot2: Vec<u64> = (0..5).map(|_| offsets.next(2, &mut rng)).collect();
        assert_eq!(slot2, [6, 7, 8, 9, 6]);
        // More slots than blocks: every slot still has one block.
        let mut tiny = Offsets::new(Access::Sequential, SequentialMode::PerSlot, 1, 2, 4);
        assert!((0..4).all(|slot| tiny.next(slot, &mut rng) < 2));
    }
}
