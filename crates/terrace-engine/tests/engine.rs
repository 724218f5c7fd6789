//! The engine end to end on memory disks: every layout, restarts, degraded
//! operation, refusals that change nothing, and the import quorum.

mod common;

use std::sync::Arc;

use common::*;
use futures::future::join_all;
use terrace_engine::io::BlockDevice;
use terrace_engine::layout::Layout;
use terrace_engine::{
    verify_space, EngineError, ImportOptions, Pool, SpaceConfig, SpaceHealth, SpaceSize,
};

const DISK_BYTES: u64 = 4 << 20;

fn space_config(name: &str, layout: Layout, size: u64, interleave: u64) -> SpaceConfig {
    let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(size));
    config.interleave_bytes = Some(interleave);
    config
}

/// Random writes, zeroes and trims against a model, then a full read-back.
async fn exercise(
    space: &terrace_engine::Space,
    model: &mut Model,
    rng: &mut SplitMix64,
    rounds: usize,
) {
    let size = space.size_bytes();
    for _ in 0..rounds {
        let (offset, length) = random_range(rng, size, 96 << 10);
        match rng.below(10) {
            0 => {
                space
                    .write_zeroes(offset, length, rng.below(2) == 0)
                    .await
                    .unwrap();
                model.zero(offset, length);
            }
            1 => {
                let data = rng.bytes(length as usize);
                space
                    .write(offset, bytes(data.clone()), true)
                    .await
                    .unwrap();
                model.write(offset, &data);
            }
            2 => space.flush().await.unwrap(),
            _ => {
                let data = rng.bytes(length as usize);
                space
                    .write(offset, bytes(data.clone()), false)
                    .await
                    .unwrap();
                model.write(offset, &data);
            }
        }
        let (offset, length) = random_range(rng, size, 128 << 10);
        let read = space.read(offset, length).await.unwrap();
        assert_eq!(
            &read[..],
            model.slice(offset, length),
            "read {offset}+{length}"
        );
    }
    check_all(space, model).await;
}

async fn check_all(space: &terrace_engine::Space, model: &Model) {
    let size = space.size_bytes();
    let mut offset = 0;
    while offset < size {
        let length = (1u64 << 20).min(size - offset);
        let read = space.read(offset, length).await.unwrap();
        assert!(
            read[..] == *model.slice(offset, length),
            "space {} differs in {offset}+{length}",
            space.name()
        );
        offset += length;
    }
}

#[test]
fn every_layout_reads_back_what_was_written_across_a_restart() {
    block_on(async {
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let mut models = Vec::new();
        for (index, (layout, name)) in layouts().into_iter().enumerate() {
            let interleave = 4096 << (index % 3);
            let created = pool
                .create_space(space_config(name, layout, 600 << 10, interleave))
                .await
                .unwrap();
            assert!(!created.columns_reason.is_empty());
            let mut model = Model::new(created.space.size_bytes());
            let mut rng = SplitMix64::new(index as u64);
            exercise(&created.space, &mut model, &mut rng, 60).await;
            assert_eq!(
                verify_space(&created.space).await.unwrap().mismatched_rows,
                vec![]
            );
            models.push((name, model));
        }
        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        assert!(pool.read_only_reason().is_none());
        for (name, model) in &models {
            let space = pool.space(name).expect("space survives restart");
            check_all(&space, model).await;
        }
    });
}

