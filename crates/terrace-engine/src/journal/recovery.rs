//! Recovery at import, and reading logged blocks back from the log.
//!
//! The scan reads records in order from the committed tail and stops at
//! the first that is not valid (magic, epoch, position, sequence,
//! checksums): nothing acknowledged lies beyond it. It gives the newest
//! place in the log of every block the records hold (an `Invalidate`
//! record drops earlier data of its blocks) and the ranges `Dirty` records
//! name; replay reads those blocks back a bounded amount at a time, writes
//! them home and flushes. A read-only pool serves them from the log
//! instead. Read-back serves the same purpose for a running journal whose
//! records were logged beyond the pool's log memory.
//!
//! Depends on: `home` (the log and home are [`HomeIo`]s), `format`, and
//! the journal's root for its index types and destage writing.

use std::collections::BTreeMap;

use futures::stream::StreamExt;
use terrace_io::BytesMut;
use terrace_layout::BLOCK_BYTES;
use terrace_meta::CacheRecord;

use super::format::{Header, Kind, HEADER_BYTES};
use super::{
    coalesce, ranges, updates, write_updates_home, Block, Entry, Held, HomeIo, Journal, Work,
    DESTAGE_PARALLEL,
};
use crate::error::EngineError;

/// Bytes of blocks held only in the log that one destage round reads back
/// at most (a drain or a write-through round goes on in further rounds),
/// and that one read-back of recovery takes at a time.
pub(super) const READ_BACK_ROUND_BYTES: u64 = 64 << 20;
/// Largest read of the log when reading blocks back.
const READ_BACK_RUN_BYTES: u64 = 4 << 20;
/// Reads of the log in flight at once when reading blocks back.
const READ_BACK_PARALLEL: usize = 8;

/// Everything recovery found in a log.
pub(crate) struct Recovered {
    /// Where the newest logged data of each block lies in the log (byte
    /// offset, after invalidations).
    pub blocks: BTreeMap<u64, u64>,
    /// Ranges written straight to the disks whose redundancy may disagree.
    pub dirty: Vec<(u64, u64)>,
}

/// Scan a log from its committed tail: every valid record in order, until
/// the first that is not.
pub(crate) async fn scan<H: HomeIo>(
    log: &H,
    cache: &CacheRecord,
) -> Result<Recovered, EngineError> {
    let mut blocks: BTreeMap<u64, u64> = BTreeMap::new();
    let mut dirty = Vec::new();
    let mut position = cache.checkpoint_hint;
    let mut offset = cache.checkpoint_offset;
    let mut expected_sequence: Option<u64> = None;
    let size = log.size_bytes();
    while offset + HEADER_BYTES <= size {
        let header_block = match log.read(offset, HEADER_BYTES).await {
            Ok(block) => block,
            Err(_) => break,
        };
        let Some(header) = Header::decode(&header_block) else {
            break;
        };
        let in_order = expected_sequence.is_none_or(|s| header.sequence == s);
        if header.epoch != cache.epoch || header.position != position || !in_order {
            break;
        }
        if offset + header.record_bytes > size {
            break;
        }
        let payload_bytes = header.record_bytes - HEADER_BYTES;
        let payload: BytesMut = if payload_bytes > 0 {
            match log.read(offset + HEADER_BYTES, payload_bytes).await {
                Ok(payload) => payload,
                Err(_) => break,
            }
        } else {
            BytesMut::new()
        };
        if crc32c::crc32c(&payload) != header.payload_checksum {
            break;
        }
        drop(payload);
        expected_sequence = Some(header.sequence + 1);
        match header.kind {
            Kind::Writes | Kind::RowImage => {
                let mut at = offset + HEADER_BYTES;
                for [start, length, _] in &header.entries {
                    for i in 0..length / BLOCK_BYTES {
                        blocks.insert(start / BLOCK_BYTES + i, at);
                        at += BLOCK_BYTES;
                    }
                }
                position += header.record_bytes;
                offset += header.record_bytes;
            }
            Kind::Dirty => {
                dirty.extend(
                    header
                        .entries
                        .iter()
                        .map(|[offset, length, _]| (*offset, *length)),
                );
                position += header.record_bytes;
                offset += header.record_bytes;
            }
            Kind::Invalidate => {
                for [first, count, _] in &header.entries {
                    for block in *first..first + count {
                        blocks.remove(&block);
                    }
                }
                position += header.record_bytes;
                offset += header.record_bytes;
            }
            Kind::Wrap => {
                let Some(&[next, _, _]) = header.entries.first() else {
                    break;
                };
                position = next;
                offset = 0;
            }
        }
    }
    Ok(Recovered { blocks, dirty })
}

