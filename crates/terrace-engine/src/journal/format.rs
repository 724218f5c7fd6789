//! Log records: a 4 KiB header, then the payload, in the ring of a log space.
//!
//! ```text
//! header (4096 bytes)                                  payload
//! | magic | version | kind | epoch | sequence | position | record bytes |
//! | payload crc | entry count | entries (24 bytes each) ... | header crc |  data ...
//! ```
//!
//! Byte tables: `docs/ON_DISK_FORMAT.md` ("Write-back log"). A record is
//! valid only if its magic, epoch (the log's, so an earlier log on the same
//! slabs never counts), position (where it was found), sequence (one more
//! than the previous record's) and both checksums agree.

use terrace_meta::codec::{Reader, Writer};

pub const RECORD_MAGIC: [u8; 8] = *b"TRRCLOG1";
pub const RECORD_VERSION: u32 = 1;
/// Header size: one block, so payloads start aligned for direct I/O.
pub const HEADER_BYTES: u64 = 4096;
/// Bytes of one entry: three u64 fields.
const ENTRY_BYTES: usize = 24;
/// Fixed header fields before the entries.
const FIXED_BYTES: usize = 64;
/// Entries that fit a header (the last 4 bytes hold its checksum).
pub const ENTRIES_MAX: usize = (HEADER_BYTES as usize - FIXED_BYTES - 4) / ENTRY_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Client writes: entries (space offset, length, 0); payload = the data.
    Writes,
    /// Ranges written straight to the disks since: entries (first block,
    /// block count, 0); no payload. Earlier records' data for them is
    /// stale.
    Invalidate,
    /// A whole row of a degraded parity extent about to be written in
    /// place: entries (space offset, length, 0); payload = the row's data.
    /// Written before the row, replayed (like writes) after a crash.
    RowImage,
    /// Filler to the end of the ring; the next record starts at offset 0.
    Wrap,
    /// A range about to be written straight to the disks (whole rows, or
    /// zeroing): entries (space offset, length, 0); no payload. Recovery
    /// resynchronises these ranges' redundancy, which a power cut during
    /// the write may have left disagreeing.
    Dirty,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Writes => 1,
            Kind::Invalidate => 2,
            Kind::RowImage => 3,
            Kind::Wrap => 4,
            Kind::Dirty => 5,
        }
    }

    fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::Writes),
            2 => Some(Kind::Invalidate),
            3 => Some(Kind::RowImage),
            4 => Some(Kind::Wrap),
            5 => Some(Kind::Dirty),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub epoch: u64,
    pub sequence: u64,
    /// Absolute ring position of the header.
    pub position: u64,
    /// Header plus payload, a multiple of 4096.
    pub record_bytes: u64,
    pub payload_checksum: u32,
    pub entries: Vec<[u64; 3]>,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.entries.len() <= ENTRIES_MAX);
        let mut writer = Writer::default();
        writer.raw(&RECORD_MAGIC);
        writer.u32(RECORD_VERSION);
        writer.u8(self.kind.code());
        writer.raw(&[0; 3]);
        writer.u64(self.epoch);
        writer.u64(self.sequence);
        writer.u64(self.position);
        writer.u64(self.record_bytes);
        writer.u32(self.payload_checksum);
        writer.u32(self.entries.len() as u32);
        writer.raw(&[0; 8]);
        for entry in &self.entries {
            for field in entry {
                writer.u64(*field);
            }
        }
        let mut block = writer.into_bytes();
        block.resize(HEADER_BYTES as usize, 0);
        let checksum = crc32c::crc32c(&block[..HEADER_BYTES as usize - 4]);
        block[HEADER_BYTES as usize - 4..].copy_from_slice(&checksum.to_le_bytes());
        block
    }

    /// Decode a header block; `None` for anything that is not a valid
    /// header (blank, torn, another log's).
    pub fn decode(block: &[u8]) -> Option<Header> {
        if block.len() < HEADER_BYTES as usize || block[..8] != RECORD_MAGIC {
            return None;
        }
        let end = HEADER_BYTES as usize - 4;
        let stored = u32::from_le_bytes(block[end..end + 4].try_into().ok()?);
        if crc32c::crc32c(&block[..end]) != stored {
            return None;
        }
        let mut reader = Reader::new(&block[8..end]);
        if reader.u32("version").ok()? != RECORD_VERSION {
            return None;
        }
        let kind = Kind::from_code(reader.u8("kind").ok()?)?;
        reader.take("reserved", 3).ok()?;
        let epoch = reader.u64("epoch").ok()?;
        let sequence = reader.u64("sequence").ok()?;
        let position = reader.u64("position").ok()?;
        let record_bytes = reader.u64("record bytes").ok()?;
        let payload_checksum = reader.u32("payload checksum").ok()?;
        let count = reader.u32("entries").ok()? as usize;
        reader.take("reserved", 8).ok()?;
        if count > ENTRIES_MAX || record_bytes < HEADER_BYTES || record_bytes % HEADER_BYTES != 0 {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            entries.push([
                reader.u64("a").ok()?,
                reader.u64("b").ok()?,
                reader.u64("c").ok()?,
            ]);
        }
        Some(Header {
            kind,
            epoch,
            sequence,
            position,
            record_bytes,
            payload_checksum,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_reject_damage() {
        let header = Header {
            kind: Kind::RowImage,
            epoch: 7,
            sequence: 42,
            position: 1 << 20,
            record_bytes: 3 * 4096,
            payload_checksum: 0xabcd,
            entries: vec![[1, 2, 3]; 5],
        };
        let block = header.encode();
        assert_eq!(block.len(), 4096);
        assert_eq!(Header::decode(&block), Some(header.clone()));
        for byte in [0, 9, 20, 70, 4000, 4095] {
            let mut damaged = block.clone();
            damaged[byte] ^= 1;
            assert_eq!(Header::decode(&damaged), None, "byte {byte}");
        }
        assert_eq!(Header::decode(&[0u8; 4096]), None);
        let full = Header {
            entries: vec![[0; 3]; ENTRIES_MAX],
            ..header
        };
        assert_eq!(
            Header::decode(&full.encode()).unwrap().entries.len(),
            ENTRIES_MAX
        );
    }
}
