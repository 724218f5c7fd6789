//! Block checksums ("sums"): one 64-bit checksum for every 4 KiB block of
//! a space's data, kept in pages apart from the data they cover.
//!
//! A block's sum is xxh3-64 of its bytes seeded with the block's index in
//! the space ([`block_sum`]), so a block that holds another block's bytes
//! (a write that landed at the wrong offset) does not pass, and 0 means
//! "not known" (a block not written since its space had sums, or whose
//! write a crash may have cut): such a block is not checked. [`ZEROES`]
//! (all bits set) means "every byte zero" (a block of a space created in
//! this run not written since, or one written with zeroes): such a block
//! is checked by its bytes. A sum that comes out 0 is stored as 1, one that
//! comes out [`ZEROES`] as one less.
//!
//! A page ([`SumsPage`], [`SUMS_PAGE_BYTES`]) holds the sums of
//! [`SUMS_PER_PAGE`] consecutive blocks, with a header naming its space,
//! its index and a generation that grows with every write of the page, and
//! a CRC32C of the whole page: a page torn by a power cut, written to the
//! wrong place or left over from a deleted space is refused, and of two
//! copies the newer generation wins. Every byte is in docs/ON_DISK_FORMAT.md.

use thiserror::Error;

use crate::ids::SpaceId;

/// A sums page's magic.
pub const SUMS_MAGIC: [u8; 8] = *b"TRRCSUMS";
/// A sums page's version: bumped on any incompatible change.
pub const SUMS_VERSION: u32 = 1;
/// Bytes of one sums page: one block.
pub const SUMS_PAGE_BYTES: usize = 4096;
/// Where the sums start in a page.
const ENTRIES_AT: usize = 40;
/// Where the page's CRC32C (of every byte before it) is.
const CRC_AT: usize = SUMS_PAGE_BYTES - 4;
/// Sums in one page.
pub const SUMS_PER_PAGE: usize = (CRC_AT - ENTRIES_AT) / 8;
/// A block's sum when it is not known.
pub const UNKNOWN: u64 = 0;
/// A block's sum when every byte of it is zero.
pub const ZEROES: u64 = u64::MAX;

/// Whether `data`, as block `block`, is what `expected` says it holds
/// (any content where the sum is not known).
pub fn block_matches(data: &[u8], block: u64, expected: u64) -> bool {
    match expected {
        UNKNOWN => true,
        ZEROES => data.iter().all(|&byte| byte == 0),
        sum => block_sum(data, block) == sum,
    }
}

/// The sum of the 4 KiB block at index `block` of a space holding `data`:
/// xxh3-64 seeded with the index (`twox-hash`, which picks the CPU's
/// widest vector instructions at run time, AVX2 where there is).
pub fn block_sum(data: &[u8], block: u64) -> u64 {
    match twox_hash::XxHash3_64::oneshot_with_seed(block, data) {
        UNKNOWN => 1,
        ZEROES => ZEROES - 1,
        sum => sum,
    }
}

/// One page of sums: those of blocks `index * SUMS_PER_PAGE ..` of space
/// `space`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SumsPage {
    pub space: SpaceId,
    pub index: u64,
    /// Grows by one with every write of the page (its copies compare by it).
    pub generation: u64,
    pub sums: Box<[u64; SUMS_PER_PAGE]>,
}

/// Why a page read from disk is not taken.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SumsPageError {
    /// Never written: no magic (a new or upgraded space's page).
    #[error("never written")]
    Blank,
    #[error("its checksum does not match (torn or damaged)")]
    Checksum,
    #[error("version {0} is not known")]
    Version(u32),
    /// A whole page of another place: written to the wrong offset, or left
    /// by a space that was deleted.
    #[error("it is page {index} of space {space}")]
    Misplaced { space: u64, index: u64 },
}

impl SumsPage {
    /// A page that knows no sum.
    pub fn unknown(space: SpaceId, index: u64) -> SumsPage {
        SumsPage::filled(space, index, UNKNOWN)
    }

    /// A page whose every sum is `sum` (such as [`ZEROES`]).
    pub fn filled(space: SpaceId, index: u64, sum: u64) -> SumsPage {
        SumsPage {
            space,
            index,
            generation: 0,
            sums: Box::new([sum; SUMS_PER_PAGE]),
        }
    }

