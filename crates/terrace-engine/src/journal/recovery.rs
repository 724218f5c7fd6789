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
//! The log keeps no block sums of its own, and a log disk can return wrong
//! data without an error (a lost or misdirected write, a flipped bit): a
//! record whose copy read first fails its checksums is read again from
//! each copy of the log on its own, and only a record no copy holds whole
//! ends the scan. Each logged block's sum (`block_sum`, as the space's) is
//! kept with its place in the log, from the record's bytes when it was
//! written or found by the scan, and a block read back must match it
//! (every copy tried): a damaged copy is never written home as the data.
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
    /// offset, after invalidations), and the block's sum.
    pub blocks: BTreeMap<u64, (u64, u64)>,
    /// Ranges written straight to the disks whose redundancy may disagree.
    pub dirty: Vec<(u64, u64)>,
}

/// Scan a log from its committed tail: every valid record in order, until
/// the first that is not.
pub(crate) async fn scan<H: HomeIo>(
    log: &H,
    cache: &CacheRecord,
) -> Result<Recovered, EngineError> {
    let mut blocks: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut dirty = Vec::new();
    let mut position = cache.checkpoint_hint;
    let mut offset = cache.checkpoint_offset;
    let mut expected_sequence: Option<u64> = None;
    let size = log.size_bytes();
    while offset + HEADER_BYTES <= size {
        let accept = |header: &Header| {
            header.epoch == cache.epoch
                && header.position == position
                && expected_sequence.is_none_or(|s| header.sequence == s)
                && header.record_bytes >= HEADER_BYTES
                && offset + header.record_bytes <= size
        };
        let Some((header, payload)) = read_record(log, offset, &accept).await else {
            break;
        };
        expected_sequence = Some(header.sequence + 1);
        match header.kind {
            Kind::Writes | Kind::RowImage => {
                let mut at = offset + HEADER_BYTES;
                let mut from = 0;
                for [start, length, _] in &header.entries {
                    for i in 0..length / BLOCK_BYTES {
                        let block = start / BLOCK_BYTES + i;
                        let bytes = &payload[from..from + BLOCK_BYTES as usize];
                        let sum = terrace_meta::sums::block_sum(bytes, block);
                        blocks.insert(block, (at, sum));
                        at += BLOCK_BYTES;
                        from += BLOCK_BYTES as usize;
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

/// The record at `offset` of `log` that `accept` takes, with its payload,
/// if one copy of the log holds it whole: first as a plain read gives it,
/// then each copy on its own (see the module's comment).
async fn read_record<H: HomeIo>(
    log: &H,
    offset: u64,
    accept: &(dyn Fn(&Header) -> bool + Sync),
) -> Option<(Header, BytesMut)> {
    let whole = |header: &Header, payload: &BytesMut| {
        payload.len() as u64 == header.record_bytes - HEADER_BYTES
            && crc32c::crc32c(payload) == header.payload_checksum
    };
    if let Some(header) = log
        .read(offset, HEADER_BYTES)
        .await
        .ok()
        .and_then(|block| Header::decode(&block))
        .filter(|header| accept(header))
    {
        if let Some(payload) = read_payload(log, offset, &header).await {
            if whole(&header, &payload) {
                return Some((header, payload));
            }
        }
    }
    let headers = log.read_copies(offset, HEADER_BYTES).await;
    for block in headers.into_iter().flatten() {
        let Some(header) = Header::decode(&block).filter(|header| accept(header)) else {
            continue;
        };
        let payload_bytes = header.record_bytes - HEADER_BYTES;
        let payloads = match payload_bytes {
            0 => vec![Ok(BytesMut::new())],
            _ => log.read_copies(offset + HEADER_BYTES, payload_bytes).await,
        };
        if let Some(payload) = payloads
            .into_iter()
            .flatten()
            .find(|payload| whole(&header, payload))
        {
            return Some((header, payload));
        }
    }
    None
}

/// The payload of the record `header` at `offset`, as a plain read gives it.
async fn read_payload<H: HomeIo>(log: &H, offset: u64, header: &Header) -> Option<BytesMut> {
    match header.record_bytes - HEADER_BYTES {
        0 => Some(BytesMut::new()),
        bytes => log.read(offset + HEADER_BYTES, bytes).await.ok(),
    }
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
    blocks: &BTreeMap<u64, (u64, u64)>,
) -> Result<(), EngineError> {
    let mut from = 0;
    loop {
        let part: Vec<(u64, u64, u64)> = blocks
            .range(from..)
            .take((READ_BACK_ROUND_BYTES / BLOCK_BYTES) as usize)
            .map(|(&block, &(at, sum))| (block, at, sum))
            .collect();
        let Some(&(last, _, _)) = part.last() else {
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
pub(crate) fn load_read_only<H: HomeIo>(journal: &Journal<H>, blocks: BTreeMap<u64, (u64, u64)>) {
    let mut state = journal.state();
    for (block, (at, sum)) in blocks {
        state.dirty_bytes += BLOCK_BYTES;
        state.index.insert(
            block,
            Entry {
                reserved: 0,
                committed: Some((
                    0,
                    Held {
                        at,
                        sum,
                        data: None,
                    },
                )),
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
    let wanted: Vec<(u64, u64, u64)> = held
        .filter(|(_, held)| held.data.is_none())
        .map(|(block, held)| (block, held.at, held.sum))
        .collect();
    read_back(log, &wanted).await
}

/// Read blocks back from `log`: `wanted` holds (block, byte offset in the
/// log, sum); neighbouring offsets are read as one, a few reads at a time.
/// A block that fails its sum is read from each copy of the log, and the
/// read fails if none matches.
async fn read_back<H: HomeIo>(
    log: &H,
    wanted: &[(u64, u64, u64)],
) -> Result<BTreeMap<u64, Block>, EngineError> {
    if wanted.is_empty() {
        return Ok(BTreeMap::new());
    }
    let sums: BTreeMap<u64, (u64, u64)> = wanted
        .iter()
        .map(|&(block, at, sum)| (block, (at, sum)))
        .collect();
    // By place in the log (in blocks), cut into runs of neighbours.
    let mut places: Vec<(u64, u64)> = wanted
        .iter()
        .map(|&(block, at, _)| (at / BLOCK_BYTES, block))
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
            let (at, sum) = sums[&block];
            let bytes = &buffer[from..from + BLOCK_BYTES as usize];
            let data = if terrace_meta::sums::block_sum(bytes, block) == sum {
                Block {
                    buffer: buffer.clone(),
                    from,
                }
            } else {
                read_copy_matching(log, block, at, sum).await?
            };
            read.insert(block, data);
        }
    }
    Ok(read)
}

/// Block `block`, logged at `at` with sum `sum`, from the first copy of
/// the log that holds it as logged.
async fn read_copy_matching<H: HomeIo>(
    log: &H,
    block: u64,
    at: u64,
    sum: u64,
) -> Result<Block, EngineError> {
    let copies = log.read_copies(at, BLOCK_BYTES).await;
    copies
        .into_iter()
        .flatten()
        .find(|copy| terrace_meta::sums::block_sum(copy, block) == sum)
        .map(|copy| Block {
            buffer: copy.freeze(),
            from: 0,
        })
        .ok_or_else(|| EngineError::Unavailable {
            space: log.name().to_string(),
            offset: at,
            length: BLOCK_BYTES,
            reason: format!(
                "block {block} logged here fails its checksum on every copy of the log"
            ),
        })
}
