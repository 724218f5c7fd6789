//! Appending records and making them durable: ring space reserved (a
//! writer that finds the ring full destages a round), the record written
//! to every copy of the log and indexed, then a group commit (one writer
//! flushes the log's disks for every record written so far) or FUA.
//! Small writes share records (see `batch`).
//!
//! Depends on: the journal's root (state, index), `ring`, `record`,
//! `format`, `batch`, `home`.

use super::*;

impl<H: HomeIo> Journal<H> {
    /// Log one block-aligned write, in a record of its own or (a small one)
    /// shared with writes in flight beside it (see [`batch`]); return once
    /// durable.
    pub(super) async fn append_writes(
        &self,
        home: &H,
        offset: u64,
        data: Bytes,
    ) -> Result<(), EngineError> {
        let length = data.len() as u64;
        if length > batch::SHARED_MAX_BYTES {
            // Its header is a small share of it: alone, as it came.
            let contents = batch::Batch::alone(offset, data).record();
            return self.append(home, Kind::Writes, contents).await.map(|_| ());
        }
        let limits = batch::Limits {
            payload_bytes: self.record_payload_max().max(BLOCK_BYTES),
            entries: ENTRIES_MAX,
        };
        let arrived = self.state().batches.arrive(offset, data, limits);
        let receiver = match arrived {
            batch::Arrival::Go(batch) => return self.append_batch(home, batch).await,
            batch::Arrival::Wait(receiver) => receiver,
        };
        let mut waiting = Waiting {
            journal: self,
            receiver,
        };
        let reason = match (&mut waiting.receiver).await {
            Ok(batch::Turn::Lead(batch)) => return self.append_batch(home, batch).await,
            Ok(batch::Turn::Done(Ok(()))) => return Ok(()),
            Ok(batch::Turn::Done(Err(reason))) => reason,
            Err(oneshot::Canceled) => "its log record was abandoned".to_string(),
        };
        Err(EngineError::Unavailable {
            space: home.name().to_string(),
            offset,
            length,
            reason,
        })
    }

    /// Write a batch as one record holding one of the log's writers (passed
    /// on once the record is written), wait until it is durable and tell
    /// the batch's other writes.
    pub(super) async fn append_batch(
        &self,
        home: &H,
        batch: batch::Batch,
    ) -> Result<(), EngineError> {
        let writer = Writer(self);
        let written = self.write_record(home, Kind::Writes, batch.record()).await;
        drop(writer);
        let result = match written {
            Ok(Some(sequence)) => self.make_durable(home, sequence).await,
            Ok(None) => Ok(()),
            Err(error) => Err(error),
        };
        batch.tell(result.as_ref().map(|_| ()).map_err(ToString::to_string));
        result
    }

    /// Append one record and wait until it and all before it are durable;
    /// its sequence, or `None` if the log has failed (its data, if any,
    /// went straight home instead).
    pub(super) async fn append(
        &self,
        home: &H,
        kind: Kind,
        contents: Contents,
    ) -> Result<Option<u64>, EngineError> {
        let sequence = self.write_record(home, kind, contents).await?;
        if let Some(sequence) = sequence {
            self.make_durable(home, sequence).await?;
        }
        Ok(sequence)
    }

