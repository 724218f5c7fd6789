//! Destage rounds: what `pick` chose is read back where only the log
//! holds it, written home (coalesced; parity rows with many runs as one
//! merged update; rows of degraded parity extents whole after a row image
//! in the log), the pool's disks flushed, the index entries dropped, the
//! records marked destaged and the new tail committed.
//!
//! Depends on: the journal's root (state, index), `pick`, `ring`,
//! `record`, `recovery` (read-back), `home`.

use super::*;

impl<H: HomeIo> Journal<H> {
    /// How urgently destaging should run: `None` below the start threshold
    /// while writes keep arriving.
    pub(super) fn destage_pressure(&self) -> Option<Pressure> {
        let quiet = self.is_quiet();
        let state = self.state();
        let size = state.lap_bytes.min(state.next_lap_bytes);
        let fill = (state.head.position - state.tail.position) * 1000 / size.max(1);
        let waiting = !state.space_waiters.is_empty();
        // Not `fill > 0`: a few blocks of a large ring are 0 per mille.
        let leftover = state.dirty_bytes > 0;
        (fill >= DESTAGE_START_PER_MILLE || waiting || (leftover && quiet)).then_some(Pressure {
            fill,
            flat_out: quiet || waiting,
        })
    }

    /// One destage round, if destaging is wanted (or `force`); returns
    /// whether it made progress.
    pub async fn destage(&self, home: &H, force: bool) -> Result<bool, EngineError> {
        if !force && self.destage_pressure().is_none() {
            return Ok(false);
        }
        let _guard = self.destaging.lock().await;
        let (budget, parallel) = match self.destage_pressure() {
            Some(Pressure { fill, flat_out }) => {
                let urgent = fill >= DESTAGE_URGENT_PER_MILLE;
                let budget = if urgent { 4 } else { 1 } * DESTAGE_ROUND_BYTES;
                (budget, destage_parallel(fill, flat_out))
            }
            None => (DESTAGE_ROUND_BYTES, DESTAGE_PARALLEL),
        };
        self.destage_locked(home, budget, parallel).await
    }

    /// A round's blocks with their data, read back from the log where only
    /// the log holds it. The ring cannot move under them: its tail moves
    /// only under the destaging lock the round holds.
    pub(super) async fn load(&self, picked: Picked) -> Result<Work, EngineError> {
        let held = picked.iter().map(|(&block, (_, held))| (block, held));
        let mut read = read_unheld(&*self.log, held).await?;
        Ok(picked
            .into_iter()
            .map(|(block, (sequence, held))| {
                let data = held.data.or_else(|| read.remove(&block));
                (block, (sequence, data.expect("read back")))
            })
            .collect())
    }

    /// Destage everything (before a resize, export or for tests).
    pub async fn drain(&self, home: &H) -> Result<(), EngineError> {
        let _guard = self.destaging.lock().await;
        while !self.is_clean() || {
            let state = self.state();
            state.tail != state.head
        } {
            if !self
                .destage_locked(home, u64::MAX, DESTAGE_PARALLEL)
                .await?
            {
                if self.is_clean() {
                    self.commit_tail(true).await?;
                    break;
                }
                home.env().sleep(1_000_000).await;
            }
        }
        Ok(())
    }