#[test]
fn concurrent_writers_of_shared_rows_leave_redundancy_consistent() {
    block_on(async {
        // Ten disks: parity gets 8 columns, wide enough that single-block
        // writes take the read-modify-write path.
        let disks = Disks::new(10, DISK_BYTES);
        let pool = create_pool(&disks).await;
        for (layout, name) in layouts() {
            let space = pool
                .create_space(space_config(name, layout, 256 << 10, 4096))
                .await
                .unwrap()
                .space;
            // 64 writers of single blocks and overlapping runs, all at once.
            let mut rng = SplitMix64::new(7);
            let writes: Vec<_> = (0..64)
                .map(|_| {
                    let (offset, length) = random_range(&mut rng, space.size_bytes(), 24 << 10);
                    let data = bytes(rng.bytes(length as usize));
                    let space = space.clone();
                    async move { space.write(offset, data, false).await }
                })
                .collect();
            for result in join_all(writes).await {
                result.unwrap();
            }
            let report = verify_space(&space).await.unwrap();
            assert_eq!(report.mismatched_rows, vec![], "{name}");
        }
    });
}

#[test]
fn degraded_spaces_keep_serving_and_beyond_tolerance_never_return_wrong_data() {
    for (layout, name) in layouts() {
        block_on(async {
            let disks = Disks::new(6, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let space = pool
                .create_space(space_config(name, layout, 512 << 10, 8192))
                .await
                .unwrap()
                .space;
            let mut model = Model::new(space.size_bytes());
            let mut rng = SplitMix64::new(99);
            exercise(&space, &mut model, &mut rng, 20).await;
            let tolerated = layout.failures_tolerated() as usize;
            for lost in 0..tolerated {
                disks.faults[lost * 2].lose();
                exercise(&space, &mut model, &mut rng, 20).await;
                assert!(
                    matches!(space.health(), SpaceHealth::Degraded { .. }),
                    "{name}: {:?}",
                    space.health()
                );
            }
            // One more loss than tolerated: reads either fail or are right.
            disks.faults[5].lose();
            disks.faults[3].lose();
            disks.faults[1].lose();
            let size = space.size_bytes();
            let mut failures = 0;
            for block in 0..size / 4096 {
                match space.read(block * 4096, 4096).await {
                    Ok(read) => assert_eq!(
                        &read[..],
                        model.slice(block * 4096, 4096),
                        "{name} block {block}"
                    ),
                    Err(EngineError::Unavailable { .. }) => failures += 1,
                    Err(other) => panic!("{name}: unexpected {other}"),
                }
            }
            assert!(
                failures > 0,
                "{name}: losing most disks must make something unavailable"
            );
            assert!(matches!(space.health(), SpaceHealth::Offline { .. }));
        });
    }
}

#[test]
fn a_disk_failing_mid_write_is_recorded_before_the_write_completes() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let space = pool
            .create_space(space_config(
                "m",
                Layout::Mirror { copies: 2 },
                256 << 10,
                4096,
            ))
            .await
            .unwrap()
            .space;
        let generation = pool.metadata().await.generation;
        disks.faults[1].fail_writes(0..u64::MAX);
        let data = vec![0x5a; 64 << 10];
        space.write(0, bytes(data.clone()), false).await.unwrap();
        let metadata = pool.metadata().await;
        assert!(metadata.generation > generation, "failure committed");
        assert_eq!(
            metadata.disks[1].state,
            terrace_engine::meta::DiskState::Failed
        );
        assert!(metadata.disks[1].state_reason.contains("injected"));
        // The failed disk is never read again: its stale data cannot surface.
        disks.faults[1].clear();
        assert_eq!(&space.read(0, 64 << 10).await.unwrap()[..], &data[..]);
        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let status = pool.status().await;
        assert_eq!(status.disks[1].condition, terrace_engine::Condition::Failed);
        assert_eq!(
            &pool.space("m").unwrap().read(0, 64 << 10).await.unwrap()[..],
            &data[..]
        );
    });
}