    /// Write one record to the log (not yet flushed) and index its blocks;
    /// its sequence, or `None` if the log has failed (before the record
    /// found its place, or writing it) and its blocks went straight home
    /// instead: a write the disks can take never fails with the log.
    pub(super) async fn write_record(
        &self,
        home: &H,
        kind: Kind,
        contents: Contents,
    ) -> Result<Option<u64>, EngineError> {
        let Contents {
            entries,
            blocks,
            pieces,
        } = contents;
        let payload_bytes = pieces.len() as u64 * BLOCK_BYTES;
        let record_bytes = HEADER_BYTES + payload_bytes;
        let reserved = self
            .reserve(
                home,
                record_bytes,
                &blocks,
                kind == Kind::Writes,
                kind == Kind::Dirty,
            )
            .await?;
        let Some(((at, sequence, wrap), alone)) = reserved else {
            // Write-through: no record; the data goes home as it would
            // have from the log.
            self.write_through(home, pieces).await?;
            return Ok(None);
        };
        // The header's place first, filled in once the payload's checksum
        // is known.
        let header_place = [0u8; HEADER_BYTES as usize];
        let mut payload = aligned_concat(
            record_bytes as usize,
            std::iter::once(&header_place[..]).chain(pieces.iter().map(|(_, data)| &data[..])),
        );
        debug_assert_eq!(payload.len() as u64, record_bytes);
        let header = Header {
            kind,
            epoch: self.epoch,
            sequence,
            position: at.position,
            record_bytes,
            payload_checksum: crc32c::crc32c(&payload[HEADER_BYTES as usize..]),
            entries,
        };
        payload[..HEADER_BYTES as usize].copy_from_slice(&header.encode());
        // Written with FUA, durable once written, without a flush of the
        // log's disks after it: when alone (see `reserve`), where that saves
        // a round trip per write at one outstanding write; and always where
        // the log's disks say FUA costs them nothing (no volatile cache, or
        // a power-loss-protected one), where a flush behind every group of
        // records would only add its wait. Otherwise the group commit
        // flushes it with the others.
        let fua = alone || self.log.cheap_fua();
        let mut writes = Vec::new();
        if let Some((wrap_at, wrap_sequence)) = wrap {
            writes.push(self.log.write_home(
                wrap_at.offset,
                self.wrap_block(wrap_at, wrap_sequence, at.position),
                fua,
            ));
        }
        let record = payload.freeze();
        writes.push(self.log.write_home(at.offset, record.clone(), fua));
        let results = join_all(writes).await;
        self.counters
            .log_bytes_written
            .fetch_add(record_bytes, Ordering::Relaxed);
        if let Some(error) = results.into_iter().find_map(Result::err) {
            let sequences: Vec<u64> = wrap.map(|(_, s)| s).into_iter().chain([sequence]).collect();
            self.log_failed(home, &sequences, &blocks, error.to_string())
                .await;
            // The write itself still has to happen: straight home.
            self.write_through(home, pieces).await?;
            return Ok(None);
        }
        {
            let mut state = self.state();
            for done in wrap.map(|(_, s)| s).into_iter().chain([sequence]) {
                if let Some(record) = state.record_mut(done) {
                    // With FUA durable, and a wrap record done, as in the
                    // group commit.
                    record.wrote(fua);
                }
            }
            if fua {
                // Durable from here on once every record before it is.
                advance_durable(&mut state);
            }
            // The index holds the record's own buffer (one allocation per
            // record, accounted whole), if the pool's log memory has room.
            let resident = !pieces.is_empty() && self.log.log_memory_take(record_bytes);
            if resident {
                if let Some(logged) = state.record_mut(sequence) {
                    logged.charged = record_bytes;
                }
            }
            // In order: of two pieces of one block in one record (writes
            // sharing it), the later wins, as on replay.
            for (i, (block, _)) in pieces.into_iter().enumerate() {
                let from = (HEADER_BYTES + i as u64 * BLOCK_BYTES) as usize;
                let held = Held {
                    at: at.offset + from as u64,
                    sum: terrace_meta::sums::block_sum(
                        &record[from..from + BLOCK_BYTES as usize],
                        block,
                    ),
                    data: resident.then(|| Block {
                        buffer: record.clone(),
                        from,
                    }),
                };
                // Reserved by this record, unless a later write's record
                // over the block failed meanwhile and forgot the
                // reservation (the log failed: its data went home). The
                // two writes were in flight together, so either may land
                // last; this one is taken again here and goes home with
                // the rest of the log.
                let entry = state.index.entry(block).or_insert(Entry {
                    reserved: sequence,
                    committed: None,
                });
                if entry.committed.as_ref().is_none_or(|(s, _)| *s <= sequence) {
                    let fresh = entry.committed.is_none();
                    entry.committed = Some((sequence, held));
                    if fresh {
                        state.dirty_bytes += BLOCK_BYTES;
                    }
                }
            }
            state.assert_invariants();
            // A group commit waiting for this write can go now.
            for sender in state.sync_waiters.drain(..) {
                let _ = sender.send(());
            }
        }
        Ok(Some(sequence))
    }

