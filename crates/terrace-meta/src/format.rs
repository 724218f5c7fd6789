//! The fixed on-disk structures: the disk label and the metadata slot header.
//!
//! # Disk layout
//!
//! ```text
//! 0          4 KiB                1 MiB            1 MiB + S        1 MiB + 2S → align 1 MiB
//! | label    | (reserved, zero)   | metadata slot 0 | metadata slot 1 | slab 0 | slab 1 | ...
//! ```
//!
//! Two write-intent slots sit in the reserved room, at 64 KiB and 128 KiB
//! ([`IntentRecord`]): the extents a redundant space without a log may
//! have writes in flight to, kept apart from the metadata so that naming
//! one more costs a write of a few KiB, not a commit of all of it.
//!
//! The label is written once, when the disk joins a pool, and names the pool
//! and the disk. Metadata commits alternate between the two slots: commit
//! `g` goes to slot `g mod 2`, so the previous generation stays intact in the
//! other slot while this one is written. A torn slot fails its checksum and
//! import falls back to the other one. Byte tables: `docs/ON_DISK_FORMAT.md`.

use crate::codec::{DecodeError, Reader, Writer};
use crate::ids::{DiskId, PoolId};

/// Label magic: identifies a terrace disk.
pub const LABEL_MAGIC: [u8; 8] = *b"TRRCLABL";
/// Metadata slot magic.
pub const SLOT_MAGIC: [u8; 8] = *b"TRRCMETA";
/// The label's version: bumped on any incompatible change of the label.
pub const FORMAT_VERSION: u32 = 1;
/// The metadata slot's version, written by every commit: bumped on any
/// change of the slot header or payload, or of what import must read
/// beside it. 2: a finished job's moves are kept as two counts. 3: the
/// write intent is also kept in the intent slots ([`IntentRecord`]), which
/// a build that reads only the metadata's list would miss after a crash;
/// the payload is as in 2. 4: a space's export name follows its name.
/// 5: a space names its sums space; jobs keep a cursor and what a scrub
/// found; the error and scrub settings follow the write intent. 6: the
/// pool's default provisioning and its allocation alerts follow them.
pub const SLOT_VERSION: u32 = 6;
/// The oldest slot version this build still reads (its pools import, and
/// their next commit writes the current version).
pub const SLOT_VERSION_OLDEST: u32 = 1;
/// One 4 KiB block: the smallest unit a 4Kn drive writes atomically-ish and
/// the O_DIRECT granularity.
pub const LABEL_BYTES: usize = 4096;
/// Metadata starts at 1 MiB, leaving room after the label for future
/// fixed structures without moving anything.
pub const METADATA_OFFSET: u64 = 1 << 20;
/// Default slot size: 4 MiB holds the extent maps of ~600,000 slabs
/// (150 TiB of 256 MiB slabs across all spaces) with room to spare.
pub const METADATA_SLOT_DEFAULT_BYTES: u64 = 4 << 20;
/// Smallest slot: 64 KiB, for tests and tiny pools.
pub const METADATA_SLOT_MIN_BYTES: u64 = 64 << 10;
/// The data area starts on a 1 MiB boundary: aligned for every drive's
/// erase blocks and stripes underneath us.
pub const DATA_ALIGNMENT: u64 = 1 << 20;
/// Size of the slot header preceding the payload.
pub const SLOT_HEADER_BYTES: usize = 64;
/// Bytes of the label covered by its checksum (the checksum sits last).
const LABEL_CHECKED_BYTES: usize = LABEL_BYTES - 4;
/// Bytes of the pool name kept in the label (informational; the metadata
/// holds the authoritative name).
pub const LABEL_NAME_BYTES: usize = 64;

/// Write-intent slot magic.
pub const INTENT_MAGIC: [u8; 8] = *b"TRRCINTN";
/// The write-intent record's version.
pub const INTENT_VERSION: u32 = 1;
/// Offset of the first write-intent slot, in the reserved room after the
/// label; the second follows it.
pub const INTENT_OFFSET: u64 = 64 << 10;
/// Size of each write-intent slot: room for 5,456 write-intent entries.
pub const INTENT_SLOT_BYTES: u64 = 64 << 10;
/// Size of the write-intent record's header.
pub const INTENT_HEADER_BYTES: usize = 64;
/// Bytes of one write-intent entry: a space id and an extent number.
pub const INTENT_ENTRY_BYTES: usize = 12;
/// Bytes of one dirty entry in an intent record: a disk index, a space id
/// and an extent number.
pub const INTENT_DIRTY_BYTES: usize = 14;
/// The extent number of a write-intent entry that stands for every extent
/// of its space.
pub const INTENT_WHOLE_SPACE: u32 = u32::MAX;

