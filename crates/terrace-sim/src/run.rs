//! One simulated run: a pool on simulated disks, clients writing, reading,
//! zeroing and flushing, disks lost within tolerance, power cut at seeded
//! points, and checkers after every recovery and at the end.
//!
//! Disk stack, top to bottom: fault injection (disk loss) → the world's gate
//! (completion order) → crash wrapper (volatile cache) → memory.
//!
//! Half the redundant runs give the space a write-back log on three journal
//! disks, with a ring of 1 or 2 MiB so that it wraps and fills (and
//! writers destage) within a run. Then every partial-row write is durable
//! when acknowledged, and the model holds the engine to that.
//!
//! A power cut while a parity space is degraded is simulated only when the
//! space has a log: without one, a partial-stripe update cut between its
//! data and parity writes corrupts the missing column (the write hole);
//! with one, every update of a degraded row is a whole row logged first.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use terrace_engine::io::fault::FaultControls;
use terrace_engine::io::{BlockDevice, Bytes, Env};
use terrace_engine::layout::Layout;
use terrace_engine::meta::format::METADATA_SLOT_MIN_BYTES;
use terrace_engine::meta::{store, DiskIndex, JobRecord, JobState};
use terrace_engine::{
    repair_space, verify_space, EngineError, ImportOptions, NewDisk, Pool, PoolConfig, ProblemKind,
    RedundancyReport, Space, SpaceConfig, SpaceSize,
};

use crate::disks::{SimDisks, SLAB_BYTES};
use crate::executor::{Executor, Stop};
use crate::model::{Model, BLOCK_BYTES, SECTOR_BYTES};
use crate::random::Random;
use crate::silent::{self, SilentCounts, SilentPlan};
use crate::world::{DiskTraits, World};

/// The shape of one run, all drawn from the seed.
#[derive(Debug, Clone)]
pub struct Plan {
    pub layout: Layout,
    pub disks: usize,
    pub slabs_per_disk: u64,
    pub interleave_bytes: u64,
    pub columns: Option<u32>,
    pub space_bytes: u64,
    pub clients: usize,
    pub chunk_blocks: u64,
    pub ops_per_client: usize,
    pub phases: usize,
    pub crash_in_phase: Vec<bool>,
    pub losses: usize,
    /// Write-back ring size, if the space has a log.
    pub cache_bytes: Option<u64>,
    /// The log gathers streams' partial rows into whole rows (and writes
    /// the whole rows of a mixed write straight to the disks). Without it
    /// every write that is not whole rows is logged, so durable when
    /// acknowledged, which the model then checks too.
    pub gather: bool,
    /// The disks say FUA is cheap on them, so the log writes every record
    /// with FUA instead of flushing behind them.
    pub cheap_fua: bool,
    /// The disks say their first writes allocate (as files do), so a new
    /// log's slabs are written ahead; otherwise its ring starts on
    /// whatever the slabs held.
    pub allocates: bool,
    /// The pool's log memory, if it is small enough that the log keeps
    /// records only on its disks (destaging and reads read them back).
    pub log_memory: Option<u64>,
    /// The pool's job runner runs beside the clients, as in the daemon:
    /// lost disks are repaired by the policy under the clients' writes and
    /// the power cuts, idle write intent is cleared, disks are probed.
    pub jobs: bool,
    /// Lost disks vanish instead of failing: the daemon notices a device
    /// gone and the pool has the disk missing, its writes recorded as
    /// missed. A vanished disk may come back: taken back while the clients
    /// write (`Pool::bring_back`), or found again at the import after a
    /// power cut.
    pub returns: bool,
    /// The pool starts without its journal disks, the log on capacity
    /// disks, and they are added while the clients write in this phase.
    /// With the job runner, the log then moves onto them.
    pub journals_later: Option<usize>,
    /// With the job runner: small spaces are created, read and deleted
    /// beside the clients (see `scratch_spaces`).
    pub scratch: bool,
    /// Lost disks fail (they do not vanish), and a failed disk's fault
    /// may pass: `Pool::clear` takes it back while the clients write.
    pub clears: bool,
    /// Disks that return wrong data without an error (`crate::silent`).
    pub silent: SilentPlan,
    /// The space (and the scratch spaces) are thin: each extent gets its
    /// slabs at its first write, under the clients, the losses and the
    /// power cuts.
    pub thin: bool,
}

/// Write every block of the space once, and flush: the blocks of a new
/// space are known zero in the run that created it, but a sums page never
/// written is blank ("not known") after an import, so damage to a block
/// never written would then read back unnoticed; runs with silent faults
/// start with every sum known.
fn prefill(run: &Run, space: &Arc<Space>) -> Result<(), String> {
    let mut executor = Executor::new(run.random.clone(), run.sim.world.clone());
    let (space, model) = (space.clone(), run.model.clone());
    executor.block_on(async move {
        let blocks = model.borrow().blocks();
        let mut start = 0;
        while start < blocks {
            let count = CHECK_BLOCKS.min(blocks - start);
            if let Err(
                Failed::Request(message) | Failed::WrongData(message) | Failed::NoRoom(message),
            ) = write(&space, &model, start, count, false, true).await
            {
                return Err(message);
            }
            start += count;
        }
        space
            .flush()
            .await
            .map_err(|e| format!("flush failed: {e}"))
    })
}

/// Journal disks of runs with a log, and their slabs (a 2 MiB ring needs 32).
const JOURNAL_DISKS: usize = 3;
const JOURNAL_SLABS: u64 = 36;

impl Plan {
    /// How many of `devices` disks the pool starts with: all, unless the
    /// journal disks (the last) join later. Only those may be lost.
    fn members_at_start(&self, devices: usize) -> usize {
        match self.journals_later {
            Some(_) => self.disks,
            None => devices,
        }
    }

