use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::executor::block_on;
use proptest::prelude::*;
use terrace_io::memory::MemoryDevice;
use terrace_io::{BlockDevice, Bytes};
use terrace_layout::{Geometry, Layout};

use crate::codec::DecodeError;
use crate::format::{
    data_offset, slot_offset, SlotError, SlotHeader, INTENT_SLOT_BYTES, LABEL_BYTES,
    METADATA_SLOT_MIN_BYTES, SLOT_VERSION,
};
use crate::quorum::{select, Candidate};
use crate::store::{encode_slot, probe, write_label, write_slot, Probe};
use crate::*;

const SLAB: u64 = 64 << 10;
const SLOT: u64 = METADATA_SLOT_MIN_BYTES;

fn disk(index: u8, slab_count: u32) -> DiskRecord {
    DiskRecord {
        id: DiskId([index; 16]),
        size_bytes: data_offset(SLOT) + u64::from(slab_count) * SLAB,
        slab_count,
        media: if index.is_multiple_of(3) {
            Media::Ssd
        } else {
            Media::Hdd
        },
        usage: Usage::Auto,
        state: DiskState::Active,
        enclosure: format!("e{}", index % 2),
        node: String::new(),
        path_hint: format!("/dev/fake{index}"),
        state_reason: String::new(),
        missing_since: 0,
    }
}

fn metadata(disks: usize, slab_count: u32) -> PoolMetadata {
    PoolMetadata {
        generation: 7,
        committed_ns: 2,
        clean: true,
        disks: (0..disks).map(|i| disk(i as u8, slab_count)).collect(),
        ..PoolMetadata::new(PoolId([0xab; 16]), "tank".into(), SLAB, 1)
    }
}

/// A pool with one space of `layout` filling `extents` extents.
fn metadata_with_space(layout: Layout, columns: u32, extents: u64) -> PoolMetadata {
    let mut pool = metadata(8, 16);
    let geometry = Geometry::new(layout, columns, 4096, SLAB).unwrap();
    let mut allocator = Allocator::new(&pool, FaultDomain::Disk, DiskRecord::takes_capacity);
    let extents: Vec<ExtentRecord> = (0..extents)
        .map(|_| ExtentRecord {
            slabs: Some(allocator.allocate_extent(&geometry).unwrap()),
        })
        .collect();
    pool.spaces.push(SpaceRecord {
        id: SpaceId(1),
        name: "vol".into(),
        export: Some("vol".into()),
        layout,
        columns,
        interleave_bytes: 4096,
        size_bytes: geometry.extent_data_bytes() * extents.len() as u64,
        provisioning: Provisioning::Fixed,
        fault_domain: FaultDomain::Disk,
        created_ns: 3,
        columns_reason: "because".into(),
        role: SpaceRole::Data,
        cache: None,
        sums: None,
        checksums: true,
        extents,
    });
    pool
}

#[test]
fn metadata_round_trips() {
    for (layout, columns) in [
        (Layout::Simple, 3),
        (Layout::Mirror { copies: 2 }, 2),
        (Layout::Mirror { copies: 3 }, 2),
        (Layout::Parity { redundancy: 1 }, 5),
        (Layout::Parity { redundancy: 2 }, 8),
    ] {
        let mut pool = metadata_with_space(layout, columns, 3);
        pool.spaces[0].extents.push(ExtentRecord { slabs: None });
        pool.spaces[0].size_bytes += pool.spaces[0].geometry(SLAB).unwrap().extent_data_bytes();
        pool.disks[1].state = DiskState::Failed;
        pool.disks[1].state_reason = "read error at 4096".into();
        pool.settings.retire_missing = RetireMissing::Never;
        pool.settings.repair_rate_bytes_per_second = 100 << 20;
        let free = Allocator::new(&pool, FaultDomain::Disk, DiskRecord::takes_capacity)
            .free_by_disk()
            .into_iter()
            .find(|(_, free)| *free > 0)
            .map(|(disk, _)| disk)
            .unwrap();
        let target = SlabRef {
            disk: free,
            slab: SlabIndex(15),
        };
        pool.jobs.push(JobRecord {
            id: 4,
            kind: JobKind::Replace {
                old: DiskIndex(1),
                new: free,
            },
            state: JobState::Paused,
            reason: String::new(),
            created_ns: 9,
            finished_ns: 0,
            bytes_total: 1 << 20,
            bytes_done: 4096,
            moves: vec![MoveRecord {
                space: SpaceId(1),
                extent: 0,
                slot: 0,
                target,
                watermark_rows: 3,
                done: false,
            }],
            folded_moves: 0,
            folded_moves_done: 0,
            cursor: 0,
            repaired: 0,
            unrepaired: 0,
        });
        pool.jobs.push(JobRecord {
            id: 5,
            kind: JobKind::LogsToJournal,
            state: JobState::Done,
            reason: String::new(),
            created_ns: 10,
            finished_ns: 11,
            bytes_total: 1 << 20,
            bytes_done: 1 << 20,
            moves: Vec::new(),
            folded_moves: 12,
            folded_moves_done: 11,
            cursor: 0,
            repaired: 0,
            unrepaired: 0,
        });
        pool.dirty.push(DirtyRecord {
            disk: DiskIndex(1),
            extents: vec![(SpaceId(1), 0), (SpaceId(1), 2)],
        });
        let decoded = codec::decode(&codec::encode(&pool)).unwrap();
        assert_eq!(decoded, pool);
    }
}

