//! What a disk holds before terrace writes to it: file systems, swap,
//! encrypted volumes, other volume managers, partition tables.
//!
//! `pool create`, `disk add` and `disk replace` would write a label and
//! metadata over whatever a candidate holds; `disk list` says what each
//! holds. The probe reads two regions of a device, its first and its last
//! [`REGION_BYTES`], and looks for the signatures of a table of known
//! formats at the offsets their on-disk formats fix:
//!
//! ```text
//!  0      512    1K    4K        64K+64                  end-1M        end
//!  |LUKS  |GPT   |ext  |md 1.2   |btrfs ... ZFS L0, L1    |ZFS L2, L3   |
//!  |XFS   |LVM   |swap |bcache   |                        |md 0.90, 1.0 |
//!  |FAT, exFAT, NTFS, MBR, md 1.1                         |GPT backup   |
//! ```
//!
//! [`identify`] is pure (bytes in, a [`Signature`] out), so every format is
//! tested on hand-made images as well as on what the real tools write;
//! [`probe_path`] is the one function that reads. Terrace's own label is
//! not in the table: the engine reads it (`scan`) and the daemon asks it
//! first, so a disk of a pool is named by its pool. See
//! `docs/design/probe.md` for why this is a table of our own rather than
//! libblkid.

use std::os::unix::fs::FileExt;

/// How much of each end of a device is read: the farthest signature from
/// its end is ZFS's label L2, 512 KiB before the 256 KiB-aligned end; from
/// its start, ZFS's label L1's uberblocks end at 512 KiB. 1 MiB covers both
/// with room for a device whose size is not aligned.
pub const REGION_BYTES: u64 = 1 << 20;

/// A format found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// What it is, as a noun phrase: "ext4 file system".
    pub kind: String,
    pub label: Option<String>,
    pub uuid: Option<String>,
    /// Byte offset of the signature's magic on the device.
    pub offset_bytes: u64,
    /// The ranges (offset, length) whose zeroing makes it go: its magic
    /// numbers, as `wipefs` erases them.
    pub wipe: Vec<(u64, u64)>,
}

impl std::fmt::Display for Signature {
    /// `an ext4 file system (label "data", UUID 0f3c…, at byte 1080)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Said as letters or with a vowel sound: "an XFS", "an md".
        const AN: [&str; 7] = ["ext", "exFAT", "XFS", "LVM", "MBR", "NTFS", "md "];
        let article = if AN.iter().any(|start| self.kind.starts_with(start)) {
            "an"
        } else {
            "a"
        };
        write!(f, "{article} {} (", self.kind)?;
        if let Some(label) = &self.label {
            write!(f, "label {label:?}, ")?;
        }
        if let Some(uuid) = &self.uuid {
            write!(f, "UUID {uuid}, ")?;
        }
        write!(f, "at byte {})", self.offset_bytes)
    }
}

/// The first and last bytes of a device of `size_bytes`.
pub struct Regions<'a> {
    pub first: &'a [u8],
    pub last: &'a [u8],
    pub size_bytes: u64,
}

impl Regions<'_> {
    /// `length` bytes at `offset` of the device, if one region holds them.
    fn at(&self, offset: u64, length: usize) -> Option<&[u8]> {
        let end = offset.checked_add(length as u64)?;
        if end <= self.first.len() as u64 {
            return self.first.get(offset as usize..end as usize);
        }
        let last_start = self.size_bytes.checked_sub(self.last.len() as u64)?;
        if offset >= last_start && end <= self.size_bytes {
            let from = (offset - last_start) as usize;
            return self.last.get(from..from + length);
        }
        None
    }

    fn has(&self, offset: u64, magic: &[u8]) -> bool {
        self.at(offset, magic.len()) == Some(magic)
    }

    fn u16_le(&self, offset: u64) -> Option<u16> {
        Some(u16::from_le_bytes(self.at(offset, 2)?.try_into().ok()?))
    }

    fn u32_le(&self, offset: u64) -> Option<u32> {
        Some(u32::from_le_bytes(self.at(offset, 4)?.try_into().ok()?))
    }

    fn u64_le(&self, offset: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.at(offset, 8)?.try_into().ok()?))
    }
}

