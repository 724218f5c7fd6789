//! Where a slot of an extent lives — usually one place, two during a move.
//!
//! ```text
//!  slot of an extent, during a repair or move of its slab:
//!
//!   row:        0 1 2 3 4 5 6 7 8 9
//!   old slab:   ■ ■ ■ ■ ■ ■ ■ ■ ■ ■   valid wherever its disk is online
//!   new slab:   ■ ■ ■ ■ □ □ □ □ □ □   valid below the watermark (4)
//! ```
//!
//! A location is valid for a row when its disk is online and the row is
//! below its watermark (or it has none). Reads use the first valid
//! location; writes go to every valid one, so a move from an online disk can
//! be cancelled or cut by a crash at any row without losing a write, and a
//! repair of an offline disk fills the new slab row by row while clients
//! keep writing. The watermark only rises, by the job that copies or
//! rebuilds each row while holding that row's lock, so a writer of the row
//! either finished before the row was copied (and the copy saw its data) or
//! starts after (and sees the new location valid).
//!
//! A disk that comes back after missing writes is the same picture with
//! one location: its own slab, valid below the watermark of its resync.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::disk::Disk;

#[derive(Clone)]
pub struct Location {
    pub disk: Arc<Disk>,
    /// Byte offset of the slab on the disk.
    pub base: u64,
    /// Rows below this are valid here; `None`: every row.
    pub valid_below: Option<Arc<AtomicU64>>,
}

impl Location {
    pub fn whole(disk: Arc<Disk>, base: u64) -> Location {
        Location {
            disk,
            base,
            valid_below: None,
        }
    }

    pub fn valid_for(&self, row: u64) -> bool {
        self.disk.is_online()
            && self
                .valid_below
                .as_ref()
                .is_none_or(|mark| row < mark.load(Ordering::Acquire))
    }

    /// Whether `other` is the same slab of the same disk.
    pub fn same_place(&self, other: &Location) -> bool {
        self.disk.index == other.disk.index && self.base == other.base
    }

    /// Valid for every row.
    pub fn complete(&self) -> bool {
        self.disk.is_online() && self.valid_below.is_none()
    }
}

#[derive(Clone)]
pub struct Target {
    pub locations: Vec<Location>,
}

impl Target {
    pub fn single(disk: Arc<Disk>, base: u64) -> Target {
        Target {
            locations: vec![Location::whole(disk, base)],
        }
    }

    /// The location to read `row` from.
    pub fn readable(&self, row: u64) -> Option<&Location> {
        self.locations
            .iter()
            .find(|location| location.valid_for(row))
    }

    /// Every location `row` must be written to.
    pub fn writable(&self, row: u64) -> impl Iterator<Item = &Location> {
        self.locations
            .iter()
            .filter(move |location| location.valid_for(row))
    }

    /// Whether the slot has every row somewhere (for health and tolerance).
    pub fn complete(&self) -> bool {
        self.locations.iter().any(Location::complete)
    }

    /// The slot's own slab (the first location).
    pub fn home(&self) -> &Location {
        &self.locations[0]
    }
}