/// A golden vector: the first bytes of an encoded payload, by hand from the
/// byte table in docs/ON_DISK_FORMAT.md.
#[test]
fn payload_golden_prefix() {
    let pool = metadata(1, 2);
    let bytes = codec::encode(&pool);
    let mut expected = vec![0xab; 16];
    expected.extend_from_slice(&7u64.to_le_bytes()); // generation
    expected.extend_from_slice(&1u64.to_le_bytes()); // created
    expected.extend_from_slice(&2u64.to_le_bytes()); // committed
    expected.extend_from_slice(&SLAB.to_le_bytes()); // slab bytes
    expected.push(1); // clean
    expected.extend_from_slice(&1u64.to_le_bytes()); // next space id
    expected.extend_from_slice(&[4, 0]);
    expected.extend_from_slice(b"tank");
    expected.extend_from_slice(&[1, 0]); // one disk
    expected.extend_from_slice(&[0; 16]); // disk id
    assert_eq!(&bytes[..expected.len()], &expected[..]);
    // zero spaces, then settings (auto, parallel, unlimited), next job id 1,
    // zero jobs, zero dirty records, zero write-intent extents, then the
    // error limit and window, the scrub interval and the last scrub, and
    // the default provisioning (fixed)
    let mut tail = vec![0, 0, 0, 0, 2, 0];
    tail.extend_from_slice(&0u64.to_le_bytes());
    tail.extend_from_slice(&1u64.to_le_bytes());
    tail.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    tail.extend_from_slice(&[0, 0, 0, 0]);
    tail.extend_from_slice(&10u32.to_le_bytes());
    tail.extend_from_slice(&600u32.to_le_bytes());
    tail.extend_from_slice(&(28u64 * 24 * 3600).to_le_bytes());
    tail.extend_from_slice(&0u64.to_le_bytes());
    tail.extend_from_slice(&[0, 70, 85, 95]);
    assert_eq!(&bytes[bytes.len() - tail.len()..], &tail[..]);
    // Format 5 ends after the scrub settings, and reads as the defaults.
    let five = codec::encode_version(&pool, 5);
    assert_eq!(five[..], bytes[..bytes.len() - 4]);
    assert_eq!(codec::decode_version(&five, 5).unwrap(), pool);
    let mut thin = pool.clone();
    thin.settings.provisioning = Provisioning::Thin;
    let encoded = codec::encode(&thin);
    assert_eq!(encoded[encoded.len() - 4], 1);
    assert_eq!(codec::decode(&encoded).unwrap(), thin);
    // Format 4 ends after the write intent, and reads as the defaults.
    let four = codec::encode_version(&pool, 4);
    assert_eq!(four[..], bytes[..bytes.len() - 28]);
    assert_eq!(codec::decode_version(&four, 4).unwrap(), pool);
    // Metadata written before the write-intent list existed ends after the
    // dirty records, and reads as an empty list.
    let older = codec::decode_version(&four[..four.len() - 4], 4).unwrap();
    assert_eq!(older, pool);
    let mut with_intent = pool.clone();
    with_intent.intent = vec![(SpaceId(3), 7), (SpaceId(3), 9)];
    assert_eq!(
        codec::decode(&codec::encode(&with_intent)).unwrap(),
        with_intent
    );
}

