//! Choosing slabs for extents.
//!
//! Each slot of an extent goes to a distinct disk; the slots of one
//! redundancy group (the copies of a mirror column, or all columns of a
//! parity extent) also go to distinct fault domains at the space's level.
//! Among the disks that qualify, the one with the most free slabs wins, so
//! large disks fill first until they are level with small ones and every
//! disk of a mixed pool ends up used. Ties (equal free slabs, the common
//! case in a pool of equal disks) go by an order that changes from extent
//! to extent, so that the disks holding the other slots of a disk's slabs
//! differ from extent to extent: when a disk fails, its slabs are rebuilt
//! by reading from many disks at once, not from one partner that held
//! every copy (declustering). On a disk the lowest free slab is taken,
//! keeping allocations compact.

use std::collections::{BTreeMap, BTreeSet};

use terrace_layout::Geometry;

use crate::ids::{DiskIndex, SlabIndex, SlabRef};
use crate::model::{DiskRecord, FaultDomain, PoolMetadata};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("not enough free capacity: an extent needs {needed} slabs on distinct disks, only {available} disks have free slabs")]
    OutOfSpace { needed: u32, available: u32 },
    #[error("cannot keep redundant slabs in distinct {level:?} fault domains: a group needs {needed}, only {available} domains have free slabs")]
    FaultDomains {
        level: FaultDomain,
        needed: usize,
        available: usize,
    },
}

#[derive(Debug, Clone)]
struct Candidate {
    index: DiskIndex,
    domain: String,
    free: BTreeSet<SlabIndex>,
}

/// Free slabs of the disks a space may use, and the rule to pick among them.
#[derive(Debug, Clone)]
pub struct Allocator {
    level: FaultDomain,
    disks: Vec<Candidate>,
    /// Varies the tie order from extent to extent; starts from how many
    /// slabs are used, so the same metadata gives the same choices.
    turn: u64,
}

