//! Silent faults: disks that return wrong data without an error.
//!
//! A run may name some of its capacity disks faulty. While the clients
//! run, one of them now and then takes a fault the engine is not told of:
//!
//! * a **bit flip**: a byte of a slab of the space (its data or its sums)
//!   changes in the memory under the disk, behind the engine and its
//!   volatile cache;
//! * a **lost write**: the disk acknowledges its next writes and never
//!   makes them;
//! * a **misdirected write**: the disk's next write lands elsewhere in its
//!   data area, on whatever slab is there;
//! * an **unreadable sector** (not silent, but as sudden): 4 KiB of a slab
//!   of the space fail every read until a write covers them; the engine
//!   must rebuild the bytes, rewrite them and keep the disk in service.
//!
//! Lost and misdirected writes keep to the data area (`SimDisks` sets the
//! fault devices' window), so labels and metadata slots are never hit.
//!
//! Within tolerance (faulty disks, counting the disks the run loses, at
//! most what the layout survives) every read must return the model's data
//! and a scrub at the end must repair every fault. Beyond it (a smaller
//! share of runs, and any run of a layout that tolerates nothing), a read
//! may fail but must never return wrong data; there a run arms lost or
//! misdirected writes once at most (flips and unreadable sectors take the
//! other faults): two writes lost from the one copy left — a block's and
//! then its sums page's — leave both old and agreeing, which no sum kept
//! on those same disks can tell from current data.

use std::cell::Cell;
use std::rc::Rc;

use terrace_engine::layout::Layout;
use terrace_engine::meta::format::{data_offset, METADATA_SLOT_MIN_BYTES};
use terrace_engine::meta::{ExtentRecord, SpaceRole};
use terrace_engine::Pool;

use crate::disks::{SimDisks, SLAB_BYTES};
use crate::executor::Executor;
use crate::random::Random;

/// The silent faults of one run, drawn from its seed.
#[derive(Debug, Clone, Default)]
pub struct SilentPlan {
    /// Capacity disks that take silent faults.
    pub disks: Vec<usize>,
    /// How many faults to inject over the run.
    pub faults: usize,
    /// More disks are faulty than the layout survives (with those lost):
    /// reads may fail, never return wrong data.
    pub beyond: bool,
}

/// Most faults a run injects: enough that several land on blocks the
/// clients read again, few enough that the run still mostly checks data.
const FAULTS_MAX: u64 = 12;

impl SilentPlan {
    /// A run of `layout` on `disks` capacity disks that loses `losses` of
    /// them: half the redundant runs with room left take faults within
    /// tolerance, one run in eight takes them on more disks than survive.
    pub fn draw(random: &mut Random, layout: Layout, disks: usize, losses: usize) -> SilentPlan {
        let room = (layout.failures_tolerated() as usize).saturating_sub(losses);
        let (count, beyond) = if random.chance(1, 8) {
            (room + 1 + random.below(2) as usize, true)
        } else if room > 0 && random.chance(1, 2) {
            (1 + random.below(room as u64) as usize, false)
        } else {
            return SilentPlan::default();
        };
        let mut faulty = Vec::new();
        while faulty.len() < count.min(disks) {
            let disk = random.below(disks as u64) as usize;
            if !faulty.contains(&disk) {
                faulty.push(disk);
            }
        }
        SilentPlan {
            disks: faulty,
            faults: 1 + random.below(FAULTS_MAX) as usize,
            beyond,
        }
    }

    pub fn any(&self) -> bool {
        !self.disks.is_empty()
    }
}

/// What the faults did and what the engine found, over a run.
#[derive(Debug, Default, Clone, Copy)]
pub struct SilentCounts {
    pub flips: u64,
    pub lost_writes: u64,
    pub misdirected_writes: u64,
    /// Sectors made unreadable, and those the engine rewrote by the end.
    pub bad_sectors: u64,
    pub bad_sectors_rewritten: u64,
    /// Blocks the disks counted as failing their sums (each rebuilt).
    pub checksum_errors: u64,
    /// Blocks the scrub at the end found failing their sums.
    pub scrubbed_blocks: u64,
    /// Reads that failed (beyond tolerance only).
    pub failed_reads: u64,
    /// Writes that failed (beyond tolerance only).
    pub failed_writes: u64,
}

impl SilentCounts {
    pub fn injected(&self) -> u64 {
        self.flips + self.lost_writes + self.misdirected_writes + self.bad_sectors
    }

    pub fn found(&self) -> u64 {
        self.checksum_errors + self.scrubbed_blocks + self.bad_sectors_rewritten
    }

