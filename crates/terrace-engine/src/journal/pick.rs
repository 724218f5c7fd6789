//! What a destage round takes home: pure choices over the journal's state,
//! no I/O. The round itself (reading back, writing home, flushing, moving
//! the tail) is the journal's; this only picks.
//!
//! A round takes the oldest records that are durable and unpinned, in
//! order, up to its budget (at least one), and of their blocks those whose
//! newest data they still hold. On parity it adds, once writers are quiet,
//! whole rows dense with durable dirty blocks, and the rest of rows it holds
//! in part where newer durable records hold the rest: one full-row write
//! instead of several partial ones. A write-through journal takes every
//! committed block instead, a bounded amount to read back per round.
//!
//! Depends on: `record`, the state and index defined in the journal's root.

use std::collections::{BTreeMap, BTreeSet};

use terrace_layout::BLOCK_BYTES;

use super::format::HEADER_BYTES;
use super::{
    ranges, Entry, Held, Picked, State, DENSE_ROWS_ROUND, MERGE_RUNS_MIN, READ_BACK_ROUND_BYTES,
};

/// What bounds a round.
#[derive(Debug, Clone, Copy)]
pub(super) struct RoundLimits {
    /// Bytes of records to take (at least one record is taken).
    pub(super) budget: u64,
    /// The row's data bytes on parity homes (rows merged and taken whole).
    pub(super) parity_row_bytes: Option<u64>,
    /// Writers have gone quiet: dense rows may be taken.
    pub(super) quiet: bool,
    /// Blocks of the home (its last row may be short).
    pub(super) space_blocks: u64,
}

/// The records a round takes (their sequences, oldest first, now
/// `Picked`) and the blocks it writes home: block → (sequence of the
/// record holding its newest data, where that data is).
pub(super) fn pick_round(state: &mut State, limits: &RoundLimits) -> (Vec<u64>, Picked) {
    let RoundLimits {
        budget,
        parity_row_bytes,
        quiet,
        space_blocks,
    } = *limits;
    let mut taken = 0;
    let mut picked = Vec::new();
    let mut work: Picked = BTreeMap::new();
    let mut rows_seen = BTreeSet::new();
    // Only once writers have gone quiet: while they write,
    // the rows' reads and writes take the disks from their
    // reads, and writers waiting for room want the tail moved.
    let dense_max = if quiet && state.space_waiters.is_empty() {
        DENSE_ROWS_ROUND
    } else {
        0
    };
    let mut dense_rows = 0;
    let mut read_back = 0;
    for record in state.records.iter().filter(|r| !r.is_destaged()) {
        let reading = if record.charged > 0 {
            0
        } else {
            record.bytes - HEADER_BYTES
        };
        if !record.is_durable()
            || record.pins > 0
            || (taken > 0 && taken + record.bytes > budget)
            || (read_back > 0 && read_back + reading > READ_BACK_ROUND_BYTES)
        {
            break;
        }
        taken += record.bytes;
        read_back += reading;
        picked.push(record.sequence);
        for block in &record.blocks {
            if let Some(Entry {
                committed: Some((sequence, held)),
                ..
            }) = state.index.get(block)
            {
                if *sequence == record.sequence {
                    work.insert(*block, (*sequence, held.clone()));
                }
            }
            let Some(row_bytes) = parity_row_bytes.filter(|_| dense_rows < dense_max) else {
                continue;
            };
            let row_blocks = row_bytes / BLOCK_BYTES;
            let row = block / row_blocks;
            if rows_seen.insert(row) {
                let dense = dense_row(state, row * row_blocks, row_blocks);
                if !dense.is_empty() {
                    dense_rows += 1;
                    work.extend(dense);
                }
            }
        }
    }
    // Rows the round holds in part (a stream's at the edges
    // of its budget, and where a write was logged as two
    // records) are taken whole where newer durable records
    // hold the rest of them: one full-row write instead of two
    // partial ones, this round's and a later one's, each
    // reading what it lacks.
    if let Some(row_bytes) = parity_row_bytes {
        let row_blocks = row_bytes / BLOCK_BYTES;
        let mut held: BTreeMap<u64, u64> = BTreeMap::new();
        for block in work.keys() {
            *held.entry(block / row_blocks).or_default() += 1;
        }
        for (row, count) in held {
            let first = row * row_blocks;
            let end = (first + row_blocks).min(space_blocks);
            if count < end - first {
                let rest = rest_of_row(state, &work, first..end);
                work.extend(rest);
            }
        }
    }
    // No direct write may pin them from now on.
    for &sequence in &picked {
        if let Some(record) = state.record_mut(sequence) {
            record.pick();
        }
    }
    state.assert_invariants();
    (picked, work)
}