const _: () = assert!(METADATA_OFFSET >= LABEL_BYTES as u64);
const _: () = assert!(
    INTENT_OFFSET >= LABEL_BYTES as u64 && INTENT_OFFSET + 2 * INTENT_SLOT_BYTES <= METADATA_OFFSET
);
const _: () = assert!(METADATA_SLOT_MIN_BYTES as usize > SLOT_HEADER_BYTES);
const _: () = assert!(
    METADATA_SLOT_DEFAULT_BYTES.is_multiple_of(4096)
        && METADATA_SLOT_MIN_BYTES.is_multiple_of(4096)
);

/// Offset of the first slab given the slot size.
pub fn data_offset(metadata_slot_bytes: u64) -> u64 {
    (METADATA_OFFSET + 2 * metadata_slot_bytes).next_multiple_of(DATA_ALIGNMENT)
}

/// Offset of metadata slot `slot` (0 or 1).
pub fn slot_offset(metadata_slot_bytes: u64, slot: u64) -> u64 {
    assert!(slot < 2);
    METADATA_OFFSET + slot * metadata_slot_bytes
}

/// Offset of write-intent slot `slot` (0 or 1).
pub fn intent_offset(slot: u64) -> u64 {
    assert!(slot < 2);
    INTENT_OFFSET + slot * INTENT_SLOT_BYTES
}

/// The identity block at the start of every pool disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub pool_id: PoolId,
    pub disk_id: DiskId,
    pub created_ns: u64,
    pub device_bytes: u64,
    pub metadata_slot_bytes: u64,
    pub data_offset: u64,
    pub slab_bytes: u64,
    pub pool_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("no terrace label")]
    Blank,
    #[error("damaged label: checksum {found:08x}, expected {expected:08x}")]
    BadChecksum { found: u32, expected: u32 },
    #[error("label format version {version} is not supported (this build reads {FORMAT_VERSION})")]
    UnknownVersion { version: u32 },
    #[error("damaged label: {source}")]
    Malformed {
        #[source]
        source: DecodeError,
    },
    #[error("damaged label: {field} is {value}, which cannot be")]
    Inconsistent { field: &'static str, value: u64 },
}

impl Label {
    pub fn encode(&self) -> [u8; LABEL_BYTES] {
        let mut writer = Writer::default();
        writer.raw(&LABEL_MAGIC);
        writer.u32(FORMAT_VERSION);
        writer.u32(LABEL_BYTES as u32);
        writer.raw(&self.pool_id.0);
        writer.raw(&self.disk_id.0);
        writer.u64(self.created_ns);
        writer.u64(self.device_bytes);
        writer.u64(METADATA_OFFSET);
        writer.u64(self.metadata_slot_bytes);
        writer.u64(self.data_offset);
        writer.u64(self.slab_bytes);
        let mut name = [0u8; LABEL_NAME_BYTES];
        let name_bytes = truncated_utf8(&self.pool_name, LABEL_NAME_BYTES);
        name[..name_bytes.len()].copy_from_slice(name_bytes);
        writer.raw(&name);
        let mut block = [0u8; LABEL_BYTES];
        let bytes = writer.into_bytes();
        block[..bytes.len()].copy_from_slice(&bytes);
        let checksum = crc32c::crc32c(&block[..LABEL_CHECKED_BYTES]);
        block[LABEL_CHECKED_BYTES..].copy_from_slice(&checksum.to_le_bytes());
        block
    }

