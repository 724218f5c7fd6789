//! Slabs no allocation may take although the committed metadata calls
//! them free: those reserved for a change not yet committed, and those a
//! space's map stopped naming while requests that began earlier may still
//! use them.
//!
//! ```text
//!   reserve(slabs) ──► held until the Reservation drops
//!                       (a new space's slabs while they are zeroed outside
//!                        the control lock; a job's moves being cancelled)
//!   retire(slabs, epoch) ──► held while any strong handle of the epoch
//!                        lives (requests that began under the old map)
//! ```
//!
//! Depends on nothing of the engine: an epoch is seen only as something
//! whose strong handles can be counted, so the space that owns it stays
//! above this module.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, Weak};

use terrace_meta::SlabRef;

/// Something whose life decides how long retired slabs are held.
pub(crate) type Epoch = Weak<dyn Send + Sync>;

#[derive(Default)]
pub(crate) struct SlabHolds {
    reserved: Mutex<BTreeSet<SlabRef>>,
    retired: Mutex<Vec<(SlabRef, Epoch)>>,
}

/// Slabs reserved until dropped (see [`SlabHolds::reserve`]).
pub(crate) struct Reservation<'a> {
    holds: &'a SlabHolds,
    slabs: Vec<SlabRef>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut reserved = self.holds.reserved();
        for slab in &self.slabs {
            reserved.remove(slab);
        }
    }
}

impl SlabHolds {
    fn reserved(&self) -> MutexGuard<'_, BTreeSet<SlabRef>> {
        self.reserved.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn retired(&self) -> MutexGuard<'_, Vec<(SlabRef, Epoch)>> {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|(_, epoch)| epoch.strong_count() > 0);
        retired
    }

    /// Set `slabs` aside until the reservation drops.
    pub(crate) fn reserve(&self, slabs: impl IntoIterator<Item = SlabRef>) -> Reservation<'_> {
        let slabs: Vec<SlabRef> = slabs.into_iter().collect();
        self.reserved().extend(slabs.iter().copied());
        Reservation { holds: self, slabs }
    }

    /// Hold `slabs` while `epoch` lives.
    pub(crate) fn retire(&self, slabs: impl IntoIterator<Item = SlabRef>, epoch: Epoch) {
        let mut retired = self.retired();
        if epoch.strong_count() > 0 {
            retired.extend(slabs.into_iter().map(|slab| (slab, epoch.clone())));
        }
    }

    /// The slabs held now: reserved, or retired while their epoch lives.
    pub(crate) fn held(&self) -> BTreeSet<SlabRef> {
        let mut slabs = self.reserved().clone();
        slabs.extend(self.retired().iter().map(|(slab, _)| *slab));
        slabs
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use terrace_meta::{DiskIndex, SlabIndex};

    use super::*;

    fn slab(disk: u16, index: u32) -> SlabRef {
        SlabRef {
            disk: DiskIndex(disk),
            slab: SlabIndex(index),
        }
    }

    #[test]
    fn reserved_slabs_are_held_until_the_reservation_drops() {
        let holds = SlabHolds::default();
        let reservation = holds.reserve([slab(0, 1), slab(1, 2)]);
        assert_eq!(holds.held(), BTreeSet::from([slab(0, 1), slab(1, 2)]));
        drop(reservation);
        assert!(holds.held().is_empty());
    }

    #[test]
    fn retired_slabs_are_held_while_their_epoch_lives() {
        let holds = SlabHolds::default();
        let epoch: Arc<dyn Send + Sync> = Arc::new(());
        holds.retire([slab(2, 3)], Arc::downgrade(&epoch));
        assert_eq!(holds.held(), BTreeSet::from([slab(2, 3)]));
        drop(epoch);
        assert!(holds.held().is_empty());
        let gone: Arc<dyn Send + Sync> = Arc::new(());
        let weak = Arc::downgrade(&gone);
        drop(gone);
        holds.retire([slab(2, 4)], weak);
        assert!(
            holds.held().is_empty(),
            "an epoch already over holds nothing"
        );
    }
}