    /// The page's bytes on disk.
    pub fn encode(&self) -> Vec<u8> {
        let mut page = vec![0u8; SUMS_PAGE_BYTES];
        page[..8].copy_from_slice(&SUMS_MAGIC);
        page[8..12].copy_from_slice(&SUMS_VERSION.to_le_bytes());
        page[16..24].copy_from_slice(&self.space.0.to_le_bytes());
        page[24..32].copy_from_slice(&self.index.to_le_bytes());
        page[32..40].copy_from_slice(&self.generation.to_le_bytes());
        for (slot, sum) in self.sums.iter().enumerate() {
            let at = ENTRIES_AT + slot * 8;
            page[at..at + 8].copy_from_slice(&sum.to_le_bytes());
        }
        seal(&mut page);
        page
    }

    /// Read page `index` of space `space` from `page`'s bytes.
    pub fn decode(page: &[u8], space: SpaceId, index: u64) -> Result<SumsPage, SumsPageError> {
        if page.len() < SUMS_PAGE_BYTES || page[..8] != SUMS_MAGIC {
            return Err(SumsPageError::Blank);
        }
        let word = |at: usize| u64::from_le_bytes(page[at..at + 8].try_into().expect("8 bytes"));
        if !sealed(page) {
            return Err(SumsPageError::Checksum);
        }
        let version = u32::from_le_bytes(page[8..12].try_into().expect("4 bytes"));
        if version != SUMS_VERSION {
            return Err(SumsPageError::Version(version));
        }
        let (found_space, found_index) = (word(16), word(24));
        if found_space != space.0 || found_index != index {
            return Err(SumsPageError::Misplaced {
                space: found_space,
                index: found_index,
            });
        }
        let mut sums = Box::new([UNKNOWN; SUMS_PER_PAGE]);
        for (slot, sum) in sums.iter_mut().enumerate() {
            *sum = word(ENTRIES_AT + slot * 8);
        }
        Ok(SumsPage {
            space,
            index,
            generation: word(32),
            sums,
        })
    }

    /// The newest of the copies of one page that decode, if any does.
    pub fn newest(
        copies: impl IntoIterator<Item = Result<SumsPage, SumsPageError>>,
    ) -> Option<SumsPage> {
        copies
            .into_iter()
            .filter_map(Result::ok)
            .max_by_key(|page| page.generation)
    }
}

/// The page holding the sum of block `block`, and the sum's place in it.
pub fn page_of(block: u64) -> (u64, usize) {
    (
        block / SUMS_PER_PAGE as u64,
        (block % SUMS_PER_PAGE as u64) as usize,
    )
}

/// Pages of sums a space of `blocks` blocks needs.
pub fn pages_for(blocks: u64) -> u64 {
    blocks.div_ceil(SUMS_PER_PAGE as u64)
}

/// A sums journal page's magic.
pub const JOURNAL_MAGIC: [u8; 8] = *b"TRRCSJNL";
/// Where a journal page's entries start.
const JOURNAL_ENTRIES_AT: usize = 48;
/// Bytes of one journal entry: block, sum, page generation.
const JOURNAL_ENTRY_BYTES: usize = 24;
/// Entries in one journal page.
pub const JOURNAL_PER_PAGE: usize = (CRC_AT - JOURNAL_ENTRIES_AT) / JOURNAL_ENTRY_BYTES;

/// One changed sum in a space's sums journal: block `block` holds content
/// whose sum is `sum`, as of its page's generation `generation` (the
/// generation the page had on disk when the change was journaled). At an
/// import an entry is laid over its page only if the page read has no
/// newer generation: a page written after the entry already holds it, or
/// something newer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalEntry {
    pub block: u64,
    pub sum: u64,
    pub generation: u64,
}

/// One page of a space's sums journal: the sums changed since the pages
/// were last written whole, appended in order (`position` within the
/// journal) within one `epoch` (a new epoch begins at position 0 each
/// time every page has been written back and flushed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalPage {
    pub space: SpaceId,
    pub epoch: u64,
    pub position: u64,
    pub entries: Vec<JournalEntry>,
}