    /// Decode a label block. A block without the magic is `Blank` (not ours);
    /// with the magic but anything wrong, it is damaged and must be left alone.
    pub fn decode(block: &[u8]) -> Result<Label, LabelError> {
        if block.len() < LABEL_BYTES || block[..8] != LABEL_MAGIC {
            return Err(LabelError::Blank);
        }
        let stored = u32::from_le_bytes(
            block[LABEL_CHECKED_BYTES..LABEL_BYTES]
                .try_into()
                .unwrap_or_default(),
        );
        let computed = crc32c::crc32c(&block[..LABEL_CHECKED_BYTES]);
        if stored != computed {
            return Err(LabelError::BadChecksum {
                found: stored,
                expected: computed,
            });
        }
        let malformed = |source| LabelError::Malformed { source };
        let mut reader = Reader::new(&block[8..LABEL_CHECKED_BYTES]);
        let version = reader.u32("label version").map_err(malformed)?;
        if version != FORMAT_VERSION {
            return Err(LabelError::UnknownVersion { version });
        }
        let label_bytes = reader.u32("label bytes").map_err(malformed)?;
        check(
            label_bytes as u64 == LABEL_BYTES as u64,
            "label size",
            label_bytes.into(),
        )?;
        let label = Label {
            pool_id: PoolId(reader.array("pool id").map_err(malformed)?),
            disk_id: DiskId(reader.array("disk id").map_err(malformed)?),
            created_ns: reader.u64("created").map_err(malformed)?,
            device_bytes: reader.u64("device bytes").map_err(malformed)?,
            metadata_slot_bytes: {
                let offset = reader.u64("metadata offset").map_err(malformed)?;
                check(offset == METADATA_OFFSET, "metadata offset", offset)?;
                reader.u64("metadata slot bytes").map_err(malformed)?
            },
            data_offset: reader.u64("data offset").map_err(malformed)?,
            slab_bytes: reader.u64("slab bytes").map_err(malformed)?,
            pool_name: {
                let raw = reader
                    .take("pool name", LABEL_NAME_BYTES)
                    .map_err(malformed)?;
                let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                String::from_utf8_lossy(&raw[..end]).into_owned()
            },
        };
        label.validate()?;
        Ok(label)
    }

    fn validate(&self) -> Result<(), LabelError> {
        let slot = self.metadata_slot_bytes;
        check(
            slot >= METADATA_SLOT_MIN_BYTES && slot.is_multiple_of(4096) && slot <= 1 << 36,
            "metadata slot size",
            slot,
        )?;
        check(
            self.data_offset == data_offset(slot),
            "data offset",
            self.data_offset,
        )?;
        check(
            self.slab_bytes.is_power_of_two() && self.slab_bytes >= 4096,
            "slab size",
            self.slab_bytes,
        )?;
        check(
            self.device_bytes >= self.data_offset,
            "device size",
            self.device_bytes,
        )
    }
}

fn check(condition: bool, field: &'static str, value: u64) -> Result<(), LabelError> {
    if condition {
        Ok(())
    } else {
        Err(LabelError::Inconsistent { field, value })
    }
}

fn truncated_utf8(text: &str, limit: usize) -> &[u8] {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text.as_bytes()[..end]
}

/// The header in front of a metadata payload in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotHeader {
    /// The slot format the payload was written under.
    pub version: u32,
    pub pool_id: PoolId,
    pub generation: u64,
    pub payload_bytes: u64,
    pub payload_checksum: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("empty slot")]
    Empty,
    #[error("slot unreadable: {source}")]
    Unreadable {
        #[source]
        source: terrace_io::IoError,
    },
    #[error("slot header checksum mismatch (torn or damaged write)")]
    HeaderChecksum,
    #[error("slot format version {version} is not supported")]
    UnknownVersion { version: u32 },
    #[error("slot payload of {payload_bytes} bytes does not fit a slot of {slot_bytes}")]
    Oversized { payload_bytes: u64, slot_bytes: u64 },
    #[error("slot payload checksum mismatch (torn or damaged write)")]
    PayloadChecksum,
    #[error("slot belongs to pool {found}, the label says {expected}")]
    WrongPool { found: PoolId, expected: PoolId },
    #[error("slot says generation {header}, its payload says {payload}")]
    GenerationMismatch { header: u64, payload: u64 },
    #[error("slot payload is malformed: {source}")]
    Payload {
        #[source]
        source: DecodeError,
    },
}

impl SlotHeader {
    pub fn encode(&self) -> [u8; SLOT_HEADER_BYTES] {
        let mut writer = Writer::default();
        writer.raw(&SLOT_MAGIC);
        writer.u32(self.version);
        writer.u32(SLOT_HEADER_BYTES as u32);
        writer.raw(&self.pool_id.0);
        writer.u64(self.generation);
        writer.u64(self.payload_bytes);
        writer.u32(self.payload_checksum);
        let bytes = writer.into_bytes();
        let mut block = [0u8; SLOT_HEADER_BYTES];
        block[..bytes.len()].copy_from_slice(&bytes);
        let checksum = crc32c::crc32c(&block[..52]);
        block[52..56].copy_from_slice(&checksum.to_le_bytes());
        block
    }

