//! Per-row locks.
//!
//! A parity update reads old data and parity, computes, and writes; two
//! writers of the same row interleaving those steps would leave parity that
//! matches neither. Degraded reads take the lock because reconstruction
//! reads several columns that must be consistent, and so do moves, rebuilds
//! and sub-block writes (read the edge blocks, merge, write them back).
//!
//! Whole-block writes of simple and mirror rows only conflict with writers
//! of the same blocks, so they lock the byte range they write, not the row
//! (a 1 MiB row of a 4-column space otherwise lets one 64 KiB write of a
//! sequential stream proceed at a time). Mirror writers of overlapping
//! ranges still take turns, which keeps every copy equal.
//!
//! ```text
//!   row:        |-------- A --------|            |---- C ----|
//!                          |------- B -------|
//!   A and C hold ranges at once; B waits for A; an exclusive holder
//!   (parity update, move, sub-block write) waits for A and C, and while
//!   it waits no new range is granted, so it is not starved.
//! ```
//!
//! The table holds only rows that are locked or waited for, so it is bounded
//! by the requests in flight. Waiters are all woken on release and race for
//! the lock: simple, and safe when a waiting future is dropped (a woken-one
//! scheme would lose the wake-up with it).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A row of a space: (extent, row within the extent).
pub type RowKey = (u64, u64);

/// Bytes `[start, end)` of a row's data.
pub type RowRange = (u64, u64);

#[derive(Default)]
struct Entry {
    held: bool,
    /// Holders in shared mode (writers that never overlap each other, such
    /// as appends to a log); an exclusive holder waits for them all.
    shared: usize,
    /// Ranges held by whole-block writers; they exclude overlapping ranges
    /// and exclusive holders.
    ranges: Vec<RowRange>,
    /// Exclusive acquirers that are waiting: while there are any, no new
    /// shared or range holder is let in.
    exclusive_waiting: usize,
    waiters: Vec<Waker>,
}

impl Entry {
    fn idle(&self) -> bool {
        !self.held && self.shared == 0 && self.ranges.is_empty() && self.exclusive_waiting == 0
    }
}

#[derive(Default)]
pub struct RowLocks {
    table: Mutex<HashMap<RowKey, Entry>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Exclusive,
    Shared,
    Range(RowRange),
}

pub struct RowGuard<'a> {
    locks: &'a RowLocks,
    key: RowKey,
    mode: Mode,
}

impl RowLocks {
    pub async fn lock(&self, key: RowKey) -> RowGuard<'_> {
        self.acquire(key, Mode::Exclusive).await
    }

    /// Share the row with other shared holders (writers that never overlap
    /// each other); exclusive holders still exclude them.
    pub async fn lock_shared(&self, key: RowKey) -> RowGuard<'_> {
        self.acquire(key, Mode::Shared).await
    }

    /// Hold bytes `range` of the row: other ranges that do not overlap it
    /// (and shared holders) may be held at the same time; exclusive holders
    /// and overlapping ranges wait.
    pub async fn lock_range(&self, key: RowKey, range: RowRange) -> RowGuard<'_> {
        debug_assert!(range.0 < range.1);
        self.acquire(key, Mode::Range(range)).await
    }

    /// Give something up on `key` (`change`), then wake everyone waiting
    /// there: a range that overlapped, an exclusive holder once the row is
    /// free, or those an exclusive waiter held back. Woken waiters poll
    /// again and put the row back if they still want it; an idle entry
    /// goes, so ones that gave up leave nothing behind.
    /// False if `key` has no entry.
    fn release(&self, key: RowKey, change: impl FnOnce(&mut Entry)) -> bool {
        let waiters = {
            let mut table = self.table();
            let Some(entry) = table.get_mut(&key) else {
                return false;
            };
            change(entry);
            let waiters = std::mem::take(&mut entry.waiters);
            if entry.idle() {
                table.remove(&key);
            }
            waiters
        };
        for waker in waiters {
            waker.wake();
        }
        true
    }

    fn table(&self) -> MutexGuard<'_, HashMap<RowKey, Entry>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn acquire(&self, key: RowKey, mode: Mode) -> Acquire<'_> {
        Acquire {
            locks: self,
            key,
            mode,
            counted: false,
            done: false,
        }
    }

    /// Rows currently locked or waited on.
    #[cfg(test)]
    pub fn active(&self) -> usize {
        self.table().len()
    }
}

/// Whether `mode` may be granted in `entry` now; `counted` is whether this
/// acquirer is one of the exclusive waiters.
fn grantable(entry: &Entry, mode: Mode, counted: bool) -> bool {
    if entry.held {
        return false;
    }
    match mode {
        Mode::Exclusive => entry.shared == 0 && entry.ranges.is_empty(),
        _ if entry.exclusive_waiting > usize::from(counted) => false,
        Mode::Shared => true,
        Mode::Range((start, end)) => entry
            .ranges
            .iter()
            .all(|&(held_start, held_end)| end <= held_start || held_end <= start),
    }
}

/// The future of [`RowLocks::acquire`]; dropping it while it waits takes
/// back its place among the exclusive waiters.
struct Acquire<'a> {
    locks: &'a RowLocks,
    key: RowKey,
    mode: Mode,
    /// Counted in `exclusive_waiting` (an exclusive acquirer that waited).
    counted: bool,
    done: bool,
}