    pub(super) async fn destage_locked(
        &self,
        home: &H,
        budget: u64,
        parallel: usize,
    ) -> Result<bool, EngineError> {
        // The oldest durable records within the budget, and their blocks
        // whose newest data they still hold.
        let failed = self.state().failed.is_some();
        let quiet = self.is_quiet();
        // Parity rows: merged updates, whole rows and row images.
        let parity_row_bytes = home
            .geometry()
            .layout()
            .row_wide_redundancy()
            .then(|| home.natural_write_bytes());
        let started_ns = home.env().now_ns();
        let (picked, work) = {
            let mut state = self.state();
            if failed {
                pick::pick_write_through(&state)
            } else {
                let limits = pick::RoundLimits {
                    budget,
                    parity_row_bytes,
                    quiet,
                    space_blocks: home.size_bytes() / BLOCK_BYTES,
                };
                pick::pick_round(&mut state, &limits)
            }
        };
        if picked.is_empty() && work.is_empty() {
            return Ok(false);
        }
        let work = self.load(work).await?;
        // Rows of a degraded parity extent are written whole, after a row
        // image in the log: a cut in the middle cannot leave the missing
        // column undefined (the write hole), recovery rewrites the row.
        let row_bytes = home.natural_write_bytes();
        let degraded: BTreeSet<u64> = if failed || parity_row_bytes.is_none() {
            BTreeSet::new()
        } else {
            work.keys()
                .map(|block| block * BLOCK_BYTES / row_bytes)
                .collect::<BTreeSet<u64>>()
                .into_iter()
                .filter(|&row| !home.healthy_for(row * row_bytes, row_bytes))
                .collect()
        };
        let (imaged, plain): (Work, Work) = work
            .iter()
            .map(|(&block, entry)| (block, entry.clone()))
            .partition(|(block, _)| degraded.contains(&(block * BLOCK_BYTES / row_bytes)));
        // Rows whose image finds no room wait for a later round (their
        // records stay); if nothing else could be done, the first goes in
        // place so destaging always progresses.
        let mut skipped: BTreeSet<u64> = BTreeSet::new();
        let mut imaged_any = false;
        for &row in &degraded {
            let blocks: Work = imaged
                .range(row * row_bytes / BLOCK_BYTES..(row + 1) * row_bytes / BLOCK_BYTES)
                .map(|(&block, entry)| (block, entry.clone()))
                .collect();
            if self
                .destage_row_image(home, row * row_bytes, row_bytes)
                .await?
            {
                imaged_any = true;
            } else {
                skipped.extend(blocks.keys());
            }
        }
        if !imaged_any && plain.is_empty() {
            if let Some(&first) = skipped.first() {
                let row = first * BLOCK_BYTES / row_bytes;
                let range = row * row_bytes / BLOCK_BYTES..(row + 1) * row_bytes / BLOCK_BYTES;
                let blocks: Work = imaged
                    .range(range.clone())
                    .map(|(&block, entry)| (block, entry.clone()))
                    .collect();
                for (offset, data) in coalesce(&blocks, row_bytes / BLOCK_BYTES) {
                    home.write_home(offset, data, false).await?;
                }
                for block in range {
                    skipped.remove(&block);
                }
            }
        }
        // A round started with little pressure speeds up as the log fills
        // or writers begin to wait for room, instead of holding its first
        // pace to the end.
        let pace = || {
            self.destage_pressure().map_or(parallel, |p| {
                parallel.max(destage_parallel(p.fill, p.flat_out))
            })
        };
        let row_blocks = parity_row_bytes.map_or(1, |bytes| bytes / BLOCK_BYTES);
        let updates = updates(coalesce(&plain, row_blocks), parity_row_bytes);
        let merged = updates.iter().filter(|update| update.len() > 1).count();
        self.counters
            .rows_merged
            .fetch_add(merged as u64, Ordering::Relaxed);
        write_updates_home(home, &updates, &pace).await?;
        if let (Some((first, _)), Some((last, _))) =
            (plain.first_key_value(), plain.last_key_value())
        {
            let (start, end) = (first * BLOCK_BYTES, (last + 1) * BLOCK_BYTES);
            self.image_rows_gone_degraded(home, start, end - start, &degraded)
                .await?;
        }
        home.flush_pool_disks().await?;
        let written: u64 = (work.len() - skipped.len()) as u64 * BLOCK_BYTES;
        self.counters
            .destaged_bytes
            .fetch_add(written, Ordering::Relaxed);
        let ended_ns = home.env().now_ns();
        let elapsed = ended_ns.saturating_sub(started_ns).max(1);
        self.counters.destage_rate.store(
            written.saturating_mul(1_000_000_000) / elapsed,
            Ordering::Relaxed,
        );
        self.counters
            .destage_ended_ns
            .store(ended_ns, Ordering::Relaxed);
        {
            let mut state = self.state();
            for (block, (sequence, _)) in work.iter().filter(|(b, _)| !skipped.contains(b)) {
                let (cleared, remove) = match state.index.get_mut(block) {
                    Some(entry) if entry.committed.as_ref().is_some_and(|(s, _)| s == sequence) => {
                        entry.committed = None;
                        (true, entry.reserved == *sequence)
                    }
                    _ => (false, false),
                };
                if cleared {
                    state.dirty_bytes = state.dirty_bytes.saturating_sub(BLOCK_BYTES);
                }
                if remove {
                    state.index.remove(block);
                }
            }
            // By sequence: a scan of every record listed for each picked
            // one held the lock for milliseconds per round in a large ring.
            for &sequence in &picked {
                if let Some(record) = state.record_mut(sequence) {
                    if failed {
                        // Write-through takes everything home, whatever
                        // became of the records.
                        record.abandon();
                    } else if !record.blocks.iter().any(|b| skipped.contains(b)) {
                        record.went_home();
                    }
                }
            }
            state.assert_invariants();
        }
        if !failed {
            self.commit_tail(false).await?;
        } else {
            // What the log held is home and flushed: its tail is committed
            // over all of it, or an import would replay its records over
            // the writes that went straight home since (older data over
            // newer, acknowledged).
            self.commit_tail(true).await?;
            let mut state = self.state();
            let head = state.head;
            state.tail = head;
            self.log.log_memory_give_back(state.charged());
            state.records.clear();
            state.recent.clear();
            state.assert_invariants();
        }
        Ok(true)
    }