    pub fn decode(block: &[u8], slot_bytes: u64) -> Result<SlotHeader, SlotError> {
        let field =
            checked_header(block, &SLOT_MAGIC, SLOT_HEADER_BYTES, 52).map_err(
                |fault| match fault {
                    HeaderFault::Empty => SlotError::Empty,
                    HeaderFault::Checksum => SlotError::HeaderChecksum,
                },
            )?;
        let version = field(8..12) as u32;
        if !(SLOT_VERSION_OLDEST..=SLOT_VERSION).contains(&version)
            || field(12..16) != SLOT_HEADER_BYTES as u64
        {
            return Err(SlotError::UnknownVersion { version });
        }
        let mut pool_id = [0u8; 16];
        pool_id.copy_from_slice(&block[16..32]);
        let header = SlotHeader {
            version,
            pool_id: PoolId(pool_id),
            generation: field(32..40),
            payload_bytes: field(40..48),
            payload_checksum: field(48..52) as u32,
        };
        if header.payload_bytes > slot_bytes - SLOT_HEADER_BYTES as u64 {
            return Err(SlotError::Oversized {
                payload_bytes: header.payload_bytes,
                slot_bytes,
            });
        }
        Ok(header)
    }
}

/// Why a fixed header could not be read.
enum HeaderFault {
    /// Too short, or without the magic.
    Empty,
    /// The checksum does not match (a torn or damaged write).
    Checksum,
}

/// Check the fixed header at the start of `block`: `magic` first, and at
/// `checksum_at` the CRC32C of the bytes before it. Gives a reader of its
/// little-endian fields (a range of up to 8 bytes).
fn checked_header<'a>(
    block: &'a [u8],
    magic: &[u8; 8],
    header_bytes: usize,
    checksum_at: usize,
) -> Result<impl Fn(std::ops::Range<usize>) -> u64 + 'a, HeaderFault> {
    if block.len() < header_bytes || block[..8] != *magic {
        return Err(HeaderFault::Empty);
    }
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&block[checksum_at..checksum_at + 4]);
    if crc32c::crc32c(&block[..checksum_at]) != u32::from_le_bytes(stored) {
        return Err(HeaderFault::Checksum);
    }
    Ok(move |range: std::ops::Range<usize>| {
        let mut bytes = [0u8; 8];
        bytes[..range.len()].copy_from_slice(&block[range]);
        u64::from_le_bytes(bytes)
    })
}

/// What the intent slots keep: the write intent (the extents of redundant
/// spaces without a working log that may have writes in flight) and the
/// dirty records noted since the last metadata commit (extents written
/// while a disk was missing), as of `sequence`. Both must be durable before
/// the writes they name begin, and the slots take them in a write of a few
/// KiB where a metadata commit writes all of the metadata.
///
/// Record `sequence` is written to slot `sequence mod 2` of every member
/// disk, so a torn write leaves the record before it whole in the other
/// slot. Import takes each disk's newest whole record:
/// - its write intent is resynced beside the metadata's own list. Every
///   member disk holds the last record completed, or one newer that the
///   power cut short (which names nothing in flight that the completed one
///   lacks: an extent is dropped only once its writes are flushed), so the
///   union holds every extent in flight; older records (a disk that was
///   away) only add extents resynced needlessly;
/// - its dirty records are added to the metadata's if the record was
///   written under the generation imported (or a later one): a metadata
///   commit after the record carried them already, and may since have
///   dropped them (the disk caught up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentRecord {
    pub pool_id: PoolId,
    pub sequence: u64,
    /// The metadata generation in force when the record was written.
    pub generation: u64,
    pub extents: Vec<(crate::ids::SpaceId, u32)>,
    /// (disk, space, extent): extents written while the disk was missing,
    /// noted since the metadata of `generation` was committed.
    pub dirty: Vec<(crate::ids::DiskIndex, crate::ids::SpaceId, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntentError {
    #[error("empty write-intent slot")]
    Empty,
    #[error("write-intent header checksum mismatch (torn or damaged write)")]
    HeaderChecksum,
    #[error("write-intent format version {version} is not supported")]
    UnknownVersion { version: u32 },
    #[error(
        "write intent of {bytes} bytes of entries does not fit the {} a slot holds",
        IntentRecord::ENTRY_ROOM
    )]
    Oversized { bytes: u64 },
    #[error("write-intent record cut short: its counts need {bytes} bytes of entries")]
    Truncated { bytes: u64 },
    #[error("write-intent entries checksum mismatch (torn or damaged write)")]
    PayloadChecksum,
}