/// Byte ranges of runs of contiguous blocks.
pub(crate) fn block_runs<T>(blocks: &BTreeMap<u64, T>) -> Vec<(u64, u64)> {
    let keys: Vec<u64> = blocks.keys().copied().collect();
    ranges(&keys)
        .into_iter()
        .map(|(first, count)| (first * BLOCK_BYTES, count * BLOCK_BYTES))
        .collect()
}

/// Write recovered blocks (see [`Recovered::blocks`]) home, read back from
/// `log` a bounded amount at a time and coalesced, then flush.
pub(crate) async fn replay<H: HomeIo>(
    home: &H,
    log: &H,
    blocks: &BTreeMap<u64, u64>,
) -> Result<(), EngineError> {
    let mut from = 0;
    loop {
        let part: Vec<(u64, u64)> = blocks
            .range(from..)
            .take((READ_BACK_ROUND_BYTES / BLOCK_BYTES) as usize)
            .map(|(&block, &at)| (block, at))
            .collect();
        let Some(&(last, _)) = part.last() else {
            break;
        };
        from = last + 1;
        let tagged: Work = read_back(log, &part)
            .await?
            .into_iter()
            .map(|(block, data)| (block, (0, data)))
            .collect();
        let updates = updates(coalesce(&tagged, 1), None);
        write_updates_home(home, &updates, &|| DESTAGE_PARALLEL).await?;
    }
    home.flush_pool_disks().await
}

/// A read-only pool cannot replay: serve the recovered blocks from the log
/// (it is not written while the pool is read-only).
pub(crate) fn load_read_only<H: HomeIo>(journal: &Journal<H>, blocks: BTreeMap<u64, u64>) {
    let mut state = journal.state();
    for (block, at) in blocks {
        state.dirty_bytes += BLOCK_BYTES;
        state.index.insert(
            block,
            Entry {
                reserved: 0,
                committed: Some((0, Held { at, data: None })),
            },
        );
    }
    state.assert_invariants();
}

/// The blocks of `held` that only the log holds, read back from `log`.
pub(super) async fn read_unheld<'a, H: HomeIo>(
    log: &H,
    held: impl Iterator<Item = (u64, &'a Held)>,
) -> Result<BTreeMap<u64, Block>, EngineError> {
    let wanted: Vec<(u64, u64)> = held
        .filter(|(_, held)| held.data.is_none())
        .map(|(block, held)| (block, held.at))
        .collect();
    read_back(log, &wanted).await
}

/// Read blocks back from `log`: `wanted` holds (block, byte offset in the
/// log); neighbouring offsets are read as one, a few reads at a time.
async fn read_back<H: HomeIo>(
    log: &H,
    wanted: &[(u64, u64)],
) -> Result<BTreeMap<u64, Block>, EngineError> {
    if wanted.is_empty() {
        return Ok(BTreeMap::new());
    }
    // By place in the log (in blocks), cut into runs of neighbours.
    let mut places: Vec<(u64, u64)> = wanted
        .iter()
        .map(|&(block, at)| (at / BLOCK_BYTES, block))
        .collect();
    places.sort_unstable();
    let log_blocks: Vec<u64> = places.iter().map(|&(place, _)| place).collect();
    let mut runs: Vec<(u64, Vec<u64>)> = Vec::new();
    let mut rest = &places[..];
    for (_, count) in ranges(&log_blocks) {
        let (run, after) = rest.split_at(count as usize);
        for part in run.chunks((READ_BACK_RUN_BYTES / BLOCK_BYTES) as usize) {
            let blocks = part.iter().map(|&(_, block)| block).collect();
            runs.push((part[0].0 * BLOCK_BYTES, blocks));
        }
        rest = after;
    }
    let mut reads = futures::stream::iter(runs.into_iter().map(|(start, blocks)| async move {
        let length = blocks.len() as u64 * BLOCK_BYTES;
        let data = log.read(start, length).await?.freeze();
        Ok::<_, EngineError>((blocks, data))
    }))
    .buffer_unordered(READ_BACK_PARALLEL);
    let mut read = BTreeMap::new();
    while let Some(result) = reads.next().await {
        let (blocks, buffer) = result?;
        for (i, block) in blocks.into_iter().enumerate() {
            let from = i * BLOCK_BYTES as usize;
            let buffer = buffer.clone();
            read.insert(block, Block { buffer, from });
        }
    }
    Ok(read)
}