    /// Wait until record `sequence` (written) and all before it are
    /// durable; if the log fails first, write its data home instead.
    pub(super) async fn make_durable(&self, home: &H, sequence: u64) -> Result<(), EngineError> {
        if self.sync_through(home, sequence).await.is_err() {
            // The log failed: this record's data is committed in the
            // index; write it home with the rest.
            let _guard = self.destaging.lock().await;
            self.destage_all_locked(home).await?;
        }
        Ok(())
    }

    /// Group commit: return once record `sequence` and every earlier one
    /// are durable. One writer at a time flushes the log's disks for every
    /// record written so far; the others wait for it and check again.
    pub(super) async fn sync_through(&self, home: &H, sequence: u64) -> Result<(), EngineError> {
        enum Role {
            Done,
            Lead(u64),
            Wait(oneshot::Receiver<()>),
        }
        loop {
            let role = {
                let mut state = self.state();
                if let Some(reason) = &state.failed {
                    return Err(EngineError::Unavailable {
                        space: self.log.name().to_string(),
                        offset: 0,
                        length: 0,
                        reason: reason.clone(),
                    });
                }
                let mut end = state.durable_below;
                for record in state.records_from(end) {
                    if record.sequence == end && record.is_written() {
                        end += 1;
                    } else {
                        break;
                    }
                }
                if state.durable_below > sequence {
                    Role::Done
                } else if !state.syncing && end > state.durable_below {
                    state.syncing = true;
                    Role::Lead(end)
                } else {
                    let (sender, receiver) = oneshot::channel();
                    state.sync_waiters.push(sender);
                    Role::Wait(receiver)
                }
            };
            match role {
                Role::Done => return Ok(()),
                Role::Wait(receiver) => {
                    let _ = receiver.await;
                }
                Role::Lead(end) => {
                    let result = self.log.flush_own_disks().await;
                    if let Err(error) = &result {
                        self.log_failed_locked(home, &[], &[], error.to_string());
                    }
                    let mut state = self.state();
                    state.syncing = false;
                    if result.is_ok() {
                        let from = state.durable_below;
                        for record in state.records_from(from) {
                            if record.sequence >= end {
                                break;
                            }
                            if record.is_written() {
                                // A wrap record holds no data: done once
                                // durable (not before, or the tail could
                                // pass it unwritten).
                                record.flushed();
                            }
                        }
                        advance_durable(&mut state);
                        state.assert_invariants();
                    }
                    for sender in state.sync_waiters.drain(..) {
                        let _ = sender.send(());
                    }
                    result?;
                }
            }
        }
    }