/// What the device holds, if any format of the table is found on it. The
/// formats are tried in an order where a more specific one comes before a
/// more general one that may also match it (a FAT boot sector also ends
/// with the MBR's 0x55AA; LUKS, LVM and md sit below file systems).
pub fn identify(regions: &Regions) -> Option<Signature> {
    const PROBES: &[fn(&Regions) -> Option<Signature>] = &[
        luks, lvm2, md_1x, md_090, bcache, zfs, ext, xfs, btrfs, swap, ntfs, exfat, fat, gpt, mbr,
    ];
    PROBES.iter().find_map(|probe| probe(regions))
}

/// Read the two regions of the file or device at `path` and identify what
/// it holds.
pub fn probe_path(path: &str) -> std::io::Result<Option<Signature>> {
    let file = std::fs::File::open(path)?;
    let size_bytes = device_size(&file)?;
    let head = REGION_BYTES.min(size_bytes);
    let tail = REGION_BYTES.min(size_bytes);
    let mut first = vec![0u8; head as usize];
    file.read_exact_at(&mut first, 0)?;
    let mut last = vec![0u8; tail as usize];
    file.read_exact_at(&mut last, size_bytes - tail)?;
    Ok(identify(&Regions {
        first: &first,
        last: &last,
        size_bytes,
    }))
}

/// A regular file's length or a block device's size (its end, found by
/// seeking there: a block device's metadata says 0).
fn device_size(file: &std::fs::File) -> std::io::Result<u64> {
    use std::io::Seek;
    let mut handle = file;
    let size = handle.seek(std::io::SeekFrom::End(0))?;
    handle.seek(std::io::SeekFrom::Start(0))?;
    Ok(size)
}

/// `kind` found by its magic of `magic_bytes` at `offset_bytes`.
fn found(kind: &str, offset_bytes: u64, magic_bytes: u64) -> Signature {
    Signature {
        kind: kind.to_string(),
        label: None,
        uuid: None,
        offset_bytes,
        wipe: vec![(offset_bytes, magic_bytes)],
    }
}

impl Signature {
    fn label(mut self, label: Option<String>) -> Signature {
        self.label = label.filter(|label| !label.is_empty());
        self
    }

    fn uuid(mut self, uuid: Option<String>) -> Signature {
        self.uuid = uuid.filter(|uuid| !uuid.is_empty());
        self
    }
}

/// Text up to its first NUL, without trailing blanks (FAT pads with them).
fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
        .trim_end()
        .to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A big-endian (RFC 4122 byte order) UUID: 8-4-4-4-12.