    /// The plan of a run. Its later additions are drawn from `extras`, so
    /// that runs without them keep the trajectories they always had.
    pub fn draw(random: &mut Random, extras: &mut Random) -> Plan {
        let layouts = [
            Layout::Simple,
            Layout::Mirror { copies: 2 },
            Layout::Mirror { copies: 3 },
            Layout::Parity { redundancy: 1 },
            Layout::Parity { redundancy: 2 },
        ];
        let layout = layouts[random.below(layouts.len() as u64) as usize];
        let tolerance = layout.failures_tolerated() as usize;
        // At least 2 × tolerance + 1 disks, so losing `tolerance` keeps a
        // metadata majority at import.
        let floor = (layout.min_disks() as usize).max(2 * tolerance + 1);
        let disks = floor + random.below(7) as usize;
        let columns = if random.chance(1, 3) {
            let max = (disks as u32 / layout.copies()).min(8);
            Some(
                layout.min_columns()
                    + random.below(u64::from(max - layout.min_columns() + 1)) as u32,
            )
        } else {
            None
        };
        let phases = 1 + random.below(3) as usize;
        let mut plan = Plan {
            layout,
            disks,
            slabs_per_disk: 12 + random.below(8),
            interleave_bytes: 4096 << random.below(3),
            columns,
            space_bytes: (16 + random.below(48)) * 4096,
            clients: 1 + random.below(5) as usize,
            chunk_blocks: 1 + random.below(4),
            ops_per_client: 10 + random.below(30) as usize,
            phases,
            crash_in_phase: (0..phases).map(|_| random.chance(2, 3)).collect(),
            losses: random.below(tolerance as u64 + 1) as usize,
            cache_bytes: (tolerance > 0 && random.chance(1, 2))
                .then(|| (1 << 20) << random.below(2)),
            gather: random.chance(1, 2),
            cheap_fua: random.chance(1, 2),
            allocates: random.chance(1, 2),
            log_memory: random.chance(1, 2).then(|| random.below(3) * (64 << 10)),
            jobs: random.chance(1, 2),
            returns: false,
            journals_later: None,
            scratch: false,
            clears: false,
            silent: SilentPlan::default(),
            thin: false,
        };
        plan.returns = plan.losses > 0 && extras.chance(1, 2);
        plan.clears = plan.losses > 0 && !plan.returns && extras.chance(1, 2);
        // The log on capacity disks first: it must fit there beside the
        // data (a 1 MiB ring is 16 slabs a copy).
        let roomy = plan.disks as u64 * plan.slabs_per_disk >= 120;
        if plan.cache_bytes.is_some() && roomy && extras.chance(1, 3) {
            plan.cache_bytes = Some(1 << 20);
            plan.journals_later = Some(extras.below(phases as u64) as usize);
        }
        plan.scratch = plan.jobs && extras.chance(1, 2);
        plan
    }
}

/// What a run did, for the test's summary line.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Runs whose space had a write-back log, and bytes their logs destaged.
    pub cached_runs: usize,
    pub destaged_bytes: u64,
    pub crashes: usize,
    pub losses: usize,
    pub writes: u64,
    pub reads: u64,
    /// Repairs the job runner finished, and moves of any job it finished,
    /// as the metadata remembers them at the end.
    pub repairs: usize,
    pub moves: usize,
    /// Vanished disks taken back while the clients wrote, and found again
    /// at an import.
    pub returns: usize,
    pub returns_at_import: usize,
    /// Failed disks taken back by `Pool::clear` once their fault passed.
    pub cleared: usize,
    /// Runs whose journal disks were added while the clients wrote.
    pub journals_added: usize,
    /// Spaces created and read beside the clients (`Plan::scratch`).
    pub scratch_spaces: usize,
    /// Runs on a thin space, and their writes refused for want of room.
    pub thin_runs: usize,
    pub thin_refused: u64,
    /// Runs with silent faults, and those with them beyond tolerance.
    pub silent_runs: usize,
    pub beyond_runs: usize,
    pub silent: SilentCounts,
}

type Shared<T> = Rc<RefCell<T>>;

/// Everything one run carries between its phases.
struct Run {
    plan: Plan,
    random: Shared<Random>,
    sim: SimDisks,
    model: Shared<Model>,
    counters: Shared<Counters>,
    lost: Vec<usize>,
    /// Lost disks that vanished and have not come back.
    vanished: Vec<usize>,
    /// Lost disks that failed, whose fault has not passed (`Plan::clears`).
    failed: Vec<usize>,
    returns_at_import: usize,
    crashes: usize,
    /// Draws the silent faults' moments, apart from the run's generator so
    /// that runs without them keep their trajectories.
    silent_random: Random,
    silent_injected: usize,
    /// Lost or misdirected writes armed so far (see `silent`).
    silent_writes_armed: u64,
    flips: Rc<Cell<u64>>,
    /// Checksum errors the disks counted in pools since closed or cut.
    checksum_errors: u64,
}