impl JournalPage {
    /// The page's bytes on disk; at most [`JOURNAL_PER_PAGE`] entries.
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.entries.len() <= JOURNAL_PER_PAGE);
        let mut page = vec![0u8; SUMS_PAGE_BYTES];
        page[..8].copy_from_slice(&JOURNAL_MAGIC);
        page[8..12].copy_from_slice(&SUMS_VERSION.to_le_bytes());
        page[12..16].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        page[16..24].copy_from_slice(&self.space.0.to_le_bytes());
        page[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        page[32..40].copy_from_slice(&self.position.to_le_bytes());
        for (i, entry) in self.entries.iter().enumerate() {
            let at = JOURNAL_ENTRIES_AT + i * JOURNAL_ENTRY_BYTES;
            page[at..at + 8].copy_from_slice(&entry.block.to_le_bytes());
            page[at + 8..at + 16].copy_from_slice(&entry.sum.to_le_bytes());
            page[at + 16..at + 24].copy_from_slice(&entry.generation.to_le_bytes());
        }
        seal(&mut page);
        page
    }

    /// Read journal page `position` of space `space`; `None` if it is not
    /// one whole (blank, torn, another space's or another place's).
    pub fn decode(page: &[u8], space: SpaceId, position: u64) -> Option<JournalPage> {
        if page.len() < SUMS_PAGE_BYTES || page[..8] != JOURNAL_MAGIC {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(page[at..at + 8].try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(page[8..12].try_into().expect("4 bytes"));
        let count = u32::from_le_bytes(page[12..16].try_into().expect("4 bytes")) as usize;
        if !sealed(page)
            || version != SUMS_VERSION
            || count > JOURNAL_PER_PAGE
            || word(16) != space.0
            || word(32) != position
        {
            return None;
        }
        let entries = (0..count)
            .map(|i| {
                let at = JOURNAL_ENTRIES_AT + i * JOURNAL_ENTRY_BYTES;
                JournalEntry {
                    block: word(at),
                    sum: word(at + 8),
                    generation: word(at + 16),
                }
            })
            .collect();
        Some(JournalPage {
            space,
            epoch: word(24),
            position,
            entries,
        })
    }
}

/// Stamp a page (sums or journal) with the CRC32C of its bytes before
/// [`CRC_AT`].
fn seal(page: &mut [u8]) {
    let crc = crc32c::crc32c(&page[..CRC_AT]);
    page[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Whether a page's stamp matches its bytes (see [`seal`]).
fn sealed(page: &[u8]) -> bool {
    let stored = u32::from_le_bytes(page[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
    crc32c::crc32c(&page[..CRC_AT]) == stored
}

/// Pages of journal a space of `pages` sums pages keeps its changed sums
/// in: as many, between 8 and 4096 (16 MiB, 688,000 changes). Up to 8 GiB
/// a space's pages all fit the sums cache, so a checkpoint comes when the
/// journal is full, and writes each page once per as many changes as the
/// journal holds.
pub fn journal_pages_for(pages: u64) -> u64 {
    pages.clamp(8, 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A journal page reads back as written; torn, misplaced or another
    /// space's is not taken.
    #[test]
    fn journal_pages_read_back_and_refuse_what_is_not_theirs() {
        let entries: Vec<JournalEntry> = (0..JOURNAL_PER_PAGE as u64)
            .map(|i| JournalEntry {
                block: i * 977,
                sum: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                generation: i % 3,
            })
            .collect();
        let page = JournalPage {
            space: SpaceId(7),
            epoch: 12,
            position: 3,
            entries,
        };
        let bytes = page.encode();
        assert_eq!(bytes.len(), SUMS_PAGE_BYTES);
        assert_eq!(JournalPage::decode(&bytes, SpaceId(7), 3), Some(page));
        assert_eq!(JournalPage::decode(&bytes, SpaceId(8), 3), None);
        assert_eq!(JournalPage::decode(&bytes, SpaceId(7), 4), None);
        let mut torn = bytes.clone();
        torn[2000] ^= 1;
        assert_eq!(JournalPage::decode(&torn, SpaceId(7), 3), None);
        assert_eq!(JournalPage::decode(&[0; 4096], SpaceId(7), 3), None);
        // Nor is it a sums page.
        assert_eq!(
            SumsPage::decode(&bytes, SpaceId(7), 3),
            Err(SumsPageError::Blank)
        );
    }

    /// The sums on disk are xxh3-64 as its reference defines it: the same
    /// as another implementation's (compiled for the baseline CPU), for
    /// blocks and seeds of every kind.
    #[test]
    fn block_sum_is_xxh3_64_seeded_with_the_block_index() {
        let mut random = terrace_io::random::SplitMix64::new(37);
        for case in 0..200u64 {
            let length = [4096, 512, 0, 17, 240, 241, 8192][case as usize % 7];
            let data = random.bytes(length);
            let seed = random.next_u64() >> (case % 64);
            let reference = xxhash_rust::xxh3::xxh3_64_with_seed(&data, seed);
            let ours = twox_hash::XxHash3_64::oneshot_with_seed(seed, &data);
            assert_eq!(ours, reference, "{length} bytes, seed {seed}");
            if reference != UNKNOWN && reference != ZEROES {
                assert_eq!(block_sum(&data, seed), reference);
            }
        }
    }

    fn page() -> SumsPage {
        let mut page = SumsPage::unknown(SpaceId(7), 3);
        page.generation = 9;
        for (slot, sum) in page.sums.iter_mut().enumerate() {
            *sum = block_sum(&[slot as u8; 4096], 3 * SUMS_PER_PAGE as u64 + slot as u64);
        }
        page
    }

    #[test]
    fn a_page_reads_back_as_written_and_fills_one_block() {
        let bytes = page().encode();
        assert_eq!(bytes.len(), SUMS_PAGE_BYTES);
        assert_eq!(SumsPage::decode(&bytes, SpaceId(7), 3), Ok(page()));
        assert_eq!(SUMS_PER_PAGE, 506);
    }

    #[test]
    fn a_blank_torn_or_misplaced_page_is_refused() {
        let bytes = page().encode();
        assert_eq!(
            SumsPage::decode(&[0u8; SUMS_PAGE_BYTES], SpaceId(7), 3),
            Err(SumsPageError::Blank)
        );
        for at in [8, 100, 4000, CRC_AT] {
            let mut torn = bytes.clone();
            torn[at] ^= 0x40;
            assert_eq!(
                SumsPage::decode(&torn, SpaceId(7), 3),
                Err(SumsPageError::Checksum),
                "a flipped bit at {at}"
            );
        }
        assert_eq!(
            SumsPage::decode(&bytes, SpaceId(7), 4),
            Err(SumsPageError::Misplaced { space: 7, index: 3 })
        );
        assert_eq!(
            SumsPage::decode(&bytes, SpaceId(8), 3),
            Err(SumsPageError::Misplaced { space: 7, index: 3 })
        );
    }

    #[test]
    fn of_two_copies_the_newer_whole_one_wins() {
        let older = page();
        let mut newer = page();
        newer.generation += 1;
        newer.sums[0] = 42;
        let mut torn = newer.encode();
        torn[50] ^= 1;
        let read = |bytes: &[u8]| SumsPage::decode(bytes, SpaceId(7), 3);
        assert_eq!(
            SumsPage::newest([read(&older.encode()), read(&newer.encode())]),
            Some(newer.clone())
        );
        assert_eq!(
            SumsPage::newest([read(&older.encode()), read(&torn)]),
            Some(older)
        );
        assert_eq!(SumsPage::newest([read(&torn)]), None);
    }

    #[test]
    fn a_block_at_another_index_or_with_other_bytes_has_another_sum() {
        let data = [0xa5u8; 4096];
        let mut other = data;
        other[4095] ^= 1;
        assert_ne!(block_sum(&data, 10), block_sum(&data, 11));
        assert_ne!(block_sum(&data, 10), block_sum(&other, 10));
        assert_ne!(block_sum(&data, 10), UNKNOWN);
        assert_eq!(page_of(505), (0, 505));
        assert_eq!(page_of(506), (1, 0));
        assert_eq!(pages_for(0), 0);
        assert_eq!(pages_for(507), 2);
    }
}
