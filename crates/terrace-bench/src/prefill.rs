//! Prefill: random data written once, sequentially, over a target's working
//! set before any profile reads from it, so that reads return written data
//! rather than holes (which thin-provisioned targets, sparse files and
//! `nbdkit memory` answer without touching storage). Then a flush.

use futures::stream::{FuturesUnordered, StreamExt};

use crate::runner::WritePool;
use crate::target::Target;
use crate::BenchError;
use terrace_io::random::SplitMix64;

/// Prefill request size: 8 MiB, several full rows of any parity layout up
/// to 16 data columns of 256 KiB interleave (2 MiB rows at 8 columns), so a
/// parity space is filled by full-row writes, not read-modify-write;
/// capped by the target's own request limit (NBD: 32 MiB).
pub const PREFILL_CHUNK_BYTES: u64 = 8 << 20;
/// Prefill requests in flight: enough to keep every drive of a pool busy,
/// few enough that 32 MiB of buffers stay pinned at most.
pub const PREFILL_DEPTH: usize = 4;
/// The prefill's own generator seed, so prefill data never repeats a run's.
const PREFILL_SEED: u64 = 0x7e77_ace0_f111_0001;

/// Write random data over `[0, working_set_bytes)` in order, calling
/// `progress` with the bytes written so far, then flush.
pub async fn prefill(
    target: &dyn Target,
    working_set_bytes: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), BenchError> {
    let alignment = target.alignment().max(1);
    let chunk = PREFILL_CHUNK_BYTES.min(target.request_max_bytes()) / alignment * alignment;
    let chunk = chunk.max(alignment);
    let mut rng = SplitMix64::new(PREFILL_SEED);
    let pool = WritePool::new(chunk, &mut rng);
    let mut in_flight = FuturesUnordered::new();
    let (mut issued, mut written) = (0u64, 0u64);
    loop {
        while issued < working_set_bytes && in_flight.len() < PREFILL_DEPTH {
            let length = chunk.min(working_set_bytes - issued);
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