/// Run one seed; `Err` carries what went wrong (the caller prints the seed).
pub fn run(seed: u64) -> Result<Report, String> {
    let mut random = Random::new(seed);
    let mut plan = Plan::draw(&mut random, &mut Random::new(seed ^ 0x5eed_e47a_5eed_e47a));
    let mut silent_random = Random::new(seed ^ 0x511e_4700_511e_4700);
    plan.silent = SilentPlan::draw(&mut silent_random, plan.layout, plan.disks, plan.losses);
    let mut thin_random = Random::new(seed ^ 0x7819_7819_7819_7819);
    plan.thin = thin_random.chance(1, 3);
    // Half the thin runs give each client whole extents, which it zeroes
    // whole at times: the extent is given back and taken again.
    let whole_extents = plan.thin && thin_random.chance(1, 2);
    let random = Rc::new(RefCell::new(random));
    let journals = if plan.cache_bytes.is_some() {
        JOURNAL_DISKS
    } else {
        0
    };
    let sim = SimDisks::with_journals(
        World::new(seed),
        plan.disks,
        plan.slabs_per_disk,
        journals,
        JOURNAL_SLABS,
        DiskTraits {
            cheap_fua: plan.cheap_fua,
            allocates: plan.allocates,
        },
    );
    let (pool, space) = setup(&sim, &plan, random.clone()).map_err(|e| format!("{plan:?}: {e}"))?;
    if whole_extents {
        plan.chunk_blocks = space.geometry().extent_data_bytes() / BLOCK_BYTES;
    }
    let mut run = Run {
        model: Rc::new(RefCell::new(Model::new(space.size_bytes() / BLOCK_BYTES))),
        counters: Rc::new(RefCell::new(Counters::default())),
        lost: Vec::new(),
        vanished: Vec::new(),
        failed: Vec::new(),
        returns_at_import: 0,
        crashes: 0,
        silent_random,
        silent_injected: 0,
        silent_writes_armed: 0,
        flips: Rc::new(Cell::new(0)),
        checksum_errors: 0,
        plan,
        random,
        sim,
    };
    if run.plan.silent.any() {
        prefill(&run, &space).map_err(|e| format!("{:?}: prefill: {e}", run.plan))?;
    }
    let (mut pool, mut space) = (pool, space);
    let mut destaged_bytes = 0;
    for phase in 0..run.plan.phases {
        let journal = space.journal();
        (pool, space) = run
            .phase(phase, pool, space)
            .map_err(|e| format!("{:?}: phase {phase}: {e}", run.plan))?;
        destaged_bytes += journal.map_or(0, |j| j.status().destaged_bytes);
    }
    let end = finish(&run, pool, space).map_err(|e| format!("{:?}: at the end: {e}", run.plan))?;
    let counters = run.counters.borrow();
    let mut silent = silent::device_counts(&run.sim, &run.plan.silent);
    silent.flips = run.flips.get();
    silent.checksum_errors = run.checksum_errors + end.checksum_errors;
    silent.scrubbed_blocks = end.scrubbed_blocks;
    silent.failed_reads = counters.failed_reads;
    silent.failed_writes = counters.failed_writes;
    Ok(Report {
        cached_runs: usize::from(run.plan.cache_bytes.is_some()),
        destaged_bytes,
        crashes: run.crashes,
        losses: run.lost.len(),
        writes: counters.writes,
        reads: counters.reads,
        repairs: end.repairs,
        moves: end.moves,
        returns: counters.returns,
        returns_at_import: run.returns_at_import,
        cleared: counters.cleared,
        journals_added: usize::from(counters.journals_added),
        scratch_spaces: counters.scratch_spaces,
        thin_runs: usize::from(run.plan.thin),
        thin_refused: counters.refused_for_room,
        silent_runs: usize::from(run.plan.silent.any()),
        beyond_runs: usize::from(run.plan.silent.beyond),
        silent,
    })
}

impl Run {
    fn is_parity(&self) -> bool {
        matches!(self.plan.layout, Layout::Parity { .. })
    }

