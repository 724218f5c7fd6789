//! The reference model: what each block of a space may contain.
//!
//! Every block is written by one client at a time, so its writes have one
//! order. The model keeps, per block, the contents written since the last
//! point it was known durable:
//!
//! ```text
//! history: [durable baseline] [acked] [acked] [in flight]
//!            ▲ flushed or FUA           ▲ current (what a read must return)
//! ```
//!
//! While the pool runs, a read must return exactly the newest acknowledged
//! content. After a crash, each 512-byte sector may hold any content in the
//! history (a flush or FUA write moves the baseline forward, so flushed data
//! can never be lost). Contents are generated patterns, so a sector names the
//! write it came from.
//!
//! A block is unsettled from a crash until it is first read or written
//! again: its first read may return any content of its history, which
//! becomes its baseline, and no flush counts writes from before it settled
//! (what the disks hold of them is still any of the history). So a check need not read the
//! whole space at each import: reads the clients make later settle blocks,
//! while the pool resynchronises behind them.

use terrace_engine::io::random::{mix, spread};

/// Bytes per block: the space's I/O granularity.
pub const BLOCK_BYTES: u64 = 4096;
/// Crash tearing granularity.
pub const SECTOR_BYTES: usize = 512;
/// A block not read or written since the last crash.
const UNSETTLED: u64 = u64::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Zeroes.
    Zero,
    /// The pattern of write number `tag`.
    Tag(u64),
    /// Exactly these bytes (what a recovery left).
    Bytes(Vec<u8>),
}

/// Whether `TERRACE_SIM_BLOCK` (a block, or `first..last`) names
/// `block`: its writes and reads are printed as the model sees them.
fn trace_block(block: u64) -> bool {
    static TRACED: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let traced = TRACED.get_or_init(|| {
        let asked = std::env::var("TERRACE_SIM_BLOCK").ok()?;
        let (first, last) = asked.split_once("..").unwrap_or((&asked, &asked));
        Some((first.parse().ok()?, last.parse().ok()?))
    });
    traced.is_some_and(|(first, last)| (first..=last).contains(&block))
}

/// Tags (below `max`) whose sector `sector` of `block` starts as `bytes`
/// does, and the offsets in it that differ from the first of them: what a
/// sector read holds, for a failure's message.
fn describe(block: u64, sector: usize, bytes: &[u8], max: u64) -> String {
    let tags: Vec<u64> = (0..max)
        .filter(|&tag| bytes[..8] == word(tag, block, sector).to_le_bytes())
        .collect();
    let differ: Vec<usize> = tags.first().map_or_else(Vec::new, |&tag| {
        let expected = word(tag, block, sector).to_le_bytes();
        (0..bytes.len())
            .filter(|&i| bytes[i] != expected[i % 8])
            .collect()
    });
    format!("starts as tags {tags:?}, differing at {differ:?}")
}

/// The 8-byte word repeated through one sector of a tagged block.
fn word(tag: u64, block: u64, sector: usize) -> u64 {
    let z = spread(tag)
        .wrapping_add(block.rotate_left(20))
        .wrapping_add(sector as u64);
    mix(z) | 1 // never zero, so a tagged sector never looks zeroed
}

impl Content {
    pub fn fill(&self, block: u64, out: &mut [u8]) {
        match self {
            Content::Zero => out.fill(0),
            Content::Bytes(bytes) => out.copy_from_slice(bytes),
            Content::Tag(tag) => {
                for (sector, chunk) in out.chunks_mut(SECTOR_BYTES).enumerate() {
                    let bytes = word(*tag, block, sector).to_le_bytes();
                    for word_bytes in chunk.chunks_mut(8) {
                        word_bytes.copy_from_slice(&bytes);
                    }
                }
            }
        }
    }

