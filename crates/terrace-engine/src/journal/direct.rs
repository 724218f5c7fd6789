//! Writes straight to the disks past the log (whole rows over nothing
//! logged, on healthy rows): the `Dirty` record logged around them, its
//! lease reused by a stream's next writes, and the `Invalidate` record
//! after them where older records name their blocks.
//!
//! Depends on: the journal's root (state, appending), `home`.

use super::*;

impl<H: HomeIo> Journal<H> {
    /// Whether `[offset, offset + length)` may go straight to the disks:
    /// the log works, holds nothing dirty there, and the rows are healthy.
    /// `Some(true)` if older records mention the range (the direct write
    /// must invalidate them).
    pub(super) fn direct_allowed(&self, home: &H, offset: u64, length: u64) -> Option<bool> {
        let (first, end) = (offset / BLOCK_BYTES, (offset + length) / BLOCK_BYTES);
        let state = self.state();
        (state.failed.is_none()
            && !Self::overlaps_index(&state, first, end)
            && home.healthy_for(offset, length))
        .then(|| state.names(first, end))
    }

    /// Whole rows straight to the disks, with a dirty-range record around
    /// the write and invalidation of older records after it.
    pub(super) async fn write_direct(
        &self,
        home: &H,
        offset: u64,
        data: impl Into<Payload>,
        fua: bool,
        invalidate: bool,
    ) -> Result<(), EngineError> {
        let data = data.into();
        let length = data.len() as u64;
        let intent = self
            .begin_direct(home, offset, length, DIRECT_AHEAD_BYTES)
            .await?;
        let (written, ()) = futures::join!(
            home.write_home(offset, data, fua),
            self.renew_lease(home, offset + length)
        );
        self.end_direct(intent);
        written?;
        self.image_rows_gone_degraded(home, offset, length, &BTreeSet::new())
            .await?;
        if invalidate {
            self.invalidate(home, offset / BLOCK_BYTES, (offset + length) / BLOCK_BYTES)
                .await?;
        }
        Ok(())
    }

    /// After a direct write of `[offset, offset + length)`: make sure
    /// recovery never replays older logged data over it.
    pub(crate) async fn after_direct(
        &self,
        home: &H,
        offset: u64,
        length: u64,
    ) -> Result<(), EngineError> {
        let first = offset.div_ceil(BLOCK_BYTES);
        let end = (offset + length) / BLOCK_BYTES;
        let needed = {
            let state = self.state();
            state.failed.is_none() && end > first && state.names(first, end)
        };
        if needed {
            self.invalidate(home, first, end).await?;
        }
        Ok(())
    }

    pub(super) async fn invalidate(
        &self,
        home: &H,
        first: u64,
        end: u64,
    ) -> Result<(), EngineError> {
        // Only blocks not dirty in the log: a dirty block's newer record
        // stays valid (it is later in the log than this one).
        let blocks: Vec<u64> = {
            let state = self.state();
            state
                .recent
                .range(first..end)
                .map(|(&block, _)| block)
                .filter(|block| !state.index.contains_key(block))
                .collect()
        };
        for group in ranges(&blocks).chunks(ENTRIES_MAX) {
            let entries: Vec<[u64; 3]> = group
                .iter()
                .map(|&(start, count)| [start, count, 0])
                .collect();
            let named: Vec<u64> = group
                .iter()
                .flat_map(|&(start, count)| start..start + count)
                .collect();
            let contents = Contents {
                entries,
                blocks: named,
                pieces: Vec::new(),
            };
            self.append(home, Kind::Invalidate, contents).await?;
        }
        Ok(())
    }