/// A write-through journal's round: every committed block, a bounded amount
/// to read back from the log; and every listed record.
pub(super) fn pick_write_through(state: &State) -> (Vec<u64>, Picked) {
    // Write-through: everything committed goes home, whatever
    // became of the records (what only the log holds, a
    // bounded amount per round).
    let mut reading = 0;
    let work: Picked = state
        .index
        .iter()
        .filter_map(|(&block, entry)| entry.committed.clone().map(|c| (block, c)))
        .take_while(|(_, (_, held))| {
            if held.data.is_none() {
                reading += BLOCK_BYTES;
            }
            reading <= READ_BACK_ROUND_BYTES
        })
        .collect();
    let picked: Vec<u64> = state.records.iter().map(|r| r.sequence).collect();
    (picked, work)
}

/// The durable dirty blocks of the row of `row_blocks` blocks from `first`
/// if they lie in [`MERGE_RUNS_MIN`] separate runs or more (the row is
/// worth one merged update), else none. Blocks of records newer than a
/// round's may go home with it: it is their newest data, and durable, so
/// a replay after a crash writes the same; their own records find them
/// gone from the index when their turn comes.
pub(super) fn dense_row(state: &State, first: u64, row_blocks: u64) -> Vec<(u64, (u64, Held))> {
    let durable: Vec<(u64, (u64, Held))> = state
        .index
        .range(first..first + row_blocks)
        .filter_map(|(&block, entry)| {
            let (sequence, held) = entry.committed.as_ref()?;
            (*sequence < state.durable_below).then(|| (block, (*sequence, held.clone())))
        })
        .collect();
    let blocks: Vec<u64> = durable.iter().map(|(block, _)| *block).collect();
    if ranges(&blocks).len() >= MERGE_RUNS_MIN {
        durable
    } else {
        Vec::new()
    }
}