    /// Destage into one row of a degraded parity extent: log the whole
    /// row's new image (after every earlier record is durable, so the image
    /// holds everything logged before it), then write the row whole. Gives
    /// `false`, having done nothing, if the ring has no room for the image.
    pub(super) async fn destage_row_image(
        &self,
        home: &H,
        start: u64,
        length: u64,
    ) -> Result<bool, EngineError> {
        // The last row of a space may end early.
        let length = length.min(home.size_bytes().saturating_sub(start));
        if length == 0 {
            return Ok(true);
        }
        let named: Vec<u64> = (start / BLOCK_BYTES..(start + length) / BLOCK_BYTES).collect();
        let reserved = {
            let mut state = self.state();
            let lap = state.lap_bytes.min(state.next_lap_bytes);
            let fits = HEADER_BYTES + length <= lap * state.image_reserve_per_mille / 1000;
            fits.then(|| try_reserve(&mut state, HEADER_BYTES + length, &named, false, false))
                .flatten()
        };
        let Some((at, sequence, wrap)) = reserved else {
            return Ok(false);
        };
        let first_own = wrap.map_or(sequence, |(_, s)| s);
        let waiter = {
            let mut state = self.state();
            if state.durable_below >= first_own {
                None
            } else {
                let (sender, receiver) = oneshot::channel();
                state.durable_waiters.push((first_own - 1, sender));
                Some(receiver)
            }
        };
        if let Some(waiter) = waiter {
            let _ = waiter.await;
        }
        let sequences: Vec<u64> = wrap.map(|(_, s)| s).into_iter().chain([sequence]).collect();
        let image = match self.read_through(home, start, length).await {
            Ok(image) => image,
            Err(error) => {
                // The reserved record can never be written: the log cannot
                // go on past it, so the space goes write-through.
                self.log_failed_locked(
                    home,
                    &sequences,
                    &[],
                    format!("row image unreadable: {error}"),
                );
                return Err(error);
            }
        };
        let mut payload = aligned_buffer((HEADER_BYTES + length) as usize);
        payload[HEADER_BYTES as usize..].copy_from_slice(&image);
        let header = Header {
            kind: Kind::RowImage,
            epoch: self.epoch,
            sequence,
            position: at.position,
            record_bytes: HEADER_BYTES + length,
            payload_checksum: crc32c::crc32c(&payload[HEADER_BYTES as usize..]),
            entries: vec![[start, length, 0]],
        };
        payload[..HEADER_BYTES as usize].copy_from_slice(&header.encode());
        let mut writes = Vec::new();
        if let Some((wrap_at, wrap_sequence)) = wrap {
            writes.push(self.log.write_home(
                wrap_at.offset,
                self.wrap_block(wrap_at, wrap_sequence, at.position),
                true,
            ));
        }
        writes.push(self.log.write_home(at.offset, payload.freeze(), true));
        let results = join_all(writes).await;
        if let Some(error) = results.into_iter().find_map(Result::err) {
            self.log_failed_locked(home, &sequences, &[], error.to_string());
        } else {
            let mut state = self.state();
            for record in state.records.iter_mut() {
                if sequences.contains(&record.sequence) {
                    record.image_done();
                }
            }
            advance_durable(&mut state);
            state.assert_invariants();
            // Group commits waiting for the records after this one.
            for sender in state.sync_waiters.drain(..) {
                let _ = sender.send(());
            }
        }
        home.write_home(start, image.freeze(), false).await?;
        Ok(true)
    }

