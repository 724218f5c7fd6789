//! Disks taken out of service while writes run.
//!
//! A write records its extents dirty for each missing disk it leaves out
//! (`Volume::track_missing`) before it writes, so that a disk that comes
//! back catches up on them. It looks at the disks once, before its writes
//! are issued. A disk marked missing after that look, but before the write
//! reached it, would be left out unrecorded and come back stale. So a disk
//! is taken out in two steps: first it is named leaving, and writes that
//! look from then on record their extents for it as if it were missing;
//! then, once every write that looked before has finished, it is marked
//! missing.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use futures::channel::oneshot;
use terrace_meta::DiskIndex;

#[derive(Default)]
pub(crate) struct Departures {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Writes entering now are counted under this epoch.
    epoch: u64,
    /// Writes in flight, by the epoch they entered in.
    writers: BTreeMap<u64, u64>,
    /// Disks named leaving and not yet marked missing.
    leaving: Vec<DiskIndex>,
    /// Who waits for every write of an epoch up to this one to finish.
    waiters: Vec<(u64, oneshot::Sender<()>)>,
}

impl State {
    /// End the current epoch: writes entering from now on are counted
    /// under the next. Gives what ends once every write of this epoch or an
    /// earlier one has finished, if any is still running.
    fn close_epoch(&mut self) -> Option<oneshot::Receiver<()>> {
        let limit = self.epoch;
        self.epoch += 1;
        // Nothing to wait for unless a write of this epoch or before runs.
        self.writers.range(..=limit).next()?;
        let (sender, receiver) = oneshot::channel();
        self.waiters.push((limit, sender));
        Some(receiver)
    }
}

/// Held by a write from its look at the disks until its writes are done.
pub(crate) struct Writing<'a> {
    departures: &'a Departures,
    epoch: u64,
}

impl Departures {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write about to look at its disks: the guard it holds until its
    /// writes are done, and the disks leaving (to treat as missing).
    pub(crate) fn enter(&self) -> (Writing<'_>, Vec<DiskIndex>) {
        let mut state = self.state();
        let epoch = state.epoch;
        *state.writers.entry(epoch).or_insert(0) += 1;
        let writing = Writing {
            departures: self,
            epoch,
        };
        (writing, state.leaving.clone())
    }

    /// Name `disk` leaving, wait until every write that looked at the disks
    /// before has finished, then `mark` it (missing) and forget it here.
    pub(crate) async fn take_out(&self, disk: DiskIndex, mark: impl FnOnce()) {
        let waiting = {
            let mut state = self.state();
            state.leaving.push(disk);
            state.close_epoch()
        };
        if let Some(receiver) = waiting {
            let _ = receiver.await;
        }
        mark();
        let mut state = self.state();
        if let Some(position) = state.leaving.iter().position(|&d| d == disk) {
            state.leaving.swap_remove(position);
        }
    }
}

impl Departures {
    /// Wait until every write that looked at the disks before now has
    /// finished: one that saw a disk in service before it failed, and left
    /// it out or failed there, has noted that by then (see
    /// `Volume::note_failed_during`).
    pub(crate) async fn settle(&self) {
        let waiting = self.state().close_epoch();
        if let Some(receiver) = waiting {
            let _ = receiver.await;
        }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut state = self.departures.state();
        if let Some(count) = state.writers.get_mut(&self.epoch) {
            *count -= 1;
            if *count == 0 {
                state.writers.remove(&self.epoch);
            }
        }
        let oldest = state.writers.keys().next().copied().unwrap_or(u64::MAX);
        for (_, sender) in state.waiters.extract_if(.., |(limit, _)| *limit < oldest) {
            let _ = sender.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_disk_is_marked_only_after_the_writes_that_looked_before_it_was_leaving() {
        let departures = Departures::default();
        let (before, leaving) = departures.enter();
        assert!(leaving.is_empty());
        let marked = std::cell::Cell::new(false);
        let mut taking = departures
            .take_out(DiskIndex(3), || marked.set(true))
            .boxed_local();
        assert!(
            (&mut taking).now_or_never().is_none(),
            "a write looked before"
        );
        let (after, leaving) = departures.enter();
        assert_eq!(leaving, vec![DiskIndex(3)], "later writes see it leaving");
        assert!(!marked.get());
        drop(before);
        assert!(
            taking.now_or_never().is_some(),
            "the later write is not waited for"
        );
        assert!(marked.get());
        assert!(departures.enter().1.is_empty(), "forgotten once marked");
        drop(after);
        assert!(departures.state().writers.is_empty());
    }
}