    /// Clients run until done, or until the power is cut; disks may be lost
    /// on the way. Returns the pool to carry on with.
    fn phase(
        &mut self,
        phase: usize,
        pool: Pool,
        space: Arc<Space>,
    ) -> Result<(Pool, Arc<Space>), String> {
        // A degraded parity space without a log is never cut (the write
        // hole; see above), and then loses disks only once no cut can
        // follow. With a log it may be cut once the loss is known (a read
        // of everything at the start of the phase finds it), but a disk is
        // never lost in the phase that is cut: a disk that dies unnoticed
        // under an in-place parity update just before a power cut is the
        // one case the row images do not cover.
        let cached = self.plan.cache_bytes.is_some();
        let exposed = self.is_parity() && !cached;
        let crash_here = self.plan.crash_in_phase[phase] && (self.lost.is_empty() || !exposed);
        let cuts_follow = crash_here
            || self.plan.crash_in_phase[phase + 1..]
                .iter()
                .any(|&crash| crash);
        let may_lose = if exposed {
            !cuts_follow
        } else {
            !(self.is_parity() && crash_here)
        };
        if cached && self.is_parity() && !self.lost.is_empty() {
            let mut executor = Executor::new(self.random.clone(), self.sim.world.clone());
            let space = space.clone();
            executor.block_on(async move {
                let size = space.size_bytes();
                let mut offset = 0;
                while offset < size {
                    let length = (64 * BLOCK_BYTES).min(size - offset);
                    let _ = space.read(offset, length).await;
                    offset += length;
                }
            });
        }
        let mut executor = Executor::new(self.random.clone(), self.sim.world.clone());
        let pool = Rc::new(pool);
        let clients_left = Rc::new(std::cell::Cell::new(self.plan.clients));
        for client in 0..self.plan.clients {
            let (model, counters, random) = (
                self.model.clone(),
                self.counters.clone(),
                self.random.clone(),
            );
            let task = client_task(
                space.clone(),
                model,
                counters,
                random,
                self.plan.clone(),
                client,
            );
            let left = clients_left.clone();
            executor.spawn(async move {
                task.await;
                left.set(left.get() - 1);
            });
        }
        let journals_due = self
            .plan
            .journals_later
            .is_some_and(|first| phase >= first && !self.counters.borrow().journals_added);
        if journals_due {
            let steps = self.random.borrow_mut().below(200);
            executor.spawn(add_journals(
                pool.clone(),
                self.sim.devices[self.plan.disks..].to_vec(),
                self.counters.clone(),
                steps,
            ));
        }
        if self.plan.scratch {
            executor.spawn(scratch_spaces(
                pool.clone(),
                self.counters.clone(),
                self.random.clone(),
                self.sim.env.clone(),
                clients_left.clone(),
                self.plan.thin,
            ));
        }
        if self.plan.jobs {
            // The runner goes on until the clients are done and no job runs
            // (or 10 s more of simulated time): it would run forever. A
            // move cut there, or by the power, resumes in a later phase.
            let (pool, left, env) = (pool.clone(), clients_left.clone(), self.sim.env.clone());
            executor.spawn(async move {
                let runner = std::pin::pin!(pool.run_jobs());
                let settled = std::pin::pin!(async {
                    while left.get() > 0 {
                        env.sleep(1_000_000).await;
                    }
                    for _ in 0..100 {
                        let statuses = pool.job_statuses().await;
                        if statuses.iter().all(|s| s.state != JobState::Running) {
                            break;
                        }
                        env.sleep(100_000_000).await;
                    }
                });
                futures::future::select(runner, settled).await;
            });
        }
        let budget = if crash_here {
            20 + self.random.borrow_mut().below(3000)
        } else {
            u64::MAX
        };
        let mut spent = 0;
        let stop = loop {
            let slice = (1 + self.random.borrow_mut().below(200)).min(budget - spent);
            let stop = executor.run(slice);
            spent += slice;
            // Not before a power cut: a row a crash leaves to
            // resynchronise learns its sums from its data as it is, so
            // damage made before the cut would be adopted (the sums pages
            // lag the data; see docs/design/testing.md).
            if !cuts_follow
                && self.silent_injected < self.plan.silent.faults
                && self.silent_random.chance(1, 10)
            {
                silent::inject(
                    &mut executor,
                    &pool,
                    &self.sim,
                    &self.plan.silent,
                    &mut self.silent_random,
                    &self.flips,
                    &mut self.silent_writes_armed,
                );
                self.silent_injected += 1;
            }
            if may_lose
                && self.lost.len() < self.plan.losses
                && self.random.borrow_mut().chance(1, 20)
            {
                // Journal disks added later are never lost: whether they
                // are in the pool yet is for the add to say.
                let members = self.plan.members_at_start(self.sim.devices.len());
                let disk = pick_unlost(&mut self.random.borrow_mut(), members, &self.lost);
                if std::env::var_os("TERRACE_SIM_TRACE").is_some() {
                    eprintln!("disk {disk} lost");
                }
                if self.plan.returns {
                    executor.spawn(vanish(pool.clone(), disk, self.sim.faults[disk].clone()));
                    self.vanished.push(disk);
                } else {
                    self.sim.faults[disk].lose();
                    if self.plan.clears {
                        self.failed.push(disk);
                    }
                }
                self.lost.push(disk);
            }
            if !self.failed.is_empty() && self.random.borrow_mut().chance(1, 20) {
                let pick = self.random.borrow_mut().below(self.failed.len() as u64);
                let disk = self.failed.remove(pick as usize);
                executor.spawn(clear_back(
                    pool.clone(),
                    disk,
                    self.sim.faults[disk].clone(),
                    self.counters.clone(),
                ));
            }
            if !self.vanished.is_empty() && self.random.borrow_mut().chance(1, 20) {
                let pick = self.random.borrow_mut().below(self.vanished.len() as u64);
                let disk = self.vanished.remove(pick as usize);
                executor.spawn(come_back(
                    pool.clone(),
                    disk,
                    self.sim.devices[disk].clone(),
                    self.sim.faults[disk].clone(),
                    self.counters.clone(),
                ));
            }
            if stop != Stop::Budget || spent >= budget {
                break stop;
            }
        };
        if stop == Stop::Stuck {
            return Err("the engine deadlocked".into());
        }
        if let Some(message) = self.counters.borrow().failure.clone() {
            return Err(message);
        }
        if self.plan.silent.any() {
            let pool = pool.clone();
            self.checksum_errors +=
                executor.block_on(async move { silent::checksum_errors(&pool).await });
        }
        drop(executor);
        let pool = Rc::try_unwrap(pool).map_err(|_| "the pool is still shared")?;
        if !crash_here {
            return Ok((pool, space));
        }
        drop(space);
        drop(pool);
        self.crashes += 1;
        self.sim.power_cut(&mut self.random.borrow_mut())?;
        // A vanished disk may be back when the pool is imported again.
        let vanished = std::mem::take(&mut self.vanished);
        for disk in vanished {
            if self.random.borrow_mut().chance(1, 2) {
                self.sim.faults[disk].restore();
                self.returns_at_import += 1;
            } else {
                self.vanished.push(disk);
            }
        }
        recover(self).map_err(|e| format!("after power cut {}: {e}", self.crashes))
    }
}

/// The daemon notices `disk`'s device gone: the pool has it missing (and
/// records what its writes miss from then on); then the device is gone.
async fn vanish(pool: Rc<Pool>, disk: usize, fault: FaultControls) {
    let _ = pool
        .disk_gone(DiskIndex(disk as u16), "simulated: its device vanished")
        .await;
    fault.lose();
}

/// `disk`'s device is back and handed to the pool, which takes it back if
/// it is still missing. A disk that failed meanwhile (a write in flight
/// when it vanished) is refused, as is one not yet marked missing (its
/// vanishing still to run): it stays lost.
async fn come_back(
    pool: Rc<Pool>,
    disk: usize,
    device: Arc<dyn BlockDevice>,
    fault: FaultControls,
    counters: Shared<Counters>,
) {
    fault.restore();
    match pool.bring_back(device).await {
        Ok((index, _)) if usize::from(index.0) == disk => counters.borrow_mut().returns += 1,
        Ok((index, _)) => {
            let message = format!("disk {disk} was taken back as disk {}", index.0);
            counters.borrow_mut().failure.get_or_insert(message);
        }
        Err(EngineError::NotReturning { .. }) => {}
        Err(error) => {
            let message = format!("taking disk {disk} back failed: {error}");
            counters.borrow_mut().failure.get_or_insert(message);
        }
    }
}

