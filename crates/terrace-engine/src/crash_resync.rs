//! Mirrors resynchronised after an unclean shutdown while they serve.
//!
//! A power cut can leave a mirror row with its copies different: a write
//! cut between them. Only extents the write intent names can hold such a
//! row (or every extent, where a space was named whole or a log could not
//! account for it). Import does not resynchronise a mirror's extents
//! before the pool serves; it notes them here and returns, and:
//!
//! - a read of a row not yet resynchronised resynchronises it first, under
//!   the row's lock, the copies it rewrites durable (FUA) before the read
//!   returns: what a client reads is then what every copy holds, so
//!   neither a copy lost later nor a power cut can change it;
//! - the job runner's pass ([`crate::Pool::resync_after_crash`]) goes
//!   through the rest, a few rows at a time, paced by the pool's repair
//!   rate;
//! - a move meanwhile may copy a row's other version to its target: the
//!   row's resync compares every location of every copy, so it mends the
//!   target too;
//! - a check leaves rows not yet resynchronised out and counts them
//!   (`unsynced_rows`): their copies may differ, and either is a valid
//!   outcome of a write never flushed;
//! - the extents stay named in the write intent until every row is done and
//!   the disks are flushed (the idle clearing of the intent does that), so
//!   a crash during the pass finds them again; a close before then keeps
//!   them named and the pool unclean.
//!
//! Writes need nothing: they reach every copy, and a row resynchronised
//! stays in agreement. Parity spaces are still resynchronised at import:
//! there, stale parity would feed partial-row updates and reconstruction
//! (they name extents only without a working log: `--cache 0`, or a log
//! that failed).
//!
//! ```text
//!   import ─ note named extents ─ serve
//!                 │                 └─ read of row r: resync r (locked), then read
//!                 └─ job runner: resync rows left ─ extent done ─ intent cleared once idle
//! ```
//!
//! This module is the bookkeeping only; the resync of a row on read and
//! the background pass are in `redundancy.rs`.
//!
//! May depend on: `terrace_meta`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use terrace_meta::format::INTENT_WHOLE_SPACE;
use terrace_meta::SpaceId;

/// Rows of one extent still to resynchronise.
struct RowsLeft {
    /// One bit per row of the extent, set once the row is done.
    done: Vec<u64>,
    rows: u64,
    left: u64,
}

impl RowsLeft {
    fn new(rows: u64) -> RowsLeft {
        RowsLeft {
            done: vec![0; rows.div_ceil(64) as usize],
            rows,
            left: rows,
        }
    }

    /// Rows past the end of the space count as done.
    fn is_done(&self, row: u64) -> bool {
        row >= self.rows || self.done[(row / 64) as usize] & (1 << (row % 64)) != 0
    }
}

/// How far a space's resync after an unclean shutdown has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncProgress {
    /// Extents owed at the import, and left.
    pub extents_total: u64,
    pub extents_left: u64,
    /// Bytes of the space's rows owed at the import, and resynchronised
    /// since.
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// Bytes per second since the import.
    pub rate_bytes_per_second: u64,
    /// Seconds to the end at that rate, once there is one.
    pub eta_seconds: Option<u64>,
}

/// A space's share of the resync.
struct SpaceShare {
    extents_total: u64,
    row_bytes: u64,
    rows_total: u64,
    rows_done: u64,
    started_ns: u64,
}

#[derive(Default)]
struct State {
    extents: HashMap<(u64, u32), RowsLeft>,
    spaces: HashMap<u64, SpaceShare>,
}

impl State {
    fn extents_of(&self, space: SpaceId) -> u64 {
        self.extents.keys().filter(|key| key.0 == space.0).count() as u64
    }

    fn forget_done_spaces(&mut self) {
        let extents = &self.extents;
        self.spaces
            .retain(|space, _| extents.keys().any(|key| key.0 == *space));
    }
}

/// The extents of mirror spaces left to resynchronise since an unclean
/// shutdown.
#[derive(Default)]
pub(crate) struct CrashResync {
    /// Extents in `state`: the read path's fast check.
    pending: AtomicUsize,
    state: Mutex<State>,
}

