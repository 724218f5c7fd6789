//! Writes smaller than a block, merged per row while they wait.
//!
//! A write that covers part of a 4 KiB block reads the block, lays its
//! bytes over it and writes it back whole, under its row's lock. Clients
//! of 512-byte sectors send runs of such writes (a 1 KiB stream at 16 in
//! flight puts four in every block, sixteen in a row): one
//! read-modify-write each, one after the other behind the row lock, ran at
//! a fifth of qemu-nbd's rate. So the writes into part of a block of one
//! row meet here: the first to arrive leads and waits for the row lock;
//! every such write into that row that arrives meanwhile joins it. With
//! the lock, the leader closes the group, reads the blocks the writes
//! touch (each run of neighbouring blocks once), lays all of their bytes
//! over them in the order they arrived and writes each run once, with FUA
//! if any of them asked for it. The followers complete when those writes
//! do, with their result.
//!
//! ```text
//!   write 0..1K  ──lead──▶ row lock ─▶ take group ─▶ read blocks ─▶ merge ─▶ write
//!   write 1K..2K ──join──▶ (wait) ◀───────────────────────────────────────── result
//!   write 5K..6K ──join──▶ (wait) ◀───────────────────────────────────────── result
//!   write 6K..7K ── arrives after the take: leads the next group
//! ```
//!
//! A leader dropped before its write (its request cancelled) drops its
//! group: the followers see their channel closed and start over, one of
//! them leading. A follower that starts over after the leader's write
//! landed writes its bytes again, which changes nothing.
//!
//! Depends on nothing in the engine: the volume does the I/O.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::channel::oneshot;
use terrace_io::Bytes;

/// Each follower's result: the leader's error, as text.
type Outcome = Result<(), String>;

/// The writes into one row gathered so far.
pub(crate) struct Group {
    /// Offset in the row and bytes, in arrival order (the leader's first).
    pub pieces: Vec<(u64, Bytes)>,
    pub fua: bool,
    followers: Vec<oneshot::Sender<Outcome>>,
}

impl Group {
    /// Answer every follower.
    pub(crate) fn finish(self, outcome: &Outcome) {
        for follower in self.followers {
            let _ = follower.send(outcome.clone());
        }
    }

    /// How many writes the group holds.
    #[cfg(test)]
    fn writes(&self) -> usize {
        self.pieces.len()
    }
}

/// A row of a volume: extent and row in it.
pub(crate) type RowKey = (u64, u64);

/// The open groups of a volume, by row.
#[derive(Default)]
pub(crate) struct BlockMerges {
    open: Mutex<HashMap<RowKey, Group>>,
}

/// What a write into part of a block does.
pub(crate) enum Joined<'a> {
    /// Lock the row, take the group, read, merge and write.
    Lead(Leading<'a>),
    /// Wait for the leader's write; a closed channel means start over.
    Follow(oneshot::Receiver<Outcome>),
}

impl BlockMerges {
    /// Join the open group of `row` with `piece` at byte `at` of the
    /// row, or open one and lead it.
    pub(crate) fn join(&self, row: RowKey, at: u64, piece: Bytes, fua: bool) -> Joined<'_> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(group) = open.get_mut(&row) {
            let (sender, receiver) = oneshot::channel();
            group.pieces.push((at, piece));
            group.fua |= fua;
            group.followers.push(sender);
            return Joined::Follow(receiver);
        }
        open.insert(
            row,
            Group {
                pieces: vec![(at, piece)],
                fua,
                followers: Vec::new(),
            },
        );
        Joined::Lead(Leading {
            merges: self,
            row,
            taken: false,
        })
    }

    /// Groups open now (for tests and invariants).
    #[cfg(test)]
    fn open_groups(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A leader's hold on its open group: taking it closes the group to later
/// writes; dropping it untaken drops the group (its followers start over).
pub(crate) struct Leading<'a> {
    merges: &'a BlockMerges,
    row: RowKey,
    taken: bool,
}

impl Leading<'_> {
    /// Close the group and take its writes.
    pub(crate) fn take(mut self) -> Group {
        self.taken = true;
        let mut open = self.merges.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&self.row)
            .expect("a leader's group stays open until it takes it")
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if !self.taken {
            let mut open = self.merges.open.lock().unwrap_or_else(|e| e.into_inner());
            open.remove(&self.row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    fn piece(byte: u8) -> Bytes {
        Bytes::from(vec![byte; 512])
    }

    #[test]
    fn writes_arriving_while_a_leader_waits_join_it_in_order() {
        let merges = BlockMerges::default();
        let Joined::Lead(leading) = merges.join((0, 7), 0, piece(1), false) else {
            panic!("the first write leads");
        };
        let Joined::Follow(second) = merges.join((0, 7), 8192, piece(2), true) else {
            panic!("a write into the same row joins");
        };
        let Joined::Follow(third) = merges.join((0, 7), 0, piece(3), false) else {
            panic!("joins");
        };
        // Another row has a group of its own.
        let Joined::Lead(other) = merges.join((1, 7), 0, piece(9), false) else {
            panic!("another row leads");
        };
        let group = leading.take();
        assert_eq!(group.writes(), 3);
        assert!(group.fua, "FUA if any write asked for it");
        let order: Vec<(u64, u8)> = group.pieces.iter().map(|(at, b)| (*at, b[0])).collect();
        assert_eq!(order, [(0, 1), (8192, 2), (0, 3)]);
        // Taken: the next write into the row leads a new group.
        let Joined::Lead(next) = merges.join((0, 7), 1024, piece(4), false) else {
            panic!("a write after the take leads");
        };
        group.finish(&Err("disk gone".into()));
        assert_eq!(block_on(second).unwrap(), Err("disk gone".to_string()));
        assert_eq!(block_on(third).unwrap(), Err("disk gone".to_string()));
        drop(next);
        drop(other);
        assert_eq!(merges.open_groups(), 0);
    }

    #[test]
    fn a_leader_dropped_before_its_write_lets_its_followers_start_over() {
        let merges = BlockMerges::default();
        let Joined::Lead(leading) = merges.join((0, 3), 0, piece(1), false) else {
            panic!("leads");
        };
        let Joined::Follow(follower) = merges.join((0, 3), 512, piece(2), false) else {
            panic!("joins");
        };
        drop(leading);
        assert!(block_on(follower).is_err(), "closed: start over");
        assert!(matches!(
            merges.join((0, 3), 512, piece(2), false),
            Joined::Lead(_)
        ));
    }
}
