//! Failover to write-through: when the log cannot take a record (no copy
//! written) or cannot be flushed, every record is abandoned, the dirty data
//! goes home (from memory, or read back from what is left of the log) and
//! is flushed, and writes in flight go straight home with FUA once what
//! the log holds of their blocks is home. The space's write intent covers
//! its writes from then on.
//!
//! Depends on: the journal's root (state, destage rounds), `home`.

use super::*;

impl<H: HomeIo> Journal<H> {
    /// The log could not take a record: write every dirty block home (from
    /// memory, or read back from what is left of the log), flush, and run
    /// write-through from now on.
    pub(super) async fn log_failed(
        &self,
        home: &H,
        sequences: &[u64],
        blocks: &[u64],
        reason: String,
    ) {
        self.log_failed_locked(home, sequences, blocks, reason);
        let _guard = self.destaging.lock().await;
        let _ = self.destage_all_locked(home).await;
    }

    /// Write-through in place of a record: `pieces` (block, data, in record
    /// order: of two pieces of one block the later wins, as on replay)
    /// straight home, in runs of consecutive blocks, with FUA as the record
    /// would have been durable when acknowledged. The disks' write intent
    /// covers them there (the space uses it once its log has failed).
    pub(super) async fn write_through(
        &self,
        home: &H,
        pieces: Vec<(u64, Bytes)>,
    ) -> Result<(), EngineError> {
        let (Some(first), Some(last)) = (
            pieces.iter().map(|(block, _)| *block).min(),
            pieces.iter().map(|(block, _)| *block).max(),
        ) else {
            return Ok(());
        };
        self.settle_blocks(home, first, last + 1).await?;
        for run in block_runs_in_order(&pieces) {
            let (start, _) = run[0];
            let data = aligned_concat(
                run.len() * BLOCK_BYTES as usize,
                run.iter().map(|(_, data)| &data[..]),
            );
            home.write_home(start * BLOCK_BYTES, data.freeze(), true)
                .await?;
        }
        Ok(())
    }

    /// Write-through: before blocks `[first, end)` are written home, what
    /// the log still holds of any of them goes home, so that older logged
    /// data never lands over the new, and the tail is committed over every
    /// record that names them, so that an import never replays one over
    /// the new either (a row image already home, say, when the log failed
    /// on the next row's). If that cannot be done the write fails. (Blocks
    /// reserved by a record still in flight are a concurrent write: either
    /// may land last.)
    pub(super) async fn settle_blocks(
        &self,
        home: &H,
        first: u64,
        end: u64,
    ) -> Result<(), EngineError> {
        if Self::logged(&self.state(), first, end) {
            let _guard = self.destaging.lock().await;
            self.destage_all_locked(home).await?;
        }
        Ok(())
    }

    /// Destage rounds until one finds nothing to take: a write-through log
    /// reads back a bounded amount per round.
    pub(super) async fn destage_all_locked(&self, home: &H) -> Result<(), EngineError> {
        while self
            .destage_locked(home, u64::MAX, DESTAGE_PARALLEL)
            .await?
            && !self.is_clean()
        {}
        Ok(())
    }

    /// Mark the log failed (write-through from now on) and release what
    /// waits on it; the caller writes the dirty data home. The home learns
    /// it first: its writes from then on are its own to account for.
    pub(super) fn log_failed_locked(
        &self,
        home: &H,
        sequences: &[u64],
        blocks: &[u64],
        reason: String,
    ) {
        {
            let mut state = self.state();
            if state.failed.is_none() {
                home.log_failed();
                let failed = format!("write-through: the log failed ({reason})");
                let event = crate::PoolEvent::WriteThrough {
                    space: self.home,
                    reason: failed.clone(),
                };
                self.log.emit(event);
                state.failed = Some(failed);
            }
            // Forget this record's reservations; its data goes home directly.
            let sequence = sequences.last().copied().unwrap_or(0);
            for block in blocks {
                if let Some(entry) = state.index.get(block) {
                    if entry.reserved == sequence && entry.committed.is_none() {
                        state.index.remove(block);
                    }
                }
            }
            for &sequence in sequences {
                if let Some(record) = state.record_mut(sequence) {
                    record.abandon();
                }
            }
            state.assert_invariants();
            for sender in state.sync_waiters.drain(..) {
                let _ = sender.send(());
            }
            for (_, sender) in state.durable_waiters.drain(..) {
                drop(sender);
            }
            state.wake_space_waiters();
        }
    }

    /// Before a flush completes: in write-through mode, everything still in
    /// the index goes home.
    pub(crate) async fn settle(&self, home: &H) -> Result<(), EngineError> {
        if self.state().failed.is_some() && !self.is_clean() {
            let _guard = self.destaging.lock().await;
            self.destage_all_locked(home).await?;
        }
        Ok(())
    }
}

/// A record's pieces in runs of consecutive blocks, in their order (a run
/// ends where the next piece is not the next block).
pub(super) fn block_runs_in_order(pieces: &[(u64, Bytes)]) -> Vec<&[(u64, Bytes)]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=pieces.len() {
        if i == pieces.len() || pieces[i].0 != pieces[i - 1].0 + 1 {
            runs.push(&pieces[start..i]);
            start = i;
        }
    }
    runs
}
