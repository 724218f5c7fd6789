//! Gathering a sequential stream's partial-row writes into whole rows.
//!
//! A write smaller than a row of a parity space would go through the log:
//! every byte is written to every log copy and later destaged. A stream of
//! such writes (a restore, a copy, 64 KiB at a time) usually has a whole
//! row's worth in flight at once, so instead its pieces wait here, briefly
//! and unacknowledged, until the row is covered; the row then goes straight
//! to the disks as one full-row write (parity computed, nothing read) and
//! every piece is acknowledged with it. Nothing is promised for a piece
//! before that, so a crash in between loses nothing acknowledged.
//!
//! A gather starts only where a stream is evident: a piece that begins a
//! row and either continues a write that ended there or is the later part
//! of a write that crosses into the row. Other partial writes join an open
//! gather of their row and otherwise go to the log as before.
//!
//! Issue order is kept for overlapping writes: a row stays claimed from its
//! first piece until its pieces are written or logged; a later write over
//! it joins it while it gathers (a whole-row write completes it, its bytes
//! applied last) and waits while it is being written or logged.
//!
//! Pieces wait while the stream moves: while pieces keep arriving within
//! [`WINDOW_NS`] of each other, or a gathered row is being written (its
//! acknowledgements let the client send more), but never more than
//! [`WAIT_MAX_NS`] from the row's first piece. When the stream stalls, or
//! the row has waited that long, the row's pieces are released to the
//! log. The pieces of a row watch one shared timer (see
//! [`Gathers::timer`]), not one each: a timer costs a thread a wakeup, and
//! a row of a stream has dozens of pieces. A stream that cannot fill a row
//! (fewer bytes in flight than a row) would pay the window on every row, so
//! after [`MISSES_OFF`] released rows in a row no gather starts for
//! [`OFF_NS`], and for twice as long each time that happens again before a
//! row fills, up to [`OFF_MAX_NS`]: such a stream stalls for two windows
//! every 16 s instead of every second (about 20 ms of 1 s for 64 KiB
//! writes at 3 outstanding on modelled drives). A row that fills starts
//! the pauses again from [`OFF_NS`]. A pause also ends early when the
//! client sends more at once: when the partial-row writes in flight come
//! to a row's worth and to more than were in flight when it began (a sweep
//! that goes from 16 outstanding writes to 32 straight on would otherwise
//! find its rows still not gathered for up to 16 s); should rows miss
//! again, the next pause is twice as long as the one that ended.

use std::collections::{HashMap, VecDeque};

use futures::channel::oneshot;
use futures::future::{FutureExt, Shared};
use terrace_io::BoxFuture;
use terrace_io::Bytes;
use terrace_layout::BLOCK_BYTES;

/// How long a stream may pause before its partial rows go to the log.
pub(crate) const WINDOW_NS: u64 = 5_000_000;
/// The longest a row's pieces wait, from its first: then they go to the
/// log whatever else is under way. Without it, pieces of a row that no
/// stream would fill (random writes whose tails start rows) waited while
/// any other row gathered or was written: seconds under many clients.
pub(crate) const WAIT_MAX_NS: u64 = 4 * WINDOW_NS;
/// Released rows in a row after which gathering pauses.
pub(crate) const MISSES_OFF: u32 = 2;
/// How long gathering pauses the first time.
pub(crate) const OFF_NS: u64 = 1_000_000_000;
/// Longest pause: the most a stream that begins to fill rows (its client
/// sends more at once) waits before its rows are gathered again.
pub(crate) const OFF_MAX_NS: u64 = 16_000_000_000;
/// Ends of recent writes remembered to recognise a stream.
const ENDS: usize = 32;

/// A window's timer, watched by every waiting piece of a row.
pub(crate) type Timer = Shared<BoxFuture<()>>;

/// What became of a gathered piece: its row was written straight to the
/// disks, or the pieces were logged after all (or it failed, with this
/// reason).
pub(crate) type Outcome = Result<(), String>;

/// A partial-row write waiting for its row.
pub(crate) struct Piece {
    pub offset: u64,
    pub data: Bytes,
    pub fua: bool,
    pub done: oneshot::Sender<Outcome>,
}

impl Piece {
    pub(crate) fn tell(self, outcome: Outcome) {
        // The writer may have gone (a dropped request): nothing to tell.
        let _ = self.done.send(outcome);
    }
}

