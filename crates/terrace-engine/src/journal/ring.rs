//! The ring: where the next record goes, and what reserving it changes.
//!
//! ```text
//!   lap n:   | .. destaged .. |tail▶ records in the log ... |head▶  free  |wrap|
//!   lap n+1: | records ... |head▶   free   |tail▶ records of lap n ... |wrap|
//! ```
//!
//! Records are appended at the head and freed behind the committed tail;
//! positions count bytes appended since the ring started, offsets are
//! bytes into the log. A record never passes the tail and always leaves
//! room at the end of its lap for a wrap record (a header, then the next
//! record starts at offset 0). A resize takes effect at the next lap.
//! Parity logs keep part of the ring for row images, which only they may
//! use. Pure: no I/O, no locks (the caller holds the state's).
//!
//! Depends on: `record`, `format` (the header size), the state defined in
//! the journal's root.

use super::format::HEADER_BYTES;
use super::record::{Cursor, Record};
use super::{Entry, State};

/// A ring position, sequence (and wrap record, if the ring wraps first)
/// for a record of `record_bytes`, if the ring has room now.
pub(super) type Reservation = (Cursor, u64, Option<(Cursor, u64)>);

pub(super) fn try_reserve(
    state: &mut State,
    record_bytes: u64,
    blocks: &[u64],
    dirtying: bool,
    pinned: bool,
) -> Option<Reservation> {
    // Row images (not dirtying, not invalidations) may use the reserve.
    let image = !dirtying && !blocks.is_empty() && record_bytes > HEADER_BYTES;
    // After a shrink the lap under way keeps its old size until the ring
    // wraps, but what the ring holds keeps to the new size from the start
    // (writers wait for destaging as in a full log). Otherwise this never
    // binds: records placed in one lap never pass its size. Row images
    // are exempt: destaging needs them to free the ring.
    let size = state.lap_bytes.min(state.next_lap_bytes);
    let held = state.head.position - state.tail.position;
    if !image && held + record_bytes + HEADER_BYTES > size {
        return None;
    }
    let slack = if image {
        0
    } else {
        state.lap_bytes.min(state.next_lap_bytes) * state.image_reserve_per_mille / 1000
    };
    let place = place_record(state, record_bytes)?;
    if slack > 0 {
        // The reserve is free ring in all, in at most two pieces (the rest
        // of this lap, the start of the next up to the tail), so the larger
        // holds at least half of it. Asking for it whole in front of the
        // head would leave writers waiting near the end of every lap until
        // the tail had moved a quarter of the ring.
        if room_after(state, record_bytes, &place) < slack {
            return None;
        }
    }
    let mut wrap = None;
    let at = match place {
        Placement::Here => state.head,
        Placement::Wrap { next_lap_bytes } => {
            let wrap_at = state.head;
            let wrap_sequence = state.next_sequence;
            state.next_sequence += 1;
            push_record(
                state,
                wrap_at,
                HEADER_BYTES,
                wrap_sequence,
                Vec::new(),
                (true, false),
            );
            wrap = Some((wrap_at, wrap_sequence));
            state.lap_bytes = next_lap_bytes;
            Cursor {
                position: wrap_at.position + HEADER_BYTES,
                offset: 0,
                lap: wrap_at.lap + 1,
            }
        }
    };
    let sequence = state.next_sequence;
    state.next_sequence += 1;
    push_record(
        state,
        at,
        record_bytes,
        sequence,
        blocks.to_vec(),
        (false, pinned),
    );
    state.head = Cursor {
        position: at.position + record_bytes,
        offset: at.offset + record_bytes,
        lap: at.lap,
    };
    if dirtying {
        for &block in blocks {
            let entry = state.index.entry(block).or_insert(Entry {
                reserved: 0,
                committed: None,
            });
            entry.reserved = entry.reserved.max(sequence);
        }
    }
    state.assert_invariants();
    Some((at, sequence, wrap))
}

fn push_record(
    state: &mut State,
    at: Cursor,
    bytes: u64,
    sequence: u64,
    blocks: Vec<u64>,
    (wrap, pinned): (bool, bool),
) {
    for &block in &blocks {
        *state.recent.entry(block).or_insert(0) += 1;
    }
    state
        .records
        .push_back(Record::reserved(at, bytes, sequence, blocks, wrap, pinned));
}

pub(super) enum Placement {
    Here,
    Wrap { next_lap_bytes: u64 },
}