    fn sector_matches(&self, block: u64, sector: usize, bytes: &[u8]) -> bool {
        match self {
            Content::Zero => bytes.iter().all(|&b| b == 0),
            Content::Bytes(expected) => expected[sector * SECTOR_BYTES..][..SECTOR_BYTES] == *bytes,
            Content::Tag(tag) => {
                let expected = word(*tag, block, sector).to_le_bytes();
                bytes.chunks(8).all(|chunk| chunk == expected)
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    content: Content,
    /// Acknowledgement sequence number; `None` while in flight.
    acked: Option<u64>,
}

#[derive(Debug)]
pub struct Model {
    blocks: Vec<Vec<Entry>>,
    /// Per block: the first acknowledgement a flush may count on since the
    /// last crash ([`UNSETTLED`] until it is read or written again). What
    /// was written before it is still any of the history on the disks.
    settled_at: Vec<u64>,
    next_ack: u64,
    next_tag: u64,
}

/// A write the model was told about, to be acknowledged later.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub first_block: u64,
    pub blocks: u64,
}

impl Model {
    pub fn new(blocks: u64) -> Model {
        Model {
            blocks: (0..blocks)
                .map(|_| {
                    vec![Entry {
                        content: Content::Zero,
                        acked: Some(0),
                    }]
                })
                .collect(),
            settled_at: vec![0; blocks as usize],
            next_ack: 1,
            next_tag: 1,
        }
    }

    pub fn blocks(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// Record a write about to be issued; returns its bytes.
    pub fn issue_write(&mut self, first_block: u64, blocks: u64, zero: bool) -> (Pending, Vec<u8>) {
        let mut data = vec![0u8; (blocks * BLOCK_BYTES) as usize];
        for (index, block) in (first_block..first_block + blocks).enumerate() {
            let content = if zero {
                Content::Zero
            } else {
                self.next_tag += 1;
                Content::Tag(self.next_tag)
            };
            content.fill(
                block,
                &mut data[index * BLOCK_BYTES as usize..][..BLOCK_BYTES as usize],
            );
            if trace_block(block) {
                eprintln!(
                    "model: block {block} write issued {content:?} (sector 0 word {:x})",
                    u64::from_le_bytes(
                        data[index * BLOCK_BYTES as usize..][..8]
                            .try_into()
                            .expect("8 bytes")
                    )
                );
            }
            self.blocks[block as usize].push(Entry {
                content,
                acked: None,
            });
            let settled_at = &mut self.settled_at[block as usize];
            if *settled_at == UNSETTLED {
                *settled_at = self.next_ack;
            }
        }
        (
            Pending {
                first_block,
                blocks,
            },
            data,
        )
    }

    /// The write completed; with `fua` it is durable too.
    pub fn acknowledge(&mut self, pending: Pending, fua: bool) {
        let sequence = self.next_ack;
        self.next_ack += 1;
        for block in pending.first_block..pending.first_block + pending.blocks {
            let history = &mut self.blocks[block as usize];
            let entry = history
                .iter_mut()
                .rev()
                .find(|e| e.acked.is_none())
                .expect("a pending entry");
            entry.acked = Some(sequence);
            if trace_block(block) {
                eprintln!("model: block {block} acked {:?} fua {fua}", entry.content);
            }
            if fua {
                let keep_from = history.len() - 1;
                history.drain(..keep_from);
            }
        }
    }

    /// The write failed: its blocks may hold their old content, its own
    /// or a mix, until they are next read (as after a crash).
    pub fn failed(&mut self, pending: Pending) {
        let blocks = pending.first_block..pending.first_block + pending.blocks;
        for block in blocks {
            if trace_block(block) {
                eprintln!("model: block {block} write failed");
            }
            self.settled_at[block as usize] = UNSETTLED;
        }
    }

    /// A flush is being issued: everything acknowledged so far is covered.
    pub fn flush_point(&self) -> u64 {
        self.next_ack
    }

    /// A flush issued at `point` completed.
    pub fn flushed(&mut self, point: u64) {
        for (history, &settled_at) in self.blocks.iter_mut().zip(&self.settled_at) {
            if let Some(newest_covered) = history.iter().rposition(|entry| {
                entry
                    .acked
                    .is_some_and(|acked| acked < point && acked >= settled_at)
            }) {
                history.drain(..newest_covered);
            }
        }
    }

    /// What a read of `block` must return while the pool runs.
    pub fn current(&self, block: u64) -> &Content {
        let history = &self.blocks[block as usize];
        &history
            .iter()
            .rev()
            .find(|e| e.acked.is_some())
            .expect("baseline")
            .content
    }

    pub fn check_current(&self, block: u64, bytes: &[u8]) -> Result<(), String> {
        let current = self.current(block);
        for (sector, chunk) in bytes.chunks(SECTOR_BYTES).enumerate() {
            if !current.sector_matches(block, sector, chunk) {
                return Err(format!(
                    "block {block} sector {sector}: read does not match the last acknowledged write {current:?} (it {})",
                    describe(block, sector, chunk, self.next_tag + 1)
                ));
            }
        }
        Ok(())
    }

    /// The power was cut: every block is unsettled.
    pub fn crashed(&mut self) {
        self.settled_at.fill(UNSETTLED);
    }

    /// A read of `block` returned `bytes`: the current content, or, if the
    /// block is unsettled, any of its history (see [`Model::recover`]).
    pub fn observe(&mut self, block: u64, bytes: &[u8]) -> Result<(), String> {
        if trace_block(block) {
            eprintln!(
                "model: block {block} read (settled: {}), sector 0 {}",
                self.settled_at[block as usize] != UNSETTLED,
                describe(block, 0, &bytes[..SECTOR_BYTES], self.next_tag + 1)
            );
        }
        if self.settled_at[block as usize] == UNSETTLED {
            self.recover(block, bytes)
        } else {
            self.check_current(block, bytes)
        }
    }

    /// After a crash: every sector must come from the block's history. The
    /// observed bytes become the new durable baseline.
    pub fn recover(&mut self, block: u64, bytes: &[u8]) -> Result<(), String> {
        let history = &self.blocks[block as usize];
        for (sector, chunk) in bytes.chunks(SECTOR_BYTES).enumerate() {
            if !history
                .iter()
                .any(|e| e.content.sector_matches(block, sector, chunk))
            {
                let contents: Vec<&Content> = history.iter().map(|e| &e.content).collect();
                return Err(format!(
                    "block {block} sector {sector} after a crash holds data never written there since it was last durable (history {contents:?}; it {})",
                    describe(block, sector, chunk, self.next_tag + 1)
                ));
            }
        }
        self.blocks[block as usize] = vec![Entry {
            content: Content::Bytes(bytes.to_vec()),
            acked: Some(0),
        }];
        self.settled_at[block as usize] = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushed_data_is_the_floor_and_unflushed_may_vanish() {
        let mut model = Model::new(2);
        let (first, data_one) = model.issue_write(0, 1, false);
        model.acknowledge(first, false);
        let point = model.flush_point();
        let (second, data_two) = model.issue_write(0, 1, false);
        model.flushed(point);
        model.acknowledge(second, false);
        assert!(model.check_current(0, &data_two).is_ok());
        assert!(model.check_current(0, &data_one).is_err());
        // After a crash either is fine, zeroes (pre-flush) are not.
        let mut crashed = Model::new(1);
        std::mem::swap(&mut crashed.blocks[0], &mut model.blocks[0]);
        assert!(crashed.recover(0, &data_one).is_ok());
        let mut torn = data_two.clone();
        torn[..512].copy_from_slice(&data_one[..512]);
        let mut again = Model::new(1);
        let (w1, _) = again.issue_write(0, 1, false);
        again.acknowledge(w1, false);
        assert!(
            again.recover(0, &vec![0u8; 4096]).is_ok(),
            "unflushed write may vanish"
        );
        let mut fua = Model::new(1);
        let (w, data) = fua.issue_write(0, 1, false);
        fua.acknowledge(w, true);
        assert!(
            fua.recover(0, &vec![0u8; 4096]).is_err(),
            "FUA data must survive"
        );
        assert!(fua.recover(0, &data).is_ok());
    }

    #[test]
    fn an_unsettled_block_keeps_its_history_until_read_or_written() {
        let mut model = Model::new(2);
        let (first, one) = model.issue_write(0, 2, false);
        model.acknowledge(first, false);
        model.crashed();
        // A flush after the crash covers nothing of what the crash left.
        let point = model.flush_point();
        model.flushed(point);
        assert!(model.observe(0, &vec![0u8; 4096]).is_ok(), "never durable");
        assert!(model.observe(0, &one[..4096]).is_err(), "settled as read");
        // Written after the crash: the write is what reads return.
        let (second, two) = model.issue_write(1, 1, false);
        model.acknowledge(second, false);
        assert!(model.observe(1, &one[4096..]).is_err());
        assert!(model.observe(1, &two).is_ok());
        // A flush issued before that write settled the block makes nothing
        // of it durable: after a crash the block may still be any of it.
        let mut late = Model::new(1);
        let (first, _) = late.issue_write(0, 1, false);
        late.acknowledge(first, false);
        late.crashed();
        let point = late.flush_point();
        let (second, _) = late.issue_write(0, 1, false);
        late.acknowledge(second, false);
        late.flushed(point);
        late.crashed();
        assert!(late.observe(0, &vec![0u8; 4096]).is_ok());
    }
}
