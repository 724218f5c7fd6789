//! Encoding of [`PoolMetadata`] into the payload of a metadata slot.
//!
//! Explicit little-endian, field by field, in the order of the byte tables in
//! `docs/ON_DISK_FORMAT.md`. Decoding trusts nothing: every length is checked
//! against the bytes that remain before anything is allocated, every enum code
//! and every slab reference is validated, and random input yields an error,
//! never a panic (the fuzz target in `fuzz/` holds us to that).

use std::collections::BTreeSet;

use terrace_layout::{Layout, LayoutError};

use crate::ids::{DiskId, DiskIndex, PoolId, SlabIndex, SlabRef, SpaceId};
use crate::model::{
    CacheRecord, DiskRecord, DiskState, ExtentRecord, FaultDomain, Media, PoolMetadata,
    Provisioning, SpaceRecord, SpaceRole, Usage,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "metadata truncated: {field} needs {needed} bytes at offset {offset}, {remaining} remain"
    )]
    Truncated {
        field: &'static str,
        offset: usize,
        needed: usize,
        remaining: usize,
    },
    #[error("metadata field {field} has unknown code {code}")]
    BadCode { field: &'static str, code: u8 },
    #[error("metadata field {field} is not valid UTF-8")]
    BadText { field: &'static str },
    #[error("space {space}: invalid geometry: {source}")]
    BadGeometry {
        space: u64,
        #[source]
        source: LayoutError,
    },
    #[error("space {space}: extents have {found} slabs, the layout needs {expected}")]
    WrongSlotCount {
        space: u64,
        found: usize,
        expected: usize,
    },
    #[error("space {space}: {found} extents for {size_bytes} bytes, the layout needs {expected}")]
    WrongExtentCount {
        space: u64,
        size_bytes: u64,
        found: usize,
        expected: u64,
    },
    #[error("space {space}: size {size_bytes} is not a multiple of 4096")]
    UnalignedSize { space: u64, size_bytes: u64 },
    #[error("space {space}: an extent puts two slabs on disk {disk}")]
    SharedDisk { space: u64, disk: u16 },
    #[error("space {space}: slab {slab} does not exist")]
    SlabOutOfRange { space: u64, slab: SlabRef },
    #[error("slab {slab} is used twice")]
    SlabReused { slab: SlabRef },
    #[error("{count} disks exceed the limit of {limit}")]
    TooManyDisks { count: usize, limit: usize },
    #[error("disk {disk} does not exist")]
    NoSuchDisk { disk: u16 },
    #[error("a job moves a slot that space {space} does not have")]
    BadMove { space: u64 },
    #[error("{trailing} unexpected bytes after the metadata")]
    Trailing { trailing: usize },
    #[error("job {job}: {done} of {total} folded moves done")]
    FoldedMoves { job: u64, done: u32, total: u32 },
}

/// Disks per pool: indices are 16-bit in slab references.
pub const DISKS_MAX: usize = u16::MAX as usize;

#[derive(Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }
    pub fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }
    pub fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }
    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }
    pub fn raw(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
    }
    /// A string as u16 length + UTF-8 bytes; longer strings are cut at a
    /// character boundary (names are validated shorter at the edge).
    pub fn text(&mut self, value: &str) {
        let mut end = value.len().min(usize::from(u16::MAX));
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.raw(&value.as_bytes()[..end]);
    }
}

