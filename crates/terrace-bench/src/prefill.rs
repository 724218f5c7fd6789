//! Prefill: random data written once, sequentially, over a target's working
//! set before any profile reads from it, so that reads return written data
//! rather than holes (which thin-provisioned targets, sparse files and
//! `nbdkit memory` answer without touching storage). Then a flush.

use futures::stream::{FuturesUnordered, StreamExt};

use crate::rng::Rng;
use crate::runner::WritePool;
use crate::target::Target;
use crate::BenchError;

/// Prefill request size: 1 MiB moves data at full speed on every target
/// and stays far below NBD's 32 MiB request limit.
pub const PREFILL_CHUNK_BYTES: u64 = 1 << 20;
/// Prefill requests in flight: enough to keep a device or a connection busy.
pub const PREFILL_DEPTH: usize = 8;
/// The prefill's own generator seed, so prefill data never repeats a run's.
const PREFILL_SEED: u64 = 0x7e77_ace0_f111_0001;

/// Write random data over `[0, working_set_bytes)` in order, calling
/// `progress` with the bytes written so far, then flush.
pub async fn prefill(
    target: &dyn Target,
    working_set_bytes: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), BenchError> {
    let mut rng = Rng::new(PREFILL_SEED);
    let pool = WritePool::new(PREFILL_CHUNK_BYTES, &mut rng);
    let mut in_flight = FuturesUnordered::new();
    let (mut issued, mut written) = (0u64, 0u64);
    loop {
        while issued < working_set_bytes && in_flight.len() < PREFILL_DEPTH {
            let length = PREFILL_CHUNK_BYTES.min(working_set_bytes - issued);
            let request = target.write(issued, pool.payload(length, &mut rng));
            in_flight.push(async move { request.await.map(|()| length) });
            issued += length;
        }
        let Some(result) = in_flight.next().await else {
            break;
        };
        written += result.map_err(|error| BenchError::target(target, error))?;
        progress(written);
    }
    target
        .flush()
        .await
        .map_err(|error| BenchError::target(target, error))
}
