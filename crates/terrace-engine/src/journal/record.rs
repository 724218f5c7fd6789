//! One record of the ring as the journal tracks it between the committed
//! tail and the head, and the phases it goes through.
//!
//! ```text
//!   Reserved ──wrote──▶ Written ──flushed──▶ Durable ──pick──▶ Picked ──home──▶ Destaged
//!      │  └──wrote with FUA───────────────────▲  ▲                 │ (some blocks
//!      │                                          └── (wrap: Destaged once durable)   skipped: stays)
//!      └──image_done / abandon (log failed): ─▶ Destaged (from any phase)
//! ```
//!
//! Every phase change goes through a method that asserts the change is
//! legal; the ring's state re-checks its invariants after each change
//! (see `state`). Pure: no I/O, no locks.
//!
//! Depends on: nothing in the engine.

/// Where a record starts: its absolute position (bytes appended since the
/// ring was started), its byte offset in the log space, and its lap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) position: u64,
    pub(super) offset: u64,
    pub(super) lap: u64,
}

/// How far a record has come. Ordered: each phase implies the ones before
/// it held (a durable record was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    /// Ring space and a sequence are reserved; its write is not done.
    Reserved,
    /// Its write to the log completed (it may still be in a volatile cache).
    Written,
    /// Written and flushed (or written with FUA): it survives a power cut.
    Durable,
    /// A destage round took it: no direct write may pin it again.
    Picked,
    /// Its blocks are home (or superseded), or it holds nothing to take
    /// home (a wrap record, a row image written home, a record the failed
    /// log gave up): it no longer holds the tail.
    Destaged,
}

/// A record appended since the committed tail.
pub(super) struct Record {
    pub(super) at: Cursor,
    pub(super) bytes: u64,
    pub(super) sequence: u64,
    /// Blocks the record names (data or invalidation).
    pub(super) blocks: Vec<u64>,
    phase: Phase,
    /// A wrap record (no data: done once durable).
    pub(super) wrap: bool,
    /// Direct writes under this dirty-range record that have not finished:
    /// the tail must not pass it while any are.
    pub(super) pins: u32,
    /// Bytes of the pool's log memory its data holds (its whole buffer, kept
    /// while any of its blocks is in the index), until the tail passes it.
    pub(super) charged: u64,
}

impl Record {
    /// A record just reserved, pinned once for its caller if `pinned`.
    pub(super) fn reserved(
        at: Cursor,
        bytes: u64,
        sequence: u64,
        blocks: Vec<u64>,
        wrap: bool,
        pinned: bool,
    ) -> Record {
        Record {
            at,
            bytes,
            sequence,
            blocks,
            phase: Phase::Reserved,
            wrap,
            pins: u32::from(pinned),
            charged: 0,
        }
    }

    pub(super) fn phase(&self) -> Phase {
        self.phase
    }

    pub(super) fn is_written(&self) -> bool {
        self.phase >= Phase::Written
    }

    pub(super) fn is_durable(&self) -> bool {
        self.phase >= Phase::Durable
    }

    pub(super) fn is_destaged(&self) -> bool {
        self.phase == Phase::Destaged
    }

    /// Whether a destage round took it (or it is done): a direct write may
    /// no longer pin it.
    pub(super) fn is_picked(&self) -> bool {
        self.phase >= Phase::Picked
    }

    /// Whether the index may hold data of this record: it was written and
    /// has not gone home.
    pub(super) fn holds_data(&self) -> bool {
        matches!(self.phase, Phase::Written | Phase::Durable | Phase::Picked)
    }

    /// Its write to the log completed; with FUA it is durable too (and a
    /// wrap record, holding nothing, is done).
    /// A record the failed log abandoned while its write was in flight
    /// stays abandoned.
    pub(super) fn wrote(&mut self, fua: bool) {
        assert!(
            matches!(self.phase, Phase::Reserved | Phase::Destaged),
            "record {} written twice",
            self.sequence
        );
        if self.phase == Phase::Destaged {
            return;
        }
        self.phase = Phase::Written;
        if fua {
            self.flushed();
        }
    }