struct Row {
    /// Blocks of the row covered so far, one bit each.
    covered: Vec<u64>,
    covered_count: u64,
    pieces: Vec<Piece>,
    /// Its pieces are being written or logged: later writes wait.
    busy: bool,
    /// Writes waiting for it to be done.
    waiters: Vec<oneshot::Sender<()>>,
    /// The current window's timer and when it fires.
    timer: Option<(Timer, u64)>,
    /// When its first piece came.
    started_ns: u64,
}

/// Open gathers of one space, keyed by row offset.
#[derive(Default)]
pub(crate) struct Gathers {
    rows: HashMap<u64, Row>,
    ends: VecDeque<u64>,
    /// Released rows since the last row that filled.
    misses: u32,
    off_until_ns: u64,
    /// Pauses since the last row that filled: the next lasts OFF_NS
    /// doubled this many times, up to OFF_MAX_NS.
    pauses: u32,
    /// Bytes of partial-row writes in flight now, and when the current
    /// pause began.
    in_flight: u64,
    in_flight_at_pause: u64,
    /// Last time a piece arrived or a gathered row was written.
    last_progress_ns: u64,
    /// Rows whose pieces are being written or logged now.
    busy: usize,
}

/// Where [`Gathers::offer`] put a piece.
pub(crate) enum Offer {
    /// Not gathered, and nothing gathered under it: write it as usual.
    Declined,
    /// Waiting for its row.
    Waiting,
    /// It completed its row: the caller writes these pieces (in order) and
    /// then calls [`Gathers::finish`].
    Full(Vec<Piece>),
    /// The row's pieces are being written or logged: try again once this
    /// fires.
    Busy(oneshot::Receiver<()>),
}

impl Gathers {
    /// A write ending at `end` arrived.
    pub(crate) fn note_end(&mut self, end: u64) {
        if self.ends.len() == ENDS {
            self.ends.pop_front();
        }
        self.ends.push_back(end);
    }

    /// Whether a write ended at `offset` recently.
    pub(crate) fn continues(&self, offset: u64) -> bool {
        self.ends.contains(&offset)
    }

    /// Whether a gather of the row at `row_offset` is open or busy.
    pub(crate) fn is_open(&self, row_offset: u64) -> bool {
        self.rows.contains_key(&row_offset)
    }

    /// Whether any row in `[offset, end)` is gathered (or busy).
    pub(crate) fn overlaps(&self, offset: u64, end: u64, row_bytes: u64) -> bool {
        !self.rows.is_empty()
            && (offset / row_bytes * row_bytes..end)
                .step_by(row_bytes as usize)
                .any(|row| self.rows.contains_key(&row))
    }

    /// Whether a new gather of a row of `row_bytes` may start now.
    pub(crate) fn may_start(&mut self, now_ns: u64, row_bytes: u64) -> bool {
        if now_ns >= self.off_until_ns {
            return true;
        }
        if self.in_flight >= row_bytes && self.in_flight > self.in_flight_at_pause {
            // More in flight than when the rows missed: try again now.
            self.off_until_ns = now_ns;
            return true;
        }
        false
    }

    /// A partial-row write of `bytes` begins (it is counted as in flight
    /// until [`Gathers::leave`]).
    pub(crate) fn enter(&mut self, bytes: u64) {
        self.in_flight += bytes;
    }

    pub(crate) fn leave(&mut self, bytes: u64) {
        self.in_flight = self.in_flight.saturating_sub(bytes);
    }