/// `disk`'s fault passes and `Pool::clear` is asked to take it back. One
/// not yet found failed is in service to the pool (nothing to take back,
/// only its error counters set to zero: its next error fails it, and its
/// fault is gone); one retired by a repair is no longer the pool's to
/// clear.
async fn clear_back(pool: Rc<Pool>, disk: usize, fault: FaultControls, counters: Shared<Counters>) {
    fault.restore();
    match pool.clear(Some(DiskIndex(disk as u16))).await {
        Ok(cleared) => match cleared.as_slice() {
            [entry] if entry.refused.is_none() => counters.borrow_mut().cleared += 1,
            [] => {}
            _ => {
                let message = format!("disk {disk} was not cleared: {cleared:?}");
                counters.borrow_mut().failure.get_or_insert(message);
            }
        },
        Err(EngineError::NotCleared { .. } | EngineError::NoSuchDisk { .. }) => {}
        Err(error) => {
            let message = format!("clearing disk {disk} failed: {error}");
            counters.borrow_mut().failure.get_or_insert(message);
        }
    }
}

/// After `steps` polls (the clients writing meanwhile), add `devices` to the
/// pool as journal disks. A power cut after the add's commit left them in
/// the pool: adding them again is refused, and they count as added.
async fn add_journals(
    pool: Rc<Pool>,
    devices: Vec<Arc<dyn BlockDevice>>,
    counters: Shared<Counters>,
    steps: u64,
) {
    for _ in 0..steps {
        yield_now().await;
    }
    let disks = || {
        devices
            .iter()
            .map(|device| {
                let mut disk = NewDisk::new(device.clone());
                disk.usage = terrace_engine::meta::Usage::Journal;
                disk
            })
            .collect()
    };
    let mut added = pool.add_disks(disks()).await;
    if let Err(EngineError::DamagedLabel { .. }) = added {
        // A power cut tore a label the add was writing: it is refused, as
        // any damaged label is, and the administrator wipes it first.
        for device in &devices {
            if let store::Probe::Damaged(_) = store::probe(device.as_ref()).await {
                let _ = store::erase_label(device.as_ref()).await;
            }
        }
        added = pool.add_disks(disks()).await;
    }
    match added {
        Ok(_) | Err(EngineError::AlreadyMember { .. }) => {
            counters.borrow_mut().journals_added = true
        }
        Err(error) => {
            let message = format!("adding the journal disks failed: {error}");
            counters.borrow_mut().failure.get_or_insert(message);
        }
    }
}

/// Spaces of one slab created, read and deleted while the clients write
/// and the job runner moves slots (`Plan::scratch`). A new space reads as
/// zeroes, so one given a slab that a request of the main space could
/// still reach (a move ended and freed its old slab, or one was cancelled
/// and freed its target, while a write to it was under way) would show
/// that request's bytes. The window is narrow here (30,000 seeds without
/// the map epochs did not hit it); the engine tests that hold a write at
/// a disk show it. Spaces left by a power cut go first.
async fn scratch_spaces(
    pool: Rc<Pool>,
    counters: Shared<Counters>,
    random: Shared<Random>,
    env: Arc<dyn Env>,
    clients_left: Rc<std::cell::Cell<usize>>,
    thin: bool,
) {
    for space in pool.spaces() {
        if space.name().starts_with("scratch") {
            let _ = pool.delete_space(space.name()).await;
        }
    }
    while clients_left.get() > 0 {
        let name = {
            let mut counters = counters.borrow_mut();
            counters.scratch_spaces += 1;
            format!("scratch{}", counters.scratch_spaces)
        };
        let mut config = SpaceConfig::new(&name, Layout::Simple, SpaceSize::Bytes(SLAB_BYTES));
        config.columns = Some(1);
        config.cache_bytes = Some(0);
        if thin {
            config.provisioning = terrace_engine::meta::Provisioning::Thin;
        }
        let Ok(created) = pool.create_space(config).await else {
            // No room now, or a disk it was given was lost meanwhile.
            env.sleep(1_000_000).await;
            continue;
        };
        let wait = random.borrow_mut().below(2_000_000);
        env.sleep(wait).await;
        if thin {
            // Its slab is taken now, by a write of zeroes to one block: the
            // rest of it must read as zeroes too.
            let zeroes = Bytes::from(vec![0u8; 4096]);
            let _ = created.space.write(4096, zeroes, false).await;
        }
        // A read may fail (its disk lost); what it returns must be zeroes.
        if let Ok(data) = created.space.read(0, SLAB_BYTES).await {
            if data.iter().any(|&byte| byte != 0) {
                let message = format!(
                    "new space {name} reads bytes that are not zero: a slab it was given \
                     was still reached by a request of another space"
                );
                counters.borrow_mut().failure.get_or_insert(message);
            }
        }
        drop(created);
        let _ = pool.delete_space(&name).await;
    }
}

/// Pending once (waking itself): other ready tasks may run first.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|context| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            context.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

fn pick_unlost(random: &mut Random, disks: usize, lost: &[usize]) -> usize {
    loop {
        let disk = random.below(disks as u64) as usize;
        if !lost.contains(&disk) {
            return disk;
        }
    }
}