/// An add cut short by a crash: the new disk was labelled, but the commit
/// that would have named it never reached the pool's disks. The pool
/// imports without it, and the disk can be added again (its label names
/// this pool but no disk the pool knows); a member's label is still
/// refused.
#[test]
fn a_disk_labelled_by_an_add_cut_short_can_be_added_again() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        pool.close().await.unwrap();
        let members: Vec<Vec<u8>> = disks.memory.iter().map(|m| m.snapshot()).collect();
        let extra = Disks::new(1, DISK_BYTES);
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        pool.add_disks(extra.new_disks()).await.unwrap();
        pool.close().await.unwrap();
        // Undo the commit: the members as before it, the new disk blank
        // but for its label.
        for (memory, before) in disks.memory.iter().zip(&members) {
            memory.write_sync(0, before);
        }
        let label = extra.memory[0].read_sync(0, 4096);
        extra.memory[0].write_sync(0, &vec![0; DISK_BYTES as usize]);
        extra.memory[0].write_sync(0, &label);
        let mut all = disks.devices.clone();
        all.push(extra.devices[0].clone());
        let pool = Pool::import(env(), all.clone(), ImportOptions::default())
            .await
            .unwrap();
        assert_eq!(
            pool.status().await.disks.len(),
            3,
            "the leftover is no member"
        );
        let member = terrace_engine::NewDisk::new(disks.devices[0].clone());
        let error = pool.add_disks(vec![member]).await.unwrap_err();
        assert!(
            matches!(error, EngineError::AlreadyMember { .. }),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "{} is already a disk of pool tank; nothing was changed",
                disks.devices[0].name()
            )
        );
        let added = pool.add_disks(extra.new_disks()).await.unwrap();
        assert_eq!(added, vec![terrace_engine::meta::DiskIndex(3)]);
        pool.close().await.unwrap();
        let pool = Pool::import(env(), all, ImportOptions::default())
            .await
            .unwrap();
        let status = pool.status().await;
        assert_eq!(status.disks.len(), 4);
        assert!(status
            .disks
            .iter()
            .all(|d| d.condition == terrace_engine::Condition::Online));
        pool.close().await.unwrap();
    });
}

#[test]
fn refused_disks_are_left_untouched() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        pool.close().await.unwrap();
        let fresh = Disks::new(2, DISK_BYTES);
        let before: Vec<Vec<u8>> = fresh.memory.iter().map(|m| m.snapshot()).collect();
        // A disk of another pool among blank ones.
        let mut mixed = fresh.new_disks();
        mixed.push(terrace_engine::NewDisk::new(disks.devices[0].clone()));
        let error = Pool::create(env(), small_config("other"), mixed)
            .await
            .err()
            .unwrap();
        assert!(
            matches!(error, EngineError::DiskInOtherPool { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("tank"));
        // A damaged label.
        let damaged = Disks::new(1, DISK_BYTES);
        let label = disks.memory[1].read_sync(0, 4096);
        let mut broken = label.clone();
        broken[100] ^= 0xff;
        damaged.memory[0].write_sync(0, &broken);
        let damaged_before = damaged.memory[0].snapshot();
        let mut with_damaged = fresh.new_disks();
        with_damaged.extend(damaged.new_disks());
        let error = Pool::create(env(), small_config("other"), with_damaged)
            .await
            .err()
            .unwrap();
        assert!(matches!(error, EngineError::DamagedLabel { .. }), "{error}");
        assert!(damaged_before == damaged.memory[0].snapshot());
        // Too small, duplicate, bad names, bad slab size.
        let tiny = Disks::new(1, 1 << 20);
        let error = Pool::create(env(), small_config("other"), tiny.new_disks())
            .await
            .err()
            .unwrap();
        assert!(matches!(error, EngineError::DiskTooSmall { .. }), "{error}");
        let mut twice = fresh.new_disks();
        twice.push(terrace_engine::NewDisk::new(fresh.devices[0].clone()));
        assert!(matches!(
            Pool::create(env(), small_config("other"), twice)
                .await
                .err()
                .unwrap(),
            EngineError::DuplicateDisk { .. }
        ));
        assert!(
            Pool::create(env(), small_config("bad name"), fresh.new_disks())
                .await
                .is_err()
        );
        let mut odd_slab = small_config("other");
        odd_slab.slab_bytes = 96 << 10;
        assert!(Pool::create(env(), odd_slab, fresh.new_disks())
            .await
            .is_err());
        for (memory, before) in fresh.memory.iter().zip(&before) {
            assert!(
                memory.snapshot() == *before,
                "a refused create wrote to a disk"
            );
        }
    });
}