    pub fn add(&mut self, other: &SilentCounts) {
        self.flips += other.flips;
        self.lost_writes += other.lost_writes;
        self.misdirected_writes += other.misdirected_writes;
        self.bad_sectors += other.bad_sectors;
        self.bad_sectors_rewritten += other.bad_sectors_rewritten;
        self.checksum_errors += other.checksum_errors;
        self.scrubbed_blocks += other.scrubbed_blocks;
        self.failed_reads += other.failed_reads;
        self.failed_writes += other.failed_writes;
    }
}

/// Inject one silent fault on one of `plan`'s disks now: a flip or an
/// unreadable sector (made by a task that asks the pool where the space's
/// slabs are), or lost or misdirected writes armed on the disk.
pub fn inject(
    executor: &mut Executor,
    pool: &Rc<Pool>,
    sim: &SimDisks,
    plan: &SilentPlan,
    random: &mut Random,
    flips: &Rc<Cell<u64>>,
    writes_armed: &mut u64,
) {
    let disk = plan.disks[random.below(plan.disks.len() as u64) as usize];
    let fault = &sim.faults[disk];
    let mut kind = random.below(4);
    if kind % 2 == 1 {
        if plan.beyond && *writes_armed > 0 {
            kind = 0;
        } else {
            *writes_armed += 1;
        }
    }
    if std::env::var_os("TERRACE_SIM_TRACE").is_some() {
        eprintln!("silent fault kind {kind} on disk {disk}");
    }
    match kind {
        0 => {
            let (pool, memory, flips) = (pool.clone(), sim.memory[disk].clone(), flips.clone());
            let (slab_pick, offset, mask) = (
                random.next_u64(),
                random.below(SLAB_BYTES),
                1 + random.below(255) as u8,
            );
            executor.spawn(async move {
                if let Some(at) = space_byte(&pool, disk, slab_pick, offset).await {
                    let byte = memory.read_sync(at, 1)[0];
                    memory.write_sync(at, &[byte ^ mask]);
                    flips.set(flips.get() + 1);
                }
            });
        }
        1 => fault.lose_writes(1 + random.below(3)),
        2 => {
            let (pool, fault) = (pool.clone(), fault.clone());
            let (slab_pick, offset) = (random.next_u64(), random.below(SLAB_BYTES) & !4095);
            executor.spawn(async move {
                if let Some(at) = space_byte(&pool, disk, slab_pick, offset).await {
                    fault.bad_sector(at..at + 4096);
                }
            });
        }
        _ => {
            // Whole sectors away, either way, within a few slabs.
            let sectors = 1 + random.below(4 * SLAB_BYTES / 512) as i64;
            let by = if random.chance(1, 2) {
                sectors
            } else {
                -sectors
            } * 512;
            fault.misdirect_writes(1, by);
        }
    }
}

/// The disk offset of byte `offset` of one of the slabs the space "sim" or
/// its sums hold on `disk` (`pick` chooses which); none if it holds none
/// there.
async fn space_byte(pool: &Pool, disk: usize, pick: u64, offset: u64) -> Option<u64> {
    let metadata = pool.metadata().await;
    let space = metadata.spaces.iter().find(|s| s.name == "sim")?;
    let slabs: Vec<u64> = metadata
        .spaces
        .iter()
        .filter(|s| s.id == space.id || s.role == SpaceRole::Sums { owner: space.id })
        .flat_map(|s| ExtentRecord::slabs_of(&s.extents))
        .filter(|slab| usize::from(slab.disk.0) == disk)
        .map(|slab| u64::from(slab.slab.0))
        .collect();
    if slabs.is_empty() {
        return None;
    }
    let slab = slabs[(pick % slabs.len() as u64) as usize];
    if std::env::var_os("TERRACE_SIM_TRACE").is_some() {
        eprintln!("fault on disk {disk} slab {slab} offset {offset}");
    }
    Some(data_offset(METADATA_SLOT_MIN_BYTES) + slab * SLAB_BYTES + offset)
}

/// What the fault devices of `plan`'s disks did (flips are counted apart).
pub fn device_counts(sim: &SimDisks, plan: &SilentPlan) -> SilentCounts {
    let mut counts = SilentCounts::default();
    for &disk in &plan.disks {
        let counters = sim.faults[disk].counters();
        counts.lost_writes += counters.lost_writes;
        counts.misdirected_writes += counters.misdirected_writes;
        counts.bad_sectors += counters.bad_sectors;
        counts.bad_sectors_rewritten += counters.remapped_sectors;
    }
    counts
}

/// Blocks the pool's disks counted as failing their sums since it opened.
pub async fn checksum_errors(pool: &Pool) -> u64 {
    let status = pool.status().await;
    status.disks.iter().map(|disk| disk.errors.checksum).sum()
}
