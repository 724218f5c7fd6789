//! The memory budget of a pool's write-back logs: how many bytes of log
//! records they keep in memory, and how many they may.
//!
//! A record logged while the budget has room keeps its data in memory
//! until the ring's tail passes it; one logged beyond the budget keeps
//! only where its blocks lie in the log, and reads and destaging read them
//! back from the log's disks. A log smaller than the budget never reads
//! its own data back.
//!
//! Depends on nothing of the engine: two counters, shared by every log of
//! the pool without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub(crate) struct LogMemory {
    held: AtomicU64,
    max: AtomicU64,
}

impl LogMemory {
    pub(crate) fn new(max_bytes: u64) -> LogMemory {
        LogMemory {
            held: AtomicU64::new(0),
            max: AtomicU64::new(max_bytes),
        }
    }

    /// Take `bytes` of the budget if it has room for them.
    pub(crate) fn take(&self, bytes: u64) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= max)
            })
            .is_ok()
    }

    pub(crate) fn give_back(&self, bytes: u64) {
        if bytes > 0 {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Let the logs keep up to `bytes` from now on; what they hold beyond
    /// it stays until given back.
    pub(crate) fn set_max(&self, bytes: u64) {
        self.max.store(bytes, Ordering::Relaxed);
    }

    /// Bytes held now, and the most the logs may hold.
    pub(crate) fn usage(&self) -> (u64, u64) {
        (
            self.held.load(Ordering::Relaxed),
            self.max.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_never_exceeded_and_comes_back() {
        let memory = LogMemory::new(100);
        assert!(memory.take(60));
        assert!(!memory.take(41), "beyond the budget");
        assert!(memory.take(40));
        assert_eq!(memory.usage(), (100, 100));
        memory.give_back(60);
        assert_eq!(memory.usage(), (40, 100));
        memory.set_max(30);
        assert!(!memory.take(1));
    }
}