fn setup(
    sim: &SimDisks,
    plan: &Plan,
    random: Shared<Random>,
) -> Result<(Pool, Arc<Space>), String> {
    let mut executor = Executor::new(random, sim.world.clone());
    let env = sim.env.clone();
    let disks: Vec<NewDisk> = sim
        .devices
        .iter()
        .enumerate()
        .take(plan.members_at_start(sim.devices.len()))
        .map(|(index, d)| {
            let mut disk = NewDisk::new(d.clone());
            if index >= plan.disks {
                disk.usage = terrace_engine::meta::Usage::Journal;
            }
            disk
        })
        .collect();
    let mut space_config = SpaceConfig::new("sim", plan.layout, SpaceSize::Bytes(plan.space_bytes));
    space_config.columns = plan.columns;
    space_config.interleave_bytes = Some(plan.interleave_bytes);
    space_config.cache_bytes = Some(plan.cache_bytes.unwrap_or(0));
    if plan.thin {
        space_config.provisioning = terrace_engine::meta::Provisioning::Thin;
    }
    let log_memory = plan.log_memory;
    executor.block_on(async move {
        let config = PoolConfig {
            name: "sim".into(),
            slab_bytes: SLAB_BYTES,
            metadata_slot_bytes: METADATA_SLOT_MIN_BYTES,
        };
        let pool = Pool::create(env, config, disks)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(bytes) = log_memory {
            pool.set_log_memory(bytes);
        }
        let created = pool
            .create_space(space_config)
            .await
            .map_err(|e| e.to_string())?;
        Ok((pool, created.space))
    })
}

#[derive(Default)]
struct Counters {
    writes: u64,
    reads: u64,
    returns: usize,
    cleared: usize,
    journals_added: bool,
    /// Spaces `scratch_spaces` created, over every phase.
    scratch_spaces: usize,
    /// Reads and writes that failed where silent faults are beyond what
    /// the layout survives (anywhere else a failure ends the run).
    failed_reads: u64,
    failed_writes: u64,
    /// Writes to a thin space refused for want of room (see
    /// [`Failed::NoRoom`]).
    refused_for_room: u64,
    failure: Option<String>,
}

async fn client_task(
    space: Arc<Space>,
    model: Shared<Model>,
    counters: Shared<Counters>,
    random: Shared<Random>,
    plan: Plan,
    client: usize,
) {
    if let Some(journal) = space.journal() {
        journal.set_gathering(plan.gather);
    }
    {
        let blocks = model.borrow().blocks();
        let chunks = blocks.div_ceil(plan.chunk_blocks);
        let owned: Vec<u64> = (0..chunks)
            .filter(|chunk| chunk % plan.clients as u64 == client as u64)
            .collect();
        if owned.is_empty() {
            return;
        }
        for _ in 0..plan.ops_per_client {
            let (start, count, operation, fua) = {
                let mut random = random.borrow_mut();
                let chunk = owned[random.below(owned.len() as u64) as usize];
                let first = chunk * plan.chunk_blocks;
                let last = (first + plan.chunk_blocks).min(blocks);
                let start = first + random.below(last - first);
                let count = 1 + random.below(last - start);
                let operation = random.below(10);
                let fua = random.chance(1, 5);
                if plan.thin && operation == 5 && random.chance(1, 2) {
                    // The whole chunk: a whole extent where chunks are.
                    (first, last - first, operation, fua)
                } else {
                    (start, count, operation, fua)
                }
            };
            let result = match operation {
                0..=4 => write(&space, &model, start, count, false, fua).await,
                // Zeroed blocks are known zero (their sums say "all
                // zeroes"), but zeroing a space with a write-back log beside
                // silent faults beyond tolerance still returns wrong data
                // at times, not yet understood: those runs write instead.
                5 if plan.silent.any() => write(&space, &model, start, count, false, fua).await,
                5 => write(&space, &model, start, count, true, fua).await,
                6..=8 => read_and_check(&space, &model, start, count).await,
                _ => flush(&space, &model).await,
            };
            if let (Err(Failed::Request(message)), true) =
                (&result, std::env::var_os("TERRACE_SIM_TRACE").is_some())
            {
                eprintln!("client {client}: {message}");
            }
            let mut counters = counters.borrow_mut();
            match result {
                Ok(()) if operation <= 5 => counters.writes += 1,
                Ok(()) if operation <= 8 => counters.reads += 1,
                Ok(()) => {}
                // Beyond tolerance a request may fail (a read or a write
                // needing a block nothing can rebuild); wrong data is
                // still a failure of the run.
                Err(Failed::Request(_)) if plan.silent.beyond && operation <= 5 => {
                    counters.failed_writes += 1
                }
                Err(Failed::Request(_)) if plan.silent.beyond && operation <= 8 => {
                    counters.failed_reads += 1
                }
                Err(Failed::Request(_)) if plan.silent.beyond => {}
                Err(Failed::NoRoom(_)) if plan.thin => counters.refused_for_room += 1,
                Err(
                    Failed::Request(message) | Failed::WrongData(message) | Failed::NoRoom(message),
                ) => {
                    counters.failure.get_or_insert(message);
                    return;
                }
            }
        }
    }
}

async fn write(
    space: &Space,
    model: &Shared<Model>,
    start: u64,
    count: u64,
    zero: bool,
    fua: bool,
) -> Result<(), Failed> {
    let (pending, data) = model.borrow_mut().issue_write(start, count, zero);
    let offset = start * BLOCK_BYTES;
    let length = count * BLOCK_BYTES;
    // With a log that does not gather, a write that is not whole rows is
    // always logged, and a logged write is durable when acknowledged.
    let row = space.natural_write_bytes();
    let logged = space.journal().is_some_and(|journal| !journal.gathering())
        && !zero
        && !(offset.is_multiple_of(row) && length.is_multiple_of(row));
    let result = if zero {
        space.write_zeroes(offset, length, fua).await
    } else if count == 1 && start % 4 == 2 {
        // A block as a 512-byte sector client sends it: its sectors in
        // flight together (merged into one write of the block, or not).
        let data = Bytes::from(data);
        let sectors = (0..data.len()).step_by(SECTOR_BYTES).map(|at| {
            let sector = data.slice(at..at + SECTOR_BYTES);
            space.write(offset + at as u64, sector, fua)
        });
        futures::future::join_all(sectors)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, _>>()
            .map(|_| ())
    } else if start % 2 == 1 {
        // As the NBD server hands them on: the blocks' sums taken on arrival.
        let sums = data
            .chunks(BLOCK_BYTES as usize)
            .zip(start..)
            .map(|(block, index)| terrace_engine::meta::sums::block_sum(block, index))
            .collect();
        space
            .write_summed(offset, Bytes::from(data), sums, fua)
            .await
    } else {
        space.write(offset, Bytes::from(data), fua).await
    };
    if let Err(error) = result {
        model.borrow_mut().failed(pending);
        if let terrace_engine::EngineError::PoolFull { .. } = error {
            return Err(Failed::NoRoom(error.to_string()));
        }
        return Err(Failed::Request(format!(
            "write of blocks {start}+{count} failed: {error}"
        )));
    }
    model.borrow_mut().acknowledge(pending, fua || logged);
    Ok(())
}

