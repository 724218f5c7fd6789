//! Packing concurrent logged writes into shared records.
//!
//! Every record costs a header block of ring space, one write to each log
//! copy and, until the next group commit, a place in the flush queue. A
//! 4 KiB client write in a record of its own therefore uses 8 KiB of ring
//! and two log writes per copy's worth of work for one block of data. Under
//! load many writes are in flight at once, so they share records instead:
//!
//! * At most [`WRITERS`] records of client writes are being written to the
//!   log at any moment. A write that finds a writer free takes it and goes
//!   at once, alone: a lone write never waits for company.
//! * A write that finds every writer busy joins the newest waiting batch
//!   (or opens one when that batch is full: [`Limits`]).
//! * When a record's write completes (well or not) its writer passes to the
//!   oldest waiting batch: the batch's first write still waiting becomes its
//!   leader, writes the whole batch as one record (one entry per write, in
//!   arrival order, so a later write over the same block wins, in memory
//!   and on replay alike), waits for the group commit and tells the others
//!   the outcome.
//!
//! Only small writes ([`SHARED_MAX_BYTES`] and less) share records and
//! count against the writers: for them the header doubles the cost.
//!
//! A write is acknowledged only after its record is durable, as before;
//! sharing changes how many records carry the data, not when it is safe.

use std::collections::VecDeque;

use futures::channel::oneshot;
use terrace_io::Bytes;
use terrace_layout::BLOCK_BYTES;

use super::Contents;

/// Records of small client writes written to the log at once.
pub(crate) const WRITERS: usize = 4;
/// Writes larger than this go in records of their own, as they come: their
/// header is a small share of them, and a large write waiting for a writer
/// would hold back the stream it belongs to (a restore's 64 KiB pieces that
/// miss their row's gather).
pub(crate) const SHARED_MAX_BYTES: u64 = 16 << 10;

/// What an arriving write learns: go now (it took a free writer; the batch
/// holds it alone), or wait to hear its [`Turn`].
pub(crate) enum Arrival {
    Go(Batch),
    Wait(oneshot::Receiver<Turn>),
}

/// What a waiting write learns: lead its batch, or how the batch went.
pub(crate) enum Turn {
    Lead(Batch),
    Done(Result<(), String>),
}

/// How much one record may carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub payload_bytes: u64,
    pub entries: usize,
}

/// Writes that go to the log as one record.
pub(crate) struct Batch {
    /// (space offset, data) in arrival order; block-aligned.
    pub writes: Vec<(u64, Bytes)>,
    /// Who waits for the batch's outcome (the leader is not among them).
    waiting: VecDeque<oneshot::Sender<Turn>>,
    bytes: u64,
}

impl Batch {
    pub(crate) fn alone(offset: u64, data: Bytes) -> Batch {
        let bytes = data.len() as u64;
        Batch {
            writes: vec![(offset, data)],
            waiting: VecDeque::new(),
            bytes,
        }
    }

    /// The record: an entry per write, the blocks named and each block's
    /// data, in the order the writes came.
    pub(crate) fn record(&self) -> Contents {
        let entries = self
            .writes
            .iter()
            .map(|(offset, data)| [*offset, data.len() as u64, 0])
            .collect();
        let mut blocks = Vec::new();
        let mut pieces = Vec::new();
        for (offset, data) in &self.writes {
            let first = offset / BLOCK_BYTES;
            for (i, at) in (0..data.len()).step_by(BLOCK_BYTES as usize).enumerate() {
                let block = first + i as u64;
                blocks.push(block);
                pieces.push((block, data.slice(at..at + BLOCK_BYTES as usize)));
            }
        }
        Contents {
            entries,
            blocks,
            pieces,
        }
    }

    /// Tell every waiting write how the batch went.
    pub(crate) fn tell(self, outcome: Result<(), String>) {
        for waiter in self.waiting {
            // A waiter that went away (a dropped request) needs no answer.
            let _ = waiter.send(Turn::Done(outcome.clone()));
        }
    }

    fn fits(&self, bytes: u64, limits: Limits) -> bool {
        self.bytes + bytes <= limits.payload_bytes && self.writes.len() < limits.entries
    }
}

/// Writers in use and the batches waiting for one.
#[derive(Default)]
pub(crate) struct Batches {
    writing: usize,
    queue: VecDeque<Batch>,
}

impl Batches {
    /// A write arrives: it takes a free writer and goes now, alone, or
    /// joins a batch and waits.
    pub(crate) fn arrive(&mut self, offset: u64, data: Bytes, limits: Limits) -> Arrival {
        if self.writing < WRITERS && self.queue.is_empty() {
            self.writing += 1;
            return Arrival::Go(Batch::alone(offset, data));
        }
        let (sender, receiver) = oneshot::channel();
        let bytes = data.len() as u64;
        match self.queue.back_mut() {
            Some(batch) if batch.fits(bytes, limits) => {
                batch.writes.push((offset, data));
                batch.waiting.push_back(sender);
                batch.bytes += bytes;
            }
            _ => self.queue.push_back(Batch {
                writes: vec![(offset, data)],
                waiting: VecDeque::from([sender]),
                bytes,
            }),
        }
        Arrival::Wait(receiver)
    }

