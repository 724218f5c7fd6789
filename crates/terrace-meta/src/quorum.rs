//! Which generation of the metadata an import trusts.
//!
//! # The rule
//!
//! Every generation names its member set: the disks that were `Active` when
//! it was committed, i.e. the disks it was written to. Walking generations
//! newest first, import takes the first one held (in either slot) by a strict
//! majority of its own member set.
//!
//! * A commit cut by a crash reached only some disks; if that is a minority,
//!   the previous generation (still in the other slot of every disk) wins —
//!   the cut commit was never acknowledged, so nothing is lost.
//! * Disks that failed were dropped from the member set by the commits that
//!   followed, so a pool that lost disks while running keeps its quorum.
//! * A handful of stale disks (failed long ago) cannot outvote the pool: the
//!   generations they hold name member sets they are a minority of.
//!
//! If no generation has a majority, import offers the newest one read-only
//! and says why; `force` takes it read-write.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::DiskId;
use crate::model::PoolMetadata;

/// One scanned disk of the pool being imported.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub disk_id: DiskId,
    /// Valid metadata copies found on it (one or two).
    pub copies: Vec<&'a PoolMetadata>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub metadata: PoolMetadata,
    /// Member disks (of the chosen generation) that hold it.
    pub holders: BTreeSet<DiskId>,
    /// Size of the chosen generation's member set.
    pub members: usize,
    /// Whether the holders are a strict majority of the members.
    pub quorum: bool,
}

impl Selection {
    /// Why the pool may only be opened read-only, if it must be.
    pub fn shortfall(&self) -> Option<String> {
        (!self.quorum).then(|| {
            format!(
                "only {} of {} member disks hold the newest metadata (generation {}); a majority ({}) is needed to open read-write",
                self.holders.len(),
                self.members,
                self.metadata.generation,
                self.members / 2 + 1
            )
        })
    }
}

/// Choose the generation to import, or `None` if no candidate holds any.
pub fn select(candidates: &[Candidate]) -> Option<Selection> {
    let mut by_generation: BTreeMap<u64, (&PoolMetadata, BTreeSet<DiskId>)> = BTreeMap::new();
    for candidate in candidates {
        for copy in &candidate.copies {
            by_generation
                .entry(copy.generation)
                .or_insert_with(|| (copy, BTreeSet::new()))
                .1
                .insert(candidate.disk_id);
        }
    }
    let judged: Vec<Selection> = by_generation
        .into_iter()
        .rev()
        .map(|(_, (metadata, holders))| {
            let members: BTreeSet<DiskId> = metadata.members().map(|(_, disk)| disk.id).collect();
            let holders: BTreeSet<DiskId> = holders.intersection(&members).copied().collect();
            Selection {
                metadata: metadata.clone(),
                quorum: holders.len() * 2 > members.len(),
                members: members.len(),
                holders,
            }
        })
        .collect();
    let newest = judged.first().cloned();
    judged
        .into_iter()
        .find(|selection| selection.quorum)
        .or(newest)
}