#[test]
fn label_golden_and_round_trip() {
    let label = Label {
        pool_id: PoolId([1; 16]),
        disk_id: DiskId([2; 16]),
        created_ns: 0x0102_0304_0506_0708,
        device_bytes: 1 << 30,
        metadata_slot_bytes: SLOT,
        data_offset: data_offset(SLOT),
        slab_bytes: SLAB,
        pool_name: "tank".into(),
    };
    let block = label.encode();
    assert_eq!(&block[0..8], b"TRRCLABL");
    assert_eq!(&block[8..12], &1u32.to_le_bytes());
    assert_eq!(&block[12..16], &4096u32.to_le_bytes());
    assert_eq!(&block[16..32], &[1; 16]);
    assert_eq!(&block[32..48], &[2; 16]);
    assert_eq!(&block[48..56], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(
        &block[64..72],
        &(1u64 << 20).to_le_bytes(),
        "metadata offset"
    );
    assert_eq!(&block[96..100], b"tank");
    let checksum = crc32c::crc32c(&block[..4092]);
    assert_eq!(&block[4092..], &checksum.to_le_bytes());
    assert_eq!(Label::decode(&block).unwrap(), label);

    let mut damaged = block;
    damaged[200] ^= 1;
    assert!(matches!(
        Label::decode(&damaged),
        Err(LabelError::BadChecksum { .. })
    ));
    assert_eq!(Label::decode(&[0u8; LABEL_BYTES]), Err(LabelError::Blank));
}

#[test]
fn slot_header_detects_damage() {
    let header = SlotHeader {
        version: SLOT_VERSION,
        pool_id: PoolId([3; 16]),
        generation: 42,
        payload_bytes: 100,
        payload_checksum: 0xdead_beef,
    };
    let block = header.encode();
    assert_eq!(SlotHeader::decode(&block, SLOT).unwrap(), header);
    for byte in 0..56 {
        let mut damaged = block;
        damaged[byte] ^= 0x10;
        assert!(SlotHeader::decode(&damaged, SLOT).is_err(), "byte {byte}");
    }
    let huge = SlotHeader {
        payload_bytes: SLOT,
        ..header
    };
    assert!(matches!(
        SlotHeader::decode(&huge.encode(), SLOT),
        Err(SlotError::Oversized { .. })
    ));
}

/// Slot format 1 kept every move of a finished job and no counts; its
/// payloads still decode (the counts zero), and a slot header of version 1
/// is read, one of a version this build does not know is refused.
#[test]
fn slots_of_format_one_still_read() {
    let mut pool = metadata(1, 2);
    pool.jobs.push(JobRecord {
        id: 1,
        kind: JobKind::LogsToJournal,
        state: JobState::Done,
        reason: String::new(),
        created_ns: 1,
        finished_ns: 2,
        bytes_total: 0,
        bytes_done: 0,
        moves: Vec::new(),
        folded_moves: 0,
        folded_moves_done: 0,
        cursor: 0,
        repaired: 0,
        unrepaired: 0,
    });
    pool.disks[0].state = DiskState::Missing;
    pool.disks[0].missing_since = 0;
    let current = codec::encode_version(&pool, 4);
    // Format 1 had no disk's missing-since generation (8 bytes at the end
    // of the one disk's record, whose length two disks tell) and no folded
    // counts (8 bytes in front of the dirty and intent counts, the job
    // being the last record).
    let disk_start = 16 + 8 * 4 + 1 + 8 + 2 + pool.name.len() + 2;
    let mut two = pool.clone();
    two.disks.push(two.disks[0].clone());
    two.disks[1].id = DiskId([9; 16]);
    let disk_end = disk_start + codec::encode_version(&two, 4).len() - current.len();
    let end = current.len();
    let mut old = current[..disk_end - 8].to_vec();
    old.extend_from_slice(&current[disk_end..end - 16]);
    old.extend_from_slice(&current[end - 8..]);
    assert_eq!(codec::decode_version(&old, 1).unwrap(), pool);
    assert!(codec::decode_version(&old, SLOT_VERSION).is_err());
    let mut folded = pool.clone();
    folded.jobs[0].folded_moves = 3;
    folded.jobs[0].folded_moves_done = 4;
    assert!(matches!(
        codec::decode(&codec::encode(&folded)),
        Err(DecodeError::FoldedMoves {
            job: 1,
            done: 4,
            total: 3
        })
    ));

    let header = |version| {
        SlotHeader {
            version,
            pool_id: PoolId([3; 16]),
            generation: 42,
            payload_bytes: 100,
            payload_checksum: 0,
        }
        .encode()
    };
    assert_eq!(SlotHeader::decode(&header(1), SLOT).unwrap().version, 1);
    assert!(matches!(
        SlotHeader::decode(&header(SLOT_VERSION + 1), SLOT),
        Err(SlotError::UnknownVersion { version }) if version == SLOT_VERSION + 1
    ));
}

/// A space's export name round-trips (a log space's none too), and a
/// payload of slot format 3, which stores none, decodes with none (the
/// import that reads it decides one).
#[test]
fn export_names_round_trip_and_format_three_has_none() {
    let mut pool = metadata_with_space(Layout::Mirror { copies: 2 }, 2, 1);
    pool.spaces[0].export = Some("tank-vol".into());
    assert_eq!(codec::decode(&codec::encode(&pool)).unwrap(), pool);
    let mut log = pool.clone();
    log.spaces[0].export = None;
    assert_eq!(codec::decode(&codec::encode(&log)).unwrap(), log);

    // The export name is 2 + 8 bytes right after the space's name.
    let current = codec::encode_version(&pool, 4);
    let name_end = {
        let needle = [&[3u8, 0][..], b"vol", &[8, 0], b"tank-vol"].concat();
        let at = current
            .windows(needle.len())
            .position(|window| window == needle)
            .expect("name and export name in the payload");
        at + 5
    };
    let mut old = current[..name_end].to_vec();
    old.extend_from_slice(&current[name_end + 10..]);
    let mut expected = pool.clone();
    expected.spaces[0].export = None;
    assert_eq!(codec::decode_version(&old, 3).unwrap(), expected);
    assert!(codec::decode_version(&old, 4).is_err());
}

#[test]
fn decoder_rejects_inconsistent_extent_maps() {
    let pool = metadata_with_space(Layout::Parity { redundancy: 1 }, 3, 2);
    let mut reused = pool.clone();
    let first = reused.spaces[0].extents[0].slabs.as_ref().unwrap()[0];
    reused.spaces[0].extents[1].slabs.as_mut().unwrap()[0] = first;
    assert!(codec::decode(&codec::encode(&reused)).is_err());
    let mut missing_disk = pool.clone();
    missing_disk.spaces[0].extents[0].slabs.as_mut().unwrap()[1].disk = DiskIndex(99);
    assert!(matches!(
        codec::decode(&codec::encode(&missing_disk)),
        Err(DecodeError::SlabOutOfRange { .. })
    ));
    let bytes = codec::encode(&pool);
    for cut in [0, 1, 20, bytes.len() / 2, bytes.len() - 1] {
        assert!(codec::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert_eq!(
        codec::decode(&trailing),
        Err(DecodeError::Trailing { trailing: 1 })
    );
}

proptest! {
    #[test]
    fn decoding_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = codec::decode(&bytes);
        let _ = Label::decode(&bytes);
        let _ = SlotHeader::decode(&bytes, SLOT);
        let _ = IntentRecord::decode(&bytes);
    }

    #[test]
    fn decoding_mutated_metadata_never_panics(position in any::<usize>(), value in any::<u8>()) {
        let mut bytes = codec::encode(&metadata_with_space(Layout::Mirror { copies: 2 }, 2, 3));
        let position = position % bytes.len();
        bytes[position] = value;
        let _ = codec::decode(&bytes);
    }
}

fn memory_disks(count: usize) -> Vec<Arc<MemoryDevice>> {
    (0..count)
        .map(|i| {
            Arc::new(MemoryDevice::new(
                format!("memory:{i}"),
                data_offset(SLOT) + 16 * SLAB,
            ))
        })
        .collect()
}

fn label_for(pool: &PoolMetadata, disk: usize) -> Label {
    Label {
        pool_id: pool.pool_id,
        disk_id: pool.disks[disk].id,
        created_ns: 0,
        device_bytes: data_offset(SLOT) + 16 * SLAB,
        metadata_slot_bytes: SLOT,
        data_offset: data_offset(SLOT),
        slab_bytes: SLAB,
        pool_name: pool.name.clone(),
    }
}

fn probe_all(devices: &[Arc<MemoryDevice>]) -> Vec<(DiskId, Probe)> {
    devices
        .iter()
        .map(|device| {
            let probe = block_on(probe(device.as_ref() as &dyn BlockDevice));
            let Probe::Member { label, .. } = &probe else {
                panic!("not a member: {probe:?}")
            };
            (label.disk_id, probe)
        })
        .collect()
}

fn selected_generation(devices: &[Arc<MemoryDevice>]) -> (u64, bool) {
    let probes = probe_all(devices);
    let candidates: Vec<Candidate> = probes
        .iter()
        .map(|(disk_id, probe)| Candidate {
            disk_id: *disk_id,
            copies: probe.generations(),
        })
        .collect();
    let selection = select(&candidates).expect("some generation");
    (selection.metadata.generation, selection.quorum)
}

/// Crash at every step of a commit — before, during (torn at every 4 KiB
/// boundary and mid-sector) and after each disk's slot write — and import
/// still finds a complete generation: the new one once a majority holds it,
/// the previous one before.
#[test]
fn a_commit_cut_at_any_step_leaves_a_consistent_newest_generation() {
    let disks = 5;
    let mut pool = metadata_with_space(Layout::Mirror { copies: 2 }, 2, 2);
    pool.disks.truncate(disks);
    pool.spaces.clear();
    let previous = pool.clone();
    let mut next = pool.clone();
    next.generation += 1;
    next.name = "renamed".into();
    let encoded = encode_slot(&next, SLOT).unwrap();
    let cuts: Vec<usize> = [0, 17, 64, 4096, 4096 + 511, encoded.len()]
        .into_iter()
        .filter(|&cut| cut <= encoded.len())
        .collect();
    for completed in 0..=disks {
        for &cut in &cuts {
            let devices = memory_disks(disks);
            for (index, device) in devices.iter().enumerate() {
                block_on(write_label(device.as_ref(), &label_for(&previous, index))).unwrap();
                let old = encode_slot(&previous, SLOT).unwrap();
                block_on(write_slot(
                    device.as_ref(),
                    &label_for(&previous, index),
                    previous.generation,
                    old,
                ))
                .unwrap();
            }
            // Disks before `completed` got the whole new slot, disk `completed` a torn prefix.
            for (index, device) in devices.iter().enumerate().take(completed + 1) {
                let length = if index < completed {
                    encoded.len()
                } else {
                    cut
                };
                let offset = slot_offset(SLOT, next.generation % 2);
                device.write_sync(offset, &encoded[..length]);
            }
            let holders = completed + usize::from(cut == encoded.len() && completed < disks);
            let (generation, quorum) = selected_generation(&devices);
            assert!(quorum, "completed {completed} cut {cut}");
            let expected = if holders * 2 > disks {
                next.generation
            } else {
                previous.generation
            };
            assert_eq!(generation, expected, "completed {completed}, cut {cut}");
        }
    }
}

#[test]
fn quorum_follows_the_member_set_and_stale_disks_cannot_outvote() {
    let mut generations = Vec::new();
    let mut pool = metadata(5, 4);
    generations.push(pool.clone()); // gen 7: members 0..5
    pool.generation = 8;
    pool.disks[0].state = DiskState::Failed;
    generations.push(pool.clone()); // gen 8: members 1..5
    pool.generation = 9;
    pool.disks[1].state = DiskState::Failed;
    generations.push(pool.clone()); // gen 9: members 2..5
    pool.generation = 10;
    pool.disks[2].state = DiskState::Missing;
    generations.push(pool.clone()); // gen 10: members 3,4
    let id = |i: u8| DiskId([i; 16]);
    let candidate = |disk: u8, held: &[usize]| Candidate {
        disk_id: id(disk),
        copies: held.iter().map(|&g| &generations[g]).collect(),
    };
    // All disks present: generation 10 held by both of its members.
    let all = vec![
        candidate(0, &[0]),
        candidate(1, &[0, 1]),
        candidate(2, &[1, 2]),
        candidate(3, &[2, 3]),
        candidate(4, &[2, 3]),
    ];
    let selection = select(&all).unwrap();
    assert_eq!(
        (selection.metadata.generation, selection.quorum),
        (10, true)
    );
    // Only the stale disks: the newest they hold (9) names members 2,3,4 of
    // which one is present; no generation has a majority → read-only at 9.
    let stale = vec![
        candidate(0, &[0]),
        candidate(1, &[0, 1]),
        candidate(2, &[1, 2]),
    ];
    let selection = select(&stale).unwrap();
    assert_eq!(
        (selection.metadata.generation, selection.quorum),
        (9, false)
    );
    assert!(selection.shortfall().unwrap().contains("only 1 of 3"));
    // One of the two current members: 1 of 2 is not a majority.
    let selection = select(&[candidate(3, &[2, 3])]).unwrap();
    assert_eq!(
        (selection.metadata.generation, selection.quorum),
        (10, false)
    );
    assert!(select(&[]).is_none());
}

#[test]
fn placement_declusters_the_copies_of_a_disk_over_many_partners() {
    // 12 equal disks, a 2-way mirror of 5 columns: a disk's slabs must have
    // their other copies spread over many disks, so that rebuilding it reads
    // from many at once, and every disk stays level.
    let pool = metadata(12, 64);
    let geometry = Geometry::new(Layout::Mirror { copies: 2 }, 5, 4096, SLAB).unwrap();
    let mut allocator = Allocator::new(&pool, FaultDomain::Disk, DiskRecord::takes_capacity);
    let mut partners: BTreeMap<u16, BTreeSet<u16>> = BTreeMap::new();
    let mut used = vec![0u32; 12];
    for _ in 0..60 {
        let slabs = allocator.allocate_extent(&geometry).unwrap();
        for pair in slabs.chunks(2) {
            let (a, b) = (pair[0].disk.0, pair[1].disk.0);
            partners.entry(a).or_default().insert(b);
            partners.entry(b).or_default().insert(a);
        }
        for slab in &slabs {
            used[usize::from(slab.disk.0)] += 1;
        }
    }
    for (disk, others) in &partners {
        assert!(others.len() >= 8, "disk {disk} pairs only with {others:?}");
    }
    let (least, most) = (used.iter().min().unwrap(), used.iter().max().unwrap());
    assert!(most - least <= 1, "uneven fill: {used:?}");
}

#[test]
fn placement_uses_mixed_disks_evenly_and_respects_domains() {
    let mut pool = metadata(4, 10);
    pool.disks[3].slab_count = 30; // one big disk
    let geometry = Geometry::new(Layout::Mirror { copies: 2 }, 1, 4096, SLAB).unwrap();
    let mut allocator = Allocator::new(&pool, FaultDomain::Disk, DiskRecord::takes_capacity);
    let mut extents = 0;
    while let Ok(slabs) = allocator.allocate_extent(&geometry) {
        assert_ne!(slabs[0].disk, slabs[1].disk);
        extents += 1;
    }
    // 60 slabs in all: the big disk pairs with every small one; all used.
    assert_eq!(extents, 30);
    assert_eq!(allocator.free_slabs(), 0);

    // Enclosure awareness: copies land in distinct enclosures (e0, e1).
    let pool = metadata(6, 10);
    let mut allocator = Allocator::new(&pool, FaultDomain::Enclosure, DiskRecord::takes_capacity);
    for _ in 0..20 {
        let slabs = allocator.allocate_extent(&geometry).unwrap();
        let enclosures: Vec<&str> = slabs
            .iter()
            .map(|slab| pool.disks[usize::from(slab.disk.0)].enclosure.as_str())
            .collect();
        assert_ne!(enclosures[0], enclosures[1]);
    }
    let triple = Geometry::new(Layout::Mirror { copies: 3 }, 1, 4096, SLAB).unwrap();
    assert_eq!(
        allocator.clone().allocate_extent(&triple),
        Err(PlacementError::FaultDomains {
            level: FaultDomain::Enclosure,
            needed: 3,
            available: 2
        })
    );
    let wide = Geometry::new(Layout::Simple, 7, 4096, SLAB).unwrap();
    let before = allocator.free_slabs();
    assert_eq!(
        allocator.allocate_extent(&wide),
        Err(PlacementError::OutOfSpace {
            needed: 7,
            available: 6
        })
    );
    assert_eq!(
        allocator.free_slabs(),
        before,
        "a failed allocation changes nothing"
    );
}

#[test]
fn placement_skips_used_failed_and_reserved_disks() {
    let mut pool = metadata_with_space(Layout::Simple, 2, 3);
    pool.disks[2].state = DiskState::Failed;
    pool.disks[3].usage = Usage::HotSpare;
    pool.disks[4].usage = Usage::Journal;
    let allocator = Allocator::new(&pool, FaultDomain::Disk, DiskRecord::takes_capacity);
    let free = allocator.free_by_disk();
    assert!(!free.contains_key(&DiskIndex(2)) && !free.contains_key(&DiskIndex(3)));
    assert_eq!(pool.used_slabs().len(), 6);
    let used_on_eligible = pool
        .used_slabs()
        .iter()
        .filter(|slab| pool.disks[usize::from(slab.disk.0)].takes_capacity())
        .count() as u64;
    // Free: every slab of the five eligible disks but those in use there.
    assert_eq!(allocator.free_slabs(), 5 * 16 - used_on_eligible);
}

#[test]
fn placement_leaves_excluded_slabs_alone() {
    let pool = metadata_with_space(Layout::Simple, 2, 3);
    let all = Allocator::new(&pool, FaultDomain::Disk, DiskRecord::takes_capacity);
    let excluded: BTreeSet<SlabRef> = (0..4)
        .map(|slab| SlabRef {
            disk: DiskIndex(0),
            slab: SlabIndex(slab),
        })
        .filter(|slab| !pool.used_slabs().contains(slab))
        .collect();
    assert!(!excluded.is_empty());
    let mut allocator = all.clone().exclude(&excluded);
    assert_eq!(
        allocator.free_slabs(),
        all.free_slabs() - excluded.len() as u64
    );
    let geometry = Geometry::new(Layout::Simple, 4, 4096, SLAB).unwrap();
    while let Ok(slabs) = allocator.allocate_extent(&geometry) {
        assert!(slabs.iter().all(|slab| !excluded.contains(slab)));
    }
}

/// A short fuzzing run inside the suite: random bytes and mutations of
/// valid encodings (bit flips, byte values, truncation, splicing) through
/// the fuzz target's body. The deep run is `cargo +nightly fuzz run metadata`.
#[test]
fn fuzz_target_smoke_run() {
    let seeds: Vec<Vec<u8>> = vec![
        codec::encode(&metadata_with_space(Layout::Parity { redundancy: 2 }, 6, 3)),
        codec::encode(&metadata_with_space(Layout::Mirror { copies: 3 }, 2, 2)),
        label_for(&metadata(2, 4), 1).encode().to_vec(),
    ];
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for iteration in 0..20_000 {
        let seed = &seeds[iteration % seeds.len()];
        let mut data = seed.clone();
        match next() % 5 {
            0 => data = (0..next() % 512).map(|_| next() as u8).collect(),
            1 => {
                let bit = next() as usize % (data.len() * 8);
                data[bit / 8] ^= 1 << (bit % 8);
            }
            2 => {
                let at = next() as usize % data.len();
                data[at] = next() as u8;
            }
            3 => data.truncate(next() as usize % data.len()),
            _ => {
                let other = &seeds[next() as usize % seeds.len()];
                let end = data.len().min(other.len());
                let at = next() as usize % end;
                data.truncate(end);
                data[at..end].copy_from_slice(&other[at..end]);
            }
        }
        crate::fuzzing::decode_anything(&data);
    }
}

fn intent(sequence: u64, extents: u32) -> IntentRecord {
    IntentRecord {
        pool_id: PoolId([5; 16]),
        sequence,
        generation: sequence + 40,
        extents: (0..extents)
            .map(|e| (SpaceId(u64::from(e % 3) + 1), e))
            .collect(),
        dirty: (0..extents / 2)
            .map(|e| (DiskIndex(e as u16 % 4), SpaceId(9), e))
            .collect(),
    }
}

#[test]
fn intent_records_round_trip_and_refuse_damage() {
    // 3,445 intent and 1,722 dirty entries fill a slot (65,448 of 65,472
    // bytes).
    for count in [0, 1, 340, 3445] {
        let record = intent(7, count);
        let bytes = record.encode().unwrap();
        assert_eq!(bytes.len() % LABEL_BYTES, 0);
        assert!(bytes.len() as u64 <= INTENT_SLOT_BYTES);
        assert_eq!(IntentRecord::decode(&bytes).unwrap(), record);
    }
    let over = intent(1, 3446);
    assert_eq!(
        over.encode(),
        Err(IntentError::Oversized {
            bytes: over.entry_bytes() as u64
        })
    );
    assert!(over.entry_bytes() > IntentRecord::ENTRY_ROOM);
    let bytes = intent(9, 100).encode().unwrap();
    assert_eq!(
        IntentRecord::decode(&vec![0; bytes.len()]),
        Err(IntentError::Empty)
    );
    for field in [33, 41] {
        // the sequence, the generation
        let mut header = bytes.clone();
        header[field] ^= 1;
        assert_eq!(
            IntentRecord::decode(&header),
            Err(IntentError::HeaderChecksum)
        );
    }
    for entry in [64 + 12 * 50, 64 + 12 * 100 + 14 * 20] {
        // an intent entry, a dirty one
        let mut entries = bytes.clone();
        entries[entry] ^= 1;
        assert_eq!(
            IntentRecord::decode(&entries),
            Err(IntentError::PayloadChecksum)
        );
    }
    // Cut short of its counts: an error, not a panic.
    assert_eq!(
        IntentRecord::decode(&bytes[..64 + 12 * 100]),
        Err(IntentError::Truncated {
            bytes: 12 * 100 + 14 * 50
        })
    );
}

#[test]
fn the_newest_whole_intent_record_of_the_pool_is_read_back() {
    block_on(async {
        let devices = memory_disks(1);
        let device = devices[0].as_ref() as &dyn BlockDevice;
        let label = Label {
            pool_id: PoolId([5; 16]),
            disk_id: DiskId([1; 16]),
            created_ns: 0,
            device_bytes: device.size_bytes(),
            metadata_slot_bytes: SLOT,
            data_offset: data_offset(SLOT),
            slab_bytes: SLAB,
            pool_name: "p".into(),
        };
        assert_eq!(store::read_intent(device, &label).await, None);
        for sequence in 1..=3 {
            let record = intent(sequence, sequence as u32 * 10);
            store::write_intent(device, sequence, store::encode_intent(&record).unwrap())
                .await
                .unwrap();
        }
        // 3 overwrote 1 in slot 1, beside 2 in slot 0.
        assert_eq!(
            store::read_intent(device, &label).await,
            Some(intent(3, 30))
        );
        // A torn write of 4 leaves 3 readable.
        let mut torn = intent(4, 40).encode().unwrap();
        torn[64 + 12 * 30..].fill(0);
        store::write_intent(device, 4, Bytes::from(torn))
            .await
            .unwrap();
        assert_eq!(
            store::read_intent(device, &label).await,
            Some(intent(3, 30))
        );
        // A newer whole record wins whichever slot it is in.
        store::write_intent(device, 5, store::encode_intent(&intent(5, 0)).unwrap())
            .await
            .unwrap();
        assert_eq!(store::read_intent(device, &label).await, Some(intent(5, 0)));
        // Another pool's records are not this one's.
        let other = Label {
            pool_id: PoolId([6; 16]),
            ..label.clone()
        };
        assert_eq!(store::read_intent(device, &other).await, None);
        // A disk labelled (again) starts with empty slots.
        write_label(device, &label).await.unwrap();
        assert_eq!(store::read_intent(device, &label).await, None);
    });
}

/// Format 5's additions round-trip: a space's sums space and a sums
/// space's role, a scrub job's cursor and findings, the error and scrub
/// settings.
#[test]
fn sums_scrub_and_error_settings_round_trip() {
    let mut pool = metadata_with_space(Layout::Mirror { copies: 2 }, 2, 1);
    pool.spaces[0].sums = Some(SpaceId(9));
    let mut sums = pool.spaces[0].clone();
    sums.id = SpaceId(9);
    sums.name = ".sums-1".into();
    sums.export = None;
    sums.sums = None;
    sums.role = SpaceRole::Sums {
        owner: pool.spaces[0].id,
    };
    sums.extents.clear();
    sums.size_bytes = 0;
    pool.spaces.push(sums);
    pool.settings.error_limit = 3;
    pool.settings.error_window_secs = 60;
    pool.settings.scrub_interval_secs = 7 * 24 * 3600;
    pool.settings.scrub_last_ns = 12345;
    pool.jobs.push(JobRecord {
        id: 1,
        kind: JobKind::Scrub,
        state: JobState::Paused,
        reason: String::new(),
        created_ns: 1,
        finished_ns: 0,
        bytes_total: 1 << 30,
        bytes_done: 1 << 20,
        moves: Vec::new(),
        folded_moves: 0,
        folded_moves_done: 0,
        cursor: 77,
        repaired: 5,
        unrepaired: 1,
    });
    assert_eq!(codec::decode(&codec::encode(&pool)).unwrap(), pool);
    // A space that keeps no sums by choice says so.
    let mut off = pool.clone();
    off.spaces[0].sums = None;
    off.spaces[0].checksums = false;
    assert_eq!(codec::decode(&codec::encode(&off)).unwrap(), off);
}
