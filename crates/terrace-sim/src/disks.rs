//! A set of simulated disks: fault injection (errors, loss, lost and
//! misdirected writes) → the world's gate → crash wrapper (volatile cache)
//! → memory (where bit flips are made, behind the engine).

use std::sync::Arc;

use terrace_engine::io::crash::CrashDevice;
use terrace_engine::io::fault::{FaultControls, FaultDevice};
use terrace_engine::io::memory::MemoryDevice;
use terrace_engine::io::{BlockDevice, Env};
use terrace_engine::meta::format::{data_offset, METADATA_SLOT_MIN_BYTES};

use crate::random::Random;
use crate::world::{DiskTraits, SimDisk, SimEnv, World};

/// Slab size of simulated pools: small, so a few MiB hold many extents.
pub const SLAB_BYTES: u64 = 64 << 10;

pub struct SimDisks {
    pub world: Arc<World>,
    pub env: Arc<dyn Env>,
    pub crash: Vec<Arc<CrashDevice>>,
    pub faults: Vec<FaultControls>,
    /// The memory under each disk, for bit flips behind the engine.
    pub memory: Vec<Arc<MemoryDevice>>,
    pub devices: Vec<Arc<dyn BlockDevice>>,
}

impl SimDisks {
    /// `count` disks with room for `slabs_per_disk` slabs each (and the
    /// smallest metadata slots).
    pub fn new(world: Arc<World>, count: usize, slabs_per_disk: u64) -> SimDisks {
        Self::with_journals(world, count, slabs_per_disk, 0, 0, DiskTraits::default())
    }

    /// As [`SimDisks::new`], plus `journals` disks of `journal_slabs` slabs
    /// each at the end (the caller pools them with usage journal). Every
    /// disk answers as `traits` says.
    pub fn with_journals(
        world: Arc<World>,
        count: usize,
        slabs_per_disk: u64,
        journals: usize,
        journal_slabs: u64,
        traits: DiskTraits,
    ) -> SimDisks {
        let mut crash = Vec::new();
        let mut faults = Vec::new();
        let mut memories = Vec::new();
        let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
        for index in 0..count + journals {
            let slabs = if index < count {
                slabs_per_disk
            } else {
                journal_slabs
            };
            let size = data_offset(METADATA_SLOT_MIN_BYTES) + slabs * SLAB_BYTES;
            let memory = Arc::new(MemoryDevice::new(format!("sim:{index}"), size));
            let crashing = Arc::new(CrashDevice::new(memory.clone()));
            let gated = Arc::new(SimDisk::new(world.clone(), crashing.clone(), traits));
            let fault = FaultDevice::new(gated);
            // Silent faults keep to the slabs: labels and metadata slots
            // have their own checksums and copies, tested apart.
            fault
                .controls()
                .silent_faults_within(data_offset(METADATA_SLOT_MIN_BYTES)..size);
            faults.push(fault.controls());
            memories.push(memory);
            crash.push(crashing);
            devices.push(Arc::new(fault));
        }
        SimDisks {
            env: SimEnv::new(world.clone()),
            world,
            crash,
            faults,
            memory: memories,
            devices,
        }
    }

    /// Cut the power: everything in flight is forgotten and every unflushed
    /// write lands, vanishes or tears, as `random` decides.
    pub fn power_cut(&self, random: &mut Random) -> Result<(), String> {
        self.world.reset();
        for device in &self.crash {
            let mut choose = || random.next_u64();
            device
                .crash(&mut choose)
                .map_err(|e| format!("crash: {e}"))?;
        }
        Ok(())
    }
}