/// Where a record of `bytes` can go, if anywhere, keeping room for a wrap
/// record at the end of every lap and never passing the committed tail.
pub(super) fn place_record(state: &State, bytes: u64) -> Option<Placement> {
    let head = state.head;
    let tail = state.tail;
    let fits_lap = |offset: u64, lap_bytes: u64| offset + bytes + HEADER_BYTES <= lap_bytes;
    if tail.lap == head.lap {
        if fits_lap(head.offset, state.lap_bytes) {
            return Some(Placement::Here);
        }
        // Wrap: the new lap runs from 0 up to the tail.
        let next = state.next_lap_bytes;
        (fits_lap(0, next) && bytes + HEADER_BYTES <= tail.offset).then_some(Placement::Wrap {
            next_lap_bytes: next,
        })
    } else {
        // The tail is a lap behind, ahead of the head in the ring.
        (head.offset + bytes + HEADER_BYTES <= tail.offset
            && fits_lap(head.offset, state.lap_bytes))
        .then_some(Placement::Here)
    }
}

/// Free ring once a record of `bytes` is placed at `place`, keeping room
/// for a wrap record at the end of every lap as [`place_record`] does.
fn room_after(state: &State, bytes: u64, place: &Placement) -> u64 {
    let (head, tail) = (state.head, state.tail);
    let rest_of_lap = |end: u64, lap_bytes: u64| lap_bytes.saturating_sub(end + HEADER_BYTES);
    match place {
        Placement::Here if tail.lap == head.lap => {
            let next_lap = tail.offset.min(state.next_lap_bytes);
            rest_of_lap(head.offset + bytes, state.lap_bytes)
                + next_lap.saturating_sub(HEADER_BYTES)
        }
        Placement::Here => {
            let end = head.offset + bytes;
            tail.offset
                .saturating_sub(end + HEADER_BYTES)
                .min(rest_of_lap(end, state.lap_bytes))
        }
        Placement::Wrap { next_lap_bytes } => tail
            .offset
            .saturating_sub(bytes + HEADER_BYTES)
            .min(rest_of_lap(bytes, *next_lap_bytes)),
    }
}

#[cfg(test)]
pub(super) fn state_with(lap: u64, head: Cursor, tail: Cursor) -> State {
    State::new(lap, head, tail, 0)
}

#[cfg(test)]
pub(super) fn at(position: u64, offset: u64, lap: u64) -> Cursor {
    Cursor {
        position,
        offset,
        lap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terrace_layout::BLOCK_BYTES;

    #[test]
    fn the_image_reserve_counts_free_ring_on_both_sides_of_the_wrap() {
        let k = BLOCK_BYTES;
        // A parity ring of 64 blocks keeps 16 for row images.
        let parity = |head: u64, tail: u64| State {
            image_reserve_per_mille: 250,
            ..state_with(64 * k, at(head * k, head * k, 0), at(tail * k, tail * k, 0))
        };
        let write = |state: &mut State| try_reserve(state, 2 * k, &[1], true, false).is_some();
        // Head 50 blocks in, tail at 10: 11 free before the lap ends, 9
        // after the wrap (each less a wrap record's block). A write may go:
        // the reserve is there in all, its larger piece holds half of it.
        assert!(write(&mut parity(50, 10)));
        // The same head with the tail at 4: too little in all.
        assert!(!write(&mut parity(50, 4)));
        // Head 58, tail 20: most of the reserve lies past the wrap.
        assert!(write(&mut parity(58, 20)));
        // Tail a lap behind: one piece, up to the tail.
        let behind = |head: u64, tail: u64| State {
            image_reserve_per_mille: 250,
            ..state_with(
                64 * k,
                at(64 * k + head * k, head * k, 1),
                at(tail * k, tail * k, 0),
            )
        };
        assert!(write(&mut behind(10, 30)));
        assert!(!write(&mut behind(10, 28)));
        // Row images may use the reserve.
        let image = |state: &mut State| try_reserve(state, 8 * k, &[1], false, false).is_some();
        assert!(image(&mut parity(50, 4)));
    }

    #[test]
    fn records_never_pass_the_tail_and_always_leave_room_to_wrap() {
        let k = BLOCK_BYTES;
        // Empty ring of 16 blocks.
        let state = state_with(16 * k, at(0, 0, 0), at(0, 0, 0));
        assert!(matches!(place_record(&state, 8 * k), Some(Placement::Here)));
        assert!(matches!(
            place_record(&state, 15 * k),
            Some(Placement::Here)
        ));
        assert!(place_record(&state, 16 * k).is_none());
        // Head near the end, tail in the middle of the same lap: wrap to 0.
        let state = state_with(16 * k, at(14 * k, 14 * k, 0), at(8 * k, 8 * k, 0));
        assert!(matches!(
            place_record(&state, 2 * k),
            Some(Placement::Wrap { .. })
        ));
        assert!(place_record(&state, 8 * k).is_none());
        // Tail a lap behind: only up to it.
        let state = state_with(16 * k, at(20 * k, 2 * k, 1), at(10 * k, 8 * k, 0));
        assert!(matches!(place_record(&state, 5 * k), Some(Placement::Here)));
        assert!(place_record(&state, 6 * k).is_none());
    }
}