/// A well-mixed 64-bit value of `x` (splitmix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Allocator {
    /// Build from the metadata: free = all slabs of eligible disks minus
    /// those any extent uses.
    pub fn new(
        metadata: &PoolMetadata,
        level: FaultDomain,
        eligible: impl Fn(&DiskRecord) -> bool,
    ) -> Allocator {
        Allocator::with_filter(metadata, level, |_, disk| eligible(disk))
    }

    /// As [`Allocator::new`], with the disk's index given to the filter.
    pub fn with_filter(
        metadata: &PoolMetadata,
        level: FaultDomain,
        eligible: impl Fn(DiskIndex, &DiskRecord) -> bool,
    ) -> Allocator {
        let used = metadata.used_slabs();
        let disks = metadata
            .disks
            .iter()
            .enumerate()
            .filter(|(index, disk)| eligible(DiskIndex(*index as u16), disk))
            .map(|(index, disk)| {
                let index = DiskIndex(index as u16);
                let free = (0..disk.slab_count)
                    .map(SlabIndex)
                    .filter(|&slab| !used.contains(&SlabRef { disk: index, slab }))
                    .collect();
                Candidate {
                    index,
                    domain: disk.domain_key(index, level),
                    free,
                }
            })
            .collect();
        Allocator {
            level,
            disks,
            turn: used.len() as u64,
        }
    }

    /// Take `slabs` out of the free ones: slabs set aside for a change not
    /// yet committed (a new space's, while they are zeroed).
    pub fn exclude(mut self, slabs: &BTreeSet<SlabRef>) -> Allocator {
        if !slabs.is_empty() {
            for disk in &mut self.disks {
                let index = disk.index;
                disk.free
                    .retain(|&slab| !slabs.contains(&SlabRef { disk: index, slab }));
            }
        }
        self
    }

    pub fn free_slabs(&self) -> u64 {
        self.disks.iter().map(|disk| disk.free.len() as u64).sum()
    }

    /// Distinct disks, and distinct fault domains, that still have free slabs.
    pub fn usable_disks_and_domains(&self) -> (u32, usize) {
        let with_free = self.disks.iter().filter(|disk| !disk.free.is_empty());
        let domains: BTreeSet<&str> = with_free.clone().map(|disk| disk.domain.as_str()).collect();
        (with_free.count() as u32, domains.len())
    }

    /// Choose one slab per slot for a new extent; nothing changes on error.
    pub fn allocate_extent(&mut self, geometry: &Geometry) -> Result<Vec<SlabRef>, PlacementError> {
        let slots = geometry.slots_per_extent() as usize;
        let mut chosen: Vec<Option<usize>> = vec![None; slots];
        let mut taken_disks = BTreeSet::new();
        for group in geometry.redundancy_groups() {
            let mut group_domains: BTreeSet<&str> = BTreeSet::new();
            for slot in group {
                let best = self
                    .disks
                    .iter()
                    .enumerate()
                    .filter(|(position, disk)| {
                        !disk.free.is_empty()
                            && !taken_disks.contains(position)
                            && !group_domains.contains(disk.domain.as_str())
                    })
                    .max_by_key(|(position, disk)| {
                        (disk.free.len(), mix(self.turn << 16 | *position as u64))
                    });
                let Some((position, disk)) = best else {
                    return Err(self.explain_failure(geometry));
                };
                group_domains.insert(disk.domain.as_str());
                taken_disks.insert(position);
                chosen[slot as usize] = Some(position);
            }
        }
        self.turn += 1;
        Ok(chosen
            .into_iter()
            .map(|position| {
                let disk = &mut self.disks[position.expect("every slot is in one group")];
                let slab = disk.free.pop_first().expect("chosen disks have free slabs");
                SlabRef {
                    disk: disk.index,
                    slab,
                }
            })
            .collect())
    }

    fn explain_failure(&self, geometry: &Geometry) -> PlacementError {
        let (disks, domains) = self.usable_disks_and_domains();
        if disks < geometry.slots_per_extent() {
            return PlacementError::OutOfSpace {
                needed: geometry.slots_per_extent(),
                available: disks,
            };
        }
        let needed = geometry
            .redundancy_groups()
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(1);
        PlacementError::FaultDomains {
            level: self.level,
            needed,
            available: domains,
        }
    }

    /// One slab on a disk outside `avoid_disks` whose domain is outside
    /// `avoid_domains` (the most free such disk wins), for re-creating or
    /// moving a single slot of an extent.
    pub fn allocate_slab(
        &mut self,
        avoid_disks: &BTreeSet<DiskIndex>,
        avoid_domains: &BTreeSet<String>,
    ) -> Option<SlabRef> {
        self.allocate_slab_by(avoid_disks, avoid_domains, |_| 0)
    }

    /// As [`Allocator::allocate_slab`], the disk of least `busy` first
    /// (the most free among those): a job spreads the copying it plans
    /// over the disks that will do it.
    pub fn allocate_slab_by(
        &mut self,
        avoid_disks: &BTreeSet<DiskIndex>,
        avoid_domains: &BTreeSet<String>,
        busy: impl Fn(DiskIndex) -> u64,
    ) -> Option<SlabRef> {
        let disk = self
            .disks
            .iter_mut()
            .filter(|disk| {
                !disk.free.is_empty()
                    && !avoid_disks.contains(&disk.index)
                    && !avoid_domains.contains(&disk.domain)
            })
            .max_by_key(|disk| {
                (
                    std::cmp::Reverse(busy(disk.index)),
                    disk.free.len(),
                    std::cmp::Reverse(disk.index),
                )
            })?;
        let slab = disk.free.pop_first()?;
        Some(SlabRef {
            disk: disk.index,
            slab,
        })
    }

    /// Free slabs per disk (for reports and tests).
    pub fn free_by_disk(&self) -> BTreeMap<DiskIndex, usize> {
        self.disks
            .iter()
            .map(|disk| (disk.index, disk.free.len()))
            .collect()
    }
}
