//! The job runner's background pass over mirror rows an unclean shutdown
//! left owed (see [`crate::crash_resync`]): paced in one budget with the
//! jobs' moves. A row a client reads first is resynchronised on the spot
//! by its space instead.

use futures::future::join_all;

use crate::error::EngineError;
use crate::pool::Pool;

/// Rows the background pass resynchronises at once, so that the drives
/// see a queue rather than one row's reads and writes at a time.
const ROWS_AT_ONCE: usize = 8;

impl Pool {
    /// Resynchronise every mirror row left since an unclean shutdown (see
    /// the module doc); the job runner runs it, and it returns at once when
    /// nothing is left. An extent stays named in the write intent until
    /// the runner's idle clearing has flushed it.
    pub async fn resync_after_crash(&self) -> Result<(), EngineError> {
        while let Some((id, extent, rows)) = self.shared.crash_resync.next() {
            self.shared.check_open()?;
            let Some(space) = self.spaces().into_iter().find(|space| space.id() == id) else {
                // Deleted.
                self.shared.crash_resync.forget(id);
                continue;
            };
            let row_bytes = space.geometry().row_data_bytes();
            for batch in rows.chunks(ROWS_AT_ONCE) {
                // Paced by the pool's repair rate, in one budget with the
                // jobs' moves; reads that meet owed rows are not.
                let rate = self
                    .shared
                    .control
                    .lock()
                    .await
                    .metadata
                    .settings
                    .repair_rate_bytes_per_second;
                self.wait_turn(rate, batch.len() as u64 * row_bytes).await;
                self.shared.check_open()?;
                let resyncs = batch
                    .iter()
                    .map(|&row| space.resync_crashed_row(u64::from(extent), row, false));
                for resynced in join_all(resyncs).await {
                    resynced?;
                }
            }
            self.shared.persist_failures().await?;
        }
        Ok(())
    }
}