    /// A writer finished its record's write: pass it to the oldest waiting
    /// batch whose writes still have someone waiting, or free it.
    pub(crate) fn release(&mut self) {
        while let Some(mut batch) = self.queue.pop_front() {
            while let Some(leader) = batch.waiting.pop_front() {
                match leader.send(Turn::Lead(batch)) {
                    Ok(()) => return,
                    // Gone: the next write of the batch leads it.
                    Err(Turn::Lead(returned)) => batch = returned,
                    Err(Turn::Done(_)) => unreachable!("sent a lead"),
                }
            }
            // Nobody waits for any of its writes: none was acknowledged.
        }
        self.writing -= 1;
    }

    /// A write was told to lead `batch` but went away before it could: the
    /// batch goes back to the front of the queue and the writer it held
    /// passes on (to the batch's next waiting write, if any).
    pub(crate) fn abandon(&mut self, batch: Batch) {
        self.queue.push_front(batch);
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        payload_bytes: 4 * BLOCK_BYTES,
        entries: 3,
    };

    fn block(fill: u8) -> Bytes {
        Bytes::from(vec![fill; BLOCK_BYTES as usize])
    }

    /// Every writer in use.
    fn busy() -> Batches {
        Batches {
            writing: WRITERS,
            ..Batches::default()
        }
    }

    fn waits(arrival: Arrival) -> oneshot::Receiver<Turn> {
        match arrival {
            Arrival::Wait(receiver) => receiver,
            Arrival::Go(_) => panic!("expected to wait"),
        }
    }

    fn lead(receiver: &mut oneshot::Receiver<Turn>) -> Batch {
        match receiver.try_recv() {
            Ok(Some(Turn::Lead(batch))) => batch,
            _ => panic!("expected to lead"),
        }
    }

    #[test]
    fn writes_go_alone_while_writers_are_free_then_share_records() {
        let mut batches = Batches::default();
        for i in 0..WRITERS as u64 {
            let arrival = batches.arrive(i * BLOCK_BYTES, block(1), LIMITS);
            assert!(matches!(arrival, Arrival::Go(..)));
        }
        // Every writer busy: the next writes wait, three to a record (the
        // entry limit), then a fourth opens the next batch.
        let mut waiting: Vec<_> = (0..4)
            .map(|i| waits(batches.arrive((100 + i) * BLOCK_BYTES, block(2), LIMITS)))
            .collect();
        batches.release();
        let batch = lead(&mut waiting[0]);
        assert_eq!(batch.writes.len(), 3);
        assert!(waiting[1].try_recv().unwrap().is_none());
        batch.tell(Ok(()));
        assert!(matches!(
            waiting[1].try_recv(),
            Ok(Some(Turn::Done(Ok(()))))
        ));
        assert!(matches!(
            waiting[2].try_recv(),
            Ok(Some(Turn::Done(Ok(()))))
        ));
        batches.release();
        assert_eq!(lead(&mut waiting[3]).writes.len(), 1);
        // Nothing waits: writers come free one by one.
        for _ in 0..WRITERS {
            batches.release();
        }
        assert_eq!(batches.writing, 0);
    }

    #[test]
    fn a_batch_holds_no_more_than_a_record_may_carry() {
        let mut batches = busy();
        let data = |blocks: usize| Bytes::from(vec![0; blocks * BLOCK_BYTES as usize]);
        let mut two = waits(batches.arrive(0, data(2), LIMITS));
        let mut three = waits(batches.arrive(0, data(3), LIMITS));
        batches.release();
        assert_eq!(lead(&mut two).writes.len(), 1);
        batches.release();
        assert_eq!(lead(&mut three).writes.len(), 1);
    }

    #[test]
    fn the_lead_passes_over_writes_that_went_away() {
        let mut batches = busy();
        let gone = batches.arrive(0, block(1), LIMITS);
        let mut stays = waits(batches.arrive(BLOCK_BYTES, block(2), LIMITS));
        drop(gone);
        batches.release();
        let batch = lead(&mut stays);
        // The write that went away is still in the record (it may or may
        // not happen, like any unacknowledged write).
        assert_eq!(batch.writes.len(), 2);
        let record = batch.record();
        assert_eq!(
            record.entries,
            vec![[0, BLOCK_BYTES, 0], [BLOCK_BYTES, BLOCK_BYTES, 0]]
        );
        assert_eq!(record.blocks, vec![0, 1]);
        assert_eq!(record.pieces[1].1[0], 2);
        // A batch nobody waits for is dropped and frees its writer.
        let gone = batches.arrive(0, block(3), LIMITS);
        drop(gone);
        batches.release();
        assert_eq!(batches.writing, WRITERS - 1);
    }

    #[test]
    fn an_abandoned_lead_passes_to_the_next_write_of_its_batch() {
        let mut batches = busy();
        let mut first = waits(batches.arrive(0, block(1), LIMITS));
        let mut second = waits(batches.arrive(BLOCK_BYTES, block(2), LIMITS));
        batches.release();
        let batch = lead(&mut first);
        batches.abandon(batch);
        assert_eq!(lead(&mut second).writes.len(), 2);
        assert_eq!(batches.writing, WRITERS);
    }
}
