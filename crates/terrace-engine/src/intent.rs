//! The run-time side of the pool's write intent: which extents the durable
//! list names, and per extent the writes in flight and when it was last
//! written. The durable list itself is written by the pool's shared state
//! (`control`: the intent slots, or a metadata commit); this module only
//! decides what it must name.
//!
//! ```text
//!   begin(extents) ──► counted in flight; those not yet named are missing:
//!                      the caller names them durably, then `named`
//!   end(extents)   ──► in flight - 1, last written = now (the guard drops)
//!   take_idle(now) ──► named extents unwritten for INTENT_IDLE_NS, off the
//!                      fast path (a new write names them again); the caller
//!                      flushes, then `keeps` says which stay in the list
//! ```
//!
//! Depends on nothing of the engine: pure bookkeeping under one lock,
//! never held across an await.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use rustc_hash::{FxHashMap, FxHashSet};
use terrace_meta::SpaceId;

pub(crate) use terrace_meta::format::INTENT_WHOLE_SPACE;

/// How long an extent must go unwritten before its write intent is
/// cleared: long enough that a busy extent costs no commits, short enough
/// that a crash finds little to resynchronise.
pub(crate) const INTENT_IDLE_NS: u64 = 5_000_000_000;

/// One extent of one space (`INTENT_WHOLE_SPACE`: every extent of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ExtentKey {
    pub(crate) space: u64,
    pub(crate) extent: u32,
}

impl ExtentKey {
    pub(crate) fn new(space: SpaceId, extent: u32) -> ExtentKey {
        ExtentKey {
            space: space.0,
            extent,
        }
    }

    fn whole(self) -> bool {
        self.extent == INTENT_WHOLE_SPACE
    }
}

#[derive(Default)]
struct State {
    /// Extents the durable list names.
    named: FxHashSet<ExtentKey>,
    /// Per extent: writes in flight, and when it was last written.
    activity: FxHashMap<ExtentKey, (u32, u64)>,
}

/// The write intent's bookkeeping, shared by every writer of the pool.
#[derive(Default)]
pub(crate) struct WriteIntent {
    state: Mutex<State>,
}