impl IntentRecord {
    /// Bytes of entries a slot holds: 5,456 write-intent entries, or
    /// 4,676 dirty ones, or a mix.
    pub const ENTRY_ROOM: usize = INTENT_SLOT_BYTES as usize - INTENT_HEADER_BYTES;

    /// Bytes of the record's entries.
    pub fn entry_bytes(&self) -> usize {
        self.extents.len() * INTENT_ENTRY_BYTES + self.dirty.len() * INTENT_DIRTY_BYTES
    }

    /// The record's bytes, zero-padded to a multiple of 4 KiB. Fails if it
    /// does not fit a slot.
    pub fn encode(&self) -> Result<Vec<u8>, IntentError> {
        if self.entry_bytes() > Self::ENTRY_ROOM {
            return Err(IntentError::Oversized {
                bytes: self.entry_bytes() as u64,
            });
        }
        let mut entries = Writer::default();
        for (space, extent) in &self.extents {
            entries.u64(space.0);
            entries.u32(*extent);
        }
        for (disk, space, extent) in &self.dirty {
            entries.u16(disk.0);
            entries.u64(space.0);
            entries.u32(*extent);
        }
        let entries = entries.into_bytes();
        let mut header = Writer::default();
        header.raw(&INTENT_MAGIC);
        header.u32(INTENT_VERSION);
        header.u32(INTENT_HEADER_BYTES as u32);
        header.raw(&self.pool_id.0);
        header.u64(self.sequence);
        header.u64(self.generation);
        header.u32(self.extents.len() as u32);
        header.u32(self.dirty.len() as u32);
        header.u32(crc32c::crc32c(&entries));
        let header = header.into_bytes();
        let total = INTENT_HEADER_BYTES + entries.len();
        // Whole 4 KiB blocks, as every structure here is written.
        let mut block = vec![0u8; total.next_multiple_of(LABEL_BYTES)];
        block[..header.len()].copy_from_slice(&header);
        let checksum = crc32c::crc32c(&block[..60]);
        block[60..64].copy_from_slice(&checksum.to_le_bytes());
        block[INTENT_HEADER_BYTES..total].copy_from_slice(&entries);
        Ok(block)
    }

    /// Decode a record from the start of `slot` (a whole slot's bytes, or
    /// at least the record's).
    pub fn decode(slot: &[u8]) -> Result<IntentRecord, IntentError> {
        let field =
            checked_header(slot, &INTENT_MAGIC, INTENT_HEADER_BYTES, 60).map_err(|fault| {
                match fault {
                    HeaderFault::Empty => IntentError::Empty,
                    HeaderFault::Checksum => IntentError::HeaderChecksum,
                }
            })?;
        let version = field(8..12) as u32;
        if version != INTENT_VERSION || field(12..16) != INTENT_HEADER_BYTES as u64 {
            return Err(IntentError::UnknownVersion { version });
        }
        let (intents, dirty) = (field(48..52), field(52..56));
        let bytes = intents * INTENT_ENTRY_BYTES as u64 + dirty * INTENT_DIRTY_BYTES as u64;
        if bytes > Self::ENTRY_ROOM as u64 {
            return Err(IntentError::Oversized { bytes });
        }
        let end = INTENT_HEADER_BYTES + bytes as usize;
        let Some(entries) = slot.get(INTENT_HEADER_BYTES..end) else {
            return Err(IntentError::Truncated { bytes });
        };
        if crc32c::crc32c(entries) != field(56..60) as u32 {
            return Err(IntentError::PayloadChecksum);
        }
        let mut pool_id = [0u8; 16];
        pool_id.copy_from_slice(&slot[16..32]);
        let mut reader = Reader::new(entries);
        let mut extents = Vec::with_capacity(intents as usize);
        let mut noted = Vec::with_capacity(dirty as usize);
        // The counts were checked against the entries' length above.
        let malformed = |_| IntentError::Truncated { bytes };
        for _ in 0..intents {
            let space = crate::ids::SpaceId(reader.u64("space").map_err(malformed)?);
            extents.push((space, reader.u32("extent").map_err(malformed)?));
        }
        for _ in 0..dirty {
            let disk = crate::ids::DiskIndex(reader.u16("disk").map_err(malformed)?);
            let space = crate::ids::SpaceId(reader.u64("space").map_err(malformed)?);
            noted.push((disk, space, reader.u32("extent").map_err(malformed)?));
        }
        Ok(IntentRecord {
            pool_id: PoolId(pool_id),
            sequence: field(32..40),
            generation: field(40..48),
            extents,
            dirty: noted,
        })
    }
}