    /// Offer `piece` (block-aligned, within the row of `row_bytes` at
    /// `row_offset`): it joins the row's gather, or starts one if `start`.
    pub(crate) fn offer(
        &mut self,
        now_ns: u64,
        row_offset: u64,
        row_bytes: u64,
        piece: Piece,
        start: bool,
    ) -> Offer {
        debug_assert!(piece.offset >= row_offset);
        debug_assert!(piece.offset + piece.data.len() as u64 <= row_offset + row_bytes);
        let blocks = row_bytes / BLOCK_BYTES;
        let row = match self.rows.get_mut(&row_offset) {
            Some(row) if row.busy => {
                let (sender, receiver) = oneshot::channel();
                row.waiters.push(sender);
                return Offer::Busy(receiver);
            }
            Some(row) => row,
            None if start => self.rows.entry(row_offset).or_insert_with(|| Row {
                covered: vec![0; blocks.div_ceil(64) as usize],
                covered_count: 0,
                pieces: Vec::new(),
                busy: false,
                waiters: Vec::new(),
                timer: None,
                started_ns: now_ns,
            }),
            None => return Offer::Declined,
        };
        self.last_progress_ns = now_ns;
        let first = (piece.offset - row_offset) / BLOCK_BYTES;
        for block in first..first + piece.data.len() as u64 / BLOCK_BYTES {
            let (word, bit) = ((block / 64) as usize, 1u64 << (block % 64));
            if row.covered[word] & bit == 0 {
                row.covered[word] |= bit;
                row.covered_count += 1;
            }
        }
        row.pieces.push(piece);
        if row.covered_count < blocks {
            return Offer::Waiting;
        }
        row.busy = true;
        self.busy += 1;
        self.misses = 0;
        self.pauses = 0;
        Offer::Full(std::mem::take(&mut row.pieces))
    }

    /// The timer a waiting piece of the row at `row_offset` watches: the
    /// row's current one, or, if that has fired (or there is none), a new
    /// one from `sleep` that fires a window from now. `None` once the row
    /// is gone (its pieces are being told).
    pub(crate) fn timer(
        &mut self,
        now_ns: u64,
        row_offset: u64,
        sleep: impl FnOnce(u64) -> BoxFuture<()>,
    ) -> Option<Timer> {
        let row = self.rows.get_mut(&row_offset)?;
        match &row.timer {
            Some((timer, fires_ns)) if *fires_ns > now_ns => Some(timer.clone()),
            _ => {
                let timer = sleep(WINDOW_NS).shared();
                row.timer = Some((timer.clone(), now_ns + WINDOW_NS));
                Some(timer)
            }
        }
    }

    /// A waiter's window ran out: if the stream has stalled (nothing
    /// arrived for a window, no gathered row being written), the row's
    /// pieces go to the log; the caller logs them (in order) and then calls
    /// [`Gathers::finish`].
    pub(crate) fn expire(&mut self, now_ns: u64, row_offset: u64) -> Option<Vec<Piece>> {
        let moving = self.busy > 0 || now_ns < self.last_progress_ns + WINDOW_NS;
        let row = self
            .rows
            .get_mut(&row_offset)
            .filter(|row| !row.busy && (!moving || now_ns >= row.started_ns + WAIT_MAX_NS))?;
        row.busy = true;
        self.busy += 1;
        self.misses += 1;
        if self.misses >= MISSES_OFF {
            self.misses = 0;
            let off = (OFF_NS << self.pauses.min(8)).min(OFF_MAX_NS);
            self.off_until_ns = now_ns + off;
            self.in_flight_at_pause = self.in_flight;
            self.pauses = self.pauses.saturating_add(1);
        }
        Some(std::mem::take(&mut row.pieces))
    }