#[test]
fn space_creation_errors_name_the_problem_and_change_nothing() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let generation = pool.metadata().await.generation;
        let error = pool
            .create_space(SpaceConfig::new(
                "d",
                Layout::Parity { redundancy: 2 },
                SpaceSize::Bytes(1 << 20),
            ))
            .await
            .err()
            .unwrap();
        assert!(error.to_string().contains("at least 4 disks"), "{error}");
        let error = pool
            .create_space(SpaceConfig::new(
                "big",
                Layout::Simple,
                SpaceSize::Bytes(1 << 30),
            ))
            .await
            .err()
            .unwrap();
        // The refusal says what the space asks for and what the disks have.
        // Narrowed to one column before giving up, as a space without a
        // column count is.
        assert_eq!(
            error.to_string(),
            "not enough free capacity for space big: 1G does not fit: at most 6M with 3 \
             columns (the largest that fits); 1G as a simple space over 1 column needs 16384 slabs of 64K (1G raw), 1 per 64K of data on distinct disks; \
             the disks it may use have 96 free slabs (6M) on 3 disks"
        );
        let mut bad_interleave = SpaceConfig::new("i", Layout::Simple, SpaceSize::Bytes(1 << 20));
        bad_interleave.interleave_bytes = Some(12 << 10);
        assert!(pool.create_space(bad_interleave).await.is_err());
        assert_eq!(
            pool.metadata().await.generation,
            generation,
            "nothing committed"
        );
        let max = pool
            .create_space(SpaceConfig::new(
                "max",
                Layout::Parity { redundancy: 1 },
                SpaceSize::Max,
            ))
            .await
            .unwrap();
        assert!(max.space.size_bytes() > 0);
        assert!(matches!(
            pool.create_space(SpaceConfig::new(
                "max",
                Layout::Simple,
                SpaceSize::Bytes(4096)
            ))
            .await,
            Err(EngineError::SpaceExists { .. })
        ));
        pool.delete_space("max").await.unwrap();
        assert!(pool.space("max").is_none());
        assert!(
            max.space.read(0, 4096).await.is_err(),
            "a deleted space refuses I/O"
        );
    });
}

#[test]
fn requests_outside_the_space_are_refused_and_any_byte_granularity_works() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let space = pool
            .create_space(SpaceConfig::new(
                "s",
                Layout::Mirror { copies: 2 },
                SpaceSize::Bytes(64 << 10),
            ))
            .await
            .unwrap()
            .space;
        let size = space.size_bytes();
        assert!(matches!(
            space.read(size, 4096).await,
            Err(EngineError::OutOfRange { .. })
        ));
        assert!(matches!(
            space.read(u64::MAX - 4095, 4096).await,
            Err(EngineError::OutOfRange { .. })
        ));
        assert!(matches!(
            space.trim(size - 4096, 8192).await,
            Err(EngineError::OutOfRange { .. })
        ));
        assert!(matches!(
            space.write(size - 1, bytes(vec![1; 2]), false).await,
            Err(EngineError::OutOfRange { .. })
        ));
        assert_eq!(space.read(0, 0).await.unwrap().len(), 0);
        // One byte, a sector, a run across a block boundary, within one block.
        let mut model = Model::new(size);
        for (offset, length) in [
            (1u64, 1u64),
            (512, 512),
            (4000, 200),
            (4097, 100),
            (12_288 - 3, 9000),
        ] {
            let data = SplitMix64::new(offset).bytes(length as usize);
            space
                .write(offset, bytes(data.clone()), false)
                .await
                .unwrap();
            model.write(offset, &data);
        }
        space.write_zeroes(4090, 20, false).await.unwrap();
        model.zero(4090, 20);
        space.trim(100, 200).await.unwrap(); // inside one block: nothing to trim
        for (offset, length) in [(0u64, size), (3, 5), (4095, 2), (12_000, 777)] {
            assert_eq!(
                &space.read(offset, length).await.unwrap()[..],
                model.slice(offset, length)
            );
        }
        assert_eq!(verify_space(&space).await.unwrap().mismatched_rows, vec![]);
    });
}