pub struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, offset: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.offset
    }

    pub fn take(&mut self, field: &'static str, needed: usize) -> Result<&'a [u8], DecodeError> {
        if needed > self.remaining() {
            return Err(DecodeError::Truncated {
                field,
                offset: self.offset,
                needed,
                remaining: self.remaining(),
            });
        }
        let slice = &self.bytes[self.offset..self.offset + needed];
        self.offset += needed;
        Ok(slice)
    }

    pub fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(field, N)?);
        Ok(array)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }
    pub fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    pub fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    pub fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    pub fn text(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let length = usize::from(self.u16(field)?);
        let bytes = self.take(field, length)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::BadText { field })
    }

    /// A count of items each at least `item_bytes` long: refused before any
    /// allocation if the remaining bytes cannot hold that many.
    pub(crate) fn count_of(
        &mut self,
        field: &'static str,
        count: usize,
        item_bytes: usize,
    ) -> Result<usize, DecodeError> {
        self.count(field, count, item_bytes)
    }

    fn count(
        &mut self,
        field: &'static str,
        count: usize,
        item_bytes: usize,
    ) -> Result<usize, DecodeError> {
        let needed = count.saturating_mul(item_bytes);
        if needed > self.remaining() {
            return Err(DecodeError::Truncated {
                field,
                offset: self.offset,
                needed,
                remaining: self.remaining(),
            });
        }
        Ok(count)
    }
}

/// A table from enum values to their one-byte codes, used both ways.
macro_rules! codes {
    ($encode:ident, $decode:ident, $type:ty, $field:literal, { $($variant:path => $code:literal),+ $(,)? }) => {
        fn $encode(value: $type) -> u8 {
            match value { $($variant => $code),+ }
        }
        fn $decode(code: u8) -> Result<$type, DecodeError> {
            match code {
                $($code => Ok($variant),)+
                _ => Err(DecodeError::BadCode { field: $field, code }),
            }
        }
    };
}

codes!(media_code, media_from, Media, "disk media", {
    Media::Hdd => 0, Media::Ssd => 1, Media::Unknown => 2,
});
codes!(usage_code, usage_from, Usage, "disk usage", {
    Usage::Auto => 0, Usage::Manual => 1, Usage::HotSpare => 2, Usage::Journal => 3, Usage::Retired => 4,
});
codes!(state_code, state_from, DiskState, "disk state", {
    DiskState::Active => 0, DiskState::Failed => 1, DiskState::Missing => 2, DiskState::Removed => 3,
});
codes!(provisioning_code, provisioning_from, Provisioning, "space provisioning", {
    Provisioning::Fixed => 0, Provisioning::Thin => 1,
});
codes!(domain_code, domain_from, FaultDomain, "space fault domain", {
    FaultDomain::Disk => 0, FaultDomain::Enclosure => 1, FaultDomain::Node => 2,
});

fn layout_codes(layout: Layout) -> (u8, u8) {
    match layout {
        Layout::Simple => (0, 0),
        Layout::Mirror { copies } => (1, copies as u8),
        Layout::Parity { redundancy } => (2, redundancy as u8),
    }
}

fn layout_from(kind: u8, parameter: u8) -> Result<Layout, DecodeError> {
    match kind {
        0 => Ok(Layout::Simple),
        1 => Ok(Layout::Mirror {
            copies: u32::from(parameter),
        }),
        2 => Ok(Layout::Parity {
            redundancy: u32::from(parameter),
        }),
        _ => Err(DecodeError::BadCode {
            field: "space layout",
            code: kind,
        }),
    }
}

/// Smallest encoded disk record: fixed fields plus four empty strings.
const DISK_RECORD_MIN_BYTES: usize = 16 + 8 + 4 + 3 + 4 * 2;
/// Smallest encoded space record (no extents, empty strings, and no export
/// name, as slot formats before 4 have it).
const SPACE_RECORD_MIN_BYTES: usize = 8 + 2 + 2 + 4 + 8 + 8 + 2 + 8 + 2 + 9 + 40 + 4 + 2;
/// An encoded slab reference: u16 disk index, u32 slab index.
const SLAB_REF_BYTES: usize = 6;

/// A space record's sums field for a space that keeps no sums by choice.
const SUMS_OFF: u64 = u64::MAX;

pub fn encode(metadata: &PoolMetadata) -> Vec<u8> {
    encode_version(metadata, crate::format::SLOT_VERSION)
}