impl CrashResync {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note `extents` of `space` to resynchronise, each with the rows (of
    /// `row_bytes`) it has within the space, at `now_ns`.
    pub(crate) fn note(
        &self,
        space: SpaceId,
        extents: impl IntoIterator<Item = (u32, u64)>,
        row_bytes: u64,
        now_ns: u64,
    ) {
        let mut state = self.state();
        let (mut extents_total, mut rows_total) = (0, 0);
        for (extent, rows) in extents.into_iter().filter(|(_, rows)| *rows > 0) {
            state.extents.entry((space.0, extent)).or_insert_with(|| {
                extents_total += 1;
                rows_total += rows;
                RowsLeft::new(rows)
            });
        }
        if rows_total > 0 {
            let share = state.spaces.entry(space.0).or_insert(SpaceShare {
                extents_total: 0,
                row_bytes,
                rows_total: 0,
                rows_done: 0,
                started_ns: now_ns,
            });
            share.extents_total += extents_total;
            share.rows_total += rows_total;
        }
        self.pending.store(state.extents.len(), Ordering::Release);
    }

    /// Extents left, every space.
    pub(crate) fn extents_pending(&self) -> u64 {
        self.pending.load(Ordering::Acquire) as u64
    }

    /// Whether `row` of `extent` of `space` is still to resynchronise.
    pub(crate) fn wanted(&self, space: SpaceId, extent: u64, row: u64) -> bool {
        if self.pending.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.state()
            .extents
            .get(&(space.0, extent as u32))
            .is_some_and(|rows| !rows.is_done(row))
    }

    /// `row` of `extent` of `space` agrees again; the extent leaves the
    /// list with its last row.
    pub(crate) fn done(&self, space: SpaceId, extent: u64, row: u64) {
        let mut state = self.state();
        let key = (space.0, extent as u32);
        let Some(rows) = state.extents.get_mut(&key) else {
            return;
        };
        if rows.is_done(row) {
            return;
        }
        rows.done[(row / 64) as usize] |= 1 << (row % 64);
        rows.left -= 1;
        let finished = rows.left == 0;
        if let Some(share) = state.spaces.get_mut(&space.0) {
            share.rows_done += 1;
        }
        if finished {
            state.extents.remove(&key);
            state.forget_done_spaces();
            self.pending.store(state.extents.len(), Ordering::Release);
        }
    }

    /// Drop what is left of `space` (deleted).
    pub(crate) fn forget(&self, space: SpaceId) {
        let mut state = self.state();
        state.extents.retain(|key, _| key.0 != space.0);
        state.forget_done_spaces();
        self.pending.store(state.extents.len(), Ordering::Release);
    }

    /// Whether the write-intent entry `key` (an extent, or a whole space)
    /// covers an extent still to resynchronise: it stays named.
    pub(crate) fn holds(&self, key: (u64, u32)) -> bool {
        self.pending.load(Ordering::Acquire) > 0 && covers(self.state().extents.keys(), key)
    }

    /// The extents still to resynchronise now, as (space, extent).
    pub(crate) fn owed(&self) -> Vec<(u64, u32)> {
        self.state().extents.keys().copied().collect()
    }

    /// Extents of `space` still to resynchronise.
    pub(crate) fn extents_left(&self, space: SpaceId) -> u64 {
        if self.pending.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.state().extents_of(space)
    }

    /// How far `space`'s resync has gone at `now_ns`, while it has one.
    pub(crate) fn progress(&self, space: SpaceId, now_ns: u64) -> Option<ResyncProgress> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let state = self.state();
        let share = state.spaces.get(&space.0)?;
        let bytes_total = share.rows_total * share.row_bytes;
        let bytes_done = share.rows_done * share.row_bytes;
        let elapsed_ns = now_ns.saturating_sub(share.started_ns);
        let rate_bytes_per_second = if elapsed_ns == 0 {
            0
        } else {
            (u128::from(bytes_done) * 1_000_000_000 / u128::from(elapsed_ns)) as u64
        };
        Some(ResyncProgress {
            extents_total: share.extents_total,
            extents_left: state.extents_of(space),
            bytes_total,
            bytes_done,
            rate_bytes_per_second,
            eta_seconds: (rate_bytes_per_second > 0)
                .then(|| (bytes_total - bytes_done).div_ceil(rate_bytes_per_second)),
        })
    }

    /// The next extent for the background pass (the lowest), and the rows
    /// it still has to do.
    pub(crate) fn next(&self) -> Option<(SpaceId, u32, Vec<u64>)> {
        let state = self.state();
        let (&key, rows) = state.extents.iter().min_by_key(|(key, _)| **key)?;
        let left = (0..rows.rows).filter(|&row| !rows.is_done(row)).collect();
        Some((SpaceId(key.0), key.1, left))
    }
}

/// Whether the write-intent entry `key` (an extent, or a whole space)
/// covers one of `extents`.
pub(crate) fn covers<'a>(
    mut extents: impl Iterator<Item = &'a (u64, u32)>,
    key: (u64, u32),
) -> bool {
    if key.1 == INTENT_WHOLE_SPACE {
        extents.any(|other| other.0 == key.0)
    } else {
        extents.any(|other| *other == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extent_leaves_with_its_last_row() {
        let resync = CrashResync::default();
        let space = SpaceId(7);
        resync.note(space, [(2, 3), (5, 3)], 4096, 0);
        assert!(resync.wanted(space, 2, 0));
        assert!(!resync.wanted(space, 3, 0));
        assert!(resync.holds((7, INTENT_WHOLE_SPACE)));
        resync.done(space, 2, 1);
        resync.done(space, 2, 1);
        assert_eq!(resync.next(), Some((space, 2, vec![0, 2])));
        let progress = resync.progress(space, 2_000_000_000).unwrap();
        assert_eq!(
            (progress.bytes_total, progress.bytes_done),
            (6 * 4096, 4096)
        );
        assert_eq!((progress.extents_total, progress.extents_left), (2, 2));
        assert_eq!(progress.rate_bytes_per_second, 2048);
        assert_eq!(progress.eta_seconds, Some(10));
        resync.done(space, 2, 0);
        resync.done(space, 2, 2);
        assert!(!resync.wanted(space, 2, 0));
        assert!(!resync.holds((7, 2)));
        assert!(resync.holds((7, 5)));
        assert_eq!(resync.extents_left(space), 1);
        resync.forget(space);
        assert_eq!(resync.next(), None);
        assert_eq!(resync.progress(space, 0), None);
        assert!(!resync.holds((7, INTENT_WHOLE_SPACE)));
    }
}