#[test]
fn import_needs_a_majority_or_force() {
    block_on(async {
        let disks = Disks::new(5, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let space = pool
            .create_space(SpaceConfig::new(
                "m",
                Layout::Mirror { copies: 3 },
                SpaceSize::Bytes(128 << 10),
            ))
            .await
            .unwrap()
            .space;
        let data = vec![0x42u8; 128 << 10];
        space.write(0, bytes(data.clone()), true).await.unwrap();
        pool.close().await.unwrap();
        // Two of five: no majority → read-only, with the reason.
        let two: Vec<Arc<dyn BlockDevice>> = disks.devices[..2].to_vec();
        let pool = Pool::import(env(), two.clone(), ImportOptions::default())
            .await
            .unwrap();
        let reason = pool.read_only_reason().expect("read-only").to_string();
        assert!(reason.contains("only 2 of 5"), "{reason}");
        let space = pool.space("m").unwrap();
        let readable = space.read(0, 128 << 10).await;
        if let Ok(read) = readable {
            assert_eq!(&read[..], &data[..]);
        }
        assert!(matches!(
            space.write(0, bytes(vec![0; 4096]), false).await,
            Err(EngineError::ReadOnly { .. })
        ));
        drop(pool);
        // Force: read-write, and the missing disks are recorded.
        let options = ImportOptions {
            force: true,
            ..ImportOptions::default()
        };
        let pool = Pool::import(env(), disks.devices[..3].to_vec(), options)
            .await
            .unwrap();
        assert!(pool.read_only_reason().is_none());
        let metadata = pool.metadata().await;
        let missing = metadata
            .disks
            .iter()
            .filter(|d| d.state == terrace_engine::meta::DiskState::Missing)
            .count();
        assert_eq!(missing, 2);
        assert_eq!(
            &pool.space("m").unwrap().read(0, 128 << 10).await.unwrap()[..],
            &data[..]
        );
    });
}

#[test]
fn pools_keep_their_metadata_when_disks_fail_while_running() {
    block_on(async {
        let disks = Disks::new(5, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let space = pool
            .create_space(SpaceConfig::new(
                "p",
                Layout::Parity { redundancy: 2 },
                SpaceSize::Bytes(256 << 10),
            ))
            .await
            .unwrap()
            .space;
        let data = SplitMix64::new(5).bytes(256 << 10);
        space.write(0, bytes(data.clone()), false).await.unwrap();
        disks.faults[0].lose();
        disks.faults[4].lose();
        space.write(0, bytes(data.clone()), false).await.unwrap();
        space.flush().await.unwrap();
        let status = pool.status().await;
        assert_eq!(
            status.spaces[0].health,
            SpaceHealth::Degraded { survives: 0 }
        );
        pool.close().await.unwrap();
        // Only the three survivors hold the newest generation, and they are
        // all of its member set: a full quorum.
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        assert!(pool.read_only_reason().is_none());
        assert_eq!(
            &pool.space("p").unwrap().read(0, 256 << 10).await.unwrap()[..],
            &data[..]
        );
    });
}

#[test]
fn several_pools_on_the_same_devices_list_are_told_apart() {
    block_on(async {
        let first = Disks::new(2, DISK_BYTES);
        let second = Disks::new(2, DISK_BYTES);
        Pool::create(env(), small_config("alpha"), first.new_disks())
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        Pool::create(env(), small_config("beta"), second.new_disks())
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        let all: Vec<Arc<dyn BlockDevice>> = first
            .devices
            .iter()
            .chain(&second.devices)
            .cloned()
            .collect();
        let error = Pool::import(env(), all.clone(), ImportOptions::default())
            .await
            .err()
            .unwrap();
        assert!(
            matches!(error, EngineError::AmbiguousPool { .. }),
            "{error}"
        );
        let options = ImportOptions {
            pool: Some("beta".into()),
            ..ImportOptions::default()
        };
        let pool = Pool::import(env(), all, options).await.unwrap();
        assert_eq!(pool.name(), "beta");
        assert!(matches!(
            Pool::import(
                env(),
                Disks::new(1, DISK_BYTES).devices,
                ImportOptions::default()
            )
            .await,
            Err(EngineError::NoPoolFound)
        ));
    });
}

#[test]
fn fault_domains_keep_redundant_slabs_apart_or_refuse() {
    block_on(async {
        let disks = Disks::new(6, DISK_BYTES);
        let mut new_disks = disks.new_disks();
        for (index, disk) in new_disks.iter_mut().enumerate() {
            disk.enclosure = format!("shelf-{}", index % 3);
        }
        let pool = Pool::create(env(), small_config("domains"), new_disks)
            .await
            .unwrap();
        let metadata = pool.metadata().await;
        assert_eq!(
            terrace_engine::default_fault_domain(&metadata),
            terrace_engine::meta::FaultDomain::Enclosure
        );
        let created = pool
            .create_space(SpaceConfig::new(
                "m",
                Layout::Mirror { copies: 3 },
                SpaceSize::Bytes(1 << 20),
            ))
            .await
            .unwrap();
        let metadata = pool.metadata().await;
        let record = metadata.space("m").unwrap();
        for extent in &record.extents {
            let slabs = extent.slabs.as_ref().unwrap();
            for column in slabs.chunks(3) {
                let mut shelves: Vec<&str> = column
                    .iter()
                    .map(|slab| metadata.disks[usize::from(slab.disk.0)].enclosure.as_str())
                    .collect();
                shelves.sort_unstable();
                shelves.dedup();
                assert_eq!(shelves.len(), 3, "copies share an enclosure");
            }
        }
        // Parity over three enclosures can span at most three columns.
        let parity = pool
            .create_space(SpaceConfig::new(
                "p",
                Layout::Parity { redundancy: 1 },
                SpaceSize::Bytes(1 << 20),
            ))
            .await
            .unwrap();
        assert_eq!(parity.space.geometry().columns(), 3);
        assert!(
            parity.columns_reason.contains("Enclosure fault domains"),
            "{}",
            parity.columns_reason
        );
        // Dual parity needs four distinct enclosures: refused, nothing changes.
        let generation = pool.metadata().await.generation;
        let error = pool
            .create_space(SpaceConfig::new(
                "d",
                Layout::Parity { redundancy: 2 },
                SpaceSize::Bytes(1 << 20),
            ))
            .await
            .err()
            .unwrap();
        assert!(
            error
                .to_string()
                .contains("distinct Enclosure fault domains"),
            "{error}"
        );
        assert_eq!(pool.metadata().await.generation, generation);
        drop(created);
    });
}

#[test]
fn trim_zeroes_whole_rows_and_leaves_partial_parity_rows() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        for (layout, name) in layouts() {
            let space = pool
                .create_space(space_config(name, layout, 512 << 10, 4096))
                .await
                .unwrap()
                .space;
            let size = space.size_bytes();
            space
                .write(0, bytes(vec![0xee; size as usize]), false)
                .await
                .unwrap();
            let row = space.geometry().row_data_bytes();
            // Trim from the middle of row 1 to the end of row 3.
            let start = row + 4096;
            let end = 4 * row;
            space.trim(start, end - start).await.unwrap();
            let read = space.read(0, size).await.unwrap();
            let partial_kept = matches!(layout, Layout::Parity { .. });
            for block in 0..size / 4096 {
                let offset = block * 4096;
                let value = read[offset as usize];
                let trimmed_whole_row = offset >= 2 * row && offset < end;
                let trimmed_partial = offset >= start && offset < 2 * row;
                let expected = if trimmed_whole_row || (trimmed_partial && !partial_kept) {
                    0
                } else {
                    0xee
                };
                assert_eq!(value, expected, "{name}: block {block}");
            }
            assert_eq!(
                verify_space(&space).await.unwrap().mismatched_rows,
                vec![],
                "{name}"
            );
        }
    });
}