/// Encode as slot format `version` wrote it, 4 or newer (what tests of
/// older formats start from): fields a format lacks are left out.
pub fn encode_version(metadata: &PoolMetadata, version: u32) -> Vec<u8> {
    assert!((4..=crate::format::SLOT_VERSION).contains(&version));
    let mut writer = Writer::default();
    writer.raw(&metadata.pool_id.0);
    writer.u64(metadata.generation);
    writer.u64(metadata.created_ns);
    writer.u64(metadata.committed_ns);
    writer.u64(metadata.slab_bytes);
    writer.u8(u8::from(metadata.clean));
    writer.u64(metadata.next_space_id);
    writer.text(&metadata.name);
    assert!(metadata.disks.len() <= DISKS_MAX);
    writer.u16(metadata.disks.len() as u16);
    for disk in &metadata.disks {
        encode_disk(&mut writer, disk);
    }
    writer.u32(metadata.spaces.len() as u32);
    for space in &metadata.spaces {
        encode_space(&mut writer, space, metadata.slab_bytes, version);
    }
    crate::codec_state::encode(
        &mut writer,
        &metadata.settings,
        metadata.next_job_id,
        &metadata.jobs,
        &metadata.dirty,
        &metadata.intent,
        version,
    );
    writer.into_bytes()
}

fn encode_disk(writer: &mut Writer, disk: &DiskRecord) {
    writer.raw(&disk.id.0);
    writer.u64(disk.size_bytes);
    writer.u32(disk.slab_count);
    writer.u8(media_code(disk.media));
    writer.u8(usage_code(disk.usage));
    writer.u8(state_code(disk.state));
    writer.text(&disk.enclosure);
    writer.text(&disk.node);
    writer.text(&disk.path_hint);
    writer.text(&disk.state_reason);
    writer.u64(disk.missing_since);
}

fn encode_space(writer: &mut Writer, space: &SpaceRecord, slab_bytes: u64, version: u32) {
    writer.u64(space.id.0);
    writer.text(&space.name);
    writer.text(space.export.as_deref().unwrap_or_default());
    let (kind, parameter) = layout_codes(space.layout);
    writer.u8(kind);
    writer.u8(parameter);
    writer.u32(space.columns);
    writer.u64(space.interleave_bytes);
    writer.u64(space.size_bytes);
    writer.u8(provisioning_code(space.provisioning));
    writer.u8(domain_code(space.fault_domain));
    writer.u64(space.created_ns);
    writer.text(&space.columns_reason);
    match space.role {
        SpaceRole::Data => {
            writer.u8(0);
            writer.u64(0);
        }
        SpaceRole::Log { owner } => {
            writer.u8(1);
            writer.u64(owner.0);
        }
        SpaceRole::Sums { owner } => {
            writer.u8(2);
            writer.u64(owner.0);
        }
    }
    let cache = space.cache.unwrap_or(CacheRecord {
        bytes: 0,
        log_space: SpaceId(0),
        epoch: 0,
        checkpoint_hint: 0,
        checkpoint_offset: 0,
    });
    writer.u64(cache.bytes);
    writer.u64(cache.log_space.0);
    writer.u64(cache.epoch);
    writer.u64(cache.checkpoint_hint);
    writer.u64(cache.checkpoint_offset);
    if version >= 5 {
        writer.u64(match (space.checksums, space.sums) {
            (false, _) => SUMS_OFF,
            (true, sums) => sums.map_or(0, |sums| sums.0),
        });
    }
    writer.u32(space.extents.len() as u32);
    let slots = space
        .geometry(slab_bytes)
        .map(|geometry| geometry.slots_per_extent())
        .expect("a space in memory has a valid geometry");
    writer.u16(slots as u16);
    for extent in &space.extents {
        match &extent.slabs {
            None => writer.u8(0),
            Some(slabs) => {
                assert_eq!(slabs.len(), slots as usize);
                writer.u8(1);
                for slab in slabs {
                    writer.u16(slab.disk.0);
                    writer.u32(slab.slab.0);
                }
            }
        }
    }
}

/// Decode a payload of the newest slot version.
pub fn decode(bytes: &[u8]) -> Result<PoolMetadata, DecodeError> {
    decode_version(bytes, crate::format::SLOT_VERSION)
}

