//! Deterministic simulation testing for terrace.
//!
//! A run draws everything from one seed: the pool's shape and layout, the
//! clients' operations, the order in which disk operations complete, when
//! disks are lost and when the power is cut, and how each unflushed write
//! fares in the cut (landed, dropped, torn). After every recovery and at the
//! end, checkers compare every block with a reference model and check that
//! mirror copies are equal and parity is consistent. A failing run reports
//! its seed; `TERRACE_SIM_SEED=<seed>` replays exactly that run.
//!
//! Half the runs also run the pool's job runner beside the clients, as the
//! daemon does: lost disks are repaired by the policy while clients write
//! and the power is cut, and moves resume after each recovery. In half the
//! runs that lose disks, a lost disk vanishes (the pool marks it missing
//! while writes run) and may come back, taken back while clients write or
//! found again at the import after a power cut; in a third of the runs
//! with a write-back log, the journal disks join while clients write.
//!
//! Some runs name disks that take silent faults (`silent`): bit flips,
//! lost and misdirected writes. Within what the layout tolerates every
//! read still returns the model's data and a scrub at the end repairs
//! every fault; beyond it, a read may fail but never returns wrong data.

pub mod disks;
pub mod executor;
pub mod model;
pub mod random;
pub mod run;
pub mod silent;
pub mod world;

pub use run::{run, Plan, Report};

/// Seeds past the default range that once found a bug, run with every
/// range or count (each with what it found):
/// - 24009: a log failed for a row it could not image (silent damage past
///   single parity's tolerance) went write-through without committing its
///   tail, and the next import replayed its records over the writes that
///   went straight home since.
/// - 7054: a replay at import that met a row past its tolerance (a disk
///   lost, a sector of another unreadable) failed the whole import.
pub const REGRESSION_SEEDS: &[u64] = &[7054, 24009];

/// Seeds to run: `TERRACE_SIM_SEED` (one), else `TERRACE_SIM_SEEDS` (a
/// count, from 1, or a range `first..last`, both included, to go on where
/// a run stopped), else `default_count`; with a count or range, the
/// [`REGRESSION_SEEDS`] too.
pub fn seeds(default_count: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("TERRACE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let asked = std::env::var("TERRACE_SIM_SEEDS").unwrap_or_default();
    let mut seeds: Vec<u64> = match asked.split_once("..") {
        Some((first, last)) => match (first.parse::<u64>(), last.parse::<u64>()) {
            (Ok(first), Ok(last)) => (first..=last).collect(),
            _ => (1..=default_count).collect(),
        },
        None => (1..=asked.parse().unwrap_or(default_count)).collect(),
    };
    for &seed in REGRESSION_SEEDS {
        if !seeds.contains(&seed) {
            seeds.push(seed);
        }
    }
    seeds
}
