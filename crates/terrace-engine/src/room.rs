//! Room in the metadata slot.
//!
//! The slot is fixed when the pool is created (it sits in front of every
//! disk's slabs), and every extent map, job and dirty record of the pool
//! has to fit it. Two rules keep a pool from running out:
//!
//! * a pool's slot is sized from its disks when no size is asked for
//!   ([`metadata_slot_bytes_for`]), at [`SLOT_BYTES_PER_SLAB`] a slab;
//! * an allocation (a space, a growth, a write-back log) is refused if the
//!   metadata after it would leave no room to record the repair of its
//!   fullest disk ([`check_room`]): a move per slab on that disk, after its
//!   extents were recorded as dirty while it was missing. Without that room
//!   the pool could allocate its last slabs and then be unable to start the
//!   repair that protects them.

use std::collections::HashMap;

use terrace_io::DIRECT_IO_ALIGNMENT;
use terrace_meta::codec;
use terrace_meta::format::{data_offset, METADATA_SLOT_DEFAULT_BYTES, SLOT_HEADER_BYTES};
use terrace_meta::{
    DiskIndex, ExtentRecord, PoolMetadata, DIRTY_EXTENT_BYTES, JOB_MIN_BYTES, MOVE_BYTES,
};

use crate::EngineError;

/// Metadata budgeted per slab when a slot is sized from the disks. A
/// slab costs at most 7 bytes in an extent map (a one-column space: a
/// flag byte and a 6-byte slab reference), and the fullest disk's slabs
/// 41 more each (the move of a repair re-creating one, 29, and its extent
/// in a dirty record, 12): 48 at most, a pool of
/// one disk. The slot cannot grow once the pool exists, so the rest is
/// for disks added later: at 64 bytes a pool of four disks that took four
/// more of four times their size (five times its slabs, the new disks a
/// fifth of them each) could allocate only part of them; at 256 it can
/// all (`a_slot_sized_at_creation_holds_a_pool_grown_five_fold`). Every
/// disk holds two slots for every slab of the pool: 0.005 % of each disk
/// for 24 disks in 256 MiB slabs.
pub const SLOT_BYTES_PER_SLAB: u64 = 256;

/// Largest metadata slot a pool may have.
pub const METADATA_SLOT_MAX_BYTES: u64 = 1 << 30;

/// The metadata slot for a pool of devices of `sizes` bytes cut into slabs
/// of `slab_bytes`: [`SLOT_BYTES_PER_SLAB`] for each slab, at least the
/// default 4 MiB and at most 1 GiB. A pool of 24 drives of 18 TB in 256 MiB
/// slabs gets 392 MiB, 0.005 % of its disks for the two slots; only the
/// metadata itself is written at each commit and read at an import, not
/// the whole slot.
pub fn metadata_slot_bytes_for(sizes: &[u64], slab_bytes: u64) -> u64 {
    let offset = data_offset(METADATA_SLOT_DEFAULT_BYTES);
    let slabs: u64 = sizes
        .iter()
        .map(|size| size.saturating_sub(offset) / slab_bytes.max(1))
        .sum();
    slabs
        .saturating_mul(SLOT_BYTES_PER_SLAB)
        .next_multiple_of(4096)
        .clamp(METADATA_SLOT_DEFAULT_BYTES, METADATA_SLOT_MAX_BYTES)
}

/// Bytes the metadata needs beyond `metadata` to record the repair of its
/// fullest disk: its extents in a dirty record, then a job with a move for
/// each of its slabs.
pub fn repair_reserve_bytes(metadata: &PoolMetadata) -> u64 {
    let mut slabs_on: HashMap<DiskIndex, u64> = HashMap::new();
    // An extent puts at most one slab on a disk.
    for slab in ExtentRecord::slabs_of(metadata.spaces.iter().flat_map(|s| s.extents.iter())) {
        *slabs_on.entry(slab.disk).or_default() += 1;
    }
    let fullest = slabs_on.values().copied().max().unwrap_or(0);
    let per_slab = (MOVE_BYTES + DIRTY_EXTENT_BYTES) as u64;
    // The job's fixed fields with a reason, and the dirty record's own.
    fullest * per_slab + JOB_MIN_BYTES as u64 + 256
}