/// How a client's request went wrong.
enum Failed {
    /// The engine answered with an error.
    Request(String),
    /// A read returned data the model does not allow.
    WrongData(String),
    /// A write to a thin space's extent without slabs found no room for
    /// them (the disks lost leave too few for its width): refused before
    /// anything was written.
    NoRoom(String),
}

async fn read_and_check(
    space: &Space,
    model: &Shared<Model>,
    start: u64,
    count: u64,
) -> Result<(), Failed> {
    let bytes = space
        .read(start * BLOCK_BYTES, count * BLOCK_BYTES)
        .await
        .map_err(|e| Failed::Request(format!("read of blocks {start}+{count} failed: {e}")))?;
    let mut model = model.borrow_mut();
    for (index, block) in (start..start + count).enumerate() {
        model
            .observe(
                block,
                &bytes[index * BLOCK_BYTES as usize..][..BLOCK_BYTES as usize],
            )
            .map_err(Failed::WrongData)?;
    }
    Ok(())
}

async fn flush(space: &Space, model: &Shared<Model>) -> Result<(), Failed> {
    let point = model.borrow().flush_point();
    space
        .flush()
        .await
        .map_err(|e| Failed::Request(format!("flush failed: {e}")))?;
    model.borrow_mut().flushed(point);
    Ok(())
}

/// Blocks read per request when a checker walks the whole space.
const CHECK_BLOCKS: u64 = 32;

async fn import(
    sim_env: Arc<dyn Env>,
    devices: Vec<Arc<dyn BlockDevice>>,
    log_memory: Option<u64>,
) -> Result<(Pool, Arc<Space>), String> {
    let pool = Pool::import(sim_env, devices, ImportOptions::default())
        .await
        .map_err(|e| format!("import failed: {e}"))?;
    if let Some(bytes) = log_memory {
        pool.set_log_memory(bytes);
    }
    if let Some(reason) = pool.read_only_reason() {
        return Err(format!("imported read-only: {reason}"));
    }
    let space = pool.space("sim").ok_or("the space is gone")?;
    Ok((pool, space))
}

/// How strictly a check holds the engine, by the run's silent faults.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Strictness {
    /// No silent faults: every read as the model says, redundancy agrees.
    Exact,
    /// Silent faults within tolerance: reads as the model says; a verify
    /// may find blocks failing their sums (rebuilt from redundancy) and
    /// parity they damaged, nothing else.
    Within,
    /// Beyond tolerance: a read returns the model's data or fails.
    Beyond,
}

impl Strictness {
    fn of(plan: &Plan) -> Strictness {
        match (plan.silent.any(), plan.silent.beyond) {
            (false, _) => Strictness::Exact,
            (true, false) => Strictness::Within,
            (true, true) => Strictness::Beyond,
        }
    }
}

/// Walk the whole space: a block not read since a crash may hold any
/// content since its last durable point, and adopts it; otherwise reads
/// must be exactly current. Then check that redundancy agrees: reading a
/// mirror row resynchronises it if a crash left it to resynchronise.
/// Beyond tolerance a read may fail (each block is then read alone) and
/// redundancy is not checked.
async fn check_space(
    pool: &Pool,
    space: &Space,
    model: &Shared<Model>,
    strictness: Strictness,
) -> Result<(), String> {
    let blocks = model.borrow().blocks();
    let mut start = 0;
    while start < blocks {
        let count = CHECK_BLOCKS.min(blocks - start);
        check_blocks(space, model, start, count, strictness).await?;
        start += count;
    }
    // The map a thin space serves from and its metadata agree on which
    // extents have slabs (a give-back or an allocation cut by a crash
    // leaves both as they were).
    let metadata = pool.metadata().await;
    if let Some(record) = metadata.space(space.name()) {
        let extent_bytes = space.geometry().extent_data_bytes();
        let recorded: u64 = (0..record.extents.len() as u64)
            .filter(|&extent| record.extents[extent as usize].slabs.is_some())
            .map(|extent| extent_bytes.min(record.size_bytes - extent * extent_bytes))
            .sum();
        if recorded != space.allocated_bytes() {
            return Err(format!(
                "the metadata has {recorded} bytes of the space allocated, its map {}",
                space.allocated_bytes()
            ));
        }
    }
    if strictness == Strictness::Beyond {
        return Ok(());
    }
    let left = pool.resync_extents_left(space.id());
    if left > 0 {
        return Err(format!(
            "{left} extents still to resynchronise after every row was read"
        ));
    }
    let report = verify_space(space)
        .await
        .map_err(|e| format!("verify failed: {e}"))?;
    let explained = |kind: &ProblemKind| {
        strictness == Strictness::Within
            && matches!(
                kind,
                ProblemKind::Checksum { .. } | ProblemKind::Parity { .. }
            )
    };
    let unexplained = report.mismatched_rows.len() > report.findings.len()
        || report
            .findings
            .iter()
            .flat_map(|finding| &finding.problems)
            .any(|problem| !explained(&problem.kind));
    if !report.mismatched_rows.is_empty() && (strictness == Strictness::Exact || unexplained) {
        return Err(format!(
            "redundancy disagrees in rows {:?}: {:?}",
            report.mismatched_rows, report.findings
        ));
    }
    Ok(())
}