    /// The pieces of a busy row are written or logged: later writes to the
    /// row may go on.
    pub(crate) fn finish(&mut self, now_ns: u64, row_offset: u64) {
        let row = self.rows.remove(&row_offset).expect("busy row");
        debug_assert!(row.busy);
        self.busy -= 1;
        self.last_progress_ns = now_ns;
        for waiter in row.waiters {
            let _ = waiter.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: u64 = 4 * BLOCK_BYTES;

    fn piece(offset: u64, blocks: u64) -> (Piece, oneshot::Receiver<Outcome>) {
        let (done, receiver) = oneshot::channel();
        let data = Bytes::from(vec![offset as u8; (blocks * BLOCK_BYTES) as usize]);
        (
            Piece {
                offset,
                data,
                fua: false,
                done,
            },
            receiver,
        )
    }

    #[test]
    fn pieces_that_cover_a_row_come_back_together() {
        let mut gathers = Gathers::default();
        let (a, _) = piece(ROW, 2);
        assert!(matches!(
            gathers.offer(0, ROW, ROW, a, true),
            Offer::Waiting
        ));
        assert!(gathers.overlaps(ROW + BLOCK_BYTES, ROW + 2 * BLOCK_BYTES, ROW));
        assert!(!gathers.overlaps(0, ROW, ROW));
        // Overlap counts once.
        let (b, _) = piece(ROW + BLOCK_BYTES, 1);
        assert!(matches!(
            gathers.offer(1, ROW, ROW, b, false),
            Offer::Waiting
        ));
        let (c, _) = piece(ROW + 2 * BLOCK_BYTES, 2);
        match gathers.offer(2, ROW, ROW, c, false) {
            Offer::Full(pieces) => {
                let offsets: Vec<u64> = pieces.iter().map(|p| p.offset).collect();
                assert_eq!(offsets, [ROW, ROW + BLOCK_BYTES, ROW + 2 * BLOCK_BYTES]);
            }
            _ => panic!("row not full"),
        }
        // While it is written, later writes to it wait.
        let (late, _) = piece(ROW, 1);
        let Offer::Busy(mut ready) = gathers.offer(3, ROW, ROW, late, true) else {
            panic!("a busy row took a piece");
        };
        // Nothing expires while a row is being written.
        let (d, _) = piece(2 * ROW, 1);
        assert!(matches!(
            gathers.offer(3, 2 * ROW, ROW, d, true),
            Offer::Waiting
        ));
        assert!(gathers.expire(3 + WINDOW_NS, 2 * ROW).is_none());
        gathers.finish(3 + WINDOW_NS, ROW);
        assert_eq!(ready.try_recv(), Ok(Some(())));
        assert!(!gathers.is_open(ROW));
        assert!(gathers.expire(2 + 2 * WINDOW_NS, 2 * ROW).is_none());
        assert_eq!(
            gathers.expire(3 + 2 * WINDOW_NS, 2 * ROW).map(|p| p.len()),
            Some(1)
        );
        // Released pieces keep the row busy until they are logged.
        let (e, _) = piece(2 * ROW, 1);
        assert!(matches!(
            gathers.offer(4, 2 * ROW, ROW, e, false),
            Offer::Busy(..)
        ));
        gathers.finish(5, 2 * ROW);
        let (f, _) = piece(2 * ROW + BLOCK_BYTES, 1);
        assert!(matches!(
            gathers.offer(6, 2 * ROW, ROW, f, false),
            Offer::Declined
        ));
    }

    #[test]
    fn a_rows_pieces_watch_one_timer_a_window() {
        let mut gathers = Gathers::default();
        let made = std::cell::Cell::new(0);
        let sleep = |_| -> BoxFuture<()> {
            made.set(made.get() + 1);
            Box::pin(futures::future::pending())
        };
        assert!(gathers.timer(0, ROW, sleep).is_none(), "no row, no timer");
        let (a, _) = piece(ROW, 1);
        assert!(matches!(
            gathers.offer(0, ROW, ROW, a, true),
            Offer::Waiting
        ));
        let (b, _) = piece(ROW + BLOCK_BYTES, 1);
        assert!(matches!(
            gathers.offer(1, ROW, ROW, b, false),
            Offer::Waiting
        ));
        assert!(gathers.timer(0, ROW, sleep).is_some());
        assert!(gathers.timer(1, ROW, sleep).is_some());
        assert!(gathers.timer(WINDOW_NS - 1, ROW, sleep).is_some());
        assert_eq!(made.get(), 1, "one timer for the window");
        assert!(gathers.timer(WINDOW_NS, ROW, sleep).is_some());
        assert!(gathers.timer(WINDOW_NS + 1, ROW, sleep).is_some());
        assert_eq!(made.get(), 2, "a new one once it fired");
    }

    #[test]
    fn only_a_start_opens_a_row_and_stalled_streams_pause_gathering() {
        let mut gathers = Gathers::default();
        let (a, _) = piece(BLOCK_BYTES, 1);
        assert!(matches!(
            gathers.offer(0, 0, ROW, a, false),
            Offer::Declined
        ));
        gathers.note_end(ROW);
        assert!(gathers.continues(ROW) && !gathers.continues(2 * ROW));
        let mut now = 0;
        for miss in 0..MISSES_OFF {
            assert!(gathers.may_start(now, ROW), "miss {miss}");
            let (p, _) = piece(ROW, 1);
            assert!(matches!(
                gathers.offer(now, ROW, ROW, p, true),
                Offer::Waiting
            ));
            assert!(gathers.expire(now + WINDOW_NS - 1, ROW).is_none());
            now += WINDOW_NS;
            assert!(gathers.expire(now, ROW).is_some());
            gathers.finish(now, ROW);
        }
        assert!(!gathers.may_start(now, ROW));
        assert!(gathers.may_start(now + OFF_NS, ROW));
    }

    /// Miss MISSES_OFF rows in a row from `now`; when the last one was
    /// released.
    fn miss(gathers: &mut Gathers, mut now: u64) -> u64 {
        for _ in 0..MISSES_OFF {
            assert!(gathers.may_start(now, ROW));
            let (p, _) = piece(ROW, 1);
            assert!(matches!(
                gathers.offer(now, ROW, ROW, p, true),
                Offer::Waiting
            ));
            now += WINDOW_NS;
            assert!(gathers.expire(now, ROW).is_some());
            gathers.finish(now, ROW);
        }
        now
    }

    /// Miss MISSES_OFF rows in a row from `now`; when gathering may start
    /// again.
    fn pause(gathers: &mut Gathers, now: u64) -> u64 {
        let mut back = miss(gathers, now);
        while !gathers.may_start(back, ROW) {
            back += OFF_NS / 4;
        }
        assert!(!gathers.may_start(back - 1, ROW));
        back
    }

    #[test]
    fn pauses_double_while_rows_keep_missing_and_a_filled_row_resets_them() {
        let mut gathers = Gathers::default();
        let mut now = 0;
        let mut pauses = Vec::new();
        for _ in 0..7 {
            let back = pause(&mut gathers, now);
            pauses.push((back - now - MISSES_OFF as u64 * WINDOW_NS) / (OFF_NS / 4));
            now = back;
        }
        // In quarters of OFF_NS: 1, 2, 4, 8, 16 s, then no longer.
        assert_eq!(pauses, vec![4, 8, 16, 32, 64, 64, 64]);
        // A row that fills: the next pause is the first one again.
        let (whole, _) = piece(ROW, ROW / BLOCK_BYTES);
        let offer = gathers.offer(now, ROW, ROW, whole, true);
        let Offer::Full(pieces) = offer else {
            panic!("a whole row fills at once");
        };
        assert_eq!(pieces.len(), 1);
        gathers.finish(now, ROW);
        let back = pause(&mut gathers, now);
        assert_eq!(back - now - MISSES_OFF as u64 * WINDOW_NS, OFF_NS);
    }

    #[test]
    fn more_in_flight_than_at_the_pause_ends_it_early() {
        let mut gathers = Gathers::default();
        let mut now = 0;
        for _ in 0..3 {
            now = pause(&mut gathers, now);
        }
        // Half a row in flight when the rows miss again (an 8 s pause).
        gathers.enter(ROW / 2);
        let at = miss(&mut gathers, now);
        assert!(!gathers.may_start(at + 1, ROW));
        // More, but under a row: still paused.
        gathers.enter(BLOCK_BYTES);
        assert!(!gathers.may_start(at + 2, ROW));
        // A row's worth and more than at the pause: it ends now.
        gathers.enter(ROW);
        assert!(gathers.may_start(at + 3, ROW));
        // Back to what it was: the pause stays ended.
        gathers.leave(ROW + BLOCK_BYTES);
        assert!(gathers.may_start(at + 4, ROW));
    }

    /// Other rows busy and pieces arriving elsewhere all the time hold a
    /// row's pieces back only until [`WAIT_MAX_NS`] after its first.
    #[test]
    fn a_row_waits_no_longer_than_its_limit_whatever_else_moves() {
        let mut gathers = Gathers::default();
        let (a, _) = piece(ROW, 1);
        assert!(matches!(
            gathers.offer(0, ROW, ROW, a, true),
            Offer::Waiting
        ));
        // Another row fills and is being written; a third keeps receiving.
        let (whole, _) = piece(4 * ROW, ROW / BLOCK_BYTES);
        assert!(matches!(
            gathers.offer(1, 4 * ROW, ROW, whole, true),
            Offer::Full(_)
        ));
        let mut now = 1;
        while now < WAIT_MAX_NS {
            let (more, _) = piece(8 * ROW, 1);
            gathers.offer(now, 8 * ROW, ROW, more, true);
            assert!(gathers.expire(now, ROW).is_none(), "released at {now}");
            now += WINDOW_NS / 2;
        }
        assert_eq!(gathers.expire(WAIT_MAX_NS, ROW).map(|p| p.len()), Some(1));
    }
}
