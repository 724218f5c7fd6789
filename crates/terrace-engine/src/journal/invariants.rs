//! The journal's state checked against its invariants after every change
//! of a record's phase, in every build (`assert!`).
//!
//! The cheap checks (ring bounds, sequence bookkeeping, the oldest
//! record's phase) are O(1) and run every time. The full walk over the
//! index and the records is O(n) in what the ring holds: it runs every
//! time in debug builds (the tests and the simulation) and, in release
//! builds, after as many checks as [`FULL_CHECK_SPACING`] times the
//! entries it walks (at least [`FULL_CHECK_EVERY`]), so that it costs a
//! transition a sixteenth of an entry visited on average however full the
//! ring is.
//!
//! Pure: no I/O, no locks (the caller holds the state's).
//!
//! Depends on: `record`, and the state defined in the journal's root.

use std::collections::BTreeMap;

use terrace_layout::BLOCK_BYTES;

use super::format::HEADER_BYTES;
use super::record::Record;
use super::State;

/// In release builds, the fewest checks between two full walks: a small
/// ring is walked no more often than this.
const FULL_CHECK_EVERY: u64 = 1024;
/// In release builds, checks between two full walks per entry walked: a
/// full 1 GiB ring of 4 KiB writes (a quarter million index entries) is
/// walked once every four million transitions.
const FULL_CHECK_SPACING: u64 = 16;

impl State {
    /// Assert the invariants that hold between any two transitions.
    pub(super) fn assert_invariants(&mut self) {
        self.assert_ring();
        self.assert_sequences();
        self.checks += 1;
        if cfg!(debug_assertions) || self.checks >= self.next_full_check {
            self.assert_index();
            self.assert_records();
            let entries = (self.index.len() + self.records.len()) as u64;
            self.next_full_check =
                self.checks + (entries * FULL_CHECK_SPACING).max(FULL_CHECK_EVERY);
        }
    }

    /// The record with `sequence`, if it is still listed (see
    /// [`State::record_mut`]).
    fn record(&self, sequence: u64) -> Option<&Record> {
        let first = self.records.front()?.sequence;
        let index = usize::try_from(sequence.checked_sub(first)?).ok()?;
        self.records.get(index)
    }

    /// The head never passes the tail, and the reservations between them
    /// lie within the ring.
    fn assert_ring(&self) {
        let (head, tail) = (self.head, self.tail);
        assert!(
            tail.position <= head.position,
            "the tail {tail:?} is past the head {head:?}"
        );
        if head.lap == tail.lap {
            assert!(
                tail.offset <= head.offset
                    && head.position - tail.position == head.offset - tail.offset,
                "head {head:?} and tail {tail:?} disagree within a lap"
            );
        } else {
            assert!(
                head.lap == tail.lap + 1 && head.offset <= tail.offset,
                "the head {head:?} passed the tail {tail:?} a lap behind"
            );
        }
        // Room for a wrap record is always left at the end of a lap.
        assert!(
            head.offset + HEADER_BYTES <= self.lap_bytes.max(HEADER_BYTES),
            "the head {head:?} leaves no room to wrap in a lap of {}",
            self.lap_bytes
        );
        if let Some(first) = self.records.front() {
            assert!(
                first.at.position >= tail.position,
                "record {} lies behind the committed tail",
                first.sequence
            );
        }
        if let Some(last) = self.records.back() {
            assert!(
                last.at.position + last.bytes <= head.position,
                "record {} lies past the head",
                last.sequence
            );
        }
    }