    /// Before writing `[offset, offset + length)` straight to the disks:
    /// log the range as dirty (durably), so that recovery resynchronises
    /// its redundancy if a power cut tears the write. The record names
    /// `ahead` bytes more, so that the writes after it can reuse it while
    /// it is in use; it holds the tail until every write under it has
    /// called [`Journal::end_direct`]. `None` when write-through.
    pub(crate) async fn begin_direct(
        &self,
        home: &H,
        offset: u64,
        length: u64,
        ahead: u64,
    ) -> Result<Option<u64>, EngineError> {
        if length == 0 {
            return Ok(None);
        }
        {
            let mut state = self.state();
            if state.failed.is_some() {
                return Ok(None);
            }
            let now_ns = home.env().now_ns();
            if let Some(sequence) = reuse_lease(&mut state, offset, offset + length, now_ns) {
                return Ok(Some(sequence));
            }
        }
        let end = (offset + length + ahead)
            .min(home.size_bytes())
            .max(offset + length);
        self.counters
            .dirty_range_waits
            .fetch_add(1, Ordering::Relaxed);
        match self.log_lease(home, offset, end).await {
            Ok(sequence) => Ok(sequence),
            Err(_) if self.state().failed.is_some() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Log a dirty-range record for `[start, end)` (pinned once, for its
    /// caller) and offer it to later direct writes as a lease; `None` if
    /// the log has failed (the space is write-through: nothing to log).
    pub(super) async fn log_lease(
        &self,
        home: &H,
        start: u64,
        end: u64,
    ) -> Result<Option<u64>, EngineError> {
        let contents = Contents {
            entries: vec![[start, end - start, 0]],
            blocks: Vec::new(),
            pieces: Vec::new(),
        };
        let Some(sequence) = self.append(home, Kind::Dirty, contents).await? else {
            return Ok(None);
        };
        let mut state = self.state();
        if state.leases.len() == LEASES_MAX {
            state.leases.pop_front();
        }
        state.leases.push_back(Lease {
            start,
            end,
            sequence,
            logged_ns: home.env().now_ns(),
        });
        Ok(Some(sequence))
    }

    /// While a direct write ending at `end` runs: if no lease will cover
    /// the next [`DIRECT_AHEAD_BYTES`] / 4 after it for long enough, log
    /// the next one now, so that a stream's next writes find a durable
    /// record waiting instead of each [`DIRECT_AHEAD_BYTES`] waiting for a
    /// log commit. At most one renewal at a time; a failed one is left to
    /// the write that needs the range.
    pub(super) async fn renew_lease(&self, home: &H, end: u64) {
        let size = home.size_bytes();
        {
            let mut state = self.state();
            let now_ns = home.env().now_ns();
            let wanted = (end + DIRECT_AHEAD_BYTES / 4).min(size);
            let covered = state.leases.iter().any(|lease| {
                lease.start <= end
                    && wanted <= lease.end
                    && now_ns.saturating_sub(lease.logged_ns) < LEASE_NS / 2
            });
            if end >= size
                || covered
                || state.renewing
                || state.failed.is_some()
                || !state.space_waiters.is_empty()
            {
                return;
            }
            state.renewing = true;
        }
        let _renewing = Renewing(self);
        let next = (end + DIRECT_AHEAD_BYTES).min(size);
        if let Ok(sequence) = self.log_lease(home, end, next).await {
            self.end_direct(sequence);
        }
    }

    /// The direct write logged by [`Journal::begin_direct`] has finished
    /// (well or not): its record may go once the disks are flushed. Its
    /// last pin gone, writers waiting for ring space try again: one of them
    /// destages, and the tail may now pass the record. (A writer that found
    /// the ring full while the record was pinned destaged nothing and
    /// waits; without this nothing would wake it.)
    pub(crate) fn end_direct(&self, sequence: Option<u64>) {
        let Some(sequence) = sequence else {
            return;
        };
        let mut state = self.state();
        let Some(record) = state.record_mut(sequence) else {
            return;
        };
        assert!(
            record.pins > 0,
            "record {sequence} unpinned more than pinned"
        );
        record.pins -= 1;
        if record.pins == 0 {
            state.wake_space_waiters();
        }
    }
}

/// A lease renewal in progress; ends when dropped.
pub(super) struct Renewing<'a, H: HomeIo>(&'a Journal<H>);

impl<H: HomeIo> Drop for Renewing<'_, H> {
    fn drop(&mut self) {
        self.0.state().renewing = false;
    }
}

/// A dirty-range record that later direct writes may reuse.
pub(super) struct Lease {
    start: u64,
    end: u64,
    sequence: u64,
    logged_ns: u64,
}

/// Pin a dirty-range record that covers `[start, end)` and may still be
/// pinned: durable with everything before it (a recovery scan reaches it),
/// and not yet taken by a destage round (which would let the tail pass it
/// while the new write is in flight). Not while writers wait for ring
/// space, nor past [`LEASE_NS`]: then the record is let go, so destaging
/// can pass it. Its sequence, if one was found.
pub(super) fn reuse_lease(state: &mut State, start: u64, end: u64, now_ns: u64) -> Option<u64> {
    if !state.space_waiters.is_empty() {
        return None;
    }
    let durable_below = state.durable_below;
    let sequence = state
        .leases
        .iter()
        .rev()
        .find(|lease| {
            lease.start <= start
                && end <= lease.end
                && lease.sequence < durable_below
                && now_ns.saturating_sub(lease.logged_ns) < LEASE_NS
        })
        .map(|lease| lease.sequence)?;
    let record = state.record_mut(sequence)?;
    if record.is_picked() {
        return None;
    }
    record.pin();
    Some(sequence)
}
