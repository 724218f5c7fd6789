//! Per-row locks.
//!
//! A parity update reads old data and parity, computes, and writes; two
//! writers of the same row interleaving those steps would leave parity that
//! matches neither. Mirror writes take the same lock so that concurrent
//! writers of one block leave every copy equal. Degraded reads take it
//! because reconstruction reads several columns that must be consistent.
//!
//! The table holds only rows that are locked or waited for, so it is bounded
//! by the requests in flight. Waiters are all woken on release and race for
//! the lock: simple, and safe when a waiting future is dropped (a woken-one
//! scheme would lose the wake-up with it).

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::Mutex;
use std::task::{Poll, Waker};

/// A row of a space: (extent, row within the extent).
pub type RowKey = (u64, u64);

#[derive(Default)]
struct Entry {
    held: bool,
    /// Holders in shared mode (writers that never overlap each other, such
    /// as appends to a log); an exclusive holder waits for them all.
    shared: usize,
    waiters: Vec<Waker>,
}

#[derive(Default)]
pub struct RowLocks {
    table: Mutex<HashMap<RowKey, Entry>>,
}

pub struct RowGuard<'a> {
    locks: &'a RowLocks,
    key: RowKey,
    shared: bool,
}

impl RowLocks {
    pub async fn lock(&self, key: RowKey) -> RowGuard<'_> {
        self.acquire(key, false).await
    }

    /// Share the row with other shared holders (writers that never overlap
    /// each other); exclusive holders still exclude them.
    pub async fn lock_shared(&self, key: RowKey) -> RowGuard<'_> {
        self.acquire(key, true).await
    }

    async fn acquire(&self, key: RowKey, shared: bool) -> RowGuard<'_> {
        poll_fn(|context| {
            let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
            let entry = table.entry(key).or_default();
            let free = !entry.held && (shared || entry.shared == 0);
            if free {
                if shared {
                    entry.shared += 1;
                } else {
                    entry.held = true;
                }
                Poll::Ready(())
            } else {
                if !entry.waiters.iter().any(|w| w.will_wake(context.waker())) {
                    entry.waiters.push(context.waker().clone());
                }
                Poll::Pending
            }
        })
        .await;
        RowGuard {
            locks: self,
            key,
            shared,
        }
    }

    /// Rows currently locked or waited on.
    #[cfg(test)]
    pub fn active(&self) -> usize {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut table = self.locks.table.lock().unwrap_or_else(|e| e.into_inner());
            let entry = table.get_mut(&self.key).expect("a held row has an entry");
            if self.shared {
                entry.shared -= 1;
            } else {
                debug_assert!(entry.held);
                entry.held = false;
            }
            let released = !entry.held && entry.shared == 0;
            let waiters = if released {
                std::mem::take(&mut entry.waiters)
            } else {
                Vec::new()
            };
            if released {
                // Woken waiters poll again and put the row back if they
                // still want it; ones that gave up leave nothing behind.
                table.remove(&self.key);
            }
            waiters
        };
        for waker in waiters {
            waker.wake();
        }
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
}