/// The durable dirty blocks of `row` (a range of blocks) that `work` lacks,
/// if with them `work` holds the whole row; else none. Like
/// [`dense_row`], they may come from records newer than a round's.
pub(super) fn rest_of_row(
    state: &State,
    work: &Picked,
    row: std::ops::Range<u64>,
) -> Vec<(u64, (u64, Held))> {
    let mut rest = Vec::new();
    for block in row {
        if work.contains_key(&block) {
            continue;
        }
        match state
            .index
            .get(&block)
            .and_then(|entry| entry.committed.as_ref())
        {
            Some((sequence, held)) if *sequence < state.durable_below => {
                rest.push((block, (*sequence, held.clone())));
            }
            _ => return Vec::new(),
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::ring::{at, state_with};
    use crate::journal::Block;
    use proptest::prelude::*;
    use terrace_io::Bytes;

    #[test]
    fn a_dense_row_brings_every_durable_dirty_block_of_the_row() {
        let k = BLOCK_BYTES;
        let mut state = state_with(64 * k, at(0, 0, 0), at(0, 0, 0));
        state.durable_below = 10;
        let block = || Held {
            at: 0,
            sum: 0,
            data: Some(Block {
                buffer: Bytes::from(vec![0; k as usize]),
                from: 0,
            }),
        };
        // Row 1 (blocks 8..16): durable blocks of records 3 to 9 in four
        // runs, and block 14 of record 12, not yet durable. Row 0: three
        // runs.
        let dirty = [(8, 3), (10, 5), (11, 9), (13, 4), (15, 7), (14, 12)];
        for (b, sequence) in dirty.into_iter().chain([(0, 2), (2, 2), (4, 6)]) {
            let entry = Entry {
                reserved: sequence,
                committed: Some((sequence, block())),
            };
            state.index.insert(b, entry);
        }
        let dense = |state: &State, first| -> Vec<(u64, u64)> {
            dense_row(state, first, 8)
                .into_iter()
                .map(|(b, (sequence, _))| (b, sequence))
                .collect()
        };
        assert_eq!(dense(&state, 8), dirty[..5].to_vec());
        // Three runs are not worth a merged update.
        assert!(dense(&state, 0).is_empty());
        // Block 14 durable too joins 13 and 15: three runs, not worth it.
        state.durable_below = 13;
        assert!(dense(&state, 8).is_empty());
    }

    /// A ring built the way the journal builds one: records reserved over
    /// random blocks (some pinned), some of them written (indexed as the
    /// journal indexes them), the oldest written ones flushed.
    fn built(writes: &[(Vec<u64>, bool)], written: &[(bool, bool)], flushed: usize) -> State {
        let k = BLOCK_BYTES;
        let mut state = state_with(4096 * k, at(0, 0, 0), at(0, 0, 0));
        let mut sequences = Vec::new();
        for (blocks, pinned) in writes {
            let bytes = HEADER_BYTES + blocks.len() as u64 * k;
            let reserved =
                crate::journal::ring::try_reserve(&mut state, bytes, blocks, true, *pinned);
            let (_, sequence, wrap) = reserved.expect("a ring this large has room");
            assert!(wrap.is_none());
            sequences.push((sequence, blocks.clone()));
        }
        for ((sequence, blocks), &(done, fua)) in sequences.iter().zip(written) {
            if !done {
                continue;
            }
            state.record_mut(*sequence).expect("listed").wrote(fua);
            for &block in blocks {
                let entry = state.index.get_mut(&block).expect("reserved");
                if entry.committed.as_ref().is_none_or(|(s, _)| s <= sequence) {
                    let fresh = entry.committed.is_none();
                    entry.committed = Some((
                        *sequence,
                        Held {
                            at: 0,
                            sum: 0,
                            data: None,
                        },
                    ));
                    if fresh {
                        state.dirty_bytes += k;
                    }
                }
            }
            state.assert_invariants();
        }
        for (sequence, _) in sequences.iter().take(flushed) {
            let record = state.record_mut(*sequence).expect("listed");
            if record.is_written() {
                record.flushed();
            }
        }
        crate::journal::advance_durable(&mut state);
        state.assert_invariants();
        state
    }

    fn writes() -> impl Strategy<Value = Vec<(Vec<u64>, bool)>> {
        proptest::collection::vec(
            (
                proptest::collection::vec(0..40u64, 1..5),
                proptest::bool::weighted(0.1),
            ),
            1..40,
        )
    }

    proptest! {
        #[test]
        fn a_round_takes_the_oldest_durable_records_and_their_newest_blocks(
            writes in writes(),
            written in proptest::collection::vec((proptest::bool::weighted(0.8), any::<bool>()), 40),
            flushed in 0..40usize,
            budget_blocks in 1..24u64,
            parity in any::<bool>(),
            quiet in any::<bool>(),
        ) {
            let k = BLOCK_BYTES;
            let mut state = built(&writes, &written, flushed);
            let before: Vec<(u64, bool, u32, u64, Vec<u64>)> = state
                .records
                .iter()
                .map(|r| (r.sequence, r.is_durable(), r.pins, r.bytes, r.blocks.clone()))
                .collect();
            let newest: BTreeMap<u64, u64> = state
                .index
                .iter()
                .filter_map(|(&b, e)| e.committed.as_ref().map(|(s, _)| (b, *s)))
                .collect();
            let durable_below = state.durable_below;
            let limits = RoundLimits {
                budget: budget_blocks * k,
                parity_row_bytes: parity.then_some(8 * k),
                quiet,
                space_blocks: 40,
            };
            let (picked, work) = pick_round(&mut state, &limits);
            // The oldest records, in order, each durable and unpinned,
            // within the budget unless one alone exceeds it.
            let taken: Vec<u64> = before.iter().take(picked.len()).map(|r| r.0).collect();
            prop_assert_eq!(&picked, &taken);
            let mut bytes = 0;
            for record in &before[..picked.len()] {
                prop_assert!(record.1 && record.2 == 0);
                bytes += record.3;
            }
            prop_assert!(picked.len() <= 1 || bytes <= limits.budget);
            // It stopped for a reason: the next is not durable, pinned, or
            // over the budget.
            if let Some(next) = before.get(picked.len()) {
                prop_assert!(!next.1 || next.2 > 0 || (bytes > 0 && bytes + next.3 > limits.budget));
            }
            for &sequence in &picked {
                prop_assert!(state.record_mut(sequence).expect("listed").is_picked());
            }
            // Every block whose newest data a picked record holds goes.
            for record in &before[..picked.len()] {
                for block in &record.4 {
                    if newest.get(block) == Some(&record.0) {
                        prop_assert_eq!(work.get(block).map(|(s, _)| *s), Some(record.0));
                    }
                }
            }
            // Only newest, durable data goes; without parity, only the
            // picked records' blocks.
            let named: BTreeSet<u64> = before[..picked.len()]
                .iter()
                .flat_map(|r| r.4.iter().copied())
                .collect();
            for (block, (sequence, _)) in &work {
                prop_assert_eq!(newest.get(block), Some(sequence));
                prop_assert!(*sequence < durable_below);
                prop_assert!(parity || named.contains(block));
            }
        }
    }
}