/// Decode a payload written under slot format `version` (one this build
/// reads: [`crate::format::SLOT_VERSION_OLDEST`] to
/// [`crate::format::SLOT_VERSION`]).
pub fn decode_version(bytes: &[u8], version: u32) -> Result<PoolMetadata, DecodeError> {
    let mut reader = Reader::new(bytes);
    let pool_id = PoolId(reader.array("pool id")?);
    let generation = reader.u64("generation")?;
    let created_ns = reader.u64("created")?;
    let committed_ns = reader.u64("committed")?;
    let slab_bytes = reader.u64("slab bytes")?;
    let clean = reader.u8("clean")? != 0;
    let next_space_id = reader.u64("next space id")?;
    let name = reader.text("pool name")?;
    let disk_count = reader.u16("disk count")?;
    let disk_count = reader.count("disks", usize::from(disk_count), DISK_RECORD_MIN_BYTES)?;
    let disks = (0..disk_count)
        .map(|_| decode_disk(&mut reader, version))
        .collect::<Result<Vec<_>, _>>()?;
    let space_count = reader.u32("space count")? as usize;
    let space_count = reader.count("spaces", space_count, SPACE_RECORD_MIN_BYTES)?;
    let mut used = BTreeSet::new();
    let mut spaces = Vec::with_capacity(space_count);
    for _ in 0..space_count {
        spaces.push(decode_space(
            &mut reader,
            slab_bytes,
            &disks,
            &mut used,
            version,
        )?);
    }
    let known = crate::codec_state::Known {
        disks: &disks,
        spaces: &spaces,
        slab_bytes,
    };
    let (settings, next_job_id, jobs, dirty, intent) =
        crate::codec_state::decode(&mut reader, &known, &mut used, version)?;
    if reader.remaining() != 0 {
        return Err(DecodeError::Trailing {
            trailing: reader.remaining(),
        });
    }
    Ok(PoolMetadata {
        pool_id,
        name,
        generation,
        created_ns,
        committed_ns,
        slab_bytes,
        clean,
        next_space_id,
        disks,
        spaces,
        settings,
        next_job_id,
        jobs,
        dirty,
        intent,
    })
}

fn decode_disk(reader: &mut Reader, version: u32) -> Result<DiskRecord, DecodeError> {
    Ok(DiskRecord {
        id: DiskId(reader.array("disk id")?),
        size_bytes: reader.u64("disk size")?,
        slab_count: reader.u32("disk slab count")?,
        media: media_from(reader.u8("disk media")?)?,
        usage: usage_from(reader.u8("disk usage")?)?,
        state: state_from(reader.u8("disk state")?)?,
        enclosure: reader.text("disk enclosure")?,
        node: reader.text("disk node")?,
        path_hint: reader.text("disk path")?,
        state_reason: reader.text("disk state reason")?,
        missing_since: if version >= 2 {
            reader.u64("disk missing since")?
        } else {
            0
        },
    })
}