#[test]
fn disks_join_spaces_grow_usage_changes_and_pools_are_destroyed() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let space = pool
            .create_space(SpaceConfig::new(
                "m",
                Layout::Mirror { copies: 2 },
                SpaceSize::Bytes(128 << 10),
            ))
            .await
            .unwrap()
            .space;
        let data = SplitMix64::new(3).bytes(128 << 10);
        space.write(0, bytes(data.clone()), false).await.unwrap();
        // Too few disks for dual parity, until two more join.
        assert!(pool
            .create_space(SpaceConfig::new(
                "p",
                Layout::Parity { redundancy: 2 },
                SpaceSize::Bytes(64 << 10)
            ))
            .await
            .is_err());
        let more = Disks::new(2, DISK_BYTES);
        assert!(matches!(
            pool.add_disks(vec![terrace_engine::NewDisk::new(disks.devices[0].clone())])
                .await,
            Err(EngineError::AlreadyMember { .. })
        ));
        let added = pool.add_disks(more.new_disks()).await.unwrap();
        assert_eq!(added.len(), 2);
        pool.create_space(SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 2 },
            SpaceSize::Bytes(64 << 10),
        ))
        .await
        .unwrap();
        // Grow the mirror; old data stays, new room reads as zeroes.
        let grown = pool.resize_space("m", 1 << 20).await.unwrap();
        assert_eq!(grown, 1 << 20);
        assert_eq!(space.size_bytes(), 1 << 20);
        assert_eq!(&space.read(0, 128 << 10).await.unwrap()[..], &data[..]);
        assert!(space
            .read(128 << 10, (1 << 20) - (128 << 10))
            .await
            .unwrap()
            .iter()
            .all(|&b| b == 0));
        space
            .write((1 << 20) - 4096, bytes(vec![9; 4096]), false)
            .await
            .unwrap();
        assert!(matches!(
            pool.resize_space("m", 4096).await,
            Err(EngineError::ShrinkRefused { .. })
        ));
        // A disk holding data cannot become a hot spare; an empty one can.
        let metadata = pool.metadata().await;
        let used = metadata.used_slabs();
        let busy = used.iter().next().unwrap().disk;
        assert!(matches!(
            pool.set_disk_usage(busy, terrace_engine::meta::Usage::HotSpare)
                .await,
            Err(EngineError::DiskInUse { .. })
        ));
        pool.set_disk_usage(busy, terrace_engine::meta::Usage::Retired)
            .await
            .unwrap();
        assert_eq!(
            pool.metadata().await.disks[usize::from(busy.0)].usage,
            terrace_engine::meta::Usage::Retired
        );
        pool.close().await.unwrap();
        // Everything survives the restart, including the added disks.
        let all: Vec<_> = disks.devices.iter().chain(&more.devices).cloned().collect();
        let pool = Pool::import(env(), all.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("m").unwrap();
        assert_eq!(space.size_bytes(), 1 << 20);
        assert_eq!(&space.read(0, 128 << 10).await.unwrap()[..], &data[..]);
        assert!(space
            .read((1 << 20) - 4096, 4096)
            .await
            .unwrap()
            .iter()
            .all(|&b| b == 9));
        let report = terrace_engine::scan(&all).await;
        assert!(report.iter().all(|r| matches!(&r.kind, terrace_engine::DeviceKind::Member { pool_name, .. } if pool_name == "tank")));
        assert_eq!(
            pool.destroy().await.unwrap(),
            vec![],
            "a healthy pool leaves no label"
        );
        let report = terrace_engine::scan(&all).await;
        assert!(report
            .iter()
            .all(|r| r.kind == terrace_engine::DeviceKind::Blank));
        // Blank again: a new pool can be made of them.
        let disks_again = all
            .iter()
            .map(|d| terrace_engine::NewDisk::new(d.clone()))
            .collect();
        Pool::create(env(), small_config("again"), disks_again)
            .await
            .unwrap();
    });
}