fn uuid_text(bytes: &[u8]) -> String {
    let hex = hex(bytes);
    if hex.len() != 32 {
        return hex;
    }
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// A GUID as GPT stores it: the first three fields little-endian.
fn guid_text(bytes: &[u8]) -> String {
    if bytes.len() != 16 {
        return hex(bytes);
    }
    let mut ordered = bytes.to_vec();
    ordered[..4].reverse();
    ordered[4..6].reverse();
    ordered[6..8].reverse();
    uuid_text(&ordered)
}

fn nonzero(bytes: &[u8]) -> Option<&[u8]> {
    bytes.iter().any(|&b| b != 0).then_some(bytes)
}

/// ext2/3/4: the superblock at 1 KiB, magic 0xEF53 at its byte 0x38; the
/// features tell the versions apart as libblkid does (a journal makes
/// ext3; extents, 64-bit or flexible groups, or the newer read-only
/// features, make ext4).
fn ext(r: &Regions) -> Option<Signature> {
    const SUPER: u64 = 1024;
    if r.u16_le(SUPER + 0x38)? != 0xEF53 {
        return None;
    }
    let compat = r.u32_le(SUPER + 0x5C)?;
    let incompat = r.u32_le(SUPER + 0x60)?;
    let ro_compat = r.u32_le(SUPER + 0x64)?;
    const COMPAT_HAS_JOURNAL: u32 = 0x4;
    const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
    const INCOMPAT_EXT4: u32 = 0x40 | 0x80 | 0x200 | 0x400 | 0x10000;
    const RO_COMPAT_EXT4: u32 = 0x8 | 0x10 | 0x20 | 0x40 | 0x400;
    let kind = if incompat & INCOMPAT_JOURNAL_DEV != 0 {
        "ext3/4 external journal"
    } else if incompat & INCOMPAT_EXT4 != 0 || ro_compat & RO_COMPAT_EXT4 != 0 {
        "ext4 file system"
    } else if compat & COMPAT_HAS_JOURNAL != 0 {
        "ext3 file system"
    } else {
        "ext2 file system"
    };
    Some(
        found(kind, SUPER + 0x38, 2)
            .label(r.at(SUPER + 0x78, 16).map(text))
            .uuid(r.at(SUPER + 0x68, 16).and_then(nonzero).map(uuid_text)),
    )
}

/// XFS: "XFSB" at byte 0; UUID at 32, label at 108.
fn xfs(r: &Regions) -> Option<Signature> {
    if !r.has(0, b"XFSB") {
        return None;
    }
    Some(
        found("XFS file system", 0, 4)
            .label(r.at(108, 12).map(text))
            .uuid(r.at(32, 16).map(uuid_text)),
    )
}

/// btrfs: the superblock at 64 KiB, magic "_BHRfS_M" at its byte 64; fsid
/// at 32, label at 0x12B.
fn btrfs(r: &Regions) -> Option<Signature> {
    const SUPER: u64 = 64 << 10;
    if !r.has(SUPER + 64, b"_BHRfS_M") {
        return None;
    }
    Some(
        found("btrfs file system", SUPER + 64, 8)
            .label(r.at(SUPER + 0x12B, 256).map(text))
            .uuid(r.at(SUPER + 32, 16).map(uuid_text)),
    )
}

/// Swap: "SWAPSPACE2" (or the old "SWAP-SPACE") in the last 10 bytes of
/// the first page, whatever the page size; UUID at 1036, label at 1052.
fn swap(r: &Regions) -> Option<Signature> {
    for page in [4096u64, 8192, 16384, 65536] {
        for magic in [&b"SWAPSPACE2"[..], b"SWAP-SPACE"] {
            if r.has(page - 10, magic) {
                return Some(
                    found("swap area", page - 10, 10)
                        .label(r.at(1052, 16).map(text))
                        .uuid(r.at(1036, 16).and_then(nonzero).map(uuid_text)),
                );
            }
        }
    }
    None
}

/// LUKS 1 and 2: "LUKS\xba\xbe" at 0, version (big-endian) at 6, the UUID
/// as text at 168; LUKS2 keeps a label at 24, and a second header
/// ("SKUL\xba\xbe") after its first one's JSON area (16 KiB to 4 MiB).
fn luks(r: &Regions) -> Option<Signature> {
    let secondary = (0..9u64).map(|step| (16u64 << 10) << step);
    let (header, magic) = std::iter::once((0, b"LUKS\xba\xbe"))
        .chain(secondary.map(|offset| (offset, b"SKUL\xba\xbe")))
        .find(|(offset, magic)| r.has(*offset, *magic))?;
    let version = u16::from_be_bytes(r.at(header + 6, 2)?.try_into().ok()?);
    let label = (version == 2)
        .then(|| r.at(header + 24, 48).map(text))
        .flatten();
    Some(
        found(
            &format!("LUKS{version} encrypted volume"),
            header,
            magic.len() as u64,
        )
        .label(label)
        .uuid(r.at(header + 168, 40).map(text)),
    )
}

/// LVM2 physical volume: "LABELONE" at the start of one of the first four
/// sectors, "LVM2 001" 24 bytes after it; the PV header (at the label's
/// byte `offset_xl`) opens with the PV's UUID, 32 characters shown in
/// groups of 6-4-4-4-4-4-6.
fn lvm2(r: &Regions) -> Option<Signature> {
    for sector in 0..4u64 {
        let label = sector * 512;
        if !r.has(label, b"LABELONE") || !r.has(label + 24, b"LVM2 001") {
            continue;
        }
        let header = label + u64::from(r.u32_le(label + 20)?);
        let uuid = r.at(header, 32).map(|id| {
            if !id.iter().all(u8::is_ascii_alphanumeric) {
                return hex(id);
            }
            let mut groups = Vec::new();
            let mut rest = id;
            for width in [6, 4, 4, 4, 4, 4, 6] {
                let (group, tail) = rest.split_at(width);
                groups.push(String::from_utf8_lossy(group).into_owned());
                rest = tail;
            }
            groups.join("-")
        });
        return Some(found("LVM2 physical volume", label, 8).uuid(uuid));
    }
    None
}

/// md RAID superblock magic, little-endian as x86 kernels write it.
const MD_MAGIC: u32 = 0xa92b_4efc;

/// md RAID 1.x superblocks: 1.1 at 0, 1.2 at 4 KiB, 1.0 at 8 KiB before
/// the end rounded down to 4 KiB. Magic at 0, major version 1 at 4, set
/// UUID at 16, set name at 32, the superblock's own sector at 144.
fn md_1x(r: &Regions) -> Option<Signature> {
    let sectors = r.size_bytes / 512;
    let end = sectors.checked_sub(16).map(|s| (s & !7) * 512);
    let places = [(Some(0), "1.1"), (Some(4096), "1.2"), (end, "1.0")];
    for (offset, version) in places {
        let Some(offset) = offset else { continue };
        if r.u32_le(offset) != Some(MD_MAGIC) || r.u32_le(offset + 4) != Some(1) {
            continue;
        }
        if r.u64_le(offset + 144) != Some(offset / 512) {
            continue;
        }
        let uuid = r
            .at(offset + 16, 16)
            .map(|bytes| bytes.chunks(4).map(hex).collect::<Vec<_>>().join(":"));
        return Some(
            found(&format!("md RAID member (metadata {version})"), offset, 4)
                .label(r.at(offset + 32, 32).map(text))
                .uuid(uuid),
        );
    }
    None
}

/// md RAID 0.90 superblock: 64 KiB before the end rounded down to 64 KiB.
/// Magic at 0, major version 0 at 4; the set UUID is its words 5, 13, 14
/// and 15.
fn md_090(r: &Regions) -> Option<Signature> {
    const RESERVED: u64 = 64 << 10;
    let offset = (r.size_bytes & !(RESERVED - 1)).checked_sub(RESERVED)?;
    if r.u32_le(offset)? != MD_MAGIC || r.u32_le(offset + 4)? != 0 {
        return None;
    }
    let words = [5u64, 13, 14, 15]
        .iter()
        .map(|word| r.u32_le(offset + word * 4).map(|w| format!("{w:08x}")))
        .collect::<Option<Vec<_>>>();
    Some(found("md RAID member (metadata 0.90)", offset, 4).uuid(words.map(|w| w.join(":"))))
}

/// bcache: the superblock at 4 KiB, its 16-byte magic at byte 24; UUID at
/// 40, label at 72.
fn bcache(r: &Regions) -> Option<Signature> {
    const SUPER: u64 = 4096;
    const MAGIC: [u8; 16] = [
        0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca, 0x82, 0x65, 0xf5, 0x7f, 0x48, 0xba, 0x6d,
        0x81,
    ];
    if !r.has(SUPER + 24, &MAGIC) {
        return None;
    }
    Some(
        found("bcache device", SUPER + 24, 16)
            .label(r.at(SUPER + 72, 32).map(text))
            .uuid(r.at(SUPER + 40, 16).map(uuid_text)),
    )
}

/// ZFS: four 256 KiB vdev labels, two at the start and two at the end
/// (rounded down to 256 KiB). Each holds an XDR name-value list at 16 KiB
/// (the pool's name and GUID) and an array of uberblocks at 128 KiB, in
/// slots of 1 KiB or more, each opening with the magic 0x00bab10c in the
/// writer's byte order.
fn zfs(r: &Regions) -> Option<Signature> {
    const LABEL: u64 = 256 << 10;
    const UBERBLOCKS: u64 = 128 << 10;
    const SLOT: u64 = 1 << 10;
    const MAGIC: u64 = 0x00ba_b10c;
    let aligned = r.size_bytes & !(LABEL - 1);
    let labels = [
        Some(0),
        Some(LABEL),
        aligned.checked_sub(2 * LABEL),
        aligned.checked_sub(LABEL),
    ];
    for label in labels.into_iter().flatten() {
        let magic_at = (0..UBERBLOCKS / SLOT)
            .map(|slot| label + UBERBLOCKS + slot * SLOT)
            .find(|&at| {
                r.u64_le(at)
                    .is_some_and(|word| word == MAGIC || word.swap_bytes() == MAGIC)
            });
        let Some(magic_at) = magic_at else { continue };
        let list = r.at(label + (16 << 10), 112 << 10).unwrap_or_default();
        let name = xdr_string(list, b"name");
        let guid = xdr_u64(list, b"pool_guid").map(|guid| guid.to_string());
        let mut signature = found("ZFS pool member", magic_at, 8).label(name).uuid(guid);
        // `zpool labelclear` clears whole labels: every uberblock goes at once.
        signature.wipe = labels
            .into_iter()
            .flatten()
            .filter(|&start| start + LABEL <= r.size_bytes)
            .map(|start| (start, LABEL))
            .collect();
        return Some(signature);
    }
    None
}

/// The XDR-encoded pair `key`'s place after its name: name length, name
/// padded to 4 bytes, then the value's type and count.
fn xdr_after(list: &[u8], key: &[u8], kind: u32) -> Option<usize> {
    let mut pattern = (key.len() as u32).to_be_bytes().to_vec();
    pattern.extend_from_slice(key);
    pattern.resize(4 + key.len().div_ceil(4) * 4, 0);
    pattern.extend_from_slice(&kind.to_be_bytes());
    pattern.extend_from_slice(&1u32.to_be_bytes());
    let at = list
        .windows(pattern.len())
        .position(|window| window == pattern.as_slice())?;
    Some(at + pattern.len())
}

fn xdr_string(list: &[u8], key: &[u8]) -> Option<String> {
    const STRING: u32 = 9;
    let at = xdr_after(list, key, STRING)?;
    let length = u32::from_be_bytes(list.get(at..at + 4)?.try_into().ok()?) as usize;
    list.get(at + 4..at + 4 + length).map(text)
}

fn xdr_u64(list: &[u8], key: &[u8]) -> Option<u64> {
    const UINT64: u32 = 8;
    let at = xdr_after(list, key, UINT64)?;
    Some(u64::from_be_bytes(list.get(at..at + 8)?.try_into().ok()?))
}

/// NTFS: "NTFS    " at byte 3 of the boot sector; its serial number at
/// 0x48. (The label lives in a file of the volume, not read here.)
fn ntfs(r: &Regions) -> Option<Signature> {
    if !r.has(3, b"NTFS    ") {
        return None;
    }
    let serial = r.u64_le(0x48).map(|serial| format!("{serial:016X}"));
    Some(found("NTFS file system", 3, 8).uuid(serial))
}

/// exFAT: "EXFAT   " at byte 3; its serial number at 100. (The label
/// lives in the root folder, not read here.)
fn exfat(r: &Regions) -> Option<Signature> {
    if !r.has(3, b"EXFAT   ") {
        return None;
    }
    Some(found("exFAT file system", 3, 8).uuid(r.u32_le(100).map(fat_serial)))
}

/// FAT12/16/32: a boot sector ending in 0x55AA whose type text says FAT
/// (at 54, or at 82 for FAT32); serial and label follow the extended boot
/// record (39 and 43, or 67 and 71).
fn fat(r: &Regions) -> Option<Signature> {
    if !r.has(510, &[0x55, 0xAA]) {
        return None;
    }
    let (kind, record) = if r.has(82, b"FAT32   ") {
        ("FAT32", 64)
    } else if r.has(54, b"FAT12   ") || r.has(54, b"FAT16   ") || r.has(54, b"FAT     ") {
        (
            if r.has(54, b"FAT12   ") {
                "FAT12"
            } else {
                "FAT16"
            },
            36,
        )
    } else {
        return None;
    };
    let label = r
        .at(record + 7, 11)
        .map(text)
        .filter(|label| label != "NO NAME");
    let type_at = if kind == "FAT32" { 82 } else { 54 };
    let mut signature = found(&format!("{kind} file system"), type_at, 8)
        .label(label)
        .uuid(r.u32_le(record + 3).map(fat_serial));
    signature.wipe.push((510, 2));
    Some(signature)
}

fn fat_serial(serial: u32) -> String {
    format!("{:04X}-{:04X}", serial >> 16, serial & 0xffff)
}

/// GPT: "EFI PART" at the start of the second sector (512 or 4096 bytes
/// in), or of the last sector (the backup header); the disk GUID at the
/// header's byte 56.
fn gpt(r: &Regions) -> Option<Signature> {
    let places = [
        Some(512),
        Some(4096),
        r.size_bytes.checked_sub(512),
        r.size_bytes.checked_sub(4096),
    ];
    for header in places.into_iter().flatten() {
        if r.has(header, b"EFI PART") {
            return Some(
                found("GPT partition table", header, 8).uuid(r.at(header + 56, 16).map(guid_text)),
            );
        }
    }
    None
}

/// MBR: 0x55AA at 510 (file systems with a boot sector were tried
/// before) and at least one partition entry in use; a protective entry
/// (type 0xEE) stands for a GPT whose headers are gone.
fn mbr(r: &Regions) -> Option<Signature> {
    if !r.has(510, &[0x55, 0xAA]) {
        return None;
    }
    let entries: Vec<&[u8]> = (0..4).filter_map(|i| r.at(446 + i * 16, 16)).collect();
    let valid = entries.iter().all(|entry| matches!(entry[0], 0x00 | 0x80));
    let types: Vec<u8> = entries.iter().map(|entry| entry[4]).collect();
    if !valid || types.iter().all(|&kind| kind == 0) {
        return None;
    }
    let kind = if types.contains(&0xEE) {
        "GPT partition table (protective MBR)"
    } else {
        "MBR partition table"
    };
    let id = r
        .u32_le(440)
        .filter(|&id| id != 0)
        .map(|id| format!("{id:08x}"));
    Some(found(kind, 510, 2).uuid(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u64 = 64 << 20;

    /// A device of SIZE bytes of zeroes with `bytes` written at `offset`
    /// (negative: from the end), identified.
    fn identify_with(writes: &[(i64, &[u8])]) -> Option<Signature> {
        let mut first = vec![0u8; REGION_BYTES as usize];
        let mut last = vec![0u8; REGION_BYTES as usize];
        for &(offset, bytes) in writes {
            let absolute = if offset < 0 {
                SIZE - offset.unsigned_abs()
            } else {
                offset as u64
            };
            let end = absolute as usize + bytes.len();
            if end <= first.len() {
                first[absolute as usize..end].copy_from_slice(bytes);
            } else {
                let from = (absolute - (SIZE - REGION_BYTES)) as usize;
                last[from..from + bytes.len()].copy_from_slice(bytes);
            }
        }
        identify(&Regions {
            first: &first,
            last: &last,
            size_bytes: SIZE,
        })
    }

    #[test]
    fn zeroes_hold_nothing() {
        assert_eq!(identify_with(&[]), None);
    }

    #[test]
    fn a_tiny_device_is_read_without_panicking() {
        for size in [0usize, 1, 511, 4095, 70_000] {
            let bytes = vec![0xffu8; size];
            let regions = Regions {
                first: &bytes,
                last: &bytes,
                size_bytes: size as u64,
            };
            let _ = identify(&regions);
        }
    }

    #[test]
    fn ext4_is_named_with_its_label_and_uuid() {
        let found = identify_with(&[
            (1024 + 0x38, &[0x53, 0xEF]),
            (1024 + 0x60, &0x40u32.to_le_bytes()),
            (1024 + 0x68, &[0x11; 16]),
            (1024 + 0x78, b"data\0"),
        ])
        .expect("ext4");
        assert_eq!(found.kind, "ext4 file system");
        assert_eq!(found.label.as_deref(), Some("data"));
        assert_eq!(
            found.to_string(),
            "an ext4 file system (label \"data\", UUID \
             11111111-1111-1111-1111-111111111111, at byte 1080)"
        );
    }

    #[test]
    fn md_090_sits_64k_before_the_aligned_end() {
        let offset = -(64 << 10);
        let found = identify_with(&[
            (offset, &MD_MAGIC.to_le_bytes()),
            (offset + 20, &0x01020304u32.to_le_bytes()),
        ])
        .expect("md");
        assert_eq!(found.kind, "md RAID member (metadata 0.90)");
        assert_eq!(
            found.uuid.as_deref(),
            Some("01020304:00000000:00000000:00000000")
        );
    }

    #[test]
    fn an_md_1x_superblock_must_name_its_own_place() {
        let mut wrong = MD_MAGIC.to_le_bytes().to_vec();
        wrong.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(identify_with(&[(4096, &wrong)]), None);
        let found =
            identify_with(&[(4096, &wrong), (4096 + 144, &8u64.to_le_bytes())]).expect("md 1.2");
        assert_eq!(found.kind, "md RAID member (metadata 1.2)");
    }

    #[test]
    fn zfs_is_found_by_an_uberblock_in_a_label_at_the_end() {
        let aligned = SIZE & !((256 << 10) - 1);
        let l3 = aligned - (256 << 10) + (128 << 10) + 5 * 1024;
        let found =
            identify_with(&[(l3 as i64 - SIZE as i64, &0x00bab10cu64.to_be_bytes())]).expect("zfs");
        assert_eq!(found.kind, "ZFS pool member");
        assert_eq!(found.offset_bytes, l3);
    }

    #[test]
    fn a_fat_boot_sector_is_not_taken_for_an_mbr() {
        let found = identify_with(&[
            (510, &[0x55, 0xAA]),
            (82, b"FAT32   "),
            (67, &0xABCD1234u32.to_le_bytes()),
            (71, b"DATA       "),
        ])
        .expect("fat");
        assert_eq!(found.kind, "FAT32 file system");
        assert_eq!(found.uuid.as_deref(), Some("ABCD-1234"));
        assert_eq!(found.label.as_deref(), Some("DATA"));
    }

    #[test]
    fn an_mbr_needs_a_partition_in_use() {
        assert_eq!(identify_with(&[(510, &[0x55, 0xAA])]), None);
        let found = identify_with(&[(510, &[0x55, 0xAA]), (446 + 4, &[0x83])]).expect("mbr");
        assert_eq!(found.kind, "MBR partition table");
    }

    #[test]
    fn a_backup_gpt_header_alone_is_found() {
        let found = identify_with(&[(-512, b"EFI PART")]).expect("gpt");
        assert_eq!(found.kind, "GPT partition table");
        assert_eq!(found.offset_bytes, SIZE - 512);
    }
}