fn decode_space(
    reader: &mut Reader,
    slab_bytes: u64,
    disks: &[DiskRecord],
    used: &mut BTreeSet<SlabRef>,
    version: u32,
) -> Result<SpaceRecord, DecodeError> {
    let id = reader.u64("space id")?;
    let name = reader.text("space name")?;
    // Empty: none (a log space's); slot formats before 4 store none.
    let export = if version >= 4 {
        Some(reader.text("space export name")?).filter(|export| !export.is_empty())
    } else {
        None
    };
    let layout = layout_from(
        reader.u8("space layout")?,
        reader.u8("space layout parameter")?,
    )?;
    let mut space = SpaceRecord {
        id: SpaceId(id),
        name,
        export,
        layout,
        columns: reader.u32("space columns")?,
        interleave_bytes: reader.u64("space interleave")?,
        size_bytes: reader.u64("space size")?,
        provisioning: provisioning_from(reader.u8("space provisioning")?)?,
        fault_domain: domain_from(reader.u8("space fault domain")?)?,
        created_ns: reader.u64("space created")?,
        columns_reason: reader.text("space columns reason")?,
        role: match reader.u8("space role")? {
            0 => {
                reader.u64("space owner")?;
                SpaceRole::Data
            }
            1 => SpaceRole::Log {
                owner: SpaceId(reader.u64("space owner")?),
            },
            2 => SpaceRole::Sums {
                owner: SpaceId(reader.u64("space owner")?),
            },
            code => {
                return Err(DecodeError::BadCode {
                    field: "space role",
                    code,
                })
            }
        },
        cache: {
            let bytes = reader.u64("cache bytes")?;
            let log_space = SpaceId(reader.u64("cache log space")?);
            let epoch = reader.u64("cache epoch")?;
            let checkpoint_hint = reader.u64("cache checkpoint")?;
            let checkpoint_offset = reader.u64("cache checkpoint offset")?;
            (bytes > 0).then_some(CacheRecord {
                bytes,
                log_space,
                epoch,
                checkpoint_hint,
                checkpoint_offset,
            })
        },
        // Slot formats before 5 keep no sums (and get them).
        sums: None,
        checksums: true,
        extents: Vec::new(),
    };
    if version >= 5 {
        match reader.u64("space sums")? {
            SUMS_OFF => space.checksums = false,
            0 => {}
            sums => space.sums = Some(SpaceId(sums)),
        }
    }
    let geometry = space
        .geometry(slab_bytes)
        .map_err(|source| DecodeError::BadGeometry { space: id, source })?;
    let extent_count = reader.u32("extent count")? as usize;
    let slots = usize::from(reader.u16("slots per extent")?);
    if slots != geometry.slots_per_extent() as usize {
        return Err(DecodeError::WrongSlotCount {
            space: id,
            found: slots,
            expected: geometry.slots_per_extent() as usize,
        });
    }
    let extent_count = reader.count("extents", extent_count, 1)?;
    if !space.size_bytes.is_multiple_of(terrace_layout::BLOCK_BYTES) {
        return Err(DecodeError::UnalignedSize {
            space: id,
            size_bytes: space.size_bytes,
        });
    }
    if extent_count as u64 != geometry.extents_for(space.size_bytes) {
        return Err(DecodeError::WrongExtentCount {
            space: id,
            size_bytes: space.size_bytes,
            found: extent_count,
            expected: geometry.extents_for(space.size_bytes),
        });
    }
    space.extents.reserve(extent_count);
    for _ in 0..extent_count {
        let extent = decode_extent(reader, id, slots, disks, used)?;
        space.extents.push(extent);
    }
    Ok(space)
}

fn decode_extent(
    reader: &mut Reader,
    space: u64,
    slots: usize,
    disks: &[DiskRecord],
    used: &mut BTreeSet<SlabRef>,
) -> Result<ExtentRecord, DecodeError> {
    match reader.u8("extent flags")? {
        0 => Ok(ExtentRecord { slabs: None }),
        1 => {
            reader.count("extent slabs", slots, SLAB_REF_BYTES)?;
            let mut slabs = Vec::with_capacity(slots);
            for _ in 0..slots {
                let slab = SlabRef {
                    disk: DiskIndex(reader.u16("slab disk")?),
                    slab: SlabIndex(reader.u32("slab index")?),
                };
                let exists = disks
                    .get(usize::from(slab.disk.0))
                    .is_some_and(|disk| slab.slab.0 < disk.slab_count);
                if !exists {
                    return Err(DecodeError::SlabOutOfRange { space, slab });
                }
                if !used.insert(slab) {
                    return Err(DecodeError::SlabReused { slab });
                }
                if slabs.iter().any(|other: &SlabRef| other.disk == slab.disk) {
                    return Err(DecodeError::SharedDisk {
                        space,
                        disk: slab.disk.0,
                    });
                }
                slabs.push(slab);
            }
            Ok(ExtentRecord { slabs: Some(slabs) })
        }
        code => Err(DecodeError::BadCode {
            field: "extent flags",
            code,
        }),
    }
}