    /// A disk lost while rows were being written in place leaves them
    /// degraded with data and parity possibly torn in volatile caches: log
    /// each such row's image (as the disks now read) so a power cut before
    /// the next flush cannot leave its missing column undefined. Rows in
    /// `done` were written whole after an image already.
    pub(super) async fn image_rows_gone_degraded(
        &self,
        home: &H,
        offset: u64,
        length: u64,
        done: &BTreeSet<u64>,
    ) -> Result<(), EngineError> {
        if length == 0
            || !home.geometry().layout().row_wide_redundancy()
            || self.state().failed.is_some()
        {
            return Ok(());
        }
        let row_bytes = home.natural_write_bytes();
        for row in offset / row_bytes..(offset + length).div_ceil(row_bytes) {
            if !done.contains(&row) && !home.healthy_for(row * row_bytes, row_bytes) {
                // No room for an image: the row stays as written (the
                // window this closes is a power cut before the next flush).
                let _ = self
                    .destage_row_image(home, row * row_bytes, row_bytes)
                    .await?;
            }
        }
        Ok(())
    }

    /// Move the committed tail over destaged records (a metadata commit)
    /// when that frees a useful amount of ring, someone waits for space, or
    /// `always`.
    pub(super) async fn commit_tail(&self, always: bool) -> Result<(), EngineError> {
        let (tail, wanted) = {
            let state = self.state();
            let tail = state
                .records
                .iter()
                .find(|r| !r.is_destaged())
                .map_or(state.head, |r| r.at);
            let freed = tail.position - state.tail.position;
            let wanted = always
                || !state.space_waiters.is_empty()
                || freed >= state.lap_bytes.min(state.next_lap_bytes) / 8
                || (state.index.is_empty() && freed > 0);
            (tail, wanted && freed > 0)
        };
        if !wanted {
            return Ok(());
        }
        self.checkpoints
            .commit_tail(self.home, tail.position, tail.offset)
            .await?;
        let mut state = self.state();
        state.tail = tail;
        while state
            .records
            .front()
            .is_some_and(|r| r.at.position < tail.position)
        {
            let record = state.records.pop_front().expect("front");
            self.log.log_memory_give_back(record.charged);
            for block in record.blocks {
                if let Some(count) = state.recent.get_mut(&block) {
                    *count -= 1;
                    if *count == 0 {
                        state.recent.remove(&block);
                    }
                }
            }
        }
        state.assert_invariants();
        state.wake_space_waiters();
        Ok(())
    }
}

/// Why destaging should run now.
pub(super) struct Pressure {
    /// Share of the ring in use, per mille.
    fill: u64,
    /// Writers wait for ring space or have gone quiet: no reason to hold
    /// back (see [`destage_parallel`]).
    flat_out: bool,
}

/// Writes home in flight for a destage round at `fill` (per mille):
/// [`DESTAGE_PARALLEL_START`] at the start threshold, rising linearly to
/// [`DESTAGE_PARALLEL`] at the urgent one; `flat_out` (writers wait for room
/// or have gone quiet) means [`DESTAGE_PARALLEL`] at any fill.
pub(super) fn destage_parallel(fill: u64, flat_out: bool) -> usize {
    if flat_out {
        return DESTAGE_PARALLEL;
    }
    let above = fill.saturating_sub(DESTAGE_START_PER_MILLE);
    let span = DESTAGE_URGENT_PER_MILLE - DESTAGE_START_PER_MILLE;
    let extra = (DESTAGE_PARALLEL - DESTAGE_PARALLEL_START) as u64 * above.min(span) / span;
    DESTAGE_PARALLEL_START + extra as usize
}