/// Read blocks `start..start + count` and hold them to the model; beyond
/// tolerance a failed read is read again block by block, and a block that
/// fails alone is skipped.
async fn check_blocks(
    space: &Space,
    model: &Shared<Model>,
    start: u64,
    count: u64,
    strictness: Strictness,
) -> Result<(), String> {
    let bytes = match space.read(start * BLOCK_BYTES, count * BLOCK_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) if strictness == Strictness::Beyond && count > 1 => {
            for block in start..start + count {
                Box::pin(check_blocks(space, model, block, 1, strictness)).await?;
            }
            return Ok(());
        }
        Err(_) if strictness == Strictness::Beyond => return Ok(()),
        Err(e) => return Err(format!("read of blocks {start}+{count} failed: {e}")),
    };
    let mut model = model.borrow_mut();
    for (index, block) in (start..start + count).enumerate() {
        model.observe(
            block,
            &bytes[index * BLOCK_BYTES as usize..][..BLOCK_BYTES as usize],
        )?;
    }
    Ok(())
}

fn recover(run: &Run) -> Result<(Pool, Arc<Space>), String> {
    let (sim, random, log_memory) = (&run.sim, &run.random, run.plan.log_memory);
    let strictness = Strictness::of(&run.plan);
    let mut executor = Executor::new(random.clone(), sim.world.clone());
    let (env, devices, model) = (sim.env.clone(), sim.devices.clone(), run.model.clone());
    model.borrow_mut().crashed();
    // Half the time the space is checked at once; otherwise the clients'
    // reads and the job runner meet the mirror rows the crash left to
    // resynchronise, and the next check reads what is left.
    let check_now = random.borrow_mut().chance(1, 2);
    executor.block_on(async move {
        let (pool, space) = import(env, devices, log_memory).await?;
        if check_now {
            check_space(&pool, &space, &model, strictness).await?;
        }
        Ok((pool, space))
    })
}

/// What the end of a run found.
struct End {
    repairs: usize,
    moves: usize,
    /// Checksum errors the disks counted since the last import.
    checksum_errors: u64,
    /// Blocks the scrub found failing their sums.
    scrubbed_blocks: u64,
}

/// Once the clients stop: with silent faults, no more are made, and a
/// scrub repairs what they left (within tolerance, all of it, so that a
/// second scrub finds nothing). Then the space is checked, before or
/// after the pool is closed and imported again, and once more after.
fn finish(run: &Run, pool: Pool, space: Arc<Space>) -> Result<End, String> {
    let (sim, random, log_memory) = (&run.sim, &run.random, run.plan.log_memory);
    let strictness = Strictness::of(&run.plan);
    for &disk in &run.plan.silent.disks {
        sim.faults[disk].stop_silent_faults();
    }
    let mut executor = Executor::new(random.clone(), sim.world.clone());
    let (env, devices, model) = (sim.env.clone(), sim.devices.clone(), run.model.clone());
    // Half the time the pool is closed before it is checked: a mirror
    // resync a crash left owing is then the next import's.
    let check_first = random.borrow_mut().chance(1, 2);
    executor.block_on(async move {
        let scrubbed_blocks = if strictness == Strictness::Exact {
            0
        } else {
            scrub(&space, strictness).await?
        };
        let checksum_errors = silent::checksum_errors(&pool).await;
        if check_first {
            check_space(&pool, &space, &model, strictness).await?;
        }
        drop(space);
        let jobs = pool.metadata().await.jobs;
        let repairs = jobs
            .iter()
            .filter(|job| {
                matches!(job.kind, terrace_engine::meta::JobKind::Repair { .. })
                    && job.state == JobState::Done
            })
            .count();
        let moves = jobs.iter().map(JobRecord::moves_done).sum();
        pool.close()
            .await
            .map_err(|e| format!("close failed: {e}"))?;
        let (pool, space) = import(env, devices, log_memory).await?;
        check_space(&pool, &space, &model, strictness).await?;
        drop(space);
        pool.close()
            .await
            .map_err(|e| format!("close failed: {e}"))?;
        Ok(End {
            repairs,
            moves,
            checksum_errors,
            scrubbed_blocks,
        })
    })
}

/// Blocks failing their sums in `report`, and blocks nothing could rebuild.
fn checksum_blocks(report: &RedundancyReport) -> (u64, u64) {
    let mut counts = (0, 0);
    for problem in report.findings.iter().flat_map(|f| &f.problems) {
        match problem.kind {
            ProblemKind::Checksum { blocks } => counts.0 += blocks,
            ProblemKind::Unrecoverable { blocks } => counts.1 += blocks,
            _ => {}
        }
    }
    counts
}

/// Scrub the space and return the blocks it found failing their sums.
/// Within tolerance every one is rebuilt, and a second scrub finds
/// nothing at all; beyond it the scrub may fail or leave blocks.
async fn scrub(space: &Space, strictness: Strictness) -> Result<u64, String> {
    let first = match repair_space(space).await {
        Ok(report) => report,
        Err(_) if strictness == Strictness::Beyond => return Ok(0),
        Err(e) => return Err(format!("scrub failed: {e}")),
    };
    let (found, unrecoverable) = checksum_blocks(&first);
    if strictness == Strictness::Beyond {
        return Ok(found);
    }
    if unrecoverable > 0 || first.mismatched_rows.len() > first.findings.len() {
        return Err(format!(
            "the scrub left {unrecoverable} blocks unrecoverable within tolerance: {:?}",
            first.findings
        ));
    }
    let second = repair_space(space)
        .await
        .map_err(|e| format!("second scrub failed: {e}"))?;
    if !second.mismatched_rows.is_empty() {
        return Err(format!(
            "a second scrub still found rows {:?}: {:?}",
            second.mismatched_rows, second.findings
        ));
    }
    Ok(found)
}