#[test]
fn growths_and_caches_that_do_not_fit_say_what_they_need() {
    block_on(async {
        let disks = Disks::new(3, 48 << 20);
        let pool = create_pool(&disks).await;
        pool.create_space(SpaceConfig::new(
            "s",
            Layout::Simple,
            SpaceSize::Bytes(1 << 20),
        ))
        .await
        .unwrap();
        let mut parity = SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 1 },
            SpaceSize::Bytes(4 << 20),
        );
        parity.cache_bytes = Some(32 << 20);
        pool.create_space(parity).await.unwrap();
        let generation = pool.metadata().await.generation;
        let refusals = [
            pool.resize_space("s", 1 << 30)
                .await
                .unwrap_err()
                .to_string(),
            pool.set_cache_size("p", 100 << 20)
                .await
                .unwrap_err()
                .to_string(),
            {
                let mut big = SpaceConfig::new(
                    "q",
                    Layout::Parity { redundancy: 1 },
                    SpaceSize::Bytes(1 << 20),
                );
                big.cache_bytes = Some(1 << 30);
                pool.create_space(big).await.err().unwrap().to_string()
            },
        ];
        assert_eq!(
            refusals,
            [
                "not enough free capacity for space s: growing from 1M to 1G as a simple space \
                 over 3 columns needs 16368 slabs of 64K (1023M raw), 3 per 192K of data on \
                 distinct disks; the disks it may use have 1066 free slabs (67M) on 3 disks",
                "not enough free capacity for space p: its write-back cache growing from 32M to \
                 100M as a 2-way mirror space over 1 column on capacity disks needs 2176 slabs \
                 of 64K (136M raw), 2 per 64K of data on distinct disks; the disks it may use \
                 have 1066 free slabs (67M) on 3 disks",
                "not enough free capacity for space q: its write-back cache on capacity disks: \
                 1G as a 2-way mirror space over 1 column needs 32768 slabs of 64K (2G raw), 2 \
                 per 64K of data on distinct disks; the disks it may use have 1042 free slabs \
                 (65M) on 3 disks",
            ]
        );
        assert_eq!(
            pool.metadata().await.generation,
            generation,
            "nothing committed"
        );
    });
}

/// A disk the pool has as missing, given to `add_disks` as if new, is
/// refused as the pool's own member (not as another pool's, with advice to
/// import or destroy that pool), and nothing changes.
#[test]
fn a_disk_of_the_pool_added_again_is_named_its_member() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        pool.close().await.unwrap();
        let present = disks.devices[..3].to_vec();
        let pool = Pool::import(env(), present, ImportOptions::default())
            .await
            .unwrap();
        let before = pool.metadata().await.generation;
        let again = terrace_engine::NewDisk::new(disks.devices[3].clone());
        let error = pool.add_disks(vec![again]).await.unwrap_err();
        assert!(
            matches!(error, EngineError::AlreadyMember { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("pool tank"), "{error}");
        assert_eq!(pool.metadata().await.generation, before);
        assert_eq!(pool.status().await.disks.len(), 4);
        pool.close().await.unwrap();
    });
}