    /// Reserve ring space (waiting for destaging if it is full), a sequence
    /// number, and the blocks' index entries; and whether the record is
    /// alone: every record before it durable, so nothing in flight before it.
    /// `None` once the log has failed, also while waiting for room (when it
    /// fails, the writers waiting are woken): the caller goes
    /// write-through.
    pub(super) async fn reserve(
        &self,
        home: &H,
        record_bytes: u64,
        blocks: &[u64],
        dirtying: bool,
        pinned: bool,
    ) -> Result<Option<(Reservation, bool)>, EngineError> {
        // Client records that find the ring full queue for room in the
        // order they came: room freed goes to the one waiting longest, and
        // one that comes while others wait queues behind them, so no writer
        // is passed over round after round. (Dirty-range records, a header
        // each, do not queue: a direct write holds the tail while it waits.)
        let mut turn = Turn {
            journal: self,
            ticket: None,
        };
        loop {
            let waiter = {
                let mut state = self.state();
                if state.failed.is_some() {
                    return Ok(None);
                }
                let first = state.room_queue.front().copied();
                let mine = !dirtying || first == turn.ticket;
                if let Some(reserved) = mine
                    .then(|| try_reserve(&mut state, record_bytes, blocks, dirtying, pinned))
                    .flatten()
                {
                    if turn.ticket.take().is_some() {
                        state.room_queue.pop_front();
                        // The next in line tries now.
                        state.wake_space_waiters();
                    }
                    let (_, sequence, wrap) = reserved;
                    let first = wrap.map_or(sequence, |(_, wrap_sequence)| wrap_sequence);
                    return Ok(Some((reserved, state.durable_below == first)));
                }
                if dirtying && turn.ticket.is_none() {
                    let ticket = state.next_room_ticket;
                    state.next_room_ticket += 1;
                    state.room_queue.push_back(ticket);
                    turn.ticket = Some(ticket);
                }
                let (sender, receiver) = oneshot::channel();
                state.space_waiters.push(sender);
                receiver
            };
            // Full: destage one round here if nobody else is, else wait
            // for them. One round, not everything: the tail moves on and
            // the writers waiting go on as soon as its records are home;
            // a full log then runs at the rate destaging frees it instead
            // of stalling every writer until the whole log is home.
            if let Some(_guard) = self.destaging.try_lock() {
                let progressed = self
                    .destage_locked(home, DESTAGE_ROUND_BYTES, DESTAGE_PARALLEL)
                    .await?;
                if !progressed {
                    // Nothing to destage: the ring holds records already
                    // home whose tail is not yet committed (after a shrink,
                    // more than the new size may), or records still in
                    // flight. Moving the tail wakes the waiters, this one
                    // too; else wait for the records in flight.
                    self.commit_tail(false).await?;
                    let _ = waiter.await;
                }
            } else {
                let _ = waiter.await;
            }
        }
    }

    /// The block of a wrap record at `at` pointing at `next`.
    pub(super) fn wrap_block(&self, at: Cursor, sequence: u64, next: u64) -> Bytes {
        let header = Header {
            kind: Kind::Wrap,
            epoch: self.epoch,
            sequence,
            position: at.position,
            record_bytes: HEADER_BYTES,
            payload_checksum: crc32c::crc32c(&[]),
            entries: vec![[next, 0, 0]],
        };
        let mut block = aligned_buffer(HEADER_BYTES as usize);
        block.copy_from_slice(&header.encode());
        block.freeze()
    }
}

/// A client record's place in the queue for ring room (see
/// [`Journal::reserve`]); given up when dropped, and the next in line
/// woken.
struct Turn<'a, H: HomeIo> {
    journal: &'a Journal<H>,
    ticket: Option<u64>,
}

impl<H: HomeIo> Drop for Turn<'_, H> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            let mut state = self.journal.state();
            state.room_queue.retain(|&queued| queued != ticket);
            state.wake_space_waiters();
        }
    }
}

/// One of the log's writers of client records (see [`batch`]), passed on
/// when dropped.
pub(super) struct Writer<'a, H: HomeIo>(&'a Journal<H>);

impl<H: HomeIo> Drop for Writer<'_, H> {
    fn drop(&mut self) {
        self.0.state().batches.release();
    }
}

/// A write waiting in a batch. If it goes away after being told to lead,
/// the lead passes to the batch's next write.
pub(super) struct Waiting<'a, H: HomeIo> {
    journal: &'a Journal<H>,
    receiver: oneshot::Receiver<batch::Turn>,
}

impl<H: HomeIo> Drop for Waiting<'_, H> {
    fn drop(&mut self) {
        self.receiver.close();
        if let Ok(Some(batch::Turn::Lead(batch))) = self.receiver.try_recv() {
            self.journal.state().batches.abandon(batch);
        }
    }
}

pub(super) fn advance_durable(state: &mut State) {
    let mut below = state.durable_below;
    // Records leave `records` only once destaged, which needs durability,
    // so every sequence from `durable_below` on is still listed.
    for record in state.records_from(below) {
        if record.sequence == below && record.is_durable() {
            below += 1;
        } else {
            break;
        }
    }
    state.durable_below = below;
    let waiters = std::mem::take(&mut state.durable_waiters);
    for (sequence, sender) in waiters {
        if sequence < below {
            let _ = sender.send(());
        } else {
            state.durable_waiters.push((sequence, sender));
        }
    }
}