impl<'a> Future for Acquire<'a> {
    type Output = RowGuard<'a>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<RowGuard<'a>> {
        let this = &mut *self;
        let mut table = this.locks.table();
        let entry = table.entry(this.key).or_default();
        if grantable(entry, this.mode, this.counted) {
            if this.counted {
                entry.exclusive_waiting -= 1;
                this.counted = false;
            }
            match this.mode {
                Mode::Exclusive => entry.held = true,
                Mode::Shared => entry.shared += 1,
                Mode::Range(range) => entry.ranges.push(range),
            }
            this.done = true;
            return Poll::Ready(RowGuard {
                locks: this.locks,
                key: this.key,
                mode: this.mode,
            });
        }
        if this.mode == Mode::Exclusive && !this.counted {
            entry.exclusive_waiting += 1;
            this.counted = true;
        }
        if !entry.waiters.iter().any(|w| w.will_wake(context.waker())) {
            entry.waiters.push(context.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        if self.done || !self.counted {
            return;
        }
        // An exclusive waiter gives up: others it held back may go now.
        self.locks
            .release(self.key, |entry| entry.exclusive_waiting -= 1);
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        let mode = self.mode;
        let held = self.locks.release(self.key, |entry| match mode {
            Mode::Exclusive => {
                debug_assert!(entry.held);
                entry.held = false;
            }
            Mode::Shared => entry.shared -= 1,
            Mode::Range(range) => {
                let position = entry
                    .ranges
                    .iter()
                    .position(|&held| held == range)
                    .expect("a held range is listed");
                entry.ranges.swap_remove(position);
            }
        });
        assert!(held, "a held row has an entry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use futures::FutureExt;

    #[test]
    fn excludes_and_releases() {
        let locks = RowLocks::default();
        let guard = block_on(locks.lock((0, 1)));
        assert!(
            locks.lock((0, 1)).now_or_never().is_none(),
            "held row blocks"
        );
        assert!(
            locks.lock((0, 2)).now_or_never().is_some(),
            "other rows are free"
        );
        drop(guard);
        assert!(locks.lock((0, 1)).now_or_never().is_some());
        assert_eq!(locks.active(), 0, "released rows leave the table");
    }

    #[test]
    fn shared_holders_share_and_exclude_exclusive_ones() {
        let locks = RowLocks::default();
        let first = block_on(locks.lock_shared((0, 1)));
        let second = locks.lock_shared((0, 1)).now_or_never();
        assert!(second.is_some(), "shared holders share");
        assert!(
            locks.lock((0, 1)).now_or_never().is_none(),
            "exclusive waits"
        );
        drop(first);
        assert!(
            locks.lock((0, 1)).now_or_never().is_none(),
            "one shared left"
        );
        drop(second);
        let exclusive = block_on(locks.lock((0, 1)));
        assert!(
            locks.lock_shared((0, 1)).now_or_never().is_none(),
            "shared waits"
        );
        drop(exclusive);
        assert_eq!(locks.active(), 0);
    }

    /// Return Pending once, after asking to be polled again.
    async fn yield_once() {
        let mut yielded = false;
        std::future::poll_fn(|context| {
            if yielded {
                Poll::Ready(())
            } else {
                yielded = true;
                context.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await
    }

    #[test]
    fn waiters_run_one_at_a_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let locks = RowLocks::default();
        let inside = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let tasks = (0..16).map(|_| async {
            let _guard = locks.lock((3, 3)).await;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            yield_once().await; // let the others run while holding the lock
            inside.fetch_sub(1, Ordering::SeqCst);
        });
        block_on(futures::future::join_all(tasks));
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(locks.active(), 0);
    }
    #[test]
    fn ranges_share_a_row_unless_they_overlap() {
        let locks = RowLocks::default();
        let first = block_on(locks.lock_range((0, 1), (0, 4096)));
        let second = locks.lock_range((0, 1), (4096, 8192)).now_or_never();
        assert!(second.is_some(), "disjoint ranges share the row");
        assert!(
            locks
                .lock_range((0, 1), (4095, 4097))
                .now_or_never()
                .is_none(),
            "an overlapping range waits"
        );
        assert!(
            locks.lock((0, 1)).now_or_never().is_none(),
            "exclusive waits for ranges"
        );
        drop(first);
        assert!(locks.lock_range((0, 1), (0, 4096)).now_or_never().is_some());
        drop(second);
        let exclusive = block_on(locks.lock((0, 1)));
        assert!(
            locks.lock_range((0, 1), (0, 4096)).now_or_never().is_none(),
            "ranges wait for an exclusive holder"
        );
        drop(exclusive);
        assert_eq!(locks.active(), 0);
    }

    #[test]
    fn a_waiting_exclusive_holder_is_not_starved_by_new_ranges() {
        let locks = RowLocks::default();
        let range = block_on(locks.lock_range((0, 1), (0, 4096)));
        let mut exclusive = Box::pin(locks.lock((0, 1)));
        assert!((&mut exclusive).now_or_never().is_none());
        assert!(
            locks
                .lock_range((0, 1), (8192, 12288))
                .now_or_never()
                .is_none(),
            "no new range while an exclusive holder waits"
        );
        drop(range);
        let guard = (&mut exclusive).now_or_never().expect("granted once free");
        drop(guard);
        drop(exclusive);
        // A waiter that gives up lets the others in.
        let range = block_on(locks.lock_range((0, 1), (0, 4096)));
        let mut waiting = Box::pin(locks.lock((0, 1)));
        assert!((&mut waiting).now_or_never().is_none());
        drop(waiting);
        assert!(locks
            .lock_range((0, 1), (8192, 12288))
            .now_or_never()
            .is_some());
        drop(range);
        assert_eq!(locks.active(), 0);
    }
}