impl WriteIntent {
    /// With the durable list `named` as imported.
    pub(crate) fn new(named: impl IntoIterator<Item = ExtentKey>) -> WriteIntent {
        WriteIntent {
            state: Mutex::new(State {
                named: named.into_iter().collect(),
                activity: FxHashMap::default(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count a write to `extents` of `space` in flight from `now`; gives the
    /// extents the durable list does not name yet.
    pub(crate) fn begin(&self, space: SpaceId, extents: Range<u32>, now: u64) -> Vec<u32> {
        let mut state = self.state();
        for extent in extents.clone() {
            let entry = state
                .activity
                .entry(ExtentKey::new(space, extent))
                .or_insert((0, now));
            entry.0 += 1;
            entry.1 = now;
        }
        if state
            .named
            .contains(&ExtentKey::new(space, INTENT_WHOLE_SPACE))
        {
            return Vec::new();
        }
        extents
            .filter(|&extent| !state.named.contains(&ExtentKey::new(space, extent)))
            .collect()
    }

    /// The durable list names `extents` of `space` now.
    pub(crate) fn named(&self, space: SpaceId, extents: &[u32]) {
        let mut state = self.state();
        state
            .named
            .extend(extents.iter().map(|&extent| ExtentKey::new(space, extent)));
    }

    /// A write to `extents` of `space` begun by [`WriteIntent::begin`] ended
    /// at `now`.
    pub(crate) fn end(&self, space: SpaceId, extents: Range<u32>, now: u64) {
        let mut state = self.state();
        for extent in extents {
            if let Some(entry) = state.activity.get_mut(&ExtentKey::new(space, extent)) {
                entry.0 = entry.0.saturating_sub(1);
                entry.1 = now;
            }
        }
    }

    /// Named extents idle since `now - INTENT_IDLE_NS` (a whole space when
    /// every extent of it is), except those `kept` (still owed a resync),
    /// taken off the fast path: a write from now on names them again.
    pub(crate) fn take_idle(&self, now: u64, kept: impl Fn(ExtentKey) -> bool) -> Vec<ExtentKey> {
        let mut state = self.state();
        let idle = |&(in_flight, last): &(u32, u64)| {
            in_flight == 0 && now.saturating_sub(last) >= INTENT_IDLE_NS
        };
        let taken: Vec<ExtentKey> = state
            .named
            .iter()
            .copied()
            .filter(|&key| !kept(key))
            .filter(|key| {
                if key.whole() {
                    state
                        .activity
                        .iter()
                        .filter(|(other, _)| other.space == key.space)
                        .all(|(_, entry)| idle(entry))
                } else {
                    state.activity.get(key).is_none_or(idle)
                }
            })
            .collect();
        for key in &taken {
            state.named.remove(key);
            state.activity.remove(key);
        }
        taken
    }

    /// Whether the durable list keeps `key` after `idle` (from
    /// [`WriteIntent::take_idle`]) was flushed: an extent not taken, named
    /// again since, or with a write in flight (to it, or to any extent of
    /// a whole space named) stays.
    pub(crate) fn keeps(&self, key: ExtentKey, idle: &[ExtentKey]) -> bool {
        let state = self.state();
        let busy = state.activity.iter().any(|(other, entry)| {
            entry.0 > 0 && other.space == key.space && (other.extent == key.extent || key.whole())
        });
        !idle.contains(&key) || state.named.contains(&key) || busy
    }

    /// After import acted on the list: it names `keep` only.
    pub(crate) fn reset(&self, keep: impl IntoIterator<Item = ExtentKey>) {
        self.state().named = keep.into_iter().collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: SpaceId = SpaceId(3);

    #[test]
    fn a_write_names_only_what_the_list_lacks_and_a_whole_space_covers_all() {
        let intent = WriteIntent::default();
        assert_eq!(intent.begin(S, 0..3, 0), vec![0, 1, 2]);
        intent.named(S, &[0, 1, 2]);
        assert_eq!(intent.begin(S, 2..5, 0), vec![3, 4]);
        let whole = WriteIntent::new([ExtentKey::new(S, INTENT_WHOLE_SPACE)]);
        assert!(whole.begin(S, 7..9, 0).is_empty());
        assert_eq!(whole.begin(SpaceId(4), 0..1, 0), vec![0], "another space");
    }

    #[test]
    fn only_extents_idle_long_enough_and_not_kept_are_taken() {
        let intent = WriteIntent::default();
        intent.begin(S, 0..2, 0);
        intent.named(S, &[0, 1]);
        intent.end(S, 0..1, 10);
        // Extent 1 is still in flight; extent 0 not idle for long enough.
        assert!(intent.take_idle(INTENT_IDLE_NS, |_| false).is_empty());
        let later = 10 + INTENT_IDLE_NS;
        assert!(intent.take_idle(later, |_| true).is_empty(), "kept");
        assert_eq!(
            intent.take_idle(later, |_| false),
            vec![ExtentKey::new(S, 0)]
        );
        // Taken off the fast path: the next write names it again.
        assert_eq!(intent.begin(S, 0..1, later), vec![0]);
    }

    #[test]
    fn the_list_keeps_what_was_named_again_or_is_busy() {
        let intent = WriteIntent::default();
        intent.begin(S, 0..2, 0);
        intent.named(S, &[0, 1]);
        intent.end(S, 0..2, 0);
        let idle = intent.take_idle(INTENT_IDLE_NS, |_| false);
        assert_eq!(idle.len(), 2);
        assert!(!intent.keeps(ExtentKey::new(S, 0), &idle));
        assert!(intent.keeps(ExtentKey::new(S, 5), &idle), "not taken");
        intent.begin(S, 1..2, INTENT_IDLE_NS);
        assert!(intent.keeps(ExtentKey::new(S, 1), &idle), "busy again");
        let whole = ExtentKey::new(S, INTENT_WHOLE_SPACE);
        assert!(intent.keeps(whole, &[whole]), "a write to any extent of it");
        intent.reset([]);
        assert_eq!(intent.begin(S, 9..10, 0), vec![9]);
    }
}
