//! What happens in a pool, told as it happens: a disk's condition
//! changing, a metadata commit (which is how a job starts or ends and how
//! a failure becomes the pool's record), a job starting or ending, a
//! write-back log failing over to write-through.
//!
//! Each event is emitted once, where it happens, as a `tracing` event (for
//! whoever subscribes to the process's tracing) and to each receiver from
//! [`PoolEvents::subscribe`] (for the daemon, which logs what changed
//! when it hears of a change rather than by looking every second).
//!
//! ```text
//!   Disk::set_condition ─┐
//!   PoolShared::commit ──┼─► PoolEvents::emit ─► tracing::info!
//!   jobs, journal ───────┘                     └─► bounded channels
//! ```
//!
//! A receiver's channel is bounded ([`EVENTS_QUEUED_MAX`]); an event that
//! finds it full is dropped for that receiver. The events queued before it
//! still wake the receiver, which then looks at the pool as it is: nothing
//! is missed, only told in fewer steps. Emitting never waits.
//!
//! Depends on nothing of the engine but [`crate::condition`].

use std::sync::Mutex;

use futures::channel::mpsc;
use terrace_meta::{DiskIndex, SpaceId};

use crate::condition::Condition;

/// Events a receiver may have waiting: enough for a burst of disk
/// failures and the commits recording them; beyond, the events waiting
/// already wake the receiver (see the module header).
pub const EVENTS_QUEUED_MAX: usize = 64;

/// One thing that happened in a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    /// A disk's run-time condition changed.
    DiskCondition {
        disk: DiskIndex,
        condition: Condition,
        reason: String,
    },
    /// The pool's metadata reached `generation`.
    Committed { generation: u64 },
    /// A job started.
    JobStarted { job: u64 },
    /// A job ended (done, cancelled or failed).
    JobEnded { job: u64 },
    /// A space's write-back log failed; the space runs write-through.
    WriteThrough { space: SpaceId, reason: String },
    /// Blocks of a row that failed their checksums on `disk` were rebuilt
    /// from redundancy (and rewritten there, unless the pool is
    /// read-only or the rewrite failed).
    Healed {
        space: String,
        offset: u64,
        length: u64,
        disk: Option<DiskIndex>,
        blocks: u64,
        rewritten: bool,
    },
    /// A read of a row failed on `disk`, which stays in service (an
    /// unreadable sector): the row's bytes were rebuilt from redundancy
    /// and, if `rewritten`, written back there (the drive remaps the
    /// sector). `offset` and `length`: the row's place in the space.
    ReadError {
        space: String,
        offset: u64,
        length: u64,
        disk: DiskIndex,
        rewritten: bool,
    },
    /// Blocks failed their checksums on every copy and no reconstruction
    /// matched: reads of them fail.
    Unrecoverable {
        space: String,
        offset: u64,
        blocks: u64,
    },
    /// A scrub found a row whose redundancy disagreed: where (`space`,
    /// by name, and the row's `offset` in it), `what` disagreed and on
    /// which disks, and whether it is `repaired`.
    ScrubFound {
        job: u64,
        space: String,
        offset: u64,
        what: String,
        repaired: bool,
    },
    /// The slabs allocated crossed `threshold` per cent of the pool's
    /// capacity (`pool set --alert`): upwards (`rising`) or back down;
    /// `percent` is where they are now.
    Capacity {
        threshold: u8,
        percent: u64,
        rising: bool,
    },
}

/// The receivers of one pool's events.
pub(crate) struct PoolEvents {
    pool: String,
    receivers: Mutex<Vec<mpsc::Sender<PoolEvent>>>,
}

impl PoolEvents {
    pub(crate) fn new(pool: &str) -> PoolEvents {
        PoolEvents {
            pool: pool.to_string(),
            receivers: Mutex::new(Vec::new()),
        }
    }

    /// A receiver of the events emitted from now on.
    pub(crate) fn subscribe(&self) -> mpsc::Receiver<PoolEvent> {
        let (sender, receiver) = mpsc::channel(EVENTS_QUEUED_MAX);
        self.receivers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sender);
        receiver
    }

    /// Tell `event` to tracing and to every receiver; never waits.
    pub(crate) fn emit(&self, event: PoolEvent) {
        trace(&self.pool, &event);
        let mut receivers = self.receivers.lock().unwrap_or_else(|e| e.into_inner());
        if receivers.is_empty() {
            return;
        }
        receivers.retain_mut(|sender| match sender.try_send(event.clone()) {
            Ok(()) => true,
            Err(error) => !error.is_disconnected(),
        });
    }
}

fn trace(pool: &str, event: &PoolEvent) {
    match event {
        PoolEvent::DiskCondition {
            disk,
            condition,
            reason,
        } => tracing::info!(pool, disk = disk.0, ?condition, reason, "disk condition"),
        PoolEvent::Committed { generation } => {
            tracing::debug!(pool, generation, "metadata committed")
        }
        PoolEvent::Capacity {
            threshold,
            percent,
            rising,
        } => tracing::warn!(pool, threshold, percent, rising, "allocation alert"),
        PoolEvent::JobStarted { job } => tracing::info!(pool, job, "job started"),
        PoolEvent::JobEnded { job } => tracing::info!(pool, job, "job ended"),
        PoolEvent::WriteThrough { space, reason } => {
            tracing::warn!(pool, space = space.0, reason, "write-back log failed")
        }
        PoolEvent::Healed {
            space,
            offset,
            length,
            disk,
            blocks,
            rewritten,
        } => tracing::warn!(
            pool,
            space,
            offset,
            length,
            disk = disk.map(|disk| disk.0),
            blocks,
            rewritten,
            "checksum error repaired"
        ),
        PoolEvent::ReadError {
            space,
            offset,
            length,
            disk,
            rewritten,
        } => tracing::warn!(
            pool,
            space,
            offset,
            length,
            disk = disk.0,
            rewritten,
            "read error repaired from redundancy"
        ),
        PoolEvent::Unrecoverable {
            space,
            offset,
            blocks,
        } => tracing::error!(
            pool,
            space,
            offset,
            blocks,
            "blocks fail their checksums on every copy"
        ),
        PoolEvent::ScrubFound {
            job,
            space,
            offset,
            what,
            repaired,
        } => tracing::warn!(pool, job, space, offset, what, repaired, "scrub found"),
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[test]
    fn every_receiver_hears_each_event_and_a_full_one_is_not_waited_for() {
        let events = PoolEvents::new("p");
        let mut first = events.subscribe();
        let second = events.subscribe();
        let event = PoolEvent::Committed { generation: 7 };
        events.emit(event.clone());
        assert_eq!(first.try_recv().ok(), Some(event));
        drop(second);
        for generation in 0..(EVENTS_QUEUED_MAX as u64 + 10) {
            events.emit(PoolEvent::Committed { generation });
        }
        let told = futures::executor::block_on(async {
            drop(events);
            first.collect::<Vec<_>>().await
        });
        assert!(!told.is_empty() && told.len() <= EVENTS_QUEUED_MAX + 1);
    }
}