/// Refuse `metadata` (the pool's after an allocation) unless what a commit
/// of it writes to a slot (header, metadata, padding: what `pool status`
/// shows) leaves room for [`repair_reserve_bytes`] to spare.
pub fn check_room(metadata: &PoolMetadata, slot_bytes: u64) -> Result<(), EngineError> {
    let metadata_bytes = (SLOT_HEADER_BYTES + codec::encode(metadata).len())
        .next_multiple_of(DIRECT_IO_ALIGNMENT) as u64;
    let reserve_bytes = repair_reserve_bytes(metadata);
    if metadata_bytes + reserve_bytes > slot_bytes {
        return Err(EngineError::MetadataRoom {
            metadata_bytes,
            reserve_bytes,
            slot_bytes,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TB: u64 = 1_000_000_000_000;

    #[test]
    fn slots_are_sized_from_the_disks_slabs() {
        // Small pools keep the 4 MiB default.
        assert_eq!(
            metadata_slot_bytes_for(&[1 << 30; 4], 256 << 20),
            METADATA_SLOT_DEFAULT_BYTES
        );
        // 24 drives of 18 TB in 256 MiB slabs: 256 bytes a slab.
        let slot = metadata_slot_bytes_for(&[18 * TB; 24], 256 << 20);
        let slabs = 24 * ((18 * TB - data_offset(METADATA_SLOT_DEFAULT_BYTES)) / (256 << 20));
        assert_eq!(slot, (slabs * SLOT_BYTES_PER_SLAB).next_multiple_of(4096));
        assert!((390 << 20..395 << 20).contains(&slot), "{slot}");
        // Never past 1 GiB, whatever the pool.
        assert_eq!(
            metadata_slot_bytes_for(&[18 * TB; 64], 64 << 10),
            METADATA_SLOT_MAX_BYTES
        );
    }

    /// Sized from four disks, the pool takes four more of four times their
    /// size (five times the slabs): a 2-way mirror over every slab, with
    /// room kept for the repair of a large disk, still fits the slot.
    #[test]
    fn a_slot_sized_at_creation_holds_a_pool_grown_five_fold() {
        use terrace_layout::{Geometry, Layout};
        use terrace_meta::*;

        let slab_bytes = 1 << 30;
        let (small, large) = (16_000u32, 64_000u32);
        let size =
            |slabs: u32| data_offset(METADATA_SLOT_DEFAULT_BYTES) + u64::from(slabs) * slab_bytes;
        let slot = metadata_slot_bytes_for(&[size(small); 4], slab_bytes);
        let disk = |index: usize, slab_count: u32| DiskRecord {
            id: DiskId([index as u8; 16]),
            size_bytes: size(slab_count),
            slab_count,
            media: Media::Hdd,
            usage: Usage::Auto,
            state: DiskState::Active,
            enclosure: String::new(),
            node: String::new(),
            path_hint: format!("/dev/sd{index}"),
            state_reason: String::new(),
            missing_since: 0,
        };
        let mut metadata = PoolMetadata {
            generation: 1,
            clean: true,
            next_space_id: 2,
            disks: (0..8)
                .map(|index| disk(index, if index < 4 { small } else { large }))
                .collect(),
            ..PoolMetadata::new(PoolId([1; 16]), "tank".into(), slab_bytes, 1)
        };
        let layout = Layout::Mirror { copies: 2 };
        let geometry = Geometry::new(layout, 1, 256 << 10, slab_bytes).unwrap();
        let mut allocator =
            Allocator::new(&metadata, FaultDomain::Disk, DiskRecord::takes_capacity);
        let extents: Vec<ExtentRecord> = std::iter::from_fn(|| {
            let slabs = allocator.allocate_extent(&geometry).ok()?;
            Some(ExtentRecord { slabs: Some(slabs) })
        })
        .collect();
        assert_eq!(extents.len() as u32, 2 * small + 2 * large);
        metadata.spaces.push(SpaceRecord {
            id: SpaceId(1),
            name: "all".into(),
            export: Some("all".into()),
            layout,
            columns: 1,
            interleave_bytes: geometry.interleave_bytes(),
            size_bytes: extents.len() as u64 * geometry.extent_data_bytes(),
            provisioning: Provisioning::Fixed,
            fault_domain: FaultDomain::Disk,
            created_ns: 1,
            columns_reason: String::new(),
            role: SpaceRole::Data,
            cache: None,
            sums: None,
            checksums: true,
            extents,
        });
        check_room(&metadata, slot).unwrap();
    }
}