    /// The log's disks were flushed after its write: durable (a wrap record
    /// done). Already durable or further: nothing changes.
    pub(super) fn flushed(&mut self) {
        assert!(
            self.phase != Phase::Reserved,
            "record {} flushed before it was written",
            self.sequence
        );
        if self.phase == Phase::Written {
            self.phase = if self.wrap {
                Phase::Destaged
            } else {
                Phase::Durable
            };
        }
    }

    /// A destage round takes it (again, if an earlier round left some of
    /// its blocks behind).
    pub(super) fn pick(&mut self) {
        assert!(
            matches!(self.phase, Phase::Durable | Phase::Picked),
            "record {} picked while {:?}",
            self.sequence,
            self.phase
        );
        self.phase = Phase::Picked;
    }

    /// The round that picked it wrote its blocks home and flushed.
    pub(super) fn went_home(&mut self) {
        assert_eq!(
            self.phase,
            Phase::Picked,
            "record {} went home unpicked",
            self.sequence
        );
        self.phase = Phase::Destaged;
    }

    /// A row image (or the wrap before it), written with FUA, whose row was
    /// then written home: nothing left to take home.
    pub(super) fn image_done(&mut self) {
        assert!(
            matches!(self.phase, Phase::Reserved | Phase::Destaged),
            "row image {} finished while {:?}",
            self.sequence,
            self.phase
        );
        self.phase = Phase::Destaged;
    }

    /// The log failed: the record will never be read from the ring again
    /// (its data, if any, goes home from memory or from what the log
    /// still holds). Legal from any phase.
    pub(super) fn abandon(&mut self) {
        self.phase = Phase::Destaged;
    }

    /// A direct write under this dirty-range record begins.
    pub(super) fn pin(&mut self) {
        assert!(
            !self.is_picked(),
            "record {} pinned while {:?}",
            self.sequence,
            self.phase
        );
        self.pins += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(wrap: bool) -> Record {
        let at = Cursor {
            position: 0,
            offset: 0,
            lap: 0,
        };
        Record::reserved(at, 8192, 1, vec![7], wrap, false)
    }

    #[test]
    fn a_record_goes_through_its_phases_in_order() {
        let mut logged = record(false);
        logged.wrote(false);
        assert_eq!(logged.phase(), Phase::Written);
        assert!(logged.holds_data() && !logged.is_durable());
        logged.flushed();
        logged.flushed();
        assert_eq!(logged.phase(), Phase::Durable);
        logged.pick();
        logged.pick();
        logged.went_home();
        assert!(logged.is_destaged() && !logged.holds_data());
        // With FUA durable at once; a wrap record is done once durable.
        let mut fua = record(false);
        fua.wrote(true);
        assert_eq!(fua.phase(), Phase::Durable);
        let mut wrap = record(true);
        wrap.wrote(false);
        wrap.flushed();
        assert!(wrap.is_destaged());
        // An abandoned record stays abandoned when its write ends.
        let mut abandoned = record(false);
        abandoned.abandon();
        abandoned.wrote(true);
        assert!(abandoned.is_destaged());
    }

    #[test]
    #[should_panic(expected = "went home unpicked")]
    fn a_record_not_picked_cannot_go_home() {
        let mut logged = record(false);
        logged.wrote(true);
        logged.went_home();
    }

    #[test]
    #[should_panic(expected = "picked while Written")]
    fn a_record_not_durable_cannot_be_picked() {
        let mut logged = record(false);
        logged.wrote(false);
        logged.pick();
    }

    #[test]
    #[should_panic(expected = "flushed before it was written")]
    fn a_record_cannot_be_durable_before_it_is_written() {
        record(false).flushed();
    }

    #[test]
    #[should_panic(expected = "pinned while Picked")]
    fn a_picked_record_cannot_be_pinned() {
        let mut logged = record(false);
        logged.wrote(true);
        logged.pick();
        logged.pin();
    }
}