    /// Records are listed by sequence without gaps, up to the next one to
    /// be handed out, and everything below `durable_below` is durable.
    fn assert_sequences(&self) {
        assert!(self.durable_below <= self.next_sequence);
        // Writers queue for ring room in arrival order, with tickets
        // handed out in order.
        if let (Some(first), Some(last)) = (self.room_queue.front(), self.room_queue.back()) {
            assert!(
                first <= last && *last < self.next_room_ticket,
                "room queue out of order: {:?}",
                self.room_queue
            );
        }
        if let (Some(first), Some(last)) = (self.records.front(), self.records.back()) {
            assert_eq!(
                last.sequence + 1 - first.sequence,
                self.records.len() as u64,
                "records listed with gaps"
            );
            assert_eq!(last.sequence + 1, self.next_sequence);
            assert!(
                first.sequence >= self.durable_below || first.is_durable(),
                "record {} below the durable mark is {:?}",
                first.sequence,
                first.phase()
            );
        }
    }

    /// Dirty bytes are the index's data entries, and each of them belongs
    /// to a listed record in a phase that holds data (unless the log failed
    /// and its records are gone, or a read-only pool serves what recovery
    /// found: sequence 0).
    fn assert_index(&self) {
        let mut dirty = 0;
        for (block, entry) in &self.index {
            let Some((sequence, _)) = &entry.committed else {
                continue;
            };
            dirty += BLOCK_BYTES;
            if *sequence == 0 || self.failed.is_some() {
                continue;
            }
            let record = self.record(*sequence);
            assert!(
                record.is_some_and(|r| r.holds_data()),
                "block {block} is dirty in record {sequence}, which is {:?}",
                record.map(|r| r.phase())
            );
        }
        assert_eq!(
            dirty, self.dirty_bytes,
            "dirty bytes are not the index's data"
        );
    }

    /// Every record below the durable mark is durable, and `recent` counts
    /// exactly the blocks the listed records name.
    fn assert_records(&self) {
        let mut named: BTreeMap<u64, u32> = BTreeMap::new();
        for record in &self.records {
            assert!(
                record.sequence >= self.durable_below || record.is_durable(),
                "record {} below the durable mark is {:?}",
                record.sequence,
                record.phase()
            );
            for &block in &record.blocks {
                *named.entry(block).or_insert(0) += 1;
            }
        }
        assert!(named == self.recent, "recent blocks miscounted");
    }
}

#[cfg(test)]
mod tests {
    use super::super::ring::{at, state_with, try_reserve};
    use super::super::{Entry, Held};
    use super::*;

    /// A ring of 64 blocks holding one durable record of block 3, indexed.
    fn one_record() -> State {
        let k = BLOCK_BYTES;
        let mut state = state_with(64 * k, at(0, 0, 0), at(0, 0, 0));
        let (_, sequence, _) = try_reserve(&mut state, HEADER_BYTES + k, &[3], true, false)
            .expect("room in an empty ring");
        state.record_mut(sequence).expect("listed").wrote(true);
        state.durable_below = sequence + 1;
        state.index.insert(
            3,
            Entry {
                reserved: sequence,
                committed: Some((
                    sequence,
                    Held {
                        at: k,
                        sum: 0,
                        data: None,
                    },
                )),
            },
        );
        state.dirty_bytes = k;
        state
    }

    #[test]
    fn a_consistent_state_passes() {
        one_record().assert_invariants();
    }

    #[test]
    #[should_panic(expected = "dirty bytes are not the index's data")]
    fn dirty_bytes_must_be_the_index() {
        let mut state = one_record();
        state.dirty_bytes += BLOCK_BYTES;
        state.assert_invariants();
    }

    #[test]
    #[should_panic(expected = "which is Some(Destaged)")]
    fn an_indexed_block_must_be_in_a_record_holding_data() {
        let mut state = one_record();
        state.records[0].abandon();
        state.assert_invariants();
    }

    #[test]
    #[should_panic(expected = "is past the head")]
    fn the_tail_never_passes_the_head() {
        let mut state = one_record();
        state.tail = at(3 * HEADER_BYTES, 3 * HEADER_BYTES, 0);
        state.assert_invariants();
    }

    #[test]
    #[should_panic(expected = "recent blocks miscounted")]
    fn recent_counts_the_records_blocks() {
        let mut state = one_record();
        state.recent.insert(9, 1);
        state.assert_invariants();
    }
}