/// Contiguous blocks joined into one write each: at most 4 MiB, and cut
/// only where a row of `row_blocks` blocks begins (so a run may be one row
/// where a row is larger); 1 where rows do not matter.
pub(super) fn coalesce(work: &Work, row_blocks: u64) -> Vec<(u64, Payload)> {
    const RUN_MAX_BLOCKS: u64 = (4 << 20) / BLOCK_BYTES;
    // Cuts fall on row boundaries: a run cut inside a row would leave that
    // row to two partial-row updates (each reading what it lacks) that
    // could have been one full-row write.
    let cut_blocks = (RUN_MAX_BLOCKS / row_blocks).max(1) * row_blocks;
    let mut runs: Vec<(u64, Vec<&Block>)> = Vec::new();
    let mut last = None;
    for (&block, (_, data)) in work {
        match runs.last_mut() {
            Some((_, parts)) if last == Some(block - 1) && !block.is_multiple_of(cut_blocks) => {
                parts.push(data);
            }
            _ => runs.push((block, vec![data])),
        }
        last = Some(block);
    }
    runs.into_iter()
        .map(|(start, blocks)| (start * BLOCK_BYTES, Payload::parts(views(&blocks))))
        .collect()
}

/// `blocks` (consecutive on the space) as views of their buffers: one view
/// for each stretch that lies end to end in one buffer (a log record's
/// blocks, logged in order), so destaging copies no bytes.
pub(super) fn views(blocks: &[&Block]) -> Vec<Bytes> {
    let view = |first: &Block, last: &Block| {
        first
            .buffer
            .slice(first.from..last.from + BLOCK_BYTES as usize)
    };
    let mut views = Vec::new();
    let mut stretch: Option<(&Block, &Block)> = None;
    for &block in blocks {
        stretch = match stretch {
            Some((first, last)) if last.followed_by(block) => Some((first, block)),
            Some((first, last)) => {
                views.push(view(first, last));
                Some((block, block))
            }
            None => Some((block, block)),
        };
    }
    views.extend(stretch.map(|(first, last)| view(first, last)));
    views
}

/// Coalesced runs (sorted) as updates home, each run alone; but where
/// `row_bytes` is given (parity), the runs within one row go together as
/// one merged update if there are [`MERGE_RUNS_MIN`] of them or more.
pub(super) fn updates(
    runs: Vec<(u64, Payload)>,
    row_bytes: Option<u64>,
) -> Vec<Vec<(u64, Payload)>> {
    let Some(row_bytes) = row_bytes else {
        return runs.into_iter().map(|run| vec![run]).collect();
    };
    let row_of = |(offset, data): &(u64, Payload)| {
        let (first, last) = (
            offset / row_bytes,
            (offset + data.len() as u64 - 1) / row_bytes,
        );
        (first == last).then_some(first)
    };
    let mut out = Vec::new();
    let mut group: Vec<(u64, Payload)> = Vec::new();
    let mut group_row = None;
    let close = |group: &mut Vec<(u64, Payload)>, out: &mut Vec<Vec<(u64, Payload)>>| {
        if group.len() >= MERGE_RUNS_MIN {
            out.push(std::mem::take(group));
        } else {
            out.extend(group.drain(..).map(|run| vec![run]));
        }
    };
    for run in runs {
        let row = row_of(&run);
        if row.is_none() || row != group_row {
            close(&mut group, &mut out);
            group_row = row;
        }
        match row {
            Some(_) => group.push(run),
            None => out.push(vec![run]),
        }
    }
    close(&mut group, &mut out);
    out
}

/// Write updates home (see [`updates`]), at most `parallel()` at a time,
/// asked again as each one ends (the next starts as soon as one ends).
/// After an error none starts, and every write running ends before the
/// first error is returned: none is left unawaited beside later writes to
/// its rows.
pub(super) async fn write_updates_home<H: HomeIo>(
    home: &H,
    updates: &[Vec<(u64, Payload)>],
    parallel: &(dyn Fn() -> usize + Sync),
) -> Result<(), EngineError> {
    let mut pending = updates.iter();
    let mut running = FuturesUnordered::new();
    let mut outcome = Ok(());
    loop {
        let allowed = parallel().max(1);
        while outcome.is_ok() && running.len() < allowed {
            let Some(update) = pending.next() else {
                break;
            };
            running.push(write_update(home, update));
        }
        match running.next().await {
            Some(Err(error)) if outcome.is_ok() => outcome = Err(error),
            Some(_) => {}
            None => return outcome,
        }
    }
}

pub(super) async fn write_update<H: HomeIo>(
    home: &H,
    update: &[(u64, Payload)],
) -> Result<(), EngineError> {
    match update {
        [(offset, data)] => home.write_home(*offset, data.clone(), false).await,
        pieces => home.write_home_merged(pieces).await,
    }
}
